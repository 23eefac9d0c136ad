import numpy as np
import pytest

from tvm_ext.core.errors import TvmExtError
from tvm_ext.schedules.gemm.simt import KNOBS, GemmTemplate
from tvm_ext.core.space import Config, Knob, Space
from tvm_ext.target import TargetInfo, offline_cuda


def test_encode_decode_round_trip_over_whole_small_space():
    space = Space((Knob("a", (1, 2, 4)), Knob("b", ("x", "y")), Knob("c", (0, 1))))
    seen = set()
    for cfg in space:
        idx = space.encode(cfg)
        assert space.decode(idx) == cfg
        seen.add(cfg)
    assert len(seen) == space.size == 12


def test_gemm_space_round_trip_random_vectors():
    space = GemmTemplate(64, 64, 64).space(offline_cuda())
    rng = np.random.default_rng(1)
    for row in space.random_indices(rng, 200):
        assert np.array_equal(space.encode(space.decode(row)), row)
    assert len(space.knobs) == len(KNOBS)


def test_config_is_frozen_hashable_and_readable():
    cfg = Config.of({"wg_x": 8, "wg_y": 4})
    assert cfg.wg_x == 8 and cfg["wg_y"] == 4
    assert {cfg: 1}[Config.of({"wg_x": 8, "wg_y": 4})] == 1
    with pytest.raises(AttributeError):  # dataclasses.FrozenInstanceError
        cfg.items = ()  # type: ignore[misc]
    assert cfg.replace(wg_x=16).wg_x == 16 and cfg.wg_x == 8


def test_config_reads_each_knob_by_name_as_its_items_say_and_after_pickling():
    """A knob's value is read by name in one lookup: the first of a repeated name, as the items
    are read; a knob named like a Config method leaves the method in place; a missing knob is an
    AttributeError (KeyError by index); a pickled config reads and compares the same."""
    import pickle

    cfg = Config((("a", 1), ("replace", 2), ("a", 3)))
    assert cfg.a == 1 and cfg["a"] == 1 and cfg["replace"] == 2
    assert cfg.replace(a=5)["a"] == 5  # the method, not the knob's value
    with pytest.raises(AttributeError):
        _ = cfg.b
    with pytest.raises(KeyError):
        cfg["b"]
    with pytest.raises(AttributeError):  # still frozen
        cfg.a = 5  # type: ignore[misc]
    back = pickle.loads(pickle.dumps(Config.of({"wg_x": 8, "wg_y": 4})))
    assert back.wg_x == 8 and back == Config.of({"wg_y": 4, "wg_x": 8})


def test_knob_index_matches_the_choices_by_equality():
    """A choice's index by one lookup, with the tuple's equality (True is 1); a value that is
    none of the choices, hashable or not, is the error naming the allowed values."""
    knob = Knob("k", (0, 1, 4))
    assert [knob.index(v) for v in (0, 1, 4, True, 4.0)] == [0, 1, 2, 1, 2]
    for bad in (3, [1], "1"):
        with pytest.raises(TvmExtError, match="allowed values: 0, 1, 4"):
            knob.index(bad)


def test_bad_knob_value_names_the_allowed_values():
    space = GemmTemplate(64, 64, 64).space(offline_cuda())
    with pytest.raises(TvmExtError, match="allowed values: 1, 2, 4, 8, 16, 32"):
        space.make(wg_x=3, wg_y=1, task_x=1, task_y=1, k_step=4, use_shared=0, pad=0, unroll=0,
                   vec=1, double_buffer=0, a_transposed=0)


def test_hardware_constraint_rejects_too_many_threads():
    cfg_1024 = dict(wg_x=32, wg_y=32, task_x=1, task_y=1, k_step=4, use_shared=0, pad=0,
                    unroll=0, vec=1, double_buffer=0, a_transposed=0)
    cuda_space = GemmTemplate(64, 64, 64).space(offline_cuda())
    assert cuda_space.is_feasible(cuda_space.make(**cfg_1024))
    small = TargetInfo(kind="opencl", max_threads_per_block=256)
    small_space = GemmTemplate(64, 64, 64).space(small)
    assert "threads per block" in small_space.infeasible_reason(small_space.make(**cfg_1024))


def test_shared_memory_limit():
    tiny_smem = TargetInfo(kind="opencl", max_shared_memory_per_block=1024)
    space = GemmTemplate(64, 64, 64).space(tiny_smem)
    cfg = space.make(wg_x=16, wg_y=16, task_x=4, task_y=4, k_step=32, use_shared=1, pad=0,
                     unroll=0, vec=1, double_buffer=0, a_transposed=0)
    assert "shared memory" in space.infeasible_reason(cfg)


def test_patent_feasibility_rule():
    # M=N=6 -> P=6, P*P=36: 2*2*1*1=4 does not divide 36? 36 % 4 == 0 -> feasible; 8 does not.
    tmpl = GemmTemplate(5, 6, 7, feasibility="patent")
    space = tmpl.space(offline_cuda())
    ok = space.make(wg_x=2, wg_y=2, task_x=1, task_y=1, k_step=4, use_shared=0, pad=0, unroll=0, vec=1,
                    double_buffer=0, a_transposed=0)
    bad = ok.replace(wg_x=4, wg_y=2)
    assert space.is_feasible(ok)
    assert "patent rule" in space.infeasible_reason(bad)
    assert GemmTemplate(5, 6, 7).space(offline_cuda()).is_feasible(bad)  # default rule admits it


@pytest.mark.parametrize("shape", [(0, 1, 1), (1, -2, 1)])
def test_non_positive_shape_rejected(shape):
    with pytest.raises(TvmExtError, match="positive"):
        GemmTemplate(*shape)


def test_config_equality_ignores_knob_order():
    """Records store knobs sorted by name; the space decodes them in knob order."""
    space = GemmTemplate(64, 64, 64).space(offline_cuda())
    cfg = space.decode(space.random_indices(np.random.default_rng(2), 1)[0])
    from_record = Config.of(dict(sorted(cfg.as_dict().items())))
    assert from_record == cfg and hash(from_record) == hash(cfg)


def test_completed_gives_knobs_added_since_their_earlier_value():
    """A config written before a knob existed gets the knob's ``before`` (the kernel it measured);
    a value it has is kept, and a knob there from the start is never filled in."""
    space = Space((Knob("a", (1, 2)), Knob("b", (0, 1), before=0), Knob("c", (4, 8), before=8)))
    assert space.completed({"a": 2}) == {"a": 2, "b": 0, "c": 8}
    assert space.completed({"a": 1, "b": 1}) == {"a": 1, "b": 1, "c": 8}
    assert space.completed({}) == {"b": 0, "c": 8}  # "a" has no earlier value: the config stays short
    assert space.outside_reason(space.make(**space.completed({"a": 2}))) is None
