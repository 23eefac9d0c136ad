"""The tensor-core GEMM as a tunable template (WMMA), and the matmul forms the WMMA schedule
is probed on.

The WMMA tile, its knobs, limits and schedule live in ``wmma.py``; the tile any float16 or
bfloat16 GEMM takes (mma.sync or WMMA: ``parse_tile``, ``pick_tile``) in
``tensor_core_tile.py``.  Their names are re-exported here, where the tensor-core GEMM's
users find them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tvm_ext.core.errors import TvmExtError
from tvm_ext.schedules.gemm.simt import GemmTemplate, TensorCoreTile, gemm_bias_func
from tvm_ext.schedules.gemm.tensor_core_tile import parse_tile, pick_tile, tile_of
from tvm_ext.schedules.gemm.wmma import (ACC_DTYPES, AUTO_TILES, FRAG, MIN_COMPUTE_CAPABILITY, OPERAND_DTYPES,
                                         SMEM_OPT_IN_BYTES, SMEM_ROW_PAD_BYTES, TC_KNOBS, TC_SPACE, WARP,
                                         WmmaGemmTile, WmmaTile, compile_wmma, compute_capability, max_dynamic_smem,
                                         pass_config, pick_wmma_tile, schedule_wmma, tensor_core_reason,
                                         wmma_intrinsics)
from tvm_ext.core.space import Config, Space
from tvm_ext.target import TargetInfo

__all__ = ["ACC_DTYPES", "AUTO_TILES", "FRAG", "MIN_COMPUTE_CAPABILITY", "OPERAND_DTYPES", "SMEM_OPT_IN_BYTES",
           "SMEM_ROW_PAD_BYTES", "TC_KNOBS", "TC_SPACE", "WARP", "MatmulProblem", "TensorCoreGemmTemplate",
           "TensorCoreTile", "WmmaGemmTile", "WmmaTile", "compile_wmma", "compute_capability", "max_dynamic_smem",
           "parse_tile", "pass_config", "pick_tile", "pick_wmma_tile", "schedule_wmma", "tensor_core_reason",
           "tile_of", "wmma_intrinsics"]


# ---- the matmul forms this schedule is used on ---------------------------------------------
@dataclass(frozen=True)
class MatmulProblem:
    """A matmul in one of the project's forms, fp16 operands: ``"gemm"`` is
    ``GemmTemplate.prim_func`` (epilogue "C_out" when ``c`` differs from ``acc``), ``"bias"``
    is ``gemm.gemm_bias_func`` (epilogue "D": bias add and narrowing; ``batch`` > 0 adds a
    leading batch axis).  Tests and the GPU probe build, check and time these."""

    form: str
    m: int
    n: int
    k: int
    acc: str = "float32"
    c: str = "float32"
    batch: int = 0

    def func_and_epilogue(self) -> tuple[Any, tuple[str, ...]]:
        if self.form == "gemm":
            tmpl = GemmTemplate(self.m, self.n, self.k, a_dtype="float16", b_dtype="float16",
                                acc_dtype=self.acc, c_dtype=self.c)
            return tmpl.prim_func(), tmpl.own_site().epilogue
        func = gemm_bias_func(self.batch, self.m, self.n, self.k, "float16", "float16", self.acc, self.c)
        return func, ("D",)

    def reason(self, config: Config, target: TargetInfo) -> str | None:
        return tensor_core_reason(self.m, self.n, self.k, "float16", "float16", self.acc, target, config)

    def schedule(self, config: Config) -> Any:
        from tvm import s_tir

        func, epilogue = self.func_and_epilogue()
        return schedule_wmma(s_tir.Schedule(func), "C", config, epilogue=epilogue)

    def flops(self) -> float:
        return 2.0 * max(self.batch, 1) * self.m * self.n * self.k

    def out_shape(self) -> tuple[int, ...]:
        return ((self.batch,) if self.batch else ()) + (self.m, self.n)

    def inputs(self, rng: np.random.Generator) -> list[np.ndarray]:
        """A, B (and the bias) in fp16, uniform in [-1, 1)."""
        lead = (self.batch,) if self.batch else ()
        shapes = [lead + (self.m, self.k), lead + (self.k, self.n)]
        if self.form == "bias":
            shapes.append(lead + (self.n,))
        return [rng.uniform(-1, 1, s).astype(np.float16) for s in shapes]

    def reference(self, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """float64 of the fp16 inputs: what is left is the kernel's own rounding."""
        out = np.matmul(inputs[0].astype(np.float64), inputs[1].astype(np.float64))
        if self.form == "bias":
            out += inputs[2].astype(np.float64)[..., None, :]
        return out

    def tolerance(self) -> float:
        """Max |out - ref| / max |ref| a correct kernel stays under (a wrong one is off by
        O(1)): fp32 accumulation is exact to ~1e-6, an fp16 output rounds at 2^-11, and fp16
        accumulation loses about an fp16 ulp per sqrt(K) of its running sums."""
        if self.acc == "float16":
            return 1e-3 * float(np.sqrt(self.k))
        return 3e-3 if self.c == "float16" else 1e-3


# ---- the tunable tensor-core GEMM ------------------------------------------------------------
@dataclass(frozen=True)
class TensorCoreGemmTemplate(GemmTemplate):
    """C[M, N] = A[M, K] · B[K, N] with float16 A and B on the tensor cores: the knobs are
    the WMMA tile (``TC_KNOBS``), so the GA searches tiles; ``tensor_core_reason`` is the
    space's constraint (a tile that does not divide the shape, or does not fit the device,
    is infeasible).  Accumulator float32 (default) or float16; C in any float type.
    Compute and reference are the GEMM template's; only the schedule differs."""

    a_dtype: str = "float16"
    b_dtype: str = "float16"
    acc_dtype: str = "float32"
    c_dtype: str = "float32"

    name = "gemm_tc"

    def __post_init__(self, dtype: str | None = None) -> None:
        super().__post_init__(dtype)
        if self.a_dtype not in OPERAND_DTYPES or self.b_dtype not in OPERAND_DTYPES:
            raise TvmExtError(f"tensor-core GEMM operands must be {'/'.join(OPERAND_DTYPES)}, "
                              f"got A {self.a_dtype} and B {self.b_dtype}")
        if self.acc_dtype not in ACC_DTYPES:
            raise TvmExtError(f"tensor-core GEMM accumulates in {' or '.join(ACC_DTYPES)}, not {self.acc_dtype}")

    @property
    def params(self) -> dict[str, Any]:
        return {"m": self.m, "n": self.n, "k": self.k, **{f"{p}_dtype": d for p, d in self.precision.items()}}

    def full_precision(self) -> GemmTemplate:
        """The float32 GEMM the inputs are drawn for (its reference is the check)."""
        return GemmTemplate(self.m, self.n, self.k)

    def space(self, target: TargetInfo) -> Space:
        return Space(TC_KNOBS, (lambda c: tensor_core_reason(self.m, self.n, self.k, self.a_dtype, self.b_dtype,
                                                             self.acc_dtype, target, c),))

    def default_config(self, target: TargetInfo) -> Config:
        """``pick_wmma_tile``'s tile (no measurement); an error naming why when none fits."""
        tile = pick_wmma_tile([(self.m, self.n, self.k)], target, self.acc_dtype)
        if tile is None:
            reason = tensor_core_reason(self.m, self.n, self.k, self.a_dtype, self.b_dtype, self.acc_dtype, target,
                                        AUTO_TILES[-1])
            raise TvmExtError(f"no tensor-core tile fits GEMM {self.m}x{self.n}x{self.k}: {reason}")
        return tile

    def analytic_pick(self, target: TargetInfo) -> tuple[Config, str]:
        """The zero-measurement pick (``--strategy analytic``) and why."""
        config = self.default_config(target)
        tile = WmmaTile.of(config)
        return config, (
            f"pick_wmma_tile: the largest probe-led WMMA tile that divides {self.m}x{self.n}x{self.k} and gives at "
            f"least half the device's {target.compute_units} SMs a block: {tile.block_m}x{tile.block_n}x"
            f"{tile.block_k}, {tile.warps} warps, {'cp.async' if tile.async_copy else 'synchronous'} copies")

    def schedule(self, config: Config, target: TargetInfo, func: Any = None, site: Any = None) -> Any:
        from tvm import s_tir

        if func is not None:
            raise TvmExtError("the tensor-core GEMM schedules its own compute only")
        return schedule_wmma(s_tir.Schedule(self.prim_func()), "C", config, epilogue=self.own_site().epilogue)

    def pass_config(self, config: Config, target: TargetInfo) -> dict[str, Any]:
        return pass_config(config)
