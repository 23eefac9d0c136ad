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
from tvm_ext.schedules.gemm.wgmma_steps import cluster_words
from tvm_ext.schedules.gemm.wgmma_layout import KernelLayout

from .step_common import cell_math
from .step_variant import StepSizes

CELL_TILE_COLUMNS = 96  # 32 units' three gates: W_hh's (K, N) rows read in N atoms of 32 columns
CELL_TILE_STAGES = 8
CELL_TALL_TILE_STAGES = 6  # with 128 rows (7 fit, 1-3 % slower: docs/results/gru.md)
# hid_cell -> (rows of a tile, K slices): 1 K whole behind a producer warpgroup, 2 K in halves in a
# cluster of two blocks, 3 the same with 128-row tiles (two consumer warpgroups, W_hh's tile read once
# for both)
CELL_FORMS = {1: (64, 1), 2: (64, 2), 3: (128, 2)}


def cell_tile(tile: WgmmaTile, hidden: int, form: int = 1) -> WgmmaTile:
    """The tile of the hidden GEMM with the cell in its store (``hid_cell`` ``form``), in
    ``tile``'s operand (the ``hid_wgmma`` tile's): 96 columns (32 units), 8 stages (6 with 128
    rows; fewer where K has fewer k steps), loaded by the TMA, launched early, stored from the
    registers, a tile a block; K whole behind a producer warpgroup (faster than 128-row tiles and
    than the tile without the producer at B128 H1024-H2048 and B256 H1024: docs/results/gru.md),
    or in halves, the two blocks of a cluster adding them (``wgmma_steps.cluster_reduction``)."""
    rows, split = CELL_FORMS[form]
    stages = min(CELL_TILE_STAGES if rows == 64 else CELL_TALL_TILE_STAGES, hidden // tile.bk // split + 2)
    return WgmmaTile(rows, CELL_TILE_COLUMNS, stages, 1, smem_epilogue=False, operand=tile.operand, tma=True,
                     specialized=split == 1, pdl=True, split=split, cluster=split > 1)


def cell_blocks(batch: int, hidden: int, dirs: int, form: int = 1) -> int:
    """Blocks of the step kernel with the cell in its store (``hid_cell`` ``form``): a tile of 32
    units each, or two a tile where K is split."""
    rows, split = CELL_FORMS[form]
    return -(-batch // rows) * (hidden // (CELL_TILE_COLUMNS // 3)) * dirs * split


def cell_tile_reason(tile: WgmmaTile, batch: int, hidden: int) -> str | None:
    """Why the cell cannot run in the store of ``tile`` (``cell_tile``) at this batch and hidden
    size (one line), or None."""
    return gate_reason(tile, 3 * hidden, "KN", hidden) or wgmma_reason(tile, batch, 3 * hidden, hidden, b_layout="KN")


@dataclass(frozen=True)
class CellStore:
    """The step's cell as the wgmma kernel's own store (``wgmma_steps.OwnStore``): the kernel is
    ``main(h, W_hh, b_hh, gi, h, step, layer, h_out, out, h_n)`` (h twice: the GEMM's A, and the
    state the cell blends)."""

    sizes: StepSizes
    kind: str = "cuda"

    def cell(self, L: KernelLayout) -> Callable[..., None]:
        """The macro ``cell(outputs, bias, d, row, unit, sum_r, sum_z, sum_n, h_new)``: the cell of
        (``row``, ``unit``) of direction ``d`` from the three gates' sums, h' into ``h_new[0]`` and
        stored (rows past the batch computed at one below it, not stored)."""
        from tvm.script import tirx as T

        s = self.sizes
        hidden = s.hidden

        def gh(value: Any, bias: Any, d: Any, gate: int, unit: Any) -> Any:  # the sum plus b_hh, as gh stores it
            return T.Cast(s.gh_dtype, value + T.Cast("float32", bias[d, gate * hidden + unit]))

        @T.macro
        def cell(outputs: Any, bias: Any, d: Any, row: Any, unit: Any, sum_r: Any, sum_z: Any, sum_n: Any,
                 h_new: Any) -> None:
            gi, h, step, layer, h_out, out, h_n = outputs
            t = T.meta_var(T.if_then_else(d == 0, step, s.seq - 1 - step))
            gi_row = T.meta_var(t * s.batch + L.epilogue_row(row))
            col = T.meta_var(d * 3 * hidden + unit)
            h_new[0] = cell_math(T, gi[gi_row, col], gi[gi_row, col + hidden], gi[gi_row, col + 2 * hidden],
                                 gh(sum_r, bias, d, 0, unit), gh(sum_z, bias, d, 1, unit),
                                 gh(sum_n, bias, d, 2, unit), h[d, L.epilogue_row(row), unit], s.math_dtype,
                                 self.kind, s.h_dtype)
            if L.in_rows(row):
                h_out[d, row, unit] = T.Cast(s.h_dtype, h_new[0])
                out[t * s.batch + row, d * hidden + unit] = T.Cast(s.out_dtype, h_new[0])
                h_n[layer * s.dirs + d, row, unit] = T.Cast(s.h_dtype, h_new[0])

        return cell

    def macro(self, L: KernelLayout) -> Callable[..., None]:
        """From the registers: a thread's pair of columns in each 8-column group of a gate's third
        holds all three gates of two units (wgmma's m64nN fragment: pair 2·group + half)."""
        from tvm.script import tirx as T

        groups = L.bn // 24
        cell = self.cell(L)

        @T.macro
        def store(outputs: Any, acc: Any, bias: Any, at: Any, row0: Any, col0: Any, tx: Any) -> None:
            h_new = T.alloc_buffer((1,), self.sizes.math_dtype, scope="local")  # computed once, stored three times
            for g in T.unroll(groups):
                for half in T.unroll(2):
                    for v in T.unroll(2):
                        cell(outputs, bias, at[0], L.fragment_row(row0, tx, half), col0 // 3 + g * 8 + tx % 4 * 2 + v,
                             acc[g * 4 + half * 2 + v], acc[(groups + g) * 4 + half * 2 + v],
                             acc[(2 * groups + g) * 4 + half * 2 + v], h_new)

        return store

    def cluster_macro(self, L: KernelLayout) -> Callable[..., None]:
        """With K split in a cluster: the block's band of rows, four units a thread, each gate's
        sums added over the cluster's blocks (16 bytes of each block's shared memory a gate)."""
        from tvm.script import tirx as T

        units = L.bn // 3
        quads = L.band * units // 4
        cell, add_words = self.cell(L), cluster_words(L)

        @T.macro
        def store(outputs: Any, bias: Any, at: Any, row0: Any, col0: Any, bid: Any, tx: Any, peer: Any) -> None:
            got = T.alloc_buffer((4,), "float32", scope="local")
            sums = T.alloc_buffer((12,), "float32", scope="local")  # r, z, n of four units
            h_new = T.alloc_buffer((1,), self.sizes.math_dtype, scope="local")
            for i in T.unroll(-(-quads // L.threads)):
                if i * L.threads + tx < quads:
                    row = T.meta_var(bid % L.split * L.band + (i * L.threads + tx) // (units // 4))
                    unit = T.meta_var((i * L.threads + tx) % (units // 4) * 4)
                    for gate in T.unroll(3):
                        add_words(sums, gate * 4, got, peer, row * L.c_stride + gate * units + unit)
                    for v in T.unroll(4):
                        cell(outputs, bias, at[0], row0 + row, col0 // 3 + unit + v, sums[v], sums[4 + v],
                             sums[8 + v], h_new)

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


def hidden_gemm(tile: WgmmaTile, sizes: StepSizes, cell: bool = False) -> Any:
    """The unfused step's hidden GEMM on wgmma: gh (dirs, B, 3H) = h (dirs, B, H) · W_hh (dirs, H,
    3H) + b_hh (dirs, 3H), a GEMM a direction, W_hh read N-major; with ``cell`` the step kernel,
    ``tile`` (``cell_tile``) taking W_hh's columns by gate and the cell in its store
    (``CellStore``)."""
    s = sizes
    return wgmma_gemm(tile, s.batch, 3 * s.hidden, s.hidden, c_dtype=s.gh_dtype, bias_dtype=s.w_dtype,
                      b_layout="KN", batch=(s.dirs,), bias_batched=True, gates=s.hidden if cell else 0,
                      store=CellStore(sizes) if cell else None)
