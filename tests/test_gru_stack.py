"""The split tensor-core step kernel with h's low parts stacked in the m16 tile (knob
``step_tc_stack``): at batch 8 or less a block's 16 rows were half padding; the low parts now
fill rows 8-15, so one ldmatrix of h and two mma.sync per W part give the four products
(hi·hi, lo·hi, hi·lo and lo·lo) where the padded tile took two ldmatrix and three mma.sync.

- No GPU: the step loop's mma.sync and ldmatrix counts against the same config unstacked, the
  fold of rows 8-15 into 0-7, and the refusals.
- ``-m gpu``: against float64 on reruns and a second input at odd sizes (rows past the batch, k
  past the hidden size, W read from shared memory, both directions, layers, two values a word),
  no less accurate than the same config unstacked.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from gru_checks import assert_reruns_match_float64
from test_gru import Shape, _inputs, _weights
from test_gru_split_flags import EIGHT_UNITS, MMA, SPLIT_FLAGS, _config, _step
from test_gru_split_step import _template

from tvm_ext.precision.precision import relative_error
from tvm_ext.schedules.gru import GRU, gru_reference
from tvm_ext.target import offline_cuda


def _pick(batch: int, hidden: int):
    target = offline_cuda("sm_90")
    t = _template(batch, hidden, seq=128).with_tensor_cores(target)
    return t, t.analytic_pick(target)[0], target


def test_two_mma_a_w_part_and_one_ldmatrix_of_h_a_slice():
    """float32 B8 H512's pick (8 units, 8 k warps of 4 k slices, 3 n8 tiles, W held): 36 mma.sync
    and 8 ldmatrix of h unstacked, 24 and 4 stacked; the rest of the step is the same code."""
    t, pick, target = _pick(8, 512)
    plain, stacked = (_step(t.compile(pick.replace(step_tc_stack=v), target).source, 128)[1] for v in (0, 1))
    assert (plain.count(MMA), stacked.count(MMA)) == (4 * 3 * 3, 4 * 3 * 2)
    assert (plain.count("ldmatrix"), stacked.count("ldmatrix")) == (8, 4)
    assert plain.count("__nv_atomic_store_n") == stacked.count("__nv_atomic_store_n")


def test_rows_8_to_15_folded_into_0_to_7_before_the_k_warp_sums():
    """Stacked, each n8 tile's accumulators 2 and 3 (rows 8-15) are added into 0 and 1, and the
    later k warps hand over only accumulators 0 and 1 of each tile (half the partial sums)."""
    t = _template(8, 128)
    target = offline_cuda("sm_90")
    cfg = _config(t, step_tc_stack=1)[0]
    plain = _step(t.compile(cfg.replace(step_tc_stack=0), target).source)[1]
    step = _step(t.compile(cfg, target).source)[1]
    assert "acc_ptr[0] = (acc_ptr[0] + acc_ptr[2]);" in step and "acc_ptr[1] = (acc_ptr[1] + acc_ptr[3]);" in step
    assert "acc_ptr[0] = (acc_ptr[0] + acc_ptr[2]);" not in plain
    handed = r"buf_dyn_shmem_ptr\)\[[^\]]*\] = acc_ptr\["  # a later k warp's partial sum into shared memory
    assert len(re.findall(handed, step)) * 2 == len(re.findall(handed, plain)) > 0


@pytest.mark.parametrize("batch, hidden, stacked", [(8, 512, True), (8, 256, True), (4, 512, True), (6, 1024, True),
                                                    (7, 256, False), (3, 512, False), (16, 512, False)])
def test_pick_stacks_from_batch_4_at_h512_and_at_batch_8(batch, hidden, stacked):
    """The stacked split kernel measured faster than the flag-exchange kernel at B4-B7 x H512-H1024
    and slower at H256; at B8 the split kernel was the pick already; from B16 no rows are padding."""
    t, pick, _ = _pick(batch, hidden)
    assert pick.step_tc_stack == int(stacked)
    assert (pick.step_tc, pick.step_flags) == ((2, 1) if stacked or batch >= 8 else (0, 1))


@pytest.mark.parametrize("batch, knobs, needs", [
    (16, dict(step_tc_rows=16), "batch 8 or less"),
    (8, dict(step_tc_rows=32), "16 rows a block"),
    (8, dict(step_tc=1), "float32 parts with exchange words"),
])
def test_refused_where_rows_8_to_15_are_not_padding(batch, knobs, needs):
    t = _template(batch, 64)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**{**SPLIT_FLAGS, **EIGHT_UNITS, "step_tc_stack": 1, **knobs})
    assert needs in (t.space(target).infeasible_reason(cfg) or "")


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
GPU_CASES = {  # the split kernel's odd shapes at batch 8 or less (``test_gru_split_flags``)
    "b8-h512-t128-pick": (Shape(seq=128, batch=8, input=512, hidden=512), None),
    # the pick's input GEMM counted 12 tiles a block, which divide its 672 tiles and not its 14 tile rows
    "b7-h512-t128-pick": (Shape(seq=128, batch=7, input=512, hidden=512), None),
    "b8-h512": (Shape(seq=12, batch=8, input=64, hidden=512), {}),
    "b5-h200-bi": (Shape(seq=9, batch=5, input=40, hidden=200, bidirectional=True),
                   dict(step_j=16, step_tc_kw=2, step_tc_wreg=2, step_tc_acc=1)),
    "b3-h34-3layer-bi": (Shape(seq=7, batch=3, input=33, hidden=34, layers=3, bidirectional=True),
                         dict(step_tc_kw=1, step_tc_acc=2)),
    "b5-h200-bi-pairs": (Shape(seq=9, batch=5, input=40, hidden=200, bidirectional=True),
                         dict(step_j=16, step_tc_kw=2, step_tc_wreg=2, step_tc_acc=1, step_split_words=2)),
    "b7-h33-2layer-from-shared-pairs": (Shape(seq=8, batch=7, input=20, hidden=33, layers=2),
                                        dict(step_tc_kw=1, step_tc_wreg=0, step_tc_acc=1, step_tc_poll=8,
                                             step_split_words=2)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(GPU_CASES))
def test_cuda_stacked_parts_match_float64_as_closely_as_unstacked(key):
    s, knobs = GPU_CASES[key]
    common = dict(num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch, seq=s.seq)
    base = GRU.build("cuda", s.input, s.hidden, **common).config.as_dict() if knobs is None else \
        {**SPLIT_FLAGS, **EIGHT_UNITS, **knobs}
    stacked, plain = (GRU.build("cuda", s.input, s.hidden, config={**base, "step_tc_stack": v}, **common)
                      .load_numpy(_weights(s)) for v in (1, 0))
    assert (stacked.config.step_tc, stacked.config.step_tc_stack) == (2, 1)
    x, h0 = _inputs(s)
    assert_reruns_match_float64(stacked, s, x, h0, 2e-6, 1e-9)
    assert_reruns_match_float64(stacked, s, x[::-1].copy(), -h0, 2e-6, 1e-9, reruns=1)
    ref = gru_reference(x, _weights(s), h0, s.layers, s.bidirectional, s.batch_first)
    errors = [relative_error(list(g(x, h0)), ref) for g in (stacked, plain)]
    assert errors[0] <= 1.1 * errors[1], errors  # lo·lo added, nothing dropped
    assert not np.array_equal(stacked(x, h0)[0], plain(x, h0)[0])  # the stacked products did run
