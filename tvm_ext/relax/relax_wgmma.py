"""Relax matmuls on Hopper's warpgroup MMA: a task's PrimFunc (a matmul and the elementwise
blocks ``FuseOps`` put after it: the cast back to float16, a bias, GELU, a residual add, the
scaling of attention's scores) replaced by a written kernel with those blocks composed into its
store: the wgmma template's (``schedules/gemm/wgmma.py``) for float16, the 3xTF32 program's
(``schedules/gemm/gemm_3xtf32.py``: its two splits and the TF32 GEMM in one function) for float32.

A meta_schedule database holds schedule traces, and the wgmma kernel is a TVMScript function
built from its config, not a schedule of the task's function, so no trace can replay it.  Its
tuned config goes to the operators file instead, as the GRU's plans do, and ``compile_relax``
puts the kernel in the function's place (same parameters, same order): the Relax VM calls it as
it would have called the function.

Composing the epilogue: the elementwise blocks but the last are inlined into it (TVM's
``compute_inline``, which also resolves an intermediate read twice, as GELU's is), leaving one
expression of the matmul's element and the function's other parameters at block indices
(i, j); the kernel evaluates it on each float32 accumulator at its row and column.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..core.errors import TvmExtError
from ..core.space import Config, Space
from ..target import TargetInfo


class NotComposable(TvmExtError):
    """An epilogue the wgmma kernel's store cannot evaluate (the reason says which part)."""


LOW_FLOATS = ("float16", "bfloat16")


def _rebuild(expr: Any, var_map: list[tuple[Any, Any]], load: Any = None, widen: bool = False) -> Any:
    """``expr`` with variables replaced (``var_map``: (var, value) pairs) and each tensor load
    replaced by ``load(node)`` (without ``load``: the same tensor at its indices rebuilt).  The
    node kinds of elementwise epilogues (arithmetic, comparisons, casts, selects, intrinsic
    calls); anything else is ``NotComposable``.  ``widen``: float16/bfloat16 values become
    float32 (loads widened, narrowing casts and their constants dropped), so the whole
    expression is float32 arithmetic."""
    from tvm import tirx
    from tvm.ir import TensorLoad
    from tvm.ir.expr import Call
    from tvm.ir.prim import expr as E

    def visit(e: Any) -> Any:
        if isinstance(e, E.Var):
            return next((value for var, value in var_map if var.same_as(e)), e)
        low = widen and str(e.ty) in LOW_FLOATS
        if isinstance(e, E.FloatImm) and low:
            return tirx.const(e.value, "float32")
        if isinstance(e, (E.IntImm, E.FloatImm)):
            return e
        if isinstance(e, TensorLoad):
            loaded = load(e) if load else e.source[tuple(visit(i) for i in e.indices)]
            return tirx.Cast("float32", loaded) if widen and str(loaded.ty) in LOW_FLOATS else loaded
        if isinstance(e, E.Cast):
            value = visit(e.value)
            if low:
                return value if str(value.ty) == "float32" else tirx.Cast("float32", value)
            return tirx.Cast(str(e.ty), value)
        if isinstance(e, (E.BinaryOpExpr, E.CmpExpr, E.LogicalExpr)) and hasattr(e, "b"):
            return type(e)(visit(e.a), visit(e.b))
        if isinstance(e, E.Not):
            return E.Not(visit(e.a))
        if isinstance(e, E.Select):
            return tirx.Select(visit(e.condition), visit(e.true_value), visit(e.false_value))
        if isinstance(e, Call) and not low:
            return Call(e.op, [visit(a) for a in e.args], e.attrs, e.ty_args, None, e.ty)
        raise NotComposable(f"the epilogue has a {type(e).__name__} node, which the wgmma store does not compose")

    return visit(expr)


@dataclass(frozen=True)
class WgmmaEpilogue:
    """The function's output element as one float32 expression of placeholders: the matmul's
    float32 element ``acc`` at output row ``row`` and column ``col`` of the matrix at batch
    indices ``lead`` (none for a matmul without a batch).  The blocks'
    float16 arithmetic runs in float32, rounded once at the store, as cuBLAS's epilogues and
    PyTorch's float16 ``Linear`` compute a bias (float16 additions in the kernel also made
    ptxas serialise the wgmma: its warning C7514)."""

    expr: Any
    acc: Any
    row: Any
    col: Any
    lead: tuple[Any, ...] = ()

    def at(self, value: Any, row: Any, col: Any, lead: Any = ()) -> Any:
        """The output element for accumulator ``value`` at (``row``, ``col``) of the matrix at
        batch indices ``lead`` (TIR, in the kernel)."""
        return _rebuild(self.expr, [(self.acc, value), (self.row, row), (self.col, col),
                                    *zip(self.lead, lead, strict=True)])


@dataclass(frozen=True)
class WgmmaSite:
    """Where the matmul's operands and output are among the function's parameters, and its
    composed epilogue."""

    a: int
    b: int
    out: int
    epilogue: WgmmaEpilogue


def compose_epilogue(func: Any, block: str, epilogue: tuple[str, ...]) -> WgmmaEpilogue:
    """The epilogue blocks ``epilogue`` after matmul block ``block`` of ``func`` as one
    expression (``WgmmaEpilogue``), reading the function's parameters (a bias, a residual)
    besides the matmul's result.  ``NotComposable`` says why where it cannot be."""
    from tvm import s_tir, tirx

    sch = s_tir.Schedule(func)
    mm = sch.get(sch.get_sblock(block)).writes[0].source
    acc = tirx.Var("acc", "float32")
    row, col = tirx.Var("row", "int32"), tirx.Var("col", "int32")
    lead = tuple(tirx.Var(f"lead{i}", "int32") for i in range(len(mm.shape) - 2))
    if not epilogue:  # the matmul writes the output itself
        return WgmmaEpilogue(acc, acc, row, col, lead)
    try:
        for name in epilogue[:-1]:
            sch.compute_inline(sch.get_sblock(name))
    except Exception as exc:  # a block another one reads in a way inlining cannot follow
        raise NotComposable(f"the epilogue blocks do not inline into one: {str(exc).strip().splitlines()[-1]}") \
            from None
    last = sch.get(sch.get_sblock(epilogue[-1]))
    store = last.body
    index_vars = [iv.var for iv in last.iter_vars]
    if (not isinstance(store, tirx.BufferStore) or len(index_vars) != len(mm.shape)
            or len(store.indices) != len(index_vars)
            or not all(i.same_as(v) for i, v in zip(store.indices, index_vars))):
        raise NotComposable(f"block {epilogue[-1]} does not store its element at its own (..., i, j)")
    places = [(var, tirx.Cast(str(var.ty), value)) for var, value in zip(index_vars, (*lead, row, col))]

    def load(e: Any) -> Any:
        if e.source.same_as(mm):
            if len(e.indices) != len(index_vars) or not all(i.same_as(v) for i, v in zip(e.indices, index_vars)):
                raise NotComposable("the epilogue reads the matmul's result at another element than its own")
            return tirx.Cast(str(mm.dtype), acc)
        if not any(e.source.same_as(p) for p in func.params):
            raise NotComposable(f"the epilogue reads {e.source.name}, neither a parameter nor the matmul's result")
        return e.source[tuple(_rebuild(i, places, load) for i in e.indices)]

    return WgmmaEpilogue(_rebuild(store.value, places, load, widen=True), acc, row, col, lead)


class KernelTemplate(Protocol):
    """A template whose kernel is a written PrimFunc ``main(A, B, C)`` built from a config (the
    wgmma GEMM; the 3xTF32 program, its splits inside), with an epilogue in its store."""

    def space(self, target: TargetInfo) -> Space: ...

    def kernel_func(self, config: Config, c_dtype: str, epilogue: Any) -> Any: ...


def substitute_kernel(func: Any, template: KernelTemplate, site: WgmmaSite, config: Config,
                      target: TargetInfo) -> Any:
    """The kernel of ``config`` for task function ``func``: its parameters (A, B, the output in
    the kernel's own buffers, the epilogue's in the function's) in the function's order, built
    for sm_90a (the function's ``target``), marked scheduled (and to launch early where the
    kernel is)."""
    import tvm
    from tvm import s_tir, tirx

    from ..lowering.launch_early import is_marked, mark_launch_early
    from ..schedules.gemm.wgmma import sm_90a

    reason = template.space(target).infeasible_reason(config)
    if reason:
        raise TvmExtError(reason)
    out = func.params[site.out]
    kernel = template.kernel_func(config, str(out.dtype), site.epilogue.at)
    own = {site.a: kernel.params[0], site.b: kernel.params[1], site.out: kernel.params[2]}
    params = [own.get(i, p) for i, p in enumerate(func.params)]
    attrs = {"tirx.noalias": True, "tirx.is_scheduled": True, "target": tvm.target.Target(sm_90a(target).tvm_target())}
    substituted = tirx.PrimFunc(params, kernel.body).with_attrs(attrs)
    s_tir.analysis.verify_well_formed(substituted)  # every buffer the epilogue reads is a parameter now
    # launched early behind the kernel ahead where the kernel is (``pipeline.build_model`` builds it so)
    return mark_launch_early(substituted) if is_marked(kernel) else substituted
