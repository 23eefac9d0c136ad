"""The tensor-core step kernel's products (``tensor_core_step.py``): the ldmatrix loads of h's A
fragments and W_hh's B fragments, W's fragments held in registers, and a warp's ``mma.sync``
over one chunk of h, read from shared memory or a slice ahead.

With float32 state split into parts (``shape.split``): h's and W's low parts lie past their high
parts in shared memory (``h_low``, ``w_low`` elements on) and in the fragment buffers, and each
product is ``hi·hi`` into the slice's accumulator set plus ``hi·lo + lo·hi`` into a set of their
own past the others (``cross_at``), as the split kernel's (``split_step.py``).  Stacked
(``shape.stacked``, batch 8 or less): h's low parts lie in the m16 tile's rows 8-15, under the
high parts of rows 0-7, so one A fragment holds both and a product is ``[hi; lo]·W_hi`` into the
slice's set plus ``[hi; lo]·W_lo`` into the cross set: the four products in two ``mma.sync``,
rows 8-15 added into 0-7 afterwards (``tensor_core_step``)."""
from __future__ import annotations

from typing import Any

from tvm_ext.schedules.gemm.mma_intrin import DTYPE_ABBREV

from .tensor_core_layout import MMA_K, MMA_M, TcKernelLayout, w_chunk


def h_low(L: TcKernelLayout) -> int:
    """Where h's low parts start in ``h_s`` (split state): past the rows, or stacked at row 8."""
    return (MMA_M // 2 if L.shape.stacked else L.shape.rows) * L.shape.h_stride


def w_low(L: TcKernelLayout) -> int:
    """Where W's low parts start in ``w_s`` (split state)."""
    return L.shape.k_extent * L.shape.w_stride


def cross_at(L: TcKernelLayout) -> int:
    """Where the cross products' accumulator set starts in ``acc`` (split state)."""
    return L.shape.acc_sets * L.shape.n_tiles * 4


def _b_loads_macros(L: TcKernelLayout) -> tuple[Any, Any]:
    """The ldmatrix.trans loads of W_hh's B fragments from its shared slice: a pair of n8 tiles,
    and an odd last tile alone; ``part`` elements on (0, or ``w_low`` for the low parts)."""
    from tvm.script import tirx as T

    operand, sw, n_tiles, w_chunks = L.shape.operand, L.shape.w_stride, L.shape.n_tiles, L.w_chunks

    def w_row(kk: Any, tile: Any, tx: Any) -> Any:
        """Where lane ``tx``'s row of n8 tile ``tile`` (of the block's W columns) starts in W's
        shared slice, k slice ``kk``: the row ldmatrix.trans reads from that lane."""
        return (kk + tx % 16) * sw + w_chunk(tx % 16, tile, w_chunks) * 8

    @T.macro
    def load_b_pair(w_s, b_frag, ni, kk, p, at, part, tx):  # type: ignore[no-untyped-def]
        """The warp's n8 tiles 2p and 2p + 1 of W, k slice ``kk``, into ``b_frag`` from ``at``."""
        T.ptx_legacy.ldmatrix(  # lanes 0-15 address the pair's first n8 tile, 16-31 its second
            True, 4, ".b16", b_frag.data, at,
            T.tvm_access_ptr(T.type_annotation(operand), w_s.data,
                             w_row(kk, ni * n_tiles + p * 2 + tx // 16, tx) + part, 8, 1), 0,
            dtype=operand)

    @T.macro
    def load_b_last(w_s, b_frag, ni, kk, at, part, tx):  # type: ignore[no-untyped-def]
        """An odd last n8 tile alone (lanes 0-15 address it)."""
        T.ptx_legacy.ldmatrix(
            True, 2, ".b16", b_frag.data, at,
            T.tvm_access_ptr(T.type_annotation(operand), w_s.data,
                             w_row(kk, ni * n_tiles + n_tiles - 1, tx) + part, 8, 1), 0,
            dtype=operand)

    return load_b_pair, load_b_last


def load_w_macro(L: TcKernelLayout) -> Any:
    """With W in registers: the B fragments of the warp's first ``held_slices`` k slices (all
    with ``step_tc_wreg`` 1) into ``b_frag``, slice q's n8 tile t at ``(q * n_tiles + t) * 4``
    (split state: the low parts ``L.held_part`` further on)."""
    from tvm.script import tirx as T

    n_tiles, warp_k, held, split = L.shape.n_tiles, L.warp_k, L.shape.held_slices, L.shape.split
    load_b_pair, load_b_last = _b_loads_macros(L)
    held_lo, w_lo = L.held_part, w_low(L)

    @T.macro
    def load_part(w_s, b_frag, ni, ki, q, frag_at, w_at, tx):  # type: ignore[no-untyped-def]
        """Slice q's fragments of one part: from ``w_at`` in w_s into ``frag_at`` on in b_frag."""
        for p in T.unroll(n_tiles // 2):
            load_b_pair(w_s, b_frag, ni, ki * warp_k + q * MMA_K, p, frag_at + (q * n_tiles + p * 2) * 4, w_at, tx)
        if n_tiles % 2 == 1:
            load_b_last(w_s, b_frag, ni, ki * warp_k + q * MMA_K, frag_at + (q * n_tiles + n_tiles - 1) * 4, w_at,
                        tx)

    @T.macro
    def load_w(w_s, b_frag, ni, ki, tx):  # type: ignore[no-untyped-def]
        for q in T.unroll(held):
            load_part(w_s, b_frag, ni, ki, q, 0, 0, tx)
            if split:
                load_part(w_s, b_frag, ni, ki, q, held_lo, w_lo, tx)

    return load_w


def load_w_global_macro(L: TcKernelLayout) -> Any:
    """With ``step_tc_wreg`` 3: the B fragments of the warp's first ``held_slices`` k slices
    straight from W_hh in global memory into ``b_frag`` (``load_w_macro``'s places), once before
    the steps, so those slices need no rows in shared memory: lane tx's four halves of n8 tile t
    are k rows 2·(tx % 4) + (0, 1, 8, 9) of the slice in column tx / 4 of the tile, the
    ``mma.sync.m16n8k16`` B layout that ``ldmatrix.trans`` gives; zeros past hidden."""
    from tvm import tirx
    from tvm.script import tirx as T

    n_tiles, warp_k, held, hidden = L.shape.n_tiles, L.warp_k, L.shape.held_slices, L.shape.hidden
    units, warp_units, zero = L.shape.units, L.warp_units, tirx.const(0, L.shape.operand)

    @T.macro
    def load_w_global(w, b_frag, bx, bz, ni, ki, tx):  # type: ignore[no-untyped-def]
        for q in T.unroll(held):
            for t in T.unroll(n_tiles):
                for e in T.unroll(4):
                    k = T.meta_var(ki * warp_k + q * MMA_K + tx % 4 * 2 + e % 2 + e // 2 * 8)
                    col = T.meta_var(t * 8 + tx // 4)  # of the warp's three gates' columns
                    unit = T.meta_var(bx * units + ni * warp_units + col % warp_units)
                    b_frag[(q * n_tiles + t) * 4 + e] = T.if_then_else(
                        T.And(k < hidden, unit < hidden),
                        w[bz, T.min(k, hidden - 1), col // warp_units * hidden + T.min(unit, hidden - 1)], zero)

    return load_w_global


def _fragment_macros(L: TcKernelLayout) -> tuple[Any, Any]:
    """The A load (a k slice of the warp's 16 rows of h, ``ldmatrix.x4``) and the
    ``mma.sync.m16n8k16`` every form of the products is made of."""
    from tvm.script import tirx as T

    operand, sh, abbrev = L.shape.operand, L.shape.h_stride, DTYPE_ABBREV[L.shape.operand]

    @T.macro
    def load_a(h_s, a_frag, mi, kk, at, part, tx):  # type: ignore[no-untyped-def]
        """k slice ``kk`` of the warp's 16 rows of h (``part`` elements on) into ``a_frag`` from ``at``."""
        T.ptx_legacy.ldmatrix(
            False, 4, ".b16", a_frag.data, at,
            T.tvm_access_ptr(T.type_annotation(operand), h_s.data,
                             (mi * MMA_M + tx % 16) * sh + kk + tx // 16 * 8 + part, 8, 1), 0,
            dtype=operand)

    @T.macro
    def mma(a_frag, b_frag, acc, a_at, b_at, acc_at):  # type: ignore[no-untyped-def]
        T.ptx_legacy.mma("m16n8k16", "row", "col", abbrev, abbrev, "fp32", a_frag.data, a_at, b_frag.data, b_at,
                         acc.data, acc_at, False, dtype="float32")

    return load_a, mma


def _slice_from_shared_macro(L: TcKernelLayout, pair_at: int) -> Any:
    """One k slice's multiplies with its B fragments read from W's shared slice into the pair
    buffer at ``pair_at`` (two n8 tiles at once, an odd last one alone): two mma.sync a pair
    (split state: the low parts' pair 8 further on, and six)."""
    from tvm.script import tirx as T

    n_tiles, split, w_lo, cross, stacked = L.shape.n_tiles, L.shape.split, w_low(L), cross_at(L), L.shape.stacked
    load_b_pair, load_b_last = _b_loads_macros(L)
    mma = _fragment_macros(L)[1]

    @T.macro
    def split_mma(a_frag, b_frag, acc, b_at, tile):  # type: ignore[no-untyped-def]
        """hi·lo and lo·hi of n8 tile ``tile`` (its high part's B fragment at ``b_at``) into the cross
        set; stacked, ``[hi; lo]·W_lo`` alone (the high part's product gave lo·hi)."""
        mma(a_frag, b_frag, acc, 0, b_at + 8, cross + tile * 4)
        if not stacked:
            mma(a_frag, b_frag, acc, 8, b_at, cross + tile * 4)

    @T.macro
    def slice_from_shared(w_s, a_frag, b_frag, acc, ni, kk, base, tx):  # type: ignore[no-untyped-def]
        for p in T.unroll(n_tiles // 2):
            load_b_pair(w_s, b_frag, ni, kk, p, pair_at, 0, tx)
            if split:
                load_b_pair(w_s, b_frag, ni, kk, p, pair_at + 8, w_lo, tx)
            for half in T.unroll(2):
                mma(a_frag, b_frag, acc, 0, pair_at + half * 4, base + (p * 2 + half) * 4)
                if split:
                    split_mma(a_frag, b_frag, acc, pair_at + half * 4, p * 2 + half)
        if n_tiles % 2 == 1:
            load_b_last(w_s, b_frag, ni, kk, pair_at, 0, tx)
            if split:
                load_b_last(w_s, b_frag, ni, kk, pair_at + 8, w_lo, tx)
            mma(a_frag, b_frag, acc, 0, pair_at, base + (n_tiles - 1) * 4)
            if split:
                split_mma(a_frag, b_frag, acc, pair_at, n_tiles - 1)

    return slice_from_shared


def products_macro(L: TcKernelLayout) -> Any:
    """A warp's MMA over one h chunk's k, the warp's k slice i into accumulator set i mod
    ``acc_sets`` (independent chains of mma.sync in flight): per slice an ldmatrix of h, and W's
    fragments held in registers for the warp's first ``held_slices`` slices (all, some or none),
    the other slices' read from shared memory; or with ``frags_ahead`` loaded a slice ahead
    (``_products_ahead_macro``)."""
    from tvm.script import tirx as T

    n_tiles, chunk_k, warp_k, split = L.shape.n_tiles, L.chunk_k, L.warp_k, L.shape.split
    acc_sets, slices, held = L.shape.acc_sets, L.chunk_k // MMA_K, L.shape.held_slices
    h_lo, held_lo, cross, stacked = h_low(L), L.held_part, cross_at(L), L.shape.stacked
    load_a, mma = _fragment_macros(L)
    from_shared = _slice_from_shared_macro(L, L.pair_at)  # its pair buffer past the held fragments

    @T.macro
    def products(h_s, w_s, a_frag, b_frag, acc, mi, ni, ki, c, tx):  # type: ignore[no-untyped-def]
        for ks in T.unroll(slices):
            q = T.meta_var(c * slices + ks)  # the warp's k slice
            kk = T.meta_var(ki * warp_k + c * chunk_k + ks * MMA_K)
            base = T.meta_var(q % acc_sets * n_tiles * 4)
            load_a(h_s, a_frag, mi, kk, 0, 0, tx)
            if split and not stacked:
                load_a(h_s, a_frag, mi, kk, 8, h_lo, tx)
            if q < held:  # a constant once the loops are unrolled
                for t in T.unroll(n_tiles):
                    mma(a_frag, b_frag, acc, 0, (q * n_tiles + t) * 4, base + t * 4)
                    if split:  # hi·lo, lo·hi (stacked: [hi; lo]·W_lo alone)
                        mma(a_frag, b_frag, acc, 0, held_lo + (q * n_tiles + t) * 4, cross + t * 4)
                        if not stacked:
                            mma(a_frag, b_frag, acc, 8, (q * n_tiles + t) * 4, cross + t * 4)
            else:
                from_shared(w_s, a_frag, b_frag, acc, ni, L.shape.w_row(kk, ki), base, tx)

    return _products_ahead_macro(L) if L.shape.frags_ahead else products


def _products_ahead_macro(L: TcKernelLayout) -> Any:
    """The products with the next k slice's fragments loaded before this slice's mma.sync (two
    fragment buffers): the ldmatrix latency behind the multiplies, which in source order (the
    PTX is volatile) would otherwise wait for each slice's loads."""
    from tvm.script import tirx as T

    n_tiles, chunk_k, warp_k = L.shape.n_tiles, L.chunk_k, L.warp_k
    acc_sets, slices = L.shape.acc_sets, L.chunk_k // MMA_K
    load_a, mma = _fragment_macros(L)
    load_b_pair, load_b_last = _b_loads_macros(L)
    nb = n_tiles * 4  # one k slice's B fragments (4 halves of a register pair per n8 tile)

    @T.macro
    def load(h_s, w_s, a_frag, b_frag, mi, ni, kk, buf, tx):  # type: ignore[no-untyped-def]
        """One k slice's A and B fragments into fragment buffer ``buf``."""
        load_a(h_s, a_frag, mi, kk, buf * 8, 0, tx)
        for p in T.unroll(n_tiles // 2):
            load_b_pair(w_s, b_frag, ni, kk, p, buf * nb + p * 8, 0, tx)
        if n_tiles % 2 == 1:
            load_b_last(w_s, b_frag, ni, kk, buf * nb + (n_tiles - 1) * 4, 0, tx)

    @T.macro
    def products_ahead(h_s, w_s, a_frag, b_frag, acc, mi, ni, ki, c, tx):  # type: ignore[no-untyped-def]
        load(h_s, w_s, a_frag, b_frag, mi, ni, ki * warp_k + c * chunk_k, 0, tx)
        for ks in T.unroll(slices):
            if ks + 1 < slices:
                load(h_s, w_s, a_frag, b_frag, mi, ni, ki * warp_k + c * chunk_k + (ks + 1) * MMA_K, (ks + 1) % 2,
                     tx)
            for t in T.unroll(n_tiles):
                mma(a_frag, b_frag, acc, ks % 2 * 8, ks % 2 * nb + t * 4, (c * slices + ks) % acc_sets * n_tiles * 4
                    + t * 4)

    return products_ahead
