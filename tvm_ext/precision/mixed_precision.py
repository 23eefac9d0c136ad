"""Method 003: mixed-precision search under an error bound.

``PrecisionProgram`` turns an operator that has precision parameters (GEMM, GRU)
into a template whose knobs *are* those parameters, at one fixed schedule config.
The tuning core then gives the search what it gives every search: feasibility,
parallel builds, isolated runs, dedup by config and by generated source, records
appended as they are made (with the measured error in ``metrics``), and resume.

``MixedPrecisionSearch`` is the method's S3–S6 loop as it is published:

- S3  measure the all-float32 program; keep at most ``nf`` stages, the slowest;
      parameters of the other stages stay float32.
- S4  the current and the history-best population are the same ``n0`` configs.
- S5  ``ng`` new configs: each parameter is a random dtype with probability
      ``u0``, else copied from a current parent or a history-best parent
      ((1 − u0)/2 each).  Beyond the method: a child that stores an operand in
      8 bits is completed to the operator's 8-bit program (``completed``).  Assignments a
      written kernel takes (Hopper's wgmma: 16-bit pairs, 8-bit pairs) run on it
      (``kernels``).
- S6  the predictor keeps ``nm`` of them (``explore`` of those at random), they
      are measured (time and error against a float64 reference on fixed random
      inputs), the best ``n0`` become the current population and are merged into
      the history-best (top ``n0``).  Stop when the current population did not
      change or ``m`` measurements were made.

A config whose error exceeds ``eb`` is never chosen; S7 (code generation) is
``tvm_ext.precision.codegen``.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from ..core.errors import TvmExtError
from ..measure.program import RunPlan
from .precision import EIGHT_BIT_DTYPES, HIGH_PRECISION, MixedPrecisionOperator, PrecisionParam, precision_reason
from ..measure.program import Artifact, CompiledProgram
from ..core.space import Config, Knob, Space
from ..target import TargetInfo
from ..core.template import Template, TensorSpec, modules_hash


class KernelProgram(Protocol):
    """An operator's program on a written kernel of its own (``schedules.gemm.gemm_programs``):
    the assignments it ``takes`` are lowered to it; ``EXTRA_DTYPES`` are types only it stores,
    offered to its ``OPERANDS``; ``NOTE`` says what it runs, for the search's log."""

    OPERANDS: tuple[str, ...]
    EXTRA_DTYPES: tuple[str, ...]
    NOTE: str

    @classmethod
    def takes(cls, assignment: Mapping[str, str]) -> bool: ...

    @classmethod
    def of(cls, operator: Any, assignment: Mapping[str, str]) -> Template: ...

    @classmethod
    def completed(cls, assignment: Mapping[str, str], choices: Mapping[str, tuple[str, ...]]) -> dict[str, str]: ...

    @staticmethod
    def target_reason(target: TargetInfo) -> str | None: ...


@dataclass(frozen=True)
class PrecisionProgram(Template):
    """An operator at a fixed schedule; its knobs are its precision parameters."""

    base: Any  # a Template that is a MixedPrecisionOperator
    schedule_config: Config
    # The method's "high and low precision types": float32 first (the program as users
    # run it), then the low types; empty = float32, the target's 16-bit types and the
    # types only ``kernels`` store, where they run.
    dtypes: tuple[str, ...] = ()
    # the operator's programs on written kernels, first taker first: one that takes types
    # every target has (16-bit pairs) only where its target runs it; one that takes only its
    # own types (8-bit) anywhere, those types offered only where it runs (the CLI gives them,
    # from the operator registry)
    kernels: tuple[type[KernelProgram], ...] = ()
    name = "mixed_precision"

    def __post_init__(self) -> None:
        if not isinstance(self.base, MixedPrecisionOperator):
            raise TvmExtError(f"{self.base.name} has no precision parameters")

    # ---- what the search varies -------------------------------------------------------
    def precision_params(self) -> tuple[PrecisionParam, ...]:
        return tuple(self.base.precision_params())

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.stage for p in self.precision_params()))

    def lowered(self, config: Config) -> Any:
        """The operator with the precision ``config`` assigns: the first of ``kernels`` that
        takes it, else the operator itself."""
        assignment = config.as_dict()
        floats = {k: v for k, v in assignment.items() if v not in EIGHT_BIT_DTYPES}
        for kernel in self.kernels:
            if kernel.takes(assignment):
                return kernel.of(self.base.with_precision(floats), assignment)
        if len(floats) < len(assignment):
            raise TvmExtError(f"{self.base.name} has no program storing 8-bit operands")
        return self.base.with_precision(assignment)

    def completed(self, config: Config, space: Space) -> Config:
        """``config`` as a kernel program runs it where it is nearly one (the 8-bit program
        needs several types at once, which S5's children rarely all draw); else as it is."""
        assignment, choices = config.as_dict(), {k.name: k.choices for k in space.knobs}
        for kernel in self.kernels:
            assignment = kernel.completed(assignment, choices)
        return config if assignment == config.as_dict() else space.make(**assignment)

    def _kernels_on(self, target: TargetInfo) -> tuple[type[KernelProgram], ...]:
        return tuple(k for k in self.kernels if k.target_reason(target) is None)

    def _extra_reason(self, dtype: str, target: TargetInfo) -> str:
        """Why no kernel program stores ``dtype`` on ``target``."""
        owners = [k for k in self.kernels if dtype in k.EXTRA_DTYPES]
        return owners[0].target_reason(target) if owners else f"{self.base.name} has no program storing it"

    def search_dtypes(self, target: TargetInfo) -> tuple[str, ...]:
        """Every type of the search: float32 first, then the low ones."""
        extra = tuple(dict.fromkeys(d for k in self._kernels_on(target) for d in k.EXTRA_DTYPES))
        if not self.dtypes:
            return (HIGH_PRECISION,) + tuple(d for d in ("float16", "bfloat16") if d in target.float_dtypes) + extra
        for d in self.dtypes:
            if d in EIGHT_BIT_DTYPES and d not in extra:
                raise TvmExtError(f"{d}: {self._extra_reason(d, target)}")
            if d not in target.float_dtypes + extra:
                raise TvmExtError(f"{d} not supported on {target.device_name}; "
                                  f"allowed: {', '.join(target.float_dtypes + extra)}")
        return (HIGH_PRECISION,) + tuple(d for d in self.dtypes if d != HIGH_PRECISION)

    def param_dtypes(self, param: PrecisionParam, target: TargetInfo) -> tuple[str, ...]:
        """``param``'s choices: the search's types, those only a kernel program stores only
        for that program's operands."""
        extra = {d for k in self.kernels if param.name in k.OPERANDS for d in k.EXTRA_DTYPES}
        return tuple(d for d in self.search_dtypes(target) if d not in EIGHT_BIT_DTYPES or d in extra)

    def space(self, target: TargetInfo) -> Space:
        knobs = tuple(Knob(p.name, self.param_dtypes(p, target), f"{p.kind} of stage {p.stage}: {p.doc}")
                      for p in self.precision_params())

        params = self.precision_params()

        def honoured(c: Config) -> str | None:
            # A type the target would silently replace (bfloat16 math on OpenCL) is not a choice.
            return precision_reason(params, c.as_dict(), target.kind)

        def schedule_fits(c: Config) -> str | None:
            # Narrower types change e.g. shared-memory bytes; the schedule must still fit.
            return self.lowered(c).space(target).infeasible_reason(self.schedule_config)

        return Space(knobs, (honoured, schedule_fits))

    def default_config(self, target: TargetInfo) -> Config:
        return self.space(target).make(**{p.name: HIGH_PRECISION for p in self.precision_params()})

    def tensor_core_note(self, target: TargetInfo) -> str:
        """Which operand types of this search run on the tensor cores, per GEMM that has a tile
        (mma.sync takes float16 or bfloat16 pairs, WMMA float16 ones; other pairs, or a shape or
        target the tile refuses, stay on the CUDA cores), after what the kernel programs take
        first: one line for the search's log."""
        gemms = self.base.tensor_core_gemms()
        kernels = "".join(f"{k.NOTE}; otherwise " for k in self._kernels_on(target))
        if not gemms:
            return f"tensor cores: {kernels}no tile, every GEMM on the CUDA cores"
        dtypes = [d for d in self.search_dtypes(target) if d not in EIGHT_BIT_DTYPES]
        parts = []
        for use in gemms:
            tile, (a, b) = use.gemm.tensor_core, use.operands
            reasons = {d: use.gemm.with_precision({"a": d, "b": d}).tensor_core_reason(target)
                       for d in dtypes if d in tile.operand_dtypes}
            taken = [d for d, reason in reasons.items() if reason is None]
            if taken:
                parts.append(f"{use.label} on {tile.label()} where {a} and {b} are both {' or both '.join(taken)}")
                continue
            why = next(iter(reasons.values()), None) or (
                f"it takes {' or '.join(tile.operand_dtypes)} operands, none of this search's types")
            parts.append(f"{use.label} on the CUDA cores ({tile.label()}: {why})")
        return f"tensor cores: {kernels}" + "; ".join(parts)

    # ---- the workload ---------------------------------------------------------------------
    @property
    def params(self) -> dict[str, Any]:
        full = self.base.full_precision()
        # The allowed dtypes are not part of it: a config measures the same under any list.
        return {"operator": full.name, **full.params, "schedule": tuple(sorted(self.schedule_config.items))}

    @cached_property
    def source_hash(self) -> str:
        own = super().source_hash + self.base.source_hash
        for kernel in self.kernels:  # their kernels are measured too
            own += modules_hash(kernel.__module__)
        return hashlib.sha256(own.encode()).hexdigest()[:16]

    def describe(self) -> str:
        return f"mixed-precision {self.base.full_precision().describe()}"  # float32 dtypes not shown

    # ---- tensors: the full-precision operator's (each lowered program has its own) -------
    def inputs(self) -> list[TensorSpec]:
        return self.base.full_precision().inputs()

    def outputs(self) -> list[TensorSpec]:
        return self.base.full_precision().outputs()

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return self.base.full_precision().reference(inputs)

    def flops(self) -> float:
        return self.base.flops()

    def bytes_moved(self) -> float:
        return self.base.full_precision().bytes_moved()

    # ---- build and measure: the lowered operator's own path ------------------------------
    def schedule(self, config: Config, target: TargetInfo) -> Any:
        return self.lowered(config).schedule(self.schedule_config, target)

    def build_program(self, config: Config, target: TargetInfo) -> CompiledProgram:
        return self.lowered(config).build_program(self.schedule_config, target)

    def measured_operator(self, config: Config) -> Template:
        """The lowered operator: its make_case rounds the fixed full-precision inputs, and its
        reference is float64 of the unrounded ones."""
        return self.lowered(config).measured_operator(self.schedule_config)

    def run_plan(self, config: Config, artifact: Artifact) -> RunPlan:
        """The lowered operator's plan; an operator of one stage counts all of it toward that stage."""
        plan = self.lowered(config).run_plan(self.schedule_config, artifact)
        if plan.stages or len(self.stages) != 1:
            return plan
        steps = artifact.calls if artifact.kind == "cuda" else artifact.launches
        return replace(plan, stages=((self.stages[0],),) * (len(steps) - plan.prepare_steps))


def breed_precisions(current: np.ndarray, history: np.ndarray, cardinalities: np.ndarray, free: np.ndarray,
                     fixed: np.ndarray, count: int, u0: float, rng: np.random.Generator) -> np.ndarray:
    """S5 on index vectors, all children at once: each free parameter is a random choice
    with probability u0, else the gene of a random current parent or of a random
    history-best parent, (1 - u0)/2 each; parameters of dropped stages keep ``fixed``."""
    genes = len(cardinalities)
    draw = rng.random((count, genes))
    random_pick = rng.integers(0, cardinalities, size=(count, genes))
    from_current = current[rng.integers(0, len(current), size=count)]
    from_history = history[rng.integers(0, len(history), size=count)]
    child = np.where(draw < u0, random_pick, np.where(draw < u0 + (1 - u0) / 2, from_current, from_history))
    return np.where(free, child, fixed)


class Predictor(Protocol):
    """S6's predictor: learns from measured configs, scores new ones (higher = better)."""

    def fit(self, configs: Sequence[Config], costs: Sequence[float], errors: Sequence[float]) -> bool: ...

    def score(self, configs: Sequence[Config]) -> np.ndarray: ...


@dataclass(frozen=True)
class MixedPrecisionSettings:
    """The search's parameters; each comment gives the name the published method uses."""

    error_bound: float = 1e-3  # eb
    max_measurements: int = 40  # m
    max_stages: int = 3  # nf
    population: int = 4  # n0
    generated: int = 32  # ng
    measured: int = 4  # nm
    mutation: float = 0.3  # u0
    explore: float = 0.25  # share of nm drawn at random instead of by the predictor
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.error_bound > 0:
            raise TvmExtError(f"error bound must be > 0, got {self.error_bound}")
        for name in ("max_measurements", "max_stages", "population", "generated", "measured"):
            if getattr(self, name) < 1:
                raise TvmExtError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.generated < self.measured:
            raise TvmExtError("ng must be >= nm (the predictor keeps nm of ng)")
        for name in ("mutation", "explore"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise TvmExtError(f"{name} must be in [0, 1], got {getattr(self, name)}")


@dataclass
class MixedPrecisionResult:
    best: Any  # Record of the chosen config (error within the bound), or None
    baseline: Any  # Record of the all-float32 program
    kept_stages: tuple[str, ...]
    stage_secs: dict[str, float]
    measured: int  # configs evaluated along the search (m counts these)
    new_measurements: int  # of which measured in this run (the rest came from the records)
    generations: int
    stop_reason: str
    log: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        if self.best is None or self.baseline is None or not self.baseline.ok:
            return math.nan
        return self.baseline.cost / self.best.cost

    @property
    def error(self) -> float:
        return error_of(self.best) if self.best is not None else math.nan


def error_of(record: Any) -> float:
    """The measured error of a record (+inf when it failed or has none)."""
    if record is None or not record.ok:
        return math.inf
    return float(record.metrics.get("rel_error", math.inf))


class MixedPrecisionSearch:
    """The S3–S6 loop over a ``Tuner`` of a ``PrecisionProgram``."""

    def __init__(self, tuner: Any, settings: MixedPrecisionSettings, predictor: Predictor | None = None,
                 log: Callable[[str], None] | None = None):
        self.tuner = tuner
        self.program: PrecisionProgram = tuner.template
        self.space: Space = tuner.space
        self.settings = settings
        self.predictor = predictor
        self.rng = np.random.default_rng(settings.seed)
        self._log = log
        self.lines: list[str] = []
        self.evaluated: list[Config] = []  # the search's trajectory (m counts these)

    def log(self, line: str) -> None:
        self.lines.append(line)
        if self._log:
            self._log(line)

    # ---- bookkeeping ------------------------------------------------------------------------
    def _key(self, cfg: Config) -> tuple[int, float, float]:
        """Ranking: within the bound by time, then over it by error, failures last."""
        rec = self.tuner.record_of(cfg)
        if rec is None or not rec.ok:
            return (2, math.inf, math.inf)
        err = error_of(rec)
        if err <= self.settings.error_bound:
            return (0, rec.cost, err)
        return (1, err, rec.cost)

    def _measure(self, configs: Sequence[Config]) -> list[Config]:
        room = self.settings.max_measurements - len(self.evaluated)
        fresh = [c for c in dict.fromkeys(configs) if c not in self.evaluated][: max(room, 0)]
        if fresh:
            self.tuner.evaluate(fresh)
            self.evaluated.extend(fresh)
        return fresh

    def _top(self, configs: Sequence[Config], n: int) -> list[Config]:
        return sorted(dict.fromkeys(configs), key=self._key)[:n]

    # ---- S3 ------------------------------------------------------------------------------------
    def _stages(self, baseline: Config) -> tuple[tuple[str, ...], dict[str, float]]:
        rec = self.tuner.record_of(baseline)
        if rec is None or not rec.ok:
            why = rec.error_msg if rec is not None else "not measured"
            raise TvmExtError(f"the all-float32 program failed ({why}); nothing to lower")
        secs = {s: float(v) for s, v in rec.metrics.get("stage_secs", {}).items()}
        stages = self.program.stages
        if not secs:
            secs = {s: rec.cost for s in stages}
        ranked = sorted(stages, key=lambda s: -secs.get(s, 0.0))
        return tuple(ranked[: self.settings.max_stages]), secs

    # ---- S5 --------------------------------------------------------------------------------------
    def _generate(self, current: Sequence[Config], history: Sequence[Config], free: np.ndarray) -> list[Config]:
        rows = breed_precisions(np.array([self.space.encode(c) for c in current]),
                                np.array([self.space.encode(c) for c in history]),
                                self.space.cardinalities, free, self.space.encode(self.space_default),
                                self.settings.generated, self.settings.mutation, self.rng)
        return list(dict.fromkeys(self.program.completed(self.space.decode(row), self.space) for row in rows))

    @cached_property
    def space_default(self) -> Config:
        return self.program.default_config(self.tuner.target)

    # ---- S6: predictor -----------------------------------------------------------------------------
    def _select(self, candidates: list[Config]) -> tuple[list[Config], dict[Config, float]]:
        """nm of the candidates: the predictor's top ones (and ``explore`` at random);
        before the predictor has learned anything, a random nm (the plain method)."""
        s = self.settings
        feasible = [c for c in candidates if c not in self.evaluated and self.space.is_feasible(c)]
        if len(feasible) <= s.measured:
            return feasible, {}
        n_explore = int(round(s.explore * s.measured))
        scores: dict[Config, float] = {}
        if self.predictor is not None and self._fit_predictor():
            predicted = self.predictor.score(feasible)
            scores = dict(zip(feasible, map(float, predicted)))
            ranked = [feasible[i] for i in np.argsort(-predicted, kind="stable")]
        else:
            ranked = [feasible[i] for i in self.rng.permutation(len(feasible))]
            n_explore = 0
        chosen = ranked[: s.measured - n_explore]
        rest = [c for c in ranked if c not in chosen]
        if n_explore and rest:
            pick = self.rng.choice(len(rest), size=min(n_explore, len(rest)), replace=False)
            chosen += [rest[i] for i in pick]
        return chosen, scores

    def _fit_predictor(self) -> bool:
        configs = list(self.evaluated)
        recs = [self.tuner.record_of(c) for c in configs]
        costs = [r.cost if r is not None else math.inf for r in recs]
        errors = [error_of(r) for r in recs]
        return bool(self.predictor.fit(configs, costs, errors))  # type: ignore[union-attr]

    # ---- the loop --------------------------------------------------------------------------------
    def run(self) -> MixedPrecisionResult:
        s = self.settings
        trials_before = self.tuner.trials
        baseline = self.space_default
        self._measure([baseline])
        kept, secs = self._stages(baseline)
        free = np.array([p.stage in kept for p in self.program.precision_params()])
        total = sum(secs.values()) or 1.0
        self.log("S3 stage times at float32: " + ", ".join(
            f"{st} {secs.get(st, 0.0) * 1e3:.3f} ms ({100 * secs.get(st, 0.0) / total:.0f}%)"
            for st in self.program.stages) + f"; kept {', '.join(kept)}")

        # S4: n0 initial configs (the float32 program and random ones).
        initial = [baseline] + self._generate([baseline], [baseline], free)[: 4 * s.population]
        initial = list(dict.fromkeys(initial))[: s.population]
        if len(initial) < s.population:  # too few distinct configs: fill at random
            initial += self._generate(initial, initial, free)[: s.population - len(initial)]
        self._measure(initial)
        current = self._top([c for c in initial if c in self.evaluated], s.population)
        history = list(current)
        generations, reason = 0, "m measurements made"
        while len(self.evaluated) < s.max_measurements:
            generations += 1
            candidates = self._generate(current, history, free)  # S5
            chosen, scores = self._select(candidates)  # S6: the predictor keeps nm of ng
            if not chosen:
                reason = "no new configuration left to measure"
                break
            measured = self._measure(chosen)
            new_current = self._top(measured, s.population) if measured else current
            history = self._top(history + measured, s.population)
            self._log_generation(generations, measured, scores, history)
            if set(new_current) == set(current):
                current, reason = new_current, "current population did not change"
                break
            current = new_current
        # the fastest within the bound of everything measured for this program: a search at a
        # looser bound over the records of a tighter one never answers worse than it did
        known = list(dict.fromkeys([*self.evaluated, *self.tuner.known_configs()]))
        best = next((c for c in self._top(known, len(known)) if self._key(c)[0] == 0), None)
        if best is not None and best not in self.evaluated:
            self.log(f"chosen from the records of an earlier search (not on this one's path): "
                     f"{' '.join(f'{k}={v}' for k, v in best.items)}")
        return MixedPrecisionResult(
            best=self.tuner.record_of(best) if best is not None else None,
            baseline=self.tuner.record_of(baseline), kept_stages=kept, stage_secs=secs,
            measured=len(self.evaluated), new_measurements=self.tuner.trials - trials_before,
            generations=generations, stop_reason=reason, log=self.lines,
        )

    def _log_generation(self, gen: int, measured: Sequence[Config], scores: Mapping[Config, float],
                        history: Sequence[Config]) -> None:
        rec = self.tuner.record_of(history[0]) if history else None
        line = f"generation {gen}: measured {len(measured)}, {len(self.evaluated)} in all"
        if rec is not None and rec.ok:
            line += f"; history best {rec.cost * 1e3:.3f} ms at error {error_of(rec):.2e}"
        ranked = [c for c in measured if c in scores]
        if len(ranked) >= 3:
            from ..cost_model.model import spearman

            speed = [1.0 / self.tuner.record_of(c).cost for c in ranked]
            line += f"; predictor rank correlation {spearman([scores[c] for c in ranked], speed):.2f}"
        self.log(line)


def schedule_for(base: Any, target: TargetInfo, store: Any) -> tuple[Config, str]:
    """The schedule the precision search runs at: the best float32 record of the
    operator in ``store`` when there is one (a tuned kernel), else the default."""
    from ..core.template import Workload

    full = base.full_precision()
    rec = store.best(Workload.of(full, target).key) if store is not None else None
    if rec is not None:
        return full.space(target).make(**rec.config), "the best float32 record"
    return full.default_config(target), "the template's default config"
