"""The wgmma GEMM as a template: its default tile (``pick_wgmma_tile``: enough blocks for the
SMs, several C tiles a block past a wave, K split where C has too few tiles) and
``WgmmaGemmTemplate`` (``tune gemm-wgmma``, the Relax ``wgmma`` matcher's kernel).  The kernel
itself, its knobs and what refuses a tile are in ``schedules.wgmma``."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tvm_ext.core.errors import TvmExtError, check_sizes
from tvm_ext.measure.program import CompiledProgram
from tvm_ext.core.space import Config, Space
from tvm_ext.target import TargetInfo
from tvm_ext.core.template import Template, TensorSpec
from tvm_ext.hardware import SHARED_RESERVED_PER_BLOCK, WGMMA_SHARED_PER_SM

from .mma import COPY_BYTES
from .wgmma import (BK, COLUMN_DIVISOR_TILES, DEFAULT_TILES, KNOBS, OPERAND_STORAGE, RAGGED_K_OPERANDS, SHARED_LIMIT,
                    SPLITS_OF_K, TILES_PER_BLOCK, WgmmaTile, b_layout_reason, b_shape, compile_wgmma, epilogue_reason,
                    fit_raster, k_steps, shared_limit, target_reason, wgmma_gemm, wgmma_reason)

# the pick's split of K: at least this many k steps a slice (shorter slices ran slower than the
# unsplit kernels; docs/results/gemm.md), and taken only where the cost model (``split_cost``)
# puts it this far below the unsplit pick
MIN_SLICE_STEPS = 16
SPLIT_GAIN = 0.85
# a split the pick adds in a thread-block cluster (distributed shared memory, one kernel), on
# tiles of at least 128x128 (faster there than the split through global memory and a second
# kernel; clusters of 4 and 8, and small tiles, mostly slower; docs/results/models.md)
CLUSTER_SPLIT = 2
# the template's dtypes of A, B and C -> its check's tolerance: the output's rounding (float16's
# about 2e-4, bfloat16's about 2e-3) with room
DTYPES = {"float16": 2e-3, "bfloat16": 1e-2}


def runs(t: WgmmaTile, shapes: Any, limit: int, b_layout: str) -> bool:
    """Whether tile ``t`` runs every GEMM (M, N, K) of ``shapes`` (``wgmma_reason``)."""
    return all(wgmma_reason(t, m, n, k, limit, b_layout) is None for m, n, k in shapes)


def c_tile_count(t: WgmmaTile, shapes: Any, matrices: int = 1) -> int:
    """C tiles of ``t`` in the smallest of the GEMMs ``shapes`` (a batch of ``matrices`` each)."""
    return min(-(-m // t.bm) * -(-n // t.bn) for m, n, _ in shapes) * matrices


# a picked tile spends less than this share of a ragged M's tile rows past M (mma.sync's 16-row tiles
# take smaller M), and the first tile giving the SMs a block is taken only with at most the second
RAGGED_PADDING = 0.5
FIRST_PICK_PADDING = 0.125
# ``few_waves_pick``: problems where the largest tile makes fewer waves than this, the tiles it
# weighs (64x128 and 128x192 besides the default ones: the best at 700x3072x768 and at
# 1024x3072x768), and the shallowest pipeline it takes to make its blocks resident together
FEW_WAVES = 2
FEW_WAVES_TILES = DEFAULT_TILES + ((64, 128, 6, 1, 1, 0), (128, 192, 4, 1, 1, 0))
# and where M is a multiple of 64 and a tile runs at most NARROW_MAX_STEPS k steps, 64x96 with 8
# stages, warp-specialized where the TMA loads it (``narrow_specialized``; BERT-base's 1024x768x768
# and four shapes like it faster than cuBLAS; at a ragged 200x3072x768 it measured slower than the
# pick without it: docs/results/gemm.md)
NARROW_TILES = ((64, 96, 8, 1, 1, 0),)
NARROW_MAX_STEPS = 12
# and from NARROW_DEEP_STEPS k steps on, K whole, with Bt stored (N, K) where its tiles make one
# wave of at least 90 % of the SMs (``narrow_whole_wave``): faster than the picks it replaced at every
# depth measured, 16 to 128 k steps, and than the split-K pick at BERT-base's FFN down
# (docs/results/gemm.md); B (K, N) measured slower, shallower K and other tile counts unmeasured
NARROW_DEEP_STEPS = 16
MIN_RESIDENT_STAGES = 4
# the pick loads its stages by the TMA where a block runs at least this many k steps, with 16-bit
# operands: at 4096^3, 8192^3, the GRU's 8192x3072x1024 and BERT-base's FFN (24-48 k steps a
# block) it was 1.03-1.11x the cp.async kernel; at 1024x768x768 (one tile of 12 k steps a block)
# 0.94x, its one thread's prologue not paid back (docs/results/gemm.md); 8-bit and TF32 operands
# keep cp.async until measured; and with fewer k steps where each thread would issue at least
# TMA_MIN_CHUNKS 16-byte cp.async copies a stage (64x128 and 128x192 were faster by TMA at 12 k
# steps, 128x64 was not)
TMA_MIN_STEPS = 24
TMA_MIN_CHUNKS = 10
TMA_OPERANDS = ("float16", "bfloat16")
STAGE_CHOICES = tuple(sorted(next(k for k in KNOBS if k.name == "wgmma_stages").choices, reverse=True))


def padding(t: WgmmaTile, shapes: Any) -> float:
    """The largest share of the tile rows' rows past M (a ragged M's last tile row) over ``shapes``."""
    return max(1 - m / (-(-m // t.bm) * t.bm) for m, _, _ in shapes)


def column_padding(t: WgmmaTile, shapes: Any) -> float:
    """The largest share of the tile columns' columns past N (a ragged N's last tile column)."""
    return max(1 - n / (-(-n // t.bn) * t.bn) for _, n, _ in shapes)


SPREAD_WAVES_SLACK = 1.05  # ``spread_waves``: tile times within 5 % of the fewest count as level


def spread(t: WgmmaTile, shapes: Any, sm_count: int, limit: int = SHARED_LIMIT, b_layout: str = "NK",
           matrices: int = 1) -> WgmmaTile:
    """``t`` with the fewest C tiles a block (``wgmma_tiles``) that fit the GEMMs of ``shapes`` into
    one block an SM, in groups of the most tile rows (8, 4, 2) dividing them: a block's pipeline
    then runs on from tile to tile instead of refilling at each (faster than a block a tile at
    8192x3072x1024 and 4096^3; docs/results/gemm.md).  Where no choice fits one wave, the one
    whose waves of blocks take fewest tile times (``spread_waves``).  ``t`` where one wave holds
    every tile or no such variant runs the shapes."""
    count = c_tile_count(t, shapes, matrices) * t.split  # units
    tiles = next((c for c in TILES_PER_BLOCK if -(-count // c) <= sm_count), None) or spread_waves(count, sm_count)
    if tiles == 1:
        return t
    for raster in (8, 4, 2, 0):
        spread_tile = dataclasses.replace(t, tiles=tiles, raster=raster)
        if runs(spread_tile, shapes, limit, b_layout):
            return spread_tile
    return t


def spread_waves(count: int, sm_count: int) -> int:
    """The tiles a block (of ``TILES_PER_BLOCK``) for ``count`` C tiles where no choice holds them
    in one wave of ``sm_count`` blocks: the most tiles a block (fewest refills) whose waves take
    at most ``SPREAD_WAVES_SLACK`` more tile times (waves x tiles a block) than the fewest: at
    2304 tiles (the GRU's input GEMM at B96 H2048) 6 a block take three waves, 18 tile times, where
    16 a block take two, 32."""
    def tile_times(c: int) -> int:
        blocks = -(-count // c)
        return -(-blocks // sm_count) * c

    fewest = min(tile_times(c) for c in TILES_PER_BLOCK)
    return max(c for c in TILES_PER_BLOCK if tile_times(c) <= SPREAD_WAVES_SLACK * fewest)


def split_cost(t: WgmmaTile, shapes: Any, sm_count: int, matrices: int = 1) -> float:
    """A model of ``t``'s time, to weigh splits of K against each other and against none: waves of
    units times a unit's multiply-adds, divided by the tile's rate (its intensity bm·bn/(bm+bn)
    against 128x128's, at most 1) and 10 % more for each extra slice (the partial sums'
    writes, reads and their kernel).  Fitted to H100 float16 and 3xTF32 sweeps
    (``benchmarks/gemm_split_k.py``)."""
    waves = -(-c_tile_count(t, shapes, matrices) * t.split // sm_count)
    depth = max(k for _, _, k in shapes)
    rate = min(1.0, t.bm * t.bn / (t.bm + t.bn) / 64)
    return waves * t.bm * t.bn * (depth // t.split) / rate * (1 + 0.1 * (t.split - 1))


def split_pick(tile: WgmmaTile, fitting: Sequence[WgmmaTile], shapes: Any, sm_count: int, limit: int,
               b_layout: str, matrices: int) -> WgmmaTile:
    """The fitting tile with K split (C stored directly) that ``split_cost`` puts lowest, where
    it is below ``SPLIT_GAIN`` of the unsplit pick ``tile``'s (its slices added by a cluster at
    ``CLUSTER_SPLIT`` on tiles of 128x128 and more); else ``tile``."""
    depth = min(k for _, _, k in shapes)
    splits = [dataclasses.replace(t, split=s, smem_epilogue=False) for t in fitting for s in SPLITS_OF_K[1:]
              if depth // t.bk // s >= MIN_SLICE_STEPS]
    costs = [(split_cost(t, shapes, sm_count, matrices), t) for t in splits if runs(t, shapes, limit, b_layout)]
    if not costs:
        return tile
    cost, best = min(costs, key=lambda c: c[0])
    if cost >= SPLIT_GAIN * split_cost(tile, shapes, sm_count, matrices):
        return tile
    clustered = dataclasses.replace(best, cluster=True)
    if best.split == CLUSTER_SPLIT and min(best.bm, best.bn) >= 128 and runs(clustered, shapes, limit, b_layout):
        return clustered
    return best


def _stages_for(tile: WgmmaTile, shapes: Any) -> WgmmaTile:
    """``tile`` with no more stages than the shortest K of ``shapes`` fills: its prologue loads
    stages - 1 - inflight k tiles ahead (``wgmma_reason`` refuses more), a depth the knob offers."""
    k_tiles = min((k_steps(tile, int(k)) for _, _, k in shapes), default=0)
    most = max(2 + tile.inflight, k_tiles + 1 + tile.inflight)
    return tile if tile.stages <= most else dataclasses.replace(tile, stages=max(s for s in STAGE_CHOICES
                                                                                  if s <= most))


def block_steps(t: WgmmaTile, shapes: Any, matrices: int = 1) -> int:
    """The k steps the busiest block of ``t`` runs on the shortest K of ``shapes`` (its units
    one after another, one pipeline across them)."""
    units = c_tile_count(t, shapes, matrices) * t.split
    busiest = -(-units // -(-units // t.tiles))
    return busiest * k_steps(t, min(int(k) for _, _, k in shapes)) // t.split


def with_tma(t: WgmmaTile, shapes: Any, limit: int, b_layout: str, matrices: int = 1) -> WgmmaTile:
    """``t`` loading its stages by the TMA where its operand is 16-bit and its busiest block runs
    at least ``TMA_MIN_STEPS`` k steps or its threads would each issue at least ``TMA_MIN_CHUNKS``
    16-byte copies a stage (and the stages' barriers fit); ``t`` elsewhere."""
    chunks = t.stage_bytes() // COPY_BYTES // t.threads  # a thread's cp.async copies a stage
    if t.operand not in TMA_OPERANDS or (block_steps(t, shapes, matrices) < TMA_MIN_STEPS
                                         and chunks < TMA_MIN_CHUNKS):
        return t
    loaded = dataclasses.replace(t, tma=True)
    return loaded if runs(loaded, shapes, limit, b_layout) else t


def pick_wgmma_tile(shapes: Any, target: TargetInfo, c_dtype: str, b_layout: str = "NK",
                    candidates: Sequence[WgmmaTile] | None = None, matrices: int = 1,
                    split_k: bool = False, operand: str = "float16", ragged_m: bool = False,
                    few_waves: bool = False, ragged_n: bool = False) -> WgmmaTile | None:
    """``first_wave_pick``'s tile, its stages loaded by the TMA where ``with_tma`` says."""
    tile = first_wave_pick(shapes, target, c_dtype, b_layout, candidates, matrices, split_k, operand, ragged_m,
                           few_waves, ragged_n)
    if tile is None:
        return None
    return narrow_specialized(with_tma(tile, shapes, shared_limit(target), b_layout, matrices), shapes,
                              shared_limit(target), b_layout)


def narrow_specialized(t: WgmmaTile, shapes: Any, limit: int, b_layout: str) -> WgmmaTile:
    """A ``NARROW_TILES`` tile loaded by the TMA and staging C, with Bt stored (N, K) (as
    measured), warp-specialized (C then through a stage of its own; measured faster than it not
    specialized at BERT-base's 1024x768x768: docs/results/gemm.md) where that runs; ``t`` elsewhere."""
    if (not (t.tma and t.smem_epilogue) or b_layout != "NK"
            or (t.bm, t.bn, t.stages) not in {n[:3] for n in NARROW_TILES}):
        return t
    specialized = dataclasses.replace(t, specialized=True)
    return specialized if runs(specialized, shapes, limit, b_layout) else t


def first_wave_pick(shapes: Any, target: TargetInfo, c_dtype: str, b_layout: str = "NK",
                    candidates: Sequence[WgmmaTile] | None = None, matrices: int = 1,
                    split_k: bool = False, operand: str = "float16", ragged_m: bool = False,
                    few_waves: bool = False, ragged_n: bool = False) -> WgmmaTile | None:
    """A tile that divides every (M, N, K) of ``shapes`` (with ``ragged_m``, every N and K, the
    kernel guarding M's last tile row, less than ``RAGGED_PADDING`` of its rows past M; with
    ``ragged_n`` likewise N's last tile column, where no tile divides N): the
    first of ``DEFAULT_TILES`` giving 90 % of the SMs a block (with at most ``FIRST_PICK_PADDING``
    of its rows past M), else the one giving most blocks (the least padded of those), its
    shared-memory epilogue where C is the ``operand``'s dtype (float16 or bfloat16; the direct one
    stores any C type), several tiles a block where they are more than a wave (``spread``); None
    off Hopper or where none fits (the GRU's input GEMMs, which do not ask for ``ragged_m``).
    ``candidates``: other tiles to pick from, in order (``gemm_3xtf32``'s TF32 tiles); ``matrices``:
    the GEMMs are batches of that many (their tiles all count).  ``split_k``: a split of K where
    ``split_pick`` finds one (callers whose programs take the partial sums' buffer).  ``few_waves``:
    where the largest tile would make fewer than ``FEW_WAVES`` waves and a tile of
    ``FEW_WAVES_TILES`` has a lower ``wave_cost`` than the first pick, that tile through
    ``few_waves_pick`` (the GRU's, FP8's and 3xTF32's callers do not ask: their workloads name
    the tile)."""
    if target_reason(target):
        return None
    limit = shared_limit(target)
    staged = bool(c_dtype == OPERAND_STORAGE.get(operand))
    ragged_k = operand in RAGGED_K_OPERANDS and any(int(k) % BK for _, _, k in shapes)  # TMA-loaded tiles only

    def made(rows: Sequence[tuple[int, ...]]) -> list[WgmmaTile]:
        return [_stages_for(WgmmaTile(bm, bn, stages, inflight, bool(smem) and staged, 0, operand=operand,
                                      tma=ragged_k), shapes)
                for bm, bn, stages, inflight, smem, _ in rows]

    def fits(t: WgmmaTile, columns: float = 0.0) -> bool:  # at most ``columns`` of a tile column past N
        return (epilogue_reason(t, c_dtype) is None and runs(t, shapes, limit, b_layout)
                and (padding(t, shapes) < RAGGED_PADDING if ragged_m else padding(t, shapes) == 0)
                and column_padding(t, shapes) <= columns)

    offered = [_stages_for(t, shapes) for t in candidates] if candidates else made(DEFAULT_TILES)
    fitting = [t for t in offered if fits(t)]
    if not fitting and candidates is None and b_layout == "KN":  # N no default tile divides, B (K, N)
        fitting = [t for t in made(COLUMN_DIVISOR_TILES) if fits(t)]
    pads_n = not fitting and ragged_n  # a tile column past N only where no tile divides it
    direct = pads_n and any(n % 8 for _, n, _ in shapes)  # C's rows no multiple of 16 bytes: stored directly
    by_tma = pads_n and b_layout == "KN" and operand in TMA_OPERANDS  # B (K, N)'s past N: the TMA's zeros

    def past_n(tiles: Sequence[WgmmaTile]) -> list[WgmmaTile]:  # the tiles a padded N takes
        return [t for t in (dataclasses.replace(t, smem_epilogue=t.smem_epilogue and not direct, tma=t.tma or by_tma)
                            for t in tiles)
                if fits(t, RAGGED_PADDING if pads_n else 0.0)]

    if pads_n:
        fitting = past_n(offered)
    if not fitting:
        return None
    tile = next((t for t in fitting if 10 * c_tile_count(t, shapes, matrices) >= 9 * target.compute_units
                 and padding(t, shapes) <= FIRST_PICK_PADDING),
                max(fitting, key=lambda t: (c_tile_count(t, shapes, matrices), -padding(t, shapes))))
    if few_waves and candidates is None and few_waves_problem(shapes, target.compute_units, matrices):
        deep = [t for t in past_n(made(NARROW_TILES))  # C staged, as measured
                if t.smem_epilogue and narrow_whole_wave(t, shapes, target.compute_units, b_layout, matrices)]
        if deep:
            return deep[0]
        extra = FEW_WAVES_TILES[len(DEFAULT_TILES):] + (NARROW_TILES if narrow_suits(shapes) else ())
        weighed = fitting + past_n(made(extra))
        picked = few_waves_pick(tile, weighed, shapes, target.compute_units, limit, b_layout, matrices, split_k)
        if picked is not None:
            return picked
    if split_k:
        tile = split_pick(tile, fitting, shapes, target.compute_units, limit, b_layout, matrices)
    return spread(tile, shapes, target.compute_units, limit, b_layout, matrices)


def narrow_suits(shapes: Any) -> bool:
    """Whether ``NARROW_TILES`` are weighed for ``shapes``: every M a multiple of 64 and every K
    at most ``NARROW_MAX_STEPS`` k steps."""
    return all(m % 64 == 0 and k <= NARROW_MAX_STEPS * BK for m, _, k in shapes)


def narrow_whole_wave(t: WgmmaTile, shapes: Any, sm_count: int, b_layout: str, matrices: int = 1) -> bool:
    """Whether the narrow tile ``t`` takes ``shapes`` with K whole at ``NARROW_DEEP_STEPS`` k
    steps or more: Bt stored (N, K), every M a multiple of 64 and every K that deep, and its C tiles one
    wave of 90-100 % of the SMs."""
    tiles = c_tile_count(t, shapes, matrices)
    return (b_layout == "NK" and 9 * sm_count <= 10 * tiles <= 10 * sm_count
            and all(m % 64 == 0 and k % BK == 0 and k >= NARROW_DEEP_STEPS * BK for m, _, k in shapes))


def few_waves_problem(shapes: Any, sm_count: int, matrices: int = 1) -> bool:
    """Whether the largest default tile (128x256) makes fewer than ``FEW_WAVES`` waves of the GEMMs
    ``shapes``: BERT-base's projections, token counts of a few hundred to a few thousand."""
    bm, bn = DEFAULT_TILES[0][:2]
    return min(-(-m // bm) * -(-n // bn) for m, n, _ in shapes) * matrices < FEW_WAVES * sm_count


def wave_cost(t: WgmmaTile, shapes: Any, sm_count: int, matrices: int = 1) -> float:
    """A model of ``t``'s time on a problem of a few waves: the C tiles the busiest SM computes
    (its blocks resident together or in turn) times a tile's multiply-adds over the tile's rate
    (``split_cost``'s: its intensity against 128x128's, at most 1)."""
    return tiles_per_sm(t, shapes, sm_count, matrices) * t.bm * t.bn / min(1.0, t.bm * t.bn / (t.bm + t.bn) / 64)


def tiles_per_sm(t: WgmmaTile, shapes: Any, sm_count: int, matrices: int = 1) -> int:
    """The C tiles of ``shapes`` the busiest SM computes (with one tile a block, its blocks)."""
    return -(-c_tile_count(t, shapes, matrices) // sm_count)


def resident(t: WgmmaTile, blocks: int) -> bool:
    """Whether ``blocks`` blocks of ``t`` fit one SM's shared memory together."""
    return blocks * (t.smem_bytes() + t.barrier_bytes() + SHARED_RESERVED_PER_BLOCK) <= WGMMA_SHARED_PER_SM


def resident_stages(t: WgmmaTile, blocks: int) -> WgmmaTile | None:
    """``t`` with the deepest pipeline (down to ``MIN_RESIDENT_STAGES``) at which ``blocks`` of its
    blocks fit one SM's shared memory together; None where none does."""
    for stages in (s for s in STAGE_CHOICES if MIN_RESIDENT_STAGES <= s <= t.stages):
        shallower = dataclasses.replace(t, stages=stages)
        if resident(shallower, blocks):
            return shallower
    return None


def few_waves_pick(first: WgmmaTile, fitting: Sequence[WgmmaTile], shapes: Any, sm_count: int, limit: int,
                   b_layout: str, matrices: int, split_k: bool) -> WgmmaTile | None:
    """The tile of ``fitting`` that ``wave_cost`` puts lowest (of two as low, the one with more
    tiles) where it is below the first-wave rule's tile ``first``: with K split where ``split_k``
    and ``split_pick`` finds a split, else one C tile a block where all the blocks can be
    resident at once (the pipeline made shallower for that, down to ``MIN_RESIDENT_STAGES``:
    blocks sharing an SM hide each other's latency).  None where it is not below ``first`` or
    its blocks cannot be resident (several tiles a block measured no better than the first pick
    there).  From a sweep of tiles, depths and tiles a block at BERT-base's shapes and token
    counts 200-2048 on the H200 (docs/results/gemm.md)."""
    def cost(t: WgmmaTile) -> float:
        return wave_cost(t, shapes, sm_count, matrices)

    tile = min(fitting, key=lambda t: (cost(t), -c_tile_count(t, shapes, matrices)))
    if cost(tile) >= cost(first):
        return None
    if split_k:
        tile = split_pick(tile, fitting, shapes, sm_count, limit, b_layout, matrices)
        if tile.split > 1:
            return tile
    shallower = resident_stages(tile, tiles_per_sm(tile, shapes, sm_count, matrices))
    return shallower if shallower is not None and runs(shallower, shapes, limit, b_layout) else None


@dataclass(frozen=True)
class WgmmaGemmTemplate(Template):
    """C[M, N] = A[M, K] · Bt[N, K]ᵀ (or A · B[K, N], ``b_layout`` "KN") on Hopper's warpgroup MMA
    (``dtype`` in and out: float16 or bfloat16; float32 accumulate); the knobs (``KNOBS``) are the
    tile, the pipeline and the epilogue.  ``batch``: leading axes of A, C and B (unless
    ``b_shared``), one GEMM each (attention's ``(batch, heads)`` products in a Relax model)."""

    m: int
    n: int
    k: int
    b_layout: str = "NK"  # "KN": B stored (K, N), C = A·B (``B_LAYOUTS``)
    batch: tuple[int, ...] = ()
    b_shared: bool = False  # B has no batch axes: every matrix of the batch multiplies the same B
    dtype: str = "float16"  # A, B and C (``DTYPES``)

    name = "gemm_wgmma"
    default_is_pick = True  # default_config picks a tile without measuring

    def __post_init__(self) -> None:
        check_sizes("GEMM", M=self.m, N=self.n, K=self.k)
        object.__setattr__(self, "batch", tuple(int(x) for x in self.batch))
        if any(x < 1 for x in self.batch):
            raise TvmExtError(f"batch axes must be >= 1, got {self.batch}")
        reason = b_layout_reason(self.b_layout)
        if reason:
            raise TvmExtError(reason)
        if self.dtype not in DTYPES:
            raise TvmExtError(f"wgmma GEMM dtype {self.dtype!r}; allowed: {', '.join(DTYPES)}")

    @property
    def tolerance(self) -> float:  # type: ignore[override]
        """The output's rounding alone: about 2e-4 in float16, 2e-3 in bfloat16 (8 bits)."""
        return DTYPES[self.dtype]

    @property
    def matrices(self) -> int:
        """GEMMs in the batch (1 without one)."""
        return int(np.prod(self.batch, dtype=np.int64))

    @classmethod
    def from_shape(cls, shape: tuple[int, ...], b_layout: str = "NK", batch: tuple[int, ...] = (),
                   b_shared: bool = False, dtype: str = "float16") -> "WgmmaGemmTemplate":
        if len(shape) != 3:
            raise TvmExtError(f"GEMM shape is M,N,K (3 numbers), got {len(shape)}")
        return cls(*shape, b_layout=b_layout, batch=batch, b_shared=b_shared, dtype=dtype)

    @property
    def params(self) -> dict[str, Any]:
        batched = {"batch": list(self.batch), "b_shared": self.b_shared} if self.batch else {}
        return {"m": self.m, "n": self.n, "k": self.k, "a_dtype": self.dtype, "b_dtype": self.dtype,
                "acc_dtype": "float32", "c_dtype": self.dtype, "b_layout": self.b_layout, **batched}

    def tile(self, config: Config) -> WgmmaTile:
        """The tile of ``config`` on this template's operands."""
        return WgmmaTile.of(config, self.dtype)

    def fitted(self, config: Config) -> Config:
        """``config`` with its raster group refitted to this M's tile rows (``fit_raster``)."""
        return config.replace(wgmma_raster=fit_raster(self.tile(config), self.m).raster)

    def resized(self, config: Config, target: TargetInfo) -> Config:
        """``config`` (a bucket's) for this M where its blocks outnumber the SMs (one C tile a
        block, K unsplit): its pipeline made shallow enough for them to be resident together
        (``resident_stages``; 64x64 tiles tuned at 128 rows, 8 stages, ran at 200 rows in 7.7 µs
        one block an SM and 5.6 µs with 6 stages, two); where no depth lets them, this M's own
        pick if that is a resident few-waves pick (700 rows: bucket 512's 64x64 tiles, 528
        blocks, 13.7 µs bare; the pick's 64x128, 264 blocks two an SM, 9.7 µs;
        docs/results/gemm.md).  ``config`` elsewhere."""
        tile = self.tile(config)
        if tile.tiles != 1 or tile.split != 1:
            return config
        shallower_tile = resident_stages(tile, tiles_per_sm(tile, self._shapes, target.compute_units, self.matrices))
        if shallower_tile is None:
            return self._resident_pick(target) or config
        shallower = config.replace(wgmma_stages=shallower_tile.stages)
        return shallower if self.space(target).is_feasible(shallower) else config

    @property
    def _shapes(self) -> list[tuple[int, int, int]]:
        return [(self.m, self.n, self.k)]

    def _resident_pick(self, target: TargetInfo) -> Config | None:
        """The default config where it is ``few_waves_pick``'s (one tile a block, every block
        resident at once), else None."""
        if not few_waves_problem(self._shapes, target.compute_units, self.matrices):
            return None
        try:
            pick = self.default_config(target)
        except TvmExtError:
            return None
        tile = self.tile(pick)
        if tile.tiles != 1 or tile.split != 1:
            return None
        return pick if resident(tile, tiles_per_sm(tile, self._shapes, target.compute_units, self.matrices)) else None

    def space(self, target: TargetInfo) -> Space:
        def reason(c: Config) -> str | None:
            return target_reason(target) or wgmma_reason(self.tile(c), self.m, self.n, self.k,
                                                         shared_limit(target), self.b_layout)
        return Space(KNOBS, (reason,))

    def default_config(self, target: TargetInfo) -> Config:
        """``pick_wgmma_tile``: the probe's best tile at 4096^3 where it gives 90 % of the SMs a
        block, else the first of ``DEFAULT_TILES`` that does, else the one giving most blocks
        (BERT-base's 1024x768x768 projection: 64x64 tiles, two a block, against 24 blocks of
        128x256), several tiles a block where they are more than a wave (``spread``), launched
        early behind the kernel ahead (``wgmma_pdl``: 0.87x -> 0.99x cuBLAS back to back at that
        shape); an error saying why where the target has no wgmma or no tile fits the shape."""
        reason = target_reason(target)
        if reason:
            raise TvmExtError(reason)
        tile = pick_wgmma_tile(self._shapes, target, self.dtype, self.b_layout,
                               matrices=self.matrices, split_k=True, operand=self.dtype, ragged_m=True, ragged_n=True,
                               few_waves=True)
        if tile is None:
            raise TvmExtError(f"no wgmma tile fits {self.m}x{self.n}x{self.k}: K must be a multiple of 64 (of 8 on "
                              f"16-bit operands, which the TMA loads), M and N (guarded; N even, with Bt stored "
                              f"(N, K)) fill more than half of their last tile")
        return self.space(target).make(**dataclasses.replace(tile, pdl=True).knobs())

    def schedule(self, config: Config, target: TargetInfo) -> Any:
        raise TvmExtError("the wgmma GEMM is written as a PrimFunc, not scheduled: use build_program")

    def build_program(self, config: Config, target: TargetInfo) -> CompiledProgram:
        """The PrimFunc of ``config`` compiled for sm_90a (wgmma is an arch-specific instruction);
        the config is its record (no schedule trace)."""
        reason = self.space(target).infeasible_reason(config)
        if reason:
            raise TvmExtError(reason)
        return compile_wgmma(self.kernel_func(config), target, config)

    def kernel_func(self, config: Config, c_dtype: str | None = None, epilogue: Any = None) -> Any:
        """The PrimFunc of ``config`` storing C as ``c_dtype`` (None: the operands' dtype),
        ``epilogue`` (``wgmma_gemm``'s) in its store: what a Relax model's matmul is replaced by
        (``tvm_ext.relax.relax_wgmma``)."""
        return wgmma_gemm(self.tile(config), self.m, self.n, self.k, c_dtype=c_dtype or self.dtype,
                          b_layout=self.b_layout, epilogue=epilogue, batch=self.batch, b_batched=not self.b_shared)

    def inputs(self) -> list[TensorSpec]:
        b_lead = () if self.b_shared else self.batch
        return [TensorSpec((*self.batch, self.m, self.k), self.dtype),
                TensorSpec((*b_lead, *b_shape(self.n, self.k, self.b_layout)), self.dtype)]

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec((*self.batch, self.m, self.n), self.dtype)]

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a, b = (x.astype(np.float64) for x in inputs)
        return [a @ (b if self.b_layout == "KN" else np.swapaxes(b, -1, -2))]

    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.matrices
