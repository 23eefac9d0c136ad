"""Builder: turn (template, config) into a runnable artifact, in parallel worker processes.

Mirrors meta_schedule's builder role: ``build`` takes a list of candidates and returns
a list of ``BuildResult``; a failure or a timeout is data (``error_kind``, ``error_msg``),
never an exception, so one bad candidate never stops a search.  What a template compiles
is its ``build_program`` (``tvm_ext.measure.program``); the artifact is plain data, the CUDA
library included as bytes, so a runner needs no file of the builder's.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Sequence

from ..core.errors import ErrorKind
from .lifetime import exit_with_parent
from .pools import ProcessDied, RestartingPool, settle
from .program import Artifact, CompiledProgram, KernelLaunch, compile_module, compile_schedule, extract_launches
from .program import plain_json
from ..core.space import Config
from ..target import TargetInfo
from ..core.template import Template

__all__ = ["Artifact", "BuildResult", "CompiledProgram", "KernelLaunch", "LocalBuilder", "build_one",
           "compile_module", "compile_schedule", "error_summary", "extract_launches", "plain_json"]


@dataclass(frozen=True)
class BuildResult:
    config: Config
    artifact: Artifact | None
    trace: Any  # schedule trace as plain JSON, replayable by TVM
    build_secs: float
    error_kind: ErrorKind = ErrorKind.OK
    error_msg: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "error_kind", ErrorKind(self.error_kind))  # a kind's string works too

    @property
    def ok(self) -> bool:
        return self.artifact is not None


def build_one(template: Template, config: Config, target: TargetInfo) -> BuildResult:
    """Schedule, compile and package one config (runs inside a worker process)."""
    start = time.perf_counter()
    try:
        program = template.build_program(config, target)
        return BuildResult(config, program.artifact(), program.trace, time.perf_counter() - start)
    except Exception as exc:  # a config that does not compile is data, not a crash
        return BuildResult(config, None, None, time.perf_counter() - start, ErrorKind.BUILD_ERROR,
                           error_summary(exc))


def error_summary(exc: BaseException) -> str:
    """One line for a record: TVM's errors put the useful line last, compilers first."""
    lines = [l.strip() for l in str(exc).strip().splitlines() if l.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[-1] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return _short(text)


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


BUILD_NICENESS = 10  # build processes yield the CPU to measuring ones (and to a PoCL device's kernels)


def _init_worker() -> None:
    # Workers compile; they never touch a device.  Keep their threads modest, and let a
    # measurement on the same host run first: a timed kernel launch or a CPU device's kernel
    # slowed by compilers beside it would be a wrong cost.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        os.nice(BUILD_NICENESS)
    except OSError:  # not permitted here: build at the parent's priority
        pass
    exit_with_parent()


WARMED: str = ""  # what this process's ``warm_up`` did ("" where it did not run or failed)
# Processes a started pool warms: importing TVM in many processes at once is much slower than in
# a few, and delays every first build (the results docs, tuning: the warmed build pool)
WARM_PROCESSES = 16


def warm_up() -> None:
    """A build process's first-build cost paid before its first candidate: TVM and every
    operator's template imported.  A failure here fails nothing: the first build imports them."""
    global WARMED
    try:
        from ..operators import OPERATORS

        for operator in OPERATORS.values():
            operator.template_class()
        WARMED = "templates imported"
    except Exception:  # noqa: BLE001 - an optional head start
        pass


class LocalBuilder:
    """Builds candidates in a pool of worker processes with a per-build timeout.  The pool is a
    ``RestartingPool``: a process that dies (idle or building) is replaced, its build retried
    once, and only a config whose build kills its process twice is a ``crash``."""

    def __init__(self, workers: int | None = None, timeout: float = 60.0):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.timeout = timeout
        self._pool: Any = None
        self._lock = threading.Lock()  # tuners in several threads build at once

    def _get_pool(self, warm: bool = False) -> RestartingPool:
        with self._lock:
            if self._pool is None:
                self._pool = RestartingPool(self.workers, _init_worker, warm=warm_up,
                                            warm_processes=WARM_PROCESSES if warm else 0)
            return self._pool

    def start(self) -> None:
        """Start the pool now, not at the first build: its first ``WARM_PROCESSES`` processes
        ``warm_up`` while the caller does its own work (a model's task extraction, a tuner's
        setup), so the first candidates' builds cost what later ones do.  Without effect on a
        started pool."""
        self._get_pool(warm=True).start()

    @property
    def rebuilds(self) -> int:
        """How often its pool broke (a process that died idle) and was replaced."""
        return self._pool.rebuilds if self._pool is not None else 0

    def submit(self, template: Template, configs: Sequence[Config], target: TargetInfo) -> "list[Future[BuildResult]]":
        """A future per config, resolved with its ``BuildResult`` as soon as that build ends
        (a failure, a timeout or a crash as data), so a caller can measure it at once."""
        if not configs:
            return []
        pool = self._get_pool()
        futures = []
        for config in configs:
            result: Future[BuildResult] = Future()
            job = pool.schedule(build_one, (template, config, target), self.timeout)
            job.add_done_callback(lambda job, config=config, result=result: settle(
                result, self._outcome(config, job)))
            futures.append(result)
        return futures

    def build(self, template: Template, configs: Sequence[Config], target: TargetInfo) -> list[BuildResult]:
        return [future.result() for future in self.submit(template, configs, target)]

    def _outcome(self, config: Config, job: Future) -> BuildResult:
        try:
            return job.result()
        except FutureTimeout:
            return BuildResult(config, None, None, self.timeout, ErrorKind.BUILD_TIMEOUT,
                               f"build took longer than {self.timeout:g} s")
        except ProcessDied as exc:  # the build killed its process twice (e.g. a segfault in codegen)
            return BuildResult(config, None, None, 0.0, ErrorKind.CRASH, _short(f"build process died: {exc}"))
        except BaseException as exc:  # the job itself raised (build_one makes its failures data), or was cancelled
            return BuildResult(config, None, None, 0.0, ErrorKind.BUILD_ERROR, _short(f"{type(exc).__name__}: {exc}"))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> "LocalBuilder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
