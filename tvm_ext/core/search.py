"""Search strategies over a space's index encoding: the parallel GA (method 000) and random.

A strategy only sees index vectors and costs (seconds, +inf for infeasible or
failed).  ``propose`` returns the next batch as one (batch, genes) array and
``observe`` takes the batch's costs: every GA operator works on the whole
population array at once, which is what makes the GA "parallel", and the driver
builds a whole batch in parallel.
"""
from __future__ import annotations

import copy
import math

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from .space import Space


class SearchStrategy(Protocol):
    """``propose`` a batch, ``observe`` its costs, until ``done``.  A strategy may also have
    ``peek(indices, costs)``: the batch ``propose`` would return after ``observe(indices,
    costs)`` (``None`` if it would be done), the strategy itself unchanged; the tuner builds
    that batch while the tail of this one measures (``peek_by_copy``)."""

    def propose(self) -> np.ndarray: ...

    def observe(self, indices: np.ndarray, costs: np.ndarray) -> None: ...

    @property
    def done(self) -> bool: ...


def peek_by_copy(strategy: Any, indices: np.ndarray, costs: np.ndarray) -> np.ndarray | None:
    """``peek`` for a strategy whose state is its fields, arrays it replaces (never writes
    into), its ``history`` list and its ``rng``: its class's ``observe`` and ``propose`` on a
    copy (the class's: a method wrapped on the instance would reach the original)."""
    cls = type(strategy)
    twin = copy.copy(strategy)
    twin.rng = copy.deepcopy(strategy.rng)
    twin.history = list(strategy.history)
    cls.observe(twin, indices, costs)
    return None if twin.done else cls.propose(twin)


# ---- GA operators: pure functions on whole populations ---------------------------------

def two_point_crossover(parents: np.ndarray, rng: np.random.Generator, rate: float = 1.0) -> np.ndarray:
    """Pair the parents at random; each pair swaps the genes between two cut points.

    Genes outside [cut1, cut2) stay with their parent.  A pair crosses with
    probability ``rate``; otherwise the children are copies.
    """
    pop, genes = parents.shape
    order = rng.permutation(pop)
    children = parents[order].copy()
    n_pairs = pop // 2
    if n_pairs == 0 or genes < 2:
        return children
    first, second = children[0 : 2 * n_pairs : 2], children[1 : 2 * n_pairs : 2]
    cuts = np.sort(rng.integers(0, genes + 1, size=(n_pairs, 2)), axis=1)
    pos = np.arange(genes)
    swap = (pos >= cuts[:, :1]) & (pos < cuts[:, 1:]) & (rng.random((n_pairs, 1)) < rate)
    new_first = np.where(swap, second, first)
    new_second = np.where(swap, first, second)
    children[0 : 2 * n_pairs : 2], children[1 : 2 * n_pairs : 2] = new_first, new_second
    return children


def mutate(population: np.ndarray, cardinalities: np.ndarray, rng: np.random.Generator,
           rate: float) -> np.ndarray:
    """Each gene is redrawn uniformly from its knob's choices with probability ``rate``."""
    mask = rng.random(population.shape) < rate
    fresh = rng.integers(0, cardinalities, size=population.shape)
    return np.where(mask, fresh, population)


def default_tourn_size(population: int) -> int:
    """2, or less where the tournament rule (tourn_size < population/2 from 4 up) needs it,
    so any population of at least 2 has a valid default."""
    return 2 if population < 4 else min(2, math.ceil(population / 2) - 1)


def tourn_size_reason(population: int, tourn_size: int) -> str | None:
    """``None`` when tournaments of ``tourn_size`` suit ``population``, else why not."""
    if tourn_size < 1:
        return f"must be >= 1, got {tourn_size}"
    if population >= 4 and tourn_size >= population / 2:
        return f"must be < population/2 ({population / 2:g}), got {tourn_size}"
    return None


def tournament_select(candidates: np.ndarray, costs: np.ndarray, size_pop: int, tourn_size: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw tourn_size·size_pop individuals, split into size_pop groups, keep each group's fastest."""
    drawn = tourn_size * size_pop
    picks = rng.choice(len(candidates), size=drawn, replace=drawn > len(candidates))
    groups = picks.reshape(size_pop, tourn_size)
    winners = groups[np.arange(size_pop), np.argmin(costs[groups], axis=1)]
    return candidates[winners], costs[winners]


@dataclass
class GeneticSearch:
    """The parallel GA: two-point crossover → mutation → back up offspring → tournament selection.

    Offspring are evaluated, then selection draws from parents ∪ offspring (the
    backup), so a good parent survives unless beaten.  ``history`` keeps each
    generation's fastest; the overall best is the minimum over it.
    """

    space: Space
    rng: np.random.Generator
    size_pop: int = 16
    generations: int = 8
    tourn_size: int | None = None  # None: default_tourn_size(size_pop)
    mutation_rate: float = 0.1
    crossover_rate: float = 0.9
    seeds: Sequence[np.ndarray] = ()
    # Optional map of offspring onto configs that can be measured (the replay of a
    # recorded sweep maps each child to its nearest recorded config); None: as bred.
    repair: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None
    population: np.ndarray | None = field(default=None, init=False)
    fitness: np.ndarray | None = field(default=None, init=False)
    generation: int = field(default=0, init=False)
    history: list[float] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.size_pop < 2:
            raise ValueError("population size must be at least 2")
        if self.tourn_size is None:
            self.tourn_size = default_tourn_size(self.size_pop)
        reason = tourn_size_reason(self.size_pop, self.tourn_size)
        if reason:
            raise ValueError(f"tourn_size {reason}")

    @property
    def done(self) -> bool:
        return self.generation > self.generations

    def propose(self) -> np.ndarray:
        if self.population is None:
            # Initial population: the seeds (default config, analytic picks), then
            # random *feasible* individuals so no slot starts at +inf.
            genes = len(self.space.knobs)
            seeds = np.array(list(self.seeds)[: self.size_pop], dtype=np.int64).reshape(-1, genes)
            rest = self.space.random_feasible_indices(self.rng, self.size_pop - len(seeds))
            missing = self.size_pop - len(seeds) - len(rest)
            filler = self.space.random_indices(self.rng, missing)  # tiny spaces only
            return np.concatenate([seeds, rest, filler])
        children = two_point_crossover(self.population, self.rng, self.crossover_rate)
        children = mutate(children, self.space.cardinalities, self.rng, self.mutation_rate)
        return children if self.repair is None else self.repair(children, self.rng)

    def observe(self, indices: np.ndarray, costs: np.ndarray) -> None:
        costs = np.asarray(costs, dtype=np.float64)
        if self.population is None:  # generation 0: the initial population
            self.population, self.fitness = indices.copy(), costs
        else:
            union = np.concatenate([self.population, indices])
            union_costs = np.concatenate([self.fitness, costs])
            self.population, self.fitness = tournament_select(
                union, union_costs, self.size_pop, self.tourn_size, self.rng)
        self.history.append(float(np.min(costs)))
        self.generation += 1

    def peek(self, indices: np.ndarray, costs: np.ndarray) -> np.ndarray | None:
        return peek_by_copy(self, indices, costs)


@dataclass
class RandomSearch:
    """Uniform random index vectors, batch by batch: the baseline the GA must beat.

    ``feasible_only`` draws distinct feasible configs per batch: the same sequence of
    measured configs in distribution (infeasible draws cost no trial), far fewer draws
    when the feasible set is a sliver of the space (a replayed sweep).
    """

    space: Space
    rng: np.random.Generator
    batch: int = 16
    generations: int = 8
    feasible_only: bool = False
    generation: int = field(default=0, init=False)
    history: list[float] = field(default_factory=list, init=False)

    @property
    def done(self) -> bool:
        return self.generation > self.generations

    def propose(self) -> np.ndarray:
        if self.feasible_only:
            return self.space.random_feasible_indices(self.rng, self.batch)
        return self.space.random_indices(self.rng, self.batch)

    def observe(self, indices: np.ndarray, costs: np.ndarray) -> None:
        self.history.append(float(np.min(costs)) if len(costs) else float("inf"))
        self.generation += 1

    def peek(self, indices: np.ndarray, costs: np.ndarray) -> np.ndarray | None:
        return peek_by_copy(self, indices, costs)
