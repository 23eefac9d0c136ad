"""8-bit float GEMM on Hopper's wgmma: C = (A · Btᵀ) x scale_a x scale_b, A (M, K) and Bt (N, K)
both e4m3 (or both e5m2), K-major, float32 accumulate, C float16 or bfloat16: what
``torch._scaled_mm`` (cuBLASLt) computes with per-tensor scales, and how quantized LLM weights
and activations are multiplied.

The kernel is the wgmma GEMM's (``schedules.gemm.wgmma``) on 1-byte operands: 128 elements a
128-byte swizzle row (a k step of 128), ``m64nNk32.f32.e4m3.e4m3`` (four a k step), the
descriptors and stages as for float16; C stored directly, the two scales (one float32 buffer,
``scale_ab``) multiplying the sum in the epilogue.  wgmma reads 8-bit operands K-major only,
so B is Bt (N, K), a Linear weight's layout; K is not split (the scales are the epilogue).

Hopper's tensor cores add 8-bit products into float32 with fewer bits kept than a float32 add:
``fp8_promote`` k steps (1: every 128 of K) adds the wgmma sums into a second set of
accumulators with the CUDA cores' float32 adds and restarts them, as cuBLASLt does unless
asked for its fast accumulation; 0 never does (faster, an error that grows with K).
``fp8_promote_overlap`` alternates two sets of wgmma accumulators so those adds run behind the
next k step's wgmma instead of after a full wait.  The default promotes every k step, on a tile
with room for both sets (bn <= 192), overlapped (with TMA loads) where there is room for three
(bn <= 128) and its blocks run many k steps; there a 128x192 tile, warp-specialized and not
overlapped, where its waves of C tiles are not much larger (its last tile column may pass N).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from tvm_ext.core.errors import TvmExtError, check_sizes
from tvm_ext.core.space import Config, Knob, Space
from tvm_ext.core.template import Template, TensorSpec
from tvm_ext.measure.program import CompiledProgram
from tvm_ext.target import TargetInfo

from .wgmma import (KNOBS, OPERAND_STORAGE, WgmmaTile, compile_wgmma, epilogue_for, fit_raster, promote_reason,
                    shared_limit, target_reason, wgmma_gemm, wgmma_reason)
from .wgmma_template import (RAGGED_PADDING, TMA_MIN_STEPS, block_steps, column_padding, padding, pick_wgmma_tile,
                             tiles_per_sm)

FP8 = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}  # the operands' formats -> their TVM dtypes
FP8_FORMATS = {dtype: name for name, dtype in FP8.items()}  # and back
PROMOTIONS = (0, 1, 2, 4)  # k steps between promotions the knob offers (0: never)
FP8_KNOBS = (*KNOBS, Knob("fp8_promote", PROMOTIONS, "k steps (of 128) between promotions of the sums (0: never)"),
             Knob("fp8_promote_overlap", (0, 1),
                  "1: windows of promotion alternate between two sets of accumulators, a window's adds running "
                  "behind the next window's first wgmma (bn <= 128, wgmma_inflight 1; the same sums)", before=0))
# the default's tiles, in order: room for two sets of accumulators (``promote_reason``)
PROMOTE_TILES = ((128, 192, 4, 1), (128, 128, 6, 1), (64, 192, 6, 1), (64, 128, 6, 1), (64, 64, 8, 1))
# the default's wide tile (bm, bn, stages, inflight), warp-specialized with promotions not overlapped
# (two sets of 96 accumulators; the consumer warpgroups' adds run beside each other's wgmma), where
# its waves of C tiles leave the SMs at most WIDE_RATE times the pick's area: the rate of its area
# over the 128x128 tile's with overlapped promotions, 1.04-1.10 measured at three shapes (and bn
# 192 faster warp-specialized than not; docs/results/gemm.md)
WIDE_TILE = (128, 192, 4, 1)
WIDE_RATE = 1.06
# C -> the check's tolerance: C's rounding, and without promotion the tensor cores' sums, whose
# error grows with K (float16 C: 1.3e-3 at K 4096, 2.1e-3 at 8192 on an H200), with room
OUT_DTYPES = {"float16": 1e-2, "bfloat16": 1e-2}


def staged_c(space: Space, config: Config) -> Config:
    """``config`` with C staged through the warp-specialized kernel's own stage (16-byte stores,
    whole rows a warp; measured faster than the same config storing from its registers:
    docs/results/gemm.md) where the space takes it (the stage fits beside the config's); else
    ``config``."""
    staged = config.replace(wgmma_smem_epilogue=1)
    return staged if config.wgmma_ws and space.is_feasible(staged) else config


@dataclass(frozen=True)
class Fp8GemmTemplate(Template):
    """C[M, N] = (A[M, K] · Bt[N, K]ᵀ) x scale_ab[0] x scale_ab[1]: A and Bt ``fp8`` (e4m3 or
    e5m2), per-tensor float32 scales, float32 accumulate, C ``out_dtype``; the knobs are the
    wgmma GEMM's (tile, pipeline, tiles a block, raster), K never split.  ``batch``: leading axes
    of A and C, one GEMM each with the same Bt (a Linear on a model's (batch, tokens, features)
    activations).  ``promote``: the sums promoted every that many k steps and no other way (0:
    never), an accuracy class the search keeps to (1: cuBLASLt's default, 0: its fast
    accumulation); None: ``fp8_promote`` is searched like any knob."""

    m: int
    n: int
    k: int
    fp8: str = "e4m3"
    out_dtype: str = "float16"
    batch: tuple[int, ...] = ()
    promote: int | None = None

    name = "gemm_fp8"
    default_is_pick = True  # default_config picks a tile without measuring

    def __post_init__(self) -> None:
        check_sizes("GEMM", M=self.m, N=self.n, K=self.k)
        object.__setattr__(self, "batch", tuple(int(x) for x in self.batch))
        if any(x < 1 for x in self.batch):
            raise TvmExtError(f"batch axes must be >= 1, got {self.batch}")
        if self.fp8 not in FP8:
            raise TvmExtError(f"8-bit float {self.fp8!r}; allowed: {', '.join(FP8)}")
        if self.out_dtype not in OUT_DTYPES:
            raise TvmExtError(f"an 8-bit GEMM stores C as {' or '.join(OUT_DTYPES)}, not {self.out_dtype}")
        if self.promote is not None and self.promote not in PROMOTIONS:
            raise TvmExtError(f"promote {self.promote!r}: k steps between promotions; allowed: "
                              f"{', '.join(map(str, PROMOTIONS))}")

    @property
    def tolerance(self) -> float:  # type: ignore[override]
        """C's rounding and the unpromoted sums' error (``OUT_DTYPES``)."""
        return OUT_DTYPES[self.out_dtype]

    @classmethod
    def from_shape(cls, shape: tuple[int, ...], fp8: str = "e4m3", out_dtype: str = "float16") -> "Fp8GemmTemplate":
        if len(shape) != 3:
            raise TvmExtError(f"GEMM shape is M,N,K (3 numbers), got {len(shape)}")
        return cls(*shape, fp8=fp8, out_dtype=out_dtype)

    @property
    def params(self) -> dict[str, Any]:
        dtype = FP8[self.fp8]
        batched = {"batch": list(self.batch), "b_shared": True} if self.batch else {}
        fixed = {} if self.promote is None else {"promote": self.promote}
        return {"m": self.m, "n": self.n, "k": self.k, "a_dtype": dtype, "b_dtype": dtype, "acc_dtype": "float32",
                "c_dtype": self.out_dtype, "scales": "per_tensor", **batched, **fixed}

    @property
    def matrices(self) -> int:
        """GEMMs in the batch (1 without one)."""
        return int(np.prod(self.batch, dtype=np.int64))

    def tile(self, config: Config) -> WgmmaTile:
        return WgmmaTile.of(config, self.fp8)

    def reason(self, config: Config, target: TargetInfo) -> str | None:
        """Why ``config`` cannot run this GEMM on ``target`` (None: it can)."""
        tile = self.tile(config)
        if tile.split > 1:
            return f"{tile.name}: an 8-bit GEMM does not split K (its scales are the epilogue)"
        if self.promote is not None and config.fp8_promote != self.promote:
            return f"fp8_promote {config.fp8_promote}: this GEMM promotes every {self.promote} k steps (promote)"
        return (target_reason(target) or wgmma_reason(tile, self.m, self.n, self.k, shared_limit(target))
                or promote_reason(tile, self.k, config.fp8_promote, bool(config.fp8_promote_overlap)))

    def space(self, target: TargetInfo) -> Space:
        return Space(FP8_KNOBS, (lambda c: self.reason(c, target),))

    def default_config(self, target: TargetInfo) -> Config:
        """``pick_wgmma_tile`` among ``PROMOTE_TILES`` on the 8-bit operands (C stored directly, K
        not split), its sums promoted every k step, overlapped, loaded by the TMA and warp-specialized
        (a producer warpgroup, ``wgmma_specialized``) where the tile has room for a third set and
        its busiest block runs ``TMA_MIN_STEPS`` k steps or more (measured faster together than
        without any of them there; at fewer k steps 16-bit tiles lost by the TMA: the results
        docs); in those blocks ``WIDE_TILE`` instead where ``_wide_config`` takes it; without
        promotion where none of them fits.  A warp-specialized pick stages C through a stage of its
        own where it fits (``staged_c``)."""
        reason = target_reason(target)
        if reason:
            raise TvmExtError(reason)
        shapes = [(self.m, self.n, self.k)]
        candidates = [WgmmaTile(bm, bn, stages, inflight, False, 0, operand=self.fp8)
                      for bm, bn, stages, inflight in PROMOTE_TILES]
        tile = pick_wgmma_tile(shapes, target, self.out_dtype, candidates=candidates, operand=self.fp8,
                               matrices=self.matrices)
        promote = 1 if self.promote is None else self.promote
        if promote == 0 or tile is None or promote_reason(tile, self.k, promote):
            if self.promote:
                raise TvmExtError(f"no wgmma tile of {self.m}x{self.n}x{self.k} promotes every {self.promote} "
                                  f"k steps: {promote_reason(tile, self.k, promote) if tile else 'none fits'}")
            tile, promote = pick_wgmma_tile(shapes, target, self.out_dtype, operand=self.fp8,
                                            matrices=self.matrices), 0
        if tile is None:
            raise TvmExtError(f"no wgmma tile fits {self.m}x{self.n}x{self.k}: M and N must be multiples of 64 "
                              f"and K of 128 (no guards)")
        space = self.space(target)
        config = space.make(**dataclasses.replace(tile, smem_epilogue=False, pdl=True).knobs(), fp8_promote=promote,
                            fp8_promote_overlap=0)
        if not promote or block_steps(tile, shapes, self.matrices) < TMA_MIN_STEPS:
            return config
        wide = self._wide_config(tile, space, target.compute_units, promote)
        if wide is not None:
            return staged_c(space, wide)
        overlapped = config.replace(fp8_promote_overlap=1, wgmma_tma=1, wgmma_ws=1)
        return staged_c(space, overlapped) if space.is_feasible(overlapped) else config

    def wide_config(self, space: Space, promote: int) -> Config | None:
        """``WIDE_TILE`` warp-specialized and launched early, one C tile a block, its largest raster
        dividing M's tile rows (``fit_raster``), its sums promoted every ``promote`` k steps without
        overlap; None where ``space`` refuses it."""
        bm, bn, stages, inflight = WIDE_TILE
        wide = fit_raster(WgmmaTile(bm, bn, stages, inflight, False, 8, 1, operand=self.fp8, tma=True,
                                    specialized=True, pdl=True), self.m)
        config = space.make(**wide.knobs(), fp8_promote=promote, fp8_promote_overlap=0)
        return config if space.is_feasible(config) else None

    def _wide_config(self, tile: WgmmaTile, space: Space, sm_count: int, promote: int) -> Config | None:
        """``wide_config`` where its last tile column may pass N (less than ``RAGGED_PADDING`` of
        it), its SMs compute at most ``WIDE_RATE`` times ``tile``'s C area (the tiles the busiest
        SM computes times a tile's area; a ragged count of tiles balanced by the hardware's block
        scheduler) and its blocks run ``TMA_MIN_STEPS`` k steps; None elsewhere."""
        config = self.wide_config(space, promote)
        if config is None:
            return None
        shapes, wide = [(self.m, self.n, self.k)], self.tile(config)

        def area(t: WgmmaTile) -> int:
            return tiles_per_sm(t, shapes, sm_count, self.matrices) * t.bm * t.bn

        fits = (padding(wide, shapes) == 0 and column_padding(wide, shapes) < RAGGED_PADDING
                and block_steps(wide, shapes, self.matrices) >= TMA_MIN_STEPS)
        return config if fits and area(wide) <= WIDE_RATE * area(tile) else None

    def schedule(self, config: Config, target: TargetInfo) -> Any:
        raise TvmExtError("the 8-bit GEMM is written as a PrimFunc, not scheduled: use build_program")

    def kernel_func(self, config: Config, c_dtype: str | None = None, epilogue: Any = None) -> Any:
        """The PrimFunc of ``config``: ``main(A, Bt, scale_ab, C)``; with ``epilogue``
        (``wgmma_gemm``'s) ``main(A, Bt, C)``, C (``c_dtype``, None: ``out_dtype``) that
        expression of the float32 sum instead of the scales: what a Relax model's 8-bit matmul,
        its scaling and cast fused after it, is replaced by (``tvm_ext.relax.relax_wgmma``)."""
        batched = {"batch": self.batch, "b_batched": False} if self.batch else {}
        c_dtype = c_dtype or self.out_dtype
        tile = epilogue_for(self.tile(config), c_dtype)  # a float32 C (a Relax model's): from the registers
        return wgmma_gemm(tile, self.m, self.n, self.k, c_dtype=c_dtype,
                          epilogue=epilogue, scales=epilogue is None, promote=config.fp8_promote,
                          overlap=bool(config.fp8_promote_overlap), **batched)

    def build_program(self, config: Config, target: TargetInfo) -> CompiledProgram:
        reason = self.space(target).infeasible_reason(config)
        if reason:
            raise TvmExtError(reason)
        return compile_wgmma(self.kernel_func(config), target, config)

    def inputs(self) -> list[TensorSpec]:
        dtype = OPERAND_STORAGE[self.fp8]
        return [TensorSpec((*self.batch, self.m, self.k), dtype), TensorSpec((self.n, self.k), dtype),
                TensorSpec((2,), "float32")]

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec((*self.batch, self.m, self.n), self.out_dtype)]

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a, bt, scales = (x.astype(np.float64) for x in inputs)
        return [a @ bt.T * scales[0] * scales[1]]

    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.matrices
