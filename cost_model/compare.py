"""Run every search strategy on a recorded sweep through the real Tuner (no hardware).

Used by ``benchmarks/search_efficiency.py`` and the tests, so what CI checks is what the
benchmark reports.  Each run is a ``tvm_ext.core.session.Session`` with the replay's builder,
runner and an in-memory record store, so the strategies are the CLI's own (the registry's
factories, with the seeds every tuning run gets: the default config, then the analytic
picks):

- ``random``: uniform random feasible configs;
- ``ga``: the parallel GA (offspring moved to the nearest recorded config, see
  :class:`~tvm_ext.cost_model.replay.NearestRecorded`);
- ``ga+xgb``: the GA with the XGBoost predictor stage (breed ng, measure nm);
- ``ga+s6``: the same predictor-stage GA with the model switched off (ablation: what
  the model adds over measuring nm offspring per generation);
- ``analytic``: the analytic tile's pick among the recorded configs; zero trials.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tvm_ext.core.records import Record
from tvm_ext.core.session import STRATEGIES as SESSION_STRATEGIES
from tvm_ext.core.session import Session, SessionOptions, analytic_pick
from tvm_ext.core.tuner import Tuner

from .model import ModelSettings
from .replay import MemoryRecordStore, NearestRecorded, ReplayBuilder, ReplayRunner, ReplayTemplate, Sweep
from .search import ModelGuidedSearch

STRATEGIES = tuple(SESSION_STRATEGIES)  # the session's registry: what the CLI runs is what is replayed


@dataclass(frozen=True)
class SearchSettings:
    """Hyper-parameters shared by the GA variants (one setting for every sweep)."""

    population: int = 12  # GA population; n0 of the predictor stage (the CLI's defaults)
    ng: int = 96  # offspring bred per generation for the model to rank (16 × nm)
    nm: int = 6  # offspring measured per generation (population / 2)
    explore: float = 0.2  # share of nm drawn at random among the unpicked offspring
    mutation: float = 0.1
    tourn_size: int = 2
    analytic_seeds: int = 4
    model: ModelSettings = ModelSettings()
    ptxas_cache: str = ""  # a PtxasCache file: ptxas registers/spills as model features


@dataclass(frozen=True)
class ReplayRun:
    """One strategy's run on one sweep: every trial's cost, in measuring order."""

    strategy: str
    seed: int
    costs: tuple[float, ...]
    best_cost: float  # the sweep's best
    rank_correlations: tuple[float, ...] = ()

    def trials_to(self, fraction: float = 0.95) -> int | None:
        """Trials until the best so far reaches ``fraction`` of the best recorded speed
        (0 for a strategy that measures nothing and already is there); None if never."""
        if self.strategy == "analytic":
            return 0 if self.best_fraction >= fraction else None
        speed = self.best_cost / np.minimum.accumulate(np.array(self.costs, dtype=np.float64))
        hit = np.flatnonzero(speed >= fraction - 1e-12)
        return int(hit[0]) + 1 if hit.size else None

    @property
    def best_fraction(self) -> float:
        """Speed of the best config found, as a fraction of the best recorded."""
        best = min(self.costs, default=math.inf)
        return self.best_cost / best if math.isfinite(best) else 0.0


def replay_run(sweep: Sweep, strategy: str, seed: int, budget: int | None = None,
               settings: SearchSettings | None = None, transfer: Sequence[Record] = (),
               stop_at: float | None = None) -> ReplayRun:
    """Tune the sweep's workload with ``strategy`` under a trial budget (default: all of it),
    stopping early once the best so far reaches ``stop_at`` of the best recorded speed."""
    s = settings or SearchSettings()
    template, target = ReplayTemplate(sweep.template(), sweep), sweep.target()
    budget = budget or len(sweep.entries)
    recorded = [e.config for e in sweep.entries]
    options = SessionOptions(  # an unknown strategy: TvmExtError naming the allowed ones
        strategy=strategy, seed=seed, population=s.population, generations=50 * budget,  # the budget stops a run
        tourn_size=s.tourn_size, mutation=s.mutation, trials=budget, analytic_seeds=s.analytic_seeds,
        ng=s.ng, nm=s.nm, explore=s.explore, ptxas_cache=s.ptxas_cache, model_file=False)
    session = Session(options, target=target, builder=ReplayBuilder(sweep), runner=ReplayRunner(sweep),
                      store=MemoryRecordStore(transfer))
    if strategy == "analytic":
        pick, _ = analytic_pick(template, target, recorded)
        return ReplayRun(strategy, seed, (sweep.cost(pick),), sweep.best_cost)
    costs: list[float] = []

    def on_record(rec: Record, tuner: Tuner) -> None:
        costs.append(rec.cost)
        if stop_at is not None and sweep.best_cost >= stop_at * rec.cost:
            tuner.trials_budget = tuner.trials  # the goal is reached: measure nothing more

    tuner = session.tuner(template, on_record)
    search = session.strategy(tuner, candidates=recorded, repair=NearestRecorded, feasible_only=True)
    session.search(tuner, search)
    rho = tuple(search.rank_correlations) if isinstance(search, ModelGuidedSearch) else ()
    return ReplayRun(strategy, seed, tuple(costs), sweep.best_cost, rho)
