"""The tensor-core step kernel's polled h stored by PTX (knob ``step_tc_warp_h``; the pick's for
16-bit state and for float32 where the batch fills the blocks' rows): a warp reads only the h it
polled, so no block barrier stands between its poll and its products; TVM's barrier pass, which
saw the buffer stores, had put one there.

- No GPU: the step loop one block barrier shorter and the poll's values stored four bytes a PTX
  store (float32 state: a pair's high parts and their low parts; 16-bit: a word's two values),
  for the float32 B16 and float16 B8 picks; float32 B8's with h's low parts stacked; the refusals;
  a block barrier after W's fragments are loaded, before the first poll.
- ``-m gpu``: against float64 on reruns, and bit-equal to the same config without the knob.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from gru_checks import assert_reruns_match_float64
from test_gru import Shape, _inputs, _weights
from test_gru_overlap import HALF
from test_gru_overlap import _template as overlap_template

from tvm_ext.schedules.gru import GRU, GruTemplate
from tvm_ext.target import offline_cuda


def _template(batch: int, hidden: int, precision: dict | None = None) -> GruTemplate:
    return overlap_template(batch, hidden, precision=precision).with_tensor_cores(offline_cuda())


def _step_loop(t: GruTemplate, cfg) -> str:
    source = t.compile(cfg, offline_cuda()).source
    kernel = source[[m.start() for m in re.finditer(r"gru_steps_kernel\(", source)][-1]:]
    return kernel[kernel.index("for (int s = 0; s < 128; ++s)"):]


@pytest.mark.parametrize("batch, precision, stores", [(16, None, 32), (8, HALF, 16)])
def test_a_warp_multiplies_the_h_it_polled_without_a_block_barrier(batch, precision, stores):
    """The picks of float32 B16 H512 and float16 B8 H512: float32, each of a lane's 16-byte loads
    holds two units' values, whose high parts go as one half2 and low parts as another; float16,
    each word's two values as its low 32 bits."""
    t = _template(batch, 512, precision)
    pick, why = t.analytic_pick(offline_cuda())
    assert pick.step_tc_warp_h == 1 and "without a block barrier" in why  # the pick's
    before, after = _step_loop(t, pick.replace(step_tc_warp_h=0)), _step_loop(t, pick)
    assert after.count("__syncthreads()") == before.count("__syncthreads()") - 1
    assert after.count("st_shared_b32(") == stores and "st_shared_b32(" not in before
    poll = after[:after.index("ldmatrix")]  # from the poll to the first products: no block barrier
    assert "__syncwarp();" in poll and "__syncthreads()" not in poll


@pytest.mark.parametrize("batch, hidden, precision", [(128, 512, HALF), (256, 256, HALF), (16, 512, None)])
def test_a_block_barrier_follows_the_w_fragments_loads(batch, hidden, precision):
    """W_hh's fragments in registers (``step_tc_wreg`` 1): TVM places h_s where w_s was, and
    the poll's PTX stores are not seen by its barrier pass, so without a barrier of its own a
    warp's first poll overwrote W that a slower warp was still loading (float16 B128 H512 and
    B256 H256, two blocks an SM, measured 2e-2 and 6e-2 off float64 before)."""
    t = _template(batch, hidden, precision)
    pick = t.analytic_pick(offline_cuda())[0]
    assert (pick.step_tc_warp_h, pick.step_tc_wreg) == (1, 1)
    source = t.compile(pick, offline_cuda()).source
    kernel = source[[m.start() for m in re.finditer(r"gru_steps_kernel\(", source)][-1]:]
    before_steps = kernel[:kernel.index("for (int s = 0;")]
    assert "__syncthreads();" in before_steps[before_steps.rindex("ldmatrix"):]


def test_float32_b8_pick_fills_its_padding_rows_before_dropping_the_barrier():
    """float32 B8 H512: 8 of the block's 16 rows were padding, where the kernel without the
    barrier measured 0.5 % slower; with h's low parts stacked in them (``step_tc_stack``) it
    measured 7 % faster, so the pick takes both."""
    t = _template(8, 512)
    pick, why = t.analytic_pick(offline_cuda())
    assert (pick.step_tc_stack, pick.step_tc_warp_h) == (1, 1)
    assert "stacked" in why and "without a block barrier" in why


@pytest.mark.parametrize("batch, hidden, precision, knobs, reason", [
    (8, 512, None, dict(step_tc_poll=8), "an even count of values a poll load"),
    (33, 96, None, dict(step_j=16, step_tc_rows=32, step_tc_nw=2, step_tc_kw=2), "one warp along the units"),
])
def test_refused_where_a_warp_would_read_h_it_did_not_poll(batch, hidden, precision, knobs, reason):
    t = _template(batch, hidden, precision)
    cfg = t.analytic_pick(offline_cuda())[0].replace(**{"step_tc": 2, "step_flags": 1, "step_tc_warp_h": 1, **knobs})
    assert reason in (t.space(offline_cuda()).infeasible_reason(cfg) or "")


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
GPU_CASES = {
    "fp32-b8-h512": (Shape(seq=128, batch=8, input=512, hidden=512), None, 2e-6),
    "fp32-b16-h512": (Shape(seq=64, batch=16, input=512, hidden=512), None, 2e-6),
    "fp16-b8-h512": (Shape(seq=128, batch=8, input=512, hidden=512), HALF, 5e-3),
    "fp32-b5-h200-bi": (Shape(seq=9, batch=5, input=40, hidden=200, bidirectional=True), None, 2e-6),
    # two blocks an SM, W's fragments in registers: the grids where a warp's first poll overwrote them
    "fp16-b128-h512": (Shape(seq=32, batch=128, input=512, hidden=512), HALF, 5e-3),
    "fp16-b256-h256": (Shape(seq=32, batch=256, input=256, hidden=256), HALF, 5e-3),
}


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(GPU_CASES))
def test_cuda_warp_h_matches_float64_and_the_kernel_with_the_barrier(key):
    s, precision, bound = GPU_CASES[key]
    common = dict(num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch, seq=s.seq,
                  **({"precision": precision} if precision else {}))
    pick = GRU.build("cuda", s.input, s.hidden, **common).config
    assert pick.step_flags == 1 and pick.step_tc_nw == 1, pick
    gru, plain = (GRU.build("cuda", s.input, s.hidden, config=pick.replace(step_tc_warp_h=v), **common)
                  .load_numpy(_weights(s)) for v in (1, 0))
    x, h0 = _inputs(s)
    assert_reruns_match_float64(gru, s, x, h0, bound, bound / 10)
    assert np.array_equal(gru(x, h0)[0], plain(x, h0)[0])  # the same products in the same order
