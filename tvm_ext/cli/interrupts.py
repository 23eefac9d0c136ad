"""Stopping a command line run: SIGTERM as Ctrl-C, and a second stop that waits for the summary.

A tuning run stops on Ctrl-C by a ``KeyboardInterrupt`` in the main thread: records so
far are kept and the best so far is printed.  A supervisor (a batch scheduler, systemd,
``timeout``) sends SIGTERM instead, which by default ends Python without a word; here it
raises the same ``KeyboardInterrupt``.  While that stop unwinds (pools closing, the
summary printing), another Ctrl-C or SIGTERM only says it was heard, so it cannot cut
the summary off; a third ends the process at once (exit code 130).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, Iterator

EXIT_INTERRUPTED = 130


class _StopHandler:
    """The handler of SIGINT and SIGTERM in the main thread of the process that installed it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.count = 0

    def __call__(self, signum: int, frame: Any) -> None:
        if os.getpid() != self.pid:  # a forked child: the default (end at once) applies to it
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.count += 1
        if self.count == 1:
            raise KeyboardInterrupt
        if self.count == 2:
            print("stopping: keeping the records and printing the summary (once more to quit at once)",
                  file=sys.stderr, flush=True)
            return
        os._exit(EXIT_INTERRUPTED)


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Within the block, SIGTERM behaves as Ctrl-C and a repeated stop cannot cut the summary
    off (see the module).  Dispositions set by whoever started us are kept (an ignored
    SIGINT stays ignored); outside the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = _StopHandler()
    saved = {}
    for signum, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        current = signal.getsignal(signum)
        if current is default:
            saved[signum] = current
            signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, previous in saved.items():
            signal.signal(signum, previous)
