"""The tensor-core GEMM whose kernel is itself a knob: mma.sync (``mma.py``), WMMA
(``wmma.py``) or, on Hopper, the warpgroup MMA (``wgmma.py``, B read N-major), each with its
own tile knobs, so one search (``tune gemm-tc``) picks the kernel as well as its tile.

A config carries both kernels' knobs; only the chosen kernel's are read (``kernel_config``),
so two configs that differ only in the other kernel's knobs build the same source, which
the tuner measures once.  Compute, inputs and reference are the GEMM template's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tvm_ext.core.errors import TvmExtError
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.schedules.gemm.mma import MMA_KNOBS, MmaGemmTemplate, with_unused_param
from tvm_ext.schedules.gemm.mma import pass_config as mma_pass_config
from tvm_ext.schedules.gemm.tensor_core import TensorCoreGemmTemplate
from tvm_ext.schedules.gemm.wmma import AUTO_TILES as WMMA_TILES
from tvm_ext.schedules.gemm.wmma import TC_KNOBS, pick_wmma_tile, schedule_wmma, tensor_core_reason
from tvm_ext.schedules.gemm.wmma import pass_config as wmma_pass_config
from tvm_ext.schedules.gemm import wgmma
from tvm_ext.schedules.gemm.wgmma_template import pick_wgmma_tile
from tvm_ext.measure.program import CompiledProgram
from tvm_ext.core.space import Config, Knob, Space
from tvm_ext.target import TargetInfo
from tvm_ext.core.template import TensorSpec

KERNELS = ("mma", "wmma", "wgmma")
KERNEL_KNOB = Knob("tc_kernel", KERNELS, "tensor-core kernel: mma.sync + ldmatrix, WMMA fragments, or Hopper's "
                                         "warpgroup MMA (sm_90, float16 or bfloat16)")
CHOICE_KNOBS = (KERNEL_KNOB, *MMA_KNOBS, *TC_KNOBS, *wgmma.KNOBS)
OWN_KNOBS = {"mma": MMA_KNOBS, "wmma": TC_KNOBS, "wgmma": wgmma.KNOBS}
WGMMA_OPERANDS = ("float16", "bfloat16")  # what ``tc_kernel`` wgmma multiplies (its TF32 is gemm_3xtf32's)


@dataclass(frozen=True)
class TensorCoreChoiceTemplate(GemmTemplate):
    """C[M, N] = A[M, K] · B[K, N] on the tensor cores, the kernel (``tc_kernel``) searched
    with its tile.  WMMA takes float16 operands only; with bfloat16 every WMMA config is
    infeasible (the reason says so) and the search has mma.sync and, on Hopper, wgmma."""

    a_dtype: str = "float16"
    b_dtype: str = "float16"
    acc_dtype: str = "float32"
    c_dtype: str = "float32"

    name = "gemm_tc_any"

    def __post_init__(self, dtype: str | None = None) -> None:
        super().__post_init__(dtype)
        _ = self.mma  # validates the dtypes (the mma.sync kernel takes every supported combination)

    @property
    def mma(self) -> MmaGemmTemplate:
        return MmaGemmTemplate(self.m, self.n, self.k, a_dtype=self.a_dtype, b_dtype=self.b_dtype,
                               acc_dtype=self.acc_dtype, c_dtype=self.c_dtype)

    @property
    def params(self) -> dict[str, Any]:
        return self.mma.params

    def full_precision(self) -> GemmTemplate:
        return GemmTemplate(self.m, self.n, self.k)

    def kernel_config(self, config: Config) -> tuple[str, Config]:
        """The chosen kernel and its own config (the knobs it reads)."""
        names = [k.name for k in OWN_KNOBS[config.tc_kernel]]
        return config.tc_kernel, Config(tuple((n, config[n]) for n in names))

    def reason(self, config: Config, target: TargetInfo) -> str | None:
        kernel, own = self.kernel_config(config)
        if kernel == "mma":
            return self.mma.reason(own, target)
        if kernel == "wgmma":
            return self.wgmma_reason(wgmma.WgmmaTile.of(own, self.a_dtype), target)
        return tensor_core_reason(self.m, self.n, self.k, self.a_dtype, self.b_dtype, self.acc_dtype, target, own)

    def space(self, target: TargetInfo) -> Space:
        return Space(CHOICE_KNOBS, (lambda c: self.reason(c, target),))

    def fitted(self, config: Config) -> Config:
        """A wgmma config with its raster group refitted to this M's tile rows (``fit_raster``)."""
        if config.tc_kernel != "wgmma":
            return config
        return config.replace(wgmma_raster=wgmma.fit_raster(wgmma.WgmmaTile.of(self.kernel_config(config)[1],
                                                                                self.a_dtype), self.m).raster)

    def scratch(self) -> list[TensorSpec]:
        return self.mma.scratch()  # a WMMA kernel takes the same (unused) scratch parameter

    def default_config(self, target: TargetInfo) -> Config:
        """mma.sync with ``pick_mma_tile``'s tile; the WMMA knobs at ``pick_wmma_tile``'s (or the
        128x128 tile's) values, so a mutation of ``tc_kernel`` lands on a sensible WMMA tile."""
        try:
            mma = self.mma.default_config(target)
        except TvmExtError as exc:
            raise TvmExtError(str(exc).replace("no mma.sync tile fits", "no tensor-core tile fits")) from None
        wmma = pick_wmma_tile([(self.m, self.n, self.k)], target, self.acc_dtype) if self.a_dtype == "float16" else None
        wg = self.wgmma_tile(target) or wgmma.WgmmaTile()
        values = {**(wmma or WMMA_TILES[1]).as_dict(), **mma.as_dict(), **wg.knobs(), "tc_kernel": "mma"}
        return Config(tuple((k.name, values[k.name]) for k in CHOICE_KNOBS))

    def analytic_pick(self, target: TargetInfo) -> tuple[Config, str]:
        """Hopper's wgmma (float16 or bfloat16 operands) where a tile of it fits and the GEMM is
        large enough that 64x64 tiles would give 90 % of the SMs a block (faster than mma.sync at
        4096^3; docs/results/gemm.md; the picked tile may be larger and fewer, or split K where C
        has too few tiles: ``wgmma_tile``), else the mma.sync pick (split-K for skinny shapes)."""
        config = self.default_config(target)
        tile = self.wgmma_tile(target)
        if tile is not None and 10 * -(-self.m // 64) * (self.n // 64) >= 9 * target.compute_units:
            return config.replace(tc_kernel="wgmma"), f"wgmma {tile.name} (Hopper), B read N-major"
        return config, self.mma.analytic_pick(target)[1]

    def wgmma_tile(self, target: TargetInfo) -> "wgmma.WgmmaTile | None":
        """``pick_wgmma_tile``'s tile for this GEMM, None where wgmma cannot run it: the tile
        ``tune gemm-wgmma`` picks, K split where C has too few tiles for the SMs (BERT-base's
        1024x768x3072: 128x128 split in two in a cluster, 0.84x cuBLAS against 0.66x for the
        unsplit 128x64 tile this pick took before; docs/results/gemm.md)."""
        if self.wgmma_types_reason():
            return None
        tile = pick_wgmma_tile([(self.m, self.n, self.k)], target, self.c_dtype, b_layout="KN",
                               split_k=True, operand=self.a_dtype, ragged_m=True, few_waves=True, ragged_n=True)
        if tile is None or self.wgmma_reason(tile, target) is not None:
            return None
        return replace(tile, pdl=True)  # launched early behind the kernel ahead (``wgmma_pdl``)

    def wgmma_types_reason(self) -> str | None:
        if self.a_dtype != self.b_dtype or self.a_dtype not in WGMMA_OPERANDS or self.acc_dtype != "float32":
            return (f"wgmma takes float16 or bfloat16 operands of one type accumulating in float32, not "
                    f"{self.a_dtype}/{self.b_dtype} in {self.acc_dtype}")
        return None

    def wgmma_reason(self, tile: "wgmma.WgmmaTile", target: TargetInfo) -> str | None:
        return (wgmma.target_reason(target) or self.wgmma_types_reason() or wgmma.epilogue_reason(tile, self.c_dtype)
                or wgmma.wgmma_reason(tile, self.m, self.n, self.k, wgmma.shared_limit(target), "KN"))

    def build_program(self, config: Config, target: TargetInfo) -> CompiledProgram:
        """wgmma: its TVMScript kernel (B stored K x N) built for sm_90a, with the split-K scratch
        parameter the other kernels take (unused); the others: their schedules."""
        kernel, own = self.kernel_config(config)
        if kernel != "wgmma":
            return super().build_program(config, target)
        reason = self.reason(config, target)
        if reason:
            raise TvmExtError(reason)
        func = wgmma.wgmma_gemm(wgmma.WgmmaTile.of(own, self.a_dtype), self.m, self.n, self.k, c_dtype=self.c_dtype,
                                b_layout="KN")
        for spec in self.scratch():
            func = _with_param(func, spec)
        return wgmma.compile_wgmma(func, target, config)

    def schedule(self, config: Config, target: TargetInfo, func: Any = None, site: Any = None) -> Any:
        from tvm import s_tir

        if func is not None:
            raise TvmExtError("the tensor-core GEMM schedules its own compute only")
        kernel, own = self.kernel_config(config)
        if kernel == "mma":
            return self.mma.schedule(own, target)
        if kernel == "wgmma":
            raise TvmExtError("the wgmma kernel is written as a PrimFunc, not scheduled: use build_program")
        scratch = self.scratch()
        wmma = TensorCoreGemmTemplate(self.m, self.n, self.k, a_dtype=self.a_dtype, b_dtype=self.b_dtype,
                                      acc_dtype=self.acc_dtype, c_dtype=self.c_dtype)
        prim = with_unused_param(self, scratch[0]) if scratch else self.prim_func()
        return schedule_wmma(s_tir.Schedule(prim), "C", own, epilogue=wmma.own_site().epilogue)

    def pass_config(self, config: Config, target: TargetInfo) -> dict[str, Any]:
        kernel, own = self.kernel_config(config)
        if kernel == "wgmma":
            return {}
        return mma_pass_config(own) if kernel == "mma" else wmma_pass_config(own)


def _with_param(func: Any, spec: TensorSpec) -> Any:
    """``func`` with one more, unused, buffer parameter of ``spec`` at the end."""
    from tvm import tirx
    from tvm.script import tirx as T

    @T.prim_func
    def holder(partial: T.Buffer(spec.shape, spec.dtype)):
        T.evaluate(0)

    return tirx.PrimFunc([*func.params, holder.params[0]], func.body, func.ret_type, func.attrs)

