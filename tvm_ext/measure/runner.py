"""Runners: measure a whole batch of built programs, returning a future per program.

A runner takes the batch from the tuner, turns each build into a ``MeasureJob`` (data:
see ``tvm_ext.measure.measure``) and returns one ``Future`` per build that always resolves to a
``RunResult``: a program that hangs (run timeout) or crashes its process becomes an
error result and the rest of the batch goes on, in a fresh worker.

``IsolatedMeasurer`` is that isolation: one process measuring jobs one at a time under a run
timeout, in a ``RestartingPool`` (a process that dies is replaced and the job it ran is measured
once more: only a job that kills its process twice is a ``crash``).
``LocalRunner`` measures on this machine with one per device, so jobs on different devices run
at the same time and jobs on one device never overlap; a ``tvm_ext.worker`` (the RPC runner's
server, ``tvm_ext.remote.rpc_runner``) measures with one per session.
"""
from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Protocol, Sequence

from .builder import BuildResult
from ..core.errors import ErrorKind, RunnerLost
from .lifetime import exit_with_parent
from .measure import MeasureJob, MeasureSettings, RunResult, make_job, run_job, time_loop, warm_device
from .pools import ProcessDied, RestartingPool
from ..target import TargetInfo
from ..core.template import Template

__all__ = ["IsolatedMeasurer", "LocalRunner", "MeasureJob", "MeasureSettings", "RemoteRunner", "RunResult", "Runner",
           "RunnerLost", "resolved", "run_all", "time_loop"]


class Runner(Protocol):
    def submit(self, template: Template, builds: Sequence[BuildResult]) -> list["Future[RunResult]"]:
        """Start measuring every build (all built: ``artifact`` set); one future per build, in
        order, each resolving to a ``RunResult`` (failures included).  A future raises only
        ``RunnerLost``: the runner can measure nothing more (e.g. its RPC tracker is gone)."""

    def close(self) -> None: ...


class RemoteRunner(Runner, Protocol):
    """A runner whose devices are elsewhere (RPC servers): the target is theirs, asked at start,
    not this machine's ``--target``/``--device``."""

    @property
    def target(self) -> TargetInfo: ...


def resolved(result: RunResult) -> "Future[RunResult]":
    """A future that is already done (runners that know results at once, e.g. a replay)."""
    future: Future[RunResult] = Future()
    future.set_result(result)
    return future


def run_all(runner: Runner, template: Template, builds: Sequence[BuildResult]) -> list[RunResult]:
    """Measure a batch and wait for all of it, in order: a build that failed gives its build error."""
    built = [b for b in builds if b.artifact is not None]
    results = iter([f.result() for f in runner.submit(template, built)])
    return [next(results) if b.artifact is not None else RunResult((), b.error_kind or ErrorKind.BUILD_ERROR,
                                                                    b.error_msg) for b in builds]


def job_error(exc: Exception) -> RunResult:
    """A job that could not be made (no case for the workload, e.g. a reference that fails)."""
    return RunResult((), ErrorKind.RUN_ERROR, f"{type(exc).__name__}: {exc}"[:300])


def _outcome(pool_future: Any, timeout: float) -> RunResult:
    """A pool future's result as a RunResult: timeouts and dead workers are data too."""
    try:
        return pool_future.result()
    except FutureTimeout:
        return RunResult((), ErrorKind.RUN_TIMEOUT, f"kernel ran longer than {timeout:g} s")
    except CancelledError:
        return RunResult((), ErrorKind.RUN_ERROR, "measurement cancelled (the runner was closed)")
    except ProcessDied as exc:  # a trap or segfault in the kernel, twice
        return RunResult((), ErrorKind.CRASH, f"measuring process died: {exc}"[:300])
    except Exception as exc:  # the job itself raised (run_job makes its failures data: unexpected)
        return RunResult((), ErrorKind.RUN_ERROR, f"{type(exc).__name__}: {exc}"[:300])


class IsolatedMeasurer:
    """One process (spawned, so no device state is inherited) measuring jobs one at a time:
    a job past ``timeout`` or one that kills the process twice (a trap in the kernel) is an
    error result, and the next job gets a fresh process.  ``measure`` is what runs a job in
    that process (``run_job``; a module-level function)."""

    def __init__(self, timeout: float = 60.0, measure: Callable[[MeasureJob], RunResult] = run_job):
        self.timeout = timeout
        self.measure = measure
        self._pool: RestartingPool | None = None

    @property
    def rebuilds(self) -> int:
        """How often its measuring process died (or was killed at a timeout) and was replaced."""
        return self._pool.rebuilds if self._pool is not None else 0

    def _started(self) -> RestartingPool:
        if self._pool is None:
            self._pool = RestartingPool(1, exit_with_parent)
        return self._pool

    def schedule(self, job: MeasureJob) -> "Future[RunResult]":
        future: Future[RunResult] = Future()
        pool_future = self._started().schedule(self.measure, (job,), self.timeout)
        pool_future.add_done_callback(lambda f: future.set_result(_outcome(f, self.timeout)))
        return future

    def run(self, job: MeasureJob) -> RunResult:
        return self.schedule(job).result()

    def warm(self, kind: str, device_id: int) -> Future:
        """Start the measuring process now and load its device (``measure.warm_device``), so the
        first job does not wait for that; a failure here is left to the first job to meet.  The
        future ends when the device is loaded."""
        return self._started().schedule(warm_device, (kind, device_id), self.timeout)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


class LocalRunner:
    """Measures in isolated worker processes on this machine, one per device (``devices``,
    default the target's), with a run timeout per job."""

    def __init__(self, target: TargetInfo, settings: MeasureSettings | None = None, timeout: float = 60.0,
                 devices: Sequence[int] | None = None):
        self.target = target
        self.settings = settings or MeasureSettings()
        self.timeout = timeout
        self.devices = tuple(devices) if devices else (target.device_id,)
        self._pools: dict[int, IsolatedMeasurer] = {}
        self._next = 0
        self._lock = threading.Lock()  # tuners in several threads submit at once

    @property
    def workers(self) -> tuple[int, ...]:
        """The device of each worker process started so far."""
        return tuple(self.devices[slot] for slot in sorted(self._pools))

    def _pool(self, slot: int) -> IsolatedMeasurer:
        if slot not in self._pools:
            self._pools[slot] = IsolatedMeasurer(self.timeout)
            self._pools[slot].warm(self.target.kind, self.devices[slot])
        return self._pools[slot]

    def warm(self) -> None:
        """Start every device's measuring process now (while the first candidates build)."""
        for slot in range(len(self.devices)):
            self._pool(slot)

    def job(self, template: Template, build: BuildResult, device: int | None = None) -> MeasureJob:
        if build.artifact is None:
            raise ValueError(f"{build.config} was not built: nothing to measure")
        return make_job(template, build.config, build.artifact, self.target, self.settings, device)

    def submit(self, template: Template, builds: Sequence[BuildResult]) -> list["Future[RunResult]"]:
        futures = []
        for build in builds:
            with self._lock:
                slot = self._next % len(self.devices)
                self._next += 1
                pool = self._pool(slot)
            try:
                job = self.job(template, build, self.devices[slot])
            except Exception as exc:  # no case for the workload (e.g. a reference that fails): data
                futures.append(resolved(job_error(exc)))
                continue
            futures.append(pool.schedule(job))
        return futures

    def run(self, template: Template, builds: Sequence[BuildResult]) -> list[RunResult]:
        return run_all(self, template, builds)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    def __enter__(self) -> "LocalRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
