"""Process pools that outlive their processes: each process on its own pipe, replaced when it dies.

Builds and measurements run in spawned processes that may die at any moment (a trap in a
kernel, the OOM killer, a stray signal).  Pools whose processes share one task channel
(pebble's, the standard library's) stall or break when a process dies holding the channel's
lock or while idle.  Here every process has its own pipe and the pool's one thread hands a job
to a process only once it said it is ready, so a death touches only that process: it is
replaced, a job it held runs once more, and only a second death is that job's outcome
(``ProcessDied``); a job past its timeout has its process killed and ends in ``TimeoutError``.
"""
from __future__ import annotations

import contextlib
import importlib
import itertools
import multiprocessing
import os
import sys
import threading
import types
import time
from collections import deque
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Iterator, Sequence

__all__ = ["ProcessDied", "RestartingPool"]

POLL_SECS = 0.2  # the longest the pool's thread sleeps without looking at its processes
STOP_SECS = 2.0  # a process asked to exit has this long before it is killed
MAX_START_DEATHS = 3  # processes in a row dying before they are ready: the queued jobs fail
READY = "ready"  # a process's first message: its initializer ran, it takes jobs
# A pool process runs one job at a time: a BLAS thread per core in each (numpy's float64
# checks) only competes with the other processes, measuring processes on other devices
# included.  Set by the spawned process itself where the user has not set them, before the
# modules of its initializer (numpy with them) load.
CHILD_ENV = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_SPAWN_LOCK = threading.Lock()  # pools start processes from their own threads


@contextlib.contextmanager
def _spawning() -> Iterator[None]:
    """A bare ``__main__`` while a pool's process spawns.  A spawned child otherwise imports the
    parent's main module again (``python -m tvm_ext.worker``, TVM's server and session
    processes, a benchmark script), and a main module that imports TVM imports torch with it
    (TVM's FFI does whenever it is installed) before the child can keep torch out: seconds
    before a measuring process is ready.  Pool jobs are functions of importable modules.

    The tuner's environment is never changed here: another thread may be starting a process at
    the same moment (TVM's RPC server, a compiler), and a process started with ``vfork`` reads
    the parent's environment as its ``execve`` runs; an entry freed under it fails that start
    with EFAULT."""
    with _SPAWN_LOCK:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if main is not None:
                sys.modules["__main__"] = main


class ProcessDied(Exception):
    """The job's process died every time it ran the job (``retries`` + 1 times)."""


@dataclass(eq=False)
class _Job:
    """One scheduled call and what became of it so far (the pool thread's bookkeeping)."""

    function: Callable[..., Any]
    args: Sequence[Any]
    timeout: float | None
    future: Future = field(default_factory=Future)
    exits: list = field(default_factory=list)  # exit codes of the processes that died running it


@dataclass(eq=False)
class _Process:
    """One spawned process, its end of its pipe, and the job it runs (None: idle or starting)."""

    process: Any
    conn: Connection
    ready: bool = False
    job: _Job | None = None
    started: float = 0.0


def _serve(conn: Connection, initializer: tuple[str, str] | None, warm: tuple[str, str] | None = None) -> None:
    """A pool process: set ``CHILD_ENV``, run the initializer (and ``warm``), each given by its
    module and name, then one job at a time until told to stop.  The two are imported only after
    the environment is set: their modules bring numpy and its BLAS with them.  Ctrl-C reaches the
    whole process group: the driver handles it, a pool process ignores it.  Its jobs build and
    measure with TVM, never torch, which TVM's FFI imports whenever it is installed (most of the
    process's start: seconds before its first job); so torch is kept out here."""
    import signal

    from .lifetime import keep_torch_out

    for name, value in CHILD_ENV.items():
        os.environ.setdefault(name, value)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep_torch_out()
    for function in (initializer, warm):
        if function is not None:
            _function_at(function)()
    conn.send(READY)
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the pool is gone
            return
        if message is None:
            return
        function, args = message
        try:
            reply = ("result", function(*args))
        except BaseException as exc:  # noqa: BLE001 - the caller's future gets it
            reply = ("error", exc)
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result or exception
            conn.send(("error", RuntimeError(f"the job's {reply[0]} could not be sent back: {exc}")))


def _function_name(function: Callable[[], None] | None) -> tuple[str, str] | None:
    """(module, qualified name) of a module-level function, what a pool's process imports it by."""
    if function is None:
        return None
    module, name = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if not module or "<" in name:
        raise ValueError(f"a pool's initializer must be a function of an importable module, not {function!r}")
    return module, name


def _function_at(where: tuple[str, str]) -> Callable[[], None]:
    found: Any = importlib.import_module(where[0])
    for part in where[1].split("."):
        found = getattr(found, part)
    return found


def _exit_text(code: Any) -> str:
    if isinstance(code, int) and code < 0:
        import signal

        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class RestartingPool:
    """``workers`` spawned processes (each running ``initializer`` first, the first
    ``warm_processes`` of them ``warm`` after it) running scheduled calls; a call's future gives
    its result, its exception, ``TimeoutError`` past its timeout, or ``ProcessDied`` once its
    process died ``retries`` + 1 times."""

    def __init__(self, workers: int = 1, initializer: Callable[[], None] | None = None, retries: int = 1,
                 warm: Callable[[], None] | None = None, warm_processes: int = 0):
        self.workers = workers
        self._initializer_name = _function_name(initializer)  # what the processes import and run
        self._warm_name = _function_name(warm)
        self.retries = retries
        self.warm_processes = warm_processes
        self.rebuilds = 0  # processes replaced after dying or being killed at a timeout
        self._lock = threading.Lock()
        self._queue: deque[_Job] = deque()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._wake_recv, self._wake_send = multiprocessing.Pipe(duplex=False)
        self._context = multiprocessing.get_context("spawn")
        self._ids = itertools.count()
        self._start_deaths = 0  # processes in a row that died before saying they were ready

    def schedule(self, function: Callable[..., Any], args: Sequence[Any] = (), timeout: float | None = None) -> Future:
        job = _Job(function, tuple(args), timeout)
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool is closed")
            self._queue.append(job)
            self._start_thread()
        self._wake()
        return job.future

    def start(self) -> None:
        """Start the processes now rather than at the first ``schedule``."""
        with self._lock:
            if not self._closed:
                self._start_thread()

    def _start_thread(self) -> None:  # under the lock
        if self._thread is None:
            self._thread = threading.Thread(target=self._supervise, name="tvm_ext-pool", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the processes; jobs not finished are cancelled."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        self._wake()
        if thread is not None:
            thread.join(timeout=STOP_SECS + 5.0)
        else:
            self._wake_recv.close()
            self._wake_send.close()

    def _wake(self) -> None:
        try:
            self._wake_send.send_bytes(b"")
        except OSError:  # closed
            pass

    # ---- the pool's thread: every process is started, fed, watched and stopped here ----------
    def _supervise(self) -> None:
        processes = [self._start() for _ in range(self.workers)]
        try:
            while not self._closed:
                ready = wait([self._wake_recv, *(p.conn for p in processes), *(p.process.sentinel for p in processes)],
                             timeout=self._next_wait(processes))
                if self._wake_recv in ready:
                    while self._wake_recv.poll():
                        self._wake_recv.recv_bytes()
                processes = [self._look_after(p) for p in processes]
                self._hand_out(processes)
        finally:
            self._stop(processes)

    def _start(self) -> _Process:
        parent, child = self._context.Pipe()
        number = next(self._ids)
        warm = self._warm_name if number < self.warm_processes else None
        process = self._context.Process(target=_serve, args=(child, self._initializer_name, warm), daemon=True,
                                        name=f"tvm_ext-pool-{number}")
        with _spawning():
            process.start()
        child.close()
        return _Process(process, parent)

    def _next_wait(self, processes: list[_Process]) -> float:
        now, wait_secs = time.monotonic(), POLL_SECS
        for p in processes:
            if p.job is not None and p.job.timeout is not None:
                wait_secs = min(wait_secs, max(0.0, p.started + p.job.timeout - now))
        return wait_secs

    def _look_after(self, p: _Process) -> _Process:
        """Take what ``p`` sent; replace it when it died or its job ran past its timeout."""
        try:
            while p.conn.poll():
                message = p.conn.recv()
                if message == READY:
                    p.ready, self._start_deaths = True, 0
                elif p.job is not None:
                    kind, value = message
                    job, p.job = p.job, None
                    settle(job.future, value if kind == "result" else None, None if kind == "result" else value)
        except (EOFError, OSError):
            pass  # it died: its exit is handled below
        if p.job is not None and p.job.timeout is not None and time.monotonic() > p.started + p.job.timeout:
            job, p.job = p.job, None
            settle(job.future, None, FutureTimeout(f"the job ran past its timeout of {job.timeout:g} s"))
            return self._replace(p)
        if not p.process.is_alive():
            if not p.ready:
                self._died_at_start(p.process.exitcode)
            if p.job is not None:
                job, p.job = p.job, None
                job.exits.append(p.process.exitcode)
                if len(job.exits) > self.retries:
                    deaths = ", ".join(_exit_text(c) for c in job.exits)
                    settle(job.future, None, ProcessDied(f"its process died each of {len(job.exits)} times ({deaths})"))
                else:
                    with self._lock:
                        self._queue.appendleft(job)  # runs again before the jobs queued after it
            return self._replace(p)
        return p

    def _died_at_start(self, code: Any) -> None:
        """A process died before it was ready (its initializer failed, or it was killed): after
        ``MAX_START_DEATHS`` in a row the queued jobs fail rather than wait for ever."""
        self._start_deaths += 1
        if self._start_deaths < MAX_START_DEATHS:
            return
        with self._lock:
            queued, self._queue = list(self._queue), deque()
        for job in queued:
            settle(job.future, None, ProcessDied(f"the pool's processes die as they start ({self._start_deaths} in a "
                                                 f"row, the last with {_exit_text(code)})"))

    def _replace(self, p: _Process) -> _Process:
        _end(p)
        self.rebuilds += 1
        return self._start()

    def _hand_out(self, processes: list[_Process]) -> None:
        for p in processes:
            if not p.ready or p.job is not None:
                continue
            with self._lock:
                job = None
                while self._queue and job is None:
                    job = self._queue.popleft()
                    if not job.future.running() and not job.future.set_running_or_notify_cancel():
                        job = None  # cancelled while queued (a job back in the queue, retried or not
                        # sent, is running already: marking it again raised in this thread)
            if job is None:
                return
            try:
                p.conn.send((job.function, job.args))
            except (OSError, ValueError):  # it died between its last message and now
                with self._lock:
                    self._queue.appendleft(job)
                continue
            except Exception as exc:  # noqa: BLE001 - arguments that cannot be sent
                settle(job.future, None, exc)
                continue
            p.job, p.started = job, time.monotonic()

    def _stop(self, processes: list[_Process]) -> None:
        for p in processes:
            if not p.ready and p.job is None:  # still starting: it holds nothing to wait for
                _end(p)
                continue
            try:
                p.conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + STOP_SECS
        for p in processes:
            p.process.join(timeout=max(0.0, deadline - time.monotonic()))
            _end(p)
            if p.job is not None:
                p.job.future.cancel() or settle(p.job.future, None, RuntimeError("the pool was closed"))
        with self._lock:
            queued, self._queue = list(self._queue), deque()
        for job in queued:
            job.future.cancel() or settle(job.future, None, RuntimeError("the pool was closed"))
        self._wake_recv.close()
        self._wake_send.close()


def settle(future: Future, result: Any = None, error: BaseException | None = None) -> None:
    """``future``'s result (or ``error``) unless it is done already: its caller may cancel it
    (Ctrl-C, a budget) while the work it waits for goes on, and that work's end is then no error."""
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except InvalidStateError:  # cancelled or settled meanwhile, on another thread
        pass


def _end(p: _Process) -> None:
    """Kill ``p``'s process if it still runs and reap it; close its pipe."""
    if p.process.is_alive():
        p.process.kill()
    p.process.join(timeout=STOP_SECS)
    p.conn.close()


def close_all(parts: Sequence[Any]) -> None:
    """``close()`` every one of ``parts`` at once (each stops its processes, which can take a
    second apiece: a CUDA context torn down), returning when all are closed."""
    threads = [threading.Thread(target=part.close, name="tvm_ext-close", daemon=True) for part in parts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
