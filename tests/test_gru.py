"""GRU inference (patent 004): real OpenCL runs on PoCL against a float64 numpy reference
of torch.nn.GRU's equations, plus torch itself when it is installed.

Kernels are built once per (shape, fusion) and reused by every test of that shape.
"""
from __future__ import annotations

import dataclasses
import re
import sys

import numpy as np
import pytest

from tvm_ext.core.errors import TvmExtError
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


@pytest.mark.parametrize("key, knobs", [
    ("h64-2layer-bi", dict(step_j=32, step_b=2, step_k=16, step_ks=4)),  # batch 5: rows padded
    ("h64-2layer-b1-batchfirst", dict(step_j=64, step_b=1, step_k=64, step_ks=8)),
    ("h200-seq17", dict(step_j=32, step_b=4, step_k=8, step_ks=2)),  # hidden 200: units guarded
    ("h64-2layer-bi", dict(step_j=16, step_b=8, step_k=16, step_ks=4, step_w_onchip=1)),  # W slice staged
    ("h200-seq17", dict(step_j=8, step_b=1, step_k=8, step_ks=1, step_w_onchip=1)),
])
def test_split_k_step_kernel_matches_the_reference(opencl, key, knobs):
    """step_ks threads per dot product, partial sums through shared memory, and the W_hh
    slice staged in shared memory (step_w_onchip): same answer."""
    s = SHAPES[key]
    gru = GRU.build(opencl, s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional,
                    batch_first=s.batch_first, batch=s.batch, seq=s.seq,
                    config={"fuse_step": 1, **knobs}).load_numpy(_weights(s))
    launch = next(l for l in gru.compiled.kernel_launches() if "step" in l.name)
    assert launch.block == (knobs["step_j"], knobs["step_ks"], 1)
    x, h0 = _inputs(s)
    out, h_n = gru(x, h0)
    ref_out, ref_h = gru_reference(x, _weights(s), h0, s.layers, s.bidirectional, s.batch_first)
    _close(out, ref_out)
    _close(h_n, ref_h)


def test_split_k_and_w_onchip_are_feasible_at_any_hidden(opencl):
    """Tiles that do not divide hidden are padded, not refused (``test_gru_shapes.py`` runs
    them); what does not fit is refused with its reason."""
    t = GruTemplate(batch=2, hidden=200, input=8, seq=3)
    space = t.space(opencl)
    cfg = t.default_config(opencl).replace(fuse_step=1, step_j=32, step_b=2, step_k=16, step_ks=4)
    assert space.is_feasible(cfg) and space.is_feasible(cfg.replace(step_w_onchip=1))
    small = dataclasses.replace(opencl, max_shared_memory_per_block=16384)
    assert "shared memory" in t.space(small).infeasible_reason(cfg.replace(step_w_onchip=1))


def test_w_onchip_persistent_kernel_loads_w_once(tmp_path):
    """CUDA, generated here: with step_w_onchip the persistent kernel fills its W_hh slice
    (dynamic shared memory) once, before the step loop; the per-step form refills it every
    step; a slice over the per-block shared-memory limit is infeasible with the reason."""
    t = GruTemplate(batch=8, hidden=512, input=16, seq=5, bidirectional=True)
    target = offline_cuda()
    cfg = t.default_config(target).replace(fuse_step=1, step_j=16, step_b=8, step_k=64, step_ks=8,
                                           step_w_onchip=1)
    for loop in (0, 2):
        compiled = t.compile(cfg.replace(step_loop=loop), target)
        name = "gru_steps" if loop else "gru_step"
        (launch,), _ = compiled.launches[name]
        # 96 KiB of W (more than a static array may have), and the h slice and partial sums with it
        assert 512 * 3 * 16 * 4 < launch.dyn_shared_bytes <= t.step_variant(cfg).shared_bytes()
        definition = re.search(rf"{name}_kernel\([^)]*\) {{", compiled.source)
        kernel = compiled.source[definition.end():]
        kernel = kernel[:kernel.index("\n}\n")]
        fill = kernel.index("= w_ptr[")  # the only read of W: the fill of the slice
        if loop:
            assert "__launch_bounds__(128)" in compiled.source  # 64 blocks: one per SM
            assert fill < kernel.index("for (int s = 0;")  # filled once, before the step loop
            assert "w_ptr[" not in kernel[kernel.index("for (int s = 0;"):]
        else:
            assert "for (int s" not in kernel
    assert "shared memory" in t.space(target).infeasible_reason(cfg.replace(step_j=128))  # 768 KiB


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
    program = t.build_program(cfg, target)
    artifact = program.artifact()
    assert artifact.kind == "cuda" and artifact.library.startswith(b"\x7fELF")  # the module, as bytes
    assert [c.name for c in artifact.calls] == [c.func for c in compiled.calls]
    assert set(program.trace) == {c.func for c in compiled.calls}


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
               "--workers", "1", "--records", str(records), "--no-progress"])
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
    assert [c.label for c in bench.CASES] == ["B1 H256", "B8 H512", "B64 H1024", "B8 H512 bidirectional",
                                              "B16 H512 T64", "B32 H512", "B5 H200 T129",
                                              "B3 H33 T7 3 layers bidirectional"]
    for case in bench.CASES:
        template = case.template()
        picks = bench.candidates(template, target, 6)
        assert picks[0] == template.default_config(target) and len(picks) >= 4
        assert picks[1] == template.analytic_pick(target)[0]  # what GRU.build uses without a config
        assert {c.fuse_step for c in picks} == {0, 1}
        assert all(template.space(target).is_feasible(c) for c in picks)
        assert all(bench.short(c) for c in picks)


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


@pytest.mark.gpu
@pytest.mark.parametrize("w_onchip", [0, 1])
@pytest.mark.parametrize("loop", [1, 2])
@pytest.mark.parametrize("shape", ["h64-2layer-bi", "h200-seq17"])
def test_cuda_step_loop_matches_reference(loop, shape, w_onchip):
    """On a GPU machine: the step loop in TVM's host code (1) and the persistent kernel with
    its grid barrier (2) give the reference answer, for 2 layers, both directions, odd T and
    a hidden size the tiles do not divide; the barrier never timed out.  With ``w_onchip`` the
    W_hh slice lives in shared memory (the persistent kernel fills it once per layer)."""
    s = SHAPES[shape]
    tile = {"step_j": 8, "step_b": 8} if w_onchip else {"step_j": 32, "step_b": 2}
    cfg = {"fuse_step": 1, **tile, "step_k": 8, "step_ks": 2, "step_loop": loop, "step_w_onchip": w_onchip}
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional,
                    batch=s.batch, seq=s.seq, config=cfg).load_numpy(_weights(s))
    x, h0 = _inputs(s)
    for _ in range(3):  # reruns: the init kernel resets the barrier counter each layer
        out, h_n = gru(x, h0)
        ref_out, ref_h = gru_reference(x, _weights(s), h0, s.layers, s.bidirectional)
        _close(out, ref_out)
        _close(h_n, ref_h)
    calls = [c.func for c in gru.compiled.calls]
    assert calls.count("gru_steps") == s.layers and "gru_step" not in calls


@pytest.mark.gpu
def test_cuda_persistent_grid_with_several_blocks_per_sm():
    """On a GPU machine: a persistent grid larger than the SM count (blocks share SMs, their
    registers capped by the launch bound) still meets at every barrier and matches the reference."""
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    s = Shape(seq=9, batch=8, input=16, hidden=32 * target.compute_units, bidirectional=True)
    weights = _weights(s)  # 2 directions x hidden/32 blocks of 32 units: 2 blocks per SM
    cfg = {"fuse_step": 1, "step_j": 32, "step_b": 8, "step_k": 8, "step_ks": 2, "step_loop": 2}
    gru = GRU.build(target, s.input, s.hidden, bidirectional=True, batch=s.batch, seq=s.seq,
                    config=cfg).load_numpy(weights)
    assert gru.template.step_variant(gru.config).residency(target)[0] == 2
    x, h0 = _inputs(s)
    for _ in range(2):
        out, h_n = gru(x, h0)
        ref_out, ref_h = gru_reference(x, weights, h0, 1, True)
        _close(out, ref_out)
        _close(h_n, ref_h)


def test_step_loop_plan_and_code(tmp_path):
    """step_loop 1/2 (CUDA, generated here without a GPU): one gru_steps call per layer; the
    host form launches its kernel from a loop in the host function, the persistent form once
    with a grid barrier (atomics) in the kernel; OpenCL and oversized persistent grids are
    infeasible with the reason."""
    t = GruTemplate(batch=4, hidden=64, input=16, seq=5, layers=2)
    target = offline_cuda()
    base = t.default_config(target).replace(fuse_step=1, step_j=32, step_b=2, step_k=16, step_ks=2)
    per_step = [c.func for c in t.plan(base)]
    assert per_step.count("gru_step") == 2 * 5
    for loop in (1, 2):
        cfg = base.replace(step_loop=loop)
        compiled = t.compile(cfg, target)
        funcs = [c.func for c in compiled.calls]
        assert funcs.count("gru_steps") == 2 and "gru_step" not in funcs
        (kernel,), params = compiled.launches["gru_steps"]
        assert ("bar" in params) == (loop == 2)
        assert "step" not in params and "h_out" not in params  # state read and written through h
        assert ("atomicAdd" in compiled.source) == (loop == 2)
        assert ("loop:s" in kernel.args) == (loop == 1)  # host form: the step index is a launch argument
        program = t.build_program(cfg, target)
        assert set(program.trace) == set(funcs) and [c.name for c in program.calls] == funcs
    space = t.space(target)
    assert space.is_feasible(base.replace(step_loop=2))
    assert "__launch_bounds__(64)" in t.compile(base.replace(step_loop=2), target).source  # 4 blocks, 132 SMs
    # 4 blocks on 2 SMs: two per SM, registers capped by the launch bound so both fit
    small = dataclasses.replace(target, compute_units=2)
    assert t.step_variant(base.replace(step_loop=2)).residency(small) == (2, None)
    assert "__launch_bounds__(64, 2)" in t.compile(base.replace(step_loop=2), small).source
    # 2048 blocks of 128 threads on 2 SMs: more than an SM holds
    wide = GruTemplate(batch=64, hidden=512, input=16, seq=5)
    cfg = wide.default_config(target).replace(fuse_step=1, step_j=16, step_b=1, step_k=64, step_ks=8, step_loop=2)
    assert "resident per SM" in wide.space(small).infeasible_reason(cfg)
    assert "registers per thread" in wide.space(target).infeasible_reason(cfg)  # 16 per SM: 32 registers
    assert wide.space(target).is_feasible(cfg.replace(step_b=4))  # 4 per SM on 132 SMs


def test_step_loop_is_cuda_only(opencl):
    t = GruTemplate(batch=4, hidden=64, input=16, seq=5)
    cfg = t.default_config(opencl).replace(fuse_step=1, step_j=32, step_b=2, step_k=16, step_ks=2, step_loop=1)
    assert "CUDA only" in t.space(opencl).infeasible_reason(cfg)
    with pytest.raises(TvmExtError, match="CUDA only"):
        GRU.build(opencl, 16, 64, batch=4, seq=5, config=cfg)


# ---- mixed precision (method 003): per-tensor / accumulator / math dtypes ---------------------
from tvm_ext.measure.builder import LocalBuilder, build_one  # noqa: E402
from tvm_ext.precision.precision import FLOAT_DTYPES, relative_error  # noqa: E402
from tvm_ext.core.records import RecordStore  # noqa: E402
from tvm_ext.measure.runner import LocalRunner, MeasureSettings  # noqa: E402
from tvm_ext.schedules.gru import PRECISION_PARAMS, STAGES  # noqa: E402
from tvm_ext.core.template import Workload  # noqa: E402
from tvm_ext.core.tuner import Tuner  # noqa: E402

BF16 = "bfloat16"
LOW = {"w_ih": BF16, "w_hh": BF16, "gi": BF16, "gh": BF16}  # bf16 weights and gate buffers
F64 = {p.name: "float64" for p in PRECISION_PARAMS}
FAST = MeasureSettings(warmup=1, repeat=2, min_repeat_secs=0.001)
# B2 H16 I8 T5: uni/bi, 1/2 layers, each with one of the two step pipelines
SMALL = {"uni-1layer": (False, 1, 0), "bi-1layer": (True, 1, 1), "uni-2layer": (False, 2, 1),
         "bi-2layer": (True, 2, 0)}


def _small(key: str, precision=None) -> tuple[GruTemplate, int]:
    bidirectional, layers, fuse = SMALL[key]
    t = GruTemplate(batch=2, hidden=16, input=8, seq=5, layers=layers, bidirectional=bidirectional)
    return t.with_precision(precision or {}), fuse


@pytest.fixture(scope="module")
def runner(opencl):
    """The core runner (an isolated worker process), shared by the tests below."""
    r = LocalRunner(opencl, FAST, timeout=120)
    yield r
    r.close()


def _measure(runner, template, fuse, tmp_path):
    cfg = template.default_config(runner.target).replace(fuse_step=fuse)
    build = build_one(template, cfg, runner.target)
    assert build.ok, build.error_msg
    (result,) = runner.run(template, [build])
    assert result.ok, f"{result.error_kind}: {result.error_msg}"
    return result


def _check_stage_secs(metrics):
    assert set(metrics["stage_secs"]) == set(STAGES) == {"input_gemm", "hidden_gemm", "cell"}
    assert all(0 < s < 1 for s in metrics["stage_secs"].values()), metrics["stage_secs"]


def test_precision_params_name_every_tensor_accumulator_and_math_type():
    stages = {p.name: (p.stage, p.kind) for p in PRECISION_PARAMS}
    assert stages == {
        "x": ("input_gemm", "tensor"), "w_ih": ("input_gemm", "tensor"),
        "in_acc": ("input_gemm", "accumulator"), "gi": ("input_gemm", "tensor"),
        "w_hh": ("hidden_gemm", "tensor"), "hid_acc": ("hidden_gemm", "accumulator"),
        "gh": ("hidden_gemm", "tensor"), "h": ("cell", "tensor"), "cell_math": ("cell", "math"),
        "out": ("cell", "tensor")}
    t = GruTemplate(batch=2, hidden=4, input=3, seq=2, layers=2)
    assert t.precision_params() == PRECISION_PARAMS
    assert t.precision == dict.fromkeys(stages, "float32") and t.tolerance == 1e-4
    low = t.with_precision(LOW)
    assert low.precision == {**t.precision, **LOW} and t.precision["gi"] == "float32"  # a copy
    assert low.full_precision() == t and t.full_precision() == t
    assert low.tolerance > t.tolerance
    assert low.params["gi_dtype"] == BF16 and t.params["gi_dtype"] == "float32"
    target = offline_cuda()
    assert Workload.of(low, target).key != Workload.of(t, target).key
    specs = low.buffers()
    assert specs["w_ih1"].dtype == specs["b_hh0"].dtype == specs["gi"].dtype == specs["gh"].dtype == BF16
    assert specs["x"].dtype == specs["out"].dtype == specs["h0"].dtype == specs["p1"].dtype == "float32"
    inputs, refs = low.make_case(np.random.default_rng(0))  # rounded inputs, fp32-valued reference
    full_inputs = t.make_inputs(np.random.default_rng(0))
    assert [str(a.dtype) for a in inputs] == [s.dtype for s in low.inputs()]
    assert all(a.dtype == np.float32 for a in full_inputs)
    np.testing.assert_array_equal(refs[0], t.reference(full_inputs)[0])


def test_with_precision_rejects_unknown_names_and_dtypes():
    t = GruTemplate(batch=2, hidden=4, input=3, seq=2)
    with pytest.raises(TvmExtError, match=r"unknown precision parameter 'w_x'; allowed: .*cell_math.*w_hh") as e:
        t.with_precision({"w_x": BF16})
    assert "\n" not in str(e.value)
    with pytest.raises(TvmExtError, match="gi: unknown dtype 'int8'; allowed: " + ", ".join(FLOAT_DTYPES)):
        t.with_precision({"gi": "int8"})
    with pytest.raises(TvmExtError, match="GRU h dtype 'half' is not supported; allowed: float64"):
        GruTemplate(batch=2, hidden=4, input=3, seq=2, h_dtype="half")
    with pytest.raises(TvmExtError, match="unknown precision parameter 'acc'"):
        GRU.build("opencl", 3, 4, precision={"acc": BF16})


def test_layers_read_the_inner_sequences_in_the_output_dtype():
    """Inner layers' outputs are stored as ``out``: layer ≥ 1 gets its own input GEMM kernel
    when that differs from ``x`` (even when the shapes agree)."""
    t = GruTemplate(batch=2, hidden=4, input=4, seq=2, layers=3)
    cfg = t.default_config(offline_cuda())
    assert "gru_gemm_x1" not in {c.func for c in t.plan(cfg)}
    low = t.with_precision({"x": BF16})
    funcs = [c.func for c in low.plan(cfg)]
    assert funcs.count("gru_gemm_x0") == 1 and funcs.count("gru_gemm_x1") == 2
    assert low.input_gemm(1).a_dtype == "float32" and low.input_gemm(0).a_dtype == BF16
    assert low.buffers()["y0"].dtype == low.buffers()["out"].dtype == "float32"


def test_fp32_kernels_have_no_conversions(opencl):
    """All float32 (the default) generates the kernels it always did: no other type appears."""
    t = GruTemplate(batch=2, hidden=16, input=8, seq=3, layers=2, bidirectional=True)
    for fuse in (0, 1):
        source = t.compile(t.default_config(opencl).replace(fuse_step=fuse), opencl).source
        for word in ("double", "half", "ushort", "bfloat"):
            assert word not in source
    low = t.with_precision(LOW).compile(t.default_config(opencl), opencl).source
    assert "ushort" in low  # bfloat16 storage on OpenCL, math in float


@pytest.mark.parametrize("key", list(SMALL))
def test_bf16_weights_and_gates_through_the_runner(runner, key, tmp_path):
    """bf16 weights and gi/gh: a correct program with a measured error above float32's and
    still small, and per-stage times of every stage."""
    full, fuse = _small(key)
    low, _ = _small(key, LOW)
    exact = _measure(runner, full, fuse, tmp_path)
    lowered = _measure(runner, low, fuse, tmp_path)
    assert exact.metrics["rel_error"] < 1e-6
    assert exact.metrics["rel_error"] < 1e-3 < lowered.metrics["rel_error"] < 2e-2
    assert np.isfinite(lowered.cost) and lowered.cost > 0
    _check_stage_secs(exact.metrics)
    _check_stage_secs(lowered.metrics)


@pytest.mark.parametrize("fuse", [0, 1], ids=["patent", "fused-step"])
def test_float64_everywhere_is_exact(runner, fuse, tmp_path):
    t, _ = _small("bi-2layer", F64)
    result = _measure(runner, t, fuse, tmp_path)
    assert result.metrics["rel_error"] < 1e-10
    _check_stage_secs(result.metrics)


def test_fused_step_rounds_gh_like_the_patent_pipeline(runner, tmp_path):
    """The precision of a program does not depend on the fusion knob: the fused kernel's
    register gate sums are rounded to ``gh`` as the patent pipeline's buffer is."""
    t, _ = _small("bi-1layer", {"gh": BF16})
    errors = [_measure(runner, t, fuse, tmp_path).metrics["rel_error"] for fuse in (0, 1)]
    assert 1e-4 < errors[0] < 2e-2
    assert errors[1] == pytest.approx(errors[0], rel=0.05)


def test_tuner_records_carry_error_and_stage_times(opencl, runner, tmp_path):
    t, _ = _small("bi-2layer", LOW)
    path = tmp_path / "gru.jsonl"
    with LocalBuilder(workers=1, timeout=120) as builder:
        tuner = Tuner(t, opencl, builder, runner, RecordStore(path))
        tuner.evaluate([t.default_config(opencl)])
    (rec,) = RecordStore(path)
    assert rec.ok and rec.workload["params"]["w_hh_dtype"] == BF16
    assert 1e-3 < rec.metrics["rel_error"] < 2e-2
    _check_stage_secs(rec.metrics)


@pytest.mark.parametrize("fuse", [0, 1], ids=["patent", "fused-step"])
def test_gru_with_precision_matches_the_reference_within_the_measured_error(opencl, runner, fuse, tmp_path):
    """The user-facing layer: float32 weights and input in, float32 out, lowered inside."""
    s = Shape(seq=5, batch=2, input=8, hidden=16, layers=2, bidirectional=True)
    gru = GRU.build(opencl, s.input, s.hidden, num_layers=2, bidirectional=True, batch=s.batch, seq=s.seq,
                    config={"fuse_step": fuse}, precision=LOW)
    assert gru.precision == {**GruTemplate(1, 1, 1, 1).precision, **LOW}
    weights = _weights(s)
    gru.load_numpy(weights)
    x, h0 = _inputs(s)
    out, h_n = gru(x, h0)
    assert out.dtype == h_n.dtype == np.float32
    ref = gru_reference(x, weights, h0, s.layers, True)
    error = relative_error([out.reshape(s.seq * s.batch, -1), h_n], [ref[0].reshape(s.seq * s.batch, -1), ref[1]])
    measured = _measure(runner, gru.template, fuse, tmp_path).metrics["rel_error"]
    assert 1e-4 < error < 3 * measured
    exact = built(opencl, "h7-bi-b1", fuse)  # the float32 layer is untouched by all this
    assert exact.precision == dict.fromkeys(gru.precision, "float32")


def test_gru_with_precision_loads_torch_weights(opencl):
    torch = pytest.importorskip("torch")
    s = Shape(seq=5, batch=2, input=8, hidden=16, bidirectional=True)
    torch.manual_seed(0)
    net = torch.nn.GRU(s.input, s.hidden, bidirectional=True)
    gru = GRU.build(opencl, s.input, s.hidden, bidirectional=True, batch=s.batch, seq=s.seq,
                    config={"fuse_step": 1}, precision={**LOW, "x": BF16, "h": BF16, "out": BF16})
    x, h0 = _inputs(s)
    with torch.no_grad():
        ref_out, ref_h = net(torch.from_numpy(x), torch.from_numpy(h0))
    # a bf16 state_dict and bf16 tensors in: converted as they are loaded
    gru.load_state_dict(net.to(torch.bfloat16).state_dict())
    out, h_n = gru(torch.from_numpy(x).to(torch.bfloat16), torch.from_numpy(h0))
    assert out.dtype == np.float32 and out.shape == (s.seq, s.batch, 2 * s.hidden)
    error = relative_error([out, h_n], [ref_out.numpy(), ref_h.numpy()])
    assert 1e-4 < error < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, bound", [("float16", 5e-3), ("bfloat16", 2e-2), ("float64", 1e-10)])
def test_cuda_precisions(dtype, bound, tmp_path):
    """On a GPU machine (``pytest -m gpu``): every tensor in ``dtype`` (accumulators and math
    too for float64), both step pipelines, through the runner hook and the user-facing layer."""
    from tvm_ext.measure.measure import measure
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda", 0)
    precision = {p.name: dtype for p in PRECISION_PARAMS if dtype == "float64" or p.kind == "tensor"}
    s = Shape(seq=5, batch=2, input=8, hidden=16, layers=2, bidirectional=True)
    t = GruTemplate(batch=s.batch, hidden=s.hidden, input=s.input, seq=s.seq, layers=2,
                    bidirectional=True).with_precision(precision)
    for fuse in (0, 1):
        build = build_one(t, t.default_config(target).replace(fuse_step=fuse), target)
        assert build.ok, build.error_msg
        result = measure(t, build.config, build.artifact, target, FAST)
        assert result.ok, f"{result.error_kind}: {result.error_msg}"
        assert result.metrics["rel_error"] < bound
        _check_stage_secs(result.metrics)
        gru = GRU.build(target, s.input, s.hidden, num_layers=2, bidirectional=True, batch=s.batch, seq=s.seq,
                        config={"fuse_step": fuse}, precision=precision).load_numpy(_weights(s))
        x, h0 = _inputs(s)
        out, h_n = gru(x, h0)
        ref = gru_reference(x, _weights(s), h0, s.layers, True)
        assert out.dtype == np.float32
        assert relative_error([out, h_n], ref) < max(bound, 1e-6)  # float32 outputs
