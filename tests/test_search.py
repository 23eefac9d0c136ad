"""GA operators of method 000 on a seeded RNG, and the driver's no-build-for-infeasible rule."""
import numpy as np
import pytest

from tvm_ext.core.search import GeneticSearch, RandomSearch, mutate, tournament_select, two_point_crossover
from tvm_ext.core.space import Knob, Space


def test_crossover_keeps_genes_outside_the_cut_points():
    rng = np.random.default_rng(7)
    genes = 9
    parents = np.stack([np.full(genes, 1), np.full(genes, 2)] * 4)  # 8 parents of two kinds
    children = two_point_crossover(parents, rng, rate=1.0)
    assert children.shape == parents.shape
    for child in children:
        # Each child is one parent with one contiguous segment from the other.
        own = child[0] if child[0] == child[-1] else None
        changed = np.flatnonzero(child != child[0]) if own is not None else np.flatnonzero(child != child[-1])
        if changed.size:
            assert np.all(np.diff(changed) == 1), f"swapped genes not contiguous: {child}"


def test_crossover_segment_comes_from_the_partner():
    rng = np.random.default_rng(3)
    a, b = np.arange(10), np.arange(10) + 100
    children = two_point_crossover(np.stack([a, b]), rng, rate=1.0)
    for child in children:
        from_a = child < 100
        # genes keep their position: value % 100 == index
        assert np.array_equal(child % 100, np.arange(10))
        transitions = np.count_nonzero(np.diff(from_a.astype(int)))
        assert transitions <= 2  # two cut points at most


def test_mutation_rate_zero_and_one():
    rng = np.random.default_rng(0)
    pop = np.zeros((50, 6), dtype=np.int64)
    card = np.array([4, 4, 4, 4, 4, 4])
    assert np.array_equal(mutate(pop, card, rng, 0.0), pop)
    mutated = mutate(pop, card, rng, 1.0)
    assert (mutated < card).all() and (mutated != 0).mean() > 0.6


def test_tournament_picks_each_groups_fastest():
    rng = np.random.default_rng(11)
    candidates = np.arange(20).reshape(20, 1)
    costs = np.linspace(2.0, 1.0, 20)  # higher index is faster
    costs[5] = np.inf
    winners, win_costs = tournament_select(candidates, costs, size_pop=8, tourn_size=3, rng=rng)
    # Replay the same draws and check every winner is its group's minimum.
    rng2 = np.random.default_rng(11)
    groups = rng2.choice(20, size=24, replace=True).reshape(8, 3)
    expected = groups[np.arange(8), np.argmin(costs[groups], axis=1)]
    assert np.array_equal(winners[:, 0], expected)
    assert np.all(win_costs == costs[expected])


def test_ga_is_reproducible_and_improves_on_a_known_landscape():
    space = Space(tuple(Knob(f"g{i}", tuple(range(8))) for i in range(6)))
    target = np.array([3, 5, 1, 7, 0, 2])

    def cost(pop):
        return np.abs(pop - target).sum(axis=1).astype(float) + 1.0

    def run(seed):
        ga = GeneticSearch(space, np.random.default_rng(seed), size_pop=20, generations=25,
                           tourn_size=3, mutation_rate=0.15)
        while not ga.done:
            batch = ga.propose()
            ga.observe(batch, cost(batch))
        return ga.history

    h1, h2 = run(5), run(5)
    assert h1 == h2  # same seed, same search
    assert min(h1) < h1[0]
    assert min(h1) <= 3.0
    rand = RandomSearch(space, np.random.default_rng(5), batch=20, generations=25)
    while not rand.done:
        batch = rand.propose()
        rand.observe(batch, cost(batch))
    assert min(h1) <= min(rand.history)


def test_tournament_size_must_be_below_half_the_population():
    space = Space((Knob("a", (1, 2)),))
    with pytest.raises(ValueError, match="tourn_size"):
        GeneticSearch(space, np.random.default_rng(0), size_pop=8, tourn_size=4)


# ---- properties that pin method 000, tested through GeneticSearch itself ---------------------
# Each drives ``propose`` / ``observe`` with a population set by ``observe`` (generation 0),
# so a change to the operators or to how the GA wires them breaks at least one test.

def _ga(cardinalities, size_pop, rate_mutation, rate_crossover, seed=0, tourn_size=2):
    space = Space(tuple(Knob(f"g{i}", tuple(range(c))) for i, c in enumerate(cardinalities)))
    return GeneticSearch(space, np.random.default_rng(seed), size_pop=size_pop, generations=50,
                         tourn_size=tourn_size, mutation_rate=rate_mutation, crossover_rate=rate_crossover)


def _distinct_parents(pop, genes):
    """Parent p holds value p·genes + j at gene j: every gene names its parent and position."""
    return np.arange(pop)[:, None] * genes + np.arange(genes)[None, :]


def _children_of(parents):
    genes = parents.shape[1]
    ga = _ga([parents.size] * genes, len(parents), 0.0, 1.0, seed=3)
    ga.observe(parents, np.ones(len(parents)))
    return ga.propose(), ga


def test_children_are_two_point_mixes_of_a_pair_of_parents():
    """No mutation, crossover rate 1: the children come in pairs; each child is one parent
    with one contiguous segment (between two cut points) taken from the other, and its
    sibling is the complement.  Every parent is used exactly once."""
    pop, genes = 40, 10
    parents = _distinct_parents(pop, genes)
    children, _ = _children_of(parents)
    owner, position = children // genes, children % genes
    assert np.array_equal(position, np.broadcast_to(np.arange(genes), children.shape))  # genes keep their place
    used = []
    interior = 0
    for first, second in zip(owner[0::2], owner[1::2]):
        pair = set(first) | set(second)
        assert len(pair) <= 2 and np.all(first != second), (first, second)  # complements of one pair
        a = first[0]
        used += sorted(pair) if len(pair) == 2 else [a, second[0]]
        from_b = np.flatnonzero(first != a)
        if from_b.size:
            assert np.all(np.diff(from_b) == 1), first  # one contiguous segment from the partner
            interior += from_b[-1] < genes - 1  # the segment ends before the last gene: two cuts
    assert sorted(used) == list(range(pop))  # a permutation of the parents, paired
    # Two cut points: uniform cuts leave a segment strictly inside the genome in about
    # half the pairs; one-point crossover never does.
    assert interior >= pop // 2 // 4, interior


def test_crossover_mixes_the_pairs():
    """Crossover rate 1, no mutation: most children differ from every parent."""
    pop, genes = 40, 10
    parents = _distinct_parents(pop, genes)
    children, _ = _children_of(parents)
    mixed = sum(not any(np.array_equal(c, p) for p in parents) for c in children)
    # a crossed pair stays unmixed only if its cuts coincide or span everything:
    # P = (genes + 3) / (genes + 1)^2 ≈ 0.11
    assert mixed >= 0.7 * pop, mixed


def test_crossover_rate_is_respected():
    """With rate r the fraction of mixed pairs is r·(1 − (g+3)/(g+1)²) (cuts drawn uniformly
    in [0, g]); 4000 pairs, seeded: within 4 standard deviations."""
    genes = 10
    p_mix = 1 - (genes + 3) / (genes + 1) ** 2
    for rate in (0.0, 0.3, 0.9):
        pop = 8000
        parents = _distinct_parents(pop, genes)
        ga = _ga([pop * genes] * genes, pop, 0.0, rate, seed=11)
        ga.observe(parents, np.ones(pop))
        children = ga.propose()
        owners = children // genes
        mixed = np.mean([len(set(c)) > 1 for c in owners[0::2]])
        expected = rate * p_mix
        sigma = np.sqrt(max(expected * (1 - expected), 1e-12) / (pop // 2))
        assert abs(mixed - expected) <= 4 * sigma + 1e-12, (rate, mixed, expected)


def test_each_gene_mutates_at_the_rate_over_its_own_choices():
    """Identical parents (all index 0), no crossover: a gene of a knob with c choices is
    redrawn with probability r, uniformly over its own c choices, so each index k > 0
    appears with frequency r/c and index 0 with 1 − r + r/c.  20 000 children, seeded;
    each frequency within 4.5 standard deviations (binomial), no index outside the knob."""
    cards = [2, 3, 5, 7, 11]
    rate, pop = 0.3, 20000
    ga = _ga(cards, pop, rate, 0.0, seed=5)
    ga.observe(np.zeros((pop, len(cards)), dtype=np.int64), np.ones(pop))
    children = ga.propose()
    for gene, c in enumerate(cards):
        values = children[:, gene]
        assert values.min() >= 0 and values.max() < c, (gene, values.max())
        freq = np.bincount(values, minlength=c) / pop
        expected = np.full(c, rate / c)
        expected[0] += 1 - rate
        sigma = np.sqrt(expected * (1 - expected) / pop)
        assert np.all(np.abs(freq - expected) <= 4.5 * sigma), (gene, freq, expected)


def test_selection_is_a_tournament_over_parents_and_offspring():
    """Tournament size 2 and a population of P: 2P draws from the 2P parents ∪ offspring
    without replacement, so every candidate meets exactly one rival.  The elite parent
    therefore always survives, the worst candidate never does, and a child that beats every
    parent survives too."""
    pop, genes = 16, 4
    for seed in range(5):
        ga = _ga([64] * genes, pop, 0.1, 0.9, seed=seed)
        parents = ga.space.random_indices(ga.rng, pop)
        parent_costs = np.linspace(2.0, 3.0, pop)
        parent_costs[7] = 0.5  # the elite
        ga.observe(parents, parent_costs)
        children = ga.propose()
        child_costs = np.linspace(4.0, 5.0, pop)  # every child worse than every parent ...
        child_costs[3] = 0.25  # ... but one, better than all
        ga.observe(children, child_costs)
        assert ga.fitness.min() == 0.25 and 0.5 in ga.fitness  # the best child and the elite parent
        assert np.array_equal(ga.population[np.argmin(ga.fitness)], children[3])
        assert any(np.array_equal(p, parents[7]) for p in ga.population)
        assert 5.0 not in ga.fitness  # the worst loses its only match
        assert len(ga.fitness) == pop


def test_elite_parent_survives_offspring_that_are_all_worse():
    """Over generations whose offspring are all worse, the best cost never gets worse."""
    ga = _ga([8] * 6, 12, 0.2, 0.9, seed=2)
    start = ga.propose()
    costs = np.arange(12, dtype=float) + 1.0
    ga.observe(start, costs)
    for _ in range(10):
        children = ga.propose()
        ga.observe(children, np.full(len(children), 100.0))
        assert ga.fitness.min() == 1.0


def test_default_tournament_size_follows_the_population():
    """From Python as from the CLI, a small population gets a tournament size that fits it."""
    space = Space((Knob("a", tuple(range(8))), Knob("b", tuple(range(8)))))
    for population in (2, 3, 4, 5, 6, 12):
        ga = GeneticSearch(space, np.random.default_rng(0), size_pop=population, generations=1)
        assert ga.tourn_size == (1 if population == 4 else 2)
        ga.observe(ga.propose(), np.arange(population, dtype=float))
        assert len(ga.propose()) == population
    with pytest.raises(ValueError, match="population/2"):
        GeneticSearch(space, np.random.default_rng(0), size_pop=4, tourn_size=2)


@pytest.mark.parametrize("kind", ["ga", "random"])
def test_peek_is_the_batch_propose_gives_after_observe_and_leaves_the_strategy_as_it_was(kind):
    """The tuner builds the peeked batch while the last jobs of this one measure: it must be the
    very batch of the search, and peeking must not move the search (its rng above all)."""
    space = Space(tuple(Knob(f"g{i}", tuple(range(8))) for i in range(6)))
    target = np.array([3, 5, 1, 7, 0, 2])

    def cost(pop):
        return np.abs(pop - target).sum(axis=1).astype(float) + 1.0

    def make():
        if kind == "ga":
            return GeneticSearch(space, np.random.default_rng(9), size_pop=12, generations=3, tourn_size=3)
        return RandomSearch(space, np.random.default_rng(9), batch=12, generations=3)

    peeking, plain = make(), make()
    peeked = []
    while not peeking.done:
        batch = peeking.propose()
        assert np.array_equal(batch, plain.propose())  # peeking never changed the search
        if peeked:
            assert peeked[-1] is not None and np.array_equal(peeked[-1], batch)
        partial = cost(batch)
        partial[-3:] = np.inf  # the batch's last jobs still measuring: peeked as if they failed
        peeked.append(peeking.peek(batch, cost(batch)))
        peeking.peek(batch, partial)
        peeking.observe(batch, cost(batch))
        plain.observe(batch, cost(batch))
    assert peeked[-1] is None  # the search is done after the last batch: nothing to build ahead
    assert peeking.history == plain.history
