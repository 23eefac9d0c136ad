"""The GRU's 16-bit input GEMM on Hopper's wgmma (knob ``in_wgmma``): the wgmma template's
kernel with the bias row, reading W_ih (K, dirs·3H) N-major as it is stored.

- The plan and its CUDA (generated here, no GPU): wgmma per input depth with the transpose
  flag, the sm_90a module; the refusals with their reasons; the pick.
- ``-m gpu``: float16 GRUs with the input GEMM on wgmma against float64, two layers and both
  directions included.
"""
from __future__ import annotations

import dataclasses

import pytest
from test_gru import Shape, _inputs, _weights

from tvm_ext.precision.precision import relative_error
from tvm_ext.schedules.gru import GRU, GruTemplate, gru_reference
from tvm_ext.target import offline_cuda

HALF = {name: "float16" for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}
BF16 = {name: "bfloat16" for name in HALF}


def _template(batch: int, hidden: int, input: int | None = None, seq: int = 128, layers: int = 1,
              bidirectional: bool = False, precision: dict | None = None) -> GruTemplate:
    return GruTemplate(batch=batch, hidden=hidden, input=input or hidden, seq=seq, layers=layers,
                       bidirectional=bidirectional).with_precision(HALF if precision is None else precision)


def test_plan_runs_wgmma_on_w_ih_as_stored_per_input_depth():
    """Two bidirectional layers whose input depths differ: per layer the wgmma GEMM reading x (or
    the layer below's output) and W_ih as stored, N-major (the instruction's transpose flag); no
    extra buffers; the module holds wgmma and is built for sm_90a."""
    import re

    target = offline_cuda()
    t = _template(8, 512, input=256, layers=2, bidirectional=True).with_tensor_cores(target)
    assert t.in_wgmma_tile is not None and t.params["in_wgmma"] == t.in_wgmma_tile.name
    cfg = t.analytic_pick(target)[0].replace(in_wgmma=1)
    assert t.space(target).infeasible_reason(cfg) is None
    compiled = t.compile(cfg, target)
    calls = [(c.func, c.args) for c in compiled.calls if c.func.startswith("gru_gemm")]
    assert calls == [("gru_gemm_x0", ("x", "w_ih0", "b_ih0", "gi")), ("gru_gemm_x1", ("y0", "w_ih1", "b_ih1", "gi"))]
    assert t.for_config(cfg).buffers() == t.for_config(cfg.replace(in_wgmma=0)).buffers()
    flags = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.f16\.f16 \{[^}]*\}, %\d+, %\d+, \w+, "
                       r"1, 1, 0, (\d);", compiled.source)
    assert flags and set(flags) == {"1"}  # B (W_ih) read N-major
    without = t.compile(cfg.replace(in_wgmma=0), target)
    assert "wgmma" not in without.source


@pytest.mark.parametrize("precision, knobs, reason", [
    ({}, {}, "w_ih, x must be float16"),  # float32: its wgmma GEMM is the split one (in_split 2)
    ({**HALF, "w_ih": "bfloat16"}, {}, "w_ih must be float16"),
    (HALF, {"in_split": 1}, "emulates float32"),
])
def test_space_refuses_with_the_reason(precision, knobs, reason):
    target = offline_cuda()
    t = _template(64, 1024, precision=precision).with_tensor_cores(target)
    cfg = t.default_config(target).replace(in_wgmma=1, **knobs)
    assert reason in t.space(target).infeasible_reason(cfg)


def test_refused_without_hopper_or_a_dividing_tile():
    target = offline_cuda()
    ampere = dataclasses.replace(target, arch="sm_80")
    t = _template(64, 1024).with_tensor_cores(ampere)
    assert t.in_wgmma_tile is None
    assert "needs a Hopper GPU" in t.space(ampere).infeasible_reason(t.default_config(ampere).replace(in_wgmma=1))
    odd = _template(3, 200, input=40, seq=7).with_tensor_cores(target)  # K = 40: no 64-deep k step divides it
    assert odd.in_wgmma_tile is None and odd.analytic_pick(target)[0].in_wgmma == 0
    assert _template(64, 1024).with_tensor_cores(dataclasses.replace(target, kind="opencl")).in_wgmma_tile is None


def test_bfloat16_input_gemm_runs_wgmma_of_bfloat16_operands():
    """bfloat16 x and W_ih (and the layer below's output): the same kernel on bf16 operands, its
    tile named for them; bfloat16 x with float16 W_ih is refused."""
    import re

    target = offline_cuda()
    t = _template(8, 512, input=256, layers=2, bidirectional=True, precision=BF16).with_tensor_cores(target)
    assert t.in_wgmma_tile is not None and t.in_wgmma_tile.operand == "bfloat16"
    assert t.params["in_wgmma"].startswith("wgmma bfloat16 ")
    cfg = t.analytic_pick(target)[0].replace(in_wgmma=1)
    assert t.space(target).infeasible_reason(cfg) is None
    source = t.compile(cfg, target).source
    kinds = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.(\w+)\.(\w+)", source))
    assert kinds == {("bf16", "bf16")}
    mixed = _template(64, 1024, precision={**BF16, "w_ih": "float16"}).with_tensor_cores(target)
    reason = mixed.space(target).infeasible_reason(mixed.default_config(target).replace(in_wgmma=1))
    assert "w_ih must be bfloat16" in reason


@pytest.mark.parametrize("batch, hidden, on_wgmma, overlap", [(64, 1024, 1, 0), (32, 1024, 1, 0), (8, 1024, 1, 1),
                                                              (16, 1024, 1, 0), (8, 512, 1, 1), (1, 256, 0, 0)])
@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_pick_runs_large_float16_input_gemms_on_wgmma(batch, hidden, on_wgmma, overlap, precision):
    """From ``WGMMA_MIN_FLOPS`` on (B8 H1024's 6.4 GFLOP measured faster there), float16 or
    bfloat16; below it where the step kernel launches while the GEMM runs (``step_overlap``: B8
    H512's 1.6 GFLOP, a tie on its own, counts its rows there). B8 H1024 counts its rows beside
    16-unit step blocks; B16 H1024's 128 blocks of 8 units leave no SMs for that."""
    target = offline_cuda()
    t = _template(batch, hidden, precision=HALF if precision == "float16" else BF16).with_tensor_cores(target)
    cfg, why = t.analytic_pick(target)
    assert (cfg.in_wgmma, bool(cfg.step_overlap)) == (on_wgmma, bool(overlap))
    assert (f"{precision} on wgmma" in why) == bool(on_wgmma)
    assert ("launched while the input GEMM runs" in why) == bool(overlap)


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
GPU_SHAPES = {"b64-h1024": (Shape(seq=5, batch=64, input=1024, hidden=1024), HALF),
              "b8-h512-2layer-bi": (Shape(seq=8, batch=8, input=256, hidden=512, layers=2, bidirectional=True), HALF),
              "b16-h256-t12": (Shape(seq=12, batch=16, input=128, hidden=256), HALF),
              "bf16-b64-h1024": (Shape(seq=5, batch=64, input=1024, hidden=1024), BF16),
              "bf16-b8-h512-2layer-bi": (Shape(seq=8, batch=8, input=256, hidden=512, layers=2, bidirectional=True),
                                         BF16)}


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(GPU_SHAPES))
def test_cuda_wgmma_input_gemm_matches_float64(key):
    """The pick with its input GEMM on wgmma, against float64 on reruns and against the same
    pick on its mma.sync tile (both the 16-bit storage's error; a wrong transpose is O(1))."""
    s, precision = GPU_SHAPES[key]
    bound = 5e-3 if precision is HALF else 2e-2
    common = dict(num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch, seq=s.seq, precision=precision)
    gru = GRU.build("cuda", s.input, s.hidden, **common)
    gru = GRU.build("cuda", s.input, s.hidden, config=gru.config.replace(in_wgmma=1), **common).load_numpy(_weights(s))
    assert gru.config.in_wgmma == 1
    x, h0 = _inputs(s)
    ref = gru_reference(x, _weights(s), h0, s.layers, s.bidirectional)
    errors = [relative_error(list(gru(x, h0)), ref) for _ in range(2)]
    assert max(errors) < bound, errors
    on_mma = gru.config.replace(in_wgmma=0, step_overlap=0)  # (a step kernel launched early needs wgmma's counts)
    mma = GRU.build("cuda", s.input, s.hidden, config=on_mma, **common).load_numpy(_weights(s))
    assert relative_error(list(mma(x, h0)), ref) < bound
