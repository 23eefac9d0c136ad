"""Runners: check one built kernel against the reference, then time it on the device.

Measurement happens one kernel at a time in a single isolated worker process, so a
kernel that hangs (run timeout) or crashes the process becomes an error record and
the search goes on with a fresh worker.  Like meta_schedule's runner, ``run`` takes a
list and returns a list of ``RunResult``; failures are data.
"""
from __future__ import annotations

import math
import statistics
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .builder import Artifact, BuildResult
from .precision import np_dtype, relative_error
from .target import TargetInfo
from .template import Template
from .timing import rotation_count


@dataclass(frozen=True)
class MeasureSettings:
    warmup: int = 2
    repeat: int = 5  # timed repeats; the cost is their median
    min_repeat_secs: float = 0.02  # each repeat loops the kernel at least this long
    seed: int = 0  # inputs used for the correctness check and timing


@dataclass(frozen=True)
class RunResult:
    costs: tuple[float, ...]  # seconds per run, one per repeat
    error_kind: str = ""  # "", run_error, run_timeout, wrong_answer, crash
    error_msg: str = ""
    metrics: dict = field(default_factory=dict)  # e.g. rel_error, stage_secs

    @property
    def ok(self) -> bool:
        return not self.error_kind

    @property
    def cost(self) -> float:
        return statistics.median(self.costs) if self.ok and self.costs else math.inf


MAX_ROTATION_SETS = 32  # input sets a measurement cycles through at most


def _rotation_sets(template: Template, target: TargetInfo) -> int:
    """How many input sets to cycle through so timing does not measure a warm L2: together
    twice the L2 (``tvm_ext.timing.rotation_count``, the benchmarks' rule too)."""
    if target.is_cpu:
        return 1
    return rotation_count(template.bytes_moved(), target.l2_bytes, MAX_ROTATION_SETS)


def time_loop(launch: Callable[[int], None], sync: Callable[[], None], settings: MeasureSettings) -> list[float]:
    """Default timer: host clock around ``number`` back-to-back launches, synchronised.

    ``launch(i)`` runs the kernel on input set i.  ``number`` grows until one repeat
    lasts ``min_repeat_secs``, so launch overhead and timer resolution stay small.
    """
    for i in range(settings.warmup):
        launch(i)
    sync()
    number, elapsed = 1, 0.0
    while True:
        start = time.perf_counter()
        for i in range(number):
            launch(i)
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= settings.min_repeat_secs or number >= 1 << 16:
            break
        number = min(1 << 16, max(number * 2, int(number * settings.min_repeat_secs / max(elapsed, 1e-9))))
    costs = [elapsed / number]
    for _ in range(settings.repeat - 1):
        start = time.perf_counter()
        for i in range(number):
            launch(i)
        sync()
        costs.append((time.perf_counter() - start) / number)
    return costs


# ---- worker-side state (one process, kept across measurements) ------------------------
_STATE: dict[Any, Any] = {}  # device contexts and queues
_REFERENCES: dict[Any, tuple[list[np.ndarray], list[np.ndarray]]] = {}
_MAX_REFERENCES = 64  # workloads whose inputs and reference a worker keeps


def _reference_case(template: Template, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Inputs and float64 reference for this workload, computed once per worker."""
    key = (repr(template), seed)
    if key not in _REFERENCES:
        if len(_REFERENCES) >= _MAX_REFERENCES:  # bound memory, keep device contexts
            _REFERENCES.clear()
        _REFERENCES[key] = template.make_case(np.random.default_rng(seed))
    return _REFERENCES[key]


def _poisoned_outputs(template: Template) -> list[np.ndarray]:
    """Outputs (then scratch buffers) filled with NaN, so an unwritten element fails the check;
    a scratch buffer that declares a ``fill`` (a counter that starts at 0) gets that."""
    outs = []
    for spec in template.outputs() + template.scratch():
        arr = np.empty(spec.shape, np_dtype(spec.dtype))
        if spec.fill is not None:
            arr.fill(spec.fill)
        else:
            arr.fill(np.nan if spec.dtype.startswith(("float", "bfloat")) else -1)
        outs.append(arr)
    return outs


def opencl_context(device_id: int) -> tuple[Any, Any]:
    import pyopencl as cl

    from .target import opencl_device

    key = ("opencl", device_id)
    if key not in _STATE:
        ctx = cl.Context([opencl_device(device_id)])
        queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        _STATE[key] = (ctx, queue)
    return _STATE[key]


def opencl_kernels(ctx: Any, artifact: Artifact) -> list[tuple[Any, Any]]:
    """Compile an OpenCL artifact's source; its kernels paired with their launches, in order."""
    import pyopencl as cl

    program = cl.Program(ctx, artifact.source).build()
    return [(getattr(program, l.name), l) for l in artifact.launches]


def enqueue_launches(queue: Any, kernels: list[tuple[Any, Any]], bufs: dict[str, Any]) -> list[Any]:
    """Enqueue the kernels in launch order on ``bufs`` (parameter name -> buffer or scalar).

    The one place that turns ``KernelLaunch``es into pyopencl calls: measurement and the
    Relax OpenCL executor (``tvm_ext.relax_opencl``) share it.
    """
    events = []
    for kernel, launch in kernels:
        args = [bufs[a] if isinstance(a, str) else np.int32(a) for a in launch.args]
        events.append(kernel(queue, launch.global_size, launch.block, *args))
    return events


def measure_opencl(artifact: Artifact, template: Template, target: TargetInfo,
                   settings: MeasureSettings) -> RunResult:
    """Run an OpenCL artifact through pyopencl: launches derived from the lowered TIR."""
    import pyopencl as cl

    ctx, queue = opencl_context(target.device_id)
    kernels = opencl_kernels(ctx, artifact)
    inputs, refs = _reference_case(template, settings.seed)
    n_in = len(template.inputs())
    mf = cl.mem_flags

    def device_buffers(arrays: list[np.ndarray]) -> dict[str, Any]:
        names = artifact.params
        bufs = {}
        for name, arr in zip(names, arrays):
            bufs[name] = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=arr)
        return bufs

    outs = _poisoned_outputs(template)
    check_bufs = device_buffers(inputs + outs)

    def enqueue(bufs: dict[str, Any]) -> list[Any]:
        return enqueue_launches(queue, kernels, bufs)

    enqueue(check_bufs)
    queue.finish()
    for name, out in zip(artifact.params[n_in:], outs):
        cl.enqueue_copy(queue, out, check_bufs[name])
    queue.finish()
    wrong = template.check(outs[: len(refs)], refs)
    if wrong:
        return RunResult((), "wrong_answer", wrong)
    metrics = {"rel_error": relative_error(outs[: len(refs)], refs)}

    sets = [check_bufs]
    rng = np.random.default_rng(settings.seed + 1)
    for _ in range(_rotation_sets(template, target) - 1):
        sets.append(device_buffers(template.make_inputs(rng) + _poisoned_outputs(template)))

    # Device-side timing with profiling events (first start to last end of a launch group).
    def one(i: int) -> float:
        events = enqueue(sets[i % len(sets)])
        events[-1].wait()
        return (events[-1].profile.end - events[0].profile.start) * 1e-9

    for i in range(settings.warmup):
        one(i)
    samples = [one(i) for i in range(max(settings.repeat, 3))]
    # Short kernels: average a few more so the median is stable.
    while sum(samples) < settings.min_repeat_secs and len(samples) < 200:
        samples.extend(one(i) for i in range(len(samples)))
    chunk = max(1, len(samples) // settings.repeat)
    costs = [statistics.median(samples[i:i + chunk]) for i in range(0, chunk * settings.repeat, chunk)]
    return RunResult(tuple(costs), metrics=metrics)


def measure_cuda(artifact: Artifact, template: Template, target: TargetInfo,
                 settings: MeasureSettings) -> RunResult:
    """Load the exported TVM module and time it on the GPU (inputs rotated if they fit in L2)."""
    import tvm

    dev = tvm.cuda(target.device_id)
    module = tvm.runtime.load_module(artifact.library)
    func = module["main"]
    inputs, refs = _reference_case(template, settings.seed)
    outs = _poisoned_outputs(template)
    args = [tvm.runtime.tensor(a, dev) for a in inputs + outs]
    func(*args)
    dev.sync()
    n_in = len(inputs)
    results = [a.numpy() for a in args[n_in : n_in + len(refs)]]
    wrong = template.check(results, refs)
    if wrong:
        return RunResult((), "wrong_answer", wrong)
    metrics = {"rel_error": relative_error(results, refs)}
    sets = [args]
    rng = np.random.default_rng(settings.seed + 1)
    for _ in range(_rotation_sets(template, target) - 1):
        sets.append([tvm.runtime.tensor(a, dev) for a in template.make_inputs(rng) + _poisoned_outputs(template)])
    if len(sets) == 1:  # inputs larger than L2: TVM's own device-synchronised timer
        evaluator = module.time_evaluator(
            "main", dev, number=1, repeat=settings.repeat, min_repeat_ms=int(settings.min_repeat_secs * 1000))
        return RunResult(tuple(float(x) for x in evaluator(*args).results), metrics=metrics)
    costs = time_loop(lambda i: func(*sets[i % len(sets)]), dev.sync, settings)
    return RunResult(tuple(costs), metrics=metrics)


MEASURE: dict[str, Callable[..., RunResult]] = {"opencl": measure_opencl, "cuda": measure_cuda}


def _measure_in_worker(artifact: Artifact, template: Template, target: TargetInfo,
                       settings: MeasureSettings) -> RunResult:
    try:
        if hasattr(template, "measure_artifact"):  # templates that build their own artifacts
            return template.measure_artifact(artifact, target, settings)
        return MEASURE[artifact.kind](artifact, template, target, settings)
    except Exception as exc:
        text = str(exc).strip().splitlines()
        return RunResult((), "run_error", (text[-1] if text else type(exc).__name__)[:300])


class LocalRunner:
    """Measures one kernel at a time in an isolated worker with a run timeout."""

    def __init__(self, target: TargetInfo, settings: MeasureSettings | None = None, timeout: float = 60.0):
        self.target = target
        self.settings = settings or MeasureSettings()
        self.timeout = timeout
        self._pool: Any = None

    def _get_pool(self) -> Any:
        if self._pool is None:
            import multiprocessing

            from pebble import ProcessPool

            self._pool = ProcessPool(max_workers=1, context=multiprocessing.get_context("spawn"))
        return self._pool

    def run(self, template: Template, builds: Sequence[BuildResult]) -> list[RunResult]:
        results = []
        for build in builds:
            if build.artifact is None:
                results.append(RunResult((), build.error_kind or "build_error", build.error_msg))
                continue
            future = self._get_pool().schedule(
                _measure_in_worker, args=(build.artifact, template, self.target, self.settings),
                timeout=self.timeout,
            )
            try:
                results.append(future.result())
            except FutureTimeout:
                results.append(RunResult((), "run_timeout", f"kernel ran longer than {self.timeout:g} s"))
            except Exception as exc:  # the worker died: a trap or segfault in the kernel
                results.append(RunResult((), "crash", f"{type(exc).__name__}: {exc}"[:300]))
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool.join()
            self._pool = None
