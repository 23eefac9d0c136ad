"""Jobs for pool and runner tests, in a module a spawned pool process can import.

Each attempt of ``note_and_*`` appends a line to the file ``ATTEMPTS_ENV`` names (inherited by
the spawned processes), so a test counts how often a job really ran."""
from __future__ import annotations

import os
import signal
import time
from typing import Any

ATTEMPTS_ENV = "TVM_EXT_TEST_ATTEMPTS"
BLAS_THREADS_AT_IMPORT = os.environ.get("OPENBLAS_NUM_THREADS")  # as this module loaded in its process
KILL_MARK = "/* kill the measuring process */"


def note(what: str) -> None:
    path = os.environ.get(ATTEMPTS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{what} {os.getpid()}\n")


def square(x: int) -> int:
    return x * x


def pid() -> int:
    return os.getpid()


def environment(name: str) -> str | None:
    return os.environ.get(name)


def nothing() -> None:
    """An initializer: the pool process imports this module before its first job."""


def blas_threads_at_import() -> str | None:
    return BLAS_THREADS_AT_IMPORT


def note_and_die(secs: float = 0.3) -> None:
    """A job that kills its own process every time (a trap in a kernel), after a moment of work."""
    note("die")
    time.sleep(secs)
    os.kill(os.getpid(), signal.SIGKILL)


def note_and_sleep(secs: float, value: int) -> int:
    note("sleep")
    time.sleep(secs)
    return value


def measure_or_die(job: Any) -> Any:
    """``run_job``, except that a program whose source holds ``KILL_MARK`` kills the process."""
    from tvm_ext.measure.measure import run_job

    if KILL_MARK in job.artifact.source:
        note_and_die(0.2)
    return run_job(job)


def exit_at_start() -> None:
    """A pool initializer that fails: the process exits before it takes a job."""
    os._exit(3)


def tvm_imported_with(name: str) -> bool:
    """Import TVM in the pool process and say whether module ``name`` came with it."""
    import sys

    import tvm  # noqa: F401

    return name in sys.modules


def warmed() -> tuple[str, bool]:
    """What this build process's warm-up did, and whether the wgmma template (which an OpenCL
    GEMM's build never imports) was imported before this job."""
    import sys

    from tvm_ext.measure import builder

    return builder.WARMED, "tvm_ext.schedules.gemm.wgmma_template" in sys.modules


def sleep_at_start() -> None:
    """An initializer that keeps its process starting for a minute (importing, warming up)."""
    time.sleep(60.0)
