"""Command-line pieces every ``python -m tvm_ext.tune`` subcommand shares: the tuning
arguments and their checks, shapes, knob help, the one-line-error parser, speeds."""
from __future__ import annotations

import argparse
from typing import Any, Sequence

from .cli_checks import Parser  # noqa: F401  (the CLI's parser: one-line errors)
from .cli_parse import knob_help, parse_batch, parse_shape  # noqa: F401  (imported from here too)
from .errors import TvmExtError
from .measure import MeasureSettings
from .session import DEFAULT_RECORDS, RUNNERS, STRATEGIES, SessionOptions


def add_tuning_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tuning")
    g.add_argument("--target", default="opencl", help="opencl (default: any OpenCL device, PoCL on a CPU) or cuda")
    g.add_argument("--device", type=int, default=0, help="device index (default 0; OpenCL GPUs first)")
    g.add_argument("--strategy", default="ga", metavar="NAME",
                   help=f"search strategy: {', '.join(STRATEGIES)} (default ga); analytic: method 002's GEMM "
                        "tile from the hardware model (or the template's own pick), printed and measured once "
                        "(--no-measure: not measured); ga+xgb is ga with --cost-model xgb")
    g.add_argument("--generations", type=int, default=6, help="GA generations (default 6)")
    g.add_argument("--population", type=int, default=12, help="GA population size (default 12)")
    g.add_argument("--tourn-size", type=int, default=None,
                   help="tournament size, < population/2 (default 2, or 1 for a population of 4)")
    g.add_argument("--mutation", type=float, default=0.1, help="per-gene mutation probability (default 0.1)")
    g.add_argument("--trials", type=int, default=None, help="max kernels measured in this run (default: no cap)")
    g.add_argument("--workers", type=int, default=None, help="parallel build processes (default: all cores)")
    g.add_argument("--no-overlap", action="store_true",
                   help="build each generation whole, then measure it (default: a generation is built in chunks of "
                        "--workers, the next chunk while the devices measure the ones before it)")
    g.add_argument("--seed", type=int, default=0, help="random seed: same seed, same search (default 0)")
    g.add_argument("--records", default=DEFAULT_RECORDS,
                   help=f"JSON-lines records file, resumed if present (default {DEFAULT_RECORDS})")
    g.add_argument("--build-timeout", type=float, default=120.0, help="seconds per build (default 120)")
    g.add_argument("--run-timeout", type=float, default=60.0, help="seconds per measurement (default 60)")
    g.add_argument("--runner", default=None, metavar="NAME",
                   help=f"where candidates are measured: {', '.join(RUNNERS)} (default local: this machine, "
                        "an isolated process per device; rpc with --tracker or --devices)")
    g.add_argument("--runner-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the runner, repeatable (local: devices=0,1 measures on both devices "
                        "at once)")
    r = p.add_argument_group("measuring on many GPUs or hosts (--runner rpc, TVM's RPC tracker)")
    r.add_argument("--tracker", default=None, metavar="HOST:PORT",
                   help="the TVM RPC tracker whose servers measure (python -m tvm_ext.worker, or stock TVM servers)")
    r.add_argument("--key", default=None, help="the servers' key at the tracker (one key per kind of device)")
    r.add_argument("--parallel", type=int, default=None,
                   help="jobs in flight (default: one per server registered under the key)")
    r.add_argument("--secret-file", default=None, metavar="PATH",
                   help="the shared secret that signs every message to and from the workers (default: "
                        "$TVM_EXT_SECRET, else unsigned); the workers need the same one")
    r.add_argument("--devices", default=None, metavar="0,1,...",
                   help="this host's devices: start a local tracker and a worker per device, measure on all of "
                        "them, stop them at the end")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--no-cuda-graph", action="store_true",
                   help="CUDA: time each candidate by launching it back to back (TVM's evaluator) instead of "
                        "replaying it from a CUDA graph (the default: a kernel of a few microseconds is otherwise "
                        "timed at the host's launch rate); the timer used is in each record's metrics")
    m = p.add_argument_group("cost model (predictor stage of the GA)")
    m.add_argument("--cost-model", default="none", choices=("none", "xgb"),
                   help="xgb: each generation breeds --ng candidates, an XGBoost model trained on the records "
                        "ranks them and only --nm are measured; saved as RECORDS.xgb.json (default none)")
    m.add_argument("--ng", type=int, default=None, help="candidates bred per generation (default 16 x nm)")
    m.add_argument("--nm", type=int, default=None, help="candidates measured per generation (default population/2)")
    m.add_argument("--explore", type=float, default=0.2,
                   help="share of nm picked at random instead of by the model (default 0.2)")
    m.add_argument("--ptxas", action="store_true",
                   help="CUDA: add registers/spills from nvcc's ptxas -v to the model's features "
                        "(compiles each ranked candidate; cached in RECORDS.ptxas.json)")
    m.add_argument("--no-measure", action="store_true",
                   help="with --strategy analytic: print the pick without measuring it (no device needed "
                        "for --target cuda: H100 limits are assumed when no GPU is found)")


def session_options(args: argparse.Namespace) -> SessionOptions:
    """The tuning arguments as session options, checked: ``cli_checks`` first (it fills in
    the default ``--tourn-size``), then the options' own checks; one ``TvmExtError`` each."""
    from .cli_checks import check_tuning_inputs

    check_tuning_inputs(args)
    strategy = args.strategy
    if args.cost_model != "none":
        if strategy != "ga":
            raise TvmExtError("--cost-model needs --strategy ga (the GA breeds the candidates the model ranks)")
        strategy = f"ga+{args.cost_model}"
    return SessionOptions(
        target=args.target, device=args.device, strategy=strategy, runner=runner_name(args),
        generations=args.generations, population=args.population, tourn_size=args.tourn_size,
        mutation=args.mutation, trials=args.trials, workers=args.workers, overlap=not args.no_overlap,
        seed=args.seed, records=args.records,
        build_timeout=args.build_timeout, run_timeout=args.run_timeout, ng=args.ng, nm=args.nm,
        explore=args.explore, ptxas=args.ptxas, runner_options=parse_runner_options(args.runner_option)
        + rpc_runner_options(args), measure=MeasureSettings(cuda_graph=not args.no_cuda_graph))


def runner_name(args: argparse.Namespace) -> str:
    """``--runner``, or rpc where ``--tracker`` or ``--devices`` says so (local otherwise)."""
    rpc = args.tracker is not None or args.devices is not None
    if args.runner is None:
        return "rpc" if rpc else "local"
    if rpc and args.runner != "rpc":
        flag = "--tracker" if args.tracker is not None else "--devices"
        raise TvmExtError(f"{flag} measures through --runner rpc, not --runner {args.runner}")
    return args.runner


def rpc_runner_options(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """The rpc flags as the runner options the rpc runner reads."""
    if args.parallel is not None and args.parallel < 1:
        raise TvmExtError(f"--parallel must be >= 1, got {args.parallel}")
    if args.key is not None and args.tracker is None:
        raise TvmExtError("--key names servers at a tracker: give --tracker HOST:PORT too")
    flags = {"tracker": args.tracker, "key": args.key, "devices": args.devices, "secret_file": args.secret_file,
             "parallel": None if args.parallel is None else str(args.parallel)}
    return tuple((name, value) for name, value in flags.items() if value is not None)


def parse_runner_options(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TvmExtError(f"--runner-option {item!r} is not KEY=VALUE")
        out.append((key.strip(), value.strip()))
    return tuple(out)


def format_speed(template: Any, cost: float) -> str:
    """GFLOP/s of a cost (seconds), or GB/s for an operator without flops; "-" when it failed."""
    from .results.summary import speed_text

    return speed_text(template, cost)
