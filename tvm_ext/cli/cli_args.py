"""Command-line pieces every ``python -m tvm_ext.tune`` subcommand shares: the tuning
options (declared in ``cli_options``) turned into session options and checked, shapes, knob
help, the one-line-error parser, speeds."""
from __future__ import annotations

import argparse
from typing import Any, Sequence

from .cli_checks import Parser  # noqa: F401  (the CLI's parser: one-line errors)
from .cli_options import TUNING_GROUPS, add_groups
from .cli_parse import knob_help, parse_batch, parse_shape  # noqa: F401  (imported from here too)
from ..core.errors import TvmExtError
from ..measure.measure import MeasureSettings
from ..core.session import SessionOptions


def add_tuning_args(p: argparse.ArgumentParser) -> None:
    """The options every tuning subcommand takes (``cli_options.TUNING_GROUPS``)."""
    add_groups(p, *TUNING_GROUPS)


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
        seed=args.seed, records=args.records, tasks_in_flight=tasks_in_flight(args),
        build_timeout=args.build_timeout, run_timeout=args.run_timeout, ng=args.ng, nm=args.nm,
        explore=args.explore, ptxas=args.ptxas, runner_options=parse_runner_options(args.runner_option)
        + rpc_runner_options(args), measure=MeasureSettings(cuda_graph=not args.no_cuda_graph))


TASKS_PER_DEVICE = 4  # a model's kernels tuned at once per device by default (``tune model``)


def tasks_in_flight(args: argparse.Namespace) -> int:
    """``--tasks-in-flight``, or ``TASKS_PER_DEVICE`` for each device the run measures on
    (``--devices`` or ``--runner-option devices=...``; one otherwise); 1 for commands without it,
    and with a cost model (one after another, each shape's model starts from the records of the
    shapes of its template tuned before it)."""
    if not hasattr(args, "tasks_in_flight"):
        return 1
    if args.tasks_in_flight is not None:
        return args.tasks_in_flight
    if getattr(args, "cost_model", "none") != "none":
        return 1
    listed = args.devices or dict(parse_runner_options(args.runner_option)).get("devices") or "0"
    devices = listed if isinstance(listed, (list, tuple)) else [d for d in str(listed).split(",") if d.strip()]
    return TASKS_PER_DEVICE * max(1, len(devices))


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
    from ..results.summary import speed_text

    return speed_text(template, cost)
