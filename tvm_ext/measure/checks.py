"""How measured outputs are compared with their float64 references, as data.

A template says which check applies (``Template.output_check``); the check travels in a
measurement job, so the process that runs the kernel needs no template code to judge it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np


class OutputCheck(Protocol):
    def __call__(self, outputs: Sequence[np.ndarray], refs: Sequence[np.ndarray]) -> str | None:
        """``None`` when the outputs match the references, else one line saying what is wrong."""


@dataclass(frozen=True)
class NormwiseCheck:
    """Each output's normwise relative error ||out - ref|| / ||ref|| (over the reference's
    non-NaN elements) at most ``tolerance``, and NaN exactly where the reference has NaN."""

    tolerance: float = 1e-4

    def __call__(self, outputs: Sequence[np.ndarray], refs: Sequence[np.ndarray]) -> str | None:
        for i, (out, ref) in enumerate(zip(outputs, refs)):
            out64 = np.asarray(out).astype(np.float64)
            ref = np.asarray(ref)
            if out64.shape != ref.shape:
                return f"output {i} has shape {out64.shape}, expected {ref.shape}"
            if not np.array_equal(np.isnan(out64), np.isnan(ref)):
                return f"output {i}: NaN where the reference has none (or the reverse)"
            mask = ~np.isnan(ref)
            denom = max(np.linalg.norm(ref[mask]), 1e-30)
            err = float(np.linalg.norm(out64[mask] - ref[mask]) / denom)
            if not err <= self.tolerance:
                return f"output {i}: relative error {err:.3g} exceeds {self.tolerance:.1g}"
        return None


@dataclass(frozen=True)
class ElementwiseCheck:
    """One output row by row: NaN exactly where the reference has NaN, infinities equal, and
    every finite value within its own absolute bound (``bounds``, the reference's shape)."""

    bounds: np.ndarray
    what: str = "float32"  # names the bound in messages

    def __call__(self, outputs: Sequence[np.ndarray], refs: Sequence[np.ndarray]) -> str | None:
        with np.errstate(invalid="ignore"):  # widening a signalling NaN flags "invalid"
            out = np.asarray(outputs[0]).astype(np.float64)
        ref = np.asarray(refs[0], dtype=np.float64)
        if out.shape != ref.shape:
            return f"output has shape {out.shape}, expected {ref.shape}"
        bound = np.where(np.isfinite(self.bounds), self.bounds, 0.0)
        nan_out, nan_ref = np.isnan(out), np.isnan(ref)
        if not np.array_equal(nan_out, nan_ref):
            i = int(np.flatnonzero(nan_out != nan_ref)[0])
            return f"row {i}: got {out[i]!r}, expected {ref[i]!r} (NaN must propagate as in numpy)"
        inf = np.isinf(ref) | np.isinf(out)
        if not np.array_equal(out[inf], ref[inf]):
            i = int(np.flatnonzero(inf & (out != ref))[0])
            return f"row {i}: got {out[i]!r}, expected {ref[i]!r}"
        fin = ~nan_ref & ~inf
        err = np.where(fin, np.abs(np.where(fin, out, 0.0) - np.where(fin, ref, 0.0)), 0.0)
        bad = fin & ~(err <= bound)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return (f"row {i}: got {out[i]!r}, expected {ref[i]!r}: error {err[i]:.3g} "
                    f"exceeds the {self.what} bound {bound[i]:.3g} ({int(bad.sum())} rows wrong)")
        return None
