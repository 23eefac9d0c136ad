"""The unfused GRU steps' hidden GEMM on Hopper's wgmma (``hid_wgmma``): the pick where no
tensor-core step kernel's grid is resident, the kernel it builds (a bias row a direction,
launched early behind the step before), the space's refusals, the records' key, and ``-m gpu``
runs against float64."""
from __future__ import annotations

import re

import pytest
from gru_checks import assert_reruns_match_float64
from test_gru import Shape, _inputs, _weights

from tvm_ext.core.errors import TvmExtError
from tvm_ext.operators import _gru_args
from tvm_ext.schedules.gemm.wgmma import WgmmaTile, wgmma_gemm
from tvm_ext.schedules.gru import GRU, GruTemplate
from tvm_ext.target import offline_cuda

HALF = {name: "float16" for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}
BF16 = {name: "bfloat16" for name in HALF}
UNFUSED_ON_WGMMA = {"fuse_step": 0, "hid_wgmma": 1}


def _template(batch: int, hidden: int, bidirectional: bool = False, precision: dict | None = HALF,
              seq: int = 5) -> GruTemplate:
    t = GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=seq, bidirectional=bidirectional)
    return (t.with_precision(precision) if precision else t).with_tensor_cores(offline_cuda("sm_90"))


@pytest.mark.parametrize("batch, hidden, bidirectional, tile, precision", [
    (64, 2048, False, "wgmma 64x64x64 s8 w1 direct tma ws pdl", HALF),
    (64, 1536, False, "wgmma 64x64x64 s8 w1 direct tma ws pdl", HALF),
    (128, 1024, True, "wgmma 128x64x64 s6 w1 direct tma ws pdl", HALF),
    (256, 1024, False, "wgmma 128x64x64 s6 w1 direct tma ws pdl", HALF),
    (128, 1536, False, "wgmma 128x64x64 s6 w1 direct tma ws pdl", HALF),
    (96, 1024, True, "wgmma 64x64x64 s8 w1 direct r2 t2 tma ws pdl", HALF),
    # (B192 H1024 takes the resident-W cell step kernel: test_gru_resident_cell.py)
    (192, 1536, False, "wgmma bfloat16 64x64x64 s8 w1 direct t2 tma ws pdl", BF16),
])
def test_pick_runs_the_unfused_steps_hidden_gemm_on_wgmma(batch, hidden, bidirectional, tile, precision):
    """Where no step kernel's grid is resident, the hidden GEMM runs on wgmma: launched early
    (PDL), with a producer warpgroup where TMA loads it, on 128-row tiles where 128 divides the
    batch (faster than the mma.sync tile picked before at B64 H1536 / H2048, and than 64-row
    tiles at B128 H2048 / B256 H1024: docs/results/gru.md); the cell kernel after it, or the cell
    in the store of a tile of its own (``test_gru_cell_epilogue.py``)."""
    target = offline_cuda("sm_90")
    t = _template(batch, hidden, bidirectional, precision)
    cfg, why = t.analytic_pick(target)
    assert (cfg.fuse_step, cfg.hid_wgmma) == (0, 1) and t.hid_wgmma_tile.name == tile
    assert why.startswith("the unfused pipeline: per step the hidden GEMM on the tensor cores (wgmma ")
    assert why.startswith(f"the unfused pipeline: per step the hidden GEMM on the tensor cores ({tile})") == \
        (cfg.hid_cell == 0)
    assert t.space(target).infeasible_reason(cfg) is None


def test_pick_keeps_the_mma_tile_where_no_wgmma_tile_divides_the_hidden_gemm():
    """H1760: 3H = 5280 is no multiple of 64, so no wgmma tile; the mma.sync tile stays."""
    target = offline_cuda("sm_90")
    t = _template(64, 1760)
    cfg, why = t.analytic_pick(target)
    assert t.hid_wgmma_tile is None and (cfg.fuse_step, cfg.hid_wgmma) == (0, 0)
    assert "(mma.sync" in why


def test_the_hidden_gemm_is_one_wgmma_kernel_a_step_with_a_bias_row_a_direction():
    target = offline_cuda("sm_90")
    t = _template(64, 512, bidirectional=True)
    cfg = t.default_config(target).replace(**UNFUSED_ON_WGMMA)
    func = t.lowered_kernels(cfg)["gru_gemm_h"]
    # h, W_hh (K, N) read N-major, b_hh and gh: a matrix and a bias row a direction
    assert [tuple(p.shape) for p in func.params] == [(2, 64, 512), (2, 512, 1536), (2, 1536), (2, 64, 1536)]
    assert "gru_gemm_h" not in t.kernels(cfg, target)  # not scheduled: written as loops
    compiled = t.compile(cfg, target)
    gemms = [c for c in compiled.function_calls() if c.name == "gru_gemm_h"]
    assert len(gemms) == t.seq and all(c.args[1:] == ("w_hh0", "b_hh0", "gh") for c in gemms)
    source = compiled.source
    kernel = source[re.search(r"gru_gemm_h_kernel\([^)]*\) \{", source).end():]
    kernel = kernel[:kernel.index("\n}\n")]
    assert "griddepcontrol_wait()" in kernel and "mma_async_sync_aligned_m64n64k16" in kernel


def test_the_mma_pick_is_built_as_before_without_the_knob():
    """hid_wgmma 0 keeps the scheduled hidden GEMM on the mma.sync tile."""
    target = offline_cuda("sm_90")
    t = _template(64, 512, bidirectional=True)
    cfg = t.default_config(target).replace(fuse_step=0, hid_wgmma=0)
    assert "gru_gemm_h" in t.kernels(cfg, target) and "gru_gemm_h" not in t.lowered_kernels(cfg)


@pytest.mark.parametrize("template, knobs, reason", [
    (lambda: _template(64, 1024), {"fuse_step": 1}, "hid_wgmma 1 runs the unfused steps' hidden GEMM on wgmma"),
    (lambda: _template(64, 1760), {"fuse_step": 0}, "hidden GEMM on wgmma (hid_wgmma 1) needs a Hopper GPU"),
    (lambda: _template(64, 1024, precision=None), {"fuse_step": 0},  # float32: on TF32 parts, the cell in its store
     "the float32 hidden GEMM on wgmma (hid_wgmma 1, TF32 parts) runs with the cell in its store"),
])
def test_space_refuses_hid_wgmma_with_the_reason(template, knobs, reason):
    target = offline_cuda("sm_90")
    t = template()
    cfg = t.default_config(target).replace(hid_wgmma=1, **knobs)
    assert reason in t.space(target).infeasible_reason(cfg)


def test_records_name_the_hidden_wgmma_tile_and_load_it_back():
    """The tile is part of the workload's key (a record measured on it names it), and a record's
    params rebuild the same template; a shape without the tile keeps the key it had."""
    t = _template(64, 2048)
    assert t.params["hid_wgmma"] == "wgmma 64x64x64 s8 w1 direct tma ws pdl"
    assert GruTemplate(**_gru_args(t.params)) == t
    assert "hid_wgmma" not in _template(8, 512).params


def test_a_bias_row_a_matrix_needs_a_batch():
    with pytest.raises(TvmExtError, match="bias_batched"):
        wgmma_gemm(WgmmaTile(64, 64, 4), 64, 192, 256, bias_dtype="float16", bias_batched=True)


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
GPU_SHAPES = {
    # both directions (each its own bias row), two layers, 70 rows: the last 64-row tile guarded
    "b70-h512-2layer-bi": Shape(seq=5, batch=70, input=64, hidden=512, layers=2, bidirectional=True),
    # loaded by TMA with a producer warpgroup (the B64 H1536 pick's tile)
    "b64-h1536": Shape(seq=4, batch=64, input=96, hidden=1536),
    # 128-row tiles, both directions
    "b128-h256-bi": Shape(seq=4, batch=128, input=64, hidden=256, bidirectional=True),
}


@pytest.mark.gpu
@pytest.mark.parametrize("precision, bound", [(HALF, 5e-3), (BF16, 3e-2)], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("key", list(GPU_SHAPES))
def test_cuda_hidden_gemm_on_wgmma_matches_float64(key, precision, bound):
    s = GPU_SHAPES[key]
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch,
                    seq=s.seq, config=UNFUSED_ON_WGMMA, precision=precision).load_numpy(_weights(s))
    assert gru.template.hid_wgmma_tile.pdl
    x, h0 = _inputs(s)
    assert_reruns_match_float64(gru, s, x, h0, bound, 1e-6)
    assert_reruns_match_float64(gru, s, x[::-1].copy(), -h0, bound, 1e-6, reruns=1)
