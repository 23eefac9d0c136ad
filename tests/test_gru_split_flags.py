"""The float32 GRU on the tagged-word tensor-core step kernel (``step_tc`` 2 with ``step_flags`` 1):
h goes between blocks as one float32 value and the step a word, the polling warps split it into
float16 high and low parts, and the products are the split kernel's three.  Generated CUDA and
nvcc here, the sizes and refusals, and ``-m gpu`` runs against float64 at odd shapes."""
from __future__ import annotations

import re
import shutil

import pytest
from gru_checks import assert_reruns_match_float64, steps_kernel_ptxas
from test_gru import Shape, _inputs, _weights
from test_gru_split_step import _kernel, _template

from tvm_ext.lowering.step_loop import SPIN_LIMIT
from tvm_ext.schedules.gru import GRU, GruTemplate
from tvm_ext.schedules.gru.tensor_core_layout import TcKernelLayout, TcStepShape
from tvm_ext.target import offline_cuda

SPLIT_FLAGS = dict(fuse_step=1, step_loop=2, step_barrier=2, step_tc=2, step_flags=1, step_tc_nw=1, step_tc_frag=0)
# a block of 8 units and 16 rows on 4 k warps, W's fragments held, two sets, 16-byte polls (the pick takes 8 k warps)
EIGHT_UNITS = dict(step_j=8, step_tc_rows=16, step_tc_kw=4, step_tc_wreg=1, step_tc_acc=2, step_tc_poll=16)
MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
WORD_STORE = "__nv_atomic_store_n((&(hx_ptr["


def _step(source: str, steps: int = 5) -> tuple[str, str]:
    """(before the step loop, the step loop) of the steps kernel."""
    body = _kernel(source)
    loop = body.index(f"for (int s = 0; s < {steps}; ++s)")
    return body[:loop], body[loop:]


def _config(t: GruTemplate, **knobs: int):
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**{**SPLIT_FLAGS, **EIGHT_UNITS, **knobs})
    assert t.space(target).is_feasible(cfg), t.space(target).infeasible_reason(cfg)
    return cfg, target


def test_each_step_polls_words_and_multiplies_three_products_without_a_grid_barrier():
    """B16 H128, 8 units on 4 k warps, W's fragments held: W_hh is read before the step loop only,
    the state never in it (h comes as words, the cell's h stays in registers), no grid barrier;
    a k warp's 2 slices x 3 n8 tiles x 3 products; one word stored a unit a lane holds (4)."""
    t = _template(16, 128)
    cfg, target = _config(t)
    before, step = _step(t.compile(cfg, target).source)
    assert "w_ptr" in before and "w_ptr" not in step
    assert "hs_ptr[" in before and "hs_ptr[" not in step
    assert "__nv_atomic_fetch_add" not in step
    assert step.count(MMA) == 2 * 3 * 3
    assert step.count(WORD_STORE) == 4
    assert "tvm_builtin_ptx_ld_vec_relaxed_gpu_v2_u64(got_ptr" in step
    timeout = rf"if \({SPIN_LIMIT} <= poll_ptr\[0\]\) \{{\s*bar_ptr\[1\] = 1;"  # a poll waiting too long: an error
    assert re.search(timeout, step)


def test_a_word_is_the_float32_bits_and_the_tag_and_its_low_part_the_rest():
    """The stored word is h's float32 bits under the step tag, the float the cell's lane keeps;
    the poll writes the high part and the float16 rounding of what is left; W is split times
    256 and the sums multiplied back by 1/256."""
    t = _template(4, 64)
    cfg, target = _config(t, step_tc_poll=8, step_tc_acc=1)
    before, step = _step(t.compile(cfg, target).source)
    assert re.search(r"<< \(uint64_t\)32ULL\) \| \(\(uint64_t\)\(\*\(uint \*\)\(&\(", step)
    assert re.search(r"\(\(half\)\(\(\*\(float \*\)\(&\((v__\d+)\)\)\) - \(\(float\)\(\(half\)"
                     r"\(\*\(float \*\)\(&\((v__\d+)\)\)\)\)\)\)\)", step)
    assert "* 0x1p+8f" in before and "* 0x1p-8f" in step


def test_sizes_double_with_the_parts():
    """W's fragments, shared memory and a word's values against the 16-bit kernel at the same
    block: B8 H512, 8 units, 4 k warps: 96 registers of W (all held), 16 rows x 128 k a warp in
    32-word rounds of 16-byte loads."""
    shape = dict(batch=8, hidden=512, dirs=1, units=8, rows=16, k_warps=4, operand="float16", w_held=1,
                 poll_bytes=16)
    half, split = TcStepShape(**shape), TcStepShape(**shape, split=True)
    assert (half.w_registers, split.w_registers) == (48, 96)
    assert (half.held_slices, split.held_slices) == (8, 8)
    partials = 3 * 3 * 4 * 32 * 4
    assert split.shared_bytes() - partials == 2 * (half.shared_bytes() - partials)
    layout = TcKernelLayout.of(128, 1, split, gi_dtype="float32", gh_dtype="float32", math_dtype="float32",
                               out_dtype="float32", flags=True)
    assert (layout.pair_words, layout.poll_words, layout.poll_rounds, layout.state) == (512, 32, 2, "float32")
    assert (layout.held_part, layout.pair_at, layout.b_frag_size) == (96, 192, 192)


@pytest.mark.parametrize("knobs, reason", [
    (dict(step_tc_wreg=0, step_tc_frag=1), "no fragments a slice ahead"),
    (dict(step_flags=2), "not in a cluster"),
])
def test_space_refuses_with_the_reason(knobs, reason):
    t = _template(8, 64)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**{**SPLIT_FLAGS, **EIGHT_UNITS, **knobs})
    assert reason in t.space(target).infeasible_reason(cfg)


def test_space_refuses_16_bit_state_and_odd_hidden_sizes_for_word_pairs():
    target = offline_cuda("sm_90")
    t = _template(8, 64).with_precision({name: "float16" for name in ("x", "w_ih", "gi", "w_hh", "h", "out")})
    cfg = t.default_config(target).replace(**SPLIT_FLAGS, **{**EIGHT_UNITS, "step_tc_acc": 1})
    assert "needs float32 h and W_hh" in t.space(target).infeasible_reason(cfg)
    cfg16 = cfg.replace(step_tc=1, step_split_words=2)
    assert "are the split kernel's exchange words" in t.space(target).infeasible_reason(cfg16)
    assert t.space(target).is_feasible(cfg16.replace(step_split_words=1))
    odd = _template(8, 33)
    cfg = odd.default_config(target).replace(**SPLIT_FLAGS, **{**EIGHT_UNITS, "step_tc_wreg": 0, "step_tc_acc": 1})
    assert "not a multiple of 2" in odd.space(target).infeasible_reason(cfg)
    assert odd.space(target).is_feasible(cfg.replace(step_tc_poll=8))


def test_the_split_state_loads_weights_through_the_range_check():
    """The kernel splits W_hh and h0 into float16 parts: the module checks their range as the
    barrier split kernel's does, and initializes the words as float32 values (not pairs)."""
    t = _template(8, 64)
    cfg, target = _config(t, step_tc_acc=1)
    step = t.step_variant(cfg)
    assert step.splits_state and step.init_layout()["paired"] is False
    barrier = t.step_variant(cfg.replace(step_flags=0))
    assert type(barrier).__name__ == "TensorCoreSplitStep" and barrier.splits_state


def test_split_pairs_store_a_word_a_pair_and_poll_the_tag_bit():
    """``step_split_words`` 2: one word for each pair of units a lane holds (2 of its 4), the
    first value's lowest bit replaced by bit 1 of the step; the poll compares that bit, not a
    32-bit tag, and takes the high half as the second unit; half the words a row."""
    t = _template(16, 128)
    cfg, target = _config(t, step_split_words=2)
    before, step = _step(t.compile(cfg, target).source)
    assert step.count(WORD_STORE) == 2
    assert "& (uint64_t)4294967294ULL) | (((uint64_t)(s + 1)) >> (uint64_t)1ULL) & (uint64_t)1ULL" in \
        step.replace("((((uint64_t)", "(((uint64_t)")
    assert "(got_ptr[0] & (uint64_t)1ULL) != " in step and ">> (uint64_t)32ULL)) != s" not in step
    assert "(uint)(got_ptr[0] >> (uint64_t)32ULL)" in step
    shape = t.step_variant(cfg).shape
    layout = TcKernelLayout.of(5, 1, shape, gi_dtype="float32", gh_dtype="float32", math_dtype="float32",
                               out_dtype="float32", flags=True)
    assert (shape.word_values, layout.pair_words) == (2, 64)
    assert t.step_variant(cfg).init_layout()["float_pairs"] is True


@pytest.mark.parametrize("hidden", [6, 5])
def test_split_pairs_init_writes_h0_with_tag_bit_0_and_slot_1_with_bit_1(hidden):
    """The init kernel, built for the CPU and run: slot 0 holds h0's pairs (an odd last unit
    beside 0.0) whose tag bit 0 says step 0, off by at most that bit; slot 1 holds words with
    the bit set, which step 1's (bit 0) never are; so a poll never takes a word of an earlier
    call or layer."""
    import numpy as np
    import tvm

    from tvm_ext.schedules.gru.kernels import init_func

    batch, layers, n = 3, 2, 3 * hidden
    func = init_func(batch, hidden, 1, layers, "float32", pingpong=True, barrier=True, flags=True,
                     float_pairs=True)
    init = tvm.compile(tvm.IRModule({"main": func}), target="llvm")["main"]
    h0 = np.random.default_rng(0).uniform(-1, 1, (layers, batch, hidden)).astype("float32")
    dev = tvm.cpu()
    hx = tvm.runtime.tensor(np.full(2 * n, 99, "uint64"), dev)
    init(tvm.runtime.tensor(h0, dev), 1, tvm.runtime.tensor(np.zeros((2, 1, batch, hidden), "float32"), dev),
         tvm.runtime.tensor(np.full(2, 7, "int32"), dev), hx)
    words = hx.numpy()
    pairs = (hidden + 1) // 2
    slot0 = words[:batch * pairs].reshape(batch, pairs)  # rows of ``pairs`` words each
    assert np.all(slot0 & 1 == 0)
    values = slot0.copy().view("uint32").view("float32").reshape(batch, 2 * pairs)
    want = np.zeros((batch, 2 * pairs), "float32")
    want[:, :hidden] = h0[1]
    assert np.allclose(values, want, rtol=2 ** -22, atol=0)
    assert np.all(words[n:n + batch * pairs] == 1)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("batch, hidden, knobs", [
    (8, 512, {}),  # the block measured: every W fragment held
    (5, 200, dict(step_j=16, step_tc_kw=2, step_tc_wreg=2, step_tc_acc=1)),  # some held, a pair buffer
])
def test_nvcc_compiles_the_kernel_for_sm_90_without_spills(tmp_path, batch, hidden, knobs):
    t = _template(batch, hidden, bidirectional=batch == 5)
    cfg, target = _config(t, **knobs)
    assert " 0 bytes spill stores" in steps_kernel_ptxas(t.compile(cfg, target).source, tmp_path)


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
GPU_CASES = {  # K past the hidden size, rows past the batch, both directions, layers
    "b8-h512": (Shape(seq=12, batch=8, input=64, hidden=512), {}),
    "b5-h200-bi": (Shape(seq=9, batch=5, input=40, hidden=200, bidirectional=True),
                   dict(step_j=16, step_tc_kw=2, step_tc_wreg=2, step_tc_acc=1)),
    "b3-h34-3layer-bi": (Shape(seq=7, batch=3, input=33, hidden=34, layers=3, bidirectional=True),
                         dict(step_tc_kw=1, step_tc_acc=2)),
    "b33-h96-rows32-nw2": (Shape(seq=6, batch=33, input=96, hidden=96),
                           dict(step_j=16, step_tc_rows=32, step_tc_nw=2, step_tc_kw=2, step_tc_poll=8)),
    "b16-h512-from-shared": (Shape(seq=6, batch=16, input=64, hidden=512),
                             dict(step_j=16, step_tc_wreg=0, step_tc_acc=4)),
    # two float32 values a word and a tag bit: as picked, both directions, an odd last unit, layers
    "b8-h512-pairs": (Shape(seq=12, batch=8, input=64, hidden=512), dict(step_tc_kw=8, step_split_words=2)),
    "b5-h200-bi-pairs": (Shape(seq=9, batch=5, input=40, hidden=200, bidirectional=True),
                         dict(step_j=16, step_tc_kw=2, step_tc_wreg=2, step_tc_acc=1, step_split_words=2)),
    "b32-h128-pairs": (Shape(seq=10, batch=32, input=64, hidden=128),
                       dict(step_tc_kw=8, step_tc_acc=1, step_split_words=2)),
    "b7-h33-2layer-pairs": (Shape(seq=8, batch=7, input=20, hidden=33, layers=2),
                            dict(step_tc_kw=1, step_tc_wreg=0, step_tc_acc=1, step_tc_poll=8, step_split_words=2)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(GPU_CASES))
def test_cuda_split_flags_step_matches_float64_at_float32_accuracy(key):
    """Against float64 on reruns (a word read before its tag says the step would move the error)
    and on a second input; float32's class of error, which a 16-bit product or a lost low part
    would not meet."""
    s, knobs = GPU_CASES[key]
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch,
                    seq=s.seq, config={**SPLIT_FLAGS, **EIGHT_UNITS, **knobs}).load_numpy(_weights(s))
    assert (gru.config.step_tc, gru.config.step_flags) == (2, 1)
    x, h0 = _inputs(s)
    assert_reruns_match_float64(gru, s, x, h0, 2e-6, 1e-9)
    assert_reruns_match_float64(gru, s, x[::-1].copy(), -h0, 2e-6, 1e-9, reruns=1)
