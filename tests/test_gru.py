"""GRU inference (patent 004): real OpenCL runs on PoCL against a float64 numpy reference
of torch.nn.GRU's equations, plus torch itself when it is installed.

Kernels are built once per (shape, fusion) and reused by every test of that shape.
"""
from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest

from tvm_ext.errors import TvmExtError
from tvm_ext.schedules.gru import GRU, GruTemplate, gru_reference
from tvm_ext.target import offline_cuda


@dataclasses.dataclass(frozen=True)
class Shape:
    seq: int
    batch: int
    input: int
    hidden: int
    layers: int = 1
    bidirectional: bool = False
    batch_first: bool = False

    @property
    def dirs(self) -> int:
        return 2 if self.bidirectional else 1


# A covering subset: uni/bi, 1/2 layers, batch 1/5, hidden 1/7/64/200, seq 1/17.
SHAPES = {
    "tiny": Shape(seq=1, batch=1, input=3, hidden=1),
    "h1-bi-seq17": Shape(seq=17, batch=5, input=2, hidden=1, bidirectional=True),
    "h7-bi-b1": Shape(seq=17, batch=1, input=7, hidden=7, bidirectional=True),
    "h64-2layer-bi": Shape(seq=17, batch=5, input=24, hidden=64, layers=2, bidirectional=True),
    "h64-2layer-b1-batchfirst": Shape(seq=17, batch=1, input=64, hidden=64, layers=2, batch_first=True),
    "h200-seq17": Shape(seq=17, batch=5, input=40, hidden=200),
    "h200-2layer-bi-seq1": Shape(seq=1, batch=5, input=16, hidden=200, layers=2, bidirectional=True),
}


def _weights(shape: Shape, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(shape.hidden)
    out = {}
    for layer in range(shape.layers):
        k = shape.input if layer == 0 else shape.dirs * shape.hidden
        for sfx in ("", "_reverse")[: shape.dirs]:
            g = 3 * shape.hidden
            for name, dims in (("weight_ih", (g, k)), ("weight_hh", (g, shape.hidden)),
                               ("bias_ih", (g,)), ("bias_hh", (g,))):
                out[f"{name}_l{layer}{sfx}"] = rng.uniform(-bound, bound, dims).astype(np.float32)
    return out


def _inputs(shape: Shape, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    dims = (shape.batch, shape.seq, shape.input) if shape.batch_first else (shape.seq, shape.batch, shape.input)
    x = rng.uniform(-1, 1, dims).astype(np.float32)
    h0 = rng.uniform(-1, 1, (shape.layers * shape.dirs, shape.batch, shape.hidden)).astype(np.float32)
    return x, h0


_BUILT: dict[tuple[str, int], GRU] = {}


def built(opencl, key: str, fuse: int) -> GRU:
    """The GRU of SHAPES[key] with step fusion ``fuse``, compiled once per test session."""
    if (key, fuse) not in _BUILT:
        s = SHAPES[key]
        gru = GRU.build(opencl, s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional,
                        batch_first=s.batch_first, batch=s.batch, seq=s.seq, config={"fuse_step": fuse})
        _BUILT[key, fuse] = gru.load_numpy(_weights(s))
    return _BUILT[key, fuse]


def _close(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("fuse", [0, 1], ids=["patent", "fused-step"])
@pytest.mark.parametrize("key", list(SHAPES))
def test_matches_reference(opencl, key, fuse):
    s = SHAPES[key]
    gru = built(opencl, key, fuse)
    weights = _weights(s)
    x, h0 = _inputs(s)
    for initial in (None, h0):
        out, h_n = gru(x, initial)
        ref_out, ref_h = gru_reference(x, weights, initial, s.layers, s.bidirectional, s.batch_first)
        _close(out, ref_out)
        _close(h_n, ref_h)
    again, _ = gru(x, h0)  # built once, run many times: same answer
    np.testing.assert_array_equal(again, out)


@pytest.mark.parametrize("key", ["h64-2layer-bi", "h200-seq17", "h1-bi-seq17"])
def test_fusion_knob_does_not_change_the_result(opencl, key):
    x, h0 = _inputs(SHAPES[key])
    plain, fused = built(opencl, key, 0), built(opencl, key, 1)
    assert plain.config.fuse_step == 0 and fused.config.fuse_step == 1
    assert len(fused.compiled.kernel_launches()) < len(plain.compiled.kernel_launches())
    for a, b in zip(plain(x, h0), fused(x, h0)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_plan_is_one_gemm_then_steps():
    """S1 once per layer, then per step S2 + S3 (patent) or one fused kernel."""
    t = GruTemplate(batch=5, hidden=8, input=4, seq=6, layers=2, bidirectional=True)
    cfg = t.default_config(offline_cuda())
    patent = [c.func for c in t.plan(cfg)]
    assert patent[:2] == ["gru_init", "gru_gemm_x0"] and patent[2:4] == ["gru_gemm_h", "gru_cell"]
    assert patent.count("gru_cell") == 2 * 6 and patent.count("gru_gemm_x1") == 1
    fused = [c.func for c in t.plan(cfg.replace(fuse_step=1))]
    assert fused.count("gru_step") == 2 * 6 and "gru_gemm_h" not in fused
    # the backward direction walks time in reverse inside the kernel: step s is passed as is
    steps = [c.args[3] for c in t.plan(cfg) if c.func == "gru_cell"]
    assert steps == list(range(6)) * 2


def test_cell_kernel_grid_is_batch_by_directions_and_block_is_clamped(opencl):
    small = dataclasses.replace(opencl, max_threads_per_block=256)
    t = GruTemplate(batch=5, hidden=300, input=4, seq=2, bidirectional=True)
    cfg = t.default_config(small)
    assert cfg.cell_block == 512
    compiled = t.compile(cfg, small)
    cells = [l for l in compiled.kernel_launches() if l.name.startswith("gru_cell")]
    assert {(l.grid, l.block) for l in cells} == {((5, 2, 1), (256, 1, 1))}
    # buffers bound by name (state ping-pong p0 -> p1 -> p0), step and layer as scalar ints
    assert [sorted(a for a in l.args if isinstance(a, str)) for l in cells] == [
        ["gh", "gi", "h_n", "out", "p0", "p1"]] * 2
    assert sorted(max(a for a in l.args if isinstance(a, int)) for l in cells) == [0, 1]


@pytest.mark.parametrize("fuse", [0, 1])
def test_cuda_source_generates(fuse, tmp_path):
    t = GruTemplate(batch=8, hidden=512, input=512, seq=4, layers=2, bidirectional=True)
    target = offline_cuda()
    cfg = t.default_config(target).replace(fuse_step=fuse)
    compiled = t.compile(cfg, target)
    assert compiled.source.count("__global__") >= 3
    assert ("gru_step_kernel" if fuse else "gru_cell_kernel") in compiled.source
    for call in compiled.function_calls():  # what CudaExecutor looks up in TVM's module
        assert compiled.executable.mod.implements_function(call.name)
    artifact, trace = t.build_artifact(cfg, target, str(tmp_path))
    assert artifact.kind == "cuda" and artifact.library.endswith(".so")
    assert set(trace) == {c.func for c in compiled.calls}


def test_bad_shapes_are_rejected_with_one_line(opencl):
    gru = built(opencl, "h7-bi-b1", 0)
    s = SHAPES["h7-bi-b1"]
    x, h0 = _inputs(s)

    def one_line(excinfo):
        assert "\n" not in str(excinfo.value)

    with pytest.raises(TvmExtError, match=r"input has shape \(17, 1, 8\), expected \(17, 1, 7\)") as e:
        gru(np.zeros((17, 1, 8), np.float32))
    one_line(e)
    with pytest.raises(TvmExtError, match=r"h0 has shape \(1, 1, 7\), expected \(2, 1, 7\)") as e:
        gru(x, h0[:1])
    one_line(e)
    weights = _weights(s)
    weights["weight_hh_l0_reverse"] = weights["weight_hh_l0_reverse"][:, :6]
    with pytest.raises(TvmExtError, match=r"weight_hh_l0_reverse.*\(21, 6\), expected \(21, 7\)") as e:
        gru.load_numpy(weights)
    one_line(e)
    with pytest.raises(TvmExtError, match=r"missing GRU weight 'weight_ih_l0_reverse' of shape \(21, 7\)"):
        gru.load_numpy({k: v for k, v in _weights(s).items() if k != "weight_ih_l0_reverse"})
    with pytest.raises(TvmExtError, match="unexpected GRU weight 'weight_ih_l1'"):
        gru.load_numpy({**_weights(s), "weight_ih_l1": np.zeros((21, 14), np.float32)})
    gru.load_numpy(_weights(s))  # still usable after rejected loads
    _close(gru(x, h0)[0], gru_reference(x, _weights(s), h0, 1, True)[0])


def test_bad_build_arguments(opencl):
    with pytest.raises(TvmExtError, match="GRU hidden must be a positive integer"):
        GRU.build(opencl, 4, 0)
    with pytest.raises(TvmExtError, match="unknown GRU knobs"):
        GRU.build(opencl, 4, 8, config={"cell_blocks": 64})
    with pytest.raises(TvmExtError, match="knob cell_block=500 is not allowed"):
        GRU.build(opencl, 4, 8, config={"cell_block": 500})
    with pytest.raises(TvmExtError, match="weights are not loaded"):
        GRU.build(opencl, 4, 8, batch=2, seq=3)(np.zeros((3, 2, 4), np.float32))


def test_no_bias_weights_are_zero_bias(opencl):
    s = SHAPES["h7-bi-b1"]
    gru = built(opencl, "h7-bi-b1", 1)
    weights = {k: v for k, v in _weights(s).items() if not k.startswith("bias")}
    gru.load_numpy(weights)
    x, h0 = _inputs(s)
    out, h_n = gru(x, h0)
    ref_out, ref_h = gru_reference(x, weights, h0, 1, True)
    _close(out, ref_out)
    _close(h_n, ref_h)
    gru.load_numpy(_weights(s))


@pytest.mark.parametrize("key", ["h64-2layer-bi", "h64-2layer-b1-batchfirst", "tiny"])
def test_matches_torch(opencl, key):
    torch = pytest.importorskip("torch")
    s = SHAPES[key]
    torch.manual_seed(0)
    net = torch.nn.GRU(s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional,
                       batch_first=s.batch_first)
    gru = built(opencl, key, 1).load_state_dict(net.state_dict())
    x, h0 = _inputs(s)
    with torch.no_grad():
        ref_out, ref_h = net(torch.from_numpy(x), torch.from_numpy(h0))
    out, h_n = gru(x, h0)
    _close(out, ref_out.numpy())
    _close(h_n, ref_h.numpy())
    gru.load_numpy(_weights(s))


def test_tune_cli_times_the_whole_layer(tmp_path, capsys):
    from tvm_ext.tune import main

    records = tmp_path / "gru.jsonl"
    rc = main(["gru", "--batch", "2", "--hidden", "8", "--input", "4", "--seq", "3", "--bidirectional",
               "--trials", "3", "--population", "4", "--generations", "1", "--tourn-size", "1",
               "--workers", "2", "--records", str(records), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "best" in out and "cell_block=" in out and "fuse_step=" in out and " ms " in out
    assert 1 <= len(records.read_text().splitlines()) <= 3  # same-source configs are measured once


def test_benchmark_script_imports_and_picks_feasible_candidates(monkeypatch):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "gru.py"
    spec = importlib.util.spec_from_file_location("bench_gru", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_gru", bench)  # dataclasses look their module up
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts benchmarks/ on the path
    spec.loader.exec_module(bench)
    target = offline_cuda()
    assert [c.label for c in bench.CASES] == ["B1 H256", "B8 H512", "B64 H1024", "B8 H512 bidirectional"]
    for case in bench.CASES:
        template = case.template()
        picks = bench.candidates(template, target, 6)
        assert picks[0] == template.default_config(target) and len(picks) >= 4
        assert {c.fuse_step for c in picks} == {0, 1}
        assert all(template.space(target).is_feasible(c) for c in picks)


@pytest.mark.gpu
@pytest.mark.parametrize("fuse", [0, 1])
def test_cuda_layer_matches_reference(fuse):
    """On a GPU machine (``pytest -m gpu``): the CUDA executor through TVM's runtime."""
    s = SHAPES["h64-2layer-bi"]
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=True, batch=s.batch,
                    seq=s.seq, config={"fuse_step": fuse}).load_numpy(_weights(s))
    x, h0 = _inputs(s)
    out, h_n = gru(x, h0)
    ref_out, ref_h = gru_reference(x, _weights(s), h0, s.layers, True)
    _close(out, ref_out)
    _close(h_n, ref_h)
