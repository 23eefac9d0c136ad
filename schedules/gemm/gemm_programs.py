"""The GEMM program on Hopper's own kernels: what the mixed-precision search (method 003) runs for
the assignments of ``GemmTemplate``'s precision that a written wgmma kernel takes, in place of
the scheduled GEMM (``mixed_precision.KernelProgram``).

- ``WgmmaGemmProgram``: A and B both float16 or both bfloat16, float32 sums, C any float type:
  the wgmma GEMM (``wgmma_template``) reading B as stored (K, N), at the tile it picks without
  measuring: faster than mma.sync's tile where both were measured (docs/results/tuning.md).
- ``EightBitGemmProgram``: A and B stored in one 8-bit type, each with a per-tensor float32
  scale (``precision.scaled_cast``: the largest magnitude to the format's largest value), B
  transposed (N, K) as wgmma reads 8-bit operands K-major only; the 8-bit wgmma kernel
  (``gemm_fp8``) with the two scales in its store.  Its error, measured as every program's
  against float64 of the unrounded float32 inputs, includes the quantization.

The float GEMM's schedule knobs are not read (as ``tc_kernel`` ignores the other kernels').
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, Mapping

import numpy as np

from tvm_ext.core.errors import TvmExtError
from tvm_ext.core.space import Config, Space
from tvm_ext.core.template import Template, TensorSpec
from tvm_ext.measure.program import CompiledProgram
from tvm_ext.precision.precision import EIGHT_BIT_DTYPES, sanity_tolerance, scaled_cast
from tvm_ext.target import TargetInfo

from .gemm_fp8 import FP8_FORMATS, OUT_DTYPES, Fp8GemmTemplate
from .wgmma import C_DTYPES, epilogue_for
from .wgmma import target_reason as wgmma_target_reason
from .wgmma_template import DTYPES as WGMMA_DTYPES
from .wgmma_template import WgmmaGemmTemplate


@dataclass(frozen=True)
class KernelGemmProgram(Template):
    """What both programs share: the GEMM (``gemm``, a ``GemmTemplate``: its shape, types and
    schedule knobs), its precision interface, a space that accepts the GEMM's configs where
    the kernel runs, and a build at the kernel's own pick."""

    gemm: Any

    OPERANDS: ClassVar[tuple[str, ...]] = ("a", "b")  # the parameters ``extra_dtypes`` are for
    EXTRA_DTYPES: ClassVar[tuple[str, ...]] = ()  # types only this program stores
    NOTE: ClassVar[str] = ""  # what it runs, for the search's log

    @staticmethod
    def target_reason(target: TargetInfo) -> str | None:
        """Why ``target`` has none of these kernels (None: it has them)."""
        return wgmma_target_reason(target)

    @classmethod
    def takes(cls, assignment: Mapping[str, str]) -> bool:
        """Whether ``assignment`` is this program's to run (it may still refuse the shape)."""
        raise NotImplementedError

    @classmethod
    def completed(cls, assignment: Mapping[str, str], choices: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
        """``assignment`` made runnable by this program where it is nearly one (unchanged here)."""
        return dict(assignment)

    # ---- the precision interface: the GEMM's ---------------------------------------------
    def precision_params(self) -> tuple[Any, ...]:
        return self.gemm.precision_params()

    @property
    def precision(self) -> dict[str, str]:
        return dict(self.gemm.precision)

    def with_precision(self, assignment: Mapping[str, str]) -> Any:
        """The GEMM with ``assignment``: this kind of program again where it takes it."""
        merged = {**self.precision, **assignment}
        floats = {k: v for k, v in merged.items() if v not in EIGHT_BIT_DTYPES}
        gemm = self.gemm.with_precision(floats)
        return type(self).of(gemm, merged) if type(self).takes(merged) else gemm

    @classmethod
    def of(cls, gemm: Any, assignment: Mapping[str, str]) -> Any:
        """``gemm`` (its float types already set) as this program, keeping of it what the
        program reads: no tensor-core tile or work-size rule."""
        return cls(replace(gemm, tensor_core=None, feasibility="tvm"))

    def full_precision(self) -> Any:
        return self.gemm.full_precision()

    def tensor_core_gemms(self) -> tuple[Any, ...]:
        return ()

    @property
    def tolerance(self) -> float:  # type: ignore[override]
        return sanity_tolerance(self.precision)

    # ---- can it run, and its build -------------------------------------------------------
    @property
    def kernel(self) -> Any:
        """The written kernel's template (raises where ``reason`` says it cannot run)."""
        raise NotImplementedError

    def own_reason(self) -> str | None:
        """Why this program's types or layout are not its kernel's (None: they are)."""
        raise NotImplementedError

    def reason(self, target: TargetInfo) -> str | None:
        """Why this program cannot run on ``target`` (None: it can)."""
        g = self.gemm
        if g.batch or g.b_transposed:
            return f"the {self.name} program has no batch axis and reads B as [K, N]"
        reason = self.own_reason() or self.target_reason(target)
        if reason:
            return reason
        try:
            self.kernel.default_config(target)
        except TvmExtError as exc:
            return str(exc)
        return None

    def space(self, target: TargetInfo) -> Space:
        """The float GEMM's knobs (a precision search's schedule config is one), none of them
        read; every config feasible exactly where the kernel runs."""
        return Space(self.gemm.full_precision().space(target).knobs, (lambda c: self.reason(target),))

    def default_config(self, target: TargetInfo) -> Config:
        return self.gemm.full_precision().default_config(target)

    def schedule(self, config: Config, target: TargetInfo) -> Any:
        raise TvmExtError(f"the {self.name} program is a written kernel, not scheduled: use build_program")

    def outputs(self) -> list[TensorSpec]:
        return self.gemm.outputs()

    def flops(self) -> float:
        return self.gemm.flops()


@dataclass(frozen=True)
class WgmmaGemmProgram(KernelGemmProgram):
    """``gemm`` with A and B both float16 or both bfloat16 and float32 sums, on the wgmma GEMM."""

    name = "gemm_wgmma_program"
    NOTE = "A and B both float16 or both bfloat16 with float32 sums on the wgmma GEMM (its own tile pick)"

    @classmethod
    def takes(cls, assignment: Mapping[str, str]) -> bool:
        return assignment.get("a") == assignment.get("b") in WGMMA_DTYPES and assignment.get("acc") == "float32"

    def own_reason(self) -> str | None:
        g = self.gemm
        if not self.takes(g.precision):
            return (f"a={g.a_dtype}, b={g.b_dtype}, acc={g.acc_dtype}: the wgmma GEMM takes A and B both "
                    f"{' or both '.join(WGMMA_DTYPES)} with float32 sums")
        if g.c_dtype not in C_DTYPES:
            return f"c={g.c_dtype}: the wgmma GEMM stores C as {', '.join(C_DTYPES)}"
        return None

    @property
    def kernel(self) -> WgmmaGemmTemplate:
        g = self.gemm
        return WgmmaGemmTemplate(g.m, g.n, g.k, b_layout="KN", dtype=g.a_dtype)

    def kernel_config(self, target: TargetInfo) -> Config:
        """The kernel's pick, C stored directly where it is not the operands' type (its
        shared-memory epilogue stages the operands' type only)."""
        config = self.kernel.default_config(target)
        return config.replace(**epilogue_for(self.kernel.tile(config), self.gemm.c_dtype).knobs())

    def build_program(self, config: Config, target: TargetInfo) -> CompiledProgram:
        from .wgmma import compile_wgmma

        reason = self.reason(target)
        if reason:
            raise TvmExtError(reason)
        kernel, picked = self.kernel, self.kernel_config(target)
        return compile_wgmma(kernel.kernel_func(picked, c_dtype=self.gemm.c_dtype), target, picked)

    @property
    def params(self) -> dict[str, Any]:
        return {**self.gemm.params, "kernel": "wgmma"}

    def inputs(self) -> list[TensorSpec]:
        return self.gemm.inputs()

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return self.gemm.reference(inputs)


@dataclass(frozen=True)
class EightBitGemmProgram(KernelGemmProgram):
    """``gemm`` (at float32 A and B, its other types set) with A and B stored as ``operands``
    (8-bit types, with per-tensor scales)."""

    operands: tuple[str, str] = ("float8_e4m3fn", "float8_e4m3fn")

    name = "gemm_8bit"
    EXTRA_DTYPES = EIGHT_BIT_DTYPES
    NOTE = "A and B in one 8-bit type (scaled per tensor) on the 8-bit wgmma GEMM"

    @classmethod
    def takes(cls, assignment: Mapping[str, str]) -> bool:
        return any(assignment.get(p) in EIGHT_BIT_DTYPES for p in cls.OPERANDS)

    @classmethod
    def of(cls, gemm: Any, assignment: Mapping[str, str]) -> "EightBitGemmProgram":
        operands = (assignment.get("a", gemm.a_dtype), assignment.get("b", gemm.b_dtype))
        return cls(replace(gemm, a_dtype="float32", b_dtype="float32", tensor_core=None, feasibility="tvm"), operands)

    @classmethod
    def completed(cls, assignment: Mapping[str, str], choices: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
        """``assignment`` as this program runs it where it stores A or B in 8 bits: both in
        that type (A's where both are 8-bit), float32 sums, C float16 or bfloat16 as
        ``choices`` allow (kept where it is one); other assignments unchanged."""
        eight = [assignment[p] for p in cls.OPERANDS if assignment.get(p) in EIGHT_BIT_DTYPES]
        if not eight:
            return dict(assignment)
        out = {**assignment, "a": eight[0], "b": eight[0], "acc": "float32"}
        if out.get("c") not in OUT_DTYPES:
            out["c"] = next((d for d in OUT_DTYPES if d in choices.get("c", ())), out.get("c", "float32"))
        return out

    @property
    def precision(self) -> dict[str, str]:
        return {**self.gemm.precision, "a": self.operands[0], "b": self.operands[1]}

    def own_reason(self) -> str | None:
        g, (a, b) = self.gemm, self.operands
        if a not in EIGHT_BIT_DTYPES or a != b:
            return (f"a={a}, b={b}: 8-bit operands run on the 8-bit wgmma GEMM, which takes A and B of one "
                    f"8-bit type ({' or '.join(EIGHT_BIT_DTYPES)})")
        if g.acc_dtype != "float32":
            return f"acc={g.acc_dtype}: the 8-bit wgmma GEMM accumulates in float32"
        if g.c_dtype not in OUT_DTYPES:
            return f"c={g.c_dtype}: the 8-bit wgmma GEMM stores C as {' or '.join(OUT_DTYPES)}"
        return None

    @property
    def kernel(self) -> Fp8GemmTemplate:
        g = self.gemm
        return Fp8GemmTemplate(g.m, g.n, g.k, fp8=FP8_FORMATS[self.operands[0]], out_dtype=g.c_dtype)

    def build_program(self, config: Config, target: TargetInfo) -> CompiledProgram:
        reason = self.reason(target)
        if reason:
            raise TvmExtError(reason)
        kernel = self.kernel
        return kernel.build_program(kernel.default_config(target), target)

    @property
    def params(self) -> dict[str, Any]:
        return {**self.gemm.params, "a_dtype": self.operands[0], "b_dtype": self.operands[1],
                "scales": "per_tensor", "b_stored": "transposed"}

    def inputs(self) -> list[TensorSpec]:
        g = self.gemm
        return [TensorSpec((g.m, g.k), self.operands[0]), TensorSpec((g.n, g.k), self.operands[1]),
                TensorSpec((2,), "float32")]

    def quantized(self, a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
        """The program's inputs from the float GEMM's: A and Bᵀ in 8 bits, their scales."""
        qa, scale_a = scaled_cast(a, self.operands[0])
        qbt, scale_b = scaled_cast(np.asarray(b).T, self.operands[1])
        return [qa, qbt, np.array([scale_a, scale_b], np.float32)]

    def make_case(self, rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The float GEMM's inputs quantized, and float64 of the unquantized ones."""
        full = self.full_precision()
        values = full.make_inputs(rng)
        return self.quantized(*values), full.reference(values)

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a, bt, scales = (np.asarray(x).astype(np.float64) for x in inputs)
        return [a @ bt.T * scales[0] * scales[1]]

    def float_inputs(self) -> list[dict[str, Any]]:
        """How a generated program's float inputs become its tensors (``precision.codegen``):
        each scaled to its 8-bit tensor (B transposed), its scale into ``scale_ab``."""
        g = self.gemm
        return [{"name": "a", "shape": [g.m, g.k], "tensor": 0, "transpose": False, "scale": [2, 0]},
                {"name": "b", "shape": [g.k, g.n], "tensor": 1, "transpose": True, "scale": [2, 1]}]
