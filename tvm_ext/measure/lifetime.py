"""How long tvm_ext's helper processes live: pool workers and the processes of a local
cluster end with the process that started them, and take what they started along.

A driver killed outright (SIGKILL, the OOM killer) cannot stop its pools or its cluster, so
each such process watches its parent itself; a cluster's tracker and workers also ask the
kernel for SIGTERM (``PR_SET_PDEATHSIG``), and end their own process trees as they go.
"""
from __future__ import annotations

import ctypes
import importlib.abc
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

PARENT_ENV = "TVM_EXT_PARENT_PID"  # set by a local cluster: end when that process does
POLL_SECS = 0.5


def watch_parent(when_gone: Callable[[], None], parent: int | None = None) -> None:
    """Call ``when_gone`` from a daemon thread once this process's parent is no longer
    ``parent`` (default: the parent it has now), i.e. once it has ended."""
    parent = os.getppid() if parent is None else parent

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_SECS)
        when_gone()

    threading.Thread(target=watch, name="tvm_ext-watch-parent", daemon=True).start()


def exit_with_parent() -> None:
    """In a pool worker: end this process at once when its driver is gone; a worker busy
    with a build or a measurement would otherwise go on alone."""
    watch_parent(lambda: os._exit(1))


def end_with_parent() -> None:
    """In a process a local cluster started (``PARENT_ENV`` set, ``tvm_ext.remote.cluster``): SIGTERM
    to itself when the driver that started it ends, so its handler ends what it started.  The
    kernel's signal follows the driver's thread that started us, so a watcher sends it too
    once we have another parent (Linux; elsewhere the cluster's ``stop`` ends them)."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    watch_parent(lambda: os.kill(os.getpid(), signal.SIGTERM), int(parent))


def parent_death_signal(signum: int) -> bool:
    """Ask Linux for ``signum`` when the parent (the thread of it that started us) ends."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(1, int(signum)) == 0  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


def end_tree_with_parent(parent: int | None = None) -> None:
    """In a process that must not outlive its parent (a worker's TVM server, one of its
    sessions): once the parent is gone (the kernel's SIGTERM, or a watcher where it has none),
    or on SIGTERM, end every process under this one and then this one.  A worker's main process
    killed outright would otherwise leave its server serving, registered at the tracker.
    ``parent``: the process expected as the parent (default: the one it has now)."""
    parent = os.getppid() if parent is None else parent

    def finish(*_: Any) -> None:
        try:
            end_descendants(timeout=1.0, rounds=2)
        finally:
            os._exit(1)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, finish)
        parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # gone already
        finish()
    watch_parent(finish, parent)


def parent_gone(wait: float = 5.0) -> bool:
    """Whether the driver that started this cluster process has ended.  The kernel signals
    us when the driver's *thread* that started us ends, which can be a moment before its last
    thread does and we are reparented: so the parent id is polled for up to ``wait`` s."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return False
    deadline = time.monotonic() + wait
    while os.getppid() == int(parent):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def end_descendants(timeout: float = 3.0, rounds: int = 3) -> None:
    """Every process under this one (TVM's server, its sessions, their measuring processes):
    TVM's server keeps running threads after its parent is gone, so it is ended here.  A
    process may start another while it is being ended, and a child whose parent died first
    is no longer under us: so this goes round until none is left, and a process a local
    cluster started (the leader of its own process group) also ends the rest of its group."""
    import psutil

    for _ in range(rounds):
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        children += [p for p in _group_members(psutil) if p not in children]
        if not children:
            return
        for child in children:
            try:
                child.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(children, timeout=timeout)
        for child in alive:
            try:
                child.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=timeout)


def _group_members(psutil: Any) -> list[Any]:
    """The other live processes of this process's group, when a local cluster made it the
    group's leader (``PARENT_ENV``); none otherwise (a user's shell job may hold others)."""
    me = os.getpid()
    if not os.environ.get(PARENT_ENV) or os.getpgrp() != me:
        return []
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != me and os.getpgid(proc.pid) == me and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, ProcessLookupError):
            continue
    return found


class _TorchKeptOut(importlib.abc.MetaPathFinder):
    """An import finder that refuses torch (``keep_torch_out``)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r} (kept out of this process)", name=name)
        return None


def keep_torch_out() -> None:
    """Refuse ``import torch`` in this process (where torch is not imported yet): TVM's FFI imports
    it whenever it is installed, which is most of a fresh process's start (seconds), and a build,
    measuring, worker or tracker process never uses it.  A finder, not ``sys.modules["torch"] =
    None``: code that looks torch up in ``sys.modules`` (scipy's array checks) must find nothing."""
    if "torch" not in sys.modules and not any(isinstance(f, _TorchKeptOut) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchKeptOut())
