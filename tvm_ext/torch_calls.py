"""The calls ``tvm_ext.torch``'s modules make on CUDA: a shape's plan recorded as a CUDA graph
(``CallGraph``) and replayed per eager call (``EagerCall``), torch's twin's call (``TwinCall``),
and a ``PackedSequence``'s padded layout (``PackedLayout``, ``PackedInput``).  The state is the
calls' joined one (``tvm_ext.torch.RecurrentModule``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import tvm_ffi

from tvm_ext.torch_fallback import TorchTwin
from tvm_ext.torch_watch import BarrierWatch

# the module dtypes, by the names the kernels' templates give them
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def run_bound(executor: Any, tensors: Mapping[str, Any]) -> None:
    """``executor.run_bound`` on torch tensors, each converted once through
    ``tvm_ffi.from_dlpack`` (a plan passes x, h0, out and h_n to several of its calls: one
    conversion each, not one per argument of every call)."""
    executor.run_bound({name: tvm_ffi.from_dlpack(tensor) for name, tensor in tensors.items()})


@dataclass(frozen=True)
class EagerCall:
    """An eager CUDA call on a recorded graph: inputs copied into its static tensors, the graph
    replayed on torch's current stream, outputs copied out in the module's dtype."""

    record: "CallGraph"
    watch: BarrierWatch
    dtype: Any

    def run(self, x: Any, hx: Any, lengths: Any = None, copy_out: bool = True) -> tuple[Any, Any]:
        """``x`` time-major (or a ``PackedInput``, padded straight into the static input);
        ``lengths`` int32 on the device where the plan takes them; ``out`` is the static one
        where ``copy_out`` is false (the caller copies what it needs at once)."""
        record = self.record
        self.watch.check()
        if isinstance(x, PackedInput):
            x.pad_into(record.x)
        else:
            record.x.copy_(x)  # into the static input: the layout and dtype conversions in one copy
        record.filled[0] = None  # every step and row of it (``torch_buckets.PaddedCall``)
        if hx is not None:
            record.h0.copy_(hx)
        if record.lengths is not None and record.lengths_from[0] is not lengths:
            record.lengths.copy_(lengths)  # a layout's device lengths never change: copied once in a row
            record.lengths_from[0] = lengths
        record.graph.replay()
        self.watch.mark()
        out = record.out.to(self.dtype, copy=True) if copy_out else record.out.to(self.dtype)
        return out, record.h_n.to(self.dtype, copy=True)


@dataclass(frozen=True)
class TwinCall:
    """An eager call of a shape that torch's own module serves (``EagerCall``'s interface)."""

    twin: TorchTwin
    key: Any  # tvm_ext.torch.EngineKey

    def run(self, x: Any, hx: Any, lengths: Any = None, copy_out: bool = True) -> tuple[Any, Any]:
        return self.twin.call(self.key, x, hx, graphs=True)


@dataclass(frozen=True)
class PackedLayout:
    """Where a ``PackedSequence``'s data rows sit among the padded time-major (seq·batch) rows,
    batch in the packed (sorted, longest first) order: padding is one ``index_select`` (rows past
    a length take data row 0: the kernels never read them, ``schedules/gru/lengths.py``),
    unpacking another (``pad_packed_sequence`` copies once per distinct batch size, up to one
    copy a step, and ``pack_padded_sequence`` slices every step)."""

    seq: int
    batch: int
    rows: Any  # int64 (sum of the lengths,) on the data's device: row t·batch + b of packed row j
    gather: Any  # int64 (seq·batch,) on the data's device: the packed row of padded row t·batch + b
    lengths: Any  # int32 CPU tensor (batch,), non-increasing
    device_lengths: Any  # the same on the data's device, made once: a CUDA graph captured with them
    # reads the same memory at every replay (no host copy inside it)

    @classmethod
    def of(cls, batch_sizes: tuple[int, ...], device: Any) -> "PackedLayout":
        seq, batch = len(batch_sizes), batch_sizes[0]
        rows = torch.cat([torch.arange(t * batch, t * batch + n) for t, n in enumerate(batch_sizes)])
        gather = torch.zeros(seq * batch, dtype=torch.int64)
        gather[rows] = torch.arange(len(rows))
        sizes = torch.tensor(batch_sizes)
        lengths = (torch.arange(batch)[None, :] < sizes[:, None]).sum(0).to(torch.int32)
        return cls(seq, batch, rows.to(device), gather.to(device), lengths, lengths.to(device))

    def pad(self, data: Any) -> Any:
        """(seq, batch, features): ``data``'s rows in place; past each row's length a copy of
        data row 0, which the GRU's hold keeps from the state."""
        return data.index_select(0, self.gather).view(self.seq, self.batch, *data.shape[1:])

    def unpack(self, out: Any) -> Any:
        """The packed data rows of time-major ``out`` (seq, batch, width)."""
        return out.reshape(self.seq * self.batch, -1).index_select(0, self.rows)


@dataclass(frozen=True)
class PackedInput:
    """A ``PackedSequence``'s data with its layout: padded (one ``index_select``) only where it
    is used, straight into a recorded graph's static input when the dtypes agree."""

    data: Any
    layout: PackedLayout

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.layout.seq, self.layout.batch, self.data.shape[1])

    @property
    def device(self) -> Any:
        return self.data.device

    def padded(self) -> Any:
        return self.layout.pad(self.data)

    def pad_into(self, static: Any) -> None:
        """Padded into ``static`` (seq, batch, features): one gather, no copy after it."""
        if static.dtype == self.data.dtype:
            torch.index_select(self.data, 0, self.layout.gather, out=static.view(-1, static.shape[-1]))
        else:
            static.copy_(self.padded())


@dataclass(frozen=True)
class CallGraph:
    """One shape's plan recorded as a CUDA graph on static tensors (the eager path): ``x`` is
    time-major in the kernels' dtype, ``h0`` the initial state replays read (None where the
    recording had no hx: its plan reads the module's zeros), ``lengths`` the int32 lengths for a
    variable-length plan and ``lengths_from`` the one tensor they were last copied from (a packed
    layout's lengths on the device, made once per layout: the same layout's next call need not
    copy them again)."""

    graph: Any
    x: Any
    h0: Any
    lengths: Any
    out: Any
    h_n: Any
    lengths_from: list[Any]
    filled: list[Any]  # (seq, batch) a padded call last wrote with zeros past them; None: the whole input

    @classmethod
    def record(cls, module: Any, engine: Any, x: Any, hx: Any, lengths: Any) -> "CallGraph":
        t = engine.template
        x_static = torch.empty(t.seq, t.batch, t.input, dtype=TORCH_DTYPES[t.x_dtype], device=x.device)
        h0 = None if hx is None else torch.empty(hx.shape, dtype=TORCH_DTYPES[t.h_dtype], device=x.device)
        lengths_static = None
        if t.variable_lengths:
            lengths_static = torch.empty(t.batch, dtype=torch.int32, device=x.device)
            lengths_static.copy_(lengths)
        if h0 is not None:
            h0.copy_(hx)
        x_static.copy_(x)
        out, h_n, tensors = module._kernel_tensors(engine, x_static, h0, lengths_static)
        graph = torch.cuda.CUDAGraph()
        watch = module._watch(engine)
        with torch.cuda.graph(graph):
            module._launch(engine, watch, tensors, torch.cuda.current_stream(x.device), zero_h0=hx is None)
            watch.enqueue()  # the flags' kernel (and copy), replayed with the plan
        return cls(graph, x_static, h0, lengths_static, out, h_n, [lengths], [None])
