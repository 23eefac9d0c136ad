"""Hopper's warpgroup MMA (``wgmma.mma_async``) as a GEMM template: C = A·Btᵀ, float16 (or
bfloat16) in, float32 accumulate, float16 (bfloat16, float32) out, A (M, K) and Bt (N, K) both
K-major (a Linear layer's weight layout, which wgmma reads from shared memory without a transpose).

The kernel is a TVMScript (``tvm.script.tirx``) PrimFunc in TVM 0.27's table-driven PTX
dialect, built by ``tvm.compile`` for sm_90a: every Hopper instruction is a ``T.ptx["..."]``
call that TVM checks against its PTX table and renders into an ``asm volatile`` helper of the
CUDA it generates (``wgmma.fence`` / ``wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16``, or
``.f32.bf16.bf16`` for bfloat16 operands, in the same 2-byte layout, on
64-bit shared-memory matrix descriptors / ``commit_group`` / ``wait_group``, 16-byte
``cp.async``, ``fence.proxy.async.shared::cta``).  Nothing is scheduled: a config (its knobs)
is the whole record of a kernel, and the template builds the PrimFunc from it.

Kernel: a block computes a BM x BN tile with BM / 64 warpgroups (128 threads each), warpgroup
w owning rows [64w, 64w + 64) and issuing ``m64n{BN}k16`` four times per k step of 64.  Shared
memory holds S stages of the A and Bt tiles in the 128-byte-swizzle layout (row r of a 64-half
k slice at byte 128 r, its 16-byte chunk c at chunk c ^ (r % 8)), filled by all threads with
16-byte ``cp.async``; the descriptors use that swizzle, SBO = 1024 bytes (8 rows), and advance
32 bytes per k16.  Pipeline (``wgmma_inflight`` = wgmma groups left in flight, 0 or 1): tiles
k+1 .. k+S-1-W load while the wgmma of tile k runs; one barrier per k step; a stage is refilled
once every warpgroup's wgmma that read it has retired.  Epilogue: the accumulator fragment
converted to half2 and stored straight to global memory, or (``wgmma_smem_epilogue``) through
padded shared memory and 16-byte coalesced stores.  ``wgmma_raster`` groups the blocks that many
tile rows at a time.  ``wgmma_tiles`` > 1: a block computes several C tiles in turn (b, b + grid,
...), one cp.async pipeline running across them, so the next tile's first stages load during
this one's last k steps and its store (the store follows the k loop and a full wgmma wait;
touching the accumulators inside the loop makes ptxas serialise the wgmma); its shared-memory
epilogue stages each warpgroup's C in the 1 + ``wgmma_inflight`` stages the next tile's loads leave
free.  ``wgmma_split_k`` S > 1: K in S slices, each a unit of work (unit u: slice u // tiles of
tile u % tiles), its float32 sums stored straight to a buffer of the function's own (S x C),
and a second kernel adds the slices and applies the epilogue: more blocks where C has too few
tiles for the SMs.  ``wgmma_split_cluster`` 1: a tile's S slices are one thread-block cluster
(adjacent blocks, slice blockIdx % S); each block puts its float32 sums in its own shared memory
and block r adds rows [r bm / S, (r + 1) bm / S) of all S blocks' through distributed shared
memory (``ld.shared::cluster``) and stores them through the epilogue: one kernel, nothing in
global memory.  Shapes the tile does not divide are refused (no guards).

Measurements: ``benchmarks/RESULTS.md`` (wgmma sections).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tvm_ext.errors import TvmExtError
from tvm_ext.hardware import WGMMA_SHARED_BYTES, has_wgmma, max_dynamic_smem, sm_90a  # noqa: F401 (sm_90a re-exported)
from tvm_ext.program import CompiledProgram, compile_module_program
from tvm_ext.space import Config, Knob
from tvm_ext.target import TargetInfo

BK = 64  # the k step: 64 halves = one 128-byte swizzle row
# what wgmma reads from shared memory: float16 or bfloat16 (k16 instructions, one layout), or
# float32 words as TF32 (k8 instructions, both operands K-major, the low 13 mantissa bits ignored:
# ``gemm_3xtf32`` splits float32 into such parts)
OPERANDS = {"float16": 2, "bfloat16": 2, "tf32": 4}  # -> bytes an element
OPERAND_STORAGE = {"float16": "float16", "bfloat16": "bfloat16", "tf32": "float32"}  # -> A's, Bt's, the stages'
OPERAND_PTX = {"float16": "k16.f32.f16.f16", "bfloat16": "k16.f32.bf16.bf16", "tf32": "k8.f32.tf32.tf32"}
# B's layouts: "NK" = Bt (N, K), K-major (a Linear weight), read as stored; "KN" = B (K, N), read
# N-major (wgmma's transposed-B mode: 64-wide N atoms of 128-byte rows, one row per k)
B_LAYOUTS = ("NK", "KN")
SHARED_LIMIT = WGMMA_SHARED_BYTES  # dynamic shared memory a block may have on sm_90
REGISTERS_PER_SM = 65536
# registers a thread needs beside its bn/2 accumulators (H100: 256x192, 512 threads, ran at the
# 128-register cap; 256x256 failed to launch)
OTHER_REGISTERS = 32
THREAD_REGISTERS = 255  # the most registers a thread may have
TILES_PER_BLOCK = (1, 2, 3, 4, 6, 8, 12, 16)  # the knob wgmma_tiles's choices
SPLITS_OF_K = (1, 2, 3, 4, 6, 8)  # the knob wgmma_split_k's choices
REDUCE_THREADS = 256  # threads a block of the split sums' kernel, four columns each
KNOBS = (
    Knob("wgmma_bm", (64, 128, 256), "block rows: wgmma_bm / 64 warpgroups of 128 threads, 64 rows each"),
    Knob("wgmma_bn", (64, 128, 192, 256), "block columns = the N of each m64nNk16 wgmma"),
    Knob("wgmma_stages", (2, 3, 4, 5, 6, 8), "shared-memory stages of the A and Bt tiles (cp.async, 128-byte swizzle)"),
    Knob("wgmma_inflight", (0, 1), "wgmma groups left outstanding at the end of a k step (wait_group N)"),
    Knob("wgmma_smem_epilogue", (0, 1), "1: C staged through shared memory for 16-byte coalesced stores"),
    Knob("wgmma_raster", (0, 2, 4, 8),
         "0: blocks in row-major tile order; G: column-major within groups of G tile rows"),
    Knob("wgmma_tiles", TILES_PER_BLOCK,
         "C tiles a block computes in turn (tiles b, b + grid, ...), its cp.async pipeline running on from one "
         "tile's k steps into the next's (no refill at each tile's start); the shared-memory epilogue then stages C "
         "in the stages the next tile's loads leave free"),
    Knob("wgmma_split_k", SPLITS_OF_K,
         "slices of K: each C tile's k steps split over that many units (more blocks where C has few tiles), "
         "their float32 sums added by a second kernel that applies the epilogue"),
    Knob("wgmma_split_cluster", (0, 1),
         "with K split: 1: a tile's slices run as one thread-block cluster (Hopper) and add their sums through "
         "distributed shared memory, each block the epilogue of its share of the tile's rows (one kernel, no "
         "sums in global memory); 0: float32 sums to global memory, added by a second kernel"),
)
# the probe's best at 4096^3 first, then smaller tiles for shapes it does not divide; 256x192 was
# best at the GRU's projection 8192x3072x1024 (H100: 0.098 ms against 0.100 with 128x256), but no
# better where 128x256 also divides; 64x64 takes 8 stages: at 64x3072x1024 (a GRU step's hidden
# GEMM) 0.93-0.94 of cuBLAS, both replayed from CUDA graphs, against 0.88-0.91 with 4-6 stages
DEFAULT_TILES = ((128, 256, 4, 1, 1, 0), (256, 192, 4, 1, 1, 4), (256, 128, 4, 1, 1, 0), (128, 128, 6, 1, 1, 0),
                 (128, 64, 6, 1, 1, 0), (64, 64, 8, 1, 1, 0))


@dataclass(frozen=True)
class Prepare:
    """Inputs a wgmma function takes in place of A and Bt (``wgmma_gemm``'s ``prepare``): their
    shapes and dtype, and the TIR macro ``macro(A_in, B_in, A, Bt)`` writing A and Bt from them."""

    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    dtype: str
    macro: Any


@dataclass(frozen=True)
class WgmmaTile:
    """A kernel's tile and pipeline (the knobs without their prefix)."""

    bm: int = 128
    bn: int = 256
    stages: int = 4
    inflight: int = 1
    smem_epilogue: bool = True
    raster: int = 0
    tiles: int = 1  # C tiles a block computes in turn
    split: int = 1  # slices of K (units a C tile), their sums added by a second kernel
    cluster: bool = False  # with a split: the slices a thread-block cluster, added in its shared memory
    operand: str = "float16"  # ``OPERANDS``

    @property
    def bk(self) -> int:
        """The k step: one 128-byte swizzle row of the operand's elements."""
        return 128 // OPERANDS.get(self.operand, 2)

    @classmethod
    def of(cls, config: Config, operand: str = "float16") -> "WgmmaTile":
        c = config.as_dict()
        return cls(c["wgmma_bm"], c["wgmma_bn"], c["wgmma_stages"], c["wgmma_inflight"], bool(c["wgmma_smem_epilogue"]),
                   c["wgmma_raster"], tiles=c.get("wgmma_tiles", 1), split=c.get("wgmma_split_k", 1),
                   cluster=bool(c.get("wgmma_split_cluster", 0)), operand=operand)

    def knobs(self) -> dict[str, int]:
        """The knob values of this tile (``of``'s inverse)."""
        return dict(wgmma_bm=self.bm, wgmma_bn=self.bn, wgmma_stages=self.stages, wgmma_inflight=self.inflight,
                    wgmma_smem_epilogue=int(self.smem_epilogue), wgmma_raster=self.raster, wgmma_tiles=self.tiles,
                    wgmma_split_k=self.split, wgmma_split_cluster=int(self.cluster))

    @property
    def name(self) -> str:
        return (f"wgmma {'' if self.operand == 'float16' else self.operand + ' '}{self.bm}x{self.bn}x{self.bk} "
                f"s{self.stages} w{self.inflight} "
                f"{'smem' if self.smem_epilogue else 'direct'}{f' r{self.raster}' if self.raster else ''}"
                f"{f' t{self.tiles}' if self.tiles > 1 else ''}{f' k/{self.split}' if self.split > 1 else ''}"
                f"{' cluster' if self.cluster else ''}")

    @property
    def threads(self) -> int:
        return self.bm // 64 * 128

    def smem_bytes(self) -> int:
        return self.stages * (self.bm + self.bn) * 128

    def cluster_sum_bytes(self) -> int:
        """Shared memory of the float32 tile a block of a cluster sums from (rows padded by 8)."""
        return self.bm * (self.bn + 8) * 4

    def c_pieces_per_stage(self) -> int:
        """Warpgroups' C (64 rows of bn halves, padded by 8) one stage's shared memory holds."""
        return (self.bm + self.bn) * 128 // (64 * (self.bn + 8) * 2)


def b_layout_reason(b_layout: str) -> str | None:
    """Why ``b_layout`` is no layout of B the kernel reads (one line), or None."""
    return None if b_layout in B_LAYOUTS else f"B layout {b_layout!r}; allowed: {', '.join(B_LAYOUTS)}"


def wgmma_reason(t: WgmmaTile, m: int, n: int, k: int, shared_limit: int = SHARED_LIMIT,
                 b_layout: str = "NK") -> str | None:
    """Why tile ``t`` cannot run an (m, n, k) GEMM with B laid out as ``b_layout`` (one line), or None."""
    layout = b_layout_reason(b_layout)
    if layout:
        return layout
    if t.operand not in OPERANDS:
        return f"wgmma operand {t.operand!r}; allowed: {', '.join(OPERANDS)}"
    if t.operand == "tf32" and (b_layout != "NK" or t.smem_epilogue):
        return f"{t.name}: TF32 operands are read K-major only (B as Bt (N, K)), C stored directly (smem epilogue 0)"
    if b_layout == "KN" and t.bn % 64:
        return f"{t.name}: B stored (K, N) is read in 64-wide N atoms: bn must be a multiple of 64"
    if t.bm % 64 or t.bn % 8 or not 8 <= t.bn <= 256 or t.inflight not in (0, 1):
        return f"{t.name}: needs bm a multiple of 64, bn in 8..256 (multiple of 8), inflight 0 or 1"
    if t.threads * (t.bn // 2 + OTHER_REGISTERS) > REGISTERS_PER_SM:
        return (f"{t.name}: {t.threads} threads x ({t.bn // 2} accumulator + ~{OTHER_REGISTERS} other registers) > "
                f"{REGISTERS_PER_SM} registers (an SM's; the launch fails)")
    if t.stages < 2 + t.inflight:
        return f"{t.name}: needs at least {2 + t.inflight} stages with {t.inflight} wgmma group(s) in flight"
    if m % t.bm or n % t.bn or k % t.bk:
        return f"{t.name}: {m}x{n}x{k} must divide the {t.bm}x{t.bn}x{t.bk} tile (no guards)"
    if t.split not in SPLITS_OF_K or k // t.bk % t.split:
        return (f"{t.name}: K's {k // t.bk} steps of {t.bk} must split into {t.split} equal slices "
                f"(allowed: {', '.join(map(str, SPLITS_OF_K))})")
    if t.split > 1 and t.smem_epilogue:
        return f"{t.name}: a split K stores float32 sums straight to global memory (use wgmma_smem_epilogue 0)"
    if t.cluster and (t.split == 1 or t.tiles > 1 or t.bm % t.split):
        return (f"{t.name}: a cluster adds the slices of K of one tile (wgmma_split_k > 1, wgmma_tiles 1), each block "
                f"{t.bm} / {t.split} of its rows: the split must divide bm")
    if t.cluster and t.cluster_sum_bytes() > t.smem_bytes():
        return (f"{t.name}: the tile's float32 sums ({t.cluster_sum_bytes()} bytes) do not fit in the stages' "
                f"shared memory ({t.smem_bytes()})")
    if t.raster < 0 or (t.raster and m // t.bm % t.raster):
        return f"{t.name}: the raster group ({t.raster}) must divide the {m // t.bm} tile rows"
    if (t.bm * 8) % t.threads or (t.bn * 8) % t.threads or (t.bm * t.bn // 8) % t.threads:
        return f"{t.name}: the 16-byte chunks of a stage and of C must split evenly over {t.threads} threads"
    if t.smem_bytes() > shared_limit:
        return f"{t.name}: {t.smem_bytes()} bytes of shared memory > {shared_limit} (the limit of a block)"
    if t.tiles < 1:
        return f"{t.name}: a block computes at least one tile"
    if t.tiles > 1 and t.smem_epilogue and t.bm // 64 > (1 + t.inflight) * t.c_pieces_per_stage():
        return (f"{t.name}: with several tiles a block stages C in the {1 + t.inflight} stage(s) the next tile's "
                f"loads leave free, {t.c_pieces_per_stage()} warpgroup(s) of 64 x {t.bn} a stage: too few for "
                f"{t.bm // 64}")
    if t.smem_epilogue and t.bm * (t.bn + 8) * 2 > t.smem_bytes():
        return f"{t.name}: C ({t.bm}x{t.bn} halves, padded) does not fit in the stages' shared memory"
    return None


def promote_reason(t: WgmmaTile, k: int, promote: int) -> str | None:
    """Why tile ``t`` cannot promote its sums every ``promote`` k steps of a depth-``k`` GEMM
    (``wgmma_gemm``'s ``promote``; 0: never), or None."""
    if not promote:
        return None
    registers = t.bn + OTHER_REGISTERS  # two sets of bn / 2 accumulators
    if registers > THREAD_REGISTERS or t.threads * registers > REGISTERS_PER_SM:
        return (f"{t.name}: promoting keeps two sets of {t.bn // 2} accumulators, ~{registers} registers a thread "
                f"({THREAD_REGISTERS} at most, {REGISTERS_PER_SM} a block): bn <= 192")
    if promote < 0 or k // t.bk // t.split % promote:
        return f"promoting every {promote} k steps must divide the {k // t.bk // t.split} k steps of a slice"
    return None


C_DTYPES = ("float16", "bfloat16", "float32")


def epilogue_reason(t: WgmmaTile, c_dtype: str) -> str | None:
    """Why tile ``t`` cannot store C as ``c_dtype`` (None: it can): the shared-memory epilogue
    stages C in the stages' own dtype, so C must be the operands' (float16 or bfloat16)."""
    if c_dtype not in C_DTYPES:
        return f"the wgmma GEMM stores C as {', '.join(C_DTYPES[:-1])} or {C_DTYPES[-1]}, not {c_dtype}"
    staged = OPERAND_STORAGE.get(t.operand, "float16")
    if t.smem_epilogue and c_dtype != staged:
        return (f"{t.name}: the shared-memory epilogue stages {staged} C only (the operands' dtype; use "
                f"wgmma_smem_epilogue 0)")
    return None


def target_reason(target: TargetInfo) -> str | None:
    """Why ``target`` has no warpgroup MMA (None: it has, sm_90)."""
    if target.kind != "cuda":
        return f"wgmma is a CUDA (Hopper, sm_90) instruction, not {target.kind}'s"
    if not has_wgmma(target):
        return f"wgmma needs a Hopper GPU (sm_90); this one is {target.arch or 'unknown'}"
    return None


def shared_limit(target: TargetInfo) -> int:
    """Dynamic shared memory a wgmma kernel's block may take on ``target``."""
    return min(SHARED_LIMIT, max_dynamic_smem(target))


def b_shape(n: int, k: int, b_layout: str) -> tuple[int, int]:
    """The stored shape of the second operand: Bt (n, k), or B (k, n) with ``b_layout`` "KN"."""
    return (k, n) if b_layout == "KN" else (n, k)


def compile_wgmma(func: Any, target: TargetInfo, config: Config) -> CompiledProgram:
    """A wgmma kernel compiled for sm_90a (wgmma is an arch-specific instruction); the config is
    its record (no schedule trace)."""
    return compile_module_program(func, sm_90a(target), {"lowered": "wgmma", "config": dict(config.items)})


def wgmma_gemm(cfg: WgmmaTile, m: int, n: int, k: int, c_dtype: str = "float16", bias_dtype: str | None = None,
               scale: float = 1.0, b_layout: str = "NK", epilogue: Callable[..., Any] | None = None,
               promote: int = 0, batch: Sequence[int] = (), b_batched: bool = True,
               prepare: "Prepare | None" = None) -> Any:
    """The PrimFunc ``main(A: (m, k), Bt: (n, k), C: (m, n) c_dtype)``, C = A @ Bt^T, or
    with ``bias_dtype`` ``main(A, Bt, bias: (n,), C)``, C = A @ Bt^T x ``scale`` + bias (the
    tile checked first: ``wgmma_reason``).  ``b_layout`` "KN": the second operand is B (k, n),
    C = A @ B, read N-major (``B_LAYOUTS``).  ``epilogue(value, row, col, lead)``: C's element for
    the float32 accumulator ``value`` at (row, col), as TIR (a Relax task's fused blocks, which
    may read buffers of their own: ``tvm_ext.relax_wgmma``), in place of scale, bias and cast;
    ``lead``: its matrix's batch indices (none without a batch).
    ``batch``: leading axes of A, C and (``b_batched``, else B is shared) B: a GEMM per index, its
    C tiles numbered after the previous matrix's (attention's ``(batch, heads, seq, dim)`` products).
    ``prepare``: the function takes other inputs, from which its macro writes A and Bt into
    buffers of their own first (``gemm_3xtf32``'s splits: one function, several kernels).
    ``cfg.operand``: A's and Bt's dtype, float16 (``m64nNk16.f32.f16.f16``) or bfloat16
    (``.f32.bf16.bf16``, the same 2-byte swizzle and descriptors); "tf32": A and Bt are float32,
    multiplied as TF32 (``m64nNk8.f32.tf32.tf32``).
    ``promote`` k steps (0: never): every that many, the wgmma accumulators are added into a
    second set with the CUDA cores' round-to-nearest adds and restart (the tensor cores'
    float32 accumulation drops low bits, an error growing with K: ``gemm_3xtf32``)."""
    from tvm import s_tir
    from tvm.script import tirx as T

    reason = (wgmma_reason(cfg, m, n, k, b_layout=b_layout) or epilogue_reason(cfg, c_dtype)
              or promote_reason(cfg, k, promote))
    if reason:
        raise TvmExtError(reason)
    n_major = b_layout == "KN"
    lead = tuple(int(x) for x in batch)
    a_shape, c_shape = (*lead, m, k), (*lead, m, n)
    bt_shape = (*(lead if b_batched else ()), *b_shape(n, k, b_layout))
    tf32 = cfg.operand == "tf32"
    in_dtype = OPERAND_STORAGE[cfg.operand]
    elem = OPERANDS[cfg.operand]  # bytes an element of A, Bt and the stages
    chunk_elems = 16 // elem  # elements a 16-byte cp.async moves
    k_inst = 32 // elem  # k of one wgmma: 32 bytes of each row
    has_bias = bias_dtype is not None
    bm, bn, bk, stages, smem_epilogue = cfg.bm, cfg.bn, cfg.bk, cfg.stages, cfg.smem_epilogue
    threads = bm // 64 * 128
    n_acc = bn // 2  # float32 accumulator registers per thread (m64nN: N/2)
    a_stage, b_stage = bm * bk, bn * bk  # elements
    stage = a_stage + b_stage
    a_loads, b_loads = a_stage // chunk_elems // threads, b_stage // chunk_elems // threads  # 16-byte cp.async
    split = cfg.split  # units a C tile: unit u is slice u // c_tiles of K of tile u % c_tiles
    k_tiles, grid_n = k // bk // split, n // bn  # k steps of a unit
    per_matrix = m // bm * grid_n  # C tiles of one matrix of the batch
    c_tiles = per_matrix * int(np.prod(lead, dtype=np.int64))
    units = c_tiles * split
    grid = -(-units // cfg.tiles)  # blocks; block b computes units b, b + grid, ...
    group = cfg.raster or 1  # raster 0 = groups of one tile row = row-major
    inflight = cfg.inflight
    ahead = stages - 1 - inflight  # tiles loaded ahead of the one being multiplied
    c_stride = bn + 8  # halves per C row in shared memory (padded: conflict-free half2 writes)
    c_loads = bm * bn // 8 // threads  # = 64 * bn // 8 // 128: a tile's or a warpgroup's C, 16 bytes a thread
    pieces = cfg.c_pieces_per_stage()
    mma = f"wgmma.mma_async.sync.aligned.m64n{bn}{OPERAND_PTX[cfg.operand]}"
    # descriptor bits 32-63: stride byte offset 1024 >> 4 (8 rows of 128 B), bit 62 = 128-byte swizzle
    desc_hi = T.uint64(((1024 >> 4) | (1 << 30)) << 32)

    def swizzled(chunk: Any) -> Any:
        """Element offset in a stage tile of 16-byte chunk ``chunk`` (row chunk // 8, column chunk % 8)."""
        row = chunk // 8
        return row * bk + (chunk % 8 ^ row % 8) * chunk_elems

    def desc(smem_base: Any, elems: Any, leading: int = 16) -> Any:
        """wgmma matrix descriptor of the 128-byte-swizzled tile at ``elems`` into smem: K-major
        (the leading byte offset unused), or N-major with ``leading`` the bytes between its
        64-wide N atoms; 8-row groups 1024 bytes apart either way."""
        addr = (smem_base + elems * elem) & 0x3FFFF
        return desc_hi | T.Cast("uint64", (addr >> 4) | ((leading >> 4) << 16))

    def b_chunk(chunk: Any) -> Any:
        """Halves offset in a B stage tile of 16-byte chunk ``chunk`` of the global tile: K-major,
        the swizzled row of an N index; N-major (B (k, n)), row k of its 64-wide N atom."""
        if not n_major:
            return swizzled(chunk)
        row, column = chunk // (bn // 8), chunk % (bn // 8)
        return column // 8 * (bk * 64) + row * 64 + (column % 8 ^ row % 8) * 8

    def k_major(X: Any, at: list[Any], row0: Any, kt: Any, chunk: Any) -> Any:
        """The global address of 16-byte chunk ``chunk`` of k tile ``kt`` of a K-major operand's
        tile (A, or Bt) whose rows start at ``row0``, in the matrix of batch indices ``at``."""
        return X.ptr_to([*at, row0 + chunk // 8, kt * bk + chunk % 8 * chunk_elems])

    def b_global(B: Any, at: list[Any], col0: Any, kt: Any, chunk: Any) -> Any:
        """The global address of 16-byte chunk ``chunk`` of k tile ``kt``'s B tile."""
        at = at if b_batched else []
        if not n_major:
            return k_major(B, at, col0, kt, chunk)
        return B.ptr_to([*at, kt * bk + chunk // (bn // 8), col0 + chunk % (bn // 8) * 8])

    def out(value: Any, bias: Any, at: list[Any], row: Any, col: Any) -> Any:
        """An accumulator as C stores it: scaled, plus the bias of its column, narrowed (or
        what ``epilogue`` makes of it)."""
        if epilogue is not None:
            return T.Cast(c_dtype, epilogue(value, row, col, at))
        if scale != 1.0:
            value = value * T.float32(scale)
        if has_bias:
            value = value + T.Cast("float32", bias[col])
        return T.Cast(c_dtype, value)

    @T.macro
    def load_stage(smem: Any, A: Any, Bt: Any, slot: Any, kt: Any, at: Any, row0: Any, col0: Any, tx: Any) -> None:
        """k tile ``kt`` of A and B into stage ``slot`` (its halves offset), 16-byte ``cp.async``."""
        for i in T.unroll(a_loads):
            T.ptx["cp.async.cg.shared.global"](smem.ptr_to([slot + swizzled(i * threads + tx)]),
                                               k_major(A, at, row0, kt, i * threads + tx), 16)
        for i in T.unroll(b_loads):
            T.ptx["cp.async.cg.shared.global"](smem.ptr_to([slot + a_stage + b_chunk(i * threads + tx)]),
                                               b_global(Bt, at, col0, kt, i * threads + tx), 16)

    clustered = cfg.cluster  # a tile's slices are the blocks of a cluster: adjacent units

    def c_tile(unit: Any) -> Any:
        """The C tile of unit ``unit`` (each tile's K slices are ``c_tiles`` units apart, or with a
        cluster adjacent)."""
        if split == 1:
            return unit
        return unit // split if clustered else unit % c_tiles

    def global_kt(unit: Any, kt: Any) -> Any:
        """Unit ``unit``'s k step ``kt`` as a k step of the whole K."""
        if split == 1:
            return kt
        return kt + (unit % split if clustered else unit // c_tiles) * k_tiles

    def in_matrix(tile: Any) -> Any:
        """Unit ``tile``'s C tile's number within its matrix of the batch."""
        return c_tile(tile) % per_matrix if lead else c_tile(tile)

    def tile_row0(tile: Any) -> Any:
        """The first row of C tile ``tile`` (tiles numbered in raster order)."""
        return (in_matrix(tile) // (group * grid_n) * group + in_matrix(tile) % group) * bm

    def tile_col0(tile: Any) -> Any:
        return in_matrix(tile) % (group * grid_n) // group * bn

    def tile_lead(tile: Any) -> list[Any]:
        """The batch indices of unit ``tile``'s matrix (none without a batch)."""
        return matrix_lead(c_tile(tile) // per_matrix)

    def matrix_lead(index: Any) -> list[Any]:
        """The batch indices of matrix ``index`` of the batch (none without one)."""
        inner = [int(np.prod(lead[i + 1:], dtype=np.int64)) for i in range(len(lead))]
        return [index // inner[i] % lead[i] if i else index // inner[i] for i in range(len(lead))]

    def fragment_row(base: Any, tx: Any, p: Any) -> Any:
        """The row of accumulator pair ``p`` of thread ``tx`` (wgmma's m64nN fragment: warp w of the
        warpgroup rows 16w.., lane // 4, 8 further for odd pairs), after row ``base``."""
        return base + tx % 128 // 32 * 16 + tx % 32 // 4 + p % 2 * 8

    def fragment_col(base: Any, tx: Any, p: Any, v: Any) -> Any:
        """The column of accumulator ``2p + v`` of thread ``tx``, after column ``base``."""
        return base + p // 2 * 8 + tx % 4 * 2 + v

    @T.macro
    def direct_store(C: Any, bias: Any, acc: Any, at: Any, row0: Any, col0: Any, wg: Any, tx: Any) -> None:
        """The accumulators straight to C (pairs of adjacent columns)."""
        for p in T.unroll(n_acc // 2):
            for v in T.vectorized(2):
                row = T.meta_var(fragment_row(row0 + wg * 64, tx, p))
                col = T.meta_var(fragment_col(col0, tx, p, v))
                C[(*at, row, col)] = out(acc[p * 2 + v], bias, at, row, col)

    @T.macro
    def partial_store(P: Any, acc: Any, unit: Any, at: Any, row0: Any, col0: Any, wg: Any, tx: Any) -> None:
        """Unit ``unit``'s float32 sums into its slice of K's partial sums P (split, *batch, m, n)."""
        for p in T.unroll(n_acc // 2):
            for v in T.vectorized(2):
                P[(unit // c_tiles, *at, fragment_row(row0 + wg * 64, tx, p), fragment_col(col0, tx, p, v))] = \
                    acc[p * 2 + v]

    band = bm // split  # with a cluster: rows of the tile each of its blocks adds and stores
    band_quads = band * bn // 4
    sum_stride = bn + 8  # float32 a row of the tile's sums in shared memory (padded: conflict-free pairs)

    @T.macro
    def cluster_sum(smem: Any, base: Any, C: Any, bias: Any, acc: Any, bid: Any, at: Any, row0: Any, col0: Any,
                    wg: Any, tx: Any) -> None:
        """The cluster's K slices of this tile added: each block's float32 sums into its shared
        memory, then block ``rank`` adds rows [rank x band, ..) of every block's (distributed
        shared memory, 16 bytes at a time, slices in order) and stores them through the epilogue."""
        sums = T.decl_buffer((bm * sum_stride,), "float32", data=smem.data, scope="shared.dyn")
        peer = T.alloc_buffer((split,), "uint32", scope="local")
        got = T.alloc_buffer((4,), "float32", scope="local")
        quad = T.alloc_buffer((4,), "float32", scope="local")
        T.ptx["cp.async.wait_group"](0)
        T.tvm_storage_sync("shared")  # every warpgroup's wgmma retired: the stages are free
        for p in T.unroll(n_acc // 2):
            for v in T.vectorized(2):
                sums[fragment_row(wg * 64, tx, p) * sum_stride + fragment_col(0, tx, p, v)] = acc[p * 2 + v]
        T.ptx["barrier.cluster.arrive.release"]()
        T.ptx["barrier.cluster.wait.acquire"]()  # every block's sums are in its shared memory
        for b in T.unroll(split):
            T.ptx["mapa.shared::cluster.u32"](peer[b], base, T.uint32(b))  # ``sums`` starts at the stages' base
        for i in T.unroll(-(-band_quads // threads)):
            if i * threads + tx < band_quads:
                row = T.meta_var(bid % split * band + (i * threads + tx) // (bn // 4))
                col = T.meta_var((i * threads + tx) % (bn // 4) * 4)
                for v in T.unroll(4):
                    quad[v] = T.float32(0)
                for b in T.unroll(split):
                    T.ptx["ld.shared::cluster.v4.f32"](got[0], got[1], got[2], got[3],
                                                       peer[b] + T.Cast("uint32", (row * sum_stride + col) * 4))
                    for v in T.unroll(4):
                        quad[v] = quad[v] + got[v]
                for v in T.vectorized(4):
                    C[(*at, row0 + row, col0 + col + v)] = out(quad[v], bias, at, row0 + row, col0 + col + v)
        T.ptx["barrier.cluster.arrive.release"]()
        T.ptx["barrier.cluster.wait.acquire"]()  # no block leaves while another reads its shared memory

    quads = c_tiles * bm * bn // 4  # C's elements, four a thread
    quad_blocks = -(-quads // REDUCE_THREADS)

    @T.macro
    def add_slices(P: Any, bias: Any, C: Any) -> None:
        """C from the K slices' partial sums P: their total through the epilogue, four columns a
        thread (16-byte loads of each slice)."""
        with T.launch_thread("blockIdx.x", quad_blocks) as bid:
            with T.launch_thread("threadIdx.x", REDUCE_THREADS) as tx:
                sums = T.alloc_buffer((4,), "float32", scope="local")
                if bid * REDUCE_THREADS + tx < quads:
                    first = T.meta_var((bid * REDUCE_THREADS + tx) * 4)  # C's element, flat
                    at = T.meta_var(matrix_lead(first // (m * n)))
                    row, col = T.meta_var(first // n % m), T.meta_var(first % n)
                    for v in T.vectorized(4):
                        sums[v] = P[(0, *at, row, col + v)]
                    for s in T.unroll(split - 1):
                        for v in T.vectorized(4):
                            sums[v] = sums[v] + P[(s + 1, *at, row, col + v)]
                    for v in T.vectorized(4):
                        C[(*at, row, col + v)] = out(sums[v], bias, at, row, col + v)

    @T.macro
    def stage_c(smem: Any, piece: Any, acc: Any, bias: Any, at: Any, row0: Any, col0: Any, wg: Any,
                tx: Any) -> None:
        """The warpgroup's accumulators as C, into its 64 padded rows of shared memory from
        ``piece`` (halves): pairs (2p, 2p+1) of adjacent columns."""
        for p in T.unroll(n_acc // 2):
            for v in T.vectorized(2):
                smem[piece + fragment_row(0, tx, p) * c_stride + fragment_col(0, tx, p, v)] = \
                    out(acc[p * 2 + v], bias, at, fragment_row(row0 + wg * 64, tx, p), fragment_col(col0, tx, p, v))

    promoting = promote > 0
    total_size = n_acc if promoting else 1

    def summed(total: Any, acc: Any) -> Any:
        """The registers holding C's sums: the promoted ones, or the accumulators."""
        return total if promoting else acc

    def scale_d(kk: Any, keep: Any) -> Any:
        """wgmma's scale-d (false: D = A·B) for instruction ``kk`` of a k step."""
        return T.Or(kk > 0, keep) if promoting else T.bool(True)

    def kept(kt: Any) -> Any:
        """Whether k step ``kt``'s first wgmma adds to the accumulators (not after a promotion)."""
        return kt % promote != 0 if promote else T.bool(True)

    @T.macro
    def promotion(acc: Any, total: Any, kt: Any) -> None:
        """At the last k step of every ``promote``: the accumulators into ``total`` (every wgmma retired)."""
        if kt % promote == promote - 1:
            T.ptx["wgmma.wait_group.sync.aligned"](0)
            for i in T.unroll(n_acc):
                total[i] = total[i] + acc[i]

    @T.macro
    def mma_stage(base: Any, acc: Any, cur: Any, wg: Any, keep: Any) -> None:
        """The warpgroup's 64 rows times the stage at ``cur`` (elements): bk / k_inst wgmma, one
        group; ``keep`` false: the first one starts the accumulators afresh."""
        T.ptx["wgmma.fence.sync.aligned"]()
        for kk in T.unroll(bk // k_inst):
            T.ptx[mma](*[acc[i] for i in range(n_acc)], desc(base, cur + wg * 64 * bk + kk * k_inst),
                       desc(base, cur + a_stage + kk * 16 * 64, bk * 128) if n_major
                       else desc(base, cur + a_stage + kk * k_inst), scale_d(kk, keep), 1, 1,
                       *(() if tf32 else (0, int(n_major))))
        T.ptx["wgmma.commit_group.sync.aligned"]()

    @T.macro
    def load_iteration(smem: Any, A: Any, Bt: Any, bid: Any, it: Any, tx: Any) -> None:
        """Iteration ``it`` of a block of several tiles: k tile it % k_tiles of its
        (it // k_tiles)-th tile (tile bid + that x grid), into stage it % stages."""
        load_stage(smem, A, Bt, it % stages * stage, global_kt(bid + it // k_tiles * grid, it % k_tiles),
                   tile_lead(bid + it // k_tiles * grid),
                   tile_row0(bid + it // k_tiles * grid), tile_col0(bid + it // k_tiles * grid), tx)

    @T.macro
    def store_unit(smem: Any, C: Any, bias: Any, sums: Any, unit: Any, at: Any, row0: Any, col0: Any, wg: Any,
                   tx: Any, piece: Any, copy_row0: Any, copy_base: Any, copy_threads: Any, lane: Any) -> None:
        """Unit ``unit``'s sums stored after its k loop: a K slice's float32 sums, or C through
        the epilogue, staged in shared memory (``wgmma_smem_epilogue``: the warpgroup's 64 rows from
        ``piece``) or directly.  The staged C goes out 16 bytes a thread, whole rows a warp:
        thread ``lane`` of ``copy_threads`` copies the rows from ``copy_base`` to C's from
        ``copy_row0`` (the whole tile, or the warpgroup's own rows)."""
        if split > 1:
            partial_store(C, sums, unit, at, row0, col0, wg, tx)
        elif smem_epilogue:
            T.tvm_storage_sync("shared")  # every warpgroup's wgmma has retired: the stages are free
            stage_c(smem, piece, sums, bias, at, row0, col0, wg, tx)
            T.tvm_storage_sync("shared")
            for i in T.unroll(c_loads):
                f = T.meta_var(i * copy_threads + lane)
                for v in T.vectorized(8):
                    C[(*at, copy_row0 + f // (bn // 8), col0 + f % (bn // 8) * 8 + v)] = \
                        smem[copy_base + f // (bn // 8) * c_stride + f % (bn // 8) * 8 + v]
        else:
            direct_store(C, bias, sums, at, row0, col0, wg, tx)

    @T.macro
    def gemm_tiles(A: Any, Bt: Any, bias: Any, C: Any) -> None:
        """Several tiles a block: one pipeline over the block's tiles' k steps in turn
        (iteration j of its n-th tile: n x k_tiles + j), the loads ``ahead`` iterations ahead
        across tile boundaries, so the next tile's first stages load during this one's last
        k steps and its store.  The store follows the k loop and a full wgmma wait (touching
        the accumulators inside the loop would make ptxas serialise every wgmma)."""
        with T.launch_thread("blockIdx.x", grid) as bid:
            with T.launch_thread("threadIdx.x", threads) as tx:
                smem = T.alloc_buffer((stages * stage,), in_dtype, scope="shared.dyn", align=1024)
                acc = T.alloc_buffer((n_acc,), "float32", scope="local")
                total = T.alloc_buffer((total_size,), "float32", scope="local")  # promoted sums
                wg = tx // 128
                base = T.cuda.cvta_generic_to_shared(smem.ptr_to([0]))
                mine = T.meta_var((units - 1 - bid) // grid + 1)  # units of this block
                for s in T.unroll(ahead):  # prologue: iterations 0 .. ahead-1
                    if s < mine * k_tiles:
                        load_iteration(smem, A, Bt, bid, s, tx)
                    T.ptx["cp.async.commit_group"]()
                for t in T.serial(mine):
                    row0 = T.meta_var(tile_row0(bid + t * grid))
                    col0 = T.meta_var(tile_col0(bid + t * grid))
                    at = T.meta_var(tile_lead(bid + t * grid))
                    for i in T.unroll(n_acc):
                        acc[i] = T.float32(0)
                        if promoting:
                            total[i] = T.float32(0)
                    for kt in T.serial(k_tiles):
                        T.ptx["cp.async.wait_group"](ahead - 1)  # this iteration's stage has landed (this thread's)
                        T.ptx["fence.proxy.async.shared::cta"]()
                        T.tvm_storage_sync("shared")  # everyone's copies; the wgmma ``inflight`` + 1 back retired
                        mma_stage(base, acc, (t * k_tiles + kt) % stages * stage, wg, kept(kt))
                        if t * k_tiles + kt + ahead < mine * k_tiles:  # refill the stage that retired wgmma read
                            load_iteration(smem, A, Bt, bid, t * k_tiles + kt + ahead, tx)
                        T.ptx["cp.async.commit_group"]()
                        T.ptx["wgmma.wait_group.sync.aligned"](inflight)
                        if promoting:
                            promotion(acc, total, kt)
                    T.ptx["wgmma.wait_group.sync.aligned"](0)
                    # C staged in the stages of this tile's last 1 + inflight k steps (not refilled), each
                    # warpgroup its own 64 rows
                    last = T.meta_var(t * k_tiles + k_tiles - 1)
                    piece = T.meta_var((last - wg // pieces) % stages * stage + wg % pieces * 64 * c_stride)
                    store_unit(smem, C, bias, summed(total, acc), bid + t * grid, at, row0, col0, wg, tx, piece,
                               row0 + wg * 64, piece, 128, tx % 128)

    @T.macro
    def gemm(A: Any, Bt: Any, bias: Any, C: Any) -> None:
        with T.launch_thread("blockIdx.x", units) as bid:
            if clustered:
                T.launch_thread("clusterCtaIdx.x", split)
            with T.launch_thread("threadIdx.x", threads) as tx:
                smem = T.alloc_buffer((stages * stage,), in_dtype, scope="shared.dyn", align=1024)
                acc = T.alloc_buffer((n_acc,), "float32", scope="local")
                total = T.alloc_buffer((total_size,), "float32", scope="local")  # promoted sums
                row0 = tile_row0(bid)
                col0 = tile_col0(bid)
                at = T.meta_var(tile_lead(bid))
                wg = tx // 128
                base = T.cuda.cvta_generic_to_shared(smem.ptr_to([0]))
                for i in T.unroll(n_acc):
                    acc[i] = T.float32(0)
                    if promoting:
                        total[i] = T.float32(0)
                for s in T.unroll(ahead):  # prologue: tiles 0 .. ahead-1
                    load_stage(smem, A, Bt, s * stage, global_kt(bid, s), at, row0, col0, tx)
                    T.ptx["cp.async.commit_group"]()
                for kt in T.serial(k_tiles):
                    T.ptx["cp.async.wait_group"](ahead - 1)  # tile kt has landed (this thread's copies)
                    T.ptx["fence.proxy.async.shared::cta"]()  # generic-proxy writes -> wgmma's async proxy
                    T.tvm_storage_sync("shared")  # everyone's copies; every wgmma of tile kt-1-inflight retired
                    mma_stage(base, acc, kt % stages * stage, wg, kept(kt))
                    if kt + ahead < k_tiles:  # refill the stage that tile kt-1-inflight used
                        nxt = (kt + ahead) % stages * stage
                        load_stage(smem, A, Bt, nxt, global_kt(bid, kt + ahead), at, row0, col0, tx)
                    T.ptx["cp.async.commit_group"]()  # possibly empty: keeps the group count uniform
                    T.ptx["wgmma.wait_group.sync.aligned"](inflight)  # tile kt-inflight's wgmma retired
                    if promoting:
                        promotion(acc, total, kt)
                T.ptx["wgmma.wait_group.sync.aligned"](0)
                if clustered:
                    cluster_sum(smem, base, C, bias, summed(total, acc), bid, at, row0, col0, wg, tx)
                else:  # C staged from the stages' start, the block's threads copying the whole tile
                    store_unit(smem, C, bias, summed(total, acc), bid, at, row0, col0, wg, tx, wg * 64 * c_stride,
                               row0, 0, threads, tx)

    @T.macro
    def units_gemm(A: Any, Bt: Any, bias: Any, C: Any) -> None:
        """The wgmma kernel: a unit a block, or several (``gemm_tiles``)."""
        if cfg.tiles > 1:
            gemm_tiles(A, Bt, bias, C)
        else:
            gemm(A, Bt, bias, C)

    @T.macro
    def run(A: Any, Bt: Any, bias: Any, C: Any) -> None:
        """The kernel, or with K split, the kernel into float32 sums of the slices, then their total
        through the epilogue (``add_slices``)."""
        if split > 1 and not clustered:
            P = T.alloc_buffer((split, *c_shape), "float32", scope="global")
            units_gemm(A, Bt, bias, P)
            add_slices(P, bias, C)
        else:
            units_gemm(A, Bt, bias, C)

    if has_bias:
        @T.prim_func
        def main_bias(A: T.Buffer(a_shape, in_dtype), Bt: T.Buffer(bt_shape, in_dtype),
                      bias: T.Buffer((n,), bias_dtype),
                      C: T.Buffer(c_shape, c_dtype)):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            run(A, Bt, bias, C)

        return main_bias

    if prepare is not None:
        a_in, b_in, in_dtype_of_inputs, fill = prepare.a_shape, prepare.b_shape, prepare.dtype, prepare.macro

        @T.prim_func(check_well_formed=False)
        def main_prepared(A_in: T.Buffer(a_in, in_dtype_of_inputs), B_in: T.Buffer(b_in, in_dtype_of_inputs),
                          C: T.Buffer(c_shape, c_dtype)):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            A = T.alloc_buffer(a_shape, in_dtype, scope="global")
            Bt = T.alloc_buffer(bt_shape, in_dtype, scope="global")
            fill(A_in, B_in, A, Bt)
            run(A, Bt, None, C)

        if epilogue is None:
            s_tir.analysis.verify_well_formed(main_prepared)
        return main_prepared

    # checked below: an epilogue may read buffers that the caller makes parameters of a function
    # of its own (the parser evaluates the decorator's arguments as constants, so it cannot say so)
    @T.prim_func(check_well_formed=False)
    def main(A: T.Buffer(a_shape, in_dtype), Bt: T.Buffer(bt_shape, in_dtype), C: T.Buffer(c_shape, c_dtype)):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        run(A, Bt, None, C)

    if epilogue is None:
        s_tir.analysis.verify_well_formed(main)
    return main
