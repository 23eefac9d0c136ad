"""The unfused step's cell in its hidden GEMM's store (``hid_cell``): one wgmma kernel a step.

Each tile's columns are the three gates of ``bn / 3`` units (W_hh's columns read as the tile's
thirds: ``KernelLayout.b_col``), so a thread's accumulators hold r, z and n of its units and it
runs the cell (S3+S4) from the registers: h' into the next state, out[t] and h_n, with no gh in
memory and no cell kernel a step.  The sums plus b_hh are rounded to gh's dtype first, as the
two-kernel step stores them, and the cell is ``step_common.cell_math``: the same h' both ways.

float32 (``tf32_parts``): the GEMM of TF32 parts of depth 3H (``gemm_3xtf32``'s three products,
float32-accurate on the tensor cores), each k tile three k steps in turn, h_lo·W_hi, h_hi·W_lo,
h_hi·W_hi (``TF32_K_PARTS``): A the state's parts ``[h_lo | h_hi]``, which the cell writes beside
h' for the next step, W_hh's parts ``[hi | lo]`` stored (3H, 2H) K-major, its rows permuted once as
the weights are loaded so each tile's rows are its units' r, z and n (32 units, or ``hid_cell_units``)
(``split_hidden_weight_func``); W_hi's tile is read twice in a row, the second time from L2, so
each step reads W_hh's parts once.  The sums are promoted every few k steps as ``gemm_3xtf32`` does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tvm_ext.schedules.gemm.gemm_3xtf32 import A_TWO_PARTS, B_TWO_PARTS, TF32_K_PARTS, promote_steps, tf32_part
from tvm_ext.schedules.gemm.wgmma import (WgmmaTile, gate_reason, k_parts_reason, promote_reason, wgmma_gemm,
                                         wgmma_reason)
from tvm_ext.schedules.gemm.wgmma_steps import cluster_words
from tvm_ext.schedules.gemm.wgmma_layout import KernelLayout

from .step_common import cell_math
from .step_variant import StepSizes

CELL_TILE_UNITS = 32  # a tile's units (``hid_cell_units``); 24 only where W_hh is read (N, K)
CELL_TILE_COLUMNS = 3 * CELL_TILE_UNITS  # their three gates: W_hh's (K, N) rows read in N atoms of 32 columns
CELL_TILE_STAGES = 8
# with more rows: 128 (7 fit, 1-3 % slower: docs/results/gru.md), 192, 256 (as many as fit)
CELL_TALL_TILE_STAGES = {128: 6, 192: 6, 256: 5}
# hid_cell -> (rows of a tile, K slices): 1 K whole behind a producer warpgroup, 2 K in halves in a
# cluster of two blocks, 3 the same with 128-row tiles (two consumer warpgroups, W_hh's tile read once
# for both), 4 128-row tiles with K whole behind a producer warpgroup, 5 192-row tiles (three consumer
# warpgroups) with K in halves, 6 256-row tiles (four) with K in halves
CELL_FORMS = {1: (64, 1), 2: (64, 2), 3: (128, 2), 4: (128, 1), 5: (192, 2), 6: (256, 2)}
# float32 on TF32 parts: the stored parts of h (A) and of W_hh (B), each k tile's three k steps
# reading them in turn (``TF32_K_PARTS``), as ``gemm_3xtf32``'s two stored parts
H_PARTS, W_PARTS = A_TWO_PARTS, B_TWO_PARTS


def tf32_parts(tile: WgmmaTile) -> bool:
    """Whether the hidden GEMM of ``tile`` runs on TF32 parts (a float32 GRU): depth 3H."""
    return tile.operand == "tf32"


def hidden_depth(tile: WgmmaTile, hidden: int) -> int:
    """The hidden GEMM's depth on ``tile``: H, or 3H of TF32 parts (``tf32_parts``)."""
    return 3 * hidden if tf32_parts(tile) else hidden


def cell_tile(tile: WgmmaTile, hidden: int, form: int = 1, share: bool = False,
              units: int = CELL_TILE_UNITS) -> WgmmaTile:
    """The tile of the hidden GEMM with the cell in its store (``hid_cell`` ``form``), in
    ``tile``'s operand (the ``hid_wgmma`` tile's): the three gates of ``units`` units
    (``hid_cell_units``: 96 columns, or 72 so that more tiles fill the SMs), 8 stages (6 with 128
    or 192 rows, 5 with 256; fewer where K has fewer k steps), loaded by the TMA, launched early,
    stored from the registers, a tile a block; K whole behind a producer warpgroup (faster than
    128-row tiles and than the tile without the producer at B128 H1024-H2048 and B256 H1024:
    docs/results/gru.md),
    or in halves, the two blocks of a cluster adding them (``wgmma_steps.cluster_reduction``).
    ``share`` (``hid_cell_share``, K whole): two adjacent tiles of a row a cluster, h's k tiles
    loaded half by each block and multicast into both (``wgmma_multicast``)."""
    rows, split = CELL_FORMS[form]
    stages = min(CELL_TALL_TILE_STAGES.get(rows, CELL_TILE_STAGES),
                 hidden_depth(tile, hidden) // tile.bk // split + 2)
    return WgmmaTile(rows, 3 * units, stages, 1, smem_epilogue=False, operand=tile.operand, tma=True,
                     specialized=split == 1, pdl=True, split=split, cluster=split > 1, multicast=share)


def cell_blocks(batch: int, hidden: int, dirs: int, form: int = 1, units: int = CELL_TILE_UNITS) -> int:
    """Blocks of the step kernel with the cell in its store (``hid_cell`` ``form``): a tile of
    ``units`` units each, or two a tile where K is split."""
    rows, split = CELL_FORMS[form]
    return -(-batch // rows) * (hidden // units) * dirs * split


def cell_tile_reason(tile: WgmmaTile, batch: int, hidden: int, transposed: bool = False) -> str | None:
    """Why the cell cannot run in the store of ``tile`` (``cell_tile``) at this batch and hidden
    size (one line), or None; ``transposed``: 16-bit W_hh read from its transposed copy in tile order."""
    parts = tf32_parts(tile)  # TF32 parts: Bt (3H, 2H) in tile order, three k steps a k tile
    layout, depth = "NK" if parts or transposed else "KN", hidden_depth(tile, hidden)
    reason = gate_reason(tile, 3 * hidden, layout, hidden) or wgmma_reason(tile, batch, 3 * hidden, depth,
                                                                            b_layout=layout, own_store=True)
    if not reason and layout == "NK" and hidden % 32:  # the copy's 32 x 32 tiles (``split_hidden_weight_func``)
        reason = f"W_hh's copy in tile order is made in 32 x 32 tiles: hidden {hidden} is no multiple of 32"
    if reason or not parts:
        return reason
    return promote_reason(tile, depth, promote_steps(tile, depth)) or k_parts_reason(tile, depth, "NK", TF32_K_PARTS)


def fragment_pair(L: KernelLayout, row0: Any, col0: Any, tx: Any, g: Any, half: Any, v: Any) -> tuple[Any, Any]:
    """(row, unit) of thread ``tx``'s pair of 8-column group ``g`` (``half``, ``v``) in a tile of
    three gates from ``row0``, ``col0``: wgmma's m64nN fragment holds, in each 8-column group of a
    gate's third, the pair 2·group + half of two adjacent units' r, z and n."""
    return L.fragment_row(row0, tx, half), col0 // 3 + g * 8 + tx % 4 * 2 + v


def fragment_sums(L: KernelLayout, acc: Any, g: Any, half: Any, v: Any) -> tuple[Any, Any, Any]:
    """The r, z and n sums of that pair among thread's accumulators ``acc``."""
    groups = L.bn // 24
    return tuple(acc[(gate * groups + g) * 4 + half * 2 + v] for gate in range(3))


def step_time(sizes: StepSizes, d: Any, step: Any) -> Any:
    """The time step ``step`` of direction ``d`` runs: itself, or from the end backwards."""
    from tvm.script import tirx as T

    return T.if_then_else(d == 0, step, sizes.seq - 1 - step)


def gate_input(sizes: StepSizes, L: KernelLayout, gi: Any, d: Any, step: Any, row: Any, unit: Any, gate: int) -> Any:
    """gi's input sum of gate ``gate`` for (``row``, ``unit``) of direction ``d`` at step ``step``
    (a row past the batch read one below it)."""
    col = d * 3 * sizes.hidden + unit
    return gi[step_time(sizes, d, step) * sizes.batch + L.epilogue_row(row), col + gate * sizes.hidden if gate else col]


@dataclass(frozen=True)
class CellStore:
    """The step's cell as the wgmma kernel's own store (``wgmma_steps.OwnStore``): the kernel is
    ``main(h, W_hh, b_hh, gi, h, step, layer, h_out, out, h_n)`` (h twice: the GEMM's A, and the
    state the cell blends); with ``parts`` A and W_hh are TF32 parts and h' is written as A's
    parts for the next step too: ``main(A, W_parts, b_hh, gi, h, step, layer, h_out, out, h_n, A_out)``."""

    sizes: StepSizes
    kind: str = "cuda"
    parts: bool = False
    slots: bool = False  # h and h_out are one (2, dirs, B, H) state: slots step % 2 and (step + 1) % 2

    def cell_values(self, L: KernelLayout) -> Callable[..., None]:
        """The macro ``cell(outputs, bias, d, row, unit, gi_r, gi_z, gi_n, h, sum_r, sum_z, sum_n,
        h_new)``: the cell of (``row``, ``unit``) of direction ``d`` from its input gates, state and
        the three gates' sums, h' into ``h_new[0]`` and stored (rows past the batch computed at one
        below it, not stored)."""
        from tvm.script import tirx as T

        s = self.sizes
        hidden = s.hidden

        def gh(value: Any, bias: Any, d: Any, gate: int, unit: Any) -> Any:  # the sum plus b_hh, as gh stores it
            return T.Cast(s.gh_dtype, value + T.Cast("float32", bias[d, gate * hidden + unit]))

        @T.macro
        def cell(outputs: Any, bias: Any, d: Any, row: Any, unit: Any, gi_r: Any, gi_z: Any, gi_n: Any, h: Any,
                 sum_r: Any, sum_z: Any, sum_n: Any, h_new: Any) -> None:
            step, layer, h_out, out, h_n = T.meta_var(outputs[2:7])  # then A's parts with ``parts``
            t = T.meta_var(step_time(s, d, step))
            h_out_at = T.meta_var([(step + 1) % 2] if self.slots else [])
            h_new[0] = cell_math(T, gi_r, gi_z, gi_n, gh(sum_r, bias, d, 0, unit), gh(sum_z, bias, d, 1, unit),
                                 gh(sum_n, bias, d, 2, unit), h, s.math_dtype, self.kind, s.h_dtype)
            if L.in_rows(row):
                h_out[(*h_out_at, d, row, unit)] = T.Cast(s.h_dtype, h_new[0])
                out[t * s.batch + row, d * hidden + unit] = T.Cast(s.out_dtype, h_new[0])
                h_n[layer * s.dirs + d, row, unit] = T.Cast(s.h_dtype, h_new[0])
                if self.parts:  # the next step's A: h' as TF32 parts along its row
                    a_out = T.meta_var(outputs[7])
                    a_out[d, row, unit] = tf32_part(h_new[0], H_PARTS[0])
                    a_out[d, row, hidden + unit] = tf32_part(h_new[0], H_PARTS[1])

        return cell

    def cell(self, L: KernelLayout) -> Callable[..., None]:
        """The macro ``cell(outputs, bias, d, row, unit, sum_r, sum_z, sum_n, h_new)``: ``cell_values``
        with the input gates read from gi and the state from h."""
        from tvm.script import tirx as T

        s = self.sizes
        values = self.cell_values(L)

        @T.macro
        def cell(outputs: Any, bias: Any, d: Any, row: Any, unit: Any, sum_r: Any, sum_z: Any, sum_n: Any,
                 h_new: Any) -> None:
            gi, h, step = T.meta_var(outputs[:3])
            values(outputs, bias, d, row, unit, *[gate_input(s, L, gi, d, step, row, unit, gate) for gate in range(3)],
                   h[d, L.epilogue_row(row), unit], sum_r, sum_z, sum_n, h_new)

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
                        cell(outputs, bias, at[0], *fragment_pair(L, row0, col0, tx, g, half, v),
                             *fragment_sums(L, acc, g, half, v), h_new)

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

        if self.parts:
            @T.prim_func
            def with_parts(A: T.Buffer(L.a_shape, L.in_dtype), Bt: T.Buffer(L.bt_shape, L.in_dtype),
                           bias: T.Buffer(bias_shape, s.w_dtype), gi: T.Buffer(gi_shape, s.gi_dtype),
                           h: T.Buffer(state, s.h_dtype), step: T.int32, layer: T.int32,
                           h_out: T.Buffer(state, s.h_dtype), out: T.Buffer(out_shape, s.out_dtype),
                           h_n: T.Buffer(h_n_shape, s.h_dtype), A_out: T.Buffer(L.a_shape, L.in_dtype)):
                T.func_attr({"global_symbol": "main", "tirx.noalias": True})
                run(A, Bt, bias, (gi, h, step, layer, h_out, out, h_n, A_out), None)

            return with_parts

        @T.prim_func
        def main(A: T.Buffer(L.a_shape, L.in_dtype), Bt: T.Buffer(L.bt_shape, L.in_dtype),
                 bias: T.Buffer(bias_shape, s.w_dtype), gi: T.Buffer(gi_shape, s.gi_dtype),
                 h: T.Buffer(state, s.h_dtype), step: T.int32, layer: T.int32, h_out: T.Buffer(state, s.h_dtype),
                 out: T.Buffer(out_shape, s.out_dtype), h_n: T.Buffer(h_n_shape, s.h_dtype)):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            run(A, Bt, bias, (gi, h, step, layer, h_out, out, h_n), None)

        return main


def hidden_gemm(tile: WgmmaTile, sizes: StepSizes, cell: bool = False, transposed: bool = False) -> Any:
    """The unfused step's hidden GEMM on wgmma: gh (dirs, B, 3H) = h (dirs, B, H) · W_hh (dirs, H,
    3H) + b_hh (dirs, 3H), a GEMM a direction, W_hh read N-major; with ``cell`` the step kernel,
    ``tile`` (``cell_tile``) taking W_hh's columns by gate and the cell in its store
    (``CellStore``); ``transposed`` (16-bit, ``hid_cell_bt``): W_hh read as ``split_hidden_weight_func``
    wrote it, (dirs, 3H, H) K-major in tile order, one 128-byte box a k step."""
    s = sizes
    parts = tf32_parts(tile)
    if parts or transposed:  # W_hh as Bt (N, K), rows in tile order: float32's TF32 parts or the copy
        depth = hidden_depth(tile, s.hidden)
        return wgmma_gemm(tile, s.batch, 3 * s.hidden, depth, c_dtype=s.gh_dtype, bias_dtype=s.w_dtype,
                          b_layout="NK", batch=(s.dirs,), bias_batched=True, gates=s.hidden,
                          promote=promote_steps(tile, depth) if parts else 0, store=CellStore(sizes, parts=parts),
                          k_parts=TF32_K_PARTS if parts else ())
    return wgmma_gemm(tile, s.batch, 3 * s.hidden, s.hidden, c_dtype=s.gh_dtype, bias_dtype=s.w_dtype,
                      b_layout="KN", batch=(s.dirs,), bias_batched=True, gates=s.hidden if cell else 0,
                      store=CellStore(sizes) if cell else None)


def tile_row(column: Any, hidden: int, units: int = CELL_TILE_UNITS) -> Any:
    """The row of W_hh's permuted parts (``split_hidden_weight_func``) that W_hh's column
    ``column`` (gate ``column // H``, unit ``column % H``) lands in: each tile's 3 x ``units``
    rows are its units' r, z and n in turn, as ``KernelLayout.b_col`` reads them from B stored (K, N)."""
    unit = column % hidden
    return unit // units * 3 * units + column // hidden * units + unit % units


def split_hidden_weight_func(hidden: int, dirs: int, dtype: str = "float32", units: int = CELL_TILE_UNITS) -> Any:
    """TIR: W_hh (dirs, H, 3H) float32 -> its TF32 parts (dirs, 3H, 2H), K-major as TF32 wgmma
    reads them: row ``tile_row(c)`` holds column c's ``[hi | lo]`` (``W_PARTS``) along K; a 16-bit
    ``dtype``: W_hh transposed (dirs, 3H, H) in the same row order (``hid_cell_bt``); the tiles
    of ``units`` units (``hid_cell_units``).  32 x 32 tiles transposed through shared memory (reads
    and writes coalesced); H a multiple of 32 (``cell_tile_reason``)."""
    from tvm.script import tirx as T

    n, k = 3 * hidden, hidden
    tiles_n, tiles_k = n // 32, k // 32
    two = dtype == "float32"  # TF32 parts, else the transposed copy (the buffer keeps its name: the same source)

    @T.prim_func
    def main(W: T.Buffer((dirs, k, n), dtype), parts: T.Buffer((dirs, n, 2 * k if two else k), dtype)):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        bid = T.launch_thread("blockIdx.x", dirs * tiles_k * tiles_n)
        tx = T.launch_thread("threadIdx.x", 32)
        ty = T.launch_thread("threadIdx.y", 8)
        tile = T.alloc_buffer((32 * 33,), dtype, scope="shared")  # rows padded: conflict-free columns
        d = T.meta_var(bid // (tiles_k * tiles_n))
        kt = T.meta_var(bid // tiles_n % tiles_k)
        nt = T.meta_var(bid % tiles_n)
        for i in T.unroll(4):
            tile[(ty + 8 * i) * 33 + tx] = W[d, kt * 32 + ty + 8 * i, nt * 32 + tx]
        T.tvm_storage_sync("shared")
        for i in T.unroll(4):
            row = T.meta_var(tile_row(nt * 32 + ty + 8 * i, hidden, units))
            depth = T.meta_var(kt * 32 + tx)
            value = T.meta_var(tile[tx * 33 + ty + 8 * i])
            if two:
                parts[d, row, depth] = tf32_part(value, W_PARTS[0])
                parts[d, row, k + depth] = tf32_part(value, W_PARTS[1])
            else:
                parts[d, row, depth] = value

    return main


def split_state_func(dirs: int, batch: int, hidden: int) -> Any:
    """TIR: the state h (dirs, B, H) float32 -> the first step's A, its TF32 parts (dirs, B, 2H)
    along each row (``H_PARTS``), a thread an element."""
    from tvm.script import tirx as T

    total = dirs * batch * hidden
    threads = 256

    @T.prim_func
    def main(h: T.Buffer((dirs, batch, hidden), "float32"), parts: T.Buffer((dirs, batch, 2 * hidden), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        bid = T.launch_thread("blockIdx.x", -(-total // threads))
        tx = T.launch_thread("threadIdx.x", threads)
        i = T.meta_var(bid * threads + tx)
        if i < total:
            d = T.meta_var(i // (batch * hidden))
            b = T.meta_var(i // hidden % batch)
            u = T.meta_var(i % hidden)
            parts[d, b, u] = tf32_part(h[d, b, u], H_PARTS[0])
            parts[d, b, hidden + u] = tf32_part(h[d, b, u], H_PARTS[1])

    return main
