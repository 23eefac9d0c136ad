"""A vendor baseline (cuBLAS through torch) timed three ways, so a kernel is compared with
the vendor's best: call by call (events around each call), back to back (events around a
run of calls on rotated inputs), and replayed from a CUDA graph of such a run.

The benchmark scripts call ``vendor_times``; it has the shape of the shared protocol being
written into ``common.py`` (same three modes), so switching is a one-line import change.
"""
from __future__ import annotations

import statistics
from typing import Any, Callable, Sequence


def rotation_sets(bytes_per_set: int, l2_bytes: int = 50 << 20) -> int:
    """Input sets to cycle through so back-to-back calls do not find their inputs in L2."""
    return max(1, min(8, -(-2 * l2_bytes // max(bytes_per_set, 1))))


def vendor_times(calls: Sequence[Callable[[], Any]], warmup: int = 5, repeat: int = 30,
                 run: int = 20) -> dict[str, float]:
    """Median seconds per call of ``calls[i % len(calls)]`` (one closure per rotated input set):
    ``per_call``, ``back_to_back`` (a run of ``run`` calls between two events), ``graph``
    (the same run captured once in a CUDA graph and replayed), and ``best`` of the three."""
    import torch

    for i in range(warmup):
        calls[i % len(calls)]()
    torch.cuda.synchronize()

    def timed(fn: Callable[[], Any], count: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3 / count

    per_call = statistics.median(timed(calls[i % len(calls)], 1) for i in range(repeat))

    def burst() -> None:
        for i in range(run):
            calls[i % len(calls)]()

    back_to_back = statistics.median(timed(burst, run) for _ in range(max(3, repeat // 5)))
    graph_time = float("nan")
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            burst()  # warm the workspaces on the capture stream
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            burst()
        graph.replay()
        torch.cuda.synchronize()
        graph_time = statistics.median(timed(graph.replay, run) for _ in range(max(3, repeat // 5)))
    except RuntimeError:  # capture is not possible for this call: the other two modes stand
        pass
    finite = [t for t in (per_call, back_to_back, graph_time) if t == t]
    return {"per_call": per_call, "back_to_back": back_to_back, "graph": graph_time, "best": min(finite)}


def describe(times: dict[str, float], flops: float) -> str:
    """'0.208 ms (661 TFLOP/s; per call 0.21, back to back 0.208, graph 0.207)'."""
    tf = flops / times["best"] / 1e12
    return (f"{times['best'] * 1e3:.3f} ms ({tf:.0f} TFLOP/s; per call {times['per_call'] * 1e3:.3f}, "
            f"back to back {times['back_to_back'] * 1e3:.3f}, graph {times['graph'] * 1e3:.3f})")
