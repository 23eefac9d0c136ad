"""The tensor-core step kernel's cell lane (``tensor_core_step.py``): gi into registers (waiting,
where the input GEMM still runs, for its counted rows), the cell on the first k warp's
accumulators and the store of h'.  A lane's accumulators hold every gate's sums of the same
(row, unit) pairs, so the cell needs no exchange: the GRU's r, z and n, or the LSTM's i, f, g
and o, whose c the lane keeps in registers for all T steps (no other lane reads it), read from
the state's c half before the first step and written back there after the last (the LSTM's
state slot is h, then c: ``schedules/lstm/kernels.py``)."""
from __future__ import annotations

from typing import Any

from tvm_ext.lowering.step_loop import NV_ATOMIC_ACQUIRE, NV_ATOMIC_RELAXED, NV_SCOPE_DEVICE, SPIN_LIMIT
from tvm_ext.schedules.gemm.wgmma_layout import counted_words

from .split import SPLIT_WEIGHT_SCALE
from .step_common import (LSTM_CELL, cell_blend, cell_gates, float_pair, float_word, lstm_c, lstm_h, pack_pair,
                          pair_tag, stored_as)
from .tensor_core_layout import MMA_M, MMA_N, TcKernelLayout, acc_row_col


GI_SEEN_WORDS = 3  # ``wait_gi_macro``'s state: the first and last tile row known complete, all of gi stored


def unseen_gi_macro(seen_at: int = 0) -> Any:
    """``unseen(seen)``: ``wait_gi_macro``'s state (its ``GI_SEEN_WORDS`` from ``seen_at``) before
    a kernel's first wait: no tile row known complete, nor all of gi."""
    from tvm.script import tirx as T

    @T.macro
    def unseen(seen):  # type: ignore[no-untyped-def]
        seen[seen_at] = -1
        seen[seen_at + 1] = -1
        seen[seen_at + 2] = 0  # 1: all of gi is stored

    return unseen


def wait_gi_macro(steps: int, batch: int, rows: int, tile: int, count: int, seen_at: int = 0) -> Any:
    """``wait_gi(ready, poll, seen, step, bz, m0)``: with gi (``steps`` x ``batch`` rows) from an
    input GEMM still running, its tile rows of ``tile`` rows complete at ``count``, spins until
    the counts of the tile rows holding the block's ``rows`` rows from ``m0`` of ``step`` (of
    direction ``bz``, the reverse one reading from the last step) are complete (acquire loads, so
    the gi loads after them read what it stored); ``seen`` keeps (from ``seen_at``) the first and
    last tile row known complete, so a lane polls once a tile row, and whether the total says all
    of gi is stored (then it polls no more: after the GEMM's end a step's rows cost no load); the
    spins count toward the kernel's poll limit (a GEMM that never counts is an error, not a
    hang)."""
    from tvm.script import tirx as T

    total = counted_words(steps * batch, tile) - 1 if tile else 0  # where the total follows the rows' counts

    def acquired(ready: Any, row: Any) -> Any:
        return T.call_extern("int32", "__nv_atomic_load_n", T.address_of(ready[row]), NV_ATOMIC_ACQUIRE,
                             NV_SCOPE_DEVICE)

    @T.macro
    def wait_gi(ready, poll, seen, step, bz, m0):  # type: ignore[no-untyped-def]
        t_row = T.meta_var(T.if_then_else(bz == 0, step, steps - 1 - step))
        for end in T.unroll(2):  # the tile rows of the block's first and last real row
            row = T.meta_var((t_row * batch + T.min(m0 + end * (rows - 1), batch - 1)) // tile)
            if T.And(row != seen[seen_at + end], seen[seen_at + 2] == 0):
                if acquired(ready, total) >= total * count:
                    seen[seen_at + 2] = 1
                else:
                    while T.And(poll[0] < SPIN_LIMIT, acquired(ready, row) < count):
                        poll[0] = poll[0] + 1
                seen[seen_at + end] = row

    return wait_gi



def keep_h_macro(L: TcKernelLayout, column: int = 0) -> Any:
    """Split state: the cell lane's h0 (of its rows and units) from the state slot into registers,
    where it keeps h' from step to step at float32 (the words it sends are split into parts);
    ``column`` (the LSTM's hidden size): its c0 from the slot's c half instead, as float32."""
    from tvm.script import tirx as T

    batch, hidden, unit_tiles = L.shape.batch, L.shape.hidden, L.unit_tiles

    def value(hs: Any, bz: Any, row: Any, unit: Any) -> Any:
        at = T.min(unit, hidden - 1)
        if column:
            return T.cast(hs[0, bz, T.min(row, batch - 1), column + at], "float32")
        return hs[0, bz, T.min(row, batch - 1), at]

    @T.macro
    def keep_h(hs, h_kept, bz, j0, m0, mi, tx):  # type: ignore[no-untyped-def]
        for t in T.unroll(unit_tiles):
            for e in T.unroll(4):
                row = T.meta_var(m0 + mi * MMA_M + acc_row_col(tx, e)[0])
                unit = T.meta_var(j0 + t * MMA_N + acc_row_col(tx, e)[1])
                h_kept[t * 4 + e] = T.if_then_else(row < batch and unit < hidden, value(hs, bz, row, unit),
                                                   T.float32(0))

    return keep_h


def load_gi_macro(L: TcKernelLayout) -> Any:
    """The lane's gi of one step into registers (loaded a step ahead, in flight across the barrier)."""
    from tvm.script import tirx as T

    steps, batch, hidden, dirs, G, unit_tiles = L.steps, L.shape.batch, L.shape.hidden, L.shape.dirs, L.gates, \
        L.unit_tiles
    gi_dtype = L.gi_dtype

    @T.macro
    def load_gi(gi, gi_reg, step, bz, j0, m0, mi, tx):  # type: ignore[no-untyped-def]
        """The lane's gi of step ``step`` (``j0``: the warp's first unit)."""
        t_row = T.meta_var(T.if_then_else(bz == 0, step, steps - 1 - step))
        for g in T.unroll(L.shape.gate_count):
            for t in T.unroll(unit_tiles):
                for e in T.unroll(4):
                    row = T.meta_var(m0 + mi * MMA_M + acc_row_col(tx, e)[0])
                    unit = T.meta_var(j0 + t * MMA_N + acc_row_col(tx, e)[1])
                    at = T.meta_var((T.min(t_row * batch + row, steps * batch - 1),
                                     T.min(bz * G + g * hidden + unit, dirs * G - 1)))
                    gi_reg[(g * unit_tiles + t) * 4 + e] = T.if_then_else(
                        row < batch and unit < hidden,
                        # from L2 where the GEMM still writes gi (no read-only or L1 copy of a line)
                        T.call_extern(gi_dtype, "__ldcg", T.address_of(gi[at])) if L.counted else gi[at],
                        T.cast(0, gi_dtype))

    return load_gi



def cell_and_store_macro(L: TcKernelLayout) -> Any:
    """The first k warp's cell on its accumulators (a lane holds every gate's sums of the same
    row and unit) and the store of h': to the other state slot (with flags: the exchange words),
    the output and at the last step h_n; then the next step's gi.  The LSTM's cell (``L.cell``)
    takes c from ``c_kept`` and leaves c' there, rounded to the state's type as a stored c would
    be, and after the last step writes it to the c half of the slot ``final_c`` reads."""
    from tvm import tirx
    from tvm.script import tirx as T

    steps, batch, hidden, dirs, sh, operand = L.steps, L.shape.batch, L.shape.hidden, L.shape.dirs, \
        L.shape.h_stride, L.shape.operand
    unit_tiles, gh_dtype, math_dtype, out_dtype, flags = L.unit_tiles, L.gh_dtype, L.math_dtype, L.out_dtype, \
        L.flags
    slot_words, pair_words, zero_op, load_gi = L.slot_words, L.pair_words, tirx.const(0, operand), load_gi_macro(L)
    wait_gi = wait_gi_macro(L.steps, L.shape.batch, L.shape.rows, L.ready_rows, L.ready_count)
    split, split_pairs, state, lstm = L.shape.split, L.shape.split_pairs, L.state, L.cell == LSTM_CELL
    unscale = 1.0 / SPLIT_WEIGHT_SCALE  # split: W_hh's parts were scaled

    def store_word(hx: Any, s: Any, bz: Any, row: Any, index: Any, word: Any) -> Any:
        """The relaxed store of exchange word ``index`` of ``row`` in step s + 1's slot."""
        return T.call_extern("void", "__nv_atomic_store_n",
                             T.address_of(hx[((s + 1) % 2) * slot_words + (bz * batch + row) * pair_words + index]),
                             word, NV_ATOMIC_RELAXED, NV_SCOPE_DEVICE)

    def at(g: int, t: int, e: int) -> int:
        """Gate g's accumulator (and gi) of the lane's element e of unit tile t: tile g * unit_tiles
        + t, the same element (the same row and unit)."""
        return (g * unit_tiles + t) * 4 + e

    def gh(acc: Any, b_h: Any, t: int, e: int, g: int) -> Any:
        """Gate g's h·W_hhᵀ + b_hh of that element, stored as gh (split: W_hh's parts unscaled)."""
        sums = acc[at(g, t, e)] * T.float32(unscale) if split else acc[at(g, t, e)]
        return stored_as(sums + b_h[(g * unit_tiles + t) * 2 + e % 2], gh_dtype)

    def gates(acc: Any, b_h: Any, gi_reg: Any, t: int, e: int) -> tuple[Any, Any]:
        """The GRU's z and n of the lane's element e of unit tile t."""
        return cell_gates(T, *(gi_reg[at(g, t, e)] for g in range(3)), *(gh(acc, b_h, t, e, g) for g in range(3)),
                          math_dtype, state=state)

    def lstm_c_new(acc: Any, b_h: Any, gi_reg: Any, c: Any, t: int, e: int) -> Any:
        """The LSTM's c' of that element from its i, f and g sums and c."""
        return lstm_c(T, *(gi_reg[at(g, t, e)] for g in range(3)), *(gh(acc, b_h, t, e, g) for g in range(3)), c,
                      math_dtype, state=state)

    def lstm_h_new(acc: Any, b_h: Any, gi_reg: Any, c_new: Any, t: int, e: int) -> Any:
        """h' of that element from its o sum and c'."""
        return lstm_h(T, gi_reg[at(3, t, e)], gh(acc, b_h, t, e, 3), c_new, math_dtype, state=state)

    @T.macro
    def store_split(hx, h_kept, h_val, s, bz, row, unit, t, e):  # type: ignore[no-untyped-def]
        """Split state: h' (``h_val[0]``) kept as the lane's float32 h and sent, one word a unit or
        a pair's from its odd unit (the even one's from ``h_kept``)."""
        h_kept[t * 4 + e] = h_val[0]
        if not split_pairs:
            T.evaluate(store_word(hx, s, bz, row, unit, float_word(T, h_val[0], s + 1)))
        elif e % 2 == 1 or unit + 1 >= hidden:
            T.evaluate(store_word(hx, s, bz, row, unit // 2, float_pair(
                T, h_kept[t * 4 + e - e % 2], h_val[0], pair_tag(T, s + 1), has_second=e % 2 == 1)))

    @T.macro
    def cell_and_store(gi, hs, hx, out, h_n, h_s, acc, b_h, gi_reg, h_rounded, h_val, h_kept, layer, s, bz, j0, m0,  # type: ignore[no-untyped-def]
                       mi, tx, ready, poll, seen, c_kept):
        # the cell: tile t of gate g holds units t*8 .. of that gate, same lanes
        t_row = T.meta_var(T.if_then_else(bz == 0, s, steps - 1 - s))
        for t in T.unroll(unit_tiles):
            for e in T.unroll(4):
                row_in = T.meta_var(mi * MMA_M + acc_row_col(tx, e)[0])
                col = T.meta_var(t * MMA_N + acc_row_col(tx, e)[1])
                row = T.meta_var(m0 + row_in)
                unit = T.meta_var(j0 + col)
                if row < batch and unit < hidden:
                    if lstm:  # c', then h', each computed once into a register; c' kept as stored
                        h_val[1] = lstm_c_new(acc, b_h, gi_reg, c_kept[t * 4 + e], t, e)
                        h_val[0] = lstm_h_new(acc, b_h, gi_reg, h_val[1], t, e)
                        c_kept[t * 4 + e] = stored_as(h_val[1], state).astype(math_dtype)
                        if s == steps - 1:  # the last c where c_n's copy reads it (slot T mod 2)
                            hs[steps % 2, bz, row, hidden + unit] = T.cast(c_kept[t * 4 + e], state)
                        if split:
                            store_split(hx, h_kept, h_val, s, bz, row, unit, t, e)
                    else:
                        # z, then h', each computed once into a register: nvcc merges no copies of them
                        z_n = T.meta_var(gates(acc, b_h, gi_reg, t, e))
                        h_val[1] = z_n[0]
                        if split:  # the lane's own float32 h
                            h_val[0] = cell_blend(h_val[1], z_n[1], h_kept[t * 4 + e], math_dtype)
                            store_split(hx, h_kept, h_val, s, bz, row, unit, t, e)
                        else:
                            h_val[0] = cell_blend(h_val[1], z_n[1], h_s[row_in * sh + unit], math_dtype)
                    h_new = T.meta_var(h_val[0])
                    if flags and not split:  # the pair (e, e + 1) goes out as one word from its even unit
                        h_rounded[e] = T.cast(h_new, operand)
                        if e % 2 == 1 or unit + 1 >= hidden:
                            T.evaluate(store_word(hx, s, bz, row, unit // 2, pack_pair(
                                T, h_rounded[e - e % 2], T.if_then_else(e % 2 == 1, h_rounded[e], zero_op), operand,
                                s + 1)))
                    elif not flags:
                        hs[(s + 1) % 2, bz, row, unit] = T.cast(h_new, operand)
                    out[t_row * batch + row, bz * hidden + unit] = T.cast(h_new, out_dtype)
                    if s == steps - 1:
                        h_n[layer * dirs + bz, row, unit] = T.cast(h_new, state)
        if s + 1 < steps:  # the next step's gi, its loads in flight across the barrier
            if L.counted:  # once the input GEMM has stored its rows
                wait_gi(ready, poll, seen, s + 1, bz, m0)
            load_gi(gi, gi_reg, s + 1, bz, j0, m0, mi, tx)

    return cell_and_store
