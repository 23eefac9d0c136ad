"""A float32 GRU's unfused steps on TF32 parts (``hid_wgmma`` 1 with ``hid_cell``, float32 h and
W_hh): W_hh's parts with their rows in tile order and h0's parts, run on PoCL against numpy; the
step kernel's source and plan; the space's refusals; ``-m gpu`` runs against float64."""
from __future__ import annotations

import re

import numpy as np
import pytest
from gru_checks import assert_reruns_match_float64
from test_gru import Shape, _inputs, _weights

from tvm_ext.schedules.gemm.gemm_3xtf32 import tf32_parts
from tvm_ext.schedules.gru import GRU, GruTemplate
from tvm_ext.schedules.gru.cell_epilogue import split_hidden_weight_func, split_state_func, tile_row
from tvm_ext.target import offline_cuda

TF32_CELL = {"fuse_step": 0, "hid_wgmma": 1, "hid_cell": 1}


def _template(batch: int, hidden: int, bidirectional: bool = False, layers: int = 1) -> GruTemplate:
    t = GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=5, bidirectional=bidirectional, layers=layers)
    return t.with_tensor_cores(offline_cuda("sm_90"))


def test_tile_rows_hold_each_tiles_32_units_r_z_n_in_turn():
    """Tile t's 96 rows are W_hh's columns of units 32t..32t+31 of r, then z, then n."""
    hidden = 512
    rows = [tile_row(c, hidden) for c in range(3 * hidden)]
    assert sorted(rows) == list(range(3 * hidden))  # a permutation
    tile = 3  # units 96..127
    assert [rows[c] for c in (96, 127, hidden + 96, hidden + 127, 2 * hidden + 96, 2 * hidden + 127)] == \
        [tile * 96 + i for i in (0, 31, 32, 63, 64, 95)]


def test_tile_rows_of_24_unit_tiles_hold_their_units_r_z_n_in_turn():
    """hid_cell_units 24: tile t's 72 rows are W_hh's columns of units 24t..24t+23 of r, z, n."""
    hidden = 768
    rows = [tile_row(c, hidden, 24) for c in range(3 * hidden)]
    assert sorted(rows) == list(range(3 * hidden))
    tile = 5  # units 120..143
    assert [rows[c] for c in (120, 143, hidden + 120, hidden + 143, 2 * hidden + 120, 2 * hidden + 143)] == \
        [tile * 72 + i for i in (0, 23, 24, 47, 48, 71)]


@pytest.mark.parametrize("hidden, units", [(64, 32), (96, 24)])
def test_w_hh_and_h_parts_on_opencl(opencl, hidden, units):
    """W_hh (dirs, H, 3H) -> (dirs, 3H, 2H): row ``tile_row(c)`` holds column c's [hi | lo] TF32
    parts along K; h (dirs, B, H) -> (dirs, B, 2H) as [lo | hi]; values beyond float16's range
    split as exactly (both directions, H = 64: two tiles of 32 units; H = 96: four of 24)."""
    from opencl_calls import run_calls

    dirs, batch = 2, 3
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((dirs, hidden, 3 * hidden)) * 0.1).astype(np.float32)
    w[1, 0, :2] = (1e30, -3e-30)
    h = rng.uniform(-1, 1, (dirs, batch, hidden)).astype(np.float32)
    funcs = {"split_w": split_hidden_weight_func(hidden, dirs, units=units),
             "split_h": split_state_func(dirs, batch, hidden)}
    out = run_calls(opencl, funcs, [("split_w", ("w", "wh")), ("split_h", ("h", "q"))], {"w": w, "h": h},
                    {"wh": (dirs, 3 * hidden, 2 * hidden), "q": (dirs, batch, 2 * hidden)})
    order = [tile_row(c, hidden, units) for c in range(3 * hidden)]
    for d in range(dirs):
        hi, lo = tf32_parts(w[d].T.copy())  # (3H, H): column c of W_hh as row c
        expect = np.empty((3 * hidden, 2 * hidden), np.float32)
        expect[order] = np.concatenate([hi, lo], axis=1)
        assert np.array_equal(out["wh"][d], expect)
    h_hi, h_lo = tf32_parts(h.reshape(-1, hidden))
    assert np.array_equal(out["q"].reshape(-1, 2 * hidden), np.concatenate([h_lo, h_hi], axis=1))


def test_k_steps_read_the_stored_parts_in_turn():
    """k step j reads k tile j // 3 of A's part (lo, hi, hi)[j % 3] and B's (hi, lo, hi)[j % 3],
    the parts side by side (A (m, 2K'), Bt (n, 2K')), across both slices of a split K."""
    from tvm.sym.analyzer import Analyzer
    from tvm import tirx

    from tvm_ext.schedules.gemm.wgmma import WgmmaTile
    from tvm_ext.schedules.gemm.wgmma_layout import KernelLayout
    from tvm_ext.schedules.gru.cell_epilogue import TF32_K_PARTS

    tile = WgmmaTile(64, 96, 8, smem_epilogue=False, operand="tf32", tma=True, split=2, cluster=True)
    part = 256  # H: each part 256 deep, 8 k tiles of 32
    layout = KernelLayout.of(tile, 64, 768, 3 * part, "NK", (2,), True, 4, k_parts=TF32_K_PARTS)
    assert layout.a_shape == (2, 64, 2 * part) and layout.bt_shape == (2, 768, 2 * part)
    simplify = Analyzer().simplify
    at = [[int(simplify(layout.k_coordinate(tirx.const(j, "int32"), op))) for j in range(24)] for op in (0, 1)]
    assert at[0][:6] == [0, part, part, 32, part + 32, part + 32]  # A: lo, hi, hi of each k tile
    assert at[1][:6] == [0, part, 0, 32, part + 32, 32]  # B: hi, lo, hi
    assert at[0][21:] == [224, part + 224, part + 224]  # the last k tile, in the second slice


def _kernel_source(source: str, name: str) -> str:
    body = source[re.search(name + r"_kernel\([^)]*\) \{", source).end():]
    return body[:body.index("\n}\n")]


@pytest.mark.parametrize("cell", [1, 2])
def test_float32_step_is_one_tf32_wgmma_kernel_writing_the_next_steps_parts(cell):
    """The step kernel multiplies TF32 (m64n96k8) on h's parts, promotes its sums and writes h' and
    its two parts; the plan splits W_hh once (prepared) and h0 each layer, the parts ping-pong."""
    t = _template(64, 512, bidirectional=True, layers=2)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**{**TF32_CELL, "hid_cell": cell})
    assert t.space(target).infeasible_reason(cfg) is None
    compiled = t.compile(cfg, target)
    kernel = _kernel_source(compiled.source, "gru_gemm_cell")
    assert "wgmma_tf32_ss_mma_async_sync_aligned_m64n96k8_f32_tf32_tf32" in kernel
    assert kernel.count("A_out_ptr[") == 2 * kernel.count("h_out_ptr[") > 0  # each h' as [lo | hi]
    assert [c.func for c in compiled.prepare if c.func != "gru_split_w0"] == ["gru_split_wh", "gru_split_wh"]
    assert [c.args for c in compiled.prepare if c.func == "gru_split_wh"] == [("w_hh0", "wh0"), ("w_hh1", "wh1")]
    steps = [c for c in compiled.calls if c.func in ("gru_split_h", "gru_gemm_cell")]
    assert steps[0].args == ("p0", "q0") and steps[6].args == ("p0", "q0")  # each layer: h0's parts
    first, second = steps[1].args, steps[2].args
    assert (first[0], first[1], first[-1], second[0], second[-1]) == ("q0", "wh0", "q1", "q1", "q0")
    specs = t.for_config(cfg).buffers()
    assert specs["wh1"].shape == (2, 1536, 1024) and specs["q0"].shape == (2, 64, 1024)


def test_float32_hidden_gemm_on_wgmma_needs_the_cell_in_its_store():
    t = _template(64, 512)
    target = offline_cuda("sm_90")
    reason = t.space(target).infeasible_reason(t.default_config(target).replace(**{**TF32_CELL, "hid_cell": 0}))
    assert reason is not None and "cell in its store" in reason
    ampere = GruTemplate(batch=64, hidden=512, input=512, seq=5).with_tensor_cores(offline_cuda("sm_80"))
    assert ampere.hid_tf32_tile is None and "hid_tf32" not in ampere.params
    reason = ampere.space(offline_cuda("sm_80")).infeasible_reason(
        ampere.default_config(offline_cuda("sm_80")).replace(**TF32_CELL))
    assert reason is not None and "runs the cell in the store of the hidden GEMM on wgmma" in reason


def test_records_name_the_tf32_tile_and_load_it_back():
    """The tile is part of a float32 GRU's workload key on Hopper and comes back from a record's
    params (what show and export rebuild the template from)."""
    from tvm_ext.operators import _gru_args

    t = _template(64, 512)
    assert t.params["hid_tf32"] == t.hid_tf32_tile.name
    assert GruTemplate(**_gru_args(t.params)) == t
    half = _template(64, 512).with_precision({n: "float16" for n in ("x", "w_ih", "gi", "w_hh", "h", "out")})
    assert half.with_tensor_cores(offline_cuda("sm_90")).hid_tf32_tile is None


@pytest.mark.parametrize("batch, hidden, bidirectional, cell", [
    (64, 2048, False, 2), (64, 1536, False, 2),  # 64 or 48 tiles: K in halves, a cluster's two blocks
    (128, 2048, False, 3), (256, 1024, False, 3),  # 128-row tiles, K in halves
    (32, 2048, False, 2), (96, 2048, False, 3),  # K in halves over the lone ragged row tile (64 or 128 rows)
    (192, 1024, False, 1), (64, 2048, True, 1),  # 128-row tiles' halves past one ragged tile row: 64-row tiles;
    # 128 tiles of both directions
    (192, 1536, False, 5), (160, 2048, False, 5), (192, 1024, True, 5),  # one row of 192-row tiles' halves
    (128, 1024, False, 0), (64, 1024, False, 0),  # the split step kernel's grid is resident (faster there)
    (16, 2048, False, 0),  # below batch 32: not measured, the CUDA-core kernel stays
])
def test_float32_pick_runs_tf32_parts_where_no_split_step_grid_is_resident(batch, hidden, bidirectional, cell):
    target = offline_cuda("sm_90")
    t = GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=128, bidirectional=bidirectional)
    cfg, why = t.with_tensor_cores(target).analytic_pick(target)
    assert cfg.hid_cell == cell and (cfg.fuse_step == 0) == (cell > 0), why
    assert ("h and W_hh as TF32 parts" in why) == (cell > 0)


GPU_SHAPES = {
    # both directions (each its own bias row), two layers, 70 rows: the last 64-row tile guarded
    "b70-h512-2layer-bi": (Shape(seq=5, batch=70, input=64, hidden=512, layers=2, bidirectional=True), 1),
    "b64-h512-2layer-bi-split": (Shape(seq=5, batch=64, input=64, hidden=512, layers=2, bidirectional=True), 2),
    "b64-h2048": (Shape(seq=4, batch=64, input=96, hidden=2048), 1),
    "b64-h2048-split": (Shape(seq=4, batch=64, input=96, hidden=2048), 2),
    "b128-h512-2layer-bi-tall": (Shape(seq=5, batch=128, input=64, hidden=512, layers=2, bidirectional=True), 3),
    # K split in a cluster with the last row tile ragged (64 and 128 rows), both directions
    "b40-h512-2layer-bi-split": (Shape(seq=5, batch=40, input=64, hidden=512, layers=2, bidirectional=True), 2),
    "b96-h512-bi-tall": (Shape(seq=5, batch=96, input=64, hidden=512, bidirectional=True), 3),
    # 192-row tiles with K in halves, the last rows ragged (160 of 192), two layers, both directions
    "b160-h512-2layer-bi-192": (Shape(seq=5, batch=160, input=64, hidden=512, layers=2, bidirectional=True), 5),
    # 24-unit tiles (hid_cell_units): K split over a ragged 64-row tile, two layers, both directions;
    # 128-row tiles with K in halves
    "b40-h768-2layer-bi-split-u24": (Shape(seq=5, batch=40, input=64, hidden=768, layers=2, bidirectional=True),
                                     {"hid_cell": 2, "hid_cell_units": 24}),
    "b128-h1536-tall-u24": (Shape(seq=4, batch=128, input=96, hidden=1536), {"hid_cell": 3, "hid_cell_units": 24}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(GPU_SHAPES))
def test_cuda_float32_cell_on_tf32_parts_matches_float64(key):
    s, cell = GPU_SHAPES[key]
    knobs = cell if isinstance(cell, dict) else {"hid_cell": cell}
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch,
                    seq=s.seq, config={**TF32_CELL, **knobs}).load_numpy(_weights(s))
    x, h0 = _inputs(s)
    assert_reruns_match_float64(gru, s, x, h0, 2e-6, 1e-6)
    assert_reruns_match_float64(gru, s, x[::-1].copy(), -h0, 2e-6, 1e-6, reruns=1)


@pytest.mark.gpu
def test_cuda_float32_cell_on_tf32_parts_with_lengths():
    """Rows past their length hold their state through the TF32 parts too (gi held, h' = h and its
    parts rewritten exactly), two layers, both directions."""
    from tvm_ext.precision.precision import relative_error
    from tvm_ext.schedules.gru import gru_reference

    s = Shape(seq=9, batch=64, input=48, hidden=512, layers=2, bidirectional=True)
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=2, bidirectional=True, batch=s.batch, seq=s.seq,
                    config=TF32_CELL, variable_lengths=True).load_numpy(_weights(s))
    x, h0 = _inputs(s)
    lengths = np.random.default_rng(2).integers(1, s.seq + 1, s.batch)
    out, h_n = gru(x, h0, lengths=lengths)
    ref_out, ref_h = gru_reference(x, _weights(s), h0, 2, True, lengths=lengths)
    assert relative_error(out, ref_out) < 2e-6 and relative_error(h_n, ref_h) < 2e-6
    assert not out[lengths.min():, lengths.argmin()].any()
