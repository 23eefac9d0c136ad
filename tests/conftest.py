"""Shared fixtures: the real OpenCL device (PoCL on a CPU machine) and small templates."""
from __future__ import annotations

import atexit
import os
import sys

import pytest

from tvm_ext.target import TargetInfo, resolve_target


@pytest.fixture(scope="session")
def opencl() -> TargetInfo:
    return resolve_target("opencl", 0)


@pytest.fixture
def make_cluster():
    """Local clusters (a tracker and tvm_ext workers), stopped after the test: then no
    process of their groups may be left."""
    from cluster_groups import assert_groups_end, quiet
    from tvm_ext.remote.cluster import LocalCluster

    clusters = []

    def make(devices=(0, 0)) -> LocalCluster:
        cluster = LocalCluster(list(devices), "opencl", log=quiet)
        clusters.append(cluster)
        return cluster.start()

    yield make
    groups = set()
    for cluster in clusters:
        groups |= {p.popen.pid for p in cluster.processes}
        cluster.stop()
    assert_groups_end(groups)


@pytest.fixture(scope="module")
def cluster():
    """One tracker and two workers (both on PoCL device 0) shared by a module's tests that
    leave them up; stopped after the module, when no process of their groups may be left."""
    from cluster_groups import assert_groups_end, quiet
    from tvm_ext.remote.cluster import LocalCluster

    cluster = LocalCluster([0, 0], "opencl", log=quiet).start()
    groups = {p.popen.pid for p in cluster.processes}
    yield cluster
    cluster.stop()
    assert_groups_end(groups)


def cuda_context_error() -> str | None:
    """The CUDA context's sticky error (a kernel that faulted: an illegal address, a trap), or
    None where it is healthy or there is no CUDA device."""
    import tvm

    device = tvm.cuda(0)
    if not device.exist:
        return None
    try:
        device.sync()
    except Exception as exc:  # noqa: BLE001 - the runtime's error, whatever its type
        lines = str(exc).strip().splitlines()
        return lines[-1] if lines else type(exc).__name__
    return None


def stop_on_broken_cuda_context(item: pytest.Item, error_of=cuda_context_error) -> None:
    """After a ``gpu`` test: where the CUDA context is broken, stop the run with the test's name
    and the error, and leave without running destructors.  A broken context makes TVM's CUDA
    module destructor abort the process (``cuModuleUnload`` under ``LOG(FATAL)`` in
    ``~CUDAModuleNode``) at the next garbage collection, wherever it falls, so the run would end
    later in an unrelated place with "Fatal Python error: Aborted"; the test that broke it is
    the one to look at.  The process then leaves as every run does (``pytest_sessionfinish``):
    with the status, after pytest's summary, before the interpreter frees the modules."""
    if item.get_closest_marker("gpu") is None:
        return
    error = error_of()
    if error is None:
        return
    pytest.exit(f"the CUDA context is broken after {item.nodeid}: {error}; the tests after it cannot run "
                f"in this process (TVM's CUDA module destructor would abort it)", returncode=3)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    stop_on_broken_cuda_context(item)


def _leave(status: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Leave with pytest's status once its summary is out, before the interpreter frees the
    native libraries the whole suite loaded (TVM, PoCL, torch, xgboost): the full suite's process
    has been seen to die of a segmentation fault there, after every test passed, with no Python
    frame on the stack and never in a part of the suite run alone."""
    atexit.register(_leave, int(exitstatus))
