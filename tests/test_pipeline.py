"""Tuned schedules inside TVM's Relax pipeline, for real on PoCL: tune the example MLP's GEMMs,
export a meta_schedule database, compile the model with it, run it and compare with numpy."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tvm_ext.measure.builder import build_one
from tvm_ext.relax.pipeline import (TuneOptions, compile_relax, extract_tasks, legalize_and_fuse, load_model,
                                    match_tasks, tune_relax)
from tvm_ext.core.records import RecordStore
from tvm_ext.relax.tvm_export import open_database, ranked_records, replay, tvm_target

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "mlp.py")
OPTIONS = TuneOptions(generations=1, population=6, seed=0)  # the CLI's defaults for the same flags


def _load_example():
    spec = importlib.util.spec_from_file_location("example_mlp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mlp():
    return _load_example()


@pytest.fixture(scope="module")
def tuned(mlp, opencl, tmp_path_factory):
    """A real tuning run of the example's GEMMs on PoCL, exported as a database."""
    work = tmp_path_factory.mktemp("pipeline")
    records, database = str(work / "records.jsonl"), str(work / "database")
    messages: list[str] = []
    result = tune_relax(mlp.get_module(), opencl, records, database, OPTIONS, log=messages.append)
    return {"result": result, "records": records, "database": database, "messages": messages, "work": work}


def _task(result, name):
    (task,) = [t for t in result.tasks if t.name == name]
    return task


def test_gemm_and_row_tasks_are_tuned_and_the_rest_falls_back(tuned):
    result = tuned["result"]
    gemms = {t.name: t for t in result.tasks if t.template == "gemm"}
    assert set(gemms) == {"fused_matmul_add_relu", "matmul1"}
    assert all(t.exported and np.isfinite(t.best_secs) for t in gemms.values())
    assert dict(gemms["fused_matmul_add_relu"].params)["n"] == 256
    rows = {t.name: t for t in result.tasks if t.template == "rows"}
    assert {n: dict(t.params)["op"] for n, t in rows.items()} == {"layer_norm": "layer_norm", "softmax": "softmax"}
    assert all(t.exported and np.isfinite(t.best_secs) for t in rows.values())
    others = [t for t in result.tasks if not t.template]
    assert {t.name for t in others} == {"transpose", "transpose1"}
    assert all(not t.exported and "no reduction" in t.note for t in others)
    assert any("transpose1" in m and "no template" in m for m in tuned["messages"])


def test_compiled_model_gives_the_reference_result(tuned, mlp, opencl):
    messages: list[str] = []
    model = load_model(mlp.get_module(), opencl, tuned["database"], log=messages.append)
    inputs = mlp.get_inputs()
    out = model(*inputs)
    ref = mlp.reference(inputs)
    assert out.shape == ref.shape and out.dtype == np.float32
    assert np.abs(out - ref).max() < 1e-5
    # exactly the untuned kernels were given dlight's schedules, each with a message
    fallback = sorted(m.split(":")[1].strip() for m in messages)
    assert fallback == ["transpose", "transpose1"]
    assert all("dlight" in m for m in messages)
    assert model.time(*inputs, repeat=3) > 0


def _canonical(source: str, params: tuple[str, ...], ours: tuple[str, ...]) -> str:
    """Kernel body with the task's buffer names replaced by the template's (A, B, C)."""
    for theirs, mine in zip(params, ours):
        stem = re.escape(theirs.replace(".", "_"))
        source = re.sub(rf"\b{stem}(?=_(?:pad|shared|local|ptr))", mine, source)
    return "\n".join(l for l in source.splitlines() if not l.startswith("__kernel")).strip()


def test_best_records_reach_the_compiled_kernels(tuned, mlp, opencl, tmp_path):
    """The model's GEMM kernels are the kernels our builder produced for the best configs."""
    model = load_model(mlp.get_module(), opencl, tuned["database"], log=None)
    steps = {s.func: s for s in model._exec.plan.steps}
    lowered = legalize_and_fuse(mlp.get_module())
    tasks = extract_tasks(lowered, opencl)
    store = RecordStore(tuned["records"])
    for match in match_tasks(tasks, opencl):
        if not match.matched:
            continue
        best = ranked_records(store, match, opencl)[0]
        assert best.cost == _task(tuned["result"], match.name).best_secs
        ours = build_one(match.template, best.config_obj(), opencl)
        assert ours.ok and ours.artifact.source_hash == best.source_hash  # the measured kernel
        compiled = steps[match.name].artifact
        assert [(l.grid, l.block) for l in compiled.launches] == [(l.grid, l.block) for l in ours.artifact.launches]
        if match.template.name != "gemm":
            continue
        if match.site.epilogue:  # bias and ReLU are stored by the GEMM kernel itself
            assert len(compiled.launches) == 1 and "max(" in compiled.source
        else:  # no epilogue: the very same kernel, up to buffer names
            a, b = (compiled.params[match.site.a], compiled.params[match.site.b])
            theirs = (a, b, compiled.params[-1])
            assert _canonical(compiled.source, theirs, ("A", "B", "C")) == \
                _canonical(ours.artifact.source, ("A", "B", "C"), ("A", "B", "C"))


def test_database_round_trip(tuned, mlp, opencl):
    import tvm
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(work_dir=tuned["database"])  # a fresh reader of the files
    lowered = legalize_and_fuse(mlp.get_module())
    tasks = extract_tasks(lowered, opencl)
    store = RecordStore(tuned["records"])
    found = 0
    for task, match in zip(tasks, match_tasks(tasks, opencl)):
        mod = task.dispatched[0]
        if not match.matched:
            assert not db.has_workload(mod)
            continue
        assert db.has_workload(mod)
        record = db.query_tuning_record(mod, tvm_target(opencl), "main")
        best = ranked_records(store, match, opencl)[0]
        assert record is not None and float(record.run_secs[0]) == pytest.approx(best.cost)
        scheduled = db.query_ir_module(mod, tvm_target(opencl), "main")
        expected = replay(match, best.config_obj(), mod, opencl).mod
        assert tvm_ffi.structural_equal(scheduled["main"], expected["main"])
        found += 1
    assert found == 4  # two GEMMs, the layer norm and the softmax
    # what a TVM user does with the folder: the zero pipeline inside `with target, database`
    from tvm import relax

    with tvm_target(opencl), db, tvm.transform.PassContext(opt_level=3):
        applied = relax.get_pipeline("zero")(mlp.get_module())
    assert applied["fused_matmul_add_relu"].attrs["tirx.is_scheduled"]
    assert applied["softmax"].attrs["tirx.is_scheduled"]
    assert "tirx.is_scheduled" not in (applied["transpose"].attrs or {})


def test_export_is_idempotent(tuned, mlp, opencl):
    before = open(os.path.join(tuned["database"], "database_tuning_record.json")).read()
    again = tune_relax(mlp.get_module(), opencl, tuned["records"], tuned["database"], OPTIONS, log=None)
    assert sum(t.trials for t in again.tasks) == 0  # resumed: nothing measured twice
    assert open(os.path.join(tuned["database"], "database_tuning_record.json")).read() == before


def test_the_build_processes_start_before_the_models_tasks_are_found(tuned, mlp, opencl, monkeypatch):
    """The session's build pool starts (and warms) before the tasks are extracted, so that it is
    ready when the first candidates come rather than starting then (here a rerun, every task in
    the database: nothing is tuned)."""
    from tvm_ext.measure.builder import LocalBuilder
    from tvm_ext.relax import pipeline

    events: list[str] = []
    start, extract = LocalBuilder.start, pipeline.extract_tasks
    monkeypatch.setattr(LocalBuilder, "start", lambda self: (events.append("start"), start(self))[1])
    monkeypatch.setattr(pipeline, "extract_tasks", lambda *a, **k: (events.append("extract"), extract(*a, **k))[1])
    again = tune_relax(mlp.get_module(), opencl, tuned["records"], tuned["database"], OPTIONS, log=None)
    assert events == ["start", "extract"]
    assert sum(t.trials for t in again.tasks) == 0


def test_task_without_template_falls_back_to_dlight(opencl, tmp_path):
    """A column sum: no template, dlight schedules it, with a message; the whole-tensor max, a
    row of one since ``whole_reductions``, takes the row template and is tuned."""
    from tvm.relax.frontend import nn

    class Columns(nn.Module):
        def forward(self, a):
            return nn.op.sum(a, axis=0) + nn.op.max(a)

    mod, _ = Columns().export_tvm(spec={"forward": {"a": nn.spec.Tensor((8, 16), "float32")}})
    messages: list[str] = []
    result = tune_relax(mod, opencl, str(tmp_path / "r.jsonl"), str(tmp_path / "db"), OPTIONS,
                        log=messages.append)
    exported = {t.name for t in result.tasks if t.exported}
    assert exported == {"max"}, [(t.name, t.note) for t in result.tasks]
    assert any("does not reduce the last axis" in t.note for t in result.tasks), [t.note for t in result.tasks]
    untuned = [m for m in messages if "no template" in m]
    assert len(untuned) == len(result.tasks) - 1 and any("for max" in m for m in messages)
    assert os.path.getsize(tmp_path / "r.jsonl")  # the max's trials recorded
    messages.clear()
    model = load_model(mod, opencl, str(tmp_path / "db"), log=messages.append)
    assert messages and all("using TVM's default (dlight)" in m for m in messages)
    a = np.random.default_rng(1).standard_normal((8, 16)).astype("float32")
    expected = a.astype(np.float64).sum(0) + a.max()
    np.testing.assert_allclose(model(a), expected, rtol=1e-5, atol=1e-5)


def test_cuda_compile_with_exported_schedules_offline(tuned, mlp, tmp_path):
    """No GPU here: the CUDA build of the model still uses the exported schedules (source only)."""
    import tvm

    from tvm_ext.schedules.gemm.simt import STAGING_DEFAULTS
    from tvm_ext.target import offline_cuda
    from tvm_ext.relax.tvm_export import commit

    cuda = offline_cuda()
    lowered = legalize_and_fuse(mlp.get_module())
    tasks = extract_tasks(lowered, cuda)
    db = open_database(str(tmp_path / "cuda_db"))
    for task, match in zip(tasks, match_tasks(tasks, cuda)):
        if match.matched and match.template.name == "gemm":  # a fixed config stands in for a CUDA tuning run
            assert match.template.staging  # CUDA tasks search the staging knobs: here at their first values
            config = match.template.space(cuda).make(
                wg_x=16, wg_y=8, task_x=4, task_y=4, k_step=16, use_shared=1, pad=1, unroll=64, vec=4,
                double_buffer=1, a_transposed=1, **STAGING_DEFAULTS)
            commit(db, task.dispatched[0], match, config, 1e-3, cuda)
    scheduled = compile_relax(mlp.get_module(), cuda, db, log=None)
    ex = tvm.compile(scheduled, target=tvm_target(cuda))
    source = ex.mod.imports[0].imports[0].inspect_source()
    start = re.search(r"__launch_bounds__\((\d+)\) fused_matmul_add_relu_kernel\([^)]*\) \{", source)
    assert start and start.group(1) == "128"  # 16 x 8 threads
    gemm = source[start.end():]
    gemm = gemm[:gemm.index("\n}\n")]
    assert "__shared__" in gemm and "max(" in gemm and "fc1_bias_ptr" in gemm  # epilogue in the GEMM


def test_cli_model_runs(tuned, tmp_path):
    cmd = [sys.executable, "-m", "tvm_ext.tune", "model", EXAMPLE, "--generations", "1", "--population", "6",
           "--records", tuned["records"], "--database", str(tmp_path / "db"), "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "fused_matmul_add_relu" in p.stdout and "tuned (database)" in p.stdout
    assert "max |error| vs reference" in p.stdout and "(ok)" in p.stdout
    assert "transpose: no tuned schedule in the database, using TVM's default (dlight)" in p.stderr
    assert os.path.getsize(tmp_path / "db" / "database_tuning_record.json")


@pytest.mark.parametrize("args, message", [
    (["model", "no/such/model.py"], "does not exist"),
    (["model", os.path.join(ROOT, "tests")], "is a folder"),
    (["model", os.path.join(ROOT, "tests", "conftest.py")], "must define get_module()"),
    (["model", EXAMPLE, "--target", "cuda"], "no CUDA GPU"),
    (["model", EXAMPLE, "--runner", "cluster"], "unknown runner 'cluster'; allowed: local"),
])
def test_cli_model_bad_input(args, message, tmp_path):
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune"] + args + ["--records", str(tmp_path / "r.jsonl")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], p.stderr


@pytest.mark.gpu
def test_cuda_model_matches_reference(mlp, tmp_path):
    """On the GPU machine: tune on CUDA, compile with the database, run in the Relax VM."""
    from tvm_ext.target import resolve_target

    cuda = resolve_target("cuda")
    result = tune_relax(mlp.get_module(), cuda, str(tmp_path / "r.jsonl"), str(tmp_path / "db"), OPTIONS)
    exported = {t.name for t in result.tasks if t.exported}  # the two GEMMs and the two row reductions
    assert exported == {"fused_matmul_add_relu", "matmul1", "layer_norm", "softmax"}
    model = load_model(mlp.get_module(), cuda, str(tmp_path / "db"))
    inputs = mlp.get_inputs()
    assert np.abs(model(*inputs) - mlp.reference(inputs)).max() < 1e-5
    assert model.time(*inputs) > 0


def test_gru_classifier_example_runs_and_matches_numpy(tmp_path, capsys):
    """examples/gru_classifier.py: a tuned GRU layer feeding a Relax head compiled with tuned
    schedules, on OpenCL (PoCL), against float64 numpy."""
    spec = importlib.util.spec_from_file_location("example_gru", os.path.join(ROOT, "examples", "gru_classifier.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    code = example.main(["--seq", "4", "--batch", "2", "--features", "8", "--hidden", "16", "--classes", "3",
                         "--records", str(tmp_path / "r.jsonl"), "--database", str(tmp_path / "db"),
                         "--workers", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "(ok)" in out and "fused_matmul_add" in out and "tuned (database)" in out


def test_a_0d_input_reaches_the_vm_as_0d():
    """A model's scalar argument (an 8-bit matmul's scale) keeps its shape on the way to the VM:
    numpy's ascontiguousarray makes it 1-d, which the VM refuses (found on the GPU)."""
    import tvm

    from tvm_ext.relax.pipeline import CompiledModel

    model = CompiledModel.__new__(CompiledModel)  # only the argument conversion, on the host
    model._dev = tvm.cpu()
    scale, x = np.array(0.5, np.float32), np.arange(6, dtype=np.float32).reshape(2, 3).T
    args = model._args([scale, x])
    assert [tuple(a.shape) for a in args] == [(), (3, 2)]
    assert args[0].numpy() == 0.5 and np.array_equal(args[1].numpy(), x)


def _scans(x: Any, i: Any) -> Any:
    """The scans of ``test_scans_of_every_form_run``, and what numpy gives for them."""
    from tvm import relax

    bb = relax.BlockBuilder()
    with bb.function("main", [x, i]):
        with bb.dataflow():
            out = bb.emit_output(relax.Tuple([
                bb.emit(relax.op.cumsum(x, axis=-1)),
                bb.emit(relax.op.cumsum(i, axis=1, dtype="int64", exclusive=True)),
                bb.emit(relax.op.cumsum(i)),
                bb.emit(relax.op.cumprod(relax.op.strided_slice(x, [1], [0], [4]), axis=0))]))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("kind", ["opencl", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_scans_of_every_form_run(kind):
    """``R.cumsum`` / ``R.cumprod``: on OpenCL legalized as reductions (``tvm_ext.relax.scans``),
    on CUDA dispatched by TVM's build: the last axis (a length past one work-group's 128 threads),
    a middle axis exclusive into int64, the whole flattened input (``axis=None``), a product down
    the first axis; each against numpy.  A scan past ``MAX_SCAN_LENGTH`` is refused on OpenCL."""
    from tvm import relax

    from tvm_ext.core.errors import TvmExtError
    from tvm_ext.precision.precision import relative_error
    from tvm_ext.relax.pipeline import CompiledModel, compile_relax
    from tvm_ext.target import resolve_target

    target = resolve_target(kind, 0)
    x = relax.Var("x", relax.TensorType((3, 300), "float32"))
    i = relax.Var("i", relax.TensorType((2, 6, 5), "int32"))
    model = CompiledModel(compile_relax(_scans(x, i), target, log=None), target)
    rng = np.random.default_rng(3)
    xs, ints = rng.random((3, 300)).astype(np.float32), rng.integers(-3, 3, (2, 6, 5)).astype(np.int32)
    along, middle, flat, product = model(xs, ints)
    assert relative_error(along, np.cumsum(xs.astype(np.float64), axis=1)) < 1e-6
    assert middle.dtype == np.int64 and np.array_equal(middle, np.cumsum(ints, axis=1) - ints)
    assert flat.shape == (60,) and np.array_equal(flat, np.cumsum(ints))
    assert relative_error(product, np.cumprod(xs[:, :4].astype(np.float64), axis=0)) < 1e-6
    if kind == "opencl":
        long = relax.Var("x", relax.TensorType((2, 20000), "float32"))
        bb = relax.BlockBuilder()
        with bb.function("main", [long]):
            with bb.dataflow():
                out = bb.emit_output(bb.emit(relax.op.cumsum(long, axis=1)))
            bb.emit_func_output(out)
        with pytest.raises(TvmExtError, match=r"^cumsum over 20000 elements: on OpenCL a scan or sort runs as"):
            compile_relax(bb.get(), target, log=None)


@pytest.mark.parametrize("kind", ["opencl", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_sorts_of_every_form_run(kind):
    """``R.sort`` / ``R.argsort`` / ``R.topk``: on OpenCL ranks counted and gathered
    (``tvm_ext.relax.sorts``), on CUDA TVM's GPU sort: ascending and descending, ties in order of
    index on OpenCL (stable, as numpy's), NaN above every number there (torch's order), the middle
    axis, int32 indices, top-k's values and indices; each against numpy."""
    from tvm import relax

    from tvm_ext.relax.pipeline import CompiledModel, compile_relax
    from tvm_ext.target import resolve_target

    target = resolve_target(kind, 0)
    x = relax.Var("x", relax.TensorType((3, 40), "float32"))
    m = relax.Var("m", relax.TensorType((2, 7, 3), "int32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, m]):
        with bb.dataflow():
            out = bb.emit_output(relax.Tuple([
                bb.emit(relax.op.sort(x, axis=1)),
                bb.emit(relax.op.sort(x, axis=-1, descending=True)),
                bb.emit(relax.op.argsort(x, axis=1, dtype="int32")),
                bb.emit(relax.op.argsort(m, axis=1)),
                bb.emit(relax.op.topk(x, 4, axis=1, ret_type="both", largest=True, dtype="int64")),
                bb.emit(relax.op.topk(m, 2, axis=1, ret_type="values", largest=False))]))
        bb.emit_func_output(out)
    rng = np.random.default_rng(4)
    xs = rng.integers(0, 9, (3, 40)).astype(np.float32)  # many ties
    if kind == "opencl":  # NaN's place is ours there; TVM's GPU sort does not say where it goes
        xs[1, [3, 17]] = np.nan
    ms = rng.integers(-4, 4, (2, 7, 3)).astype(np.int32)
    up, down, order, middle, (values, indices), smallest = CompiledModel(
        compile_relax(bb.get(), target, log=None), target)(xs, ms)
    key = np.where(np.isnan(xs), 1e30, xs)  # NaN above every number, as torch orders it
    ascending, descending = np.argsort(key, axis=1, kind="stable"), np.argsort(-key, axis=1, kind="stable")
    np.testing.assert_array_equal(up, np.take_along_axis(xs, ascending, 1))
    np.testing.assert_array_equal(down, np.take_along_axis(xs, descending, 1))
    np.testing.assert_array_equal(values, np.take_along_axis(xs, descending, 1)[:, :4])
    np.testing.assert_array_equal(smallest, np.sort(ms, axis=1)[:, :2])
    assert order.dtype == np.int32 and indices.dtype == np.int64
    if kind == "opencl":  # the order of ties (index order, stable) is ours; TVM's GPU sort does not promise it
        np.testing.assert_array_equal(order, ascending)
        np.testing.assert_array_equal(middle, np.argsort(ms, axis=1, kind="stable"))
        np.testing.assert_array_equal(indices, descending[:, :4])


def test_a_reduction_of_every_axis_runs_as_one_row(opencl):
    """``x.sum()``, ``x.mean()``, a variance, an argmax of the flattened tensor, a max kept in
    two dimensions (``relax_rewrites.whole_reductions``): each against numpy, on one row, its
    kernels launched once each (TVM's fallback launched one kernel per element, from a host loop
    with a buffer of the host's, which the OpenCL executor does not run)."""
    from tvm import relax

    from tvm_ext.relax.pipeline import CompiledModel, compile_relax
    from tvm_ext.relax.relax_opencl import plan_relax

    x = relax.Var("x", relax.TensorType((30, 70), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.Tuple([bb.emit(relax.op.sum(x)), bb.emit(relax.op.mean(x)),
                                              bb.emit(relax.op.variance(x)), bb.emit(relax.op.argmax(x)),
                                              bb.emit(relax.op.max(x, [0, 1], keepdims=True))]))
        bb.emit_func_output(out)
    scheduled = compile_relax(bb.get(), opencl, log=None)
    assert all(len(step.artifact.launches) <= 2 for step in plan_relax(scheduled, opencl).steps)
    xs = np.random.default_rng(5).standard_normal((30, 70)).astype(np.float32)
    total, mean, var, where, top = CompiledModel(scheduled, opencl)(xs)
    assert total.shape == mean.shape == var.shape == where.shape == () and top.shape == (1, 1)
    np.testing.assert_allclose([total, mean, var], [xs.astype(np.float64).sum(), xs.mean(), xs.var()], rtol=1e-5)
    assert int(where) == int(np.argmax(xs)) and top[0, 0] == xs.max()
