"""Variable-length batches: each batch row stops at its own length, as ``torch.nn.GRU`` runs a
``PackedSequence``: outputs past a row's length are zero, h_n is its state after its last
step, and the backward direction starts at the row's last step.

How: after a layer's input GEMM, ``gru_hold`` sets the update gate's input sum to ``HOLD``
(and the reset and new gates' to 0) wherever t >= length.  Every step kernel computes
z = sigmoid(gi_z + gh_z) and h' = (1 - z)·n + z·h, so z is exactly 1 there and h' = h exactly:
the forward state stops at the row's last step and the backward state stays h0 until it
reaches it.  The last layer's output rows past the length are then zeroed (``gru_zero_out``).
Inner layers need no zeroing: what they hold past a length only feeds held steps, whose input
sums the hold overwrites (so the padding's values, NaN or not, never reach the state).
Both kernels run a thread per 16 bytes of a row on CUDA (``row_vector``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tvm_ext.core.errors import TvmExtError
from tvm_ext.precision.precision import itemsize

# sigmoid(HOLD + gh) == 1 exactly in float16, bfloat16 and float32 (exp(-HOLD) underflows to 0)
# for any |gh| well under HOLD; HOLD is exact in all three types.
HOLD = 8192.0
LENGTHS_DTYPE = "int32"
GRU_HELD = (0.0, HOLD, 0.0)  # r, z, n: z = 1 exactly, so h' = h


def _constant(dtype: str, value: float) -> Any:
    """``value`` in ``dtype``; bfloat16 as its bits (TVM's OpenCL cast of a bfloat16 literal
    takes the address of the float literal, which OpenCL C refuses)."""
    from tvm import tirx

    if dtype != "bfloat16":
        return tirx.const(value, dtype)
    bits = int(np.array(value, np.float32).view(np.uint32)) >> 16  # exact: HOLD and 0 need no rounding
    return tirx.reinterpret("bfloat16", tirx.const(bits, "uint16"))


def _held_value(T: Any, gate: Any, held: tuple[float, ...], dtype: str) -> Any:
    """``held[gate]`` as an expression of ``gate``: a choice for each gate not held at 0."""
    value = _constant(dtype, 0.0)
    for index, constant in enumerate(held):
        if constant:
            value = T.if_then_else(gate == index, _constant(dtype, constant), value)
    return value


def row_vector(hidden: int, dtype: str, kind: str) -> int:
    """Elements of a row one thread of the hold and the zeroing writes: 16 bytes on CUDA where
    the hidden size is a multiple of them (a vector then lies in one gate), else fewer; 1 on
    other targets."""
    vec = 16 // itemsize(dtype) if kind == "cuda" else 1
    while hidden % vec:
        vec //= 2
    return vec


def hold_func(steps: int, batch: int, hidden: int, dirs: int, gi_dtype: str, vec: int = 1,
              held: tuple[float, ...] = GRU_HELD) -> Any:
    """gi at rows (t, b) with t >= lengths[b], in place: gate g's columns ``held[g]`` (the GRU's:
    the update gate's ``HOLD``, the reset and new gates' 0), whatever the input there was
    (padding, or an inner layer's output past a length), ``vec`` elements at a time
    (``row_vector``)."""
    from tvm.script import tirx as T

    G = len(held) * hidden

    @T.prim_func(s_tir=True)
    def hold(lengths: T.Buffer((batch,), LENGTHS_DTYPE), gi: T.Buffer((steps * batch, dirs * G), gi_dtype)):
        T.func_attr({"tirx.noalias": True})
        for r, c, v in T.grid(steps * batch, dirs * G // vec, vec):
            with T.sblock("hold"):
                vr, vc, vv = T.axis.remap("SSS", [r, c, v])
                if vr // batch >= lengths[vr % batch]:
                    gi[vr, vc * vec + vv] = _held_value(T, vc * vec % G // hidden, held, gi_dtype)

    return hold


def zero_out_func(steps: int, batch: int, width: int, out_dtype: str, vec: int = 1) -> Any:
    """out's rows (t, b) with t >= lengths[b] set to zero (in place), ``vec`` elements at a time."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def zero_out(lengths: T.Buffer((batch,), LENGTHS_DTYPE), out: T.Buffer((steps * batch, width), out_dtype)):
        T.func_attr({"tirx.noalias": True})
        for r, c, v in T.grid(steps * batch, width // vec, vec):
            with T.sblock("zero_out"):
                vr, vc, vv = T.axis.remap("SSS", [r, c, v])
                if vr // batch >= lengths[vr % batch]:
                    out[vr, vc * vec + vv] = _constant(out_dtype, 0.0)

    return zero_out



def checked_lengths(lengths: Any, batch: int, seq: int, enforce_sorted: bool = False, what: str = "GRU") -> np.ndarray:
    """``lengths`` (a sequence, numpy array or CPU tensor) as int32 (batch,), or a clear error
    (``what``: the layer's name in it): one length per row, each in [1, seq]; non-increasing where
    ``enforce_sorted`` (as ``torch.nn.utils.rnn.pack_padded_sequence`` requires by default)."""
    if hasattr(lengths, "detach"):
        lengths = lengths.detach().cpu().numpy()
    array = np.asarray(lengths)
    if array.ndim != 1 or array.shape[0] != batch:
        raise TvmExtError(f"{what} lengths has shape {array.shape}, expected ({batch},): one length per batch row")
    if array.dtype.kind not in "iu":
        if array.dtype.kind != "f" or not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
            raise TvmExtError(f"{what} lengths must be integers, got {array.dtype} values {array[:4].tolist()}")
    values = array.astype(np.int64)
    bad = np.flatnonzero((values < 1) | (values > seq))
    if bad.size:
        i = int(bad[0])
        raise TvmExtError(f"{what} lengths[{i}] = {int(values[i])} is outside 1..{seq} (every row needs at least "
                          f"one step and at most the sequence length {seq})")
    if enforce_sorted and np.any(np.diff(values) > 0):
        i = int(np.flatnonzero(np.diff(values) > 0)[0]) + 1
        raise TvmExtError(f"{what} lengths are not sorted in decreasing order (lengths[{i}] = {int(values[i])} > "
                          f"lengths[{i - 1}] = {int(values[i - 1])}); sort the batch or pass enforce_sorted=False")
    return values.astype(np.int32)
