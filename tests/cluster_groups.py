"""Local clusters' process groups: what is left of them, and the check that nothing is."""
from __future__ import annotations

import os
import time

import psutil


def quiet(_message: str) -> None:
    pass


def group_members(groups) -> list[psutil.Process]:
    """Every live process in the process groups ``groups``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) in groups and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, ProcessLookupError):
            continue
    return found


def assert_groups_end(groups, secs: float = 10.0) -> None:
    """Every process of ``groups`` is gone within ``secs`` (a killed group's members die, and are
    reaped, a moment after the signal)."""
    deadline = time.monotonic() + secs
    while group_members(groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = group_members(groups)
    assert not left, [" ".join(p.cmdline()) for p in left if p.is_running()]
