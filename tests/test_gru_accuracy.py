"""The float32 GRU's accuracy: its cell computes tanh from expm1 because NVRTC builds TVM's
CUDA with --use_fast_math, under which tanhf is an approximation (relative error up to 1.1e-5:
the float32 GRU's 4e-6 against cuDNN STANDARD's 2.7e-7 - 5.2e-7).  Generated source here
(CUDA and OpenCL, and PoCL's numbers); ``-m gpu``: the error against float64 at a
benchmark-like shape, every family."""
from __future__ import annotations

import pytest
from test_gru import Shape, _inputs, _weights

from tvm_ext.precision.precision import relative_error
from tvm_ext.schedules.gru import GRU, GruTemplate, gru_reference
from tvm_ext.target import offline_cuda

FAMILIES = {"pick": None, "unfused": {"fuse_step": 0}, "persistent": {"fuse_step": 1, "step_loop": 2},
            "flags": {"fuse_step": 1, "step_loop": 2, "step_flags": 1}}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_float32_cell_has_no_fast_exp_or_division(family):
    t = GruTemplate(batch=4, hidden=64, input=64, seq=3, bidirectional=True)
    target = offline_cuda("sm_90")
    knobs = FAMILIES[family]
    cfg = t.analytic_pick(target)[0] if knobs is None else t.default_config(target).replace(**knobs)
    source = t.compile(cfg, target).source
    assert "tanhf(" not in source and "expm1f(" in source


def test_16_bit_cell_math_keeps_tanh():
    t = GruTemplate(batch=4, hidden=64, input=64, seq=3).with_precision({"cell_math": "float16", "h": "float16"})
    target = offline_cuda("sm_90")
    source = t.compile(t.default_config(target), target).source
    assert "expm1" not in source and "tanh" in source


@pytest.mark.parametrize("fuse", [0, 1])
def test_opencl_cell_uses_expm1_and_matches_float64(opencl, fuse):
    shape = Shape(seq=12, batch=3, input=24, hidden=40, bidirectional=True)
    gru = GRU.build(opencl, 24, 40, bidirectional=True, batch=3, seq=12, config={"fuse_step": fuse})
    assert "expm1(" in gru.compiled.source and "tanh(" not in gru.compiled.source
    gru.load_numpy(_weights(shape))
    x, h0 = _inputs(shape)
    out, h_n = gru(x, h0)
    ref_out, ref_h = gru_reference(x, _weights(shape), h0, 1, True)
    assert max(relative_error(out, ref_out), relative_error(h_n, ref_h)) < 2e-6


@pytest.mark.gpu
@pytest.mark.parametrize("family", list(FAMILIES))
def test_float32_error_within_twice_cudnn_standard(family):
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda", 0)
    shape = Shape(seq=64, batch=8, input=512, hidden=512)
    gru = GRU.build(target, 512, 512, batch=8, seq=64, config=FAMILIES[family]).load_numpy(_weights(shape))
    x, h0 = _inputs(shape)
    out, h_n = gru(x, h0)
    ref_out, ref_h = gru_reference(x, _weights(shape), h0)
    assert max(relative_error(out, ref_out), relative_error(h_n, ref_h)) < 1e-6, family
