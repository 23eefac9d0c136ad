"""The last dlight rule: each top-level block's loops on blocks and threads, what is inside serial.

Why: TVM's rules (``Fallback`` included) give up on a function whose blocks nest a reduction
with window extents that vary with the output position, as an adaptive pool's whose output does
not divide its input (``adaptive_avg_pool1d(x, 3)`` on 7 steps): the model then stopped with
"no schedule".  Where the last top-level block (the output's) is spatial, one thread an output
element (that block's loops fused, split by the threads a block takes, the blocks before it
computed in the same thread into registers) runs the nested window serially; a function of any
other shape is left to the error it had.
"""
from __future__ import annotations

from typing import Any

THREADS = 256  # threads a block (what dlight's fallback takes on most GPUs)


def outer_loops_rule() -> Any:
    """The rule, a ``dlight`` GPU schedule rule (made on first use: dlight imports TVM)."""
    from tvm import s_tir
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

    class OuterLoopsOnThreads(GPUScheduleRule):
        """Each top-level block's loops fused onto blocks and threads (the module docstring)."""

        def apply(self, func: Any, target: Any, _: bool) -> Any:
            if not self.is_target_available(target):
                return None
            sch = s_tir.Schedule(func)
            blocks = sch.get_child_blocks(sch.get_sblock("root"))
            if not blocks or any(iv.iter_type != 0 for iv in sch.get(blocks[-1]).iter_vars):
                return None  # the output a reduction: the other rules' (or no one's)
            last = blocks[-1]  # the output's block on the threads; each block before it computed
            loops = sch.get_loops(last)  # in its thread, into registers (no buffer between kernels)
            if not loops:
                return None
            fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
            outer, inner = sch.split(fused, [None, THREADS])
            sch.bind(outer, "blockIdx.x")
            sch.bind(inner, "threadIdx.x")
            for block in reversed(blocks[:-1]):
                sch.compute_at(block, inner)
                sch.set_scope(block, 0, "local")
            return sch

    return OuterLoopsOnThreads()
