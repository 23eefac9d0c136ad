"""The kernels every GRU config runs besides its step kernel, and their schedules: the init
of the state buffer (and of a persistent kernel's barrier and exchange words) per layer, and
one thread per element for the elementwise kernels (the init, the input GEMM's operand splits,
the variable-length holds).  The step kernels are their variants' (``step_variant.py``); the
gate GEMMs are the GEMM template's (``tvm_ext.schedules.gemm.simt``).
"""
from __future__ import annotations

from typing import Any

from tvm_ext.lowering.step_loop import BARRIER_WORDS

from .compute import F32
from .step_common import float_pair, pack_pair


def exchange_words_macro(batch: int, hidden: int, dirs: int, dtype: str, paired: bool, float_pairs: bool) -> Any:
    """``words(h0, hx, layer, vd, vb, vj)``: an init's exchange words of h0's element (vd, vb, vj)
    (a GRU's or an LSTM's): slot 0 h0's float32 bits beside the step tag 0 and slot 1 zero; with
    ``paired`` two 16-bit values of adjacent units a word (``pack_pair``), with ``float_pairs``
    two float32 values and a tag bit (``float_pair``), slot 1's words with the bit set, written
    by the even unit's thread."""
    from tvm.script import tirx as T

    n, pair_words = dirs * batch * hidden, -(-hidden // 2)

    @T.macro
    def words(h0, hx, layer, vd, vb, vj):  # type: ignore[no-untyped-def]
        if paired or float_pairs:  # (parsed only where it is taken: 16-bit state, or split pairs)
            if vj % 2 == 0:
                word = T.meta_var((vd * batch + vb) * pair_words + vj // 2)
                second = T.meta_var(T.if_then_else(
                    vj + 1 < hidden, h0[layer * dirs + vd, vb, T.min(vj + 1, hidden - 1)], T.cast(0, dtype)))
                if float_pairs:
                    hx[word] = float_pair(T, h0[layer * dirs + vd, vb, vj], second, T.uint64(0))
                    hx[n + word] = T.uint64(1)
                else:
                    hx[word] = pack_pair(T, h0[layer * dirs + vd, vb, vj], second, dtype, 0)
                    hx[n + word] = T.uint64(0)
        else:
            hx[(vd * batch + vb) * hidden + vj] = T.Cast(
                "uint64", T.reinterpret("uint32", T.Cast("float32", h0[layer * dirs + vd, vb, vj])))
            hx[n + (vd * batch + vb) * hidden + vj] = T.uint64(0)

    return words


def init_func(batch: int, hidden: int, dirs: int, layers: int, dtype: str = F32, pingpong: bool = False,
              barrier: bool = False, flags: bool = False, paired: bool = False, float_pairs: bool = False,
              ready_words: int = 0, zero_words: int = 0) -> Any:
    """Copies layer ``layer``'s slice of h0 into the state buffer (one small launch per layer);
    both are of the state type ``dtype``.  ``pingpong``: the state is the fused step kernel's
    (2, dirs, batch, hidden) buffer, written at slot 0.  ``barrier``: also zeroes the persistent
    step kernel's barrier counter (and, at layer 0, its timed-out flag).  ``flags``: also writes
    the flag-exchange step kernel's words ``hx`` (``flag_step.py``): slot 0 (h0's float32 bits,
    step tag 0), slot 1 zero, so no tag of an earlier layer or call is read as this one's;
    ``paired``: the words of the tensor-core kernel's exchange, two 16-bit values of adjacent
    units a word (``pack_pair``); ``float_pairs``: two float32 values a word and a tag bit
    (``float_pair``), slot 1's words with the bit set.  ``ready_words``: also zeroes the counts
    ``gi_ready`` of the input GEMM's stored tile rows that the step kernel waits for (it runs
    before that layer's GEMM; ``tensor_core_step.wait_gi_macro``), with ``flags`` or ``barrier``.
    ``zero_words`` (with ``barrier``, not ``flags`` nor ``ready_words``): also zeroes that many
    words of ``hx``, a kernel's per-block step counts (``resident_cell.py``)."""
    from tvm.script import tirx as T

    if not pingpong:
        @T.prim_func(s_tir=True)
        def init(h0: T.Buffer((layers * dirs, batch, hidden), dtype), layer: T.int32,
                 h: T.Buffer((dirs, batch, hidden), dtype)):
            T.func_attr({"tirx.noalias": True})
            for d, b, j in T.grid(dirs, batch, hidden):
                with T.sblock("init"):
                    vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                    h[vd, vb, vj] = h0[layer * dirs + vd, vb, vj]

        return init

    @T.prim_func(s_tir=True)
    def init_pingpong(h0: T.Buffer((layers * dirs, batch, hidden), dtype), layer: T.int32,
                      hs: T.Buffer((2, dirs, batch, hidden), dtype)):
        T.func_attr({"tirx.noalias": True})
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("init"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                hs[0, vd, vb, vj] = h0[layer * dirs + vd, vb, vj]

    @T.macro
    def copy_and_reset(h0, hs, bar, layer, vd, vb, vj):  # type: ignore[no-untyped-def]
        hs[0, vd, vb, vj] = h0[layer * dirs + vd, vb, vj]
        if vd == 0 and vb == 0 and vj == 0:
            bar[0] = 0
            if layer == 0:
                bar[1] = 0

    @T.prim_func(s_tir=True)
    def init_barrier(h0: T.Buffer((layers * dirs, batch, hidden), dtype), layer: T.int32,
                     hs: T.Buffer((2, dirs, batch, hidden), dtype), bar: T.Buffer((BARRIER_WORDS,), "int32")):
        T.func_attr({"tirx.noalias": True})
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("init"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                T.reads(h0[layer * dirs + vd, vb, vj])
                T.writes(hs[0, vd, vb, vj], bar[0:BARRIER_WORDS])
                copy_and_reset(h0, hs, bar, layer, vd, vb, vj)

    n = dirs * batch * hidden
    words = exchange_words_macro(batch, hidden, dirs, dtype, paired, float_pairs)

    @T.macro
    def flag_words(h0, hs, bar, hx, layer, vd, vb, vj):  # type: ignore[no-untyped-def]
        copy_and_reset(h0, hs, bar, layer, vd, vb, vj)
        words(h0, hx, layer, vd, vb, vj)

    @T.prim_func(s_tir=True)
    def init_flags(h0: T.Buffer((layers * dirs, batch, hidden), dtype), layer: T.int32,
                   hs: T.Buffer((2, dirs, batch, hidden), dtype), bar: T.Buffer((BARRIER_WORDS,), "int32"),
                   hx: T.Buffer((2 * n,), "uint64")):
        T.func_attr({"tirx.noalias": True})
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("init"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                T.reads(h0[layer * dirs + vd, vb, vj:vj + 2])
                T.writes(hs[0, vd, vb, vj], bar[0:BARRIER_WORDS], hx[0:2 * n])
                flag_words(h0, hs, bar, hx, layer, vd, vb, vj)

    @T.macro
    def zero_first(words, count, vd, vb, vj):  # type: ignore[no-untyped-def]
        """The element's thread zeroes word (its index) of ``words`` if it is below ``count``."""
        if (vd * batch + vb) * hidden + vj < count:
            words[(vd * batch + vb) * hidden + vj] = T.Cast(words.dtype, 0)

    ready_len = max(ready_words, 1)

    @T.prim_func(s_tir=True)
    def init_flags_ready(h0: T.Buffer((layers * dirs, batch, hidden), dtype), layer: T.int32,
                         hs: T.Buffer((2, dirs, batch, hidden), dtype), bar: T.Buffer((BARRIER_WORDS,), "int32"),
                         hx: T.Buffer((2 * n,), "uint64"), ready: T.Buffer((ready_len,), "int32")):
        T.func_attr({"tirx.noalias": True})
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("init"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                T.reads(h0[layer * dirs + vd, vb, vj:vj + 2])
                T.writes(hs[0, vd, vb, vj], bar[0:BARRIER_WORDS], hx[0:2 * n], ready[0:ready_len])
                flag_words(h0, hs, bar, hx, layer, vd, vb, vj)
                zero_first(ready, ready_words, vd, vb, vj)

    # with the barrier, the words zeroed besides: gi's tile-row counts, or the blocks' step counts in hx
    words_shape, words_dtype = ((ready_len,), "int32") if ready_words else ((2 * n,), "uint64")
    words_zeroed, words_written = ready_words or zero_words, max(ready_words or zero_words, 1)

    @T.prim_func(s_tir=True)
    def init_barrier_words(h0: T.Buffer((layers * dirs, batch, hidden), dtype), layer: T.int32,
                           hs: T.Buffer((2, dirs, batch, hidden), dtype), bar: T.Buffer((BARRIER_WORDS,), "int32"),
                           words: T.Buffer(words_shape, words_dtype)):
        T.func_attr({"tirx.noalias": True})
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("init"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                T.reads(h0[layer * dirs + vd, vb, vj])
                T.writes(hs[0, vd, vb, vj], bar[0:BARRIER_WORDS], words[0:words_written])
                copy_and_reset(h0, hs, bar, layer, vd, vb, vj)
                zero_first(words, words_zeroed, vd, vb, vj)

    if flags:
        return init_flags_ready if ready_words else init_flags
    if zero_words and ready_words:
        raise ValueError("the init zeroes step counts (zero_words) or gi's tile-row counts (ready_words), not both")
    if ready_words or zero_words:
        return init_barrier_words
    return init_barrier if barrier else init_pingpong


def schedule_elementwise(func: Any, block: str, threads: int, vectorized: bool = False) -> Any:
    """One thread per element of ``block``'s output (coalesced along the row), ``threads`` a block;
    ``vectorized``: per vector instead, the block's innermost loop (the hold and the zeroing of
    ``lengths.py``, whose length test is the row's, outside the vector)."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    loops = sch.get_loops(sch.get_sblock(block))
    bx, tx = sch.split(sch.fuse(*loops[:-1] if vectorized else loops), [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    if vectorized:
        sch.vectorize(loops[-1])
    return sch


def schedule_init(func: Any, threads: int) -> Any:
    return schedule_elementwise(func, "init", threads)
