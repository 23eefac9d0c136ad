"""What the GRU probes share beside ``benchmarks/common.py``: one layer's weights as ``nn.GRU``
initialises them, and the wgmma kernels' A box as it was before ``KernelLayout.a_box_rows`` (to
time the code before against the code now in one process)."""
from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator
from unittest.mock import patch


def gru_weights(rng: Any, hidden: int, bidirectional: bool = False) -> dict[str, Any]:
    """One GRU layer's weights (input = hidden) as ``nn.GRU`` initialises them (uniform in
    ±1/sqrt(hidden)), float32 arrays by ``state_dict`` name, drawn from ``rng`` in one order."""
    g, k = 3 * hidden, 1 / math.sqrt(hidden)
    return {name + tail: rng.uniform(-k, k, shape).astype("float32")
            for tail in (("", "_reverse") if bidirectional else ("",)) for name, shape in (
                ("weight_ih_l0", (g, hidden)), ("weight_hh_l0", (g, hidden)), ("bias_ih_l0", (g,)),
                ("bias_hh_l0", (g,)))}


@contextmanager
def full_a_box(full: bool) -> Iterator[None]:
    """While open (``full``), every wgmma kernel built loads A's whole tile by the TMA where M is
    below one tile (rows past M as the TMA's zeros), as before ``KernelLayout.a_box_rows``: the
    code before, built in the same process to time against the code now."""
    from tvm_ext.schedules.gemm.wgmma_layout import KernelLayout

    with patch.object(KernelLayout, "a_box_rows", property(lambda self: self.bm)) if full else nullcontext():
        yield
