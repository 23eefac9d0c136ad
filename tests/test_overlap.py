"""Builds overlapped with measurement, on PoCL through real tvm_ext workers on 127.0.0.1.

An instrumented builder and runner log when each chunk's build starts and ends, when builds
go to the runner and when each measurement is done.  From that log: a chunk was built while
the workers measured the one before it, and the built candidates waiting for or in
measurement never outnumbered the queue's bound; records keep the generations' order (with
one worker the very order of a run without overlap), no config is measured twice, a worker
killed mid-run costs nothing, and a rerun resumes with nothing left to measure.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from concurrent.futures import Future

import numpy as np
import pytest

from cluster_groups import quiet
from test_rpc import FAST, records_of, slowed
from tvm_ext.measure.builder import LocalBuilder
from tvm_ext.remote.cluster import LocalCluster
from tvm_ext.measure.measure import MeasureSettings
from tvm_ext.core.records import RecordStore
from tvm_ext.remote.rpc_runner import RpcRunner
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.core.search import GeneticSearch, RandomSearch
from tvm_ext.target import resolve_target
from tvm_ext.core.tuner import Tuner

TEMPLATE = GemmTemplate(24, 16, 20)
CHUNK = 2  # configs a build call gets: the build queue's bound is two chunks
SLOW = MeasureSettings(warmup=1, repeat=2, min_repeat_secs=0.3)  # with ``slowed`` kernels: jobs of 0.6 s and more


class Timeline:
    """Events in the order they happened: ("build", n) when a build of n configs starts,
    ("built", n) when it ends, ("submit", n) when n builds go to the runner, ("done", 1) when a
    measurement is done."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, float]] = []
        self._lock = threading.Lock()

    def add(self, what: str, count: int) -> None:
        with self._lock:
            self.events.append((what, count, time.monotonic()))

    def in_measurement(self) -> list[tuple[str, int, int]]:
        """Each event with the builds sent to the runner and not yet done at that moment."""
        out, waiting = [], 0
        for what, count, _ in list(self.events):
            waiting += count if what == "submit" else -count if what == "done" else 0
            out.append((what, count, waiting))
        return out


class LoggedBuilder:
    """The real build pool (the module's, its two processes started once), logging each call
    on the timeline; ``slow``: each kernel built with a loop that makes it run for milliseconds
    (same result), so measuring a chunk outlasts building the next."""

    def __init__(self, timeline: Timeline, builder: LocalBuilder, slow: bool = False):
        self.builder = builder
        self.workers = builder.workers
        self.timeline = timeline
        self.slow = slow
        self.asked: list = []
        self.late: dict = {}  # config -> seconds its build ends late (``submit``)
        self.ended: dict = {}  # config -> when its build ended

    def build(self, template, configs, target):
        self.timeline.add("build", len(configs))
        self.asked += configs
        try:
            builds = self.builder.build(template, configs, target)
            return [slowed(b) if self.slow and b.ok else b for b in builds]
        finally:
            self.timeline.add("built", len(configs))

    def submit(self, template, configs, target):
        """The pool's futures, one per config, each logged ("built", 1) as it ends; the configs
        in ``late`` end that many seconds after their build did."""
        self.timeline.add("build", len(configs))
        self.asked += configs
        out = []
        for config, future in zip(configs, self.builder.submit(template, configs, target)):
            mine = Future()
            delay = self.late.get(config, 0.0)
            future.add_done_callback(lambda f, mine=mine, delay=delay: threading.Timer(
                delay, self._ended, (f.result(), mine)).start())
            out.append(mine)
        return out

    def _ended(self, build, mine) -> None:
        self.timeline.add("built", 1)
        self.ended[build.config] = time.monotonic()
        mine.set_result(slowed(build) if self.slow and build.ok else build)

class LoggedRunner:
    """The RPC runner, logging what it is given and each measurement done."""

    def __init__(self, timeline: Timeline, runner: RpcRunner):
        self.timeline = timeline
        self.runner = runner

    @property
    def target(self):
        return self.runner.target

    def submit(self, template, builds):
        self.timeline.add("submit", len(builds))  # before: a done callback may run at once
        futures = self.runner.submit(template, builds)
        for future in futures:
            future.add_done_callback(lambda _: self.timeline.add("done", 1))
        return futures

    def close(self) -> None:
        self.runner.close()


@pytest.fixture(scope="module")
def build_pool():
    """Two build processes shared by the module's runs (a build leaves nothing behind in them)."""
    builder = LocalBuilder(workers=2, timeout=120)
    yield builder
    builder.close()


def rpc(cluster: LocalCluster, parallel: int, settings: MeasureSettings = FAST) -> RpcRunner:
    return RpcRunner(cluster.tracker, cluster.key, "opencl", settings, parallel=parallel, log=quiet,
                     secret=cluster.secret.encode()).start()


def tuned(cluster, build_pool, path, strategy_of, parallel=2, overlap=True, on_record=None, settings=FAST,
          rpc_runner: RpcRunner | None = None, late: dict | None = None):
    """A tuning run over the cluster; its tuner, result, timeline and the batches proposed.
    ``rpc_runner``: measure through this one (left open) instead of a runner of its own;
    ``late``: configs whose builds end that many seconds late."""
    timeline = Timeline()
    builder = LoggedBuilder(timeline, build_pool, slow=settings is SLOW)
    builder.late = late or {}
    runner = LoggedRunner(timeline, rpc_runner or rpc(cluster, parallel, settings))
    try:
        tuner = Tuner(TEMPLATE, runner.target, builder, runner, RecordStore(path), overlap=overlap, chunk=CHUNK,
                      on_record=on_record)
        strategy = strategy_of(tuner)
        batches: list[list] = []
        propose = strategy.propose

        def spy():
            rows = propose()
            batches.append([tuner.space.decode(r) for r in rows])
            return rows

        strategy.propose = spy
        result = tuner.tune(strategy)
    finally:
        if rpc_runner is None:
            runner.close()
    return tuner, result, timeline, batches


def random_search(tuner, generations=1, batch=6):
    return RandomSearch(tuner.space, np.random.default_rng(7), batch=batch, generations=generations,
                        feasible_only=True)


def ga(tuner):
    default = tuner.template.default_config(tuner.target)
    return GeneticSearch(tuner.space, np.random.default_rng(3), size_pop=6, generations=2,
                         seeds=[tuner.space.encode(default)])


def config_keys(recs) -> list[str]:
    return [json.dumps(r.config, sort_keys=True) for r in recs]


def assert_each_built_and_measured_once(tuner: Tuner, timeline: Timeline) -> None:
    """No config went to the builder twice, and the runner got one job per record."""
    asked = tuner.builder.asked
    assert len(asked) == len(set(asked)), Counter(asked).most_common(2)
    assert sum(count for what, count, _ in timeline.events if what == "submit") == tuner.trials


def assert_overlapped_and_bounded(timeline: Timeline) -> None:
    """A chunk's build started while measurements were in flight, and at every build's start
    the builds in measurement and the chunk being built fit the bound of two chunks."""
    starts = [(count, waiting) for what, count, waiting in timeline.in_measurement() if what == "build"]
    assert all(count <= CHUNK for count, _ in starts), starts
    assert all(count + waiting <= 2 * CHUNK for count, waiting in starts), starts
    assert any(waiting > 0 for _, waiting in starts), starts  # built while the workers measured


# ---- overlap -------------------------------------------------------------------------------------
def test_chunks_are_built_while_the_workers_measure_and_the_queue_stays_bounded(cluster, build_pool, tmp_path):
    tuner, result, timeline, batches = tuned(cluster, build_pool, tmp_path / "r.jsonl", ga, settings=SLOW)
    assert_overlapped_and_bounded(timeline)
    assert_each_built_and_measured_once(tuner, timeline)
    assert CHUNK < tuner.most_waiting <= 2 * CHUNK  # a chunk built and sent while the one before measured
    assert tuner.built_ahead > 0  # the next generation's first candidates were built while this one measured
    recs = records_of(tmp_path / "r.jsonl")
    keys = config_keys(recs)
    assert len(keys) == len(set(keys)) == result.trials  # nothing measured twice, nothing lost
    assert all(r.ok for r in recs)
    assert {r.metrics["server"] for r in recs} and len({r.metrics["server"] for r in recs}) == 2
    # the order of records: the default first, then each generation's after the one before it
    first_batch = {}
    for index, batch in enumerate(batches):
        for config in batch:
            first_batch.setdefault(json.dumps(config.as_dict(), sort_keys=True), index + 1)
    default = TEMPLATE.default_config(tuner.target)
    assert tuner.builder.asked[0] == default  # built first, with the first batch, not alone before it
    assert next(e for e in timeline.events if e[0] == "build")[1] == CHUNK
    first_batch[json.dumps(default.as_dict(), sort_keys=True)] = 1
    order = [first_batch[k] for k in keys]
    assert order == sorted(order) and order[-1] == len(batches), order
    assert len(builder_calls := [e for e in timeline.events if e[0] == "build"]) > len(batches) + 1, builder_calls


def test_with_one_worker_the_records_are_those_of_a_run_without_overlap(cluster, build_pool, tmp_path):
    with rpc(cluster, parallel=1) as one_at_a_time:  # both runs measure through it
        on = tuned(cluster, build_pool, tmp_path / "on.jsonl", random_search, rpc_runner=one_at_a_time)
        off = tuned(cluster, build_pool, tmp_path / "off.jsonl", random_search, overlap=False,
                    rpc_runner=one_at_a_time)
    assert_overlapped_and_bounded(on[2])
    assert not any(waiting > 0 for what, _, waiting in off[2].in_measurement() if what == "build")
    # builds go to the runner as each ends: the same records, in the order the builds ended
    on_keys, off_keys = (config_keys(records_of(tmp_path / name)) for name in ("on.jsonl", "off.jsonl"))
    assert sorted(on_keys) == sorted(off_keys)
    assert on[1].trials == off[1].trials == 1 + 2 * 6


def test_a_build_goes_to_the_runner_when_it_ends_not_when_its_chunk_does(cluster, build_pool, tmp_path):
    """The default config's build (the first of the first chunk) ends 6 s late: the chunk's other
    config goes to the runner meanwhile, and the default is measured once it ends."""
    default = TEMPLATE.default_config(resolve_target("opencl", 0))  # the workers' device: PoCL here too
    tuner, result, timeline, _ = tuned(cluster, build_pool, tmp_path / "r.jsonl", random_search,
                                       late={default: 6.0})
    submits = [at for what, _, at in timeline.events if what == "submit"]
    default_ended = tuner.builder.ended[default]
    assert submits[0] < default_ended  # handed to the runner while the default was late
    recs = records_of(tmp_path / "r.jsonl")
    keys = config_keys(recs)
    assert json.dumps(default.as_dict(), sort_keys=True) in keys and result.trials == len(keys) == 1 + 2 * 6


def test_a_worker_killed_mid_run_costs_nothing_and_a_rerun_resumes(make_cluster, build_pool, tmp_path):
    cluster = make_cluster([0, 0])
    path = tmp_path / "r.jsonl"
    killed_at: list[int] = []

    def kill_a_worker(rec, tuner):
        if tuner.trials == 4 and not killed_at:  # chunks in flight: the next is built or measured
            os.killpg(cluster.processes[1].popen.pid, signal.SIGKILL)  # worker 0 ([0] is the tracker)
            killed_at.append(len(tuner.builder.asked))

    tuner, result, timeline, _ = tuned(cluster, build_pool, path, lambda t: random_search(t, batch=8),
                                       on_record=kill_a_worker)
    assert killed_at and killed_at[0] < len(tuner.builder.asked)  # builds went on after the kill
    assert_overlapped_and_bounded(timeline)
    assert_each_built_and_measured_once(tuner, timeline)
    recs = records_of(path)
    assert max(Counter(config_keys(recs)).values()) == 1  # nothing measured twice
    assert result.trials == len(recs) == 1 + 2 * 8 and all(r.ok for r in recs)  # nothing lost, no error
    again = tuned(cluster, build_pool, path, lambda t: random_search(t, batch=8))
    assert again[1].trials == 0 and again[1].resumed == len(recs)
    assert not [e for e in again[2].events if e[0] == "build"]  # nothing built again either
