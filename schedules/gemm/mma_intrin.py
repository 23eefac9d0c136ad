"""The 16x16 tensor intrinsics of the mma.sync GEMM (``mma.py``): ``ldmatrix.x4`` loads of
operand tiles from ``shared.dyn`` into the lane layout, two ``mma.sync.m16n8k16`` per 16x16x16
product, the accumulator fill and store, for float16 or bfloat16 operands and float32 or
float16 accumulators.

Only these few are registered, on first use (``mma_intrinsics``): TVM's
``tvm.s_tir.tensor_intrin.cuda`` has no bfloat16 ones and takes over a minute to import.
"""
from __future__ import annotations

from typing import Any

from tvm_ext.lowering.warp_memory import install_warp_memory_fix

FRAG = 16  # every operand and accumulator tile is 16x16
WARP = 32
LANE_ELEMS = FRAG * FRAG // WARP  # 8 elements of a 16x16 tile per lane
WARP_TILE = (WARP, 1, 1, LANE_ELEMS)  # one 16x16 tile of a (lane, tile row, tile col, element) warp buffer
INTRIN_PREFIX = "tvm_ext_mma16"
DTYPE_ABBREV = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def lane_layout(i: Any, j: Any) -> tuple[Any, Any]:
    """(lane, element) holding element (i, j) of a 16x16 tile in the ldmatrix / mma.sync
    m16n8k16 register layout (TVM's ``shared_16x16_to_ldmatrix_32x8_layout``)."""
    return 4 * (i % 8) + (j % 8) // 2, 4 * (j // 8) + (i // 8) * 2 + (j % 2)


def fragment_index_map(*indices: Any) -> tuple[Any, ...]:
    """A warp buffer (operand or accumulator) of rows x cols elements as (lane, tile row,
    tile col, element): lane-major, so after ``LowerWarpMemory`` each lane holds one array
    of 8 elements per 16x16 tile.  Tile-major offsets (8 x 32 per tile) defeat that pass's
    index simplifier as soon as an access adds an element offset (the second 8-column half
    of a B tile, the output store), which leaves the array in local memory."""
    *lead, i, j = indices  # leading (batch, split) indices are kept
    lane, elem = lane_layout(i % FRAG, j % FRAG)
    return (*lead, lane, i // FRAG, j // FRAG, elem)


def _warp_tile(T: Any, handle: Any, dtype: str, strided: bool) -> Any:
    """One 16x16 tile of a ``fragment_index_map`` warp buffer: (32 lanes, 1, 1, 8 elements)."""
    if not strided:
        return T.match_buffer(handle, WARP_TILE, dtype, offset_factor=1, scope="warp")
    strides = [T.int32() for _ in WARP_TILE]
    return T.match_buffer(handle, WARP_TILE, dtype, offset_factor=1, scope="warp", strides=strides)


def _ldmatrix_intrin(dtype: str, operand: str) -> tuple[Any, Any]:
    """One ``ldmatrix.x4`` of a 16x16 tile from ``shared.dyn`` into the lane layout: A
    tiles as stored (row = m), B tiles transposed by the instruction (row = k)."""
    from tvm.script import tirx as T

    transpose = operand == "B"

    @T.prim_func(s_tir=True)
    def desc(warp_handle: T.handle, shared_handle: T.handle) -> None:
        shared = T.match_buffer(shared_handle, (FRAG, FRAG), dtype, align=64, offset_factor=FRAG,
                                scope="shared.dyn")
        warp = _warp_tile(T, warp_handle, dtype, False)
        with T.sblock("root"):
            T.reads(shared[0:FRAG, 0:FRAG])
            T.writes(warp[0:WARP, 0, 0, 0:LANE_ELEMS])
            for ax0, ax1 in T.grid(FRAG, FRAG):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    T.reads(shared[v0, v1])
                    lane, elem = T.meta_var(lane_layout(v0, v1))
                    T.writes(warp[lane, 0, 0, elem])
                    warp[lane, 0, 0, elem] = shared[v0, v1]

    @T.prim_func(s_tir=True)
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(shared_handle, (FRAG, FRAG), dtype, align=64, offset_factor=FRAG,
                                scope="shared.dyn", strides=[s0, s1])
        warp = _warp_tile(T, warp_handle, dtype, True)
        with T.sblock("root"):
            T.reads(shared[0:FRAG, 0:FRAG])
            T.writes(warp[0:WARP, 0, 0, 0:LANE_ELEMS])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                # lane t points at row t % 16, column 8 * (t // 16): the four 8x8 matrices
                T.evaluate(T.ptx_legacy.ldmatrix(
                    transpose, 4, ".b16", warp.data, warp.elem_offset + tx * warp.strides[0],
                    shared.access_ptr("r"), s0 * (tx % 16) + 8 * (tx // 16), dtype=dtype))

    return desc, impl


def _mma_intrin(in_dtype: str, acc_dtype: str) -> tuple[Any, Any]:
    """C += A · B on 16x16x16 lane-layout tiles: two ``mma.sync.m16n8k16``, one per 8-column half."""
    from tvm.script import tirx as T
    from tvm.tirx import Cast

    def widen(v: Any) -> Any:
        return Cast(acc_dtype, v) if acc_dtype != in_dtype else v

    a_abbrev, c_abbrev = DTYPE_ABBREV[in_dtype], DTYPE_ABBREV[acc_dtype]

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = _warp_tile(T, a, in_dtype, False)
        B = _warp_tile(T, b, in_dtype, False)
        C = _warp_tile(T, c, acc_dtype, False)
        with T.sblock("root"):
            T.reads(C[0:WARP, 0, 0, 0:LANE_ELEMS], A[0:WARP, 0, 0, 0:LANE_ELEMS], B[0:WARP, 0, 0, 0:LANE_ELEMS])
            T.writes(C[0:WARP, 0, 0, 0:LANE_ELEMS])
            for i, j, k in T.grid(FRAG, FRAG, FRAG):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    c_lane, c_elem = T.meta_var(lane_layout(vi, vj))
                    a_lane, a_elem = T.meta_var(lane_layout(vi, vk))
                    b_lane, b_elem = T.meta_var(lane_layout(vk, vj))
                    T.reads(C[c_lane, 0, 0, c_elem], A[a_lane, 0, 0, a_elem], B[b_lane, 0, 0, b_elem])
                    T.writes(C[c_lane, 0, 0, c_elem])
                    C[c_lane, 0, 0, c_elem] += widen(A[a_lane, 0, 0, a_elem]) * widen(B[b_lane, 0, 0, b_elem])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = _warp_tile(T, a, in_dtype, True)
        B = _warp_tile(T, b, in_dtype, True)
        C = _warp_tile(T, c, acc_dtype, True)
        with T.sblock("root"):
            T.reads(C[0:WARP, 0, 0, 0:LANE_ELEMS], A[0:WARP, 0, 0, 0:LANE_ELEMS], B[0:WARP, 0, 0, 0:LANE_ELEMS])
            T.writes(C[0:WARP, 0, 0, 0:LANE_ELEMS])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                for half in T.unroll(2):  # columns 0-7, then 8-15: B and C elements 4 * half + ...
                    T.evaluate(T.ptx_legacy.mma(
                        "m16n8k16", "row", "col", a_abbrev, a_abbrev, c_abbrev,
                        A.data, A.elem_offset + tx * A.strides[0],
                        B.data, B.elem_offset + tx * B.strides[0] + half * 4,
                        C.data, C.elem_offset + tx * C.strides[0] + half * 4,
                        False, dtype=acc_dtype))

    return desc, impl


def _fill_intrin(acc_dtype: str) -> tuple[Any, Any]:
    from tvm.script import tirx as T
    from tvm.tirx import IntImm

    zero = IntImm("int32", 0).astype(acc_dtype)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle) -> None:
        C = _warp_tile(T, a, acc_dtype, False)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:WARP, 0, 0, 0:LANE_ELEMS])
            for i0, i1 in T.grid(FRAG, FRAG):
                with T.sblock("C_warp"):
                    i, j = T.axis.remap("SS", [i0, i1])
                    lane, elem = T.meta_var(lane_layout(i, j))
                    T.reads()
                    T.writes(C[lane, 0, 0, elem])
                    C[lane, 0, 0, elem] = zero

    @T.prim_func(s_tir=True)
    def impl(a: T.handle) -> None:
        C = _warp_tile(T, a, acc_dtype, True)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:WARP, 0, 0, 0:LANE_ELEMS])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                for e in T.unroll(LANE_ELEMS):
                    C[tx, 0, 0, e] = zero

    return desc, impl


def _store_intrin(acc_dtype: str, scope: str) -> tuple[Any, Any]:
    """Lane-layout accumulator tile -> a 16x16 tile of ``scope``, element by element (a
    vector read of the warp buffer would make TVM retype the whole buffer as vectors)."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, c: T.handle) -> None:
        C_warp = _warp_tile(T, a, acc_dtype, False)
        C = T.match_buffer(c, (FRAG, FRAG), acc_dtype, scope=scope, offset_factor=1)
        with T.sblock("root"):
            T.reads(C_warp[0:WARP, 0, 0, 0:LANE_ELEMS])
            T.writes(C[0:FRAG, 0:FRAG])
            for i0, i1 in T.grid(FRAG, FRAG):
                with T.sblock("C_warp"):
                    v0, v1 = T.axis.remap("SS", [i0, i1])
                    lane, elem = T.meta_var(lane_layout(v0, v1))
                    T.reads(C_warp[lane, 0, 0, elem])
                    T.writes(C[v0, v1])
                    C[v0, v1] = C_warp[lane, 0, 0, elem]

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, c: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        C_warp = _warp_tile(T, a, acc_dtype, True)
        C = T.match_buffer(c, (FRAG, FRAG), acc_dtype, scope=scope, offset_factor=1, strides=[s0, s1])
        with T.sblock("root"):
            T.reads(C_warp[0:WARP, 0, 0, 0:LANE_ELEMS])
            T.writes(C[0:FRAG, 0:FRAG])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                for e in T.unroll(LANE_ELEMS):  # row tx/4 + 8*(e/2%2), column 8*(e/4) + 2*(tx%4) + e%2
                    C[tx // 4 + 8 * (e // 2 % 2), 8 * (e // 4) + (tx % 4) * 2 + e % 2] = C_warp[tx, 0, 0, e]

    return desc, impl


def mma_intrinsics(operand_dtype: str, acc_dtype: str, out_scope: str) -> dict[str, str]:
    """Names of the intrinsics for ``operand_dtype`` tiles staged in ``shared.dyn``,
    accumulating in ``acc_dtype`` and storing the accumulators to ``out_scope``; registered
    on first use (a process that replays a trace of ``schedule_mma`` must call this first)."""
    from tvm.s_tir import TensorIntrin

    install_warp_memory_fix()
    op, acc, scope = DTYPE_ABBREV[operand_dtype], DTYPE_ABBREV[acc_dtype], out_scope.replace(".", "_")
    specs = {
        "load_a": (f"{INTRIN_PREFIX}_ldmatrix_a_{op}", lambda: _ldmatrix_intrin(operand_dtype, "A")),
        "load_b": (f"{INTRIN_PREFIX}_ldmatrix_b_{op}", lambda: _ldmatrix_intrin(operand_dtype, "B")),
        "sync": (f"{INTRIN_PREFIX}_mma_{op}_{acc}", lambda: _mma_intrin(operand_dtype, acc_dtype)),
        "fill": (f"{INTRIN_PREFIX}_fill_{acc}", lambda: _fill_intrin(acc_dtype)),
        "store": (f"{INTRIN_PREFIX}_store_{acc}_{scope}", lambda: _store_intrin(acc_dtype, out_scope)),
    }
    for name, make in specs.values():
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *make())
    return {role: name for role, (name, _) in specs.items()}
