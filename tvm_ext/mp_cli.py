"""``python -m tvm_ext.tune mixed-precision gemm|gru``: method 003 on an operator.

Finds the fastest precision assignment whose measured error (normwise relative,
against a float64 reference on fixed random inputs) stays within ``--error-bound``,
at the operator's best float32 schedule from the records file (its default config
when the records hold none), and writes the program out (``--out``).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

from .cli_args import Parser, parse_shape
from .session import DEFAULT_RECORDS

DEFAULT_OUT = "tvm_ext_program"
TILE_HELP = ("tensor-core tile for {what} are both float16 or both bfloat16 (mma.sync), or float16 "
             "(WMMA), on CUDA: auto (default: picked for {where}, mma.sync where one of its tiles fits, else "
             "WMMA), none, mma / wmma (that kernel's 128x128x32 tile), or one kernel's knobs as k=v,... "
             "(mma_ knobs: mma.sync, tc_ knobs: WMMA)")


def add_mixed_precision_parser(sub: Any) -> None:
    mp = sub.add_parser(
        "mixed-precision", help="method 003: fastest precision per tensor within an error bound",
        description=__doc__.split("\n\n", 1)[1].replace("\n", " "),
    )
    ops = mp.add_subparsers(dest="operator", metavar="OPERATOR", required=True, parser_class=Parser)
    gemm = ops.add_parser("gemm", help="C = A·B: dtypes of A, B, C and the accumulator")
    gemm.add_argument("--shape", required=True, help="M,N,K")
    gemm.add_argument("--tensor-core", default="auto", metavar="TILE", help=TILE_HELP.format(
        what="configs whose A and B", where="the shape"))
    gemm.set_defaults(make_operator=_gemm, tensor_cores=_gemm_tensor_cores)
    gru = ops.add_parser("gru", help="a GRU layer: dtypes of x, weights, gate buffers, state, output, "
                                     "both accumulators and the cell's math")
    for name, help_text in (("batch", "batch size B"), ("hidden", "hidden size H"), ("input", "input size I"),
                            ("seq", "sequence length T")):
        gru.add_argument(f"--{name}", type=int, required=True, help=help_text)
    gru.add_argument("--layers", type=int, default=1, help="stacked layers (default 1)")
    gru.add_argument("--bidirectional", action="store_true", help="two directions per layer")
    gru.add_argument("--tensor-core", default="auto", metavar="TILE", help=TILE_HELP.format(
        what="the input GEMM where x and W_ih", where="its shape"))
    gru.add_argument("--hidden-tensor-core", default="auto", metavar="TILE",
                     help="the same for the hidden GEMM of unfused schedules (h and W_hh)")
    gru.set_defaults(make_operator=_gru, tensor_cores=_gru_tensor_cores)
    for p in (gemm, gru):
        _add_method_args(p)
        p.set_defaults(run=run_mixed_precision)


def _add_method_args(p: argparse.ArgumentParser) -> None:
    from .mixed_precision import Method003Settings

    d = Method003Settings()
    g = p.add_argument_group("method 003")
    g.add_argument("--error-bound", "--eb", type=float, default=d.error_bound,
                   help=f"largest relative error accepted (eb, default {d.error_bound:g})")
    g.add_argument("--m", type=int, default=d.max_measurements, help=f"max measurements (default {d.max_measurements})")
    g.add_argument("--nf", type=int, default=d.max_stages, help=f"max stages kept by S3 (default {d.max_stages})")
    g.add_argument("--n0", type=int, default=d.population, help=f"population size (default {d.population})")
    g.add_argument("--ng", type=int, default=d.generated, help=f"configs generated per round (default {d.generated})")
    g.add_argument("--nm", type=int, default=d.measured, help=f"configs measured per round (default {d.measured})")
    g.add_argument("--u0", type=float, default=d.mutation, help=f"mutation probability (default {d.mutation:g})")
    g.add_argument("--explore", type=float, default=d.explore,
                   help=f"share of nm drawn at random instead of by the predictor (default {d.explore:g})")
    g.add_argument("--predictor", default="xgb", choices=("xgb", "none"),
                   help="S6 predictor: xgb (speed and error models) or none (random nm of ng)")
    g.add_argument("--dtypes", default="",
                   help="the low precision types to try besides float32, comma-separated from float16, "
                        "bfloat16, float64 (default: the target's 16-bit types)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    r = p.add_argument_group("run")
    r.add_argument("--target", default="opencl", help="opencl (default) or cuda")
    r.add_argument("--device", type=int, default=0, help="device index (default 0)")
    r.add_argument("--records", default=DEFAULT_RECORDS, help="records file, resumed if present")
    r.add_argument("--out", default=DEFAULT_OUT, help=f"folder for the generated program (default {DEFAULT_OUT})")
    r.add_argument("--workers", type=int, default=None, help="parallel build processes (default: all cores)")
    r.add_argument("--build-timeout", type=float, default=300.0, help="seconds per build (default 300)")
    r.add_argument("--run-timeout", type=float, default=120.0, help="seconds per measurement (default 120)")


def _gemm(args: argparse.Namespace) -> Any:
    from .schedules.gemm import GemmTemplate

    return GemmTemplate.from_shape(parse_shape(args.shape, ("M", "N", "K")))


def _gru(args: argparse.Namespace) -> Any:
    from .schedules.gru import GruTemplate

    return GruTemplate(batch=args.batch, hidden=args.hidden, input=args.input, seq=args.seq,
                       layers=args.layers, bidirectional=args.bidirectional)


def tile_option(text: str, shapes: list[tuple[int, int, int]], target: Any, option: str, epilogue: bool,
          batch: int = 0) -> Any:
    """The tile for ``--tensor-core``-like text (its syntax checked on any target; None off
    CUDA).  A tile given by hand that cannot run the float16 GEMM of every shape is refused
    with the reason: it would silently leave them on the CUDA cores."""
    from .errors import TvmExtError
    from .schedules.tensor_core import parse_tile, pick_tile

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


def _gemm_tensor_cores(base: Any, args: argparse.Namespace, target: Any) -> Any:
    from dataclasses import replace

    shapes = [(base.m, base.n, base.k)]
    return replace(base, tensor_core=tile_option(args.tensor_core, shapes, target, "--tensor-core", epilogue=False))


def _gru_tensor_cores(base: Any, args: argparse.Namespace, target: Any) -> Any:
    from dataclasses import replace

    inputs = [(base.seq * base.batch, base.dirs * 3 * base.hidden, base.layer_input(layer))
              for layer in range(base.layers)]
    hidden = [(base.batch, 3 * base.hidden, base.hidden)]
    return replace(base, in_tensor_core=tile_option(args.tensor_core, inputs, target, "--tensor-core", epilogue=True),
                   hid_tensor_core=tile_option(args.hidden_tensor_core, hidden, target, "--hidden-tensor-core",
                                               epilogue=True, batch=base.dirs))


def run_mixed_precision(args: argparse.Namespace) -> int:
    from .codegen import export_program
    from .mixed_precision import Method003Settings, MixedPrecisionSearch, PrecisionProgram, schedule_for
    from .records import RecordStore
    from .cli_checks import check_index_range, check_out_dir, check_run_inputs
    from .session import Session, SessionOptions

    check_run_inputs(args)
    check_out_dir(args.out)
    settings = Method003Settings(
        error_bound=args.error_bound, max_measurements=args.m, max_stages=args.nf, population=args.n0,
        generated=args.ng, measured=args.nm, mutation=args.u0, explore=args.explore, seed=args.seed)
    base = args.make_operator(args)
    check_index_range(base)
    options = SessionOptions(target=args.target, device=args.device, records=args.records, workers=args.workers,
                             build_timeout=args.build_timeout, run_timeout=args.run_timeout, seed=args.seed)
    session = Session(options, store=RecordStore(args.records))
    target = session.target
    schedule, source = schedule_for(base, target, session.store)
    base = args.tensor_cores(base, args, target)  # 16-bit operands on CUDA run on the tensor cores
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    program = PrecisionProgram(base, schedule, dtypes)
    program.space(target)  # unknown or unsupported dtypes: a clear error before anything runs
    tuner = session.tuner(program, recorded_as="method003")
    predictor = None
    if args.predictor == "xgb":
        from .cost_model.precision import PrecisionPredictor

        predictor = PrecisionPredictor(program, target, settings.error_bound, seed=args.seed)
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731
    log(f"{program.describe()} on {target.kind}:{target.device_name}, schedule: {source}; "
        f"dtypes {', '.join(target.float_dtypes)}; {tuner.resumed} records resumed from {args.records}")
    if target.kind == "cuda":
        log(program.tensor_core_note(target))
    try:
        result = MixedPrecisionSearch(tuner, settings, predictor, log=log).run()
    except KeyboardInterrupt:
        print("interrupted: records so far are kept; rerun the same command to resume", file=sys.stderr)
        return 130
    finally:
        session.close()
    print_result(program, result, settings)
    if result.best is None:
        print(f"error: no configuration within the error bound {settings.error_bound:g} ran correctly",
              file=sys.stderr)
        return 1
    chosen = tuner.space.make(**result.best.config)
    manifest = export_program(
        program.lowered(chosen), schedule, target, args.out,
        extra={"error": result.error, "error_bound": settings.error_bound, "time_s": result.best.cost,
               "baseline_time_s": result.baseline.cost, "speedup": result.speedup,
               "configs_measured": result.measured, "error_metric": "max over outputs of ||out-ref||/||ref||",
               "check_seed": 0})
    print(f"generated program: {os.path.abspath(os.path.dirname(manifest))} "
          f"(load with tvm_ext.codegen.load_program)")
    return 0


def print_result(program: Any, result: Any, settings: Any) -> None:
    base = result.baseline
    print(f"\n{program.describe()}: {result.measured} configs measured "
          f"({result.new_measurements} in this run), {result.generations} generations, "
          f"stopped: {result.stop_reason}")
    print(f"  stages kept: {', '.join(result.kept_stages)}")
    print(f"  float32 program: {base.cost * 1e3:.4f} ms, error {base.metrics.get('rel_error', math.nan):.2e}")
    if result.best is not None:
        print(f"  chosen program:  {result.best.cost * 1e3:.4f} ms, error {result.error:.2e} "
              f"(bound {settings.error_bound:g}), speedup {result.speedup:.2f}x")
        lowered = {k: v for k, v in result.best.config.items() if v != "float32"}
        print("  precision: " + (" ".join(f"{k}={v}" for k, v in sorted(lowered.items())) or "all float32"))
