"""How the wgmma kernel's stages are filled (``wgmma_steps`` assembles the kernel): every thread's
16-byte ``cp.async`` of its chunks (``staging``), or the Tensor Memory Accelerator's boxes issued by
one thread and counted on a barrier a stage (``tma_staging``; ``wgmma_tma``), the waits of either
(``stage_waits``), and the sizes and coordinates of the tensor maps the host function encodes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .wgmma_layout import KernelLayout

TMA_SWIZZLE_128B = 3  # CU_TENSOR_MAP_SWIZZLE_128B: the TMA writes the swizzle the descriptors read
TMA_SWIZZLE_64B = 2  # CU_TENSOR_MAP_SWIZZLE_64B: B's N atoms of 32 elements (``KernelLayout.b_atom``)


def tma_swizzle(row_bytes: int) -> int:
    """The tensor map's swizzle mode writing rows of ``row_bytes`` (128 or 64) swizzled."""
    return {128: TMA_SWIZZLE_128B, 64: TMA_SWIZZLE_64B}[row_bytes]


@dataclass(frozen=True)
class Staging:
    """The loads of k tiles into the stages (cp.async or the TMA's)."""

    load_stage: Callable[..., None]  # (smem, A, Bt, slot, kt, at, row0, col0, tx)
    load_iteration: Callable[..., None]  # (smem, A, Bt, bid, it, tx): several units a block


def staging(L: KernelLayout) -> Staging:
    """The macros filling a stage: 16-byte ``cp.async`` of A's and B's k tile, each thread its
    chunks, into the 128-byte swizzle (B N-major: 64-wide atoms); with ``tma`` the TMA's boxes."""
    from tvm.script import tirx as T

    if L.tma:
        return tma_staging(L)

    @T.macro
    def load_stage(smem: Any, A: Any, Bt: Any, slot: Any, kt: Any, at: Any, row0: Any, col0: Any, tx: Any) -> None:
        """k tile ``kt`` of A and B into stage ``slot`` (its halves offset), 16-byte ``cp.async``."""
        for i in T.unroll(L.a_loads):
            T.ptx["cp.async.cg.shared.global"](smem.ptr_to([slot + L.swizzled(i * L.threads + tx)]),
                                               L.a_global(A, at, row0, kt, i * L.threads + tx), 16)
        for i in T.unroll(L.b_loads):
            T.ptx["cp.async.cg.shared.global"](smem.ptr_to([slot + L.a_stage + L.b_chunk(i * L.threads + tx)]),
                                               L.b_global(Bt, at, col0, kt, i * L.threads + tx), 16)

    return by_iteration(L, load_stage)


def by_iteration(L: KernelLayout, load_stage: Callable[..., None],
                 last: Callable[[Any, Any], Any] = lambda bid, tx: tx) -> Staging:
    """``load_stage`` and the macro loading iteration ``it`` of a block of several tiles with it:
    k tile it % k_tiles of its (it // k_tiles)-th tile (tile bid + that x grid), into stage
    it % stages; ``load_stage``'s last argument is ``last(bid, tx)`` (the loading thread, or
    what else the stage's loads need of the block)."""
    from tvm.script import tirx as T

    @T.macro
    def load_iteration(smem: Any, A: Any, Bt: Any, bid: Any, it: Any, tx: Any) -> None:
        load_stage(smem, A, Bt, it % L.stages * L.stage, L.global_kt(bid + it // L.k_tiles * L.grid, it % L.k_tiles),
                   L.tile_lead(bid + it // L.k_tiles * L.grid),
                   L.tile_row0(bid + it // L.k_tiles * L.grid), L.tile_col0(bid + it // L.k_tiles * L.grid),
                   last(bid, tx))

    return Staging(load_stage, load_iteration)


def tma_staging(L: KernelLayout) -> Staging:
    """The macros filling a stage by the Tensor Memory Accelerator: thread 0 tells the stage's
    barrier the bytes to expect and issues A's and Bt's boxes, which the TMA writes in the 128-byte
    swizzle the descriptors read (``A`` and ``Bt`` are their tensor maps here).  The proxy fence
    orders the block's earlier generic accesses of the stage (a staged C) before the TMA's writes."""
    from tvm.script import tirx as T

    copy = "cp.async.bulk.tensor.{}d.shared::cluster.global.mbarrier::complete_tx::bytes"
    a_copy, b_copy = copy.format(len(L.a_shape)), copy.format(len(L.bt_shape))
    if L.multicast:
        shared_copy = copy + ".multicast::cluster"
        return multicast_staging(L, a_copy, b_copy, shared_copy.format(len(L.a_shape)),
                                 shared_copy.format(len(L.bt_shape)))

    @T.macro
    def load_stage(smem: Any, A: Any, Bt: Any, slot: Any, kt: Any, at: Any, row0: Any, col0: Any, tx: Any) -> None:
        """k tile ``kt`` of A and B into stage ``slot`` (elements), counted on its barrier."""
        if tx == 0:
            bar = T.meta_var(stage_barrier(L, smem, slot // L.stage))
            T.ptx["fence.proxy.async.shared::cta"]()
            T.ptx["mbarrier.arrive.expect_tx.shared::cta.b64"](bar, T.uint32(L.stage_bytes_loaded))
            T.ptx[a_copy](smem.ptr_to([slot]), T.address_of(A), *a_coordinates(L, at, row0, kt), bar)
            for j in T.unroll(b_boxes(L)):  # B's N atoms, bk x b_atom elements apart (one box K-major)
                T.ptx[b_copy](smem.ptr_to([slot + L.a_stage + j * L.bk * L.b_atom]), T.address_of(Bt),
                              *b_coordinates(L, at, col0, kt, j), bar)

    return by_iteration(L, load_stage)


def multicast_staging(L: KernelLayout, a_copy: str, b_copy: str, a_shared: str, b_shared: str) -> Staging:
    """The TMA's loads of a block of a pair sharing one operand's tile (``multicast``): its own
    tile of the other operand (``a_copy`` / ``b_copy``), and half of the shared tile (the rows of
    its rank in the cluster, ``shared_rows`` of them; ``a_shared`` / ``b_shared``, the copies'
    multicast forms), which the TMA writes into both blocks' stage at the same offset and counts
    on both blocks' barrier of the stage; each barrier expects the whole stage's bytes.  Rank r
    of the cluster is block ``bid % 2``; the producer calls ``load_iteration``."""
    from tvm.script import tirx as T

    half = L.shared_rows

    @T.macro
    def load_stage(smem: Any, A: Any, Bt: Any, slot: Any, kt: Any, at: Any, row0: Any, col0: Any, rank: Any) -> None:
        bar = T.meta_var(stage_barrier(L, smem, slot // L.stage))
        T.ptx["fence.proxy.async.shared::cta"]()
        T.ptx["mbarrier.arrive.expect_tx.shared::cta.b64"](bar, T.uint32(L.stage_bytes_loaded))
        if L.shares_a:
            T.ptx[a_shared](smem.ptr_to([slot + rank * half * L.bk]), T.address_of(A),
                            *a_coordinates(L, at, row0 + rank * half, kt), bar, T.uint16(3))
            for j in T.unroll(b_boxes(L)):
                T.ptx[b_copy](smem.ptr_to([slot + L.a_stage + j * L.bk * L.b_atom]), T.address_of(Bt),
                              *b_coordinates(L, at, col0, kt, j), bar)
        else:
            T.ptx[a_copy](smem.ptr_to([slot]), T.address_of(A), *a_coordinates(L, at, row0, kt), bar)
            T.ptx[b_shared](smem.ptr_to([slot + L.a_stage + rank * half * L.bk]), T.address_of(Bt),
                            *b_coordinates(L, at, col0 + rank * half, kt, 0), bar, T.uint16(3))

    return by_iteration(L, load_stage, last=lambda bid, tx: bid % 2)


def phase_wait() -> Callable[..., None]:
    """The macro ``wait_phase(done, bar, parity)``: spins on ``mbarrier.try_wait.parity`` until the
    barrier at shared address ``bar`` has completed the phase of that parity (``done``: a
    uint32 register)."""
    from tvm.script import tirx as T

    @T.macro
    def wait_phase(done: Any, bar: Any, parity: Any) -> None:
        done[0] = T.uint32(0)
        while done[0] == T.uint32(0):
            T.ptx["mbarrier.try_wait.parity.shared::cta.b64"](done[0], bar, T.Cast("uint32", parity))

    return wait_phase


def stage_waits(L: KernelLayout) -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
    """The macros ``init(smem, tx)`` (before the prologue), ``landed(smem, it, done)`` (before the
    block barrier of iteration ``it``: its stage has landed) and ``issued()`` (after a stage's
    loads): cp.async groups, or with ``tma`` a barrier a stage, waited on for the phase of the
    iteration's round of the stages."""
    from tvm.script import tirx as T

    wait_phase = phase_wait()

    @T.macro
    def init(smem: Any, tx: Any) -> None:
        if L.tma:
            if tx == 0:
                for i in T.unroll(L.stages):
                    T.ptx["mbarrier.init.shared::cta.b64"](stage_barrier(L, smem, i), T.uint32(1))
                T.ptx["fence.mbarrier_init.release.cluster"]()
            T.tvm_storage_sync("shared")

    @T.macro
    def landed(smem: Any, it: Any, done: Any) -> None:
        if L.tma:
            wait_phase(done, stage_barrier(L, smem, it % L.stages), it // L.stages % 2)
        else:
            T.ptx["cp.async.wait_group"](L.ahead - 1)  # this iteration's stage has landed (this thread's copies)
            T.ptx["fence.proxy.async.shared::cta"]()  # generic-proxy writes -> wgmma's async proxy

    @T.macro
    def issued() -> None:
        if not L.tma:
            T.ptx["cp.async.commit_group"]()  # possibly empty: keeps the group count uniform

    return init, landed, issued


# the Tensor Memory Accelerator's barriers, tensor maps and boxes
def shared_region(L: KernelLayout, smem: Any, first: Any, size: int) -> Any:
    """The shared address of the ``size`` bytes of ``smem`` from element ``first`` on, written as
    the address of their last element less the bytes before it, because TVM sizes a kernel's
    dynamic shared memory by the largest index of ``smem`` it sees (from the base address plus
    bytes it saw none: 163,842 bytes of 196,640 for a block of several tiles, the last stage and
    the barriers out of range; from the first element, 6 bytes short)."""
    from tvm.script import tirx as T

    last = T.cuda.cvta_generic_to_shared(smem.ptr_to([first + size // L.elem - 1]))
    return last - T.uint32(size - L.elem)


def stage_barrier(L: KernelLayout, smem: Any, index: Any) -> Any:
    """The shared address of stage ``index``'s barrier (``tma``), after the stages."""
    return shared_region(L, smem, L.stages * L.stage + index * (8 // L.elem), 8)


def tensor_map_dims(L: KernelLayout, shape: Sequence[int]) -> list[Any]:
    """``tensormap_encode_tiled``'s sizes of an operand of ``shape`` (batch axes, then its
    matrix): dimensions and byte strides, innermost first."""
    dims = [int(x) for x in reversed(shape)]
    strides = [int(np.prod(dims[:i + 1], dtype=np.int64)) * L.elem for i in range(len(dims) - 1)]
    return [*dims, *strides]


def tensor_map_box(inner: int, outer: int, rank: int) -> list[int]:
    """A box of ``outer`` rows of ``inner`` elements (one matrix of any batch axes), and unit
    element strides."""
    return [inner, outer, *[1] * (rank - 2), *[1] * rank]


def a_box(L: KernelLayout) -> tuple[int, int]:
    """A's box: a stage's A tile (bk x ``a_box_rows``: its rows, or M's below one tile), or with
    ``multicast`` sharing A the half each block loads."""
    return L.bk, L.shared_rows if L.multicast and L.shares_a else L.a_box_rows


def b_box(L: KernelLayout) -> tuple[int, int]:
    """B's box: a stage's Bt tile (bk x bn; with ``multicast`` sharing Bt the half each block loads),
    or B (k, n) N-major, one N atom (``b_atom`` wide) of bk rows."""
    if L.n_major:
        return L.b_atom, L.bk
    return L.bk, L.shared_rows if L.multicast and not L.shares_a else L.bn


def b_boxes(L: KernelLayout) -> int:
    """B's boxes a stage: the N atoms of B (k, n), else one."""
    return L.bn // L.b_atom if L.n_major else 1


def a_coordinates(L: KernelLayout, at: list[Any], row0: Any, kt: Any) -> list[Any]:
    """A's box of k tile ``kt`` at rows ``row0``, innermost first (rows past M load as zeros; below
    one tile the box holds M's rows alone: ``a_box_rows``)."""
    from tvm.script import tirx as T

    return [T.Cast("int32", x) for x in (L.k_coordinate(kt, 0), row0, *reversed(at))]


def b_coordinates(L: KernelLayout, at: list[Any], col0: Any, kt: Any, atom: int) -> list[Any]:
    """B's box ``atom`` of k tile ``kt`` at columns ``col0``, innermost first."""
    from tvm.script import tirx as T

    lead = reversed(at if L.b_batched else [])
    inner = (L.b_col(col0, atom * L.b_atom), kt * L.bk) if L.n_major else (L.k_coordinate(kt, 1), col0)
    return [T.Cast("int32", x) for x in (*inner, *lead)]
