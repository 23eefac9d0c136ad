"""What the GRU's step kernels share, in TIR: PyTorch's cell (r, z, n, h') with the accurate
tanh, a value rounded as storing it would round it, the store of h' into the state and the
output, the tagged words the persistent kernels exchange h in, and a thread's register
budget.  The cell kernel, the fused step kernel, the flag-exchange kernel and the tensor-core
kernel all build on these, so their arithmetic agrees to the bit.  The fused step kernel also
runs PyTorch's LSTM cell (``lstm_c``, ``lstm_h``, ``lstm_store_macro``) for ``schedules.lstm``."""
from __future__ import annotations

from typing import Any

from .compute import F32

# A thread's registers: what it may have, and what a step kernel needs besides a share of
# W_hh held in registers (accumulators, addresses, the cell).
MAX_REGISTERS, OTHER_REGISTERS = 255, 40

# The recurrent cells the fused step kernel runs, and their gates (PyTorch's order: GRU r, z, n;
# LSTM i, f, g, o)
GRU_CELL, LSTM_CELL = "gru", "lstm"
CELL_GATES = {GRU_CELL: 3, LSTM_CELL: 4}


def tanh(T: Any, v: Any, math: str, kind: str) -> Any:
    """tanh(v); in float32 as sign(v)·(-e / (2 + e)) with e = expm1(-2|v|): NVRTC builds TVM's
    CUDA with --use_fast_math, under which tanhf is an approximation that set the float32 GRU's
    error, while expm1f stays accurate (figures: ``docs/results/gru.md``).  ``kind``: the
    target kind, which names the C function (CUDA ``expm1f``, OpenCL ``expm1``)."""
    from tvm import tirx

    if math != "float32":  # (and "" where the caller wants the plain tanh)
        return T.tanh(v)
    e = tirx.call_pure_extern(math, "expm1f" if kind == "cuda" else "expm1",
                              tirx.const(-2.0, math) * tirx.abs(v))
    magnitude = -e / (tirx.const(2.0, math) + e)
    return tirx.if_then_else(v < tirx.const(0.0, math), -magnitude, magnitude)  # OpenCL C has no copysignf


def cell_gates(T: Any, gi_r: Any, gi_z: Any, gi_n: Any, gh_r: Any, gh_z: Any, gh_n: Any, math: str,
               kind: str = "cuda", state: str = F32) -> tuple[Any, Any]:
    """The cell's update gate z and candidate n (``cell_math``), for a kernel that keeps z
    in a register: the blend reads z twice, and nvcc does not merge the two sigmoids."""
    def m(value: Any) -> Any:
        return value.astype(math)  # no cast when the type already is ``math``

    r = T.sigmoid(m(gi_r) + m(gh_r))
    z = T.sigmoid(m(gi_z) + m(gh_z))
    # the accurate tanh where the state keeps float32's precision (16-bit states round it away)
    return z, tanh(T, m(gi_n) + r * m(gh_n), math if state == F32 else "", kind)


def cell_blend(z: Any, n: Any, h: Any, math: str) -> Any:
    """h' = (1-z)n + z·h in type ``math``."""
    import tvm

    return (tvm.tirx.const(1.0, math) - z) * n + z * h.astype(math)


def cell_math(T: Any, gi_r: Any, gi_z: Any, gi_n: Any, gh_r: Any, gh_z: Any, gh_n: Any,
              h: Any, math: str, kind: str = "cuda", state: str = F32) -> Any:
    """PyTorch's cell in type ``math`` (every operand widened to it first): r, z from
    input+hidden gates; n = tanh(gi_n + r·gh_n); h' = (1-z)n + z·h.  ``kind``: the target's;
    ``state``: h's stored type (a 16-bit state rounds away what ``tanh``'s accuracy buys)."""
    z, n = cell_gates(T, gi_r, gi_z, gi_n, gh_r, gh_z, gh_n, math, kind, state)
    return cell_blend(z, n, h, math)


def lstm_c(T: Any, gi_i: Any, gi_f: Any, gi_g: Any, gh_i: Any, gh_f: Any, gh_g: Any, c: Any, math: str,
           kind: str = "cuda", state: str = F32) -> Any:
    """PyTorch's LSTM cell state c' = f·c + i·g in type ``math`` (i, f = σ(gi + gh), g = tanh(gi_g
    + gh_g)).  ``state``: the stored type of h and c (the accurate tanh where it keeps float32's
    precision, as ``cell_gates``)."""
    def m(value: Any) -> Any:
        return value.astype(math)

    i = T.sigmoid(m(gi_i) + m(gh_i))
    f = T.sigmoid(m(gi_f) + m(gh_f))
    g = tanh(T, m(gi_g) + m(gh_g), math if state == F32 else "", kind)
    return f * m(c) + i * g


def lstm_h(T: Any, gi_o: Any, gh_o: Any, c_new: Any, math: str, kind: str = "cuda", state: str = F32) -> Any:
    """PyTorch's LSTM output h' = o·tanh(c') (o = σ(gi_o + gh_o)) from the cell state ``c_new``."""
    o = T.sigmoid(gi_o.astype(math) + gh_o.astype(math))
    return o * tanh(T, c_new.astype(math), math if state == F32 else "", kind)


def state_width(cell: str, hidden: int) -> int:
    """The width of a persistent step kernel's state slot: h, and after it the LSTM's c."""
    return 2 * hidden if cell == LSTM_CELL else hidden


def stored_as(value: Any, dtype: str) -> Any:
    """``value`` rounded to ``dtype`` as storing it in a ``dtype`` buffer would, for a value
    that stays in registers.  bfloat16 is rounded with integer ops on the float32 bits
    (round to nearest even, as TVM's bfloat16 stores do), because TVM computes bfloat16 in
    float32 where the target has no bfloat16 arithmetic and would drop a plain cast there."""
    from tvm import tirx

    if dtype != "bfloat16":
        return value.astype(dtype)
    u32 = lambda v: tirx.const(v, "uint32")  # noqa: E731
    bits = tirx.reinterpret("uint32", value.astype("float32"))
    rounded = (bits + u32(0x7FFF) + ((bits >> u32(16)) & u32(1))) & u32(0xFFFF0000)
    return tirx.reinterpret("float32", rounded)


def store_macro(steps: int, batch: int, hidden: int, dirs: int, h_dtype: str, out_dtype: str,
                 pingpong: bool = False) -> Any:
    """S4 of the cell and of the fused step kernel: h' (math type) into the next state and
    h_n as ``h_dtype``, and into out[t] (t = step, or T-1-step backward) as ``out_dtype``.
    ``pingpong``: the state is one (2, dirs, batch, hidden) buffer and step s writes slot
    (s+1) % 2 (the fused step kernel; see ``step_func``)."""
    from tvm.script import tirx as T

    @T.macro
    def store(h_new, step, layer, h_out, out, h_n):  # type: ignore[no-untyped-def]
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("store"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                row = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step) * batch + vb)
                h_out[vd, vb, vj] = h_new[vd, vb, vj].astype(h_dtype)
                out[row, vd * hidden + vj] = h_new[vd, vb, vj].astype(out_dtype)
                h_n[layer * dirs + vd, vb, vj] = h_new[vd, vb, vj].astype(h_dtype)

    @T.macro
    def store_pingpong(h_new, step, layer, hs, out, h_n):  # type: ignore[no-untyped-def]
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("store"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                row = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step) * batch + vb)
                hs[(step + 1) % 2, vd, vb, vj] = h_new[vd, vb, vj].astype(h_dtype)
                out[row, vd * hidden + vj] = h_new[vd, vb, vj].astype(out_dtype)
                h_n[layer * dirs + vd, vb, vj] = h_new[vd, vb, vj].astype(h_dtype)

    return store_pingpong if pingpong else store


def lstm_store_macro(steps: int, batch: int, hidden: int, dirs: int, h_dtype: str, out_dtype: str) -> Any:
    """S4 of the fused step kernel running the LSTM cell: h' and c' into the next slot of the
    (2, dirs, batch, 2·hidden) state (c after h: only the owning thread reads its c back), h'
    into out[t] and h_n (``store_macro``'s ping-pong form otherwise; c_n is copied from the
    state after the last step)."""
    from tvm.script import tirx as T

    @T.macro
    def store(h_new, c_new, step, layer, hs, out, h_n):  # type: ignore[no-untyped-def]
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("store"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                row = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step) * batch + vb)
                hs[(step + 1) % 2, vd, vb, vj] = h_new[vd, vb, vj].astype(h_dtype)
                hs[(step + 1) % 2, vd, vb, hidden + vj] = c_new[vd, vb, vj].astype(h_dtype)
                out[row, vd * hidden + vj] = h_new[vd, vb, vj].astype(out_dtype)
                h_n[layer * dirs + vd, vb, vj] = h_new[vd, vb, vj].astype(h_dtype)

    return store


def word_tag(T: Any, word: Any) -> Any:
    """The step tag of an exchange word (its high 32 bits), as either step kernel writes it."""
    return T.Cast("int32", T.shift_right(word, T.uint64(32)))


def pack_pair(T: Any, first: Any, second: Any, dtype: str, tag: Any) -> Any:
    """One exchange word of the tensor-core kernel: two 16-bit values (``first`` in the low
    half) and the step ``tag`` in the high 32 bits."""
    def bits(value: Any) -> Any:
        return T.Cast("uint64", T.reinterpret("uint16", T.Cast(dtype, value)))

    return T.bitwise_or(T.bitwise_or(T.shift_left(T.Cast("uint64", tag), T.uint64(32)),
                                     T.shift_left(bits(second), T.uint64(16))), bits(first))


def float_word(T: Any, value: Any, tag: Any) -> Any:
    """One exchange word of a float32 state: ``value``'s bits in the low half and the step ``tag``
    in the high 32 bits (the flag-exchange kernel's, and the split tensor-core kernel's)."""
    bits = T.Cast("uint64", T.reinterpret("uint32", T.Cast("float32", value)))
    return T.bitwise_or(T.shift_left(T.Cast("uint64", tag), T.uint64(32)), bits)


def word_float(T: Any, word: Any) -> Any:
    """The float32 value of a ``float_word``."""
    return T.reinterpret("float32", T.Cast("uint32", word))


def pair_tag(T: Any, step: Any) -> Any:
    """The one-bit tag of a ``float_pair`` word of ``step``: bit 1 of the step.  Step s's words
    go to slot s mod 2, where a poll for s finds step s - 2's or step s's and never another (a
    word of s + 2 needs the poller's own h of s + 1), so one bit tells the two apart; the init
    writes slot 1 with the bit set, which no step-1 word has."""
    return T.bitwise_and(T.shift_right(T.Cast("uint64", step), T.uint64(1)), T.uint64(1))


def float_pair(T: Any, first: Any, second: Any, tag: Any, has_second: Any = True) -> Any:
    """One exchange word of two adjacent units' float32 values (``first`` in the low half; a
    zero high half where ``has_second`` is false), the tag bit ``pair_tag`` in place of
    ``first``'s lowest mantissa bit (a float16 high and low split, 22 bits, drops it anyway):
    half the words of a ``float_word`` a unit."""
    def bits(value: Any) -> Any:
        return T.Cast("uint64", T.reinterpret("uint32", T.Cast("float32", value)))

    high = bits(second) if has_second is True else T.if_then_else(has_second, bits(second), T.uint64(0))
    return T.bitwise_or(T.shift_left(high, T.uint64(32)),
                        T.bitwise_or(T.bitwise_and(bits(first), T.uint64(0xFFFFFFFE)), tag))


def pair_float(T: Any, word: Any, q: Any) -> Any:
    """Value ``q`` (0: the low half) of a ``float_pair`` word, its tag bit left in place."""
    shift = T.uint64(32 * q) if isinstance(q, int) else T.Cast("uint64", q * 32)
    return T.reinterpret("float32", T.Cast("uint32", T.shift_right(word, shift)))
