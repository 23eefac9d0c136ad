"""The tensor-core step kernel's sizes (``tensor_core_step.py``; the GRU's, and the LSTM's on four
gates): the knobs' allowed values,
a config's shape for one GRU (``TcStepShape``: blocks, threads, strides, shared memory) and every
size the kernel's parts share (``TcKernelLayout``), kept apart from the kernel so the space's
checks and the pick read them without building it."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tvm_ext.precision.precision import itemsize

from .step_common import GRU_CELL

WARP = 32
MMA_M, MMA_N, MMA_K = 16, 8, 16
OPERANDS = ("float16", "bfloat16")
TC_UNITS = (8, 16, 32)  # hidden units per block: 1, 2 or 4 n8 tiles per gate
TC_ROWS = (16, 32, 64)  # batch rows per block: 1, 2 or 4 warps along M
TC_N_WARPS = (1, 2, 4)  # warps splitting the block's units (8 or more units each)
TC_ACC_SETS = (1, 2, 4)  # accumulator sets a warp's k slices take turns in
H_CHUNKS = 4  # a warp copies its share of h in up to this many cp.async groups
MAX_W_REGISTERS = 96  # W_hh fragments a lane may keep (32-bit registers) with step_tc_wreg, unless step_tc_wregs
# says more (its default and the value of records before it): the pick's B8-B64 H512 blocks need 96, beside the
# accumulators, h fragments, gi and polled words under 255
POLL_WORDS = 64  # with flags: exchange words a lane polls at once, more in rounds (faster than 32 or 16
# at B64 H1024, the same at B8 H512; docs/results/gru.md)
SPLIT_POLL_WORDS = 32  # the same for float32 state split into parts: its W fragments take twice the registers,
# and for the LSTM's four gates (their accumulators and float32 gi: with 64 its H1024 blocks spill, ptxas)


def acc_row_col(tx: Any, e: int) -> tuple[Any, Any]:
    """(row, column) within its m16n8 tile of accumulator element ``e`` (0-3) of lane ``tx``
    (the ``mma.sync.m16n8k16`` layout: rows tx/4 and tx/4 + 8, two adjacent columns)."""
    return tx // 4 + e // 2 * 8, tx % 4 * 2 + e % 2


def padded_stride(columns: int, dtype: str) -> int:
    """A shared row stride of at least ``columns`` whose 16-byte chunk count is odd, so the
    8 rows one ``ldmatrix`` phase reads lie on distinct banks."""
    per_chunk = 16 // itemsize(dtype)
    chunks = -(-columns // per_chunk)
    return (chunks + (chunks % 2 == 0)) * per_chunk


def w_chunk(k: Any, chunk: Any, chunks: int) -> Any:
    """The stored 16-byte chunk of logical ``chunk`` in k row ``k`` of a W slice whose rows
    are ``chunks`` chunks long: rows k mod 8 start on banks k·chunks mod 8, which repeat every
    ``8 / gcd(chunks, 8)`` rows; XOR by the repeat index (below gcd, so the chunk stays in its
    row) puts 8 consecutive rows on 8 distinct bank groups."""
    repeats = math.gcd(chunks, 8)
    if repeats == 1:
        return chunk
    return chunk ^ (k // (8 // repeats) % repeats)


class UnitRowBlocks:
    """What both tensor-core step kernels' shapes derive alike from a block of ``units`` hidden
    units (all ``gate_count`` gates) and ``rows`` batch rows of one direction."""

    hidden: int
    batch: int
    dirs: int
    units: int
    rows: int
    gate_count: int = 3  # the cell's gates (the GRU's three; the LSTM's four)

    @property
    def blocks(self) -> int:
        return -(-self.hidden // self.units) * -(-self.batch // self.rows) * self.dirs

    @property
    def w_stride(self) -> int:
        """W's shared row: gates·units columns, unpadded (``w_chunk`` swizzles it)."""
        return self.gate_count * self.units


@dataclass(frozen=True)
class TcStepShape(UnitRowBlocks):
    """The sizes a tensor-core step config implies for one GRU shape."""

    batch: int
    hidden: int
    dirs: int
    units: int
    rows: int
    k_warps: int
    operand: str
    n_warps: int = 1
    acc_sets: int = 1  # a warp's k slice i accumulates into set i mod acc_sets
    frags_ahead: bool = False  # the next k slice's fragments loaded before this slice's mma.sync
    w_held: int = 0  # step_tc_wreg: 0 W_hh's fragments read from shared memory every step, 1 all of the
    # warp's kept in registers for all steps, 2 those of its first k slices that fit ``w_regs``, 3 those
    # loaded from global memory, only the other slices' rows in shared memory (``w_rows``)
    poll_bytes: int = 8  # step_tc_poll: bytes of exchange words one poll load reads (with flags)
    split: bool = False  # step_tc 2 with flags: float32 h and W_hh as float16 high and low parts, three products
    split_pairs: bool = False  # step_split_words 2: two float32 values a word and a one-bit tag (``float_pair``)
    w_regs: int = MAX_W_REGISTERS  # step_tc_wregs: registers a lane may keep W's fragments in
    warp_h: bool = False  # step_tc_warp_h: a warp's polled h stored by PTX (no block barrier before its products)
    stacked: bool = False  # step_tc_stack: split, h's low parts in the m16 tile's rows 8-15 (batch <= 8)
    gate_count: int = 3  # the cell's gates: the GRU's r, z, n; the LSTM's i, f, g, o

    @property
    def parts(self) -> int:
        """float16 parts of each value of h and W_hh the products read: high and low, or the value."""
        return 2 if self.split else 1

    @property
    def word_values(self) -> int:
        """Values of h an exchange word holds: two 16-bit ones, or float32 ones (split into parts by
        the warps that poll them) one beside a 32-bit tag or two beside a tag bit (``split_pairs``)."""
        return 1 if self.split and not self.split_pairs else 2

    @property
    def k_extent(self) -> int:
        """k rounded up so each of the ``k_warps`` warps takes whole 16-deep slices, and each
        of its ``n_warps`` copies whole 16-deep parts of that warp's h."""
        step = MMA_K * self.k_warps * self.n_warps
        return -(-self.hidden // step) * step

    @property
    def warp_slices(self) -> int:
        """The 16-deep k slices of one k warp's range."""
        return self.k_extent // self.k_warps // MMA_K

    @property
    def warps(self) -> int:
        return self.rows // MMA_M * self.k_warps * self.n_warps

    @property
    def threads(self) -> int:
        return WARP * self.warps

    @property
    def h_stride(self) -> int:
        return padded_stride(self.k_extent, self.operand)

    @property
    def n_tiles(self) -> int:
        """n8 accumulator tiles a warp holds: its units' gates."""
        return self.gate_count * self.units // self.n_warps // MMA_N

    @property
    def w_registers(self) -> int:
        """32-bit registers a lane needs to keep all its warp's W_hh fragments: two an n8 tile and
        16-deep k slice, a part."""
        return self.n_tiles * self.warp_slices * 2 * self.parts

    @property
    def held_slices(self) -> int:
        """The warp's k slices (its first) whose W_hh fragments stay in registers."""
        if self.w_held == 1:
            return self.warp_slices
        if self.w_held in (2, 3):
            return min(self.warp_slices, self.w_regs // (self.n_tiles * 2 * self.parts))
        return 0

    @property
    def w_rows(self) -> int:
        """W's k rows in shared memory: all, or with ``w_held`` 3 those of the k slices no lane holds
        (each k warp's last ``warp_slices - held_slices``, one k warp's after another)."""
        return self.k_extent - (self.k_warps * self.held_slices * MMA_K if self.w_held == 3 else 0)

    def w_row(self, k: Any, k_warp: Any) -> Any:
        """The shared row of W's k row ``k`` (of k warp ``k_warp``'s range, not held)."""
        return k - (k_warp + 1) * self.held_slices * MMA_K if self.w_held == 3 else k

    def w_k(self, row: Any) -> Any:
        """The k row of W's shared row ``row`` (``w_row``'s inverse)."""
        if self.w_held != 3:
            return row
        held_k, warp_k = self.held_slices * MMA_K, self.k_extent // self.k_warps
        return row + (row // (warp_k - held_k) + 1) * held_k if warp_k > held_k else row

    def shared_bytes(self) -> int:
        """W slice + h rows (operand type, each part) + the k warps' partial sums (float32)."""
        operands = (self.w_rows * self.w_stride + self.rows * self.h_stride) * itemsize(self.operand) * self.parts
        partials = (self.k_warps - 1) * self.rows // MMA_M * self.n_warps * self.n_tiles * 4 * WARP * 4
        return operands + partials


@dataclass(frozen=True)
class TcKernelLayout:
    """Every size the kernel's parts share, derived once from one layer's shape and knobs: the
    warps' shares of units, rows and k, the h chunks they copy and multiply, the shared strides,
    and with flags the exchange words a lane polls."""

    steps: int
    layers: int
    shape: TcStepShape
    gi_dtype: str
    gh_dtype: str
    math_dtype: str
    out_dtype: str
    flags: bool
    gates: int  # gates·hidden: the gate GEMM's columns
    m_warps: int
    warp_units: int
    unit_tiles: int  # n8 tiles of one gate a warp holds
    warp_k: int  # the k range of a k warp's products
    chunks: int  # a warp's products in this many h chunks
    chunk_k: int
    copy_k: int  # the k range of h a warp copies: its share of its k warp's range
    copy_chunks: int  # in this many cp.async groups
    copy_chunk_k: int
    w_chunks: int  # 16-byte chunks of W's shared row
    vec: int  # 16-byte copies where a row's k and units come in whole vectors
    asynchronous: bool  # cp.async copies 16 bytes (a 2-byte element cannot go)
    partial_tiles: int  # the k warps' partial-sum tiles (all k warps but the first)
    pair_words: int  # with flags: the exchange words (``shape.word_values`` units each) of one row
    slot_words: int  # hx holds two slots of this many words
    poll_words: int  # exchange words a lane polls at once
    poll_rounds: int
    poll_vector: int  # exchange words one poll load reads (adjacent k)
    # gi from an input GEMM still running (``step_overlap``): its rows counted in tiles of this many
    # rows (0: gi is complete at launch), a tile row complete at ``ready_count``
    ready_rows: int = 0
    ready_count: int = 0
    cell: str = GRU_CELL  # the recurrent cell on the accumulators (``tensor_core_cell.py``)

    @classmethod
    def of(cls, steps: int, layers: int, shape: TcStepShape, *, gi_dtype: str, gh_dtype: str, math_dtype: str,
           out_dtype: str, flags: bool, gi_ready: tuple[int, int] = (0, 0), cell: str = GRU_CELL) -> "TcKernelLayout":
        K, k_warps, n_warps = shape.k_extent, shape.k_warps, shape.n_warps
        warp_k, k_slices = K // k_warps, shape.warp_slices
        chunks = math.gcd(k_slices, H_CHUNKS)
        copy_k = warp_k // n_warps
        copy_chunks = math.gcd(k_slices // n_warps, H_CHUNKS)
        vec = 8 if shape.hidden % 8 == 0 else 1
        vector, word_values = shape.poll_bytes // 8, shape.word_values
        lane_loads = -(-MMA_M * copy_k // word_values // vector // WARP)
        few = shape.split or shape.gate_count > 3
        poll_loads = min(lane_loads, (SPLIT_POLL_WORDS if few else POLL_WORDS) // vector)
        m_warps, warp_units = shape.rows // MMA_M, shape.units // n_warps
        return cls(steps, layers, shape, gi_dtype, gh_dtype, math_dtype, out_dtype, flags,
                   gates=shape.gate_count * shape.hidden, m_warps=m_warps, warp_units=warp_units,
                   unit_tiles=warp_units // MMA_N,
                   warp_k=warp_k, chunks=chunks, chunk_k=warp_k // chunks, copy_k=copy_k, copy_chunks=copy_chunks,
                   copy_chunk_k=copy_k // copy_chunks, w_chunks=shape.w_stride * itemsize(shape.operand) // 16,
                   vec=vec, asynchronous=vec == 8, partial_tiles=(k_warps - 1) * m_warps * n_warps,
                   pair_words=-(-shape.hidden // word_values), slot_words=shape.dirs * shape.batch * shape.hidden,
                   poll_words=poll_loads * vector, poll_rounds=-(-lane_loads // poll_loads), poll_vector=vector,
                   ready_rows=gi_ready[0], ready_count=gi_ready[1], cell=cell)

    @property
    def counted(self) -> bool:
        """gi comes from an input GEMM still running, its tile rows counted (``ready_rows``)."""
        return self.ready_rows > 0

    @property
    def state(self) -> str:
        """The type of h, W_hh and b_hh in memory: float32 where the products split it, else the operand's."""
        return "float32" if self.shape.split else self.shape.operand

    @property
    def a_frag_size(self) -> int:
        """A's fragment registers (halves): one k slice's (each part's), two with ``frags_ahead``."""
        return 16 if self.shape.frags_ahead else 8 * self.shape.parts

    @property
    def b_frag_size(self) -> int:
        """B's: a pair of n8 tiles at a time, with ``frags_ahead`` all of two k slices', with W in
        registers those of the held k slices (four halves an n8 tile and k slice) and a pair; each
        part's (high parts first)."""
        s = self.shape
        if s.held_slices:  # the held ones, then a pair buffer for the slices read every step
            return (s.n_tiles * s.held_slices * 4 + (8 if s.held_slices < s.warp_slices else 0)) * s.parts
        return 2 * s.n_tiles * 4 if s.frags_ahead else 8 * s.parts

    @property
    def held_part(self) -> int:
        """Where the held fragments' low parts start in ``b_frag`` (past the high parts')."""
        return self.shape.n_tiles * self.shape.held_slices * 4

    @property
    def pair_at(self) -> int:
        """Where the pair buffer (for k slices read from shared memory every step) starts in ``b_frag``."""
        return self.held_part * self.shape.parts

    @property
    def grid(self) -> tuple[int, int, int]:
        """Blocks along the units, the rows and the directions."""
        s = self.shape
        return -(-s.hidden // s.units), -(-s.batch // s.rows), s.dirs

    @property
    def chunk_vectors(self) -> int:
        """Vectors a lane copies per chunk of h."""
        return MMA_M * self.copy_chunk_k // self.vec // WARP
