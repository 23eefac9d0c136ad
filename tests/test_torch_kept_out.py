"""Build and measuring processes keep torch out: TVM's FFI imports torch whenever it is installed,
which is most of a fresh process's start, and those processes never use it.  The tuner's own
process keeps it (a model file or the torch module may need it)."""
from __future__ import annotations

import subprocess
import sys

import pool_jobs
import pytest

from tvm_ext.measure.pools import RestartingPool

pytest.importorskip("torch")  # where torch is not installed there is nothing to keep out


def test_a_pool_process_imports_tvm_without_torch():
    pool = RestartingPool(1)
    try:
        assert pool.schedule(pool_jobs.tvm_imported_with, ("torch",)).result(timeout=120) is False
        assert pool.schedule(pool_jobs.tvm_imported_with, ("tvm_ffi",)).result(timeout=120) is True
    finally:
        pool.close()


def test_kept_out_torch_is_an_import_error_and_scipy_still_works():
    code = ("from tvm_ext.measure.lifetime import keep_torch_out; keep_torch_out()\n"
            "import sys, tvm, numpy as np, scipy.stats\n"
            "assert 'torch' not in sys.modules\n"
            "try:\n    import torch\nexcept ImportError as exc:\n    print('refused:', exc)\n"
            "print(scipy.stats.spearmanr(np.arange(4), np.arange(4)).statistic)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "refused: No module named 'torch' (kept out of this process)" in done.stdout
    assert done.stdout.strip().endswith("1.0") or "0.99999" in done.stdout
