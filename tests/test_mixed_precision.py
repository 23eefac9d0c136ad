"""Method 003 on the real OpenCL device (PoCL): precision parameters, the search under an
error bound, resume, and generated programs that reproduce the measured error.

PoCL has no cl_khr_fp16, so the space here is float64 / float32 / bfloat16 (TVM
stores bfloat16 as ushort and computes in float32); CUDA adds float16.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest

from tvm_ext.measure.builder import LocalBuilder, build_one
from tvm_ext.precision.codegen import export_program, load_program
from tvm_ext.cost_model.precision import PrecisionPredictor
from tvm_ext.core.errors import TvmExtError
from tvm_ext.precision.mixed_precision import (MixedPrecisionSettings, MixedPrecisionSearch, PrecisionProgram,
                                               breed_precisions, error_of, schedule_for)
from tvm_ext.precision.precision import relative_error
from tvm_ext.core.records import RecordStore
from tvm_ext.measure.measure import measure
from tvm_ext.measure.runner import LocalRunner, MeasureSettings
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.schedules.gru import GruTemplate
from tvm_ext.core.tuner import Tuner

FAST = MeasureSettings(warmup=1, repeat=3, min_repeat_secs=0.002)
SHAPE = (40, 36, 300)  # K large enough that bfloat16 inputs cost ~1e-3 of relative error


def _search(target, path, eb, m=10, seed=0, predictor=True, base=None, dtypes=("bfloat16", "float64")):
    base = base or GemmTemplate(*SHAPE)
    store = RecordStore(path)
    schedule, _ = schedule_for(base, target, store)
    program = PrecisionProgram(base, schedule, dtypes)
    tuner = Tuner(program, target, LocalBuilder(workers=2, timeout=120), LocalRunner(target, FAST), store)
    settings = MixedPrecisionSettings(error_bound=eb, max_measurements=m, population=3, generated=12, measured=3,
                                 seed=seed)
    pred = PrecisionPredictor(program, target, eb, seed=seed) if predictor else None
    try:
        return MixedPrecisionSearch(tuner, settings, pred).run(), tuner
    finally:
        tuner.builder.close()
        tuner.runner.close()


def test_precision_parameters_validate_names_and_dtypes():
    gemm = GemmTemplate(8, 8, 8)
    assert [p.name for p in gemm.precision_params()] == ["a", "b", "acc", "c"]
    with pytest.raises(TvmExtError, match="allowed: a, acc, b, c"):
        gemm.with_precision({"weights": "float16"})
    with pytest.raises(TvmExtError, match="allowed: float64, float32, bfloat16, float16"):
        gemm.with_precision({"a": "int8"})
    low = gemm.with_precision({"a": "bfloat16", "acc": "float64"})
    assert low.inputs()[0].dtype == "bfloat16" and low.precision["b"] == "float32"
    assert low.full_precision() == gemm
    from tvm_ext.core.template import Workload
    from tvm_ext.target import offline_cuda

    assert Workload.of(low, offline_cuda()).key != Workload.of(gemm, offline_cuda()).key


@pytest.mark.parametrize("precision, low, high", [
    ({}, 0.0, 1e-6),
    ({"a": "bfloat16", "b": "bfloat16"}, 3e-4, 2e-2),
    ({"a": "float64", "b": "float64", "acc": "float64", "c": "float64"}, 0.0, 1e-12),
])
def test_lowered_gemm_error_is_measured_against_unrounded_inputs(opencl, tmp_path, precision, low, high):
    """The error includes the rounding of the inputs: float64 of the fp32 data is exact,
    bfloat16 inputs cost ~1e-3, and the value lands in the run's metrics."""
    gemm = GemmTemplate(*SHAPE).with_precision(precision)
    build = build_one(gemm, gemm.default_config(opencl), opencl)
    assert build.ok, build.error_msg
    result = measure(gemm, build.config, build.artifact, opencl, FAST)
    assert result.ok, result.error_msg
    assert low <= result.metrics["rel_error"] <= high


def test_breeding_draws_from_parents_or_at_random():
    rng = np.random.default_rng(0)
    current = np.zeros((3, 4), dtype=np.int64)
    history = np.ones((3, 4), dtype=np.int64)
    card = np.array([3, 3, 3, 3])
    fixed = np.full(4, 2)
    free = np.array([True, True, True, False])
    kids = breed_precisions(current, history, card, free, fixed, 400, 0.0, rng)
    assert set(np.unique(kids[:, :3])) == {0, 1}  # u0 = 0: only parents' genes
    assert (kids[:, 3] == 2).all()  # a dropped stage keeps its fixed dtype
    share = (kids[:, :3] == 0).mean()
    assert 0.4 < share < 0.6  # current and history-best parents half and half
    kids = breed_precisions(current, history, card, free, fixed, 400, 1.0, rng)
    assert 2 in np.unique(kids[:, :3])  # u0 = 1: random dtypes appear


@pytest.mark.slow
def test_search_respects_the_bound_resumes_and_generates_code(opencl, tmp_path):
    records = tmp_path / "mp.jsonl"
    eb = 5e-3
    result, tuner = _search(opencl, records, eb)
    assert result.baseline.ok and result.measured == 10
    assert result.kept_stages == ("gemm",)
    lines = [json.loads(l) for l in records.read_text().splitlines()]
    assert len(lines) == result.new_measurements >= 8  # a twin kernel may be skipped
    assert all("rel_error" in l["metrics"] for l in lines if not l["error_kind"])
    # Never a config over the bound, and nothing within the bound is faster.
    assert result.best is not None and error_of(result.best) <= eb
    within = [r for r in (tuner.record_of(c) for c in tuner._records) if r.ok and error_of(r) <= eb]
    assert result.best.cost == min(r.cost for r in within)

    again, _ = _search(opencl, records, eb)  # resume: same trajectory, nothing measured twice
    assert again.new_measurements == 0
    assert again.best.config == result.best.config
    assert len(records.read_text().splitlines()) == len(lines)
    # A search that measures only the float32 program, at a bound that program misses, still
    # answers with what is on record: float64 sums, measured earlier into the same file
    precise = tuner.space.make(a="float32", b="float32", acc="float64", c="float32")
    tuner.runner, tuner.builder = LocalRunner(opencl, FAST), LocalBuilder(workers=1)
    tuner.evaluate([precise])
    tuner.builder.close(), tuner.runner.close()
    tight = error_of(result.baseline) / 2
    assert error_of(tuner.record_of(precise)) <= tight
    short, _ = _search(opencl, records, tight, m=1)
    assert short.measured == 1 and short.new_measurements == 0 and error_of(short.baseline) > tight
    # the fastest record within the bound: the float64 sums, or an earlier config as precise (a
    # float64 operand) that measured faster
    within_tight = [r for r in (tuner.record_of(c) for c in tuner._records) if r.ok and error_of(r) <= tight]
    assert tuner.record_of(precise) in within_tight
    assert short.best is not None and error_of(short.best) <= tight
    assert short.best.cost == min(r.cost for r in within_tight)
    assert any(line.startswith("chosen from the records of an earlier search") for line in short.log)

    # S7 on a lowered config (bfloat16 operands): the loaded program reproduces the
    # recorded error on the fixed inputs and stays within the bound on fresh ones.
    program = tuner.template
    chosen = tuner.space.make(a="bfloat16", b="bfloat16", acc="float32", c="float32")
    tuner.runner = LocalRunner(opencl, FAST)
    tuner.builder = LocalBuilder(workers=1)
    tuner.evaluate([chosen])
    tuner.builder.close(), tuner.runner.close()
    rec = tuner.record_of(chosen)
    out = tmp_path / "program"
    export_program(program.lowered(chosen), program.schedule_config, opencl, str(out),
                   extra={"error": error_of(rec)})
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == {"a": "bfloat16", "b": "bfloat16", "acc": "float32", "c": "float32"}
    assert [t["dtype"] for t in manifest["tensors"]] == ["bfloat16", "bfloat16", "float32"]
    script = (out / "kernels" / "main.py").read_text()
    assert '"bfloat16"' in script
    assert (out / "program.so").stat().st_size > 0
    loaded = load_program(str(out))
    lowered = program.lowered(chosen)
    inputs, refs = lowered.make_case(np.random.default_rng(0))
    err = relative_error(loaded.run(*inputs), refs)
    assert math.isclose(err, manifest["error"], rel_tol=1e-6)
    fresh_inputs, fresh_refs = lowered.make_case(np.random.default_rng(1234))
    assert relative_error(loaded.run(*fresh_inputs), fresh_refs) <= 2 * manifest["error"]
    with pytest.raises(TvmExtError, match="must have shape"):
        loaded.run(inputs[0][:3], inputs[1])


@pytest.mark.slow
def test_a_tiny_bound_admits_only_float64_accumulation(opencl, tmp_path):
    """eb below float32 rounding: the float32 program itself is over the bound, so only
    configs that carry float64 far enough may be chosen (or none at all)."""
    result, tuner = _search(opencl, tmp_path / "r.jsonl", eb=1e-9, m=8, predictor=False)
    assert error_of(result.baseline) > 1e-9
    if result.best is not None:
        assert error_of(result.best) <= 1e-9
        assert result.best.config["acc"] == "float64"


def test_default_search_types_are_float32_and_the_targets_16_bit_types(opencl):
    from tvm_ext.target import offline_cuda

    gemm = GemmTemplate(*SHAPE)
    program = PrecisionProgram(gemm, gemm.default_config(opencl))
    assert program.space(opencl).knobs[0].choices == ("float32", "bfloat16")  # PoCL: no fp16
    cuda = offline_cuda()
    program = PrecisionProgram(gemm, gemm.default_config(cuda))
    assert program.space(cuda).knobs[0].choices == ("float32", "float16", "bfloat16")


def test_predictor_ranks_bound_violations_last(opencl):
    program = PrecisionProgram(GemmTemplate(*SHAPE), GemmTemplate(*SHAPE).default_config(opencl),
                               ("bfloat16", "float64"))
    space = program.space(opencl)
    configs = [space.make(a=a, b=b, acc=acc, c="float32") for a in ("float32", "bfloat16", "float64")
               for b in ("float32", "bfloat16") for acc in ("float32", "float64")]
    # What PoCL shows: bfloat16 operands are cheaper and cost ~1e-3 of error.
    costs = [1.0 - 0.2 * (c["a"] == "bfloat16") - 0.2 * (c["b"] == "bfloat16") for c in configs]
    errors = [1e-7 + 1e-3 * ((c["a"] == "bfloat16") + (c["b"] == "bfloat16")) for c in configs]
    pred = PrecisionPredictor(program, opencl, error_bound=1.5e-3)
    assert pred.fit(configs, costs, errors)
    scores = dict(zip(configs, pred.score(configs)))
    both = space.make(a="bfloat16", b="bfloat16", acc="float32", c="float32")
    one = space.make(a="bfloat16", b="float32", acc="float32", c="float32")
    none = space.make(a="float32", b="float32", acc="float32", c="float32")
    assert scores[one] > scores[none] > scores[both]  # fastest within the bound first


def test_cli_mixed_precision_gemm(tmp_path):
    out = tmp_path / "prog"
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "mixed-precision", "gemm", "--shape", "24,20,64",
                        "--m", "6", "--n0", "2", "--ng", "8", "--nm", "2", "--error-bound", "1e-2",
                        # float64 too: float32/bfloat16 alone leave PoCL 8 configs (no bfloat16
                        # accumulator on OpenCL), few enough for breeding to find nothing new
                        "--dtypes", "bfloat16,float64",
                        "--records", str(tmp_path / "r.jsonl"), "--out", str(out), "--workers", "1"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "6 configs measured" in p.stdout and "speedup" in p.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["error"] <= 1e-2 and manifest["configs_measured"] == 6
    shown = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "show", str(tmp_path / "r.jsonl")],
                           capture_output=True, text=True, timeout=120)
    best = next(line for line in shown.stdout.splitlines() if line.strip().startswith("best"))
    assert re.search(r"error \d\.\de-\d\d  a=", best), best  # each program's time beside its error


@pytest.mark.parametrize("args, message", [
    (["gemm", "--shape", "8,8,8", "--error-bound", "-1"], "error bound must be > 0"),
    (["gemm", "--shape", "8,8,8", "--ng", "2", "--nm", "4"], "ng must be >= nm"),
    (["gemm", "--shape", "8,0,8"], "shape dimensions must be positive"),
    (["conv"], "invalid choice"),
    (["gemm", "--shape", "8,8,8", "--target", "vulkan"], "unknown target"),
    (["gemm", "--shape", "8,8,8", "--dtypes", "float16"], "float16 not supported"),
    (["gemm", "--shape", "8,8,8", "--dtypes", "int8"], "int8 not supported"),
    (["gru", "--batch", "2", "--hidden", "8", "--input", "8", "--seq", "2", "--dtypes", "float8_e4m3fn"],
     "float8_e4m3fn: gru has no program storing it"),
    (["gemm", "--shape", "8,8,8", "--tensor-core", "tc_vec=3"], "tc_vec=3 is not allowed; allowed values: 1, 2, 4, 8"),
    (["gru", "--batch", "2", "--hidden", "8", "--input", "8", "--seq", "2", "--hidden-tensor-core", "tc_warp=2"],
     "unknown tensor-core knob 'tc_warp'"),
])
def test_cli_bad_input_is_one_line(args, message, tmp_path):
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "mixed-precision", *args,
                        "--records", str(tmp_path / "r.jsonl")] if args != ["conv"] else
                       [sys.executable, "-m", "tvm_ext.tune", "mixed-precision", "conv"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert message in p.stderr and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


@pytest.mark.slow
def test_gru_search_keeps_the_bound_resumes_and_its_program_reproduces_the_error(opencl, tmp_path):
    """The GRU layer as a mixed-precision program: S3 sees its three stages, the chosen
    program respects eb on fresh inputs, a rerun measures nothing, and the exported
    program (several kernels and a host plan) gives back the recorded error."""
    gru = GruTemplate(batch=2, hidden=16, input=8, seq=5)
    eb = 1e-2
    result, tuner = _search(opencl, tmp_path / "gru.jsonl", eb, m=8, base=gru)
    assert set(result.stage_secs) == {"input_gemm", "hidden_gemm", "cell"}
    assert all(v > 0 for v in result.stage_secs.values())
    assert result.best is not None and error_of(result.best) <= eb
    again, _ = _search(opencl, tmp_path / "gru.jsonl", eb, m=8, base=gru)
    assert again.new_measurements == 0 and again.best.config == result.best.config

    program = tuner.template
    chosen = tuner.space.make(**{**program.default_config(opencl).as_dict(),
                                 "w_ih": "bfloat16", "w_hh": "bfloat16", "gi": "bfloat16"})
    tuner.runner, tuner.builder = LocalRunner(opencl, FAST), LocalBuilder(workers=1)
    tuner.evaluate([chosen])
    tuner.builder.close(), tuner.runner.close()
    rec = tuner.record_of(chosen)
    assert 1e-4 < error_of(rec) <= eb
    out = tmp_path / "gru_program"
    export_program(program.lowered(chosen), program.schedule_config, opencl, str(out),
                   extra={"error": error_of(rec)})
    assert {"gru_init.py", "gru_gemm_x0.py"} <= {p.name for p in (out / "kernels").iterdir()}
    loaded = load_program(str(out))
    lowered = program.lowered(chosen)
    inputs, refs = lowered.make_case(np.random.default_rng(0))
    assert math.isclose(relative_error(loaded.run(*inputs), refs), error_of(rec), rel_tol=1e-6)
    inputs, refs = lowered.make_case(np.random.default_rng(99))
    assert relative_error(loaded.run(*inputs), refs) <= eb
