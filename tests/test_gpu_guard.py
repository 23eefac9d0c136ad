"""The test run's own guard: a ``gpu`` test that breaks the CUDA context stops the run (conftest)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest


def test_a_gpu_test_that_breaks_the_cuda_context_stops_the_run_naming_itself(monkeypatch):
    """After a ``gpu`` test the CUDA context is checked: broken (a kernel faulted), the run stops
    with the test's name, the error and status 3, and leaves as every run does (the next test)
    without freeing the compiled modules (TVM's CUDA module destructor aborts on a broken
    context); after a CPU test, or with a healthy context, nothing happens."""
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
    broken = "broken after tests/test_x.py::test_y: CUDA_ERROR_ILLEGAL_ADDRESS"
    with pytest.raises(pytest.exit.Exception, match=broken) as stopped:
        stop_on_broken_cuda_context(Item(gpu=True), lambda: "CUDA_ERROR_ILLEGAL_ADDRESS")
    assert stopped.value.returncode == 3 and registered == []


def test_the_run_leaves_with_its_status_before_the_interpreter_frees_the_modules(tmp_path):
    """Every run (a stopped one too) leaves with pytest's status once its summary is out, through
    ``os._exit`` registered at session finish: no module destructor runs after it (an atexit
    handler registered before it, which would run after it, never does)."""
    test = tmp_path / "test_stop.py"
    test.write_text("import atexit\n"
                    "import pytest\n\n"
                    "def test_stop():\n"
                    "    atexit.register(print, 'a destructor ran')\n"
                    "    pytest.exit('stopped', returncode=3)\n")
    conftest = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
    (tmp_path / "conftest.py").write_text(open(conftest).read())
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          str(test)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 3, run.stdout + run.stderr
    assert "stopped" in run.stdout + run.stderr and "a destructor ran" not in run.stdout
