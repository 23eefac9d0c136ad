"""Which step kernel a GRU config selects: the one place its integer-coded step knobs
(``fuse_step``, ``step_tc``, ``step_flags``, ``step_loop``) are read to choose a family."""
from __future__ import annotations

from typing import Any

from tvm_ext.core.space import Config
from tvm_ext.schedules.gemm.wgmma import WgmmaTile

from .cell_step import CellStep
from .cluster_step import ClusterStep
from .flag_step import FlagStep
from .resident_cell import ResidentCellStep
from .fused_step import FusedStep, PersistentStep
from .split_step import TensorCoreSplitStep
from .step_variant import StepSizes, StepVariant
from .tensor_core_step import TensorCoreStep

STEP_FAMILIES = (CellStep, FusedStep, PersistentStep, TensorCoreStep, TensorCoreSplitStep, FlagStep, ClusterStep,
                 ResidentCellStep)


def select_step_variant(sizes: StepSizes, config: Config, hidden_gemm: Any,
                        hidden_wgmma: WgmmaTile | None = None) -> StepVariant:
    """The step kernel ``config`` runs, its knobs decoded (``hidden_gemm``: the unfused
    steps' GEMM template; ``hidden_wgmma``: its wgmma tile, for ``hid_wgmma``)."""
    if not config.fuse_step:
        return CellStep.of(sizes, config, hidden_gemm, hidden_wgmma)
    if config.step_cell:  # the cell-in-the-store tile as a persistent kernel, W_hh resident
        return ResidentCellStep.of(sizes, config)
    if config.step_tc == 2 and not config.step_flags:  # float32 h and W_hh as float16 parts, grid barrier
        return TensorCoreSplitStep.of(sizes, config)
    if config.step_tc:  # with step_flags: the tensor-core kernel exchanging tagged words (step_tc 2: split)
        return TensorCoreStep.of(sizes, config)
    if config.step_flags == 2:
        return ClusterStep.of(sizes, config)
    if config.step_flags:
        return FlagStep.of(sizes, config)
    if config.step_loop == 2:
        return PersistentStep.of(sizes, config)
    return FusedStep.of(sizes, config)
