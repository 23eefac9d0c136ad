"""One executor per backend: a program's buffers allocated once, its launches run in order.

``OpenclExecutor`` runs device kernels through pyopencl (the PyPI TVM wheel has no OpenCL
runtime); ``CudaExecutor`` calls a TVM module's functions through TVM's runtime.  The
runner (measuring candidates), the GRU layer, the Relax OpenCL path and generated
programs all run through them; ``opencl_context`` is the one cache of OpenCL contexts
and queues per device in a process.

Both keep ``sets`` copies of every buffer (set 0 is the one ``write``/``read`` use by
default): timing rotates inputs over several sets when they fit in L2 together.  The first
``prepared`` launches (calls) prepare what the inputs' weights give once (a GRU's W_ih split
into its parts): ``prepare`` runs them after the weights are written, ``run`` only the rest.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any, Mapping, Sequence

import numpy as np

from ..precision.precision import itemsize, np_dtype
from .program import MAIN, KernelLaunch, TensorSpec

STAGE_REPEAT = 3  # timed passes per stage measurement (after one warm-up pass)
_PROGRAM_CACHE_SIZE = 64  # built OpenCL programs kept per process (by source)

_CONTEXTS: dict[int, tuple[Any, Any]] = {}
_PROFILING_QUEUES: dict[int, Any] = {}
_PROGRAMS: dict[tuple[int, str], Any] = {}


# ---- OpenCL ------------------------------------------------------------------------------
def opencl_context(device_id: int) -> tuple[Any, Any]:
    """The context of OpenCL device ``device_id`` and its plain in-order queue (made once)."""
    import pyopencl as cl

    from ..target import opencl_device

    if device_id not in _CONTEXTS:
        ctx = cl.Context([opencl_device(device_id)])
        _CONTEXTS[device_id] = (ctx, cl.CommandQueue(ctx))
    return _CONTEXTS[device_id]


def opencl_profiling_queue(device_id: int) -> Any:
    """A second queue on the same context with profiling events, for device timing only
    (the plain queue stays free of profiling overhead)."""
    import pyopencl as cl

    if device_id not in _PROFILING_QUEUES:
        ctx, _ = opencl_context(device_id)
        _PROFILING_QUEUES[device_id] = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    return _PROFILING_QUEUES[device_id]


def opencl_program(device_id: int, source: str) -> Any:
    """``source`` built for the device (each distinct source once per process)."""
    import pyopencl as cl

    key = (device_id, source)
    if key not in _PROGRAMS:
        if len(_PROGRAMS) >= _PROGRAM_CACHE_SIZE:
            _PROGRAMS.clear()
        ctx, _ = opencl_context(device_id)
        _PROGRAMS[key] = cl.Program(ctx, source).build()
    return _PROGRAMS[key]


def nbytes(spec: TensorSpec) -> int:
    return int(np.prod(spec.shape)) * itemsize(spec.dtype)


def contiguous(array: Any, spec: TensorSpec) -> np.ndarray:
    """``array`` in the buffer's layout and dtype (rounded to it: float32 -> bfloat16, ...)."""
    array = np.asarray(array)
    if array.dtype != np_dtype(spec.dtype):
        array = array.astype(np_dtype(spec.dtype))
    return np.ascontiguousarray(array.reshape(spec.shape))


def _stage_totals(named_secs: Sequence[tuple[Sequence[str], float]], stages: Sequence[str]) -> dict[str, float]:
    totals = dict.fromkeys(stages, 0.0)
    for owners, secs in named_secs:
        for stage in owners:
            totals[stage] += secs
    return totals


def _stage_names(stages: Sequence[Sequence[str]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s for owners in stages for s in owners))


class OpenclExecutor:
    """Device kernels through pyopencl: one kernel object per launch and buffer set with its
    arguments set once, so a run is only ``enqueue_nd_range_kernel`` calls.

    ``steps``: (OpenCL source, launch) pairs in order, the launch's arguments naming buffers
    of ``specs`` (or scalar ints); a program of one source is ``OpenclExecutor.of``."""

    def __init__(self, steps: Sequence[tuple[str, KernelLaunch]], specs: Mapping[str, TensorSpec], device_id: int,
                 sets: int = 1, profiling: bool = False, prepared: int = 0):
        import pyopencl as cl

        self.device_id = device_id
        self.prepared = prepared
        self.ctx, plain = opencl_context(device_id)
        self.queue = opencl_profiling_queue(device_id) if profiling else plain
        self.specs = dict(specs)
        self.launches = [launch for _, launch in steps]
        flags = cl.mem_flags.READ_WRITE
        self.sets = [{name: cl.Buffer(self.ctx, flags, size=max(1, nbytes(spec))) for name, spec in self.specs.items()}
                     for _ in range(max(1, sets))]
        self.kernels: list[list[tuple[Any, Any, Any]]] = []
        for bufs in self.sets:
            bound = []
            for source, launch in steps:
                kernel = cl.Kernel(opencl_program(device_id, source), launch.name)
                kernel.set_args(*[bufs[a] if isinstance(a, str) else np.int32(a) for a in launch.args])
                bound.append((kernel, launch.global_size, launch.block))
            self.kernels.append(bound)

    @classmethod
    def of(cls, source: str, launches: Sequence[KernelLaunch], specs: Mapping[str, TensorSpec], device_id: int,
           **options: Any) -> "OpenclExecutor":
        return cls([(source, launch) for launch in launches], specs, device_id, **options)

    def write(self, name: str, array: Any, set_index: int = 0) -> None:
        import pyopencl as cl

        cl.enqueue_copy(self.queue, self.sets[set_index][name], contiguous(array, self.specs[name]))

    def read(self, name: str, set_index: int = 0) -> np.ndarray:
        import pyopencl as cl

        spec = self.specs[name]
        out = np.empty(spec.shape, np_dtype(spec.dtype))
        cl.enqueue_copy(self.queue, out, self.sets[set_index][name])
        return out

    def run(self, set_index: int = 0, queue: Any = None) -> list[Any]:
        """Enqueue every launch (but the ``prepared`` ones) on buffer set ``set_index``; their events."""
        return self._enqueue(self.kernels[set_index][self.prepared:], queue)

    def prepare(self, set_index: int = 0) -> None:
        """Enqueue the ``prepared`` launches on buffer set ``set_index`` (after its weights are written)."""
        self._enqueue(self.kernels[set_index][:self.prepared], None)

    def _enqueue(self, kernels: Sequence[tuple[Any, Any, Any]], queue: Any) -> list[Any]:
        import pyopencl as cl

        queue = queue or self.queue
        return [cl.enqueue_nd_range_kernel(queue, kernel, global_size, block) for kernel, global_size, block in kernels]

    def sync(self) -> None:
        self.queue.finish()

    def device_secs(self, set_index: int = 0) -> float:
        """One run timed by profiling events, first start to last end (a profiling executor)."""
        events = self.run(set_index)
        events[-1].wait()
        return (events[-1].profile.end - events[0].profile.start) * 1e-9

    def stage_secs(self, stages: Sequence[Sequence[str]], repeat: int = STAGE_REPEAT) -> dict[str, float]:
        """Device seconds per run of each stage: every launch enqueued on a profiling queue, its
        event time added to the stages ``stages[i]`` names for launch i; the median over
        ``repeat`` runs after one warm-up run."""
        self.sync()
        queue = opencl_profiling_queue(self.device_id)
        names = _stage_names(stages)
        passes = []
        for _ in range(repeat + 1):
            events = self.run(0, queue)
            queue.finish()
            passes.append(_stage_totals([(owners, (e.profile.end - e.profile.start) * 1e-9)
                                         for owners, e in zip(stages, events)], names))
        return {stage: statistics.median(p[stage] for p in passes[1:]) for stage in names}


# ---- CUDA ----------------------------------------------------------------------------------
def load_library(library: bytes) -> Any:
    """A TVM runtime module from an exported library's bytes (loaded from a temporary file)."""
    import tvm

    with tempfile.TemporaryDirectory(prefix="tvm_ext_run_") as tmp:
        path = os.path.join(tmp, "program.so")
        with open(path, "wb") as fh:
            fh.write(library)
        return tvm.runtime.load_module(path)


class CudaExecutor:
    """A TVM module's functions through TVM's runtime: one packed-function call per ``calls``
    entry, its arguments naming buffers of ``specs`` (or scalar ints).

    ``dev``: where the buffers live and the module runs, default ``tvm.cuda(device_id)``; a
    remote module and device of an RPC session work the same way (every call goes over the
    connection)."""

    def __init__(self, module: Any, calls: Sequence[KernelLaunch], specs: Mapping[str, TensorSpec], device_id: int,
                 sets: int = 1, dev: Any = None, prepared: int = 0):
        import tvm

        self.module = module
        self.prepared = prepared
        self.dev = dev if dev is not None else tvm.cuda(device_id)
        self.remote = dev is not None
        self.specs = dict(specs)
        self.names = [c.name for c in calls]
        funcs = {name: module[name] for name in dict.fromkeys(self.names)}
        self.sets = [{name: tvm.runtime.empty(spec.shape, spec.dtype, self.dev) for name, spec in self.specs.items()}
                     for _ in range(max(1, sets))]
        self.calls = [[(funcs[c.name], [tensors[a] if isinstance(a, str) else int(a) for a in c.args]) for c in calls]
                      for tensors in self.sets]
        self.single_main = len(calls) == 1 and calls[0].name == MAIN
        self.arg_names = [tuple(a if isinstance(a, str) else None for a in c.args) for c in calls]

    @classmethod
    def from_library(cls, library: bytes, calls: Sequence[KernelLaunch], specs: Mapping[str, TensorSpec],
                     device_id: int, **options: Any) -> "CudaExecutor":
        return cls(load_library(library), calls, specs, device_id, **options)

    def write(self, name: str, array: Any, set_index: int = 0) -> None:
        self.sets[set_index][name].copyfrom(contiguous(array, self.specs[name]))

    def read(self, name: str, set_index: int = 0) -> np.ndarray:
        return self.sets[set_index][name].numpy()

    def run(self, set_index: int = 0) -> None:
        """Every call but the ``prepared`` ones, on buffer set ``set_index``."""
        for func, args in self.calls[set_index][self.prepared:]:
            func(*args)

    def prepare(self, set_index: int = 0) -> None:
        """The ``prepared`` calls on buffer set ``set_index`` (after its weights are written)."""
        for func, args in self.calls[set_index][:self.prepared]:
            func(*args)

    def run_bound(self, tensors: Mapping[str, Any], set_index: int = 0) -> None:
        """``run`` with some buffers replaced by caller-owned tensors of the same shape and
        dtype (anything TVM's FFI takes through DLPack, e.g. torch CUDA tensors): the
        caller's memory is read and written in place, no copy."""
        calls = zip(self.calls[set_index][self.prepared:], self.arg_names[self.prepared:])
        for (func, args), names in calls:
            func(*[tensors.get(name, arg) if name else arg for arg, name in zip(args, names)])

    def sync(self) -> None:
        self.dev.sync()

    def capture(self, call_secs: float) -> Any:
        """The program's calls captured as one CUDA graph (``tvm_ext.measure.cuda_graph``), as many
        times as a replay of about 2 ms holds at ``call_secs`` a call, cycling the input sets;
        ``CudaGraphError`` over RPC (the graph would have to be captured on the server)."""
        from .cuda_graph import CapturedCalls, CudaGraphError, calls_per_replay

        if self.remote:
            raise CudaGraphError("not captured over RPC")
        return CapturedCalls(self.dev, self.run, len(self.sets), calls_per_replay(call_secs, len(self.sets)))

    def evaluator_secs(self, repeat: int, min_repeat_secs: float) -> list[float]:
        """TVM's device-synchronised timer on ``main`` (a single-function program, set 0)."""
        _, args = self.calls[0][0]
        evaluator = self.module.time_evaluator(MAIN, self.dev, number=1, repeat=repeat,
                                               min_repeat_ms=int(min_repeat_secs * 1000))
        return [float(x) for x in evaluator(*args).results]

    def stage_secs(self, stages: Sequence[Sequence[str]], repeat: int = STAGE_REPEAT) -> dict[str, float]:
        """Seconds per run of each stage: the calls of one stage (``stages[i]`` names call i's)
        run back to back, the others left out, synchronised, host clock; the median over
        ``repeat`` runs after one warm-up run.  For ranking stages: run on their own, kernels
        may time a little differently than interleaved."""
        out = {}
        for stage in _stage_names(stages):
            calls = [call for owners, call in zip(stages, self.calls[0][self.prepared:]) if stage in owners]
            times = []
            for _ in range(repeat + 1):
                self.sync()
                start = time.perf_counter()
                for func, args in calls:
                    func(*args)
                self.sync()
                times.append(time.perf_counter() - start)
            out[stage] = statistics.median(times[1:])
        return out
