"""A job's check data (its case) goes into a measuring process once and stays there.

A 2048² GEMM's float64 reference is 32 MB; sent with every job it cost a worker a tenth of a
second a job.  Real PoCL measurements: a job sent without its case is checked against the case
the process holds, a process that lost it (replaced after a death) is sent it again, and the
process keeps the latest few.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import pytest

import pool_jobs
from cluster_groups import quiet
from test_processes import gemm_configs, kill_and_wait

WAIT = 120.0


@pytest.fixture(scope="module")
def gemm_job(opencl):
    from tvm_ext.measure.builder import build_one
    from tvm_ext.measure.measure import MeasureSettings, make_job

    template, (config,) = gemm_configs(opencl, 1)
    build = build_one(template, config, opencl)
    assert build.ok, build.error_msg
    settings = MeasureSettings(warmup=1, repeat=2, min_repeat_secs=0.001)
    return make_job(template, config, build.artifact, opencl, settings)


def forged(job):
    """``job`` with references that no correct program matches (zeros where the output is not)."""
    return replace(job, references=tuple(np.zeros_like(r) for r in job.references))


def test_a_job_sent_without_its_case_is_checked_against_the_case_the_process_holds(gemm_job):
    from tvm_ext.measure.cases import case_key, split_case
    from tvm_ext.measure.runner import IsolatedMeasurer

    key = case_key(split_case(gemm_job)[1])
    measurer = IsolatedMeasurer(timeout=WAIT)
    try:
        first = measurer.run(gemm_job, key)
        # the same key: its (forged) references stay here, the process checks against the held ones
        held = measurer.run(forged(gemm_job), key)
        # a key of its own: the forged references travel and the check fails, as it must
        sent = measurer.run(forged(gemm_job), case_key(split_case(forged(gemm_job))[1]))
    finally:
        measurer.close()
    assert first.ok and held.ok, (first, held)
    assert not sent.ok and "error" in sent.error_msg.lower(), sent


def test_a_process_that_lost_its_cases_is_sent_the_case_again(gemm_job):
    from tvm_ext.measure.cases import case_key, split_case
    from tvm_ext.measure.runner import IsolatedMeasurer

    key = case_key(split_case(gemm_job)[1])
    measurer = IsolatedMeasurer(timeout=WAIT)
    try:
        assert measurer.run(gemm_job, key).ok
        pid = measurer._started().schedule(pool_jobs.pid).result(timeout=WAIT)
        kill_and_wait(pid)
        time.sleep(0.5)  # the pool notices and starts a fresh process, which holds nothing
        again = measurer.run(gemm_job, key)
        assert measurer.rebuilds >= 1
    finally:
        measurer.close()
    assert again.ok, again


def test_a_case_sent_ahead_is_held_for_the_first_job(gemm_job):
    from tvm_ext.measure.cases import case_key, split_case
    from tvm_ext.measure.runner import IsolatedMeasurer

    light, case = split_case(gemm_job)
    key = case_key(case)
    measurer = IsolatedMeasurer(timeout=WAIT)
    try:
        measurer.hold(key, case)
        result = measurer.run(forged(gemm_job), key)  # held ahead: the forged references stay here
    finally:
        measurer.close()
    assert result.ok, result


def test_a_measuring_process_keeps_the_latest_cases():
    from tvm_ext.measure.cases import CASES_KEPT
    from tvm_ext.measure.runner import _HELD, CASE_MISSING, hold_case, measure_held

    _HELD.clear()
    try:
        for index in range(CASES_KEPT + 1):
            hold_case(f"k{index}", ((), (np.full(2, index),), None))
        assert measure_held(pool_jobs.square, "job", "k0", None) == CASE_MISSING
        assert measure_held(lambda job: job.references[0].tolist(), _Job(), "k1", None) == [1, 1]
        assert measure_held(lambda job: job.references[0].tolist(), _Job(), "k0",
                            (None, (np.full(2, 7),), None)) == [7, 7]
    finally:
        _HELD.clear()


@dataclass(frozen=True)
class _Job:
    """The fields ``join_case`` fills in, as a ``MeasureJob`` has them."""

    inputs: tuple = ()
    references: tuple = ()
    check: object = None


def test_case_keys_follow_the_content_and_a_check_that_cannot_travel_has_none():
    from tvm_ext.measure.cases import case_key, case_key_of
    from tvm_ext.measure.checks import NormwiseCheck

    ref = np.arange(6.0)
    key = case_key_of((None, (ref,), NormwiseCheck(1e-3)))
    assert key == case_key((None, (ref.copy(),), NormwiseCheck(1e-3)))  # same content, same key
    assert key != case_key((None, (ref + 1,), NormwiseCheck(1e-3)))
    assert key != case_key((None, (ref,), NormwiseCheck(1e-4)))
    assert case_key_of((None, (ref,), object())) is None


def held_sessions(runner):
    with runner._lock:
        return list(runner._sessions)


def wait_for(condition, secs: float = 60.0) -> bool:
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_the_rpc_runner_sends_the_workloads_case_to_every_worker_before_the_first_build_ends(make_cluster, opencl):
    """``prepare`` (the tuner calls it as a search starts): every worker session holds the
    case before any job is submitted, so no first job carries 32 MB; jobs then measure."""
    from tvm_ext.measure.builder import build_one
    from tvm_ext.measure.cases import case_key_of
    from tvm_ext.measure.measure import MeasureSettings, job_case
    from tvm_ext.remote.rpc_runner import RpcRunner

    cluster = make_cluster((0, 0))
    template, configs = gemm_configs(opencl, 2, seed=7)
    settings = MeasureSettings(warmup=1, repeat=2, min_repeat_secs=0.001)
    with RpcRunner(cluster.tracker, cluster.key, "opencl", settings, timeout=60, log=quiet,
                   secret=cluster.secret.encode()).start() as runner:
        key = case_key_of(job_case(template, configs[0], settings))
        sessions = held_sessions(runner)
        assert len(sessions) == 2 and not any(key in s._cases for s in sessions)
        runner.prepare(template, configs[0])
        assert wait_for(lambda: all(key in s._cases for s in sessions)), "the case did not reach every worker"
        builds = [build_one(template, c, opencl) for c in configs]
        results = [f.result(timeout=WAIT) for f in runner.submit(template, builds)]
    assert all(r.ok for r in results), results


def test_the_local_runner_sends_the_case_to_each_measuring_process_ahead(opencl):
    from tvm_ext.measure.builder import build_one
    from tvm_ext.measure.cases import case_key_of
    from tvm_ext.measure.measure import MeasureSettings, job_case
    from tvm_ext.measure.runner import LocalRunner

    template, (config,) = gemm_configs(opencl, 1, seed=8)
    settings = MeasureSettings(warmup=1, repeat=2, min_repeat_secs=0.001)
    key = case_key_of(job_case(template, config, settings))
    with LocalRunner(opencl, settings, timeout=WAIT, devices=(0, 0)) as runner:
        runner.prepare(template, config)
        assert wait_for(lambda: len(runner._pools) == 2 and all(key in p._sent for p in runner._pools.values()))
        result = runner.run(template, [build_one(template, config, opencl)])[0]
    assert result.ok, result


def test_a_local_runner_closed_while_its_case_is_made_starts_no_process_after(opencl):
    """``prepare`` makes the case on a thread; a runner closed meanwhile (a budget that stops the
    search) must not start a measuring process for it afterwards (one that nothing would close),
    nor raise on that thread."""
    import threading

    from tvm_ext.measure.measure import MeasureSettings
    from tvm_ext.measure.runner import LocalRunner

    template, (config,) = gemm_configs(opencl, 1, seed=9)
    raised: list[BaseException] = []
    hook, threading.excepthook = threading.excepthook, lambda args: raised.append(args.exc_value)
    try:
        runner = LocalRunner(opencl, MeasureSettings(warmup=1, repeat=2, min_repeat_secs=0.001), timeout=WAIT)
        runner.prepare(template, config)
        runner.close()  # before the case is made: the thread meets a closed runner
        for thread in [t for t in threading.enumerate() if t.name == "tvm_ext-case-ahead"]:
            thread.join(WAIT)
    finally:
        threading.excepthook = hook
    assert raised == [] and runner._pools == {}
    with pytest.raises(RuntimeError, match="closed"):
        runner.warm()  # nor on any later call
