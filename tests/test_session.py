"""The session (one way in), measurement in batches with futures, jobs as data, one executor
per backend: real builds, real PoCL runs, real records on disk."""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tvm_ext.measure.builder import build_one
from tvm_ext.core.errors import ErrorKind, TvmExtError
from tvm_ext.measure.measure import MeasureSettings, UniformInputs, make_job, run_job
from tvm_ext.core.records import RecordStore
from tvm_ext.measure.runner import LocalRunner
from tvm_ext.schedules.gemm.simt import KNOBS, GemmTemplate
from tvm_ext.core.session import RUNNERS, STRATEGIES, Session, SessionOptions
from tvm_ext.core.space import Config, Knob, Space

FAST = MeasureSettings(warmup=1, repeat=3, min_repeat_secs=0.002)
CLI = [sys.executable, "-m", "tvm_ext.tune"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- names: one registry, one error line ---------------------------------------------------------
@pytest.mark.parametrize("args, allowed", [
    (["gemm", "--shape", "8,8,8", "--strategy", "annealing"], "unknown strategy 'annealing'; allowed: " +
     ", ".join(STRATEGIES)),
    (["gemm", "--shape", "8,8,8", "--runner", "cluster"], "unknown runner 'cluster'; allowed: " + ", ".join(RUNNERS)),
    (["gru", "--batch", "1", "--hidden", "4", "--input", "2", "--seq", "2", "--runner", "cluster"],
     "unknown runner 'cluster'"),
    (["model", os.path.join(ROOT, "examples", "mlp.py"), "--strategy", "annealing"], "unknown strategy 'annealing'"),
])
def test_unknown_strategy_or_runner_is_one_line_naming_the_allowed(args, allowed, tmp_path):
    p = subprocess.run(CLI + args + ["--records", str(tmp_path / "r.jsonl")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and allowed in err[0], p.stderr
    assert not (tmp_path / "r.jsonl").exists() or not (tmp_path / "r.jsonl").read_text()


def test_options_check_names_from_python():
    with pytest.raises(TvmExtError, match="allowed: random, ga, ga.xgb, ga.s6, analytic"):
        SessionOptions(strategy="annealing")
    with pytest.raises(TvmExtError, match="unknown runner 'cluster'; allowed: local, rpc"):
        SessionOptions(runner="cluster")


# ---- one session for every entry point --------------------------------------------------------------
MODEL_FILE = textwrap.dedent(f"""
    import importlib.util
    spec = importlib.util.spec_from_file_location("mlp_example", {os.path.join(ROOT, "examples", "mlp.py")!r})
    mlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mlp)
    SIZES = dict(batch=16, features=32, hidden=24, classes=8)

    def get_module():
        return mlp.get_module(**SIZES)

    def get_inputs():
        return mlp.get_inputs(**SIZES)

    def reference(inputs):
        return mlp.reference(inputs)
""")


def test_tune_model_with_the_xgb_cost_model(tmp_path):
    """``tune model --cost-model xgb`` runs the GA with the predictor stage on every task of
    the model, as ``tune gemm --cost-model xgb`` does: the second GEMM's model is warm from the
    first's records (another shape of the same template, tuned right after it), and the model
    is saved."""
    model_file = tmp_path / "small_mlp.py"
    model_file.write_text(MODEL_FILE)
    rec = tmp_path / "r.jsonl"
    p = subprocess.run(CLI + ["model", str(model_file), "--cost-model", "xgb", "--generations", "2",
                              "--population", "5", "--nm", "2", "--records", str(rec), "--database",
                              str(tmp_path / "db"), "--no-progress", "--workers", "1"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "(ok)" in p.stdout and "tuned (database)" in p.stdout
    notes, tuning = {}, None
    for line in p.stderr.splitlines():
        if line.startswith("tuning "):
            tuning = line.split(" for ")[0][len("tuning "):]
        elif line.startswith("cost model:"):
            notes[tuning] = line
    # one predictor stage per distinct workload: two GEMMs, the softmax and the layer norm
    gemms = [note for workload, note in notes.items() if workload.startswith("gemm ")]
    assert len(notes) == 4 and len(gemms) == 2, p.stderr
    assert "0 of other shapes" in gemms[0] and "0 of other shapes" not in gemms[1]  # the second GEMM's is warm
    assert "generation 1:" in p.stderr and "predictor" in p.stderr
    assert (tmp_path / "r.xgb.json").exists()
    workloads = {json.loads(line)["workload_key"] for line in rec.read_text().splitlines()}
    assert len(workloads) == 4


# ---- batches, dedup by generated source, results as they arrive ------------------------------------------
@dataclasses.dataclass(frozen=True)
class LabelledGemm(GemmTemplate):
    """The GEMM with a knob that changes nothing in the kernel: configs differing only in it
    generate the same source."""

    name = "labelled_gemm"

    def space(self, target):
        base = super().space(target)
        strip = lambda c: Config(tuple(kv for kv in c.items if kv[0] != "label"))  # noqa: E731
        return Space(KNOBS + (Knob("label", (0, 1, 2)),), tuple(lambda c, f=f: f(strip(c)) for f in base.constraints))

    def default_config(self, target):
        return Config(GemmTemplate(self.m, self.n, self.k).default_config(target).items + (("label", 0),))

    def schedule(self, config, target, func=None, site=None):
        return super().schedule(Config(tuple(kv for kv in config.items if kv[0] != "label")), target)


class BatchRecordingRunner(LocalRunner):
    """The local runner, remembering each batch it is handed and its futures."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.batches, self.futures = [], []

    def submit(self, template, builds):
        futures = super().submit(template, builds)
        self.batches.append([b.config for b in builds])
        self.futures.append(futures)
        return futures


@pytest.mark.parametrize("overlap", [False, True])
def test_a_generation_is_deduplicated_by_source_and_recorded_as_results_arrive(overlap, opencl, tmp_path):
    """Without overlap the runner gets the generation as one batch; with it, each build as it
    ends (in chunks of one round of the build pool, two configs here), deduplicated across
    chunks: one job per source, whichever twin's build ended first."""
    template = LabelledGemm(24, 16, 32)
    base = template.default_config(opencl)
    other = base.replace(wg_x=4, wg_y=4, task_x=2, task_y=2)
    generation = [base, base.replace(label=1), other, other.replace(label=2), base.replace(label=2),
                  base.replace(k_step=16)]
    runner = BatchRecordingRunner(opencl, FAST, timeout=120)
    seen_pending = []

    def on_record(rec, tuner):
        seen_pending.append(sum(not f.done() for f in runner.futures[-1]))

    path = tmp_path / "r.jsonl"
    with Session(SessionOptions(records=str(path), workers=2, overlap=overlap), target=opencl,
                 runner=runner) as session:
        tuner = session.tuner(template, on_record=on_record)
        costs = tuner.evaluate(generation)
    measured = [config for batch in runner.batches for config in batch]
    twins = [{base, base.replace(label=1), base.replace(label=2)}, {other, other.replace(label=2)},
             {base.replace(k_step=16)}]
    assert sorted(next(i for i, same in enumerate(twins) if c in same) for c in measured) == [0, 1, 2]
    if overlap:
        assert tuner.most_waiting <= 4  # two chunks building or waiting at most
    else:
        assert measured == [base, other, base.replace(k_step=16)]  # the first of each source, in order
        assert len(runner.batches) == 1  # the whole generation at once
        assert seen_pending[0] > 0  # the first record was written while the batch was still measuring
    assert np.isfinite(costs).all()
    assert costs[0] == costs[1] == costs[4] and costs[2] == costs[3]  # twins share the measurement
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and tuner.trials == 3
    batches = len(runner.batches)
    with Session(SessionOptions(records=str(path), workers=1), target=opencl, runner=runner) as session:
        again = session.tuner(template)
        assert again.resumed == 3
        (cost,) = again.evaluate([base.replace(label=3)])  # built, its source known: not measured
    assert again.trials == 0 and cost == costs[0] and len(runner.batches) == batches


# ---- a measurement job is data -----------------------------------------------------------------------------
JOB_RUNNER = """
import json, pickle, sys
from tvm_ext.measure.measure import run_job
job = pickle.load(open(sys.argv[1], "rb"))
result = run_job(job)
loaded = sorted(m for m in sys.modules if m.startswith(("tvm_ext.schedules", "tvm_ext.core.template")))
print(json.dumps({"kind": result.error_kind.value, "cost": result.cost, "msg": result.error_msg, "loaded": loaded}))
"""


def test_a_job_runs_in_a_fresh_process_without_template_code(opencl, tmp_path):
    """The job carries the kernel source, launches, buffers, inputs, references and check:
    a process that never imported a template runs it, and it judges by the job's references."""
    template = GemmTemplate(20, 12, 36)
    build = build_one(template, template.default_config(opencl), opencl)
    job = make_job(template, build.config, build.artifact, opencl, FAST)
    assert [name for name, _ in job.buffers] == ["A", "B", "C"] and len(job.references) == 1
    assert isinstance(job.inputs, UniformInputs)  # drawn by the worker from the seed: A and B do not travel
    wrong = dataclasses.replace(job, references=(job.references[0] * 1.01,))
    script = tmp_path / "run_job.py"
    script.write_text(JOB_RUNNER)
    outcomes = []
    for which, data in (("right", job), ("wrong", wrong)):
        path = tmp_path / f"{which}.pkl"
        path.write_bytes(pickle.dumps(data))
        p = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        outcomes.append(json.loads(p.stdout.strip().splitlines()[-1]))
    right, wrong_outcome = outcomes
    assert right["kind"] == "" and 0 < right["cost"] < 10, right
    assert wrong_outcome["kind"] == ErrorKind.WRONG_ANSWER.value and "relative error" in wrong_outcome["msg"]
    assert right["loaded"] == [] and wrong_outcome["loaded"] == []
    rotated = run_job(dataclasses.replace(job, rotation_sets=3))  # timing cycles over 3 input sets
    assert rotated.ok and len(rotated.costs) == FAST.repeat


def test_error_kinds_are_one_enum_and_old_records_read_back(tmp_path):
    path = tmp_path / "r.jsonl"
    base = {"workload_key": "k", "workload": {}, "config": {"x": 1}, "costs": [], "error_msg": "m"}
    lines = [dict(base, error_kind=kind) for kind in ("", "wrong_answer", "crash", "runtime_error", "no_such_kind")]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    store = RecordStore(path)
    kinds = [r.error_kind for r in store]
    assert kinds == [ErrorKind.OK, ErrorKind.WRONG_ANSWER, ErrorKind.CRASH, ErrorKind.RUN_ERROR]
    assert store.skipped_lines == 1  # an unknown kind is a foreign line, never fatal
    assert [k.value for k in kinds] == ["", "wrong_answer", "crash", "run_error"]


def test_the_local_runner_measures_on_several_devices(opencl, tmp_path):
    """devices=(0, 0): two isolated workers on the one PoCL device, jobs spread over both."""
    template = GemmTemplate(16, 16, 16)
    space = template.space(opencl)
    configs = [template.default_config(opencl)] + [space.decode(r) for r in
                                                   space.random_feasible_indices(np.random.default_rng(1), 5)]
    builds = [build_one(template, c, opencl) for c in configs]
    options = SessionOptions(runner_options=(("devices", "0,0"),), measure=FAST)
    with RUNNERS["local"].make(options, opencl, print) as runner:
        results = [f.result() for f in runner.submit(template, builds)]
        assert runner.devices == (0, 0) and len(runner.workers) == 2
    assert all(r.ok for r in results), [(r.error_kind, r.error_msg) for r in results]
    with pytest.raises(TvmExtError, match="devices='x' is not"):
        SessionOptions(runner_options=(("devices", "x"),))


# ---- one executor per backend, one OpenCL context --------------------------------------------------------
def test_every_opencl_path_shares_one_context(opencl, tmp_path):
    from tvm_ext.precision.codegen import export_program, load_program
    from tvm_ext.measure.executors import opencl_context
    from tvm_ext.schedules.gru import GRU

    gru = GRU.build(opencl, 3, 4, batch=2, seq=2)
    gemm = GemmTemplate(8, 8, 8)
    export_program(gemm, gemm.default_config(opencl), opencl, str(tmp_path / "prog"))
    program = load_program(str(tmp_path / "prog"))
    a, b = np.ones((8, 8), np.float32), np.full((8, 8), 2.0, np.float32)
    (c,) = program.run(a, b)
    assert np.allclose(c, 16.0)
    ctx, _ = opencl_context(opencl.device_id)
    assert gru.executor.ctx is ctx and program.executor.ctx is ctx


# ---- the GA's first individuals ----------------------------------------------------------------------------
def test_the_ga_starts_from_the_default_and_the_templates_own_analytic_pick(tmp_path):
    """A short search (a model's tasks get a few trials each) must not end below the
    zero-measurement pick: the GRU's pick is a persistent fused kernel random draws rarely hit."""
    from tvm_ext.schedules.gru import GruTemplate
    from tvm_ext.target import offline_cuda

    target = offline_cuda()
    template = GruTemplate(batch=16, hidden=512, input=256, seq=8, layers=2)
    space, default = template.space(target), template.default_config(target)
    pick = template.analytic_pick(target)[0]
    assert pick != default and pick.fuse_step == 1
    with Session(SessionOptions(records=str(tmp_path / "r.jsonl")), target=target) as session:
        first = [space.decode(row) for row in session.seeds(template, space, default)]
    assert first == [default, pick]
    with Session(SessionOptions(records=str(tmp_path / "r.jsonl"), analytic_seeds=0), target=target) as session:
        assert [space.decode(row) for row in session.seeds(template, space, default)] == [default]


def test_the_known_good_tile_comes_before_method_002s_picks(tmp_path):
    """A model's task gets a few trials: the GEMM's measured tile (``known_good``) is the second
    individual, ahead of method 002's picks, so a population of 4 measures it."""
    from tvm_ext.schedules.gemm.simt import GemmTemplate
    from tvm_ext.target import offline_cuda

    target = offline_cuda()
    template = GemmTemplate(1024, 768, 3072, staging=True)
    space, default = template.space(target), template.default_config(target)
    with Session(SessionOptions(records=str(tmp_path / "r.jsonl")), target=target) as session:
        first = [space.decode(row) for row in session.seeds(template, space, default)]
    assert first[:2] == [default, *template.known_good(target)] and len(first) > 2
