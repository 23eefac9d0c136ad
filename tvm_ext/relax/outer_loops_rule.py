"""The last dlight rule: each top-level block's loops on blocks and threads, what is inside serial.

Why: TVM's rules (``Fallback`` included) give up on a function whose blocks nest a reduction
with window extents that vary with the output position, as an adaptive pool's whose output does
not divide its input (``adaptive_avg_pool1d(x, 3)`` on 7 steps): the model then stopped with
"no schedule".  Where the last top-level block (the output's) is spatial, one thread an output
element (that block's loops fused, split by the threads a block takes, the blocks before it
computed in the same thread into registers) runs the nested window serially; where that block
(alone in the function) reduces over axes after its spatial ones (an adaptive max pool's window
of one row: ``adaptive_max_pool1d``), its spatial loops go on the threads and the reduction runs
serially in each; a function of any other shape is left to the error it had.
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
            if not blocks:
                return None
            last = blocks[-1]  # the output's block on the threads; each block before it computed
            loops = sch.get_loops(last)  # in its thread, into registers (no buffer between kernels)
            kinds = [iv.iter_type for iv in sch.get(last).iter_vars]
            spatial = kinds.index(2) if 2 in kinds else len(kinds)  # its reduction axes last, serial
            if not loops or spatial == 0 or len(loops) != len(kinds) or any(k != 2 for k in kinds[spatial:]) \
                    or (spatial < len(kinds) and len(blocks) > 1):
                return None  # the output a reduction over everything: the other rules' (or no one's)
            loops = loops[:spatial]
            fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
            outer, inner = sch.split(fused, [None, THREADS])
            sch.bind(outer, "blockIdx.x")
            sch.bind(inner, "threadIdx.x")
            for block in reversed(blocks[:-1]):
                sch.compute_at(block, inner)
                sch.set_scope(block, 0, "local")
            return sch

    return OuterLoopsOnThreads()
