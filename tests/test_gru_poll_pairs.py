"""The tensor-core GRU step kernel's 16-byte polls (``step_tc_poll`` 16): two adjacent exchange
words (four units of h) a relaxed vector load, each word checked by its own tag.  The generated
CUDA and its PTX on the CPU, the refusals, and ``-m gpu`` runs against float64."""
from __future__ import annotations

import shutil

import pytest
from gru_checks import assert_reruns_match_float64
from test_gru import Shape, _inputs, _weights
from test_gru_tensor_core import BF16, HALF, TC, _kernel, _template

from tvm_ext.schedules.gru import GRU
from tvm_ext.schedules.gru.tensor_core_layout import TcKernelLayout, TcStepShape
from tvm_ext.target import offline_cuda

SCALAR_POLL = "__nv_atomic_load_n((&(hx_ptr["
VECTOR_POLL = "tvm_builtin_ptx_ld_vec_relaxed_gpu_v2_u64(got_ptr"  # its helper: one ld.relaxed.gpu.v2.u64


def _step(source: str, steps: int = 5) -> str:
    kernel = _kernel(source)
    return kernel[kernel.index(f"for (int s = 0; s < {steps}; ++s)"):]


def test_a_lane_polls_the_same_words_in_half_the_loads():
    """At the float16 B64 H1024 pick's block (32 units over 4 warps, 16 rows, one k warp) a lane
    polls 16 x 256 / 2 / 32 = 64 words: 64 loads of a word, or 32 of two, in one round."""
    shape = dict(batch=64, hidden=1024, dirs=1, units=32, rows=16, k_warps=1, operand="float16", n_warps=4)
    layouts = {b: TcKernelLayout.of(128, 1, TcStepShape(**shape, poll_bytes=b), gi_dtype="float16",
                                    gh_dtype="float32", math_dtype="float32", out_dtype="float16", flags=True)
               for b in (8, 16)}
    assert [(x.poll_vector, x.poll_words, x.poll_rounds) for x in layouts.values()] == [(1, 64, 1), (2, 64, 1)]


def test_the_generated_cuda_polls_word_pairs_with_one_vector_load():
    """H 64, 2 k warps, batch 8: a lane's 8 words of a warp's 16 rows x 32 k, of which those in
    rows past the batch are not read: half as many poll loads, each of two words, the scalar
    relaxed loads gone from the step; the stores of h' are the same."""
    t = _template(8, 64)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**TC, step_j=16, step_tc_rows=16, step_tc_kw=2, step_flags=1)
    scalar = _step(t.compile(cfg, target).source)
    pairs = _step(t.compile(cfg.replace(step_tc_poll=16), target).source)
    assert scalar.count(SCALAR_POLL) == 4 and VECTOR_POLL not in scalar
    assert pairs.count(VECTOR_POLL) == 2 and SCALAR_POLL not in pairs
    assert pairs.count("__nv_atomic_store_n((&(hx_ptr[") == scalar.count("__nv_atomic_store_n((&(hx_ptr[")
    assert "step_tc_poll" in t.shown_knobs(cfg.replace(step_tc_poll=16))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the GPU compiles with NVRTC)")
def test_nvcc_accepts_the_vector_poll_for_sm_90():
    import tvm
    from tvm.support import nvcc

    t = _template(5, 200, bidirectional=True, layers=2)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**TC, step_j=32, step_tc_rows=16, step_tc_kw=4, step_flags=1,
                                           step_tc_poll=16)
    assert t.space(target).is_feasible(cfg), t.space(target).infeasible_reason(cfg)
    with tvm.target.Target(target.tvm_target()):
        ptx = nvcc.compile_cuda(t.compile(cfg, target).source, target_format="ptx", compiler="nvcc")
    text = ptx.decode() if isinstance(ptx, bytes) else str(ptx)
    assert "ld.relaxed.gpu.v2.u64" in text


@pytest.mark.parametrize("hidden, flags, why", [(64, 0, "need exchange words"), (66, 1, "not a multiple of 4")])
def test_16_byte_polls_are_refused_without_words_or_aligned_pairs(hidden, flags, why):
    t = _template(8, hidden)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**TC, step_j=16, step_tc_rows=16, step_tc_kw=1, step_flags=flags)
    assert t.space(target).is_feasible(cfg), t.space(target).infeasible_reason(cfg)
    assert why in t.space(target).infeasible_reason(cfg.replace(step_tc_poll=16))


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
GPU_CASES = {
    "b8-h512-kw4-wreg": (Shape(seq=9, batch=8, input=512, hidden=512),
                         dict(step_j=8, step_tc_rows=16, step_tc_kw=4, step_tc_wreg=1, step_tc_acc=2)),
    "b64-h1024-nw4-wreg2": (Shape(seq=5, batch=64, input=1024, hidden=1024),
                            dict(step_j=32, step_tc_rows=16, step_tc_kw=1, step_tc_nw=4, step_tc_wreg=2)),
    "b40-h256-kw4": (Shape(seq=6, batch=40, input=256, hidden=256), dict(step_j=32, step_tc_rows=64, step_tc_kw=4)),
    "b5-h200-bi-kw4": (Shape(seq=7, batch=5, input=40, hidden=200, bidirectional=True),
                       dict(step_j=16, step_tc_rows=16, step_tc_kw=4)),
    # the float16 pick's block from H1024 on: 8 units on 8 k warps, W held
    "b8-h1024-kw8-wreg": (Shape(seq=6, batch=8, input=64, hidden=1024),
                          dict(step_j=8, step_tc_rows=16, step_tc_kw=8, step_tc_wreg=1, step_tc_acc=2)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("precision, bound", [(HALF, 5e-3), (BF16, 3e-2)], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("key", list(GPU_CASES))
def test_cuda_16_byte_polls_match_float64(key, precision, bound):
    """Against float64 on reruns and a second input (a pair whose second word still holds the
    previous step would be read as this one's without its own tag check)."""
    s, knobs = GPU_CASES[key]
    gru = GRU.build("cuda", s.input, s.hidden, bidirectional=s.bidirectional, batch=s.batch, seq=s.seq,
                    config={**TC, **knobs, "step_flags": 1, "step_tc_poll": 16},
                    precision=precision).load_numpy(_weights(s))
    assert gru.config.step_tc_poll == 16
    x, h0 = _inputs(s)
    assert_reruns_match_float64(gru, s, x, h0, bound, 1e-6)
    assert_reruns_match_float64(gru, s, x[::-1].copy(), -h0, bound, 1e-6, reruns=1)
