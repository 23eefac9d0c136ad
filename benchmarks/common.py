"""Shared helpers of the GPU benchmark scripts: the timing protocol on CUDA (torch's events
and graphs) and the printed table.

The protocol itself is ``tvm_ext.measure.timing`` (framework-free, tested on PoCL); this file adds
what needs torch: CUDA events as the clock, the vendor timed per call, back to back and
replayed from a CUDA graph (``time_vendor``), and our kernels timed back to back with the
same events and input rotation (``time_ours``), or, for TVM calls of a few microseconds,
the same three ways with TVM's launches captured in the graph (``time_ours_three``).  Every
benchmark reports its ratios against the vendor's best of the three (``VendorTimes.best``).

The GEMM comparisons also run in interleaved rounds (``interleaved_rounds``): ours and each
vendor replayed from CUDA graphs on the same rotated operands, the order reversed every round,
the SM clock and power read after each; the ratio quoted is the median of the per-round ratios
(``ratio_summary``), because a card at its power cap moves both sides by more than they differ.
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Callable

from tvm_ext.measure.timing import (BACK_TO_BACK, GRAPH, PER_CALL, Launch, Rotation, Timing, TimingSettings,
                                    VendorTimes, back_to_back, calls_per_sample, per_call, rotation_count)

__all__ = ["TorchEventClock", "time_vendor", "time_graph", "time_ours", "time_ours_three", "l2_rotation",
           "vendor_header", "vendor_cells", "vendor_methods", "seconds_by_method", "methods_text", "table",
           "device_name", "rel_error_vs", "tvm_launch", "torch_stream", "poisoned_error", "ours_on", "shape_names",
           "parse_shapes", "GpuReading", "parse_gpu_reading", "read_gpu", "smi_device", "round_order", "RoundRow",
           "interleaved_rounds", "RatioSummary", "ratio_summary", "graph_timer", "compare_in_rounds",
           "write_rounds", "rounds_header", "rounds_cells", "cublas_launches", "ours_launch", "TimingSettings",
           "VendorTimes", "Timing", "host_and_wall_us", "profiled"]

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


def host_and_wall_us(call: Callable[[], Any], n: int = 50,
                     before: Callable[[], Any] | None = None) -> tuple[float, float]:
    """Medians over ``n`` calls of ``call()``, each from an idle GPU (``before()`` first where
    given): the host time until it returns and the wall clock until the GPU is done, in µs."""
    import torch

    host, wall = [], []
    for _ in range(n):
        if before is not None:
            before()
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        host.append(time.perf_counter() - start)
        torch.cuda.synchronize()
        wall.append(time.perf_counter() - start)
    return statistics.median(host) * 1e6, statistics.median(wall) * 1e6


def profiled(run: Callable[[], Any], calls: int, warm: int = 1) -> Any:
    """torch's profiler (CUDA activity) over ``calls`` calls of ``run`` after ``warm`` unprofiled
    ones, the device synchronised before and after."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warm):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    return prof


def kernel_calls(run: Any, calls: int = 5, warm: int = 1) -> dict[str, tuple[float, int]]:
    """GPU µs and launches per call by kernel name over ``calls`` back-to-back calls after ``warm``
    (torch.profiler, CUDA), the most time first."""
    import torch

    per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in profiled(run, calls, warm).events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_name[event.name][0] += event.device_time_total / calls
            per_name[event.name][1] += 1
    ranked = sorted(per_name.items(), key=lambda kv: -kv[1][0])
    return {name: (us, launches // calls) for name, (us, launches) in ranked}


def kernel_breakdown(run: Any, calls: int = 5) -> dict[str, float]:
    """GPU µs per call by kernel name over ``calls`` back-to-back calls (``kernel_calls``)."""
    return {name: us for name, (us, _) in kernel_calls(run, calls).items()}


def breakdown_table(label: str, sides: dict[str, dict[str, float]], top: int) -> str:
    rows = []
    for side, kernels in sides.items():
        total = sum(kernels.values())
        rows.append([side, f"(all {len(kernels)} kernels)", f"{total:.1f}", "100 %"])
        for name, us in list(kernels.items())[:top]:
            rows.append([side, name[:90], f"{us:.1f}", f"{100 * us / total:.0f} %"])
    return table(f"{label}: GPU time per call by kernel (torch.profiler)", ["side", "kernel", "µs", "share"], rows)


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
    """'' when the graph's result equals the eager result of the same call, or differs from it
    by no more than rounding (normwise, 16 units of its type's epsilon: a library may pick
    another kernel under capture, e.g. cuBLAS in a 12-layer BERT: 1.25e-6 in float32, whose
    error against float64 is 1.3e-6 either way), else what differs."""
    import torch

    got, want = _tensors(graph_out), _tensors(eager_out)
    if len(got) != len(want):
        return f"graph returned {len(got)} tensors, eager {len(want)}"
    for a, b in zip(got, want):
        if a.shape != b.shape or not torch.equal(a, b):
            if a.shape != b.shape:
                return f"graph output has shape {tuple(a.shape)}, eager {tuple(b.shape)}"
            diff = (a.double() - b.double()).norm().item() / max(b.double().norm().item(), 1e-300)
            bound = 16 * torch.finfo(b.dtype).eps if b.is_floating_point() else 0.0
            if not diff <= bound:
                return f"graph output differs from eager output (normwise {diff:.3g} > {bound:.3g})"
    return ""


def _on(context: Any, tvm_stream: bool) -> Any:
    """``context`` (a torch stream or graph capture), with TVM's launches sent to the same
    stream where ``tvm_stream`` (TVM's CUDA runtime launches on the FFI's current stream)."""
    if not tvm_stream:
        return context
    import tvm_ffi

    return tvm_ffi.use_torch_stream(context)


def capture_graph(fn: Launch, sets: int, calls: int, tvm_stream: bool = False) -> tuple[Any, int]:
    """``calls`` calls (cycling the sets, rounded to a multiple of them) captured in one CUDA
    graph, checked, and the calls it holds.  ``fn(i)`` returns its output (a call that writes
    into a buffer returns that buffer).  The outputs are poisoned with NaN before the checked
    replay, and ``RuntimeError`` is raised if any set's replayed output differs from the same
    call run eagerly.  ``tvm_stream``: ``fn`` launches TVM kernels (see ``_on``)."""
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
    return graph, calls


def _replays(graph: Any, calls: int, sets: int, settings: TimingSettings) -> Timing:
    """Events around each replay of a captured graph, per call."""
    timed = per_call(lambda _: graph.replay(), 1, TorchEventClock(), settings)
    samples = tuple(s / calls for s in timed.samples)
    return Timing(GRAPH, timed.seconds / calls, samples, calls, sets)


def time_graph(fn: Launch, sets: int, calls: int, settings: TimingSettings = TimingSettings(),
               tvm_stream: bool = False) -> Timing:
    """``calls`` calls captured in one CUDA graph and checked (``capture_graph``); each sample
    is events around one replay, divided by the calls."""
    graph, calls = capture_graph(fn, sets, calls, tvm_stream)
    return _replays(graph, calls, sets, settings)


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


def gemm_operand_sets(m: int, n: int, k: int, dtype: str = "float32", count: int | None = None
                      ) -> list[tuple[Any, Any]]:
    """randn A [m, k] and B [k, n] of ``dtype`` on the GPU: ``count`` sets, by default enough to
    rotate past L2."""
    import torch

    torch_dtype = getattr(torch, dtype)
    if count is None:
        count = l2_rotation(torch_dtype.itemsize * (m * k + k * n + m * n))
    return [(torch.randn(m, k, device="cuda", dtype=torch_dtype), torch.randn(k, n, device="cuda", dtype=torch_dtype))
            for _ in range(count)]


def cublas_gemm(sets: Sequence[tuple[Any, Any]]) -> tuple[VendorTimes, float]:
    """torch's ``a @ b`` (cuBLAS, at the current TF32 setting) per call, back to back and from a
    CUDA graph on the rotated operands ``sets``, and its error vs float64 (of those operands)."""
    times = time_vendor(lambda i: sets[i][0] @ sets[i][1], len(sets))
    a, b = sets[0]
    return times, rel_error_vs(a @ b, a.double() @ b.double())


def _on_blas(choose: Callable[..., Any], library: str, fn: Launch) -> Launch:
    """``fn`` run with torch's preferred BLAS library set to ``library``, restored after."""
    def launch(i: int) -> Any:
        before = choose()
        choose(library)
        try:
            return fn(i)
        finally:
            choose(before)

    return launch


def cublas_launches(sets: Sequence[tuple[Any, Any]], lt: bool = False) -> dict[str, Launch]:
    """torch's ``a @ b`` on the rotated operands through cuBLAS, and where ``lt`` and this
    torch can choose (``torch.backends.cuda.preferred_blas_library``) through cuBLASLt too."""
    import torch

    matmul = lambda i: sets[i][0] @ sets[i][1]  # noqa: E731
    choose = getattr(torch.backends.cuda, "preferred_blas_library", None)
    if choose is None:
        return {"cuBLAS": matmul}
    launches = {"cuBLAS": _on_blas(choose, "cublas", matmul)}
    if lt:
        launches["cuBLASLt"] = _on_blas(choose, "cublaslt", matmul)
    return launches


E4M3_MAX = 448.0  # e4m3's largest finite value


def scaled_e4m3(x: Any) -> tuple[Any, Any]:
    """torch tensor ``x`` as e4m3 with its float32 per-tensor scale (amax / 448, the rule of
    ``precision.scaled_cast``), as a quantized model's operands and ``torch._scaled_mm`` take them."""
    import torch

    scale = (x.abs().max() / E4M3_MAX).float()
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


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


def case_rows(cases: Sequence[Any], labels: str, run_case: Callable[[Any], dict], summary: Callable[[dict], list],
              path: str) -> list[list[str]]:
    """The summary rows of the ``cases`` named in ``labels`` (comma-separated, spaces as _; none:
    all), each case's row appended to ``path`` as a JSON line as it comes; a case that fails is
    printed and the rest go on."""
    import json

    wanted = {c.strip().lower() for c in labels.split(",") if c.strip()}
    rows = []
    with open(path, "a") as log:
        for case in (c for c in cases if not wanted or c.label.lower().replace(" ", "_") in wanted):
            try:
                row = run_case(case)
            except Exception as exc:  # noqa: BLE001 - a failure is a line, never the end of the run
                print(f"[{case.label}] failed: {type(exc).__name__}: {exc}", flush=True)
                continue
            log.write(json.dumps(row) + "\n")
            log.flush()
            rows.append(summary(row))
            print(" | ".join(rows[-1]), flush=True)
    return rows


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
    (``ours_launch``), and its error vs float64 on NaN-poisoned outputs."""
    launch, err = ours_launch(template, config, target, sets)
    return time_ours_three(launch, len(sets)), err


def ours_launch(template: Any, config: dict, target: Any, sets: list[tuple[Any, Any]]) -> tuple[Launch, float]:
    """``launch(i)`` of the config built again on the vendor's operands ``sets`` (B passed
    transposed where the kernel reads it [n, k]: its ``b_layout`` "NK", or else its B's shape),
    and its error vs float64 on NaN-poisoned outputs."""
    import torch
    import tvm

    from tvm_ext.core.space import Config

    cfg = Config.of(config)
    op = template.measured_operator(cfg)
    program = template.build_program(cfg, target)
    _, b_spec = op.inputs()
    (c_spec,) = op.outputs()
    layout = getattr(template, "b_layout", None)  # where N == K the shapes cannot tell the layouts apart
    transposed = layout == "NK" if layout in ("NK", "KN") else tuple(b_spec.shape)[-2:] != tuple(sets[0][1].shape)[-2:]
    b_of = (lambda b: b.transpose(-1, -2).contiguous()) if transposed else (lambda b: b)
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
    return launch, err


def rows_by_shape(parser: Any, args: Any, named: Mapping[str, tuple[int, int, int]], shape_rows: Any
                  ) -> tuple[list[list[str]], list[list[str]]] | None:
    """A GEMM script's shapes run: ``--rounds`` at least 1 (else the parser's error), ``--shapes``
    parsed against ``named`` (None after its one error line), ``--out`` made, then each shape's
    table rows and rounds rows from ``shape_rows(m, n, k, target, args)`` on CUDA, in order, one
    line on stderr as each shape is done."""
    from tvm_ext.target import resolve_target

    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    shapes = parse_shapes(args.shapes, named)
    if shapes is None:
        return None
    os.makedirs(args.out, exist_ok=True)
    target = resolve_target("cuda")
    rows: list[list[str]] = []
    round_rows: list[list[str]] = []
    for name, (m, n, k) in shapes:
        shape, rounds = shape_rows(m, n, k, target, args)
        rows += shape
        round_rows += rounds
        print(f"{name} done", file=sys.stderr, flush=True)
    return rows, round_rows


def parse_shapes(text: str, named: Mapping[str, tuple[int, int, int]]) -> list[tuple[str, tuple[int, int, int]]] | None:
    """The comma-separated GEMM shapes of ``text``, each a name of ``named`` or ``MxNxK`` (or
    ``N`` for N³), as (label, (m, n, k)); None after printing one error line."""
    shapes = []
    for item in (s.strip() for s in text.split(",")):
        if item in named:
            shapes.append((item, tuple(named[item])))
            continue
        dims = item.lower().replace("³", "").split("x")
        if len(dims) == 1:
            dims = dims * 3
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            print(f"error: bad shape {item!r}: give MxNxK (e.g. 1024x768x3072), N for N³, or one of "
                  f"{', '.join(named)}", file=sys.stderr)
            return None
        m, n, k = map(int, dims)
        shapes.append((f"{m}x{n}x{k}", (m, n, k)))
    return shapes


# ---- interleaved rounds: ours and the vendors on the same operands, clocks read between ----------------
SMI_QUERY = ("nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits")
OURS = "ours"


@dataclass(frozen=True)
class GpuReading:
    """The SM clock (MHz) and board power (W) ``nvidia-smi`` reported; None where it could not
    (``note`` says why: no nvidia-smi, an error, a field it does not support)."""

    sm_clock_mhz: float | None = None
    power_w: float | None = None
    note: str = ""


def _number(field: str) -> float | None:
    try:
        return float(field.strip())
    except ValueError:  # '[N/A]', '[Not Supported]', ''
        return None


def parse_gpu_reading(text: str) -> GpuReading:
    """``nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits`` output
    ('1485, 699.12') as a reading; fields it could not give are None."""
    line = next((line for line in text.splitlines() if line.strip()), "")
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != 2:
        return GpuReading(note=f"unexpected nvidia-smi output {line[:80]!r}")
    clock, power = _number(fields[0]), _number(fields[1])
    unread = [f"{name} {field!r}" for name, field, value in (("clock", fields[0], clock), ("power", fields[1], power))
              if value is None]
    return GpuReading(clock, power, ", ".join(unread))


def read_gpu(device: str = "0", run: Callable[..., Any] = subprocess.run) -> GpuReading:
    """The SM clock and power of nvidia-smi's GPU ``device`` (an index or a UUID) now; a
    reading of None fields (with the reason) where nvidia-smi is missing or fails."""
    try:
        done = run([*SMI_QUERY, "-i", device], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError) as exc:
        return GpuReading(note=f"nvidia-smi not run: {type(exc).__name__}: {exc}"[:160])
    if done.returncode != 0:
        why = (done.stderr or done.stdout or "").strip().splitlines()
        return GpuReading(note=f"nvidia-smi exit {done.returncode}: {why[0] if why else ''}"[:160])
    return parse_gpu_reading(done.stdout)


def smi_device(uuid: str | None, visible: str | None) -> str:
    """The ``-i`` that names torch's device 0 to nvidia-smi: its UUID where torch gives one
    (nvidia-smi's indices follow PCI order, CUDA's need not), else the first of
    ``CUDA_VISIBLE_DEVICES``, else '0'."""
    if uuid:
        return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    first = (visible or "").split(",")[0].strip()
    return first or "0"


def round_order(sides: Sequence[str], index: int) -> tuple[str, ...]:
    """The order the sides run in round ``index``: as given in even rounds, reversed in odd
    ones, so over an even number of rounds ours runs before and after each vendor equally
    often and a clock that drifts within a round favours neither."""
    return tuple(sides) if index % 2 == 0 else tuple(reversed(sides))


@dataclass(frozen=True)
class RoundRow:
    """One round: each side's seconds per call, the order they ran in, and the GPU's reading
    taken after the round."""

    index: int
    order: tuple[str, ...]
    seconds: Mapping[str, float]
    gpu: GpuReading

    def ratio(self, vendor: str, ours: str = OURS) -> float:
        """Ours' speed over the vendor's in this round (> 1: ours faster)."""
        return self.seconds[vendor] / self.seconds[ours]


def interleaved_rounds(timers: Mapping[str, Callable[[], float]], rounds: int, read: Callable[[], GpuReading],
                       on_round: Callable[[RoundRow], None] | None = None) -> list[RoundRow]:
    """``rounds`` rounds of every timer (a side's name to a call returning its seconds per call,
    e.g. a graph's replays), in ``round_order``, the GPU read after each round."""
    if rounds < 1:
        raise ValueError(f"at least one round, got {rounds}")
    rows = []
    for index in range(rounds):
        order = round_order(list(timers), index)
        seconds = {side: timers[side]() for side in order}
        rows.append(RoundRow(index, order, seconds, read()))
        if on_round is not None:
            on_round(rows[-1])
    return rows


@dataclass(frozen=True)
class RatioSummary:
    """Ours against one vendor over the rounds: the median of the per-round ratios (the figure
    to quote), their range, the best round of each side against the other's best, each side's
    median seconds, and the range of SM clocks (MHz) and power (W) read (None: not read)."""

    vendor: str
    rounds: int
    median: float
    low: float
    high: float
    best_vs_best: float
    ours_median_s: float
    vendor_median_s: float
    clock_mhz: tuple[float, float] | None
    power_w: tuple[float, float] | None


def _span(values: Sequence[float | None]) -> tuple[float, float] | None:
    known = [v for v in values if v is not None]
    return (min(known), max(known)) if known else None


def ratio_summary(rows: Sequence[RoundRow], vendor: str, ours: str = OURS) -> RatioSummary:
    """The rounds of ``rows`` where both sides ran, summarised (``RatioSummary``)."""
    both = [r for r in rows if vendor in r.seconds and ours in r.seconds]
    if not both:
        raise ValueError(f"no round timed both {ours} and {vendor}")
    ratios = [r.ratio(vendor, ours) for r in both]
    ours_s = [r.seconds[ours] for r in both]
    vendor_s = [r.seconds[vendor] for r in both]
    return RatioSummary(vendor, len(both), statistics.median(ratios), min(ratios), max(ratios),
                        min(vendor_s) / min(ours_s), statistics.median(ours_s), statistics.median(vendor_s),
                        _span([r.gpu.sm_clock_mhz for r in both]), _span([r.gpu.power_w for r in both]))


def round_json(shape: str, row: RoundRow, ours: str = OURS, **extra: Any) -> dict[str, Any]:
    """One round as a JSON object (a line of the raw rounds file)."""
    return {"shape": shape, "round": row.index, "order": list(row.order), "seconds": dict(row.seconds),
            "ratio": {side: row.ratio(side, ours) for side in row.seconds if side != ours},
            "sm_clock_mhz": row.gpu.sm_clock_mhz, "power_w": row.gpu.power_w, "smi_note": row.gpu.note, **extra}


def write_rounds(path: str, shape: str, rows: Sequence[RoundRow], **extra: Any) -> None:
    """Append the rounds as JSON lines to ``path`` (earlier runs' lines are kept)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(round_json(shape, row, **extra)) + "\n")


def rounds_header(unit: str = "ms") -> list[str]:
    """Column names of ``rounds_cells``: the median ratio first among the ratios."""
    return ["vendor", "median ratio (ours speed / vendor's)", "min ratio", "max ratio", "best vs best",
            f"ours median {unit}", f"vendor median {unit}", "rounds", "SM clock MHz", "power W"]


def rounds_cells(summary: RatioSummary, scale: float = 1e3, digits: int = 4) -> list[str]:
    """A summary's cells for ``rounds_header`` (``scale``: 1e3 for ms)."""
    span = lambda s: "-" if s is None else f"{s[0]:.0f}–{s[1]:.0f}"  # noqa: E731
    return [summary.vendor, f"{summary.median:.3f}", f"{summary.low:.3f}", f"{summary.high:.3f}",
            f"{summary.best_vs_best:.3f}", f"{summary.ours_median_s * scale:.{digits}f}",
            f"{summary.vendor_median_s * scale:.{digits}f}", str(summary.rounds), span(summary.clock_mhz),
            span(summary.power_w)]


# ---- the torch side of the rounds --------------------------------------------------------------------
def graph_timer(fn: Launch, sets: int, settings: TimingSettings = TimingSettings(),
                tvm_stream: bool = False) -> Callable[[], float]:
    """``fn`` captured once in a checked CUDA graph of enough calls for a ``min_secs`` replay
    (estimated back to back); the returned call times its replays (median of ``repeat``) and
    gives seconds per call, every time it is called (one per round)."""
    estimate = back_to_back(fn, sets, TorchEventClock(), TimingSettings(warmup=sets, repeat=3, min_secs=0.005))
    graph, calls = capture_graph(fn, sets, calls_per_sample(estimate.seconds, sets, settings), tvm_stream)
    return lambda: _replays(graph, calls, sets, settings).seconds


def torch_smi_device() -> str:
    """``smi_device`` for torch's device 0."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None)
    return smi_device(str(uuid) if uuid else None, os.environ.get("CUDA_VISIBLE_DEVICES"))


def compare_in_rounds(shape: str, ours: Launch, vendors: Mapping[str, Launch], sets: int, rounds: int,
                      out_path: str, settings: TimingSettings = TimingSettings(),
                      peers: Mapping[str, Launch] | None = None, **extra: Any
                      ) -> tuple[list[RatioSummary], dict[str, str]]:
    """Ours (TVM launches) and each vendor on the same ``sets`` rotated operands, each
    replayed from its own CUDA graph, in ``rounds`` interleaved rounds with the GPU read after
    each; the raw rounds appended to ``out_path`` (JSON lines).  A vendor whose graph cannot
    be captured is left out, with why; ours failing raises.  ``peers``: other kernels of ours
    in the same rounds, each summarised against every vendor (its label ``"vendor, ours
    NAME"``) and against ours (``"ours, ours NAME"``: the peer's speed over ours)."""
    device = torch_smi_device()
    timers = {OURS: graph_timer(ours, sets, settings, tvm_stream=True)}
    for name, fn in (peers or {}).items():
        timers[name] = graph_timer(fn, sets, settings, tvm_stream=True)
    left_out = {}
    for name, fn in vendors.items():
        try:
            timers[name] = graph_timer(fn, sets, settings)
        except Exception as exc:  # reported beside the table, never the end of the run
            text = [line for line in str(exc).strip().splitlines() if line.strip()]
            left_out[name] = (text[0] if text else type(exc).__name__)[:160]
    rows = interleaved_rounds(timers, rounds, lambda: read_gpu(device))
    write_rounds(out_path, shape, rows, device=device_name(), **extra)
    ours_sides = [OURS, *(peers or {})]
    summaries = [ratio_summary(rows, name) for name in timers if name not in ours_sides]
    for peer in ours_sides[1:]:
        summaries += [replace(ratio_summary(rows, name, ours=peer), vendor=f"{name}, ours {peer}")
                      for name in timers if name not in ours_sides[1:]]
    return summaries, left_out


def parse_knob_sets(text: str, option: str, bare: tuple[str, ...] = ()) -> dict[str, dict[str, int]]:
    """An option naming configs as knob changes: 'label:knob=v,knob=v;...' -> {label: {knob: v}}; a
    label of ``bare`` may stand alone (no changes).  ValueError naming ``option`` and the bad part."""
    sets: dict[str, dict[str, int]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        if part in bare:
            sets[part] = {}
            continue
        label, sep, knobs = part.partition(":")
        try:
            changes = {k.strip(): int(v) for k, v in (kv.split("=") for kv in knobs.split(",") if kv.strip())}
        except ValueError:
            changes = {}
        if not sep or not label.strip() or not changes:
            raise ValueError(f"{option} takes 'label:knob=integer,...;...', got {part!r}")
        sets[label.strip()] = changes
    return sets
