"""End-to-end tuning on the real OpenCL device (PoCL on CI): records, resume, failures as data."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from broken_gemm import BrokenGemm
from tvm_ext.measure.builder import LocalBuilder, build_one
from tvm_ext.core.records import RecordStore
from tvm_ext.measure.measure import measure
from tvm_ext.measure.runner import LocalRunner, MeasureSettings
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.core.search import GeneticSearch
from tvm_ext.core.tuner import Tuner

FAST = MeasureSettings(warmup=1, repeat=3, min_repeat_secs=0.002)


@pytest.fixture(scope="module")
def build_pool():
    """Two build processes for the module's tuners (a build leaves nothing behind in them; a
    process a broken kernel kills is replaced)."""
    builder = LocalBuilder(workers=2, timeout=120)
    yield builder
    builder.close()


def _tuner(template, target, path, builder, trials=1 << 30):
    return Tuner(template, target, builder, LocalRunner(target, FAST, timeout=60), RecordStore(path), trials=trials)


def _ga(tuner, seed=0, pop=6, gens=2):
    default = tuner.template.default_config(tuner.target)
    return GeneticSearch(tuner.space, np.random.default_rng(seed), size_pop=pop, generations=gens,
                         seeds=[tuner.space.encode(default)])


@pytest.mark.parametrize("shape", [(127, 513, 65), (1, 1, 1), (33, 7, 129)])
def test_non_multiple_shapes_are_correct(opencl, shape, tmp_path):
    """Every config here runs the reference check on fresh random inputs; a wrong one fails."""
    tmpl = GemmTemplate(*shape)
    space = tmpl.space(opencl)
    configs = [tmpl.default_config(opencl),
               space.make(wg_x=8, wg_y=4, task_x=4, task_y=4, k_step=16, use_shared=1, pad=1,
                          unroll=512, vec=4, double_buffer=1, a_transposed=1),
               space.make(wg_x=4, wg_y=8, task_x=2, task_y=1, k_step=4, use_shared=0, pad=0,
                          unroll=0, vec=2, double_buffer=0, a_transposed=0)]
    for cfg in configs:
        assert space.is_feasible(cfg), space.infeasible_reason(cfg)
        build = build_one(tmpl, cfg, opencl)
        assert build.ok, build.error_msg
        result = measure(tmpl, build.config, build.artifact, opencl, FAST)
        assert result.ok, f"{cfg}: {result.error_kind} {result.error_msg}"
        assert 0 < result.cost < 10


def test_tuning_writes_records_beats_default_and_resumes(opencl, build_pool, tmp_path):
    path = tmp_path / "records.jsonl"
    tmpl = GemmTemplate(64, 64, 64)
    tuner = _tuner(tmpl, opencl, path, build_pool)
    result = tuner.tune(_ga(tuner))
    tuner.runner.close()
    lines = path.read_text().splitlines()
    assert result.trials == len(lines) >= 8
    rec = json.loads(lines[0])
    for field in ("workload_key", "config", "costs", "error_kind", "build_secs", "trace", "timestamp"):
        assert field in rec
    assert rec["workload"]["template"] == "gemm" and rec["workload"]["params"]["m"] == 64
    assert rec["workload"]["tvm_version"] and rec["workload"]["template_hash"]
    assert isinstance(rec["trace"], list) and rec["trace"]
    assert result.best is not None and result.default is not None
    assert result.best.cost < result.default.cost
    assert RecordStore(path).best(result.workload.key).cost == result.best.cost

    # Same command again: everything is read back, nothing is measured twice.
    again = _tuner(tmpl, opencl, path, build_pool)
    second = again.tune(_ga(again))
    again.runner.close()
    assert second.resumed == result.trials
    assert second.trials == 0
    assert len(path.read_text().splitlines()) == len(lines)
    assert second.best.cost == result.best.cost


def test_budget_stops_the_search_and_a_rerun_continues(opencl, build_pool, tmp_path):
    path = tmp_path / "r.jsonl"
    tmpl = GemmTemplate(32, 32, 32)
    first = _tuner(tmpl, opencl, path, build_pool, trials=4)
    r1 = first.tune(_ga(first, gens=3))
    assert r1.trials == 4
    second = _tuner(tmpl, opencl, path, build_pool, trials=4)
    r2 = second.tune(_ga(second, gens=3))
    assert r2.resumed == 4 and r2.trials == 4
    configs = [json.dumps(json.loads(l)["config"], sort_keys=True) for l in path.read_text().splitlines()]
    assert len(configs) == len(set(configs)) == 8  # no config measured twice
    for t in (first, second):
        t.runner.close()


class RecordingBuilder:
    """The real builder, remembering what it was asked to build."""

    def __init__(self, builder: LocalBuilder):
        self.builder = builder
        self.workers = builder.workers
        self.asked = []

    def build(self, template, configs, target):
        self.asked.extend(configs)
        return self.builder.build(template, configs, target)


def test_infeasible_configs_never_reach_the_builder(opencl, build_pool, tmp_path):
    narrow = dataclasses.replace(opencl, max_threads_per_block=16)  # most configs infeasible
    builder = RecordingBuilder(build_pool)
    tuner = _tuner(GemmTemplate(16, 16, 16), narrow, tmp_path / "r.jsonl", builder=builder)
    ga = _ga(tuner, pop=8, gens=3)
    proposed = []
    original = ga.propose

    def spy():
        batch = original()
        proposed.extend(tuner.space.decode(r) for r in batch)
        return batch

    ga.propose = spy
    tuner.tune(ga)
    tuner.runner.close()
    assert builder.asked and all(tuner.space.is_feasible(c) for c in builder.asked)
    assert any(not tuner.space.is_feasible(c) for c in proposed)
    assert len(builder.asked) == len(set(builder.asked))


def test_failures_become_error_records_and_the_run_finishes(opencl, build_pool, tmp_path):
    path = tmp_path / "r.jsonl"
    tmpl = BrokenGemm(16, 16, 16)
    tuner = _tuner(tmpl, opencl, path, build_pool)
    default = tmpl.default_config(opencl)
    configs = [default.replace(mode=m) for m in ("compile_error", "trap", "wrong", "ok")]
    costs = tuner.evaluate(configs)
    tuner.runner.close()
    kinds = {json.loads(l)["config"]["mode"]: json.loads(l) for l in path.read_text().splitlines()}
    assert kinds["compile_error"]["error_kind"] == "build_error"
    assert "no_such_block" in kinds["compile_error"]["error_msg"]
    assert kinds["trap"]["error_kind"] in ("crash", "run_error")
    assert kinds["wrong"]["error_kind"] == "wrong_answer"
    assert kinds["ok"]["error_kind"] == ""
    assert np.isinf(costs[:3]).all() and np.isfinite(costs[3])
    best = RecordStore(path).best(tuner.workload.key)
    assert best.config["mode"] == "ok"  # a wrong answer is never the best


def _records_with_and_without_timer(target, path):
    """Two correct records and a failure of one GEMM workload on ``target``: the first and
    the failure without ``metrics["timer"]`` (as records were before they named it)."""
    from tvm_ext.core.records import Record
    from tvm_ext.core.template import Workload

    template = GemmTemplate(64, 64, 64)
    workload = Workload.of(template, target)
    space = template.space(target)
    untimed, timed, failed = (space.make(**{**template.default_config(target).as_dict(), "k_step": k})
                              for k in (4, 8, 16))
    store = RecordStore(path)
    store.append(Record(workload.key, workload.as_json(), untimed.as_dict(), (1e-3,)))
    store.append(Record(workload.key, workload.as_json(), timed.as_dict(), (2e-3,), metrics={"timer": "cuda graph"}))
    store.append(Record(workload.key, workload.as_json(), failed.as_dict(), (), "run_error", "wrong answer"))
    return template, store, (untimed, timed, failed)


def test_cuda_records_timed_before_timers_are_measured_again(tmp_path):
    """A correct CUDA record without a timer (host loop or TVM's evaluator, before CUDA-graph
    replay) is not resumed: the tuner counts it and would measure the config again, and the
    export's ranking leaves it out, though it is the fastest on file.  Failures resume."""
    from tvm_ext.target import offline_cuda
    from tvm_ext.relax.tvm_export import ranked_records

    cuda = offline_cuda()
    template, store, (untimed, timed, failed) = _records_with_and_without_timer(cuda, tmp_path / "r.jsonl")
    tuner = Tuner(template, cuda, None, None, RecordStore(store.path))
    assert tuner.record_of(untimed) is None
    assert tuner.record_of(timed).cost == 2e-3 and not tuner.record_of(failed).ok
    assert (tuner.resumed, tuner.stale) == (2, 1)
    assert [r.config for r in ranked_records(store, template, cuda)] == [timed.as_dict()]
    from tvm_ext.results.summary import load_workloads

    (summary,) = load_workloads(store.path)  # what `tvm_ext.results show` and `export` rank
    assert summary.best.config == timed.as_dict() and len(summary.records) == 3


def test_opencl_records_without_timer_resume(opencl, tmp_path):
    """OpenCL's timer did not change: its records resume whether or not they name it."""
    template, store, (untimed, timed, _) = _records_with_and_without_timer(opencl, tmp_path / "r.jsonl")
    tuner = Tuner(template, opencl, None, None, RecordStore(store.path))
    assert tuner.record_of(untimed).cost == 1e-3 and (tuner.resumed, tuner.stale) == (3, 0)


def test_a_templates_hash_covers_the_schedule_modules_it_builds_on():
    """Records go stale when any kernel a template builds on changes, not only its own file:
    the 3xTF32 template's kernel is the wgmma template's, the tensor-core choice reaches the
    warp tiling through mma.sync and WMMA, the GRU's package takes its input GEMM from gemm/simt.py."""
    from tvm_ext.core.template import schedule_modules

    def short(module):
        return {name.removeprefix("tvm_ext.schedules.") for name in schedule_modules(module)}

    assert short("tvm_ext.schedules.gemm.simt") == {"gemm.simt"}  # imports no other schedule, not its whole family
    assert short("tvm_ext.schedules.gemm.gemm_3xtf32") >= {"gemm.gemm_3xtf32", "gemm.wgmma"}  # facts: tvm_ext.hardware
    choice = short("tvm_ext.schedules.gemm.tensor_core_choice")
    assert choice >= {"gemm.mma", "gemm.wmma", "gemm.wgmma", "gemm.warp_tile", "gemm.mma_intrin"}
    assert "gemm" not in choice  # the family's package is no kernel
    gru = short("tvm_ext.schedules.gru.template")
    assert {"gru.kernels", "gru.plan", "gru.flag_step", "gemm.simt", "gemm.warp_tile"} <= gru and "gru.template" in gru
    assert "tvm_ext.schedules" not in schedule_modules("tvm_ext.schedules.reduce.rows")  # the registry is not a kernel
