"""The layout of a wgmma GEMM kernel: what its operands are (``OPERANDS``: bytes an element,
the stages' dtype, the instruction's type suffix) and ``KernelLayout``, the sizes and index maps
derived once from a tile and a GEMM's shape (stages, swizzle, descriptors, which C tile and K slice
a unit is, the accumulator fragment) that the loads (``wgmma_loads``) and the kernel's steps
(``wgmma_steps``) read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

# what wgmma reads from shared memory: float16 or bfloat16 (k16 instructions, one layout),
# float32 words as TF32 (k8 instructions, both operands K-major, the low 13 mantissa bits ignored:
# ``gemm_3xtf32`` splits float32 into such parts), or 8-bit floats, e4m3 or e5m2 (k32
# instructions, both operands K-major): the same 128-byte swizzle rows, of 64, 32 or 128 elements
OPERANDS = {"float16": 2, "bfloat16": 2, "tf32": 4, "e4m3": 1, "e5m2": 1}  # -> bytes an element
OPERAND_STORAGE = {"float16": "float16", "bfloat16": "bfloat16", "tf32": "float32",  # -> A's, Bt's, the stages'
                   "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
OPERAND_PTX = {"float16": "k16.f32.f16.f16", "bfloat16": "k16.f32.bf16.bf16", "tf32": "k8.f32.tf32.tf32",
               "e4m3": "k32.f32.e4m3.e4m3", "e5m2": "k32.f32.e5m2.e5m2"}
K_MAJOR_ONLY = ("tf32", "e4m3", "e5m2")  # operands wgmma reads K-major only: its lines have no transpose
REDUCE_THREADS = 256  # threads a block of the split sums' kernel, four columns each


def b_shape(n: int, k: int, b_layout: str) -> tuple[int, int]:
    """The stored shape of the second operand: Bt (n, k), or B (k, n) with ``b_layout`` "KN"."""
    return (k, n) if b_layout == "KN" else (n, k)


class Tile(Protocol):
    """What the layout reads of a tile (``wgmma.WgmmaTile``)."""

    bm: int
    bn: int
    stages: int
    inflight: int
    smem_epilogue: bool
    raster: int
    tiles: int
    split: int
    cluster: bool
    operand: str
    tma: bool
    specialized: bool
    multicast: bool
    pdl: bool
    wg_cols: int
    c_turns: bool
    wg_k: int
    ends: int

    @property
    def bk(self) -> int: ...

    @property
    def c_stage_rows(self) -> int: ...

    def c_pieces_per_stage(self) -> int: ...

    @property
    def staged_apart(self) -> bool: ...


def n_atom(bn: int) -> int:
    """Columns of an N atom of B (k, n) read N-major by a tile ``bn`` wide: a 128-byte swizzle row
    (64 elements), or where bn is no multiple of that (96), a 64-byte one (32 elements;
    ``KernelLayout.b_swizzle``)."""
    return 64 if bn % 64 == 0 else 32


def counted_words(m: int, bm: int) -> int:
    """The length of a counting kernel's ``ready`` (``wgmma_gemm``'s ``signal``) for ``m`` rows in
    tiles of ``bm``: a count a tile row, then their total (at index ``counted_words - 1``)."""
    return -(-m // bm) + 1


C_STAGE_ALIGN = 128  # the warp-specialized kernel's C stage starts past the barriers at this alignment


def c_stage_row(bn: int) -> int:
    """Elements a row of that C stage: bn where its 16-byte chunks swizzle in eights, else padded by 8."""
    return bn if bn % 64 == 0 else bn + 8


def own_c_stage_bytes(rows: int, bn: int) -> int:
    """Shared memory of a C stage of its own holding ``rows`` rows of 2-byte C (0: no such stage):
    the alignment past the barriers and the rows."""
    return C_STAGE_ALIGN + rows * c_stage_row(bn) * 2 if rows else 0


def k_turn_sums_bytes(wg_k: int, bn: int) -> int:
    """Shared memory of the second consumer warpgroup's float32 sums where two take a 64-row tile's k
    steps in turn (``wgmma_wg_k`` 2): its m64n``bn`` fragment, a register of each thread a row of 128
    words, 16-byte aligned past C's own stage (0 with one consumer)."""
    return 16 + 64 * bn * 4 if wg_k > 1 else 0


def stage_barrier_bytes(stages: int, tma: bool, specialized: bool) -> int:
    """Shared memory of the stages' mbarriers, after the stages: with ``tma`` 8 bytes a stage
    (its load), twice that ``specialized`` (its release by the consumers too)."""
    return 8 * stages * (2 if specialized else 1) if tma else 0


def stored_row_count(n: int, bn: int, split: int, clustered: bool) -> int:
    """The count of a tile row of C (``n`` columns in tiles of ``bn``) once a counting kernel
    has stored all of it: one a tile, one a block of a cluster (each stores its band of rows)."""
    return -(-n // bn) * (split if clustered else 1)


@dataclass(frozen=True)
class KernelLayout:
    """The sizes of a wgmma kernel (stages and counts in elements of the operand) and its index
    maps: a unit is a C tile's K slice (unit u: slice u // c_tiles of tile u % c_tiles, or with
    a cluster slice u % split of tile u // split); a block computes units b, b + grid, ..."""

    bm: int
    bn: int
    bk: int
    stages: int
    smem_epilogue: bool
    inflight: int
    tiles: int  # units a block
    split: int  # units a C tile (slices of K)
    clustered: bool  # a tile's slices are the blocks of a cluster: adjacent units
    promote: int  # k steps between promotions of the sums (0: never)
    k_major_only: bool  # the operand has no transposed read (``K_MAJOR_ONLY``): no transpose immediates
    n_major: bool  # B stored (k, n), read N-major
    b_batched: bool
    in_dtype: str  # A's, Bt's and the stages'
    elem: int  # bytes an element of A, Bt and the stages
    mma: str  # the wgmma instruction
    lead: tuple[int, ...]  # batch axes
    a_shape: tuple[int, ...]
    bt_shape: tuple[int, ...]
    c_shape: tuple[int, ...]
    m: int
    n: int
    k_tiles: int  # k steps of a unit (the last partly past a ragged K: read as zeros by the TMA)
    grid_n: int
    per_matrix: int  # C tiles of one matrix of the batch
    c_tiles: int
    group: int  # raster 0 = groups of one tile row = row-major
    pieces: int  # warpgroups' C one stage holds
    tma: bool = False  # stages loaded by the Tensor Memory Accelerator, a barrier each after the stages
    overlap: bool = False  # promoting: two accumulator sets, a window's promotion behind the next one's wgmma
    signal: bool = False  # counts each tile row's stores (``signals_per_row``) for a kernel launched early
    specialized: bool = False  # a producer warpgroup ahead of the consumers (``wgmma_specialized``)
    multicast: bool = False  # clusters of two blocks, one operand's tile shared by TMA multicast (``shares_a``)
    pdl: bool = False  # launched early, lets the next kernel launch, waits for the one ahead (``after_prior``)
    wg_cols: int = 1  # consumer warpgroups across the tile's columns (``wg_row``, ``wg_first_col``, ``wg_b``)
    # rows of the warp-specialized kernel's C stage of its own, past the barriers (``c_stage_at``; 0:
    # none): the tile's, or 64 the consumer warpgroups take in turn (``c_turns``)
    c_stage_rows: int = 0
    wg_k: int = 1  # consumer warpgroups taking the k steps in turn (``k_parity``, ``k_sums_at``)
    ends: int = 1  # row-major tiles' rows taken from the first, or with 2 from both ends in turn (``tile_row0``)
    gates: int = 0  # B's columns three gates of this many units, a tile's columns a third of each (``b_col``)
    # the k steps' (A part, B part) in turn, each operand stored as parts of K / len of these side by
    # side (``k_coordinate``; none: K as it is)
    k_parts: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, cfg: Tile, m: int, n: int, k: int, b_layout: str, batch: Sequence[int], b_batched: bool,
           promote: int, overlap: bool = False, signal: bool = False, gates: int = 0,
           k_parts: tuple[tuple[int, int], ...] = ()) -> "KernelLayout":
        lead = tuple(int(x) for x in batch)
        split = cfg.split
        part = k // len(k_parts) if k_parts else k  # the depth of one stored part
        a_k, b_k = ((1 + max(p[i] for p in k_parts)) * part for i in (0, 1)) if k_parts else (k, k)
        per_matrix = -(-m // cfg.bm) * -(-n // cfg.bn)  # a ragged M's last tile row, N's last column counted
        return cls(bm=cfg.bm, bn=cfg.bn, bk=cfg.bk, stages=cfg.stages, smem_epilogue=cfg.smem_epilogue,
                   inflight=cfg.inflight, tiles=cfg.tiles, split=split, clustered=cfg.cluster, promote=promote,
                   k_major_only=cfg.operand in K_MAJOR_ONLY, n_major=b_layout == "KN", b_batched=b_batched,
                   in_dtype=OPERAND_STORAGE[cfg.operand], elem=OPERANDS[cfg.operand],
                   mma=f"wgmma.mma_async.sync.aligned.m64n{cfg.bn // cfg.wg_cols}{OPERAND_PTX[cfg.operand]}",
                   lead=lead, a_shape=(*lead, m, a_k), c_shape=(*lead, m, n),
                   bt_shape=(*(lead if b_batched else ()), *b_shape(n, b_k, b_layout)), m=m, n=n,
                   k_tiles=-(-k // cfg.bk) // split, grid_n=-(-n // cfg.bn), per_matrix=per_matrix,
                   c_tiles=per_matrix * int(np.prod(lead, dtype=np.int64)), group=cfg.raster or 1,
                   pieces=cfg.c_pieces_per_stage(), tma=cfg.tma, overlap=overlap, signal=signal,
                   specialized=cfg.specialized, multicast=cfg.multicast, pdl=cfg.pdl, wg_cols=cfg.wg_cols,
                   c_stage_rows=cfg.c_stage_rows if cfg.staged_apart else 0, wg_k=cfg.wg_k, ends=cfg.ends,
                   gates=gates, k_parts=tuple(k_parts))

    # sizes derived from the fields
    @property
    def ragged(self) -> bool:
        """M is no multiple of bm: the last tile row reads rows of A below M again in place of
        those past it (``row_below_m``) and stores only C's rows below M (``in_rows``)."""
        return self.m % self.bm != 0

    @property
    def ragged_n(self) -> bool:
        """N is no multiple of bn: the last tile column reads rows of Bt below N again in place of
        those past it (``col_below_n``; zeros where the TMA loads them) and stores only C's
        columns below N (``in_cols``)."""
        return self.n % self.bn != 0

    @property
    def guarded(self) -> bool:
        """Whether C's last tile row or column is partly past M or N (its stores guarded)."""
        return self.ragged or self.ragged_n

    @property
    def threads(self) -> int:
        return self.bm // 64 * self.wg_cols * self.wg_k * 128

    @property
    def wg_bn(self) -> int:
        """Columns a warpgroup multiplies: the tile's, or its share where ``wg_cols`` split them."""
        return self.bn // self.wg_cols

    def wg_row(self, wg: Any) -> Any:
        """The 64-row band of the tile warpgroup ``wg`` multiplies (its number where it takes all
        columns and k steps)."""
        return wg // self.wg_cols if self.wg_cols > 1 else wg // self.wg_k if self.wg_k > 1 else wg

    def k_parity(self, wg: Any) -> Any:
        """Which of the k steps warpgroup ``wg`` takes where ``wg_k`` consumers take them in turn:
        those ``kt % wg_k`` equal to it."""
        return wg % self.wg_k

    def wg_first_col(self, col0: Any, wg: Any) -> Any:
        """The first of C's columns warpgroup ``wg`` multiplies in the tile from column ``col0``."""
        return col0 + wg % self.wg_cols * self.wg_bn if self.wg_cols > 1 else col0

    def wg_b(self, stage: Any, wg: Any) -> Any:
        """Where in the stage at ``stage`` warpgroup ``wg``'s Bt rows start: after A's tile, and
        where ``wg_cols`` split the columns, its share's first row (K-major: a row of bk each)."""
        start = stage + self.a_stage
        return start + wg % self.wg_cols * self.wg_bn * self.bk if self.wg_cols > 1 else start

    @property
    def signals_per_row(self) -> int:
        """With ``signal``: the count a tile row of C reaches once all of it is stored."""
        return stored_row_count(self.n, self.bn, self.split, self.clustered)

    @property
    def n_acc(self) -> int:
        """float32 accumulator registers per thread (m64nN: N/2, N a warpgroup's columns)."""
        return self.wg_bn // 2

    @property
    def b_atom(self) -> int:
        """Columns of an N atom of B (k, n) read N-major (``n_atom``)."""
        return n_atom(self.bn)

    @property
    def b_swizzle(self) -> int:
        """Bytes of B's swizzle rows in the stages: 128, or 64 for N atoms of 32 elements."""
        return self.b_atom * self.elem if self.n_major else 128

    @property
    def chunk_elems(self) -> int:
        """Elements a 16-byte cp.async moves."""
        return 16 // self.elem

    @property
    def k_inst(self) -> int:
        """k of one wgmma: 32 bytes of each row."""
        return 32 // self.elem

    @property
    def a_stage(self) -> int:
        return self.bm * self.bk

    @property
    def stage(self) -> int:
        return self.a_stage + self.bn * self.bk

    @property
    def a_box_rows(self) -> int:
        """Rows of A's tile the TMA loads a stage: the tile's, or M's where M is less than one tile
        (a box past A's rows costs more than the rows it leaves out: docs/results/gru.md); the
        stage's rows past M are then left as they are, and the C rows they make are not stored
        (``in_rows``).  Not with ``multicast``, whose blocks each load half the tile."""
        return self.m if self.tma and self.m < self.bm and not self.multicast else self.bm

    @property
    def stage_bytes_loaded(self) -> int:
        """Bytes the TMA writes into a stage (its barrier's expected count): A's box and B's tile."""
        return (self.stage - (self.bm - self.a_box_rows) * self.bk) * self.elem

    @property
    def a_loads(self) -> int:
        """16-byte cp.async a thread of a stage's A tile."""
        return self.a_stage // self.chunk_elems // self.threads

    @property
    def b_loads(self) -> int:
        return self.bn * self.bk // self.chunk_elems // self.threads

    @property
    def units(self) -> int:
        return self.c_tiles * self.split

    @property
    def grid(self) -> int:
        """Blocks; block b computes units b, b + grid, ..."""
        return -(-self.units // self.tiles)

    @property
    def ahead(self) -> int:
        """k tiles loaded ahead of the one being multiplied."""
        return self.stages - 1 - self.inflight

    @property
    def c_stride(self) -> int:
        """Halves per C row in shared memory (padded: conflict-free half2 writes); also float32 a
        row of a cluster's sums."""
        return self.bn + 8

    @property
    def c_loads(self) -> int:
        """A tile's or a warpgroup's C, 16 bytes a thread (= 64 * bn // 8 // 128)."""
        return self.bm * self.bn // 8 // self.threads

    @property
    def band(self) -> int:
        """With a cluster: rows of the tile each of its blocks adds and stores."""
        return self.bm // self.split

    @property
    def quads(self) -> int:
        """C's elements, four a thread of the slices' sum kernel."""
        return self.c_tiles * self.bm * self.bn // 4

    @property
    def promoting(self) -> bool:
        return self.promote > 0

    @property
    def windows(self) -> int:
        """Promotion windows of a unit's k loop (``promote`` k steps each)."""
        return self.k_tiles // self.promote

    @property
    def shares_a(self) -> bool:
        """With ``multicast``: the two blocks of a cluster share A's tile (row-major tiles: the
        same tile row), else Bt's (within a raster group: the same tile column)."""
        return self.group == 1

    @property
    def shared_rows(self) -> int:
        """With ``multicast``: the rows of the shared operand's tile each block of the pair loads."""
        return (self.bm if self.shares_a else self.bn) // 2

    # shared memory and the wgmma descriptors
    def swizzled(self, chunk: Any) -> Any:
        """Element offset in a stage tile of 16-byte chunk ``chunk`` (row chunk // 8, column chunk % 8)."""
        row = chunk // 8
        return row * self.bk + (chunk % 8 ^ row % 8) * self.chunk_elems

    def b_chunk(self, chunk: Any) -> Any:
        """Halves offset in a B stage tile of 16-byte chunk ``chunk`` of the global tile: K-major,
        the swizzled row of an N index; N-major (B (k, n)), row k of its N atom (``b_atom``), its
        chunks swizzled as the TMA's 128- or 64-byte swizzle writes them."""
        if not self.n_major:
            return self.swizzled(chunk)
        row, column = chunk // (self.bn // 8), chunk % (self.bn // 8)
        per_row = self.b_atom // 8  # chunks a row of an atom
        swizzle = row % 8 if per_row == 8 else row // 2 % 4
        return column // per_row * (self.bk * self.b_atom) + row * self.b_atom + (column % per_row ^ swizzle) * 8

    def desc(self, smem_base: Any, elems: Any, leading: int = 16, swizzle: int = 128) -> Any:
        """wgmma matrix descriptor of the tile at ``elems`` into smem, in rows of ``swizzle``
        bytes (128 or 64) swizzled so: K-major (the leading byte offset unused), or N-major with
        ``leading`` the bytes between its N atoms; 8-row groups 8 x ``swizzle`` bytes apart either way."""
        from tvm.script import tirx as T

        # bits 32-63: stride byte offset (8 rows) >> 4, bits 62-63 the swizzle: 1 = 128-byte, 2 = 64-byte
        # (bit 63: past an int64 constant, so shifted into place in the kernel)
        mode = {128: 1, 64: 2}[swizzle]
        desc_hi = (T.uint64((((8 * swizzle) >> 4) | (mode << 30)) << 32) if mode == 1
                   else T.shift_left(T.uint64(((8 * swizzle) >> 4) | (mode << 30)), T.uint64(32)))
        addr = (smem_base + elems * self.elem) & 0x3FFFF
        return desc_hi | T.Cast("uint64", (addr >> 4) | ((leading >> 4) << 16))

    # the Tensor Memory Accelerator's stages
    @property
    def smem_elems(self) -> int:
        """The dynamic shared memory's elements: the stages, with ``tma`` their barriers after,
        C's own stage after those (``c_stage_bytes``) and the second consumer's sums (``k_sums_at``)."""
        return (self.barriers_end + self.c_stage_bytes + k_turn_sums_bytes(self.wg_k, self.bn)) // self.elem

    @property
    def k_sums_at(self) -> int:
        """With ``wg_k`` 2: the byte offset of the second consumer's float32 sums, 16-byte aligned
        past the barriers and C's own stage."""
        return -(-(self.barriers_end + self.c_stage_bytes) // 16) * 16

    @property
    def barriers_end(self) -> int:
        """The byte offset past the stages and their barriers."""
        return self.stages * self.stage * self.elem + stage_barrier_bytes(self.stages, self.tma, self.specialized)

    @property
    def c_stage_at(self) -> int:
        """The byte offset of C's own stage: past the barriers, 128-byte aligned."""
        return -(-self.barriers_end // C_STAGE_ALIGN) * C_STAGE_ALIGN

    @property
    def c_stage_bytes(self) -> int:
        """Shared memory of C's own stage (``own_c_stage_bytes``; 0: none)."""
        return own_c_stage_bytes(self.c_stage_rows, self.bn)

    @property
    def c_turns(self) -> bool:
        """The consumer warpgroups take C's own stage in turn (one warpgroup's 64 rows)."""
        return 0 < self.c_stage_rows < self.bm

    def c_stage_chunk(self, row: Any, chunk: Any) -> Any:
        """The byte offset in C's own stage of 16-byte chunk ``chunk`` of row ``row``: rows of 8
        chunks' multiples swizzled (chunk ^ row % 8), others padded (both conflict-free)."""
        swizzled = chunk ^ row % 8 if c_stage_row(self.bn) == self.bn else chunk
        return row * c_stage_row(self.bn) * 2 + swizzled * 16

    # global memory
    def k_major(self, X: Any, at: list[Any], row0: Any, kt: Any, chunk: Any) -> Any:
        """The global address of 16-byte chunk ``chunk`` of k tile ``kt`` of a K-major operand's
        tile (A, or Bt) whose rows start at ``row0``, in the matrix of batch indices ``at``."""
        return X.ptr_to([*at, row0 + chunk // 8, kt * self.bk + chunk % 8 * self.chunk_elems])

    def a_global(self, A: Any, at: list[Any], row0: Any, kt: Any, chunk: Any) -> Any:
        """The global address of 16-byte chunk ``chunk`` of k tile ``kt``'s A tile; with a ragged
        M, a row past it reads one below it (``row_below_m``; its sums are never stored)."""
        if not self.ragged:
            return self.k_major(A, at, row0, kt, chunk)
        return A.ptr_to([*at, self.row_below_m(row0 + chunk // 8), kt * self.bk + chunk % 8 * self.chunk_elems])

    def row_below_m(self, row: Any) -> Any:
        """A row of A (or of an epilogue's buffer) below M standing in for ``row``: itself, or for a
        row past M, ``row`` mod M, distinct rows for distinct rows past M (every row past M reading
        M's last one made one L2 line a hot spot: 200 rows on 64-row tiles ran at 0.6 of 256)."""
        return row % self.m

    def in_rows(self, row: Any) -> Any:
        """Whether C has row ``row`` (True, not an expression, where M is a multiple of bm)."""
        return row < self.m if self.ragged else True

    def col_below_n(self, col: Any) -> Any:
        """A column of C (a row of Bt, or an epilogue's column) below N standing in for ``col``."""
        return col % self.n

    def in_cols(self, col: Any) -> Any:
        """Whether C has column ``col`` (True where N is a multiple of bn)."""
        return col < self.n if self.ragged_n else True

    def in_c(self, row: Any, col: Any) -> Any:
        """Whether C has (``row``, ``col``): ``in_rows`` and ``in_cols`` (True where neither is ragged)."""
        from tvm import tirx

        conds = [c for c in (self.in_rows(row), self.in_cols(col)) if c is not True]
        return True if not conds else conds[0] if len(conds) == 1 else tirx.And(*conds)

    def epilogue_col(self, col: Any) -> Any:
        """The column an epilogue reads its own buffers (a bias) at for C's column ``col``."""
        return self.col_below_n(col) if self.ragged_n else col

    def epilogue_row(self, row: Any) -> Any:
        """The row an epilogue reads its own buffers at for C's row ``row``: one below M
        (``row_below_m``; a value computed for a row past M is never stored, and computing it
        unguarded keeps the epilogue's arithmetic free of branches)."""
        return self.row_below_m(row) if self.ragged else row

    def b_global(self, B: Any, at: list[Any], col0: Any, kt: Any, chunk: Any) -> Any:
        """The global address of 16-byte chunk ``chunk`` of k tile ``kt``'s B tile."""
        at = at if self.b_batched else []
        if not self.n_major and self.ragged_n:  # a row past N reads one below it (its sums are never stored)
            return B.ptr_to([*at, self.col_below_n(col0 + chunk // 8), kt * self.bk + chunk % 8 * self.chunk_elems])
        if not self.n_major:
            return self.k_major(B, at, col0, kt, chunk)
        return B.ptr_to([*at, kt * self.bk + chunk // (self.bn // 8), self.b_col(col0, chunk % (self.bn // 8) * 8)])

    def b_col(self, col0: Any, offset: Any) -> Any:
        """B's column for the tile's column ``col0 + offset``: itself, or with ``gates`` (a GRU's
        hidden GEMM, B = W_hh (H, 3H) with its gates r, z, n side by side) the tile's columns are
        the three gates of its ``bn / 3`` units in turn, so each thread's accumulators hold all
        three gates of its units (``wgmma.gate_reason``)."""
        if not self.gates:
            return col0 + offset
        units = self.bn // 3
        return offset // units * self.gates + col0 // 3 + offset % units

    # units, C tiles and the batch
    def c_tile(self, unit: Any) -> Any:
        """The C tile of unit ``unit`` (each tile's K slices are ``c_tiles`` units apart, or with a
        cluster adjacent)."""
        if self.split == 1:
            return unit
        return unit // self.split if self.clustered else unit % self.c_tiles

    def k_coordinate(self, kt: Any, operand: int) -> Any:
        """The element along K where k step ``kt`` reads ``operand`` (0: A, 1: B): ``kt`` x bk, or
        with ``k_parts`` k tile ``kt // cycle`` of the part its place in the cycle names, the parts
        side by side (a part read twice in a cycle is the same tile twice: the second load an L2
        hit)."""
        if not self.k_parts:
            return kt * self.bk
        from tvm import tirx

        cycle = len(self.k_parts)
        depth = self.k_tiles * self.split * self.bk // cycle  # one part's
        part = tirx.const(self.k_parts[-1][operand], "int32")
        for place in range(cycle - 2, -1, -1):
            part = tirx.Select(kt % cycle == place, tirx.const(self.k_parts[place][operand], "int32"), part)
        return part * depth + kt // cycle * self.bk

    def global_kt(self, unit: Any, kt: Any) -> Any:
        """Unit ``unit``'s k step ``kt`` as a k step of the whole K."""
        if self.split == 1:
            return kt
        return kt + (unit % self.split if self.clustered else unit // self.c_tiles) * self.k_tiles

    def in_matrix(self, tile: Any) -> Any:
        """Unit ``tile``'s C tile's number within its matrix of the batch."""
        return self.c_tile(tile) % self.per_matrix if self.lead else self.c_tile(tile)

    def tile_row0(self, tile: Any) -> Any:
        """The first row of C tile ``tile`` (tiles numbered in raster order); with ``ends`` 2
        (row-major) the tile rows in order 0, R - 1, 1, R - 2, ...: a kernel reading C's rows
        from the first and one reading them from the last (a bidirectional GRU's two directions)
        both find theirs among the first stored."""
        row = (self.in_matrix(tile) // (self.group * self.grid_n) * self.group
               + self.in_matrix(tile) % self.group)
        if self.ends == 2:
            last = -(-self.m // self.bm) - 1
            row = row % 2 * (last - row // 2) + (1 - row % 2) * (row // 2)
        return row * self.bm

    def tile_col0(self, tile: Any) -> Any:
        return self.in_matrix(tile) % (self.group * self.grid_n) // self.group * self.bn

    def tile_lead(self, tile: Any) -> list[Any]:
        """The batch indices of unit ``tile``'s matrix (none without a batch)."""
        return self.matrix_lead(self.c_tile(tile) // self.per_matrix)

    def matrix_lead(self, index: Any) -> list[Any]:
        """The batch indices of matrix ``index`` of the batch (none without one)."""
        lead = self.lead
        inner = [int(np.prod(lead[i + 1:], dtype=np.int64)) for i in range(len(lead))]
        return [index // inner[i] % lead[i] if i else index // inner[i] for i in range(len(lead))]

    # the accumulator fragment
    def fragment_row(self, base: Any, tx: Any, p: Any) -> Any:
        """The row of accumulator pair ``p`` of thread ``tx`` (wgmma's m64nN fragment: warp w of the
        warpgroup rows 16w.., lane // 4, 8 further for odd pairs), after row ``base``."""
        return base + tx % 128 // 32 * 16 + tx % 32 // 4 + p % 2 * 8

    def fragment_col(self, base: Any, tx: Any, p: Any, v: Any) -> Any:
        """The column of accumulator ``2p + v`` of thread ``tx``, after column ``base``."""
        return base + p // 2 * 8 + tx % 4 * 2 + v

    # promoted sums
    def summed(self, total: Any, acc: Any) -> Any:
        """The registers holding C's sums: the promoted ones, or the accumulators."""
        return total if self.promoting else acc

    def scale_d(self, kk: Any, keep: Any) -> Any:
        """wgmma's scale-d (false: D = A·B) for instruction ``kk`` of a k step."""
        from tvm.script import tirx as T

        return T.Or(kk > 0, keep) if self.promoting else T.bool(True)

    def kept(self, kt: Any) -> Any:
        """Whether k step ``kt``'s first wgmma adds to the accumulators (not after a promotion)."""
        from tvm.script import tirx as T

        return kt % self.promote != 0 if self.promote else T.bool(True)
