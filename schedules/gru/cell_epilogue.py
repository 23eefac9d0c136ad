"""The unfused step's cell in its hidden GEMM's store (``hid_cell``): one wgmma kernel a step.

Each tile's columns are the three gates of ``bn / 3`` units (W_hh's columns read as the tile's
thirds: ``KernelLayout.b_col``), so a thread's accumulators hold r, z and n of its units and it
runs the cell (S3+S4) from the registers: h' into the next state, out[t] and h_n, with no gh in
memory and no cell kernel a step.  The sums plus b_hh are rounded to gh's dtype first, as the
two-kernel step stores them, and the cell is ``step_common.cell_math``: the same h' both ways.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tvm_ext.schedules.gemm.wgmma import WgmmaTile, gate_reason, wgmma_gemm, wgmma_reason
from tvm_ext.schedules.gemm.wgmma_layout import KernelLayout

from .step_common import cell_math
from .step_variant import StepSizes

CELL_TILE_COLUMNS = 96  # 32 units' three gates: W_hh's (K, N) rows read in N atoms of 32 columns
CELL_TILE_STAGES = 8


def cell_tile(tile: WgmmaTile, hidden: int) -> WgmmaTile:
    """The tile of the hidden GEMM with the cell in its store, in ``tile``'s operand (the
    ``hid_wgmma`` tile's): 64 rows and 96 columns (32 units), 8 stages (fewer where K has fewer
    k steps), loaded by the TMA behind a producer warpgroup, launched early, stored from the
    registers, a tile a block: faster than 128-row tiles and than the tile without the producer
    at B128 H1024-H2048 and B256 H1024 (docs/results/gru.md)."""
    stages = min(CELL_TILE_STAGES, hidden // tile.bk + 2)
    return WgmmaTile(64, CELL_TILE_COLUMNS, stages, 1, smem_epilogue=False, operand=tile.operand, tma=True,
                     specialized=True, pdl=True)


def cell_blocks(batch: int, hidden: int, dirs: int) -> int:
    """Blocks of the step kernel with the cell in its store: a tile of 64 rows and 32 units each."""
    return -(-batch // 64) * (hidden // (CELL_TILE_COLUMNS // 3)) * dirs


def cell_tile_reason(tile: WgmmaTile, batch: int, hidden: int) -> str | None:
    """Why the cell cannot run in the store of ``tile`` (``cell_tile``) at this batch and hidden
    size (one line), or None."""
    return gate_reason(tile, 3 * hidden, "KN", hidden) or wgmma_reason(tile, batch, 3 * hidden, hidden, b_layout="KN")


def _gate_sum(L: KernelLayout, acc: Any, bias: Any, d: Any, gate: int, g: int, half: int, v: int, unit: Any,
              hidden: int, gh_dtype: str) -> Any:
    """gh of ``gate`` at the thread's unit: its accumulator (8-column group ``g`` of the gate's
    third of the tile, row ``half``, column ``v`` of the pair) plus b_hh, rounded to gh's dtype."""
    from tvm.script import tirx as T

    index = (gate * (L.bn // 24) + g) * 4 + half * 2 + v  # wgmma's m64nN fragment: pair 2·group + half
    return T.Cast(gh_dtype, acc[index] + T.Cast("float32", bias[d, gate * hidden + unit]))


@dataclass(frozen=True)
class CellStore:
    """The step's cell as the wgmma kernel's own store (``wgmma_steps.OwnStore``): the kernel is
    ``main(h, W_hh, b_hh, gi, h, step, layer, h_out, out, h_n)`` (h twice: the GEMM's A, and the
    state the cell blends)."""

    sizes: StepSizes
    kind: str = "cuda"

    def macro(self, L: KernelLayout) -> Callable[..., None]:
        from tvm.script import tirx as T

        s = self.sizes
        hidden, gates3, groups = s.hidden, 3 * s.hidden, L.bn // 24

        @T.macro
        def store(outputs: Any, acc: Any, bias: Any, at: Any, row0: Any, col0: Any, tx: Any) -> None:
            gi, h, step, layer, h_out, out, h_n = outputs
            h_new = T.alloc_buffer((1,), s.math_dtype, scope="local")  # computed once, stored three times
            d = T.meta_var(at[0])
            t = T.meta_var(T.if_then_else(d == 0, step, s.seq - 1 - step))
            for g in T.unroll(groups):
                for half in T.unroll(2):
                    row = T.meta_var(L.fragment_row(row0, tx, half))
                    below = T.meta_var(L.epilogue_row(row))
                    for v in T.unroll(2):
                        unit = T.meta_var(col0 // 3 + g * 8 + tx % 4 * 2 + v)
                        col = T.meta_var(d * gates3 + unit)
                        h_new[0] = cell_math(
                            T, gi[t * s.batch + below, col], gi[t * s.batch + below, col + hidden],
                            gi[t * s.batch + below, col + 2 * hidden],
                            _gate_sum(L, acc, bias, d, 0, g, half, v, unit, hidden, s.gh_dtype),
                            _gate_sum(L, acc, bias, d, 1, g, half, v, unit, hidden, s.gh_dtype),
                            _gate_sum(L, acc, bias, d, 2, g, half, v, unit, hidden, s.gh_dtype),
                            h[d, below, unit], s.math_dtype, self.kind, s.h_dtype)
                        if L.in_rows(row):
                            h_out[d, row, unit] = T.Cast(s.h_dtype, h_new[0])
                            out[t * s.batch + row, d * hidden + unit] = T.Cast(s.out_dtype, h_new[0])
                            h_n[layer * s.dirs + d, row, unit] = T.Cast(s.h_dtype, h_new[0])

        return store

    def prim_func(self, L: KernelLayout, run: Callable[..., None]) -> Any:
        from tvm.script import tirx as T

        s = self.sizes
        state, bias_shape = (s.dirs, s.batch, s.hidden), (s.dirs, 3 * s.hidden)
        gi_shape, out_shape = (s.seq * s.batch, s.dirs * 3 * s.hidden), (s.seq * s.batch, s.dirs * s.hidden)
        h_n_shape = (s.layers * s.dirs, s.batch, s.hidden)

        @T.prim_func
        def main(A: T.Buffer(L.a_shape, L.in_dtype), Bt: T.Buffer(L.bt_shape, L.in_dtype),
                 bias: T.Buffer(bias_shape, s.w_dtype), gi: T.Buffer(gi_shape, s.gi_dtype),
                 h: T.Buffer(state, s.h_dtype), step: T.int32, layer: T.int32, h_out: T.Buffer(state, s.h_dtype),
                 out: T.Buffer(out_shape, s.out_dtype), h_n: T.Buffer(h_n_shape, s.h_dtype)):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            run(A, Bt, bias, (gi, h, step, layer, h_out, out, h_n), None)

        return main


def cell_gemm(tile: WgmmaTile, sizes: StepSizes, kind: str = "cuda") -> Any:
    """The step kernel: h (dirs, B, H) · W_hh (dirs, H, 3H) + b_hh on ``tile`` (``cell_tile``),
    the cell in its store (``CellStore``)."""
    s = sizes
    return wgmma_gemm(tile, s.batch, 3 * s.hidden, s.hidden, c_dtype=s.gh_dtype, bias_dtype=s.w_dtype,
                      b_layout="KN", batch=(s.dirs,), bias_batched=True, gates=s.hidden,
                      store=CellStore(sizes, kind))
