"""Tensor-core (WMMA, fp16 operands) schedule for a matmul block: the tile, its knobs and
limits, the intrinsics and the schedule (no operator here: ``WmmaGemmTile`` is the tile a
``GemmTemplate``, and so the GRU, runs its matmul on; ``tensor_core.py`` holds the tunable
tensor-core GEMM).

The CUDA-core schedules in ``simt.py`` top out far below what an
sm_70+ GPU does with fp16 operands: its tensor cores multiply 16×16×16 tiles per
warp.  This module tiles a matmul block ([batch,] i, j, k) into such tiles,
``blockize``s them and tensorizes the pieces with WMMA intrinsics (``wmma_intrinsics``
registers the few it needs, the same as TVM's ``tensor_intrin.cuda`` ones):

- thread block: ``tc_warps_m × tc_warps_n`` warps (one fused ``threadIdx.y``; the
  32 lanes of a warp are ``threadIdx.x``, used by the cooperative copies), each warp
  owning ``tc_frags_m × tc_frags_n`` 16×16 accumulator fragments;
- K advances ``tc_k_frags × 16`` per shared-memory stage; A and B tiles are copied
  global → shared (vector width ``tc_vec`` fp16 elements, rows padded by 16 bytes so
  the fragment loads do not conflict on banks) → ``wmma.matrix_a``/``_b`` fragments;
- ``tc_pipeline`` double-buffers the shared stages (1), and issues the copies as
  ``cp.async`` (2, sm_80+), or triple-buffers them with cp.async (3), so loads of the
  next slices overlap the math of this one; cp.async needs the PassContext option in
  ``pass_config`` (``compile_wmma`` sets it), without it 2 builds the same kernel as 1;
- the accumulators go straight to global memory (``tc_out_smem=0``, only when the
  block writes the function's output in the accumulator type) or through a shared
  tile that the whole block stores with vector writes (``tc_out_smem=1``); any
  elementwise epilogue (bias add, narrowing) is fused into that shared → global
  copy, so an epilogue always stages through shared memory.

All shared buffers are ``shared.dyn``: TVM merges them into one dynamic allocation
(the output tile reuses the A/B staging memory) and the runtime opts the kernel in
to more than 48 KiB.

Shapes must be multiples of the block tile (``tensor_core_reason`` says so); there is
no padding path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from tvm_ext.hardware import SMEM_OPT_IN_BYTES, compute_capability, max_dynamic_smem  # noqa: F401 (re-exported)
from tvm_ext.precision.precision import itemsize
from tvm_ext.schedules.gemm.warp_tile import FRAG, WARP, WarpGridSizes
from tvm_ext.core.space import Config, Knob, Space
from tvm_ext.target import TargetInfo

SMEM_ROW_PAD_BYTES = 16  # shared rows padded by 16 B: fragment loads/stores avoid bank conflicts

TC_KNOBS = (
    Knob("tc_warps_m", (1, 2, 4), "warps per thread block along M"),
    Knob("tc_warps_n", (1, 2, 4), "warps per thread block along N"),
    Knob("tc_frags_m", (1, 2, 4), "16x16 accumulator fragments per warp along M"),
    Knob("tc_frags_n", (1, 2, 4), "16x16 accumulator fragments per warp along N"),
    Knob("tc_k_frags", (1, 2, 4), "16-deep k fragments per shared-memory stage"),
    Knob("tc_vec", (1, 2, 4, 8), "fp16 elements per thread per global->shared copy (8 = 16-byte loads)"),
    Knob("tc_pipeline", (0, 1, 2, 3), "shared stages: 0 single buffer; 1 double-buffered (software "
                                      "pipeline); 2 double-buffered with cp.async copies (sm_80+); "
                                      "3 triple-buffered with cp.async"),
    Knob("tc_out_smem", (0, 1), "stage the output tile in shared memory for vector stores "
                                "(always on with an epilogue)"),
)
TC_SPACE = Space(TC_KNOBS)

OPERAND_DTYPES = ("float16",)
ACC_DTYPES = ("float32", "float16")
MIN_COMPUTE_CAPABILITY = 70


@dataclass(frozen=True)
class WmmaTile(WarpGridSizes):
    """The sizes a tensor-core config implies (elements unless named otherwise)."""

    warps_m: int
    warps_n: int
    frags_m: int
    frags_n: int
    k_frags: int
    vec: int
    pipeline: int
    out_smem: int

    @classmethod
    def of(cls, config: Config) -> "WmmaTile":
        return cls(config.tc_warps_m, config.tc_warps_n, config.tc_frags_m, config.tc_frags_n,
                   config.tc_k_frags, config.tc_vec, config.tc_pipeline, config.tc_out_smem)

    @property
    def stages(self) -> int:
        """Shared buffers per operand: k stages in flight."""
        return {0: 1, 1: 2, 2: 2, 3: 3}[self.pipeline]

    @property
    def async_copy(self) -> bool:
        return self.pipeline >= 2

    def operand_row_strides(self, operand_dtype: str = "float16") -> tuple[int, int]:
        """Row strides of the A (block_m x block_k) and B (block_k x block_n) shared tiles: rows
        padded by 16 bytes, so the 8 rows a fragment load reads per phase hit distinct banks."""
        pad = SMEM_ROW_PAD_BYTES // itemsize(operand_dtype)
        return self.block_k + pad, self.block_n + pad

    def operand_smem_bytes(self, operand_dtype: str = "float16") -> tuple[int, int]:
        """Bytes of the A and B shared tiles, times the pipeline's buffers."""
        size, (row_a, row_b) = itemsize(operand_dtype), self.operand_row_strides(operand_dtype)
        return self.stages * size * self.block_m * row_a, self.stages * size * self.block_k * row_b

    def output_row_stride(self, acc_dtype: str) -> int:
        """Row stride of the staged output tile: padded by 16 bytes, and for a float32 tile by
        further 32-element steps (same banks) until it is larger than either operand tile.

        Why larger: TVM's StorageRewrite lets a later shared buffer reuse a freed one of up
        to 16x its size whatever the dtype, and then emits a float32 ``tvm_access_ptr`` on a
        float16 buffer, which LowerIntrin rejects.  TVM merges the dynamic buffers anyway
        (MergeSharedMemoryAllocations), so the padding rarely costs shared memory."""
        size = itemsize(acc_dtype)
        stride = self.block_n + SMEM_ROW_PAD_BYTES // size
        if acc_dtype != "float16":
            largest_operand = max(self.operand_smem_bytes())
            while self.block_m * stride * size <= largest_operand:
                stride += 32
        return stride

    def output_smem_bytes(self, acc_dtype: str) -> int:
        return self.block_m * self.output_row_stride(acc_dtype) * itemsize(acc_dtype)

    def smem_bytes(self, acc_dtype: str, out_smem: bool) -> int:
        """Dynamic shared memory: the output tile is written after the last k stage, so TVM's
        merge of dynamic allocations lets it reuse the operand tiles' memory."""
        operands = sum(self.operand_smem_bytes())
        return max(operands, self.output_smem_bytes(acc_dtype)) if out_smem else operands

    def epilogue_vec(self, acc_dtype: str) -> int:
        """Vector width of the shared → global output copy: at most 16 bytes of accumulators."""
        return min(self.vec, 16 // itemsize(acc_dtype))


def tensor_core_reason(m: int, n: int, k: int, a_dtype: str, b_dtype: str, acc_dtype: str,
                       target: TargetInfo, config: Config) -> str | None:
    """Why ``config`` cannot run this matmul on tensor cores (one line), or None if it can.

    Conservative about shared memory: counts the output staging tile even when the
    config might store straight to global, since an epilogue forces staging."""
    if a_dtype not in OPERAND_DTYPES or b_dtype not in OPERAND_DTYPES:
        return f"tensor cores need float16 operands, got A {a_dtype} and B {b_dtype}"
    if acc_dtype not in ACC_DTYPES:
        return f"tensor cores accumulate in {' or '.join(ACC_DTYPES)}, not {acc_dtype}"
    if target.kind != "cuda":
        return f"tensor cores (WMMA) need a CUDA target, not {target.kind}"
    cc = compute_capability(target)
    if cc is not None and cc < MIN_COMPUTE_CAPABILITY:
        return f"WMMA needs compute capability >= 7.0, target is {target.arch}"
    if config.tc_pipeline >= 2 and cc is not None and cc < 80:
        return f"cp.async (tc_pipeline={config.tc_pipeline}) needs sm_80+, target is {target.arch}"
    t = WmmaTile.of(config)
    for dim, size, tile in (("M", m, t.block_m), ("N", n, t.block_n), ("K", k, t.block_k)):
        if size % tile:
            return f"{dim}={size} is not a multiple of the {tile}-wide block tile (no padding path)"
    if t.threads > target.max_threads_per_block:
        return f"{t.threads} threads per block > device limit {target.max_threads_per_block}"
    smem, limit = t.smem_bytes(acc_dtype, out_smem=True), max_dynamic_smem(target)
    if smem > limit:
        return f"needs {smem} B shared memory > {limit}"
    if t.block_k % t.vec or t.block_n % t.vec:
        return f"tc_vec={t.vec} does not divide the shared tile rows"
    for name, elements in (("A", t.block_m * t.block_k), ("B", t.block_k * t.block_n)):
        if elements % (t.threads * t.vec):
            return (f"the {name} tile ({elements} elements) does not split evenly over {t.threads} "
                    f"threads x tc_vec={t.vec}")
    return None


# ---- choosing a tile --------------------------------------------------------------------
def _tile(warps: tuple[int, int], frags: tuple[int, int], k_frags: int) -> Config:
    return TC_SPACE.make(tc_warps_m=warps[0], tc_warps_n=warps[1], tc_frags_m=frags[0], tc_frags_n=frags[1],
                         tc_k_frags=k_frags, tc_vec=8, tc_pipeline=2, tc_out_smem=1)


# Tiles ``pick_wmma_tile`` tries, largest first: the WMMA probe's leaders
# (``benchmarks/probes/tensor_core_probe.py``, fp16 GEMMs 2048-8192; docs/results/gemm.md),
# 128x256x32 and 128x128x32 with cp.async, 64x64x64 at M = 64; the smaller ones fit shapes the
# large ones do not divide.
AUTO_TILES = (
    _tile((2, 4), (4, 4), 2),  # 128x256x32, 8 warps
    _tile((2, 2), (4, 4), 2),  # 128x128x32, 4 warps
    _tile((2, 2), (2, 2), 4),  # 64x64x64
    _tile((2, 2), (2, 1), 4),  # 64x32x64
    _tile((1, 1), (2, 2), 2),  # 32x32x32, 1 warp
    _tile((1, 1), (1, 1), 1),  # 16x16x16
)


def pick_wmma_tile(shapes: Sequence[tuple[int, int, int]], target: TargetInfo,
                   acc_dtype: str = "float32") -> Config | None:
    """A WMMA tile for fp16 matmuls of every (M, N, K) in ``shapes`` on ``target``, without
    measuring: the first of ``AUTO_TILES`` that fits them all and still gives half the SMs a
    block on the smallest shape (on the probe a 64x64 tile over 96 blocks beat smaller tiles
    that filled all 132), else the fitting one with the most blocks; None if none fits.  Before
    sm_80 (no cp.async) the tiles are double-buffered with synchronous copies instead."""
    cc = compute_capability(target)
    tiles = AUTO_TILES if cc is None or cc >= 80 else tuple(c.replace(tc_pipeline=1) for c in AUTO_TILES)
    fitting = [c for c in tiles if all(tensor_core_reason(m, n, k, "float16", "float16", acc_dtype, target, c)
                                       is None for m, n, k in shapes)]
    if not fitting:
        return None

    def blocks(config: Config) -> int:
        t = WmmaTile.of(config)
        return min((m // t.block_m) * (n // t.block_n) for m, n, _ in shapes)

    return next((c for c in fitting if 2 * blocks(c) >= target.compute_units), max(fitting, key=blocks))


# ---- WMMA tensor intrinsics ------------------------------------------------------------
# Our own registrations of the few WMMA intrinsics this schedule uses.  TVM registers the
# same ones in ``tvm.s_tir.tensor_intrin.cuda``, but importing that package parses every
# intrinsic of every target (over a minute on a small CPU), in each builder process.
INTRIN_PREFIX = "tvm_ext_wmma16"


def _frag_index(buf: Any, stride: Any) -> Any:
    """Which element of a fragment array a 16x16 tile is: fragments are laid out as the
    row-major 16x16 tiles of the (compacted) fragment buffer."""
    return buf.elem_offset // stride // FRAG * (stride // FRAG) + buf.elem_offset % stride // FRAG


def _copy_intrin(dtype: str, src_scope: str, dst_scope: str, call: Any) -> tuple[Any, Any]:
    """A 16x16 copy between scopes (fragment load or store); ``call(src, dst, src_stride,
    dst_stride)`` is the WMMA builtin that implements it."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, c: T.handle) -> None:
        src = T.match_buffer(a, (FRAG, FRAG), dtype, align=64, offset_factor=FRAG, scope=src_scope)
        dst = T.match_buffer(c, (FRAG, FRAG), dtype, align=64, offset_factor=FRAG, scope=dst_scope)
        with T.sblock("root"):
            T.reads(src[0:FRAG, 0:FRAG])
            T.writes(dst[0:FRAG, 0:FRAG])
            for i, j in T.grid(FRAG, FRAG):
                with T.sblock("copy"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    dst[vi, vj] = src[vi, vj]

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, c: T.handle) -> None:
        s1 = T.int32()
        s0 = T.int32()
        d1 = T.int32()
        d0 = T.int32()
        src = T.match_buffer(a, (FRAG, FRAG), dtype, align=64, offset_factor=FRAG, scope=src_scope,
                             strides=[s1, s0])
        dst = T.match_buffer(c, (FRAG, FRAG), dtype, align=64, offset_factor=FRAG, scope=dst_scope,
                             strides=[d1, d0])
        with T.sblock("root"):
            T.reads(src[0:FRAG, 0:FRAG])
            T.writes(dst[0:FRAG, 0:FRAG])
            T.evaluate(call(src, dst, s1, d1))

    return desc, impl


def _fill_intrin(dtype: str) -> tuple[Any, Any]:
    """Zero a 16x16 accumulator fragment (the reduction's init)."""
    from tvm import tirx
    from tvm.script import tirx as T

    zero = tirx.const(0, dtype)

    @T.prim_func(s_tir=True)
    def desc(c: T.handle) -> None:
        acc = T.match_buffer(c, (FRAG, FRAG), dtype, align=64, offset_factor=FRAG, scope="wmma.accumulator")
        with T.sblock("root"):
            T.reads()
            T.writes(acc[0:FRAG, 0:FRAG])
            for i, j in T.grid(FRAG, FRAG):
                with T.sblock("init"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    acc[vi, vj] = zero

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        d1 = T.int32()
        d0 = T.int32()
        acc = T.match_buffer(c, (FRAG, FRAG), dtype, align=64, offset_factor=FRAG, scope="wmma.accumulator",
                             strides=[d1, d0])
        with T.sblock("root"):
            T.reads()
            T.writes(acc[0:FRAG, 0:FRAG])
            T.evaluate(T.tvm_fill_fragment(acc.data, FRAG, FRAG, FRAG, _frag_index(acc, d1), T.float32(0),
                                           dtype="void"))

    return desc, impl


def _mma_intrin(acc_dtype: str) -> tuple[Any, Any]:
    """acc += widen(A) · widen(B) on 16x16x16 fragments; widening only when acc is not
    float16, exactly as ``.astype(acc)`` appears in the compute (a no-op cast vanishes)."""
    from tvm import tirx
    from tvm.script import tirx as T

    def widen(value: Any) -> Any:
        return value if acc_dtype == "float16" else tirx.Cast(acc_dtype, value)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (FRAG, FRAG), "float16", align=64, offset_factor=FRAG, scope="wmma.matrix_a")
        B = T.match_buffer(b, (FRAG, FRAG), "float16", align=64, offset_factor=FRAG, scope="wmma.matrix_b")
        C = T.match_buffer(c, (FRAG, FRAG), acc_dtype, align=64, offset_factor=FRAG, scope="wmma.accumulator")
        with T.sblock("root"):
            T.reads(C[0:FRAG, 0:FRAG], A[0:FRAG, 0:FRAG], B[0:FRAG, 0:FRAG])
            T.writes(C[0:FRAG, 0:FRAG])
            for i, j, k in T.grid(FRAG, FRAG, FRAG):
                with T.sblock("mma"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + widen(A[vi, vk]) * widen(B[vk, vj])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        a1 = T.int32()
        a0 = T.int32()
        b1 = T.int32()
        b0 = T.int32()
        c1 = T.int32()
        c0 = T.int32()
        A = T.match_buffer(a, (FRAG, FRAG), "float16", align=64, offset_factor=FRAG, scope="wmma.matrix_a",
                           strides=[a1, a0])
        B = T.match_buffer(b, (FRAG, FRAG), "float16", align=64, offset_factor=FRAG, scope="wmma.matrix_b",
                           strides=[b1, b0])
        C = T.match_buffer(c, (FRAG, FRAG), acc_dtype, align=64, offset_factor=FRAG, scope="wmma.accumulator",
                           strides=[c1, c0])
        with T.sblock("root"):
            T.reads(C[0:FRAG, 0:FRAG], A[0:FRAG, 0:FRAG], B[0:FRAG, 0:FRAG])
            T.writes(C[0:FRAG, 0:FRAG])
            T.evaluate(T.tvm_mma_sync(C.data, _frag_index(C, c1), A.data, _frag_index(A, a1), B.data,
                                      _frag_index(B, b1), C.data, _frag_index(C, c1), dtype="void"))

    return desc, impl


def _load_call(dtype: str) -> Any:
    def call(src: Any, dst: Any, src_stride: Any, dst_stride: Any) -> Any:
        from tvm.script import tirx as T

        return T.tvm_load_matrix_sync(dst.data, FRAG, FRAG, FRAG, _frag_index(dst, dst_stride),
                                      src.access_ptr("r", ptr_type=dtype), src_stride, "row_major",
                                      dtype="void")
    return call


def _store_call(dtype: str) -> Any:
    def call(src: Any, dst: Any, src_stride: Any, dst_stride: Any) -> Any:
        from tvm.script import tirx as T

        return T.tvm_store_matrix_sync(src.data, FRAG, FRAG, FRAG, _frag_index(src, src_stride),
                                       dst.access_ptr("w", ptr_type=dtype), dst_stride, "row_major",
                                       dtype="void")
    return call


def wmma_intrinsics(acc_dtype: str, out_scope: str) -> dict[str, str]:
    """Names of the WMMA intrinsics for fp16 operands staged in ``shared.dyn``, accumulating
    in ``acc_dtype`` and storing fragments to ``out_scope``; registered on first use (so a
    process that replays a trace of ``schedule_wmma`` must call this first)."""
    from tvm.s_tir import TensorIntrin

    specs = {
        "load_a": (f"{INTRIN_PREFIX}_load_a_f16", lambda: _copy_intrin(
            "float16", "shared.dyn", "wmma.matrix_a", _load_call("float16"))),
        "load_b": (f"{INTRIN_PREFIX}_load_b_f16", lambda: _copy_intrin(
            "float16", "shared.dyn", "wmma.matrix_b", _load_call("float16"))),
        "fill": (f"{INTRIN_PREFIX}_fill_{acc_dtype}", lambda: _fill_intrin(acc_dtype)),
        "sync": (f"{INTRIN_PREFIX}_mma_f16_{acc_dtype}", lambda: _mma_intrin(acc_dtype)),
        "store": (f"{INTRIN_PREFIX}_store_{acc_dtype}_{out_scope}", lambda: _copy_intrin(
            acc_dtype, "wmma.accumulator", out_scope, _store_call(acc_dtype))),
    }
    for name, make in specs.values():
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *make())
    return {role: name for role, (name, _) in specs.items()}


def pass_config(config: Config) -> dict[str, Any]:
    """PassContext options ``tvm.compile`` needs for ``config``: cp.async copies are only
    emitted with ``tirx.use_async_copy`` (without it tc_pipeline=2 builds as 1)."""
    return {"tirx.use_async_copy": True} if WmmaTile.of(config).async_copy else {}


def compile_wmma(sch: Any, config: Config, target: TargetInfo) -> Any:
    """``tvm.compile`` of a ``schedule_wmma`` schedule with the options its config needs."""
    import tvm

    with tvm.transform.PassContext(config=pass_config(config)):
        return tvm.compile(sch.mod, target=tvm.target.Target(target.tvm_target()))


def _tensorize_tiles(sch: Any, block: Any, intrin: str) -> Any:
    """Split the block's last two loops into 16x16 tiles, unroll the tile loops (fragment
    arrays need constant indices to stay in registers) and tensorize each tile; returns
    the tile block."""
    rows, cols = sch.get_loops(block)[-2:]
    r0, r1 = sch.split(rows, [None, FRAG])
    c0, c1 = sch.split(cols, [None, FRAG])
    sch.reorder(r0, c0, r1, c1)
    sch.unroll(r0)
    sch.unroll(c0)
    tile = sch.blockize(r1)
    sch.tensorize(tile, intrin)
    return tile


def _cooperative_copy(sch: Any, block: Any, vec: int, warps: int) -> None:
    """All the block's threads copy a tile: vec elements each, consecutive threads on
    consecutive vectors (coalesced global access)."""
    own = sch.get_loops(block)[-2:]
    fused = sch.fuse(*own)
    outer, ty, tx, v = sch.split(fused, [None, warps, WARP, vec])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    if vec > 1:
        sch.vectorize(v)
    sch.unroll(outer)


def schedule_wmma(sch: Any, block_name: str, config: Config, *, epilogue: Sequence[str] = (),
                  a_read: int = 0, b_read: int = 1) -> Any:
    """Schedule matmul block ``block_name`` of ``sch`` on tensor cores; returns ``sch``.

    The block's loops are ([batch,] i, j, k); it reads A[..., i, k] (read ``a_read``) and
    B[..., k, j] (read ``b_read``), both float16, and accumulates ``A.astype(acc) *
    B.astype(acc)`` with acc float32 or float16 (the WMMA intrinsics' own description).
    ``epilogue`` names elementwise blocks after it, in order (bias add, narrowing): they
    are inlined into the shared → global store of the output tile.  A batch loop binds
    to blockIdx.z.  Check ``tensor_core_reason`` first: shapes must divide the tile.
    """
    t = WmmaTile.of(config)
    gemm = sch.get_sblock(block_name)
    acc_dtype = str(sch.get(gemm).writes[0].source.dtype)
    out_smem = bool(epilogue) or bool(t.out_smem)
    intrin = wmma_intrinsics(acc_dtype, "shared.dyn" if out_smem else "global")

    loops = sch.get_loops(gemm)
    batch, (i, j, k) = (loops[0] if len(loops) == 4 else None), loops[-3:]
    # 16x16x16 tiles become one block each: the unit the mma intrinsic replaces.
    i_t, i_f = sch.split(i, [None, FRAG])
    j_t, j_f = sch.split(j, [None, FRAG])
    k_t, k_f = sch.split(k, [None, FRAG])
    sch.reorder(i_t, j_t, k_t, i_f, j_f, k_f)
    mma = sch.blockize(i_f)

    by, wy, fm = sch.split(i_t, [None, t.warps_m, t.frags_m])
    bx, wx, fn = sch.split(j_t, [None, t.warps_n, t.frags_n])
    ko, ki = sch.split(k_t, [None, t.k_frags])
    sch.reorder(by, bx, wy, wx, ko, ki, fm, fn)
    if batch is not None:
        sch.bind(batch, "blockIdx.z")
    sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    warp = sch.fuse(wy, wx)
    sch.bind(warp, "threadIdx.y")
    for loop in (ki, fm, fn):
        sch.unroll(loop)

    # Output path: fragments -> (shared tile -> epilogue ->) global.
    if out_smem:
        out_stage = sch.cache_write(mma, 0, "shared.dyn")
        sch.reverse_compute_at(out_stage, bx)
        for name in epilogue:
            sch.reverse_compute_inline(sch.get_sblock(name))
    frag_store = sch.cache_write(mma, 0, "wmma.accumulator")
    sch.reverse_compute_at(frag_store, warp)
    if out_smem:
        _cooperative_copy(sch, out_stage, t.epilogue_vec(acc_dtype), t.warps)

    # Operands: global -> shared (padded rows) -> fragments, per k stage / k fragment.
    fragments = []
    row_a, row_b = t.operand_row_strides()
    for read, scope, row in ((a_read, "wmma.matrix_a", row_a), (b_read, "wmma.matrix_b", row_b)):
        smem = sch.cache_read(mma, read, "shared.dyn")
        sch.compute_at(smem, ko)
        sch.storage_align(smem, 0, axis=-2, factor=row, offset=0)  # row stride = row
        _cooperative_copy(sch, smem, t.vec, t.warps)
        frag = sch.cache_read(mma, read, scope)
        sch.compute_at(frag, ki)
        fragments.append(frag)

    init = sch.decompose_reduction(mma, ko)
    sch.tensorize(init, intrin["fill"])
    for loop in sch.get_loops(init)[-2:]:
        sch.unroll(loop)
    _tensorize_tiles(sch, fragments[0], intrin["load_a"])
    _tensorize_tiles(sch, fragments[1], intrin["load_b"])
    store_tile = _tensorize_tiles(sch, frag_store, intrin["store"])
    if out_smem:  # on the tile block: tensorize drops the attribute of the block it replaces
        sch.storage_align(store_tile, 0, axis=-2, factor=t.output_row_stride(acc_dtype), offset=0)
    sch.tensorize(mma, intrin["sync"])

    if t.pipeline:  # children of ko: A copy, B copy, the k-fragment loop, stages-1 apart
        sch.annotate(ko, "software_pipeline_stage", [0, 0, t.stages - 1])
        sch.annotate(ko, "software_pipeline_order", [0, 1, 2])
        if t.async_copy:
            sch.annotate(ko, "software_pipeline_async_stages", [0])
    return sch


@dataclass(frozen=True)
class WmmaGemmTile:
    """A WMMA tile for the GEMM block of any PrimFunc: what ``GemmTemplate.tensor_core`` holds
    (``gemm.TensorCoreTile``) to run its GEMM (narrowing store, bias row, batch axis) on
    ``schedule_wmma``; float16 operands only.  ``str`` is the tile as
    ``tensor_core.parse_tile`` reads it."""

    config: Config
    kernel: ClassVar[str] = "wmma"
    operand_dtypes: ClassVar[tuple[str, ...]] = OPERAND_DTYPES

    def __post_init__(self) -> None:
        TC_SPACE.encode(self.config)  # every tc_ knob, each an allowed value

    def __str__(self) -> str:
        return ",".join(f"{name}={value}" for name, value in self.config.items)

    def label(self) -> str:
        t = WmmaTile.of(self.config)
        return (f"WMMA {t.block_m}x{t.block_n}x{t.block_k} w{t.warps_m}x{t.warps_n} p{t.pipeline}"
                f"{' smem' if t.out_smem else ''}")

    def reason(self, m: int, n: int, k: int, a_dtype: str, b_dtype: str, acc_dtype: str, c_dtype: str,
               target: TargetInfo, *, epilogue: bool = False) -> str | None:
        """``tensor_core_reason`` (which counts the staged output tile whatever ``epilogue`` says)."""
        return tensor_core_reason(m, n, k, a_dtype, b_dtype, acc_dtype, target, self.config)

    def schedule(self, sch: Any, block_name: str, *, epilogue: Sequence[str] = (), a_read: int = 0,
                 b_read: int = 1) -> Any:
        return schedule_wmma(sch, block_name, self.config, epilogue=epilogue, a_read=a_read, b_read=b_read)

    def pass_config(self) -> dict[str, Any]:
        return pass_config(self.config)
