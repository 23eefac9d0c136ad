"""The LSTM's kernels besides the input GEMM and the step kernels: the init of the state (h0
and c0 into slot 0 of the fused step kernel's (2, dirs, batch, 2·hidden) buffer, and a persistent
kernel's barrier reset; or into the unfused steps' h and c buffers) and the copy of each layer's
last c into c_n (the fused step kernel's; the unfused cell kernel writes c_n itself)."""
from __future__ import annotations

from typing import Any

from tvm_ext.lowering.step_loop import BARRIER_WORDS
from tvm_ext.schedules.gru.kernels import exchange_words_macro


def init_func(batch: int, hidden: int, dirs: int, layers: int, dtype: str, barrier: bool = False,
              flags: bool = False, paired: bool = False, float_pairs: bool = False) -> Any:
    """Layer ``layer``'s slices of h0 and c0 into the state's slot 0 (h, then c); ``barrier``:
    also zeroes the persistent step kernel's barrier counter (and at layer 0 its timed-out
    flag), as the GRU's init does; ``flags`` (with ``barrier``): also the flag-exchange kernel's
    words ``hx``, slot 0 h0's float32 bits with the tag 0, slot 1 zero (``gru.kernels``' form);
    ``paired`` (with ``flags``): the tensor-core kernel's words instead, two 16-bit values of
    adjacent units a word (``pack_pair``); ``float_pairs``: its split kernel's two float32 values
    a word and a tag bit (``float_pair``), slot 1's words with the bit set."""
    from tvm.script import tirx as T

    states = (layers * dirs, batch, hidden)

    @T.macro
    def copy(h0, c0, hs, layer, vd, vb, vj):  # type: ignore[no-untyped-def]
        hs[0, vd, vb, vj] = h0[layer * dirs + vd, vb, vj]
        hs[0, vd, vb, hidden + vj] = c0[layer * dirs + vd, vb, vj]

    @T.macro
    def reset_barrier(bar, layer, vd, vb, vj):  # type: ignore[no-untyped-def]
        if vd == 0 and vb == 0 and vj == 0:  # the counter, and at layer 0 the timed-out flag
            bar[0] = 0
            if layer == 0:
                bar[1] = 0

    @T.prim_func(s_tir=True)
    def init(h0: T.Buffer(states, dtype), c0: T.Buffer(states, dtype), layer: T.int32,
             hs: T.Buffer((2, dirs, batch, 2 * hidden), dtype)):
        T.func_attr({"tirx.noalias": True})
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("init"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                copy(h0, c0, hs, layer, vd, vb, vj)

    @T.prim_func(s_tir=True)
    def init_barrier(h0: T.Buffer(states, dtype), c0: T.Buffer(states, dtype), layer: T.int32,
                     hs: T.Buffer((2, dirs, batch, 2 * hidden), dtype), bar: T.Buffer((BARRIER_WORDS,), "int32")):
        T.func_attr({"tirx.noalias": True})
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("init"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                T.reads(h0[layer * dirs + vd, vb, vj], c0[layer * dirs + vd, vb, vj])
                T.writes(hs[0, vd, vb, vj], hs[0, vd, vb, hidden + vj], bar[0:BARRIER_WORDS])
                copy(h0, c0, hs, layer, vd, vb, vj)
                reset_barrier(bar, layer, vd, vb, vj)

    n = dirs * batch * hidden
    words = exchange_words_macro(batch, hidden, dirs, dtype, paired, float_pairs)

    @T.prim_func(s_tir=True)
    def init_flags(h0: T.Buffer(states, dtype), c0: T.Buffer(states, dtype), layer: T.int32,
                   hs: T.Buffer((2, dirs, batch, 2 * hidden), dtype), bar: T.Buffer((BARRIER_WORDS,), "int32"),
                   hx: T.Buffer((2 * n,), "uint64")):
        T.func_attr({"tirx.noalias": True})
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("init"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                T.reads(h0[layer * dirs + vd, vb, vj:vj + 2], c0[layer * dirs + vd, vb, vj])
                T.writes(hs[0, vd, vb, vj], hs[0, vd, vb, hidden + vj], bar[0:BARRIER_WORDS], hx[0:2 * n])
                copy(h0, c0, hs, layer, vd, vb, vj)
                words(h0, hx, layer, vd, vb, vj)
                reset_barrier(bar, layer, vd, vb, vj)

    if flags:
        return init_flags
    return init_barrier if barrier else init


def init_states_func(batch: int, hidden: int, dirs: int, layers: int, dtype: str) -> Any:
    """Layer ``layer``'s slices of h0 and c0 into the unfused steps' first h and c buffers (``p0``,
    ``k0``; ``cell_step``)."""
    from tvm.script import tirx as T

    states = (layers * dirs, batch, hidden)

    @T.prim_func(s_tir=True)
    def init(h0: T.Buffer(states, dtype), c0: T.Buffer(states, dtype), layer: T.int32,
             h: T.Buffer((dirs, batch, hidden), dtype), c: T.Buffer((dirs, batch, hidden), dtype)):
        T.func_attr({"tirx.noalias": True})
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("init"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                h[vd, vb, vj] = h0[layer * dirs + vd, vb, vj]
                c[vd, vb, vj] = c0[layer * dirs + vd, vb, vj]

    return init


def final_c_func(steps: int, batch: int, hidden: int, dirs: int, layers: int, dtype: str) -> Any:
    """c_n of layer ``layer``: the c half of the state slot the last step wrote (slot T mod 2,
    every direction having run T steps)."""
    from tvm.script import tirx as T

    last = steps % 2

    @T.prim_func(s_tir=True)
    def final_c(hs: T.Buffer((2, dirs, batch, 2 * hidden), dtype), layer: T.int32,
                c_n: T.Buffer((layers * dirs, batch, hidden), dtype)):
        T.func_attr({"tirx.noalias": True})
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("final_c"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                c_n[layer * dirs + vd, vb, vj] = hs[last, vd, vb, hidden + vj]

    return final_c
