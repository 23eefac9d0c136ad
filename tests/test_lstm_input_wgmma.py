"""The LSTM's input GEMM on Hopper's wgmma: float32 as three TF32 products of x's and W_ih's high
and low parts (``in_split`` 3, the GRU's ``SplitInputGemm``), 16-bit as stored (``in_wgmma``):
what the pick takes and where, the plan (W_ih's parts split once as the weights load, x's each
call), the buffers, the generated CUDA built offline, the refusals; on a GPU machine against
float64 at float32's accuracy and at 16-bit storage's."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tvm_ext.schedules.gru.plan import Call
from tvm_ext.schedules.lstm import LstmTemplate
from tvm_ext.target import offline_cuda

from test_lstm_tensor_core import _cuda_against_float64, _template as shape_template

HOPPER = offline_cuda("sm_90a")


def _template(batch: int, hidden: int, inputs: int | None = None, seq: int = 128, layers: int = 1,
              bidirectional: bool = False, dtype: str = "float32", target=HOPPER) -> LstmTemplate:
    return LstmTemplate(batch=batch, hidden=hidden, input=inputs or hidden, seq=seq, layers=layers,
                        bidirectional=bidirectional, dtype=dtype).with_tensor_cores(target)


def test_the_float32_pick_runs_its_input_gemm_on_two_stored_tf32_parts():
    """B32 H1024: x split each call, W_ih once (``prepare``), the GEMM on wgmma over both, its
    k steps reading the two stored parts in turn through the TMA."""
    t = _template(32, 1024)
    cfg, why = t.analytic_pick(HOPPER)
    assert (cfg.in_split, cfg.in_tf32_parts) == (3, 2) and "TF32 parts" in why and "read in turn by the TMA" in why
    compiled = t.compile(cfg, HOPPER)
    funcs = [c.func for c in compiled.calls]
    assert funcs[:3] == ["lstm_init", "lstm_split_x0", "lstm_gemm_x0"]
    assert compiled.calls[1].args == ("x", "xs0") and compiled.calls[2].args == ("xs0", "ws0", "b_ih0", "gi")
    assert compiled.prepare == (Call("lstm_split_w0", ("w_ih0", "ws0")),)
    specs = t.for_config(cfg).buffers()
    assert (specs["xs0"].shape, specs["ws0"].shape, specs["xs0"].dtype) == ((128 * 32, 2048), (4096, 2048), "float32")
    assert "xs0" not in t.buffers()  # only the config's plan has the parts
    gemm = compiled.source[re.search(r"lstm_gemm_x0_kernel\([^)]*\) \{", compiled.source).start():]
    gemm = gemm[:gemm.index("\n}\n")]
    assert "CUtensorMap a_map" in gemm and "wgmma_tf32" in gemm and "tensor_2d" in gemm, gemm[:3000]
    assert t.params["in_split_tf32"] == t.in_split_tf32.name  # the tile is in the records' key


def test_two_layers_both_ways_split_each_layers_weights_into_its_own_parts():
    """Layer 1 reads 2H: its own GEMM kind, its own x parts; every layer's W_ih has its buffer."""
    t = _template(16, 512, inputs=256, layers=2, bidirectional=True)
    cfg, _ = t.analytic_pick(HOPPER)
    assert cfg.in_split == 3
    compiled = t.compile(cfg, HOPPER)
    gemms = [c for c in compiled.calls if c.func.startswith(("lstm_split_x", "lstm_gemm_x"))]
    assert [(c.func, c.args[:2]) for c in gemms] == [
        ("lstm_split_x0", ("x", "xs0")), ("lstm_gemm_x0", ("xs0", "ws0")),
        ("lstm_split_x1", ("y0", "xs1")), ("lstm_gemm_x1", ("xs1", "ws1"))]
    assert [c.func for c in compiled.prepare] == ["lstm_split_w0", "lstm_split_w1"]
    specs = t.for_config(cfg).buffers()
    parts = cfg.in_tf32_parts
    assert specs["ws0"].shape == (2 * 4 * 512, parts * 256) and specs["ws1"].shape == (2 * 4 * 512, parts * 1024)


def test_a_ragged_input_depth_is_padded_by_the_scheduled_split():
    """An input of 200 pads each part to 224 with zeros: x's parts come from the scheduled split
    kernel (``split_rows_func``), not the 16-byte one, and W_ih's rows are as deep."""
    t = _template(32, 512, inputs=200)
    cfg, _ = t.analytic_pick(HOPPER)
    assert (cfg.in_split, cfg.in_tf32_parts) == (3, 2)
    specs = t.for_config(cfg).buffers()
    assert specs["xs0"].shape == (128 * 32, 2 * 224) and specs["ws0"].shape == (4 * 512, 2 * 224)
    assert not t.split_rows_written(cfg, 0) and "lstm_split_x0" in t.kernels(cfg, HOPPER)
    three = cfg.replace(in_tf32_parts=3)
    assert t.space(HOPPER).infeasible_reason(three) is None
    assert t.for_config(three).buffers()["xs0"].shape == (128 * 32, 3 * 224)
    assert "lstm_split_x0_kernel(" in t.compile(three, HOPPER).source


def test_the_pick_keeps_the_cuda_core_gemm_where_the_split_does_not_gain_or_run():
    """Below the GRU's SPLIT_MIN_FLOPS, off Hopper and in 16-bit: no TF32 parts; the space says why."""
    small = _template(8, 256, seq=4)
    assert small.analytic_pick(HOPPER)[0].in_split == 0
    ampere = _template(32, 1024, target=offline_cuda("sm_80"))
    cfg, why = ampere.analytic_pick(offline_cuda("sm_80"))
    assert ampere.in_split_tf32 is None and cfg.in_split == 0 and "TF32" not in why
    assert "needs float32 x and W_ih, a Hopper GPU" in ampere.space(offline_cuda("sm_80")).infeasible_reason(
        cfg.replace(in_split=3))
    half = _template(32, 1024, dtype="float16")
    cfg, _ = half.analytic_pick(HOPPER)
    assert cfg.in_split == 0 and half.space(HOPPER).infeasible_reason(cfg.replace(in_split=3)) is not None


def test_what_the_split_refuses():
    t = _template(32, 1024)
    cfg, _ = t.analytic_pick(HOPPER)
    space = t.space(HOPPER)
    assert space.infeasible_reason(cfg.replace(in_split=0, in_tf32_parts=2)) == \
        "in_tf32_parts changes the input GEMM of TF32 parts (in_split 3)"
    fused = t.space(HOPPER).make(**{**t.default_config(HOPPER).as_dict(), "fuse_step": 1, "step_loop": 2,
                                    "step_flags": 1, "step_flag_input": 1, "in_split": 3})
    assert "step_flag_input 1 runs x·W_ihᵀ in the step kernel" in space.infeasible_reason(fused)


def test_records_written_before_the_knobs_read_as_the_cuda_core_gemm():
    """A config recorded before ``in_split`` existed names the kernel it measured: in_split 0."""
    t = _template(32, 1024)
    cfg, _ = t.analytic_pick(HOPPER)
    old = {k: v for k, v in cfg.as_dict().items() if k not in ("in_split", "in_tf32_parts")}
    completed = t.space(HOPPER).completed(old)
    assert (completed["in_split"], completed["in_tf32_parts"]) == (0, 3)
    assert t.space(HOPPER).infeasible_reason(t.space(HOPPER).make(**completed)) is None


def test_shown_knobs_name_the_parts_not_the_cuda_core_tile():
    t = _template(32, 1024)
    cfg, _ = t.analytic_pick(HOPPER)
    shown = t.shown_knobs(cfg)
    assert "in_split" in shown and "in_tf32_parts" in shown and "in_wg_x" not in shown
    plain = t.shown_knobs(cfg.replace(in_split=0, in_tf32_parts=3))
    assert "in_wg_x" in plain and "in_tf32_parts" not in plain


def test_the_16_bit_pick_runs_its_input_gemm_on_wgmma_from_the_grus_size():
    """float16 and bfloat16 B64 H1024: x and W_ih (K, N) read as stored by the TMA, no parts, no
    prepare; below the GRU's WGMMA_MIN_FLOPS (a few steps) the mma.sync tile as before."""
    for dtype in ("float16", "bfloat16"):
        t = _template(64, 1024, dtype=dtype)
        cfg, why = t.analytic_pick(HOPPER)
        assert cfg.in_wgmma == 1 and cfg.in_split == 0 and f"{dtype} on wgmma" in why
        compiled = t.compile(cfg, HOPPER)
        gemm = [c for c in compiled.calls if c.func.startswith("lstm_gemm_x")]
        assert [(c.func, c.args) for c in gemm] == [("lstm_gemm_x0", ("x", "w_ih0", "b_ih0", "gi"))]
        assert compiled.prepare == () and "xs0" not in t.for_config(cfg).buffers()
        body = compiled.source[re.search(r"lstm_gemm_x0_kernel\([^)]*\) \{", compiled.source).start():]
        assert "CUtensorMap a_map" in body[:400] and "wgmma" in body[:body.index("\n}\n")]
        assert t.params["in_wgmma"] == t.in_wgmma_tile.name and "in_wgmma" in t.shown_knobs(cfg)
        assert "in_wg_x" not in t.shown_knobs(cfg)
    assert _template(8, 256, seq=4, dtype="float16").analytic_pick(HOPPER)[0].in_wgmma == 0


def test_what_the_16_bit_input_gemm_on_wgmma_refuses():
    half = _template(64, 1024, dtype="float16")
    cfg, _ = half.analytic_pick(HOPPER)
    space = half.space(HOPPER)
    assert "needs float32 x and W_ih" in space.infeasible_reason(cfg.replace(in_split=3))
    single = _template(32, 1024)
    split = single.analytic_pick(HOPPER)[0]
    assert "the float32 one runs there as TF32 parts" in single.space(HOPPER).infeasible_reason(
        split.replace(in_wgmma=1))
    reason = single.space(HOPPER).infeasible_reason(split.replace(in_split=0, in_tf32_parts=3, in_wgmma=1))
    assert single.in_wgmma_tile is None and "needs float16 or bfloat16 x and W_ih" in reason
    ampere = _template(64, 1024, dtype="float16", target=offline_cuda("sm_80"))
    assert ampere.in_wgmma_tile is None and ampere.analytic_pick(offline_cuda("sm_80"))[0].in_wgmma == 0
    fused = space.make(**{**half.default_config(HOPPER).as_dict(), "fuse_step": 1, "step_loop": 2,
                          "step_flags": 1, "step_flag_input": 1, "in_wgmma": 1})
    assert "no input GEMM to run on wgmma" in space.infeasible_reason(fused)


# ---- on a GPU machine -------------------------------------------------------------------------
GPU_CASES = {  # (shape, parts): one layer of two stored parts; two layers both ways, a ragged input, three
    "b16-h256-two-parts": (dict(seq=8, batch=16, inputs=256, hidden=256), 2),
    "2layer-bi-ragged-three-parts": (dict(seq=4, batch=32, inputs=200, hidden=192, layers=2, bidirectional=True), 3),
}


def _case_config(shape: dict, dtype: str, **knobs):
    """A GPU case's template and its pick with ``knobs`` over it."""
    t = shape_template(shape, dtype)
    return t, t.analytic_pick(HOPPER)[0].replace(**knobs)


@pytest.mark.parametrize("case", list(GPU_CASES))
def test_the_gpu_cases_build_offline(case):
    """What the GPU test below runs is in the space and builds (T·B rows a TF32 tile divides)."""
    shape, parts = GPU_CASES[case]
    t, config = _case_config(shape, "float32", in_split=3, in_tf32_parts=parts)
    assert t.space(HOPPER).infeasible_reason(config) is None
    assert "lstm_gemm_x0_kernel(" in t.compile(config, HOPPER).source


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_cuda_input_gemm_on_tf32_parts_matches_float64_at_float32_accuracy(case):
    """On a GPU machine: float32's error (one TF32 product alone is 1e-4, a missing bias or a
    part read from the wrong layer O(1)), twice on one input and once on another."""
    shape, parts = GPU_CASES[case]
    _, config = _case_config(shape, "float32", in_split=3, in_tf32_parts=parts)
    lstm = _cuda_against_float64(shape, "float32", config, 2e-6)
    assert lstm.config.in_split == 3 and lstm.compiled.prepare
    assert np.all(np.isfinite(lstm.executor.read("ws0")))


WGMMA_CASES = {  # one layer; two layers both ways (layer 1 reads 2H: its own GEMM kind)
    "b16-h256": dict(seq=8, batch=16, inputs=256, hidden=256),
    "2layer-bi": dict(seq=4, batch=32, inputs=200, hidden=192, layers=2, bidirectional=True),
}


@pytest.mark.parametrize("case", list(WGMMA_CASES))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_16_bit_gpu_cases_build_offline(case, dtype):
    t, config = _case_config(WGMMA_CASES[case], dtype, in_wgmma=1)
    assert t.space(HOPPER).infeasible_reason(config) is None
    assert "lstm_gemm_x0_kernel(" in t.compile(config, HOPPER).source


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, bound", [("float16", 5e-3), ("bfloat16", 3e-2)])
@pytest.mark.parametrize("case", list(WGMMA_CASES))
def test_cuda_16_bit_input_gemm_on_wgmma_matches_float64(case, dtype, bound):
    """On a GPU machine: 16-bit storage's error, where a wrong bias, gate column or layer's
    weights is O(1)."""
    shape = WGMMA_CASES[case]
    lstm = _cuda_against_float64(shape, dtype, _case_config(shape, dtype, in_wgmma=1)[1], bound)
    assert lstm.config.in_wgmma == 1 and not lstm.compiled.prepare
