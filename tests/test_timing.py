"""The timing protocol (``tvm_ext.measure.timing``): real kernels on PoCL, host clock around a sync.

The CUDA-graph path and the CUDA-event clock need a GPU and torch (``benchmarks/common.py``);
their test carries ``gpu``.
"""
from __future__ import annotations

import importlib.util
import math
import os
import statistics
import time

import numpy as np
import pytest

from tvm_ext.measure.timing import (BACK_TO_BACK, GRAPH, PER_CALL, HostClock, Rotation, Timing, TimingSettings,
                                    VendorTimes, back_to_back, calls_per_sample, per_call, rotation_count)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MB = 1 << 20

# A kernel that bumps the counter of the set it was given: which sets a timing loop used.
COUNT_SOURCE = "__kernel void bump(__global int* count) { count[0] += 1; }"
# A kernel whose work is a dependent chain of ``n`` multiply-adds per work item: slow and
# the same every call, so per-call and back-to-back timing must agree.
SLOW_SOURCE = """
__kernel void slow(__global float* out, const int n) {
    float acc = (float)get_global_id(0);
    for (int i = 0; i < n; ++i) acc = acc * 0.999999f + 1.0f;
    out[get_global_id(0)] = acc;
}
"""


@pytest.fixture(scope="module")
def queue(opencl):
    import pyopencl as cl

    from tvm_ext.target import opencl_device

    ctx = cl.Context([opencl_device(opencl.device_id)])
    return ctx, cl.CommandQueue(ctx)


def test_rotation_count_fills_twice_the_l2():
    l2 = 50 * MB
    assert rotation_count(4 * MB, l2) == 25  # sum of 2^20 floats: 25 sets = 100 MB
    assert rotation_count(64 * MB, l2) == 2  # a 4096^2 float matrix: two sets
    assert rotation_count(100 * MB, l2) == 1 and rotation_count(300 * MB, l2) == 1
    assert rotation_count(1024, l2) == 64 and rotation_count(1024, l2, max_sets=8) == 8  # capped
    assert rotation_count(4 * MB, 0) == 1  # no L2 figure: nothing to defeat


def test_calls_per_sample_is_whole_rounds_of_the_rotation():
    settings = TimingSettings(min_secs=0.02, max_calls=1000)
    assert calls_per_sample(1e-3, 1, settings) == 20
    assert calls_per_sample(1e-3, 8, settings) == 24  # 20 rounded up to whole rounds of 8
    assert calls_per_sample(1.0, 8, settings) == 8  # at least one round
    assert calls_per_sample(1e-9, 7, settings) == 994  # capped, still whole rounds
    for spc in (1e-6, 3e-5, 1e-4, 2e-3):
        for sets in (1, 3, 25):
            calls = calls_per_sample(spc, sets, settings)
            assert calls % sets == 0 and sets <= calls <= max(sets, 1000)


def test_rotation_continues_across_calls():
    rotation = Rotation(3)
    assert [rotation() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError, match="at least one"):
        Rotation(0)


@pytest.mark.parametrize("timer", [back_to_back, per_call], ids=["back_to_back", "per_call"])
def test_timing_cycles_every_input_set(queue, timer):
    import pyopencl as cl

    ctx, q = queue
    kernel = cl.Program(ctx, COUNT_SOURCE).build().bump
    sets = 5
    counters = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                          hostbuf=np.zeros(1, np.int32)) for _ in range(sets)]
    rotation = Rotation(sets)
    settings = TimingSettings(warmup=2, repeat=4, min_secs=0.005, max_calls=400)
    timing = timer(lambda i: kernel(q, (1,), (1,), counters[i]), sets, HostClock(q.finish), settings, rotation)
    counts = []
    for buf in counters:
        host = np.empty(1, np.int32)
        cl.enqueue_copy(q, host, buf)
        counts.append(int(host[0]))
    assert timing.sets == sets and (timing.calls % sets == 0 or timing.method == PER_CALL)
    assert sum(counts) == rotation.calls  # every launch reached its set's buffer
    assert min(counts) >= 1 and max(counts) - min(counts) <= 1, counts  # all sets, equally often


def test_per_call_and_back_to_back_agree_on_a_slow_kernel(queue):
    """A kernel of ~30 ms on one work item: launch and sync overheads (~0.1 ms) are noise,
    so both methods measure the same work.  The two are interleaved, one sample each per
    round (the CPU is shared: its load drifts), and their fastest rounds must lie within 20 %
    of each other."""

    import pyopencl as cl

    ctx, q = queue
    kernel = cl.Program(ctx, SLOW_SOURCE).build().slow
    out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size=4)
    n = 1 << 16
    kernel(q, (1,), None, out, np.int32(1))  # PoCL compiles the kernel on its first launch
    q.finish()
    def once() -> float:
        start = time.perf_counter()
        kernel(q, (1,), None, out, np.int32(n))
        q.finish()
        return time.perf_counter() - start

    # grow the chain until a call takes ~30 ms on this CPU (the fastest of 3: a call slowed by
    # other load would stop the growth early, and the check below would find the kernel fast)
    while min(once() for _ in range(3)) <= 0.03 and n < 1 << 28:
        n *= 2
    launch = lambda i: kernel(q, (1,), None, out, np.int32(n))  # noqa: E731
    clock = HostClock(q.finish)
    settings = TimingSettings(warmup=0, repeat=1, min_secs=0.2)
    singles, loops = [], []
    for _ in range(7):
        single = per_call(launch, 1, clock, settings)
        loop = back_to_back(launch, 1, clock, settings)
        assert single.method == PER_CALL and loop.method == BACK_TO_BACK and loop.calls >= 2
        singles.append(single.seconds)
        loops.append(loop.seconds)
    # the fastest round of each: load on the shared CPU only slows a round (a CI run saw rounds of
    # both methods at 34 and 72 ms, which put the two medians in different modes)
    single, loop = min(singles), min(loops)
    # really slow: 100 times the launch and sync overheads (the growth above aims at 30 ms; with less
    # load on the CPU later, the calls can run faster than when it stopped)
    assert single > 0.01
    # a back-to-back round averages its calls, so under load its fastest round sits between the
    # fastest single call and the singles' median (a loaded CI run: 30.2 ms fastest single, 36.5 ms
    # fastest round); a wrong count of calls would put it a factor off either way
    assert 0.8 * single <= loop <= 1.2 * max(single, statistics.median(singles)), (singles, loops)


def test_back_to_back_divides_by_the_calls_of_a_sample():
    """A fake device whose every call takes 2 ms of clock time: each method reports 2 ms."""
    now = [0.0]

    class FakeClock:
        def idle(self):
            pass

        def mark(self):
            return now[0]

        def seconds(self, start, end):
            return end - start

    def launch(i):
        now[0] += 0.002

    settings = TimingSettings(warmup=1, repeat=3, min_secs=0.05, max_calls=1 << 10)
    loop = back_to_back(launch, 4, FakeClock(), settings)
    assert loop.calls >= 25 and loop.calls % 4 == 0
    assert loop.seconds == pytest.approx(0.002) and all(s == pytest.approx(0.002) for s in loop.samples)
    assert per_call(launch, 4, FakeClock(), settings).seconds == pytest.approx(0.002)


def _timing(method, secs):
    return Timing(method, secs, (secs,), 1, 1)


def test_vendor_ratio_is_against_its_best_method():
    launch_bound = VendorTimes(_timing(PER_CALL, 39e-6), _timing(BACK_TO_BACK, 16.8e-6), _timing(GRAPH, 7.6e-6))
    assert launch_bound.best.method == GRAPH
    assert launch_bound.speedup(7.6e-6) == pytest.approx(1.0)
    assert launch_bound.speedup(3.8e-6) == pytest.approx(2.0)
    no_graph = VendorTimes(_timing(PER_CALL, 2e-3), _timing(BACK_TO_BACK, 2.5e-3), None, "capture failed")
    assert no_graph.best.method == PER_CALL and len(no_graph.timings) == 2
    assert math.isnan(no_graph.speedup(0.0))


def _common():
    import sys

    spec = importlib.util.spec_from_file_location("bench_common", os.path.join(ROOT, "benchmarks", "common.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_benchmark_helpers_import_without_torch_and_print_every_column():
    import sys

    before = "torch" in sys.modules
    common = _common()
    assert ("torch" in sys.modules) == before  # importing the helpers did not import torch
    times = VendorTimes(_timing(PER_CALL, 2e-3), _timing(BACK_TO_BACK, 1e-3), None, "differs")
    cells = common.vendor_cells(times)
    assert cells == ["2.000", "1.000", "- (differs)", f"1.000 ({BACK_TO_BACK})"]
    assert len(common.vendor_header()) == len(cells)
    # what the probes record and the model rows' notes say: every method, the left-out graph too
    assert common.seconds_by_method(times) == {PER_CALL: 2e-3, BACK_TO_BACK: 1e-3, f"{GRAPH}: differs": None}
    assert common.methods_text(times) == f"{PER_CALL} 2.000, {BACK_TO_BACK} 1.000, {GRAPH}: differs"
    # a TVM call over per-set arguments returns its result, or the set's output buffer it writes
    calls: list[tuple] = []
    result = common.tvm_launch(lambda *a: calls.append(a) or "returned", [[1], [2]])
    written = common.tvm_launch(lambda *a: calls.append(a), [[1], [2]], ["out 1", "out 2"])
    assert (result(1), written(0), calls) == ("returned", "out 1", [(2,), (1,)])


@pytest.mark.gpu
def test_graph_timing_on_the_gpu(tmp_path):
    """torch.sum on rotated inputs: the three methods, the graph check, and a TVM kernel timed
    with the same events (``time_ours``)."""
    import torch
    import tvm
    from tvm import te, s_tir

    common = _common()
    n, sets = 1 << 20, common.l2_rotation(4 * (1 << 20))
    assert sets > 1
    xs = [torch.rand(n, device="cuda") for _ in range(sets)]
    settings = TimingSettings(warmup=3, repeat=10, min_secs=0.01)
    times = common.time_vendor(lambda i: torch.sum(xs[i]), sets, settings)
    assert times.graph is not None, times.graph_note
    assert times.graph.calls % sets == 0
    # torch.sum of 4 MB is launch-bound per call: the graph (no host dispatch) beats it
    assert times.graph.seconds < times.per_call.seconds
    # a call whose captured result differs from its eager result is caught
    state = {"k": 0.0}

    def drifting(i):
        state["k"] += 1.0
        return xs[i] + state["k"]

    with pytest.raises(RuntimeError, match="differs"):
        common.time_graph(drifting, sets, 2 * sets, settings)

    a = te.placeholder((n,), "float32", name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="B")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    bx, tx = sch.split(sch.get_loops(sch.get_sblock("B"))[0], [None, 256])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    func = tvm.compile(sch.mod, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90"})).mod["main"]
    dev = tvm.cuda(0)
    args = [[tvm.runtime.tensor(x.cpu().numpy(), dev), tvm.runtime.empty((n,), "float32", dev)] for x in xs]
    ours = common.time_ours(common.tvm_launch(func, args), sets, settings)
    np.testing.assert_allclose(args[1][1].numpy(), 2 * xs[1].cpu().numpy())
    assert ours.method == BACK_TO_BACK and ours.calls % sets == 0 and ours.seconds > 0

    # the same TVM kernel in a CUDA graph: its launches go to the capture stream only when
    # TVM is told the stream; the replay is checked on NaN-poisoned outputs
    launch = common.tvm_launch(func, args, [a[1] for a in args])
    with pytest.raises(Exception) as outside:  # noqa: B017  launched on TVM's own stream, outside the capture
        common.time_graph(launch, sets, 2 * sets, settings)
    print("TVM's launch outside the capture:", type(outside.value).__name__, outside.value)
    torch.cuda.synchronize()
    three = common.time_ours_three(launch, sets, settings)
    assert three.graph is not None, three.graph_note
    assert three.graph.calls % sets == 0 and three.graph.seconds > 0
    np.testing.assert_allclose(args[0][1].numpy(), 2 * xs[0].cpu().numpy())

    def stale(i):  # a launch that captures nothing: the poisoned output is caught
        return args[i][1]

    with pytest.raises(RuntimeError, match="differs"):
        common.time_graph(stale, sets, 2 * sets, settings, tvm_stream=True)
