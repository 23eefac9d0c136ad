"""Process pools that outlive their processes: pebble's pool, rebuilt when a process dies.

pebble's ``ProcessPool`` replaces a process that dies while it runs a job, but one that dies
idle (the OOM killer, a stray signal) breaks the pool for good: every later job fails with
``Unexpected error within the Pool``.  ``RestartingPool`` wraps one so a long search never
depends on that: a broken pool is replaced and the jobs it held are scheduled again (a job
that was only queued is never a failure); a job whose process died runs once more, and only
a second death is its outcome (``ProcessDied``), so a job that kills its process is one crash
and a process killed from outside costs nothing.
"""
from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import CancelledError, Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

__all__ = ["ProcessDied", "RestartingPool"]

POLL_SECS = 0.2  # how often a pool with jobs pending is checked for being broken
MAX_BREAKS = 3  # pool breaks a job may see before it counts as a crash (a job killing its
# process before pebble knew it had started, over and over)


class ProcessDied(Exception):
    """The job's process died every time it ran the job (``retries`` + 1 times)."""


@dataclass(eq=False)
class _Job:
    """One scheduled call and what became of it so far (mutable: the pool's bookkeeping)."""

    function: Callable[..., Any]
    args: Sequence[Any]
    timeout: float | None
    future: Future = field(default_factory=Future)
    inner: Any = None  # the pebble future of the current attempt
    exits: list = field(default_factory=list)  # exit codes of the processes that died running it
    breaks: int = 0


def _exit_text(code: Any) -> str:
    if isinstance(code, int) and code < 0:
        import signal

        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class RestartingPool:
    """``workers`` spawned processes (each running ``initializer`` first) running scheduled
    calls; a call's future gives its result, its exception, ``TimeoutError`` past its
    timeout, or ``ProcessDied`` once its process died ``retries`` + 1 times."""

    def __init__(self, workers: int = 1, initializer: Callable[[], None] | None = None, retries: int = 1):
        self.workers = workers
        self.initializer = initializer
        self.retries = retries
        self.rebuilds = 0  # pools replaced after breaking
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._pool: Any = None
        self._pending: set[_Job] = set()
        self._todo: list[_Job] = []
        self._closed = False
        self._thread: threading.Thread | None = None

    def schedule(self, function: Callable[..., Any], args: Sequence[Any] = (), timeout: float | None = None) -> Future:
        job = _Job(function, tuple(args), timeout)
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._supervise, name="tvm_ext-pool", daemon=True)
                self._thread.start()
            self._pending.add(job)
            self._todo.append(job)
        self._wake.set()
        return job.future

    # ---- the supervising thread: every submission and every rebuild happen here ----
    def _supervise(self) -> None:
        while True:
            self._wake.wait(POLL_SECS)
            self._wake.clear()
            with self._lock:
                if self._closed:
                    return
                broken = self._pool is not None and not self._pool.active
                old = self._pool if broken else None
                if broken:  # every job it held is scheduled again; only queued ones never resolve there
                    self._pool = None
                    self.rebuilds += 1
                    for job in self._pending:
                        if job.inner is not None:
                            job.inner = None
                            self._todo.append(job)
            if old is not None:  # outside the lock: stopping joins pebble's threads, which call back
                old.stop()
                old.join()
            with self._lock:
                todo, self._todo = self._todo, []
                for job in todo:
                    if not job.future.done() and not self._closed:
                        self._submit(job)

    def _submit(self, job: _Job) -> None:
        if self._pool is None:
            from pebble import ProcessPool

            self._pool = ProcessPool(max_workers=self.workers, initializer=self.initializer,
                                     context=multiprocessing.get_context("spawn"))
        try:
            inner = self._pool.schedule(job.function, args=job.args, timeout=job.timeout)
        except RuntimeError:  # it broke since the last look: the next round (POLL_SECS) rebuilds it
            self._todo.append(job)
            return
        job.inner = inner
        inner.add_done_callback(lambda f, job=job: self._done(job, f))

    def _done(self, job: _Job, inner: Any) -> None:
        """An attempt ended (on one of pebble's threads)."""
        from pebble import ProcessExpired

        outcome: tuple[str, Any] | None = None
        with self._lock:
            if job.inner is not inner or job.future.done():
                return  # an attempt of a pool already replaced
            job.inner = None
            try:
                error = inner.exception()
            except CancelledError as exc:
                error = exc
            if error is None:
                outcome = ("result", inner.result())
            elif isinstance(error, ProcessExpired):
                job.exits.append(error.exitcode)
                if len(job.exits) > self.retries:
                    deaths = ", ".join(_exit_text(c) for c in job.exits)
                    outcome = ("error", ProcessDied(f"its process died each of {len(job.exits)} times ({deaths})"))
            elif isinstance(error, BrokenProcessPool):
                job.breaks += 1
                if job.breaks > MAX_BREAKS:
                    outcome = ("error", ProcessDied(f"the pool broke {job.breaks} times while running it"))
            else:
                outcome = ("error", error)
            if outcome is None:
                self._todo.append(job)
                self._wake.set()
                return
            self._pending.discard(job)
        kind, value = outcome  # resolved outside the lock: the caller's callbacks run here
        if kind == "result":
            job.future.set_result(value)
        elif isinstance(value, CancelledError):
            job.future.cancel()
        else:
            job.future.set_exception(value)

    def close(self) -> None:
        """Stop the processes; pending jobs are cancelled."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            pending, self._pending = list(self._pending), set()
            self._todo = []
        self._wake.set()
        if pool is not None:
            pool.stop()
            pool.join()
        for job in pending:
            job.future.cancel()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
