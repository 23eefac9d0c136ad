"""The steps of the wgmma GEMM kernel that ``wgmma.wgmma_gemm`` assembles into a PrimFunc.

``KernelLayout``: the sizes and index maps derived once from a tile and a GEMM's shape (stages,
swizzle, descriptors, which C tile and K slice a unit is, the accumulator fragment).  ``CValue``:
what C stores for an accumulator (scale, bias, cast, or a caller's epilogue).  Then a function
per step, each returning TIR macros that close over the layout: the loads of k tiles into the
stages (``wgmma_loads``: cp.async, or the TMA with ``wgmma_tma``), the wgmma of a k step and the
promotion of its sums (``mma``), the stores after the k loop (``stores``: direct, through shared
memory, or a K slice's float32 sums), the sum of a cluster's K slices (``cluster_sum``), the second
kernel adding unclustered slices (``add_slices``), the kernels with their launch and k loops
(``one_unit_kernel``, ``several_units_kernel``), and the PrimFunc around them (``prim_func``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from .wgmma_loads import (TMA_SWIZZLE_128B, Staging, b_box, stage_waits, staging, tensor_map_box,
                          tensor_map_dims)

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

    @property
    def bk(self) -> int: ...

    def c_pieces_per_stage(self) -> int: ...


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
    k_tiles: int  # k steps of a unit
    grid_n: int
    per_matrix: int  # C tiles of one matrix of the batch
    c_tiles: int
    group: int  # raster 0 = groups of one tile row = row-major
    pieces: int  # warpgroups' C one stage holds
    tma: bool = False  # stages loaded by the Tensor Memory Accelerator, a barrier each after the stages

    @classmethod
    def of(cls, cfg: Tile, m: int, n: int, k: int, b_layout: str, batch: Sequence[int], b_batched: bool,
           promote: int) -> "KernelLayout":
        lead = tuple(int(x) for x in batch)
        split = cfg.split
        per_matrix = -(-m // cfg.bm) * (n // cfg.bn)  # a ragged M's last tile row counted
        return cls(bm=cfg.bm, bn=cfg.bn, bk=cfg.bk, stages=cfg.stages, smem_epilogue=cfg.smem_epilogue,
                   inflight=cfg.inflight, tiles=cfg.tiles, split=split, clustered=cfg.cluster, promote=promote,
                   k_major_only=cfg.operand in K_MAJOR_ONLY, n_major=b_layout == "KN", b_batched=b_batched,
                   in_dtype=OPERAND_STORAGE[cfg.operand], elem=OPERANDS[cfg.operand],
                   mma=f"wgmma.mma_async.sync.aligned.m64n{cfg.bn}{OPERAND_PTX[cfg.operand]}",
                   lead=lead, a_shape=(*lead, m, k), c_shape=(*lead, m, n),
                   bt_shape=(*(lead if b_batched else ()), *b_shape(n, k, b_layout)), m=m, n=n,
                   k_tiles=k // cfg.bk // split, grid_n=n // cfg.bn, per_matrix=per_matrix,
                   c_tiles=per_matrix * int(np.prod(lead, dtype=np.int64)), group=cfg.raster or 1,
                   pieces=cfg.c_pieces_per_stage(), tma=cfg.tma)

    # sizes derived from the fields
    @property
    def ragged(self) -> bool:
        """M is no multiple of bm: the last tile row reads rows of A below M again in place of
        those past it (``row_below_m``) and stores only C's rows below M (``in_rows``)."""
        return self.m % self.bm != 0

    @property
    def threads(self) -> int:
        return self.bm // 64 * 128

    @property
    def n_acc(self) -> int:
        """float32 accumulator registers per thread (m64nN: N/2)."""
        return self.bn // 2

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

    # shared memory and the wgmma descriptors
    def swizzled(self, chunk: Any) -> Any:
        """Element offset in a stage tile of 16-byte chunk ``chunk`` (row chunk // 8, column chunk % 8)."""
        row = chunk // 8
        return row * self.bk + (chunk % 8 ^ row % 8) * self.chunk_elems

    def b_chunk(self, chunk: Any) -> Any:
        """Halves offset in a B stage tile of 16-byte chunk ``chunk`` of the global tile: K-major,
        the swizzled row of an N index; N-major (B (k, n)), row k of its 64-wide N atom."""
        if not self.n_major:
            return self.swizzled(chunk)
        row, column = chunk // (self.bn // 8), chunk % (self.bn // 8)
        return column // 8 * (self.bk * 64) + row * 64 + (column % 8 ^ row % 8) * 8

    def desc(self, smem_base: Any, elems: Any, leading: int = 16) -> Any:
        """wgmma matrix descriptor of the 128-byte-swizzled tile at ``elems`` into smem: K-major
        (the leading byte offset unused), or N-major with ``leading`` the bytes between its
        64-wide N atoms; 8-row groups 1024 bytes apart either way."""
        from tvm.script import tirx as T

        # bits 32-63: stride byte offset 1024 >> 4 (8 rows of 128 B), bit 62 = 128-byte swizzle
        desc_hi = T.uint64(((1024 >> 4) | (1 << 30)) << 32)
        addr = (smem_base + elems * self.elem) & 0x3FFFF
        return desc_hi | T.Cast("uint64", (addr >> 4) | ((leading >> 4) << 16))

    # the Tensor Memory Accelerator's stages
    @property
    def smem_elems(self) -> int:
        """The dynamic shared memory's elements: the stages, and with ``tma`` their barriers after."""
        return self.stages * self.stage + (8 * self.stages // self.elem if self.tma else 0)

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

    def epilogue_row(self, row: Any) -> Any:
        """The row an epilogue reads its own buffers at for C's row ``row``: one below M
        (``row_below_m``; a value computed for a row past M is never stored, and computing it
        unguarded keeps the epilogue's arithmetic free of branches)."""
        return self.row_below_m(row) if self.ragged else row

    def b_global(self, B: Any, at: list[Any], col0: Any, kt: Any, chunk: Any) -> Any:
        """The global address of 16-byte chunk ``chunk`` of k tile ``kt``'s B tile."""
        at = at if self.b_batched else []
        if not self.n_major:
            return self.k_major(B, at, col0, kt, chunk)
        return B.ptr_to([*at, kt * self.bk + chunk // (self.bn // 8), col0 + chunk % (self.bn // 8) * 8])

    # units, C tiles and the batch
    def c_tile(self, unit: Any) -> Any:
        """The C tile of unit ``unit`` (each tile's K slices are ``c_tiles`` units apart, or with a
        cluster adjacent)."""
        if self.split == 1:
            return unit
        return unit // self.split if self.clustered else unit % self.c_tiles

    def global_kt(self, unit: Any, kt: Any) -> Any:
        """Unit ``unit``'s k step ``kt`` as a k step of the whole K."""
        if self.split == 1:
            return kt
        return kt + (unit % self.split if self.clustered else unit // self.c_tiles) * self.k_tiles

    def in_matrix(self, tile: Any) -> Any:
        """Unit ``tile``'s C tile's number within its matrix of the batch."""
        return self.c_tile(tile) % self.per_matrix if self.lead else self.c_tile(tile)

    def tile_row0(self, tile: Any) -> Any:
        """The first row of C tile ``tile`` (tiles numbered in raster order)."""
        return (self.in_matrix(tile) // (self.group * self.grid_n) * self.group
                + self.in_matrix(tile) % self.group) * self.bm

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


@dataclass(frozen=True)
class CValue:
    """What C stores for an accumulator: scaled, plus the bias of its column, cast to ``c_dtype``;
    or what ``epilogue(value, row, col, lead)`` makes of it.  ``scales``: the buffer in the
    bias's place holds two float32 scales (A's and B's, per tensor: an 8-bit float GEMM's) that
    multiply the sum."""

    c_dtype: str
    scale: float = 1.0
    has_bias: bool = False
    epilogue: Callable[..., Any] | None = None
    scales: bool = False

    def __call__(self, value: Any, bias: Any, at: list[Any], row: Any, col: Any) -> Any:
        from tvm.script import tirx as T

        if self.epilogue is not None:
            return T.Cast(self.c_dtype, self.epilogue(value, row, col, at))
        if self.scales:
            value = value * (bias[0] * bias[1])
        if self.scale != 1.0:
            value = value * T.float32(self.scale)
        if self.has_bias:
            value = value + T.Cast("float32", bias[col])
        return T.Cast(self.c_dtype, value)


@dataclass(frozen=True)
class Mma:
    """The wgmma of a k step and the promotion of its sums."""

    mma_stage: Callable[..., None]  # (base, acc, cur, wg, keep)
    promotion: Callable[..., None]  # (acc, total, kt)


def mma(L: KernelLayout) -> Mma:
    """The macros of a k step's multiply: a warpgroup's bk / k_inst wgmma on the stage's
    descriptors (one commit group), and, promoting, the accumulators added into the second set."""
    from tvm.script import tirx as T

    @T.macro
    def promotion(acc: Any, total: Any, kt: Any) -> None:
        """At the last k step of every ``promote``: the accumulators into ``total`` (every wgmma retired)."""
        if kt % L.promote == L.promote - 1:
            T.ptx["wgmma.wait_group.sync.aligned"](0)
            for i in T.unroll(L.n_acc):
                total[i] = total[i] + acc[i]

    @T.macro
    def mma_stage(base: Any, acc: Any, cur: Any, wg: Any, keep: Any) -> None:
        """The warpgroup's 64 rows times the stage at ``cur`` (elements): bk / k_inst wgmma, one
        group; ``keep`` false: the first one starts the accumulators afresh."""
        T.ptx["wgmma.fence.sync.aligned"]()
        for kk in T.unroll(L.bk // L.k_inst):
            T.ptx[L.mma](*[acc[i] for i in range(L.n_acc)], L.desc(base, cur + wg * 64 * L.bk + kk * L.k_inst),
                         L.desc(base, cur + L.a_stage + kk * 16 * 64, L.bk * 128) if L.n_major
                         else L.desc(base, cur + L.a_stage + kk * L.k_inst), L.scale_d(kk, keep), 1, 1,
                         *(() if L.k_major_only else (0, int(L.n_major))))
        T.ptx["wgmma.commit_group.sync.aligned"]()

    return Mma(mma_stage, promotion)


def stores(L: KernelLayout, out: CValue) -> Callable[..., None]:
    """The macro ``store_unit(smem, C, bias, sums, unit, at, row0, col0, wg, tx, piece, copy_row0,
    copy_base, copy_threads, lane)`` storing a unit's sums after its k loop: a K slice's float32
    sums, C staged through shared memory, or C stored directly."""
    from tvm.script import tirx as T

    @T.macro
    def direct_store(C: Any, bias: Any, acc: Any, at: Any, row0: Any, col0: Any, wg: Any, tx: Any) -> None:
        """The accumulators straight to C (pairs of adjacent columns)."""
        if L.ragged:  # each pair computed unguarded (at rows below M), stored below M; else as it always was
            pair = T.alloc_buffer((2,), C.dtype, scope="local")
            for p in T.unroll(L.n_acc // 2):
                row = T.meta_var(L.fragment_row(row0 + wg * 64, tx, p))
                for v in T.vectorized(2):
                    pair[v] = out(acc[p * 2 + v], bias, at, L.epilogue_row(row), L.fragment_col(col0, tx, p, v))
                if L.in_rows(row):
                    for v in T.vectorized(2):
                        C[(*at, row, L.fragment_col(col0, tx, p, v))] = pair[v]
        else:
            for p in T.unroll(L.n_acc // 2):
                for v in T.vectorized(2):
                    row = T.meta_var(L.fragment_row(row0 + wg * 64, tx, p))
                    col = T.meta_var(L.fragment_col(col0, tx, p, v))
                    C[(*at, row, col)] = out(acc[p * 2 + v], bias, at, row, col)

    @T.macro
    def partial_store(P: Any, acc: Any, unit: Any, at: Any, row0: Any, col0: Any, wg: Any, tx: Any) -> None:
        """Unit ``unit``'s float32 sums into its slice of K's partial sums P (split, *batch, m, n)."""
        for p in T.unroll(L.n_acc // 2):
            for v in T.vectorized(2):
                P[(unit // L.c_tiles, *at, L.fragment_row(row0 + wg * 64, tx, p), L.fragment_col(col0, tx, p, v))] = \
                    acc[p * 2 + v]

    @T.macro
    def stage_c(smem: Any, piece: Any, acc: Any, bias: Any, at: Any, row0: Any, col0: Any, wg: Any,
                tx: Any) -> None:
        """The warpgroup's accumulators as C, into its 64 padded rows of shared memory from
        ``piece`` (halves): pairs (2p, 2p+1) of adjacent columns."""
        for p in T.unroll(L.n_acc // 2):
            for v in T.vectorized(2):  # rows past a ragged M: computed at rows below it, never copied out
                smem[piece + L.fragment_row(0, tx, p) * L.c_stride + L.fragment_col(0, tx, p, v)] = \
                    out(acc[p * 2 + v], bias, at, L.epilogue_row(L.fragment_row(row0 + wg * 64, tx, p)),
                        L.fragment_col(col0, tx, p, v))

    @T.macro
    def store_unit(smem: Any, C: Any, bias: Any, sums: Any, unit: Any, at: Any, row0: Any, col0: Any, wg: Any,
                   tx: Any, piece: Any, copy_row0: Any, copy_base: Any, copy_threads: Any, lane: Any) -> None:
        """Unit ``unit``'s sums stored after its k loop: a K slice's float32 sums, or C through
        the epilogue, staged in shared memory (``wgmma_smem_epilogue``: the warpgroup's 64 rows from
        ``piece``) or directly.  The staged C goes out 16 bytes a thread, whole rows a warp:
        thread ``lane`` of ``copy_threads`` copies the rows from ``copy_base`` to C's from
        ``copy_row0`` (the whole tile, or the warpgroup's own rows)."""
        if L.split > 1:
            partial_store(C, sums, unit, at, row0, col0, wg, tx)
        elif L.smem_epilogue:
            T.tvm_storage_sync("shared")  # every warpgroup's wgmma has retired: the stages are free
            stage_c(smem, piece, sums, bias, at, row0, col0, wg, tx)
            T.tvm_storage_sync("shared")
            for i in T.unroll(L.c_loads):
                f = T.meta_var(i * copy_threads + lane)
                if L.in_rows(copy_row0 + f // (L.bn // 8)):
                    for v in T.vectorized(8):
                        C[(*at, copy_row0 + f // (L.bn // 8), col0 + f % (L.bn // 8) * 8 + v)] = \
                            smem[copy_base + f // (L.bn // 8) * L.c_stride + f % (L.bn // 8) * 8 + v]
        else:
            direct_store(C, bias, sums, at, row0, col0, wg, tx)

    return store_unit


def cluster_reduction(L: KernelLayout, out: CValue) -> Callable[..., None]:
    """The macro ``cluster_sum(smem, base, C, bias, acc, bid, at, row0, col0, wg, tx)``: the
    cluster's K slices of this tile added: each block's float32 sums into its shared memory, then
    block ``rank`` adds rows [rank x band, ..) of every block's (distributed shared memory, 16 bytes
    at a time, slices in order) and stores them through the epilogue."""
    from tvm.script import tirx as T

    split, threads, bn, band, sum_stride = L.split, L.threads, L.bn, L.band, L.c_stride
    band_quads = band * bn // 4

    @T.macro
    def cluster_sum(smem: Any, base: Any, C: Any, bias: Any, acc: Any, bid: Any, at: Any, row0: Any, col0: Any,
                    wg: Any, tx: Any) -> None:
        sums = T.decl_buffer((L.bm * sum_stride,), "float32", data=smem.data, scope="shared.dyn")
        peer = T.alloc_buffer((split,), "uint32", scope="local")
        got = T.alloc_buffer((4,), "float32", scope="local")
        quad = T.alloc_buffer((4,), "float32", scope="local")
        T.ptx["cp.async.wait_group"](0)
        T.tvm_storage_sync("shared")  # every warpgroup's wgmma retired: the stages are free
        for p in T.unroll(L.n_acc // 2):
            for v in T.vectorized(2):
                sums[L.fragment_row(wg * 64, tx, p) * sum_stride + L.fragment_col(0, tx, p, v)] = acc[p * 2 + v]
        T.ptx["barrier.cluster.arrive.release"]()
        T.ptx["barrier.cluster.wait.acquire"]()  # every block's sums are in its shared memory
        for b in T.unroll(split):
            T.ptx["mapa.shared::cluster.u32"](peer[b], base, T.uint32(b))  # ``sums`` starts at the stages' base
        for i in T.unroll(-(-band_quads // threads)):
            if i * threads + tx < band_quads:
                row = T.meta_var(bid % split * band + (i * threads + tx) // (bn // 4))
                col = T.meta_var((i * threads + tx) % (bn // 4) * 4)
                for v in T.unroll(4):
                    quad[v] = T.float32(0)
                for b in T.unroll(split):
                    T.ptx["ld.shared::cluster.v4.f32"](got[0], got[1], got[2], got[3],
                                                       peer[b] + T.Cast("uint32", (row * sum_stride + col) * 4))
                    for v in T.unroll(4):
                        quad[v] = quad[v] + got[v]
                for v in T.vectorized(4):
                    C[(*at, row0 + row, col0 + col + v)] = out(quad[v], bias, at, row0 + row, col0 + col + v)
        T.ptx["barrier.cluster.arrive.release"]()
        T.ptx["barrier.cluster.wait.acquire"]()  # no block leaves while another reads its shared memory

    return cluster_sum


def slice_sum_kernel(L: KernelLayout, out: CValue) -> Callable[..., None]:
    """The macro ``add_slices(P, bias, C)``: the second kernel of an unclustered split, C from the
    K slices' partial sums P, their total through the epilogue, four columns a thread (16-byte
    loads of each slice)."""
    from tvm.script import tirx as T

    m, n, split, quads = L.m, L.n, L.split, L.quads
    quad_blocks = -(-quads // REDUCE_THREADS)

    @T.macro
    def add_slices(P: Any, bias: Any, C: Any) -> None:
        with T.launch_thread("blockIdx.x", quad_blocks) as bid:
            with T.launch_thread("threadIdx.x", REDUCE_THREADS) as tx:
                sums = T.alloc_buffer((4,), "float32", scope="local")
                if bid * REDUCE_THREADS + tx < quads:
                    first = T.meta_var((bid * REDUCE_THREADS + tx) * 4)  # C's element, flat
                    at = T.meta_var(L.matrix_lead(first // (m * n)))
                    row, col = T.meta_var(first // n % m), T.meta_var(first % n)
                    for v in T.vectorized(4):
                        sums[v] = P[(0, *at, row, col + v)]
                    for s in T.unroll(split - 1):
                        for v in T.vectorized(4):
                            sums[v] = sums[v] + P[(s + 1, *at, row, col + v)]
                    for v in T.vectorized(4):
                        C[(*at, row, col + v)] = out(sums[v], bias, at, row, col + v)

    return add_slices


def one_unit_kernel(L: KernelLayout, staged: Staging, step: Mma, store_unit: Callable[..., None],
                    cluster_sum: Callable[..., None]) -> Callable[..., None]:
    """The macro ``gemm(A, Bt, bias, C)``: the kernel of a unit a block (a cluster's block with
    ``clustered``): the prologue loads ``ahead`` k tiles, then each k step waits for its tile,
    issues its wgmma, refills the stage the retired wgmma read, and the sums go out through the
    cluster's reduction or ``store_unit``."""
    from tvm.script import tirx as T

    stages, stage, ahead, threads = L.stages, L.stage, L.ahead, L.threads
    init, landed, issued = stage_waits(L)

    @T.macro
    def gemm(A: Any, Bt: Any, bias: Any, C: Any) -> None:
        with T.launch_thread("blockIdx.x", L.units) as bid:
            if L.clustered:
                T.launch_thread("clusterCtaIdx.x", L.split)
            with T.launch_thread("threadIdx.x", threads) as tx:
                smem = T.alloc_buffer((L.smem_elems,), L.in_dtype, scope="shared.dyn", align=1024)
                acc = T.alloc_buffer((L.n_acc,), "float32", scope="local")
                total = T.alloc_buffer((L.n_acc if L.promoting else 1,), "float32", scope="local")  # promoted sums
                done = T.alloc_buffer((1,), "uint32", scope="local")
                row0 = L.tile_row0(bid)
                col0 = L.tile_col0(bid)
                at = T.meta_var(L.tile_lead(bid))
                wg = tx // 128
                base = T.cuda.cvta_generic_to_shared(smem.ptr_to([0]))
                for i in T.unroll(L.n_acc):
                    acc[i] = T.float32(0)
                    if L.promoting:
                        total[i] = T.float32(0)
                init(smem, tx)
                for s in T.unroll(ahead):  # prologue: tiles 0 .. ahead-1
                    staged.load_stage(smem, A, Bt, s * stage, L.global_kt(bid, s), at, row0, col0, tx)
                    issued()
                for kt in T.serial(L.k_tiles):
                    landed(smem, kt, done)  # tile kt has landed (this thread's copies, or the TMA's)
                    T.tvm_storage_sync("shared")  # everyone's copies; every wgmma of tile kt-1-inflight retired
                    step.mma_stage(base, acc, kt % stages * stage, wg, L.kept(kt))
                    if kt + ahead < L.k_tiles:  # refill the stage that tile kt-1-inflight used
                        nxt = (kt + ahead) % stages * stage
                        staged.load_stage(smem, A, Bt, nxt, L.global_kt(bid, kt + ahead), at, row0, col0, tx)
                    issued()
                    T.ptx["wgmma.wait_group.sync.aligned"](L.inflight)  # tile kt-inflight's wgmma retired
                    if L.promoting:
                        step.promotion(acc, total, kt)
                T.ptx["wgmma.wait_group.sync.aligned"](0)
                if L.clustered:
                    cluster_sum(smem, base, C, bias, L.summed(total, acc), bid, at, row0, col0, wg, tx)
                else:  # C staged from the stages' start, the block's threads copying the whole tile
                    store_unit(smem, C, bias, L.summed(total, acc), bid, at, row0, col0, wg, tx,
                               wg * 64 * L.c_stride, row0, 0, threads, tx)

    return gemm


def several_units_kernel(L: KernelLayout, staged: Staging, step: Mma,
                         store_unit: Callable[..., None]) -> Callable[..., None]:
    """The macro ``gemm_tiles(A, Bt, bias, C)``: several units a block, one pipeline over the
    block's units' k steps in turn (iteration j of its n-th unit: n x k_tiles + j), the loads
    ``ahead`` iterations ahead across unit boundaries, so the next unit's first stages load during
    this one's last k steps and its store.  The store follows the k loop and a full wgmma wait
    (touching the accumulators inside the loop would make ptxas serialise every wgmma)."""
    from tvm.script import tirx as T

    stages, stage, ahead, k_tiles, grid = L.stages, L.stage, L.ahead, L.k_tiles, L.grid
    init, landed, issued = stage_waits(L)

    @T.macro
    def gemm_tiles(A: Any, Bt: Any, bias: Any, C: Any) -> None:
        with T.launch_thread("blockIdx.x", grid) as bid:
            with T.launch_thread("threadIdx.x", L.threads) as tx:
                smem = T.alloc_buffer((L.smem_elems,), L.in_dtype, scope="shared.dyn", align=1024)
                acc = T.alloc_buffer((L.n_acc,), "float32", scope="local")
                total = T.alloc_buffer((L.n_acc if L.promoting else 1,), "float32", scope="local")  # promoted sums
                done = T.alloc_buffer((1,), "uint32", scope="local")
                wg = tx // 128
                base = T.cuda.cvta_generic_to_shared(smem.ptr_to([0]))
                mine = T.meta_var((L.units - 1 - bid) // grid + 1)  # units of this block
                init(smem, tx)
                for s in T.unroll(ahead):  # prologue: iterations 0 .. ahead-1
                    if s < mine * k_tiles:
                        staged.load_iteration(smem, A, Bt, bid, s, tx)
                    issued()
                for t in T.serial(mine):
                    row0 = T.meta_var(L.tile_row0(bid + t * grid))
                    col0 = T.meta_var(L.tile_col0(bid + t * grid))
                    at = T.meta_var(L.tile_lead(bid + t * grid))
                    for i in T.unroll(L.n_acc):
                        acc[i] = T.float32(0)
                        if L.promoting:
                            total[i] = T.float32(0)
                    for kt in T.serial(k_tiles):
                        landed(smem, t * k_tiles + kt, done)  # this iteration's stage has landed
                        T.tvm_storage_sync("shared")  # everyone's copies; the wgmma ``inflight`` + 1 back retired
                        step.mma_stage(base, acc, (t * k_tiles + kt) % stages * stage, wg, L.kept(kt))
                        if t * k_tiles + kt + ahead < mine * k_tiles:  # refill the stage that retired wgmma read
                            staged.load_iteration(smem, A, Bt, bid, t * k_tiles + kt + ahead, tx)
                        issued()
                        T.ptx["wgmma.wait_group.sync.aligned"](L.inflight)
                        if L.promoting:
                            step.promotion(acc, total, kt)
                    T.ptx["wgmma.wait_group.sync.aligned"](0)
                    # C staged in the stages of this unit's last 1 + inflight k steps (not refilled), each
                    # warpgroup its own 64 rows
                    last = T.meta_var(t * k_tiles + k_tiles - 1)
                    piece = T.meta_var((last - wg // L.pieces) % stages * stage + wg % L.pieces * 64 * L.c_stride)
                    store_unit(smem, C, bias, L.summed(total, acc), bid + t * grid, at, row0, col0, wg, tx, piece,
                               row0 + wg * 64, piece, 128, tx % 128)

    return gemm_tiles


def kernels(L: KernelLayout, out: CValue) -> Callable[..., None]:
    """The macro ``run(A, Bt, bias, C)``: the wgmma kernel (a unit a block, or several), or with K
    split and no cluster, the kernel into float32 sums of the slices, then their total through the
    epilogue (``slice_sum_kernel``)."""
    from tvm.script import tirx as T

    staged, step, store_unit = staging(L), mma(L), stores(L, out)
    if L.tiles > 1:
        units_gemm = several_units_kernel(L, staged, step, store_unit)
    else:
        units_gemm = one_unit_kernel(L, staged, step, store_unit, cluster_reduction(L, out))
    add_slices = slice_sum_kernel(L, out)

    @T.macro
    def run(A: Any, Bt: Any, bias: Any, C: Any) -> None:
        if L.split > 1 and not L.clustered:
            P = T.alloc_buffer((L.split, *L.c_shape), "float32", scope="global")
            units_gemm(A, Bt, bias, P)
            add_slices(P, bias, C)
        else:
            units_gemm(A, Bt, bias, C)

    a_rank, b_rank = len(L.a_shape), len(L.bt_shape)

    @T.macro
    def run_tma(A: Any, Bt: Any, bias: Any, C: Any) -> None:
        """``run`` on the tensor maps of A and Bt (encoded on the host; the kernel's parameters)."""
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        T.evaluate(T.tensormap_encode_tiled(a_map, A.data, *tensor_map_dims(L, L.a_shape),
                                            *tensor_map_box(L.bk, L.bm, a_rank), descriptor_dtype=L.in_dtype,
                                            rank=a_rank, swizzle=TMA_SWIZZLE_128B))
        b_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        T.evaluate(T.tensormap_encode_tiled(b_map, Bt.data, *tensor_map_dims(L, L.bt_shape),
                                            *tensor_map_box(*b_box(L), b_rank), descriptor_dtype=L.in_dtype,
                                            rank=b_rank, swizzle=TMA_SWIZZLE_128B))
        run(a_map, b_map, bias, C)

    return run_tma if L.tma else run


@dataclass(frozen=True)
class Prepare:
    """Inputs a wgmma function takes in place of A and Bt (``wgmma_gemm``'s ``prepare``): their
    shapes and dtype, and the TIR macro ``macro(A_in, B_in, A, Bt)`` writing A and Bt from them."""

    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    dtype: str
    macro: Any


def prim_func(L: KernelLayout, run: Callable[..., None], bias_dtype: str | None, prepare: Prepare | None,
              c_dtype: str, checked: bool, scales: bool = False) -> Any:
    """The PrimFunc ``main`` around ``run``: ``main(A, Bt, C)``, ``main(A, Bt, bias, C)`` with
    ``bias_dtype``, ``main(A, Bt, scale_ab, C)`` with ``scales`` (A's and B's float32 scales),
    or ``main(A_in, B_in, C)`` writing A and Bt first (``prepare``).  ``checked``
    false: not verified well formed (an epilogue may read buffers that the caller makes parameters
    of a function of its own; the parser evaluates the decorator's arguments as constants, so it
    cannot say so)."""
    from tvm import s_tir
    from tvm.script import tirx as T

    a_shape, bt_shape, c_shape, in_dtype, n = L.a_shape, L.bt_shape, L.c_shape, L.in_dtype, L.n
    if scales:
        @T.prim_func
        def main_scaled(A: T.Buffer(a_shape, in_dtype), Bt: T.Buffer(bt_shape, in_dtype),
                        scale_ab: T.Buffer((2,), "float32"), C: T.Buffer(c_shape, c_dtype)):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            run(A, Bt, scale_ab, C)

        return main_scaled

    if bias_dtype is not None:
        @T.prim_func
        def main_bias(A: T.Buffer(a_shape, in_dtype), Bt: T.Buffer(bt_shape, in_dtype),
                      bias: T.Buffer((n,), bias_dtype),
                      C: T.Buffer(c_shape, c_dtype)):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            run(A, Bt, bias, C)

        return main_bias

    if prepare is not None:
        a_in, b_in, in_dtype_of_inputs, fill = prepare.a_shape, prepare.b_shape, prepare.dtype, prepare.macro

        @T.prim_func(check_well_formed=False)
        def main_prepared(A_in: T.Buffer(a_in, in_dtype_of_inputs), B_in: T.Buffer(b_in, in_dtype_of_inputs),
                          C: T.Buffer(c_shape, c_dtype)):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            A = T.alloc_buffer(a_shape, in_dtype, scope="global")
            Bt = T.alloc_buffer(bt_shape, in_dtype, scope="global")
            fill(A_in, B_in, A, Bt)
            run(A, Bt, None, C)

        if checked:
            s_tir.analysis.verify_well_formed(main_prepared)
        return main_prepared

    @T.prim_func(check_well_formed=False)
    def main(A: T.Buffer(a_shape, in_dtype), Bt: T.Buffer(bt_shape, in_dtype), C: T.Buffer(c_shape, c_dtype)):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        run(A, Bt, None, C)

    if checked:
        s_tir.analysis.verify_well_formed(main)
    return main
