"""Runners: measure a whole batch of built programs, returning a future per program.

A runner takes the batch from the tuner, turns each build into a ``MeasureJob`` (data:
see ``tvm_ext.measure.measure``) and returns one ``Future`` per build that always resolves to a
``RunResult``: a program that hangs (run timeout) or crashes its process becomes an
error result and the rest of the batch goes on, in a fresh worker.

``IsolatedMeasurer`` is that isolation: one process measuring jobs one at a time under a run
timeout, in a ``RestartingPool`` (a process that dies is replaced and the job it ran is measured
once more: only a job that kills its process twice is a ``crash``).  A job's check data (its
case, ``tvm_ext.measure.cases``) goes into that process once and stays there: jobs go without it.
``LocalRunner`` measures on this machine with one per device, so jobs on different devices run
at the same time and jobs on one device never overlap; a ``tvm_ext.worker`` (the RPC runner's
server, ``tvm_ext.remote.rpc_runner``) measures with one per session.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Protocol, Sequence

from .builder import BuildResult
from .cases import case_key_of, join_case, keep_latest, split_case
from ..core.errors import ErrorKind, RunnerLost
from .lifetime import exit_with_parent
from .measure import MeasureJob, MeasureSettings, RunResult, keyed_case, make_job, run_job, time_loop, warm_device
from .pools import ProcessDied, RestartingPool, close_all, settle
from ..target import TargetInfo
from ..core.template import Template

__all__ = ["IsolatedMeasurer", "LocalRunner", "MeasureJob", "MeasureSettings", "RemoteRunner", "RunResult", "Runner",
           "RunnerLost", "resolved", "run_all", "time_loop"]


class Runner(Protocol):
    """Measures built programs.  A runner may also have ``prepare(template, config)``, called
    once as a search starts, before anything is built: it makes the workload's check data and
    sends it where the jobs will be measured, so the first jobs do not wait for it."""

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


def _returned(pool_future: Any) -> Any:
    """What the pool's job returned; ``None`` when it raised, timed out or was cancelled."""
    if pool_future.cancelled() or pool_future.exception() is not None:
        return None
    return pool_future.result()


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


CASE_MISSING = "tvm_ext: the measuring process does not hold this case"
_HELD: OrderedDict[str, tuple[Any, ...]] = OrderedDict()  # in a measuring process: its cases by key


def hold_case(key: str, case: tuple[Any, ...]) -> None:
    """In a measuring process: keep ``case`` under ``key`` (the ``CASES_KEPT`` latest)."""
    keep_latest(_HELD, key, case)


def measure_held(measure: Callable[[MeasureJob], RunResult], job: MeasureJob, key: str,
                 case: tuple[Any, ...] | None) -> RunResult | str:
    """In a measuring process: ``measure`` ``job`` with case ``key`` (``case`` when sent along,
    else the one held); ``CASE_MISSING`` when it holds none (a fresh process), to be sent again."""
    if case is not None:
        hold_case(key, case)
    held = _HELD.get(key)
    if held is None:
        return CASE_MISSING
    _HELD.move_to_end(key)
    return measure(join_case(job, held))


class IsolatedMeasurer:
    """One process (spawned, so no device state is inherited) measuring jobs one at a time:
    a job past ``timeout`` or one that kills the process twice (a trap in the kernel) is an
    error result, and the next job gets a fresh process.  ``measure`` is what runs a job in
    that process (``run_job``; a module-level function)."""

    def __init__(self, timeout: float = 60.0, measure: Callable[[MeasureJob], RunResult] = run_job):
        self.timeout = timeout
        self.measure = measure
        self._pool: RestartingPool | None = None
        self._sent: OrderedDict[str, None] = OrderedDict()  # cases sent to the process (it may have lost them)
        self._lock = threading.Lock()

    @property
    def rebuilds(self) -> int:
        """How often its measuring process died (or was killed at a timeout) and was replaced."""
        return self._pool.rebuilds if self._pool is not None else 0

    def _started(self) -> RestartingPool:
        if self._pool is None:
            self._pool = RestartingPool(1, exit_with_parent)
        return self._pool

    def schedule(self, job: MeasureJob, case_key: str | None = None) -> "Future[RunResult]":
        """Measure ``job``; with ``case_key`` (its case's, ``cases.case_key``) the case goes to
        the process only if it was not sent before, and again if the process lost it."""
        future: Future[RunResult] = Future()
        if case_key is None:
            pool_future = self._started().schedule(self.measure, (job,), self.timeout)
            pool_future.add_done_callback(lambda f: settle(future, _outcome(f, self.timeout)))
            return future
        light, case = split_case(job)

        def send(with_case: bool) -> None:
            args = (self.measure, light, case_key, case if with_case else None)
            self._started().schedule(measure_held, args, self.timeout).add_done_callback(
                lambda f: ended(f, with_case))

        def ended(pool_future: Any, with_case: bool) -> None:
            if not with_case and _returned(pool_future) == CASE_MISSING:
                try:
                    return send(True)
                except RuntimeError:  # closed meanwhile
                    return settle(future, RunResult((), ErrorKind.RUN_ERROR, "the measuring process was closed"))
            settle(future, _outcome(pool_future, self.timeout))

        send(not self._mark_sent(case_key))
        return future

    def _mark_sent(self, key: str) -> bool:
        """Whether case ``key`` was sent before; it counts as sent from now on."""
        with self._lock:
            known = key in self._sent
            keep_latest(self._sent, key, None)
        return known

    def hold(self, case_key: str, case: tuple[Any, ...]) -> None:
        """Send case ``case_key`` to the process ahead of its jobs (while they build)."""
        if not self._mark_sent(case_key):
            self._started().schedule(hold_case, (case_key, case), self.timeout)

    def run(self, job: MeasureJob, case_key: str | None = None) -> RunResult:
        return self.schedule(job, case_key).result()

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
        self._lock = threading.Lock()  # tuners in several threads submit at once; pools made and closed under it
        self._closed = False

    @property
    def in_flight(self) -> int:
        """Jobs measured at once: one a device."""
        return len(self.devices)

    @property
    def workers(self) -> tuple[int, ...]:
        """The device of each worker process started so far."""
        return tuple(self.devices[slot] for slot in sorted(self._pools))

    def _pool(self, slot: int) -> IsolatedMeasurer:
        """Device ``slot``'s measuring process, started on first use (the caller holds the lock);
        RuntimeError once the runner is closed: no process outlives ``close``."""
        if self._closed:
            raise RuntimeError("the local runner was closed")
        pool = self._pools.get(slot)
        if pool is None:
            pool = self._pools[slot] = IsolatedMeasurer(self.timeout)
            pool.warm(self.target.kind, self.devices[slot])
        return pool

    def warm(self) -> None:
        """Start every device's measuring process now (while the first candidates build)."""
        with self._lock:
            for slot in range(len(self.devices)):
                self._pool(slot)

    def prepare(self, template: Template, config: Any) -> None:
        """The workload's check data (``config``'s, the default's), made on a thread while the
        first candidates build and sent to every device's measuring process ahead of its jobs."""
        def send_all() -> None:
            keyed = keyed_case(template, config, self.settings)
            for slot in range(len(self.devices)) if keyed is not None else ():
                try:
                    with self._lock:
                        pool = self._pool(slot)
                    pool.hold(*keyed)
                except RuntimeError:  # closed meanwhile
                    return

        threading.Thread(target=send_all, daemon=True, name="tvm_ext-case-ahead").start()

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
            futures.append(pool.schedule(job, case_key_of(split_case(job)[1])))
        return futures

    def run(self, template: Template, builds: Sequence[BuildResult]) -> list[RunResult]:
        return run_all(self, template, builds)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools, self._pools = list(self._pools.values()), {}
        close_all(pools)

    def __enter__(self) -> "LocalRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
