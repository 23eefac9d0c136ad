"""The GRU's zero-measurement config (``GruTemplate.analytic_pick``): rules read off the
fused step kernel's measurements, sized by the hardware model, so any shape gets a fast kernel
without tuning.  The measurements behind each rule are in ``docs/results/gru.md`` ("History: the
GRU pick's evidence").

- On CUDA the fused step kernel as the persistent kernel (one launch per layer) wherever its
  grid is resident, with the acquire/release barrier and gi loaded a step ahead.
- Small batch: one row per block, the first of ``SMALL_TILES`` resident with at most 256
  threads per SM (more threads capped the registers and the kernels spilled); W_hh in
  registers where the k extent is padded or W_hh is 16-bit.
- Batch >= 32: blocks of 32 rows and the fewest units whose grid fits one block per SM (every
  block reads all its rows' h each step: fewer rows, less of that traffic), W_hh's slice in
  shared memory, the h slice double-buffered; where none fits, blocks of 8 units x all rows.
- Below batch 8 with float32 state, and at batch 1 with 16-bit state: the flag-exchange
  kernel (no grid barrier, ``flag_step.py``) with the fewest units whose grid fits.
- float32 h and W_hh from batch 8: the tensor-core step kernel exchanging tagged words with
  float32 split into float16 parts (``step_tc`` 2 with ``step_flags``), 8 units a block where
  that grid has a block an SM at most, else 16, 16 rows, 8 k warps, W_hh's fragments held;
  where it does not fit (shared memory at H1024 from batch 32), the next rule.
- 16-bit h and W_hh from batch 2: the tensor-core step kernel exchanging tagged words, blocks of
  8 units where their grid has a block an SM at most (else 16 or 32), W_hh's fragments in
  registers where a lane's share fits, else those of its first k slices, h polled 16 bytes a
  load where hidden is a multiple of 4.  Where no block's W_hh slice fits shared memory (past
  H1024, or 64-row blocks), the held fragments loaded from global memory and only the rest of
  the slice in shared memory; where no such grid is resident either (B64 past H1024), the
  unfused steps with the hidden GEMM on the tensor cores.
- float32 h and W_hh from batch 32 on: the split tensor-core step kernel (``split_step.py``:
  three float16 products of high and low parts, float32-accurate), 16 units a block and the
  fewest rows whose grid is resident, the most k warps that fit, two chunks of h loaded ahead.
- The input GEMM: float16 on wgmma from ``WGMMA_MIN_FLOPS`` on Hopper; float32 split into parts
  on the tensor cores from ``SPLIT_MIN_FLOPS`` (TF32 parts on Hopper: float32's range, nothing
  to check per call; float16 parts elsewhere), else the fp32 GEMM study's tile where it gives
  every SM a block.

On a CPU device (PoCL) the unfused pipeline, which was the faster family there.
"""
from __future__ import annotations

from typing import Any

from tvm_ext.cost_model.hardware import HardwareModel
from tvm_ext.precision.precision import itemsize
from tvm_ext.core.space import Config
from tvm_ext.target import TargetInfo

from tvm_ext.schedules.gemm.wgmma import TILES_PER_BLOCK, row_order_tiles

from .cell_epilogue import CELL_FORMS, cell_blocks
from .flag_step import FLAG_UNITS
from .knobs import COUNTED_TILES_PER_BLOCK
from .fused_step import step_k_extent
from .split_step import SPLIT_CHUNK_K

# (batch rows per thread, hidden units per block), tried in order at small batch
SMALL_TILES = ((1, 32), (2, 16), (1, 16), (2, 32), (4, 16), (4, 32), (8, 32))
MANY_ROWS = 32  # from this batch on, blocks of 32 rows with W_hh's slice in shared memory
MANY_ROWS_UNITS = (4, 8, 16)  # their units per block, tried in order
FLAG_BATCH = 16  # up to this batch, the flag-exchange step kernel (float32 state; measured up to B16) where
# the tagged-word split kernel does not take it (``SPLIT_FLAGS_BATCH``)
FLAG_BATCH_TENSOR_CORE = 1  # with 16-bit state, up to this batch (from batch 2 the tensor-core kernel, with its
# 8-unit blocks and 16-byte polls, is faster; docs/results/gru.md)
# From this batch on, float32 state runs the split tensor-core step kernel: faster than the CUDA-core
# kernel at B32-B64 x H512-H1024, slower than the flag-exchange kernel at B8-B16 (docs/results/gru.md)
SPLIT_STEP_BATCH = 32
# From this batch on, float32 state runs the tensor-core kernel exchanging tagged words, split into parts
# (step_tc 2, step_flags 1): 8-25 % faster than the flag-exchange kernel at B8-B16 (2.3x at B16 H1024) and
# than the split kernel behind the grid barrier at B32-B64 H512; slower at B4 (docs/results/gru.md). With h's
# low parts stacked in its padding rows (``step_tc_stack``) from batch 4 at hidden 512 or more: 0-15 % faster
# at B4-B7 x H512-H1024, slower at H256
SPLIT_FLAGS_BATCH = 8
SPLIT_FLAGS_STACKED = (4, 512)  # (batch, hidden) from which on the stacked split kernel is picked below 8
# the flag-exchange kernel projects the input itself up to this batch (measured faster at B1-B4, even at B7:
# docs/results/gru.md)
FUSED_INPUT_BATCH = 4
SPLIT_FLAGS_UNITS = (8, 16)  # its units per block, 8 only where that grid has a block an SM at most
SPLIT_FLAGS_K_WARPS = 8  # warps splitting k (4 were 2-10 % slower at B8-B16, 2 % faster at B32 H512)
# two float32 values a word (step_split_words 2) for 8-unit blocks of full rows up to this hidden size,
# where they measured faster (slower at B8, where rows 8-15 are padding, and at H1024: docs/results/gru.md)
SPLIT_PAIRS_MAX_HIDDEN = 512
SPLIT_BLOCKS = ((16, 16, 2), (16, 32, 2), (16, 64, 2))  # (units, rows, unit warps), in the pick's order
SPLIT_K_WARPS = (4, 2, 1)  # warps splitting a chunk's k, the most that fit first
SPLIT_AHEAD = 2  # chunks of h a thread loads ahead
THREADS_PER_SM = 256  # at most this many threads of the persistent kernel on one SM
# From this many flops of layer 0's input GEMM on, float32 runs it as float16 parts on the tensor
# cores (``split.py``): faster from B8 H512 (1.6 GFLOP) on, not at B1 H256 (docs/results/gru.md)
SPLIT_MIN_FLOPS = 1e9
# ... and below it where the step kernel is the stacked split kernel (``SPLIT_FLAGS_STACKED``), which the
# TF32 GEMM runs beside: float32 B4 H512 (0.8 GFLOP) 0.175 ms against 0.230 with the default tile
# From this many flops on, a 16-bit input GEMM runs on Hopper's wgmma (``in_wgmma``) rather than its
# mma.sync tile: faster at B64 H1024 (51.5 GFLOP) and B8 H1024 (6.4), a tie at float16 B8 H512 (1.6 GFLOP;
# docs/results/gru.md)
WGMMA_MIN_FLOPS = 4e9
# The unfused steps run the cell in the hidden GEMM's store where its whole tiles make at least this
# share of a wave (and at most one where K is split in a cluster's two blocks), in this order of
# ``hid_cell`` forms: 128-row tiles with K in halves (4-10 % faster than 64-row tiles with K whole
# at 96-128 blocks, float16), one row of 192-row tiles with K in halves past 128 rows (16-bit
# B160-B192 H1536-H2048 and bidirectional B192 H1024 20-37 % faster than two rows of 128-row tiles
# with K whole, float32 B192 H1536 20 % faster than 64-row tiles), one row of 256-row tiles with K
# in halves past 192 rows (float16 B256 H1536-H2048 8-10 %, bidirectional B256 H768 5 % faster than
# two rows of 128-row tiles with K whole; float32 not measured), 64-row tiles with K whole (faster
# than two kernels a step with 96-256 tiles, slower with 48-64), their K halves (faster with 96-128
# blocks, slower with 192-256; docs/results/gru.md); a ragged last row tile of K halves too (float16
# B96 H1536-H2048 14-16 % faster on one 128-row tile than on two 64-row ones, B200 H768 13 %, B48
# H2048 17 % than two kernels a step), on TF32 parts only where it is the only row tile (float32 B96
# H2048 32 % faster, B192 H1024 20 % slower)
CELL_WAVE = 0.7
# The tiles read a 16-bit W_hh from its copy transposed in tile order (``hid_cell_bt``): 1-6 %
# faster at six of seven shapes, level or 1 % faster on 128-row tiles over a ragged batch
# (docs/results/gru.md)
CELL_PICK_ORDER = (3, 5, 6, 4, 1, 2)
TF32_CELL_PICK_ORDER = (3, 5, 1, 2)  # float32 on TF32 parts: 128-row tiles with K whole not measured
# From this batch and hidden size on, those steps are taken over the tensor-core step kernel's
# resident grid too (16-bit B128 H1024: K in halves on 128 blocks 9 % faster; at the smaller shapes
# where both run, B128 H512-H768, B192-B256 H256-H768, bidirectional B64 H768 and B128 H512, the
# step kernel is 1.2-2.7x faster than every cell form: docs/results/gru.md)
CELL_OVER_RESIDENT_BATCH = 128
CELL_OVER_RESIDENT_HIDDEN = 1024
# The resident-W cell step kernel with its input GEMM counted beside it is taken over the
# tensor-core step kernel from this batch, a direction / both (its grid 64 blocks there): float16
# B96 H1024 0.923 ms against 1.298, bidirectional B64 H1024 1.008 against 1.177 (docs/results/gru.md)
RESIDENT_COUNTED_BATCH = {1: 96, 2: 64}
# Below H1024, from this hidden size, it is taken counted where no tensor-core step kernel's grid is
# resident (over the unfused steps): float16 B192 / B160 H768 1.004 / 0.986 ms against 1.193 / 1.153,
# bidirectional B96 H768 1.109 against 1.462, bfloat16 B192 H768 1.007 against 1.203; the tensor-core
# step kernel faster where it runs (B128 H768 0.771 against 0.994; docs/results/gru.md)
RESIDENT_HIDDEN = 768
# The fp32 GEMM study's best tile at 4096^3 (docs/results/gemm.md)
LARGE_GEMM_TILE = dict(wg_x=16, wg_y=8, task_x=8, task_y=8, k_step=16, use_shared=1, pad=1, unroll=512, vec=4,
                       double_buffer=1, a_transposed=1)


def analytic_pick(template: Any, target: TargetInfo) -> tuple[Config, str]:
    """(config, why) for ``template`` (a ``GruTemplate``) on ``target``: the rules below, then the
    input GEMM of TF32 parts reading two stored parts where it runs ahead of the steps."""
    cfg, why = _rules_pick(template, target)
    return two_tf32_parts(template, cfg, why, template.space(target)) if cfg.in_split == 3 else (cfg, why)


def two_tf32_parts(template: Any, cfg: Config, why: str, space: Any) -> tuple[Config, str]:
    """``cfg`` with its input GEMM of TF32 parts reading x's and W_ih's parts stored once each,
    in turn, by the TMA (``in_tf32_parts`` 2) where its tile can and no step kernel counts its rows
    (a counted GEMM's tile keeps its loads: ``step_overlap_tma``), and the why's words for it (the
    GRU's and the LSTM's, which has no counted GEMM)."""
    two = cfg.replace(in_tf32_parts=2)
    if getattr(cfg, "step_overlap", 0) or not space.is_feasible(two):
        return cfg, why
    return two, (f"{why}; the input GEMM's TF32 parts stored once each and read in turn by the TMA "
                 f"({template.tf32_input_tile(two).name})")


def _rules_pick(template: Any, target: TargetInfo) -> tuple[Config, str]:
    """(config, why) for ``template`` on ``target`` by the rules (``analytic_pick``)."""
    base = template.default_config(target)
    if target.is_cpu:
        return base, "CPU device: the unfused pipeline (per-step GEMM, then the cell kernel)"
    hw = HardwareModel.from_target(target)
    space = template.space(target)
    cuda = target.kind == "cuda"
    stacked_rule = stacked_split_rows(template)
    wants_split_flags = cuda and (template.batch >= SPLIT_FLAGS_BATCH or stacked_rule)
    base, gemm_why = input_gemm_config(template, base, space, hw.sm_count, any_size=cuda and stacked_rule)
    extras = dict(step_loop=2, step_barrier=2, step_prefetch=1) if cuda else dict(step_loop=0)
    tensor_core = tensor_core_step_config(template, base, space, hw.sm_count) if cuda else None
    most_rows = FLAG_BATCH if tensor_core is None else FLAG_BATCH_TENSOR_CORE
    split_flags = split_flags_step_config(template, base, space, hw.sm_count) if wants_split_flags else None
    if split_flags is not None:
        split_flags, early = _overlapped(template, split_flags, space, hw.sm_count)
        split_flags, stacked = stacked_config(split_flags, space)
        split_flags, warp = warp_h_config(template, split_flags, space)
        return split_flags, (f"{split_flags_why(template.step_variant(split_flags).shape, stacked, warp)}; "
                             f"{gemm_why}{early}")
    flags = flag_step_config(template, base, space, hw.sm_count) if cuda and template.batch <= most_rows else None
    if flags is not None:
        return flags, flag_step_why(template, flags, " in registers", gemm_why)
    resident, early = (_resident_cell(template, base, space, hw.sm_count, tensor_core is not None) if cuda
                       else (None, ""))
    if resident is not None:
        shape = template.step_variant(resident).shape
        return resident, (f"resident-W cell step kernel (one launch a layer, a grid barrier a step): {shape.blocks} "
                          f"blocks of 64 rows x 32 units on wgmma, W_hh's columns in shared memory for all T steps, "
                          f"h streamed through {shape.stages} stages, the cell from the registers; {gemm_why}{early}")
    if (tensor_core is not None and template.batch >= CELL_OVER_RESIDENT_BATCH
            and template.hidden >= CELL_OVER_RESIDENT_HIDDEN):
        cell = _cell_in_gemm(template, base.replace(hid_wgmma=1), space, hw.sm_count)
        if cell is not None:
            return cell, (_cell_why(template, cell, f"faster than the tensor-core step kernel's resident grid from "
                                                    f"B{CELL_OVER_RESIDENT_BATCH} H{CELL_OVER_RESIDENT_HIDDEN}")
                          + f"; {gemm_why}")
    if tensor_core is not None:
        tensor_core, early = _overlapped(template, tensor_core, space, hw.sm_count)
        if not early:
            tensor_core, early = _wider_counted(template, tensor_core, space, hw.sm_count)
        if not early:
            tensor_core, early = _many_rows_counted(template, tensor_core, space, hw.sm_count)
        tensor_core, warp = warp_h_config(template, tensor_core, space)
        if early and not base.in_wgmma:
            gemm_why = f"input GEMM: {template.precision['x']} on wgmma ({template.in_wgmma_tile.name})"
        return tensor_core, (f"{tensor_core_why(template.step_variant(tensor_core).shape, warp)}; {gemm_why}"
                             f"{early}")
    split = split_step_config(base, space) if cuda and template.batch >= SPLIT_STEP_BATCH else None
    if split is not None:
        return split, f"{split_step_why(template.step_variant(split).shape)}; {gemm_why}"
    tf32 = _tf32_cell(template, base, space, hw.sm_count) if cuda and template.batch >= SPLIT_STEP_BATCH else None
    if tf32 is not None:
        return tf32, (_cell_why(template, tf32, "float32 h and W_hh as TF32 parts, three products: no split step "
                                                "kernel's grid is resident") + f"; {gemm_why}")
    if cuda and template.batch >= MANY_ROWS and template.hid_tensor_core is not None:
        wgmma = base.replace(hid_wgmma=1)
        unfused = wgmma if space.is_feasible(wgmma) else base
        cell = _cell_in_gemm(template, unfused, space, hw.sm_count)
        if cell is not None:
            return cell, _cell_why(template, cell, "no tensor-core step kernel's grid is resident: W_hh's slices "
                                                   "and h's rows do not fit")
        tile = template.hid_wgmma_tile.name if unfused.hid_wgmma else template.hid_tensor_core.label()
        return unfused, (f"the unfused pipeline: per step the hidden GEMM on the tensor cores ({tile}), then the "
                         f"cell kernel (no tensor-core step kernel's grid is resident: W_hh's slices and h's rows "
                         f"do not fit)")
    if cuda and template.batch >= MANY_ROWS:
        cfg = many_rows_config(template, base, space, hw.sm_count, extras)
        if cfg is not None:
            step = template.step_variant(cfg)
            return cfg, (f"fused step kernel, {step.blocks} blocks of {step.units} units x "
                         f"{step.rows} batch rows (threads {step.j}x{step.ks}x{step.bt}, "
                         f"{step.u * step.b} outputs of each gate a thread), W_hh's slice in shared memory, "
                         f"h slices of {step.k} double-buffered, persistent; {gemm_why}")
    ks = 8 if template.hidden >= 128 else 4
    step_k = next((k for k in (64, 32, 16) if step_k_extent(template.hidden, k, ks) * 4 <= template.hidden * 5), 8)
    padded = step_k_extent(template.hidden, step_k, ks) > template.hidden
    in_registers = padded or itemsize(template.w_hh_dtype) == 2  # a 16-bit W_hh takes half the registers
    for rows, units in SMALL_TILES:
        units = units if template.hidden > 16 else 16
        cfg = base.replace(fuse_step=1, step_j=units, step_b=rows, step_k=step_k, step_ks=ks, **extras)
        if in_registers and space.is_feasible(cfg.replace(step_w_onchip=2)):
            cfg = cfg.replace(step_w_onchip=2)
        if not space.is_feasible(cfg):
            continue
        step = template.step_variant(cfg)  # persistent on CUDA
        per_sm = step.blocks_per_sm(target) if cuda else -(-step.blocks // hw.sm_count)
        if per_sm * units * ks > THREADS_PER_SM and (cuda or per_sm > 2):
            continue
        loop = "persistent kernel (one launch, a grid barrier per step)" if cuda else "one launch per step"
        w_hh = "W_hh in registers, " if cfg.step_w_onchip == 2 else ""
        return cfg, (f"fused step kernel, split-K: {step.blocks} blocks of {units} units x {rows} "
                     f"batch rows ({units}x{ks} threads, k slices of {step_k}, k extent "
                     f"{step_k_extent(template.hidden, step_k, ks)}), {w_hh}{loop} on {hw.sm_count} SMs; {gemm_why}")
    cfg = base.replace(fuse_step=1, step_j=32, step_b=8, step_k=step_k, step_ks=ks, step_loop=0, step_prefetch=1)
    if space.is_feasible(cfg):
        return cfg, (f"fused step kernel, split-K: 32 units x 8 batch rows per block (32x{ks} threads, k slices of "
                     f"{step_k}), one launch per step (no resident persistent grid); {gemm_why}")
    return base, f"the unfused pipeline (the fused step kernel does not fit: {space.infeasible_reason(cfg)})"


# The counted TF32 input GEMM's columns (``step_overlap_bn``): its 3K-deep tiles take about as long at 32
# columns as at 64 or 128 (latency, 48 k steps at K 512), so the first steps wait least for the narrowest.
NARROW_COUNTED_BN = 32


def _overlapped(template: Any, cfg: Config, space: Any, sm_count: int, counts: tuple[int, ...] = TILES_PER_BLOCK,
                least_blocks: int = 1) -> tuple[Config, str]:
    """``cfg`` with its step kernel launched while its input GEMM runs (``step_overlap``; the
    GEMM on wgmma, taken for it by 16-bit inputs) where the GEMM's blocks and the step kernel's fit
    the SMs side by side, and the why's words for it ("" where it stays as it was).  float16 B8
    H512: 0.152 ms against 0.172.  Both directions with 16-bit input only (the GEMM's tile rows
    from both ends, the reverse direction's first step reading the last): float16 bidirectional
    B4 H256 14 % faster, B8 H128 / H384 10 %, B16 H256 3-4 %, B8 H256 level; float32 B16 H256 on
    TF32 parts 5 % slower (docs/results/gru.md)."""
    if template.bidirectional and cfg.in_split:
        return cfg, ""
    early = cfg.replace(step_overlap=1, **({} if cfg.in_split or cfg.in_wgmma else {"in_wgmma": 1}))
    if not space.is_feasible(early):
        return cfg, ""
    for bn in (NARROW_COUNTED_BN, 0) if early.in_split == 3 else (0,):
        placed, why = _counted_beside(template, early.replace(step_overlap_bn=bn), space, sm_count, counts,
                                      ", columns narrowed" if bn else "", least_blocks)
        if why:
            return placed, why
    return cfg, ""


def _counted_beside(template: Any, cfg: Config, space: Any, sm_count: int, counts: tuple[int, ...],
                    narrowed: str = "", least_blocks: int = 1) -> tuple[Config, str]:
    """``cfg`` with its input GEMM counted (``step_overlap``: the fewest of ``counts`` tiles a
    block) on the SMs its step kernel's grid leaves, where both grids fit side by side, the GEMM
    has ``least_blocks`` blocks or more and the space allows it (its pipeline deepened by
    ``_deepened``), and the why's words ("" where it stays as it was)."""
    early = cfg.replace(step_overlap=1)
    one_a_block = template.counted_gemm_tile(early)
    if one_a_block is None:
        return cfg, ""
    (m, n), blocks = template.gi_shape, template.step_variant(early).shape.blocks
    placed = early.replace(step_overlap=row_order_tiles(one_a_block, m, n, sm_count - blocks, counts))
    tile = template.counted_gemm_tile(placed)
    gemm_blocks = -(-(n // tile.bn * -(-m // tile.bm)) // tile.tiles)
    if blocks + gemm_blocks > sm_count or gemm_blocks < least_blocks or not space.is_feasible(placed):
        return cfg, ""
    placed, deeper = _deepened(template, placed, space)
    ends = ", tile rows from both ends" if template.bidirectional else ""
    return placed, (f"; the step kernel launched while the input GEMM runs, its {gemm_blocks} blocks "
                    f"({template.counted_gemm_tile(placed).name}{narrowed}{deeper}{ends}) beside the step kernel's "
                    f"{blocks}, which waits for each step's rows")


# The counted GEMM's loads issued at least this many k steps ahead (``step_overlap_stages``): float32 B16
# H512's TF32 tile of 128 rows has 4 stages, 2 ahead, and ran 2 % slower than with 8; B8's 64 rows, 4
# ahead, gained nothing from more (docs/results/gru.md).
COUNTED_LOADS_AHEAD = 4
DEEPENED_STAGES = 8


def _deepened(template: Any, cfg: Config, space: Any) -> tuple[Config, str]:
    """``cfg`` with its counted GEMM's pipeline deepened to ``DEEPENED_STAGES`` where its own loads
    fewer than ``COUNTED_LOADS_AHEAD`` k steps ahead and the deeper one fits, and the why's words."""
    tile = template.counted_gemm_tile(cfg)
    deep = cfg.replace(step_overlap_stages=DEEPENED_STAGES)
    if tile.stages - 1 - tile.inflight >= COUNTED_LOADS_AHEAD or not space.is_feasible(deep):
        return cfg, ""
    return deep, f", {DEEPENED_STAGES} stages for its {tile.stages}"


def warp_h_config(template: Any, cfg: Config, space: Any) -> tuple[Config, str]:
    """``cfg`` with each warp's polled h stored by PTX (``step_tc_warp_h``: no block barrier
    between a warp's poll and its products) where its tensor-core step kernel allows it and the
    state is 16-bit or fills the blocks' rows (float32: with the batch, or its low parts stacked
    under 8 rows by ``_stacked`` before), and the why's words: float32 B16 H512 9 % faster, float16
    B8 H512 3 %, float32 B8 H512 stacked 7 %; float32 B8 unstacked (8 of 16 rows padding) 0.5 %
    slower (docs/results/gru.md)."""
    warp = cfg.replace(step_tc_warp_h=1)
    if cfg.step_tc not in (1, 2) or cfg.step_flags != 1 or not space.is_feasible(warp):
        return cfg, ""
    shape = template.step_variant(cfg).shape
    if shape.split and template.batch % shape.rows and not shape.stacked:
        return cfg, ""
    return warp, ", each warp multiplying the h it polled without a block barrier"


def stacked_config(cfg: Config, space: Any) -> tuple[Config, str]:
    """``cfg`` with float32 h's low parts in its m16 tiles' padding rows (``step_tc_stack``: two
    mma.sync a W part for three) where the kernel allows it (batch 8 or less, 16 rows a block),
    and the why's words: with the warp's h stored by PTX, float32 B8 H512 0.244 → 0.213 ms, B8
    H1024 0.488 → 0.459 (docs/results/gru.md)."""
    stacked = cfg.replace(step_tc_stack=1)
    if cfg.step_tc != 2 or cfg.step_flags != 1 or not space.is_feasible(stacked):
        return cfg, ""
    return stacked, ", h's low parts stacked under its high parts in the m16 tile's padding rows"


def stacked_split_rows(template: Any) -> bool:
    """Whether float32 state below ``SPLIT_FLAGS_BATCH`` rows takes the split kernel with its low
    parts stacked (``SPLIT_FLAGS_STACKED``)."""
    stacked_batch, stacked_hidden = SPLIT_FLAGS_STACKED
    return template.batch >= stacked_batch and template.hidden >= stacked_hidden


def split_flags_why(shape: Any, stacked: str, warp: str, gates: str = "") -> str:
    """What the split tensor-core kernel exchanging tagged words runs (``split_flags_step_config``),
    with ``stacked_config``'s and ``warp_h_config``'s words; ``gates``: after "W_hh" (the LSTM's)."""
    return (f"tensor-core persistent step kernel, float32 h and W_hh{gates} as float16 high and low parts "
            f"({'four products, two a W part' if shape.stacked else 'three products'}), h exchanged as tagged "
            f"float32 words{' (two a word, a tag bit)' if shape.split_pairs else ''} (no grid barrier): "
            f"{shape.blocks} blocks of {shape.units} units x {shape.rows} batch rows, {shape.k_warps} warps "
            f"splitting k, W_hh's parts in shared memory{held_why(shape, 'their')}{stacked}{warp}")


def split_step_why(shape: Any, gates: str = "") -> str:
    """What the split tensor-core kernel behind the grid barrier runs (``split_step_config``);
    ``gates``: after "W_hh" (the LSTM's)."""
    return (f"split tensor-core persistent step kernel (float32 h and W_hh{gates} as float16 high and low parts, "
            f"three products): {shape.blocks} blocks of {shape.units} units x {shape.rows} batch rows on "
            f"{shape.k_warps} k warps, W_hh's parts in shared memory, h in chunks of {SPLIT_CHUNK_K} {shape.ahead} "
            f"ahead")


def flag_step_why(template: Any, cfg: Config, gates: str, gemm_why: str) -> str:
    """The why's words for the flag-exchange step kernel of ``cfg`` (``gates``: what W_hh's share
    holds and the cell lane keeps, said where it is not the GRU's; ``gemm_why``: the input GEMM's
    words, where the kernel does not project the input itself)."""
    shape = template.step_variant(cfg).shape
    inputs = "the input projected in it (W_ih's share in registers too), no input GEMM" if cfg.step_flag_input \
        else gemm_why
    return (f"flag-exchange persistent step kernel (no grid barrier): {shape.blocks} blocks of {shape.units} units "
            f"x all {template.batch} rows, W_hh's share{gates}; {inputs}")


def tensor_core_why(shape: Any, warp: str, gates: str = "") -> str:
    """The why's words for a tensor-core step kernel of ``shape`` exchanging tagged words (``warp``:
    ``warp_h_config``'s words; ``gates``: what W_hh's slice holds, said where it is not the GRU's)."""
    return (f"tensor-core persistent step kernel, h exchanged as tagged words (no grid barrier): {shape.blocks} "
            f"blocks of {shape.units} units x {shape.rows} batch rows, {shape.k_warps} warps splitting k and "
            f"{shape.n_warps} the units, W_hh's slice{gates} in shared memory{held_why(shape, 'its')}{warp}")


def held_why(shape: Any, whose: str) -> str:
    """What of W_hh's fragments the tensor-core step kernel's lanes hold in registers, for a why."""
    return {0: "", 1: f", {whose} fragments held in registers",
            2: f", the fragments of {shape.held_slices} of a warp's {shape.warp_slices} k slices held in "
               f"registers",
            3: f", the fragments of {shape.held_slices} of a warp's {shape.warp_slices} k slices loaded into "
               f"registers from global memory"}[shape.w_held]


TC_BLOCKS = (  # (units, rows, k warps, unit warps) of the tensor-core step kernel, in the pick's order
    (8, 16, 4, 1), (16, 16, 4, 1), (32, 16, 1, 4), (16, 32, 2, 1), (16, 64, 2, 1))
TC_FEWEST_UNITS = 8  # blocks of this many units only where their grid has at most one block an SM
# From this hidden size on, those blocks split k over 8 warps (each 8 or more 16-deep k slices): float16 B8
# H1024 0.255-0.258 ms against 0.271 on 4; at H512 (4 slices a warp) 1-8 % slower (docs/results/gru.md)
TC_EIGHT_K_WARPS_HIDDEN = 1024
W_HELD_ACC_SETS = 2  # accumulator sets with W_hh's fragments in registers (float16 B8 H512: 0.198 ms, one set 0.207)
# Blocks of TC_FEWEST_UNITS whose grid leaves no SMs for a counted input GEMM take twice the units at this
# batch, one direction only, the GEMM counted beside them (``_wider_counted``): 2-3 % faster at 16-bit B8
# H1024; 20 % slower at B4 (the GEMM half as large), 6 % at B16, 8 % at bidirectional B8 H512
# (docs/results/gru.md)
WIDER_COUNTED_BATCH = 8
# 32-unit blocks on 4 unit warps split k over this many warps, the fragments of as many k slices as fit in
# WIDE_W_REGISTERS a lane loaded from global memory (step_tc_wreg 3; float16 B64 H1024 0.447 ms against
# 0.555 on one k warp holding 96 registers' worth: docs/results/gru.md)
WIDE_K_WARPS = 2
WIDE_W_REGISTERS = 160
# Blocks whose W_hh slice is streamed (``_streamed``) take the k warps that make this many warps a block (k warps
# x unit warps x 16-row tiles), or the fewest more that fit: float16 B8 H2048, 16 rows, 0.439 ms on 8 k warps against
# 0.632 on 4; B32 H1536, 32 rows, 0.843 on 4 against 0.882 on 2 and 1.306 on 8; bidirectional B64 H1024, 64
# rows, 1.172 on 2 against 2.073 on 4 and 3.181 on 8; 32 units on 4 unit warps at bidirectional B8 H2048 (2
# does not fit) 1.160 on 4 against 2.836 on 8 (docs/results/gru.md)
STREAMED_WARPS = 8
# Of the streamed blocks, the first of at most this many threads (a lane may take 255 registers beside its held
# fragments): 512-thread ones are capped at 128 registers a lane and spill (ptxas: 900 bytes a lane at float16
# B32 H1760 on 32 units, 4 k warps and 4 unit warps); there 16 units and 32 rows on 4 k warps ran 1.750 ms
# against 2.350 (docs/results/gru.md)
STREAMED_MAX_THREADS = 256


def tensor_core_step_config(template: Any, base: Config, space: Any, sm_count: int,
                            wide_registers: int = 0) -> Config | None:
    """The tensor-core step kernel where it runs (16-bit h and W_hh, a resident grid), h
    exchanged as tagged words (faster than the grid barrier and than the flag-exchange
    CUDA-core kernel), the first block of ``TC_BLOCKS`` whose grid is resident: 8 units and 16
    rows on 4 k warps where that grid has a block an SM at most (float16 B8 / B16 H512: 64
    blocks instead of 32 of 16 units, 5-16 % faster; on 8 k warps from H1024), else 16 units and 16 rows on 4 k warps
    (more, smaller blocks), else 32 units and 16 rows on 4 warps
    splitting the units (a step's exchange is blocks x rows x H words, H²·B/units, so fewer
    blocks exchange less), else more rows; W_hh's fragments in registers with two accumulator
    sets where they fit (``MAX_W_REGISTERS``: 8 or 16 units on 4 k warps up to H512), else those of
    the warp's first k slices that fit; h polled two words a load (``step_tc_poll`` 16) where
    hidden is a multiple of 4.  Where no block's W_hh slice fits shared memory beside its h rows
    (16-bit past H1024), the first of those blocks whose grid is resident with the fragments of
    as many k slices as ``WIDE_W_REGISTERS`` a lane holds loaded from global memory, only the
    rest in shared memory (``_streamed``; of those, the first of ``STREAMED_MAX_THREADS`` threads
    or fewer where one fits); None where no such config fits.  The timings behind
    each choice: docs/results/gru.md.  ``wide_registers`` (the LSTM's): the 32-unit blocks on warps
    splitting the units stream W's fragments even where their whole slice does not fit shared
    memory, that many registers a lane (0: the GRU's rule, only where it fits)."""
    resident = []
    for units, rows, k_warps, n_warps in TC_BLOCKS:
        deep = units == TC_FEWEST_UNITS and template.hidden >= TC_EIGHT_K_WARPS_HIDDEN
        cfg = base.replace(fuse_step=1, step_loop=2, step_barrier=2, step_tc=1, step_flags=1, step_j=units,
                           step_tc_rows=rows, step_tc_kw=8 if deep else k_warps, step_tc_nw=n_warps)
        if deep and not space.is_feasible(cfg):
            cfg = cfg.replace(step_tc_kw=k_warps)
        if units == TC_FEWEST_UNITS and template.step_variant(cfg).shape.blocks > sm_count:
            continue
        resident.append(cfg)
        streams = n_warps > 1 and wide_registers > 0
        if space.is_feasible(cfg) or streams:
            wide = cfg.replace(step_tc_kw=WIDE_K_WARPS, step_tc_wreg=3,
                               step_tc_wregs=wide_registers or WIDE_W_REGISTERS)
            if n_warps > 1 and space.is_feasible(wide):
                return _held_and_paired((wide,), space)
        if space.is_feasible(cfg):
            return _held_and_paired((cfg.replace(step_tc_wreg=1, step_tc_acc=W_HELD_ACC_SETS),
                                     cfg.replace(step_tc_wreg=2), cfg), space)
    streamed = [s for c in resident if (s := _streamed(template, c, space)) is not None]
    return next((s for s in streamed if template.step_variant(s).shape.threads <= STREAMED_MAX_THREADS),
                streamed[0] if streamed else None)


def _streamed(template: Any, cfg: Config, space: Any) -> Config | None:
    """``cfg`` with the fragments of as many of a warp's k slices as ``WIDE_W_REGISTERS`` a lane
    holds loaded from global memory, only the rest of W_hh's slice in shared memory (``step_tc_wreg``
    3), on the fewest k warps that fit from those that bring the block to ``STREAMED_WARPS`` warps
    (more leave a lane too few registers beside the held fragments), h polled 16 bytes a load where
    that fits; None where it does not fit."""
    streamed = (cfg.replace(step_tc_kw=k_warps, step_tc_wreg=3, step_tc_wregs=WIDE_W_REGISTERS)
                for k_warps in sorted(space.knob("step_tc_kw").choices))
    fitting = (_held_and_paired((c,), space) for c in streamed
               if template.step_variant(c).shape.warps >= STREAMED_WARPS)
    return next((c for c in fitting if c is not None), None)


def _wider_counted(template: Any, cfg: Config, space: Any, sm_count: int) -> tuple[Config, str]:
    """``cfg`` of ``TC_FEWEST_UNITS`` units a block, whose grid leaves no SMs for a counted input
    GEMM, with twice the units a block (half the blocks, the same warps) and the GEMM counted
    beside them at ``WIDER_COUNTED_BATCH`` rows, one direction, where that fits; and the why's
    words ("" where ``cfg`` stays).  float16 / bfloat16 B8 H1024: 0.222 ms against 0.228 / 0.227;
    at B4, B16 and bidirectional B8 H512 the wider blocks cost more than the GEMM they hide
    (docs/results/gru.md)."""
    if cfg.step_j != TC_FEWEST_UNITS or template.batch != WIDER_COUNTED_BATCH or template.bidirectional:
        return cfg, ""
    wider = cfg.replace(step_j=2 * TC_FEWEST_UNITS)
    if not space.is_feasible(wider):
        return cfg, ""
    counted, early = _overlapped(template, wider, space, sm_count)
    return (counted, early) if early else (cfg, "")


# A 16-bit tensor-core step kernel's input GEMM of many tile rows counted beside it with 32 or 64
# tiles a block (``COUNTED_TILES_PER_BLOCK``) where the GEMM still has this many blocks: float16
# B128 H768 0.754 ms against 0.778, bidirectional B64 H768 0.766 against 0.820 (36 blocks beside
# 96); B96 H768's 27 blocks 1.132 against 0.946 (docs/results/gru.md)
MANY_ROWS_COUNTED_BLOCKS = 36


def _many_rows_counted(template: Any, cfg: Config, space: Any, sm_count: int) -> tuple[Config, str]:
    """``cfg`` (a tensor-core step kernel whose input GEMM ``_overlapped`` could not count: more
    tile rows than 16 tiles a block take on the SMs left) with its 16-bit GEMM counted at 32 or 64
    tiles a block where that leaves it ``MANY_ROWS_COUNTED_BLOCKS`` blocks, and the why's words."""
    if cfg.in_split:
        return cfg, ""
    return _overlapped(template, cfg, space, sm_count, COUNTED_TILES_PER_BLOCK, MANY_ROWS_COUNTED_BLOCKS)


def _held_and_paired(held: tuple[Config, ...], space: Any) -> Config | None:
    """The first feasible of ``held`` (W_hh's fragments all held in registers, some, none), h
    polled two words a load (``step_tc_poll`` 16) where that is feasible; None where none is."""
    cfg = next((c for c in held if space.is_feasible(c)), None)
    if cfg is None:
        return None
    pairs = cfg.replace(step_tc_poll=16)
    return pairs if space.is_feasible(pairs) else cfg


def split_flags_step_config(template: Any, base: Config, space: Any, sm_count: int) -> Config | None:
    """The tensor-core kernel exchanging tagged words with float32 state split into parts where
    it runs (float32 h and W_hh, a resident grid, W's parts and all the block's rows of h in shared
    memory): 8 units a block where that grid has a block an SM at most, else 16, 16 rows, 8 k
    warps, W_hh's fragments held in registers where a lane's share fits (else those of its first
    k slices), one accumulator set, 16-byte polls where hidden is even; two values a word for
    8-unit blocks of 16 batch rows or more up to ``SPLIT_PAIRS_MAX_HIDDEN``; None where none fits."""
    for units in SPLIT_FLAGS_UNITS:
        cfg = base.replace(fuse_step=1, step_loop=2, step_barrier=2, step_tc=2, step_flags=1, step_j=units,
                           step_tc_rows=16, step_tc_kw=SPLIT_FLAGS_K_WARPS, step_tc_nw=1, step_tc_acc=1)
        if units == SPLIT_FLAGS_UNITS[0] and template.step_variant(cfg).shape.blocks > sm_count:
            continue
        picked = _held_and_paired((cfg.replace(step_tc_wreg=1), cfg.replace(step_tc_wreg=2), cfg), space)
        if picked is None:
            continue
        pairs = picked.replace(step_split_words=2)
        full_rows = template.batch >= picked.step_tc_rows and template.hidden <= SPLIT_PAIRS_MAX_HIDDEN
        return pairs if units == SPLIT_FLAGS_UNITS[0] and full_rows and space.is_feasible(pairs) else picked
    return None


def _cell_in_gemm(template: Any, unfused: Config, space: Any, sm_count: int,
                  forms: tuple[int, ...] = CELL_PICK_ORDER, ragged_split_alone: bool = False) -> Config | None:
    """The unfused steps with the cell in the hidden GEMM's store (``hid_cell``): the first form of
    ``forms`` that the space takes whose tiles make 70 % of a wave (``CELL_WAVE``), and
    at most one where K is split, the last row tile is ragged or 128-row tiles keep K whole, those
    only past 128 rows (docs/results/gru.md: float16 B96 H1536 / H2048 ragged on 96 / 128 blocks,
    1.883 / 2.716 ms against 2.076 / 2.905 with a cell kernel; B200 H1536 on 192, 3.654 against
    3.009; 128-row tiles with K whole at B192 H1536 / B256 H2048 2.937 / 4.166 against 3.392 / 4.632
    on 64-row ones past a wave, at B96 H2048 on 64 blocks 3.188 against 2.716), a tile of more
    than 64 rows only where its last 64-row band holds a row (128-row ones past 64 rows, 192-row
    ones past 128, 256-row ones past 192); K split over a ragged last row tile only where it is
    the only one with ``ragged_split_alone``; a 16-bit W_hh read from its transposed copy; None
    (two kernels a step) where none does."""
    if not unfused.hid_wgmma:
        return None
    for form in forms:
        rows, split = CELL_FORMS[form]
        blocks = cell_blocks(template.batch, template.hidden, template.dirs, form)
        tall_whole = split == 1 and rows > CELL_FORMS[1][0]
        if (blocks < CELL_WAVE * sm_count or (tall_whole and template.batch <= rows)
                or template.batch <= rows - CELL_FORMS[1][0]
                or (ragged_split_alone and split > 1 and template.batch % rows and template.batch > rows)
                or ((split > 1 or tall_whole or template.batch % rows) and blocks > sm_count)):
            continue
        cell = unfused.replace(hid_cell=form)
        if space.is_feasible(cell):
            transposed = cell.replace(hid_cell_bt=1)  # a 16-bit W_hh read from its transposed copy
            return transposed if space.is_feasible(transposed) else cell
    return None


def _resident_cell(template: Any, base: Config, space: Any, sm_count: int,
                   tensor_core: bool) -> tuple[Config | None, str]:
    """The resident-W cell step kernel (``step_cell`` 1, 4 stages) for 16-bit h and W_hh from
    ``RESIDENT_HIDDEN`` at a batch no multiple of 128 (where 128-row cell tiles run,
    as fast or faster replayed from a CUDA graph: B256 H1024 1.439 against 1.434, bidirectional
    B128 1.457 against 1.529, B128 0.992 against 0.997 with its GEMM counted), with its input GEMM
    counted on the SMs its grid leaves (``_counted_beside``), and the why's words for that:
    - where the cell form would be on 64-row tiles (from ``CELL_OVER_RESIDENT_BATCH``) and its grid
      makes at least ``CELL_WAVE`` of a wave: float16 B192 / B160 H1024 1.085 / 1.073 ms counted,
      1.389 / 1.135 not, 1.633 on the 64-row cell form (B192); bfloat16 alike;
    - counted, from ``RESIDENT_COUNTED_BATCH`` over the tensor-core step kernel;
    - below ``CELL_OVER_RESIDENT_HIDDEN``, counted, where no tensor-core step kernel
      (``tensor_core``: one is resident) runs.
    (None, "") elsewhere (docs/results/gru.md)."""
    none = (None, "")
    if (template.precision["h"] not in ("float16", "bfloat16") or template.hidden < RESIDENT_HIDDEN
            or template.batch % CELL_FORMS[3][0] == 0):
        return none
    cfg = base.replace(fuse_step=1, step_loop=2, step_barrier=2, step_cell=1, step_cell_stages=4,
                       step_cell_inflight=1)
    if not space.is_feasible(cfg):
        return none
    wave = (template.hidden >= CELL_OVER_RESIDENT_HIDDEN and template.batch >= CELL_OVER_RESIDENT_BATCH
            and template.step_variant(cfg).shape.blocks >= CELL_WAVE * sm_count)
    over = (not tensor_core if template.hidden < CELL_OVER_RESIDENT_HIDDEN
            else template.batch >= RESIDENT_COUNTED_BATCH[template.dirs])  # taken only counted
    if not (wave or over):
        return none
    counted, early = _counted_beside(template, cfg, space, sm_count, COUNTED_TILES_PER_BLOCK)
    return (counted, early) if wave or early else none


def _tf32_cell(template: Any, base: Config, space: Any, sm_count: int) -> Config | None:
    """A float32 GRU's unfused steps on TF32 parts with the cell in the hidden GEMM's store
    (``hid_tf32_tile``): ``_cell_in_gemm``'s form, else 64-row tiles with K whole where fewer tiles
    make less of a wave (2.0-2.5x the CUDA-core step kernels at B64-B256 x H1024-H2048, 1.2x at B32
    H2048; the split step kernel's resident grid faster at B128 H1024: docs/results/gru.md; the rule
    covers larger batches and hidden sizes unmeasured; K split over a ragged last row tile only
    where it is the only one); None where the space refuses both."""
    if template.hid_tf32_tile is None:
        return None
    unfused = base.replace(fuse_step=0, hid_wgmma=1)
    cell = _cell_in_gemm(template, unfused, space, sm_count, TF32_CELL_PICK_ORDER, ragged_split_alone=True)
    if cell is not None:
        return cell
    whole = unfused.replace(hid_cell=1)
    return whole if space.is_feasible(whole) else None


def _cell_why(template: Any, cell: Config, reason: str) -> str:
    """Why the pick is ``cell`` (``_cell_in_gemm``'s): its step kernel's tile, and ``reason``."""
    return (f"the unfused pipeline: per step the hidden GEMM on the tensor cores "
            f"({template.step_variant(cell).wgmma.name}) with the cell in its store, one kernel a step ({reason})")


def split_step_config(base: Config, space: Any, blocks: tuple[tuple[int, int, int], ...] = SPLIT_BLOCKS
                      ) -> Config | None:
    """The split tensor-core step kernel where it runs (float32 h and W_hh, a resident grid): the
    first block of ``blocks`` (units, rows, unit warps) that fits, the GRU's ``SPLIT_BLOCKS``: 16
    units (W_hh's two parts of 32 units fill the shared memory at H1024) on 2 warps and the
    fewest rows, so the most blocks share the products (16 rows tie 32 units at H512), with the
    most k warps that fit (more warps hide the multiplies' latency: 4 k warps 7-22 % faster than
    1; docs/results/gru.md); None where none fits."""
    for units, rows, n_warps in blocks:
        for k_warps in SPLIT_K_WARPS:
            cfg = base.replace(fuse_step=1, step_loop=2, step_barrier=2, step_tc=2, step_flags=0, step_j=units,
                               step_tc_rows=rows, step_tc_kw=k_warps, step_tc_nw=n_warps, step_tc_ahead=SPLIT_AHEAD)
            if space.is_feasible(cfg):
                return cfg
    return None


def flag_step_config(template: Any, base: Config, space: Any, sm_count: int) -> Config | None:
    """The flag-exchange step kernel at small batch (the caller bounds the batch): the fewest
    units per block whose grid fits one block per SM (more blocks share the math; faster than
    a grid barrier, docs/results/gru.md), the input projected in it (no input GEMM) up to
    ``FUSED_INPUT_BATCH`` where that fits; None where no such config fits.  The LSTM's pick
    takes it too (its space has no input split knobs)."""
    no_split = {name: 0 for name in ("in_split", "in_wgmma") if name in space.names}
    for units in FLAG_UNITS:
        cfg = base.replace(fuse_step=1, step_loop=2, step_flags=1, step_flag_units=units)
        if template.step_variant(cfg).shape.blocks <= sm_count and space.is_feasible(cfg):
            fused = cfg.replace(step_flag_input=1, **no_split)
            return fused if template.batch <= FUSED_INPUT_BATCH and space.is_feasible(fused) else cfg
    return None


def wgmma_input_config(template: Any, base: Config, space: Any) -> tuple[Config, str] | None:
    """``base`` with a 16-bit input GEMM on Hopper's wgmma as stored (``in_wgmma`` 1) where the
    template has a tile for it and layer 0's GEMM has ``WGMMA_MIN_FLOPS``, and the why's words;
    None where not (the GRU's and the 16-bit LSTM's)."""
    if template.in_wgmma_tile is None or template.input_gemm(0).flops() < WGMMA_MIN_FLOPS:
        return None
    cfg = base.replace(in_wgmma=1)  # float16 x and W_ih on Hopper
    if not space.is_feasible(cfg):
        return None
    return cfg, f"input GEMM: {template.x_dtype} on wgmma ({template.in_wgmma_tile.name}), W_ih read N-major"


def input_gemm_config(template: Any, base: Config, space: Any, sm_count: int,
                      any_size: bool = False) -> tuple[Config, str]:
    """``base`` with the float32 input GEMM split into float16 parts on the tensor cores where it
    is large enough to gain (``SPLIT_MIN_FLOPS``) or ``any_size`` (the stacked split step kernel's
    shapes), else with its large tile where that gives every SM a block (the GRU's, and the
    float32 LSTM's, which has only the split on TF32 parts)."""
    on_wgmma = wgmma_input_config(template, base, space)
    if on_wgmma is not None:
        return on_wgmma
    # CUDA with a float16 tile (elsewhere the split gains nothing); on Hopper TF32 parts on wgmma
    # (float32's range), else float16 parts on wgmma, else on the mma.sync tile
    tf32 = template.in_split_tf32
    wgmma, tile = getattr(template, "in_split_wgmma", None), getattr(template, "in_split_tensor_core", None)
    large = base.replace(**{"in_" + k: v for k, v in LARGE_GEMM_TILE.items()})  # what in_split 0 would run
    way = 3 if tf32 is not None else 2 if wgmma is not None else 1
    split = (large if space.is_feasible(large) else base).replace(in_split=way)
    large_enough = any_size or template.input_gemm(0).flops() >= SPLIT_MIN_FLOPS
    if (tf32 or wgmma or tile) is not None and large_enough and space.is_feasible(split):
        if way == 3:
            return split, f"input GEMM: float32 as TF32 parts on the tensor cores ({tf32.name})"
        label = wgmma.name if wgmma is not None else tile.label()
        return split, f"input GEMM: float32 as float16 parts on the tensor cores ({label})"
    return large_input_tile(template, base, space, sm_count)


def large_input_tile(template: Any, base: Config, space: Any, sm_count: int) -> tuple[Config, str]:
    """``base`` with the input GEMM on the CUDA cores' large tile (``LARGE_GEMM_TILE``) where
    that gives every SM a block (the GRU's, the LSTM's float32 GEMM), and the why's words."""
    gemm = template.input_gemm(0)
    tile_m = LARGE_GEMM_TILE["wg_y"] * LARGE_GEMM_TILE["task_y"]
    tile_n = LARGE_GEMM_TILE["wg_x"] * LARGE_GEMM_TILE["task_x"]
    if -(-gemm.m // tile_m) * -(-gemm.n // tile_n) < sm_count:
        return base, "input GEMM: the default tile"
    cfg = base.replace(**{"in_" + k: v for k, v in LARGE_GEMM_TILE.items()})
    if space.is_feasible(cfg):
        return cfg, f"input GEMM: the {tile_m}x{tile_n} tile"
    return base, "input GEMM: the default tile"


def many_rows_config(template: Any, base: Config, space: Any, sm_count: int,
                     extras: dict[str, int]) -> Config | None:
    """The fused step kernel for many rows (the GRU's, the LSTM's: ``schedules.lstm.pick``):
    blocks of 32 rows and the fewest units (``MANY_ROWS_UNITS``) whose grid fits one block per SM,
    256 threads (8 along the rows, 4 rows each; up to 8 along the units; the rest split k), h
    slices of 64 (32 where shared memory is short); else blocks of 8 units x all rows (8 rows per
    thread, up to 16 threads along the rows); None where neither is feasible."""
    rows = dict(step_b=4, step_bt=8)
    for units in MANY_ROWS_UNITS:
        threads_j = min(units, 8)
        cfg = base.replace(fuse_step=1, step_j=threads_j, step_u=units // threads_j, step_ks=32 // threads_j,
                           step_w_onchip=1, step_pipeline=1, **rows, **extras)
        if template.step_variant(cfg).blocks > sm_count:
            continue
        for step_k in (64, 32):
            if space.is_feasible(cfg.replace(step_k=step_k)):
                return cfg.replace(step_k=step_k)
    row_threads = 1
    while row_threads * 8 < template.batch and row_threads < 16:
        row_threads *= 2
    cfg = base.replace(fuse_step=1, step_j=8, step_b=8, step_bt=row_threads, step_k=64, step_ks=4,
                       step_w_onchip=1, step_pipeline=1, **extras)
    return cfg if space.is_feasible(cfg) else None
