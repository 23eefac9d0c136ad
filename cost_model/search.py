"""The GA with a predictor stage (the mixed-precision search's S6 on the GA's operators).

Each generation the GA breeds ``ng`` new feasible candidates from the history-best
population (tournament selection → two-point crossover → mutation), the cost model
ranks them, and only ``nm`` are measured: the top ``nm·(1 − explore)`` by prediction
plus ``nm·explore`` drawn at random from the rest, so the model also sees configs it
would not pick (its blind spots get data).  Until the model can predict (fewer than
``min_train`` measured records and no transfer data) the batch is simply the first
``nm`` offspring: the plain GA.  The model is retrained after every measured batch,
and the Spearman correlation between its scores and the measured speed of each batch
it ranked is kept (``rank_correlations``) and logged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from tvm_ext.core.search import mutate, two_point_crossover
from tvm_ext.core.space import Space

from .model import spearman

Repair = Callable[[np.ndarray, np.random.Generator, "set[int] | None"], np.ndarray]


def feasible_mask(space: Space, indices: np.ndarray) -> np.ndarray:
    """``is_feasible`` per index row (vectorized when the space offers it)."""
    fast = getattr(space, "feasible_mask", None)
    if fast is not None:
        return fast(indices)
    return np.array([space.is_feasible(space.decode(r)) for r in indices], dtype=bool)


def flat_index(space: Space, indices: np.ndarray) -> np.ndarray:
    return np.ravel_multi_index(np.asarray(indices, dtype=np.int64).reshape(-1, len(space.knobs)).T,
                                space.cardinalities)


@dataclass
class ModelGuidedSearch:
    """GA + cost model: breed ng, predict, measure nm (SearchStrategy protocol)."""

    space: Space
    rng: np.random.Generator
    model: Any = None  # an XGBCostModel (predict/observe/fit/ready); None = rank at random
    size_pop: int = 16  # n0: history-best population the parents come from
    ng: int = 64  # candidates bred per generation
    nm: int = 8  # candidates measured per generation
    explore: float = 0.2  # share of nm drawn at random from the unpicked candidates
    generations: int = 8
    tourn_size: int = 2
    mutation_rate: float = 0.1
    crossover_rate: float = 0.9
    seeds: Sequence[np.ndarray] = ()
    repair: Repair | None = None
    log: Callable[[str], None] | None = None
    max_breed_rounds: int = 16
    population: np.ndarray | None = field(default=None, init=False)
    fitness: np.ndarray | None = field(default=None, init=False)
    generation: int = field(default=0, init=False)
    history: list[float] = field(default_factory=list, init=False)
    rank_correlations: list[float] = field(default_factory=list, init=False)
    _seen: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _scores: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _exhausted: bool = field(default=False, init=False, repr=False)  # nothing new left to breed

    def __post_init__(self) -> None:
        if self.size_pop < 2 or self.nm < 1 or self.ng < self.nm:
            raise ValueError(f"need size_pop >= 2 and ng >= nm >= 1 (got {self.size_pop}, {self.ng}, {self.nm})")
        if not 0.0 <= self.explore <= 1.0:
            raise ValueError("explore must be a share in [0, 1]")

    @property
    def done(self) -> bool:
        return self.generation > self.generations or self._exhausted

    @property
    def ranking(self) -> bool:
        return self.model is not None and self.model.ready

    # ---- propose ------------------------------------------------------------------------------
    def propose(self) -> np.ndarray:
        if self.population is None:
            return self._initial()
        pool = self._breed(self.ng)
        self._exhausted = len(pool) == 0
        return self._select(pool, self.nm)

    def _initial(self) -> np.ndarray:
        """Seeds, then random feasible configs (ranked by the model when transfer data lets it)."""
        genes = len(self.space.knobs)
        seeds = np.array(list(self.seeds)[: self.size_pop], dtype=np.int64).reshape(-1, genes)
        want = self.size_pop - len(seeds)
        if want <= 0:
            return seeds
        taken = set(flat_index(self.space, seeds).tolist())
        count = max(self.ng, want) if self.ranking else want
        rest = self.space.random_feasible_indices(self.rng, count + len(seeds))
        rest = rest[[f not in taken for f in flat_index(self.space, rest)]] if len(rest) else rest
        return np.concatenate([seeds, self._select(rest, want)])

    def _breed(self, count: int) -> np.ndarray:
        """Up to ``count`` distinct, feasible, never-measured offspring of the population."""
        genes = len(self.space.knobs)
        found: dict[int, np.ndarray] = {}
        for _ in range(self.max_breed_rounds):
            parents = self._tournament(count)
            children = two_point_crossover(parents, self.rng, self.crossover_rate)
            children = mutate(children, self.space.cardinalities, self.rng, self.mutation_rate)
            if self.repair is not None:
                children = self.repair(children, self.rng, set(self._seen) | set(found))
            ok = feasible_mask(self.space, children)
            for row, flat, good in zip(children, flat_index(self.space, children), ok):
                flat = int(flat)
                if good and flat not in self._seen and flat not in found:
                    found[flat] = row
            if len(found) >= count:
                break
        rows = list(found.values())[:count]
        if len(rows) < min(count, self.nm):  # bred out: random feasible immigrants
            extra = self.space.random_feasible_indices(self.rng, 2 * count)
            for row, flat in zip(extra, flat_index(self.space, extra) if len(extra) else []):
                if int(flat) not in self._seen and int(flat) not in found and len(rows) < count:
                    found[int(flat)] = row
                    rows.append(row)
        return np.array(rows, dtype=np.int64).reshape(-1, genes)

    def _tournament(self, count: int) -> np.ndarray:
        assert self.population is not None and self.fitness is not None
        groups = self.rng.integers(0, len(self.population), size=(count, self.tourn_size))
        winners = groups[np.arange(count), np.argmin(self.fitness[groups], axis=1)]
        return self.population[winners]

    def _select(self, pool: np.ndarray, count: int) -> np.ndarray:
        """The measured share of a candidate pool: model's top picks plus random exploration."""
        if len(pool) <= count and not self.ranking:
            return pool
        if not self.ranking:
            return pool[:count]  # offspring are in random order: the plain GA
        configs = [self.space.decode(r) for r in pool]
        prepare = getattr(self.model, "prepare", None)
        if prepare is not None:
            prepare(configs)
        scores = np.asarray(self.model.predict(configs), dtype=np.float64)
        if len(pool) <= count:
            chosen = np.arange(len(pool))
        else:
            n_explore = int(round(count * self.explore))
            order = np.argsort(-scores, kind="stable")
            top, rest = order[: count - n_explore], order[count - n_explore:]
            chosen = np.concatenate([top, self.rng.choice(rest, size=min(n_explore, len(rest)), replace=False)])
        for flat, score in zip(flat_index(self.space, pool[chosen]), scores[chosen]):
            self._scores[int(flat)] = float(score)
        return pool[chosen]

    # ---- observe ------------------------------------------------------------------------------
    def observe(self, indices: np.ndarray, costs: np.ndarray) -> None:
        indices = np.asarray(indices, dtype=np.int64).reshape(-1, len(self.space.knobs))
        costs = np.asarray(costs, dtype=np.float64)
        flats = flat_index(self.space, indices) if len(indices) else np.zeros(0, np.int64)
        predicted, measured = [], []
        for flat, cost in zip(flats, costs):
            flat = int(flat)
            self._seen[flat] = float(cost)
            if flat in self._scores:
                predicted.append(self._scores.pop(flat))
                measured.append(1.0 / cost if math.isfinite(cost) and cost > 0 else 0.0)
        self._scores.clear()
        rho = spearman(predicted, measured) if len(predicted) >= 3 else math.nan
        if predicted:
            self.rank_correlations.append(rho)
        if self.model is not None and len(indices):
            self.model.observe([self.space.decode(r) for r in indices], costs)
            self.model.fit()
        self._update_population()
        self.history.append(float(np.min(costs)) if len(costs) else math.inf)
        if self.log is not None:
            best = min(self._seen.values(), default=math.inf)
            text = f"ρ={rho:+.2f} over {len(predicted)} ranked" if predicted else "plain GA (model not ready)"
            self.log(f"generation {self.generation}: measured {len(costs)}, best {best:.4g} s, predictor {text}")
        self.generation += 1

    def _update_population(self) -> None:
        """History-best population: the size_pop fastest configs measured so far."""
        if not self._seen:
            return
        flats = np.fromiter(self._seen, dtype=np.int64)
        costs = np.fromiter(self._seen.values(), dtype=np.float64)
        keep = np.argsort(costs, kind="stable")[: self.size_pop]
        rows = np.stack(np.unravel_index(flats[keep], tuple(self.space.cardinalities)), axis=1)
        self.population, self.fitness = rows.astype(np.int64), costs[keep]
