"""The persistent GRU step kernel whose blocks form one thread-block cluster per direction
(``step_flags`` 2, Hopper): the flag-exchange kernel's blocks and math (``warp_units.py``: a warp
per hidden unit, its lanes splitting k, W_hh's share in registers for all T steps), but h goes
between blocks through distributed shared memory.  Each block keeps all of h in its own shared
memory, twice (slot s % 2 read at step s, slot (s+1) % 2 written), and a barrier (``mbarrier``)
per slot; the lanes that run a row's cell store h' into that slot of every block of the cluster
with ``st.async``, which counts the bytes on the receiving block's barrier of the slot, and a step
begins once its slot's barrier has counted all of h (one thread arms it for the next step).
With ``step_cluster_quads`` the block first gathers its h' in its shared memory and its threads
store it four values an ``st.async``: each receiving barrier counts a quarter of the arrivals.
With ``step_cluster_pull`` nothing is stored into another block: each block keeps its units' h' in
its own shared memory as (value, step tag) words, two slots, and every block pulls all of h_s with
remote loads (``ld.relaxed.cluster.shared::cluster``, a word a thread, each polled until its tag
says the step), then a block barrier; no mbarrier.  A slot is written again two steps later, only
after its writer has pulled the words every block wrote after pulling from that slot.

Why: at a batch of a few rows a step is a few hundred nanoseconds of math, and the flag kernel's
exchange through L2 (a relaxed store, then polling until the tag shows) costs an L2 round trip;
a store into a neighbour SM's shared memory might cost less (measured: it does not, so the pick
leaves this kernel to the search; ``docs/results/gru.md``).  The cluster is launched as a whole
(its blocks resident together); a wait that polls ``SPIN_LIMIT`` times raises the timed-out flag
rather than hang, and a cluster the GPU cannot place fails the launch, an error record.  No
barrier between steps is needed for the slot written: a block receives all of h_s only after
every warp of every block has read slot (s-1) % 2 for the last time, and only then writes it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm_ext.cost_model.hardware import HardwareModel
from tvm_ext.hardware import CLUSTER_MAX, supports_clusters
from tvm_ext.schedules.gemm.warp_tile import WARP
from tvm_ext.core.space import Config
from tvm_ext.lowering.step_loop import BARRIER_WORDS, SPIN_LIMIT
from tvm_ext.target import TargetInfo

from .step_common import MAX_REGISTERS, cell_blend, stored_as
from .step_variant import SIMT_STEP_KNOBS, TC_STEP_KNOBS, StepSizes, StepVariant, fused_threads_reason
from .warp_units import WarpUnitMath, WarpUnitShape

# Registers a thread needs besides its W share, sums and peers (addresses, the cell, the loop):
# fewer than the other step kernels' budget, which polls or stages h in registers
CLUSTER_OTHER_REGISTERS = 20
KERNEL = "cluster step kernel"  # its name in messages


@dataclass(frozen=True)
class ClusterStepShape(WarpUnitShape):
    """The sizes a cluster step config implies for one GRU shape: ``units`` hidden units a
    block, the blocks of a direction one cluster; ``quads``: h' gathered before it is stored."""

    quads: bool = False
    pull: bool = False

    @property
    def cluster(self) -> int:
        """Blocks of a direction, which form its cluster."""
        return -(-self.hidden // self.units)

    @property
    def blocks(self) -> int:
        return self.cluster * self.dirs

    @property
    def lanes_per_row(self) -> int:
        """Lanes that run the cell of one row, sharing the stores of its h' into the cluster."""
        return WARP // self.batch

    @property
    def peers(self) -> int:
        """Blocks each lane that runs a cell stores h' into (none where h is pulled)."""
        return 0 if self.pull else -(-self.cluster // self.lanes_per_row)

    def registers(self) -> int:
        """32-bit registers a thread needs: its W share, the accumulators (3 gates x rows), the
        peers' addresses (of h and of its barriers) and the rest."""
        return self.w_registers() + 3 * self.batch + 2 * self.peers + CLUSTER_OTHER_REGISTERS

    def shared_bytes(self) -> int:
        """h twice (the slot read and the slot written), float32, rows padded to 32 k; with
        ``quads`` the block's own h' once more, with ``pull`` its words (8 bytes) in two slots."""
        own = self.batch * self.units * (16 if self.pull else 4 if self.quads else 0)
        return 2 * self.batch * self.k_per_lane * WARP * 4 + own


def cluster_step_func(steps: int, batch: int, hidden: int, dirs: int, layers: int, *, units: int, h_dtype: str,
                      w_dtype: str, gi_dtype: str, acc_dtype: str, gh_dtype: str, math_dtype: str, out_dtype: str,
                      quads: bool = False, pull: bool = False, name: str = "gru_steps") -> Any:
    """The cluster step kernel of one layer as a lowered PrimFunc (gi, hs, w, bias, layer, out,
    h_n, bar): it reads h0 from slot 0 of the state ``hs`` that ``gru_init`` wrote, and raises the
    timed-out flag ``bar[1]`` where a wait gave up.  ``quads``: a block gathers its units' h' in
    its shared memory and stores them into the cluster four values an ``st.async`` (a quarter of
    the arrivals each receiving barrier counts).  ``pull``: each block keeps its h' as tagged words
    and pulls everyone's from their shared memory (``pull_step``)."""
    from tvm.script import tirx as T

    shape = ClusterStepShape(batch, hidden, dirs, units, w_dtype, quads=quads, pull=pull)
    G, KP, U, cluster = 3 * hidden, shape.k_per_lane, units, shape.cluster
    HP = KP * WARP  # a row of h in shared memory, zero past the hidden size
    slot_words = batch * HP
    threads = shape.threads
    lanes_per_row, peers = shape.lanes_per_row, shape.peers
    storing_lanes = batch if pull else lanes_per_row * batch
    pulls = -(-batch * hidden // threads)  # words of h a thread pulls a step
    math = WarpUnitMath(steps, batch, hidden, dirs, KP, h_dtype, w_dtype, gi_dtype, acc_dtype, gh_dtype, math_dtype,
                        cell_lanes=storing_lanes)
    load_w, load_gi, gate_sums, select_row = math.macros()

    quad_count = -(-hidden // 4)  # quads of units a row, the last padded with zeros
    quads_a_block = units // 4
    senders = cluster * batch * quads_a_block  # a thread a (peer, row, quad of the block's units)
    # what each block receives a step: all of h', float32 (padded to whole quads)
    tx_bytes = batch * (quad_count * 16 if quads else hidden * 4)

    @T.macro
    def wait_for_step(mbar, done, polls, s):  # type: ignore[no-untyped-def]
        """Until h_s has landed in this block's slot s % 2 (its barrier's phase (s-1) // 2 done),
        or ``SPIN_LIMIT`` polls: then the timed-out flag is raised and the kernel runs on."""
        done[0] = T.uint32(0)
        while done[0] == T.uint32(0):
            parity = T.meta_var(T.Cast("uint32", T.bitwise_and(T.shift_right(s - 1, 1), 1)))
            T.ptx["mbarrier.try_wait.parity.shared::cta.b64"](
                done[0], T.cuda.cvta_generic_to_shared(mbar.ptr_to([s % 2])), parity)
            polls[0] = polls[0] + 1
            if polls[0] >= SPIN_LIMIT:
                done[0] = T.uint32(1)

    @T.macro
    def pull_step(h_s, own, word, far, done, polls, s, tid):  # type: ignore[no-untyped-def]
        """h at step s into slot s % 2 of ``h_s``: thread t pulls words t, t + threads, ... (row f // hidden,
        unit f % hidden) from the block that owns the unit, each polled until tagged s, or
        ``SPIN_LIMIT`` polls (then the timed-out flag is raised and the kernel runs on)."""
        for it in T.unroll(pulls):
            f = T.meta_var(it * threads + tid)
            if f < batch * hidden:
                row, k = T.meta_var(f // hidden), T.meta_var(f % hidden)
                T.ptx["mapa.shared::cluster.u32"](
                    far[0], T.cuda.cvta_generic_to_shared(own.ptr_to([((s % 2) * batch + row) * units + k % units])),
                    T.Cast("uint32", k // units))
                done[0] = T.uint32(0)
                while done[0] == T.uint32(0):
                    T.ptx["ld.relaxed.cluster.shared::cluster.b64"](word[0], far[0])
                    polls[0] = polls[0] + 1
                    if T.Cast("int32", T.shift_right(word[0], T.uint64(32))) == s or polls[0] >= SPIN_LIMIT:
                        done[0] = T.uint32(1)
                T.ptx["st.shared::cta.b32"](  # by PTX: the slot read a step ago needs no barrier of its own
                    T.cuda.cvta_generic_to_shared(h_s.ptr_to([(s % 2) * slot_words + row * HP + k])),
                    T.Cast("uint32", T.bitwise_and(word[0], T.uint64(0xFFFFFFFF))))
        T.tvm_storage_sync("shared")

    @T.prim_func(private=True)
    def kernel(gi: T.Buffer((steps * batch, dirs * G), gi_dtype), hs: T.Buffer((2, dirs, batch, hidden), h_dtype),
               w: T.Buffer((dirs, hidden, G), w_dtype), bias: T.Buffer((dirs, G), w_dtype), layer: T.int32,
               out: T.Buffer((steps * batch, dirs * hidden), out_dtype),
               h_n: T.Buffer((layers * dirs, batch, hidden), h_dtype), bar: T.Buffer((BARRIER_WORDS,), "int32")):
        T.func_attr({"tirx.noalias": True})
        bx = T.launch_thread("blockIdx.x", cluster)
        T.launch_thread("clusterCtaIdx.x", cluster)
        bz = T.launch_thread("blockIdx.y", dirs)
        tx = T.launch_thread("threadIdx.x", WARP)
        ty = T.launch_thread("threadIdx.y", U)
        h_s = T.alloc_buffer((2 * slot_words,), "float32", scope="shared")
        mbar = T.alloc_buffer((2,), "uint64", scope="shared")  # slot i's arrivals (bytes of h)
        w_r = T.alloc_buffer((3 * KP,), w_dtype, scope="local")
        acc = T.alloc_buffer((3 * batch,), acc_dtype, scope="local")
        sums = T.alloc_buffer((3,), acc_dtype, scope="local")
        gi_reg = T.alloc_buffer((3,), gi_dtype, scope="local")
        b_h = T.alloc_buffer((3,), "float32", scope="local")
        peer = T.alloc_buffer((max(peers, 1),), "uint32", scope="local")
        peer_bar = T.alloc_buffer((max(peers, 1),), "uint32", scope="local")
        staged = T.alloc_buffer((batch * units if quads else 1,), "float32", scope="shared")  # the block's h'
        own = T.alloc_buffer((2 * batch * units if pull else 1,), "uint64", scope="shared")  # its h' words, pulled
        word = T.alloc_buffer((1,), "uint64", scope="local")
        far = T.alloc_buffer((1,), "uint32", scope="local")
        quad = T.alloc_buffer((4,), "float32", scope="local")
        h_new = T.alloc_buffer((1,), "float32", scope="local")
        z = T.alloc_buffer((1,), math_dtype, scope="local")  # the cell's update gate, computed once
        done = T.alloc_buffer((1,), "uint32", scope="local")
        polls = T.alloc_buffer((1,), "int32", scope="local")
        tid = T.meta_var(ty * WARP + tx)
        j = T.meta_var(bx * U + ty)
        if tid == 0 and not pull:
            for i in T.unroll(2):
                T.ptx["mbarrier.init.shared::cta.b64"](T.cuda.cvta_generic_to_shared(mbar.ptr_to([i])), T.uint32(1))
            T.ptx["fence.mbarrier_init.release.cluster"]()
        load_w(w, w_r, bz, j, tx)  # the lane's W_hh share, once for all steps
        for it in T.unroll(-(-2 * slot_words // threads)):  # h0 into slot 0; k past the hidden size stays zero
            f = T.meta_var(it * threads + tid)
            if f < 2 * slot_words:
                h_s[f] = T.if_then_else(f < slot_words and f % HP < hidden,
                                        T.cast(hs[0, bz, T.min(f // HP, batch - 1), T.min(f % HP, hidden - 1)],
                                               "float32"), T.float32(0))
        if pull:
            for it in T.unroll(-(-2 * batch * units // threads)):  # no slot holds a step's words yet
                if it * threads + tid < 2 * batch * units:
                    own[it * threads + tid] = T.shift_left(T.uint64(0xFFFFFFFF), T.uint64(32))  # tag -1
        for g in T.unroll(3):
            b_h[g] = T.if_then_else(j < hidden, T.cast(bias[bz, g * hidden + T.min(j, hidden - 1)], "float32"),
                                    T.float32(0))
        if quads:  # sender tid's peer: tid // (batch x quads a block)
            rank = T.meta_var(T.Cast("uint32", T.min(tid // (batch * quads_a_block), cluster - 1)))
            T.ptx["mapa.shared::cluster.u32"](peer[0], T.cuda.cvta_generic_to_shared(h_s.ptr_to([0])), rank)
            T.ptx["mapa.shared::cluster.u32"](peer_bar[0], T.cuda.cvta_generic_to_shared(mbar.ptr_to([0])), rank)
        elif not pull:
            for r in T.unroll(peers):  # the blocks this lane stores into: r x lanes_per_row + l // batch
                rank = T.meta_var(T.Cast("uint32", T.min(r * lanes_per_row + tx // batch, cluster - 1)))
                T.ptx["mapa.shared::cluster.u32"](peer[r], T.cuda.cvta_generic_to_shared(h_s.ptr_to([0])), rank)
                T.ptx["mapa.shared::cluster.u32"](peer_bar[r], T.cuda.cvta_generic_to_shared(mbar.ptr_to([0])),
                                                  rank)
        load_gi(gi, gi_reg, 0, bz, j, tx)
        polls[0] = 0
        T.ptx["barrier.cluster.arrive.release.aligned"]()
        T.ptx["barrier.cluster.wait.acquire.aligned"]()  # every block runs, its barriers set, before any store
        for s in T.serial(steps):
            if pull:
                if s > 0:  # slot 0 holds h0, loaded above
                    pull_step(h_s, own, word, far, done, polls, s, tid)
            elif s > 0:
                wait_for_step(mbar, done, polls, s)
            if not pull:
                if tid == 0 and s + 1 < steps:  # slot (s+1) % 2 expects h_{s+1}: its last phase ended at step s-1
                    T.ptx["mbarrier.arrive.expect_tx.shared::cta.b64"](
                        T.cuda.cvta_generic_to_shared(mbar.ptr_to([(s + 1) % 2])), T.uint32(tx_bytes))
            read = T.meta_var((s % 2) * slot_words)
            gate_sums(acc, w_r, h_s, read, tx)
            select_row(sums, acc, tx)  # lane l's row l % batch
            if tx < storing_lanes and j < hidden:
                row = T.meta_var(tx % batch)
                z_n = T.meta_var(math.gates(sums, b_h, gi_reg))
                z[0] = z_n[0]
                h_new[0] = T.cast(stored_as(cell_blend(z[0], z_n[1], h_s[read + row * HP + j], math_dtype), h_dtype),
                                  "float32")
                if pull:
                    if s + 1 < steps:  # into its own slot (s+1) % 2, tagged s + 1
                        T.ptx["st.relaxed.cluster.shared::cta.b64"](
                            T.cuda.cvta_generic_to_shared(own.ptr_to([((s + 1) % 2 * batch + row) * units + ty])),
                            T.bitwise_or(T.shift_left(T.Cast("uint64", s + 1), T.uint64(32)),
                                         T.Cast("uint64", T.reinterpret("uint32", h_new[0]))))
                elif s + 1 < steps and not quads:  # lane l stores into peers l // batch, + lanes_per_row, ...
                    for r in T.unroll(peers):
                        if r * lanes_per_row + tx // batch < cluster:
                            T.ptx["st_async.shared::cluster.mbarrier::complete_tx::bytes.f32"](
                                peer[r] + T.Cast("uint32", ((1 - s % 2) * slot_words + row * HP + j) * 4), h_new[0],
                                peer_bar[r] + T.Cast("uint32", (1 - s % 2) * 8))
            if quads and s + 1 < steps:
                if tx < batch:  # lane r holds row r's h' (zero past the hidden size)
                    staged[tx * units + ty] = T.if_then_else(j < hidden, h_new[0], T.float32(0))
                T.tvm_storage_sync("shared")
                if tid < senders:
                    row = T.meta_var(tid // quads_a_block % batch)
                    q = T.meta_var(tid % quads_a_block)
                    first = T.meta_var(bx * units + q * 4)  # the quad's first unit
                    if first < hidden:
                        for e in T.unroll(4):
                            quad[e] = staged[row * units + q * 4 + e]
                        T.ptx["st_async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32"](
                            peer[0] + T.Cast("uint32", ((1 - s % 2) * slot_words + row * HP + first) * 4),
                            quad[0], quad[1], quad[2], quad[3], peer_bar[0] + T.Cast("uint32", (1 - s % 2) * 8))
            if tx < batch and j < hidden:
                t_row = T.meta_var(T.if_then_else(bz == 0, s, steps - 1 - s))
                out[t_row * batch + tx, bz * hidden + j] = T.cast(h_new[0], out_dtype)
                if s == steps - 1:
                    h_n[layer * dirs + bz, tx, j] = T.cast(h_new[0], h_dtype)
            if s + 1 < steps:
                load_gi(gi, gi_reg, s + 1, bz, j, tx)
        if polls[0] >= SPIN_LIMIT:
            bar[1] = 1
        T.ptx["barrier.cluster.arrive.release.aligned"]()
        T.ptx["barrier.cluster.wait.acquire.aligned"]()  # no block leaves while a peer's store into it is in flight

    return kernel.with_attr("global_symbol", name)


@dataclass(frozen=True)
class ClusterStep(StepVariant):
    """The cluster step kernel (``step_flags`` 2, ``step_tc`` 0): ``step_flag_units`` units a
    block, a warp each; a direction's blocks one thread-block cluster exchanging h through
    distributed shared memory."""

    units: int
    loop: int
    step_j: int  # not this kernel's, but checked against the block limit as for every fused kernel
    quads: bool = False
    pull: bool = False

    unshown_names = SIMT_STEP_KNOBS + TC_STEP_KNOBS + ("step_j", "step_barrier", "step_tc")

    @classmethod
    def of(cls, sizes: StepSizes, c: Config) -> "ClusterStep":
        return cls(sizes, units=c.step_flag_units, loop=c.step_loop, step_j=c.step_j,
                   quads=bool(c.step_cluster_quads), pull=bool(c.step_cluster_pull))

    @property
    def shape(self) -> ClusterStepShape:
        s = self.sizes
        return ClusterStepShape(s.batch, s.hidden, s.dirs, self.units, s.w_dtype, quads=self.quads, pull=self.pull)

    def reason(self, target: TargetInfo) -> str | None:
        """Why it cannot run here: CUDA's persistent kernel on a GPU with clusters, its tile,
        and a cluster the GPU can launch."""
        return (fused_threads_reason(self.step_j, target) or self._persistent_reason(target)
                or self._tile_reason() or self._device_reason(target))

    def _persistent_reason(self, target: TargetInfo) -> str | None:
        if target.kind != "cuda" or self.loop != 2:
            return "cluster step kernel (step_flags 2) is CUDA's persistent kernel only (step_loop 2, step_tc 0)"
        if not supports_clusters(target):
            return f"cluster step kernel (step_flags 2) needs thread-block clusters (sm_90+), not {target.arch}"
        return None

    def _tile_reason(self) -> str | None:
        shape = self.shape
        if why := shape.tile_reason(KERNEL):
            return why
        if self.pull and self.quads:
            return ("cluster step kernel: step_cluster_pull 1 pulls h, nothing is stored into a peer "
                    "(step_cluster_quads 0)")
        if shape.cluster > CLUSTER_MAX:
            return (f"cluster step kernel: hidden {shape.hidden} over {shape.units} units a block is a cluster of "
                    f"{shape.cluster} blocks > {CLUSTER_MAX} (the largest cluster)")
        if shape.registers() > MAX_REGISTERS:
            return (f"cluster step kernel: needs about {shape.registers()} registers per thread (W share "
                    f"3 x {shape.k_per_lane}, {3 * shape.batch} sums) > {MAX_REGISTERS}")
        return None

    def _device_reason(self, target: TargetInfo) -> str | None:
        shape = self.shape
        if why := shape.block_reason(KERNEL, target, shape.shared_bytes(), "h twice"):
            return why
        hw = HardwareModel.from_target(target)
        if hw.registers_per_sm and shape.threads * shape.registers() > hw.registers_per_sm:
            return (f"cluster step kernel: a block of {shape.threads} threads needs about {shape.registers()} "
                    f"registers a thread (W share 3 x {shape.k_per_lane}, {3 * shape.batch} sums); an SM has "
                    f"{hw.registers_per_sm // shape.threads} a thread for it")
        return None

    def init_layout(self) -> dict[str, bool]:
        return {"pingpong": True, "barrier": True}

    def barrier_words(self) -> tuple[str, ...]:
        return ("bar",)

    def lowered_kernels(self) -> dict[str, Any]:
        s = self.sizes
        return {"gru_steps": cluster_step_func(
            s.seq, s.batch, s.hidden, s.dirs, s.layers, units=self.units, h_dtype=s.h_dtype, w_dtype=s.w_dtype,
            gi_dtype=s.gi_dtype, acc_dtype=s.acc_dtype, gh_dtype=s.gh_dtype, math_dtype=s.math_dtype,
            out_dtype=s.out_dtype, quads=self.quads, pull=self.pull)}
