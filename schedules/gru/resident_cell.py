"""The persistent GRU step kernel on wgmma with W_hh resident (``step_cell`` 1, Hopper): the
cell-in-the-store tile of ``cell_epilogue`` (64 batch rows by the r, z and n columns of 32 units)
as one launch a layer.  Each block loads its units' columns of W_hh, all of K, into shared memory
once and keeps them for all T steps; a step streams the block's 64 rows of h through ``cp.async``
stages, multiplies them by the resident W (wgmma, B read N-major in the 64-byte swizzle of 32-column
atoms, as the cell form's TMA writes it), runs the cell from the accumulators (``CellStore``) and
meets the other blocks at ``tvm_ext.lowering.step_loop``'s grid barrier.

Why: past batch 128 at H1024 and more no tensor-core step kernel's grid is resident, because each
of its blocks holds all K of h for its rows besides W, and the unfused steps read W_hh (6 MB at
H1024) from L2 and launch a kernel every step.  Here a block holds W and streams only its rows of
h, 64 x 64 a stage: W_hh's 96 x H slice takes 192 x H bytes (196,608 at H1024), beside the stages.
The sums are added in the cell form's order (K whole, k tile by k tile), so h' is the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from tvm_ext.cost_model.hardware import HardwareModel
from tvm_ext.core.space import Config
from tvm_ext.hardware import has_wgmma
from tvm_ext.precision.precision import itemsize
from tvm_ext.lowering.step_loop import (BARRIER_WORDS, BARRIERS, NV_ATOMIC_ACQUIRE, NV_ATOMIC_RELEASE,
                                        NV_SCOPE_DEVICE, SPIN_LIMIT)
from tvm_ext.schedules.gemm.wgmma import WgmmaTile, gate_reason
from tvm_ext.schedules.gemm.wgmma_layout import KernelLayout, counted_words
from tvm_ext.target import TargetInfo

from .cell_epilogue import CELL_TILE_COLUMNS, CellStore, fragment_pair, fragment_sums, gate_input
from .step_variant import (CLUSTER_STEP_KNOBS, FLAG_STEP_KNOBS, OVERLAP_KNOBS, SIMT_STEP_KNOBS, TC_STEP_KNOBS,
                           CountedGiWords, StepSizes, StepVariant, residency)
from .tensor_core_cell import GI_SEEN_WORDS, unseen_gi_macro, wait_gi_macro
from .tensor_core_step import BARRIER_MARK, with_grid_barrier

RESIDENT_ROWS = 64  # batch rows a block: one consumer warpgroup
RESIDENT_STAGES = (4, 3)  # h's stages, the most that fit beside W first (2 would load none ahead)
RESIDENT_THREADS = 128
KERNEL = "resident-W cell step kernel"  # its name in messages


@dataclass(frozen=True)
class ResidentCellShape:
    """The sizes a resident-W cell step kernel implies for one GRU: tiles of ``RESIDENT_ROWS``
    rows by 32 units (96 columns), K whole, a block each, and the shared memory they take."""

    batch: int
    hidden: int
    dirs: int
    stages: int
    elem: int  # bytes of an element of h and W_hh

    @property
    def row_tiles(self) -> int:
        return -(-self.batch // RESIDENT_ROWS)

    @property
    def unit_tiles(self) -> int:
        return self.hidden // (CELL_TILE_COLUMNS // 3)

    @property
    def blocks(self) -> int:
        return self.row_tiles * self.unit_tiles * self.dirs

    @property
    def w_bytes(self) -> int:
        """The block's W_hh columns, all of K: 96 x H."""
        return CELL_TILE_COLUMNS * self.hidden * self.elem

    @property
    def shared_bytes(self) -> int:
        """W's columns and h's stages (64 rows x one 128-byte row of k each)."""
        return self.w_bytes + self.stages * RESIDENT_ROWS * 128


def resident_tile(stages: int, operand: str, inflight: int = 1) -> WgmmaTile:
    """The wgmma tile whose layout (``KernelLayout``) the kernel reads: 64 x 96, its h loaded by
    ``cp.async`` (``stages - 1 - inflight`` k tiles ahead), stored from the registers by the cell."""
    return WgmmaTile(RESIDENT_ROWS, CELL_TILE_COLUMNS, stages, inflight, smem_epilogue=False, operand=operand)


def resident_cell_func(sizes: StepSizes, stages: int, barrier: int, inflight: int = 1, flags: bool = False,
                       gi_ready: tuple[int, int] = (0, 0), name: str = "gru_steps") -> Any:
    """The kernel of one layer as a lowered PrimFunc: (gi, hs, w, bias, layer, out, h_n, bar), the
    persistent step kernels' signature, ``barrier`` indexing ``BARRIERS`` (the knob
    ``step_barrier``), ``inflight`` wgmma groups left in flight at each k step.  ``flags``
    (``step_flags`` 1): no grid barrier; each block stores its count of steps done into its word
    of ``hx`` (a further parameter, zeroed by the init) with a release store, and a step waits
    only for the blocks of its row tile, whose h' it reads (a lane of the first warp polling each
    with acquire loads).  ``gi_ready`` (rows, count), with the grid barrier: gi comes from an
    input GEMM still running (``step_overlap``); the kernel takes ``ready`` (a count a tile row of
    that many rows, then their total) and each thread waits for a step's tile rows before it loads
    that step's input gates (``tensor_core_step.wait_gi_macro``)."""
    kernel = _kernel(sizes, stages, inflight, flags, gi_ready)
    if not flags:
        kernel = with_grid_barrier(kernel, BARRIERS[barrier], replaced=1, kept=1 if gi_ready[0] else 0)
    return kernel.with_attr("global_symbol", name)


def _kernel(s: StepSizes, stages: int, inflight: int, flags: bool, gi_ready: tuple[int, int]) -> Any:
    """The kernel with its barrier mark: W once, then per step h's k tiles through the stages
    (``ahead`` loaded ahead of the one multiplied, each stage refilled once the wgmma that read it
    retired), the cell from the registers, the next step's input gates loaded, the mark.  A thread
    keeps the state of its 16 (row, unit) pairs in registers from step to step, and loads a step's
    input gates before the barrier ahead of it, so neither load waits in the cell."""
    from tvm.script import tirx as T

    operand, hidden, batch, dirs, steps = s.h_dtype, s.hidden, s.batch, s.dirs, s.seq
    L = KernelLayout.of(resident_tile(stages, operand, inflight), batch, 3 * hidden, hidden, "KN", (dirs,), True, 0,
                        gates=hidden)
    shape = ResidentCellShape(batch, hidden, dirs, stages, L.elem)
    blocks, row_tiles, unit_tiles = shape.blocks, shape.row_tiles, shape.unit_tiles
    k_tiles, threads, chunk = L.k_tiles, RESIDENT_THREADS, L.chunk_elems
    w_tile = L.bn * L.bk  # elements of a k tile of W's columns
    w_elems = k_tiles * w_tile
    a_stage = L.a_stage
    ahead = stages - 1 - L.inflight
    groups = L.bn // 24  # 8-column groups of a gate's third
    pairs = groups * 4  # (row, unit) pairs a thread's accumulators hold all three gates of (``fragment_pair``)
    cell = CellStore(s, slots=True).cell_values(L)
    G, state = 3 * hidden, (dirs, batch, hidden)
    counted = gi_ready[0] > 0
    wait_gi = wait_gi_macro(steps, batch, RESIDENT_ROWS, *gi_ready, seen_at=1) if counted else None
    unseen = unseen_gi_macro(seen_at=1)
    ready_words = counted_words(steps * batch, gi_ready[0]) if counted else 1

    def pair(tx: Any, row0: Any, col0: Any, i: int) -> tuple[Any, Any]:
        """(row, unit) of a thread's pair ``i`` (group i // 4, half i // 2 % 2, unit i % 2)."""
        return fragment_pair(L, row0, col0, tx, i // 4, i // 2 % 2, i % 2)

    @T.macro
    def load_h(smem: Any, hs: Any, slot: Any, d: Any, row0: Any, kt: Any, tx: Any) -> None:
        """k tile ``kt`` of the block's rows of h (state slot ``slot``) into its stage; a row past
        the batch reads one below it (its h' is not stored)."""
        for i in T.unroll(L.a_loads):
            c = T.meta_var(i * threads + tx)
            T.ptx["cp.async.cg.shared.global"](
                smem.ptr_to([w_elems + kt % stages * a_stage + L.swizzled(c)]),
                hs.ptr_to([slot, d, L.row_below_m(row0 + c // 8), kt * L.bk + c % 8 * chunk]), 16)

    @T.macro
    def multiply(base: Any, acc: Any, kt: Any) -> None:
        """The 64 rows of stage ``kt`` times W's k tile ``kt``: bk / k_inst wgmma, one group."""
        T.ptx["wgmma.fence.sync.aligned"]()
        for kk in T.unroll(L.bk // L.k_inst):
            T.ptx[L.mma](*[acc[i] for i in range(L.n_acc)],
                         L.desc(base, w_elems + kt % stages * a_stage + kk * L.k_inst),
                         L.desc(base, kt * w_tile + kk * 16 * L.b_atom, L.bk * L.b_swizzle, L.b_swizzle),
                         T.bool(True), 1, 1, 0, 1)
        T.ptx["wgmma.commit_group.sync.aligned"]()

    @T.macro
    def load_gi(gi: Any, gates: Any, step: Any, d: Any, row0: Any, col0: Any, tx: Any) -> None:
        """The input gates of step ``step`` at the thread's pairs, into ``gates``."""
        for i in T.unroll(pairs):
            row, unit = T.meta_var(pair(tx, row0, col0, i))
            r, z, n = T.meta_var([gate_input(s, L, gi, d, step, row, unit, gate) for gate in range(3)])
            gates[i * 3] = r
            gates[i * 3 + 1] = z
            gates[i * 3 + 2] = n

    @T.macro
    def exchange(hx: Any, bar: Any, step: Any, bid: Any, tx: Any, spins: Any) -> None:
        """The block's count of steps done, released once all its threads stored h'; then the first
        warp's lanes wait for the counts of the row tile's blocks (their h' the next step reads).
        ``spins`` counts a lane's polls over all steps: past ``SPIN_LIMIT`` it raises the timed-out
        flag and polls no more (a grid that is not resident raises rather than hangs)."""
        T.tvm_storage_sync("shared")  # every thread's h' stored
        if tx == 0:
            T.evaluate(T.call_extern("void", "__nv_atomic_store_n", T.address_of(hx[bid]), T.Cast("uint64", step + 1),
                                     NV_ATOMIC_RELEASE, NV_SCOPE_DEVICE))
        if tx < unit_tiles:
            while (T.call_extern("uint64", "__nv_atomic_load_n", T.address_of(hx[bid - bid % unit_tiles + tx]),
                                 NV_ATOMIC_ACQUIRE, NV_SCOPE_DEVICE) < T.Cast("uint64", step + 1)
                   and spins[0] < SPIN_LIMIT):
                spins[0] = spins[0] + 1
            if spins[0] >= SPIN_LIMIT:
                bar[1] = 1
        T.tvm_storage_sync("shared")

    @T.macro
    def gates_when_stored(gi: Any, gates: Any, step: Any, d: Any, row0: Any, col0: Any, tx: Any, ready: Any,
                          spins: Any) -> None:
        """``load_gi``, with gi counted after the wait for the step's tile rows (spins toward the
        poll limit: past it the timed-out flag, raised after the steps)."""
        if counted:
            wait_gi(ready, spins, spins, step, d, row0)
        load_gi(gi, gates, step, d, row0, col0, tx)

    @T.macro
    def body(gi: Any, hs: Any, w: Any, bias: Any, layer: Any, out: Any, h_n: Any, bar: Any, hx: Any,
             ready: Any) -> None:
        bid = T.launch_thread("blockIdx.x", blocks)
        tx = T.launch_thread("threadIdx.x", threads)
        smem = T.alloc_buffer((w_elems + stages * a_stage,), operand, scope="shared.dyn", align=1024)
        acc = T.alloc_buffer((L.n_acc,), "float32", scope="local")
        gates = T.alloc_buffer((pairs * 3,), s.gi_dtype, scope="local")  # the step's input gates
        h_kept = T.alloc_buffer((pairs,), operand, scope="local")  # the state of the thread's pairs
        h_new = T.alloc_buffer((1,), s.math_dtype, scope="local")
        spins = T.alloc_buffer((1 + GI_SEEN_WORDS if counted else 1,), "int32", scope="local")
        spins[0] = 0
        if counted:  # spins[1:]: gi's tile rows known stored (``wait_gi_macro``)
            unseen(spins)
        d = T.meta_var(bid // (row_tiles * unit_tiles))
        row0 = T.meta_var(bid // unit_tiles % row_tiles * RESIDENT_ROWS)
        col0 = T.meta_var(bid % unit_tiles * CELL_TILE_COLUMNS)
        base = T.cuda.cvta_generic_to_shared(smem.ptr_to([0]))
        for kt in T.serial(k_tiles):  # W's columns, all of K, once: the oldest cp.async group
            for i in T.unroll(L.b_loads):
                c = T.meta_var(i * threads + tx)
                T.ptx["cp.async.cg.shared.global"](smem.ptr_to([kt * w_tile + L.b_chunk(c)]),
                                                   L.b_global(w, [d], col0, kt, c), 16)
        T.ptx["cp.async.commit_group"]()
        for i in T.unroll(pairs):
            row, unit = T.meta_var(pair(tx, row0, col0, i))
            h_kept[i] = hs[0, d, L.epilogue_row(row), unit]
        gates_when_stored(gi, gates, 0, d, row0, col0, tx, ready, spins)
        for step in T.serial(steps):
            for i in T.unroll(L.n_acc):
                acc[i] = T.float32(0)
            for p in T.unroll(ahead):
                load_h(smem, hs, step % 2, d, row0, p, tx)
                T.ptx["cp.async.commit_group"]()
            for kt in T.serial(k_tiles):
                T.ptx["cp.async.wait_group"](ahead - 1)  # k tile kt has landed (this thread's copies)
                T.ptx["fence.proxy.async.shared::cta"]()  # generic-proxy writes -> wgmma's async proxy
                T.tvm_storage_sync("shared")  # everyone's copies; the wgmma of k tile kt-1-inflight retired
                multiply(base, acc, kt)
                if kt + ahead < k_tiles:  # the stage the retired wgmma read
                    load_h(smem, hs, step % 2, d, row0, kt + ahead, tx)
                T.ptx["cp.async.commit_group"]()  # possibly empty: keeps the group count uniform
                T.ptx["wgmma.wait_group.sync.aligned"](L.inflight)
            T.ptx["wgmma.wait_group.sync.aligned"](0)
            for i in T.unroll(pairs):
                row, unit = T.meta_var(pair(tx, row0, col0, i))
                cell((gi, hs, step, layer, hs, out, h_n), bias, d, row, unit, gates[i * 3], gates[i * 3 + 1],
                     gates[i * 3 + 2], h_kept[i], *fragment_sums(L, acc, i // 4, i // 2 % 2, i % 2), h_new)
                h_kept[i] = T.Cast(operand, h_new[0])
            if step + 1 < steps:  # behind the barrier
                gates_when_stored(gi, gates, step + 1, d, row0, col0, tx, ready, spins)
            if flags:
                exchange(hx, bar, step, bid, tx, spins)
            else:
                T.evaluate(T.call_extern("int32", BARRIER_MARK, (step + 1) * blocks, tx == 0))
        if counted and spins[0] >= SPIN_LIMIT:
            bar[1] = 1

    gi_shape, out_shape, h_n_shape = (steps * batch, dirs * G), (steps * batch, dirs * hidden), (s.layers * dirs,
                                                                                              batch, hidden)
    if flags:
        @T.prim_func(private=True)
        def with_flags(gi: T.Buffer(gi_shape, s.gi_dtype), hs: T.Buffer((2, *state), operand),
                       w: T.Buffer((dirs, hidden, G), operand), bias: T.Buffer((dirs, G), operand), layer: T.int32,
                       out: T.Buffer(out_shape, s.out_dtype), h_n: T.Buffer(h_n_shape, operand),
                       bar: T.Buffer((BARRIER_WORDS,), "int32"), hx: T.Buffer((2 * dirs * batch * hidden,), "uint64")):
            T.func_attr({"tirx.noalias": True})
            body(gi, hs, w, bias, layer, out, h_n, bar, hx, None)

        return with_flags

    if counted:
        @T.prim_func(private=True)
        def with_ready(gi: T.Buffer(gi_shape, s.gi_dtype), hs: T.Buffer((2, *state), operand),
                       w: T.Buffer((dirs, hidden, G), operand), bias: T.Buffer((dirs, G), operand), layer: T.int32,
                       out: T.Buffer(out_shape, s.out_dtype), h_n: T.Buffer(h_n_shape, operand),
                       bar: T.Buffer((BARRIER_WORDS,), "int32"), ready: T.Buffer((ready_words,), "int32")):
            T.func_attr({"tirx.noalias": True})
            body(gi, hs, w, bias, layer, out, h_n, bar, None, ready)

        return with_ready

    @T.prim_func(private=True)
    def kernel(gi: T.Buffer(gi_shape, s.gi_dtype), hs: T.Buffer((2, *state), operand),
               w: T.Buffer((dirs, hidden, G), operand), bias: T.Buffer((dirs, G), operand), layer: T.int32,
               out: T.Buffer(out_shape, s.out_dtype), h_n: T.Buffer(h_n_shape, operand),
               bar: T.Buffer((BARRIER_WORDS,), "int32")):
        T.func_attr({"tirx.noalias": True})
        body(gi, hs, w, bias, layer, out, h_n, bar, None, None)

    return kernel


@dataclass(frozen=True)
class ResidentCellStep(CountedGiWords, StepVariant):
    """The resident-W cell step kernel (``step_cell`` 1): ``step_cell_stages`` stages of h, the
    grid barrier ``step_barrier`` between steps."""

    stages: int
    barrier: int
    loop: int
    inflight: int = 1
    exchange: int = 0  # step_flags
    gi_ready: tuple[int, int] = (0, 0)  # (rows, count) of a tile row of gi counted by the input GEMM

    @property
    def flags(self) -> bool:
        """Whether a step waits for its row tile's step counts rather than at the grid barrier."""
        return self.exchange == 1

    uses_wgmma: ClassVar[bool] = True

    @classmethod
    def of(cls, sizes: StepSizes, c: Config) -> "ResidentCellStep":
        return cls(sizes, stages=c.step_cell_stages, barrier=c.step_barrier, loop=c.step_loop,
                   inflight=c.step_cell_inflight, exchange=c.step_flags)

    @property
    def shape(self) -> ResidentCellShape:
        s = self.sizes
        return ResidentCellShape(s.batch, s.hidden, s.dirs, self.stages, itemsize(s.h_dtype))

    def unshown(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        # the other persistent kernels' knobs do not apply
        tensor_core = tuple(name for name in TC_STEP_KNOBS if name not in OVERLAP_KNOBS)  # the input GEMM's stay
        return ("cell_block", "hid_"), (SIMT_STEP_KNOBS + FLAG_STEP_KNOBS + CLUSTER_STEP_KNOBS + tensor_core
                                        + ("step_j", "step_tc", "step_cluster_quads")
                                        + (("step_barrier",) if self.flags else ()))

    def reason(self, target: TargetInfo) -> str | None:
        """Why it cannot run here: Hopper, 16-bit h and W_hh, a hidden size of whole k tiles and
        32-unit tiles, the persistent loop, and a grid of one block an SM that fits."""
        s, shape = self.sizes, self.shape
        if target.kind != "cuda" or not has_wgmma(target) or self.loop != 2:
            return f"{KERNEL} (step_cell 1) is the persistent kernel (step_loop 2) of a Hopper GPU (sm_90, wgmma)"
        if self.exchange not in (0, 1):
            return f"{KERNEL}: a grid barrier (step_flags 0) or its row tile's step counts (1), not a cluster (2)"
        if s.h_dtype != s.w_dtype or s.h_dtype not in ("float16", "bfloat16") or s.acc_dtype != "float32":
            return (f"{KERNEL}: h and W_hh both float16 or both bfloat16, summed in float32 (got {s.h_dtype}, "
                    f"{s.w_dtype}, {s.acc_dtype})")
        tile = resident_tile(self.stages, s.h_dtype)
        if s.hidden % tile.bk:
            return f"{KERNEL}: hidden {s.hidden} is no multiple of its k tile ({tile.bk})"
        gates = gate_reason(tile, 3 * s.hidden, "KN", s.hidden)
        if gates:
            return f"{KERNEL}: {gates}"
        if self.stages not in RESIDENT_STAGES:
            return f"{KERNEL}: {self.stages} stages of h (step_cell_stages); allowed: {RESIDENT_STAGES}"
        hw = HardwareModel.from_target(target)
        if shape.shared_bytes > hw.shared_per_block_optin:
            return (f"{KERNEL}: W_hh's 96 columns ({shape.w_bytes} B) and {self.stages} stages of h need "
                    f"{shape.shared_bytes} B of shared memory > {hw.shared_per_block_optin}")
        per_sm, fits = residency(hw, shape.blocks, RESIDENT_THREADS, shape.shared_bytes)
        if per_sm > fits:
            return (f"{KERNEL}: persistent grid needs every block resident, {shape.blocks} blocks > {hw.sm_count} "
                    f"SMs x {fits} resident per SM")
        return None

    @property
    def counts_gi(self) -> bool:
        return not self.flags  # the step counts' variant keeps gi complete at launch

    def init_layout(self) -> dict[str, Any]:
        return {"pingpong": True, "barrier": True, "zero_words": self.shape.blocks if self.flags else 0,
                "ready_words": self.ready_words}

    def lowered_kernels(self) -> dict[str, Any]:
        return {"gru_steps": resident_cell_func(self.sizes, self.stages, self.barrier, self.inflight, self.flags,
                                                self.gi_ready)}
