"""A measuring process draws a workload's input sets once: the check's set from the seed, the
timing sets from seed + 1, the same arrays as drawing them per job, kept for a few workloads."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tvm_ext.measure import measure
from tvm_ext.measure.measure import UniformInputs
from tvm_ext.core.template import TensorSpec

SPECS = [TensorSpec((7, 5), "float32"), TensorSpec((5, 3), "float32")]


def job(seed: int, inputs=None):
    return SimpleNamespace(inputs=UniformInputs() if inputs is None else inputs, settings=SimpleNamespace(seed=seed))


def test_input_sets_are_the_seeded_draws_and_drawn_once_per_workload():
    measure._DRAWN.clear()
    sets = measure._input_sets(job(4), SPECS, 3)
    check = UniformInputs().draw(np.random.default_rng(4), SPECS)
    rng = np.random.default_rng(5)
    timing = [UniformInputs().draw(rng, SPECS) for _ in range(2)]
    for got, want in zip(sets, [check, *timing]):
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
    again = measure._input_sets(job(4), SPECS, 3)
    assert all(a is b for x, y in zip(sets, again) for a, b in zip(x, y))  # kept, not drawn again
    assert not sets[0][0].flags.writeable
    other = measure._input_sets(job(6), SPECS, 3)
    assert not np.array_equal(other[0][0], sets[0][0])
    for seed in (7, 8, 9):
        measure._input_sets(job(seed), SPECS, 3)
    assert len(measure._DRAWN) == measure.DRAWN_KEPT


def test_given_inputs_are_used_as_they_are_and_not_kept():
    measure._DRAWN.clear()
    given = [np.ones((7, 5), np.float32), np.ones((5, 3), np.float32)]
    sets = measure._input_sets(job(0, inputs=given), SPECS, 2)
    assert sets[0][0] is given[0] and len(sets) == 2 and not measure._DRAWN
