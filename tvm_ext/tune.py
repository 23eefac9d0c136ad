"""``python -m tvm_ext.tune``: tune an operator and print the best schedule found.

Bad input (unknown template or target, malformed shape, no device, unwritable
records) prints one ``error:`` line and exits with code 2; Ctrl-C keeps every
record written so far, prints the best so far and exits with code 130.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
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
    g.add_argument("--strategy", default="ga", choices=("ga", "random"), help="search strategy (default ga)")
    g.add_argument("--generations", type=int, default=6, help="GA generations (default 6)")
    g.add_argument("--population", type=int, default=12, help="GA population size (default 12)")
    g.add_argument("--tourn-size", type=int, default=2, help="tournament size, < population/2 (default 2)")
    g.add_argument("--mutation", type=float, default=0.1, help="per-gene mutation probability (default 0.1)")
    g.add_argument("--trials", type=int, default=None, help="max kernels measured in this run (default: no cap)")
    g.add_argument("--workers", type=int, default=None, help="parallel build processes (default: all cores)")
    g.add_argument("--seed", type=int, default=0, help="random seed: same seed, same search (default 0)")
    g.add_argument("--records", default=DEFAULT_RECORDS, help=f"JSON-lines records file, resumed if present (default {DEFAULT_RECORDS})")
    g.add_argument("--build-timeout", type=float, default=120.0, help="seconds per build (default 120)")
    g.add_argument("--run-timeout", type=float, default=60.0, help="seconds per measurement (default 60)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def _check_tuning_args(args: argparse.Namespace) -> None:
    for name in ("generations", "population", "tourn_size"):
        if getattr(args, name) < 1:
            raise TvmExtError(f"--{name.replace('_', '-')} must be >= 1")
    if args.trials is not None and args.trials < 1:
        raise TvmExtError("--trials must be >= 1")
    if not 0.0 <= args.mutation <= 1.0:
        raise TvmExtError("--mutation must be a probability in [0, 1]")
    if args.population >= 4 and args.tourn_size >= args.population / 2:
        raise TvmExtError(f"--tourn-size must be < population/2 ({args.population / 2:g})")


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump) and exit code 2."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from .schedules.gemm import KNOBS as GEMM_KNOBS

    parser = _Parser(
        prog="python -m tvm_ext.tune",
        description="Search the schedule space of a TVM operator template and keep the fastest kernel.",
    )
    sub = parser.add_subparsers(dest="command", metavar="TEMPLATE", required=True,
                                parser_class=_Parser)
    gemm = sub.add_parser(
        "gemm", help="fp32 GEMM C[M,N] = A[M,K]·B[K,N]",
        description="Tune fp32 GEMM C[M,N] = A[M,K]·B[K,N] with the parallel genetic algorithm (patent 000).",
        epilog=knob_help(GEMM_KNOBS), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gemm.add_argument("--shape", required=True, help="M,N,K (e.g. 512,512,512)")
    gemm.add_argument("--feasibility", default="tvm", choices=("tvm", "patent"),
                      help="tvm: tile fits the device limits (default); patent: also wg_x·wg_y·task_x·task_y | P·P")
    add_tuning_args(gemm)
    gemm.set_defaults(make_template=_gemm_template)
    return parser


def _gemm_template(args: argparse.Namespace) -> Any:
    from .schedules.gemm import GemmTemplate

    return GemmTemplate.from_shape(parse_shape(args.shape, ("M", "N", "K")), feasibility=args.feasibility)


def run_tuning(args: argparse.Namespace) -> int:
    import numpy as np

    from .builder import LocalBuilder
    from .records import RecordStore
    from .runner import LocalRunner
    from .search import make_strategy
    from .target import resolve_target
    from .tuner import Tuner

    _check_tuning_args(args)
    template = args.make_template(args)
    store = RecordStore(args.records)
    target = resolve_target(args.target, args.device)
    builder = LocalBuilder(workers=args.workers, timeout=args.build_timeout)
    runner = LocalRunner(target, timeout=args.run_timeout)
    progress = _Progress(template, disabled=args.no_progress,
                         total=args.trials or args.population * (args.generations + 1) + 1)
    tuner = Tuner(template, target, builder, runner, store,
                  trials=args.trials or (1 << 30), on_record=progress.update)
    default = template.default_config(target)
    strategy = make_strategy(
        args.strategy, tuner.space, np.random.default_rng(args.seed), population=args.population,
        generations=args.generations, seeds=[tuner.space.encode(default)],
        tourn_size=args.tourn_size, mutation_rate=args.mutation,
    )
    print(f"tuning {template.describe()} on {target.kind}:{target.device_name} "
          f"(space {tuner.space.size} configs, {tuner.resumed} records resumed from {args.records})",
          file=sys.stderr)
    try:
        result = tuner.tune(strategy, default)
    finally:
        progress.close()
        builder.close()
        runner.close()
    print_summary(template, result, target, args.records)
    if result.interrupted:
        print("interrupted: records so far are kept; rerun the same command to resume", file=sys.stderr)
        return 130
    if result.best is None:
        print("error: no candidate compiled and ran correctly (see error records)", file=sys.stderr)
        return 1
    return 0


class _Progress:
    def __init__(self, template: Any, disabled: bool, total: int):
        from tqdm import tqdm

        self.template = template
        self.bar = tqdm(total=total, unit="trial", disable=disabled, file=sys.stderr, dynamic_ncols=True)

    def update(self, record: Any, tuner: Any) -> None:
        best = tuner.best
        self.bar.update(1)
        self.bar.set_postfix(best=_speed(self.template, best.cost) if best else "-", errors=tuner.errors)

    def close(self) -> None:
        self.bar.close()


def _speed(template: Any, cost: float) -> str:
    if not math.isfinite(cost):
        return "-"
    if template.flops():
        return f"{template.flops() / cost / 1e9:.1f} GFLOP/s"
    return f"{template.bytes_moved() / cost / 1e9:.1f} GB/s"


def print_summary(template: Any, result: Any, target: Any, records: str) -> None:
    rows = []
    for label, rec in (("best", result.best), ("default", result.default)):
        if rec is None:
            continue
        cost = rec.cost
        rows.append((label, f"{cost * 1e3:.4f} ms" if math.isfinite(cost) else rec.error_kind,
                     _speed(template, cost), " ".join(f"{k}={v}" for k, v in rec.config.items())))
    print(f"\n{template.describe()}  target={target.kind} device={target.device_name}")
    print(f"trials this run: {result.trials} (errors {result.errors}), resumed: {result.resumed}, "
          f"wall: {result.wall_secs:.1f} s, records: {os.path.abspath(records)}")
    width = max((len(r[1]) for r in rows), default=4)
    for label, time_s, speed, cfg in rows:
        print(f"  {label:<8} {time_s:>{width}}  {speed:>18}  {cfg}")
    speedup = result.speedup_over_default()
    if math.isfinite(speedup):
        print(f"  speedup over the default config: {speedup:.2f}x")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run_tuning(args)
    except TvmExtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted before tuning started", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
