"""Each operator's own command-line part: the arguments its ``tune`` subcommand and its
``mixed-precision`` subcommand add, and the template those arguments make.

``tvm_ext.operators`` names these functions in its registry; ``tune.build_parser`` and
``mp_cli`` add the arguments every subcommand shares.  Schedule modules are imported
inside the functions so the CLI starts fast and nothing here imports the tuning core.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Sequence

from .cli_parse import parse_batch, parse_shape
from ..core.errors import TvmExtError
from ..core.space import Knob

TILE_HELP = ("tensor-core tile for {what} are both float16 or both bfloat16 (mma.sync), or float16 "
             "(WMMA), on CUDA: auto (default: picked for {where}, mma.sync where one of its tiles fits, else "
             "WMMA), none, mma / wmma (that kernel's 128x128x32 tile), or one kernel's knobs as k=v,... "
             "(mma_ knobs: mma.sync, tc_ knobs: WMMA)")


# ---- tune: GEMM on the CUDA cores (and OpenCL) ---------------------------------------------------
def gemm_knobs() -> Sequence[Knob]:
    from ..schedules.gemm.simt import KNOBS as GEMM_KNOBS, STAGING_KNOBS

    return GEMM_KNOBS + STAGING_KNOBS


def add_gemm_args(gemm: argparse.ArgumentParser) -> None:
    gemm.add_argument("--shape", required=True, help="M,N,K (e.g. 512,512,512)")
    gemm.add_argument("--staging", action="store_true",
                      help="also search the staging knobs (prefetch, warp_x, load_vec; listed last below)")
    gemm.add_argument("--feasibility", default="tvm", choices=("tvm", "patent"),
                      help="tvm: tile fits the device limits (default); patent: also wg_x·wg_y·task_x·task_y | P·P")


def gemm_template(args: argparse.Namespace) -> Any:
    from ..schedules.gemm.simt import GemmTemplate

    return GemmTemplate.from_shape(parse_shape(args.shape, ("M", "N", "K")), feasibility=args.feasibility,
                                   staging=args.staging)


# ---- tune: GEMM on the tensor cores (mma.sync, WMMA, or the search's choice) ---------------------
def gemm_tc_knobs() -> Sequence[Knob]:
    from ..schedules.gemm.tensor_core_choice import CHOICE_KNOBS

    return CHOICE_KNOBS


def add_gemm_tc_args(gemm_tc: argparse.ArgumentParser) -> None:
    from ..schedules.gemm.mma import ACC_DTYPES, OPERAND_DTYPES

    gemm_tc.add_argument("--shape", required=True, help="M,N,K; N and K multiples of 16 (e.g. 4096,4096,4096)")
    gemm_tc.add_argument("--kernel", default="any", choices=("any", "mma", "wmma"),
                         help="any: the search picks mma.sync, WMMA or (Hopper) wgmma (default); mma / wmma: that "
                              "kernel only")
    gemm_tc.add_argument("--in-dtype", default="float16", choices=OPERAND_DTYPES,
                         help="A and B (default float16; WMMA takes float16 only)")
    gemm_tc.add_argument("--acc-dtype", default="float32", choices=ACC_DTYPES, help="accumulator (default float32)")
    gemm_tc.add_argument("--out-dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                         help="C's dtype (default float32)")


def gemm_tc_template(args: argparse.Namespace) -> Any:
    from ..schedules.gemm.mma import MmaGemmTemplate
    from ..schedules.gemm.tensor_core import TensorCoreGemmTemplate
    from ..schedules.gemm.tensor_core_choice import TensorCoreChoiceTemplate

    kind = {"any": TensorCoreChoiceTemplate, "mma": MmaGemmTemplate, "wmma": TensorCoreGemmTemplate}[args.kernel]
    return kind.from_shape(parse_shape(args.shape, ("M", "N", "K")), a_dtype=args.in_dtype, b_dtype=args.in_dtype,
                           acc_dtype=args.acc_dtype, c_dtype=args.out_dtype)


# ---- tune: GEMM on Hopper's warpgroup MMA ----------------------------------------------------------
def gemm_wgmma_knobs() -> Sequence[Knob]:
    from ..schedules.gemm.wgmma import KNOBS as WGMMA_KNOBS

    return WGMMA_KNOBS


def add_gemm_wgmma_args(gemm_wgmma: argparse.ArgumentParser) -> None:
    gemm_wgmma.add_argument("--shape", required=True, help="M,N,K; multiples of the tile (e.g. 4096,4096,4096)")
    gemm_wgmma.add_argument("--b-layout", choices=("nk", "kn"), default="nk",
                            help="nk: Bt stored N×K, C = A·Btᵀ (default); kn: B stored K×N, C = A·B (wgmma reads it "
                                 "N-major)")
    gemm_wgmma.add_argument("--batch", default="",
                            help="leading batch axes of A, B and C, one GEMM each (e.g. 8,12: attention's batch "
                                 "and heads); default none")
    gemm_wgmma.add_argument("--b-shared", action="store_true",
                            help="with --batch: B has no batch axes (one B for all)")
    gemm_wgmma.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16",
                            help="A, B and C (float32 accumulate); default float16")


def gemm_wgmma_template(args: argparse.Namespace) -> Any:
    from ..schedules.gemm.wgmma_template import WgmmaGemmTemplate

    batch = parse_batch(args.batch)
    if args.b_shared and not batch:
        raise TvmExtError("--b-shared needs --batch (a B shared by the matrices of a batch)")
    return WgmmaGemmTemplate.from_shape(parse_shape(args.shape, ("M", "N", "K")), b_layout=args.b_layout.upper(),
                                        batch=batch, b_shared=args.b_shared, dtype=args.dtype)


# ---- tune: float32 GEMM as three TF32 products ----------------------------------------------------
def gemm_3xtf32_knobs() -> Sequence[Knob]:
    from ..schedules.gemm.gemm_3xtf32 import KNOBS as TF32_KNOBS

    return TF32_KNOBS


def add_gemm_3xtf32_args(gemm_3xtf32: argparse.ArgumentParser) -> None:
    gemm_3xtf32.add_argument("--shape", required=True,
                             help="M,N,K; M, N multiples of 64, K of 32 (e.g. 4096,4096,4096)")


def gemm_3xtf32_template(args: argparse.Namespace) -> Any:
    from ..schedules.gemm.gemm_3xtf32 import Gemm3xTf32Template

    return Gemm3xTf32Template.from_shape(parse_shape(args.shape, ("M", "N", "K")))


# ---- tune: 8-bit float GEMM ---------------------------------------------------------------------------
def gemm_fp8_knobs() -> Sequence[Knob]:
    from ..schedules.gemm.gemm_fp8 import FP8_KNOBS

    return FP8_KNOBS


def add_gemm_fp8_args(gemm_fp8: argparse.ArgumentParser) -> None:
    gemm_fp8.add_argument("--shape", required=True, help="M,N,K; M, N multiples of 64, K of 128 (e.g. 4096,4096,4096)")
    gemm_fp8.add_argument("--fp8", choices=("e4m3", "e5m2"), default="e4m3", help="A's and Bt's format (default e4m3)")
    gemm_fp8.add_argument("--out-dtype", choices=("float16", "bfloat16"), default="float16",
                          help="C's dtype (default float16)")
    gemm_fp8.add_argument("--promote", type=int, choices=(0, 1, 2, 4), default=None,
                          help="the accuracy class: the sums promoted every N k steps of 128 and searched no other "
                               "way (1: cuBLASLt's default accuracy; 0: never, its use_fast_accum); default: "
                               "fp8_promote searched like any knob")


def gemm_fp8_template(args: argparse.Namespace) -> Any:
    from ..schedules.gemm.gemm_fp8 import Fp8GemmTemplate

    template = Fp8GemmTemplate.from_shape(parse_shape(args.shape, ("M", "N", "K")), fp8=args.fp8,
                                          out_dtype=args.out_dtype)
    return template if args.promote is None else dataclasses.replace(template, promote=args.promote)


# ---- tune: reductions -------------------------------------------------------------------------------
def reduce_knobs() -> Sequence[Knob]:
    from ..schedules.reduce.reduction import KNOBS as REDUCE_KNOBS

    return REDUCE_KNOBS


def add_reduce_args(reduce: argparse.ArgumentParser) -> None:
    from ..schedules.reduce.reduction import DTYPES as REDUCE_DTYPES, OPS as REDUCE_OPS

    reduce.add_argument("--op", default="sum", choices=REDUCE_OPS, help="reduction (default sum)")
    reduce.add_argument("--shape", required=True, help="N (e.g. 1048576) or ROWS,COLS (e.g. 4096,4096)")
    reduce.add_argument("--dtype", default="float32", choices=REDUCE_DTYPES,
                        help="input type; float16 accumulates in float32 (default float32)")


def reduce_template(args: argparse.Namespace) -> Any:
    from ..schedules.reduce.reduction import ReductionTemplate

    names = ("ROWS", "COLS") if "," in args.shape.replace("x", ",") else ("N",)
    return ReductionTemplate.from_shape(parse_shape(args.shape, names), op=args.op, dtype=args.dtype)


# ---- tune: the GRU layer -------------------------------------------------------------------------------
def gru_knobs() -> Sequence[Knob]:
    from ..schedules.gru import KNOBS as GRU_KNOBS

    return GRU_KNOBS


def add_gru_shape_args(gru: argparse.ArgumentParser) -> None:
    """The GRU's shape: what ``tune gru`` and ``mixed-precision gru`` both take."""
    for name, help_text in (("batch", "batch size B"), ("hidden", "hidden size H"), ("input", "input size I"),
                            ("seq", "sequence length T")):
        gru.add_argument(f"--{name}", type=int, required=True, help=help_text)
    gru.add_argument("--layers", type=int, default=1, help="stacked layers (default 1)")
    gru.add_argument("--bidirectional", action="store_true", help="two directions per layer")
    gru.add_argument("--variable-lengths", action="store_true",
                     help="each batch row stops at its own length, as a PackedSequence runs (calls take lengths; "
                          "measured on lengths drawn in 1..T, one row of T)")


def gru_template(args: argparse.Namespace) -> Any:
    from ..schedules.gru import GruTemplate

    return GruTemplate(batch=args.batch, hidden=args.hidden, input=args.input, seq=args.seq,
                       layers=args.layers, bidirectional=args.bidirectional, variable_lengths=args.variable_lengths)


# ---- tune: the LSTM layer ------------------------------------------------------------------------------
def lstm_knobs() -> Sequence[Knob]:
    from ..schedules.lstm.template import KNOBS as LSTM_KNOBS

    return LSTM_KNOBS


def add_lstm_shape_args(lstm: argparse.ArgumentParser) -> None:
    """The LSTM's shape (the GRU's arguments) and its storage type."""
    add_gru_shape_args(lstm)
    lstm.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                      help="type of x, the weights, h, c and the output (products and cell in float32)")


def lstm_template(args: argparse.Namespace) -> Any:
    from ..schedules.lstm import LstmTemplate

    return LstmTemplate(batch=args.batch, hidden=args.hidden, input=args.input, seq=args.seq,
                        layers=args.layers, bidirectional=args.bidirectional, dtype=args.dtype,
                        variable_lengths=args.variable_lengths)


# ---- mixed-precision: GEMM and GRU ---------------------------------------------------------------------
def add_gemm_precision_args(gemm: argparse.ArgumentParser) -> None:
    gemm.add_argument("--shape", required=True, help="M,N,K")
    gemm.add_argument("--tensor-core", default="auto", metavar="TILE", help=TILE_HELP.format(
        what="configs whose A and B", where="the shape"))


def gemm_precision_operator(args: argparse.Namespace) -> Any:
    from ..schedules.gemm.simt import GemmTemplate

    return GemmTemplate.from_shape(parse_shape(args.shape, ("M", "N", "K")))


def add_gru_precision_args(gru: argparse.ArgumentParser) -> None:
    add_gru_shape_args(gru)
    gru.add_argument("--tensor-core", default="auto", metavar="TILE", help=TILE_HELP.format(
        what="the input GEMM where x and W_ih", where="its shape"))
    gru.add_argument("--hidden-tensor-core", default="auto", metavar="TILE",
                     help="the same for the hidden GEMM of unfused schedules (h and W_hh)")


def tile_option(text: str, shapes: list[tuple[int, int, int]], target: Any, option: str, epilogue: bool,
                batch: int = 0) -> Any:
    """The tile for ``--tensor-core``-like text (its syntax checked on any target; None off
    CUDA).  A tile given by hand that cannot run the float16 GEMM of every shape is refused
    with the reason: it would silently leave them on the CUDA cores."""
    from ..schedules.gemm.tensor_core import parse_tile, pick_tile

    auto = text.strip() == "auto"
    tile = None if auto else parse_tile(text)
    if target.kind != "cuda":
        return None
    if auto:
        return pick_tile(shapes, target, batch=batch)
    for m, n, k in shapes if tile is not None else ():
        reason = tile.reason(m, n, k, "float16", "float16", "float32", "float32", target, epilogue=epilogue)
        if reason:
            raise TvmExtError(f"{option} {text}: the {m}x{n}x{k} GEMM cannot run on {tile.label()}: {reason}")
    return tile


def gemm_tensor_cores(base: Any, args: argparse.Namespace, target: Any) -> Any:
    from dataclasses import replace

    shapes = [(base.m, base.n, base.k)]
    return replace(base, tensor_core=tile_option(args.tensor_core, shapes, target, "--tensor-core", epilogue=False))


def gemm_kernel_programs(args: argparse.Namespace, target: Any) -> tuple[type, ...]:
    """``mixed-precision gemm``'s programs on Hopper's written kernels: 8-bit operands (the
    search offers their types only where they run, and says why not), and on Hopper with
    ``--tensor-core auto`` 16-bit pairs with float32 sums on wgmma (a tile given by hand, or
    none, keeps those on it)."""
    from ..schedules.gemm.gemm_programs import EightBitGemmProgram, WgmmaGemmProgram

    wgmma = args.tensor_core.strip() == "auto" and WgmmaGemmProgram.target_reason(target) is None
    return (EightBitGemmProgram,) + ((WgmmaGemmProgram,) if wgmma else ())


def gru_tensor_cores(base: Any, args: argparse.Namespace, target: Any) -> Any:
    from dataclasses import replace

    inputs = [(base.seq * base.batch, base.dirs * 3 * base.hidden, base.layer_input(layer))
              for layer in range(base.layers)]
    hidden = [(base.batch, 3 * base.hidden, base.hidden)]
    return replace(base, in_tensor_core=tile_option(args.tensor_core, inputs, target, "--tensor-core", epilogue=True),
                   hid_tensor_core=tile_option(args.hidden_tensor_core, hidden, target, "--hidden-tensor-core",
                                               epilogue=True, batch=base.dirs))
