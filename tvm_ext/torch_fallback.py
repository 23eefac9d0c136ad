"""Where ``tvm_ext.torch.GRU`` hands a shape to torch's own GRU: a user who swaps ``nn.GRU`` for
ours should never get a slower call.  Our kernels lead cuDNN at most shapes, but not at all
(large batches past hidden 1024), so on a shape's first eager call the module times its own
call and ``torch.nn.GRU``'s (cuDNN on CUDA) on the same input, interleaved, as a user calls
them, and keeps the faster for that shape (``torch.backends.cudnn.benchmark`` does the same
for convolutions).  The torch side is an ``nn.GRU`` built from the module's parameters, its eager
calls replayed from a CUDA graph as ours are, run as ``nn.GRU`` runs under the user's flags: a
float32 GRU on cuDNN with TF32 where ``torch.backends.cudnn.allow_tf32`` allows it (torch's
default), so a shape where torch's TF32 call is faster than our float32-accurate one is served
as the user's ``nn.GRU`` served it, and the choice is made again when the flag changes.

Where torch's output is off our float32-accurate one by TF32's error (the flag allowed TF32 and
cuDNN used it: at small sizes it may run float32's math), the user's ``nn.GRU`` had TF32's error
class at that shape: our GRU in that class (float16 operands, float32 sums and cell,
``tvm_ext.torch.TF32_CLASS_PRECISION``) is timed against the faster side too and serves where it
is faster still (past ``MARGIN`` where our float32-accurate GRU is the side it beats).  Its input GEMM's
products are stored in float16, so x and h0 must stay below ``float16_input_limit`` (checked on
the device; a call past it is reported at the next call).  With the flag off a float32 shape
is served at float32's accuracy, by ours or torch.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import nn

FALLBACKS = ("auto", "measure", "off")
TVM_EXT, TORCH = "tvm_ext", "torch"
TVM_EXT_TF32 = "tvm_ext_tf32_class"  # ours in TF32's error class, where torch's call had that error
FLOAT32_CLASS = 2e-5  # torch's output within this (relative) of our float32-accurate one: float32's math ran
ROUNDS = 5  # interleaved rounds of each side's calls; the median of the per-round times decides
CALLS_A_ROUND = 3  # each call timed on its own, between two synchronizes
MARGIN = 0.03  # torch is taken only where it is this much faster: noise never flips a shape to it


@dataclass(frozen=True)
class BackendChoice:
    """What serves one shape's calls, and the per-call milliseconds that decided it."""

    backend: str  # TVM_EXT, TORCH or TVM_EXT_TF32
    ours_ms: float
    torch_ms: float
    torch_tf32: bool | None = None  # cuDNN's TF32 flag torch ran under (None: not a float32 CUDA GRU)
    tf32_class_ms: float | None = None  # ours in TF32's class, timed where torch's call had TF32's error

    @classmethod
    def of(cls, ours_ms: float, torch_ms: float, margin: float = MARGIN,
           torch_tf32: bool | None = None) -> "BackendChoice":
        backend = TORCH if torch_ms * (1.0 + margin) < ours_ms else TVM_EXT
        return cls(backend, ours_ms, torch_ms, torch_tf32)

    def with_tf32_class(self, tf32_class_ms: float, rival_ms: float, margin: float = MARGIN) -> "BackendChoice":
        """Ours in TF32's class against the side chosen (``rival_ms``: its time in the same
        rounds): where torch's call was chosen, taken unless torch is ``margin`` faster still (as
        torch is taken against ours); where ours at float32's accuracy, taken only ``margin``
        faster than it (float32's accuracy kept where the two are near)."""
        if self.backend == TORCH:
            faster = not rival_ms * (1.0 + margin) < tf32_class_ms
        else:
            faster = tf32_class_ms * (1.0 + margin) < rival_ms
        return replace(self, backend=TVM_EXT_TF32 if faster else self.backend, tf32_class_ms=tf32_class_ms)


def fallback_reason(fallback: str, device: Any, customised: bool) -> str | None:
    """Why a call is not measured against torch (None: it is).  ``auto`` measures CUDA calls
    only (on the CPU ours runs through OpenCL for testing, not for speed), ``measure`` any
    device; never where the user chose a config or a precision (``customised``: they asked
    for those kernels).  A ``PackedSequence`` is measured as its own shape (the key's
    ``variable_lengths``), against torch's packed call."""
    if fallback not in FALLBACKS:
        return f"fallback must be one of {', '.join(FALLBACKS)}, got {fallback!r}"
    if fallback == "off":
        return "fallback is off"
    if fallback == "auto" and torch.device(device).type != "cuda":
        return "fallback auto measures CUDA calls only"
    if customised:
        return "a config or precision was given"
    return None


def tf32_error_seen(ours: Any, theirs: Any) -> bool:
    """Whether torch's output ``theirs`` is off our float32-accurate ``ours`` by more than float32's
    class (``FLOAT32_CLASS``): cuDNN ran TF32's math for the shape (at small sizes it may not, and
    its call is then float32-accurate: a TF32-class side would be less accurate than the user's
    ``nn.GRU``)."""
    ours, theirs = ours.detach().double(), theirs.detach().double()
    scale = float(torch.linalg.vector_norm(ours))
    return float(torch.linalg.vector_norm(theirs - ours)) > FLOAT32_CLASS * max(scale, 1e-30)


def float16_input_limit(layers: Iterable[tuple[Any, Any]]) -> float:
    """The largest |x| and |h0| a float32 GRU stored in float16 takes: each layer's input GEMM
    stores x·W_ihᵀ + b_ih in float16, so every row's Σ|W_ih| · |x| + |b_ih| must stay within
    ``FLOAT16_MAX`` (a later layer's input is h, within max(1, |h0|)); ``layers``: each layer's
    and direction's (W_ih, b_ih or None) as float arrays."""
    from tvm_ext.schedules.gru.split import FLOAT16_MAX  # what the float16 parts of the split inputs hold too

    limit = FLOAT16_MAX
    for w_ih, b_ih in layers:
        rows = np.abs(np.asarray(w_ih, np.float64)).sum(axis=1)
        room = FLOAT16_MAX - (np.abs(np.asarray(b_ih, np.float64)) if b_ih is not None else 0.0)
        spent = rows > 0  # a row of zeros stores its bias alone, whatever x is
        if spent.any():
            limit = min(limit, float((np.broadcast_to(room, rows.shape)[spent] / rows[spent]).min()))
    return limit


class TorchTwin:
    """torch's own module (``nn.GRU``, ``nn.LSTM``) holding the module's parameters (copied, then
    flattened as cuDNN wants them), called time-major under the user's cuDNN flags (TF32 where
    they allow it), its state joined as the module's calls join it (an LSTM's h then c in one
    tensor).  Eager CUDA calls replay a CUDA graph of it per shape and TF32 flag, as ours do
    (``TwinGraph``): the two sides are timed and served alike."""

    def __init__(self, module: nn.Module):
        first = next(module.parameters())
        self.states = module.STATES
        self.module = getattr(nn, module.NAME)(module.input_size, module.hidden_size, module.num_layers, module.bias,
                                               batch_first=False, bidirectional=module.bidirectional,
                                               device=first.device, dtype=first.dtype).eval()
        self.graphs: dict[tuple[Any, bool, bool], TwinGraph] = {}
        self.reload(module)

    def reload(self, module: nn.Module) -> None:
        """The module's current parameters into the twin (its recorded graphs dropped)."""
        self.graphs.clear()
        with torch.no_grad():
            for name, value in self.module.named_parameters():
                value.copy_(getattr(module, name))
        if next(self.module.parameters()).is_cuda:
            self.module.flatten_parameters()

    def __call__(self, x: Any, hx: Any = None) -> tuple[Any, Any]:
        """(out, h_n) for time-major ``x`` (or a ``PackedSequence``, its h_n in the caller's row
        order, as ``nn.GRU`` gives them), launched directly; hx and h_n joined (an LSTM's h, c)."""
        with torch.no_grad():
            if self.states == 1:
                return self.module(x, hx)
            out, states = self.module(x, None if hx is None else hx.chunk(self.states))
            return out, torch.cat(states)

    def call(self, key: Any, x: Any, hx: Any, graphs: bool) -> tuple[Any, Any]:
        """An eager call as the module serves it: on CUDA (``graphs``, not inside a capture)
        the replay of ``key``'s recorded graph, else a direct call."""
        if not (graphs and x.is_cuda) or torch.cuda.is_current_stream_capturing():
            return self(x, hx)
        recorded = (key, hx is None, torch.backends.cudnn.allow_tf32)  # a graph keeps the math it was recorded with
        graph = self.graphs.get(recorded)
        if graph is None:
            graph = self.graphs[recorded] = TwinGraph.record(self, x, hx)
        return graph.run(x, hx)


@dataclass(frozen=True)
class TwinGraph:
    """torch's GRU recorded as a CUDA graph on static tensors (after one call outside it, which
    makes cuDNN's plan and workspace): inputs copied in, outputs copied out."""

    graph: Any
    x: Any
    h0: Any
    out: Any
    h_n: Any

    @classmethod
    def record(cls, twin: TorchTwin, x: Any, hx: Any) -> "TwinGraph":
        x_static = x.clone(memory_format=torch.contiguous_format)
        h0 = None if hx is None else hx.clone(memory_format=torch.contiguous_format)
        side = torch.cuda.Stream(x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            twin(x_static, h0)
        torch.cuda.current_stream(x.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, h_n = twin(x_static, h0)
        return cls(graph, x_static, h0, out, h_n)

    def run(self, x: Any, hx: Any) -> tuple[Any, Any]:
        self.x.copy_(x)
        if hx is not None:
            self.h0.copy_(hx)
        self.graph.replay()
        return self.out.clone(), self.h_n.clone()


def per_call_ms(sides: dict[str, Callable[[], Any]], device: Any, rounds: int = ROUNDS,
                calls: int = CALLS_A_ROUND) -> dict[str, float]:
    """Each side's milliseconds a call, as a user's eager call and a synchronize take them: the
    median over ``rounds`` interleaved rounds of ``calls`` calls each (after one warm-up call
    each, which records what a side records on its first call)."""
    on_cuda = torch.device(device).type == "cuda"

    def sync() -> None:
        if on_cuda:
            torch.cuda.synchronize(device)

    for call in sides.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, call in sides.items():
            for _ in range(calls):
                sync()
                began = time.perf_counter()
                call()
                sync()
                times[name].append((time.perf_counter() - began) * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}
