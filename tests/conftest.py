"""Shared fixtures: the real OpenCL device (PoCL on a CPU machine) and small templates."""
from __future__ import annotations

import pytest

from tvm_ext.target import TargetInfo, resolve_target


@pytest.fixture(scope="session")
def opencl() -> TargetInfo:
    return resolve_target("opencl", 0)
