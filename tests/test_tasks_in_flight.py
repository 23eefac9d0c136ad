"""A model's kernels tuned at once (``tune_relax`` with ``tasks_in_flight``), for real on PoCL with
two measuring processes on the one CPU device: the searches run side by side, every kernel is
tuned and exported, nothing is measured twice, the model gives the reference result, and one
at a time stays the default."""
from __future__ import annotations

import collections
import threading

import numpy as np
import pytest
from test_pipeline import _load_example

from tvm_ext.measure.measure import MeasureSettings
from tvm_ext.relax.pipeline import TuneOptions, load_model, tune_relax
from tvm_ext.core.records import RecordStore

FAST = MeasureSettings(warmup=1, repeat=2, min_repeat_secs=0.001)
WAIT = 120.0  # seconds the first search waits for another to record (it never needs that long)


@pytest.fixture(scope="module")
def mlp():
    return _load_example()


class SideBySide:
    """A progress hook that holds the first search's second record until another kernel's
    search has recorded one: searches one after another would wait here for ``WAIT`` seconds
    and report it."""

    def __init__(self) -> None:
        self.first: str | None = None
        self.keys: list[str] = []
        self.other = threading.Event()
        self.waited_in_vain = False
        self.lock = threading.Lock()

    def __call__(self, record, tuner) -> None:
        key = tuner.workload.key
        with self.lock:
            self.keys.append(key)
            self.first = self.first or key
            if key != self.first:
                self.other.set()
            hold = key == self.first and self.keys.count(key) == 2
        if hold and not self.other.wait(WAIT):
            self.waited_in_vain = True


def test_kernels_tuned_at_once_share_the_devices_and_give_the_model(mlp, opencl, tmp_path):
    options = TuneOptions(generations=1, population=4, seed=0, tasks_in_flight=2, measure=FAST,
                          runner_options=(("devices", "0,0"),))
    records, database = str(tmp_path / "records.jsonl"), str(tmp_path / "database")
    hook = SideBySide()
    result = tune_relax(mlp.get_module(), opencl, records, database, options, log=None, on_record=hook)
    assert not hook.waited_in_vain and hook.other.is_set()  # a second search recorded while the first ran
    tuned = [t for t in result.tasks if t.template]
    assert {t.template for t in tuned} == {"gemm", "rows"} and len(tuned) == 4
    assert all(t.exported and np.isfinite(t.best_secs) for t in tuned), [(t.name, t.note) for t in tuned]
    measured = collections.Counter((r.workload_key, r.config_obj()) for r in RecordStore(records))
    assert measured and max(measured.values()) == 1  # nothing measured twice
    assert len({key for key, _ in measured}) == 4
    inputs = mlp.get_inputs()
    out = load_model(mlp.get_module(), opencl, database, log=None)(*inputs)
    assert np.abs(out - mlp.reference(inputs)).max() < 1e-5


def test_one_at_a_time_is_the_api_default_and_a_bad_count_is_refused(mlp):
    from tvm_ext.core.errors import TvmExtError

    assert TuneOptions().tasks_in_flight == 1
    with pytest.raises(TvmExtError, match="--tasks-in-flight must be >= 1, got 0"):
        TuneOptions(tasks_in_flight=0)


@pytest.mark.parametrize("argv, expected", [
    ([], 4),  # one device: four kernels at once (one GPU tuned the BERT layer in 0.51 of the time)
    (["--devices", "0,1"], 8),
    (["--runner-option", "devices=0,1,2"], 12),
    (["--tasks-in-flight", "1"], 1),
    (["--cost-model", "xgb"], 1),  # one after another: each shape's model warm from the shapes before it
    (["--cost-model", "xgb", "--tasks-in-flight", "3"], 3),
])
def test_tune_model_tunes_four_kernels_a_device_at_once_unless_told(argv, expected):
    from tvm_ext.cli.cli_args import tasks_in_flight
    from tvm_ext.tune import build_parser

    args = build_parser().parse_args(["model", "m.py", *argv])
    assert tasks_in_flight(args) == expected
    assert tasks_in_flight(build_parser().parse_args(["gemm", "--shape", "64,64,64"])) == 1


class FakeTuner:
    def __init__(self) -> None:
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()


class FakeSession:
    builder = runner = None


def test_a_failing_search_stops_the_others_and_its_error_is_raised():
    """The searches in flight are told to stop (they end after their batch), the ones not
    started never start, and the failure reaches the caller."""
    from tvm_ext.relax.pipeline import _Searches

    searches, tuners, started = _Searches(), [FakeTuner() for _ in range(3)], []
    failed = threading.Event()

    def search(index: int) -> bool:
        started.append(index)
        if index == 0:
            failed.wait(10)
            raise RuntimeError("build pool gone")
        return searches.run(tuners[index], lambda tuner: (failed.set(), tuner.stopped.wait(10))[1] and False)

    with pytest.raises(RuntimeError, match="build pool gone"):
        searches.all_at_once([0, 1, 2], 2, search, FakeSession())
    assert tuners[1].stopped.is_set()  # in flight when the other failed: told to stop
    assert 2 not in started  # not started: never runs


def test_devices_alone_measure_a_model_on_this_machines_devices():
    """``tune model --devices 0,1``: the local runner's process per device (the model is compiled
    and run here, so its kernels are measured here); a tracker stays the rpc runner's, refused."""
    from tvm_ext.cli.model_cli import _devices_here
    from tvm_ext.core.session import SessionOptions

    here = _devices_here(SessionOptions(runner="rpc", runner_options=(("devices", "0,1"),)))
    assert (here.runner, here.runner_options) == ("local", (("devices", "0,1"),))
    remote = SessionOptions(runner="rpc", runner_options=(("tracker", "127.0.0.1:9190"), ("key", "h100")))
    assert _devices_here(remote) is remote
