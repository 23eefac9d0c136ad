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
global memory. K must divide the tile but where the TMA loads a 16-bit tile, K unsplit (the last k
step's columns past K read as zeros: DeepSpeech2's 1760); an M that bm does not divide (a token
count) is guarded in the unsplit kernel and where a cluster adds K's slices: the last tile row's
loads past M read rows below it again (row mod M; zeros where the TMA loads them, or with M below
one tile the TMA's box only M's rows) and its stores stop at M; an even N that bn does not divide
(a vocabulary of 30522), the same with Bt stored (N, K) and K unsplit: its last tile column's rows
of Bt past N read rows below it again (zeros where the TMA loads them; with B stored (K, N) only
the TMA's zeros, N a multiple of 8), its stores stop at N (C staged in shared memory only where N
is a multiple of 8, as 1000 classes: its 16-byte chunks are whole and aligned).

``wgmma_tma`` loads the stages by the Tensor Memory Accelerator, ``wgmma_ws`` specializes a
producer warpgroup (``wgmma_specialized``), ``wgmma_multicast`` pairs its blocks in clusters that
share an operand's tile, and ``wgmma_pdl`` launches every kernel early behind the kernel ahead,
which it waits for before its first global access (the knobs' texts below).

``wgmma_gemm`` checks the tile and assembles the kernel from its steps in ``wgmma_steps`` (the
layout derived once, then staging, the wgmma of a k step, the stores, the cluster's and the second
kernel's sums of K slices, the kernels' launch and k loops, the PrimFunc).

Measurements: ``docs/results/gemm.md`` (wgmma sections).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from tvm_ext.core.errors import TvmExtError
from tvm_ext.hardware import WGMMA_SHARED_BYTES, has_wgmma, max_dynamic_smem, sm_90a  # noqa: F401 (sm_90a re-exported)
from tvm_ext.measure.program import CompiledProgram, compile_module_program
from tvm_ext.core.space import Config, Knob
from tvm_ext.lowering.launch_early import mark_launch_early
from tvm_ext.target import TargetInfo

from .wgmma_layout import (K_MAJOR_ONLY, OPERAND_STORAGE, OPERANDS, KernelLayout, b_shape,  # noqa: F401
                           k_turn_sums_bytes, n_atom, own_c_stage_bytes, stage_barrier_bytes)
from .wgmma_specialized import CONSUMER_REGISTERS, specialized_registers
from .wgmma_steps import CValue, OwnStore, Prepare, kernels, prim_func

BK = 64  # the k step: 64 halves = one 128-byte swizzle row
# B's layouts: "NK" = Bt (N, K), K-major (a Linear weight), read as stored; "KN" = B (K, N), read
# N-major (wgmma's transposed-B mode: 64-wide N atoms of 128-byte rows, one row per k; where bn is
# no multiple of 64, 32-wide atoms of 64-byte rows)
B_LAYOUTS = ("NK", "KN")
SHARED_LIMIT = WGMMA_SHARED_BYTES  # dynamic shared memory a block may have on sm_90
REGISTERS_PER_SM = 65536
# registers a thread needs beside its bn/2 accumulators (a 256x192 tile of 512 threads ran at the
# 128-register cap; 256x256 failed to launch)
OTHER_REGISTERS = 32
THREAD_REGISTERS = 255  # the most registers a thread may have
TILES_PER_BLOCK = (1, 2, 3, 4, 6, 8, 12, 16)  # the knob wgmma_tiles's choices
SPLITS_OF_K = (1, 2, 3, 4, 6, 8)  # the knob wgmma_split_k's choices
KNOBS = (
    Knob("wgmma_bm", (64, 128, 256), "block rows: wgmma_bm / 64 warpgroups of 128 threads, 64 rows each"),
    Knob("wgmma_bn", (64, 128, 192, 256, 96, 160, 32), "block columns = the N of each m64nNk16 wgmma (96, 160 "
                                                        "and 32: with B stored (K, N) in N atoms of 32 columns, "
                                                        "64-byte swizzled; last, so the other values keep their "
                                                        "indices in saved models; 160 and 32 divide N where no "
                                                        "other does, as a GRU's 3H = 5280)"),
    Knob("wgmma_stages", (2, 3, 4, 5, 6, 8), "shared-memory stages of the A and Bt tiles (cp.async, 128-byte swizzle)"),
    Knob("wgmma_inflight", (0, 1), "wgmma groups left outstanding at the end of a k step (wait_group N)"),
    Knob("wgmma_smem_epilogue", (0, 1), "1: C staged through shared memory for 16-byte coalesced stores"),
    Knob("wgmma_raster", (0, 2, 4, 8),
         "0: blocks in row-major tile order; G: column-major within groups of G tile rows"),
    Knob("wgmma_tiles", TILES_PER_BLOCK,
         "C tiles a block computes in turn (tiles b, b + grid, ...), its cp.async pipeline running on from one "
         "tile's k steps into the next's (no refill at each tile's start); the shared-memory epilogue then stages C "
         "in the stages the next tile's loads leave free", before=1),
    Knob("wgmma_split_k", SPLITS_OF_K,
         "slices of K: each C tile's k steps split over that many units (more blocks where C has few tiles), "
         "their float32 sums added by a second kernel that applies the epilogue", before=1),
    Knob("wgmma_split_cluster", (0, 1),
         "with K split: 1: a tile's slices run as one thread-block cluster (Hopper) and add their sums through "
         "distributed shared memory, each block the epilogue of its share of the tile's rows (one kernel, no "
         "sums in global memory); 0: float32 sums to global memory, added by a second kernel", before=0),
    Knob("wgmma_tma", (0, 1),
         "1: a stage's A and Bt tiles loaded by the Tensor Memory Accelerator (one thread issues both boxes, "
         "a barrier a stage counts their bytes; tensor maps encoded on the host) instead of every thread's "
         "16-byte cp.async", before=0),
    Knob("wgmma_ws", (0, 1),
         "1 (with wgmma_tma): warp specialization, a producer warpgroup (one thread issuing the TMA loads, its "
         "registers given up by setmaxnreg) ahead of the consumer warpgroups, which wait for a stage's barrier, "
         "multiply and release the stage on a barrier of its own: no block barrier in the k loop", before=0),
    Knob("wgmma_multicast", (0, 1),
         "1 (with wgmma_ws): blocks in thread-block clusters of two computing adjacent tiles, which share an "
         "operand's tile (A's in row-major order, raster 0; Bt's within raster groups); each block's producer "
         "loads half of it and the TMA multicasts that half into both blocks: a quarter or more less read "
         "from L2 a stage, as cuBLAS's Hopper kernels run", before=0),
    Knob("wgmma_pdl", (0, 1),
         "1: programmatic dependent launch: each kernel lets the next one on the stream launch at its start and "
         "is itself launched early, waiting (griddepcontrol.wait) for the kernel ahead of it only after its "
         "barriers' init, before its first global access: back-to-back kernels overlap launch and prologue "
         "with the tail of the one ahead", before=0),
    Knob("wgmma_wg_cols", (1, 2),
         "2 (with wgmma_ws, Bt stored (N, K)): two consumer warpgroups a 64-row band of the tile, each multiplying "
         "its half of the tile's columns (m64n(bn/2) wgmma on the same A): two chains of wgmma in flight where one "
         "warpgroup would issue one, as cuBLAS's Hopper kernels run a 64x96 tile on 384 threads (slower than one "
         "consumer at BERT-base's shapes: no pick takes it)", before=1),
    Knob("wgmma_wg_k", (1, 2),
         "2 (with wgmma_ws, one 64-row band, K unsplit, sums not promoted): two consumer warpgroups on the tile, "
         "taking its k steps in turn (the even ones and the odd ones, each into accumulators of its own, each "
         "releasing the stages it read), the second's sums added into the first's through shared memory before "
         "the first stores C: two independent chains of wgmma on one tile at the cost of one m64nN fragment of "
         "shared memory (slower than one consumer at BERT-base's shapes: no pick takes it)", before=1),
    Knob("wgmma_c_turns", (0, 1),
         "1 (C staged by the warp-specialized kernel's two consumer warpgroups): C's own stage holds 64 rows, "
         "which the consumers fill and copy out in turn (the second waits for the first's copy at a named "
         "barrier): half the shared memory, so a 128x256 tile keeps 4 stages beside it", before=0),
)
# the probe's best at 4096^3 first, then smaller tiles for shapes it does not divide; 256x192 was
# slightly faster at the GRU's projection 8192x3072x1024, but no better where 128x256 also divides;
# 64x64 takes 8 stages, faster than 4-6 at 64x3072x1024 (a GRU step's hidden GEMM); the timings:
# docs/results/gemm.md
DEFAULT_TILES = ((128, 256, 4, 1, 1, 0), (256, 192, 4, 1, 1, 4), (256, 128, 4, 1, 1, 0), (128, 128, 6, 1, 1, 0),
                 (128, 64, 6, 1, 1, 0), (64, 64, 8, 1, 1, 0))
# tried first where no default tile divides N and B is stored (K, N) (its last tile column guarded only
# where the TMA loads it): a GRU's 3H where H is no multiple of 64, as 5280 of DeepSpeech2's H1760
COLUMN_DIVISOR_TILES = ((128, 160, 4, 1, 1, 0), (128, 96, 6, 1, 1, 0), (128, 32, 8, 1, 1, 0))
# operands whose K need not divide the k step: loaded by the TMA, which reads past K as zeros
RAGGED_K_OPERANDS = ("float16", "bfloat16")


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
    tma: bool = False  # stages loaded by the Tensor Memory Accelerator, a barrier each
    specialized: bool = False  # a producer warpgroup issuing the loads, the others multiplying (``wgmma_ws``)
    multicast: bool = False  # clusters of two blocks sharing one operand's tile by TMA multicast (``wgmma_multicast``)
    pdl: bool = False  # launched early behind the kernel ahead, waiting for it before global access (``wgmma_pdl``)
    wg_cols: int = 1  # consumer warpgroups across the tile's columns, each bn / wg_cols of them (``wgmma_wg_cols``)
    c_turns: bool = False  # C's own stage 64 rows, the consumer warpgroups' in turn (``wgmma_c_turns``)
    wg_k: int = 1  # consumer warpgroups taking a 64-row tile's k steps in turn (``wgmma_wg_k``)
    ends: int = 1  # 2: row-major tile rows from both ends in turn (``in_row_order``; no knob)

    @property
    def bk(self) -> int:
        """The k step: one 128-byte swizzle row of the operand's elements."""
        return 128 // OPERANDS.get(self.operand, 2)

    @classmethod
    def of(cls, config: Config, operand: str = "float16") -> "WgmmaTile":
        c = config.as_dict()
        return cls(c["wgmma_bm"], c["wgmma_bn"], c["wgmma_stages"], c["wgmma_inflight"], bool(c["wgmma_smem_epilogue"]),
                   c["wgmma_raster"], tiles=c.get("wgmma_tiles", 1), split=c.get("wgmma_split_k", 1),
                   cluster=bool(c.get("wgmma_split_cluster", 0)), operand=operand, tma=bool(c.get("wgmma_tma", 0)),
                   specialized=bool(c.get("wgmma_ws", 0)), multicast=bool(c.get("wgmma_multicast", 0)),
                   pdl=bool(c.get("wgmma_pdl", 0)), wg_cols=c.get("wgmma_wg_cols", 1),
                   c_turns=bool(c.get("wgmma_c_turns", 0)), wg_k=c.get("wgmma_wg_k", 1))

    def knobs(self) -> dict[str, int]:
        """The knob values of this tile (``of``'s inverse)."""
        return dict(wgmma_bm=self.bm, wgmma_bn=self.bn, wgmma_stages=self.stages, wgmma_inflight=self.inflight,
                    wgmma_smem_epilogue=int(self.smem_epilogue), wgmma_raster=self.raster, wgmma_tiles=self.tiles,
                    wgmma_split_k=self.split, wgmma_split_cluster=int(self.cluster), wgmma_tma=int(self.tma),
                    wgmma_ws=int(self.specialized), wgmma_multicast=int(self.multicast), wgmma_pdl=int(self.pdl),
                    wgmma_wg_cols=self.wg_cols, wgmma_c_turns=int(self.c_turns), wgmma_wg_k=self.wg_k)

    @property
    def name(self) -> str:
        return (f"wgmma {'' if self.operand == 'float16' else self.operand + ' '}{self.bm}x{self.bn}x{self.bk} "
                f"s{self.stages} w{self.inflight} "
                f"{'smem' if self.smem_epilogue else 'direct'}{f' r{self.raster}' if self.raster else ''}"
                f"{f' t{self.tiles}' if self.tiles > 1 else ''}{f' k/{self.split}' if self.split > 1 else ''}"
                f"{' cluster' if self.cluster else ''}{' tma' if self.tma else ''}{' ws' if self.specialized else ''}"
                f"{' multicast' if self.multicast else ''}{' pdl' if self.pdl else ''}"
                f"{f' c{self.wg_cols}' if self.wg_cols > 1 else ''}{' turns' if self.c_turns else ''}"
                f"{f' kw{self.wg_k}' if self.wg_k > 1 else ''}{' ends' if self.ends == 2 else ''}")

    @property
    def threads(self) -> int:
        """The threads that multiply: a warpgroup for each 64-row band, share of the columns and
        turn of the k steps."""
        return self.bm // 64 * self.wg_cols * self.wg_k * 128

    @property
    def acc_registers(self) -> int:
        """float32 accumulators a multiplying thread holds: its warpgroup's m64n(bn / wg_cols) fragment."""
        return self.bn // self.wg_cols // 2

    def stage_bytes(self) -> int:
        """One stage's A and Bt tiles: a 128-byte row of k a row of the tile."""
        return (self.bm + self.bn) * 128

    def smem_bytes(self) -> int:
        """The stages' shared memory (with ``tma``, their barriers follow: ``barrier_bytes``)."""
        return self.stages * self.stage_bytes()

    def barrier_bytes(self) -> int:
        """Shared memory of the stages' barriers, after the stages (``stage_barrier_bytes``)."""
        return stage_barrier_bytes(self.stages, self.tma, self.specialized)

    @property
    def staged_apart(self) -> bool:
        """C staged in shared memory of its own, past the stages: the warp-specialized kernel's
        staged epilogue (its producer refills every stage while the consumers store)."""
        return self.specialized and self.smem_epilogue

    @property
    def c_stage_rows(self) -> int:
        """Rows of C's own stage: the tile's, or one warpgroup's 64 taken in turn (``c_turns``)."""
        return 64 if self.c_turns else self.bm

    def c_stage_bytes(self) -> int:
        """That shared memory (``staged_apart``; else 0): ``c_stage_rows`` of C in 2-byte elements,
        128-byte aligned from the barriers' end, rows padded by 8 columns where bn is no multiple
        of 64 (else their 16-byte chunks swizzled)."""
        return own_c_stage_bytes(self.c_stage_rows if self.staged_apart else 0, self.bn)

    def block_smem_bytes(self) -> int:
        """A block's dynamic shared memory: the stages, their barriers, C's own stage and the
        second consumer's sums where two take the k steps in turn (``k_turn_sums_bytes``)."""
        return self.smem_bytes() + self.barrier_bytes() + self.c_stage_bytes() + k_turn_sums_bytes(self.wg_k,
                                                                                                    self.bn)

    def cluster_sum_bytes(self) -> int:
        """Shared memory of the float32 tile a block of a cluster sums from (rows padded by 8)."""
        return self.bm * (self.bn + 8) * 4

    def c_pieces_per_stage(self) -> int:
        """Warpgroups' C (64 rows of bn halves, padded by 8) one stage's shared memory holds."""
        return self.stage_bytes() // (64 * (self.bn + 8) * 2)


def b_layout_reason(b_layout: str) -> str | None:
    """Why ``b_layout`` is no layout of B the kernel reads (one line), or None."""
    return None if b_layout in B_LAYOUTS else f"B layout {b_layout!r}; allowed: {', '.join(B_LAYOUTS)}"


def k_steps(t: WgmmaTile, k: int) -> int:
    """The k steps of ``t`` over K: the last one partly past K where K is ragged (the TMA reads
    its columns past K as zeros, ``RAGGED_K_OPERANDS``)."""
    return -(-k // t.bk)


def wgmma_reason(t: WgmmaTile, m: int, n: int, k: int, shared_limit: int = SHARED_LIMIT,
                 b_layout: str = "NK", own_store: bool = False) -> str | None:
    """Why tile ``t`` cannot run an (m, n, k) GEMM with B laid out as ``b_layout`` (one line), or None.
    ``own_store``: a caller's store from the registers (``OwnStore``) takes C, not 16-byte chunks."""
    layout = b_layout_reason(b_layout)
    if layout:
        return layout
    if t.operand not in OPERANDS:
        return f"wgmma operand {t.operand!r}; allowed: {', '.join(OPERANDS)}"
    if t.operand in K_MAJOR_ONLY and (b_layout != "NK" or (t.smem_epilogue and not t.specialized)):
        return (f"{t.name}: {t.operand} operands are read K-major only (B as Bt (N, K)), C stored directly "
                "(smem epilogue 0) but by the warp-specialized kernel")
    if b_layout == "KN" and t.bn % 32:
        return f"{t.name}: B stored (K, N) is read in N atoms of 64 or 32 columns: bn must be a multiple of 32"
    if t.bm % 64 or t.bn % 8 or not 8 <= t.bn <= 256 or t.inflight not in (0, 1):
        return f"{t.name}: needs bm a multiple of 64, bn in 8..256 (multiple of 8), inflight 0 or 1"
    if t.wg_cols not in (1, 2) or (t.wg_cols > 1 and (not t.specialized or b_layout != "NK" or t.bn % 32)):
        return (f"{t.name}: consumer warpgroups split the columns (wgmma_wg_cols {t.wg_cols}) in two at most, in the "
                "warp-specialized kernel (wgmma_ws 1) on Bt stored (N, K), each a multiple of 16 columns")
    if t.threads * (t.acc_registers + OTHER_REGISTERS) > REGISTERS_PER_SM:
        return (f"{t.name}: {t.threads} threads x ({t.acc_registers} accumulator + ~{OTHER_REGISTERS} other "
                f"registers) > {REGISTERS_PER_SM} registers (an SM's; the launch fails)")
    if t.wg_k not in (1, 2) or (t.wg_k > 1 and (not t.specialized or t.bm != 64 or t.wg_cols > 1 or t.split > 1
                                                  or t.multicast or k_steps(t, k) % 2)):
        return (f"{t.name}: consumer warpgroups take the k steps in turn (wgmma_wg_k {t.wg_k}) two at most, in the "
                "warp-specialized kernel (wgmma_ws 1) on one 64-row band (bm 64), its columns unsplit, K unsplit, "
                "no multicast, an even count of k steps")
    if t.stages < 2 + t.inflight:
        return f"{t.name}: needs at least {2 + t.inflight} stages with {t.inflight} wgmma group(s) in flight"
    if k % t.bk and not (t.tma and t.split == 1 and t.operand in RAGGED_K_OPERANDS):
        return (f"{t.name}: K ({k}) must divide the tile's k step {t.bk} but on a 16-bit tile the TMA loads, K "
                "unsplit (its last k step's columns past K read as zeros; M and N are guarded)")
    if t.tma and k * OPERANDS.get(t.operand, 2) % 16:
        return (f"{t.name}: the TMA reads rows of 16-byte multiples: K ({k}) must be a multiple of "
                f"{16 // OPERANDS.get(t.operand, 2)}")
    steps = k_steps(t, k)
    guards_n = b_layout == "NK" or (t.tma and n % 8 == 0)  # B (K, N): the TMA reads its columns past N as zeros
    if n % t.bn and (not guards_n or (t.smem_epilogue and n % 8) or t.split > 1 or n % 2):
        return (f"{t.name}: N = {n} is no multiple of bn {t.bn}: its last tile column is guarded with Bt stored "
                "(N, K), or B stored (K, N) loaded by the TMA with N a multiple of 8, K unsplit and an even N, "
                "staged through shared memory only where N is a multiple of 8 (16-byte rows; else "
                "wgmma_smem_epilogue 0)")
    if m % t.bm and t.split > 1 and not t.cluster:
        return (f"{t.name}: M = {m} is no multiple of bm {t.bm}: its last rows are guarded in the unsplit kernel "
                "and where a cluster adds K's slices (wgmma_split_k 1, or wgmma_split_cluster 1)")
    if t.split not in SPLITS_OF_K or steps % t.split:
        return (f"{t.name}: K's {steps} steps of {t.bk} must split into {t.split} equal slices "
                f"(allowed: {', '.join(map(str, SPLITS_OF_K))})")
    if t.tiles == 1 and t.stages - 1 - t.inflight > steps // t.split:
        return (f"{t.name}: its prologue loads {t.stages - 1 - t.inflight} k tiles ahead, past K's "
                f"{steps // t.split} (reads beyond A and B): at most {steps // t.split + 1 + t.inflight} "
                "stages here")
    if t.split > 1 and t.smem_epilogue:
        return f"{t.name}: a split K stores float32 sums straight to global memory (use wgmma_smem_epilogue 0)"
    if t.cluster and (t.split == 1 or t.tiles > 1 or t.bm % t.split):
        return (f"{t.name}: a cluster adds the slices of K of one tile (wgmma_split_k > 1, wgmma_tiles 1), each block "
                f"{t.bm} / {t.split} of its rows: the split must divide bm")
    if t.cluster and t.cluster_sum_bytes() > t.smem_bytes():
        return (f"{t.name}: the tile's float32 sums ({t.cluster_sum_bytes()} bytes) do not fit in the stages' "
                f"shared memory ({t.smem_bytes()})")
    if t.raster < 0 or (t.raster and -(-m // t.bm) % t.raster):
        return f"{t.name}: the raster group ({t.raster}) must divide the {-(-m // t.bm)} tile rows"
    copied = not t.tma and ((t.bm * 8) % t.threads or (t.bn * 8) % t.threads)  # the TMA loads whole boxes
    if copied or (not own_store and (t.bm * t.bn // 8) % t.threads):
        return (f"{t.name}: the 16-byte chunks of C, and of a stage copied by cp.async, must split evenly over "
                f"{t.threads} threads")
    if t.block_smem_bytes() > shared_limit:
        return (f"{t.name}: {t.block_smem_bytes()} bytes of shared memory > {shared_limit} "
                "(the limit of a block)")
    if t.tiles < 1:
        return f"{t.name}: a block computes at least one tile"
    if t.specialized and (not t.tma or t.split > 1 or (t.smem_epilogue and t.wg_cols > 1)):
        return (f"{t.name}: warp specialization (wgmma_ws) has a producer warpgroup issue TMA loads (wgmma_tma 1), "
                "K unsplit, C staged (wgmma_smem_epilogue 1) by warpgroups of whole rows (wgmma_wg_cols 1)")
    if t.c_turns and (not t.staged_apart or t.bm // 64 != 2 or t.wg_cols > 1):
        return (f"{t.name}: C's stage taken in turn (wgmma_c_turns) is the warp-specialized kernel's staged C "
                "(wgmma_ws 1, wgmma_smem_epilogue 1) shared by its two consumer warpgroups (bm 128)")
    if t.specialized and specialized_registers(t.threads) > REGISTERS_PER_SM:
        return (f"{t.name}: warp specialization gives each of the {t.bm // 64} consumer warpgroups "
                f"{CONSUMER_REGISTERS} registers a thread (setmaxnreg): {specialized_registers(t.threads)} with the "
                f"producer's > {REGISTERS_PER_SM}, an SM's (the consumers would wait for them forever); bm 64 or 128")
    if t.multicast:
        reason = multicast_reason(t, m, n, b_layout)
        if reason:
            return reason
    if (t.tiles > 1 and t.smem_epilogue and not t.staged_apart
            and t.bm // 64 > (1 + t.inflight) * t.c_pieces_per_stage()):
        return (f"{t.name}: with several tiles a block stages C in the {1 + t.inflight} stage(s) the next tile's "
                f"loads leave free, {t.c_pieces_per_stage()} warpgroup(s) of 64 x {t.bn} a stage: too few for "
                f"{t.bm // 64}")
    if t.smem_epilogue and not t.staged_apart and t.bm * (t.bn + 8) * 2 > t.smem_bytes():
        return f"{t.name}: C ({t.bm}x{t.bn} halves, padded) does not fit in the stages' shared memory"
    return None


def multicast_reason(t: WgmmaTile, m: int, n: int, b_layout: str) -> str | None:
    """Why tile ``t`` cannot share an operand's tile between the two blocks of a cluster
    (``wgmma_multicast``) at an (m, n) C, or None: the warp-specialized kernel only; the two blocks
    compute adjacent tiles (b and b + 1 of each turn), which share A's tile where the tiles run in
    row-major order (an even count of tile columns) and Bt's within raster groups (Bt stored (N,
    K): its box is split by rows); each block the same count of tiles (a matrix's tiles a multiple
    of twice the tiles a block)."""
    if not t.specialized:
        return f"{t.name}: multicast pairs the producers of the warp-specialized kernel (wgmma_ws 1)"
    tiles = -(-m // t.bm) * -(-n // t.bn)
    if t.raster == 0 and -(-n // t.bn) % 2:
        return (f"{t.name}: in row-major order the two blocks of a cluster share A's tile: the tile columns "
                f"({-(-n // t.bn)}) must be even")
    if t.raster and b_layout != "NK":
        return f"{t.name}: within raster groups the two blocks share Bt's tile: Bt stored (N, K) only"
    if tiles % (2 * t.tiles):
        return (f"{t.name}: the two blocks of a cluster compute tiles in pairs, as many each: the {tiles} tiles "
                f"must divide into pairs of blocks of {t.tiles} tile(s)")
    return None


def pdl_reason(t: WgmmaTile, unwaited: bool) -> str | None:
    """Why tile ``t`` cannot launch its kernels early (``wgmma_pdl``), or None: ``unwaited``, the
    function has kernels that do not wait for the one ahead (prepared inputs' splits written
    before the GEMM, a counting GEMM's dependant launched while it runs)."""
    if t.pdl and unwaited:
        return (f"{t.name}: a kernel launched early (wgmma_pdl) waits for the kernel ahead of it; the other "
                "kernels of this function (prepared inputs' splits, a counting kernel's dependant) are not "
                "launched early: no wgmma_pdl here")
    return None


def fit_raster(t: WgmmaTile, m: int) -> WgmmaTile:
    """``t`` with the largest raster group of at most its own that divides M's tile rows (0 where
    none does): a config tuned at another M, where its raster would be refused."""
    rows = -(-m // t.bm)
    if not t.raster or rows % t.raster == 0:
        return t
    return replace(t, raster=next((g for g in (8, 4, 2) if g < t.raster and rows % g == 0), 0))


def promote_reason(t: WgmmaTile, k: int, promote: int, overlap: bool = False) -> str | None:
    """Why tile ``t`` cannot promote its sums every ``promote`` k steps of a depth-``k`` GEMM
    (``wgmma_gemm``'s ``promote``; 0: never), with ``overlap`` its windows in two accumulator
    sets (``wgmma_steps.k_loop``), or None."""
    if not promote:
        return "overlapping promotions needs promoted sums" if overlap else None
    sets = 3 if overlap else 2  # the promoted sums and one or two sets of bn / 2 accumulators
    registers = sets * t.acc_registers + OTHER_REGISTERS
    if registers > THREAD_REGISTERS or t.threads * registers > REGISTERS_PER_SM:
        return (f"{t.name}: promoting keeps {sets} sets of {t.acc_registers} accumulators, ~{registers} registers a "
                f"thread ({THREAD_REGISTERS} at most, {REGISTERS_PER_SM} a block): bn <= {'128' if overlap else '192'}")
    if promote < 0 or k_steps(t, k) // t.split % promote:
        return f"promoting every {promote} k steps must divide the {k_steps(t, k) // t.split} k steps of a slice"
    if t.wg_k > 1:
        return f"{t.name}: consumer warpgroups taking the k steps in turn (wgmma_wg_k 2) do not promote their sums"
    if overlap and t.inflight != 1:
        return (f"{t.name}: overlapping promotions adds a window's sums while the next window's first wgmma "
                f"runs: it needs one wgmma group in flight (wgmma_inflight 1)")
    return None


C_DTYPES = ("float16", "bfloat16", "float32")


def k_parts_reason(t: WgmmaTile, k: int, b_layout: str, k_parts: tuple[tuple[int, int], ...]) -> str | None:
    """Why tile ``t`` cannot take its k steps from operands stored as parts (``k_parts``), or None."""
    if not k_parts:
        return None
    if not t.tma or b_layout != "NK" or t.multicast or k % (len(k_parts) * t.bk):
        return (f"{t.name}: k steps from stored parts are loaded by the TMA (no multicast) from Bt (N, K), "
                f"each part a multiple of bk {t.bk} deep ({k} / {len(k_parts)})")
    return None


def gate_reason(t: WgmmaTile, n: int, b_layout: str, gates: int) -> str | None:
    """Why tile ``t`` cannot take its columns as three gates of ``gates`` units each
    (``KernelLayout.b_col``; with Bt stored (N, K) its rows already in that order, which the
    caller made) for a caller's own store from the registers (one line), or None.  A pair sharing
    A's tile by multicast loads B as a lone block does; sharing Bt's would split its gates' rows."""
    units, atom = t.bn // 3, n_atom(t.bn)
    atoms = b_layout == "NK" or units % atom == 0  # B (K, N) read by gate in whole N atoms
    if (b_layout not in B_LAYOUTS or n != 3 * gates or t.bn % 3 or not atoms or gates % units
            or (t.split > 1 and not t.cluster) or (t.multicast and t.raster) or t.smem_epilogue or t.wg_cols > 1
            or t.wg_k > 1):
        return (f"{t.name}: a tile of three gates' units reads B stored (K, N) of 3 x {gates} columns in whole N "
                f"atoms ({atom} columns; bn / 3 = {t.bn / 3:g} units a multiple of them and dividing {gates}), or "
                "Bt (N, K) with its rows in that order, K unsplit or split in a cluster, multicast only of A's tile "
                "(row-major tiles), stored from the registers by whole-column warpgroups (wgmma_smem_epilogue 0)")
    return None


def epilogue_reason(t: WgmmaTile, c_dtype: str) -> str | None:
    """Why tile ``t`` cannot store C as ``c_dtype`` (None: it can): the shared-memory epilogue
    stages C in the stages' own dtype, so C must be the operands' (float16 or bfloat16); the
    warp-specialized kernel's stage of its own takes either whatever the operands."""
    if c_dtype not in C_DTYPES:
        return f"the wgmma GEMM stores C as {', '.join(C_DTYPES[:-1])} or {C_DTYPES[-1]}, not {c_dtype}"
    if t.staged_apart:
        if c_dtype not in C_DTYPES[:-1]:
            return (f"{t.name}: the warp-specialized kernel stages {' or '.join(C_DTYPES[:-1])} C only (use "
                    "wgmma_smem_epilogue 0)")
        return None
    staged = OPERAND_STORAGE.get(t.operand, "float16")
    if t.smem_epilogue and c_dtype != staged:
        return (f"{t.name}: the shared-memory epilogue stages {staged} C only (the operands' dtype; use "
                f"wgmma_smem_epilogue 0)")
    return None


def epilogue_for(t: WgmmaTile, c_dtype: str) -> WgmmaTile:
    """``t`` storing C as ``c_dtype``: itself, or where it cannot stage that C (``epilogue_reason``:
    a float32 C, a Relax model's) the same tile storing C straight from its registers, no stage
    and none taken in turn."""
    if epilogue_reason(t, c_dtype) is None:
        return t
    return replace(t, smem_epilogue=False, c_turns=False)


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


def signal_reason(t: WgmmaTile, plain_bias: bool) -> str | None:
    """Why tile ``t`` cannot count its tile rows' stores (``wgmma_gemm``'s ``signal``), or None:
    the counted kernel is the one storing C (K unsplit, or split in a cluster) of a function
    ``main(A, Bt, bias, C)`` (``plain_bias``: one matrix, a bias, no epilogue of a caller's)."""
    if t.split > 1 and not t.cluster:
        return (f"{t.name}: a GEMM counting its stored tile rows stores C from its one kernel: K unsplit or "
                "split in a cluster")
    if t.specialized:
        return f"{t.name}: a GEMM counting its stored tile rows meets at a block barrier: no warp specialization"
    if not plain_bias:
        return "a GEMM counting its stored tile rows is main(A, Bt, bias, C, ready): one matrix with a bias"
    return None


def in_row_order(t: WgmmaTile, m: int, n: int, k: int, tiles: int, b_layout: str = "NK",
                 ends: int = 1) -> WgmmaTile:
    """``t`` with its C tiles stored tile row by tile row, for a kernel that reads C's rows in
    order while this one runs (``signal``): row-major, ``tiles`` a block, so that with ``tiles``
    dividing the tile rows block b computes column b % (n / bn) of every g-th tile row in turn
    (g = blocks / columns) and the tile rows are done in bands of g; ``ends`` 2: the rows from
    both ends in turn, for readers from the first and from the last; without the shared-memory
    epilogue where several tiles a block leave it no room (``wgmma_reason`` says what else)."""
    ordered = replace(t, raster=0, tiles=tiles, ends=ends)
    if wgmma_reason(ordered, m, n, k, b_layout=b_layout) is not None and ordered.smem_epilogue:
        return replace(ordered, smem_epilogue=False)
    return ordered


def row_order_divides(rows: int, columns: int, tiles: int) -> bool:
    """Whether ``tiles`` a block give every block of a row-ordered grid of ``rows`` x ``columns``
    tiles the same count: they divide the tile rows (each block keeps one column) or all the tiles
    (each round of the grid still stores one contiguous band of tiles in row order)."""
    return rows % tiles == 0 or rows * columns % tiles == 0


def row_order_tiles(t: WgmmaTile, m: int, n: int, max_blocks: int,
                    counts: tuple[int, ...] = TILES_PER_BLOCK) -> int:
    """The fewest tiles a block (of ``counts``) whose row-ordered grid has at most
    ``max_blocks`` blocks (the SMs another kernel leaves free): first of those dividing the tile
    rows (each block then keeps one column), else of those dividing all the tiles (the grid's k-th
    round still covers one contiguous band of tiles in row order: 14 tile rows of 48 at float32
    B7 H512, 12 a block); the most that divide the rows where none is that few; 1 where none does."""
    rows, columns = -(-m // t.bm), -(-n // t.bn)
    choices = sorted(x for x in counts if rows % x == 0)
    whole = sorted(x for x in counts if row_order_divides(rows, columns, x))
    return next((x for x in choices if columns * (rows // x) <= max_blocks),
                next((x for x in whole if rows * columns // x <= max_blocks), choices[-1] if choices else 1))


def compile_wgmma(func: Any, target: TargetInfo, config: Config) -> CompiledProgram:
    """A wgmma kernel compiled for sm_90a (wgmma is an arch-specific instruction); the config is
    its record (no schedule trace)."""
    return compile_module_program(func, sm_90a(target), {"lowered": "wgmma", "config": dict(config.items)})


def wgmma_gemm(cfg: WgmmaTile, m: int, n: int, k: int, c_dtype: str = "float16", bias_dtype: str | None = None,
               scale: float = 1.0, b_layout: str = "NK", epilogue: Callable[..., Any] | None = None,
               promote: int = 0, batch: Sequence[int] = (), b_batched: bool = True,
               prepare: "Prepare | None" = None, scales: bool = False, overlap: bool = False,
               signal: bool = False, bias_batched: bool = False, gates: int = 0,
               store: OwnStore | None = None, k_parts: tuple[tuple[int, int], ...] = ()) -> Any:
    """The PrimFunc ``main(A: (m, k), Bt: (n, k), C: (m, n) c_dtype)``, C = A @ Bt^T, or
    with ``bias_dtype`` ``main(A, Bt, bias: (n,), C)``, C = A @ Bt^T x ``scale`` + bias (the
    tile checked first: ``wgmma_reason``).  ``b_layout`` "KN": the second operand is B (k, n),
    C = A @ B, read N-major (``B_LAYOUTS``); with ``bias_batched`` the bias is (*batch, n), a row for
    each matrix of the batch (a bidirectional GRU's b_hh).  ``epilogue(value, row, col, lead)``: C's element for
    the float32 accumulator ``value`` at (row, col), as TIR (a Relax task's fused blocks, which
    may read buffers of their own: ``tvm_ext.relax.relax_wgmma``), in place of scale, bias and cast;
    ``lead``: its matrix's batch indices (none without a batch).
    ``batch``: leading axes of A, C and (``b_batched``, else B is shared) B: a GEMM per index, its
    C tiles numbered after the previous matrix's (attention's ``(batch, heads, seq, dim)`` products).
    ``prepare``: the function takes other inputs, from which its macro writes A and Bt into
    buffers of their own first (``gemm_3xtf32``'s splits: one function, several kernels).
    ``cfg.operand``: A's and Bt's dtype, float16 (``m64nNk16.f32.f16.f16``) or bfloat16
    (``.f32.bf16.bf16``, the same 2-byte swizzle and descriptors); "tf32": A and Bt are float32,
    multiplied as TF32 (``m64nNk8.f32.tf32.tf32``); "e4m3" or "e5m2": 8-bit floats
    (``m64nNk32.f32.e4m3.e4m3``), and with ``scales`` the function is ``main(A, Bt, scale_ab, C)``,
    C = A @ Bt^T x scale_ab[0] x scale_ab[1] (per-tensor scales, as ``torch._scaled_mm`` takes them).
    ``promote`` k steps (0: never): every that many, the wgmma accumulators are added into a
    second set with the CUDA cores' round-to-nearest adds and restart (the tensor cores'
    float32 accumulation drops low bits, an error growing with K: ``gemm_3xtf32``); ``overlap``:
    in two sets of accumulators, each window's adds behind the next one's first wgmma
    (``wgmma_steps.k_loop``; the same C).  ``signal``: ``main(A, Bt, bias, C, ready)``, the
    kernel letting the next one on the stream launch at its start and counting each tile row's
    stores in ``ready`` (int32, one a tile row and their total after them, zero before the call)
    until it reaches ``KernelLayout.signals_per_row`` (``wgmma_steps.row_signals``; ``signal_reason``).
    ``gates``: B's columns are three gates of that many units, each tile's a third of each
    (``KernelLayout.b_col``; with Bt (N, K) its rows are in that order already: ``gate_reason``),
    for ``store``: a caller's own store of the sums and the PrimFunc around it
    (``wgmma_steps.OwnStore``), in place of C's.  ``k_parts``: the k steps
    take (A part, B part) in turn from operands stored as parts of depth k / len(k_parts) side by
    side (``KernelLayout.k_coordinate``: 3xTF32's three products from two parts each, a part's tile
    read twice in a row); loaded by the TMA, Bt (N, K)."""
    reason = ((gate_reason(cfg, n, b_layout, gates) if gates or store is not None else None)
              or wgmma_reason(cfg, m, n, k, b_layout=b_layout, own_store=store is not None)
              or epilogue_reason(cfg, c_dtype)
              or promote_reason(cfg, k, promote, overlap)
              or (signal_reason(cfg, bias_dtype is not None and epilogue is None and prepare is None
                                and not scales and not batch) if signal else None))
    reason = reason or pdl_reason(cfg, prepare is not None or signal) or k_parts_reason(cfg, k, b_layout, k_parts)
    if reason:
        raise TvmExtError(reason)
    layout = KernelLayout.of(cfg, m, n, k, b_layout, batch, b_batched, promote, overlap, signal, gates, k_parts)
    if scales and (bias_dtype is not None or epilogue is not None or prepare is not None or cfg.split > 1):
        raise TvmExtError("per-tensor scales are the whole epilogue: no bias, epilogue, prepared inputs or split K")
    if bias_batched and (bias_dtype is None or not batch):
        raise TvmExtError("bias_batched: a bias row for each matrix of a batch needs a bias and a batch")
    out = CValue(c_dtype, scale, bias_dtype is not None, epilogue, scales, bias_batched, store)
    # an epilogue may read buffers that the caller makes parameters of a function of its own: not checked
    if store is not None:
        func = store.prim_func(layout, kernels(layout, out))
    else:
        func = prim_func(layout, kernels(layout, out), bias_dtype, prepare, c_dtype, checked=epilogue is None,
                         scales=scales, bias_batched=bias_batched)
    return mark_launch_early(func) if cfg.pdl else func
