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
from typing import Any, Mapping

from .cli_args import Parser
from .operator_cli import TILE_HELP, tile_option  # noqa: F401  (imported from here too)
from .cli_options import RUN_GROUP, add_groups, mixed_precision_group


def add_mixed_precision_parser(sub: Any, operators: Mapping[str, Any] | None = None) -> None:
    """``mixed-precision OPERATOR``: one subcommand per operator of ``operators`` (the registry by
    default) that has a ``PrecisionCommand``."""
    from ..operators import precision_operators

    mp = sub.add_parser(
        "mixed-precision", help="method 003: fastest precision per tensor within an error bound",
        description=__doc__.split("\n\n", 1)[1].replace("\n", " "),
    )
    ops = mp.add_subparsers(dest="operator", metavar="OPERATOR", required=True, parser_class=Parser)
    for op in precision_operators(operators):
        p = ops.add_parser(op.name, help=op.precision.help)
        op.precision.add_arguments(p)
        p.set_defaults(make_operator=op.precision.make_operator, tensor_cores=op.precision.tensor_cores,
                       kernel_programs=op.precision.kernel_programs)
        _add_method_args(p)
        p.set_defaults(run=run_mixed_precision)


def _add_method_args(p: argparse.ArgumentParser) -> None:
    add_groups(p, mixed_precision_group(), RUN_GROUP)


def run_mixed_precision(args: argparse.Namespace) -> int:
    from ..precision.codegen import export_program
    from ..precision.mixed_precision import MixedPrecisionSettings, MixedPrecisionSearch, PrecisionProgram, schedule_for
    from ..core.records import RecordStore
    from .cli_checks import check_index_range, check_out_dir, check_run_inputs
    from ..core.session import Session, SessionOptions

    check_run_inputs(args)
    check_out_dir(args.out)
    settings = MixedPrecisionSettings(
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
    kernels = args.kernel_programs(args, target) if args.kernel_programs else ()
    program = PrecisionProgram(base, schedule, dtypes, kernels=kernels)
    program.space(target)  # unknown or unsupported dtypes: a clear error before anything runs
    tuner = session.tuner(program, recorded_as="method003")
    predictor = None
    if args.predictor == "xgb":
        from ..cost_model.precision import PrecisionPredictor

        predictor = PrecisionPredictor(program, target, settings.error_bound, seed=args.seed)
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731
    log(f"{program.describe()} on {target.kind}:{target.device_name}, schedule: {source}; "
        f"dtypes {', '.join(program.search_dtypes(target))}; {tuner.resumed} records resumed from {args.records}")
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
          f"(load with tvm_ext.precision.codegen.load_program)")
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
