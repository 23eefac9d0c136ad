"""The persistent GRU step kernel on the tensor cores (knob ``step_tc``): every step's gate
dot products ``h · W_hh`` through ``ldmatrix`` + ``mma.sync.m16n8k16``, W_hh's block slice
in shared memory for all T steps, the cell on the accumulators, one launch per layer.

Why a kernel of its own: at large batch the fused step kernel's dot products on the CUDA
cores are the floor (B64 H1024: 403 MFLOP a step, several microseconds at the float32 SIMT rate), while
the tensor cores do them in well under a microsecond; a 16-bit W_hh (6 MB at H1024) fits
the SMs' shared memory, so it is read from memory once per layer instead of every step.
It is written as the loops TVM lowers a schedule to (launch threads, shared and register
arrays, the PTX intrinsics), parameterised by its knobs and compiled by ``tvm.compile`` like
any kernel: that way the cell reads the ``mma.sync`` accumulators where they are, in
registers (a tensorized schedule stores them to a buffer first), and the W fill stands
outside the step loop.

A block owns ``units`` hidden units of one direction (all three gates: 3·units columns of
the gate GEMM; the LSTM's four: ``cell``) and ``rows`` batch rows (16 per warp along M); ``k_warps`` warps split the dot
products over k (their partial sums meet in shared memory) and ``n_warps`` split the units
(each its own units' three gates over all k: no partial sums, but every warp reads all of the
block's h, so they meet at a block barrier after copying it).  Per step: each warp copies
its share of the block's rows and k of h into shared memory in up to ``H_CHUNKS``
``cp.async`` groups; with one warp along the units it multiplies chunk c (``ldmatrix.x4`` of
A, ``ldmatrix.x4.trans`` of B, two ``mma.sync`` per 16x16x16) while its later chunks are in
flight.  Then the first k warp of each (row tile, unit share) runs the cell on its
accumulators: a lane's accumulators hold the r, z and n sums of the same (row, unit) pairs,
so the cell needs no exchange, and its gi was loaded into registers before the previous
barrier.  h' goes to the other state slot and the output, and the blocks meet at
``tvm_ext.lowering.step_loop``'s grid barrier.

W_hh's slice sits in shared memory as k rows of 3·units columns, warp share by warp share
(each share gate by gate), with no padding: its 16-byte chunks are XOR-swizzled by k
(``w_chunk``) so the 8 rows one ``ldmatrix`` phase reads lie on distinct banks.  The padding
it replaces cost 8 % of the slice, which at 32 units and H1024 is what keeps 16-row blocks
out of shared memory: with them each block reads half the h of 32-row blocks from L2 a step.

Rows past the batch and k past the hidden size are zeros in shared memory (any batch and
hidden size run); units past the hidden size are computed on zero weights and not stored.

With float32 h and W_hh (``step_tc`` 2 with ``step_flags``: ``split``) the same kernel runs the
split kernel's arithmetic (``split_step.py``): W_hh's slice is staged as float16 high and low
parts, each polled float32 word is split into the same two parts, and a k slice is three
products (``tensor_core_products.py``); exchanging words instead of meeting at the grid barrier,
it is the faster of the two wherever its shared memory holds W's parts and all its rows of h.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm_ext.cost_model.hardware import HardwareModel
from tvm_ext.core.space import Config
from tvm_ext.lowering.step_loop import BARRIER_WORDS, BARRIERS, SPIN_LIMIT, grid_barrier
from tvm_ext.schedules.gemm.wgmma_layout import counted_words
from tvm_ext.target import TargetInfo

from .tensor_core_layout import (MAX_W_REGISTERS, MMA_M, MMA_N, OPERANDS, TC_ACC_SETS, TC_N_WARPS,
                                 TC_ROWS, TC_UNITS, WARP, TcKernelLayout, TcStepShape, acc_row_col, w_chunk)
from .step_common import CELL_GATES, GRU_CELL, LSTM_CELL, state_width
from .tensor_core_cell import (GI_SEEN_WORDS, cell_and_store_macro, keep_h_macro, load_gi_macro, unseen_gi_macro,
                               wait_gi_macro)
from .tensor_core_poll import poll_h_macro
from .split import high_part, low_part, scaled_weight
from .tensor_core_products import h_low, load_w_global_macro, load_w_macro, products_macro, w_low
from .step_variant import (CLUSTER_STEP_KNOBS, FLAG_STEP_KNOBS, SIMT_STEP_KNOBS, CountedGiWords, StepSizes, StepVariant,
                           fused_threads_reason, mma_grid_reason)


def tc_step_func(steps: int, batch: int, hidden: int, dirs: int, layers: int, *, units: int, rows: int,
                 k_warps: int, operand: str, gi_dtype: str, gh_dtype: str, math_dtype: str, out_dtype: str,
                 barrier: int, flags: bool = False, n_warps: int = 1, acc_sets: int = 1,
                 frags_ahead: bool = False, w_held: int = 0, poll_bytes: int = 8, split: bool = False,
                 split_pairs: bool = False, gi_ready: tuple[int, int] = (0, 0), name: str = "gru_steps",
                 w_regs: int = MAX_W_REGISTERS, warp_h: bool = False, stacked: bool = False,
                 cell: str = GRU_CELL) -> Any:
    """The persistent tensor-core step kernel of one layer as a lowered PrimFunc:
    (gi, hs, w, bias, layer, out, h_n, bar), the signature of the fused step kernel's
    persistent form (``tvm_ext.lowering.step_loop.loop_steps``), so the plan calls either alike.
    ``barrier`` indexes ``tvm_ext.lowering.step_loop.BARRIERS`` (the knob ``step_barrier``).

    ``flags`` (the knob ``step_flags``): no grid barrier; h goes between blocks as 8-byte
    words of ``hx`` (a further parameter), two adjacent units' 16-bit values and the step as
    a tag (``step_common.pack_pair``), each written with one relaxed store by the lane whose
    accumulators hold the pair, and polled by the warps that read those rows and k until the
    tag says the step, as the flag-exchange kernel does (``flag_step.py``: why two slots
    suffice, and the poll limit that turns a grid that is not resident into an error);
    ``poll_bytes`` 16: two adjacent words a load.

    ``split`` (``step_tc`` 2 with flags): float32 h and W_hh (``operand`` float16, their parts'
    type); a word is one unit's float32 value and the tag (the flag-exchange kernel's words),
    split into high and low parts by the warps that poll it; the products are the split
    kernel's three (``split_step.py``: W_hh's parts scaled by ``SPLIT_WEIGHT_SCALE``); the cell's
    lane keeps its units' float32 h in registers from step to step; ``split_pairs``
    (``step_split_words`` 2): two units' float32 values a word and the step's tag as one bit
    (``step_common.float_pair``), half the words to poll.

    ``gi_ready`` (rows, count), with flags: gi comes from an input GEMM still running (the knob
    ``step_overlap``): the kernel takes ``ready`` (int32, one a tile row of that many rows of gi),
    and before loading a step's gi it waits until its tile rows' counts reach ``count``
    (``wait_gi_macro``), reading gi from L2.  ``warp_h`` (``step_tc_warp_h``): the polled h stored
    by PTX, so a warp starts its products without a block barrier (``poll_h_macro``); TVM may place
    h_s where w_s was once W's fragments are in registers and cannot see those stores, so one block
    barrier follows the fragments' loads (without it, grids of two blocks an SM read torn W).  ``stacked``
    (``step_tc_stack``): h's low parts under its high parts in the m16 tile (``tensor_core_products``).

    ``cell`` ``"lstm"``: the LSTM's four gates and cell (``tensor_core_cell.py``), the state
    (2, dirs, batch, 2·hidden): h, then c, each cell lane keeping its c in registers."""
    shape = TcStepShape(batch, hidden, dirs, units, rows, k_warps, operand, n_warps, acc_sets, frags_ahead, w_held,
                        poll_bytes, split, split_pairs, w_regs, warp_h, stacked, CELL_GATES[cell])
    layout = TcKernelLayout.of(steps, layers, shape, gi_dtype=gi_dtype, gh_dtype=gh_dtype, math_dtype=math_dtype,
                               out_dtype=out_dtype, flags=flags, gi_ready=gi_ready if flags else (0, 0), cell=cell)
    kernel = _kernel(layout)
    if flags:
        return kernel.with_attr("global_symbol", name)
    return with_grid_barrier(kernel, BARRIERS[barrier]).with_attr("global_symbol", name)


def _kernel(L: TcKernelLayout) -> Any:
    """The kernel with its parts in order: the block's W_hh slice, h padding and b_h once, then
    per step h in and the products, the k warps' sums, the cell and the store, and the step's
    end (the barrier mark, or with flags a block sync)."""
    from tvm.script import tirx as T

    shape = L.shape
    steps, batch, hidden, dirs, layers, G = L.steps, shape.batch, shape.hidden, shape.dirs, L.layers, L.gates
    operand, gi_dtype, out_dtype, flags, blocks = shape.operand, L.gi_dtype, L.out_dtype, L.flags, shape.blocks
    (grid_x, grid_y, _), sw, sh, n_tiles = L.grid, shape.w_stride, shape.h_stride, shape.n_tiles
    m_warps, n_warps, k_warps, U, warp_units = L.m_warps, shape.n_warps, shape.k_warps, shape.units, L.warp_units
    slot_words, warp_k, copy_k = L.slot_words, L.warp_k, L.copy_k
    stage_once, load_gi, step_products = _stage_once_macro(L), load_gi_macro(L), _step_products_macro(L)
    sum_k_warps, cell_and_store = _sum_k_warps_macro(L), cell_and_store_macro(L)
    load_w, held_slices, split, parts, state = load_w_macro(L), shape.held_slices, shape.split, shape.parts, L.state
    load_w_global = load_w_global_macro(L)
    keep_h, unseen = keep_h_macro(L), unseen_gi_macro()
    lstm = L.cell == LSTM_CELL
    keep_c, width = keep_h_macro(L, hidden), state_width(L.cell, hidden)
    wait_gi = wait_gi_macro(L.steps, L.shape.batch, L.shape.rows, L.ready_rows, L.ready_count)

    @T.macro
    def body(gi, hs, w, bias, layer, out, h_n, bar, hx, ready):  # type: ignore[no-untyped-def]
        bx = T.launch_thread("blockIdx.x", grid_x)
        by = T.launch_thread("blockIdx.y", grid_y)
        bz = T.launch_thread("blockIdx.z", dirs)
        tx = T.launch_thread("threadIdx.x", WARP)
        ty = T.launch_thread("threadIdx.y", m_warps * n_warps * k_warps)
        w_s = T.alloc_buffer((max(shape.w_rows, 1) * sw * parts,), operand, scope="shared.dyn")
        h_s = T.alloc_buffer((shape.rows * sh * parts,), operand, scope="shared.dyn")
        part = T.alloc_buffer((max(L.partial_tiles * n_tiles * 4 * WARP, 1),), "float32", scope="shared.dyn")
        a_frag = T.alloc_buffer((L.a_frag_size,), operand, scope="local")
        b_frag = T.alloc_buffer((L.b_frag_size,), operand, scope="local")
        acc = T.alloc_buffer((n_tiles * 4 * (shape.acc_sets + split),), "float32", scope="local")
        b_h = T.alloc_buffer((n_tiles * 2,), "float32", scope="local")
        gi_reg = T.alloc_buffer((shape.gate_count * L.unit_tiles * 4,), gi_dtype, scope="local")
        got = T.alloc_buffer((L.poll_words,), "uint64", scope="local")
        poll = T.alloc_buffer((2,), "int32", scope="local")  # [polls so far, all tags seen]
        h_rounded = T.alloc_buffer((4,), operand, scope="local")  # with flags: the lane's h' in the state type
        h_val = T.alloc_buffer((2,), L.math_dtype, scope="local")  # the cell's h' and z, computed once
        h_kept = T.alloc_buffer((L.unit_tiles * 4 if split else 1,), state, scope="local")  # split: the lane's h
        c_kept = T.alloc_buffer((L.unit_tiles * 4 if lstm else 1,), L.math_dtype, scope="local")  # the LSTM's c
        seen = T.alloc_buffer((GI_SEEN_WORDS if L.counted else 1,), "int32", scope="local")  # ``unseen_gi_macro``
        tid = T.meta_var(ty * WARP + tx)
        mi = T.meta_var(ty % m_warps)
        ni = T.meta_var(ty // m_warps % n_warps)
        ki = T.meta_var(ty // (m_warps * n_warps))
        j0 = T.meta_var(bx * U + ni * warp_units)  # the warp's first unit
        m0 = T.meta_var(by * shape.rows)
        copy_k0 = T.meta_var(ki * warp_k + ni * copy_k)  # where the warp's copy of h starts
        stage_once(w, bias, w_s, h_s, b_h, bx, bz, tid, j0, m0, tx)
        if ki == 0:
            if L.counted:
                poll[0] = 0
                unseen(seen)
                wait_gi(ready, poll, seen, 0, bz, m0)
            load_gi(gi, gi_reg, 0, bz, j0, m0, mi, tx)
            if split:
                keep_h(hs, h_kept, bz, j0, m0, mi, tx)
            if lstm:
                keep_c(hs, c_kept, bz, j0, m0, mi, tx)
        if flags:
            poll[0] = 0
        T.tvm_storage_sync("shared")
        if held_slices > 0:  # the warp's W_hh fragments (of its first held_slices k slices), once for all steps
            if shape.w_held == 3:
                load_w_global(w, b_frag, bx, bz, ni, ki, tx)
            else:
                load_w(w_s, b_frag, ni, ki, tx)
                if shape.warp_h:  # h_s, stored by PTX the barrier pass does not see, may take w_s's place
                    T.tvm_storage_sync("shared")
        for s in T.serial(steps):
            step_products(h_s, hs, hx, w_s, a_frag, b_frag, acc, got, poll, s, bz, m0, mi, ni, ki, copy_k0, tx)
            sum_k_warps(part, acc, mi, ni, ki, tx)
            if ki == 0:
                cell_and_store(gi, hs, hx, out, h_n, h_s, acc, b_h, gi_reg, h_rounded, h_val, h_kept, layer, s, bz, j0,
                               m0, mi, tx, ready, poll, seen, c_kept)
            if flags:
                T.tvm_storage_sync("shared")  # the next step's h overwrites h_s
            else:
                T.evaluate(T.call_extern("int32", BARRIER_MARK, (s + 1) * blocks, tx == 0 and ty == 0))
        if flags and poll[0] >= SPIN_LIMIT:
            bar[1] = 1

    if L.counted:
        row_tiles = counted_words(steps * batch, L.ready_rows)

        @T.prim_func(private=True)
        def kernel_counted(gi: T.Buffer((steps * batch, dirs * G), gi_dtype),
                           hs: T.Buffer((2, dirs, batch, width), state), w: T.Buffer((dirs, hidden, G), state),
                           bias: T.Buffer((dirs, G), state), layer: T.int32,
                           out: T.Buffer((steps * batch, dirs * hidden), out_dtype),
                           h_n: T.Buffer((layers * dirs, batch, hidden), state),
                           bar: T.Buffer((BARRIER_WORDS,), "int32"), hx: T.Buffer((2 * slot_words,), "uint64"),
                           ready: T.Buffer((row_tiles,), "int32")):
            T.func_attr({"tirx.noalias": True})
            body(gi, hs, w, bias, layer, out, h_n, bar, hx, ready)

        return kernel_counted

    @T.prim_func(private=True)
    def kernel(gi: T.Buffer((steps * batch, dirs * G), gi_dtype), hs: T.Buffer((2, dirs, batch, width), state),
               w: T.Buffer((dirs, hidden, G), state), bias: T.Buffer((dirs, G), state), layer: T.int32,
               out: T.Buffer((steps * batch, dirs * hidden), out_dtype),
               h_n: T.Buffer((layers * dirs, batch, hidden), state), bar: T.Buffer((BARRIER_WORDS,), "int32"),
               hx: T.Buffer((2 * slot_words,), "uint64")):
        T.func_attr({"tirx.noalias": True})
        body(gi, hs, w, bias, layer, out, h_n, bar, hx, None)

    return kernel


def _stage_once_macro(L: TcKernelLayout) -> Any:
    """The block's W_hh slice in shared memory, the h padding zeroed and the lane's b_h in
    registers: everything the steps read but never write, staged once."""
    from tvm import tirx
    from tvm.script import tirx as T

    shape = L.shape
    hidden, G, K, U, sw, sh = shape.hidden, L.gates, shape.k_extent, shape.units, shape.w_stride, shape.h_stride
    threads, vec, warp_units, w_chunks, unit_tiles = shape.threads, L.vec, L.warp_units, L.w_chunks, L.unit_tiles
    batch, n_tiles, zero_op = shape.batch, shape.n_tiles, tirx.const(0, shape.operand)
    gates = shape.gate_count
    w_vectors, h_vectors = shape.w_rows * gates * U // vec, shape.rows * K // vec
    split, w_lo, h_lo = shape.split, w_low(L), h_low(L)

    @T.macro
    def stage_once(w, bias, w_s, h_s, b_h, bx, bz, tid, j0, m0, tx):  # type: ignore[no-untyped-def]
        # W_hh's slice of this block, all k, once for all steps: column (n, g, u) of row k (the
        # n-th warp's share, gate g, its unit u) holds W[k, g * H + bx * U + n * warp_units + u]
        for it in T.unroll(-(-w_vectors // threads)):
            f = T.meta_var(it * threads + tid)
            row = T.meta_var(f // (gates * U // vec))  # W's shared row, of k row k
            k = T.meta_var(shape.w_k(row))
            col = T.meta_var(f % (gates * U // vec) * vec)
            g = T.meta_var(col % (gates * warp_units) // warp_units)
            unit = T.meta_var(bx * U + col // (gates * warp_units) * warp_units + col % warp_units)
            at = T.meta_var(row * sw + w_chunk(row, col // 8, w_chunks) * 8 + col % 8)
            if split:  # the high part, and the float16 rounding of the rest K rows on
                if f < w_vectors:
                    for v in T.unroll(vec):
                        w_s[at + v] = high_part(scaled_weight(w, bz, k, g * hidden + unit + v, hidden, unit + v,
                                                              gates))
                        w_s[w_lo + at + v] = low_part(scaled_weight(w, bz, k, g * hidden + unit + v, hidden,
                                                                    unit + v, gates))
            elif f < w_vectors:
                if k < hidden and unit < hidden:
                    for v in T.vectorized(vec):
                        w_s[at + v] = w[bz, k, g * hidden + unit + v]
                else:
                    for v in T.vectorized(vec):
                        w_s[at + v] = zero_op
        # the h rows past the batch and k past the hidden size: zeros, once (the steps copy the rest)
        for it in T.unroll(-(-h_vectors // threads)):
            f = T.meta_var(it * threads + tid)
            r = T.meta_var(f // (K // vec))
            k = T.meta_var(f % (K // vec) * vec)
            if f < h_vectors and (m0 + r >= batch or k >= hidden):
                for v in T.vectorized(vec):
                    h_s[r * sh + k + v] = zero_op
                if split:
                    for v in T.vectorized(vec):
                        h_s[h_lo + r * sh + k + v] = zero_op
        # b_h of the lane's units (two per n8 tile of the warp), once
        for t in T.unroll(n_tiles):
            for e in T.unroll(2):
                unit = T.meta_var(j0 + t % unit_tiles * MMA_N + acc_row_col(tx, e)[1])  # e: 0, 1
                b_h[t * 2 + e] = T.if_then_else(
                    unit < hidden, T.cast(bias[bz, T.min(t // unit_tiles * hidden + unit, G - 1)], "float32"),
                    T.float32(0))

    return stage_once


def _copy_h_macro(L: TcKernelLayout) -> Any:
    """One chunk of a warp's copy of h from the state slot into shared memory."""
    from tvm.script import tirx as T

    batch, hidden, sh = L.shape.batch, L.shape.hidden, L.shape.h_stride
    chunk_vectors, copy_chunk_k, vec = L.chunk_vectors, L.copy_chunk_k, L.vec

    @T.macro
    def copy_h(h_s, hs, step, bz, m0, mi, k0, c, tx):  # type: ignore[no-untyped-def]
        """Chunk ``c`` of the warp's copy of h: its 16 rows, k from ``k0``."""
        for it in T.unroll(chunk_vectors):
            f = T.meta_var(it * WARP + tx)
            r = T.meta_var(mi * MMA_M + f // (copy_chunk_k // vec))
            k = T.meta_var(k0 + c * copy_chunk_k + f % (copy_chunk_k // vec) * vec)
            if m0 + r < batch and k < hidden:
                for v in T.vectorized(vec):
                    h_s[r * sh + k + v] = hs[step % 2, bz, m0 + r, k + v]

    return copy_h


def _step_products_macro(L: TcKernelLayout) -> Any:
    """A step's h into shared memory and the warp's products on it: with flags polled from the
    exchange words; else copied from the state slot in cp.async groups, with one warp along the
    units the products on chunk c starting while the later chunks are still in flight, with
    more once every warp's copy is in."""
    from tvm.script import tirx as T

    n_tiles, n_warps, chunks, copy_chunks, asynchronous = L.shape.n_tiles, L.shape.n_warps, L.chunks, \
        L.copy_chunks, L.asynchronous
    products, copy_h, poll_h = products_macro(L), _copy_h_macro(L), poll_h_macro(L)
    flags, acc_sets, split, stacked = L.flags, L.shape.acc_sets, L.shape.split, L.shape.stacked

    @T.macro
    def step_products(h_s, hs, hx, w_s, a_frag, b_frag, acc, got, poll, s, bz, m0, mi, ni, ki, copy_k0,  # type: ignore[no-untyped-def]
                      tx):
        if flags:  # the words of the warp's rows and k range, polled until their tags say s
            for i in T.unroll(n_tiles * 4 * (acc_sets + split)):  # (split: and the cross products' set)
                acc[i] = T.float32(0)
            poll_h(h_s, hx, got, poll, s, bz, m0, mi, copy_k0, tx)
            if n_warps == 1:  # the warp reads only the h it polled
                T.evaluate(T.call_extern("void", "__syncwarp"))
            else:  # and the other unit warps' share of it
                T.tvm_storage_sync("shared")
            for c in T.unroll(chunks):
                products(h_s, w_s, a_frag, b_frag, acc, mi, ni, ki, c, tx)
        else:
            for c in T.unroll(copy_chunks):
                if asynchronous:
                    with T.attr(0, "async_commit_queue_scope", 0):
                        with T.attr(0, "async_scope", 1):
                            copy_h(h_s, hs, s, bz, m0, mi, copy_k0, c, tx)
                else:
                    copy_h(h_s, hs, s, bz, m0, mi, copy_k0, c, tx)
            for i in T.unroll(n_tiles * 4 * acc_sets):
                acc[i] = T.float32(0)
            if n_warps == 1:
                for c in T.unroll(chunks):
                    with T.attr(0, "async_wait_queue_scope", 0):
                        with T.attr(0, "async_wait_inflight_count", chunks - 1 - c if asynchronous else 0):
                            T.evaluate(T.call_extern("void", "__syncwarp"))  # the lanes' copies are in
                            products(h_s, w_s, a_frag, b_frag, acc, mi, ni, ki, c, tx)
            else:
                with T.attr(0, "async_wait_queue_scope", 0):
                    with T.attr(0, "async_wait_inflight_count", 0):
                        T.tvm_storage_sync("shared")  # every warp's copies are in
                for c in T.unroll(chunks):
                    products(h_s, w_s, a_frag, b_frag, acc, mi, ni, ki, c, tx)
        if acc_sets + split > 1:  # the other sets into the first
            for j in T.unroll(1, acc_sets + split):
                for i in T.unroll(n_tiles * 4):
                    acc[i] = acc[i] + acc[j * n_tiles * 4 + i]
        if stacked:  # each n8 tile's rows 8-15 (the low parts' products) into rows 0-7, the same lane's
            for t in T.unroll(n_tiles):
                for e in T.unroll(2):
                    acc[t * 4 + e] = acc[t * 4 + e] + acc[t * 4 + 2 + e]

    return step_products


def _sum_k_warps_macro(L: TcKernelLayout) -> Any:
    """With k warps: the other k warps' partial sums into the first's accumulators (16-bit state
    at batch 8 or less: only those of the rows 0-7 a tile's lanes hold, rows 8-15 being padding;
    measured faster there and slower with float32 parts, docs/results/gru.md; stacked parts: rows
    8-15 were folded into 0-7)."""
    skipped = L.shape.batch <= MMA_M // 2 and (not L.shape.split or L.shape.stacked)
    return k_warp_sums_macro(L.shape.k_warps, L.shape.n_warps, L.m_warps, L.shape.n_tiles * 4,
                             upper_rows=not skipped)



def k_warp_sums_macro(k_warps: int, n_warps: int, m_warps: int, sums: int, upper_rows: bool = True) -> Any:
    """With ``k_warps`` > 1: the later k warps' first ``sums`` accumulators, in the lane layout,
    added to the first k warp's through shared memory (``part``), behind one block barrier (which
    also tells the first k warp that every warp's h is in: the cell reads it); both tensor-core
    step kernels' warps split k this way.  ``upper_rows`` False: only the accumulators of the
    lane's rows in the m16 tile's first eight (elements 0 and 1 of each n8 tile), where the
    other eight are padding for every block."""
    from tvm.script import tirx as T

    live = sums if upper_rows else sums // 2

    def element(i: Any) -> Any:
        """The accumulator of live sum ``i``: every one, or elements 0 and 1 of each n8 tile."""
        return i if upper_rows else i // 2 * 4 + i % 2

    def part_at(q: Any, ni: Any, mi: Any, i: Any, tx: Any) -> Any:
        """Accumulator ``i`` of lane ``tx`` of k warp ``q + 1`` (warp ``ni`` along the units,
        ``mi`` along M) in the partial sums."""
        return (((q * n_warps + ni) * m_warps + mi) * sums + i) * WARP + tx

    @T.macro
    def sum_k_warps(part, acc, mi, ni, ki, tx):  # type: ignore[no-untyped-def]
        if k_warps > 1:  # the other k warps' partial sums, in the lane layout, to the first
            if ki > 0:
                for i in T.unroll(live):
                    part[part_at(ki - 1, ni, mi, element(i), tx)] = acc[element(i)]
            T.tvm_storage_sync("shared")
            if ki == 0:
                for q in T.unroll(k_warps - 1):
                    for i in T.unroll(live):
                        acc[element(i)] = acc[element(i)] + part[part_at(q, ni, mi, element(i), tx)]

    return sum_k_warps


BARRIER_MARK = "tvm_ext_grid_barrier"  # (expected arrivals, leader): where the step's grid barrier goes


def with_grid_barrier(func: Any, kind: str, replaced: int = 2, kept: int = 0) -> Any:
    """``func`` with its barrier mark replaced by ``tvm_ext.lowering.step_loop``'s grid barrier, and
    its ``replaced`` parameters before the last ``kept`` (``bar``, and ``hx`` where it has one) by
    the barrier's, the kernel's own stores to ``bar`` going to the barrier's."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    barrier: list[Any] = []

    def replace(node: Any, mutator: Any) -> Any:
        call = node.value
        if isinstance(call, tvm.ir.Call) and call.op.name == "tirx.call_extern" and call.args[0].value == BARRIER_MARK:
            stmt, bar = grid_barrier(kind, call.args[1], call.args[2])
            barrier.append(bar)
            return stmt
        return mutator.default_mutate(node)

    body = tvm_ffi.structural_mutate(func.body, [(tirx.Evaluate, replace)])
    (bar,) = barrier  # the kernel's own ``bar`` (and ``hx``) parameters by the barrier's
    params = list(func.params)
    last = len(params) - kept
    own = params[last - replaced]

    def rebind(node: Any, mutator: Any) -> Any:  # the kernel's stores to its own bar (a timed-out flag)
        return tirx.BufferStore(bar, node.value, node.indices) if node.buffer.same_as(own) else node

    body = tvm_ffi.structural_mutate(body, [(tirx.BufferStore, rebind)])
    return tirx.PrimFunc([*params[:last - replaced], bar, *params[last:]], body, attrs=func.attrs)


@dataclass(frozen=True)
class TensorCoreStep(CountedGiWords, StepVariant):
    """The tensor-core persistent step kernel (``step_tc`` 1): ``step_j`` units and
    ``step_tc_rows`` rows a block, ``step_tc_kw`` warps splitting k and ``step_tc_nw`` the units;
    between steps the grid barrier ``step_barrier``, or with ``step_flags`` h exchanged as tagged
    words (two 16-bit values a word); with ``step_tc`` 2 and ``step_flags`` float32 h and W_hh as
    float16 parts (``split``), one float32 value a word."""

    units: int
    rows: int
    k_warps: int
    n_warps: int
    acc_sets: int
    frags_ahead: bool
    w_held: int
    barrier: int
    flags: bool
    loop: int
    cluster: bool = False  # step_flags 2, which this kernel does not have
    w_regs: int = MAX_W_REGISTERS  # step_tc_wregs
    warp_h: bool = False  # step_tc_warp_h
    poll_bytes: int = 8
    split: bool = False  # step_tc 2: float32 h and W_hh as float16 high and low parts, three products
    split_pairs: bool = False  # step_split_words 2: two float32 values a word, a tag bit
    stacked: bool = False  # step_tc_stack: h's low parts in the m16 tile's padding rows 8-15
    # step_overlap 1: gi's rows counted by the input GEMM in tiles of this many rows, complete at the count
    # (set by the template, which knows the GEMM's tile: ``GruTemplate.step_variant``)
    gi_ready: tuple[int, int] = (0, 0)

    @property
    def splits_state(self) -> bool:  # type: ignore[override]
        return self.split

    @classmethod
    def of(cls, sizes: StepSizes, c: Config) -> "TensorCoreStep":
        return cls(sizes, units=c.step_j, rows=c.step_tc_rows, k_warps=c.step_tc_kw, n_warps=c.step_tc_nw,
                   acc_sets=c.step_tc_acc, frags_ahead=bool(c.step_tc_frag),
                   w_held=c.step_tc_wreg, barrier=c.step_barrier,
                   flags=bool(c.step_flags), loop=c.step_loop,
                   cluster=c.step_flags == 2, poll_bytes=c.step_tc_poll, split=c.step_tc == 2,
                   split_pairs=c.step_split_words == 2, w_regs=c.step_tc_wregs, warp_h=bool(c.step_tc_warp_h),
                   stacked=bool(c.step_tc_stack))

    @property
    def shape(self) -> TcStepShape:
        s = self.sizes
        operand = "float16" if self.split else s.h_dtype
        return TcStepShape(s.batch, s.hidden, s.dirs, self.units, self.rows, self.k_warps, operand, self.n_warps,
                           self.acc_sets, self.frags_ahead, self.w_held, self.poll_bytes, self.split,
                           self.split_pairs, self.w_regs, self.warp_h, self.stacked, s.gates)

    def unshown(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        # the CUDA-core kernel's knobs do not apply (with flags: nor the barrier)
        return self.unshown_prefixes, (SIMT_STEP_KNOBS + FLAG_STEP_KNOBS + CLUSTER_STEP_KNOBS + ("step_tc_ahead",)
                                       + (("step_barrier",) if self.flags else ()))

    def reason(self, target: TargetInfo) -> str | None:
        """Why it cannot run here: types, tile, and a grid that must be resident (persistent)
        with its shared memory."""
        return (fused_threads_reason(self.units, target) or self._persistent_reason(target) or self._tile_reason()
                or self._device_reason(target))

    def _persistent_reason(self, target: TargetInfo) -> str | None:
        if target.kind != "cuda" or self.loop != 2:
            return "tensor-core step kernel (step_tc 1) is CUDA's persistent kernel only (step_loop 2)"
        if self.cluster:
            return "tensor-core step kernel (step_tc 1) exchanges h as tagged words (step_flags 1), not in a cluster"
        return None

    def _tile_reason(self) -> str | None:
        """Why these types or sizes cannot run on the kernel (None: they can)."""
        h_dtype, w_dtype, acc_dtype, shape = self.sizes.h_dtype, self.sizes.w_dtype, self.sizes.acc_dtype, self.shape
        if self.sizes.cell == LSTM_CELL and not self.flags:
            return "the LSTM's tensor-core step kernel exchanges h as tagged words (step_flags 1)"
        if self.split and (h_dtype, w_dtype) != ("float32", "float32"):
            return (f"split tensor-core step kernel (step_tc 2) needs float32 h and W_hh, got {h_dtype} and {w_dtype} "
                    f"(16-bit states: step_tc 1)")
        if self.split_pairs and not (self.split and self.flags):
            return ("tensor-core step kernel: two float32 values a word (step_split_words 2) are the split kernel's "
                    "exchange words (step_tc 2 with step_flags 1)")
        if self.stacked and not (self.split and self.flags and shape.rows == MMA_M and shape.batch <= MMA_M // 2):
            return ("tensor-core step kernel: h's low parts stacked in the m16 tile's rows 8-15 (step_tc_stack) need "
                    f"float32 parts with exchange words (step_tc 2, step_flags 1), 16 rows a block (step_tc_rows, "
                    f"{shape.rows} here) and batch 8 or less ({shape.batch} here)")
        if self.split and shape.frags_ahead:
            return "split tensor-core step kernel with exchange words: no fragments a slice ahead (step_tc_frag)"
        if not self.split and (h_dtype != w_dtype or w_dtype not in OPERANDS):
            return (f"tensor-core step kernel (step_tc 1) needs h and W_hh both float16 or both bfloat16, got "
                    f"{h_dtype} and {w_dtype}")
        if acc_dtype != "float32":
            return f"tensor-core step kernel (step_tc 1) accumulates in float32, not {acc_dtype}"
        if shape.units not in TC_UNITS:
            return f"tensor-core step kernel: step_j {shape.units} units per block; allowed: {TC_UNITS}"
        if shape.rows not in TC_ROWS:
            return f"tensor-core step kernel: {shape.rows} rows per block; allowed: {TC_ROWS}"
        if shape.n_warps not in TC_N_WARPS:
            return f"tensor-core step kernel: {shape.n_warps} warps along the units; allowed: {TC_N_WARPS}"
        if shape.units % (MMA_N * shape.n_warps):
            return (f"tensor-core step kernel: step_j {shape.units} units over {shape.n_warps} warps (step_tc_nw) "
                    f"is not 8 units or more a warp")
        if shape.acc_sets not in TC_ACC_SETS:
            return f"tensor-core step kernel: {shape.acc_sets} accumulator sets; allowed: {TC_ACC_SETS}"
        if shape.acc_sets > shape.warp_slices:
            return (f"tensor-core step kernel: {shape.acc_sets} accumulator sets (step_tc_acc) for a warp's "
                    f"{shape.warp_slices} k slices")
        if shape.w_held and shape.frags_ahead:
            return ("tensor-core step kernel: W in registers (step_tc_wreg) loads no W fragments a slice ahead "
                    "(step_tc_frag)")
        if shape.w_held == 1 and shape.w_registers > shape.w_regs:
            return (f"tensor-core step kernel: W in registers (step_tc_wreg) needs {shape.w_registers} registers "
                    f"a lane > {shape.w_regs} (step_tc_wregs)")
        if shape.w_held == 2 and shape.w_registers <= shape.w_regs:
            return (f"tensor-core step kernel: all of W's fragments fit in registers ({shape.w_registers} a lane): "
                    f"step_tc_wreg 1, not a part (2)")
        if shape.w_held == 3 and self.split:
            return ("split tensor-core step kernel: W's fragments are staged in shared memory as parts; loading "
                    "them from global memory (step_tc_wreg 3) is the 16-bit kernel's")
        if shape.w_held == 0 and shape.w_regs != MAX_W_REGISTERS:
            return (f"tensor-core step kernel: no W fragments in registers (step_tc_wreg 0) takes no register "
                    f"budget (step_tc_wregs {shape.w_regs}; it is {MAX_W_REGISTERS} there)")
        if shape.poll_bytes == 16 and not self.flags:
            return "tensor-core step kernel: 16-byte polls (step_tc_poll) need exchange words (step_flags 1)"
        if shape.poll_bytes == 16 and shape.hidden % (2 * shape.word_values):
            return (f"tensor-core step kernel: 16-byte polls (step_tc_poll) read word pairs 16-byte aligned, "
                    f"hidden {shape.hidden} not a multiple of {2 * shape.word_values}")
        pairs = shape.poll_bytes // 8 * shape.word_values % 2 == 0  # values a poll load, in half2 stores
        if shape.warp_h and not (self.flags and shape.n_warps == 1 and pairs):
            return ("tensor-core step kernel: h stored by PTX without a block barrier (step_tc_warp_h) needs exchange "
                    "words (step_flags 1), one warp along the units (step_tc_nw 1: a warp reads only the h it "
                    "polled) and an even count of values a poll load (step_tc_poll 16 with one float32 value a word)")
        if shape.rows > 16 and shape.rows >= 2 * shape.batch:
            return f"tensor-core step kernel: {shape.rows} rows per block for batch {shape.batch} (half of them idle)"
        return None

    def _device_reason(self, target: TargetInfo) -> str | None:
        shape = self.shape
        return mma_grid_reason("tensor-core step kernel", shape.threads, shape.blocks, shape.shared_bytes(),
                               "W_hh slice, h rows and partial sums", target,
                               lane_registers=HardwareModel.from_target(target).max_registers_per_thread)

    @property
    def counts_gi(self) -> bool:
        return self.flags

    def init_layout(self) -> dict[str, Any]:
        return {"pingpong": True, "barrier": True, "flags": self.flags, "paired": not self.split,
                "float_pairs": self.split_pairs, "ready_words": self.ready_words}

    def async_copy(self) -> bool:
        return True  # h is copied in cp.async groups

    def lowered_kernels(self) -> dict[str, Any]:
        s = self.sizes
        return {f"{s.cell}_steps": tc_step_func(s.seq, s.batch, s.hidden, s.dirs, s.layers, units=self.units,
                                          rows=self.rows, k_warps=self.k_warps, operand=self.shape.operand,
                                          gi_dtype=s.gi_dtype, gh_dtype=s.gh_dtype, math_dtype=s.math_dtype,
                                          out_dtype=s.out_dtype, barrier=self.barrier, flags=self.flags,
                                          n_warps=self.n_warps, acc_sets=self.acc_sets,
                                          frags_ahead=self.frags_ahead, w_held=self.w_held,
                                          poll_bytes=self.poll_bytes, split=self.split,
                                          split_pairs=self.split_pairs, gi_ready=self.gi_ready,
                                          w_regs=self.w_regs, warp_h=self.warp_h, stacked=self.stacked,
                                          name=f"{s.cell}_steps", cell=s.cell)}
