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
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

FALLBACKS = ("auto", "measure", "off")
TVM_EXT, TORCH = "tvm_ext", "torch"
ROUNDS = 5  # interleaved rounds of each side's calls; the median of the per-round times decides
CALLS_A_ROUND = 3  # each call timed on its own, between two synchronizes
MARGIN = 0.03  # torch is taken only where it is this much faster: noise never flips a shape to it


@dataclass(frozen=True)
class BackendChoice:
    """What serves one shape's calls, and the per-call milliseconds that decided it."""

    backend: str  # TVM_EXT or TORCH
    ours_ms: float
    torch_ms: float
    torch_tf32: bool | None = None  # cuDNN's TF32 flag torch ran under (None: not a float32 CUDA GRU)

    @classmethod
    def of(cls, ours_ms: float, torch_ms: float, margin: float = MARGIN,
           torch_tf32: bool | None = None) -> "BackendChoice":
        backend = TORCH if torch_ms * (1.0 + margin) < ours_ms else TVM_EXT
        return cls(backend, ours_ms, torch_ms, torch_tf32)


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


class TorchTwin:
    """An ``nn.GRU`` holding the module's parameters (copied, then flattened as cuDNN wants
    them), called time-major under the user's cuDNN flags (TF32 where they allow it).  Eager
    CUDA calls replay a CUDA graph of it per shape and TF32 flag, as ours do (``TwinGraph``):
    the two sides are timed and served alike."""

    def __init__(self, module: nn.Module):
        first = next(module.parameters())
        self.module = nn.GRU(module.input_size, module.hidden_size, module.num_layers, module.bias,
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
        order, as ``nn.GRU`` gives them), launched directly."""
        with torch.no_grad():
            return self.module(x, hx)

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
