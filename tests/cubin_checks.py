"""nvcc's report on generated CUDA, for the tests that check what ptxas made of a kernel
(registers, spills, wgmma kept asynchronous) without a GPU."""
from __future__ import annotations

import subprocess
from typing import Any


def ptxas_report(source: str, tmp_path: Any, name: str = "k", arch: str = "sm_90a") -> str:
    """ptxas's report (``-v``) on ``source`` built by nvcc into ``tmp_path / name.cubin``; the
    build must succeed."""
    path = tmp_path / f"{name}.cu"
    path.write_text(source)
    done = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / f"{name}.cubin"),
                           str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def assert_wgmma_asynchronous_without_spills(report: str) -> None:
    """No C7514 "serialized" report (every wgmma kept asynchronous) and no register spilled."""
    assert "C7514" not in report and "serialized" not in report, report[-2000:]
    assert " 0 bytes spill stores" in report
