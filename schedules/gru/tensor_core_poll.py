"""The tensor-core step kernel's poll (``tensor_core_step.py``, with ``step_flags`` 1): a warp's
rows and k range of h from the tagged exchange words of ``hx``, each word two units' 16-bit
values and the step as a tag (``step_common.pack_pair``), polled until every tag says the step.
A lane loads one word at a time (a relaxed 8-byte atomic load) or, with ``step_tc_poll`` 16, two
adjacent words with one relaxed 16-byte vector load (``ld.relaxed.gpu.v2.u64``): a vector load
is single-copy atomic per element, not whole, so each word is still checked by its own tag.
With float32 state split into parts (``shape.split``) a word is one unit's float32 value and the
tag, or with ``shape.split_pairs`` two units' values and a tag bit (``step_common.float_pair``),
and the poll writes their high and low float16 parts to ``h_s``.  With ``shape.warp_h``
(``step_tc_warp_h``) it writes ``h_s`` by PTX stores, four bytes each, which TVM's barrier pass
does not see: a warp reads only the h it polled, so no block barrier is put before its products."""
from __future__ import annotations

from typing import Any

from tvm_ext.lowering.step_loop import NV_ATOMIC_RELAXED, NV_SCOPE_DEVICE, SPIN_LIMIT

from .split import high_part, low_part
from .step_common import pair_float, pair_tag, word_float, word_tag
from .tensor_core_layout import MMA_M, WARP, TcKernelLayout
from .tensor_core_products import h_low


def poll_h_macro(L: TcKernelLayout) -> Any:
    """``poll_h(h_s, hx, got, poll, step, bz, m0, mi, k0, tx)``: the warp's rows and k range of
    h_step from the exchange words into ``h_s``, ``L.poll_words`` a lane at once in loads of
    ``L.poll_vector`` words, each round polled until every tag says ``step``."""
    from tvm.script import tirx as T

    batch, hidden, sh, operand = L.shape.batch, L.shape.hidden, L.shape.h_stride, L.shape.operand
    vector, poll_rounds = L.poll_vector, L.poll_rounds
    values, split, h_lo = L.shape.word_values, L.shape.split, h_low(L)
    loads, row_loads = L.poll_words // vector, L.copy_k // values // vector
    slot_words, pair_words, split_pairs, warp_h = L.slot_words, L.pair_words, L.shape.split_pairs, L.shape.warp_h

    def stale(word: Any, step: Any) -> Any:
        """Whether ``word`` is not yet of ``step``: its tag, or with split pairs its tag bit."""
        if split_pairs:
            return T.bitwise_and(word, T.uint64(1)) != pair_tag(T, step)
        return word_tag(T, word) != step

    def value(word: Any, q: int) -> Any:
        """The float32 value ``q`` of a split state's word."""
        return pair_float(T, word, q) if split_pairs else word_float(T, word)

    def load(c: Any, i: Any, k0: Any, tx: Any) -> tuple[Any, Any, Any]:
        """(row in the warp's 16, first k, within the warp's loads) of load i of poll round c;
        the warp polls its 16 rows, ``copy_k`` from ``k0``."""
        f = (c * loads + i) * WARP + tx
        return f // row_loads, k0 + f % row_loads * (values * vector), f < MMA_M * row_loads

    def at(hx: Any, step: Any, bz: Any, m0: Any, mi: Any, r: Any, k: Any) -> Any:
        return T.address_of(hx[(step % 2) * slot_words + (bz * batch + m0 + mi * MMA_M + r) * pair_words
                               + k // values])

    @T.macro
    def high_low(h_s, at, value):  # type: ignore[no-untyped-def]
        """``value``'s float16 high part at ``at``, the rounding of the rest ``h_lo`` further on."""
        h_s[at] = high_part(value)
        h_s[h_lo + at] = low_part(value)

    def half_pair(low: Any, high: Any) -> Any:
        """Two float16 values as the 32 bits of a half2 (``low`` at the lower address)."""
        return T.bitwise_or(T.Cast("uint32", T.reinterpret("uint16", low)),
                            T.shift_left(T.Cast("uint32", T.reinterpret("uint16", high)), T.uint32(16)))

    @T.macro
    def unseen_h(h_s, got, at, i):  # type: ignore[no-untyped-def]
        """Load i's values of h into ``h_s`` from element ``at`` on, 4 bytes a PTX store (``warp_h``):
        split, each adjacent pair's high parts as one half2 and their low parts as another; else the
        words' two 16-bit values, each word's low 32 bits as they are."""
        base = T.meta_var(T.cuda.cvta_generic_to_shared(h_s.ptr_to([0])))
        if split:
            for q in T.unroll(vector * values // 2):
                first = T.meta_var(value(got[vector * i + 2 * q // values], 2 * q % values))
                second = T.meta_var(value(got[vector * i + (2 * q + 1) // values], (2 * q + 1) % values))
                T.ptx["st.shared.b32"](base + T.Cast("uint32", (at + 2 * q) * 2),
                                       half_pair(high_part(first), high_part(second)))
                T.ptx["st.shared.b32"](base + T.Cast("uint32", (h_lo + at + 2 * q) * 2),
                                       half_pair(low_part(first), low_part(second)))
        else:
            for q in T.unroll(vector):
                T.ptx["st.shared.b32"](base + T.Cast("uint32", (at + 2 * q) * 2),
                                       T.Cast("uint32", T.bitwise_and(got[vector * i + q], T.uint64(0xFFFFFFFF))))

    @T.macro
    def poll_h(h_s, hx, got, poll, step, bz, m0, mi, k0, tx):  # type: ignore[no-untyped-def]
        for c in T.unroll(poll_rounds):
            poll[1] = 0
            while poll[1] == 0:
                poll[1] = 1
                for i in T.unroll(loads):
                    r = T.meta_var(load(c, i, k0, tx)[0])
                    k = T.meta_var(load(c, i, k0, tx)[1])
                    if load(c, i, k0, tx)[2] and m0 + mi * MMA_M + r < batch and k < hidden:
                        if vector == 1:
                            got[i] = T.call_extern("uint64", "__nv_atomic_load_n", at(hx, step, bz, m0, mi, r, k),
                                                   NV_ATOMIC_RELAXED, NV_SCOPE_DEVICE)
                            if stale(got[i], step):
                                poll[1] = 0
                        else:
                            T.ptx["ld.relaxed.gpu.v2.u64"](got[2 * i], got[2 * i + 1], at(hx, step, bz, m0, mi, r, k))
                            if T.Or(stale(got[2 * i], step), stale(got[2 * i + 1], step)):
                                poll[1] = 0
                poll[0] = poll[0] + 1
                if poll[0] >= SPIN_LIMIT:
                    poll[1] = 1
            for i in T.unroll(loads):
                r = T.meta_var(load(c, i, k0, tx)[0])
                k = T.meta_var(load(c, i, k0, tx)[1])
                if load(c, i, k0, tx)[2] and m0 + mi * MMA_M + r < batch and k < hidden:
                    if warp_h:  # by PTX: TVM's barrier pass puts no block barrier before the warp's products
                        unseen_h(h_s, got, (mi * MMA_M + r) * sh + k, i)
                    elif split:
                        for q in T.unroll(vector * values):  # the float32 values of the load's words as two parts
                            high_low(h_s, (mi * MMA_M + r) * sh + k + q, value(got[vector * i + q // values],
                                                                               q % values))
                    else:
                        for q in T.unroll(2 * vector):  # the 16-bit values of the load's words, k order
                            h_s[(mi * MMA_M + r) * sh + k + q] = T.reinterpret(operand, T.Cast(
                                "uint16", T.bitwise_and(T.shift_right(got[vector * i + q // 2],
                                                                      T.uint64(16 * (q % 2))), T.uint64(0xFFFF))))

    return poll_h
