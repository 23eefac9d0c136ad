"""Runners: measure a whole batch of built programs, returning a future per program.

A runner takes the batch from the tuner, turns each build into a ``MeasureJob`` (data:
see ``tvm_ext.measure``) and returns one ``Future`` per build that always resolves to a
``RunResult``: a program that hangs (run timeout) or crashes its process becomes an
error result and the rest of the batch goes on, in a fresh worker.

``LocalRunner`` measures on this machine: one isolated worker process per device, so
jobs on different devices run at the same time and jobs on one device never overlap.
"""
from __future__ import annotations

from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol, Sequence

from .builder import BuildResult
from .errors import ErrorKind
from .measure import MeasureJob, MeasureSettings, RunResult, make_job, run_job, time_loop
from .target import TargetInfo
from .template import Template

__all__ = ["LocalRunner", "MeasureJob", "MeasureSettings", "RunResult", "Runner", "resolved", "run_all", "time_loop"]


class Runner(Protocol):
    def submit(self, template: Template, builds: Sequence[BuildResult]) -> list["Future[RunResult]"]:
        """Start measuring every build (all built: ``artifact`` set); one future per build, in
        order, each resolving to a ``RunResult`` (failures included), never raising."""

    def close(self) -> None: ...


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


def _outcome(pool_future: Any, timeout: float) -> RunResult:
    """A pebble future's result as a RunResult: timeouts and dead workers are data too."""
    try:
        return pool_future.result()
    except FutureTimeout:
        return RunResult((), ErrorKind.RUN_TIMEOUT, f"kernel ran longer than {timeout:g} s")
    except CancelledError:
        return RunResult((), ErrorKind.RUN_ERROR, "measurement cancelled (the runner was closed)")
    except Exception as exc:  # the worker died: a trap or segfault in the kernel
        return RunResult((), ErrorKind.CRASH, f"{type(exc).__name__}: {exc}"[:300])


class LocalRunner:
    """Measures in isolated worker processes on this machine, one per device (``devices``,
    default the target's), with a run timeout per job."""

    def __init__(self, target: TargetInfo, settings: MeasureSettings | None = None, timeout: float = 60.0,
                 devices: Sequence[int] | None = None):
        self.target = target
        self.settings = settings or MeasureSettings()
        self.timeout = timeout
        self.devices = tuple(devices) if devices else (target.device_id,)
        self._pools: dict[int, Any] = {}
        self._next = 0

    @property
    def workers(self) -> tuple[int, ...]:
        """The device of each worker process started so far."""
        return tuple(self.devices[slot] for slot in sorted(self._pools))

    def _pool(self, slot: int) -> Any:
        if slot not in self._pools:
            import multiprocessing

            from pebble import ProcessPool

            self._pools[slot] = ProcessPool(max_workers=1, context=multiprocessing.get_context("spawn"))
        return self._pools[slot]

    def job(self, template: Template, build: BuildResult, device: int | None = None) -> MeasureJob:
        if build.artifact is None:
            raise ValueError(f"{build.config} was not built: nothing to measure")
        return make_job(template, build.config, build.artifact, self.target, self.settings, device)

    def submit(self, template: Template, builds: Sequence[BuildResult]) -> list["Future[RunResult]"]:
        futures = []
        for build in builds:
            slot = self._next % len(self.devices)
            device = self.devices[slot]
            self._next += 1
            future: Future[RunResult] = Future()
            try:
                job = self.job(template, build, device)
            except Exception as exc:  # no case for the workload (e.g. a reference that fails): data
                future.set_result(RunResult((), ErrorKind.RUN_ERROR, f"{type(exc).__name__}: {exc}"[:300]))
                futures.append(future)
                continue
            pool_future = self._pool(slot).schedule(run_job, args=(job,), timeout=self.timeout)
            pool_future.add_done_callback(lambda f, out=future: out.set_result(_outcome(f, self.timeout)))
            futures.append(future)
        return futures

    def run(self, template: Template, builds: Sequence[BuildResult]) -> list[RunResult]:
        return run_all(self, template, builds)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.stop()
            pool.join()
        self._pools.clear()

    def __enter__(self) -> "LocalRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
