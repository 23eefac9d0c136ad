"""The fused step kernel (knob ``fuse_step``): S2+S3+S4 of a step in one kernel, each thread
owning a few hidden units' three gate dot products for a few batch rows, so a step costs one
launch and ``gh`` never goes through global memory; and its variants ``FusedStep`` (a launch
per step, or the steps looped in TVM's host code: ``step_loop`` 0, 1) and ``PersistentStep``
(one launch per layer, the blocks meeting at a grid barrier between steps: ``step_loop`` 2).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tvm_ext.lowering import step_loop
from tvm_ext.cost_model.hardware import HardwareModel
from tvm_ext.precision.precision import itemsize
from tvm_ext.core.space import Config
from tvm_ext.target import TargetInfo

from .compute import F32
from .step_common import (CELL_GATES, GRU_CELL, LSTM_CELL, MAX_REGISTERS, OTHER_REGISTERS, cell_math, lstm_c,
                          lstm_h, lstm_store_macro, state_width, store_macro, stored_as)
from .step_variant import (CLUSTER_STEP_KNOBS, FLAG_STEP_KNOBS, PERSISTENT_MIN_REGISTERS, TC_STEP_KNOBS, StepSizes,
                           StepVariant, fused_threads_reason, residency)


def _step_cell_macro(steps: int, batch: int, hidden: int, dirs: int, acc_dtype: str, gh_dtype: str,
                     math_dtype: str, prefetched: bool = False, kind: str = "cuda", h_dtype: str = F32,
                     cell: str = GRU_CELL) -> Any:
    """S3 of the fused step kernels: the gate sums ``acc`` plus b_h, rounded to ``gh_dtype``
    as if stored, and the cell on them into ``h_new`` (both step kernels share it).
    ``prefetched``: gi and b_h come from the step's copies (dirs, batch, gates, hidden) and
    (dirs, gates, hidden) (``step_func``'s ``prefetch``).  ``cell`` ``"lstm"``: the LSTM's
    cell: c' (``step_common.lstm_c``, c read from the state's second half) into ``c_new``, then
    h' from it (``lstm_h``, block "cell_h"), so c' is computed once."""
    from tvm.script import tirx as T

    G, is_lstm = CELL_GATES[cell] * hidden, cell == LSTM_CELL

    def gate_sum(acc: Any, bias: Any, vd: Any, vb: Any, g: int, vj: Any) -> Any:
        b_h = bias[vd, g, vj] if prefetched else bias[vd, g * hidden + vj] if g else bias[vd, vj]
        return stored_as(acc[vd, vb, g, vj] + b_h.astype(acc_dtype), gh_dtype)

    @T.macro
    def cell(gi, h, acc, bias, h_new, step):  # type: ignore[no-untyped-def]
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("cell"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                row = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step) * batch + vb)
                col = T.meta_var(vd * G + vj)
                h_new[vd, vb, vj] = cell_math(
                    T, *((gi[vd, vb, 0, vj], gi[vd, vb, 1, vj], gi[vd, vb, 2, vj]) if prefetched
                         else (gi[row, col], gi[row, col + hidden], gi[row, col + 2 * hidden])),
                    gate_sum(acc, bias, vd, vb, 0, vj), gate_sum(acc, bias, vd, vb, 1, vj),
                    gate_sum(acc, bias, vd, vb, 2, vj), h[step % 2, vd, vb, vj], math_dtype, kind, h_dtype)

    @T.macro
    def lstm(gi, h, acc, bias, h_new, c_new, step):  # type: ignore[no-untyped-def]
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("cell"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                row = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step) * batch + vb)
                col = T.meta_var(vd * G + vj)
                c_new[vd, vb, vj] = lstm_c(
                    T, *((gi[vd, vb, 0, vj], gi[vd, vb, 1, vj], gi[vd, vb, 2, vj]) if prefetched
                         else (gi[row, col], gi[row, col + hidden], gi[row, col + 2 * hidden])),
                    gate_sum(acc, bias, vd, vb, 0, vj), gate_sum(acc, bias, vd, vb, 1, vj),
                    gate_sum(acc, bias, vd, vb, 2, vj), h[step % 2, vd, vb, hidden + vj], math_dtype, kind, h_dtype)
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("cell_h"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                row = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step) * batch + vb)
                h_new[vd, vb, vj] = lstm_h(
                    T, gi[vd, vb, 3, vj] if prefetched else gi[row, vd * G + 3 * hidden + vj],
                    gate_sum(acc, bias, vd, vb, 3, vj), c_new[vd, vb, vj], math_dtype, kind, h_dtype)

    return lstm if is_lstm else cell


def step_k_extent(hidden: int, step_k: int, step_ks: int) -> int:
    """The extent of the fused step kernel's reduction over k: ``hidden``, or rounded up to a
    multiple of ``step_k`` when split-K (``step_ks`` > 1) would otherwise split it unevenly
    (rfactor drops the guard of an uneven split, so the padding is part of the compute)."""
    if step_ks > 1 and hidden % step_k:
        return -(-hidden // step_k) * step_k
    return hidden


def step_func(steps: int, batch: int, hidden: int, dirs: int, layers: int, gi_dtype: str = F32,
              h_dtype: str = F32, w_dtype: str = F32, acc_dtype: str = F32, gh_dtype: str = F32,
              math_dtype: str = F32, out_dtype: str = F32, w_tile: int = 0, k_extent: int = 0,
              w_split: int = 0, prefetch: bool = False, kind: str = "cuda", cell: str = GRU_CELL) -> Any:
    """Fused S2+S3+S4: gh = h·W_hᵀ + b_h kept in registers, then the cell, in one kernel.

    The hidden GEMM's parameters and the cell's both apply: h, W_h and b_h (``w_dtype``)
    are widened to ``acc_dtype``, the gate sums rounded to ``gh_dtype`` (as if stored)
    and widened to ``math_dtype`` for the cell; stores as in ``cell_func``.

    The state ping-pongs inside one (2, dirs, batch, hidden) buffer: step s reads slot
    s % 2 and writes slot (s+1) % 2, so the kernel's only per-step argument is ``step`` and
    a loop over steps (``tvm_ext.lowering.step_loop``) needs no buffer swapping.  The plan passes that
    buffer twice, as ``h`` (read) and ``h_out`` (written): one parameter both read and
    written would make TVM see a write-after-read hazard it cannot schedule around.

    ``cell`` ``"lstm"``: PyTorch's LSTM cell on four gates (i, f, g, o; W_h (dirs, hidden,
    4·hidden)), the state (2, dirs, batch, 2·hidden) holding c after h in each slot.

    ``w_tile`` > 0: W_h is read through a copy ``w_tiles`` laid out per tile of ``w_tile``
    units, (dirs, ceil(hidden/w_tile), k, gate, unit), so a block's slice of all three gates
    is one compact region (in the (k, 3·hidden) layout the gates lie hidden apart) that the
    schedule stages in shared memory; units past ``hidden`` are zeros.

    ``w_split`` > 0 (instead of ``w_tile``): W_h is read through a copy ``w_regs`` laid out per
    thread of a split-K over ``w_split`` threads interleaved in k (k = i·w_split + t), (dirs,
    unit, t, i, gate): one thread's share of W is one compact region, which the schedule
    keeps in registers (the persistent kernel loads it once for all T steps).

    ``prefetch``: the cell reads this step's gi and b_h through copies ``gi_pre`` (dirs, batch,
    3, hidden) and ``bias_pre`` (dirs, 3, hidden) made before the dot products, so the
    schedule can load them early (their latency behind the math; b_h once per launch).

    ``k_extent`` > ``hidden`` (``step_k_extent``): the dot products run over k < k_extent,
    the state read through ``h_pad`` (zeros past ``hidden``) and W's row index clamped to
    ``hidden``-1 (real weights times zero: every load stays in bounds), so a split of k
    into equal slices needs no guard."""
    from tvm.script import tirx as T

    gates, lstm = CELL_GATES[cell], cell == LSTM_CELL
    G, K = gates * hidden, max(k_extent, hidden)
    width = state_width(cell, hidden)
    padded, last = K > hidden, hidden - 1
    tiles, tile = (-(-hidden // w_tile), w_tile) if w_tile else (1, 1)
    staged_w, reg_w, split = bool(w_tile), bool(w_split), max(w_split, 1)
    guard_w = padded or (staged_w and hidden % w_tile != 0)
    store = (lstm_store_macro(steps, batch, hidden, dirs, h_dtype, out_dtype) if lstm
             else store_macro(steps, batch, hidden, dirs, h_dtype, out_dtype, pingpong=True))
    cell_of = _step_cell_macro(steps, batch, hidden, dirs, acc_dtype, gh_dtype, math_dtype, prefetched=prefetch,
                               kind=kind, h_dtype=h_dtype, cell=cell)
    zero_h, zero_w, zero_acc = (T.cast(0, dtype) for dtype in (h_dtype, w_dtype, acc_dtype))

    @T.prim_func(s_tir=True)
    def step_kernel(gi: T.Buffer((steps * batch, dirs * G), gi_dtype),
                    h: T.Buffer((2, dirs, batch, width), h_dtype),
                    w: T.Buffer((dirs, hidden, G), w_dtype), bias: T.Buffer((dirs, G), w_dtype),
                    step: T.int32, layer: T.int32, h_out: T.Buffer((2, dirs, batch, width), h_dtype),
                    out: T.Buffer((steps * batch, dirs * hidden), out_dtype),
                    h_n: T.Buffer((layers * dirs, batch, hidden), h_dtype)):
        T.func_attr({"tirx.noalias": True})
        w_tiles = T.sblock_alloc_buffer((dirs, tiles, K, gates, tile), w_dtype)
        h_pad = T.sblock_alloc_buffer((dirs, batch, K), h_dtype)
        w_regs = T.sblock_alloc_buffer((dirs, hidden, split, K // split, gates), w_dtype)
        gi_pre = T.sblock_alloc_buffer((dirs, batch, gates, hidden), gi_dtype)
        bias_pre = T.sblock_alloc_buffer((dirs, gates, hidden), w_dtype)
        if prefetch:
            for d, b, g, j in T.grid(dirs, batch, gates, hidden):
                with T.sblock("gi_pre"):
                    vd, vb, vg, vj = T.axis.remap("SSSS", [d, b, g, j])
                    row = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step) * batch + vb)
                    gi_pre[vd, vb, vg, vj] = gi[row, vd * G + vg * hidden + vj]
            for d, g, j in T.grid(dirs, gates, hidden):
                with T.sblock("bias_pre"):
                    vd, vg, vj = T.axis.remap("SSS", [d, g, j])
                    bias_pre[vd, vg, vj] = bias[vd, vg * hidden + vj]
        acc = T.sblock_alloc_buffer((dirs, batch, gates, hidden), acc_dtype)
        h_new = T.sblock_alloc_buffer((dirs, batch, hidden), math_dtype)
        c_new = T.sblock_alloc_buffer((dirs, batch, hidden), math_dtype)  # (the LSTM's; unused buffers go)
        if staged_w:
            for d, t, k, g, u in T.grid(dirs, tiles, K, gates, tile):
                with T.sblock("w_stage"):
                    vd, vt, vk, vg, vu = T.axis.remap("SSSSS", [d, t, k, g, u])
                    if guard_w:
                        w_tiles[vd, vt, vk, vg, vu] = T.if_then_else(
                            vk < hidden and vt * tile + vu < hidden,
                            w[vd, T.min(vk, last), vg * hidden + T.min(vt * tile + vu, last)], zero_w)
                    else:
                        w_tiles[vd, vt, vk, vg, vu] = w[vd, vk, vg * hidden + vt * tile + vu]
        if reg_w:
            for d, j, kt, kk, g in T.grid(dirs, hidden, w_split, K // w_split, gates):
                with T.sblock("w_regs"):
                    vd, vj, vkt, vkk, vg = T.axis.remap("SSSSS", [d, j, kt, kk, g])
                    if padded:
                        w_regs[vd, vj, vkt, vkk, vg] = T.if_then_else(
                            vkk * w_split + vkt < hidden,
                            w[vd, T.min(vkk * w_split + vkt, last), vg * hidden + vj], zero_w)
                    else:
                        w_regs[vd, vj, vkt, vkk, vg] = w[vd, vkk * w_split + vkt, vg * hidden + vj]
        if padded:
            for d, b, k in T.grid(dirs, batch, K):
                with T.sblock("h_pad"):
                    vd, vb, vk = T.axis.remap("SSS", [d, b, k])
                    h_pad[vd, vb, vk] = T.if_then_else(vk < hidden, h[step % 2, vd, vb, T.min(vk, last)], zero_h)
        if reg_w:  # k = i·w_split + t: the split-K threads' axis t is the block's own
            for d, b, g, j, i, t in T.grid(dirs, batch, gates, hidden, K // w_split, w_split):
                with T.sblock("gh"):
                    vd, vb, vg, vj, vi, vt = T.axis.remap("SSSSRR", [d, b, g, j, i, t])
                    with T.init():
                        acc[vd, vb, vg, vj] = zero_acc
                    h_k = T.meta_var(h_pad[vd, vb, vi * w_split + vt] if padded
                                     else h[step % 2, vd, vb, vi * w_split + vt])
                    acc[vd, vb, vg, vj] = acc[vd, vb, vg, vj] + (
                        h_k.astype(acc_dtype) * w_regs[vd, vj, vt, vi, vg].astype(acc_dtype))
        else:
            for d, b, g, j, k in T.grid(dirs, batch, gates, hidden, K):
                with T.sblock("gh"):
                    vd, vb, vg, vj, vk = T.axis.remap("SSSSR", [d, b, g, j, k])
                    with T.init():  # zero, not the bias: a plain sum can be split over threads (rfactor)
                        acc[vd, vb, vg, vj] = zero_acc
                    h_k = T.meta_var(h_pad[vd, vb, vk] if padded else h[step % 2, vd, vb, vk])
                    if staged_w:
                        w_k = T.meta_var(w_tiles[vd, vj // tile, vk, vg, vj % tile])
                    elif padded:
                        w_k = T.meta_var(w[vd, T.min(vk, last), vg * hidden + vj])
                    else:
                        w_k = T.meta_var(w[vd, vk, vg * hidden + vj])
                    acc[vd, vb, vg, vj] = acc[vd, vb, vg, vj] + h_k.astype(acc_dtype) * w_k.astype(acc_dtype)
        if lstm and prefetch:
            cell_of(gi_pre, h, acc, bias_pre, h_new, c_new, step)
        elif lstm:
            cell_of(gi, h, acc, bias, h_new, c_new, step)
        elif prefetch:
            cell_of(gi_pre, h, acc, bias_pre, h_new, step)
        else:
            cell_of(gi, h, acc, bias, h_new, step)
        if lstm:
            store(h_new, c_new, step, layer, h_out, out, h_n)
        else:
            store(h_new, step, layer, h_out, out, h_n)

    return step_kernel


def schedule_step(func: Any, tile: "FusedStep", kind: str = "cuda") -> Any:
    """Fused step: block = ``step_j`` hidden units × ``step_bt``·``step_b`` batch rows of one
    direction; each thread keeps 3·step_b gate sums in registers (``step_bt`` threads along
    the rows, ``step_ks`` along k), h is staged in shared memory ``step_k`` at a time
    (in 1 + ``step_pipeline`` buffers, a software pipeline).  ``step_w_onchip`` 1: the block's W_h slice in
    shared memory too (dynamic on CUDA, with every other shared buffer: it exceeds the 48 KiB
    of a static array), serving all the block's rows; 2: each thread's share of W_h in
    registers.  ``step_prefetch``: this step's gi and b_h in registers (the step-loop
    forms move their loads early, ``tvm_ext.lowering.step_loop``)."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    # with the W slice in dynamic shared memory, every shared buffer is (one allocation, up
    # to the opt-in limit); otherwise static arrays (48 KiB)
    dynamic = "shared.dyn" if kind == "cuda" else "shared"
    store = sch.get_sblock("store")
    d, b, j = sch.get_loops(store)
    bt = tile.bt
    # units: block, thread (threadIdx.x), each thread's own (step_u, innermost; no loop of one
    # at step_u 1, so that kernel is what it was)
    jo, jt, *ju = sch.split(j, [None, tile.j, tile.u] if tile.u > 1 else [None, tile.j])
    if bt > 1:  # rows: block, thread (threadIdx.z), each thread's own
        bo, bz, bi = sch.split(b, [None, bt, tile.b])
        sch.reorder(d, bo, jo, bz, jt, bi, *ju)
        sch.bind(bz, "threadIdx.z")
    else:
        bo, bi = sch.split(b, [None, tile.b])
        sch.reorder(d, bo, jo, jt, bi, *ju)
    sch.bind(jo, "blockIdx.x")
    sch.bind(bo, "blockIdx.y")
    sch.bind(d, "blockIdx.z")
    sch.bind(jt, "threadIdx.x")
    outer = 4 + (bt > 1)  # the loops above a thread's own: d, bo, jo, (bz,) jt
    cell = sch.get_sblock("cell")
    cells = [b for b in sch.get_producers(store) if sch.get(b).name_hint == "cell_h"] + [cell]  # LSTM: h' from c'
    for block in cells:  # each consumer first: a block goes under a loop its consumers are under
        sch.compute_at(block, ju[0] if ju else bi)
        sch.set_scope(block, 0, "local")
    if tile.prefetch or tile.w_onchip == 2 or bt > 1 or ju:
        sch.unroll(bi)  # the thread's rows: register arrays indexed by constants (no local memory)
    for loop in ju:
        sch.unroll(loop)  # the thread's units, likewise
    gh = sch.get_sblock("gh")
    ks = tile.ks
    main = gh
    if ks > 1:
        # Split-K: threadIdx.y = ks threads share each dot product, each summing its
        # k-slice (step_k/ks of every staged slice) in registers; the partial sums meet
        # in shared memory (rfactor) and every thread adds them up for the cell.  ks
        # times the warps per SM for the same W traffic (the kernel is latency-bound).
        # With W on chip, k is interleaved over the ks threads (k = ki·ks + kt): their
        # shared-memory reads of one W row and one h row fall in different banks (in
        # contiguous chunks the chunk stride is a multiple of 32 words: ks-way conflicts).
        if tile.w_onchip == 2:  # the compute already splits k = i·ks + t
            kt = sch.get_loops(gh)[-1]
        elif tile.w_onchip:
            _, _, kt = sch.split(sch.get_loops(gh)[-1], [None, tile.k // ks, ks])
        else:
            _, kt, _ = sch.split(sch.get_loops(gh)[-1], [None, ks, tile.k // ks])
        main = sch.rfactor(kt, 0)
    sch.compute_at(gh, jt, preserve_unit_loops=True)
    sch.set_scope(gh, 0, "local")
    if ks == 1:
        own = sch.get_loops(gh)[outer:]  # batch rows, gates, unit j, k
        ko, ki = sch.split(own[-1], [None, tile.k])
        sch.reorder(ko, ki, *own[:-1])
    else:
        sch.compute_at(main, jt, preserve_unit_loops=True)
        if tile.w_onchip == 2:  # iter order: kt, d, rows, gates, j, i
            kt, *spatial, i = sch.get_loops(main)[outer:]
            ko, ki = sch.split(i, [None, tile.k // ks])
        else:  # iter order: kt, d, rows, gates, j, ko, ki
            kt, *spatial, ko, ki = sch.get_loops(main)[outer:]
        sch.reorder(kt, ko, ki, *spatial)
        sch.bind(kt, "threadIdx.y")
        sch.set_scope(main, 0, dynamic if tile.w_onchip == 1 else "shared")
        partial = sch.cache_write(main, 0, "local")
        sch.reverse_compute_at(partial, kt, preserve_unit_loops=True)
    if tile.w_onchip == 2:  # the thread's share of W (its k's, 3 gates, its unit) in registers
        w_regs = sch.get_sblock("w_regs")
        sch.compute_at(w_regs, kt if ks > 1 else jt, preserve_unit_loops=True)
        sch.set_scope(w_regs, 0, "local")
        for loop in sch.get_loops(w_regs)[outer + (ks > 1):]:
            sch.unroll(loop)  # constant indices: the array stays in registers
    elif tile.w_onchip:  # the block's W slice: all of k, 3 gates, step_j units
        w_stage = sch.get_sblock("w_stage")
        sch.compute_at(w_stage, jo, preserve_unit_loops=True)
        sch.set_scope(w_stage, 0, dynamic)
        fused = sch.fuse(*sch.get_loops(w_stage)[3:])  # below d, bo, jo: k, gate, unit
        _bind_fill(sch, fused, tile)
    if tile.prefetch:  # this step's gi and b_h in registers, loaded before the dot products
        for name in ("gi_pre", "bias_pre"):
            pre = sch.get_sblock(name)
            sch.compute_at(pre, jt, preserve_unit_loops=True)
            sch.set_scope(pre, 0, "local")
            for loop in sch.get_loops(pre)[outer:]:
                sch.unroll(loop)
    padded = [b for b in sch.get_producers(main) if sch.get(b).name_hint == "h_pad"]
    h_scope = dynamic if tile.w_onchip == 1 else "shared"
    if padded:  # padded k (``step_k_extent``): the zero-padded state slice is what is staged
        (staged,) = padded
        sch.set_scope(staged, 0, h_scope)
    else:
        staged = sch.cache_read(main, "h", h_scope, consumer_blocks=[main])
    sch.compute_at(staged, ko, preserve_unit_loops=True)
    below = outer + 1 + (ks > 1)  # d, bo, jo, (bz,) jt, (kt,) ko
    fused = sch.fuse(*sch.get_loops(staged)[below:])  # the staged rows × k-slice
    if bt > 1:  # every thread of the block takes a share
        _bind_fill(sch, fused, tile)
    else:
        _, fx = sch.split(fused, [None, tile.j])
        sch.bind(fx, "threadIdx.x")
    if tile.pipeline:  # the fills of slices k+1..k+n (their own buffers) overlap the math of slice k
        sch.annotate(ko, "software_pipeline_stage", [0, tile.pipeline])
        sch.annotate(ko, "software_pipeline_order", [0, 1])
        if kind == "cuda":  # cp.async: the fill does not wait for its loads (``GruTemplate.pass_config``)
            sch.annotate(ko, "software_pipeline_async_stages", [0])
    if tile.w_onchip == 2:  # every k slice: its W values are registers, named by constants
        sch.unroll(ko)
        sch.unroll(ki)
    else:
        sch.annotate(ko, "pragma_auto_unroll_max_step", 256)
        sch.annotate(ko, "pragma_unroll_explicit", 1)
    sch.decompose_reduction(main, ko)
    return sch


def _bind_fill(sch: Any, fused: Any, tile: "FusedStep") -> None:
    """A cooperative fill loop over the block's threads (z: step_bt, y: step_ks, x: step_j)."""
    factors = [tile.bt, tile.ks, tile.j]
    tags = ["threadIdx.z", "threadIdx.y", "threadIdx.x"]
    used = [(f, t) for f, t in zip(factors, tags) if f > 1 or t == "threadIdx.x"]
    loops = sch.split(fused, [None, *(f for f, _ in used)])
    for loop, (_, tag) in zip(loops[1:], used):
        sch.bind(loop, tag)




@dataclass(frozen=True)
class FusedStep(StepVariant):
    """The fused step kernel on the CUDA cores, a launch per step (``loop`` 0) or every step from
    one call of TVM's host code (``loop`` 1, CUDA).  Its knobs are the ``step_*`` knobs of the
    same names without the prefix (``j`` is ``step_j``, ``w_onchip`` is ``step_w_onchip``)."""

    j: int
    b: int
    u: int
    bt: int
    k: int
    pipeline: int
    ks: int
    prefetch: int
    w_onchip: int
    loop: int
    barrier: int

    unshown_names = TC_STEP_KNOBS + FLAG_STEP_KNOBS + CLUSTER_STEP_KNOBS

    @classmethod
    def of(cls, sizes: StepSizes, c: Config) -> "FusedStep":
        return cls(sizes, j=c.step_j, b=c.step_b, u=c.step_u, bt=c.step_bt, k=c.step_k, pipeline=c.step_pipeline,
                   ks=c.step_ks, prefetch=c.step_prefetch, w_onchip=c.step_w_onchip, loop=c.step_loop,
                   barrier=c.step_barrier)

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def units(self) -> int:
        """Hidden units of one block: ``step_j`` threads along them, ``step_u`` each."""
        return self.j * self.u

    @property
    def rows(self) -> int:
        """Batch rows of one block: ``step_bt`` threads along them, ``step_b`` each."""
        return self.b * self.bt

    @property
    def threads(self) -> int:
        """Threads of one block: units (x), split-K (y) and batch rows (z)."""
        return self.j * self.ks * self.bt

    @property
    def blocks(self) -> int:
        """Blocks of the grid: unit tiles x row tiles x directions."""
        s = self.sizes
        return -(-s.hidden // self.units) * -(-s.batch // self.rows) * s.dirs

    @property
    def k_extent(self) -> int:
        return step_k_extent(self.sizes.hidden, self.k, self.ks)

    def shared_bytes(self) -> int:
        """Shared memory of one block: the staged h slice, split-K partial sums and
        (``step_w_onchip`` 1) the W slice."""
        s = self.sizes
        partials = 0 if self.ks == 1 else self.ks * self.rows * s.gates * self.units * itemsize(s.acc_dtype)
        w_slice = (self.w_onchip == 1) * self.k_extent * s.gates * self.units * itemsize(s.w_dtype)
        stages = 1 + self.pipeline  # the pipelined slice has a buffer per stage
        return stages * itemsize(s.h_dtype) * self.rows * self.k + partials + w_slice

    def w_registers(self) -> int:
        """32-bit registers per thread that hold its share of W_hh (``step_w_onchip`` 2): one per
        value of up to 4 bytes (16-bit values are not assumed packed), two per float64."""
        return self.sizes.gates * self.u * (self.k_extent // self.ks) * max(1, itemsize(self.sizes.w_dtype) // 4)

    def blocks_per_sm(self, target: TargetInfo) -> int:
        """Blocks one SM holds at once as far as the register budget is concerned."""
        return 1

    # ---- feasibility -------------------------------------------------------------------------
    def reason(self, target: TargetInfo) -> str | None:
        return (fused_threads_reason(self.j, target) or self._shape_reason(target) or self._shared_reason(target)
                or self._register_reason(target))

    def _shape_reason(self, target: TargetInfo) -> str | None:
        if self.threads > target.max_threads_per_block:
            return (f"step kernel: {self.j}x{self.ks}x{self.bt} threads > device limit "
                    f"{target.max_threads_per_block}")
        if self.bt > 1 and self.bt * self.b >= 2 * self.sizes.batch:
            return f"step kernel: {self.bt}x{self.b} rows per block for batch {self.sizes.batch} (half of them idle)"
        if self.k % self.ks:
            return "step kernel: step_ks must divide step_k"
        if self.loop and target.kind != "cuda":
            return "step kernel: step_loop 1 and 2 are CUDA only (OpenCL runs one launch per step)"
        return None

    def _shared_reason(self, target: TargetInfo) -> str | None:
        static = dataclasses.replace(self, w_onchip=0).shared_bytes()
        if static > target.max_shared_memory_per_block and not (self.w_onchip == 1 and target.kind == "cuda"):
            return "step kernel: staged h slice and partial sums exceed shared memory"
        # with the W slice, all is dynamic shared memory on CUDA (up to the opt-in limit per block)
        limit = HardwareModel.from_target(target).shared_per_block_optin
        if self.shared_bytes() > limit:
            return (f"step kernel: h slice, partial sums and W_hh slice need {self.shared_bytes()} B "
                    f"of shared memory > {limit}")
        return None

    def _register_reason(self, target: TargetInfo) -> str | None:
        if self.w_onchip == 2 and self.ks == 1:
            return "step kernel: W_hh in registers (step_w_onchip 2) needs split-K (step_ks > 1)"
        if self.w_onchip == 2 and target.kind == "cuda":
            available = min(MAX_REGISTERS, 65536 // (self.blocks_per_sm(target) * self.threads))
            if self.w_registers() + OTHER_REGISTERS > available:
                return (f"step kernel: W_hh in registers needs {self.w_registers()} per thread "
                        f"({self.sizes.gates} gates x {self.u} units x {self.k_extent // self.ks} k) + "
                        f"{OTHER_REGISTERS} > {available}")
        return None

    # ---- kernels and calls -------------------------------------------------------------------
    def init_layout(self) -> dict[str, bool]:
        return {"pingpong": True}

    def async_copy(self) -> bool:
        return bool(self.pipeline)  # the pipelined h slice is copied in cp.async groups

    def scheduled_kernels(self, target: TargetInfo) -> dict[str, Any]:
        s = self.sizes
        func = step_func(s.seq, s.batch, s.hidden, s.dirs, s.layers, gi_dtype=s.gi_dtype, h_dtype=s.h_dtype,
                         w_dtype=s.w_dtype, acc_dtype=s.acc_dtype, gh_dtype=s.gh_dtype, math_dtype=s.math_dtype,
                         out_dtype=s.out_dtype, w_tile=self.units if self.w_onchip == 1 else 0,
                         w_split=self.ks if self.w_onchip == 2 else 0, prefetch=bool(self.prefetch),
                         k_extent=self.k_extent, kind=target.kind, cell=s.cell)
        return {f"{s.cell}_step": schedule_step(func, self, target.kind)}

    def looped_steps(self, step: Any, target: TargetInfo) -> Any:
        if not self.loop:
            return None
        mode, per_sm, hoist, early = self._loop_form(target)
        return step_loop.loop_steps(step_loop.lower_to_loops(step.mod, target), self.sizes.seq, mode,
                                    state=("h", "h_out"), name=f"{self.sizes.cell}_steps", min_blocks_per_sm=per_sm,
                                    hoist=hoist,
                                    barrier=step_loop.BARRIERS[self.barrier], early=early)

    def _loop_form(self, target: TargetInfo) -> tuple[str, int, tuple[str, ...], tuple[str, ...]]:
        """(the step loop's mode, blocks per SM, buffers loaded once, buffers loaded a step ahead)."""
        return step_loop.HOST, 1, (), ()

    def step_calls(self, layer: int, out: str) -> list[tuple[str, tuple[str | int, ...]]]:
        if self.loop:  # all T steps in one call
            return super().step_calls(layer, out)
        return [(f"{self.sizes.cell}_step", (*self.weights(layer), s, layer, "hs", out, "h_n"))
                for s in range(self.sizes.seq)]


@dataclass(frozen=True)
class PersistentStep(FusedStep):
    """The fused step kernel as one launch per layer (``step_loop`` 2, CUDA): every block
    resident, meeting the others at a grid barrier (``step_barrier``) between steps."""

    def residency(self, target: TargetInfo) -> tuple[int, str | None]:
        """Blocks per SM the kernel needs resident (its grid spread over the SMs), or why they
        cannot all be: a grid barrier waits for every block, so a block that is not resident
        would never arrive.  Threads, resident-block and shared-memory limits come from the
        hardware model; registers are made to fit by compiling with
        ``__launch_bounds__(threads, per_sm)``, refused when that leaves too few."""
        hw = HardwareModel.from_target(target)
        per_sm, fits = residency(hw, self.blocks, self.threads, self.shared_bytes())
        if per_sm > fits:
            return per_sm, (f"step kernel: persistent (step_loop 2) needs every block resident, {self.blocks} "
                            f"blocks > {hw.sm_count} SMs x {fits} resident per SM")
        if hw.registers_per_sm and hw.registers_per_sm // (per_sm * self.threads) < PERSISTENT_MIN_REGISTERS:
            return per_sm, (f"step kernel: persistent (step_loop 2) with {per_sm} blocks of {self.threads} threads "
                            f"per SM leaves < {PERSISTENT_MIN_REGISTERS} registers per thread")
        return per_sm, None

    def blocks_per_sm(self, target: TargetInfo) -> int:
        return self.residency(target)[0]

    def reason(self, target: TargetInfo) -> str | None:
        return super().reason(target) or self.residency(target)[1]

    def init_layout(self) -> dict[str, bool]:
        return {"pingpong": True, "barrier": True}

    def barrier_words(self) -> tuple[str, ...]:
        return ("bar",)

    def _loop_form(self, target: TargetInfo) -> tuple[str, int, tuple[str, ...], tuple[str, ...]]:
        # W_hh's tile is filled from the weights only: the persistent kernel loads it once
        hoist: tuple[str, ...] = ()
        early: tuple[str, ...] = ()
        if self.w_onchip:
            hoist = ("w_tiles_shared.dyn",) if self.w_onchip == 1 else ("w_regs_local",)
        if self.prefetch:  # b_h once, gi a step ahead
            hoist, early = hoist + ("bias_pre_local",), ("gi_pre_local",)
        return step_loop.PERSISTENT, self.blocks_per_sm(target), hoist, early
