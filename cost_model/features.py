"""Features of a candidate config: what the cost model sees before anything is measured.

Every template gets its knob values and the log2 of its numeric shape parameters (so
one model can learn across shapes, the transfer case).  GEMM adds what decides its
speed on the hardware model: threads per block, outputs per thread, block tile,
shared-memory bytes, estimated registers (or ``ptxas -v``'s registers and spills when
a :class:`~tvm_ext.cost_model.ptxas.PtxasCache` knows them), arithmetic intensity,
estimated occupancy, resident blocks, waves and padding waste.  Missing values are
NaN, which XGBoost treats as "unknown".
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from tvm_ext.core.space import Config, Space
from tvm_ext.target import TargetInfo
from tvm_ext.core.template import Template

from .hardware import HardwareModel, ceil_div, waves

GEMM_DERIVED = (
    "threads", "outputs_per_thread", "block_m", "block_n", "log2_aspect", "shared_bytes",
    "regs_est", "ptxas_regs", "ptxas_spill_bytes", "intensity_block", "intensity_total",
    "resident_blocks", "occupancy", "blocks", "blocks_per_sm", "waves", "wave_efficiency",
    "pad_waste", "k_iters", "fill_rounds",
)


# Precision knobs (mixed-precision programs) are featurized by their mantissa bits:
# ordered like precision, so "narrower" is one direction for the trees.
MANTISSA_BITS = {"float64": 52.0, "float32": 23.0, "float16": 10.0, "bfloat16": 7.0, "float8_e4m3fn": 3.0,
                 "float8_e5m2": 2.0}
STORAGE_BITS = {52.0: 64.0, 23.0: 32.0, 10.0: 16.0, 7.0: 16.0, 3.0: 8.0, 2.0: 8.0}


def knob_matrix(space: Space, configs: Sequence[Config]) -> np.ndarray:
    """(n, knobs) float matrix: numeric knob values as is, dtypes by mantissa bits, other
    values by choice index."""
    out = np.empty((len(configs), len(space.knobs)), dtype=np.float64)
    for j, knob in enumerate(space.knobs):
        numeric = all(isinstance(v, (int, float, np.integer, np.floating)) for v in knob.choices)
        dtypes = all(v in MANTISSA_BITS for v in knob.choices)
        for i, cfg in enumerate(configs):
            value = cfg[knob.name]
            out[i, j] = (float(value) if numeric else MANTISSA_BITS[value] if dtypes
                         else float(knob.index(value)))
    return out


def numeric_params(template: Template) -> dict[str, float]:
    """log2 of the template's numeric shape parameters (bools as 0/1, strings dropped)."""
    out = {}
    for key, value in sorted(template.params.items()):
        if isinstance(value, bool):
            out[key] = float(value)
        elif isinstance(value, (int, float, np.integer, np.floating)) and value > 0:
            out[f"log2_{key}"] = math.log2(float(value))
    return out


class Featurizer:
    """Feature rows for configs of one workload (template at a shape, on a target)."""

    def __init__(self, template: Template, target: TargetInfo, ptxas: Any = None):
        self.template = template
        self.target = target
        self.hw = HardwareModel.from_target(target)
        self.space = template.space(target)
        self.ptxas = ptxas
        self._params = numeric_params(template)
        derived = DERIVED.get(template.name)
        self._derived: Callable[..., dict[str, np.ndarray]] | None = derived[1] if derived else None
        self.names: tuple[str, ...] = (tuple(self.space.names) + tuple(self._params)
                                       + (derived[0] if derived else ()))

    def __call__(self, configs: Sequence[Config]) -> np.ndarray:
        if not configs:
            return np.zeros((0, len(self.names)))
        knobs = knob_matrix(self.space, configs)
        cols = [knobs, np.tile(np.array(list(self._params.values()), dtype=np.float64), (len(configs), 1))]
        if self._derived is not None:
            values = dict(zip(self.space.names, knobs.T))
            extra = self._derived(self.template, self.hw, values, self._ptxas_columns(configs))
            cols.append(np.stack([extra[n] for n in DERIVED[self.template.name][0]], axis=1))
        x = np.concatenate(cols, axis=1)
        return np.where(np.isinf(x), np.sign(x) * 1e9, x)  # "does not fit" -> very large

    def _ptxas_columns(self, configs: Sequence[Config]) -> tuple[np.ndarray, np.ndarray]:
        regs = np.full(len(configs), np.nan)
        spills = np.full(len(configs), np.nan)
        if self.ptxas is not None and self.target.kind == "cuda":
            for i, cfg in enumerate(configs):
                found = self.ptxas.lookup(self.template, cfg, self.target)
                if found is not None:
                    regs[i], spills[i] = found.registers, found.spill_bytes
        return regs, spills


def gemm_derived(template: Any, hw: HardwareModel, k: dict[str, np.ndarray],
                 ptxas: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    """GEMM features on the hardware model (vectorized over candidates)."""
    m, n, kk = (float(template.params[d]) for d in ("m", "n", "k"))
    threads = k["wg_x"] * k["wg_y"]
    outputs = k["task_x"] * k["task_y"]
    bm, bn = k["wg_y"] * k["task_y"], k["wg_x"] * k["task_x"]
    stages = np.where(k["double_buffer"] > 0, 2.0, 1.0)
    pad = np.where(k["pad"] > 0, k["vec"], 0.0)
    shared = np.where(k["use_shared"] > 0, 4.0 * stages * (bm * (k["k_step"] + pad) + k["k_step"] * (bn + pad)), 0.0)
    regs_est = estimate_registers(k)
    regs = np.where(np.isnan(ptxas[0]), regs_est, ptxas[0])
    grid = ceil_div(m, bm) * ceil_div(n, bn)
    resident = hw.blocks_per_sm(threads, regs, shared)
    occupancy = resident * threads / hw.max_threads_per_sm
    w = waves(grid, resident, hw.sm_count)
    with np.errstate(invalid="ignore"):
        efficiency = np.where(np.isfinite(w), w / np.maximum(np.ceil(w), 1.0), 0.0)
    mp, np_, kp = ceil_div(m, bm) * bm, ceil_div(n, bn) * bn, ceil_div(kk, k["k_step"]) * k["k_step"]
    traffic = 4.0 * (ceil_div(n, bn) * mp * kp + ceil_div(m, bm) * np_ * kp + m * n)
    fills = np.where(k["use_shared"] > 0, (bm + bn) * k["k_step"] / np.maximum(threads * k["vec"], 1.0), 0.0)
    return {
        "threads": threads, "outputs_per_thread": outputs, "block_m": bm, "block_n": bn,
        "log2_aspect": np.log2(bm / bn), "shared_bytes": shared, "regs_est": regs_est,
        "ptxas_regs": ptxas[0], "ptxas_spill_bytes": ptxas[1],
        "intensity_block": bm * bn / (2.0 * (bm + bn)),  # FLOP per byte of a block's loads
        "intensity_total": 2.0 * m * n * kk / traffic,
        "resident_blocks": resident, "occupancy": occupancy, "blocks": grid,
        "blocks_per_sm": grid / hw.sm_count, "waves": w,
        "wave_efficiency": efficiency,
        "pad_waste": mp * np_ * kp / (m * n * kk) - 1.0,
        "k_iters": kp / k["k_step"], "fill_rounds": fills,
    }


def estimate_registers(k: dict[str, np.ndarray]) -> np.ndarray:
    """Registers per thread without compiling: accumulators + A/B fragments + addressing.

    Calibrated loosely on ptxas output of the template for sm_90 (about 30 registers of
    indices and pointers; double buffering keeps a second set of fill addresses).
    """
    frag = k["task_x"] + k["task_y"]
    return np.minimum(255.0, k["task_x"] * k["task_y"] + frag + 30.0 + 8.0 * (k["double_buffer"] > 0))


PRECISION_DERIVED = ("min_mantissa", "lowered_params", "mean_storage_bits")


def precision_derived(template: Any, hw: HardwareModel, k: dict[str, np.ndarray],
                      ptxas: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    """Mixed-precision programs: how far the program as a whole was narrowed."""
    mantissa = np.stack(list(k.values()), axis=1)
    storage = np.vectorize(lambda m: STORAGE_BITS.get(float(m), 32.0))(mantissa)
    return {"min_mantissa": mantissa.min(axis=1), "lowered_params": (mantissa < 23.0).sum(axis=1),
            "mean_storage_bits": storage.mean(axis=1)}


# template name -> (derived feature names, function)
DERIVED: dict[str, tuple[tuple[str, ...], Callable[..., dict[str, np.ndarray]]]] = {
    "gemm": (GEMM_DERIVED, gemm_derived),
    "mixed_precision": (PRECISION_DERIVED, precision_derived),
}
