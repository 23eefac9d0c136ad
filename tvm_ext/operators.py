"""The registry of operators: one ``Operator`` entry per template, read by everything that
lists operators.

A record names its template (``Workload.template``); ``OPERATORS`` maps that name to how the
template is rebuilt from the record's parameters (``template_of``: ``show``, ``report``,
``export``, the cost model), the ``tune`` subcommand that tunes it (``tune.build_parser``),
the Relax matchers that produce it (``tasks.MATCHERS`` names), its ``mixed-precision``
subcommand (``mp_cli``), and what it explicitly does not support, with the reason.  Adding an
operator is its template in ``schedules/`` and one entry here.

Schedule modules are imported on first use (the CLI starts fast), and nothing here imports
the tuning core: the core never needs the registry.
"""
from __future__ import annotations

import argparse
import importlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .cli import operator_cli as cli
from .core.errors import TvmExtError

if TYPE_CHECKING:
    from .core.space import Knob
    from .core.template import Template

__all__ = ["CAPABILITIES", "OPERATORS", "Operator", "PrecisionCommand", "TuneCommand", "get_template_class",
           "operator_named", "template_names", "template_of"]

# What an entry may declare ``unsupported``: its own ``tune`` subcommand and ``tune export``.
CAPABILITIES = ("tune", "export")


@dataclass(frozen=True)
class TuneCommand:
    """A ``python -m tvm_ext.tune`` subcommand that tunes an operator: its own arguments and
    the template they make (the tuning arguments every subcommand shares are added by
    ``tune.build_parser``).  Several entries may share one (``gemm-tc --kernel``)."""

    command: str
    help: str
    description: str
    knobs: Callable[[], Sequence[Knob]]  # listed in the subcommand's help
    add_arguments: Callable[[argparse.ArgumentParser], None]
    make_template: Callable[[argparse.Namespace], Template]
    example: tuple[str, ...]  # a minimal argument set (a small shape): the registry's test parses it


@dataclass(frozen=True)
class PrecisionCommand:
    """A ``mixed-precision`` subcommand (the mixed-precision search on the operator): its
    arguments, the float32 operator they make and how it takes the tensor cores on CUDA."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    make_operator: Callable[[argparse.Namespace], Template]
    tensor_cores: Callable[[Any, argparse.Namespace, Any], Any]  # (operator, args, target) -> operator
    example: tuple[str, ...]
    # (args, target) -> its programs on written kernels (``mixed_precision.KernelProgram``) there
    kernel_programs: Callable[[argparse.Namespace, Any], tuple[type, ...]] | None = None


@dataclass(frozen=True)
class Operator:
    """One operator: its template (by the name records carry), how a record rebuilds it, how
    the CLI tunes it, which Relax matchers produce it, its mixed-precision subcommand, and
    ``unsupported``: each of ``CAPABILITIES`` it lacks, with the reason (never silently)."""

    name: str
    template_class: Callable[[], type[Template]]  # imports the class on first use
    # record params -> constructor arguments, where they differ (fixed dtypes a record names)
    constructor_args: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    tune: TuneCommand | None = None
    tune_selector: tuple[str, ...] = ()  # the arguments of ``tune``'s subcommand that choose this template
    matchers: tuple[str, ...] = ()  # ``tasks.MATCHERS`` entries whose template this is
    precision: PrecisionCommand | None = None
    unsupported: Mapping[str, str] = field(default_factory=dict)  # capability -> why not
    # record params of a small instance, for an entry without a tune subcommand (whose example
    # arguments make one): what the registry's test round-trips, shows and exports
    example: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.unsupported) - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"{self.name}: unknown capabilities {sorted(unknown)}; known: {CAPABILITIES}")
        if (self.tune is None) != ("tune" in self.unsupported):
            raise ValueError(f"{self.name}: a tune subcommand, or 'tune' in unsupported with the reason")
        if self.tune is None and not self.example:
            raise ValueError(f"{self.name}: without a tune subcommand, an example instance's params")

    def rebuild(self, params: Mapping[str, Any]) -> Template:
        """The template at a record's workload parameters (``TvmExtError``/``TypeError`` when
        they are not this template's)."""
        args = self.constructor_args(params) if self.constructor_args else dict(params)
        return self.template_class()(**args)

    @property
    def precision_params(self) -> tuple[str, ...]:
        """The tensors whose dtypes the mixed-precision search varies (the template's ``PRECISION_PARAMS``)."""
        return tuple(p.name for p in getattr(self.template_class(), "PRECISION_PARAMS", ()))

    def unsupported_error(self, capability: str) -> TvmExtError | None:
        """The one-line error for ``capability`` when this operator does not support it."""
        reason = self.unsupported.get(capability)
        return None if reason is None else TvmExtError(f"{capability} does not support {self.name}: {reason}")


# ---- the template classes, imported on first use ---------------------------------------------------
def _lazy(module: str, name: str) -> Callable[[], type[Template]]:
    """A loader of template class ``name`` of ``tvm_ext.<module>``, imported on its first call
    (the registry imports no schedule module)."""

    def load() -> type[Template]:
        return getattr(importlib.import_module(f"tvm_ext.{module}"), name)

    load.__qualname__ = load.__name__ = f"load_{name}"
    return load


_gemm = _lazy("schedules.gemm.simt", "GemmTemplate")
_gemm_8bit = _lazy("schedules.gemm.gemm_programs", "EightBitGemmProgram")
_gemm_wgmma_program = _lazy("schedules.gemm.gemm_programs", "WgmmaGemmProgram")
_gemm_bias = _lazy("schedules.gemm.simt", "BiasGemmTemplate")
_gemm_tc_any = _lazy("schedules.gemm.tensor_core_choice", "TensorCoreChoiceTemplate")
_gemm_mma = _lazy("schedules.gemm.mma", "MmaGemmTemplate")
_gemm_tc = _lazy("schedules.gemm.tensor_core", "TensorCoreGemmTemplate")
_gemm_wgmma = _lazy("schedules.gemm.wgmma_template", "WgmmaGemmTemplate")
_gemm_3xtf32 = _lazy("schedules.gemm.gemm_3xtf32", "Gemm3xTf32Template")
_gemm_fp8 = _lazy("schedules.gemm.gemm_fp8", "Fp8GemmTemplate")
_reduce = _lazy("schedules.reduce.reduction", "ReductionTemplate")
_rows = _lazy("schedules.reduce.rows", "RowTemplate")
_gru = _lazy("schedules.gru", "GruTemplate")
_lstm = _lazy("schedules.lstm", "LstmTemplate")


def _fp8_args(params: Mapping[str, Any]) -> dict[str, Any]:
    """Record params -> ``Fp8GemmTemplate`` arguments: A and B of one 8-bit float, float32
    accumulate, per-tensor scales, C float16 or bfloat16."""
    from .schedules.gemm.gemm_fp8 import FP8_FORMATS

    out = dict(params)
    dtype = out.pop("a_dtype", None)
    if dtype not in FP8_FORMATS:
        raise TvmExtError(f"a_dtype {dtype!r}: this template takes {' or '.join(FP8_FORMATS)} only")
    c_dtype = out.pop("c_dtype", "float16")
    if out.pop("b_shared", True) is not True:
        raise TvmExtError("b_shared false: an 8-bit GEMM's batch shares one Bt")
    out = fixed_dtypes(b_dtype=dtype, acc_dtype="float32", scales="per_tensor")(out)
    return {**out, "fp8": FP8_FORMATS[dtype], "out_dtype": c_dtype}


def fixed_dtypes(**dtypes: str) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """Record params -> constructor arguments for a template whose ``params`` name dtypes it
    fixes (``gemm_3xtf32``: float32 throughout): those are checked and dropped; a record naming
    other dtypes is not this template's."""
    def args(params: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(params)
        for name, dtype in dtypes.items():
            value = out.pop(name, dtype)
            if value != dtype:
                raise TvmExtError(f"{name} {value!r}: this template takes {dtype} only")
        if isinstance(out.get("batch"), list):  # JSON has no tuples
            out["batch"] = tuple(out["batch"])
        return out
    return args


def _wgmma_args(params: Mapping[str, Any]) -> dict[str, Any]:
    """Record params -> ``WgmmaGemmTemplate`` arguments: A, B and C of one dtype (float16 or
    bfloat16: its ``dtype``), float32 accumulate; a record naming other dtypes is not its."""
    out = dict(params)
    dtype = out.pop("a_dtype", "float16")
    if dtype not in ("float16", "bfloat16"):
        raise TvmExtError(f"a_dtype {dtype!r}: this template takes float16 or bfloat16 only")
    out = fixed_dtypes(b_dtype=dtype, acc_dtype="float32", c_dtype=dtype)(out)
    return {**out, "dtype": dtype} if dtype != "float16" else out


_WGMMA_NAME = re.compile(r"wgmma (?:(\w+) )?(\d+)x(\d+)x\d+ s(\d+) w(\d+) (smem|direct)(?: r(\d+))?(?: t(\d+))?"
                         r"(?: k/(\d+))?( cluster)?( tma)?( ws)?( multicast)?( pdl)?")


def wgmma_tile_named(name: str) -> Any:
    """The ``WgmmaTile`` whose ``name`` (what a record's params hold) is ``name``."""
    from .schedules.gemm.wgmma import WgmmaTile

    found = _WGMMA_NAME.fullmatch(name) if isinstance(name, str) else None
    if found is None:
        raise TvmExtError(f"not a wgmma tile: {name!r}")
    operand, bm, bn, stages, inflight, epilogue, raster, tiles, split, cluster, tma, ws, multicast, pdl = found.groups()
    tile = WgmmaTile(int(bm), int(bn), int(stages), int(inflight), epilogue == "smem", int(raster or 0),
                     tiles=int(tiles or 1), split=int(split or 1), cluster=bool(cluster), operand=operand or "float16",
                     tma=bool(tma), specialized=bool(ws), multicast=bool(multicast), pdl=bool(pdl))
    if tile.name != name:  # e.g. a k step that is not the operand's
        raise TvmExtError(f"not a wgmma tile: {name!r}")
    return tile


def _tensor_core_tile(text: Any) -> Any:
    """A tensor-core tile from its text in a record (``str(tile)``: its knobs as k=v,...)."""
    from .schedules.gemm.tensor_core import parse_tile

    return parse_tile(text) if isinstance(text, str) else text


def _gemm_args(params: Mapping[str, Any]) -> dict[str, Any]:
    """Record params -> ``GemmTemplate`` arguments: a tensor-core tile is recorded as its text."""
    out = dict(params)
    if "tensor_core" in out:
        out["tensor_core"] = _tensor_core_tile(out["tensor_core"])
    return out


def _gemm_8bit_args(params: Mapping[str, Any]) -> dict[str, Any]:
    """Record params -> ``EightBitGemmProgram`` arguments: the GEMM's and the 8-bit operands."""
    from .schedules.gemm.simt import GemmTemplate

    own = ("a_dtype", "b_dtype", "scales", "b_stored")
    return {"gemm": GemmTemplate(**_gemm_args({k: v for k, v in params.items() if k not in own})),
            "operands": (params["a_dtype"], params["b_dtype"])}


def _gemm_wgmma_program_args(params: Mapping[str, Any]) -> dict[str, Any]:
    """Record params -> ``WgmmaGemmProgram`` arguments: the GEMM's."""
    from .schedules.gemm.simt import GemmTemplate

    return {"gemm": GemmTemplate(**_gemm_args({k: v for k, v in params.items() if k != "kernel"}))}


def _gru_args(params: Mapping[str, Any]) -> dict[str, Any]:
    """Record params -> ``GruTemplate`` arguments: tensor-core tiles are recorded as their text,
    wgmma tiles as their names (the float16 input GEMM's under ``in_wgmma``, the unfused steps'
    hidden GEMM's under ``hid_wgmma``, its float32 one on TF32 parts under ``hid_tf32``)."""
    out = dict(params)
    for name in ("in_tensor_core", "hid_tensor_core", "in_split_tensor_core"):
        if name in out:
            out[name] = _tensor_core_tile(out[name])
    for key, name in (("in_split_wgmma", "in_split_wgmma"), ("in_split_tf32", "in_split_tf32"),
                      ("in_wgmma", "in_wgmma_tile"), ("hid_wgmma", "hid_wgmma_tile"), ("hid_tf32", "hid_tf32_tile")):
        if key in out:
            out[name] = wgmma_tile_named(out.pop(key))
    return out


# ---- the subcommands -------------------------------------------------------------------------------------
_SHAPE = ("--shape", "128,128,64")

GEMM_TUNE = TuneCommand(
    "gemm", help="fp32 GEMM C[M,N] = A[M,K]·B[K,N]",
    description="Tune fp32 GEMM C[M,N] = A[M,K]·B[K,N] with the parallel genetic algorithm.",
    knobs=cli.gemm_knobs, add_arguments=cli.add_gemm_args, make_template=cli.gemm_template, example=_SHAPE)

GEMM_TC_TUNE = TuneCommand(
    "gemm-tc", help="float16/bfloat16 GEMM on tensor cores (CUDA): the kernel (mma.sync, WMMA or Hopper's "
                    "wgmma) and its tile are what is searched",
    description="Tune C[M,N] = A[M,K]·B[K,N] with float16 (or bfloat16) A and B on the tensor cores (CUDA): "
                "the GA searches the kernel (--kernel any: mma.sync with ldmatrix, WMMA, or on Hopper wgmma) "
                "and its tile; --strategy analytic gives a tile without measuring.",
    knobs=cli.gemm_tc_knobs, add_arguments=cli.add_gemm_tc_args, make_template=cli.gemm_tc_template,
    example=_SHAPE)

GEMM_WGMMA_TUNE = TuneCommand(
    "gemm-wgmma", help="float16/bfloat16 GEMM C = A·Btᵀ (Bt stored N×K, a Linear weight) on Hopper's warpgroup "
                       "MMA",
    description="Tune C[M,N] = A[M,K]·Bt[N,K]ᵀ, float16 (--dtype bfloat16: bfloat16) in and out, float32 "
                "accumulate, on Hopper's "
                "wgmma (sm_90): the tile, the cp.async pipeline and the epilogue are what is searched.",
    knobs=cli.gemm_wgmma_knobs, add_arguments=cli.add_gemm_wgmma_args, make_template=cli.gemm_wgmma_template,
    example=("--shape", "128,128,128"))

GEMM_3XTF32_TUNE = TuneCommand(
    "gemm-3xtf32", help="float32 GEMM C = A·B at float32 accuracy on Hopper's TF32 tensor cores (3 products)",
    description="Tune float32 C[M,N] = A[M,K]·B[K,N] computed as three TF32 products on Hopper's wgmma "
                "(sm_90), each operand split into two TF32 parts, the tensor cores' sums promoted into "
                "round-to-nearest float32 adds: the tile, the pipeline and the promotion are what is searched.",
    knobs=cli.gemm_3xtf32_knobs, add_arguments=cli.add_gemm_3xtf32_args, make_template=cli.gemm_3xtf32_template,
    example=("--shape", "128,128,64"))

GEMM_FP8_TUNE = TuneCommand(
    "gemm-fp8", help="8-bit float GEMM C = (A·Btᵀ) x scale_a x scale_b on Hopper's wgmma (e4m3 or e5m2)",
    description="Tune C[M,N] = (A[M,K]·Bt[N,K]ᵀ) x scale_a x scale_b with A and Bt 8-bit floats (e4m3 or e5m2, "
                "K-major), per-tensor float32 scales, float32 accumulate and float16 (or bfloat16) C on Hopper's "
                "wgmma (sm_90), as torch._scaled_mm computes it: the tile, the pipeline (cp.async or TMA loads) "
                "and the promotion of the sums (how often, overlapped or not; --promote fixes how often) are "
                "what is searched.",
    knobs=cli.gemm_fp8_knobs, add_arguments=cli.add_gemm_fp8_args, make_template=cli.gemm_fp8_template,
    example=("--shape", "128,128,128"))

def _lstm_args(params: Mapping[str, Any]) -> dict[str, Any]:
    """Record params -> ``LstmTemplate`` arguments: the input GEMM's tensor-core tile as its text."""
    out = dict(params)
    if "in_tensor_core" in out:
        out["in_tensor_core"] = _tensor_core_tile(out["in_tensor_core"])
    return out


REDUCE_TUNE = TuneCommand(
    "reduce", help="reduction of a vector, or of each row of a matrix (sum, max, min, mean, sumsq)",
    description="Tune a full 1-D reduction (--shape N) or a row-wise reduction (--shape ROWS,COLS) "
                "from the x/z/w vector split plan (the default config) with the genetic algorithm.",
    knobs=cli.reduce_knobs, add_arguments=cli.add_reduce_args, make_template=cli.reduce_template,
    example=("--shape", "64,256"))

GRU_TUNE = TuneCommand(
    "gru", help="GRU inference layer (torch.nn.GRU semantics): the whole forward pass",
    description="Tune a GRU layer stack (the input GEMM, per-step hidden GEMM and cell kernel pipeline, and "
                "its fusions): cell block size, "
                "step fusion and both gate GEMMs' tiles, timing the whole forward pass.",
    knobs=cli.gru_knobs, add_arguments=cli.add_gru_shape_args, make_template=cli.gru_template,
    example=("--batch", "2", "--hidden", "32", "--input", "16", "--seq", "3"))

LSTM_TUNE = TuneCommand(
    "lstm", help="LSTM inference layer (torch.nn.LSTM semantics): the whole forward pass",
    description="Tune an LSTM layer stack (the input GEMM, then the fused step kernel on four gates, a launch "
                "per step, looped in TVM's host code or persistent): the step kernel's tiles and loop and the "
                "input GEMM's tile, timing the whole forward pass.",
    knobs=cli.lstm_knobs, add_arguments=cli.add_lstm_shape_args, make_template=cli.lstm_template,
    example=("--batch", "2", "--hidden", "12", "--input", "5", "--seq", "3"))

GEMM_PRECISION = PrecisionCommand(
    help="C = A·B: dtypes of A, B, C and the accumulator", add_arguments=cli.add_gemm_precision_args,
    make_operator=cli.gemm_precision_operator, tensor_cores=cli.gemm_tensor_cores, example=_SHAPE,
    kernel_programs=cli.gemm_kernel_programs)

GRU_PRECISION = PrecisionCommand(
    help="a GRU layer: dtypes of x, weights, gate buffers, state, output, both accumulators and the cell's math",
    add_arguments=cli.add_gru_precision_args, make_operator=cli.gru_template, tensor_cores=cli.gru_tensor_cores,
    example=GRU_TUNE.example)

_NO_TUNE_BIAS = ("no subcommand of its own: the GEMM with a bias row is tuned as the GRU's input GEMM "
                 "and by the Python API")
_NO_TUNE_8BIT = ("no subcommand of its own: the mixed-precision search runs it where it stores a GEMM's A and B "
                 "in 8 bits (mixed-precision gemm); its kernel is tuned as gemm-fp8")
_NO_TUNE_16BIT = ("no subcommand of its own: the mixed-precision search runs it where a GEMM's A and B are both "
                  "float16 or both bfloat16 with float32 sums on Hopper (mixed-precision gemm); its kernel is tuned "
                  "as gemm-wgmma")
_NO_TUNE_ROWS = "no subcommand of its own: row operators are tuned as the kernels of a Relax model (tune model)"


# ---- the registry: records name these; the order is the CLI's ---------------------------------------------
OPERATORS: dict[str, Operator] = {op.name: op for op in (
    Operator("gemm", _gemm, _gemm_args, tune=GEMM_TUNE, matchers=("gemm",), precision=GEMM_PRECISION),
    Operator("gemm_bias", _gemm_bias, _gemm_args, unsupported={"tune": _NO_TUNE_BIAS},
             example={"m": 128, "n": 128, "k": 64}),
    Operator("gemm_8bit", _gemm_8bit, _gemm_8bit_args, unsupported={"tune": _NO_TUNE_8BIT},
             example={"m": 128, "n": 128, "k": 128, "a_dtype": "float8_e4m3fn", "b_dtype": "float8_e4m3fn",
                      "acc_dtype": "float32", "c_dtype": "float16", "scales": "per_tensor", "b_stored": "transposed"}),
    Operator("gemm_wgmma_program", _gemm_wgmma_program, _gemm_wgmma_program_args, unsupported={"tune": _NO_TUNE_16BIT},
             example={"m": 128, "n": 128, "k": 128, "a_dtype": "float16", "b_dtype": "float16",
                      "acc_dtype": "float32", "c_dtype": "float32", "kernel": "wgmma"}),
    Operator("gemm_tc_any", _gemm_tc_any, tune=GEMM_TC_TUNE),
    Operator("gemm_mma", _gemm_mma, tune=GEMM_TC_TUNE, tune_selector=("--kernel", "mma"),
             matchers=("tensor_core",)),
    Operator("gemm_tc", _gemm_tc, tune=GEMM_TC_TUNE, tune_selector=("--kernel", "wmma")),
    Operator("gemm_wgmma", _gemm_wgmma, _wgmma_args, tune=GEMM_WGMMA_TUNE, matchers=("wgmma",)),
    Operator("gemm_3xtf32", _gemm_3xtf32, fixed_dtypes(a_dtype="float32", b_dtype="float32", acc_dtype="float32",
                                                       c_dtype="float32"),
             tune=GEMM_3XTF32_TUNE, matchers=("tf32",)),
    Operator("gemm_fp8", _gemm_fp8, _fp8_args, tune=GEMM_FP8_TUNE, matchers=("fp8",)),
    Operator("reduce", _reduce, tune=REDUCE_TUNE),
    Operator("rows", _rows, matchers=("rows",), unsupported={"tune": _NO_TUNE_ROWS},
             example={"op": "softmax", "rows": 64, "n": 256, "dtype": "float32"}),
    Operator("gru", _gru, _gru_args, tune=GRU_TUNE, precision=GRU_PRECISION),
    Operator("lstm", _lstm, _lstm_args, tune=LSTM_TUNE),
)}


def tune_commands(operators: Mapping[str, Operator] | None = None) -> list[TuneCommand]:
    """The ``tune`` subcommands of ``operators`` (the registry by default), each once, in order."""
    commands: dict[str, TuneCommand] = {}
    for op in (OPERATORS if operators is None else operators).values():
        if op.tune is not None:
            commands.setdefault(op.tune.command, op.tune)
    return list(commands.values())


def precision_operators(operators: Mapping[str, Operator] | None = None) -> list[Operator]:
    """The operators with a ``mixed-precision`` subcommand, in registry order."""
    return [op for op in (OPERATORS if operators is None else operators).values() if op.precision is not None]


def operator_named(name: str) -> Operator:
    """The entry of template ``name``; an error listing the known ones otherwise."""
    if name not in OPERATORS:
        raise TvmExtError(f"unknown template {name!r}; available: {', '.join(template_names())}")
    return OPERATORS[name]


def template_of(workload: Mapping[str, Any]) -> Template | None:
    """Rebuild the template of a record's workload (None when its shape cannot be)."""
    try:
        return operator_named(workload["template"]).rebuild(workload["params"])
    except Exception:
        return None


def template_names() -> tuple[str, ...]:
    return tuple(sorted(OPERATORS))


def get_template_class(name: str) -> type[Template]:
    return operator_named(name).template_class()
