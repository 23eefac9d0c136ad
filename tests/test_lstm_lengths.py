"""Variable lengths on the LSTM's fused step kernels (``schedules/lstm/lengths.py``): the plan's
hold, the backward h0's products and the forward h_n's copy around every step kernel family,
the pick unchanged by lengths; on a GPU machine every family against float64 with NaN in the
padding, nonzero h0 and c0, and other lengths on reruns."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_ext.precision.precision import relative_error
from tvm_ext.schedules.lstm import LSTM, LstmTemplate, lstm_reference
from tvm_ext.target import offline_cuda

from test_lstm import _weights

FLAG = dict(fuse_step=1, step_loop=2, step_flags=1)
# (shape, dtype, knobs over the pick, the family's knobs the built config must have, error bound)
CASES = {
    "flag-2layer-bi": (dict(seq=7, batch=3, inputs=24, hidden=40, layers=2, bidirectional=True), "float32",
                       FLAG, dict(step_flags=1, step_tc=0), 2e-6),
    "tensor-core-f16-bi": (dict(seq=6, batch=8, inputs=64, hidden=256, bidirectional=True), "float16", {},
                           dict(step_tc=1), 5e-3),
    "tensor-core-f16-b64-h1024": (dict(seq=5, batch=64, inputs=96, hidden=1024), "float16", {},
                                  dict(step_tc=1), 5e-3),
    "split-flags-f32-2layer": (dict(seq=5, batch=8, inputs=64, hidden=512, layers=2), "float32", {},
                               dict(step_tc=2, step_flags=1), 2e-6),
    "grid-split-f32-b64-h1024": (dict(seq=5, batch=64, inputs=96, hidden=1024), "float32", {},
                                 dict(step_tc=2, step_flags=0), 2e-6),
    "persistent-fused-bi": (dict(seq=6, batch=3, inputs=24, hidden=40, bidirectional=True), "float32",
                            dict(step_flags=0, step_j=16, step_k=16, step_ks=2, step_loop=2),
                            dict(step_tc=0, step_flags=0), 2e-6),
}


def _template(shape: dict, dtype: str, variable_lengths: bool = True) -> LstmTemplate:
    return LstmTemplate(batch=shape["batch"], hidden=shape["hidden"], input=shape["inputs"], seq=shape["seq"],
                        layers=shape.get("layers", 1), bidirectional=shape.get("bidirectional", False),
                        dtype=dtype, variable_lengths=variable_lengths).with_tensor_cores(offline_cuda("sm_90a"))


def test_the_plan_holds_gi_and_puts_back_h0_and_h_n_around_each_step_kernel():
    """Built for an H100: each fused family's plan holds gi after the input GEMM, adds the
    backward h0's products (both directions only) and copies the forward h_n after the steps;
    the pick with lengths is the pick without, but for the flag-exchange kernel's own input
    projection, which lengths refuse (the input GEMM runs before it instead)."""
    target = offline_cuda("sm_90a")
    for name, (shape, dtype, knobs, family, _) in CASES.items():
        t = _template(shape, dtype)
        pick, why = t.analytic_pick(target)
        fixed, fixed_why = _template(shape, dtype, variable_lengths=False).analytic_pick(target)
        assert pick == fixed.replace(step_flag_input=0), name
        assert pick.step_flag_input == 0 and (why == fixed_why) == (fixed.step_flag_input == 0), name
        cfg = pick.replace(**knobs)
        assert t.space(target).infeasible_reason(cfg) is None, name
        assert all(getattr(cfg, k) == v for k, v in family.items()), name
        funcs = [call.func for call in t.compile(cfg, target).calls]
        steps = next(f for f in funcs if f.startswith("lstm_steps"))
        layer_calls = funcs[:funcs.index("lstm_last_h") + 1]
        held = ["lstm_hold", "lstm_h0_products", "lstm_inject"] if shape.get("bidirectional") else ["lstm_hold"]
        assert layer_calls[layer_calls.index("lstm_hold"):layer_calls.index(steps)] == held, name
        assert funcs.count("lstm_last_h") == funcs.count("lstm_hold") == shape.get("layers", 1), name


def _lengths(batch: int, seq: int, rng: np.random.Generator) -> np.ndarray:
    lengths = rng.integers(1, seq + 1, batch).astype(np.int32)
    lengths[rng.integers(batch)] = seq
    return lengths


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_lstm_lengths_match_float64_on_every_step_kernel(case):
    """On a GPU machine: three calls, each with other lengths (a row of the full length among
    them), NaN in the padding, nonzero h0 and c0; out, h_n and c_n against float64 within the
    family's error (a row run past its length or a missed h0 is O(1)), outputs past a length
    exactly zero."""
    shape, dtype, knobs, family, bound = CASES[case]
    layers, dirs = shape.get("layers", 1), 2 if shape.get("bidirectional") else 1
    target = offline_cuda("sm_90a")
    pick, _ = _template(shape, dtype).analytic_pick(target)
    lstm = LSTM.build("cuda", shape["inputs"], shape["hidden"], num_layers=layers, bidirectional=dirs == 2,
                      batch=shape["batch"], seq=shape["seq"], dtype=dtype, config=pick.replace(**knobs),
                      variable_lengths=True)
    assert all(getattr(lstm.config, k) == v for k, v in family.items())
    rng = np.random.default_rng(7)
    weights = _weights(shape["inputs"], shape["hidden"], layers, dirs, rng=rng)
    lstm.load_numpy(weights)
    states = (layers * dirs, shape["batch"], shape["hidden"])
    for _ in range(3):
        x = rng.uniform(-1, 1, (shape["seq"], shape["batch"], shape["inputs"])).astype(np.float32)
        h0, c0 = (rng.uniform(-1, 1, states).astype(np.float32) for _ in range(2))
        lengths = _lengths(shape["batch"], shape["seq"], rng)
        past = np.arange(shape["seq"])[:, None] >= lengths[None, :]
        padded = x.copy()
        padded[past] = np.nan
        out, (h_n, c_n) = lstm(padded, (h0, c0), lengths)
        want = lstm_reference(x, weights, h0, c0, layers, dirs == 2, lengths=lengths)
        for ours, ref in zip((out, h_n, c_n), want):
            assert relative_error(ours, ref) < bound
        assert not np.any(np.asarray(out, np.float32)[past])
