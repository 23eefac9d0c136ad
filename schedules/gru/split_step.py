"""The float32 GRU step on the tensor cores (``step_tc`` 2): each step's gate sums ``h · W_hh``
as three float16 products of high and low parts, the method of the float32 input GEMM
(``split.py``: ``v = hi + lo``, ``A·B ≈ A_hi·B_hi + A_hi·B_lo + A_lo·B_hi``, 22 of float32's 24
bits, float32 accumulators), in a persistent kernel behind the grid barrier.

Why: the float32 state's CUDA-core step kernel runs the dot products at a fraction of the SIMT
rate (W_hh's slice and h both read from shared memory for every multiply), while three
``mma.sync`` products do the same sums at float32 accuracy many times faster.  Why not the
16-bit tensor-core kernel with wider types: W_hh's parts take twice a float16 slice, so at
H1024 a block of 16 units holds 192 KB of them and no longer has room for all its rows of h
in shared memory.  So h is not kept whole: each step the block reads its rows of the float32
state in chunks of ``SPLIT_CHUNK_K``, ``step_tc_ahead`` chunks ahead into registers, splits
each into a ring of two shared chunks (high part, then low part, a row each) and multiplies one
chunk while the next ones are in flight.  The state stays float32 in the plan's (2, dirs, batch, hidden) slots,
so the host plan, h0 and h_n are the persistent CUDA-core kernel's.

W_hh's parts are stored times ``SPLIT_WEIGHT_SCALE`` (PyTorch's init keeps |W_hh| <= 1/sqrt(H),
whose low parts would be subnormal) and the sums multiplied by its inverse before b_hh, as
the input GEMM does; W_hh is split on the device once per layer call, so new weights need
nothing but a load.  The high-by-high product and the two cross products accumulate apart
(two chains of ``mma.sync`` in flight) and meet before the cell.

Layout as the 16-bit tensor-core kernel's (``tensor_core_step.py``): a block owns ``units``
units of one direction (their three gates) and ``rows`` batch rows, warps split the rows (16
each), the units (``step_tc_nw``) and each chunk's k slices (``step_tc_kw``: more warps to hide
the multiplies' latency, their sums meeting in shared memory once a step); W_hh's two parts are
k rows of 3·units columns with the 16-byte chunks XOR-swizzled (``w_chunk``); a lane's
accumulators hold the r, z and n sums of the same (row, unit) pairs, so the cell needs no
exchange.  Rows past the batch and k past the
hidden size are zeros; units past the hidden size are computed on zero weights, not stored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from tvm_ext.core.space import Config
from tvm_ext.cost_model.hardware import HardwareModel
from tvm_ext.lowering.step_loop import BARRIER_WORDS, BARRIERS
from tvm_ext.target import TargetInfo

from .split import SPLIT_WEIGHT_SCALE, high_part, low_part, scaled_weight
from .step_common import CELL_GATES, GRU_CELL, LSTM_CELL, cell_blend, cell_gates, lstm_c, lstm_h, state_width, stored_as
from .step_variant import (CLUSTER_STEP_KNOBS, FLAG_STEP_KNOBS, SIMT_STEP_KNOBS, StepSizes, StepVariant,
                           fused_threads_reason, mma_grid_reason)
from .tensor_core_layout import (MMA_K, MMA_M, MMA_N, TC_N_WARPS, TC_ROWS, WARP, TcKernelLayout,
                                 TcStepShape, UnitRowBlocks, acc_row_col, padded_stride, w_chunk)
from .tensor_core_cell import keep_h_macro, load_gi_macro
from .tensor_core_step import BARRIER_MARK, k_warp_sums_macro, with_grid_barrier

SPLIT_UNITS = (8, 16, 32)  # hidden units per block: 1, 2 or 4 n8 tiles per gate
SPLIT_CHUNK_K = 64  # k of h a shared chunk holds (its high and low parts side by side in a row)
# The registers a lane of the kernel wants (80-119 from nvcc where launch bounds name only the
# threads): grids whose blocks an SM leave a lane fewer are refused. The kernel is compiled with
# __launch_bounds__(threads, blocks an SM) so its grid is resident at any count (float32
# bidirectional B192 H256's three 256-thread blocks an SM and B96 H384's two 512-thread blocks,
# taken before with the threads alone, were not: the grid barrier timed out)
SPLIT_LANE_REGISTERS = 120
PART = "float16"
STATE = "float32"


@dataclass(frozen=True)
class SplitStepShape(UnitRowBlocks):
    """The sizes a split step config implies for one GRU (or LSTM) shape."""

    batch: int
    hidden: int
    dirs: int
    units: int
    rows: int
    n_warps: int
    ahead: int = 1  # chunks of h in flight in registers
    k_warps: int = 1  # warps splitting each chunk's k slices (their sums meet in shared memory)
    gate_count: int = 3  # the GRU's three gates, the LSTM's four

    @property
    def k_extent(self) -> int:
        """k rounded up to whole chunks (W_hh's rows past the hidden size are zeros)."""
        return -(-self.hidden // SPLIT_CHUNK_K) * SPLIT_CHUNK_K

    @property
    def chunks(self) -> int:
        return self.k_extent // SPLIT_CHUNK_K

    @property
    def m_warps(self) -> int:
        return self.rows // MMA_M

    @property
    def threads(self) -> int:
        return WARP * self.m_warps * self.n_warps * self.k_warps

    @property
    def warp_slices(self) -> int:
        """The 16-deep k slices of a chunk one k warp multiplies."""
        return SPLIT_CHUNK_K // MMA_K // self.k_warps

    @property
    def ring_stride(self) -> int:
        """A row of a ring chunk: the high parts of SPLIT_CHUNK_K values, then the low ones."""
        return padded_stride(2 * SPLIT_CHUNK_K, PART)

    @property
    def warp_units(self) -> int:
        return self.units // self.n_warps

    @property
    def unit_tiles(self) -> int:
        """n8 tiles of one gate a warp holds."""
        return self.warp_units // MMA_N

    @property
    def n_tiles(self) -> int:
        """n8 accumulator tiles a warp holds: its units' gates."""
        return self.gate_count * self.unit_tiles

    @property
    def loads(self) -> int:
        """float32 values of h a thread loads for each chunk."""
        return self.rows * SPLIT_CHUNK_K // self.threads

    @property
    def partial_floats(self) -> int:
        """The k warps' sums but the first's, in the lane layout (float32)."""
        return (self.k_warps - 1) * self.m_warps * self.n_warps * self.n_tiles * 4 * WARP

    def shared_bytes(self) -> int:
        """W_hh's two parts + the ring's two chunks (float16) + the k warps' partial sums."""
        return (2 * self.k_extent * self.w_stride + 2 * self.rows * self.ring_stride) * 2 + self.partial_floats * 4


def split_step_func(steps: int, batch: int, hidden: int, dirs: int, layers: int, *, units: int, rows: int,
                    n_warps: int, ahead: int, gi_dtype: str, gh_dtype: str, math_dtype: str, out_dtype: str,
                    barrier: int, k_warps: int = 1, name: str = "gru_steps", cell: str = GRU_CELL) -> Any:
    """The persistent split step kernel of one layer as a lowered PrimFunc: (gi, hs, w, bias,
    layer, out, h_n, bar), the persistent CUDA-core kernel's signature, so the plan calls either
    alike.  ``barrier`` indexes ``tvm_ext.lowering.step_loop.BARRIERS`` (``step_barrier``).
    ``cell`` ``"lstm"``: the LSTM's four gates and cell, the state (2, dirs, batch, 2·hidden): h,
    then c, each cell lane keeping its c in registers (read from the c half before the first step,
    written back after the last)."""
    gates = CELL_GATES[cell]
    shape = SplitStepShape(batch, hidden, dirs, units, rows, n_warps, ahead, k_warps, gates)
    # the 16-bit kernel's layout for its gi loads (the lane's rows and units are the same)
    gi_layout = TcKernelLayout.of(steps, layers, TcStepShape(batch, hidden, dirs, units, rows, 1, PART, n_warps,
                                                             gate_count=gates),
                                  gi_dtype=gi_dtype, gh_dtype=gh_dtype, math_dtype=math_dtype,
                                  out_dtype=out_dtype, flags=False, cell=cell)
    kernel = _kernel(shape, steps, layers, gi_layout, gh_dtype=gh_dtype, math_dtype=math_dtype,
                     out_dtype=out_dtype)
    return with_grid_barrier(kernel, BARRIERS[barrier], replaced=1).with_attr("global_symbol", name)


def _kernel(S: SplitStepShape, steps: int, layers: int, gi_layout: TcKernelLayout, *, gh_dtype: str,
            math_dtype: str, out_dtype: str) -> Any:
    """The kernel with its parts in order: W_hh's parts and b_h once; per step the cell's h and
    the first chunk of h loaded, then chunk by chunk split, multiplied and the next loaded, the
    cell and the store, and the grid barrier's mark."""
    from tvm.script import tirx as T

    batch, hidden, dirs, G, K, sw, shr = S.batch, S.hidden, S.dirs, S.gate_count * S.hidden, S.k_extent, \
        S.w_stride, S.ring_stride
    lstm, width = gi_layout.cell == LSTM_CELL, state_width(gi_layout.cell, S.hidden)
    gi_dtype, m_warps, U, chunks, blocks = gi_layout.gi_dtype, S.m_warps, S.units, S.chunks, S.blocks
    stage_once, load_chunk, split_chunk = _stage_once_macro(S), _load_chunk_macro(S), _split_chunk_macro(S)
    products, load_gi, cell_and_store = _products_macro(S), load_gi_macro(gi_layout), \
        _cell_and_store_macro(S, steps, gi_layout, gh_dtype, math_dtype, out_dtype)
    sum_k_warps, keep_c = _sum_k_warps_macro(S), keep_h_macro(gi_layout, S.hidden)

    @T.prim_func(private=True)
    def kernel(gi: T.Buffer((steps * batch, dirs * G), gi_dtype), hs: T.Buffer((2, dirs, batch, width), STATE),
               w: T.Buffer((dirs, hidden, G), STATE), bias: T.Buffer((dirs, G), STATE), layer: T.int32,
               out: T.Buffer((steps * batch, dirs * hidden), out_dtype),
               h_n: T.Buffer((layers * dirs, batch, hidden), STATE), bar: T.Buffer((BARRIER_WORDS,), "int32")):
        T.func_attr({"tirx.noalias": True})
        bx = T.launch_thread("blockIdx.x", -(-hidden // U))
        by = T.launch_thread("blockIdx.y", -(-batch // S.rows))
        bz = T.launch_thread("blockIdx.z", dirs)
        tx = T.launch_thread("threadIdx.x", WARP)
        ty = T.launch_thread("threadIdx.y", m_warps * S.n_warps * S.k_warps)
        w_s = T.alloc_buffer((2 * K * sw,), PART, scope="shared.dyn")
        ring = T.alloc_buffer((2 * S.rows * shr,), PART, scope="shared.dyn")
        part = T.alloc_buffer((max(S.partial_floats, 1),), "float32", scope="shared.dyn")
        a_frag = T.alloc_buffer((16,), PART, scope="local")  # the high part's fragment, then the low one's
        b_frag = T.alloc_buffer((16,), PART, scope="local")  # a pair of n8 tiles' high parts, then low
        acc = T.alloc_buffer((2 * S.n_tiles * 4,), "float32", scope="local")  # hi·hi, then the cross products
        b_h = T.alloc_buffer((S.n_tiles * 2,), "float32", scope="local")
        gi_reg = T.alloc_buffer((S.gate_count * S.unit_tiles * 4,), gi_dtype, scope="local")
        # the cell's h of the lane's pairs (the GRU's), or their c, kept for all steps (the LSTM's)
        h_prev = T.alloc_buffer((S.unit_tiles * 4,), STATE, scope="local")
        h_reg = T.alloc_buffer((S.ahead * S.loads,), STATE, scope="local")  # the next chunks of h, in flight
        h_val = T.alloc_buffer((2,), math_dtype, scope="local")  # the cell's h' and z, computed once
        tid = T.meta_var(ty * WARP + tx)
        mi = T.meta_var(ty % m_warps)
        ni = T.meta_var(ty // m_warps % S.n_warps)
        ki = T.meta_var(ty // (m_warps * S.n_warps))
        j0 = T.meta_var(bx * U + ni * S.warp_units)  # the warp's first unit
        m0 = T.meta_var(by * S.rows)
        stage_once(w, bias, w_s, b_h, bx, bz, tid, j0, tx)
        if ki == 0:
            load_gi(gi, gi_reg, 0, bz, j0, m0, mi, tx)
            if lstm:
                keep_c(hs, h_prev, bz, j0, m0, mi, tx)
        T.tvm_storage_sync("shared")
        for s in T.serial(steps):
            for a in T.unroll(S.ahead):
                if a < chunks:
                    load_chunk(hs, h_reg, a, s, a, bz, m0, tid)
            if not lstm:
                for t in T.unroll(S.unit_tiles):
                    for e in T.unroll(4):
                        row = T.meta_var(m0 + mi * MMA_M + acc_row_col(tx, e)[0])
                        unit = T.meta_var(j0 + t * MMA_N + acc_row_col(tx, e)[1])
                        if ki == 0 and row < batch and unit < hidden:
                            h_prev[t * 4 + e] = T.call_extern(STATE, "__ldcg",
                                                              T.address_of(hs[s % 2, bz, row, unit]))
            for i in T.unroll(2 * S.n_tiles * 4):
                acc[i] = T.float32(0)
            for c0 in T.serial(-(-chunks // S.ahead)):  # chunk c's h in register set c mod ahead
                for a in T.unroll(S.ahead):
                    c = T.meta_var(c0 * S.ahead + a)
                    if c < chunks:
                        split_chunk(ring, h_reg, a, c % 2, tid)
                        T.tvm_storage_sync("shared")  # the chunk is in; every warp is past the chunk before last
                        if c + S.ahead < chunks:
                            load_chunk(hs, h_reg, a, s, c + S.ahead, bz, m0, tid)
                        products(ring, w_s, a_frag, b_frag, acc, c, mi, ni, ki, tx)
            sum_k_warps(part, acc, mi, ni, ki, tx)
            if ki == 0:
                cell_and_store(gi, hs, out, h_n, acc, b_h, gi_reg, h_prev, h_val, layer, s, bz, j0, m0, mi, tx)
            T.evaluate(T.call_extern("int32", BARRIER_MARK, (s + 1) * blocks, tx == 0 and ty == 0))

    return kernel


def _stage_once_macro(S: SplitStepShape) -> Any:
    """W_hh's slice of the block as two float16 parts (times SPLIT_WEIGHT_SCALE) in shared
    memory, and the lane's b_h in registers, once for all steps."""
    from tvm.script import tirx as T

    hidden, gates, K, U, sw, threads = S.hidden, S.gate_count, S.k_extent, S.units, S.w_stride, S.threads
    G = gates * hidden
    warp_units, w_chunks, unit_tiles, n_tiles = S.warp_units, sw * 2 // 16, S.unit_tiles, S.n_tiles
    values = K * sw

    @T.macro
    def stage_once(w, bias, w_s, b_h, bx, bz, tid, j0, tx):  # type: ignore[no-untyped-def]
        # column (n, g, u) of row k (the n-th warp's share, gate g, its unit u) holds
        # W[k, g * H + bx * U + n * warp_units + u]; the low part K rows after the high one
        for it in T.serial(-(-values // threads)):
            f = T.meta_var(it * threads + tid)
            k = T.meta_var(f // sw)
            col = T.meta_var(f % sw)
            g = T.meta_var(col % (gates * warp_units) // warp_units)
            unit = T.meta_var(bx * U + col // (gates * warp_units) * warp_units + col % warp_units)
            at = T.meta_var(k * sw + w_chunk(k, col // 8, w_chunks) * 8 + col % 8)
            if f < values:
                scaled = T.meta_var(scaled_weight(w, bz, k, g * hidden + unit, hidden, unit, gates))
                w_s[at] = high_part(scaled)
                w_s[K * sw + at] = low_part(scaled)
        for t in T.unroll(n_tiles):
            for e in T.unroll(2):
                unit = T.meta_var(j0 + t % unit_tiles * MMA_N + acc_row_col(tx, e)[1])  # e: 0, 1
                b_h[t * 2 + e] = T.if_then_else(unit < hidden, bias[bz, T.min(t // unit_tiles * hidden + unit, G - 1)],
                                                T.float32(0))

    return stage_once


def _load_chunk_macro(S: SplitStepShape) -> Any:
    """Chunk ``c`` of the block's rows of h from state slot ``s % 2`` into a thread's register set
    ``a`` (L2 loads: another block wrote them this step; zeros past the batch and the hidden size)."""
    from tvm.script import tirx as T

    batch, hidden, threads, CK = S.batch, S.hidden, S.threads, SPLIT_CHUNK_K

    @T.macro
    def load_chunk(hs, h_reg, a, s, c, bz, m0, tid):  # type: ignore[no-untyped-def]
        for i in T.unroll(S.loads):
            f = T.meta_var(i * threads + tid)
            row = T.meta_var(m0 + f // CK)
            k = T.meta_var(c * CK + f % CK)
            if row < batch and k < hidden:
                h_reg[a * S.loads + i] = T.call_extern(STATE, "__ldcg", T.address_of(hs[s % 2, bz, row, k]))
            else:
                h_reg[a * S.loads + i] = T.float32(0)

    return load_chunk


def _split_chunk_macro(S: SplitStepShape) -> Any:
    """A thread's values of h in register set ``a`` into ring chunk ``buf``: the high part at k,
    the low one SPLIT_CHUNK_K further along the row."""
    from tvm.script import tirx as T

    threads, CK, shr, rows = S.threads, SPLIT_CHUNK_K, S.ring_stride, S.rows

    @T.macro
    def split_chunk(ring, h_reg, a, buf, tid):  # type: ignore[no-untyped-def]
        for i in T.unroll(S.loads):
            f = T.meta_var(i * threads + tid)
            at = T.meta_var(buf * rows * shr + f // CK * shr + f % CK)
            value = T.meta_var(h_reg[a * S.loads + i])
            ring[at] = high_part(value)
            ring[at + CK] = low_part(value)

    return split_chunk


def _products_macro(S: SplitStepShape) -> Any:
    """A warp's three products over its k slices of one ring chunk: per 16-deep k slice, ldmatrix
    of h's two parts and of W_hh's two parts (two n8 tiles at once, an odd last one alone), hi·hi
    into the first accumulator set, hi·lo and lo·hi into the second."""
    from tvm.script import tirx as T

    K, sw, shr, n_tiles, rows, CK = S.k_extent, S.w_stride, S.ring_stride, S.n_tiles, S.rows, SPLIT_CHUNK_K
    w_chunks, cross = sw * 2 // 16, n_tiles * 4

    def w_row(kk: Any, tile: Any, tx: Any) -> Any:
        """Where lane ``tx``'s row of n8 tile ``tile`` starts in W's high part, k slice ``kk``."""
        return (kk + tx % 16) * sw + w_chunk(tx % 16, tile, w_chunks) * 8

    def ldmatrix(trans: bool, count: int, frag: Any, at: int, buffer: Any, offset: Any) -> Any:
        return T.ptx_legacy.ldmatrix(trans, count, ".b16", frag.data, at,
                                     T.tvm_access_ptr(T.type_annotation(PART), buffer.data, offset, 8, 1), 0,
                                     dtype=PART)

    def mma(a_frag: Any, b_frag: Any, acc: Any, a_at: int, b_at: int, acc_at: Any) -> Any:
        return T.ptx_legacy.mma("m16n8k16", "row", "col", "fp16", "fp16", "fp32", a_frag.data, a_at, b_frag.data,
                                b_at, acc.data, acc_at, False, dtype="float32")

    @T.macro
    def products(ring, w_s, a_frag, b_frag, acc, c, mi, ni, ki, tx):  # type: ignore[no-untyped-def]
        for ks in T.unroll(S.warp_slices):  # k warp ki's slices of the chunk
            slice_k = T.meta_var((ki * S.warp_slices + ks) * MMA_K)
            kk = T.meta_var(c * CK + slice_k)  # W's k row
            a_at = T.meta_var(c % 2 * rows * shr + (mi * MMA_M + tx % 16) * shr + slice_k + tx // 16 * 8)
            T.evaluate(ldmatrix(False, 4, a_frag, 0, ring, a_at))
            T.evaluate(ldmatrix(False, 4, a_frag, 8, ring, a_at + CK))
            for p in T.unroll(n_tiles // 2):  # lanes 0-15 address the pair's first n8 tile, 16-31 its second
                b_at = T.meta_var(w_row(kk, ni * n_tiles + p * 2 + tx // 16, tx))
                T.evaluate(ldmatrix(True, 4, b_frag, 0, w_s, b_at))
                T.evaluate(ldmatrix(True, 4, b_frag, 8, w_s, K * sw + b_at))
                for half in T.unroll(2):
                    tile = T.meta_var((p * 2 + half) * 4)
                    T.evaluate(mma(a_frag, b_frag, acc, 0, half * 4, tile))
                    T.evaluate(mma(a_frag, b_frag, acc, 0, 8 + half * 4, cross + tile))
                    T.evaluate(mma(a_frag, b_frag, acc, 8, half * 4, cross + tile))
            if n_tiles % 2 == 1:  # an odd last n8 tile alone (lanes 0-15 address it)
                b_last = T.meta_var(w_row(kk, ni * n_tiles + n_tiles - 1, tx))
                T.evaluate(ldmatrix(True, 2, b_frag, 0, w_s, b_last))
                T.evaluate(ldmatrix(True, 2, b_frag, 8, w_s, K * sw + b_last))
                T.evaluate(mma(a_frag, b_frag, acc, 0, 0, (n_tiles - 1) * 4))
                T.evaluate(mma(a_frag, b_frag, acc, 0, 8, cross + (n_tiles - 1) * 4))
                T.evaluate(mma(a_frag, b_frag, acc, 8, 0, cross + (n_tiles - 1) * 4))

    return products


def _sum_k_warps_macro(S: SplitStepShape) -> Any:
    """Each warp's cross-product sums into its first set, then with k warps the others' sums into
    the first k warp's (``k_warp_sums_macro``, the 16-bit kernel's)."""
    from tvm.script import tirx as T

    sums = S.n_tiles * 4
    k_warp_sums = k_warp_sums_macro(S.k_warps, S.n_warps, S.m_warps, sums)

    @T.macro
    def sum_k_warps(part, acc, mi, ni, ki, tx):  # type: ignore[no-untyped-def]
        for i in T.unroll(sums):
            acc[i] = acc[i] + acc[sums + i]
        k_warp_sums(part, acc, mi, ni, ki, tx)

    return sum_k_warps


def _cell_and_store_macro(S: SplitStepShape, steps: int, gi_layout: TcKernelLayout, gh_dtype: str, math_dtype: str,
                          out_dtype: str) -> Any:
    """The cell on the lane's sums (``sum_k_warps`` folded them into the first set; unscaled, b_hh
    added) and the store of h' to the other state slot, the output and at the last step h_n;
    then the next step's gi."""
    from tvm.script import tirx as T

    batch, hidden, dirs, unit_tiles = S.batch, S.hidden, S.dirs, S.unit_tiles
    load_gi, unscale = load_gi_macro(gi_layout), 1.0 / SPLIT_WEIGHT_SCALE
    lstm = gi_layout.cell == LSTM_CELL

    def at(g: int, t: int, e: int) -> int:
        """Gate g's sum (and gi) of the lane's element e of unit tile t: accumulator tile
        g * unit_tiles + t, the same element (the same row and unit)."""
        return (g * unit_tiles + t) * 4 + e

    def sums(acc: Any, b_h: Any, gi_reg: Any, t: int, e: int) -> tuple[list[Any], list[Any]]:
        """Each gate's gi and h·W_hhᵀ + b_hh (unscaled, stored as gh) of that element."""
        gh = [stored_as(acc[at(g, t, e)] * T.float32(unscale) + b_h[(g * unit_tiles + t) * 2 + e % 2], gh_dtype)
              for g in range(S.gate_count)]
        return [gi_reg[at(g, t, e)] for g in range(S.gate_count)], gh

    def gates(acc: Any, b_h: Any, gi_reg: Any, t: int, e: int) -> tuple[Any, Any]:
        """The GRU's z and n of that element."""
        gi, gh = sums(acc, b_h, gi_reg, t, e)
        return cell_gates(T, *gi, *gh, math_dtype, state=STATE)

    def lstm_c_new(acc: Any, b_h: Any, gi_reg: Any, c: Any, t: int, e: int) -> Any:
        """The LSTM's c' of that element from its i, f and g sums and c."""
        gi, gh = sums(acc, b_h, gi_reg, t, e)
        return lstm_c(T, *gi[:3], *gh[:3], c, math_dtype, state=STATE)

    def lstm_h_new(acc: Any, b_h: Any, gi_reg: Any, c_new: Any, t: int, e: int) -> Any:
        """h' of that element from its o sum and c'."""
        gi, gh = sums(acc, b_h, gi_reg, t, e)
        return lstm_h(T, gi[3], gh[3], c_new, math_dtype, state=STATE)

    @T.macro
    def cell_and_store(gi, hs, out, h_n, acc, b_h, gi_reg, h_prev, h_val, layer, s, bz, j0, m0, mi, tx):  # type: ignore[no-untyped-def]
        t_row = T.meta_var(T.if_then_else(bz == 0, s, steps - 1 - s))
        for t in T.unroll(unit_tiles):
            for e in T.unroll(4):
                row = T.meta_var(m0 + mi * MMA_M + acc_row_col(tx, e)[0])
                unit = T.meta_var(j0 + t * MMA_N + acc_row_col(tx, e)[1])
                if row < batch and unit < hidden:
                    if lstm:  # c', then h'; c' kept (``h_prev`` holds c), the last c where c_n's copy reads it
                        h_val[1] = lstm_c_new(acc, b_h, gi_reg, h_prev[t * 4 + e], t, e)
                        h_val[0] = lstm_h_new(acc, b_h, gi_reg, h_val[1], t, e)
                        h_prev[t * 4 + e] = h_val[1]
                        if s == steps - 1:
                            hs[steps % 2, bz, row, hidden + unit] = h_val[1]
                    else:
                        z_n = T.meta_var(gates(acc, b_h, gi_reg, t, e))
                        h_val[1] = z_n[0]
                        h_val[0] = cell_blend(h_val[1], z_n[1], h_prev[t * 4 + e], math_dtype)
                    hs[(s + 1) % 2, bz, row, unit] = T.Cast(STATE, h_val[0])
                    out[t_row * batch + row, bz * hidden + unit] = T.Cast(out_dtype, h_val[0])
                    if s == steps - 1:
                        h_n[layer * dirs + bz, row, unit] = T.Cast(STATE, h_val[0])
        if s + 1 < steps:  # the next step's gi, its loads in flight across the barrier
            load_gi(gi, gi_reg, s + 1, bz, j0, m0, mi, tx)

    return cell_and_store


@dataclass(frozen=True)
class TensorCoreSplitStep(StepVariant):
    """The split tensor-core step kernel (``step_tc`` 2, float32 h and W_hh): ``step_j`` units
    and ``step_tc_rows`` rows a block, ``step_tc_nw`` warps splitting the units; the grid barrier
    ``step_barrier`` between steps."""

    splits_state: ClassVar[bool] = True

    units: int
    rows: int
    k_warps: int
    n_warps: int
    ahead: int
    barrier: int
    loop: int

    @classmethod
    def of(cls, sizes: StepSizes, c: Config) -> "TensorCoreSplitStep":
        return cls(sizes, units=c.step_j, rows=c.step_tc_rows, k_warps=c.step_tc_kw, n_warps=c.step_tc_nw,
                   ahead=c.step_tc_ahead, barrier=c.step_barrier, loop=c.step_loop)

    @property
    def shape(self) -> SplitStepShape:
        s = self.sizes
        return SplitStepShape(s.batch, s.hidden, s.dirs, self.units, self.rows, self.n_warps, self.ahead,
                              self.k_warps, s.gates)

    def unshown(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        # the CUDA-core kernel's knobs and the 16-bit kernel's accumulator sets and fragments do not apply
        return self.unshown_prefixes, (SIMT_STEP_KNOBS + FLAG_STEP_KNOBS + CLUSTER_STEP_KNOBS
                                       + ("step_tc_acc", "step_tc_frag", "step_tc_wreg", "step_tc_wregs"))

    def reason(self, target: TargetInfo) -> str | None:
        """Why it cannot run here: types, tile, and a grid that must be resident with its shared memory."""
        return (fused_threads_reason(self.units, target) or self._form_reason(target) or self._tile_reason()
                or self._device_reason(target))

    def _form_reason(self, target: TargetInfo) -> str | None:
        if target.kind != "cuda" or self.loop != 2:
            return "split tensor-core step kernel (step_tc 2) is CUDA's persistent kernel only (step_loop 2)"
        if SPLIT_CHUNK_K // MMA_K % self.k_warps:
            return (f"split tensor-core step kernel (step_tc 2): {self.k_warps} k warps (step_tc_kw) do not split a "
                    f"chunk's {SPLIT_CHUNK_K // MMA_K} k slices")
        return None

    def _tile_reason(self) -> str | None:
        s, shape = self.sizes, self.shape
        if (s.h_dtype, s.w_dtype, s.acc_dtype) != (STATE, STATE, "float32"):
            return (f"split tensor-core step kernel (step_tc 2) needs float32 h, W_hh and accumulator, got "
                    f"{s.h_dtype}, {s.w_dtype} and {s.acc_dtype} (16-bit states: step_tc 1)")
        if shape.units not in SPLIT_UNITS:
            return f"split tensor-core step kernel: step_j {shape.units} units per block; allowed: {SPLIT_UNITS}"
        if shape.rows not in TC_ROWS:
            return f"split tensor-core step kernel: {shape.rows} rows per block; allowed: {TC_ROWS}"
        if shape.n_warps not in TC_N_WARPS or shape.units % (MMA_N * shape.n_warps):
            return (f"split tensor-core step kernel: step_j {shape.units} units over {shape.n_warps} warps "
                    f"(step_tc_nw; allowed {TC_N_WARPS}) is not 8 units or more a warp")
        if shape.rows > 16 and shape.rows >= 2 * shape.batch:
            return (f"split tensor-core step kernel: {shape.rows} rows per block for batch {shape.batch} (half of "
                    f"them idle)")
        return None

    def _device_reason(self, target: TargetInfo) -> str | None:
        shape = self.shape
        return mma_grid_reason("split tensor-core step kernel", shape.threads, shape.blocks, shape.shared_bytes(),
                               "W_hh's two parts, h's two chunks and partial sums", target,
                               lane_registers=SPLIT_LANE_REGISTERS)

    def lowered_blocks_per_sm(self, target: TargetInfo) -> int:
        # its lanes take 80-119 registers where the threads alone bound them: capped so its grid is resident
        return -(-self.shape.blocks // HardwareModel.from_target(target).sm_count)

    def init_layout(self) -> dict[str, bool]:
        return {"pingpong": True, "barrier": True}

    def barrier_words(self) -> tuple[str, ...]:
        return ("bar",)

    def lowered_kernels(self) -> dict[str, Any]:
        s = self.sizes
        return {f"{s.cell}_steps": split_step_func(s.seq, s.batch, s.hidden, s.dirs, s.layers, units=self.units,
                                                   rows=self.rows, n_warps=self.n_warps, ahead=self.ahead,
                                                   k_warps=self.k_warps, gi_dtype=s.gi_dtype, gh_dtype=s.gh_dtype,
                                                   math_dtype=s.math_dtype, out_dtype=s.out_dtype,
                                                   barrier=self.barrier, name=f"{s.cell}_steps", cell=s.cell)}
