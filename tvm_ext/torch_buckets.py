"""Shape buckets of ``tvm_ext.torch.GRU``: calls of many (seq, batch) served by a few compiled GRUs.

Why: the module compiles a GRU per (batch, seq) on a shape's first call (seconds on a GPU), so a
model fed sequences of many lengths or batches of many sizes (an inference server, a compiled
model with dynamic shapes) would stop to compile at each new one.  With buckets a call's seq and
batch are rounded up to the smallest bucket that holds them: the input is padded with zero steps
and rows and run on the bucket's GRU, every row's length set to the call's seq when steps were
added (the variable-length plan holds each row's state from its length on, so ``h_n`` is the
state after the call's last step, and a bidirectional layer's reverse direction starts there);
the outputs are cut back.  A size past the largest bucket is its own.  The padding costs the
added steps and rows, and the variable-length plan a little more than the fixed one.  From a
shape's second eager CUDA call on (``PaddedCall``) the input is copied straight into the leading
steps and rows of the bucket's recorded graph and the outputs straight out of them: no padded
tensor, no checks, one copy each way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from tvm_ext.core.errors import TvmExtError

BUCKETED = ("seq", "batch")


@dataclass(frozen=True)
class ShapeBuckets:
    """Sorted bucket sizes of each bucketed dimension (an empty tuple: that size is exact)."""

    seq: tuple[int, ...] = ()
    batch: tuple[int, ...] = ()

    @classmethod
    def of(cls, buckets: Mapping[str, Sequence[int]] | None) -> "ShapeBuckets | None":
        """``{"seq": [...], "batch": [...]}`` (either left out) as buckets; None for None.  One
        ``TvmExtError`` for another name or a size that is no positive integer."""
        if buckets is None:
            return None
        if not isinstance(buckets, Mapping) or set(buckets) - set(BUCKETED):
            raise TvmExtError(f"tvm_ext.torch.GRU buckets takes a mapping of {' and '.join(BUCKETED)} to sizes, "
                              f"got {buckets!r}")
        sizes = {}
        for name, values in buckets.items():
            values = list(values) if isinstance(values, (list, tuple, range)) else [values]
            if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
                raise TvmExtError(f"tvm_ext.torch.GRU buckets[{name!r}] must be positive integers, "
                                  f"got {buckets[name]!r}")
            sizes[name] = tuple(sorted(set(values)))
        return cls(**sizes)

    def round(self, seq: int, batch: int) -> tuple[int, int]:
        """(seq, batch) rounded up to their buckets (each its own past the largest)."""
        return _up(seq, self.seq), _up(batch, self.batch)


def _up(size: int, buckets: tuple[int, ...]) -> int:
    return next((bucket for bucket in buckets if bucket >= size), size)


def pad(x: Any, hx: Any, seq: int, batch: int) -> tuple[Any, Any]:
    """Time-major ``x`` and ``hx`` (or None) padded with zeros to ``seq`` steps and ``batch`` rows."""
    padded = x.new_zeros((seq, batch, x.shape[2]))
    padded[:x.shape[0], :x.shape[1]] = x
    if hx is None:
        return padded, None
    h0 = hx.new_zeros((hx.shape[0], batch, hx.shape[2]))
    h0[:, :hx.shape[1]] = hx
    return padded, h0


def cut(out: Any, h_n: Any, seq: int, batch: int) -> tuple[Any, Any]:
    """A padded call's (out, h_n) cut back to the call's ``seq`` steps and ``batch`` rows,
    contiguous as ``nn.GRU``'s."""
    return out[:seq, :batch].contiguous(), h_n[:, :batch].contiguous()


@dataclass(frozen=True)
class PaddedCall:
    """An eager CUDA call of a bucketed shape on its bucket's recorded graph (``torch.EagerCall``'s
    interface): x (time-major) and hx copied into the static tensors' leading ``seq`` steps and
    ``batch`` rows, the graph replayed, the outputs copied out of the same steps and rows.  The
    static input is shared by every shape of the bucket, so where the last call that filled it
    had another shape (``record.filled``), the steps and rows past this one's are zeroed first:
    what another call left there would be run (and range-checked) as this call's padding."""

    record: Any  # torch.CallGraph of the bucket's shape
    watch: Any  # its BarrierWatch
    dtype: Any  # the module's
    seq: int
    batch: int
    lengths: Any  # int32 on the device, every row ``seq`` (None where the bucket adds no steps)

    def run(self, x: Any, hx: Any, lengths: Any = None, copy_out: bool = True) -> tuple[Any, Any]:
        record, seq, batch = self.record, self.seq, self.batch
        self.watch.check()
        if record.filled[0] != (seq, batch):
            record.x[seq:].zero_()
            record.x[:seq, batch:].zero_()
            if hx is not None:
                record.h0[:, batch:].zero_()
            record.filled[0] = (seq, batch)
        record.x[:seq, :batch].copy_(x)
        if hx is not None:
            record.h0[:, :batch].copy_(hx)
        if record.lengths is not None and record.lengths_from[0] is not self.lengths:
            record.lengths.copy_(self.lengths)
            record.lengths_from[0] = self.lengths
        record.graph.replay()
        self.watch.mark()
        out = torch.empty((seq, batch, record.out.shape[2]), dtype=self.dtype, device=record.out.device)
        h_n = torch.empty((record.h_n.shape[0], batch, record.h_n.shape[2]), dtype=self.dtype,
                          device=record.h_n.device)
        return out.copy_(record.out[:seq, :batch]), h_n.copy_(record.h_n[:, :batch])
