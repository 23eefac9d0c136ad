"""The runner's CUDA graph timer (``tvm_ext.measure.cuda_graph``): how many calls a graph holds,
a clear error where no graph can be captured, the timer each measurement used in its
metrics, the CLI's switch; on the GPU (``gpu``) a kernel of a few microseconds timed from a
graph, below the launch-bound loop, and the switch back to TVM's evaluator."""
from __future__ import annotations

import pytest

from tvm_ext.measure.builder import build_one
from tvm_ext.measure.cuda_graph import MAX_CALLS, CapturedCalls, CudaGraphError, calls_per_replay
from tvm_ext.measure.measure import MeasureSettings, measure
from tvm_ext.schedules.gemm.simt import GemmTemplate

FAST = MeasureSettings(warmup=1, repeat=3, min_repeat_secs=0.002)
TILE = dict(wg_x=8, wg_y=8, task_x=2, task_y=2, k_step=8, use_shared=1, pad=1, unroll=0, vec=1, double_buffer=0,
            a_transposed=0)


def test_a_graph_holds_whole_rotations_for_about_two_milliseconds():
    assert calls_per_replay(4e-6, 1) == 500
    assert calls_per_replay(4e-6, 3) == 498  # whole rounds of the 3 input sets
    assert calls_per_replay(1e-9, 4) == MAX_CALLS  # a graph's size is bounded
    assert calls_per_replay(1.0, 5) == 5  # a slow program: one round of the sets


def _has_cuda() -> bool:
    import tvm

    return tvm.cuda(0).exist


@pytest.mark.skipif(_has_cuda(), reason="a CUDA device is here")
def test_without_a_gpu_the_capture_fails_with_a_reason():
    """No device (or no CUDA runtime library): ``CudaGraphError`` with the runtime's words,
    which the runner turns into a note and times the old way."""
    import tvm

    with pytest.raises(CudaGraphError, match=r"cudaStreamCreateWithFlags|libcudart"):
        CapturedCalls(tvm.cuda(0), lambda i: None, 1, 1)


def test_an_opencl_measurement_says_its_timer(opencl):
    template = GemmTemplate(32, 32, 32)
    build = build_one(template, template.space(opencl).make(**TILE), opencl)
    assert build.ok, build.error_msg
    result = measure(template, build.config, build.artifact, opencl, FAST)
    assert result.ok and result.metrics["timer"] == "opencl events"


def test_the_cli_times_from_a_graph_unless_told_not_to():
    from tvm_ext.cli.cli_args import add_tuning_args, session_options
    from tvm_ext.cli.cli_checks import Parser

    parser = Parser(prog="t")
    add_tuning_args(parser)
    assert session_options(parser.parse_args([])).measure.cuda_graph is True
    assert session_options(parser.parse_args(["--no-cuda-graph"])).measure.cuda_graph is False


@pytest.mark.gpu
def test_a_few_microseconds_kernel_is_timed_from_a_graph():
    """A 16x16x16 GEMM (well under the host's launch time): replayed from a graph its cost is
    the GPU's, below back-to-back launches (TVM's evaluator, or a host loop over rotated
    inputs), which still serve when the graph is switched off; both checked against float64."""
    from tvm_ext.target import resolve_target

    cuda = resolve_target("cuda", 0)
    template = GemmTemplate(16, 16, 16)
    build = build_one(template, template.space(cuda).make(**TILE), cuda)
    assert build.ok, build.error_msg
    graph = measure(template, build.config, build.artifact, cuda, MeasureSettings())
    loop = measure(template, build.config, build.artifact, cuda, MeasureSettings(cuda_graph=False))
    assert graph.ok and loop.ok, (graph.error_msg, loop.error_msg)
    assert graph.metrics["timer"] == "cuda graph"
    assert loop.metrics["timer"] in ("tvm evaluator", "host loop")  # one input set or several (rotated)
    print(f"16x16x16 GEMM: graph {graph.cost * 1e6:.2f} us, evaluator {loop.cost * 1e6:.2f} us")
    assert graph.cost < loop.cost
