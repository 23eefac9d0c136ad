"""``tvm_ext.torch.GRU`` and ``LSTM``: drop-in ``torch.nn.GRU`` / ``nn.LSTM`` for inference on tvm_ext's kernels.

Same constructor arguments, parameters (names, shapes, ``state_dict``) and forward as
``nn.GRU``: ``batch_first``, ``h0``, ``num_layers``, ``bidirectional``, ``bias``, and
``PackedSequence`` input (each row stops at its own length).  On CUDA it takes and returns
torch tensors without a copy (the compiled kernels read and write torch's memory through
DLPack), launches on torch's current stream, and can be captured in ``torch.cuda.graph``.
A GRU is compiled per (batch, seq) shape on first use (a few seconds) and kept; with
``buckets`` calls of many shapes are padded to a few (``tvm_ext/torch_buckets.py``).

A shape's first eager call on CUDA times ours against ``torch.nn.GRU`` on the same input
(``fallback="auto"``, the default; ``tvm_ext/torch_fallback.py``), torch's as ``nn.GRU`` runs
under the user's flags (a float32 GRU with TF32 where ``torch.backends.cudnn.allow_tf32``, torch's
default, allows it), and keeps the faster for that shape: a user who swaps ``nn.GRU`` for this
module never gets a slower call.  Where torch's call erred as TF32 does (the flag allowed it and
cuDNN used it), ours in TF32's error class (float16 operands, float32 sums and cell) is timed too
and serves where fastest: the error class the user's ``nn.GRU`` had, at our speed.  ``choices`` says
which side serves each shape and the times that decided it; ``fallback="off"`` always runs ours.

Eager calls on CUDA replay a CUDA graph of the plan that the module records on a shape's first
call (``graphs=True``, the default; what ``torch.compile(mode="reduce-overhead")`` does): the
input is copied into the graph's static input, the graph replayed on torch's current stream and
the outputs copied out, so a call costs one graph launch and two copies on the host instead of
one launch per kernel of the plan.  It holds one more input and output per shape on the device;
``graphs=False`` launches every kernel instead.  From the second call of an input and hx
signature (shape, dtype and device of each) the checks are not repeated: the call goes straight
to its replay (``EagerCall``).  Inside a user's own capture the kernels are launched directly, so
they become part of the user's graph.  Under ``torch.compile`` the forward is one custom op
(``tvm_ext/torch_op.py``): the model compiles as one graph around it; ``torch.export`` records
``aten::gru``, as for ``nn.GRU``.

    gru = tvm_ext.torch.GRU.from_module(nn.GRU(512, 512).cuda().eval())
    out, h_n = gru(x)                       # x: (T, B, 512) CUDA float32 tensor

``tvm_ext.torch.LSTM`` is the same for ``torch.nn.LSTM`` on tvm_ext's LSTM (``schedules/lstm``):
hx ``(h_0, c_0)``, outputs ``(output, (h_n, c_n))``, measured against ``nn.LSTM`` on a shape's
first call, the op ``tvm_ext::lstm`` under ``torch.compile``, ``aten::lstm`` under ``torch.export``.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import tvm_ffi
from torch import nn

from tvm_ext import torch_buckets, torch_op
from tvm_ext.core.errors import TvmExtError, check_sizes
from tvm_ext.measure.cases import keep_latest, kept
from tvm_ext.torch_fallback import (FALLBACKS, TORCH, TVM_EXT, TVM_EXT_TF32, BackendChoice, TorchTwin,
                                    fallback_reason, float16_input_limit, per_call_ms, tf32_error_seen)
from tvm_ext.torch_calls import (TORCH_DTYPES, CallGraph, EagerCall, PackedInput, PackedLayout, TwinCall,
                                 run_bound)
from tvm_ext.torch_watch import BarrierWatch, StoredLimits

DTYPES = {dtype: name for name, dtype in TORCH_DTYPES.items()}
# the stored tensors in a 16-bit module (gate sums, the cell and accumulation stay float32)
LOW_PRECISION_TENSORS = ("x", "w_ih", "gi", "w_hh", "h", "out")
# a float32 GRU in TF32's error class (``torch_fallback``): float16 storage (TF32's mantissa), float32 sums and cell
TF32_CLASS_PRECISION = {name: "float16" for name in LOW_PRECISION_TENSORS}
MAX_CACHED_LAYOUTS = 64  # packed inputs of distinct batch sizes whose layouts (and lengths on the device) are kept
MAX_EAGER_CALLS = 4096  # input and hx signatures whose checked eager calls are kept (bucketed shapes are many)


# the plan's initial and final state buffers, in the order the calls join the state (h, then c)
STATE_BUFFERS = (("h0", "h_n"), ("c0", "c_n"))


@dataclass(frozen=True)
class EngineKey:
    """What a compiled GRU is specific to."""

    batch: int
    seq: int
    variable_lengths: bool
    device: str  # "cuda:0", or "cpu" (PoCL through OpenCL, host copies)
    tf32_class: bool = False  # a float32 GRU in TF32's class (``TF32_CLASS_PRECISION``), where it serves


class RecurrentModule(nn.Module):
    """What ``GRU`` and ``LSTM`` share (their arguments: ``GRU``'s).  The calls inside take the
    state as one tensor, (states·layers·directions, batch, hidden): a GRU's h, an LSTM's h then c
    (``LSTM.joined_state``), so that the recorded graphs, padding, packing, torch's twin and the
    compiled op handle both alike."""

    NAME = "GRU"  # in messages, and the torch class (``nn.GRU``) the module stands in for
    GATES = 3
    STATES = 1  # state tensors (h; an LSTM's h and c)
    TF32_CLASS = True  # a float32 module served in TF32's error class where torch's call had it

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device: Any = None, dtype: Any = None, config: Mapping[str, Any] | None = None,
                 precision: str | Mapping[str, str] | None = None, graphs: bool = True,
                 fallback: str = "auto", buckets: Mapping[str, Sequence[int]] | None = None):
        super().__init__()
        what = f"tvm_ext.torch.{self.NAME}"
        if fallback not in FALLBACKS:
            raise TvmExtError(f"{what} fallback must be one of {', '.join(FALLBACKS)}, got {fallback!r}")
        check_sizes(what, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers)
        if dropout:
            raise TvmExtError(f"{what} is for inference: dropout must be 0, got {dropout}")
        dtype = torch.float32 if dtype is None else dtype
        if dtype not in DTYPES:
            raise TvmExtError(f"{what} dtype {dtype} is not supported; allowed: "
                              f"{', '.join(str(d) for d in DTYPES)}")
        self.input_size, self.hidden_size, self.num_layers = int(input_size), int(hidden_size), int(num_layers)
        self.bias, self.batch_first, self.bidirectional = bool(bias), bool(batch_first), bool(bidirectional)
        self.config = dict(config or {})
        self.graphs = bool(graphs)
        self.fallback = fallback
        self.buckets = torch_buckets.ShapeBuckets.of(buckets)
        # the user asked for these kernels (or shapes padded to buckets): not measured against torch
        self.customised = bool(config) or precision is not None or self.buckets is not None
        if isinstance(precision, str):  # one type for every stored tensor, the cell and sums in float32
            precision = {name: precision for name in LOW_PRECISION_TENSORS}
        low = DTYPES[dtype]
        self.precision = dict(precision) if precision is not None else \
            ({} if low == "float32" else {name: low for name in LOW_PRECISION_TENSORS})
        dirs = 2 if bidirectional else 1
        bound = 1.0 / math.sqrt(hidden_size)
        for layer in range(num_layers):
            width = input_size if layer == 0 else dirs * hidden_size
            for sfx in ("", "_reverse")[:dirs]:
                rows = self.GATES * hidden_size
                shapes = {"weight_ih": (rows, width), "weight_hh": (rows, hidden_size)}
                if bias:
                    shapes.update(bias_ih=(rows,), bias_hh=(rows,))
                for name, shape in shapes.items():
                    value = torch.empty(shape, device=device, dtype=dtype).uniform_(-bound, bound)
                    self.register_parameter(f"{name}_l{layer}{sfx}", nn.Parameter(value, requires_grad=False))
        self._engines: dict[EngineKey, Any] = {}
        self._watches: dict[int, BarrierWatch] = {}
        self._zero_states: dict[tuple[Any, ...], Any] = {}
        self._layouts: OrderedDict[tuple[Any, ...], PackedLayout] = OrderedDict()
        self._bucket_lengths: OrderedDict[tuple[Any, ...], Any] = OrderedDict()  # a padded call's lengths
        self._call_graphs: dict[tuple[EngineKey, bool], CallGraph] = {}
        # by input and hx signature
        self._eager_calls: OrderedDict[tuple[Any, ...], EagerCall | TwinCall | torch_buckets.PaddedCall] = OrderedDict()
        # the shapes measured against torch, each under cuDNN's TF32 flag of its float32 calls (else None)
        self._choices: dict[tuple[EngineKey, bool | None], BackendChoice] = {}
        self._twin: TorchTwin | None = None  # torch's module on our parameters, made where measured
        self._op_ready: set[tuple[Any, ...]] = set()  # input and hx signatures the compiled op has served
        self._op_key = torch_op.register(self)  # how the compiled graph's op names this module
        self.register_load_state_dict_post_hook(lambda module, keys: module.reload_weights())

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy (``copy.deepcopy``, unpickling) gets a number of its own for the compiled op."""
        super().__setstate__(state)
        self._op_key = torch_op.register(self)
        self._op_ready = set()  # its first op call of each signature made off the thread again

    @classmethod
    def from_module(cls, module: nn.Module, config: Mapping[str, Any] | None = None,
                    precision: str | Mapping[str, str] | None = None, fallback: str = "auto",
                    buckets: Mapping[str, Sequence[int]] | None = None) -> "RecurrentModule":
        """A tvm_ext module with ``module``'s arguments, weights, device and dtype (``module`` an
        ``nn.GRU`` for ``GRU.from_module``, an ``nn.LSTM`` for ``LSTM.from_module``)."""
        torch_class = getattr(nn, cls.NAME)
        if not isinstance(module, torch_class):
            raise TvmExtError(f"from_module takes a torch.nn.{cls.NAME}, got {type(module).__name__}")
        if getattr(module, "proj_size", 0):
            raise TvmExtError(f"torch.nn.{cls.NAME} with proj_size is not supported")
        first = next(module.parameters())
        made = cls(module.input_size, module.hidden_size, module.num_layers, module.bias, module.batch_first,
                   0.0, module.bidirectional, device=first.device, dtype=first.dtype, config=config,
                   precision=precision, fallback=fallback, buckets=buckets)
        made.load_state_dict(module.state_dict())
        return made

    @property
    def dirs(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def dtype(self) -> Any:
        return next(self.parameters()).dtype

    @property
    def choices(self) -> dict[EngineKey, BackendChoice]:
        """The shapes timed against torch's module (``nn.GRU``, ``nn.LSTM``) so far: which side serves
        each, and why."""
        flag = torch.backends.cudnn.allow_tf32
        return {key: choice for (key, tf32), choice in self._choices.items()
                if tf32 in (None, flag) or (key, flag) not in self._choices}

    def reload_weights(self) -> None:
        """Copy the parameters into every compiled GRU or LSTM (after they were changed in place;
        ``load_state_dict`` calls it)."""
        weights = self._numpy_weights()
        self._call_graphs.clear()  # recorded against the buffers the weights were in
        self._eager_calls.clear()
        self._op_ready.clear()
        for engine in self._engines.values():
            engine.load_numpy(weights)
            if id(engine) in self._watches:  # the limits of x and h0 follow the weights
                self._watches[id(engine)].narrow(self._stored_limits(engine))
        if self._twin is not None:
            self._twin.reload(self)

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``nn.Module``'s (``.to``, ``.cuda``, ``.half``): the parameters' device or dtype may
        change, so no eager call skips the checks of the next one, and the shapes are measured
        against torch again."""
        self._eager_calls.clear()
        self._op_ready.clear()
        self._choices.clear()
        self._twin = None
        return super()._apply(fn, *args, **kwargs)

    def _numpy_weights(self) -> dict[str, Any]:
        return {name: p.detach().float().cpu().numpy() for name, p in self.named_parameters()}

    # ---- forward ---------------------------------------------------------------------------
    def forward(self, input: Any, hx: Any = None) -> tuple[Any, Any]:
        if torch_op.exporting():  # a program as an nn.GRU model's: aten::gru (``torch_op``)
            return torch_op.as_torch_call(self, input, hx)
        if torch.compiler.is_compiling():  # one opaque op of the user's compiled graph (``torch_op``)
            return torch_op.call(self, input, hx)
        out, state = self.eager_forward(input, self.joined_state(hx))
        return out, self.split_state(state)

    def joined_state(self, hx: Any) -> Any:
        """hx as the calls take it, one tensor (a GRU's is that already; ``LSTM.joined_state``)."""
        return hx

    def split_state(self, state: Any) -> Any:
        """The calls' final state as the module returns it (``joined_state``'s inverse)."""
        return state

    def op_forward(self, input: Any, hx: Any) -> tuple[Any, Any]:
        """The compiled graph's op (``torch_op.gru``) on a tensor input: ``eager_forward``, where
        it is a signature's first CUDA call (which makes what the module keeps across calls: a
        compiled GRU, its recorded graph, zero states, the time against torch) on a thread of its
        own, outside torch's graph pools (``torch_op.outside_graph_pools``)."""
        if not input.is_cuda or torch.cuda.is_current_stream_capturing():
            return self.eager_forward(input, hx)
        ready = self._call_signature(input, hx)
        if ready in self._op_ready:
            return self.eager_forward(input, hx)
        outputs = torch_op.outside_graph_pools(self.eager_forward, input, hx)
        self._op_ready.add(ready)
        return outputs

    def eager_forward(self, input: Any, hx: Any = None) -> tuple[Any, Any]:
        """``forward`` outside ``torch.compile`` (and the compiled graph's op)."""
        signature = self._eager_signature(input, hx)
        call = self._eager_calls.get(signature) if signature is not None else None
        if call is not None and not torch.cuda.is_current_stream_capturing():
            # an input and hx of a signature checked before, on a recorded graph: straight to it
            out, h_n = call.run(input if not self.batch_first else input.transpose(0, 1), hx)
            return (out if not self.batch_first else out.transpose(0, 1)), h_n
        packed = isinstance(input, nn.utils.rnn.PackedSequence)
        if packed:  # padded in the packed (sorted) row order: one index kernel each way
            self.checked_sizes(input.data, None, True)
            x, time_major = PackedInput(input.data, self._packed_layout(input.batch_sizes, input.data.device)), True
            seq, batch = x.shape[0], x.shape[1]
            if hx is not None:
                self._check_hx(hx, batch, x.device)
        else:
            x, time_major = input, not self.batch_first
            seq, batch = self.checked_sizes(x, hx, False)
        if not time_major:
            x = x.transpose(0, 1)
        key = EngineKey(batch, seq, packed, str(x.device))
        if packed:
            return self._packed_call(key, input, x, hx)
        if self.buckets is not None and self.buckets.round(seq, batch) != (seq, batch):
            out, h_n = self._bucketed_call(x, hx, seq, batch, signature)
            return (out if time_major else out.transpose(0, 1)), h_n
        tf32_key = replace(key, tf32_class=True)
        backend = self._backend(key, lambda: self._ours(key, x, hx, None, False, None),
                                lambda: self._twin.call(key, x, hx, self.graphs), x.device,
                                (lambda: self._ours(tf32_key, x, hx, None, False, None)) if self.TF32_CLASS else None)
        if backend == TORCH:
            out, h_n = self._twin.call(key, x, hx, self.graphs)
            if signature is not None and x.is_cuda and not torch.cuda.is_current_stream_capturing():
                keep_latest(self._eager_calls, signature, TwinCall(self._twin, key), MAX_EAGER_CALLS)
            return (out if time_major else out.transpose(0, 1)), h_n
        out, h_n = self._ours(tf32_key if backend == TVM_EXT_TF32 else key, x, hx, None, False, signature)
        return (out if time_major else out.transpose(0, 1)), h_n

    def _bucketed_call(self, x: Any, hx: Any, seq: int, batch: int,
                       signature: tuple[Any, ...] | None) -> tuple[Any, Any]:
        """Time-major ``x``'s (out, h_n) on the GRU of its shape's bucket: padded, every row's
        length ``seq`` where steps were added, cut back (``torch_buckets``); where the bucket's
        graph is recorded, straight into and out of it (``PaddedCall``, kept under ``signature``)."""
        bucket_seq, bucket_batch = self.buckets.round(seq, batch)
        lengths = None
        if bucket_seq != seq:  # made once a (rows, length, device): a recorded graph copies it once
            lengths = kept(self._bucket_lengths, (bucket_batch, seq, x.device),
                           lambda: torch.full((bucket_batch,), seq, dtype=torch.int32, device=x.device),
                           MAX_CACHED_LAYOUTS)
        key = EngineKey(bucket_batch, bucket_seq, lengths is not None, str(x.device))
        record = self._call_graphs.get((key, hx is None)) if signature is not None and x.is_cuda \
            and not torch.cuda.is_current_stream_capturing() else None
        if record is None:
            padded, h0 = torch_buckets.pad(x, hx, bucket_seq, bucket_batch)
            out, h_n = self._ours(key, padded, h0, lengths, False, None)
            return torch_buckets.cut(out, h_n, seq, batch)
        call = torch_buckets.PaddedCall(record, self._watch(self._engines[key]), self.dtype, seq, batch, lengths)
        keep_latest(self._eager_calls, signature, call, MAX_EAGER_CALLS)
        return call.run(x, hx)

    @property
    def compiled_shapes(self) -> list[EngineKey]:
        """The shapes a GRU or LSTM has been compiled for (a bucketed call's: its bucket's)."""
        return sorted(self._engines, key=lambda key: (key.device, key.batch, key.seq, key.variable_lengths,
                                                      key.tf32_class))

    def checked_sizes(self, x: Any, hx: Any, packed: bool) -> tuple[int, int]:
        """(seq, batch) of input ``x`` after checking it and hx against the module: one
        ``TvmExtError`` naming what is wrong.  ``packed``: ``x`` is a ``PackedSequence``'s data,
        (rows, hx's batch or 0) returned."""
        self._check_tensor("input", x)
        if packed:
            if x.dim() != 2 or x.shape[1] != self.input_size:
                raise TvmExtError(f"{self.NAME} PackedSequence data has shape {tuple(x.shape)}, "
                                  f"expected (rows, {self.input_size})")
            seq, batch = x.shape[0], hx.shape[1] if hx is not None and hx.dim() == 3 else 0
        else:
            if x.dim() != 3 or x.shape[2] != self.input_size:
                layout = "batch, seq" if self.batch_first else "seq, batch"
                raise TvmExtError(f"{self.NAME} input has shape {tuple(x.shape)}, expected ({layout}, "
                                  f"{self.input_size})")
            seq, batch = (x.shape[1], x.shape[0]) if self.batch_first else (x.shape[0], x.shape[1])
        if hx is not None:
            self._check_hx(hx, batch, x.device)
        return seq, batch

    def _check_hx(self, hx: Any, batch: int, device: Any) -> None:
        self._check_tensor("hx", hx, device)
        state = (self.num_layers * self.dirs, batch, self.hidden_size)
        if tuple(hx.shape) != (self.STATES * state[0], *state[1:]):
            raise TvmExtError(self._state_shape_error(tuple(hx.shape), state))

    def _state_shape_error(self, shape: tuple[int, ...], state: tuple[int, ...]) -> str:
        return f"GRU hx has shape {shape}, expected {state} (layers·directions, batch, hidden)"

    def _packed_call(self, key: EngineKey, input: Any, x: "PackedInput", hx: Any) -> tuple[Any, Any]:
        """A ``PackedSequence``'s (output, h_n): ours on its padded rows, or torch's own packed call
        where the shape's first call measured torch faster (cuDNN's STANDARD algorithm, launched
        directly: its packed call depends on the batch sizes, which a recorded graph would fix)."""
        def ours() -> tuple[Any, Any]:
            h0 = hx
            if hx is not None and input.sorted_indices is not None:
                h0 = hx.index_select(1, input.sorted_indices)  # into the packed row order, as nn.GRU does
            out, h_n = self._ours(key, x, h0, x.layout.device_lengths, True, None)
            if input.unsorted_indices is not None:
                h_n = h_n.index_select(1, input.unsorted_indices)
            return nn.utils.rnn.PackedSequence(x.layout.unpack(out), input.batch_sizes, input.sorted_indices,
                                               input.unsorted_indices), h_n

        if self._backend(key, ours, lambda: self._twin(input, hx), x.device) == TORCH:
            return self._twin(input, hx)
        return ours()

    def _ours(self, key: EngineKey, x: Any, hx: Any, lengths: Any, packed: bool,
              signature: tuple[Any, ...] | None) -> tuple[Any, Any]:
        """(out, h_n) of time-major ``x`` on our kernels: through the shape's recorded graph on
        eager CUDA calls (its ``EagerCall`` kept under ``signature``), launched directly otherwise."""
        engine = self._engine(key)
        if x.device.type == "cuda" and self.graphs and not torch.cuda.is_current_stream_capturing():
            out, h_n, call = self._replay(key, engine, x, hx, lengths, copy_out=not packed)
            if call is not None and signature is not None:
                keep_latest(self._eager_calls, signature, call, MAX_EAGER_CALLS)  # the next call skips checks
            return out, h_n
        return self._run(engine, x.padded() if packed else x.contiguous(), hx, lengths)

    def _backend(self, key: EngineKey, ours: Any, theirs: Any, device: Any, tf32_class: Any = None) -> str:
        """Which side serves ``key``'s calls: the choice measured on its first call where
        ``fallback`` allows (``torch_fallback``; ``ours`` and ``theirs`` make the call each side
        would serve, ``tf32_class`` ours in TF32's class, timed against the faster of them where
        torch's call erred as TF32 does), else ours.  Not measured inside a capture (ours is
        captured; the next eager call measures).  A compiled GRU that serves none of the shape's
        choices is let go with its recorded graphs (they would hold device memory for nothing):
        a float32 shape is measured under each value of cuDNN's TF32 flag its calls come with
        (torch's side runs as the flag has it)."""
        on_cuda = key.device.startswith("cuda")
        tf32 = torch.backends.cudnn.allow_tf32 if on_cuda and self.dtype == torch.float32 else None
        choice = self._choices.get((key, tf32))
        if choice is not None:
            return choice.backend
        if (on_cuda and torch.cuda.is_current_stream_capturing()) or \
                fallback_reason(self.fallback, key.device, self.customised) is not None:
            return TVM_EXT
        if self._twin is None:
            self._twin = TorchTwin(self)
        ms = per_call_ms({TVM_EXT: ours, TORCH: theirs}, device)
        choice = BackendChoice.of(ms[TVM_EXT], ms[TORCH], torch_tf32=tf32)
        if tf32 and tf32_class is not None and tf32_error_seen(ours()[0], theirs()[0]):  # torch's error class
            rival = {TVM_EXT: ours, TORCH: theirs}[choice.backend]
            ms = per_call_ms({TVM_EXT_TF32: tf32_class, choice.backend: rival}, device)
            choice = choice.with_tf32_class(ms[TVM_EXT_TF32], ms[choice.backend])
        self._choices[(key, tf32)] = choice
        serving = {c.backend for (k, _), c in self._choices.items() if k == key}
        for backend, engine_key in ((TVM_EXT, key), (TVM_EXT_TF32, replace(key, tf32_class=True))):
            if backend not in serving and engine_key in self._engines:
                self._release(engine_key)
        return choice.backend

    def _release(self, key: EngineKey) -> None:
        """Let ``key``'s compiled GRU go, with its watch and recorded graphs."""
        engine = self._engines.pop(key)
        self._watches.pop(id(engine), None)
        for zero_h0 in (True, False):
            self._call_graphs.pop((key, zero_h0), None)

    def _eager_signature(self, input: Any, hx: Any) -> tuple[Any, ...] | None:
        """What an eager call's checks depend on (None: a call the fast path does not take, packed
        or graphs off): the input's and hx's shape, dtype and device, ``batch_first``, and cuDNN's
        TF32 flag (torch's side of a measured shape runs as it has it)."""
        if not self.graphs or type(input) is not torch.Tensor or (hx is not None and type(hx) is not torch.Tensor):
            return None
        return self._call_signature(input, hx)

    def _call_signature(self, input: Any, hx: Any) -> tuple[Any, ...]:
        """A tensor input's and hx's shape, dtype and device, ``batch_first`` and cuDNN's TF32
        flag: the key of what the module made for such calls (the eager fast path's, the
        compiled op's first call)."""
        return (input.shape, input.dtype, input.device, self.batch_first,
                None if hx is None else (hx.shape, hx.dtype, hx.device), torch.backends.cudnn.allow_tf32)

    def _packed_layout(self, batch_sizes: Any, device: Any) -> "PackedLayout":
        """The pad/unpack index of a ``PackedSequence``'s batch sizes (a CPU int64 tensor), kept
        per distinct value (keyed by its bytes: a tuple of its values cost 10 us a call)."""
        return kept(self._layouts, (batch_sizes.cpu().numpy().tobytes(), batch_sizes.dtype, device),
                    lambda: PackedLayout.of(tuple(int(v) for v in batch_sizes.tolist()), device), MAX_CACHED_LAYOUTS)

    def _check_tensor(self, name: str, tensor: Any, device: Any = None) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TvmExtError(f"{self.NAME} {name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype != self.dtype:
            raise TvmExtError(f"{self.NAME} {name} has dtype {tensor.dtype}, expected {self.dtype} (the module's)")
        want = self.weight_ih_l0.device if device is None else device
        if tensor.device != want:
            raise TvmExtError(f"{self.NAME} {name} is on {tensor.device}, expected {want}"
                              + (" (the module's parameters)" if device is None else " (the input's)"))

    def _engine(self, key: EngineKey) -> Any:
        engine = self._engines.get(key)
        if engine is None:
            from tvm_ext.target import resolve_target

            on_cuda = key.device.startswith("cuda")
            target = resolve_target("cuda", torch.device(key.device).index or 0) if on_cuda \
                else resolve_target("opencl", 0)
            engine = self._build(target, key)
            engine.load_numpy(self._numpy_weights())
            self._engines[key] = engine
        return engine

    def _build(self, target: Any, key: EngineKey) -> Any:
        """The compiled GRU of ``key``'s shape (``tvm_ext.schedules.gru.GRU``)."""
        from tvm_ext.schedules.gru import GRU as CompiledGRU

        precision = TF32_CLASS_PRECISION if key.tf32_class else self.precision
        return CompiledGRU.build(target, self.input_size, self.hidden_size, self.num_layers, self.bidirectional,
                                 False, key.batch, key.seq, config=self.config or None, device_id=target.device_id,
                                 precision=precision, variable_lengths=key.variable_lengths)

    def _numpy_call(self, engine: Any, x: Any, h0: Any, lengths: Any) -> tuple[Any, Any]:
        """(out, state) of ``engine``'s numpy call (OpenCL on the CPU), the state as the calls join it."""
        return engine(x, h0, lengths=lengths)

    def _run(self, engine: Any, x: Any, hx: Any, lengths: Any) -> tuple[Any, Any]:
        """One forward pass of ``engine`` on time-major x: in place on CUDA tensors, through
        host copies on the CPU (OpenCL)."""
        if x.device.type != "cuda":
            h0 = None if hx is None else hx.float().numpy()
            out, h_n = self._numpy_call(engine, x.float().numpy(), h0, None if lengths is None else lengths.numpy())
            return torch.from_numpy(out).to(self.dtype), torch.from_numpy(h_n).to(self.dtype)
        out, h_n, tensors = self._kernel_tensors(engine, x, hx, lengths)
        stream = torch.cuda.current_stream(x.device)
        watch = self._watch(engine)
        watch.check()
        self._launch(engine, watch, tensors, stream, zero_h0=hx is None)
        watch.enqueue()
        return out.to(self.dtype), h_n.to(self.dtype)

    def _kernel_tensors(self, engine: Any, x: Any, hx: Any, lengths: Any) -> tuple[Any, Any, dict[str, Any]]:
        """New out and h_n in the kernels' dtypes, and every tensor the plan binds (x and h0
        converted where needed; ``lengths`` an int32 CUDA tensor where the plan takes them)."""
        t = engine.template
        kernel_dtype = {name: TORCH_DTYPES[dtype] for name, dtype in (("x", t.x_dtype), ("h", t.h_dtype),
                                                                      ("out", t.out_dtype))}
        out = torch.empty(t.seq, t.batch, t.dirs * t.hidden, dtype=kernel_dtype["out"], device=x.device)
        rows = t.layers * t.dirs
        h_n = torch.empty(self.STATES * rows, t.batch, t.hidden, dtype=kernel_dtype["h"], device=x.device)
        h0 = self._zeros(h_n) if hx is None else hx.to(kernel_dtype["h"]).contiguous()
        tensors = {"x": x.to(kernel_dtype["x"]).contiguous().view(t.seq * t.batch, t.input),
                   "out": out.view(t.seq * t.batch, -1)}
        for i, (state, final) in enumerate(STATE_BUFFERS[:self.STATES]):  # the joined state's parts, views of it
            tensors[state], tensors[final] = h0[i * rows:(i + 1) * rows], h_n[i * rows:(i + 1) * rows]
        if t.variable_lengths:
            tensors["lengths"] = lengths
        return out, h_n, tensors

    @staticmethod
    def _launch(engine: Any, watch: "BarrierWatch", tensors: Mapping[str, Any], stream: Any, zero_h0: bool) -> None:
        """The plan on ``stream``, after the range checks of the inputs it splits into float16
        parts (on the device, reported at the next call by the engine's ``watch``; ``zero_h0``:
        h0 is the module's zeros, nothing to check)."""
        watch.check_ranges(tensors, zero_h0)
        with tvm_ffi.use_raw_stream(engine.executor.dev, stream.cuda_stream):
            run_bound(engine.executor, tensors)

    def _watch(self, engine: Any) -> "BarrierWatch":
        watch = self._watches.get(id(engine))
        if watch is None:
            watch = self._watches[id(engine)] = BarrierWatch(engine, self._stored_limits(engine))
        return watch

    def _stored_limits(self, engine: Any) -> StoredLimits | None:
        """Where ``engine`` stores this float32 module's x in float16 (TF32's class, or a
        ``precision`` of float16): the largest |x| and |h0| its input GEMM's float16 products
        hold (``float16_input_limit``), else None."""
        if self.dtype != torch.float32 or engine.template.x_dtype != "float16":
            return None
        limit = float16_input_limit(
            (getattr(self, f"weight_ih_l{layer}{sfx}").detach().float().cpu().numpy(),
             getattr(self, f"bias_ih_l{layer}{sfx}").detach().float().cpu().numpy() if self.bias else None)
            for layer in range(self.num_layers) for sfx in ("", "_reverse")[:self.dirs])
        return StoredLimits({"x": limit, "h0": limit}, "float32", "the input GEMM's float16 products")

    def _replay(self, key: EngineKey, engine: Any, x: Any, hx: Any, lengths: Any,
                copy_out: bool = True) -> tuple[Any, Any, "EagerCall | None"]:
        """An eager CUDA call through the shape's recorded graph (recorded on its first call, after
        one direct run that loads the kernels), and the ``EagerCall`` that replays it (None on
        that first call)."""
        record = self._call_graphs.get((key, hx is None))
        if record is None:
            x = x.padded() if isinstance(x, PackedInput) else x
            out, h_n = self._run(engine, x.contiguous(), hx, lengths)
            self._call_graphs[(key, hx is None)] = CallGraph.record(self, engine, x, hx, lengths)
            return out, h_n, None
        call = EagerCall(record, self._watch(engine), self.dtype)
        return (*call.run(x, hx, lengths, copy_out), call)

    def _zeros(self, like: Any) -> Any:
        """A zero h0 of ``like``'s shape, made once (no memset in every call)."""
        key = (tuple(like.shape), like.dtype, like.device)
        zeros = self._zero_states.get(key)
        if zeros is None:
            zeros = self._zero_states[key] = torch.zeros_like(like)
        return zeros

    def check(self) -> None:
        """Synchronise and raise if a persistent kernel's grid barrier timed out in a past call
        (checked without a sync at the start of every call, for the calls before it)."""
        for watch in self._watches.values():
            watch.check(wait=True)


class GRU(RecurrentModule):
    """``torch.nn.GRU`` inference on tvm_ext's kernels (see the module docstring).

    ``config``: GRU knobs overriding the pick (``tvm_ext.schedules.gru.GRU.build``);
    ``precision``: the stored tensors' types behind the module's dtype (a type name for all of
    x, the weights, gi, h and out, or a mapping of ``PRECISION_PARAMS``; default: the module's
    dtype), e.g. ``precision="float16"`` on a float32 module: float32 in and out, float16 storage,
    float32 sums and cell (errors near 4e-4, the class of cuDNN's TF32 GRU);
    ``graphs``: replay a recorded CUDA graph per shape on eager CUDA calls (see the module docstring);
    ``fallback``: ``"auto"`` times a shape's first eager CUDA call against ``torch.nn.GRU`` and
    keeps the faster (a ``PackedSequence`` against torch's packed call; not where ``config`` or
    ``precision`` is given; a float32 tensor call also against ours in TF32's class where torch's
    call had TF32's error),
    ``"measure"`` does so on any device, ``"off"`` always runs ours;
    ``buckets``: ``{"seq": [...], "batch": [...]}``, sizes a call's seq and batch are padded up
    to, so that calls of many shapes share a few compiled GRUs (``tvm_ext/torch_buckets.py``;
    tensor inputs, not measured against torch); ``dropout`` must be 0 (inference)."""


class LSTM(RecurrentModule):
    """``torch.nn.LSTM`` inference on tvm_ext's LSTM (``tvm_ext.schedules.lstm``): ``GRU``'s
    arguments, calls, choice against torch, recorded graphs, buckets and compiled op (see the
    module docstring), with hx ``(h_0, c_0)`` and outputs ``(output, (h_n, c_n))`` as
    ``nn.LSTM`` has them.  ``precision``: one type name the LSTM stores x, the weights, h, c and
    the outputs in (default: the module's dtype; the products and cell stay float32), e.g.
    ``"float16"`` on a float32 module: float32 in and out, errors near 4e-4 (TF32's class, which
    a float32 shape's first call also times where torch's call had TF32's error, as ``GRU``'s).
    ``config``: LSTM knobs over the pick; ``proj_size`` must be 0."""

    NAME = "LSTM"
    GATES = 4
    STATES = 2

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device: Any = None, dtype: Any = None, config: Mapping[str, Any] | None = None,
                 precision: str | None = None, graphs: bool = True, fallback: str = "auto",
                 buckets: Mapping[str, Sequence[int]] | None = None):
        if proj_size:
            raise TvmExtError(f"tvm_ext.torch.LSTM does not support proj_size (got {proj_size}): h is hidden_size wide")
        if precision is not None and precision not in DTYPES.values():
            raise TvmExtError(f"tvm_ext.torch.LSTM stores every tensor in one type: precision must be one of "
                              f"{', '.join(DTYPES.values())} or None, got {precision!r}")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device,
                         dtype, config, precision, graphs, fallback, buckets)

    def joined_state(self, hx: Any) -> Any:
        """``(h_0, c_0)`` as the calls take it: one tensor, h's rows then c's (None stays None)."""
        if hx is None:
            return None
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TvmExtError(f"LSTM hx must be a tuple (h_0, c_0) of two tensors, got {type(hx).__name__}"
                              + (f" of {len(hx)}" if isinstance(hx, (tuple, list)) else ""))
        for name, tensor in zip(("h_0", "c_0"), hx):
            self._check_tensor(name, tensor)
        if hx[0].shape != hx[1].shape or hx[0].dim() != 3:
            raise TvmExtError(f"LSTM h_0 has shape {tuple(hx[0].shape)} and c_0 {tuple(hx[1].shape)}: both must be "
                              f"(layers·directions, batch, hidden) = ({self.num_layers * self.dirs}, batch, "
                              f"{self.hidden_size})")
        return torch.cat(tuple(hx))

    def split_state(self, state: Any) -> tuple[Any, Any]:
        """The calls' joined final state as ``(h_n, c_n)`` (two views of it)."""
        h_n, c_n = state.chunk(2)
        return h_n, c_n

    def _state_shape_error(self, shape: tuple[int, ...], state: tuple[int, ...]) -> str:
        return (f"LSTM h_0 and c_0 have shape {(shape[0] // 2, *shape[1:])}, expected {state} "
                "(layers·directions, batch, hidden)")

    def _build(self, target: Any, key: EngineKey) -> Any:
        """The compiled LSTM of ``key``'s shape (``tvm_ext.schedules.lstm.LSTM``), stored in float16
        in TF32's class, else in ``precision``'s type (the module's dtype by default)."""
        from tvm_ext.schedules.lstm import LSTM as CompiledLSTM

        storage = "float16" if key.tf32_class else self.precision.get("x", DTYPES[self.dtype])
        return CompiledLSTM.build(target, self.input_size, self.hidden_size, self.num_layers, self.bidirectional,
                                  False, key.batch, key.seq, config=self.config or None, device_id=target.device_id,
                                  dtype=storage, variable_lengths=key.variable_lengths)

    def _stored_limits(self, engine: Any) -> StoredLimits | None:
        """Where ``engine`` stores a wider module's tensors in float16: x and h_0 below what float16
        holds (x·W_ihᵀ is summed and stored in float32), c_0 as far below it as the call's steps
        can add to |c| (each adds f·c + i·g, |i·g| < 1)."""
        if self.dtype == torch.float16 or engine.template.dtype != "float16":
            return None
        from tvm_ext.schedules.gru.split import FLOAT16_MAX

        return StoredLimits({"x": FLOAT16_MAX, "h0": FLOAT16_MAX, "c0": FLOAT16_MAX - engine.template.seq},
                            DTYPES[self.dtype], "float16 storage (c over the call's steps)")

    def _numpy_call(self, engine: Any, x: Any, h0: Any, lengths: Any) -> tuple[Any, Any]:
        state = None if h0 is None else tuple(h0.reshape(2, -1, *h0.shape[1:]))
        out, (h_n, c_n) = engine(x, state, lengths=lengths)
        return out, np.concatenate((h_n, c_n))
