"""``python -m tvm_ext.tune``: tune an operator and print the best schedule found.

Bad input (unknown template or target, malformed shape, no device, unwritable
records, a full disk) prints one ``error:`` line and exits with code 2; Ctrl-C or
SIGTERM keeps every record written so far, prints the best so far and exits with
code 130 (a second one while stopping does not cut the summary off).
"""
from __future__ import annotations

import argparse
import errno
import json
import math
import os
import sys
from typing import Any, Mapping, Sequence

from .cli.cli_args import Parser, add_tuning_args, format_speed, knob_help, session_options
from .cli.cli_options import JSON
from .core.errors import TvmExtError


def build_parser(operators: Mapping[str, Any] | None = None) -> argparse.ArgumentParser:
    """The CLI: a subcommand per tuning command of ``operators`` (``tvm_ext.operators.OPERATORS``
    by default), then ``model``, ``mixed-precision`` and the results' subcommands."""
    from .operators import tune_commands

    parser = Parser(
        prog="python -m tvm_ext.tune",
        description="Search the schedule space of a TVM operator template and keep the fastest kernel.",
    )
    sub = parser.add_subparsers(dest="command", metavar="TEMPLATE", required=True,
                                parser_class=Parser)
    for command in tune_commands(operators):
        add_tune_parser(sub, command)
    from .cli.model_cli import add_model_parser

    add_model_parser(sub, add_tuning_args)
    from .cli.mp_cli import add_mixed_precision_parser

    add_mixed_precision_parser(sub, operators)
    from .results.cli import add_result_parsers

    add_result_parsers(sub)
    return parser


def add_tune_parser(sub: Any, command: Any) -> argparse.ArgumentParser:
    """``command``'s subcommand (an ``operators.TuneCommand``): its own arguments, then the
    tuning arguments and ``--json`` every operator takes."""
    p = sub.add_parser(command.command, help=command.help, description=command.description,
                       epilog=knob_help(command.knobs()), formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_arguments(p)
    add_tuning_args(p)
    JSON.add_to(p)
    p.set_defaults(make_template=command.make_template)
    return p


def run_tuning(args: argparse.Namespace) -> int:
    from .core.records import RecordStore
    from .core.session import Session

    from .cli.cli_checks import check_index_range, check_memory

    options = session_options(args)
    template = args.make_template(args)
    check_index_range(template)
    check_memory(template)  # the host's; the device's once the target is known
    if options.strategy == "analytic":
        return _run_analytic(args, options, template)
    session = Session(options, store=RecordStore(options.records))  # unwritable records: said at once
    progress = None
    try:
        target = session.target
        session.start_builds()  # warming while the records load and the search is set up
        template = template.for_target(target)
        check_memory(template, target)
        template.default_config(target)  # as does a template that cannot run here
        total = args.trials or args.population + options.measured_per_generation * args.generations + 1
        progress = _Progress(template, disabled=args.no_progress, total=total)
        session.log = progress.write
        tuner = session.tuner(template, on_record=progress.update)
        progress.write(f"tuning {template.describe()} on {target.kind}:{target.device_name} "
                       f"(space {tuner.space.size} configs, {tuner.resumed} records resumed from {args.records}"
                       + (f"; {tuner.stale} timed before records named their timer, measured again" if tuner.stale
                          else "") + ")")
        progress.start()
        result = session.search(tuner)
        if not result.interrupted:
            progress.finish()
    finally:
        if progress is not None:
            progress.close()
        session.close()
    if args.json:
        from .results.summary import tune_result_json

        print(json.dumps(tune_result_json(template, target, result, args.records), indent=1))
    else:
        print_summary(template, result, target, args.records)
    if result.interrupted:
        print("interrupted: records so far are kept; rerun the same command to resume", file=sys.stderr)
        return 130
    if result.best is None:
        print("error: no candidate compiled and ran correctly (see error records)", file=sys.stderr)
        return 1
    return 0


def _run_analytic(args: argparse.Namespace, options: Any, template: Any) -> int:
    """The analytic tile (or the template's own rule): print the pick; measure it once."""
    import dataclasses

    from .core.session import RUNNERS, Session
    from .target import offline_cuda, resolve_target

    session = Session(dataclasses.replace(options, trials=1, workers=1))
    if RUNNERS[options.runner].remote_target:  # the servers' device (asked when they are reached)
        try:
            return _analytic_on(args, template, session, session.target)
        finally:
            session.close()
    try:
        target = resolve_target(args.target, args.device)
    except TvmExtError:
        if not (args.no_measure and args.target.lower() == "cuda"):
            raise
        target = dataclasses.replace(offline_cuda(), device_id=args.device)
        print("note: no CUDA GPU found; using H100 (sm_90) limits", file=sys.stderr)
    with Session(session.options, target=target) as session:
        return _analytic_on(args, template, session, target)


def _analytic_on(args: argparse.Namespace, template: Any, session: Any, target: Any) -> int:
    from .core.session import analytic_pick

    template = template.for_target(target)
    config, explanation = analytic_pick(template, target)
    pick = {"description": template.describe(), "strategy": "analytic",
            "target": {"kind": target.kind, "device": target.device_name, "arch": target.arch},
            "config": config.as_dict(), "explanation": explanation, "measured": None}
    if not args.json:
        print(f"{template.describe()}  target={target.kind} device={target.device_name}")
        print(explanation)
        print(f"config: {config}")
    if args.no_measure:
        if args.json:
            print(json.dumps(pick, indent=1))
        return 0
    tuner = session.tuner(template)
    (cost,) = tuner.evaluate([config])
    rec = tuner.record_of(config)
    if rec is not None:
        pick["measured"] = {"cost_secs": rec.cost if rec.ok else None, "costs": list(rec.costs),
                            "error_kind": rec.error_kind, "error_msg": rec.error_msg,
                            "records": os.path.abspath(args.records)}
    if args.json:
        print(json.dumps(pick, indent=1))
    if rec is None or not rec.ok:
        why = f"{rec.error_kind}: {rec.error_msg}" if rec else "not measured"
        if not args.json:
            print(f"measured: failed ({why})")
        return 1
    if not args.json:
        print(f"measured: {cost * 1e3:.4f} ms  {format_speed(template, cost)}  "
              f"({'resumed from' if tuner.trials == 0 else 'recorded in'} {os.path.abspath(args.records)})")
    return 0


class _Progress:
    """The trials bar on stderr, opened (``start``) once the header is printed so nothing
    is glued to it; its total, the planned trials, stays what it was at the start."""

    def __init__(self, template: Any, disabled: bool, total: int):
        self.template = template
        self.disabled = disabled
        self.total = total
        self.bar: Any = None

    def start(self) -> Any:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, unit="trial", disable=self.disabled, file=sys.stderr,
                            dynamic_ncols=True)
        return self.bar

    def update(self, record: Any, tuner: Any) -> None:
        best = tuner.best
        bar = self.start()
        bar.update(1)
        bar.set_postfix(best=format_speed(self.template, best.cost) if best else "-", errors=tuner.errors)

    def write(self, message: str) -> None:
        """A log line on stderr that does not break the bar."""
        if self.bar is None:
            print(message, file=sys.stderr, flush=True)
        else:
            self.bar.write(message, file=sys.stderr)

    def finish(self) -> None:
        """The search ended: configs already measured, infeasible or twins of a measured
        kernel cost no trial; the bar keeps the total it started with and counts them as done,
        saying how many were not measured."""
        if self.bar is not None and self.bar.total and self.bar.n < self.bar.total:
            skipped = self.bar.total - self.bar.n
            self.bar.set_postfix_str(f"{skipped} not measured (measured before, infeasible or twins)",
                                     refresh=False)
            self.bar.update(skipped)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def print_summary(template: Any, result: Any, target: Any, records: str) -> None:
    from .results.summary import config_text

    rows = []
    for label, rec in (("best", result.best), ("default", result.default)):
        if rec is None:
            continue
        cost = rec.cost
        rows.append((label, f"{cost * 1e3:.4f} ms" if math.isfinite(cost) else rec.error_kind,
                     format_speed(template, cost), config_text(template, target, rec.config)))
    print(f"\n{template.describe()}  target={target.kind} device={target.device_name}")
    print(f"trials this run: {result.trials} (errors {result.errors}), resumed: {result.resumed}, "
          f"wall: {result.wall_secs:.1f} s, records: {os.path.abspath(records)}")
    width = max((len(r[1]) for r in rows), default=4)
    for label, time_s, speed, cfg in rows:
        print(f"  {label:<8} {time_s:>{width}}  {speed:>18}  {cfg}")
    speedup = result.speedup_over_default()
    if math.isfinite(speedup):
        print(f"  speedup over the default config: {speedup:.2f}x")


# Failures of the disk or the file system, not of tvm_ext: one ``error:`` line naming the path.
_DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM}


def main(argv: Sequence[str] | None = None) -> int:
    from .cli.interrupts import EXIT_INTERRUPTED, stop_signals

    parser = build_parser()
    args = parser.parse_args(argv)
    with stop_signals():
        try:
            return getattr(args, "run", run_tuning)(args)  # "model" has its own driver
        except TvmExtError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            if exc.errno not in _DISK_ERRORS:
                raise
            print(f"error: {exc.filename or 'a file'}: {exc.strerror}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted before tuning started", file=sys.stderr)
            return EXIT_INTERRUPTED


if __name__ == "__main__":
    if sys.argv[1:2] != ["model"]:  # a model file may use torch; the operators' commands never do, and
        from tvm_ext.measure.lifetime import keep_torch_out  # TVM's FFI would import it: seconds of every start

        keep_torch_out()
    sys.exit(main())
