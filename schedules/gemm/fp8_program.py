"""The GEMM program with 8-bit operands: what the mixed-precision search (method 003) runs when
it stores A and B of ``GemmTemplate`` in 8 bits.

A and B each get a per-tensor float32 scale (``precision.scaled_cast``: the largest magnitude
to the format's largest value), B is stored transposed (N, K) as wgmma reads 8-bit operands
K-major only, and the product runs on the 8-bit wgmma kernel (``gemm_fp8``) at the tile it
picks without measuring, the two scales in its store.  The float GEMM's schedule knobs are not
read (as ``tc_kernel`` ignores the other kernels' knobs).  Its error is measured as every
program's: against float64 of the unrounded float32 inputs, so it includes the quantization.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from tvm_ext.core.errors import TvmExtError
from tvm_ext.core.space import Config, Space
from tvm_ext.core.template import Template, TensorSpec
from tvm_ext.measure.program import CompiledProgram
from tvm_ext.precision.precision import EIGHT_BIT_DTYPES, sanity_tolerance, scaled_cast
from tvm_ext.target import TargetInfo

from .gemm_fp8 import FP8_FORMATS, OUT_DTYPES, Fp8GemmTemplate
from .wgmma import target_reason as wgmma_target_reason


@dataclass(frozen=True)
class EightBitGemmProgram(Template):
    """``gemm`` (a ``GemmTemplate`` at its other parameters' types) with A and B stored as
    ``operands`` (8-bit types, with per-tensor scales)."""

    gemm: Any
    operands: tuple[str, str]

    name = "gemm_8bit"
    OPERANDS = ("a", "b")  # the precision parameters that may be 8-bit

    @classmethod
    def of(cls, gemm: Any, assignment: Mapping[str, str]) -> "EightBitGemmProgram":
        """``gemm`` with the 8-bit types of ``assignment`` (its other types already set); of
        the GEMM only what the 8-bit program reads is kept (its shape, accumulator and C, the
        schedule knobs it accepts): float32 A and B, no tensor-core tile or work-size rule."""
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

    @staticmethod
    def target_reason(target: TargetInfo) -> str | None:
        """Why ``target`` has no 8-bit GEMM (None: it has one)."""
        return wgmma_target_reason(target)

    # ---- the precision interface: the GEMM's parameters, A and B 8-bit ---------------------
    def precision_params(self) -> tuple[Any, ...]:
        return self.gemm.precision_params()

    @property
    def precision(self) -> dict[str, str]:
        return {**self.gemm.precision, "a": self.operands[0], "b": self.operands[1]}

    def with_precision(self, assignment: Mapping[str, str]) -> Any:
        """The GEMM with ``assignment``: this program again if A or B stays 8-bit, else the GEMM."""
        merged = {**self.precision, **assignment}
        floats = {k: v for k, v in merged.items() if v not in EIGHT_BIT_DTYPES}
        gemm = self.gemm.with_precision(floats)
        return type(self).of(gemm, merged) if len(floats) < len(merged) else gemm

    def full_precision(self) -> Any:
        return self.gemm.full_precision()

    def tensor_core_gemms(self) -> tuple[Any, ...]:
        return self.gemm.tensor_core_gemms()

    @property
    def tolerance(self) -> float:  # type: ignore[override]
        return sanity_tolerance(self.precision)

    # ---- can it run ------------------------------------------------------------------------
    @property
    def kernel(self) -> Fp8GemmTemplate:
        """The 8-bit wgmma GEMM this program runs (raises where ``reason`` says it cannot)."""
        g = self.gemm
        return Fp8GemmTemplate(g.m, g.n, g.k, fp8=FP8_FORMATS[self.operands[0]], out_dtype=g.c_dtype)

    def reason(self, target: TargetInfo) -> str | None:
        """Why this program cannot run on ``target`` (None: it can)."""
        g, (a, b) = self.gemm, self.operands
        if a not in EIGHT_BIT_DTYPES or a != b:
            return (f"a={a}, b={b}: 8-bit operands run on the 8-bit wgmma GEMM, which takes A and B of one "
                    f"8-bit type ({' or '.join(EIGHT_BIT_DTYPES)})")
        if g.acc_dtype != "float32":
            return f"acc={g.acc_dtype}: the 8-bit wgmma GEMM accumulates in float32"
        if g.c_dtype not in OUT_DTYPES:
            return f"c={g.c_dtype}: the 8-bit wgmma GEMM stores C as {' or '.join(OUT_DTYPES)}"
        if g.batch or g.b_transposed:
            return "the 8-bit GEMM program has no batch axis and reads B as [K, N]"
        reason = self.target_reason(target)
        if reason:
            return reason
        try:
            self.kernel.default_config(target)
        except TvmExtError as exc:
            return str(exc)
        return None

    def space(self, target: TargetInfo) -> Space:
        """The float GEMM's knobs (a precision search's schedule config is one), none of them
        read; every config feasible exactly where the 8-bit kernel runs."""
        return Space(self.gemm.full_precision().space(target).knobs, (lambda c: self.reason(target),))

    def default_config(self, target: TargetInfo) -> Config:
        return self.gemm.full_precision().default_config(target)

    # ---- build and measure -----------------------------------------------------------------
    def schedule(self, config: Config, target: TargetInfo) -> Any:
        raise TvmExtError("the 8-bit GEMM is written as a PrimFunc, not scheduled: use build_program")

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

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec((self.gemm.m, self.gemm.n), self.gemm.c_dtype)]

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

    def flops(self) -> float:
        return self.gemm.flops()

    def float_inputs(self) -> list[dict[str, Any]]:
        """How a generated program's float inputs become its tensors (``precision.codegen``):
        each scaled to its 8-bit tensor (B transposed), its scale into ``scale_ab``."""
        g = self.gemm
        return [{"name": "a", "shape": [g.m, g.k], "tensor": 0, "transpose": False, "scale": [2, 0]},
                {"name": "b", "shape": [g.k, g.n], "tensor": 1, "transpose": True, "scale": [2, 1]}]
