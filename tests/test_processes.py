"""Helper processes that die: pools rebuilt, jobs retried once, workers that exit to be restarted.

A build or measuring process killed while idle (the OOM killer, a stray signal) costs nothing:
its pool is rebuilt and every healthy config is measured; a job that kills its process is
retried once and is one ``crash``, and the pool goes on.  A ``tvm_ext.worker`` whose TVM server
or session process dies exits non-zero with one line (a supervisor restarts it), and a worker
killed outright takes its server along.  Real processes throughout; every wait is bounded.
"""
from __future__ import annotations

import os
import signal
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace

import psutil
import pytest

import pool_jobs
from tvm_ext.measure.pools import ProcessDied, RestartingPool

WAIT = 60.0  # bound on any one future in these tests


def attempts(path) -> list[str]:
    return path.read_text().split()[::2] if path.exists() else []


@pytest.fixture
def attempt_log(tmp_path, monkeypatch):
    path = tmp_path / "attempts"
    monkeypatch.setenv(pool_jobs.ATTEMPTS_ENV, str(path))
    return path


def dead(pid: int) -> bool:
    """``pid`` is gone or a zombie (it may be reaped between any two looks at it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_and_wait(pid: int, secs: float = 10.0) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + secs
    while not dead(pid):
        assert time.monotonic() < deadline, f"process {pid} did not die"
        time.sleep(0.05)


def pool_processes() -> list[psutil.Process]:
    """This process's spawned pool processes (builders and measurers)."""
    return [p for p in psutil.Process().children(recursive=True)
            if "multiprocessing.spawn" in " ".join(p.cmdline())]


# ---- the pool ------------------------------------------------------------------------------------
def test_a_process_killed_while_idle_is_replaced_and_no_job_fails():
    pool = RestartingPool(1)
    try:
        first = pool.schedule(pool_jobs.pid).result(timeout=WAIT)
        kill_and_wait(first)
        time.sleep(0.5)  # the pool notices the death and starts another process
        results = [f.result(timeout=WAIT) for f in [pool.schedule(pool_jobs.square, (i,)) for i in range(6)]]
        assert results == [i * i for i in range(6)]
        assert pool.schedule(pool_jobs.pid).result(timeout=WAIT) != first
        assert pool.rebuilds >= 1
    finally:
        pool.close()


def test_queued_jobs_survive_a_pool_that_breaks_under_them(attempt_log):
    """Jobs queued behind a running one, the idle second process killed: each job ends once, well."""
    pool = RestartingPool(2)
    try:
        pids = {pool.schedule(pool_jobs.pid).result(timeout=WAIT) for _ in range(4)}
        futures = [pool.schedule(pool_jobs.note_and_sleep, (0.3, i)) for i in range(6)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # gone already
                pass
        assert [f.result(timeout=WAIT) for f in futures] == list(range(6))
    finally:
        pool.close()


def test_a_job_that_kills_its_process_is_one_crash_after_one_retry_and_the_pool_goes_on(attempt_log):
    pool = RestartingPool(1)
    try:
        with pytest.raises(ProcessDied, match="died each of 2 times .*SIGKILL"):
            pool.schedule(pool_jobs.note_and_die).result(timeout=WAIT)
        assert attempts(attempt_log) == ["die", "die"]  # retried once, not more
        assert [pool.schedule(pool_jobs.square, (i,)).result(timeout=WAIT) for i in range(3)] == [0, 1, 4]
    finally:
        pool.close()


def test_a_process_killed_mid_job_from_outside_costs_one_retry(attempt_log):
    pool = RestartingPool(1)
    try:
        future = pool.schedule(pool_jobs.note_and_sleep, (3.0, 7))
        deadline = time.monotonic() + WAIT
        while not attempts(attempt_log):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        kill_and_wait(int(attempt_log.read_text().split()[1]))
        assert future.result(timeout=WAIT) == 7
        assert attempts(attempt_log) == ["sleep", "sleep"]
    finally:
        pool.close()


def test_processes_that_die_as_they_start_fail_the_queued_jobs_not_hang_them():
    pool = RestartingPool(1, pool_jobs.exit_at_start)
    try:
        with pytest.raises(ProcessDied, match="die as they start .*exit code 3"):
            pool.schedule(pool_jobs.square, (2,)).result(timeout=WAIT)
    finally:
        pool.close()


def test_a_timeout_is_still_a_timeout():
    pool = RestartingPool(1)
    try:
        with pytest.raises(FutureTimeout):
            pool.schedule(pool_jobs.note_and_sleep, (30.0, 1), timeout=1.0).result(timeout=WAIT)
        assert pool.schedule(pool_jobs.square, (3,)).result(timeout=WAIT) == 9
    finally:
        pool.close()


# ---- the local builder and runner --------------------------------------------------------------------
def gemm_configs(opencl, count: int, seed: int = 4):
    import numpy as np

    from tvm_ext.schedules.gemm.simt import GemmTemplate

    template = GemmTemplate(24, 16, 20)
    space = template.space(opencl)
    configs = [template.default_config(opencl)] + [
        space.decode(r) for r in space.random_feasible_indices(np.random.default_rng(seed), count - 1)]
    return template, configs


def test_pool_processes_run_single_threaded_blas_unless_the_user_says_otherwise(monkeypatch):
    """One job at a time: a BLAS thread per core in each pool process would only compete with
    the measuring processes of other devices.  A value the user set is kept; the tuner's own
    environment is left as it was."""
    from tvm_ext.measure.pools import CHILD_ENV

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    pool = RestartingPool(1, initializer=pool_jobs.nothing)
    try:
        seen = {name: pool.schedule(pool_jobs.environment, (name,), 60).result(timeout=120) for name in CHILD_ENV}
        at_import = pool.schedule(pool_jobs.blas_threads_at_import, (), 60).result(timeout=120)
    finally:
        pool.close()
    assert seen == {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "3"}
    assert at_import == "1"  # set before the initializer's modules (numpy's BLAS, in a real pool) load
    assert "OPENBLAS_NUM_THREADS" not in os.environ and os.environ["MKL_NUM_THREADS"] == "3"


def test_a_pool_starting_processes_leaves_the_tuners_environment_alone(monkeypatch):
    """Another thread may start a process while a pool starts its own (the worker's TVM server
    beside its measuring process, a compiler beside the build pool); a process started with
    vfork reads the parent's environment as it execs, and an entry changed under it failed that
    start with EFAULT.  The pool's processes get their variables without the tuner's
    environment being written at all."""
    writes = []
    monkeypatch.setattr(os, "putenv", lambda name, value: writes.append(("putenv", name)))
    monkeypatch.setattr(os, "unsetenv", lambda name: writes.append(("unsetenv", name)))
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    writes.clear()
    pool = RestartingPool(2, warm=pool_jobs.nothing, warm_processes=1)
    try:
        assert pool.schedule(pool_jobs.environment, ("OPENBLAS_NUM_THREADS",), 60).result(timeout=120) == "1"
    finally:
        pool.close()
    assert writes == []


MAIN_THAT_IMPORTS = """
import os, sys
with open(os.environ["MAIN_IMPORTS"], "a") as fh:  # each import of this main module: a line
    fh.write(f"{os.getpid()}\\n")
sys.path.insert(0, TESTS)
import pool_jobs
from tvm_ext.measure.pools import RestartingPool

if __name__ == "__main__":
    pool = RestartingPool(1)
    print(pool.schedule(pool_jobs.pid, (), 60).result(timeout=120))
    pool.close()
"""


def test_a_pool_process_does_not_import_the_parents_main_module_again(tmp_path):
    """A spawned process imports its parent's main module again unless told not to; a main
    module that imports TVM (the worker, TVM's server processes, a benchmark) then costs every
    measuring process torch's import before it can keep torch out.  Pool jobs live in
    importable modules, so the pool's processes start from a bare main."""
    import subprocess
    import sys

    script, log = tmp_path / "main.py", tmp_path / "imports"
    script.write_text(MAIN_THAT_IMPORTS.replace("TESTS", repr(os.path.dirname(os.path.abspath(__file__)))))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MAIN_IMPORTS": str(log)})
    assert done.returncode == 0, done.stderr
    child = int(done.stdout.split()[-1])
    importers = [int(line) for line in log.read_text().split()]
    assert len(importers) == 1 and child not in importers, (importers, child)  # the parent only


def test_build_processes_yield_the_cpu_to_measuring_ones():
    """A build process runs BUILD_NICENESS nicer than the tuner; a measuring process does not."""
    from tvm_ext.measure.builder import BUILD_NICENESS, LocalBuilder
    from tvm_ext.measure.runner import IsolatedMeasurer

    with LocalBuilder(workers=1) as builder:
        built_at = builder._get_pool().schedule(os.nice, (0,), 60).result(timeout=120)
    measurer = IsolatedMeasurer(measure=os.nice)  # "measures" by reporting its niceness
    try:
        measured_at = measurer.schedule(0).result(timeout=120)
    finally:
        measurer.close()
    assert built_at == min(19, os.nice(0) + BUILD_NICENESS)
    assert measured_at == os.nice(0)


def test_a_started_build_pool_warms_its_first_processes_before_their_first_candidate(monkeypatch):
    """``LocalBuilder.start`` (a model's tuning calls it before finding its tasks): its first
    ``WARM_PROCESSES`` processes import TVM and every template before they take a job; the rest,
    and a pool started by its first build, do not (they would delay that build)."""
    from tvm_ext.measure import builder as builder_module
    from tvm_ext.measure.builder import LocalBuilder

    with LocalBuilder(workers=1) as builder:
        builder.start()
        assert builder._get_pool().schedule(pool_jobs.warmed, (), 60).result(timeout=120) == (
            "templates imported", True)
    with LocalBuilder(workers=1) as builder:
        assert builder._get_pool().schedule(pool_jobs.warmed, (), 60).result(timeout=120) == ("", False)
    monkeypatch.setattr(builder_module, "WARM_PROCESSES", 0)
    with LocalBuilder(workers=1) as builder:
        builder.start()
        assert builder._get_pool().schedule(pool_jobs.warmed, (), 60).result(timeout=120) == ("", False)


def test_closing_a_pool_whose_processes_are_still_starting_does_not_wait_for_them():
    """A process still in its initializer holds no job: closing the pool kills it at once rather
    than asking it to exit and waiting ``STOP_SECS`` (a model's tuning that finds everything in
    its database closes the build pool it started while its processes warm)."""
    from tvm_ext.measure.pools import STOP_SECS

    pool = RestartingPool(2, pool_jobs.sleep_at_start)
    pool.start()
    deadline = time.monotonic() + WAIT
    while len(pool_processes()) < 2:
        assert time.monotonic() < deadline, "the pool's processes did not start"
        time.sleep(0.05)
    started = time.monotonic()
    pool.close()
    assert time.monotonic() - started < STOP_SECS / 2
    assert not pool_processes()


def test_idle_build_and_measuring_processes_killed_between_batches_cost_nothing(opencl):
    """Two batches of a real search on PoCL with every pool process SIGKILLed between them: both
    batches are built and measured in full, nothing is an error."""
    from tvm_ext.measure.builder import LocalBuilder
    from tvm_ext.measure.measure import MeasureSettings
    from tvm_ext.measure.runner import LocalRunner

    template, configs = gemm_configs(opencl, 4)
    settings = MeasureSettings(warmup=1, repeat=2, min_repeat_secs=0.001)
    with LocalBuilder(workers=1, timeout=120) as builder, LocalRunner(opencl, settings, timeout=120) as runner:
        results = []
        for batch in (configs[:2], configs[2:]):
            builds = builder.build(template, batch, opencl)
            assert all(b.ok for b in builds), [b.error_msg for b in builds]
            results += runner.run(template, builds)
            idle = pool_processes()
            assert len(idle) == 2  # one builder, one measurer: both idle now
            for process in idle:
                kill_and_wait(process.pid)
            time.sleep(0.5)  # both pools notice and replace their processes
        assert all(r.ok for r in results), [(r.error_kind, r.error_msg) for r in results]
        assert len(results) == 4
        assert builder.rebuilds >= 1 and runner._pools[0].rebuilds >= 1


def test_a_program_that_kills_its_measuring_process_is_one_crash_and_the_next_is_measured(opencl, attempt_log):
    from tvm_ext.measure.builder import build_one
    from tvm_ext.core.errors import ErrorKind
    from tvm_ext.measure.measure import MeasureSettings, make_job
    from tvm_ext.measure.runner import IsolatedMeasurer

    template, (config,) = gemm_configs(opencl, 1)
    build = build_one(template, config, opencl)
    settings = MeasureSettings(warmup=1, repeat=2, min_repeat_secs=0.001)
    good = make_job(template, config, build.artifact, opencl, settings)
    bad = replace(good, artifact=replace(build.artifact, source=pool_jobs.KILL_MARK + build.artifact.source))
    measurer = IsolatedMeasurer(timeout=120, measure=pool_jobs.measure_or_die)
    try:
        futures = [measurer.schedule(job) for job in (bad, good, good)]  # two queued behind the crash
        crash, *then = [f.result(timeout=WAIT) for f in futures]
    finally:
        measurer.close()
    assert crash.error_kind == ErrorKind.CRASH and "died each of 2 times" in crash.error_msg, crash
    assert attempts(attempt_log) == ["die", "die"]
    assert all(r.ok for r in then), then


# ---- a tvm_ext worker's processes --------------------------------------------------------------------
def quiet(_message: str) -> None:
    pass


@pytest.fixture(scope="module")
def tracker():
    from tvm_ext.remote.cluster import LocalCluster

    cluster = LocalCluster([], "opencl", log=quiet).start()
    yield cluster
    cluster.stop()


def registered(cluster, key: str) -> int:
    from tvm_ext.remote.rpc_runner import TrackerClient

    client = TrackerClient(cluster.tracker)
    try:
        return len(client.servers(key))
    finally:
        client.close()


def until(condition, secs: float, what: str) -> None:
    deadline = time.monotonic() + secs
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture
def worker(tracker, tmp_path):
    """A tvm_ext worker (in a process group of its own) registered at the tracker under a key
    of its own: (its process, its key); whatever is left of it is killed after the test."""
    import subprocess
    import sys

    from tvm_ext.remote.cluster import free_port
    from tvm_ext.remote.wire import SECRET_ENV

    key = f"procs-{tmp_path.name}"
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    proc = subprocess.Popen([sys.executable, "-m", "tvm_ext.worker", "--tracker", tracker.tracker_text, "--key", key,
                             "--port", str(free_port())], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        until(lambda: registered(tracker, key) or proc.poll() is not None, 120, "the worker did not register")
        assert proc.poll() is None, proc.stderr.read()
        yield proc, key
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its group: orphans of a failed test included
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        proc.stderr.close()


def psutil_children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def server_process(worker_pid: int) -> psutil.Process:
    (server,) = [p for p in psutil.Process(worker_pid).children() if "tvm.exec.popen_worker" in " ".join(p.cmdline())]
    return server


def open_session(cluster, key: str):
    """A client's session on the worker (its session process forked), hello'd once."""
    from tvm import rpc

    session = rpc.connect_tracker(*cluster.tracker).request(key)
    session.get_function("tvm_ext.worker.hello")(bytearray(b"not a hello"))  # refused, but the session is up
    return session


def exits_with_one_error_line(proc, secs: float = 30.0) -> str:
    try:
        _, err = proc.communicate(timeout=secs)
    except Exception:
        pytest.fail(f"the worker did not exit within {secs:g} s")
    assert proc.returncode == 1, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_a_worker_whose_server_process_is_killed_exits_non_zero(tracker, worker):
    proc, key = worker
    kill_and_wait(server_process(proc.pid).pid)
    line = exits_with_one_error_line(proc)
    assert "TVM RPC server process was killed (SIGKILL)" in line and "supervisor" in line, line
    until(lambda: not registered(tracker, key), 20, "the dead server is still registered")


def test_a_worker_whose_session_process_dies_exits_non_zero(tracker, worker):
    proc, key = worker
    server = server_process(proc.pid)
    session = open_session(tracker, key)
    until(lambda: server.children(), 20, "no session process")
    (session_process,) = server.children()
    kill_and_wait(session_process.pid)
    line = exits_with_one_error_line(proc)
    assert "a session process of the TVM RPC server died" in line, line
    del session
    until(lambda: not registered(tracker, key), 20, "the dead server is still registered")


def test_a_worker_killed_outright_takes_its_server_and_session_along(tracker, worker):
    proc, key = worker
    session = open_session(tracker, key)
    until(lambda: server_process(proc.pid).children(), 20, "no session process")
    tree = psutil_children(proc.pid)
    assert len(tree) >= 2  # the server and its session process
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    _, left = psutil.wait_procs(tree, timeout=5)
    assert not left, [" ".join(p.cmdline()) for p in left if p.is_running()]
    del session
    until(lambda: not registered(tracker, key), 20, "the orphaned server is still registered")


def test_a_workers_measuring_process_killed_while_idle_costs_nothing(tracker, worker, opencl):
    """Over RPC: the session's measuring process SIGKILLed between two batches; the second batch
    is measured in full by the same worker, nothing is an error."""
    from tvm_ext.measure.builder import build_one
    from tvm_ext.measure.measure import MeasureSettings
    from tvm_ext.remote.rpc_runner import RpcRunner

    proc, key = worker
    template, configs = gemm_configs(opencl, 4, seed=6)
    builds = [build_one(template, c, opencl) for c in configs]
    settings = MeasureSettings(warmup=1, repeat=2, min_repeat_secs=0.001)
    with RpcRunner(tracker.tracker, key, "opencl", settings, timeout=60, log=quiet).start() as runner:
        results = [f.result(timeout=WAIT) for f in runner.submit(template, builds[:2])]
        measuring = [p for p in psutil_children(proc.pid) if "multiprocessing.spawn" in " ".join(p.cmdline())]
        assert len(measuring) == 1
        kill_and_wait(measuring[0].pid)
        time.sleep(0.5)  # the session's pool notices and replaces its process
        results += [f.result(timeout=WAIT) for f in runner.submit(template, builds[2:])]
    assert all(r.ok for r in results), [(r.error_kind, r.error_msg) for r in results]
    assert proc.poll() is None  # the worker serves on


def measuring_processes(worker_pid: int) -> list[psutil.Process]:
    found = []
    for p in psutil_children(worker_pid):
        try:
            if "multiprocessing.spawn" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:  # gone, or a zombie not yet reaped
            pass
    return found


def test_a_workers_measuring_process_is_warm_before_a_tuner_connects_and_kept_between_runs(tracker, worker, opencl):
    """The worker's own process starts its measuring process (a tuner's first job does not wait
    for a fresh interpreter and the device), and two runs one after the other use the same one,
    its case held from the first run."""
    from tvm_ext.measure.builder import build_one
    from tvm_ext.measure.measure import MeasureSettings
    from tvm_ext.remote.rpc_runner import RpcRunner

    proc, key = worker
    until(lambda: len(measuring_processes(proc.pid)) == 1, 60, "no measuring process before any session")
    (before,) = measuring_processes(proc.pid)
    assert before.ppid() == proc.pid  # the worker's own, not a session's
    template, configs = gemm_configs(opencl, 2, seed=9)
    builds = [build_one(template, c, opencl) for c in configs]
    settings = MeasureSettings(warmup=1, repeat=2, min_repeat_secs=0.001)
    results = []
    for _ in range(2):  # two runs, each a session of its own
        with RpcRunner(tracker.tracker, key, "opencl", settings, timeout=60, log=quiet).start() as runner:
            results += [f.result(timeout=WAIT) for f in runner.submit(template, builds)]
    assert all(r.ok for r in results), [(r.error_kind, r.error_msg) for r in results]
    assert [p.pid for p in measuring_processes(proc.pid)] == [before.pid]


def test_a_build_whose_future_was_cancelled_ends_without_an_error(opencl, caplog):
    """Ctrl-C cancels the futures a search waits for while their builds go on; a build ending
    after that settles nothing and raises nothing in its callback (it once printed
    ``InvalidStateError: CANCELLED`` as a traceback on the way out)."""
    import logging

    from tvm_ext.measure.builder import LocalBuilder

    template, (config,) = gemm_configs(opencl, 1, seed=11)
    with caplog.at_level(logging.ERROR, logger="concurrent.futures"), LocalBuilder(workers=1) as builder:
        (future,) = builder.submit(template, [config], opencl)
        assert future.cancel()
        builder._get_pool().schedule(os.nice, (0,), 60).result(timeout=120)  # one worker: after the build
    assert future.cancelled()
    assert not [r for r in caplog.records if "exception calling callback" in r.getMessage()]


def test_a_job_sent_to_a_process_that_died_meanwhile_goes_to_the_next_one():
    """The send of a job to a process that died since its last message fails; the job goes back to
    the queue, already marked running, and the next ready process takes it (marking it running
    again raised in the pool's thread, which then stopped feeding every process)."""
    from concurrent.futures import Future

    from tvm_ext.measure.pools import _Job, _Process

    class Pipe:
        def __init__(self, fails: bool):
            self.fails, self.sent = fails, []

        def send(self, message):
            if self.fails:
                raise OSError("broken pipe")
            self.sent.append(message)

    pool = RestartingPool(2)
    try:
        job = _Job(pool_jobs.square, (3,), None, Future())
        pool._queue.append(job)
        dead, alive = _Process(None, Pipe(fails=True), ready=True), _Process(None, Pipe(fails=False), ready=True)
        pool._hand_out([dead, alive])
        assert dead.job is None and alive.job is job and alive.conn.sent == [(pool_jobs.square, (3,))]
        assert job.future.running() and not pool._queue
    finally:
        pool.close()


def test_a_build_on_a_thread_whose_future_was_cancelled_ends_quietly(monkeypatch):
    """The tuner cancels a build it started ahead once it no longer wants it; the build's thread
    then finishes and settles a cancelled future: no exception on that thread (it was printed as a
    traceback), and an uncancelled one still gets its result."""
    import threading
    import time

    from tvm_ext.core.tuner import in_thread

    raised = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    unwanted = in_thread(time.sleep, 0.2)
    assert unwanted.cancel()
    wanted = in_thread(lambda: time.sleep(0.2) or 7)
    assert wanted.result(timeout=WAIT) == 7
    time.sleep(0.3)
    assert raised == []
