"""Shared fixtures: the real OpenCL device (PoCL on a CPU machine) and small templates."""
from __future__ import annotations

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
