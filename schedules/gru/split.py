"""The float32 input GEMM on float16 tensor cores (knob ``in_split``): each operand is split
into a high and a low float16 part, ``v = hi + lo`` (``hi`` = v rounded to float16, ``lo`` =
the rest rounded to float16: 22 of float32's 24 bits), and

    A·B ≈ A_hi·B_hi + A_hi·B_lo + A_lo·B_hi

is one float16 GEMM of depth 3K with a float32 accumulator, ``[A_hi | A_hi | A_lo]`` times
``[B_hi; B_lo; B_hi]`` (the dropped ``A_lo·B_lo`` is 2^-22 of a product).  The tensor cores
multiply float16 exactly into float32, so the result is float32-accurate at a third of the
tensor cores' float16 rate, far above the CUDA cores' float32 rate (the idea of CUTLASS's
3xTF32, with float16 parts because TVM 0.27 has float16 mma.sync tiles).

Range: a float16 part must not overflow (|v| < 65504) and a low part below float16's
smallest normal number (2^-14) loses bits.  x (and the hidden state, |h| < 1) are split as
they are: a low part that is subnormal still has an absolute error under 2^-25.  W_ih is
stored times ``SPLIT_WEIGHT_SCALE`` (PyTorch's init keeps |W| <= 1/sqrt(H), whose low parts
would be subnormal) and the GEMM's epilogue multiplies by its inverse before the bias, which
stays float32.  Both splits run on the device in every forward pass (W_ih too: the pass is
self-contained, what a caller loading new weights gets, about 1 % of it at B64 H1024).

``in_split`` 3 splits into TF32 parts instead (``gemm_3xtf32``: float32 words with 13 low
mantissa bits zero, at float32's exponent range) for Hopper's TF32 wgmma: no range to check and
no scale, at half the float16 rate and twice the parts' bytes.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tvm_ext.schedules.gemm.gemm_3xtf32 import A_ORDER, A_TWO_PARTS, B_ORDER, B_TWO_PARTS, TF32_K_PARTS, tf32_part

SPLIT_WEIGHT_SCALE = 2.0 ** 8  # W_ih's float16 parts hold W_ih x 256 (|W_ih| up to 255)
FLOAT16_MAX = 65504.0
PARTS = 3  # A: hi, hi, lo; B: hi, lo, hi
FLOAT16_SPLITS = (1, 2)  # the in_split values with float16 parts (a range to check); 3 has TF32 parts
K_ALIGN = 32  # each part is zero-padded to a multiple of this depth (tensor-core k stages divide it)


def tf32_orders(parts: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The TF32 parts x's and W_ih's rows hold, in order (``in_tf32_parts``): three side by side,
    one GEMM of depth 3K (``A_ORDER``, ``B_ORDER``), or two, each k tile's three products reading
    them in turn (``A_TWO_PARTS``, ``B_TWO_PARTS``; ``TF32_K_PARTS``)."""
    return (A_TWO_PARTS, B_TWO_PARTS) if parts == 2 else (A_ORDER, B_ORDER)


def tf32_k_parts(parts: int) -> tuple[tuple[int, int], ...]:
    """``wgmma_gemm``'s ``k_parts`` for TF32 operands stored as ``parts`` parts (none for three)."""
    return TF32_K_PARTS if parts == 2 else ()


def split_depth(k: int) -> int:
    """The depth of one part of an operand of depth ``k`` (padded with zeros)."""
    return -(-k // K_ALIGN) * K_ALIGN


def high_part(value: Any) -> Any:
    """A float32 ``value``'s high float16 part: the value rounded to float16 (TIR)."""
    return value.astype("float16")


def low_part(value: Any) -> Any:
    """A float32 ``value``'s low float16 part: the rest past its high part, rounded (TIR)."""
    return (value - high_part(value).astype("float32")).astype("float16")


def scaled_weight(w: Any, d: Any, k: Any, column: Any, hidden: int, unit: Any, gates: int = 3) -> Any:
    """``w[d, k, column]`` of a (dirs, hidden, gates·hidden) float32 W_hh times ``SPLIT_WEIGHT_SCALE``,
    zero where ``k`` or the column's ``unit`` is past the hidden size (the indices clamped, the
    load not made there): what the split step kernels stage as W_hh's parts (TIR)."""
    from tvm import tirx

    inside = tirx.all(k < hidden, unit < hidden)
    value = tirx.if_then_else(inside, w[d, tirx.min(k, hidden - 1), tirx.min(column, gates * hidden - 1)],
                              tirx.const(0, "float32"))
    return value * tirx.const(SPLIT_WEIGHT_SCALE, "float32")


def _hi_lo(value: Any, low: Any) -> Any:
    """``value``'s high float16 part, or where ``low`` holds its low part (TIR)."""
    from tvm import tirx

    return tirx.Select(low, low_part(value), high_part(value))


def _padded(depth: Any, k: int, part: Any) -> Any:
    """``part`` where ``depth`` (within one part) is below ``k``, else 0 (not evaluated there)."""
    from tvm import tirx

    return tirx.if_then_else(depth < k, part, tirx.const(0, str(part.ty)))


def split_rows_func(m: int, k: int, tf32: bool = False, parts: int = PARTS) -> Any:
    """TE: A (m, k) float32 -> (m, 3·kp) float16, ``[A_hi | A_hi | A_lo]`` along the row, each
    part zero-padded to ``kp = split_depth(k)``.  ``tf32``: float32 TF32 parts ``[A_lo | A_hi |
    A_hi]`` (``gemm_3xtf32``'s ``A_ORDER``, the small product first) for in_split 3, or with
    ``parts`` 2 ``[A_lo | A_hi]`` (``tf32_orders``)."""
    from tvm import te, tirx

    kp = split_depth(k)
    order = tf32_orders(parts)[0]
    a = te.placeholder((m, k), "float32", name="A")

    def part(i: Any, j: Any) -> Any:
        depth = tirx.floormod(j, kp)
        value = a[i, depth]
        if tf32:  # the first part, then the second (three parts: two alike, A_ORDER[1] == A_ORDER[2])
            return _padded(depth, k, tirx.Select(j < kp, tf32_part(value, order[0]), tf32_part(value, order[1])))
        return _padded(depth, k, _hi_lo(value, j >= 2 * kp))

    return te.create_prim_func([a, te.compute((m, (parts if tf32 else PARTS) * kp), part, name="split")])


def split_weight_func(k: int, n: int, scale: float = SPLIT_WEIGHT_SCALE) -> Any:
    """TE: B (k, n) float32 -> (3·kp, n) float16, ``[B_hi; B_lo; B_hi]`` of B x ``scale``, each
    part zero-padded to ``kp = split_depth(k)`` rows."""
    from tvm import te, tirx

    kp = split_depth(k)
    b = te.placeholder((k, n), "float32", name="B")

    def part(j: Any, c: Any) -> Any:
        depth = tirx.floormod(j, kp)
        return _padded(depth, k, _hi_lo(b[depth, c] * tirx.const(scale, "float32"), tirx.floordiv(j, kp) == 1))

    return te.create_prim_func([b, te.compute((PARTS * kp, n), part, name="split")])


def split_weight_n_major_func(k: int, n: int, scale: float = SPLIT_WEIGHT_SCALE, tf32: bool = False,
                              parts: int = PARTS) -> Any:
    """TIR: B (k, n) float32 -> (n, 3·kp) float16, ``[B_hi | B_lo | B_hi]`` of Bᵀ x ``scale`` along
    each row (K-major, what the wgmma GEMM reads), each part zero-padded to ``kp``: 32 x 32 tiles
    transposed through shared memory, so reads and writes are both coalesced.  ``tf32``: float32
    TF32 parts of B (``B_ORDER``, unscaled) for in_split 3, or with ``parts`` 2 ``[B_hi | B_lo]``
    (``tf32_orders``)."""
    from tvm.script import tirx as T

    kp = split_depth(k)
    tiles_n = -(-n // 32)
    dtype, factor = ("float32", 1.0) if tf32 else ("float16", scale)
    order = tf32_orders(parts)[1] if tf32 else ("hi", "lo", "hi")
    width, third = len(order) * kp, len(order) == 3

    def parts_of(value: Any) -> tuple[Any, ...]:
        if tf32:
            return tuple(tf32_part(value, which) for which in order)
        hi = T.Cast("float16", value)
        return hi, T.Cast("float16", value - T.Cast("float32", hi)), hi

    @T.prim_func
    def main(B: T.Buffer((k, n), "float32"), parts: T.Buffer((n, width), dtype)):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        bid = T.launch_thread("blockIdx.x", tiles_n * (kp // 32))
        tx = T.launch_thread("threadIdx.x", 32)
        ty = T.launch_thread("threadIdx.y", 8)
        tile = T.alloc_buffer((32 * 33,), "float32", scope="shared")  # rows padded: conflict-free columns
        for i in T.unroll(4):
            row = bid // tiles_n * 32 + ty + 8 * i
            col = bid % tiles_n * 32 + tx
            tile[(ty + 8 * i) * 33 + tx] = T.if_then_else(row < k and col < n, B[row, col] * T.float32(factor),
                                                          T.float32(0))
        T.tvm_storage_sync("shared")
        for i in T.unroll(4):
            col = bid % tiles_n * 32 + ty + 8 * i
            depth = bid // tiles_n * 32 + tx
            if col < n:
                value = tile[tx * 33 + ty + 8 * i]
                values = T.meta_var(parts_of(value))
                parts[col, depth] = values[0]
                parts[col, kp + depth] = values[1]
                if third:
                    parts[col, 2 * kp + depth] = values[2]

    return main


def split_parts(value: np.ndarray, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """numpy: (hi, lo) float16 parts of ``value`` x ``scale`` (what the kernels store)."""
    scaled = np.asarray(value, np.float32) * np.float32(scale)
    hi = scaled.astype(np.float16)
    return hi, (scaled - hi.astype(np.float32)).astype(np.float16)


def split_product(a: np.ndarray, b: np.ndarray, scale: float = SPLIT_WEIGHT_SCALE) -> np.ndarray:
    """numpy float64 of what the split GEMM computes for ``a @ b`` (the three products, B
    scaled and unscaled), for tests."""
    a_hi, a_lo = (p.astype(np.float64) for p in split_parts(a))
    b_hi, b_lo = (p.astype(np.float64) for p in split_parts(b, scale))
    return (a_hi @ b_hi + a_hi @ b_lo + a_lo @ b_hi) / scale


def split_range_reason(name: str, value: np.ndarray, scale: float = 1.0, knob: str = "in_split") -> str | None:
    """Why ``value`` cannot be split into float16 parts (a part would overflow), or None;
    ``knob``: the one whose split it is (the input GEMM's, or the step kernel's ``step_tc`` 2)."""
    if value.size == 0:
        return None
    largest = float(np.max(np.abs(np.asarray(value, np.float64))))
    if not largest * scale < FLOAT16_MAX:
        return (f"{name} has |value| {largest:g}, beyond what its float16 parts hold "
                f"({FLOAT16_MAX / scale:g}); build without {knob}")
    return None
