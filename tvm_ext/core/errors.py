"""User-facing errors (one line, non-zero exit, never a traceback), and the kinds of failure
a candidate can have inside a search (data in its record, never an exception)."""
from __future__ import annotations

import contextlib
import gc
import os
import sys
from enum import Enum
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


class TvmExtError(Exception):
    """Bad input or an environment that cannot do the job (unknown target, no device...).

    The CLI prints ``error: <message>`` and exits with code 2.
    """


def check_sizes(what: str, **sizes: object) -> None:
    """A one-line error naming the first of ``sizes`` that is not a positive integer (a bool is
    not one): the shape check every template's constructor makes."""
    import numpy as np

    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise TvmExtError(f"{what} {name} must be a positive integer, got {value!r}")


def last_line(exc: BaseException, limit: int = 200) -> str:
    """The last line of ``exc``'s message (TVM puts its check there), at most ``limit``
    characters, or its type's name where it has none: a failure inside TVM as one error line."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:limit]


def run_frontend(convert: Callable[[], T], describe: Callable[[BaseException], str],
                 catch: tuple[type[BaseException], ...] = (Exception,)) -> T:
    """``convert()`` (a TVM frontend importing a model), or a ``TvmExtError`` of ``describe`` of
    what it raised among ``catch``.  The frontend's block builder, left open by the failure and
    freed with its frames, makes TVM warn on file descriptor 2 ('BlockBuilder destroyed with
    remaining blocks!'); it is freed here with that descriptor on /dev/null, so that the user's
    one error line is all they read."""
    failure: BaseException | None = None
    try:
        return convert()
    except catch as exc:
        failure = exc
    message = describe(failure)
    with _stderr_to_devnull():
        failure = None
        gc.collect()
    raise TvmExtError(message)


@contextlib.contextmanager
def _stderr_to_devnull() -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(null)
        os.close(saved)


def unconverted_error(first: str, kinds: list[str], count: int, frontend: str) -> TvmExtError:
    """The one-line refusal of a model with ``count`` nodes no converter of TVM's ``frontend``
    takes (ONNX, torch): the first named (``first``), the operators of all of them (``kinds``)."""
    more = f" and {count - 1} more node(s) of {kinds}" if count > 1 else ""
    return TvmExtError(f"{first}{more}: no converter in TVM's {frontend} frontend")


class RunnerLost(TvmExtError):
    """A runner can measure nothing more (its RPC tracker or every server is gone, a server
    of another device joined): the search stops; the records written so far are kept."""


class ErrorKind(str, Enum):
    """Why a candidate failed, shared by the builder, the runner and the records.

    A ``str`` enum whose values are the strings records hold, so old records read back and
    ``kind == "wrong_answer"`` still works; ``OK`` (the empty string) is a success."""

    OK = ""
    BUILD_ERROR = "build_error"  # scheduling or compiling raised
    BUILD_TIMEOUT = "build_timeout"  # the build ran past the builder's timeout
    RUN_ERROR = "run_error"  # loading or running the program raised, or it flagged a failure
    RUN_TIMEOUT = "run_timeout"  # the measurement ran past the runner's timeout
    WRONG_ANSWER = "wrong_answer"  # the outputs do not match the float64 reference
    CRASH = "crash"  # the measuring (or build) process died, again when retried (a trap or segfault)

    @classmethod
    def _missing_(cls, value: object) -> "ErrorKind | None":
        return cls.RUN_ERROR if value == "runtime_error" else None  # an older GRU record's name

    def __str__(self) -> str:
        return self.value
