"""Precision parameters: what method 003 (S2) calls the mixed-precision space.

A template that supports mixed precision names one ``PrecisionParam`` per tensor it
reads or writes, per accumulator and per stage-internal math type, each tied to the
stage (kernel function) it belongs to, so S3 can keep only the stages that matter.
``with_precision`` returns the same operator with some of them lowered; its inputs,
outputs and generated kernels carry those dtypes, and its workload key differs.

This module only knows dtypes and errors; which parameters exist is the template's
business, and the search over them is ``tvm_ext.precision.mixed_precision``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from ..core.errors import TvmExtError

# Highest precision first: the search starts from the first supported one.
FLOAT_DTYPES = ("float64", "float32", "bfloat16", "float16")
HIGH_PRECISION = "float32"  # the "full precision" program of S3 (what users run today)
PARAM_KINDS = ("tensor", "accumulator", "math")
# Storage of an operand with a per-tensor scale (``scaled_cast``): only an operator's 8-bit
# kernel reads these (a ``PrecisionProgram`` kernel program's), never a float kernel.
EIGHT_BIT_DTYPES = ("float8_e4m3fn", "float8_e5m2")


def np_dtype(name: str) -> np.dtype:
    """numpy dtype of a TVM dtype name; bfloat16 and the 8-bit floats (float8_e4m3fn,
    float8_e5m2) come from ml_dtypes (a TVM dependency)."""
    if name == "bfloat16" or name.startswith("float8_"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def cast(array: np.ndarray, dtype: str) -> np.ndarray:
    """``array`` rounded to ``dtype`` (round to nearest even, as the device does)."""
    return np.asarray(array.astype(np_dtype(dtype)), order="C")  # a 0-d array stays 0-d


def scaled_cast(array: np.ndarray, dtype: str) -> tuple[np.ndarray, float]:
    """``array`` stored in the 8-bit ``dtype`` with one float32 scale: ``q x scale`` is its
    value, the largest magnitude mapped to the format's largest finite value (448 for
    e4m3, 57344 for e5m2), as ``torch._scaled_mm``'s users scale per tensor; an all-zero
    array gets scale 1."""
    import ml_dtypes

    top = float(ml_dtypes.finfo(np_dtype(dtype)).max)
    largest = float(np.max(np.abs(array))) if array.size else 0.0
    if not np.isfinite(largest):  # an inf would scale every other value to zero
        raise TvmExtError(f"an array stored as {dtype} needs finite values for its scale, got {largest}")
    scale = np.float32(largest / top if largest > 0 else 1.0)
    # clipped: the largest value over a float32 scale may land a hair past ``top`` (e4m3 has no inf)
    scaled = np.clip(np.asarray(array, np.float64) / float(scale), -top, top)
    return cast(scaled, dtype), float(scale)


def itemsize(dtype: str) -> int:
    return np_dtype(dtype).itemsize


def example_array(rng: np.random.Generator, shape: Sequence[int], dtype: Any, name: str = "") -> np.ndarray:
    """An example input of a model's: floats from a standard normal; integers zero (a valid id of
    any table), but one in an input named as a mask (``attention_mask``: zeros would hide every
    key, and a check would see no attention); booleans true."""
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(tuple(shape)).astype(dtype)
    one = dtype == np.bool_ or "mask" in name.lower()
    return (np.ones if one else np.zeros)(tuple(shape), dtype)


@dataclass(frozen=True)
class PrecisionParam:
    """One precision choice of a program: a tensor's storage type, an accumulator's type,
    or the type a kernel does its elementwise math in."""

    name: str  # unique in the program: "a", "acc", "w_hh", "cell_math"
    stage: str  # the kernel function it belongs to (S3 keeps or drops whole stages)
    kind: str  # one of PARAM_KINDS
    doc: str = ""

    def __post_init__(self) -> None:
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"precision kind {self.kind!r}; allowed: {', '.join(PARAM_KINDS)}")


@dataclass(frozen=True)
class TensorCoreGemm:
    """A GEMM of an operator that has a tensor-core tile: a label, the precision parameters of
    its A and B operands, and the GEMM template (at full precision, with the tile), so a
    search can say which operand types run on the tensor cores."""

    label: str
    operands: tuple[str, str]
    gemm: Any  # a schedules.gemm.GemmTemplate with ``tensor_core`` set


@runtime_checkable
class MixedPrecisionOperator(Protocol):
    """What a template adds to take part in the mixed-precision search."""

    def precision_params(self) -> tuple[PrecisionParam, ...]: ...

    @property
    def precision(self) -> dict[str, str]:
        """The current assignment: parameter name -> dtype."""

    def with_precision(self, assignment: Mapping[str, str]) -> "MixedPrecisionOperator":
        """The same operator with the named parameters set (the others unchanged)."""

    def tensor_core_gemms(self) -> tuple[TensorCoreGemm, ...]:
        """The operator's GEMMs that have a tensor-core tile (none: every GEMM on CUDA cores)."""


def check_assignment(params: Sequence[PrecisionParam], assignment: Mapping[str, str]) -> None:
    """Unknown parameter names or dtypes: an error naming what is allowed."""
    names = {p.name for p in params}
    for name, dtype in assignment.items():
        if name not in names:
            raise TvmExtError(f"unknown precision parameter {name!r}; allowed: {', '.join(sorted(names))}")
        if dtype not in FLOAT_DTYPES:
            raise TvmExtError(f"{name}: unknown dtype {dtype!r}; allowed: {', '.join(FLOAT_DTYPES)}")


def unhonoured_reason(param: PrecisionParam, dtype: str, target_kind: str) -> str | None:
    """Why a target would not give ``param`` the precision ``dtype`` (None: it would).

    OpenCL has no bfloat16 arithmetic: TVM stores bfloat16 tensors as 16-bit words,
    rounded as the type demands, but computes every bfloat16 operation in float32 and
    keeps bfloat16 registers as float.  A bfloat16 accumulator or math type would
    silently be float32, and a program recorded (or exported) as bfloat16 would claim
    a precision its kernel does not have, so it is infeasible instead."""
    if dtype in EIGHT_BIT_DTYPES and target_kind != "cuda":
        return f"{param.name}={dtype}: only the 8-bit wgmma GEMM (CUDA, Hopper) reads 8-bit operands"
    if target_kind == "opencl" and dtype == "bfloat16" and param.kind in ("accumulator", "math"):
        return (f"{param.name}=bfloat16: OpenCL has no bfloat16 arithmetic (TVM computes it in float32), "
                f"so this {param.kind} would really be float32")
    return None


def precision_reason(params: Sequence[PrecisionParam], assignment: Mapping[str, str],
                     target_kind: str) -> str | None:
    """The first parameter of ``assignment`` the target cannot honour, as a reason."""
    for param in params:
        reason = unhonoured_reason(param, assignment.get(param.name, HIGH_PRECISION), target_kind)
        if reason:
            return reason
    return None


def relative_error(outputs: Sequence[np.ndarray], refs: Sequence[np.ndarray]) -> float:
    """The program's error: the largest normwise relative error over its outputs,
    ``‖out − ref‖₂ / ‖ref‖₂`` against the float64 reference (inf for NaN or inf)."""
    worst = 0.0
    for out, ref in zip(outputs, refs):
        with np.errstate(invalid="ignore"):  # a signalling NaN widens to NaN: the check below says inf
            out64 = np.asarray(out).astype(np.float64)
        ref64 = np.asarray(ref, dtype=np.float64)
        if not np.all(np.isfinite(out64)):
            return float("inf")
        denom = max(float(np.linalg.norm(ref64)), 1e-30)
        worst = max(worst, float(np.linalg.norm(out64 - ref64)) / denom)
    return worst


def sanity_tolerance(assignment: Mapping[str, str]) -> float:
    """The error beyond which a result is a wrong kernel, not a rounding effect.

    At float32 and above that is 1e-4 (as for every template); once anything is
    lowered, rounding alone may reach a few 1e-3, so only gross errors (> 0.1) are
    rejected as wrong answers: the rest is recorded and judged against the bound.
    """
    if any(d in EIGHT_BIT_DTYPES for d in assignment.values()):
        return 0.3  # e5m2 keeps 2 bits of mantissa: rounding alone gives a few 1e-2
    lowered = any(d in ("float16", "bfloat16") for d in assignment.values())
    return 0.1 if lowered else 1e-4


class DtypeFields:
    """Mixin for frozen-dataclass templates that keep each precision parameter ``p`` in a
    field ``p_dtype`` and list them in ``PRECISION_PARAMS``: the MixedPrecisionOperator
    methods, written once."""

    PRECISION_PARAMS: ClassVar[tuple[PrecisionParam, ...]] = ()

    def precision_params(self) -> tuple[PrecisionParam, ...]:
        return self.PRECISION_PARAMS

    @property
    def precision(self) -> dict[str, str]:
        """The current assignment: parameter name -> dtype."""
        return {p.name: getattr(self, f"{p.name}_dtype") for p in self.PRECISION_PARAMS}

    def with_precision(self, assignment: Mapping[str, str]) -> Any:
        """The same operator with the named parameters set (the others unchanged)."""
        check_assignment(self.PRECISION_PARAMS, assignment)
        return dataclasses.replace(self, **{f"{name}_dtype": d for name, d in assignment.items()})  # type: ignore[type-var]

    def full_precision(self) -> Any:
        return self.with_precision({p.name: HIGH_PRECISION for p in self.PRECISION_PARAMS})

    def tensor_core_gemms(self) -> tuple[TensorCoreGemm, ...]:
        return ()

    def precision_reason(self, target_kind: str) -> str | None:
        """Why ``target_kind`` cannot run this assignment as declared (None: it can)."""
        return precision_reason(self.PRECISION_PARAMS, self.precision, target_kind)

    @property
    def tolerance(self) -> float:
        return sanity_tolerance(self.precision)
