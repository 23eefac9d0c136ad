"""Executors of a GRU plan: buffers allocated once, the whole plan enqueued per run, on
OpenCL (pyopencl) or CUDA (TVM's runtime module); both also time each stage's kernels."""
from __future__ import annotations

import statistics
import time
from typing import Any, Mapping, Sequence

import numpy as np

from tvm_ext.precision import itemsize, np_dtype
from tvm_ext.template import TensorSpec

from .compute import STAGES, function_stages

_CL_CONTEXTS: dict[int, Any] = {}
_CL_PROFILING_QUEUES: dict[int, Any] = {}
STAGE_REPEAT = 3  # timed passes per stage measurement (after one warm-up pass)


def _cl_context(device_id: int) -> tuple[Any, Any]:
    import pyopencl as cl

    from tvm_ext.target import opencl_device

    if device_id not in _CL_CONTEXTS:
        ctx = cl.Context([opencl_device(device_id)])
        _CL_CONTEXTS[device_id] = (ctx, cl.CommandQueue(ctx))
    return _CL_CONTEXTS[device_id]


def _cl_profiling_queue(device_id: int) -> Any:
    """A second queue on the same context with profiling events, for per-stage timing only
    (the plain queue stays free of profiling overhead)."""
    import pyopencl as cl

    if device_id not in _CL_PROFILING_QUEUES:
        ctx, _ = _cl_context(device_id)
        _CL_PROFILING_QUEUES[device_id] = cl.CommandQueue(
            ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    return _CL_PROFILING_QUEUES[device_id]


def _stage_totals(named_secs: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Seconds per stage from (kernel or function name, seconds) pairs of one pass."""
    totals = dict.fromkeys(STAGES, 0.0)
    for name, secs in named_secs:
        for stage in function_stages(name):
            totals[stage] += secs
    return totals


class OpenclExecutor:
    """Runs a plan's kernel launches with pyopencl: one kernel object per launch with its
    arguments set once, so a run is only ``enqueue_nd_range_kernel`` calls."""

    def __init__(self, source: str, launches: Sequence[Any], specs: Mapping[str, TensorSpec], device_id: int):
        import pyopencl as cl

        self.device_id = device_id
        self.ctx, self.queue = _cl_context(device_id)
        self.specs = dict(specs)
        program = cl.Program(self.ctx, source).build()
        self.bufs = {name: cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, size=nbytes(spec))
                     for name, spec in self.specs.items()}
        self.kernels = []
        self.names = [launch.name for launch in launches]
        for launch in launches:
            kernel = cl.Kernel(program, launch.name)
            kernel.set_args(*[self.bufs[a] if isinstance(a, str) else np.int32(a) for a in launch.args])
            self.kernels.append((kernel, launch.global_size, launch.block))

    def write(self, name: str, array: np.ndarray) -> None:
        import pyopencl as cl

        cl.enqueue_copy(self.queue, self.bufs[name], contiguous(array, self.specs[name]))

    def run(self) -> None:
        import pyopencl as cl

        for kernel, global_size, block in self.kernels:
            cl.enqueue_nd_range_kernel(self.queue, kernel, global_size, block)

    def read(self, name: str) -> np.ndarray:
        import pyopencl as cl

        spec = self.specs[name]
        out = np.empty(spec.shape, np_dtype(spec.dtype))
        cl.enqueue_copy(self.queue, out, self.bufs[name])
        return out

    def sync(self) -> None:
        self.queue.finish()

    def stage_secs(self, repeat: int = STAGE_REPEAT) -> dict[str, float]:
        """Device seconds per forward pass of each stage (``STAGES``): the whole plan enqueued
        on a profiling queue, each launch's event time added to its function's stages (the
        fused step kernel to both "hidden_gemm" and "cell", the init kernel to "cell");
        the median over ``repeat`` passes after one warm-up pass."""
        import pyopencl as cl

        self.sync()
        queue = _cl_profiling_queue(self.device_id)
        passes = []
        for _ in range(repeat + 1):
            events = [cl.enqueue_nd_range_kernel(queue, kernel, global_size, block)
                      for kernel, global_size, block in self.kernels]
            queue.finish()
            passes.append(_stage_totals([(name, (e.profile.end - e.profile.start) * 1e-9)
                                         for name, e in zip(self.names, events)]))
        return {stage: statistics.median(p[stage] for p in passes[1:]) for stage in STAGES}


class CudaExecutor:
    """Runs a plan through TVM's runtime module: one packed-function call per kernel launch."""

    def __init__(self, module: Any, calls: Sequence[Any], specs: Mapping[str, TensorSpec], device_id: int):
        import tvm

        self.dev = tvm.cuda(device_id)
        self.specs = dict(specs)
        self.tensors = {name: tvm.runtime.empty(spec.shape, spec.dtype, self.dev)
                        for name, spec in self.specs.items()}
        funcs = {name: module[name] for name in {c.name for c in calls}}
        self.names = [c.name for c in calls]
        self.calls = [(funcs[c.name], [self.tensors[a] if isinstance(a, str) else int(a) for a in c.args])
                      for c in calls]

    @classmethod
    def load(cls, artifact: Any, specs: Mapping[str, TensorSpec], device_id: int) -> "CudaExecutor":
        import tvm

        return cls(tvm.runtime.load_module(artifact.library), artifact.launches, specs, device_id)

    def write(self, name: str, array: np.ndarray) -> None:
        self.tensors[name].copyfrom(contiguous(array, self.specs[name]))

    def run(self) -> None:
        for func, args in self.calls:
            func(*args)

    def read(self, name: str) -> np.ndarray:
        return self.tensors[name].numpy()

    def sync(self) -> None:
        self.dev.sync()

    def stage_secs(self, repeat: int = STAGE_REPEAT) -> dict[str, float]:
        """Seconds per forward pass of each stage (``STAGES``): all of the plan's calls of one
        stage's functions run back to back (the others left out), synchronised, host clock
        (the fused step kernel counts toward both "hidden_gemm" and "cell", the init kernel
        toward "cell"); the median over ``repeat`` passes after one warm-up pass.  For ranking
        stages: run on their own, kernels may time a little differently than interleaved."""
        out = {}
        for stage in STAGES:
            calls = [call for name, call in zip(self.names, self.calls) if stage in function_stages(name)]
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


def nbytes(spec: TensorSpec) -> int:
    return int(np.prod(spec.shape)) * itemsize(spec.dtype)


def contiguous(array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """``array`` in the buffer's layout and dtype (rounded to it: float32 -> bfloat16, ...)."""
    array = np.asarray(array)
    if array.dtype != np_dtype(spec.dtype):
        array = array.astype(np_dtype(spec.dtype))
    return np.ascontiguousarray(array.reshape(spec.shape))
