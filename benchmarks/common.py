"""Shared helpers of the GPU benchmark scripts: the timing protocol on CUDA (torch's events
and graphs) and the printed table.

The protocol itself is ``tvm_ext.timing`` (framework-free, tested on PoCL); this file adds
what needs torch: CUDA events as the clock, the vendor timed per call, back to back and
replayed from a CUDA graph (``time_vendor``), and our kernels timed back to back with the
same events and input rotation (``time_ours``), or, for TVM calls of a few microseconds,
the same three ways with TVM's launches captured in the graph (``time_ours_three``).  Every
benchmark reports its ratios against the vendor's best of the three (``VendorTimes.best``).
"""
from __future__ import annotations

import datetime
import sys
from collections.abc import Sequence
from typing import Any, Callable

from tvm_ext.timing import (BACK_TO_BACK, GRAPH, PER_CALL, Launch, Rotation, Timing, TimingSettings,
                            VendorTimes, back_to_back, calls_per_sample, per_call, rotation_count)

__all__ = ["TorchEventClock", "time_vendor", "time_graph", "time_ours", "time_ours_three", "l2_rotation",
           "vendor_header", "vendor_cells", "vendor_methods", "seconds_by_method", "methods_text", "table",
           "device_name", "rel_error_vs", "tvm_launch", "torch_stream", "poisoned_error", "ours_on", "shape_names",
           "TimingSettings",
           "VendorTimes", "Timing"]

MAX_GRAPH_CALLS = 4096  # calls captured in one graph at most (memory for their outputs)


class TorchEventClock:
    """CUDA events on torch's current stream.  TVM's CUDA runtime launches on the legacy
    default stream, which is torch's default stream too, so the same events time both."""

    def idle(self) -> None:
        import torch

        torch.cuda.synchronize()

    def mark(self) -> Any:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        end.synchronize()
        return start.elapsed_time(end) * 1e-3


def l2_rotation(set_bytes: float, max_sets: int = 64) -> int:
    """Input sets for ``set_bytes`` per call on this GPU (``rotation_count`` with its L2)."""
    import torch

    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)
    return rotation_count(set_bytes, l2, max_sets)


def _tensors(value: Any) -> list[Any]:
    """The tensors in a call's result (torch tensors, or TVM tensors seen through DLPack, or
    nested tuples/lists of them)."""
    if isinstance(value, Sequence) and not isinstance(value, str):  # tuple, list, TVM's Array
        return [t for v in value for t in _tensors(v)]
    if hasattr(value, "detach"):
        return [value]
    if hasattr(value, "__dlpack__"):
        import torch

        return [torch.from_dlpack(value)]
    return []


def _same(graph_out: Any, eager_out: Any) -> str:
    """'' when the graph's result equals the eager result of the same call, else what differs."""
    import torch

    got, want = _tensors(graph_out), _tensors(eager_out)
    if len(got) != len(want):
        return f"graph returned {len(got)} tensors, eager {len(want)}"
    for a, b in zip(got, want):
        if a.shape != b.shape or not torch.equal(a, b):
            diff = (a.double() - b.double()).abs().max().item() if a.shape == b.shape else float("nan")
            return f"graph output differs from eager output (max |diff| {diff:.3g})"
    return ""


def _on(context: Any, tvm_stream: bool) -> Any:
    """``context`` (a torch stream or graph capture), with TVM's launches sent to the same
    stream where ``tvm_stream`` (TVM's CUDA runtime launches on the FFI's current stream)."""
    if not tvm_stream:
        return context
    import tvm_ffi

    return tvm_ffi.use_torch_stream(context)


def time_graph(fn: Launch, sets: int, calls: int, settings: TimingSettings = TimingSettings(),
               tvm_stream: bool = False) -> Timing:
    """Capture ``calls`` calls (cycling the sets) in one CUDA graph; each sample is events
    around one replay, divided by ``calls``.  ``fn(i)`` returns its output (a call that
    writes into a buffer returns that buffer).  The outputs are poisoned with NaN before the
    checked replay, and ``RuntimeError`` is raised if any set's replayed output differs from
    the same call run eagerly.  ``tvm_stream``: ``fn`` launches TVM kernels (see ``_on``)."""
    import torch

    calls = max(sets, min(calls, MAX_GRAPH_CALLS) // sets * sets)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    kept: list[Any] = [None] * sets
    with _on(torch.cuda.stream(side), tvm_stream):  # warm up off the capture stream (workspaces, autotuning)
        for i in range(3 * sets):
            kept[i % sets] = fn(i % sets)  # outputs held as the capture holds them: an allocator's pool
    torch.cuda.current_stream().wait_stream(side)  # (TVM's) then has their memory, no cudaMalloc in capture
    del kept
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    outs: list[Any] = [None] * sets
    with _on(torch.cuda.graph(graph), tvm_stream):
        for i in range(calls):
            outs[i % sets] = fn(i % sets)  # the last call of each set keeps its output
    for t in _tensors(outs):
        if t.is_floating_point():
            t.fill_(float("nan"))  # a replay that writes nothing fails the check
    graph.replay()
    torch.cuda.synchronize()
    replayed = [[t.clone() for t in _tensors(o)] for o in outs]  # before eager calls overwrite buffers
    for i in range(sets):
        differs = _same(replayed[i], fn(i))
        if differs:
            raise RuntimeError(differs)
    timed = per_call(lambda _: graph.replay(), 1, TorchEventClock(), settings)
    samples = tuple(s / calls for s in timed.samples)
    return Timing(GRAPH, timed.seconds / calls, samples, calls, sets)


def time_vendor(fn: Launch, sets: int = 1, settings: TimingSettings = TimingSettings(),
                graph: bool = True, tvm_stream: bool = False) -> VendorTimes:
    """The vendor's ``fn(i)`` (one call on input set i, returning its output) per call, back
    to back and replayed from a CUDA graph, in this order, in this process.  A graph that
    cannot be captured or whose output differs from eager is left out (``graph_note``)."""
    clock = TorchEventClock()
    single = per_call(fn, sets, clock, settings)
    loop = back_to_back(fn, sets, clock, settings)
    if not graph:
        return VendorTimes(single, loop, None, "not run")
    try:
        replayed = time_graph(fn, sets, calls_per_sample(loop.seconds, sets, settings), settings, tvm_stream)
    except Exception as exc:  # reported in the table, never the end of the run
        text = [line for line in str(exc).strip().splitlines() if line.strip()]
        return VendorTimes(single, loop, None, (text[0] if text else type(exc).__name__)[:160])
    return VendorTimes(single, loop, replayed)


def time_ours(launch: Launch, sets: int = 1, settings: TimingSettings = TimingSettings()) -> Timing:
    """Our kernel's ``launch(i)`` (e.g. a TVM ``Module`` function on input set i, or the GRU
    layer's executor) back to back on the rotated sets, with the same CUDA events."""
    return back_to_back(launch, sets, TorchEventClock(), settings, Rotation(sets))


def time_ours_three(launch: Launch, sets: int = 1, settings: TimingSettings = TimingSettings()) -> VendorTimes:
    """Our TVM call timed the vendor's three ways, the graph capturing TVM's launches too: for
    kernels of a few microseconds, where a back-to-back loop measures the host's launch rate
    and the vendor's graph replay would be compared with it.  ``launch(i)`` returns its output."""
    return time_vendor(launch, sets, settings, graph=True, tvm_stream=True)


def vendor_methods(times: VendorTimes) -> list[tuple[str, Timing | None]]:
    """The three methods in table order, each with its timing; a graph that was left out
    comes as (``"CUDA graph: <why>"``, None), so every table shows all three."""
    graph = (GRAPH, times.graph) if times.graph is not None else (f"{GRAPH}: {times.graph_note}", None)
    return [(PER_CALL, times.per_call), (BACK_TO_BACK, times.back_to_back), graph]


def seconds_by_method(times: VendorTimes) -> dict[str, float | None]:
    """The three methods' seconds by name, in table order (None: the graph was left out)."""
    return {method: (t.seconds if t else None) for method, t in vendor_methods(times)}


def methods_text(times: VendorTimes) -> str:
    """'per call 0.206, back-to-back 0.188, CUDA graph 0.186' (ms; a left-out graph says why)."""
    return ", ".join(f"{method} {t.seconds * 1e3:.3f}" if t else method for method, t in vendor_methods(times))


def gemm_operand_sets(m: int, n: int, k: int, dtype: str = "float32") -> list[tuple[Any, Any]]:
    """randn A [m, k] and B [k, n] of ``dtype`` on the GPU, enough sets to rotate past L2."""
    import torch

    torch_dtype = getattr(torch, dtype)
    return [(torch.randn(m, k, device="cuda", dtype=torch_dtype), torch.randn(k, n, device="cuda", dtype=torch_dtype))
            for _ in range(l2_rotation(torch_dtype.itemsize * (m * k + k * n + m * n)))]


def cublas_gemm(sets: Sequence[tuple[Any, Any]]) -> tuple[VendorTimes, float]:
    """torch's ``a @ b`` (cuBLAS, at the current TF32 setting) per call, back to back and from a
    CUDA graph on the rotated operands ``sets``, and its error vs float64 (of those operands)."""
    times = time_vendor(lambda i: sets[i][0] @ sets[i][1], len(sets))
    a, b = sets[0]
    return times, rel_error_vs(a @ b, a.double() @ b.double())


def rel_error_vs(out: Any, ref: Any) -> float:
    """Normwise relative error of ``out`` (tensor or array) against a float64 reference."""
    import numpy as np

    if hasattr(out, "detach"):
        out = out.detach().double().cpu().numpy()
    if hasattr(ref, "detach"):
        ref = ref.detach().double().cpu().numpy()
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300))


def vendor_header(unit: str = "ms", name: str = "vendor") -> list[str]:
    """Column names for ``vendor_cells``: the three methods and which one was best."""
    return [f"{name} {PER_CALL} {unit}", f"{name} {BACK_TO_BACK} {unit}", f"{name} {GRAPH} {unit}",
            f"{name} best {unit}"]


def vendor_cells(times: VendorTimes, scale: float = 1e3, digits: int = 3) -> list[str]:
    """The vendor's three times (``scale``: 1e3 for ms, 1e6 for µs) and the best's method."""
    fmt = lambda t: f"{t.seconds * scale:.{digits}f}"  # noqa: E731
    graph = fmt(times.graph) if times.graph is not None else f"- ({times.graph_note or 'failed'})"
    best = times.best
    return [fmt(times.per_call), fmt(times.back_to_back), graph, f"{fmt(best)} ({best.method})"]


def device_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:
        return "unknown device"


def shape_names(text: str, shapes: Sequence[str]) -> list[str] | None:
    """The comma-separated shape names of ``text``, each one of ``shapes``; None after printing
    one error line naming the allowed ones."""
    names = text.split(",")
    unknown = [s for s in names if s not in shapes]
    if unknown:
        print(f"error: unknown shape {unknown[0]!r}; allowed: {', '.join(shapes)}", file=sys.stderr)
        return None
    return names


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    out = [f"### {title} ({datetime.date.today().isoformat()}, {device_name()})", "", line(cells[0]),
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def program_launch(program: Any, arg_sets: Sequence[dict[str, Any]], outputs: Sequence[Any]) -> Launch:
    """``launch(i)`` running a built program's host calls (``CompiledProgram.calls``) on the
    i-th set of TVM tensors named as its parameters, returning ``outputs[i]``: a tuned config
    timed on the operands the vendor's call gets."""
    funcs = {call.name: program.executable.mod[call.name] for call in program.calls}

    def launch(i: int) -> Any:
        bound = arg_sets[i]
        for call in program.calls:
            funcs[call.name](*[bound[a] if isinstance(a, str) else int(a) for a in call.args])
        return outputs[i]

    return launch


def torch_stream(cp: Any, torch: Any) -> Any:
    """CuPy's view of torch's current stream (a CUDA graph's capture stream included), so raw
    CuPy kernels are captured and ordered like the vendor's calls."""
    stream = torch.cuda.current_stream()
    if hasattr(cp.cuda.Stream, "from_external"):  # CuPy 14: ExternalStream is deprecated
        try:
            return cp.cuda.Stream.from_external(stream)
        except Exception:  # a torch stream without the CUDA stream protocol
            pass
    return cp.cuda.ExternalStream(stream.cuda_stream)


def poisoned_error(launch: Launch, out: Any, ref: Any) -> float:
    """``launch(0)``'s error against float64 ``ref`` with its output ``out`` (a torch tensor)
    filled with NaN first: a kernel that leaves elements unwritten gets NaN, not a pass."""
    import torch

    out.fill_(float("nan"))
    launch(0)
    torch.cuda.synchronize()
    return rel_error_vs(out, ref)


def tvm_launch(func: Callable[..., Any], arg_sets: Sequence[Sequence[Any]],
               outputs: Sequence[Any] | None = None) -> Launch:
    """``launch(i)`` for a TVM function over prepared argument lists, one per input set,
    returning what the call returns, or ``outputs[i]`` for a function that writes into a
    buffer of its arguments (a CUDA graph's replay is checked on the returned output)."""
    if outputs is None:
        return lambda i: func(*arg_sets[i])

    def launch(i: int) -> Any:
        func(*arg_sets[i])
        return outputs[i]

    return launch


def ours_on(template: Any, config: dict, target: Any, sets: list[tuple[Any, Any]]) -> tuple[Any, float]:
    """The tuned config built again and timed the vendor's three ways on the vendor's operands
    (B passed transposed where the kernel reads it [n, k]), and its error vs float64 on
    NaN-poisoned outputs."""
    import torch
    import tvm

    from tvm_ext.space import Config

    cfg = Config.of(config)
    op = template.measured_operator(cfg)
    program = template.build_program(cfg, target)
    _, b_spec = op.inputs()
    (c_spec,) = op.outputs()
    b_of = (lambda b: b) if tuple(b_spec.shape)[-2:] == tuple(sets[0][1].shape)[-2:] \
        else (lambda b: b.transpose(-1, -2).contiguous())
    outs = [torch.full(tuple(c_spec.shape), float("nan"), device="cuda", dtype=getattr(torch, c_spec.dtype))
            for _ in sets]
    scratch = {}
    for name, spec in zip(program.params[3:], op.scratch()):
        fill = 0.0 if spec.fill is None else spec.fill
        scratch[name] = tvm.runtime.from_dlpack(torch.full(tuple(spec.shape), fill, device="cuda",
                                                           dtype=getattr(torch, spec.dtype)))
    a_name, b_name, c_name = program.params[:3]
    args = [{a_name: tvm.runtime.from_dlpack(a), b_name: tvm.runtime.from_dlpack(b_of(b)),
             c_name: tvm.runtime.from_dlpack(c), **scratch} for (a, b), c in zip(sets, outs)]
    launch = program_launch(program, args, outs)
    launch(0)
    torch.cuda.synchronize()
    a, b = sets[0]
    err = rel_error_vs(outs[0], a.double() @ b.double())
    return time_ours_three(launch, len(sets)), err
