"""The test run's own guard: a ``gpu`` test that breaks the CUDA context stops the run (conftest)."""
from __future__ import annotations

import os

import pytest


def test_a_gpu_test_that_breaks_the_cuda_context_stops_the_run_naming_itself(monkeypatch):
    """After a ``gpu`` test the CUDA context is checked: broken (a kernel faulted), the run stops
    with the test's name and the error and the process leaves without freeing the compiled
    modules (TVM's CUDA module destructor aborts on a broken context); after a CPU test, or
    with a healthy context, nothing happens."""
    import atexit

    from conftest import stop_on_broken_cuda_context

    class Item:
        def __init__(self, gpu):
            self.nodeid, self.gpu = "tests/test_x.py::test_y", gpu

        def get_closest_marker(self, name):
            return object() if name == "gpu" and self.gpu else None

    registered = []
    monkeypatch.setattr(atexit, "register", lambda *args: registered.append(args))
    stop_on_broken_cuda_context(Item(gpu=False), lambda: "CUDA_ERROR_ILLEGAL_ADDRESS")
    stop_on_broken_cuda_context(Item(gpu=True), lambda: None)
    assert registered == []
    with pytest.raises(pytest.exit.Exception, match="broken after tests/test_x.py::test_y: CUDA_ERROR_ILLEGAL_ADDRESS"):
        stop_on_broken_cuda_context(Item(gpu=True), lambda: "CUDA_ERROR_ILLEGAL_ADDRESS")
    assert registered == [(os._exit, 3)]
