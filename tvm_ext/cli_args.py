"""Command-line pieces every ``python -m tvm_ext.tune`` subcommand shares: the tuning
arguments and their checks, shapes, knob help, the one-line-error parser, speeds."""
from __future__ import annotations

import argparse
from typing import Any, Sequence

from .errors import TvmExtError
from .space import Knob

DEFAULT_RECORDS = "tvm_ext_records.jsonl"


def parse_shape(text: str, names: Sequence[str]) -> tuple[int, ...]:
    parts = [p.strip() for p in text.replace("x", ",").split(",")]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise TvmExtError(f"shape {text!r} is malformed; expected {','.join(names)} as integers") from None
    if len(values) != len(names):
        raise TvmExtError(f"shape {text!r} needs {len(names)} numbers: {','.join(names)}")
    bad = [f"{n}={v}" for n, v in zip(names, values) if v < 1]
    if bad:
        raise TvmExtError(f"shape dimensions must be positive: {', '.join(bad)}")
    return values


def knob_help(knobs: Sequence[Knob]) -> str:
    width = max(len(k.name) for k in knobs)
    lines = ["template knobs (searched by the tuner):"]
    for k in knobs:
        choices = ", ".join(map(str, k.choices))
        lines.append(f"  {k.name:<{width}}  {k.doc} [{choices}]")
    return "\n".join(lines)


def add_tuning_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tuning")
    g.add_argument("--target", default="opencl", help="opencl (default: any OpenCL device, PoCL on a CPU) or cuda")
    g.add_argument("--device", type=int, default=0, help="device index (default 0; OpenCL GPUs first)")
    g.add_argument("--strategy", default="ga", choices=("ga", "random", "analytic"),
                   help="search strategy (default ga); analytic: method 002's GEMM tile from the hardware "
                        "model, printed and measured once (--no-measure: not measured)")
    g.add_argument("--generations", type=int, default=6, help="GA generations (default 6)")
    g.add_argument("--population", type=int, default=12, help="GA population size (default 12)")
    g.add_argument("--tourn-size", type=int, default=None,
                   help="tournament size, < population/2 (default 2, or 1 for a population of 4)")
    g.add_argument("--mutation", type=float, default=0.1, help="per-gene mutation probability (default 0.1)")
    g.add_argument("--trials", type=int, default=None, help="max kernels measured in this run (default: no cap)")
    g.add_argument("--workers", type=int, default=None, help="parallel build processes (default: all cores)")
    g.add_argument("--seed", type=int, default=0, help="random seed: same seed, same search (default 0)")
    g.add_argument("--records", default=DEFAULT_RECORDS, help=f"JSON-lines records file, resumed if present (default {DEFAULT_RECORDS})")
    g.add_argument("--build-timeout", type=float, default=120.0, help="seconds per build (default 120)")
    g.add_argument("--run-timeout", type=float, default=60.0, help="seconds per measurement (default 60)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
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


def check_tuning_args(args: argparse.Namespace) -> None:
    from .cli_checks import check_tuning_inputs

    check_tuning_inputs(args)  # first: it fills in the default --tourn-size
    for name in ("generations", "population", "tourn_size"):
        if getattr(args, name) < 1:
            raise TvmExtError(f"--{name.replace('_', '-')} must be >= 1")
    if args.trials is not None and args.trials < 1:
        raise TvmExtError("--trials must be >= 1")
    if not 0.0 <= args.mutation <= 1.0:
        raise TvmExtError("--mutation must be a probability in [0, 1]")
    if args.population >= 4 and args.tourn_size >= args.population / 2:
        raise TvmExtError(f"--tourn-size must be < population/2 ({args.population / 2:g})")
    if args.cost_model != "none" and args.strategy != "ga":
        raise TvmExtError("--cost-model needs --strategy ga (the GA breeds the candidates the model ranks)")
    for name in ("ng", "nm"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise TvmExtError(f"--{name} must be >= 1")
    if args.ng is not None and args.nm is not None and args.ng < args.nm:
        raise TvmExtError("--ng must be >= --nm (the model picks nm of ng candidates)")
    if not 0.0 <= args.explore <= 1.0:
        raise TvmExtError("--explore must be a share in [0, 1]")


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump) and exit code 2."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def format_speed(template: Any, cost: float) -> str:
    """GFLOP/s of a cost (seconds), or GB/s for an operator without flops; "-" when it failed."""
    from .results.summary import speed_text

    return speed_text(template, cost)
