"""LSTM inference (``schedules.lstm``: the GRU's pipeline with the LSTM's cell on the fused step
kernel): real OpenCL runs on PoCL against a float64 numpy reference of torch.nn.LSTM's
equations and against torch itself; CUDA code generated offline; ``tune lstm`` end to end."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tvm_ext.core.errors import TvmExtError
from tvm_ext.schedules.lstm import LSTM, LstmTemplate, lstm_reference
from tvm_ext.target import offline_cuda


def _weights(inputs: int, hidden: int, layers: int, dirs: int, seed: int = 0, bias: bool = True,
             rng: np.random.Generator | None = None) -> dict:
    """nn.LSTM's weights by PyTorch's names in its init range, drawn from ``rng`` (default: one seeded
    ``seed``) in the order weight_ih, weight_hh, bias_ih, bias_hh of each layer and direction."""
    rng = rng if rng is not None else np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(hidden)
    out = {}
    for layer in range(layers):
        k = inputs if layer == 0 else dirs * hidden
        for sfx in ("", "_reverse")[:dirs]:
            dims = {"weight_ih": (4 * hidden, k), "weight_hh": (4 * hidden, hidden)}
            if bias:
                dims.update(bias_ih=(4 * hidden,), bias_hh=(4 * hidden,))
            for name, shape in dims.items():
                out[f"{name}_l{layer}{sfx}"] = rng.uniform(-bound, bound, shape).astype(np.float32)
    return out


def _run(opencl, seq, batch, inputs, hidden, layers=1, bidirectional=False, config=None, bias=True):
    """Our LSTM and the float64 reference on one input set: ((out, h_n, c_n), reference)."""
    dirs = 2 if bidirectional else 1
    lstm = LSTM.build(opencl, inputs, hidden, num_layers=layers, bidirectional=bidirectional, batch=batch,
                      seq=seq, config=config)
    weights = _weights(inputs, hidden, layers, dirs, bias=bias)
    lstm.load_numpy(weights)
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (seq, batch, inputs)).astype(np.float32)
    h0, c0 = (rng.uniform(-1, 1, (layers * dirs, batch, hidden)).astype(np.float32) for _ in range(2))
    out, (h_n, c_n) = lstm(x, (h0, c0))
    return (out, h_n, c_n), lstm_reference(x, weights, h0, c0, layers, bidirectional)


def _close(actual, expected) -> None:
    for a, e in zip(actual, expected):
        assert a.shape == e.shape
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=2e-5)


# Each a different form of the step kernel: the default (a thread a unit, k slices of 16), split-K
# with W_hh's slice in shared memory and this step's gi prefetched, split-K with each thread's share
# of W_hh in registers and a pipelined h slice, threads and registers along rows and units, and a
# k extent padded past H (18 over four threads' slices of 16).
CASES = {
    "default-2layer-bi": (dict(seq=5, batch=3, inputs=7, hidden=13, layers=2, bidirectional=True), None),
    "ks2-w-shared-prefetch-3layer": (dict(seq=4, batch=5, inputs=5, hidden=20, layers=3),
                                     dict(step_j=8, step_k=8, step_ks=2, step_w_onchip=1, step_prefetch=1)),
    "ks4-w-registers-pipeline-bi": (dict(seq=3, batch=5, inputs=6, hidden=20, bidirectional=True),
                                    dict(step_j=4, step_k=8, step_ks=4, step_w_onchip=2, step_pipeline=1)),
    "rows-and-units-per-thread": (dict(seq=3, batch=5, inputs=6, hidden=18),
                                  dict(step_j=4, step_u=2, step_bt=2, step_b=2, step_k=8, step_ks=2)),
    "padded-k": (dict(seq=3, batch=2, inputs=6, hidden=18), dict(step_j=8, step_k=16, step_ks=4)),
    # the unfused steps: the hidden GEMM (batched over directions), then the cell kernel
    "unfused-2layer-bi": (dict(seq=4, batch=3, inputs=5, hidden=11, layers=2, bidirectional=True),
                          dict(fuse_step=0, cell_block=32)),
    "unfused-gemm-tile": (dict(seq=3, batch=6, inputs=7, hidden=20), dict(fuse_step=0, cell_block=64, hid_wg_x=8,
                                                                          hid_wg_y=2, hid_task_x=2, hid_k_step=8)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_the_float64_reference(opencl, case):
    shape, config = CASES[case]
    _close(*_run(opencl, **shape, config=config))


def test_c_is_carried_from_step_to_step_and_layer_to_layer(opencl):
    """c0 reaches the first step of each layer and c_n is each layer's last c: a run whose c0 is
    zero differs from one with c0, and each matches its own reference."""
    (out, _, c_n), ref = _run(opencl, seq=4, batch=2, inputs=3, hidden=9, layers=2)
    _close((out, c_n), (ref[0], ref[2]))
    assert np.abs(ref[2]).max() > 0.1  # c_n is not trivially small


def test_matches_torch_lstm_with_batch_first_and_without_bias(opencl):
    torch = pytest.importorskip("torch")
    net = torch.nn.LSTM(6, 10, num_layers=2, bidirectional=True, batch_first=True, bias=False).double()
    lstm = LSTM.build(opencl, 6, 10, num_layers=2, bidirectional=True, batch_first=True, batch=3, seq=4)
    lstm.load_state_dict(net.state_dict())
    x = np.random.default_rng(2).uniform(-1, 1, (3, 4, 6)).astype(np.float32)
    with torch.no_grad():
        ref_out, (ref_h, ref_c) = net(torch.from_numpy(x).double())
    out, (h_n, c_n) = lstm(x)
    _close((out, h_n, c_n), (ref_out.numpy(), ref_h.numpy(), ref_c.numpy()))


@pytest.mark.parametrize("config", [None, {"fuse_step": 0}], ids=["fused", "unfused"])
def test_a_bfloat16_lstm_is_within_bfloat16s_rounding(opencl, config):
    """bfloat16 storage (x, weights, h, c, out; products and cell in float32): normwise errors of a
    few bfloat16 roundings (2^-8), not more; a 16-bit type the device lacks is one error."""
    from tvm_ext.precision.precision import relative_error

    lstm = LSTM.build(opencl, 6, 10, num_layers=2, bidirectional=True, batch=3, seq=5, dtype="bfloat16", config=config)
    weights = _weights(6, 10, 2, 2)
    lstm.load_numpy(weights)
    x = np.random.default_rng(4).uniform(-1, 1, (5, 3, 6)).astype(np.float32)
    out, (h_n, c_n) = lstm(x)
    for ours, ref in zip((out, h_n, c_n), lstm_reference(x, weights, None, None, 2, True)):
        assert relative_error(ours, ref) < 1e-2
    if "float16" not in opencl.float_dtypes:
        with pytest.raises(TvmExtError, match="has no float16 arithmetic"):
            LSTM.build(opencl, 6, 10, dtype="float16")


@pytest.mark.parametrize("config", [None, {"fuse_step": 0}], ids=["fused", "unfused"])
def test_variable_lengths_stop_each_row_at_its_own_length(opencl, config):
    """``variable_lengths``: each row stops at its own length as a ``PackedSequence`` does (outputs
    past it zero, h_n and c_n at its last step, the backward direction starting there from h0
    and c0), two layers both directions, unsorted lengths, NaN in the padding; on the fused step
    kernel (gi held, the backward h0's products added, the forward h_n copied: ``lengths.py``)
    and on the unfused steps; bad lengths are one error each."""
    lstm = LSTM.build(opencl, 5, 9, num_layers=2, bidirectional=True, batch=4, seq=6, variable_lengths=True,
                      config=config)
    assert lstm.config.fuse_step == (0 if config else 1)
    weights = _weights(5, 9, 2, 2)
    lstm.load_numpy(weights)
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (6, 4, 5)).astype(np.float32)
    h0, c0 = (rng.uniform(-1, 1, (4, 4, 9)).astype(np.float32) for _ in range(2))
    lengths = np.array([3, 6, 1, 5], np.int32)
    padded = x.copy()
    padded[np.arange(6)[:, None] >= lengths[None, :]] = np.nan  # never reaches the state
    got = lstm(padded, (h0, c0), lengths)
    want = lstm_reference(x, weights, h0, c0, 2, True, lengths=lengths)
    _close((got[0], *got[1]), want)
    assert not np.any(got[0][3:, 0]) and not np.any(got[0][1:, 2])  # past a row's length: zeros
    _close((lstm(x, (h0, c0))[0],), (lstm_reference(x, weights, h0, c0, 2, True)[0],))  # lengths left out: all T
    with pytest.raises(TvmExtError, match=r"LSTM lengths\[1\] = 7 is outside 1..6"):
        lstm(x, (h0, c0), [3, 7, 1, 5])
    with pytest.raises(TvmExtError, match="built for full-length rows"):
        LSTM.build(opencl, 5, 9, batch=4, seq=6).load_numpy(_weights(5, 9, 1, 1))(x, None, lengths)


def test_variable_lengths_on_one_direction_and_the_refused_input_projection(opencl):
    """One direction, three layers, float32 on the fused steps: each row's h_n from its last
    step (the forward h_n's copy), c_n held; the flag-exchange kernel's own input projection
    (``step_flag_input`` 1) is refused with variable lengths, with the reason."""
    lstm = LSTM.build(opencl, 7, 5, num_layers=3, batch=3, seq=7, variable_lengths=True)
    weights = _weights(7, 5, 3, 1, seed=2)
    lstm.load_numpy(weights)
    rng = np.random.default_rng(6)
    x = rng.uniform(-1, 1, (7, 3, 7)).astype(np.float32)
    h0, c0 = (rng.uniform(-1, 1, (3, 3, 5)).astype(np.float32) for _ in range(2))
    lengths = np.array([2, 7, 4], np.int32)
    got = lstm(x, (h0, c0), lengths)
    _close((got[0], *got[1]), lstm_reference(x, weights, h0, c0, 3, False, lengths=lengths))
    space = lstm.template.space(opencl)
    flags = lstm.config.replace(step_loop=2, step_flags=1, step_flag_input=1)
    assert "variable lengths hold each row's gates in gi" in space.infeasible_reason(flags)


def test_bad_input_is_one_error(opencl):
    lstm = LSTM.build(opencl, 4, 8, batch=2, seq=3)
    with pytest.raises(TvmExtError, match="weights are not loaded"):
        lstm(np.zeros((3, 2, 4), np.float32))
    with pytest.raises(TvmExtError, match="proj_size is not supported"):
        lstm.load_numpy({**_weights(4, 8, 1, 1), "weight_hr_l0": np.zeros((4, 8), np.float32)})
    with pytest.raises(TvmExtError, match=r"weight_hh_l0' has shape \(24, 8\), expected \(32, 8\)"):
        lstm.load_numpy({**_weights(4, 8, 1, 1), "weight_hh_l0": np.zeros((24, 8), np.float32)})
    lstm.load_numpy(_weights(4, 8, 1, 1))
    with pytest.raises(TvmExtError, match=r"input has shape \(2, 3, 4\), expected \(3, 2, 4\)"):
        lstm(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(TvmExtError, match="c0 has shape"):
        lstm(np.zeros((3, 2, 4), np.float32), (np.zeros((1, 2, 8)), np.zeros((2, 2, 8))))
    with pytest.raises(TvmExtError, match="unknown LSTM knobs"):
        LSTM.build(opencl, 4, 8, config={"step_cell": 1})  # (the GRU's resident-cell kernel's knob)
    with pytest.raises(TvmExtError, match="tensor-core step kernel .* is CUDA's persistent kernel only"):
        LSTM.build(opencl, 4, 8, config={"step_tc": 1})
    with pytest.raises(TvmExtError, match="dtype 'int8' is not supported"):
        LstmTemplate(batch=1, hidden=4, input=4, seq=2, dtype="int8")
    with pytest.raises(TvmExtError, match="CUDA only"):
        LSTM.build(opencl, 4, 8, config={"step_loop": 1})


def test_persistent_cuda_kernel_runs_every_step_behind_a_grid_barrier():
    """CUDA, generated here: the persistent form is one launch a layer looping over the steps
    with the barrier, W_hh's share loaded into registers once, before the loop; four gates' sums
    a unit; c_n copied after each layer's steps."""
    t = LstmTemplate(batch=2, hidden=64, input=32, seq=5, layers=2)
    target = offline_cuda()
    cfg = t.default_config(target).replace(step_j=16, step_k=16, step_ks=4, step_w_onchip=2, step_loop=2,
                                           step_prefetch=1)
    assert t.space(target).infeasible_reason(cfg) is None
    compiled = t.compile(cfg, target)
    layer = ["lstm_init", "lstm_gemm_x{}", "lstm_steps", "lstm_final_c"]  # layer 1's input GEMM is 64 deep
    assert [c.func for c in compiled.calls] == [f.format(0) for f in layer] + [f.format(1) for f in layer]
    definition = re.search(r"lstm_steps_kernel\([^)]*\) {", compiled.source)
    kernel = compiled.source[definition.end():]
    kernel = kernel[:kernel.index("\n}\n")]
    loop = kernel.index("for (int s = 0;")
    assert "w_ptr[" in kernel[:loop] and "w_ptr[" not in kernel[loop:]  # W_hh's share loaded once
    assert "atomic" in kernel[loop:]  # the grid barrier
    # the accurate tanh of g and of c' (each -e / (2 + e) in both branches of its sign: 4 calls written),
    # c' computed once, in a register its tanh reads (not rewritten into h's expression)
    assert "fabsf(c_new_local_ptr[0])" in kernel and kernel.count("expm1f(") == 8
    # per step, every thread keeps 4 gates x 1 unit x 1 row of sums (not the GRU's 3)
    assert t.step_variant(cfg).w_registers() == 4 * (64 // 4)


def test_unfused_steps_are_a_gemm_then_a_cell_a_step_and_the_pick_at_a_large_16_bit_batch():
    """``fuse_step`` 0: per layer the init of h and c, the input GEMM, then per step the hidden GEMM
    and the cell kernel (which writes c_n itself: no copy after the steps); a 16-bit LSTM of 64 rows
    on CUDA whose tensor-core step kernel's grid is not resident (H2048) picks them, its hidden GEMM
    on an mma.sync tile (the GRU's rule), and builds."""
    target = offline_cuda()
    t = LstmTemplate(batch=3, hidden=16, input=16, seq=4, layers=2)
    calls = [c.func for c in t.compile(t.default_config(target).replace(fuse_step=0), target).calls]
    assert calls == (["lstm_init", "lstm_gemm_x0"] + ["lstm_gemm_h", "lstm_cell"] * 4) * 2
    half = LstmTemplate(batch=64, hidden=2048, input=2048, seq=4, dtype="float16").with_tensor_cores(target)
    pick, why = half.analytic_pick(target)
    assert pick.fuse_step == 0 and "tensor cores" in why and half.hid_tensor_core is not None
    assert half.hidden_gemm().uses_tensor_cores(target)
    compiled = half.compile(pick, target)
    assert "mma.sync" in compiled.source or "mma_sync" in compiled.source
    assert "step_j" not in half.shown_knobs(pick) and "hid_wg_x" in half.shown_knobs(pick)
    # float32 at 64 rows has no tensor-core tile for the unfused steps: the split step kernel behind the
    # grid barrier (W_hh's float16 parts on chip, persistent)
    single = LstmTemplate(batch=64, hidden=1024, input=1024, seq=4).with_tensor_cores(target)
    pick, why = single.analytic_pick(target)
    assert (pick.fuse_step, pick.step_loop, pick.step_tc, pick.step_flags) == (1, 2, 2, 0), why


def test_step_knobs_count_four_gates_in_their_limits():
    """A W_hh slice that fits shared memory for the GRU's three gates but not the LSTM's four is
    refused with the reason; the 16-bit LSTM's input GEMM takes a tensor-core tile on CUDA."""
    target = offline_cuda()
    t = LstmTemplate(batch=8, hidden=512, input=512, seq=4)
    cfg = t.default_config(target).replace(step_j=32, step_k=32, step_ks=4, step_w_onchip=1, step_loop=2)
    # 32 units x 4 gates x 512 x 4 B = 256 KiB; three gates would be 192 KiB
    assert "shared memory" in t.space(target).infeasible_reason(cfg)
    half = LstmTemplate(batch=8, hidden=512, input=512, seq=4, dtype="float16").with_tensor_cores(target)
    assert half.in_tensor_core is not None and half.params["in_tensor_core"]
    pick, why = half.analytic_pick(target)
    assert half.space(target).infeasible_reason(pick) is None and "persistent" in why


def test_tune_cli_tunes_the_whole_layer_and_a_rerun_resumes(tmp_path, capsys):
    from tvm_ext.tune import main

    records = tmp_path / "lstm.jsonl"
    args = ["lstm", "--batch", "2", "--hidden", "12", "--input", "5", "--seq", "3", "--bidirectional",
            "--trials", "3", "--population", "4", "--generations", "1", "--tourn-size", "1",
            "--workers", "1", "--records", str(records), "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "best" in out and "step_j=" in out and " ms " in out and "errors 0" in out
    measured = records.read_text().splitlines()
    assert 1 <= len(measured) <= 3
    assert main(args) == 0
    assert f"resumed: {len(measured)}" in capsys.readouterr().out


def test_tune_cli_tunes_variable_lengths_on_the_fused_steps(tmp_path, capsys):
    """``tune lstm --variable-lengths``: the template with lengths (its records keyed so), measured
    against float64 on random lengths, its best on the fused step kernel."""
    import json

    from tvm_ext.tune import main

    records = tmp_path / "lstm.jsonl"
    assert main(["lstm", "--batch", "3", "--hidden", "8", "--input", "5", "--seq", "4", "--variable-lengths",
                 "--trials", "2", "--population", "2", "--generations", "1", "--tourn-size", "1", "--workers", "1",
                 "--records", str(records), "--no-progress"]) == 0
    assert "errors 0" in capsys.readouterr().out
    measured = [json.loads(line) for line in records.read_text().splitlines()]
    assert measured and all(r["workload"]["params"].get("variable_lengths") is True for r in measured)
    assert any(r["config"]["fuse_step"] == 1 and not r.get("error_kind") and r["costs"] for r in measured)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [{"fuse_step": 0}] + [{"step_j": 16, "step_k": 16, "step_ks": 2, "step_loop": loop}
                                                      for loop in (0, 1, 2)])
def test_cuda_lstm_matches_the_reference(cfg):
    """On a GPU machine: the unfused steps, and the fused step kernel a launch per step, on the host
    loop and persistent, two layers both directions, an H the tiles do not divide; reruns reset
    the barrier."""
    for _ in range(2):
        _close(*_run("cuda", seq=9, batch=3, inputs=24, hidden=40, layers=2, bidirectional=True, config=cfg))


FLAG_CASES = {  # the flag-exchange step kernel: one row, rows past a warp's units, both directions and
    # layers over an H its warps do not divide, the input projected in it, 16-bit storage
    "b1": (dict(seq=9, batch=1, inputs=256, hidden=256), {}),
    "2layer-bi-ragged": (dict(seq=7, batch=3, inputs=24, hidden=40, layers=2, bidirectional=True), {}),
    "fused-input": (dict(seq=6, batch=2, inputs=40, hidden=96), {"step_flag_input": 1}),
    "units-8": (dict(seq=5, batch=8, inputs=64, hidden=64), {"step_flag_units": 8}),
    "fused-input-2layer": (dict(seq=5, batch=3, inputs=20, hidden=20, layers=2), {"step_flag_input": 1}),
}
FLAG = dict(fuse_step=1, step_loop=2, step_flags=1)


def test_the_flag_exchange_kernel_runs_the_lstm_cell_offline():
    """The flag-exchange step kernel (``schedules/gru/flag_step.py``) on four gates, built for an
    H100: the plan's calls (no input GEMM where the kernel projects x), each lane's W_hh share of
    four gates, c kept in the cell lane's register from the state's c half, c_n's source written
    there at the last step; the pick takes it at small batches and not where W's share does not
    fit (H1024)."""
    target = offline_cuda()
    for shape, knobs in FLAG_CASES.values():
        t = LstmTemplate(batch=shape["batch"], hidden=shape["hidden"], input=shape["inputs"], seq=shape["seq"],
                         layers=shape.get("layers", 1), bidirectional=shape.get("bidirectional", False))
        cfg = t.default_config(target).replace(**FLAG, **knobs)
        assert t.space(target).infeasible_reason(cfg) is None
        compiled = t.compile(cfg, target)
        funcs = [call.func for call in compiled.calls]
        assert funcs[:3] == (["lstm_init", "lstm_steps", "lstm_final_c"] if knobs.get("step_flag_input")
                             else ["lstm_init", "lstm_gemm_x0", "lstm_steps"])
        body = compiled.source[compiled.source.index("lstm_steps_kernel("):]
        kp = -(-shape["hidden"] // 32)
        assert f"w_r_ptr[{4 * kp}]" in body and "__nv_atomic_load_n" in body and "__nv_atomic_store_n" in body
        assert re.search(r"zh_ptr\[0\] = hs_ptr\[", body)  # c0 from the state's c half
        assert re.search(r"hs_ptr\[[^]]*\] = zh_ptr\[0\]", body)  # the last c where c_n's copy reads it
    deeper = LstmTemplate(batch=2, hidden=33, input=17, seq=4, layers=3, bidirectional=True).with_tensor_cores(target)
    pick, _ = deeper.analytic_pick(target)  # layer 1 reads 66 values a row, layer 0 17: the input GEMM stays
    assert (pick.step_flags, pick.step_flag_input) == (1, 0) and deeper.compile(pick, target).calls
    assert "each layer's input must be 17 deep (layer 1 reads 66)" in deeper.space(target).infeasible_reason(
        pick.replace(step_flag_input=1))
    # the flag-exchange kernel below the split tensor-core kernel's rows (batch 8, or 4 from H512)
    for batch, hidden, flags in ((1, 256, 1), (2, 512, 1), (7, 256, 1), (8, 512, 0), (4, 512, 0), (64, 1024, 0)):
        cfg, why = LstmTemplate(batch=batch, hidden=hidden, input=hidden, seq=8).with_tensor_cores(
            target).analytic_pick(target)
        assert (cfg.step_flags == 1 and cfg.step_tc == 0) == bool(flags) == why.startswith("flag-exchange"), why


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(FLAG_CASES))
def test_cuda_flag_exchange_lstm_matches_the_reference(case):
    """On a GPU machine: the flag-exchange step kernel against float64, twice (the words and the
    barrier flag reset by the init)."""
    shape, knobs = FLAG_CASES[case]
    for _ in range(2):
        _close(*_run("cuda", **shape, config={**FLAG, **knobs}))


def test_an_onnx_lstm_with_dynamic_axes_is_tuned_at_buckets_on_our_kernel(tmp_path):
    """What a user exports: ``nn.LSTM`` through torch's ONNX exporter with ``dynamic_axes`` (sequence
    and batch).  ``tune model --buckets seq=4,8`` tunes our LSTM plan at both and runs 6 steps on
    bucket 8's config, checked against the file; unbound, one error names the dimensions."""
    import subprocess
    import sys

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    path = str(tmp_path / "lstm.onnx")
    torch.onnx.export(torch.nn.LSTM(5, 9).eval(), (torch.randn(6, 2, 5),), path, dynamo=False, input_names=["x"],
                      output_names=["y", "h", "c"],
                      dynamic_axes={"x": {0: "seq", 1: "batch"}, "y": {0: "seq", 1: "batch"}, "h": {1: "batch"},
                                    "c": {1: "batch"}})
    base = [sys.executable, "-m", "tvm_ext.tune", "model", path, "--generations", "1", "--population", "2",
            "--records", str(tmp_path / "r.jsonl"), "--database", str(tmp_path / "db"), "--no-progress"]
    p = subprocess.run(base + ["--buckets", "seq=4,8", "--model-option", "seq=6", "--model-option", "batch=2"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("tuned (LSTM plan)") == 2 and "seq = 6: lstm lv" in p.stdout and "bucket 8" in p.stdout
    assert "(ok)" in p.stdout and "unrolled" not in p.stderr
    bad = subprocess.run(base, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and bad.stderr.startswith(
        "error: LSTM input of shape (seq * batch, 5) has symbolic dimensions (batch, seq)"), bad.stderr


def test_benchmark_script_builds_the_pick_of_every_case(monkeypatch):
    """``benchmarks/lstm_vendor.py`` imports here and every case's pick is feasible and compiles
    for an H100 (the run itself needs the GPU)."""
    import importlib.util
    import pathlib
    import sys

    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "lstm_vendor.py"
    spec = importlib.util.spec_from_file_location("bench_lstm", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_lstm", bench)  # dataclasses look their module up
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts benchmarks/ on the path
    spec.loader.exec_module(bench)
    target = offline_cuda()
    for case in bench.CASES:
        template = case.template().with_tensor_cores(target)
        pick, why = template.analytic_pick(target)
        assert template.space(target).infeasible_reason(pick) is None, case.label
        assert "lstm_init" in [c.func for c in template.compile(pick, target).calls] and why


def test_relax_lstm_layer_runs_our_lstm_against_torch(opencl):
    """``lstm_layer`` in a ``relax.frontend.nn`` model, an ``nn.LSTM``'s weights bound
    (``device_weights(cell="lstm")``): one LSTM placeholder, lowered to our plan, against torch
    in float64."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend import nn

    from tvm_ext.precision.precision import relative_error
    from tvm_ext.relax.pipeline import load_model
    from tvm_ext.relax.relax_gru import device_weights, find_grus, lstm_layer

    torch = pytest.importorskip("torch")

    class Model(nn.Module):
        def __init__(self):
            self.lstm = lstm_layer(6, 10, 2, bidirectional=True)

        def forward(self, x, h0, c0):
            return self.lstm(x, h0, c0)

    state = (2 * 2, 3, 10)
    spec = {"x": nn.spec.Tensor((5, 3, 6), "float32"), "h0": nn.spec.Tensor(state, "float32"),
            "c0": nn.spec.Tensor(state, "float32")}
    mod, params = Model().export_tvm(spec={"forward": spec})
    torch.manual_seed(0)
    net = torch.nn.LSTM(6, 10, num_layers=2, bidirectional=True).double().eval()
    weights = device_weights(net.state_dict(), 6, 10, 2, bidirectional=True, cell="lstm")
    mod = relax.transform.BindParams("forward", {n: tvm.runtime.tensor(weights[n.split(".")[-1]])
                                                 for n, _ in params})(mod)
    (found,) = find_grus(mod)
    assert found.template.name == "lstm" and found.template.layers == 2
    rng = np.random.default_rng(3)
    x, h0, c0 = (rng.uniform(-1, 1, shape).astype(np.float32) for shape in ((5, 3, 6), state, state))
    outputs = load_model(mod, opencl, None, function="forward", log=None)(x, h0, c0)
    with torch.no_grad():
        y, (h, c) = net(torch.from_numpy(x).double(), (torch.from_numpy(h0).double(), torch.from_numpy(c0).double()))
    for ours, ref in zip(outputs, (y, h, c)):
        ours = np.asarray(ours.numpy() if hasattr(ours, "numpy") else ours)
        assert ours.shape == tuple(ref.shape) and relative_error(ours, ref.numpy()) < 1e-5


def test_gru_storage_gives_a_float32_models_lstm_16_bit_storage(tmp_path):
    """``--gru-storage float16`` on a float32 ONNX LSTM: the template tuned and run is our LSTM storing
    its tensors in float16 (``lower_grus`` casts the placeholder's arguments to it and the results
    back); unset, the LSTM stays float32; another type is one error."""
    from tvm_ext.relax.onnx_import import load_onnx
    from tvm_ext.relax.relax_gru import find_grus
    from tvm_ext.target import offline_cuda

    torch = pytest.importorskip("torch")
    path = str(tmp_path / "lstm.onnx")
    torch.onnx.export(torch.nn.LSTM(4, 6).eval(), (torch.randn(3, 2, 4),), path, dynamo=False)
    mod = load_onnx(path)
    (stored,) = find_grus(mod, offline_cuda(), "float16")
    (plain,) = find_grus(mod, offline_cuda())
    assert (stored.template.dtype, plain.template.dtype) == ("float16", "float32")
    with pytest.raises(TvmExtError, match="LSTM storage 'int8' is not supported"):
        find_grus(mod, None, "int8")
