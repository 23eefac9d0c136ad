"""GRU picks whose persistent grid holds more than one block an SM, one of each kind of step
kernel: where the warps of two or three blocks share an SM, races within a block show and grids
stop fitting (W_hh torn by the first poll, 2e-2 off float64; split-kernel grids whose registers
did not fit, a grid-barrier timeout); ``benchmarks/probes/gru_pick_check.py`` found both.

- No GPU: each shape's pick still has such a grid (on the H100/H200's 132 SMs), so the GPU test
  keeps testing what it names.
- ``-m gpu``: each pick against float64 on reruns.
"""
from __future__ import annotations

import pytest
from gru_checks import assert_reruns_match_float64
from test_gru import Shape, _inputs, _weights

from tvm_ext.cost_model.hardware import HardwareModel
from tvm_ext.schedules.gru import GRU, GruTemplate
from tvm_ext.target import offline_cuda

SM_COUNT = HardwareModel.from_target(offline_cuda("sm_90")).sm_count  # an H100 / H200's
BOUNDS = {"float32": 2e-6, "float16": 5e-3, "bfloat16": 3e-2}
CROWDED = {  # dtype, batch, hidden, bidirectional: the kernel its pick runs
    "fp32-b8-h2048": ("float32", 8, 2048, False),  # the CUDA-core fused step kernel, a grid barrier
    "fp32-b3-h768-bi": ("float32", 3, 768, True),
    "fp32-b192-h256-bi": ("float32", 192, 256, True),  # split tensor-core kernel, three blocks an SM
    "fp32-b96-h384-bi": ("float32", 96, 384, True),  # split tensor-core kernel, 256-thread blocks
    "fp32-b48-h384-bi": ("float32", 48, 384, True),
    "fp16-b128-h512": ("float16", 128, 512, False),  # tensor-core kernel, W's fragments held
    "fp16-b256-h256-bi": ("float16", 256, 256, True),
    "fp16-b256-h512": ("float16", 256, 512, False),  # 32-unit blocks
    "fp16-b64-h768": ("float16", 64, 768, False),  # the first k slices' fragments held
    "bf16-b96-h384-bi": ("bfloat16", 96, 384, True),
    "bf16-b192-h256-bi": ("bfloat16", 192, 256, True),
}
SEQ = 32


def _template(dtype: str, batch: int, hidden: int, bidirectional: bool) -> GruTemplate:
    precision = {name: dtype for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}
    return GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=SEQ, bidirectional=bidirectional
                       ).with_precision(precision).with_tensor_cores(offline_cuda("sm_90"))


@pytest.mark.parametrize("key", list(CROWDED))
def test_each_pick_has_a_grid_of_more_than_a_block_an_sm(key):
    t = _template(*CROWDED[key])
    pick = t.analytic_pick(offline_cuda("sm_90"))[0]
    variant = t.step_variant(pick)
    assert pick.fuse_step == 1 and getattr(variant, "shape", variant).blocks > SM_COUNT


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(CROWDED))
def test_cuda_crowded_pick_matches_float64(key):
    dtype, batch, hidden, bidirectional = CROWDED[key]
    s = Shape(seq=SEQ, batch=batch, input=hidden, hidden=hidden, bidirectional=bidirectional)
    precision = {name: dtype for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}
    gru = GRU.build("cuda", s.input, s.hidden, bidirectional=bidirectional, batch=batch, seq=SEQ,
                    **({} if dtype == "float32" else {"precision": precision})).load_numpy(_weights(s))
    x, h0 = _inputs(s)
    assert_reruns_match_float64(gru, s, x, h0, BOUNDS[dtype], BOUNDS[dtype] / 10)
