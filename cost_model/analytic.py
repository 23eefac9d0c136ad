"""Method 002: choose a GEMM tile configuration from the hardware alone, with no measurement.

The method's steps, in order, each keeping a subset of the candidates:

1. list every thread-block tile (block_m × block_n, k step) the template can express;
2. split the block's threads between M (``wg_y``) and N (``wg_x``) and keep splits with
   ``16 ≤ threads_m, threads_n ≤ max_threads_per_block / 16`` (plain FMA; with a matrix
   unit the lower bound is the unit's smallest M/N shape); then drop tiles whose register
   use leaves fewer resident threads per SM than a threshold (poor data reuse);
3. keep the tiles that use the hardware fully: at least one block per SM (core);
4. keep the largest compute-to-memory ratio (useful FLOPs per byte of global traffic,
   padding included);
5. keep the fewest kernel launches (every config of this template compiles to one
   kernel, so this step keeps them all; it matters for templates that split the work).

If a step would leave nothing (a tiny problem, a small device, a replay that recorded
none of them) it keeps its input: the method's filters narrow, they never fail.

The knobs the method does not cover (shared-memory staging, padding, unrolling, vector
width, double buffering, K-major A tile) follow a fixed policy stated in
:func:`policy_mismatch`; among configs that tie after step 5 the one closest to the
policy wins (these knobs are first-order: vector width alone changes speed by ~2×), then
the fewest waves of blocks (rounds of block issue on the SMs), the highest occupancy and
the largest k step (fewest barriers).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from tvm_ext.core.errors import TvmExtError
from tvm_ext.core.space import Config, Knob
from tvm_ext.target import TargetInfo
from tvm_ext.core.template import Template

from .features import estimate_registers
from .hardware import HardwareModel, ceil_div, waves

TILE_KNOBS = ("wg_x", "wg_y", "task_x", "task_y", "k_step")


@dataclass(frozen=True)
class AnalyticRules:
    """The method's thresholds (its published numbers, kept as parameters)."""

    min_threads_per_dim: int = 16
    max_threads_divisor: int = 16  # threads per direction <= max_threads_per_block / this
    min_resident_share: float = 0.25  # register-limited resident threads / max threads per SM
    use_matrix_unit: bool = False  # the fp32 template issues plain FMAs


@dataclass(frozen=True)
class TileCandidate:
    """One candidate config with the quantities the filters read."""

    config: Config
    threads_m: int
    threads_n: int
    block_m: int
    block_n: int
    k_step: int
    registers: float
    shared_bytes: float
    resident_threads_by_registers: float
    occupancy: float
    blocks: int
    waves: float
    intensity: float
    launches: int
    policy_mismatch: int


@dataclass(frozen=True)
class AnalyticResult:
    """The pick and how each filter narrowed the candidates (for the CLI and tests)."""

    hardware: HardwareModel
    ranked: tuple[TileCandidate, ...]  # survivors of step 5 in pick order, then the rest
    steps: tuple[tuple[str, int], ...]  # (step, candidates left after it)

    @property
    def pick(self) -> TileCandidate:
        return self.ranked[0]

    @property
    def config(self) -> Config:
        return self.pick.config

    def explain(self) -> str:
        p = self.pick
        lines = [f"hardware: {self.hardware.describe()}"]
        lines += [f"  {name}: {left} left" for name, left in self.steps]
        lines.append(
            f"pick: block tile {p.block_m}x{p.block_n} (k step {p.k_step}), threads {p.threads_m} (M) x "
            f"{p.threads_n} (N), ~{p.registers:.0f} regs/thread, {p.shared_bytes / 1024:.1f} KiB shared, "
            f"{p.blocks} blocks, {p.waves:.2f} waves, occupancy {p.occupancy:.2f}, "
            f"{p.intensity:.1f} FLOP/B")
        return "\n".join(lines)


def policy(config: Config, hw: HardwareModel) -> dict[str, object]:
    """The non-tile knobs the tile selection does not choose, as the template's hardware policy:
    stage tiles in shared memory (data reuse), the widest vector width the tile allows
    (128-bit accesses), K-major A (vector fragment loads), bank-conflict padding only where
    there are banks (GPUs), no double buffering (it doubles shared memory and registers,
    which steps 2–5 budgeted without), and unrolling that covers the thread's register tile."""
    tx, ty = config["task_x"], config["task_y"]
    vec = max(v for v in (1, 2, 4) if tx % v == 0 and ty % v == 0)
    work = tx * ty
    unroll = next((u for u in (16, 64, 512) if u >= work), 512)
    return {"use_shared": 1, "vec": vec, "a_transposed": 1, "pad": 0 if hw.is_cpu else 1,
            "double_buffer": 0, "unroll": unroll}


def policy_mismatch(config: Config, hw: HardwareModel) -> int:
    want = policy(config, hw)
    return sum(1 for k, v in want.items() if config[k] != v)


def default_candidates(template: Template, target: TargetInfo) -> list[Config]:
    """Step 1's list: every tile and thread split of the template's knobs, each with the
    policy's other knobs (falling back to any feasible variant when the policy's is not)."""
    space = template.space(target)
    hw = HardwareModel.from_target(target)
    tile_choices = [space.knob(n).choices for n in TILE_KNOBS]
    others = [k for k in space.names if k not in TILE_KNOBS]
    other_knobs = [space.knob(n) for n in others]
    variants = list(itertools.product(*(k.choices for k in other_knobs)))
    # the variants as their choices' indices, the policy's values likewise (-1: none of the choices)
    table = np.array(list(itertools.product(*(range(len(k.choices)) for k in other_knobs))), dtype=np.int64)
    out = []
    for tile in itertools.product(*tile_choices):
        base = dict(zip(TILE_KNOBS, tile))
        probe = Config(tuple((n, base.get(n, space.knob(n).choices[0])) for n in space.names))
        want = policy(probe, hw)
        target_row = np.array([_choice_index(k, want[k.name]) if k.name in want else -1 for k in other_knobs])
        mismatch = (table != target_row).sum(axis=1)
        for i in np.argsort(mismatch, kind="stable"):
            cfg = space.make(**base, **dict(zip(others, variants[i])))
            if space.is_feasible(cfg):
                out.append(cfg)
                break
    return out


def _choice_index(knob: Knob, value: object) -> int:
    """The index of ``value`` among ``knob``'s choices, -1 where it is none of them."""
    try:
        return knob.index(value)
    except TvmExtError:
        return -1


def measure_candidates(template: Template, target: TargetInfo, configs: Sequence[Config],
                       registers: Sequence[float] | None = None) -> list[TileCandidate]:
    """The hardware-model quantities of each config (registers estimated unless given)."""
    if not configs:
        return []
    hw = HardwareModel.from_target(target)
    m, n, k = (int(template.params[d]) for d in ("m", "n", "k"))
    col = {name: np.array([c[name] for c in configs], dtype=np.float64)
           for name in TILE_KNOBS + ("use_shared", "pad", "vec", "double_buffer")}
    threads = col["wg_x"] * col["wg_y"]
    bm, bn = col["wg_y"] * col["task_y"], col["wg_x"] * col["task_x"]
    stages = np.where(col["double_buffer"] > 0, 2.0, 1.0)
    padv = np.where(col["pad"] > 0, col["vec"], 0.0)
    shared = np.where(col["use_shared"] > 0,
                      4.0 * stages * (bm * (col["k_step"] + padv) + col["k_step"] * (bn + padv)), 0.0)
    regs = np.asarray(registers, dtype=np.float64) if registers is not None else estimate_registers(col)
    resident = hw.blocks_per_sm(threads, regs, shared)
    if hw.registers_per_sm:
        r = np.ceil(regs / 8.0) * 8.0
        by_regs = np.minimum(np.floor(hw.registers_per_sm / (r * threads)), hw.max_threads_per_sm // threads) * threads
    else:
        by_regs = np.full(len(configs), float(hw.max_threads_per_sm))
    blocks = ceil_div(m, bm) * ceil_div(n, bn)
    w = waves(blocks, resident, hw.sm_count)
    mp, np_, kp = ceil_div(m, bm) * bm, ceil_div(n, bn) * bn, ceil_div(k, col["k_step"]) * col["k_step"]
    traffic = 4.0 * (ceil_div(n, bn) * mp * kp + ceil_div(m, bm) * np_ * kp + m * n)
    intensity = 2.0 * m * n * k / traffic
    return [
        TileCandidate(cfg, int(cfg["wg_y"]), int(cfg["wg_x"]), int(bm[i]), int(bn[i]), int(cfg["k_step"]),
                      float(regs[i]), float(shared[i]), float(by_regs[i]),
                      float(resident[i] * threads[i] / hw.max_threads_per_sm), int(blocks[i]), float(w[i]),
                      float(intensity[i]), 1, policy_mismatch(cfg, hw))
        for i, cfg in enumerate(configs)
    ]


def select_tile(template: Template, target: TargetInfo, candidates: Iterable[Config] | None = None,
                rules: AnalyticRules | None = None) -> AnalyticResult:
    """The tile selection over ``candidates`` (default: every tile of the template's knobs)."""
    if template.name != "gemm":
        raise TvmExtError(f"analytic tile selection supports the gemm template, not {template.name!r}")
    rules = rules or AnalyticRules()
    hw = HardwareModel.from_target(target)
    configs = list(candidates) if candidates is not None else default_candidates(template, target)
    space = template.space(target)
    configs = [c for c in configs if space.is_feasible(c)]
    if not configs:
        raise TvmExtError("no feasible GEMM tile for this device")
    cands = measure_candidates(template, target, configs)
    steps: list[tuple[str, int]] = [("1. tiles and thread splits (feasible)", len(cands))]
    dropped_at: dict[int, int] = {}  # candidate -> the step that dropped it

    def keep(name: str, pool: list[TileCandidate], ok: Sequence[bool]) -> list[TileCandidate]:
        kept = [c for c, good in zip(pool, ok) if good]
        steps.append((name if kept else f"{name} (none pass: kept all)", len(kept or pool)))
        if kept:
            for c, good in zip(pool, ok):
                if not good:
                    dropped_at[id(c)] = len(steps)
        return kept or pool

    lo = max(rules.min_threads_per_dim, hw.mma_min_m if rules.use_matrix_unit else 0)
    lo_n = max(rules.min_threads_per_dim, hw.mma_min_n if rules.use_matrix_unit else 0)
    hi = max(1, hw.max_threads_per_block // rules.max_threads_divisor)
    pool = keep(f"2a. {lo} <= threads per direction <= {hi}", cands,
                [lo <= c.threads_m <= hi and lo_n <= c.threads_n <= hi for c in cands])
    need = rules.min_resident_share * hw.max_threads_per_sm
    pool = keep(f"2b. register-limited resident threads >= {need:.0f}", pool,
                [c.resident_threads_by_registers >= need for c in pool])
    pool = keep(f"3. blocks >= {hw.sm_count} SMs (all cores busy)", pool,
                [c.blocks >= hw.sm_count and math.isfinite(c.waves) for c in pool])
    best = max(c.intensity for c in pool)
    pool = keep("4. largest compute-to-memory ratio", pool, [c.intensity >= best * (1 - 1e-9) for c in pool])
    fewest = min(c.launches for c in pool)
    pool = keep("5. fewest kernel launches", pool, [c.launches == fewest for c in pool])
    order = sorted(pool, key=lambda c: (c.policy_mismatch, *_rank_key(c)[1:]))
    chosen = {id(c) for c in order}
    rest = sorted((c for c in cands if id(c) not in chosen), key=lambda c: (-dropped_at[id(c)], *_rank_key(c)))
    return AnalyticResult(hw, tuple(order + rest), tuple(steps))


def _rank_key(c: TileCandidate) -> tuple:
    """Order of the configs the filters dropped (extra seeds): those that passed more steps
    first, then by the later steps' criteria."""
    return (-round(c.intensity, 9), c.policy_mismatch,
            math.ceil(c.waves - 1e-9) if math.isfinite(c.waves) else 1 << 30,
            -c.occupancy, -c.k_step, str(c.config))


def analytic_seeds(template: Template, target: TargetInfo, count: int = 4,
                   candidates: Iterable[Config] | None = None) -> list[Config]:
    """The pick and the next distinct tiles (GA seeds); [] for templates the tile selection does not cover."""
    if template.name != "gemm" or count <= 0:
        return []
    result = select_tile(template, target, candidates)
    seen, out = set(), []
    for c in result.ranked:
        tile = (c.block_m, c.block_n, c.threads_m, c.threads_n)
        if tile not in seen:
            seen.add(tile)
            out.append(c.config)
        if len(out) == count:
            break
    return out
