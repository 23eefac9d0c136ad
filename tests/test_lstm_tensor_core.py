"""The LSTM on the tensor-core step kernel (``schedules/gru/tensor_core_step.py`` on four gates,
``tensor_core_cell.py``'s LSTM cell), with 16-bit state and with float32 state split into
float16 parts (``step_tc`` 2): CUDA generated and built offline, what the pick takes, the
refusals; on a GPU machine against float64, and the split form's range checks."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from tvm_ext.core.errors import TvmExtError
from tvm_ext.precision.precision import relative_error
from tvm_ext.schedules.gru.split_step import TensorCoreSplitStep
from tvm_ext.schedules.lstm import LSTM, LstmTemplate, lstm_reference
from tvm_ext.target import offline_cuda

from cubin_checks import ptxas_report
from test_lstm import _weights as lstm_weights

TC = dict(fuse_step=1, step_loop=2, step_barrier=2, step_tc=1, step_flags=1)
# (shape, knobs over the pick): 8-unit blocks with W_hh's fragments in registers, both directions and
# two layers over an H the blocks and k warps do not divide, 16- and 32-unit blocks of 32 rows with
# some fragments held (the B64 H1024 pick's form), warps along the units
CASES = {
    "b8-h512": (dict(seq=6, batch=8, inputs=512, hidden=512), {}),
    "2layer-bi-ragged": (dict(seq=5, batch=5, inputs=40, hidden=200, layers=2, bidirectional=True), {}),
    "b64-h1024": (dict(seq=4, batch=64, inputs=96, hidden=1024), {}),
    "unit-warps": (dict(seq=5, batch=20, inputs=64, hidden=256),
                   {**TC, "step_j": 32, "step_tc_rows": 16, "step_tc_kw": 1, "step_tc_nw": 4, "step_tc_wreg": 0,
                    "step_tc_warp_h": 0, "step_tc_poll": 8}),
}


def _template(shape: dict, dtype: str = "float16") -> LstmTemplate:
    return LstmTemplate(batch=shape["batch"], hidden=shape["hidden"], input=shape["inputs"], seq=shape["seq"],
                        layers=shape.get("layers", 1), bidirectional=shape.get("bidirectional", False),
                        dtype=dtype).with_tensor_cores(offline_cuda("sm_90a"))


def _config(template: LstmTemplate, knobs: dict):
    target = offline_cuda("sm_90a")
    pick, _ = template.analytic_pick(target)
    return pick.replace(**knobs)


def test_the_tensor_core_kernel_runs_the_lstm_cell_offline():
    """Built for an H100: the plan's calls (the paired words' init, the input GEMM, the step kernel,
    c_n's copy), four gates' gi a lane, c kept in the cell lanes' registers from the state's c half
    and the last c written back there, h sent as tagged 16-bit pairs."""
    target = offline_cuda("sm_90a")
    for shape, knobs in CASES.values():
        t = _template(shape)
        cfg = _config(t, knobs)
        assert cfg.step_tc == 1 and t.space(target).infeasible_reason(cfg) is None
        compiled = t.compile(cfg, target)
        assert [c.func for c in compiled.calls][:4] == ["lstm_init", "lstm_gemm_x0", "lstm_steps", "lstm_final_c"]
        body = compiled.source[compiled.source.index("lstm_steps_kernel("):]
        unit_tiles = cfg.step_j // cfg.step_tc_nw // 8
        assert f"float gi_reg_ptr[{4 * unit_tiles * 4}];" in body and "mma.sync.aligned.m16n8k16" in body
        # c0 from the state's c half (H on), the last c back there where c_n's copy reads it
        assert re.search(rf"\(\(float\)hs_ptr\[[^;]*\+ {shape['hidden']}\)\]\)", body) and "c_kept_ptr" in body
        assert re.search(r"hs_ptr\[[^;]*\] = \(\(half\)c_kept_ptr\[\d+\]\);", body)
        assert "__nv_atomic_store_n" in body and re.search(r"ld\.relaxed\.gpu|__nv_atomic_load", compiled.source)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("batch, hidden", [(8, 512), (64, 1024), (32, 1024)])
def test_the_picks_build_without_spilling(tmp_path, batch, hidden):
    """ptxas on the picks: four gates' sums and float32 gi beside W's held fragments fit a lane's
    registers (at H1024 only with the poll words halved: 64 of them spilled 228 bytes)."""
    t = _template(dict(seq=8, batch=batch, inputs=hidden, hidden=hidden))
    cfg, _ = t.analytic_pick(offline_cuda("sm_90a"))
    assert cfg.step_tc == 1
    report = ptxas_report(t.compile(cfg, offline_cuda("sm_90a")).source, tmp_path)
    steps = report[report.index("'lstm_steps_kernel'"):]
    assert " 0 bytes spill stores" in steps[:400], steps[:400]


def test_the_pick_takes_the_kernel_for_16_bit_state_from_batch_2():
    """16-bit state on CUDA from batch 2 where its grid is resident on 256 threads a block or
    fewer (the GRU's rule and blocks); one row stays on the flag-exchange kernel, float32 never
    takes it, and blocks of 512 threads (B128 H1024: a lane capped at 128 registers) leave it
    to the unfused steps, as does H2048 (no grid resident)."""
    target = offline_cuda("sm_90a")
    for batch, hidden, dtype, kernel in ((2, 256, "float16", "tensor-core"), (8, 512, "bfloat16", "tensor-core"),
                                         (64, 1024, "float16", "tensor-core"), (1, 256, "float16", "flag-exchange"),
                                         (128, 1024, "float16", "the unfused"), (64, 2048, "float16", "the unfused")):
        cfg, why = _template(dict(seq=8, batch=batch, inputs=hidden, hidden=hidden), dtype).analytic_pick(target)
        assert why.startswith(kernel) and (cfg.step_tc == 1) == (kernel == "tensor-core"), (batch, hidden, why)


def test_the_pick_takes_32_unit_blocks_of_four_unit_warps_from_batch_32_at_h768():
    """From 32 rows at H768 and more the B64 H1024 pick's blocks (32 units on four unit warps, two
    k warps, the first k slices' fragments held) where their grid is resident; below, the GRU's."""
    target = offline_cuda("sm_90a")
    for batch, hidden, wide in ((32, 1024, True), (32, 768, True), (48, 1024, True), (64, 1024, True),
                                (16, 1024, False), (32, 512, False), (8, 768, False)):
        cfg, why = _template(dict(seq=8, batch=batch, inputs=hidden, hidden=hidden)).analytic_pick(target)
        assert cfg.step_tc == 1
        assert ((cfg.step_j, cfg.step_tc_nw, cfg.step_tc_kw, cfg.step_tc_wreg) == (32, 4, 2, 3)) == wide, \
            (batch, hidden, why)


def test_the_pick_takes_the_split_kernel_for_float32_state_where_the_gru_does():
    """float32 from batch 8, and from batch 4 at H512 or more with h's low parts stacked (the
    GRU's rule), where W_hh's parts and the block's rows fit: 8-unit blocks of 16 rows, two
    values a word at B32 H512; the flag-exchange kernel below; from batch 32 where no such grid
    is resident (B32-B64 H1024) the split kernel behind the grid barrier, h streamed in chunks."""
    target = offline_cuda("sm_90a")
    for batch, hidden, kernel, stacked, pairs in ((8, 512, "tensor-core", 1, 1), (4, 1024, "tensor-core", 1, 1),
                                                 (32, 512, "tensor-core", 0, 2), (8, 1024, "tensor-core", 1, 1),
                                                 (4, 256, "flag-exchange", 0, 1), (1, 256, "flag-exchange", 0, 1),
                                                 (64, 1024, "split tensor-core", 0, 1),
                                                 (32, 1024, "split tensor-core", 0, 1)):
        cfg, why = _template(dict(seq=8, batch=batch, inputs=hidden, hidden=hidden), "float32").analytic_pick(target)
        assert why.startswith(kernel) and (cfg.step_tc == 2) == (kernel != "flag-exchange"), (batch, hidden, why)
        assert cfg.step_flags == (kernel != "split tensor-core"), (batch, hidden, why)
        assert (cfg.step_tc_stack, cfg.step_split_words) == (stacked, pairs), (batch, hidden, why)
        assert (cfg.step_tc == 2) == ("W_hh of 4 gates as float16 high and low parts" in why)


def test_the_kernel_refuses_what_it_does_not_run():
    """16-bit state only whole (step_tc 1) with exchange words, float32 state only split into parts
    (step_tc 2: without exchange words the kernel behind the grid barrier), nor off CUDA."""
    target = offline_cuda("sm_90a")
    t = _template(dict(seq=4, batch=8, inputs=64, hidden=64))
    cfg = _config(t, TC)
    assert "exchanges h as tagged words" in t.space(target).infeasible_reason(cfg.replace(step_flags=0))
    assert "needs float32 h and W_hh" in t.space(target).infeasible_reason(cfg.replace(step_tc=2))
    single = LstmTemplate(batch=8, hidden=64, input=64, seq=4)
    assert "both float16 or both bfloat16" in single.space(target).infeasible_reason(
        single.default_config(target).replace(**TC, step_j=8))
    split = single.default_config(target).replace(**{**TC, "step_tc": 2}, step_j=8)
    assert isinstance(single.step_variant(split.replace(step_flags=0)), TensorCoreSplitStep)  # the grid barrier's


# float32 shapes on the split kernel (knobs over the pick): stacked low parts at B8, two values a word at
# B16, one a word over a ragged bidirectional 2-layer H, W's fragments partly held at H1024
SPLIT = dict(fuse_step=1, step_loop=2, step_barrier=2, step_tc=2, step_flags=1, step_j=8, step_tc_rows=16,
             step_tc_kw=8, step_tc_nw=1, step_tc_acc=1)
SPLIT_CASES = {
    "b8-h512-stacked": (dict(seq=6, batch=8, inputs=512, hidden=512), {}),
    "b16-h256-pairs": (dict(seq=5, batch=16, inputs=96, hidden=256), {}),
    "2layer-bi-ragged": (dict(seq=5, batch=5, inputs=40, hidden=200, layers=2, bidirectional=True),
                         {**SPLIT, "step_tc_wreg": 1, "step_tc_stack": 1}),
    "b8-h1024-held": (dict(seq=4, batch=8, inputs=64, hidden=1024), {}),
}


# float32 shapes on the split kernel behind the grid barrier (``split_step.py``): the B64 H1024 pick (64
# rows a block), 32 rows over a ragged batch and H, two bidirectional layers with K past the hidden size
GRID = dict(fuse_step=1, step_loop=2, step_barrier=2, step_tc=2, step_flags=0, step_j=8, step_tc_nw=1,
            step_tc_ahead=2)
GRID_CASES = {
    "b64-h1024": (dict(seq=5, batch=64, inputs=96, hidden=1024), {}),
    "b40-h96-rows32": (dict(seq=6, batch=40, inputs=72, hidden=96), {**GRID, "step_tc_rows": 32, "step_tc_kw": 4}),
    "2layer-bi-ragged": (dict(seq=5, batch=5, inputs=40, hidden=200, layers=2, bidirectional=True),
                         {**GRID, "step_tc_rows": 16, "step_tc_kw": 2}),
}


def test_the_grid_barrier_split_kernel_runs_the_lstm_cell_offline():
    """Built for an H100: four gates' parts staged, the cell lanes' c read from the state's c half
    once and written back after the last step, h streamed in chunks, a grid barrier a step."""
    target = offline_cuda("sm_90a")
    for shape, knobs in GRID_CASES.values():
        t = _template(shape, "float32")
        cfg = _config(t, knobs)
        assert (cfg.step_tc, cfg.step_flags) == (2, 0) and t.space(target).infeasible_reason(cfg) is None
        compiled = t.compile(cfg, target)
        assert [c.func for c in compiled.calls][:4] == ["lstm_init", "lstm_gemm_x0", "lstm_steps", "lstm_final_c"]
        body = compiled.source[compiled.source.index("lstm_steps_kernel("):]
        assert f"float gi_reg[{4 * 4}];" in body.replace("_ptr", "") and "* 0x1p+8f" in body
        assert re.search(rf"\(float\)hs_ptr\[[^;]*\+ {shape['hidden']}\)\]", body) or \
            re.search(rf"hs_ptr\[[^;]*\+ {shape['hidden']}\)\]", body)  # c0 from the state's c half
        assert "hx_ptr" not in body and "bar_ptr" in body  # the grid barrier, no exchange words


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("batch, hidden", [(64, 1024), (32, 1024)])
def test_the_grid_barrier_split_picks_build_without_spilling(tmp_path, batch, hidden):
    t = _template(dict(seq=8, batch=batch, inputs=hidden, hidden=hidden), "float32")
    cfg, _ = t.analytic_pick(offline_cuda("sm_90a"))
    assert (cfg.step_tc, cfg.step_flags) == (2, 0)
    report = ptxas_report(t.compile(cfg, offline_cuda("sm_90a")).source, tmp_path)
    steps = report[report.index("'lstm_steps_kernel'"):]
    assert " 0 bytes spill stores" in steps[:400], steps[:400]


def test_the_split_kernel_runs_the_lstm_cell_offline():
    """Built for an H100: W_hh's four gates staged as scaled float16 high and low parts, c kept in
    the cell lanes' registers, h sent as tagged float32 words (or pairs with a tag bit), and the
    init writing those words (not the 16-bit pairs)."""
    target = offline_cuda("sm_90a")
    for shape, knobs in SPLIT_CASES.values():
        t = _template(shape, "float32")
        cfg = _config(t, knobs)
        assert cfg.step_tc == 2 and t.space(target).infeasible_reason(cfg) is None
        compiled = t.compile(cfg, target)
        body = compiled.source[compiled.source.index("lstm_steps_kernel("):]
        assert "c_kept_ptr" in body and "h_kept_ptr" in body and "mma.sync.aligned.m16n8k16" in body
        assert "* 0x1p+8f" in body  # W_hh's parts scaled by SPLIT_WEIGHT_SCALE
        init = compiled.source[compiled.source.rindex("lstm_init_kernel("):]
        init = init[:init.index("\n}\n")]
        # h0's words: float32 bits beside the tag 0, or (pairs) two values a word, slot 1 tagged 1
        assert ("(*(uint *)(&(" in init) and ("(uint64_t)1ULL;" in init) == (cfg.step_split_words == 2), init


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("batch, hidden", [(8, 512), (32, 512), (8, 1024)])
def test_the_split_picks_build_without_spilling(tmp_path, batch, hidden):
    t = _template(dict(seq=8, batch=batch, inputs=hidden, hidden=hidden), "float32")
    cfg, _ = t.analytic_pick(offline_cuda("sm_90a"))
    assert cfg.step_tc == 2
    report = ptxas_report(t.compile(cfg, offline_cuda("sm_90a")).source, tmp_path)
    steps = report[report.index("'lstm_steps_kernel'"):]
    assert " 0 bytes spill stores" in steps[:400], steps[:400]


def _weights(shape: dict, rng: np.random.Generator) -> dict:
    return lstm_weights(shape["inputs"], shape["hidden"], shape.get("layers", 1),
                        2 if shape.get("bidirectional") else 1, rng=rng)


def _cuda_against_float64(shape: dict, dtype: str, config, bound: float) -> LSTM:
    """The LSTM built on CUDA against float64 twice on one input and once on another (a tag or a c
    left from the call before would be read as this one's)."""
    layers, dirs = shape.get("layers", 1), 2 if shape.get("bidirectional") else 1
    lstm = LSTM.build("cuda", shape["inputs"], shape["hidden"], num_layers=layers,
                      bidirectional=shape.get("bidirectional", False), batch=shape["batch"], seq=shape["seq"],
                      dtype=dtype, config=config)
    rng = np.random.default_rng(3)
    weights = _weights(shape, rng)
    lstm.load_numpy(weights)
    states = (layers * dirs, shape["batch"], shape["hidden"])
    calls = [(rng.uniform(-1, 1, (shape["seq"], shape["batch"], shape["inputs"])).astype(np.float32),
              rng.uniform(-1, 1, states).astype(np.float32), rng.uniform(-1, 1, states).astype(np.float32))
             for _ in range(2)]
    for x, h0, c0 in (calls[0], calls[0], calls[1]):
        out, (h_n, c_n) = lstm(x, (h0, c0))
        for ours, ref in zip((out, h_n, c_n), lstm_reference(x, weights, h0, c0, layers, dirs == 2)):
            assert relative_error(ours, ref) < bound
    return lstm


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, bound", [("float16", 5e-3), ("bfloat16", 3e-2)])
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_tensor_core_lstm_matches_float64(case, dtype, bound):
    """On a GPU machine: the error is 16-bit storage's, where a wrong gate or a lost c is O(1)."""
    shape, knobs = CASES[case]
    lstm = _cuda_against_float64(shape, dtype, knobs or None, bound)
    assert lstm.config.step_tc == 1


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GRID_CASES))
def test_cuda_grid_barrier_split_lstm_matches_float64_at_float32_accuracy(case):
    """On a GPU machine: float32's error behind the grid barrier (a block reading h before every
    block stored it, or a c lost between steps, is far past it)."""
    shape, knobs = GRID_CASES[case]
    lstm = _cuda_against_float64(shape, "float32", _config(_template(shape, "float32"), knobs), 2e-6)
    assert (lstm.config.step_tc, lstm.config.step_flags) == (2, 0) and lstm.split_inputs() == {"h0": "step_tc 2"}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_cuda_split_lstm_matches_float64_at_float32_accuracy(case):
    """On a GPU machine: float32's error (the parts drop 2 of 24 bits), where a lost low part is
    1e-3 and a wrong gate O(1); an h_0 or a W_hh past what their float16 parts hold is refused
    before a call runs on it."""
    shape, knobs = SPLIT_CASES[case]
    config = _config(_template(shape, "float32"), knobs)
    lstm = _cuda_against_float64(shape, "float32", config, 2e-6)
    assert lstm.config.step_tc == 2 and lstm.split_inputs() == {"h0": "step_tc 2"}
    states = (shape.get("layers", 1) * (2 if shape.get("bidirectional") else 1), shape["batch"], shape["hidden"])
    x = np.zeros((shape["seq"], shape["batch"], shape["inputs"]), np.float32)
    with pytest.raises(TvmExtError, match="LSTM h0 has \\|value\\| 70000, beyond what its float16 parts hold"):
        lstm(x, (np.full(states, 7e4, np.float32), np.zeros(states, np.float32)))
    weights = _weights(shape, np.random.default_rng(4))
    weights["weight_hh_l0"][0, 0] = 300.0
    with pytest.raises(TvmExtError, match="weight_hh_l0 has \\|value\\| 300, .*build without step_tc 2"):
        lstm.load_numpy(weights)
