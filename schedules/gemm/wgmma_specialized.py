"""The warp-specialized wgmma kernel (knob ``wgmma_ws``), as the published Hopper GEMMs run: the
block's first warpgroup is the producer, whose one thread issues every stage's TMA loads as soon
as the consumers have released the stage, and the other ``bm / 64`` warpgroups are the consumers,
each waiting for a stage's barrier, multiplying its 64 rows, and releasing the stage on a second
barrier once its wgmma has retired.  No block barrier in the k loop: a consumer warpgroup never
waits for another, and the loads run ahead by as many stages as there are.  ``setmaxnreg`` gives
the producer's registers to the consumers.  The same units a block as ``several_units_kernel``
(row-major or rastered, one tile or several), the same k loop (``wgmma_steps.k_loop``: promotions
overlapped or not), C stored straight from the registers.  With ``multicast`` the blocks run as
clusters of two sharing one operand's tile (``wgmma_loads.multicast_staging``): a stage's release
barrier then counts one thread of each consumer warpgroup of both blocks, and the blocks meet at a
cluster barrier after the barriers' init and before leaving.
"""
from __future__ import annotations

from typing import Any, Callable

from .wgmma_layout import KernelLayout
from .wgmma_loads import Staging, phase_wait, shared_region, stage_barrier

PRODUCER_REGISTERS = 40  # the producer warpgroup's registers a thread after setmaxnreg (one thread issues loads)
CONSUMER_REGISTERS = 232  # the consumers': 128 x 40 + 256 x 232 fits an SM's 65536 with two consumer warpgroups
PRODUCER_THREADS = 128  # a warpgroup: setmaxnreg acts on whole warpgroups


def specialized_registers(consumer_threads: int) -> int:
    """The registers a block holds after ``setmaxnreg``: the producer warpgroup's and the consumers'."""
    return PRODUCER_THREADS * PRODUCER_REGISTERS + consumer_threads * CONSUMER_REGISTERS


def release_barrier(L: KernelLayout, smem: Any, index: Any) -> Any:
    """The shared address of stage ``index``'s release barrier, after the stages' load barriers."""
    return stage_barrier(L, smem, L.stages + index)


def release_count(L: KernelLayout) -> int:
    """Arrivals that release a stage: every consumer thread; with ``multicast`` one thread of each
    consumer warpgroup of both blocks (the pair's producers refill both blocks' stage)."""
    return L.threads // 128 * 2 if L.multicast else L.threads // L.wg_k  # a stage is one turn's with wg_k


TURN_TO_SECOND, TURN_TO_FIRST = 3, 4  # named barriers handing C's stage over (1 and 2: each warpgroup's own)
SUMS_WRITTEN, SUMS_READ = 5, 6  # named barriers of the k turns' sums (``k_turn_sums``)


def c_turn(L: KernelLayout) -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
    """The macros ``take(wg, t)``, ``hand_over(wg)`` and ``last(wg, mine)`` around each unit's
    store where the two consumer warpgroups take C's 64-row stage in turn (``c_turns``; empty
    otherwise): the second waits until the first has copied its rows out, the first (from its
    second unit on) until the second has copied the unit before out; each hands the stage over
    at a named barrier of both warpgroups' 256 threads (``bar.arrive`` by the one leaving, ``bar.sync``
    by the one waiting), and the first meets the second's last hand-over before it leaves."""
    from tvm.script import tirx as T

    @T.macro
    def take(wg: Any, t: Any) -> None:
        if L.c_turns:
            if wg == 1:
                T.ptx["bar.sync"](T.uint32(TURN_TO_SECOND), T.uint32(256))
            elif t > 0:
                T.ptx["bar.sync"](T.uint32(TURN_TO_FIRST), T.uint32(256))

    @T.macro
    def hand_over(wg: Any) -> None:
        if L.c_turns:
            if wg == 0:
                T.ptx["bar.arrive"](T.uint32(TURN_TO_SECOND), T.uint32(256))
            else:
                T.ptx["bar.arrive"](T.uint32(TURN_TO_FIRST), T.uint32(256))

    @T.macro
    def last(wg: Any, mine: Any) -> None:
        if L.c_turns:
            if wg == 0 and mine > 0:  # the second's last hand-over met: no barrier left half-arrived
                T.ptx["bar.sync"](T.uint32(TURN_TO_FIRST), T.uint32(256))

    return take, hand_over, last


def k_turn_sums(L: KernelLayout) -> tuple[Callable[..., None], Callable[..., None]]:
    """The macros ``meet(smem, acc, wg, lane, t)`` after each unit's k loop and ``leave(wg, mine)``
    where two consumer warpgroups take a 64-row tile's k steps in turn (``wgmma_wg_k`` 2; empty
    otherwise): the second writes its sums into shared memory of their own (``k_sums_at``, a
    register of each thread a row of 128 words) and arrives at a named barrier the first waits at,
    then the first adds them into its own; before the second writes a later unit's, it waits at a
    second barrier the first arrives at once it has read them, and it meets the first's last
    arrival before it leaves (no barrier left half-arrived)."""
    from tvm.script import tirx as T

    @T.macro
    def meet(smem: Any, acc: Any, wg: Any, lane: Any, t: Any) -> None:
        if L.wg_k > 1:
            sums = T.meta_var(shared_region(L, smem, L.k_sums_at // L.elem, L.n_acc * 128 * 4))
            at = T.meta_var(sums + T.Cast("uint32", lane % 128 * 4))
            if L.k_parity(wg) == 1:
                if t > 0:
                    T.ptx["bar.sync"](T.uint32(SUMS_READ), T.uint32(256))  # the first has read the unit before's
                for i in T.unroll(L.n_acc):
                    T.ptx["st.shared.f32"](at + T.uint32(i * 128 * 4), acc[i])
                T.ptx["bar.arrive"](T.uint32(SUMS_WRITTEN), T.uint32(256))
            else:
                got = T.alloc_buffer((1,), "float32", scope="local")
                T.ptx["bar.sync"](T.uint32(SUMS_WRITTEN), T.uint32(256))
                for i in T.unroll(L.n_acc):
                    T.ptx["ld.shared.f32"](got[0], at + T.uint32(i * 128 * 4))
                    acc[i] = acc[i] + got[0]
                T.ptx["bar.arrive"](T.uint32(SUMS_READ), T.uint32(256))

    @T.macro
    def leave(wg: Any, mine: Any) -> None:
        if L.wg_k > 1:
            if L.k_parity(wg) == 1 and mine > 0:
                T.ptx["bar.sync"](T.uint32(SUMS_READ), T.uint32(256))

    return meet, leave


def specialized_kernel(L: KernelLayout, staged: Staging, step: Any, loop: Callable[..., None],
                       store_unit: Callable[..., None], launch_early: Callable[..., None],
                       wait_prior: Callable[..., None]) -> Callable[..., None]:
    """The macro ``gemm_ws(A, Bt, bias, C, ready)``: the producer and consumer warpgroups of
    the module docstring over the block's units b, b + grid, ...; ``A`` and ``Bt`` are tensor
    maps (``wgmma_tma``).  Iteration it (unit it // k_tiles, k step it % k_tiles) uses stage
    it % stages in round it // stages: its load barrier completes once per round (the TMA's
    bytes), its release barrier once every consumer thread (``release_count``) has arrived after
    the round's wgmma.  ``launch_early`` and ``wait_prior`` are ``wgmma_steps``' programmatic
    dependent launch macros (empty without ``pdl``)."""
    from tvm.script import tirx as T

    stages, stage, k_tiles, grid, consumers = L.stages, L.stage, L.k_tiles, L.grid, L.threads
    wait = phase_wait()
    take, hand_over, last = c_turn(L)
    meet, leave = k_turn_sums(L)

    @T.macro
    def cluster_sync() -> None:  # every thread of both blocks of the cluster past this point
        T.ptx["barrier.cluster.arrive.release"]()
        T.ptx["barrier.cluster.wait.acquire"]()

    @T.macro
    def produce(smem: Any, A: Any, Bt: Any, bid: Any, mine: Any, done: Any) -> None:
        for it in T.serial(mine * k_tiles):
            if it >= stages:  # the consumers have released the stage's previous round
                wait(done, release_barrier(L, smem, it % stages), (it // stages - 1) % 2)
            staged.load_iteration(smem, A, Bt, bid, it, 0)

    @T.macro
    def release(smem: Any, it: Any, lane: Any) -> None:
        if L.multicast:  # thread r of each consumer warpgroup releases the stage of the cluster's block r
            if lane % 128 < 2:
                peer = T.alloc_buffer((1,), "uint32", scope="local")
                T.ptx["mapa.shared::cluster.u32"](peer[0], release_barrier(L, smem, it % stages),
                                                  T.Cast("uint32", lane % 128))
                T.ptx["mbarrier.arrive.shared::cluster.b64"](peer[0])  # release at CTA scope, as CUTLASS
        else:
            T.ptx["mbarrier.arrive.shared::cta.b64"](release_barrier(L, smem, it % stages))

    @T.macro
    def k_step(smem: Any, base: Any, t: Any, wg: Any, lane: Any, done: Any, sums: Any, kt: Any) -> None:
        it = T.meta_var(t * k_tiles + kt)
        wait(done, stage_barrier(L, smem, it % stages), it // stages % 2)  # its stage has landed
        step.mma_stage(base, sums, it % stages * stage, wg, L.kept(kt))
        T.ptx["wgmma.wait_group.sync.aligned"](L.inflight)
        if L.inflight == 0:
            release(smem, it, lane)
        elif L.wg_k == 1:
            if kt > 0:  # the wgmma of the step before has retired
                release(smem, it - 1, lane)
        elif kt >= L.wg_k:  # the wgmma of this warpgroup's turn before has retired
            release(smem, it - L.wg_k, lane)

    @T.macro
    def k_turns(k_step: Any, at_step: Any, acc: Any, wg: Any) -> None:
        """A unit's k steps ``wg_k`` consumers take in turn: this warpgroup's, then every wgmma retired."""
        for j in T.serial(k_tiles // L.wg_k):
            k_step(*at_step, acc, j * L.wg_k + L.k_parity(wg))
        T.ptx["wgmma.wait_group.sync.aligned"](0)

    @T.macro
    def gemm_ws(A: Any, Bt: Any, bias: Any, C: Any, ready: Any) -> None:
        with T.launch_thread("blockIdx.x", grid) as bid:
            if L.multicast:
                T.launch_thread("clusterCtaIdx.x", 2)
            with T.launch_thread("threadIdx.x", consumers + PRODUCER_THREADS) as tx:
                launch_early()
                smem = T.alloc_buffer((L.smem_elems,), L.in_dtype, scope="shared.dyn", align=1024)
                acc = T.alloc_buffer((L.n_acc,), "float32", scope="local")
                total = T.alloc_buffer((L.n_acc if L.promoting else 1,), "float32", scope="local")
                spare = T.alloc_buffer((L.n_acc if L.overlap else 1,), "float32", scope="local")
                done = T.alloc_buffer((1,), "uint32", scope="local")
                base = T.cuda.cvta_generic_to_shared(smem.ptr_to([0]))
                mine = T.meta_var((L.units - 1 - bid) // grid + 1)  # units of this block
                if tx == 0:
                    for i in T.unroll(stages):
                        T.ptx["mbarrier.init.shared::cta.b64"](stage_barrier(L, smem, i), T.uint32(1))
                        T.ptx["mbarrier.init.shared::cta.b64"](release_barrier(L, smem, i),
                                                               T.uint32(release_count(L)))
                    T.ptx["fence.mbarrier_init.release.cluster"]()
                T.tvm_storage_sync("shared")
                if L.multicast:  # the peer's barriers initialised before its loads and releases reach them
                    cluster_sync()
                wait_prior()
                if tx < PRODUCER_THREADS:
                    T.ptx["setmaxnreg.dec.sync.aligned.u32"](PRODUCER_REGISTERS)
                    if tx == 0:
                        produce(smem, A, Bt, bid, mine, done)
                else:
                    T.ptx["setmaxnreg.inc.sync.aligned.u32"](CONSUMER_REGISTERS)
                    lane = T.meta_var(tx - PRODUCER_THREADS)
                    wg = T.meta_var(lane // 128)
                    for t in T.serial(mine):
                        row0 = T.meta_var(L.tile_row0(bid + t * grid))
                        col0 = T.meta_var(L.tile_col0(bid + t * grid))
                        at = T.meta_var(L.tile_lead(bid + t * grid))
                        step.cleared(acc, total)
                        if L.wg_k > 1:
                            k_turns(k_step, (smem, base, t, wg, lane, done), acc, wg)
                            if L.inflight > 0:  # every wgmma retired: this warpgroup's last stage too
                                release(smem, t * k_tiles + k_tiles - L.wg_k + L.k_parity(wg), lane)
                            meet(smem, acc, wg, lane, t)
                            if L.k_parity(wg) == 0:  # the first stores the tile's sums
                                store_unit(smem, C, bias, acc, bid + t * grid, at, row0, col0, wg, lane,
                                           0, row0, 0, 128, lane)
                        else:
                            loop(k_step, (smem, base, t, wg, lane, done), acc, spare, total)
                            if L.inflight > 0:  # every wgmma retired: the unit's last stage too
                                release(smem, t * k_tiles + k_tiles - 1, lane)
                            take(wg, t)
                            store_unit(smem, C, bias, L.summed(total, acc), bid + t * grid, at, row0, col0, wg,
                                       lane, 0, row0, 0, 128, lane)
                            hand_over(wg)
                    last(wg, mine)
                    leave(wg, mine)
                if L.multicast:  # no block leaves while its peer may still load into it or release its stages
                    cluster_sync()

    return gemm_ws
