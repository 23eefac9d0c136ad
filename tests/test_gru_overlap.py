"""The step kernel launched while the input GEMM runs (knob ``step_overlap``): the wgmma GEMM
lets the next kernel launch at its start and counts each tile row of gi it has stored; the
tensor-core step kernel, launched early (programmatic dependent launch), waits for a step's
tile rows before loading its gi.

- No GPU: the counting GEMM's CUDA and its refusals; its tile rows in order; the launch tag on
  the marked function's kernels only; the plan passing the counts from the init through the
  GEMM to the step kernel, and the step kernel's acquire loads; the space's refusals.
- ``-m gpu``: GRUs with and without the overlap against float64 on reruns and a second input.
"""
from __future__ import annotations


import dataclasses

import numpy as np
import pytest
from test_gru import Shape, _inputs, _weights
from test_wgmma_pdl import launch_params

from tvm_ext.core.errors import TvmExtError
from tvm_ext.precision.precision import relative_error
from tvm_ext.schedules.gemm.wgmma import WgmmaTile, in_row_order, row_order_tiles, wgmma_gemm
from tvm_ext.schedules.gemm.wgmma_layout import KernelLayout
from tvm_ext.schedules.gru import GRU, GruTemplate, gru_reference
from tvm_ext.target import offline_cuda

HALF = {name: "float16" for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}


def _template(batch: int, hidden: int, input: int | None = None, seq: int = 128, layers: int = 1,
              bidirectional: bool = False, precision: dict | None = None) -> GruTemplate:
    t = GruTemplate(batch=batch, hidden=hidden, input=input or hidden, seq=seq, layers=layers,
                    bidirectional=bidirectional)
    return t.with_precision(precision) if precision else t


def _source(func) -> str:
    import tvm

    target = tvm.target.Target(offline_cuda("sm_90a").tvm_target())
    return tvm.compile(tvm.IRModule({"main": func}), target=target).mod.imports[0].inspect_source()


@pytest.mark.parametrize("tile", [WgmmaTile(128, 64, 6, 1, True), WgmmaTile(128, 128, 4, 1, False, tiles=8, tma=True)])
def test_counting_gemm_launches_the_next_kernel_and_counts_its_tile_rows(tile):
    """``signal``: a fifth parameter ``ready`` of one int32 a tile row and their total; the kernel
    lets the next launch at its start, and after a tile's stores every thread fences and one adds
    1 to its tile row's count (``row0 / bm``) and to the total; without it none of that is in
    the source."""
    func = wgmma_gemm(tile, 1024, 1536, 512, c_dtype="float16", bias_dtype="float16", b_layout="KN", signal=True)
    assert func.params[-1].name == "ready" and tuple(int(x) for x in func.params[-1].shape) == (9,)
    src = _source(func)
    assert src.count("griddepcontrol.launch_dependents;") == 1
    body = src[src.index("__global__"):]
    assert body.count("atomicAdd((&(ready_ptr[") == 2  # once a tile into its tile row's count, once into the total
    assert "atomicAdd((&(ready_ptr[8])), 1)" in body
    assert body.index("__threadfence()") < body.index("atomicAdd")
    plain = _source(wgmma_gemm(tile, 1024, 1536, 512, c_dtype="float16", bias_dtype="float16", b_layout="KN"))
    assert "griddepcontrol" not in plain and "atomicAdd" not in plain


@pytest.mark.parametrize("tile, kwargs, reason", [
    (WgmmaTile(128, 64, 6, 1, False, split=2), {"bias_dtype": "float16"}, "K unsplit or split in a cluster"),
    (WgmmaTile(128, 64, 6, 1, True), {}, "one matrix with a bias"),
])
def test_counting_gemm_refusals(tile, kwargs, reason):
    with pytest.raises(TvmExtError, match=reason):
        wgmma_gemm(tile, 1024, 1536, 512, c_dtype="float16", signal=True, **kwargs)


@pytest.mark.parametrize("m, n, bm, bn", [(1024, 1536, 128, 64), (2048, 1536, 128, 128), (1280, 768, 64, 128)])
def test_tiles_in_row_order_finish_tile_rows_in_turn(m, n, bm, bn):
    """A block's k-th tile is in a later tile row than its (k-1)-th, and every block's k-th tile
    is in the same band of tile rows: tile row r is stored in the (r // g)-th round of the blocks."""
    base = WgmmaTile(bm, bn, 4, 1, False, raster=8, tiles=2)
    tiles = row_order_tiles(base, m, n, max_blocks=68)  # the SMs a 64-block step kernel leaves of 132
    tile = in_row_order(base, m, n, 512, tiles)
    assert tile.raster == 0 and tile.tiles == tiles > 1 and n // bn * (-(-m // bm) // tiles) <= 68
    L = KernelLayout.of(tile, m, n, 512, "NK", (), True, 0, signal=True)
    rounds = [[int(L.tile_row0(b + t * L.grid)) // bm for b in range(L.grid)] for t in range(tile.tiles)]
    groups = L.grid // (n // bn)
    assert all(rounds[t] == [t * groups + b // (n // bn) for b in range(L.grid)] for t in range(tile.tiles))
    assert L.signals_per_row == n // bn


def test_tiles_dividing_all_tiles_but_not_the_rows_still_store_bands_in_row_order():
    """float32 B7 H512's counted GEMM (896 x 1536, 64x32 tiles: 14 tile rows of 48): no count
    dividing 14 fits the 68 SMs left, 12 a block divides the 672 tiles (56 blocks); round t of the
    grid stores tiles [56t, 56t + 56), so every tile row is done before a later round's."""
    m, n, bm, bn = 896, 1536, 64, 32
    base = WgmmaTile(bm, bn, 6, 1, False, tiles=2)
    tiles = row_order_tiles(base, m, n, max_blocks=68)
    tile = in_row_order(base, m, n, 512, tiles)
    L = KernelLayout.of(tile, m, n, 512, "NK", (), True, 0, signal=True)
    assert (tiles, L.grid) == (12, 56) and (m // bm) % tiles and L.units == L.grid * tiles
    rows = [sorted(int(L.tile_row0(b + t * L.grid)) // bm for b in range(L.grid)) for t in range(tiles)]
    assert all(rows[t][-1] <= rows[t + 1][0] for t in range(tiles - 1))
    assert row_order_tiles(base, 1024, n, max_blocks=68) == 16  # 16 tile rows: a dividing count first


@pytest.mark.parametrize("batch, precision, tiles", [(4, None, 8), (5, None, 8), (7, None, 12), (5, HALF, 2),
                                                     (7, HALF, 3)])
def test_pick_counts_the_input_gemm_beside_the_step_kernel_at_batch_4_to_7(batch, precision, tiles):
    """float32 B4-B7 H512 (the stacked split kernel) run the input GEMM as TF32 parts counted beside
    the step kernel, B4 below the split's flop floor and B5 / B7 with tiles a block that divide the
    GEMM's tiles and not its tile rows; float16 B5 / B7 count their wgmma GEMM the same way
    (measured 3-24 % faster than the picks before, docs/results/gru.md)."""
    target = offline_cuda()
    t = _template(batch, 512, precision=precision).with_tensor_cores(target)
    pick = t.analytic_pick(target)[0]
    assert pick.step_overlap == tiles and pick.in_split == (3 if precision is None else 0)
    assert t.space(target).infeasible_reason(pick) is None


@pytest.mark.parametrize("batch, bidirectional, tiles", [(128, False, 32), (64, True, 32), (96, False, 0),
                                                         (32, False, 8)])
def test_pick_counts_an_input_gemm_of_many_tile_rows_where_it_keeps_36_blocks(batch, bidirectional, tiles):
    """float16 H768: the tensor-core step kernel's 96 blocks leave 36 SMs, too few for the GEMM's
    tile rows at 16 tiles a block; at 32 its 36 blocks run beside them (B128 and bidirectional B64:
    3 % / 7 % faster), not where that leaves it 27 (B96: 20 % slower); B32's fit 16 (8 a block)."""
    target = offline_cuda()
    t = _template(batch, 768, bidirectional=bidirectional, precision=HALF).with_tensor_cores(target)
    pick, why = t.analytic_pick(target)
    assert why.startswith("tensor-core persistent step") and pick.step_overlap == tiles
    if tiles:
        assert "its 36 blocks" in why and "beside the step kernel's 96" in why
        assert t.space(target).infeasible_reason(pick) is None


@pytest.mark.parametrize("batch, dtype, units, counted", [(8, "float16", 16, True), (8, "bfloat16", 16, True),
                                                        (16, "float16", 8, False), (4, "float16", 8, False)])
def test_pick_widens_8_unit_blocks_to_count_the_input_gemm_beside_them_at_batch_8(batch, dtype, units, counted):
    """16-bit H1024: 128 blocks of 8 units leave no SMs for a counted GEMM; at batch 8 the pick
    takes 16 units a block with the same warps and counts the GEMM beside their 64 blocks (2-3 %
    faster); at B4, B16 and bidirectional B8 H512 the wider blocks cost more than the GEMM they hide."""
    target = offline_cuda()
    t = _template(batch, 1024, precision={name: dtype for name in HALF}).with_tensor_cores(target)
    pick, why = t.analytic_pick(target)
    assert (pick.step_j, bool(pick.step_overlap)) == (units, counted)
    assert pick.step_tc_kw == 8 and t.space(target).infeasible_reason(pick) is None
    if counted:
        assert t.step_variant(pick).shape.blocks == 64 and "beside the step kernel's 64" in why
    both = _template(8, 512, bidirectional=True, precision={name: dtype for name in HALF}).with_tensor_cores(target)
    assert (both.analytic_pick(target)[0].step_j, both.analytic_pick(target)[0].step_overlap) == (8, 0)


def test_tile_rows_from_both_ends_put_the_last_rows_among_the_first_stored():
    """``ends`` 2 (a bidirectional GRU's counted GEMM): tile rows in order 0, R-1, 1, R-2, ...,
    each once, so after round t both the first rows (forward) and the last (reverse) are done;
    ``ends`` 1 keeps the plain row order."""
    m, n, bm, bn = 2048, 1536, 128, 32  # float32 bidirectional B16 H256: 16 tile rows of 48
    base = WgmmaTile(bm, bn, 6, 1, False)
    for ends in (1, 2):
        tile = in_row_order(base, m, n, 512, 16, ends=ends)
        L = KernelLayout.of(tile, m, n, 512, "NK", (), True, 0, signal=True)
        order = [int(L.tile_row0(r * (n // bn))) // bm for r in range(m // bm)]
        assert sorted(order) == list(range(m // bm))
        assert order[:4] == ([0, 15, 1, 14] if ends == 2 else [0, 1, 2, 3])
        assert all(int(L.tile_row0(r * (n // bn) + c)) == order[r] * bm for r in range(m // bm) for c in (1, 47))
    assert "ends" in in_row_order(base, m, n, 512, 16, ends=2).name


@pytest.mark.parametrize("batch, hidden, precision, overlapped", [(8, 256, HALF, True), (16, 256, HALF, True),
                                                                  (16, 256, None, False), (8, 512, HALF, False)])
def test_pick_counts_a_bidirectional_input_gemm_from_both_ends_where_sms_are_left(batch, hidden, precision,
                                                                                  overlapped):
    """16-bit, both directions' step blocks (64 at H256, 128 at H512) beside the counted GEMM's
    where they fit: its tile rows from both ends, so the reverse direction's first steps do not
    wait for the whole GEMM; float32 input on TF32 parts measured slower so, not counted."""
    target = offline_cuda()
    t = _template(batch, hidden, bidirectional=True, precision=precision).with_tensor_cores(target)
    pick, why = t.analytic_pick(target)
    assert bool(pick.step_overlap) == overlapped
    if overlapped:
        assert t.counted_gemm_tile(pick).ends == 2 and "tile rows from both ends" in why
        assert t.space(target).infeasible_reason(pick) is None


def test_launch_early_tags_the_marked_functions_kernels_only():
    import tvm
    from tvm.script import tirx as T

    from tvm_ext.lowering.launch_early import LAUNCH_TAG, mark_launch_early

    @T.prim_func
    def early(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i in T.thread_binding(64, "threadIdx.x"):
            b[i] = a[i] + T.float32(1)

    @T.prim_func
    def plain(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i in T.thread_binding(64, "threadIdx.x"):
            b[i] = a[i] + T.float32(2)

    mod = tvm.IRModule({"early": mark_launch_early(early.with_attr("global_symbol", "early")),
                        "plain": plain.with_attr("global_symbol", "plain")})
    assert launch_params(mod) == {"early_kernel": ["threadIdx.x", LAUNCH_TAG], "plain_kernel": ["threadIdx.x"]}


@pytest.mark.parametrize("precision, knobs", [(HALF, {"in_wgmma": 1}), (None, {"in_split": 2}),
                                              (None, {"in_split": 3})])
def test_plan_passes_the_counts_from_init_through_gemm_to_the_step_kernel(precision, knobs):
    """float16 on wgmma, float32 on wgmma of float16 or TF32 parts: the init zeroes ``gi_ready``
    (one int32 a tile row of the GEMM), the GEMM counts into it, the step kernel (launched early)
    polls it with acquire loads and reads gi from L2; the GEMM's tile runs its tile rows in turn."""
    target = offline_cuda()
    t = _template(8, 512, precision=precision).with_tensor_cores(target)
    cfg = t.analytic_pick(target)[0].replace(step_overlap=4, **knobs)
    assert t.space(target).infeasible_reason(cfg) is None
    tile = t.counted_gemm_tile(cfg)
    assert tile.raster == 0 and tile.tiles == 4
    rows = 128 * 8 // tile.bm
    assert t.for_config(cfg).buffers()["gi_ready"].shape == (rows + 1,)  # and the total
    assert "gi_ready" not in t.for_config(cfg.replace(step_overlap=0)).buffers()
    compiled = t.compile(cfg, target)
    counted = {c.func: c.args for c in compiled.calls if "gi_ready" in c.args}
    assert set(counted) == {"gru_init", "gru_gemm_x0", "gru_steps"}
    assert counted["gru_gemm_x0"][-1] == "gi_ready" and counted["gru_steps"][-1] == "gi_ready"
    steps = compiled.source[compiled.source.index("gru_steps_kernel("):]
    # before step 0's gi and before each next step's: the total, then the first and last rows' counts
    assert steps.count("__nv_atomic_load_n((&(ready_ptr[") == 2 * 2 * 2 and "__ldcg(" in steps
    assert t.step_variant(cfg).gi_ready == (tile.bm, 3 * 512 // tile.bn)


@pytest.mark.parametrize("batch, knobs, reason", [
    (8, {"step_overlap": 1, "in_wgmma": 0}, "needs the input GEMM on wgmma"),
    (7, {"step_overlap": 16, "in_wgmma": 1}, "16 tiles a block must divide its 7 tile rows of 128 or all its 168"),
    (2, {"step_overlap": 1, "fuse_step": 1, "step_loop": 2, "step_tc": 0, "step_flags": 1, "in_wgmma": 1},
     "tensor-core step kernel's with exchange words"),
])
def test_space_refuses_overlap_with_the_reason(batch, knobs, reason):
    target = offline_cuda()
    t = _template(batch, 512, precision=HALF).with_tensor_cores(target)
    cfg = t.analytic_pick(target)[0].replace(**knobs)
    assert reason in t.space(target).infeasible_reason(cfg)


def test_space_refuses_overlap_where_a_later_layers_gemm_cannot_take_the_counted_tile():
    """One counted tile runs every layer's input GEMM: a tile whose pipeline would load past the
    later layers' short K (128 from 1024 inputs: 2 k tiles against 6 loaded ahead) is refused with
    that GEMM's reason, not only checked at layer 0's depth."""
    import dataclasses

    target = offline_cuda()
    t = dataclasses.replace(_template(8, 128, input=1024, layers=2, precision=HALF).with_tensor_cores(target),
                            in_wgmma_tile=WgmmaTile(128, 64, 8, 1, True, 0))
    cfg = t.analytic_pick(target)[0].replace(step_overlap=1, in_wgmma=1, step_tc=1, step_flags=1)
    reason = t.space(target).infeasible_reason(cfg)
    assert reason is not None and "past K's 2" in reason, reason
    short = dataclasses.replace(t, input=128)  # every layer's depth 128: the same reason at layer 0
    assert "past K's 2" in (short.space(target).infeasible_reason(cfg) or "")


def test_narrowed_counted_tile_stores_the_first_tile_rows_from_more_blocks():
    """``step_overlap_bn``: the counted GEMM's tile of 32 columns, 16 tiles a block, so its 48
    blocks store one tile row a band (the first steps' rows first) instead of four; the step
    kernel waits for as many counts a tile row as the narrowed GEMM has columns of tiles; the
    knob alone, or no narrower than the GEMM's own tile, is refused."""
    target = offline_cuda()
    t = _template(8, 512).with_tensor_cores(target)
    space = t.space(target)
    wide = t.analytic_pick(target)[0].replace(step_overlap=4, step_overlap_bn=0)
    narrow = wide.replace(step_overlap=16, step_overlap_bn=32)
    assert space.infeasible_reason(wide) is None and space.infeasible_reason(narrow) is None
    own, tile = t.counted_gemm_tile(wide), t.counted_gemm_tile(narrow)
    assert (tile.bm, tile.bn, tile.tiles) == (own.bm, 32, 16) and own.bn == 128
    assert t.step_variant(narrow).gi_ready == (tile.bm, 3 * 512 // 32)
    m, n = t.gi_shape
    assert n // tile.bn * (m // tile.bm // tile.tiles) == 48  # the bands of one tile row each
    compiled = t.compile(narrow, target)
    gemm = compiled.source[compiled.source.index("gru_gemm_x0_kernel("):]
    assert "atomicAdd((&(ready_ptr[" in gemm
    assert "step_overlap > 0" in space.infeasible_reason(narrow.replace(step_overlap=0))
    assert "step_overlap > 0" in space.infeasible_reason(wide.replace(step_overlap=0, step_overlap_tma=1))
    assert "must narrow" in space.infeasible_reason(wide.replace(step_overlap_bn=128))


def test_deeper_counted_pipeline_loads_further_ahead_and_is_refused_where_it_changes_nothing():
    """``step_overlap_stages``: the counted GEMM's tile with more stages (its loads issued further
    ahead of the k steps that read them) and a kernel of its own; a depth no deeper than the
    tile's own, the knob without the overlap, and stages past a block's shared memory are refused."""
    target = offline_cuda()
    t = _template(8, 512).with_tensor_cores(target)
    space = t.space(target)
    pick = t.analytic_pick(target)[0]
    deep = pick.replace(step_overlap_stages=12)
    assert space.infeasible_reason(deep) is None
    own, tile = t.counted_gemm_tile(pick), t.counted_gemm_tile(deep)
    assert own.stages < 12 and tile == dataclasses.replace(own, stages=12)
    waits = [f"cp.async.wait_group {s.stages - 3};" for s in (own, tile)]  # loads in flight past a k step's
    assert waits[0] in t.compile(pick, target).source and waits[1] in t.compile(deep, target).source
    deep_own = dataclasses.replace(t, in_split_tf32=dataclasses.replace(t.in_split_tf32, stages=12))
    assert "must deepen" in deep_own.space(target).infeasible_reason(deep)
    assert "step_overlap > 0" in space.infeasible_reason(deep.replace(step_overlap=0, step_overlap_bn=0))
    wide = pick.replace(step_overlap=4, step_overlap_bn=0, step_overlap_stages=16)  # 128 columns: 384 KiB
    assert "shared memory" in space.infeasible_reason(wide)


def test_pick_deepens_a_counted_pipeline_that_loads_fewer_than_four_k_steps_ahead():
    """float32 B16 H512's counted TF32 tile (128 rows, 4 stages: 2 k steps ahead) runs on 8 stages;
    B8's (64 rows, 6 stages: 4 ahead) keeps its own."""
    target = offline_cuda()
    b16 = _template(16, 512).with_tensor_cores(target)
    cfg, why = b16.analytic_pick(target)
    assert (cfg.step_overlap_stages, b16.counted_gemm_tile(cfg).stages) == (8, 8) and "8 stages for its 4" in why
    b8 = _template(8, 512).with_tensor_cores(target)
    cfg, why = b8.analytic_pick(target)
    assert cfg.step_overlap_stages == 0 and b8.counted_gemm_tile(cfg).stages == 6 and "stages for its" not in why


def test_pick_narrows_the_counted_tile_of_tf32_parts_only():
    """The pick's counted GEMM on TF32 parts (48 k steps deep at K 512: a tile's time is its
    latency) takes 32 columns and the tiles a block that fit the SMs the step kernel leaves; a
    float16 GEMM (8 k steps) keeps its own tile."""
    target = offline_cuda()
    t = _template(8, 512).with_tensor_cores(target)
    cfg, why = t.analytic_pick(target)
    assert (cfg.in_split, cfg.step_overlap_bn, cfg.step_overlap) == (3, 32, 16)
    assert "columns narrowed" in why
    half = _template(8, 512, precision=HALF).with_tensor_cores(target)
    cfg, why = half.analytic_pick(target)
    assert cfg.step_overlap and not cfg.step_overlap_bn and "narrowed" not in why


def test_space_refuses_overlap_with_variable_lengths():
    import dataclasses

    target = offline_cuda()
    t = dataclasses.replace(_template(8, 512, precision=HALF), variable_lengths=True).with_tensor_cores(target)
    cfg = t.analytic_pick(target)[0].replace(step_overlap=1, in_wgmma=1, step_tc=1, step_flags=1)
    assert "variable lengths" in t.space(target).infeasible_reason(cfg)


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
GPU_CASES = {"fp16-b8-h512": (Shape(seq=128, batch=8, input=512, hidden=512), HALF, {"in_wgmma": 1}, 4),
             "fp16-b6-h256-2layer-bi": (Shape(seq=64, batch=6, input=128, hidden=256, layers=2, bidirectional=True),
                                        HALF, {"in_wgmma": 1}, 3),
             "fp32-b8-h512-tf32": (Shape(seq=128, batch=8, input=512, hidden=512), None,
                                   {"in_split": 3, "step_overlap_bn": 0}, 4),
             "fp32-b8-h512-tf32-narrow": (Shape(seq=128, batch=8, input=512, hidden=512), None,
                                          {"in_split": 3, "step_overlap_bn": 32}, 16),
             "fp32-b16-h256-halves": (Shape(seq=64, batch=16, input=256, hidden=256), None, {"in_split": 2}, 1),
             # the counted pipeline deepened (the pick's at B16); sums promoted every 2 k steps in two sets
             "fp32-b16-h512-tf32-deep": (Shape(seq=128, batch=16, input=512, hidden=512), None,
                                         {"in_split": 3, "step_overlap_bn": 32, "step_overlap_stages": 8}, 16),
             "fp32-b8-h512-tf32-promote2": (Shape(seq=128, batch=8, input=512, hidden=512), None,
                                            {"in_split": 3, "step_overlap_bn": 32, "in_tf32_promote": 2}, 16),
             # layers whose input GEMMs differ in depth (64, then 256; 1024, then 256), each counted
             "fp16-b8-h256-i64-3layer": (Shape(seq=64, batch=8, input=64, hidden=256, layers=3), HALF,
                                         {"in_wgmma": 1}, 2),
             "fp32-b8-h256-i1024-2layer-tf32": (Shape(seq=64, batch=8, input=1024, hidden=256, layers=2), None,
                                                {"in_split": 3, "step_overlap_bn": 0}, 2),
             "fp32-b8-h256-i1024-2layer-tf32-narrow": (Shape(seq=64, batch=8, input=1024, hidden=256, layers=2),
                                                       None, {"in_split": 3, "step_overlap_bn": 32}, 8),
             # 8-unit blocks widened to 16 so the GEMM is counted beside them (the pick's)
             "fp16-b8-h1024-16units": (Shape(seq=128, batch=8, input=1024, hidden=1024), HALF,
                                       {"in_wgmma": 1, "step_j": 16}, 4),
             # both directions beside the counted GEMM, its tile rows from both ends (not the pick's)
             "fp32-b16-h256-bi-tf32-ends": (Shape(seq=128, batch=16, input=256, hidden=256, bidirectional=True),
                                            None, {"in_split": 3, "step_overlap_bn": 32, "step_overlap_stages": 8},
                                            16)}


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(GPU_CASES))
def test_cuda_overlapped_steps_match_float64(key):
    """The pick with its step kernel launched while the input GEMM runs, against float64 on
    three calls and a second input, and against the same config without the overlap."""
    s, precision, knobs, tiles = GPU_CASES[key]
    common = dict(num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch, seq=s.seq,
                  **({"precision": precision} if precision else {}))
    pick = GRU.build("cuda", s.input, s.hidden, **common).config.replace(step_tc=pick_tc(precision), step_flags=1,
                                                                        **knobs)
    gru = GRU.build("cuda", s.input, s.hidden, config=pick.replace(step_overlap=tiles), **common)
    gru = gru.load_numpy(_weights(s))
    plain = GRU.build("cuda", s.input, s.hidden, config=pick.replace(step_overlap=0, step_overlap_bn=0,
                                                                     step_overlap_stages=0),
                      **common).load_numpy(_weights(s))
    bound = 5e-3 if precision else 1e-5
    for seed in (1, 2):
        x, h0 = _inputs(s, seed)
        ref = gru_reference(x, _weights(s), h0, s.layers, s.bidirectional)
        errors = [relative_error(list(gru(x, h0)), ref) for _ in range(3)]
        assert max(errors) < bound, errors
        assert relative_error(list(plain(x, h0)), ref) < bound
        assert np.array_equal(gru(x, h0)[0], plain(x, h0)[0])  # the same sums in the same order


def pick_tc(precision: dict | None) -> int:
    return 1 if precision else 2
