"""An LSTM config without measuring: the GRU's rules (``schedules.gru.pick``) on four gates: with
16-bit state on CUDA the tensor-core step kernel from batch 2, with float32 state its split form
(float16 parts) where the GRU takes it, the flag-exchange step kernel at a small batch, the
unfused steps on the tensor cores at a large batch, and otherwise its fused split-K step
kernel."""
from __future__ import annotations

from typing import Any

from tvm_ext.cost_model.hardware import HardwareModel
from tvm_ext.core.space import Config
from tvm_ext.schedules.gru.fused_step import step_k_extent
from tvm_ext.schedules.gru.pick import (FLAG_BATCH, FLAG_BATCH_TENSOR_CORE, MANY_ROWS, SMALL_TILES,
                                       SPLIT_FLAGS_BATCH, SPLIT_STEP_BATCH, STREAMED_MAX_THREADS,
                                       THREADS_PER_SM, WIDE_K_WARPS,
                                       flag_step_config, flag_step_why, many_rows_config, split_flags_step_config,
                                       input_gemm_config, split_flags_why, split_step_config, split_step_why,
                                       stacked_config, stacked_split_rows, tensor_core_step_config,
                                       tensor_core_why, two_tf32_parts, warp_h_config,
                                       wgmma_input_config)
from tvm_ext.target import TargetInfo


# The 16-bit tensor-core kernel's 32-unit blocks on four unit warps stream this many registers a lane of W's
# fragments where the slice does not fit shared memory (four gates' sums and float32 gi take the rest; at 160
# ptxas spilled): float16 B64 H1024 0.659 ms against 0.904 on 32-row blocks of 16 units (docs/results/gru.md)
LSTM_WIDE_W_REGISTERS = 128
# The split kernel behind the grid barrier (``split_step.py``) on 8-unit blocks, (units, rows, unit warps):
# W_hh's two parts of four gates take 128 KB a block at H1024, so 16 units (the GRU's) do not fit there
LSTM_SPLIT_BLOCKS = ((8, 32, 1), (8, 64, 1))
# From this batch at this hidden size on, the 16-bit kernel on the B64 H1024 pick's blocks (32 units of four unit
# warps, the fragments of the first k slices held) where their grid is resident, rather than the GRU's smaller
# blocks: faster at float16 B32 H768 and H1024 (docs/results/gru.md)
LSTM_WIDE_BATCH = 32
LSTM_WIDE_HIDDEN = 768
LSTM_WIDE_BLOCK = dict(step_j=32, step_tc_kw=WIDE_K_WARPS, step_tc_nw=4, step_tc_wreg=3,
                       step_tc_wregs=LSTM_WIDE_W_REGISTERS, step_tc_warp_h=0)


def analytic_pick(template: Any, target: TargetInfo) -> tuple[Config, str]:
    """(config, why) for ``template`` (an ``LstmTemplate``) on ``target``: the rules below, then
    the input GEMM of TF32 parts reading two stored parts where it can, as the GRU's pick."""
    cfg, why = _rules_pick(template, target)
    return two_tf32_parts(template, cfg, why, template.space(target)) if cfg.in_split == 3 else (cfg, why)


def _rules_pick(template: Any, target: TargetInfo) -> tuple[Config, str]:
    """(config, why): on CUDA with 16-bit state past ``FLAG_BATCH_TENSOR_CORE`` rows the
    tensor-core step kernel where its grid is resident (``tensor_core_step_config``, the GRU's
    blocks) on ``STREAMED_MAX_THREADS`` threads or fewer (a lane of a 512-thread block gets 128
    registers, and four gates' sums spill: ptxas at B128 H1024); with float32 state from
    ``SPLIT_FLAGS_BATCH`` rows (or stacked: ``stacked_split_rows``) its split form exchanging
    tagged words where it fits (``split_flags_step_config``: W_hh's parts and the block's rows of
    h in shared memory, a resident grid), else from ``SPLIT_STEP_BATCH`` rows its form behind the
    grid barrier streaming h in chunks (``split_step_config`` on ``LSTM_SPLIT_BLOCKS``); up to
    ``FLAG_BATCH`` rows the flag-exchange step kernel where its grid fits one block an SM (``flag_step_config``); from
    ``MANY_ROWS`` rows with a 16-bit hidden GEMM on a tensor-core tile, the unfused steps, without
    one the fused step kernel on blocks of many rows (the GRU's ``many_rows_config``); else on a
    GPU the fused step kernel split over k, persistent on CUDA (one launch a layer, a grid barrier
    a step, W_hh's share in registers where it fits), a launch per step elsewhere; on a CPU device
    the default (a launch per step).  A float32 input GEMM on CUDA runs on Hopper as TF32 parts
    stored once each (``in_split`` 3, ``in_tf32_parts`` 2) from the GRU's ``SPLIT_MIN_FLOPS``,
    else on the CUDA cores' large tile where it gives every SM a block (``large_input_tile``); a
    16-bit one from the GRU's ``WGMMA_MIN_FLOPS`` on wgmma as stored (``in_wgmma``)."""
    base = template.default_config(target)
    if target.is_cpu:
        return base, "CPU device: the fused step kernel, a launch per step"
    space = template.space(target)
    cuda = target.kind == "cuda"
    sm_count = HardwareModel.from_target(target).sm_count
    gemm_why = "the input GEMM before it"
    if cuda and template.in_tensor_core is None:  # float32: TF32 parts on wgmma, or the CUDA cores' large tile
        base, tile = input_gemm_config(template, base, space, sm_count)
        gemm_why += tile.replace("input GEMM:", ",", 1) if "default" not in tile else ""
    elif cuda and (on_wgmma := wgmma_input_config(template, base, space)) is not None:  # 16-bit, as the GRU's
        base, tile = on_wgmma
        gemm_why += tile.replace("input GEMM:", ",", 1)
    tensor_core = tensor_core_step_config(template, base, space, sm_count, LSTM_WIDE_W_REGISTERS) if cuda else None
    if (tensor_core is not None and template.batch > FLAG_BATCH_TENSOR_CORE
            and template.step_variant(tensor_core).shape.threads <= STREAMED_MAX_THREADS):
        tensor_core, warp = warp_h_config(template, _wide_blocks(template, tensor_core, space), space)
        return tensor_core, (f"{tensor_core_why(template.step_variant(tensor_core).shape, warp, ' of 4 gates')}, c "
                             f"in the cell lanes' registers; {gemm_why}")
    float32 = cuda and template.dtype == "float32"
    split = split_flags_step_config(template, base, space, sm_count) if (
        float32 and (template.batch >= SPLIT_FLAGS_BATCH or stacked_split_rows(template))) else None
    if split is not None:
        split, stacked = stacked_config(split, space)
        split, warp = warp_h_config(template, split, space)
        return split, (f"{split_flags_why(template.step_variant(split).shape, stacked, warp, ' of 4 gates')}, c in "
                       f"the cell lanes' registers; {gemm_why}")
    split = split_step_config(base, space, LSTM_SPLIT_BLOCKS) if (
        float32 and template.batch >= SPLIT_STEP_BATCH) else None
    if split is not None:
        return split, (f"{split_step_why(template.step_variant(split).shape, ' of 4 gates')}, a grid barrier a "
                       f"step, c in the cell lanes' registers; {gemm_why}")
    if cuda and template.batch >= MANY_ROWS and template.hid_tensor_core is not None:
        unfused = base.replace(fuse_step=0)
        if space.is_feasible(unfused):
            return unfused, (f"the unfused steps: per step the hidden GEMM on the tensor cores "
                             f"({template.hid_tensor_core.label()}), then the cell kernel")
    flags = flag_step_config(template, base, space, sm_count) if cuda and template.batch <= FLAG_BATCH else None
    if flags is not None:
        return flags, flag_step_why(template, flags, " of 4 gates in registers, c in the cell lane's", gemm_why)
    extras = dict(step_loop=2, step_barrier=2, step_prefetch=1) if cuda else dict(step_loop=0)
    many = many_rows_config(template, base, space, sm_count, extras) if cuda and template.batch >= MANY_ROWS else None
    if many is not None:
        step = template.step_variant(many)
        return many, (f"fused step kernel, {step.blocks} blocks of {step.units} units x {step.rows} batch rows "
                      f"(threads {step.j}x{step.ks}x{step.bt}), W_hh's slice in shared memory, h slices of "
                      f"{step.k} double-buffered, persistent")
    ks = 8 if template.hidden >= 128 else 4
    step_k = next((k for k in (64, 32, 16) if step_k_extent(template.hidden, k, ks) * 4 <= template.hidden * 5), 8)
    for rows, units in SMALL_TILES:
        units = units if template.hidden > 16 else 16
        cfg = base.replace(step_j=units, step_b=rows, step_k=step_k, step_ks=ks, **extras)
        if space.is_feasible(cfg.replace(step_w_onchip=2)):
            cfg = cfg.replace(step_w_onchip=2)
        if not space.is_feasible(cfg):
            continue
        step = template.step_variant(cfg)
        per_sm = step.blocks_per_sm(target) if cuda else -(-step.blocks // sm_count)
        if per_sm * units * ks > THREADS_PER_SM and (cuda or per_sm > 2):
            continue
        loop = "persistent kernel (one launch, a grid barrier per step)" if cuda else "one launch per step"
        w_hh = "W_hh in registers, " if cfg.step_w_onchip == 2 else ""
        return cfg, (f"fused step kernel, split-K: {step.blocks} blocks of {units} units x {rows} batch rows "
                     f"({units}x{ks} threads, k slices of {step_k}), {w_hh}{loop} on {sm_count} SMs")
    cfg = base.replace(step_j=32, step_b=8, step_k=step_k, step_ks=ks, step_loop=0, step_prefetch=1)
    if space.is_feasible(cfg):
        return cfg, (f"fused step kernel, split-K: 32 units x 8 batch rows per block (32x{ks} threads, k slices of "
                     f"{step_k}), one launch per step (no resident persistent grid)")
    return base, f"the default (the split-K step kernel does not fit: {space.infeasible_reason(cfg)})"


def _wide_blocks(template: Any, cfg: Config, space: Any) -> Config:
    """``cfg`` (the 16-bit tensor-core kernel) on ``LSTM_WIDE_BLOCK``'s blocks from
    ``LSTM_WIDE_BATCH`` rows at ``LSTM_WIDE_HIDDEN`` or more where they run (a resident grid of
    ``STREAMED_MAX_THREADS`` threads a block or fewer), else ``cfg``."""
    if template.batch < LSTM_WIDE_BATCH or template.hidden < LSTM_WIDE_HIDDEN:
        return cfg
    wide = cfg.replace(**LSTM_WIDE_BLOCK)
    fits = space.is_feasible(wide) and template.step_variant(wide).shape.threads <= STREAMED_MAX_THREADS
    return wide if fits else cfg
