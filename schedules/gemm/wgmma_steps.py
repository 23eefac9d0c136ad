"""The steps of the wgmma GEMM kernel that ``wgmma.wgmma_gemm`` assembles into a PrimFunc.

Over ``wgmma_layout.KernelLayout`` (the sizes and index maps derived once from a tile and a
GEMM's shape: stages, swizzle, descriptors, which C tile and K slice a unit is, the accumulator
fragment).  ``CValue``:
what C stores for an accumulator (scale, bias, cast, or a caller's epilogue).  Then a function
per step, each returning TIR macros that close over the layout: the loads of k tiles into the
stages (``wgmma_loads``: cp.async, or the TMA with ``wgmma_tma``), the wgmma of a k step and the
promotion of its sums (``mma``), a unit's k loop with its promotions overlapped or not
(``k_loop``), the stores after the k loop (``stores``: direct, through shared memory, or a K
slice's float32 sums), the sum of a cluster's K slices (``cluster_sum``), the second kernel
adding unclustered slices (``add_slices``), the kernels with their launch and k steps
(``one_unit_kernel``, ``several_units_kernel``), and the PrimFunc around them (``prim_func``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from .wgmma_layout import REDUCE_THREADS, KernelLayout, c_stage_row, counted_words
from .wgmma_specialized import specialized_kernel
from .wgmma_loads import (TMA_SWIZZLE_128B, Staging, a_box, b_box, shared_region, stage_waits, staging,
                          tensor_map_box, tma_swizzle, tensor_map_dims)


@dataclass(frozen=True)
class CValue:
    """What C stores for an accumulator: scaled, plus the bias of its column, cast to ``c_dtype``;
    or what ``epilogue(value, row, col, lead)`` makes of it.  ``scales``: the buffer in the
    bias's place holds two float32 scales (A's and B's, per tensor: an 8-bit float GEMM's) that
    multiply the sum.  ``bias_batched``: a bias row for each matrix of the batch (its leading
    axes are the batch's), as each direction of a GRU has its own.  ``store``: a caller's own
    store of the accumulators in place of C's (``OwnStore``)."""

    c_dtype: str
    scale: float = 1.0
    has_bias: bool = False
    epilogue: Callable[..., Any] | None = None
    scales: bool = False
    bias_batched: bool = False
    store: "OwnStore | None" = None

    def __call__(self, value: Any, bias: Any, at: list[Any], row: Any, col: Any) -> Any:
        from tvm.script import tirx as T

        if self.epilogue is not None:
            return T.Cast(self.c_dtype, self.epilogue(value, row, col, at))
        if self.scales:
            value = value * (bias[0] * bias[1])
        if self.scale != 1.0:
            value = value * T.float32(self.scale)
        if self.has_bias:
            value = value + T.Cast("float32", bias[(*at, col)] if self.bias_batched else bias[col])
        return T.Cast(self.c_dtype, value)


class OwnStore(Protocol):
    """A caller's own store of a tile's sums in place of C's, and the PrimFunc around it (a GRU
    step's cell on gate-grouped columns: ``schedules/gru/cell_epilogue.py``): ``macro(L)`` is
    ``store(outputs, acc, bias, at, row0, col0, tx)`` for a warpgroup's 64 rows from ``row0`` and
    the tile's columns from ``col0`` (``outputs``: what the function passes in C's place);
    ``cluster_macro(L)``, with K split in a cluster, ``store(outputs, bias, at, row0, col0, bid, tx,
    peer)`` for the block's band of rows, the slices' float32 sums in each block's shared memory
    (``peer``: their addresses, rows ``L.c_stride`` words apart); ``prim_func(L, run)`` the PrimFunc
    calling ``run(A, Bt, bias, outputs, None)``."""

    def macro(self, L: KernelLayout) -> Callable[..., None]: ...

    def cluster_macro(self, L: KernelLayout) -> Callable[..., None]: ...

    def prim_func(self, L: KernelLayout, run: Callable[..., None]) -> Any: ...


@dataclass(frozen=True)
class Mma:
    """The wgmma of a k step and the promotion of its sums."""

    mma_stage: Callable[..., None]  # (base, acc, cur, wg, keep)
    promotion: Callable[..., None]  # (acc, total, kt)
    add_into: Callable[..., None]  # (total, acc): total += acc, every wgmma into acc retired
    cleared: Callable[..., None]  # (acc, total): both zero before a unit's k loop (total where promoting)


def mma(L: KernelLayout) -> Mma:
    """The macros of a k step's multiply: a warpgroup's bk / k_inst wgmma on the stage's
    descriptors (one commit group), and, promoting, the accumulators added into the second set."""
    from tvm.script import tirx as T

    @T.macro
    def add_into(total: Any, acc: Any) -> None:
        for i in T.unroll(L.n_acc):
            total[i] = total[i] + acc[i]

    @T.macro
    def cleared(acc: Any, total: Any) -> None:
        for i in T.unroll(L.n_acc):
            acc[i] = T.float32(0)
            if L.promoting:
                total[i] = T.float32(0)

    @T.macro
    def promotion(acc: Any, total: Any, kt: Any) -> None:
        """At the last k step of every ``promote``: the accumulators into ``total`` (every wgmma retired)."""
        if kt % L.promote == L.promote - 1:
            T.ptx["wgmma.wait_group.sync.aligned"](0)
            add_into(total, acc)

    @T.macro
    def mma_stage(base: Any, acc: Any, cur: Any, wg: Any, keep: Any) -> None:
        """The warpgroup's 64 rows times the stage at ``cur`` (elements): bk / k_inst wgmma, one
        group; ``keep`` false: the first one starts the accumulators afresh."""
        T.ptx["wgmma.fence.sync.aligned"]()
        for kk in T.unroll(L.bk // L.k_inst):
            T.ptx[L.mma](*[acc[i] for i in range(L.n_acc)],
                         L.desc(base, cur + L.wg_row(wg) * 64 * L.bk + kk * L.k_inst),
                         L.desc(base, cur + L.a_stage + kk * 16 * L.b_atom, L.bk * L.b_swizzle, L.b_swizzle)
                         if L.n_major
                         else L.desc(base, L.wg_b(cur, wg) + kk * L.k_inst),
                         L.scale_d(kk, keep), 1, 1,
                         *(() if L.k_major_only else (0, int(L.n_major))))
        T.ptx["wgmma.commit_group.sync.aligned"]()

    return Mma(mma_stage, promotion, add_into, cleared)


OVERLAP_CHUNK_STEPS = 16  # k steps unrolled between full waits with overlapped promotions


def k_loop(L: KernelLayout, step: Mma) -> Callable[..., None]:
    """The macro ``loop(k_step, at_step, acc, spare, total)``: a unit's k steps, ``k_step(*at_step,
    sums, kt)`` each (wait for the stage, the wgmma into ``sums``, refill, wait for all but
    ``inflight`` groups), then every wgmma retired.  Promoting, the sums go into ``total``: after
    each window's last step (every group retired first); or with ``overlap``, windows alternate
    between ``acc`` and ``spare`` and a window's sums are added at the next window's first step,
    after its wait for all but that step's own group, so the adds run while its wgmma does
    (the same adds in the same order: the same C).  ptxas keeps the wgmma asynchronous only where
    no set is read across a loop's back edge, and a k loop unrolled over a long K outgrows the
    instruction cache (docs/results/gemm.md): the windows go in chunks of about
    ``OVERLAP_CHUNK_STEPS`` k steps, each unrolled and ending with every group retired."""
    from tvm.script import tirx as T

    p = max(L.promote, 1)
    windows = L.windows if L.overlap else 1
    per_chunk = max(1, min(windows, OVERLAP_CHUNK_STEPS // p))

    @T.macro
    def window(k_step: Any, at_step: Any, sums: Any, other: Any, total: Any, first: Any) -> None:
        """The window of k steps from ``first`` into ``sums``, ``other``'s (the window before) added
        after its first step's wait."""
        for j in T.unroll(p):
            k_step(*at_step, sums, first + j)
            if j == 0:
                step.add_into(total, other)

    def chunk(count: int) -> Callable[..., None]:
        """The macro ``run(k_step, at_step, acc, spare, total, first)``: ``count`` windows from k
        step ``first``, the first into ``acc`` (nothing before it to add), the sets alternating,
        then every group retired and the last window's sums added."""

        @T.macro
        def run(k_step: Any, at_step: Any, acc: Any, spare: Any, total: Any, first: Any) -> None:
            for j in T.unroll(p):
                k_step(*at_step, acc, first + j)
            # unrolled by nvcc (``#pragma unroll``; TVM's own unrolling leaves ptxas too few registers)
            for w in T.unroll((count - 1) // 2, annotations={"pragma_unroll_explicit": 0}):
                window(k_step, at_step, spare, acc, total, first + (2 * w + 1) * p)
                window(k_step, at_step, acc, spare, total, first + (2 * w + 2) * p)
            if count % 2 == 0:
                window(k_step, at_step, spare, acc, total, first + (count - 1) * p)
                T.ptx["wgmma.wait_group.sync.aligned"](0)
                step.add_into(total, spare)
            else:
                T.ptx["wgmma.wait_group.sync.aligned"](0)
                step.add_into(total, acc)

        return run

    whole, rest = chunk(per_chunk), chunk(windows % per_chunk or per_chunk)

    @T.macro
    def loop(k_step: Any, at_step: Any, acc: Any, spare: Any, total: Any) -> None:
        if L.overlap:
            for c in T.serial(windows // per_chunk):
                whole(k_step, at_step, acc, spare, total, c * per_chunk * p)
            if windows % per_chunk > 0:
                rest(k_step, at_step, acc, spare, total, windows // per_chunk * per_chunk * p)
        else:
            for kt in T.serial(L.k_tiles):
                k_step(*at_step, acc, kt)
                if L.promoting:
                    step.promotion(acc, total, kt)
            T.ptx["wgmma.wait_group.sync.aligned"](0)

    return loop


def stores(L: KernelLayout, out: CValue) -> Callable[..., None]:
    """The macro ``store_unit(smem, C, bias, sums, unit, at, row0, col0, wg, tx, piece, copy_row0,
    copy_base, copy_threads, lane)`` storing a unit's sums after its k loop: a K slice's float32
    sums, C staged through shared memory (the stages', or the warp-specialized kernel's own), or
    C stored directly."""
    from tvm.script import tirx as T

    own = out.store.macro(L) if out.store is not None else None

    @T.macro
    def direct_store(C: Any, bias: Any, acc: Any, at: Any, row0: Any, col0: Any, wg: Any, tx: Any) -> None:
        """The accumulators straight to C (pairs of adjacent columns), the warpgroup's band and columns."""
        first = T.meta_var(L.wg_first_col(col0, wg))
        if own is not None:  # the caller's store, C its outputs
            own(C, acc, bias, at, row0 + L.wg_row(wg) * 64, first, tx)
        elif L.guarded:  # each pair computed unguarded (below M and N), stored below them; else as it always was
            pair = T.alloc_buffer((2,), C.dtype, scope="local")
            for p in T.unroll(L.n_acc // 2):
                row = T.meta_var(L.fragment_row(row0 + L.wg_row(wg) * 64, tx, p))
                for v in T.vectorized(2):
                    pair[v] = out(acc[p * 2 + v], bias, at, L.epilogue_row(row),
                                  L.epilogue_col(L.fragment_col(first, tx, p, v)))
                if L.in_c(row, L.fragment_col(first, tx, p, 0)):  # an even N: a pair is in or out
                    for v in T.vectorized(2):
                        C[(*at, row, L.fragment_col(first, tx, p, v))] = pair[v]
        else:
            for p in T.unroll(L.n_acc // 2):
                for v in T.vectorized(2):
                    row = T.meta_var(L.fragment_row(row0 + L.wg_row(wg) * 64, tx, p))
                    col = T.meta_var(L.fragment_col(first, tx, p, v))
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
                        L.epilogue_col(L.fragment_col(col0, tx, p, v)))

    @T.macro
    def staged_apart(smem: Any, C: Any, bias: Any, acc: Any, at: Any, row0: Any, col0: Any, wg: Any,
                     tx: Any) -> None:
        """The warp-specialized kernel's C through a stage of its own (``c_stage_at``; its producer
        refills every other stage meanwhile): the warpgroup writes its 64 rows there, meets at a
        named barrier of its 128 threads (not the block's: the producer does not come), and copies
        them out 16 bytes a thread, whole rows a warp; a second barrier before the next tile's
        rows overwrite them (with ``c_turns`` the stage is one warpgroup's, which
        ``wgmma_specialized.c_turn`` hands over).  Shared memory through PTX, which TVM's barrier
        pass does not see."""
        pair = T.alloc_buffer((2,), C.dtype, scope="local")
        quad = T.alloc_buffer((4,), "uint32", scope="local")
        c_bytes = T.meta_var(L.c_stage_rows * c_stage_row(L.bn) * 2)
        band = T.meta_var(shared_region(L, smem, L.c_stage_at // L.elem, c_bytes) + T.Cast(
            "uint32", (0 if L.c_turns else wg) * 64 * c_stage_row(L.bn) * 2))
        lane = T.meta_var(tx % 128)
        for p in T.unroll(L.n_acc // 2):
            row = T.meta_var(L.fragment_row(0, lane, p))
            for v in T.vectorized(2):
                pair[v] = out(acc[p * 2 + v], bias, at, L.epilogue_row(row0 + wg * 64 + row),
                              L.epilogue_col(L.fragment_col(col0, lane, p, v)))
            T.ptx["st.shared.b32"](band + T.Cast("uint32", L.c_stage_chunk(row, p // 2) + lane % 4 * 4),
                                   T.reinterpret("uint32", pair.vload([0], f"{C.dtype}x2")))
        T.ptx["bar.sync"](T.Cast("uint32", 1 + wg), T.uint32(128))  # the warpgroup's rows staged
        for i in T.unroll(L.bn // 16):  # 64 rows x bn / 8 chunks over 128 threads
            row = T.meta_var((i * 128 + lane) // (L.bn // 8))
            chunk = T.meta_var((i * 128 + lane) % (L.bn // 8))
            T.ptx["ld.shared.v4.b32"](quad[0], quad[1], quad[2], quad[3],
                                      band + T.Cast("uint32", L.c_stage_chunk(row, chunk)))
            if L.in_c(row0 + wg * 64 + row, col0 + chunk * 8):  # N % 8 == 0: chunks in or out
                T.ptx["st.global.v4.b32"](C.ptr_to([*at, row0 + wg * 64 + row, col0 + chunk * 8]),
                                          quad[0], quad[1], quad[2], quad[3])
        if not L.c_turns:  # in turn the other warpgroup's barrier orders the copy before the next rows
            T.ptx["bar.sync"](T.Cast("uint32", 1 + wg), T.uint32(128))  # copied out before the next tile's rows

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
        elif L.c_stage_bytes > 0:
            staged_apart(smem, C, bias, sums, at, row0, col0, wg, tx)
        elif L.smem_epilogue:
            T.tvm_storage_sync("shared")  # every warpgroup's wgmma has retired: the stages are free
            stage_c(smem, piece, sums, bias, at, row0, col0, wg, tx)
            T.tvm_storage_sync("shared")
            for i in T.unroll(L.c_loads):
                f = T.meta_var(i * copy_threads + lane)
                if L.in_c(copy_row0 + f // (L.bn // 8), col0 + f % (L.bn // 8) * 8):  # N % 8 == 0: chunks in or out
                    for v in T.vectorized(8):
                        C[(*at, copy_row0 + f // (L.bn // 8), col0 + f % (L.bn // 8) * 8 + v)] = \
                            smem[copy_base + f // (L.bn // 8) * L.c_stride + f % (L.bn // 8) * 8 + v]
        else:
            direct_store(C, bias, sums, at, row0, col0, wg, tx)

    return store_unit


def cluster_words(L: KernelLayout) -> Callable[..., None]:
    """The macro ``add_words(sums, first, got, peer, word)``: four float32 words from word ``word``
    of every block's sums in the cluster (``peer``: their shared-memory addresses; distributed
    shared memory, 16 bytes a block, slices in order) added into ``sums[first:first + 4]`` (``got``:
    four float32 registers the loads land in)."""
    from tvm.script import tirx as T

    @T.macro
    def add_words(sums: Any, first: Any, got: Any, peer: Any, word: Any) -> None:
        for v in T.unroll(4):
            sums[first + v] = T.float32(0)
        for b in T.unroll(L.split):
            T.ptx["ld.shared::cluster.v4.f32"](got[0], got[1], got[2], got[3], peer[b] + T.Cast("uint32", word * 4))
            for v in T.unroll(4):
                sums[first + v] = sums[first + v] + got[v]

    return add_words


def cluster_reduction(L: KernelLayout, out: CValue) -> Callable[..., None]:
    """The macro ``cluster_sum(smem, base, C, bias, acc, bid, at, row0, col0, wg, tx)``: the
    cluster's K slices of this tile added: each block's float32 sums into its shared memory, then
    block ``rank`` adds rows [rank x band, ..) of every block's (distributed shared memory, 16 bytes
    at a time, slices in order) and stores them through the epilogue, or a caller's own store
    does (``OwnStore.cluster_macro``)."""
    from tvm.script import tirx as T

    split, threads, bn, band, sum_stride = L.split, L.threads, L.bn, L.band, L.c_stride
    band_quads = band * bn // 4
    own = out.store.cluster_macro(L) if out.store is not None else None
    add_words = cluster_words(L)

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
        if own is not None:  # the caller's store, C its outputs
            own(C, bias, at, row0, col0, bid, tx, peer)
        else:
            for i in T.unroll(-(-band_quads // threads)):
                if i * threads + tx < band_quads:
                    row = T.meta_var(bid % split * band + (i * threads + tx) // (bn // 4))
                    col = T.meta_var((i * threads + tx) % (bn // 4) * 4)
                    add_words(quad, 0, got, peer, row * sum_stride + col)
                    if L.in_rows(row0 + row):  # a ragged M's rows below it (True, no branch, where bm divides M)
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
    wait_prior, (launch_early, _) = after_prior(L), row_signals(L)

    @T.macro
    def add_slices(P: Any, bias: Any, C: Any) -> None:
        with T.launch_thread("blockIdx.x", quad_blocks) as bid:
            with T.launch_thread("threadIdx.x", REDUCE_THREADS) as tx:
                sums = T.alloc_buffer((4,), "float32", scope="local")
                launch_early()
                wait_prior()  # the slices' kernel has finished
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


def after_prior(L: KernelLayout) -> Callable[..., None]:
    """The macro ``wait_prior()``: with ``L.pdl`` (the kernel launched early), wait until the
    kernel ahead of it on the stream has finished and its memory is visible
    (``griddepcontrol.wait``), before this kernel's first global access; empty without."""
    from tvm.script import tirx as T

    @T.macro
    def wait_prior() -> None:
        if L.pdl:
            T.ptx["griddepcontrol.wait"]()

    return wait_prior


def row_signals(L: KernelLayout) -> tuple[Callable[..., None], Callable[..., None]]:
    """The macros ``launch_early()`` and ``stored(ready, row0, tx)`` of a kernel that counts its
    stores (``L.signal``) or is launched early itself (``L.pdl``): at its start it lets the next
    kernel on the stream launch (programmatic dependent launch,
    ``griddepcontrol.launch_dependents``), and once a block's
    threads have stored a tile (its band, in a cluster) one thread adds 1 to its tile row's count
    and to the total after the rows' counts, behind every thread's fence: a kernel that polls
    ``ready`` with acquire loads reads the rows of a complete count (all rows: a complete
    total) as stored.  Without ``signal`` (and ``pdl``) both are empty."""
    from tvm.script import tirx as T

    @T.macro
    def launch_early() -> None:
        if L.signal or L.pdl:
            T.ptx["griddepcontrol.launch_dependents"]()

    @T.macro
    def stored(ready: Any, row0: Any, tx: Any) -> None:
        if L.signal:
            T.evaluate(T.call_extern("void", "__threadfence"))  # this thread's C stores, before the count
            T.tvm_storage_sync("shared")
            if tx == 0:
                T.evaluate(T.call_extern("int32", "atomicAdd", T.address_of(ready[row0 // L.bm]), 1))
                T.evaluate(T.call_extern("int32", "atomicAdd", T.address_of(ready[counted_words(L.m, L.bm) - 1]), 1))

    return launch_early, stored


def one_unit_kernel(L: KernelLayout, staged: Staging, step: Mma, store_unit: Callable[..., None],
                    cluster_sum: Callable[..., None]) -> Callable[..., None]:
    """The macro ``gemm(A, Bt, bias, C)``: the kernel of a unit a block (a cluster's block with
    ``clustered``): the prologue loads ``ahead`` k tiles, then each k step waits for its tile,
    issues its wgmma, refills the stage the retired wgmma read, and the sums go out through the
    cluster's reduction or ``store_unit``."""
    from tvm.script import tirx as T

    stages, stage, ahead, threads = L.stages, L.stage, L.ahead, L.threads
    init, landed, issued = stage_waits(L)
    wait_prior = after_prior(L)
    loop = k_loop(L, step)
    launch_early, stored = row_signals(L)

    @T.macro
    def k_step(smem: Any, A: Any, Bt: Any, base: Any, bid: Any, at: Any, row0: Any, col0: Any, tx: Any, wg: Any,
               done: Any, acc: Any, kt: Any) -> None:
        landed(smem, kt, done)  # tile kt has landed (this thread's copies, or the TMA's)
        T.tvm_storage_sync("shared")  # everyone's copies; every wgmma of tile kt-1-inflight retired
        step.mma_stage(base, acc, kt % stages * stage, wg, L.kept(kt))
        if kt + ahead < L.k_tiles:  # refill the stage that tile kt-1-inflight used
            nxt = (kt + ahead) % stages * stage
            staged.load_stage(smem, A, Bt, nxt, L.global_kt(bid, kt + ahead), at, row0, col0, tx)
        issued()
        T.ptx["wgmma.wait_group.sync.aligned"](L.inflight)  # tile kt-inflight's wgmma retired

    @T.macro
    def gemm(A: Any, Bt: Any, bias: Any, C: Any, ready: Any) -> None:
        with T.launch_thread("blockIdx.x", L.units) as bid:
            if L.clustered:
                T.launch_thread("clusterCtaIdx.x", L.split)
            with T.launch_thread("threadIdx.x", threads) as tx:
                launch_early()
                smem = T.alloc_buffer((L.smem_elems,), L.in_dtype, scope="shared.dyn", align=1024)
                acc = T.alloc_buffer((L.n_acc,), "float32", scope="local")
                total = T.alloc_buffer((L.n_acc if L.promoting else 1,), "float32", scope="local")  # promoted sums
                spare = T.alloc_buffer((L.n_acc if L.overlap else 1,), "float32", scope="local")  # second set
                done = T.alloc_buffer((1,), "uint32", scope="local")
                row0 = L.tile_row0(bid)
                col0 = L.tile_col0(bid)
                at = T.meta_var(L.tile_lead(bid))
                wg = tx // 128
                base = T.cuda.cvta_generic_to_shared(smem.ptr_to([0]))
                step.cleared(acc, total)
                init(smem, tx)
                wait_prior()
                for s in T.unroll(ahead):  # prologue: tiles 0 .. ahead-1
                    staged.load_stage(smem, A, Bt, s * stage, L.global_kt(bid, s), at, row0, col0, tx)
                    issued()
                loop(k_step, (smem, A, Bt, base, bid, at, row0, col0, tx, wg, done), acc, spare, total)
                if L.clustered:
                    cluster_sum(smem, base, C, bias, L.summed(total, acc), bid, at, row0, col0, wg, tx)
                else:  # C staged from the stages' start, the block's threads copying the whole tile
                    store_unit(smem, C, bias, L.summed(total, acc), bid, at, row0, col0, wg, tx,
                               wg * 64 * L.c_stride, row0, 0, threads, tx)
                stored(ready, row0, tx)

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
    wait_prior = after_prior(L)
    loop = k_loop(L, step)
    launch_early, stored = row_signals(L)

    @T.macro
    def k_step(smem: Any, A: Any, Bt: Any, base: Any, bid: Any, t: Any, mine: Any, tx: Any, wg: Any, done: Any,
               acc: Any, kt: Any) -> None:
        landed(smem, t * k_tiles + kt, done)  # this iteration's stage has landed
        T.tvm_storage_sync("shared")  # everyone's copies; the wgmma ``inflight`` + 1 back retired
        step.mma_stage(base, acc, (t * k_tiles + kt) % stages * stage, wg, L.kept(kt))
        if t * k_tiles + kt + ahead < mine * k_tiles:  # refill the stage that retired wgmma read
            staged.load_iteration(smem, A, Bt, bid, t * k_tiles + kt + ahead, tx)
        issued()
        T.ptx["wgmma.wait_group.sync.aligned"](L.inflight)

    @T.macro
    def gemm_tiles(A: Any, Bt: Any, bias: Any, C: Any, ready: Any) -> None:
        with T.launch_thread("blockIdx.x", grid) as bid:
            with T.launch_thread("threadIdx.x", L.threads) as tx:
                launch_early()
                smem = T.alloc_buffer((L.smem_elems,), L.in_dtype, scope="shared.dyn", align=1024)
                acc = T.alloc_buffer((L.n_acc,), "float32", scope="local")
                total = T.alloc_buffer((L.n_acc if L.promoting else 1,), "float32", scope="local")  # promoted sums
                spare = T.alloc_buffer((L.n_acc if L.overlap else 1,), "float32", scope="local")  # second set
                done = T.alloc_buffer((1,), "uint32", scope="local")
                wg = tx // 128
                base = T.cuda.cvta_generic_to_shared(smem.ptr_to([0]))
                mine = T.meta_var((L.units - 1 - bid) // grid + 1)  # units of this block
                init(smem, tx)
                wait_prior()
                for s in T.unroll(ahead):  # prologue: iterations 0 .. ahead-1
                    if s < mine * k_tiles:
                        staged.load_iteration(smem, A, Bt, bid, s, tx)
                    issued()
                for t in T.serial(mine):
                    row0 = T.meta_var(L.tile_row0(bid + t * grid))
                    col0 = T.meta_var(L.tile_col0(bid + t * grid))
                    at = T.meta_var(L.tile_lead(bid + t * grid))
                    step.cleared(acc, total)
                    loop(k_step, (smem, A, Bt, base, bid, t, mine, tx, wg, done), acc, spare, total)
                    # C staged in the stages of this unit's last 1 + inflight k steps (not refilled), each
                    # warpgroup its own 64 rows
                    last = T.meta_var(t * k_tiles + k_tiles - 1)
                    piece = T.meta_var((last - wg // L.pieces) % stages * stage + wg % L.pieces * 64 * L.c_stride)
                    store_unit(smem, C, bias, L.summed(total, acc), bid + t * grid, at, row0, col0, wg, tx, piece,
                               row0 + wg * 64, piece, 128, tx % 128)
                    stored(ready, row0, tx)

    return gemm_tiles


def kernels(L: KernelLayout, out: CValue) -> Callable[..., None]:
    """The macro ``run(A, Bt, bias, C)``: the wgmma kernel (a unit a block, or several), or with K
    split and no cluster, the kernel into float32 sums of the slices, then their total through the
    epilogue (``slice_sum_kernel``)."""
    from tvm.script import tirx as T

    staged, step, store_unit = staging(L), mma(L), stores(L, out)
    if L.specialized:  # a producer warpgroup and consumer warpgroups (``wgmma_specialized``)
        units_gemm = specialized_kernel(L, staged, step, k_loop(L, step), store_unit, row_signals(L)[0],
                                        after_prior(L))
    elif L.tiles > 1:
        units_gemm = several_units_kernel(L, staged, step, store_unit)
    else:
        units_gemm = one_unit_kernel(L, staged, step, store_unit, cluster_reduction(L, out))
    add_slices = slice_sum_kernel(L, out)

    # the K slices' sums in a scope of their own where the TMA reads A and Bt: TVM sees those reads
    # only where the tensor maps are encoded, before the kernel, so it would put the sums in A's or
    # Bt's memory where the caller's function allocates them (``Prepare``) while the kernel reads them
    partials = "global.partial" if L.tma else "global"

    @T.macro
    def run(A: Any, Bt: Any, bias: Any, C: Any, ready: Any) -> None:
        if L.split > 1 and not L.clustered:
            P = T.alloc_buffer((L.split, *L.c_shape), "float32", scope=partials)
            units_gemm(A, Bt, bias, P, None)
            add_slices(P, bias, C)
        else:
            units_gemm(A, Bt, bias, C, ready)

    a_rank, b_rank = len(L.a_shape), len(L.bt_shape)

    @T.macro
    def run_tma(A: Any, Bt: Any, bias: Any, C: Any, ready: Any) -> None:
        """``run`` on the tensor maps of A and Bt (encoded on the host; the kernel's parameters)."""
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        T.evaluate(T.tensormap_encode_tiled(a_map, A.data, *tensor_map_dims(L, L.a_shape),
                                            *tensor_map_box(*a_box(L), a_rank), descriptor_dtype=L.in_dtype,
                                            rank=a_rank, swizzle=TMA_SWIZZLE_128B))
        b_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        T.evaluate(T.tensormap_encode_tiled(b_map, Bt.data, *tensor_map_dims(L, L.bt_shape),
                                            *tensor_map_box(*b_box(L), b_rank), descriptor_dtype=L.in_dtype,
                                            rank=b_rank, swizzle=tma_swizzle(L.b_swizzle)))
        run(a_map, b_map, bias, C, ready)

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
              c_dtype: str, checked: bool, scales: bool = False, bias_batched: bool = False) -> Any:
    """The PrimFunc ``main`` around ``run``: ``main(A, Bt, C)``, ``main(A, Bt, bias, C)`` with
    ``bias_dtype`` (bias (n,), or with ``bias_batched`` (*batch, n)), ``main(A, Bt, scale_ab, C)``
    with ``scales`` (A's and B's float32 scales), or ``main(A_in, B_in, C)`` writing A and Bt
    first (``prepare``).  ``checked`` false: not verified well formed (an epilogue may read buffers
    that the caller makes parameters of a function of its own; the parser evaluates the
    decorator's arguments as constants, so it cannot say so)."""
    from tvm import s_tir
    from tvm.script import tirx as T

    a_shape, bt_shape, c_shape, in_dtype, n = L.a_shape, L.bt_shape, L.c_shape, L.in_dtype, L.n
    bias_shape = (*L.lead, n) if bias_batched else (n,)
    if scales:
        @T.prim_func
        def main_scaled(A: T.Buffer(a_shape, in_dtype), Bt: T.Buffer(bt_shape, in_dtype),
                        scale_ab: T.Buffer((2,), "float32"), C: T.Buffer(c_shape, c_dtype)):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            run(A, Bt, scale_ab, C, None)

        return main_scaled

    if bias_dtype is not None and L.signal:
        rows = counted_words(L.m, L.bm)

        @T.prim_func
        def main_bias_counted(A: T.Buffer(a_shape, in_dtype), Bt: T.Buffer(bt_shape, in_dtype),
                              bias: T.Buffer(bias_shape, bias_dtype), C: T.Buffer(c_shape, c_dtype),
                              ready: T.Buffer((rows,), "int32")):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            run(A, Bt, bias, C, ready)

        return main_bias_counted

    if bias_dtype is not None:
        @T.prim_func
        def main_bias(A: T.Buffer(a_shape, in_dtype), Bt: T.Buffer(bt_shape, in_dtype),
                      bias: T.Buffer(bias_shape, bias_dtype),
                      C: T.Buffer(c_shape, c_dtype)):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            run(A, Bt, bias, C, None)

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
            run(A, Bt, None, C, None)

        if checked:
            s_tir.analysis.verify_well_formed(main_prepared)
        return main_prepared

    @T.prim_func(check_well_formed=False)
    def main(A: T.Buffer(a_shape, in_dtype), Bt: T.Buffer(bt_shape, in_dtype), C: T.Buffer(c_shape, c_dtype)):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        run(A, Bt, None, C, None)

    if checked:
        s_tir.analysis.verify_well_formed(main)
    return main
