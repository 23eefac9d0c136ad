"""Matching TVM's PrimFuncs (Relax tuning tasks) to our templates: a registry of matchers.

TVM's Relax lowering (``LegalizeOps`` + ``FuseOps`` + ``FuseTIR``) produces PrimFuncs we did
not write: a ``matmul`` block followed by fused elementwise blocks (bias add, activation,
a cast), a softmax or a layer norm with a broadcast after it, ...  A template can only be
applied to such a function if we recognise its computation by pattern, so each template
has a matcher (``MATCHERS``: one entry per template, tried in order) that reads the
function's blocks and returns the template at the task's shape and where its computation
sits in the function (a site), or why it does not apply.  A function that looks right but
still cannot be scheduled (the template's default config fails on it) is not a match
either: the caller then falls back to TVM's default schedules, and every unmatched function
carries the reason.

- ``gemm``: one reduction block ``C[..., i, j] += A[..., i, k]·B[..., k, j]`` in float32 (a
  batch of leading axes; B transposed ``B[..., j, k]`` or shared by the batch) plus
  elementwise blocks after it (bias, GELU, residual add), which the GEMM kernel's
  write-back absorbs -> ``GemmTemplate``.
- ``tf32``: a float32 matmul (no batch) on Hopper -> the 3xTF32 template (``gemm_3xtf32``), its
  splits and TF32 wgmma GEMM as one function in the function's place (as ``wgmma``'s); a
  float32 matmul elsewhere, or one no TF32 tile divides, goes on to ``gemm``.
- ``wgmma``: a float16 or bfloat16 matmul (float32 accumulate, out in its own type, batched or not) on Hopper -> the
  wgmma template, whose kernel replaces the function (``Matcher.substitute``,
  ``relax_wgmma``) rather than scheduling it.
- ``fp8``: an 8-bit float matmul (both operands e4m3 or both e5m2, float32 accumulate, B read
  as [n, k], out float16 or bfloat16) on Hopper -> the 8-bit wgmma template, its kernel in the
  function's place with the function's scaling and cast composed into its store (as ``wgmma``'s;
  ``relax_rewrites``'s ``fp8_weight_rows`` makes a transposed weight read as [n, k]).
- ``tensor_core``: the same matmul with float16 or bfloat16 operands -> the mma.sync
  template (CUDA; elsewhere it falls back with the reason).
- ``rows``: one or two reductions over the last axis (softmax, layer norm, RMS norm, sum,
  mean, max) with elementwise stages around them -> ``RowTemplate``, the stages fused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Collection, Protocol

from .relax_wgmma import WgmmaSite, compose_epilogue, substitute_kernel
from ..core.space import Config
from ..target import TargetInfo

# wgmma takes a B stored (K, N) from this many columns: narrower, mma.sync's 32-column tiles read
# it faster (8192x32x1024 float16; docs/results/models.md)
KN_MIN_COLUMNS = 64


class TaskTemplate(Protocol):
    """What a matched template offers the pipeline: its config space and default, and its
    schedule replayed on a foreign PrimFunc at a site its matcher found."""

    name: str

    @property
    def params(self) -> dict[str, Any]: ...

    def default_config(self, target: TargetInfo) -> Config: ...

    def schedule(self, config: Config, target: TargetInfo, func: Any = None, site: Any = None) -> Any: ...

    def pass_config(self, config: Config, target: TargetInfo) -> dict[str, Any]: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class TaskMatch:
    """A PrimFunc and the template (with its site) that schedules it, or why none does."""

    name: str
    template: TaskTemplate | None
    site: Any
    reason: str = ""  # why no template applies; empty when matched
    matcher: str = ""  # the ``MATCHERS`` entry that matched

    @property
    def matched(self) -> bool:
        return self.template is not None

    @property
    def substitutes(self) -> bool:
        """Whether the template's kernel replaces the function (``Matcher.substitute``)."""
        return self.matched and MATCHERS[self.matcher].substitute is not None


@dataclass(frozen=True)
class NoMatch:
    """Why a matcher does not take a function; ``near``: the function has the matcher's
    computation (e.g. a matmul of the wrong dtype), so its reason is the one to report."""

    reason: str
    near: bool = False


@dataclass(frozen=True)
class Matcher:
    name: str
    match: Callable[[Any, TargetInfo], Any]  # (func, target) -> (template, site) | NoMatch
    doc: str
    # (func, template, site, config, target) -> a PrimFunc to put in the function's place: the
    # template's kernel replaces the function instead of a schedule of it (``match_task`` builds
    # it with the default config as its check), and its tuned config is exported as an operator
    # config, not a trace
    substitute: Callable[..., Any] | None = None


# ---- reading blocks ----------------------------------------------------------------------------
def _static(extent: Any) -> int | None:
    from tvm.tirx import IntImm

    return int(extent) if isinstance(extent, (IntImm, int)) else None


def _is_var(expr: Any, var: Any) -> bool:
    return hasattr(expr, "same_as") and expr.same_as(var)


def _is_load(expr: Any) -> bool:
    from tvm.ir import TensorLoad  # 0.27: tirx.BufferLoad builds one of these

    return isinstance(expr, TensorLoad)


def _load_of(expr: Any, buffer: Any) -> bool:
    return _is_load(expr) and expr.source.same_as(buffer)


def _uncast(expr: Any) -> Any:
    """The value under a widening cast (float16 operands of a float32 matmul)."""
    from tvm.tirx import Cast

    return expr.value if isinstance(expr, Cast) else expr


def root_blocks(func: Any) -> tuple[Any, list[Any]]:
    """A schedule of ``func`` and its top-level blocks (the TIR objects) in order."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    return sch, [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]


def _is_reduction(block: Any) -> bool:
    from tvm.tirx import IterVar

    return any(iv.iter_type == IterVar.CommReduce for iv in block.iter_vars)


def dynamic_shape_reason(func: Any) -> str | None:
    """Why ``func`` has no static shape (a buffer with a symbolic dimension), or None."""
    for param in func.params:
        shape = getattr(param, "shape", None)
        if shape is None:
            continue  # a scalar parameter
        if any(_static(d) is None for d in shape):
            dims = ", ".join(str(d) for d in shape)
            return (f"dynamic shape: {param.name} is ({dims}); the templates take static shapes "
                    "(tune model --buckets tunes a symbolic dimension at sizes)")
    return None


# ---- matmuls ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MatmulPattern:
    """A matmul found in a PrimFunc: sizes, layout and dtypes, and its site."""

    m: int
    n: int
    k: int
    batch: int  # product of the leading batch axes (0: none)
    b_transposed: bool
    b_shared: bool
    a_dtype: str
    b_dtype: str
    acc_dtype: str
    c_dtype: str  # the function's output dtype (the narrowing epilogue, if any)
    site: Any  # schedules.gemm.MatmulSite
    params: tuple[int, int]  # A's and B's positions among the function's parameters
    lead: tuple[int, ...] = ()  # the leading batch axes (their product is ``batch``)


def find_matmul(func: Any) -> MatmulPattern | NoMatch:
    """The matmul in ``func``: one reduction block ``C[..., i, j] += A[..., i, k]·B[..., k, j]``
    (widening casts allowed, B may be ``[..., j, k]`` or shared by the batch) and elementwise
    blocks after it; else why not."""
    from tvm.tirx import Add, BufferStore, IterVar, Mul

    from ..schedules.gemm.simt import MatmulSite

    _, blocks = root_blocks(func)
    reductions = [b for b in blocks if _is_reduction(b)]
    if len(reductions) != 1:
        return NoMatch(f"{len(reductions)} reduction blocks (a matmul has one)")
    mm = reductions[0]
    kinds = [iv.iter_type for iv in mm.iter_vars]
    if len(kinds) < 3 or kinds[-1] != IterVar.CommReduce or any(t != IterVar.DataPar for t in kinds[:-1]):
        return NoMatch("the reduction is not over (..., i, j, k)")
    extents = [_static(iv.dom.extent) for iv in mm.iter_vars]
    if None in extents:
        return NoMatch("dynamic shape", near=True)
    *lead_vars, vi, vj, vk = (iv.var for iv in mm.iter_vars)
    store = mm.body
    shape_error = NoMatch("the reduction is not C[..., i, j] += A[..., i, k] * B[..., k, j]")
    if not isinstance(store, BufferStore) or len(mm.writes) != 1 or len(mm.reads) != 2:
        return shape_error
    out = store.buffer
    value = store.value
    index_vars = lead_vars + [vi, vj]
    if (not isinstance(value, Add) or not _load_of(value.a, out) or not isinstance(value.b, Mul)
            or len(store.indices) != len(index_vars)
            or not all(_is_var(x, v) for x, v in zip(store.indices, index_vars))):
        return shape_error
    loads = (_uncast(value.b.a), _uncast(value.b.b))
    if not all(_is_load(x) for x in loads):
        return shape_error

    def indexed(load: Any, *want: Any) -> bool:
        return len(load.indices) == len(want) and all(_is_var(x, v) for x, v in zip(load.indices, want))

    role: dict[str, Any] = {}
    b_transposed = b_shared = False
    for load in loads:
        if indexed(load, *lead_vars, vi, vk):
            role["A"] = load.source
        elif indexed(load, *lead_vars, vk, vj) or (lead_vars and indexed(load, vk, vj)):
            role["B"], b_shared = load.source, len(load.indices) == 2 and bool(lead_vars)
        elif indexed(load, *lead_vars, vj, vk) or (lead_vars and indexed(load, vj, vk)):
            role["B"], b_shared, b_transposed = load.source, len(load.indices) == 2 and bool(lead_vars), True
    if set(role) != {"A", "B"}:
        return NoMatch("operand layout is not A[..., i, k] with B[..., k, j] or B[..., j, k] (a transposed A, "
                       "or batch axes on B only)", near=True)
    read_pos = {r.source.name: pos for pos, r in enumerate(mm.reads)}
    if any(role[n].name not in read_pos for n in role):
        return NoMatch("the reduction's reads do not name A and B", near=True)
    positions = {n: [i for i, p in enumerate(func.params) if p.same_as(role[n])] for n in role}
    if not all(positions.values()):
        return NoMatch("A or B is computed inside the function (a fused producer)", near=True)
    position = [i for i, b in enumerate(blocks) if b.same_as(mm)][0]
    if position:
        return NoMatch(f"block {blocks[0].name_hint} runs before the matmul (a fused producer)", near=True)
    others = blocks[1:]
    for b in others:
        if any(iv.iter_type != IterVar.DataPar for iv in b.iter_vars):
            return NoMatch(f"block {b.name_hint} after the matmul is not elementwise", near=True)
        if [_static(iv.dom.extent) for iv in b.iter_vars] != extents[:-1]:  # a store of another shape
            return NoMatch(f"block {b.name_hint} after the matmul covers another shape than the product's "
                           "(a slice or a pad of it)", near=True)
    *lead, m, n, k = extents
    output = func.params[-1]
    return MatmulPattern(
        m=m, n=n, k=k, batch=math.prod(lead) if lead else 0, b_transposed=b_transposed, b_shared=b_shared,
        a_dtype=str(role["A"].dtype), b_dtype=str(role["B"].dtype), acc_dtype=str(out.dtype),
        c_dtype=str(output.dtype),
        site=MatmulSite(block=mm.name_hint, a=read_pos[role["A"].name], b=read_pos[role["B"].name],
                        epilogue=tuple(b.name_hint for b in others)),
        params=(positions["A"][0], positions["B"][0]), lead=tuple(lead))


def match_gemm(func: Any, target: TargetInfo) -> Any:
    """A float32 matmul -> the GEMM template (a batch axis, B transposed or shared as found)."""
    from ..schedules.gemm.simt import GemmTemplate

    found = find_matmul(func)
    if isinstance(found, NoMatch):
        return NoMatch(f"not a GEMM: {found.reason}", found.near)
    dtypes = {found.a_dtype, found.b_dtype, found.acc_dtype}
    if dtypes != {"float32"}:
        return NoMatch(f"not a GEMM: operands {found.a_dtype}/{found.b_dtype} accumulating in {found.acc_dtype} "
                       "(the GEMM template is float32; float16 and bfloat16 matmuls go to the tensor cores)")
    # CUDA: with the staging knobs (register-staged prefetch and its seed tile, ``known_good``)
    template = GemmTemplate(found.m, found.n, found.k, batch=found.batch, b_transposed=found.b_transposed,
                            b_shared=found.b_shared, staging=target.kind == "cuda")
    return template, found.site


def match_tensor_core(func: Any, target: TargetInfo) -> Any:
    """A float16 / bfloat16 matmul -> the mma.sync template (CUDA), without split-K (a Relax
    task's PrimFunc has no scratch buffer for partial sums)."""
    from ..core.errors import TvmExtError
    from ..schedules.gemm.mma import ACC_DTYPES, OPERAND_DTYPES, MmaGemmTemplate

    found = find_matmul(func)
    if isinstance(found, NoMatch):
        return NoMatch(f"not a tensor-core matmul: {found.reason}")
    if found.a_dtype not in OPERAND_DTYPES or found.b_dtype != found.a_dtype:
        return NoMatch(f"not a tensor-core matmul: operands {found.a_dtype}/{found.b_dtype}")
    what = f"{found.a_dtype} matmul"
    if target.kind != "cuda":
        return NoMatch(f"{what}: the tensor-core template (mma.sync) needs a CUDA target, not {target.kind}", True)
    if found.acc_dtype not in ACC_DTYPES:
        return NoMatch(f"{what}: mma.sync accumulates in {' or '.join(ACC_DTYPES)}, not {found.acc_dtype}", True)
    if found.b_transposed:
        return NoMatch(f"{what}: mma.sync reads B as [k, n] (ldmatrix transposes its tiles); B is [n, k]", True)
    try:
        template = MmaGemmTemplate(found.m, found.n, found.k, a_dtype=found.a_dtype, b_dtype=found.b_dtype,
                                   acc_dtype=found.acc_dtype, c_dtype=found.c_dtype, batch=found.batch,
                                   b_shared=found.b_shared, allow_split_k=False)
    except TvmExtError as exc:
        return NoMatch(f"{what}: {exc}", True)
    return template, found.site


def _hopper_matmul(func: Any, target: TargetInfo, kind: str, dtypes: tuple[tuple[str, str, str, str], ...],
                   takes: str) -> Any:
    """The matmul of ``func`` (``MatmulPattern``) if its A, B, accumulator and output dtypes are
    one of ``dtypes`` and ``target`` is Hopper; else why not (``takes``: what the kind takes)."""
    from ..schedules.gemm.wgmma import target_reason

    found = find_matmul(func)
    if isinstance(found, NoMatch):
        return NoMatch(f"not a {kind} matmul: {found.reason}")
    if (found.a_dtype, found.b_dtype, found.acc_dtype, found.c_dtype) not in dtypes:
        return NoMatch(f"not a {kind} matmul: {found.a_dtype}/{found.b_dtype} accumulating in {found.acc_dtype} "
                       f"into {found.c_dtype} ({takes})")
    reason = target_reason(target)
    return NoMatch(f"{found.a_dtype} matmul on {kind}: {reason}") if reason else found


def _substitution(func: Any, found: MatmulPattern, make: Callable[[MatmulPattern], Any], what: str,
                  near: bool) -> Any:
    """(the template ``make`` gives, its ``WgmmaSite`` with the composed epilogue), or why not."""
    from ..core.errors import TvmExtError

    try:
        template = make(found)
        epilogue = compose_epilogue(func, found.site.block, found.site.epilogue)
    except TvmExtError as exc:
        return NoMatch(f"{what}: {exc}", near)
    return template, WgmmaSite(*found.params, len(func.params) - 1, epilogue)


def match_wgmma(func: Any, target: TargetInfo) -> Any:
    """A float16 (or bfloat16) matmul accumulating in float32 into its own dtype, on Hopper -> the wgmma
    template, its kernel in the function's place with the epilogue composed into its store
    (``relax_wgmma``; B read as stored, [k, n] or [n, k]; batch axes as the function has them,
    attention's (batch, heads), B with them or shared).  A shape some wgmma tile divides; else the
    mma.sync template takes it (``match_task`` builds the kernel with the default config as its
    check)."""
    from ..schedules.gemm.wgmma_template import WgmmaGemmTemplate

    found = _hopper_matmul(func, target, "wgmma", tuple((d, d, "float32", d) for d in ("float16", "bfloat16")),
                           "wgmma takes float16 or bfloat16 accumulating in float32 into the same type")
    if isinstance(found, NoMatch):
        return found
    if not found.b_transposed and found.n < KN_MIN_COLUMNS:
        return NoMatch(f"{found.a_dtype} matmul on wgmma: B (K, N) of {found.n} columns, under "
                       f"{KN_MIN_COLUMNS}: mma.sync takes it", near=True)
    return _substitution(func, found, lambda f: WgmmaGemmTemplate(
        f.m, f.n, f.k, b_layout="NK" if f.b_transposed else "KN", batch=f.lead, b_shared=f.b_shared,
        dtype=f.a_dtype), f"{found.a_dtype} matmul on wgmma", near=True)


def match_fp8(func: Any, target: TargetInfo) -> Any:
    """An 8-bit float matmul (both operands e4m3 or both e5m2) accumulating in float32 into float16
    or bfloat16, on Hopper -> the 8-bit wgmma template, its kernel in the function's place with the
    epilogue (the model's scales, bias, cast) composed into its store.  wgmma reads 8-bit operands
    K-major only: B must be read as [n, k]; leading batch axes of A and C share it (a weight)."""
    from ..schedules.gemm.gemm_fp8 import FP8_FORMATS, OUT_DTYPES, Fp8GemmTemplate

    found = _hopper_matmul(func, target, "fp8", tuple((d, d, "float32", c) for d in FP8_FORMATS for c in OUT_DTYPES),
                           "the 8-bit wgmma GEMM takes two e4m3 or two e5m2 operands accumulating in float32 into "
                           f"{' or '.join(OUT_DTYPES)}")
    if isinstance(found, NoMatch):
        return found
    what = f"{found.a_dtype} matmul on wgmma"
    if not found.b_transposed:
        return NoMatch(f"{what}: wgmma reads 8-bit operands K-major only, so B must be read as [n, k] "
                       "(a Linear weight as stored); this function reads it as [k, n]", True)
    if found.batch and not found.b_shared:
        return NoMatch(f"{what}: a batch of {found.batch} matmuls each with a B of its own (the 8-bit template's "
                       "batch shares one B, a weight)", True)
    return _substitution(func, found, lambda f: Fp8GemmTemplate(f.m, f.n, f.k, fp8=FP8_FORMATS[f.a_dtype],
                                                                out_dtype=f.c_dtype, batch=f.lead), what, near=True)


def match_tf32(func: Any, target: TargetInfo) -> Any:
    """A float32 matmul (float32 out, no batch) on Hopper -> the 3xTF32 template: its splits and
    TF32 GEMM in one function in the function's place, the epilogue composed into the GEMM's store
    (``relax_wgmma``; B read as stored, [k, n] or [n, k]), float32-accurate at 1.5-1.7x cuBLAS's
    float32 GEMM.  A batch, another target, or a shape no TF32 tile divides go to ``gemm``."""
    from ..schedules.gemm.gemm_3xtf32 import Gemm3xTf32Template

    found = _hopper_matmul(func, target, "3xTF32", (("float32",) * 4,), "3xTF32 is float32 throughout")
    if isinstance(found, NoMatch):
        return found
    what = "float32 matmul on 3xTF32"
    if found.batch:
        return NoMatch(f"{what}: a batch of {found.batch} matmuls (the 3xTF32 program has no batch axis)")
    return _substitution(func, found, lambda f: Gemm3xTf32Template(f.m, f.n, f.k, b_layout="NK" if f.b_transposed
                                                                   else "KN"), what, near=False)


# ---- row operators ------------------------------------------------------------------------------
def _combiner(block: Any) -> str:
    """"max", "min" or "sum": how a reduction block combines (its update's top operation)."""
    from tvm.tirx import Max, Min

    value = block.body.value
    return "max" if isinstance(value, Max) else "min" if isinstance(value, Min) else "sum"


def match_rows(func: Any, target: TargetInfo) -> Any:
    """One or two reductions over the last axis of a row input (softmax: max then sum; layer
    norm: sum then sum of squares; RMS norm, sum, mean, max: one) with elementwise stages
    around them -> the row template (its op picked by the reductions and the output)."""
    from tvm.tirx import IterVar

    from ..schedules.reduce.rows import DTYPES, RowSite, RowTemplate

    _, blocks = root_blocks(func)
    reductions = [b for b in blocks if _is_reduction(b)]
    if not reductions:
        return NoMatch("not a row operator: no reduction")
    if len(reductions) > 2:
        return NoMatch(f"not a row operator: {len(reductions)} reductions (a row operator has 1 or 2)")
    shapes = set()
    for red in reductions:
        kinds = [iv.iter_type for iv in red.iter_vars]
        if kinds[-1] != IterVar.CommReduce or any(t != IterVar.DataPar for t in kinds[:-1]):
            return NoMatch(f"not a row operator: {red.name_hint} reduces more than one axis")
        if len(kinds) < 2:
            return NoMatch(f"not a row operator: {red.name_hint} reduces a whole tensor (no rows)")
        extents = tuple(_static(iv.dom.extent) for iv in red.iter_vars)
        if None in extents:
            return NoMatch("not a row operator: dynamic shape", True)
        shapes.add(extents)
        k = red.iter_vars[-1].var
        rows_vars = [iv.var for iv in red.iter_vars[:-1]]
        row_reads = [r for r in red.reads if len(r.region) and _region_is_var(r.region[-1], k)]
        if not row_reads:
            return NoMatch(f"not a row operator: {red.name_hint} does not reduce the last axis of its input")
        if any(_uses(r.region[i], k) for r in red.reads for i in range(len(r.region) - 1)):
            return NoMatch(f"not a row operator: {red.name_hint} reduces an axis other than the last")
        for r in row_reads:  # a row input is read at (row..., k); a weight along the row at (k)
            if len(r.region) > 1 and not (len(r.region) == len(rows_vars) + 1 and all(
                    _region_is_var(rng, v) for rng, v in zip(r.region, rows_vars))):
                return NoMatch(f"not a row operator: {red.name_hint} reads {r.source.name} at other than (row, k) "
                               "(a matmul?)")
    if len(shapes) != 1:
        return NoMatch("not a row operator: its reductions run over different rows", True)
    *row_dims, n = shapes.pop()
    rows = math.prod(row_dims)
    output = func.params[-1]
    full_row = len(output.shape) == len(row_dims) + 1 and _static(output.shape[-1]) == n
    first = _combiner(reductions[0])
    if len(reductions) == 2:
        op = "softmax" if first == "max" else "layer_norm"
    elif full_row:
        op = "rms_norm"
    else:
        op = "max" if first in ("max", "min") else "sum"
    row_input = [r.source for r in reductions[0].reads if _region_is_var(r.region[-1], reductions[0].iter_vars[-1].var)]
    dtype = str(row_input[0].dtype)
    if dtype not in DTYPES:
        return NoMatch(f"{op} over rows of {dtype}: the row template takes {', '.join(DTYPES)}", True)
    if dtype not in target.float_dtypes:
        return NoMatch(f"{op} over rows of {dtype}: no {dtype} arithmetic on this {target.kind} device", True)
    last_rows = row_dims[-1] if len(row_dims) > 1 else 0
    return RowTemplate(op, rows, n, dtype, last_rows=last_rows), RowSite(rows, n)


def _region_is_var(rng: Any, var: Any) -> bool:
    return _static(rng.extent) == 1 and _is_var(rng.min, var)


def _uses(rng: Any, var: Any) -> bool:
    from tvm.tirx import analysis

    return any(v.same_as(var) for v in analysis.undefined_vars(rng.min, []))


# ---- the registry --------------------------------------------------------------------------------
MATCHERS: dict[str, Matcher] = {
    "tf32": Matcher("tf32", match_tf32, "float32 matmul on Hopper -> the 3xTF32 program (two splits and a TF32 "
                                        "wgmma GEMM, float32-accurate) in the function's place",
                    substitute=substitute_kernel),
    "gemm": Matcher("gemm", match_gemm, "float32 matmul (batched, B transposed or shared) with an elementwise "
                                        "epilogue -> GemmTemplate"),
    "wgmma": Matcher("wgmma", match_wgmma, "float16/bfloat16 matmul (float32 accumulate, out in its type) on Hopper "
                                          "-> the wgmma template's kernel in the function's place",
                     substitute=substitute_kernel),
    "fp8": Matcher("fp8", match_fp8, "e4m3/e5m2 matmul (float32 accumulate, B as [n, k], out float16/bfloat16) on "
                                    "Hopper -> the 8-bit wgmma template's kernel in the function's place",
                   substitute=substitute_kernel),
    "tensor_core": Matcher("tensor_core", match_tensor_core, "float16/bfloat16 matmul -> the mma.sync template "
                                                             "(CUDA)"),
    "rows": Matcher("rows", match_rows, "softmax, layer norm, RMS norm, sum/mean/max over the last axis, with "
                                        "elementwise stages -> RowTemplate"),
}


def without_reason(without: Collection[str]) -> str | None:
    """Why ``without`` (matchers a user turns off) is not a list of ``MATCHERS`` names, or None."""
    unknown = sorted(set(without) - set(MATCHERS))
    return (f"unknown template matcher {', '.join(unknown)}: choose from {', '.join(MATCHERS)}" if unknown
            else None)


def _matchers(without: Collection[str]) -> list[Matcher]:
    reason = without_reason(without)
    if reason:
        from ..core.errors import TvmExtError

        raise TvmExtError(reason)
    return [m for name, m in MATCHERS.items() if name not in without]


def match_substitute(name: str, func: Any, target: TargetInfo, without: Collection[str] = ()) -> TaskMatch | None:
    """The first substituting matcher (``Matcher.substitute``) whose pattern takes ``func``, or
    None: what a compiled model replaces with a tuned config's kernel (built there, not here).
    ``without``: matchers turned off (e.g. ``tf32`` for CUDA-core float32 GEMMs)."""
    if dynamic_shape_reason(func):
        return None
    for matcher in _matchers(without):
        if matcher.substitute is not None:
            found = matcher.match(func, target)
            if not isinstance(found, NoMatch):
                return TaskMatch(name, found[0], found[1], matcher=matcher.name)
    return None


def _last_line(exc: Exception) -> str:
    text = [line for line in str(exc).strip().splitlines() if line.strip()]
    return text[-1] if text else type(exc).__name__


def match_task(name: str, func: Any, target: TargetInfo, without: Collection[str] = ()) -> TaskMatch:
    """The template that schedules ``func``: each matcher's pattern (but those in ``without``),
    then the template's default config scheduled on the function and lowered
    (``program.lower_check``)."""
    from ..measure.program import lower_check

    dynamic = dynamic_shape_reason(func)
    if dynamic:
        return TaskMatch(name, None, None, dynamic)
    if not any(_is_reduction(b) for b in root_blocks(func)[1]):
        return TaskMatch(name, None, None, "no reduction (elementwise or data movement): no template")
    reasons: list[NoMatch] = []
    for matcher in _matchers(without):
        found = matcher.match(func, target)
        if isinstance(found, NoMatch):
            reasons.append(found)
            continue
        template, site = found
        try:
            config = template.default_config(target)
            if matcher.substitute is not None:  # the kernel that would take the function's place builds
                matcher.substitute(func, template, site, config, target)
            else:
                sch = template.schedule(config, target, func=func, site=site)
                lower_check(sch.mod, target, template.pass_config(config, target))
        except Exception as exc:  # e.g. an epilogue that cannot join the write-back stage
            reasons.append(NoMatch(f"{template.name} pattern found but not schedulable: {_last_line(exc)}", True))
            continue
        return TaskMatch(name, template, site, matcher=matcher.name)
    near = [r.reason for r in reasons if r.near]
    return TaskMatch(name, None, None, "; ".join(near or [r.reason for r in reasons]))
