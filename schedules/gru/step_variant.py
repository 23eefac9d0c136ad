"""The step kernel a GRU config selects, as one frozen ``StepVariant``: the recurrent part of
every layer (S2-S4 of each step) is one of a few kernel families, and each family owns the
decoding of its knobs, why it cannot run a config on a target, its kernels and its calls in
the host plan.  ``variants.step_variant`` makes the choice once; the template, the host plan
and the pick ask the variant rather than reading the knobs again.

Families (each in its own module): the unfused hidden GEMM + cell kernel per step
(``cell_step``), the fused step kernel per step or looped on the host and its persistent form
behind a grid barrier (``fused_step``), the flag-exchange kernel (``flag_step``), its blocks as a
thread-block cluster (``cluster_step``) and the tensor-core kernel (``tensor_core_step``).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from tvm_ext.cost_model.hardware import HardwareModel
from tvm_ext.schedules.gemm.mma import MIN_COMPUTE_CAPABILITY, compute_capability
from tvm_ext.schedules.gemm.wgmma_layout import counted_words
from tvm_ext.target import TargetInfo

from .step_common import CELL_GATES, GRU_CELL

# A persistent step kernel's blocks must all be resident; the SM keeps 1 KiB of shared
# memory per resident block (sm_80+), and fitting several blocks per SM by capping
# registers (launch bounds) is refused below this many registers per thread (spills).
SHARED_RESERVED_PER_BLOCK = 1024
PERSISTENT_MIN_REGISTERS = 64

# The knobs of the fused CUDA-core step kernel, which the other fused kernels do not read
SIMT_STEP_KNOBS = ("step_b", "step_u", "step_bt", "step_k", "step_pipeline", "step_ks", "step_prefetch",
                   "step_w_onchip")
OVERLAP_KNOBS = ("step_overlap", "step_overlap_bn", "step_overlap_tma", "step_overlap_stages")
TC_STEP_KNOBS = ("step_tc_rows", "step_tc_kw", "step_tc_nw", "step_tc_acc", "step_tc_frag", "step_tc_wreg",
                 "step_tc_wregs", "step_tc_poll", "step_tc_warp_h", "step_tc_stack", "step_split_words",
                 "step_tc_ahead") + OVERLAP_KNOBS
FLAG_STEP_KNOBS = ("step_flag_units", "step_flag_input")
CLUSTER_STEP_KNOBS = ("step_cluster_quads", "step_cluster_pull")


@dataclass(frozen=True)
class StepSizes:
    """What a step kernel needs of its GRU: the sizes and the recurrent part's types."""

    seq: int
    batch: int
    hidden: int
    dirs: int
    layers: int
    gi_dtype: str
    h_dtype: str
    w_dtype: str  # W_hh and b_hh
    acc_dtype: str  # the hidden GEMM's accumulator
    gh_dtype: str
    math_dtype: str  # the cell's
    out_dtype: str
    input: int = 0  # the depth of the layers' input (a step kernel that runs x·W_ihᵀ itself: one for all layers)
    x_dtype: str = "float32"  # that input's type (x, or the layer below's output)
    w_ih_dtype: str = "float32"
    cell: str = GRU_CELL  # the recurrent cell (the fused step kernel also runs the LSTM's: ``schedules.lstm``)

    @property
    def gates(self) -> int:
        """The cell's gates: each unit's dot products a step."""
        return CELL_GATES[self.cell]


def input_buffer(layer: int) -> str:
    """The plan buffer ``layer`` reads: x, or the layer below's output (two alternate)."""
    return "x" if layer == 0 else f"y{(layer - 1) % 2}"


def residency(hw: HardwareModel, blocks: int, threads: int, shared: int) -> tuple[int, int]:
    """(blocks each SM must hold for a persistent grid of ``blocks`` to be resident, blocks of
    ``threads`` threads and ``shared`` bytes of shared memory one SM can hold)."""
    fits = min(hw.max_blocks_per_sm, hw.max_threads_per_sm // threads,
               hw.shared_per_sm // (shared + SHARED_RESERVED_PER_BLOCK))
    return -(-blocks // hw.sm_count), fits


def mma_grid_reason(kernel: str, threads: int, blocks: int, shared: int, held: str,
                    target: TargetInfo, lane_registers: int = 0) -> str | None:
    """Why a persistent ``mma.sync`` step kernel's grid cannot run on ``target``: its block's
    threads, the compute capability (ldmatrix, mma.sync), ``held`` in ``shared`` bytes past the
    opt-in limit, or blocks that cannot all be resident (None: it can).  ``lane_registers``: the
    most registers a lane may take, counted too (allocated in eights, at most an SM's registers
    over the block's threads, which launch bounds naming only the threads allow): the thread
    limit for a kernel that may take all it can, the most it takes for one known to take few
    (the split kernel: counted at the limit, its grids of two 256-thread blocks an SM would be
    refused; not counted, three of them were taken and were not resident); 0 counts none."""
    hw = HardwareModel.from_target(target)
    if threads > target.max_threads_per_block:
        return f"{kernel}: {threads} threads > device limit {target.max_threads_per_block}"
    cc = compute_capability(target)
    if cc is not None and cc < MIN_COMPUTE_CAPABILITY:
        return f"{kernel} needs sm_{MIN_COMPUTE_CAPABILITY} or newer (ldmatrix, mma.sync)"
    if shared > hw.shared_per_block_optin:
        return f"{kernel}: {held} need {shared} B of shared memory > {hw.shared_per_block_optin}"
    per_sm, fits = residency(hw, blocks, threads, shared)
    if lane_registers and hw.registers_per_sm:  # launch bounds naming the threads cap a lane at an SM's share
        lane = min(-(-lane_registers // 8) * 8, hw.registers_per_sm // threads // 8 * 8)
        fits = min(fits, hw.registers_per_sm // (threads * lane))
    if per_sm > fits:
        return (f"{kernel}: persistent grid needs every block resident, {blocks} blocks > {hw.sm_count} SMs x "
                f"{fits} resident per SM")
    return None


def fused_threads_reason(step_j: int, target: TargetInfo) -> str | None:
    """The check every fused step kernel's config passes first: ``step_j`` threads fit a block."""
    if step_j > target.max_threads_per_block:
        return f"step kernel: {step_j} threads > device limit {target.max_threads_per_block}"
    return None


@dataclass(frozen=True)
class StepVariant(ABC):
    """One step kernel family with its knobs decoded (``of``), for one GRU's sizes."""

    sizes: StepSizes

    # The knobs that do not change this family's kernels: names starting with these, and these names
    unshown_prefixes: ClassVar[tuple[str, ...]] = ("cell_block", "hid_", "step_cell")
    unshown_names: ClassVar[tuple[str, ...]] = ()
    runs_hidden_gemm: ClassVar[bool] = False  # the hidden GEMM (S2) is a kernel of its own (hid_ knobs)
    splits_state: ClassVar[bool] = False  # h and W_hh (scaled) become float16 parts: a range to check
    fuses_input: ClassVar[bool] = False  # computes x·W_ihᵀ + b_ih itself: no input GEMM before it
    uses_wgmma: ClassVar[bool] = False  # its kernels are Hopper's wgmma: the module is built for sm_90a

    @abstractmethod
    def reason(self, target: TargetInfo) -> str | None:
        """Why this kernel cannot run here (None: it can)."""

    def unshown(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(prefixes, names) of the knobs that do not change this kernel (summaries hide them)."""
        return self.unshown_prefixes, self.unshown_names

    def init_layout(self) -> dict[str, bool]:
        """``init_func``'s options: the state buffer (and barrier and exchange words) this kernel reads."""
        return {}

    def async_copy(self) -> bool:
        """Whether the module is compiled with cp.async copies (``tirx.use_async_copy``)."""
        return False

    def scheduled_kernels(self, target: TargetInfo) -> dict[str, Any]:
        """The scheduled ``s_tir.Schedule`` of each of its kernel functions, by name."""
        return {}

    def lowered_kernels(self) -> dict[str, Any]:
        """Its kernel functions written as lowered loops (PrimFuncs), by name."""
        return {}

    def looped_steps(self, step: Any, target: TargetInfo) -> Any:
        """``gru_steps``, every step in one call, from the scheduled ``gru_step``; None where the
        steps are not looped after scheduling."""
        return None

    def lowered_blocks_per_sm(self, target: TargetInfo) -> int:
        """Blocks each SM must hold at once for the grid of the lowered ``gru_steps`` to be
        resident, where it is compiled with ``__launch_bounds__(threads, that)`` so nvcc keeps a
        lane's registers to its share (1: the threads only)."""
        return 1

    def barrier_words(self) -> tuple[str, ...]:
        """The plan buffers of a persistent kernel's grid barrier and exchange words (none here)."""
        return ()

    @property
    def counts_gi(self) -> bool:
        """Whether the kernel can start while its input GEMM runs, waiting for the GEMM's counts of
        each step's stored rows of gi (``step_overlap``; its ``gi_ready`` then set)."""
        return False

    @property
    def ready_words(self) -> int:
        """The counts of a running input GEMM's stored tile rows of gi that the kernel waits for,
        and their total (``step_overlap``; 0: gi is complete when it starts)."""
        return 0

    def weights(self, layer: int) -> tuple[str, ...]:
        """The step kernel's first arguments: gi, the state, W_hh and b_hh of ``layer``."""
        return ("gi", "hs", f"w_hh{layer}", f"b_hh{layer}")

    def prepare_calls(self, layer: int) -> list[tuple[str, tuple[str | int, ...]]]:
        """The (function, arguments) that prepare ``layer``'s recurrent weights once, as they are
        loaded (``plan.prepare_calls``; named from ``plan.PREPARED``): none here."""
        return []

    def state_args(self, layer: int) -> tuple[str | int, ...]:
        """``gru_init``'s arguments for ``layer``: h0 into the (2, dirs, batch, hidden) state."""
        return ("h0", layer, "hs", *self.barrier_words())

    def step_calls(self, layer: int, out: str) -> list[tuple[str, tuple[str | int, ...]]]:
        """The (function, arguments) of ``layer``'s steps, writing the output ``out``: here all
        T steps in one call of ``gru_steps``."""
        return [(f"{self.sizes.cell}_steps", (*self.weights(layer), layer, out, "h_n", *self.barrier_words()))]


class CountedGiWords:
    """The words of a persistent step kernel on a grid barrier (``bar``), with the exchange
    words ``hx`` where it polls them (``flags``), that can wait for a running input GEMM's counted
    tile rows of gi (``gi_ready`` (rows, count), ``step_overlap``): mixed into such a
    ``StepVariant`` before it, so the counts' size and the buffers are said once."""

    @property
    def ready_words(self) -> int:
        """The counts of the input GEMM's tile rows of gi whose stores the kernel waits for, and
        their total (0: none)."""
        s, rows = self.sizes, self.gi_ready[0]
        return counted_words(s.seq * s.batch, rows) if rows else 0

    def barrier_words(self) -> tuple[str, ...]:
        return (("bar", "hx") if self.flags else ("bar",)) + (("gi_ready",) if self.ready_words else ())
