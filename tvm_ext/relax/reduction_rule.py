"""dlight's ``Reduction`` rule kept off reductions that read through a division of an output index.

Why: a grouped convolution reads its input at ``ff // g * g + rc`` (output channel ``ff``,
``g`` channels a group).  TVM 0.27's ``Reduction`` rule takes that read as a split of ``ff``
and schedules the lower part as an inner spatial axis, which the read does not have: with a
kernel of one (SqueezeBERT's grouped pointwise convolutions) the kernel it made gave wrong
sums (errors of 2, or 1e37), with a kernel of three it did not build ("cross-thread reduction
requires all the reduction-related loops to be the deepest").  Such a function goes on to the
next rule (``GeneralReduction``, which computes it right); every other function gets the rule
as before.
"""
from __future__ import annotations

from typing import Any


def reads_through_divided_output_index(func: Any) -> bool:
    """Whether a reduction block of ``func`` loads at an index with a floor division or modulo
    of one of its spatial (output) iteration variables."""
    import tvm
    import tvm_ffi

    found: list[bool] = []

    def block(node: Any) -> None:
        spatial = {iv.var for iv in node.iter_vars if iv.iter_type == 0}
        if len(spatial) == len(node.iter_vars):
            return  # not a reduction

        def divided(expr: Any) -> None:
            used: list[Any] = []
            tvm_ffi.structural_walk(expr, [(tvm.tirx.Var, used.append)])
            if any(v in spatial for v in used):
                found.append(True)

        def load(node: Any) -> None:
            for index in node.indices:
                tvm_ffi.structural_walk(index, [((tvm.tirx.FloorDiv, tvm.tirx.FloorMod), divided)])

        tvm_ffi.structural_walk(node.body, [(tvm.ir.expr.TensorLoad, load)])

    tvm_ffi.structural_walk(func.body, [(tvm.s_tir.SBlock, block)])
    return bool(found)


def guarded_reduction_rule() -> Any:
    """``dlight.gpu.Reduction``, passing a function that reads through a divided output index
    to the next rule (the module docstring)."""
    from tvm.s_tir import dlight as dl

    class GuardedReduction(dl.gpu.Reduction):  # type: ignore[misc, name-defined]
        def apply(self, func: Any, target: Any, tunable: bool) -> Any:
            if reads_through_divided_output_index(func):
                return None
            return super().apply(func, target, tunable)

    return GuardedReduction()
