"""Tensor-core GEMM through ``mma.sync`` and ``ldmatrix``: the template, its knobs and reference.

WMMA (``tensor_core.py``) hides the fragment layout, so its schedule cannot swizzle shared
memory for the fragment loads, keep fragments of the next k step in registers, or place
the output by hand.  This schedule works on the layout itself: every 16x16 operand tile is
a warp buffer of 32 lanes x 8 elements (the ``ldmatrix``/``mma.sync.m16n8k16`` register
layout), loaded by one ``ldmatrix.x4`` and multiplied by two ``mma.sync.m16n8k16``.  The
intrinsics are registered by ``mma_intrin.py`` (only the few this schedule uses, for
float16 or bfloat16 operands).  ``schedule_mma`` schedules the matmul block of any PrimFunc
(with epilogue blocks and a batch axis): ``MmaGemmTile`` is that schedule as the tile a
``GemmTemplate`` (and so the GRU's gate GEMMs and the mixed-precision GEMM) runs on.

The knobs (``MMA_KNOBS``):

- block tile: ``mma_warps_m x mma_warps_n`` warps, each owning ``mma_frags_m x
  mma_frags_n`` 16x16 accumulator tiles (the warp tile); ``mma_k_frags x 16`` of K per
  shared-memory stage;
- ``mma_stages`` shared stages: 1 is a single buffer; 2-4 is a multi-stage ``cp.async``
  pipeline (loads ``stages - 1`` k steps ahead; sm_80+, compiled under ``pass_config``);
- ``mma_swizzle``: shared rows padded by 16 bytes (0), or XOR-swizzled in 16-byte chunks
  (1, TVM's ``permuted_layout``): both keep the 8 rows an ``ldmatrix`` phase reads on
  distinct banks; the swizzle costs no shared memory;
- ``mma_frag_buffers``: fragments of 1 or 2 consecutive 16-deep k slices are loaded into
  registers as one group before their ``mma.sync``s: with 2, the ``ldmatrix`` of the next
  slice is issued before the math of this one (register double buffering; a software
  pipeline over the k slices would version the warp buffers with offsets TVM 0.27's
  ``LowerWarpMemory`` cannot simplify, leaving the fragments in local memory);
- ``mma_raster``: 0 is a 2-D grid; G > 0 launches the blocks in column strips G blocks
  wide (a grid swizzle: blocks that run together share A and B tiles in L2);
- ``mma_out_smem``: the accumulators go to global memory from the registers (0, only
  when C is the accumulator type), or through a shared tile the block stores with
  16-byte vectors (1; an epilogue, e.g. the narrowing to a float16 C, always does);
- ``mma_split_k``: S > 1 splits K over S blocks (grid z) that write float32 partial sums
  to a scratch buffer, and a second kernel adds them (and narrows): more blocks for
  skinny shapes, whose M x N tiles alone leave SMs idle.

M, N and K that are no multiple of the block tile are padded (guarded loads read zeros,
guarded stores drop the padding: an M = 8 batch of GRU steps on a 16-row tile, a speech
model's 29 output classes on a 32-wide tile, its 80 input features in three 32-deep k
stages); a ragged dimension's copies move as many elements at a time as divide it, so no
vector straddles the edge or a misaligned row (29 columns: one at a time).  Split-K takes
whole tiles only.  ``mma_reason`` names why a config cannot run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from tvm_ext.hardware import compute_capability, max_dynamic_smem  # noqa: F401 (re-exported)
from tvm_ext.core.errors import TvmExtError
from tvm_ext.precision.precision import itemsize
from tvm_ext.schedules.gemm.warp_tile import WarpGridSizes
from tvm_ext.schedules.gemm.mma_intrin import FRAG, LANE_ELEMS, WARP, fragment_index_map, mma_intrinsics
from tvm_ext.core.space import Config, Knob, Space
from tvm_ext.target import TargetInfo

COPY_BYTES = 16  # global -> shared copies: 16 bytes per thread (cp.async's widest)
PAD_BYTES = 16  # padded rows: 16 bytes more than the tile row
SPLIT_K_SCRATCH_BYTES = 64 << 20  # largest float32 partial-sum buffer split-K may use

MMA_KNOBS = (
    Knob("mma_warps_m", (1, 2, 4), "warps per thread block along M"),
    Knob("mma_warps_n", (1, 2, 4), "warps per thread block along N"),
    Knob("mma_frags_m", (1, 2, 4, 8), "16-row accumulator tiles per warp along M (warp tile)"),
    Knob("mma_frags_n", (1, 2, 4, 8), "16-column accumulator tiles per warp along N (warp tile)"),
    Knob("mma_k_frags", (1, 2, 4), "16-deep k slices per shared-memory stage (k depth)"),
    Knob("mma_stages", (1, 2, 3, 4), "shared stages: 1 single buffer, 2-4 cp.async pipeline depth"),
    Knob("mma_swizzle", (0, 1), "shared rows against ldmatrix bank conflicts: 0 padded, 1 XOR-swizzled"),
    Knob("mma_frag_buffers", (1, 2), "k slices whose fragments are loaded into registers together: 2 has "
                                      "the next slice's ldmatrix in flight during this slice's mma"),
    Knob("mma_raster", (0, 2, 4, 8), "block rasterization: 0 2-D grid, G column strips G blocks wide"),
    Knob("mma_out_smem", (0, 1), "output through a shared tile with 16-byte stores (1), or from "
                                 "registers (0)"),
    Knob("mma_split_k", (1, 2, 4, 8), "split K over this many blocks plus a reduction kernel"),
)
MMA_SPACE = Space(MMA_KNOBS)

OPERAND_DTYPES = ("float16", "bfloat16")
ACC_DTYPES = ("float32", "float16")
MIN_COMPUTE_CAPABILITY = 80  # ldmatrix, mma.sync.m16n8k16 with bf16, cp.async
MAX_ACC_TILES = 16  # 16x16 accumulator tiles per warp: 128 fp32 registers per lane


@dataclass(frozen=True)
class MmaTile(WarpGridSizes):
    """The sizes a config implies (elements unless named otherwise)."""

    warps_m: int
    warps_n: int
    frags_m: int
    frags_n: int
    k_frags: int
    stages: int
    swizzle: int
    frag_buffers: int
    raster: int
    out_smem: int
    split_k: int

    @classmethod
    def of(cls, config: Config) -> "MmaTile":
        return cls(*(config[k.name] for k in MMA_KNOBS))

    @property
    def async_copy(self) -> bool:
        return self.stages >= 2

    def operand_row_strides(self, operand_dtype: str) -> tuple[int, int]:
        """Row strides of the A (block_m x block_k) and B (block_k x block_n) shared tiles."""
        if self.swizzle:
            return self.block_k, self.block_n
        pad = PAD_BYTES // itemsize(operand_dtype)
        return self.block_k + pad, self.block_n + pad

    def operand_smem_bytes(self, operand_dtype: str) -> int:
        row_a, row_b = self.operand_row_strides(operand_dtype)
        return self.stages * itemsize(operand_dtype) * (self.block_m * row_a + self.block_k * row_b)

    def output_row_stride(self, acc_dtype: str) -> int:
        return self.block_n + PAD_BYTES // itemsize(acc_dtype)

    def output_smem_bytes(self, acc_dtype: str) -> int:
        return self.block_m * self.output_row_stride(acc_dtype) * itemsize(acc_dtype)

    def smem_bytes(self, operand_dtype: str, acc_dtype: str, out_smem: bool) -> int:
        """Dynamic shared memory: TVM merges the allocations, and the output tile is written
        after the last k stage, so it reuses the operand tiles' memory."""
        operands = self.operand_smem_bytes(operand_dtype)
        return max(operands, self.output_smem_bytes(acc_dtype)) if out_smem else operands

    def copy_vec(self, operand_dtype: str, row: int = 0) -> int:
        """Elements a thread copies at a time: 16 bytes, or the most that divide ``row`` (the
        global row's length: its rows stay aligned and a ragged edge falls between vectors)."""
        return edge_vec(COPY_BYTES // itemsize(operand_dtype), row)

    def epilogue_vec(self, out_dtype: str) -> int:
        return COPY_BYTES // itemsize(out_dtype)

    def label(self) -> str:
        """128x256x32 w2x4 s3 swz fb2 r8 smem k1: the tile first, then how it runs."""
        return (f"{self.block_m}x{self.block_n}x{self.block_k} w{self.warps_m}x{self.warps_n} s{self.stages}"
                f"{' swz' if self.swizzle else ' pad'} fb{self.frag_buffers} r{self.raster}"
                f"{' smem' if self.out_smem else ''} k{self.split_k}")


def padded(size: int, tile: int) -> int:
    return -(-size // tile) * tile


def edge_vec(vec: int, row: int = 0) -> int:
    """The largest power of two up to ``vec`` that divides ``row`` (``vec`` when ``row`` is 0)."""
    while row and row % vec:
        vec //= 2
    return vec


def max_split_k(m: int, n: int) -> int:
    """The largest split of K whose float32 partial sums of an M x N output fit the scratch
    cap (1: no split-K for this shape, and no scratch buffer)."""
    per_split = m * n * 4
    fitting = [s for s in MMA_SPACE.knob("mma_split_k").choices if s * per_split <= SPLIT_K_SCRATCH_BYTES]
    return max(fitting) if fitting else 1


def mma_reason(m: int, n: int, k: int, a_dtype: str, b_dtype: str, acc_dtype: str, c_dtype: str,
               target: TargetInfo, config: Config, *, epilogue: bool = False) -> str | None:
    """Why ``config`` cannot run this matmul with mma.sync (one line), or None if it can.
    ``epilogue``: elementwise blocks after the matmul (a bias row) join the output store, so
    the output tile goes through shared memory whatever ``mma_out_smem`` says."""
    if a_dtype not in OPERAND_DTYPES or a_dtype != b_dtype:
        return f"mma.sync needs float16 or bfloat16 operands of one type, got A {a_dtype} and B {b_dtype}"
    if acc_dtype not in ACC_DTYPES:
        return f"mma.sync accumulates in {' or '.join(ACC_DTYPES)}, not {acc_dtype}"
    if a_dtype == "bfloat16" and acc_dtype != "float32":
        return "bfloat16 mma.sync accumulates in float32 only"
    if target.kind != "cuda":
        return f"tensor cores (mma.sync) need a CUDA target, not {target.kind}"
    cc = compute_capability(target)
    if cc is not None and cc < MIN_COMPUTE_CAPABILITY:
        return f"mma.sync with ldmatrix and cp.async needs compute capability >= 8.0, target is {target.arch}"
    t = MmaTile.of(config)
    if t.frags_m * t.frags_n > MAX_ACC_TILES:
        return (f"a {t.frags_m * FRAG}x{t.frags_n * FRAG} warp tile needs {t.frags_m * t.frags_n * LANE_ELEMS} "
                f"accumulator registers per lane (> {MAX_ACC_TILES * LANE_ELEMS})")
    if t.split_k > 1:
        if acc_dtype != "float32":
            return "split-K adds float32 partial sums: it needs a float32 accumulator"
        if m % t.block_m:
            return f"split-K needs M={m} to be a multiple of the {t.block_m}-row block tile (no padding with split-K)"
        if n % t.block_n or k % (t.block_k * t.split_k):
            return (f"split-K needs N={n} and K={k} to be multiples of the {t.block_n}-wide block tile and the "
                    f"{t.block_k}-deep k stage x split-K {t.split_k} (no padding with split-K)")
        if t.split_k > max_split_k(m, n):
            return (f"split-K {t.split_k} needs {t.split_k * m * n * 4 >> 20} MiB of partial sums "
                    f"(> {SPLIT_K_SCRATCH_BYTES >> 20} MiB)")
    if m % t.block_m and padded(m, t.block_m) - m >= FRAG * t.frags_m:
        return (f"M={m} pads to {padded(m, t.block_m)}: a whole warp row of the {t.block_m}-row block "
                f"tile would compute padding only")
    if n % t.block_n and padded(n, t.block_n) - n >= FRAG * t.frags_n:
        return (f"N={n} pads to {padded(n, t.block_n)}: a whole warp column of the {t.block_n}-wide block "
                f"tile would compute padding only")
    if 2 * (padded(k, t.block_k) - k) > t.block_k:
        return (f"K={k} pads to {padded(k, t.block_k)}: more than half of the last {t.block_k}-deep k stage "
                f"would be zeros (a shallower stage fits)")
    if t.threads > target.max_threads_per_block:
        return f"{t.threads} threads per block > device limit {target.max_threads_per_block}"
    out_smem = bool(epilogue or t.out_smem or c_dtype != acc_dtype or t.split_k > 1 or m % t.block_m
                    or n % t.block_n)
    smem, limit = t.smem_bytes(a_dtype, acc_dtype, out_smem), max_dynamic_smem(target)
    if smem > limit:
        return f"needs {smem} B shared memory > {limit}"
    for name, rows, cols, row in (("A", t.block_m, t.block_k, k), ("B", t.block_k, t.block_n, n)):
        vec = t.copy_vec(a_dtype, row)
        if cols % vec or (rows * cols) % (t.threads * vec):
            return (f"the {name} tile ({rows}x{cols}) does not split into {vec * itemsize(a_dtype)}-byte copies "
                    f"over {t.threads} threads")
    if t.swizzle and (t.block_k % 32 or t.block_n % 32):
        return (f"the XOR swizzle needs shared rows of a multiple of 32 elements (A {t.block_k}, "
                f"B {t.block_n})")
    if t.frag_buffers == 2 and t.k_frags == 1:
        return "fragment double buffering needs at least 2 k slices per stage"
    columns = padded(n, t.block_n) // t.block_n
    if t.raster and columns % t.raster:
        return f"rasterization in strips of {t.raster} blocks needs the {columns} block columns of N={n} to divide"
    return None


# ---- the schedule ---------------------------------------------------------------------------
def pass_config(config: Config) -> dict[str, Any]:
    """PassContext options ``tvm.compile`` needs: cp.async copies only with ``tirx.use_async_copy``;
    no TIR common-subexpression elimination, which hides the ``lane * 8`` offsets of the warp
    buffers from ``LowerWarpMemory`` behind variables (nvcc eliminates them anyway)."""
    options: dict[str, Any] = {"tirx.disable_cse_tir": True}
    if MmaTile.of(config).async_copy:
        options["tirx.use_async_copy"] = True
    return options


def _split_tiles(sch: Any, block: Any) -> tuple[Any, Any]:
    """Split the block's last two loops into 16x16 tiles with constant (unrolled) tile
    loops outside; returns the outer tile loops' innermost and the tile's row loop."""
    rows, cols = sch.get_loops(block)[-2:]
    r0, r1 = sch.split(rows, [None, FRAG])
    c0, c1 = sch.split(cols, [None, FRAG])
    sch.reorder(r0, c0, r1, c1)
    sch.unroll(r0)
    sch.unroll(c0)
    return c0, r1


def _tensorize_tiles(sch: Any, block: Any, intrin: str, warp_buffer: tuple[str, int]) -> Any:
    """Tile the block 16x16, lay its warp buffer out by lanes, tensorize; returns the tile block."""
    _, r1 = _split_tiles(sch, block)
    sch.transform_layout(block, warp_buffer, lambda *idx: fragment_index_map(*idx))  # batch axes kept
    tile = sch.blockize(r1)
    sch.tensorize(tile, intrin)
    return tile


def _cooperative_copy(sch: Any, block: Any, vec: int, warps: int) -> None:
    """All the block's threads copy a tile, vec elements each, consecutive threads on
    consecutive vectors (coalesced global access)."""
    fused = sch.fuse(*sch.get_loops(block)[-2:])
    outer, ty, tx, v = sch.split(fused, [None, warps, WARP, vec])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    if vec > 1:
        sch.vectorize(v)
    sch.unroll(outer)


def schedule_mma(sch: Any, block_name: str, config: Config, *, epilogue: Sequence[str] = (),
                 a_read: int = 0, b_read: int = 1, out_smem: bool = False) -> Any:
    """Schedule matmul block ``block_name`` of ``sch`` with mma.sync; returns ``sch``.

    The block's loops are ([batch,] i, j, k): it reads A[..., i, k] (read ``a_read``) and
    B[..., k, j] (read ``b_read``), float16 or bfloat16, and accumulates their widened
    product; the batch loops (fused) bind to blockIdx.z.  ``epilogue`` names elementwise blocks after
    it (narrowing, bias): they join the shared -> global store of the output tile, which
    ``out_smem`` (or the config's ``mma_out_smem``) also asks for.  Ragged shapes are padded to
    the tile (``pad_einsum``: guarded copies, a guarded store); ``mma_reason`` says what fits.
    """
    t = MmaTile.of(config)
    gemm = sch.get_sblock(block_name)
    block = sch.get(gemm)
    operand_dtype = str(block.reads[a_read].source.dtype)
    acc_dtype = str(block.writes[0].source.dtype)
    a_name, out_name = block.reads[a_read].source.name, block.writes[0].source.name
    b_name = block.reads[b_read].source.name
    loops = sch.get_loops(gemm)
    m, n, depth = (int(sch.get(loop).extent) for loop in loops[-3:])
    ragged_a, ragged_b = bool(m % t.block_m or depth % t.block_k), bool(depth % t.block_k or n % t.block_n)
    if ragged_a or ragged_b:  # past M, N or K: operands read zeros (guarded copies), the store drops them
        sch.pad_einsum(gemm, [1] * (len(block.iter_vars) - 3) + [t.block_m, t.block_n, t.block_k])
        if m % t.block_m or n % t.block_n:
            epilogue = (f"{out_name}_pad", *epilogue)
    staged = bool(epilogue) or out_smem or bool(t.out_smem)
    intrin = mma_intrinsics(operand_dtype, acc_dtype, "shared.dyn" if staged else "global")

    loops = sch.get_loops(gemm)
    batch, (i, j, k) = loops[:-3], loops[-3:]
    if len(batch) > 1:  # several batch axes (a model's batch and heads): one grid axis
        batch = [sch.fuse(*batch)]
    i_t, i_f = sch.split(i, [None, FRAG])
    j_t, j_f = sch.split(j, [None, FRAG])
    k_t, k_f = sch.split(k, [None, FRAG])
    sch.reorder(i_t, j_t, k_t, i_f, j_f, k_f)
    mma = sch.blockize(i_f)

    by, wy, fm = sch.split(i_t, [None, t.warps_m, t.frags_m])
    bx, wx, fn = sch.split(j_t, [None, t.warps_n, t.frags_n])
    ko, ki_group, ki = sch.split(k_t, [None, t.k_frags // t.frag_buffers, t.frag_buffers])
    sch.reorder(by, bx, wy, wx, ko, ki_group, ki, fm, fn)
    for loop in batch:
        sch.bind(loop, "blockIdx.z")
    if t.raster:  # column strips `raster` blocks wide, walked down M: neighbours share tiles
        strip, bx_in = sch.split(bx, [None, t.raster])
        sch.reorder(strip, by, bx_in)
        block_loop = sch.fuse(strip, by, bx_in)
        sch.bind(block_loop, "blockIdx.x")
    else:
        sch.bind(by, "blockIdx.y")
        sch.bind(bx, "blockIdx.x")
        block_loop = bx
    warp = sch.fuse(wy, wx)
    sch.bind(warp, "threadIdx.y")
    for loop in (ki_group, ki, fm, fn):
        sch.unroll(loop)

    # Output: lane-layout accumulators -> (shared tile -> epilogue ->) global.
    if staged:
        out_stage = sch.cache_write(mma, 0, "shared.dyn")
        sch.reverse_compute_at(out_stage, block_loop)
        for name in epilogue:
            sch.reverse_compute_inline(sch.get_sblock(name))
    frag_store = sch.cache_write(mma, 0, "warp")
    sch.reverse_compute_at(frag_store, warp)

    # Operands: global -> shared (padded or swizzled rows) -> lane-layout fragments.
    fragments = []
    row_a, row_b = t.operand_row_strides(operand_dtype)
    copies = []
    for read, row, source, ragged, global_row in ((a_read, row_a, a_name, ragged_a, depth),
                                                  (b_read, row_b, b_name, ragged_b, n)):
        smem = sch.cache_read(mma, read, "shared.dyn")
        sch.compute_at(smem, ko)
        if ragged:  # pad_einsum's copy of the operand, read through the guarded copy instead
            sch.compute_inline(sch.get_sblock(f"{source}_pad"))
        if not t.swizzle:
            sch.storage_align(smem, 0, axis=-2, factor=row, offset=0)  # row stride = row
        _cooperative_copy(sch, smem, t.copy_vec(operand_dtype, global_row), t.warps)
        copies.append(smem)
        frag = sch.cache_read(mma, read, "warp")
        sch.compute_at(frag, ki_group)  # the fragments of frag_buffers k slices at a time
        fragments.append(frag)

    init = sch.decompose_reduction(mma, ko)
    loads = [_tensorize_tiles(sch, frag, intrin[name], ("write", 0))
             for frag, name in zip(fragments, ("load_a", "load_b"))]
    store_tile = _tensorize_tiles(sch, frag_store, intrin["store"], ("read", 0))
    sch.tensorize(init, intrin["fill"])
    for loop in sch.get_loops(init)[-2:]:
        sch.unroll(loop)
    sch.tensorize(mma, intrin["sync"])
    if staged:
        sch.storage_align(store_tile, 0, axis=-2, factor=t.output_row_stride(acc_dtype), offset=0)
        out_dtype = str(sch.get(out_stage).writes[0].source.dtype)
        vec = edge_vec(min(t.epilogue_vec(out_dtype), t.epilogue_vec(acc_dtype)), n)
        _cooperative_copy(sch, out_stage, vec, t.warps)
    if t.swizzle:  # the copies into shared and the ldmatrix reads agree on the XOR swizzle
        for blk in copies + loads:
            sch.annotate(blk, "permuted_layout", 1)

    if t.stages > 1:  # children of ko: A copy, B copy, the k-slice loop
        sch.annotate(ko, "software_pipeline_stage", [0, 0, t.stages - 1])
        sch.annotate(ko, "software_pipeline_order", [0, 1, 2])
        sch.annotate(ko, "software_pipeline_async_stages", [0])
    return sch


# ---- split-K: partial sums in a scratch buffer, then a reduction kernel ------------------------
SPLIT_K_THREADS = 256
SPLIT_K_VEC = 4  # float32 partial sums read 16 bytes at a time


def split_k_func(m: int, n: int, k: int, operand_dtype: str, c_dtype: str, splits: int,
                 scratch_splits: int) -> Any:
    """C = A · B as ``splits`` partial products over K slices ("C": partial[s] = A[:, slice s] ·
    B[slice s, :], float32) and their sum ("C_sum", narrowed to ``c_dtype``).  ``partial`` is
    the last parameter, ``scratch_splits`` deep whatever ``splits`` is, so every config of a
    shape has the signature of ``MmaGemmTemplate.scratch``."""
    from tvm.script import tirx as T

    slice_k = k // splits

    def total(partial: Any, i: Any, j: Any) -> Any:
        out = partial[0, i, j]
        for s in range(1, splits):
            out = out + partial[s, i, j]
        return out

    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((m, k), operand_dtype), B: T.Buffer((k, n), operand_dtype),
             C: T.Buffer((m, n), c_dtype), partial: T.Buffer((scratch_splits, m, n), "float32")) -> None:
        T.func_attr({"tirx.noalias": True})
        for s, i, j, r in T.grid(splits, m, n, slice_k):
            with T.sblock("C"):
                vs, vi, vj, vr = T.axis.remap("SSSR", [s, i, j, r])
                with T.init():
                    partial[vs, vi, vj] = T.float32(0)
                partial[vs, vi, vj] = partial[vs, vi, vj] + T.Cast("float32", A[vi, vs * slice_k + vr]) * T.Cast(
                    "float32", B[vs * slice_k + vr, vj])
        for i, j in T.grid(m, n):
            with T.sblock("C_sum"):
                vi, vj = T.axis.remap("SS", [i, j])
                C[vi, vj] = T.Cast(c_dtype, total(partial, vi, vj))

    return func


def schedule_split_k_sum(sch: Any, block_name: str = "C_sum") -> None:
    """The reduction kernel: one thread per 4 adjacent outputs, 16-byte reads of each partial."""
    fused = sch.fuse(*sch.get_loops(sch.get_sblock(block_name)))
    bx, tx, vec = sch.split(fused, [None, SPLIT_K_THREADS, SPLIT_K_VEC])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(vec)


# ---- choosing a tile without measuring -----------------------------------------------------
def _tile(warps: tuple[int, int], frags: tuple[int, int], k_frags: int, stages: int = 4,
          **changes: int) -> Config:
    values = dict(mma_warps_m=warps[0], mma_warps_n=warps[1], mma_frags_m=frags[0], mma_frags_n=frags[1],
                  mma_k_frags=k_frags, mma_stages=stages, mma_swizzle=1, mma_frag_buffers=2, mma_raster=0,
                  mma_out_smem=1, mma_split_k=1)
    return MMA_SPACE.make(**{**values, **changes})


# Tiles ``pick_mma_tile`` tries, largest first: the leaders of the mma.sync probe
# (benchmarks/probes/mma_probe.py, fp16 in, fp32 acc, fp16 out; docs/results/gemm.md): 128x128x32
# with 4 warps of 64x64 and 4 cp.async stages at 4096^3, 16x64x64 with 4 stages at 64x3072x1024,
# the swizzled 16x32x32 at 8x1536x512 back to back (from a CUDA graph 16x64x64 led there too).
AUTO_TILES = (
    _tile((2, 2), (4, 4), 2, 4),  # 128x128x32, 4 warps of 64x64
    _tile((2, 2), (2, 4), 4, 3),  # 64x128x64
    _tile((2, 2), (2, 2), 4, 3),  # 64x64x64
    _tile((1, 2), (1, 2), 4, 4),  # 16x64x64: an M = 64 batch of GRU steps in 16-row tiles
    _tile((1, 1), (1, 2), 2, 2, mma_frag_buffers=1),  # 16x32x32: the smallest fit
)
# Tried first where N is one 32-wide column, padded or whole: a speech model's 8192x29x1024 output
# layer took 0.020 ms on 64x32x64 with 4 warps along M, 0.022 on 128x32x64, 0.037 on 16x32x32;
# its weight padded to 32 columns (8192x32x1024) 0.0076 on 64x32x64 against 0.014 on 16x32x32
# (docs/results/models.md)
NARROW_TILES = (_tile((4, 1), (1, 2), 4, 4),)  # 64x32x64


def pick_mma_tile(m: int, n: int, k: int, operand_dtype: str, acc_dtype: str, c_dtype: str,
                  target: TargetInfo, split_k: bool = True, batch: int = 1) -> Config | None:
    """An mma.sync config for one GEMM without measuring: the first of ``AUTO_TILES`` that fits
    and gives 90 % of the SMs a block; else the first that, split over K (the largest split
    that keeps at least 4 k stages per block), gives every SM one; else the fitting config
    with the most blocks; None if none fits.  ``split_k`` False: whole-K tiles only;
    ``batch``: GEMMs side by side (the grid's z axis), each of M x N."""
    return pick_mma_tile_for([(m, n, k)], operand_dtype, acc_dtype, c_dtype, target, split_k=split_k, batch=batch)


def pick_mma_tile_for(shapes: Sequence[tuple[int, int, int]], operand_dtype: str, acc_dtype: str, c_dtype: str,
                      target: TargetInfo, *, split_k: bool = True, epilogue: bool = False,
                      batch: int = 0, pad: bool = True) -> Config | None:
    """``pick_mma_tile``'s rule for one tile that fits every (M, N, K) of ``shapes`` (blocks
    counted on the one with fewest, times the ``batch`` axis): without ``split_k`` only whole-K
    tiles (a GEMM inside another PrimFunc has no scratch for partial sums); ``epilogue`` as in
    ``mma_reason``; a tile that pads N or K only where none divides them, and with ``pad`` False
    never."""
    def fits(c: Config) -> bool:
        return all(mma_reason(m, n, k, operand_dtype, operand_dtype, acc_dtype, c_dtype, target, c,
                              epilogue=epilogue) is None for m, n, k in shapes)

    def blocks(c: Config) -> int:
        t = MmaTile.of(c)
        return max(batch, 1) * t.split_k * min(padded(m, t.block_m) // t.block_m * padded(n, t.block_n) // t.block_n
                                               for m, n, _ in shapes)

    def exact(c: Config) -> bool:  # N and K whole tiles (M is padded by every pick as before)
        t = MmaTile.of(c)
        return all(n % t.block_n == 0 and k % t.block_k == 0 for _, n, k in shapes)

    options = []
    for tile in AUTO_TILES:
        split_options = [tile.replace(mma_split_k=s) for s in (8, 4, 2)
                         if split_k and min(k for _, _, k in shapes) // (s * MmaTile.of(tile).block_k) >= 4]
        options += [c for c in [tile] + split_options if fits(c)]
    exact_options = [c for c in options if exact(c)]
    # an N of 32 or less on the narrow tiles first, padded or not
    narrow = [c for c in NARROW_TILES if fits(c)] if all(n <= 32 for _, n, _ in shapes) else []
    if exact_options or not pad:
        options = [c for c in narrow if exact(c)] + exact_options
    else:  # N or K padded where no tile divides them
        options = narrow + options
    if not options:
        return None
    whole = [c for c in options if c.mma_split_k == 1 and 10 * blocks(c) >= 9 * target.compute_units]
    split = [c for c in options if blocks(c) >= target.compute_units]
    # a grid that fills no SM count runs each block on an SM of its own: the most warps in
    # flight, the larger (deeper-pipelined) tile on a tie (at 8x1536x512 from a CUDA graph,
    # 16x64x64 on 2 warps and 24 blocks beat 16x32x32 on 1 warp and 48 blocks; docs/results/gemm.md)
    return (whole or split or [max(options, key=lambda c: blocks(c) * MmaTile.of(c).warps)])[0]


@dataclass(frozen=True)
class MmaGemmTile:
    """An mma.sync tile for the GEMM block of any PrimFunc: what ``GemmTemplate.tensor_core``
    holds (``gemm.TensorCoreTile``) to run its GEMM, with a narrowing store, a bias row or a
    batch axis (the mixed-precision GEMM, the GRU's gate GEMMs), on ``schedule_mma``.  Split-K
    is refused there: its partial sums need a scratch buffer and a second kernel, which only
    ``MmaGemmTemplate`` has.  ``str`` is the tile as ``tensor_core.parse_tile`` reads it."""

    config: Config
    kernel: ClassVar[str] = "mma"
    operand_dtypes: ClassVar[tuple[str, ...]] = OPERAND_DTYPES

    def __post_init__(self) -> None:
        MMA_SPACE.encode(self.config)  # every mma knob, each an allowed value

    def __str__(self) -> str:
        return ",".join(f"{name}={value}" for name, value in self.config.items)

    def label(self) -> str:
        return f"mma.sync {MmaTile.of(self.config).label()}"

    def reason(self, m: int, n: int, k: int, a_dtype: str, b_dtype: str, acc_dtype: str, c_dtype: str,
               target: TargetInfo, *, epilogue: bool = False) -> str | None:
        if self.config.mma_split_k > 1:
            return ("split-K needs a scratch buffer of partial sums and a second kernel, which only the mma.sync "
                    "GEMM template (tune gemm-tc) has")
        return mma_reason(m, n, k, a_dtype, b_dtype, acc_dtype, c_dtype, target, self.config, epilogue=epilogue)

    def schedule(self, sch: Any, block_name: str, *, epilogue: Sequence[str] = (), a_read: int = 0,
                 b_read: int = 1) -> Any:
        return schedule_mma(sch, block_name, self.config, epilogue=epilogue, a_read=a_read, b_read=b_read)

    def pass_config(self) -> dict[str, Any]:
        return pass_config(self.config)


# ---- the tunable template ------------------------------------------------------------------
from tvm_ext.schedules.gemm.simt import GemmTemplate, collapse_epilogue  # noqa: E402  (gemm imports nothing from here)
from tvm_ext.core.template import TensorSpec  # noqa: E402


@dataclass(frozen=True)
class MmaGemmTemplate(GemmTemplate):
    """C[M, N] = A[M, K] · B[K, N] on the tensor cores through mma.sync and ldmatrix: A and B
    float16 or bfloat16 (the same), accumulation float32 (default) or float16, C any float
    type.  The knobs are ``MMA_KNOBS``; ``mma_reason`` is the space's constraint.  Shapes
    with split-K configs take a float32 scratch buffer of partial sums (``scratch``)."""

    a_dtype: str = "float16"
    b_dtype: str = "float16"
    acc_dtype: str = "float32"
    c_dtype: str = "float32"
    # False: no split-K configs (and no scratch parameter), as for a matmul inside a Relax
    # model, whose PrimFunc has no buffer for the partial sums
    allow_split_k: bool = True

    name = "gemm_mma"

    def __post_init__(self, dtype: str | None = None) -> None:
        super().__post_init__(dtype)
        if self.a_dtype not in OPERAND_DTYPES or self.b_dtype != self.a_dtype:
            raise TvmExtError(f"mma.sync GEMM operands must both be float16 or both bfloat16, got A {self.a_dtype} "
                              f"and B {self.b_dtype}")
        if self.acc_dtype not in ACC_DTYPES:
            raise TvmExtError(f"mma.sync GEMM accumulates in {' or '.join(ACC_DTYPES)}, not {self.acc_dtype}")
        if self.b_transposed:
            raise TvmExtError("the mma.sync GEMM reads B as [K, N] (ldmatrix transposes its tiles); B is [N, K]")

    @property
    def params(self) -> dict[str, Any]:
        params = {"m": self.m, "n": self.n, "k": self.k, **{f"{p}_dtype": d for p, d in self.precision.items()}}
        if self.batch:
            params["batch"] = self.batch
        if self.b_shared:
            params["b_shared"] = True
        if not self.allow_split_k:
            params["allow_split_k"] = False
        return params

    @property
    def splits_k(self) -> bool:
        """Whether split-K configs exist (they have no batch axis)."""
        return self.allow_split_k and not self.batch

    def full_precision(self) -> GemmTemplate:
        """The float32 GEMM the inputs are drawn for (its reference is the check)."""
        return GemmTemplate(self.m, self.n, self.k, batch=self.batch, b_shared=self.b_shared)

    def reason(self, config: Config, target: TargetInfo) -> str | None:
        if config.mma_split_k > 1 and not self.splits_k:
            return ("split-K needs a scratch buffer of partial sums: not with a batch axis or in a Relax "
                    "model's matmul")
        return mma_reason(self.m, self.n, self.k, self.a_dtype, self.b_dtype, self.acc_dtype, self.c_dtype,
                          target, config)

    def space(self, target: TargetInfo) -> Space:
        return Space(MMA_KNOBS, (lambda c: self.reason(c, target),))

    def scratch(self) -> list[TensorSpec]:
        if not self.splits_k:
            return []
        splits = max_split_k(self.m, self.n) if self.acc_dtype == "float32" and self.m % FRAG == 0 else 1
        return [TensorSpec((splits, self.m, self.n), "float32")] if splits > 1 else []

    def default_config(self, target: TargetInfo) -> Config:
        """``pick_mma_tile``'s config (no measurement); an error naming why when none fits."""
        config = pick_mma_tile(self.m, self.n, self.k, self.a_dtype, self.acc_dtype, self.c_dtype, target,
                               split_k=self.splits_k, batch=max(1, self.batch))
        if config is None:
            raise TvmExtError(f"no mma.sync tile fits GEMM {self.m}x{self.n}x{self.k}: "
                              f"{self.reason(AUTO_TILES[-1], target)}")
        return config

    def analytic_pick(self, target: TargetInfo) -> tuple[Config, str]:
        """The zero-measurement pick (``--strategy analytic``) and why."""
        config = self.default_config(target)
        return config, (f"pick_mma_tile: the largest listed mma.sync tile that fits {self.m}x{self.n}x{self.k} "
                        f"and keeps the device's {target.compute_units} SMs busy (split-K for skinny shapes): "
                        f"{MmaTile.of(config).label()}")

    def func(self, config: Config) -> Any:
        """The PrimFunc ``config`` schedules: the plain GEMM, or its split-K form."""
        splits = MmaTile.of(config).split_k
        scratch = self.scratch()
        if splits > 1:
            return split_k_func(self.m, self.n, self.k, self.a_dtype, self.c_dtype, splits, scratch[0].shape[0])
        if not scratch:
            return self.prim_func()
        return with_unused_param(self, scratch[0])  # the scratch parameter every config of this shape takes

    def schedule(self, config: Config, target: TargetInfo, func: Any = None, site: Any = None) -> Any:
        """The schedule of ``config``; with ``func`` and ``site`` (``gemm.MatmulSite``), of the
        matmul inside a foreign PrimFunc (a Relax task), its epilogue joining the output tile's store."""
        from tvm import s_tir

        if func is not None:
            if MmaTile.of(config).split_k > 1:
                raise TvmExtError("a split-K config needs the scratch buffer of its own compute")
            sch = s_tir.Schedule(func)
            site = collapse_epilogue(sch, site)
            return schedule_mma(sch, site.block, config, epilogue=site.epilogue, a_read=site.a, b_read=site.b)
        sch = s_tir.Schedule(self.func(config))
        if MmaTile.of(config).split_k > 1:
            schedule_mma(sch, "C", config, out_smem=True)
            schedule_split_k_sum(sch)
            return sch
        return schedule_mma(sch, "C", config, epilogue=self.own_site().epilogue)

    def pass_config(self, config: Config, target: TargetInfo) -> dict[str, Any]:
        return pass_config(config)


def with_unused_param(template: GemmTemplate, spec: TensorSpec) -> Any:
    """The template's GEMM (``GemmTemplate.prim_func``'s compute) with one more, unused,
    buffer parameter of ``spec`` at the end."""
    from tvm import te

    acc = template.acc_dtype
    a = te.placeholder((template.m, template.k), template.a_dtype, name="A")
    b = te.placeholder((template.k, template.n), template.b_dtype, name="B")
    r = te.reduce_axis((0, template.k), name="k")
    c = te.compute((template.m, template.n),
                   lambda i, j: te.sum(a[i, r].astype(acc) * b[r, j].astype(acc), axis=r), name="C")
    if template.c_dtype != acc:
        c = te.compute((template.m, template.n), lambda i, j: c[i, j].astype(template.c_dtype), name="C_out")
    return te.create_prim_func([a, b, c, te.placeholder(spec.shape, spec.dtype, name="partial")])
