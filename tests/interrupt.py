"""Children that Ctrl-C reaches, however the test run was started.

A shell starts a background job's children with SIGINT ignored, and a Python started that
way never raises KeyboardInterrupt: a test that sends SIGINT would see the run go on to its
end (exit 0).  A terminal's Ctrl-C is what these tests mean, so the child gets the default
disposition back before it runs Python.
"""
from __future__ import annotations

import signal


def sigint_default() -> None:
    """``preexec_fn`` for ``subprocess.Popen``: SIGINT back to its default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
