"""CUDA graph capture and replay of TVM calls, for the runner's timer.

Why: a kernel of a few microseconds launched back to back from Python is timed at the
host's launch rate, not the GPU's, so a search ranking by that loop cannot see the
differences between its candidates at skinny shapes; a pipeline that replays a graph (or
launches from a busy stream) sees the GPU time. The calls are captured on a stream of our
own, TVM's launches sent there through the FFI's stream context, and each sample is CUDA
events around one replay of many calls. The CUDA runtime is the one TVM's CUDA module
already loaded (its ``libcudart``), called through ``ctypes``: no further dependency.
"""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

CAPTURE_THREAD_LOCAL = 1  # cudaStreamCaptureModeThreadLocal: an unsafe call of this thread fails the capture
STREAM_NON_BLOCKING = 1
MAX_CALLS = 1000  # calls captured in one graph, at most
TARGET_REPLAY_SECS = 2e-3  # calls a graph so that one replay lasts about this long


class CudaGraphError(RuntimeError):
    """The calls could not be captured or replayed (the caller times them another way)."""


@functools.cache
def cudart() -> ctypes.CDLL:
    """The CUDA runtime library this process has loaded (TVM's CUDA module links it), found
    once per process (a worker captures a graph for every candidate it times)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = [line.split()[-1] for line in maps if "libcudart.so" in line]
    except OSError:
        paths = []
    for name in paths[:1] + ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        return lib
    raise CudaGraphError("no CUDA runtime library (libcudart) in this process or on the library path")


class _Runtime:
    """The few runtime calls a capture needs, each checked."""

    def __init__(self) -> None:
        self.lib = cudart()

    def __call__(self, name: str, *args: Any) -> None:
        code = getattr(self.lib, name)(*args)
        if code:
            self.lib.cudaGetLastError()  # clear it, so the next call in this process starts clean
            raise CudaGraphError(f"{name}: {self.lib.cudaGetErrorString(code).decode()}")

    def handle(self, name: str, *args: Any) -> ctypes.c_void_p:
        out = ctypes.c_void_p()
        self(name, ctypes.byref(out), *args)
        return out


def calls_per_replay(call_secs: float, sets: int) -> int:
    """Calls in one graph: enough that a replay lasts about ``TARGET_REPLAY_SECS`` (launch
    and event overheads small against it), a whole number of input rotations, at most
    ``MAX_CALLS`` (a graph's size), at least one rotation."""
    wanted = int(TARGET_REPLAY_SECS / max(call_secs, 1e-7))
    return max(sets, min(wanted, MAX_CALLS) // sets * sets)


class CapturedCalls:
    """``run(i)`` (a program's calls on input set i) captured ``calls`` times, cycling the
    sets, as one CUDA graph on a stream of its own; ``replay`` runs it, ``seconds`` times it."""

    def __init__(self, device: Any, run: Callable[[int], None], sets: int, calls: int) -> None:
        import tvm_ffi

        self.rt, self.calls = _Runtime(), calls
        self.stream = self.rt.handle("cudaStreamCreateWithFlags", ctypes.c_uint(STREAM_NON_BLOCKING))
        self.graph = self.exec = None
        try:
            with tvm_ffi.use_raw_stream(device, self.stream.value):
                for i in range(sets):  # loaded and warm before the capture (no module load inside it)
                    run(i)
                self.sync()
                self.rt("cudaStreamBeginCapture", self.stream, ctypes.c_int(CAPTURE_THREAD_LOCAL))
                try:
                    for i in range(calls):
                        run(i % sets)
                finally:
                    graph = ctypes.c_void_p()
                    ended = self.lib_call("cudaStreamEndCapture", self.stream, ctypes.byref(graph))
                    self.graph = graph if graph.value else None
                if ended:
                    raise CudaGraphError(ended)
            self.exec = self.rt.handle("cudaGraphInstantiate", self.graph, ctypes.c_ulonglong(0))
        except Exception:
            self.close()
            raise

    def lib_call(self, name: str, *args: Any) -> str:
        """A runtime call whose failure is returned (not raised): ending a capture that an
        error inside it invalidated must still run."""
        try:
            self.rt(name, *args)
        except CudaGraphError as exc:
            return str(exc)
        return ""

    def sync(self) -> None:
        self.rt("cudaStreamSynchronize", self.stream)

    def replay(self) -> None:
        self.rt("cudaGraphLaunch", self.exec, self.stream)

    def seconds(self, repeat: int, warmup: int = 2) -> list[float]:
        """Seconds per call of ``repeat`` replays, each between two CUDA events."""
        start, end = self.rt.handle("cudaEventCreate"), self.rt.handle("cudaEventCreate")
        try:
            for _ in range(warmup):
                self.replay()
            samples = []
            for _ in range(repeat):
                self.rt("cudaEventRecord", start, self.stream)
                self.replay()
                self.rt("cudaEventRecord", end, self.stream)
                self.rt("cudaEventSynchronize", end)
                ms = ctypes.c_float()
                self.rt("cudaEventElapsedTime", ctypes.byref(ms), start, end)
                samples.append(ms.value * 1e-3 / self.calls)
            return samples
        finally:
            self.rt.lib.cudaEventDestroy(start)
            self.rt.lib.cudaEventDestroy(end)

    def close(self) -> None:
        if self.exec is not None:
            self.rt.lib.cudaGraphExecDestroy(self.exec)
        if self.graph is not None:
            self.rt.lib.cudaGraphDestroy(self.graph)
        self.rt.lib.cudaStreamDestroy(self.stream)
        self.exec = self.graph = None
