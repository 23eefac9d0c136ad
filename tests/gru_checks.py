"""Checks the GRU step-kernel tests share: nvcc's report on the persistent step kernel, and a
built GRU against float64 on reruns."""
from __future__ import annotations

from typing import Any

import numpy as np
from cubin_checks import ptxas_report
from test_gru import _weights

from tvm_ext.precision.precision import relative_error
from tvm_ext.schedules.gru import gru_reference


def steps_kernel_ptxas(source: str, tmp_path: Any) -> str:
    """ptxas's report (``-v``) on ``gru_steps_kernel`` of ``source`` built by nvcc for sm_90, up
    to the next kernel's; the build must succeed."""
    report = ptxas_report(source, tmp_path, "gru", "sm_90")
    steps = report[report.index("'gru_steps_kernel'"):]
    return steps.split("ptxas info    : Compiling")[0]


def assert_reruns_match_float64(gru: Any, s: Any, x: np.ndarray, h0: np.ndarray, bound: float, spread: float,
                                reruns: int = 3) -> None:
    """``gru(x, h0)`` ``reruns`` times against the float64 reference of shape ``s``: each within
    ``bound``, all within ``spread`` of each other (a race between blocks would move the error)."""
    ref = gru_reference(x, _weights(s), h0, s.layers, s.bidirectional, s.batch_first)
    errors = [relative_error(list(gru(x, h0)), ref) for _ in range(reruns)]
    assert max(errors) < bound, errors
    assert np.ptp(errors) < spread
