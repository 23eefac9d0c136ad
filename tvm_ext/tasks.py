"""Matching TVM's PrimFuncs (Relax tuning tasks) to our templates.

TVM's Relax lowering (``LegalizeOps`` + ``FuseOps`` + ``FuseTIR``) produces PrimFuncs
we did not write: a ``matmul`` block, often followed by fused elementwise blocks
(bias add, activation).  A template can only be applied to such a function if we
recognise its computation by pattern, so the match is structural: a GEMM is one
reduction block ``C[i, j] += A[i, k] * B[k, j]`` (fp32, static shapes, A and B
parameters of the function) plus spatial blocks after it.  A function that looks
right but still cannot be scheduled (the template's default config fails on it)
is not a match either: the caller then falls back to TVM's default schedules.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .schedules.gemm import GemmTemplate, MatmulSite
from .target import TargetInfo


@dataclass(frozen=True)
class TaskMatch:
    """A PrimFunc and the template (with its site) that schedules it, or why none does."""

    name: str
    template: GemmTemplate | None
    site: MatmulSite | None
    reason: str = ""  # why no template applies; empty when matched

    @property
    def matched(self) -> bool:
        return self.template is not None


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


def find_matmul(func: Any) -> tuple[tuple[int, int, int], MatmulSite] | str:
    """``((M, N, K), site)`` of the GEMM in ``func``, or the reason it is not one."""
    from tvm import s_tir
    from tvm.tirx import Add, BufferStore, IterVar, Mul

    sch = s_tir.Schedule(func)
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    reductions = [b for b in blocks if any(iv.iter_type == IterVar.CommReduce for iv in b.iter_vars)]
    if len(reductions) != 1:
        return f"{len(reductions)} reduction blocks (a GEMM has one)"
    mm = reductions[0]
    kinds = [iv.iter_type for iv in mm.iter_vars]
    if kinds != [IterVar.DataPar, IterVar.DataPar, IterVar.CommReduce]:
        return "the reduction is not over (i, j, k) (batched or higher-rank matmul)"
    extents = [_static(iv.dom.extent) for iv in mm.iter_vars]
    if None in extents:
        return "dynamic shape"
    vi, vj, vk = (iv.var for iv in mm.iter_vars)
    store = mm.body
    if not isinstance(store, BufferStore) or len(mm.writes) != 1 or len(mm.reads) != 2:
        return "the reduction is not C[i, j] += A[i, k] * B[k, j]"
    out = store.buffer
    if str(out.dtype) != "float32":
        return f"dtype {out.dtype} (the GEMM template is fp32)"
    value = store.value
    if (not isinstance(value, Add) or not _load_of(value.a, out)
            or not isinstance(value.b, Mul) or len(store.indices) != 2
            or not (_is_var(store.indices[0], vi) and _is_var(store.indices[1], vj))):
        return "the reduction is not C[i, j] += A[i, k] * B[k, j]"
    loads = (value.b.a, value.b.b)
    if not all(_is_load(x) and len(x.indices) == 2 for x in loads):
        return "the reduction is not C[i, j] += A[i, k] * B[k, j]"
    role: dict[str, Any] = {}
    for load in loads:
        i0, i1 = load.indices
        if _is_var(i0, vi) and _is_var(i1, vk):
            role["A"] = load.source
        elif _is_var(i0, vk) and _is_var(i1, vj):
            role["B"] = load.source
    if set(role) != {"A", "B"}:
        return "operand layout is not A[i, k], B[k, j] (transposed operands are not supported)"
    if any(str(role[n].dtype) != "float32" for n in role):
        return "operands are not fp32"
    read_pos = {r.source.name: pos for pos, r in enumerate(mm.reads)}
    if any(role[n].name not in read_pos for n in role):
        return "the reduction's reads do not name A and B"
    if not all(any(p.same_as(role[n]) for p in func.params) for n in role):
        return "A or B is computed inside the function (a fused producer)"
    others = [b for b in blocks if not b.same_as(mm)]
    for b in others:
        if any(iv.iter_type != IterVar.DataPar for iv in b.iter_vars):
            return f"block {b.name_hint} after the matmul is not elementwise"
    epilogue = tuple(b.name_hint for b in others)
    m, n, k = extents
    return (m, n, k), MatmulSite(block=mm.name_hint, a=read_pos[role["A"].name],
                                 b=read_pos[role["B"].name], epilogue=epilogue)


def match_task(name: str, func: Any, target: TargetInfo) -> TaskMatch:
    """The template that schedules ``func``: pattern first, then a trial schedule."""
    found = find_matmul(func)
    if isinstance(found, str):
        return TaskMatch(name, None, None, f"not a GEMM: {found}")
    (m, n, k), site = found
    template = GemmTemplate(m, n, k)
    try:
        template.schedule(template.default_config(target), target, func=func, site=site)
    except Exception as exc:  # e.g. an epilogue that cannot join the write-back stage
        text = [line for line in str(exc).strip().splitlines() if line.strip()]
        return TaskMatch(name, None, None, f"GEMM pattern found but not schedulable: "
                                           f"{text[-1] if text else type(exc).__name__}")
    return TaskMatch(name, template, site)
