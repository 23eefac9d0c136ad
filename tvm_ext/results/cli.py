"""``python -m tvm_ext.tune show | report | export RECORDS``: reading a records file."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..cli.cli_options import DEVICE, OUT, RECORDS_FILE, WORKLOAD
from ..core.errors import TvmExtError

DEFAULT_REPORT = "tvm_ext_report"
DEFAULT_EXPORT = "tvm_ext_kernel"


def add_result_parsers(sub: Any) -> None:
    show = sub.add_parser("show", help="summarize a records file: best configs per workload, errors, time",
                          description="Per workload of a records file: the best configs, errors by kind, "
                                      "trials, tuning time and strategies.")
    RECORDS_FILE.add_to(show)
    WORKLOAD.add_to(show)
    show.add_argument("--top", type=int, default=1, help="configs shown per workload, fastest first (default 1)")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    show.set_defaults(run=run_show)

    report = sub.add_parser("report", help="plot a records file: convergence and per-knob PNGs, an HTML page",
                            description="Write, per workload, the best result so far against trials and "
                                        "against wall time (one line per strategy) and the speed at each "
                                        "knob value as PNG, and index.html showing them.")
    RECORDS_FILE.add_to(report)
    OUT.but(default=DEFAULT_REPORT, help=f"folder to write (default {DEFAULT_REPORT})").add_to(report)
    WORKLOAD.add_to(report)
    report.set_defaults(run=run_report)

    export = sub.add_parser("export", help="write the best kernel of a workload: source, TVMScript, library",
                            description="Rebuild the best recorded kernel of one workload and write its "
                                        "device source (program.cl/.cu), TVMScript (kernels/), library "
                                        "(program.so) and manifest.json; tvm_ext.precision.codegen.load_program "
                                        "runs it.")
    RECORDS_FILE.add_to(export)
    WORKLOAD.but(help="the workload (key, its start, or description words); needed when the file "
                      "holds several").add_to(export)
    OUT.but(default=DEFAULT_EXPORT, help=f"folder to write (default {DEFAULT_EXPORT})").add_to(export)
    DEVICE.add_to(export)
    export.set_defaults(run=run_export)


def run_show(args: argparse.Namespace) -> int:
    from .summary import load_workloads, select

    if args.top < 1:
        raise TvmExtError(f"--top must be >= 1, got {args.top}")
    workloads = select(load_workloads(args.records), args.workload)
    if args.json:
        print(json.dumps([w.as_json(args.top) for w in workloads], indent=1, default=str))
        return 0
    print(f"{os.path.abspath(args.records)}: {len(workloads)} workload{'s' * (len(workloads) != 1)}")
    for w in workloads:
        print()
        print(_printable(w.text(args.top)))
    return 0


def _printable(text: str) -> str:
    """``text`` with every character a terminal would act on (escapes, bells) but a newline
    shown as ``?``: the strings come from the records file."""
    return "".join(c if c.isprintable() or c == "\n" else "?" for c in text)


def run_report(args: argparse.Namespace) -> int:
    from ..cli.cli_checks import check_out_dir
    from .plots import write_report
    from .summary import load_workloads, select

    check_out_dir(args.out)
    workloads = select(load_workloads(args.records), args.workload)
    page = write_report(workloads, args.out, args.records)
    print(f"report: {os.path.abspath(page)} ({len(workloads)} workload{'s' * (len(workloads) != 1)})")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from ..cli.cli_checks import check_out_dir
    from .export import export_best
    from .summary import load_workloads, select

    check_out_dir(args.out)
    chosen = select(load_workloads(args.records), args.workload)
    if len(chosen) > 1:
        names = "\n".join(f"  {w.key}  {w.description}" for w in chosen)
        if args.workload is not None:
            raise TvmExtError(f"{len(chosen)} workloads match --workload {args.workload!r}; name one of:\n{names}")
        # the most recently tuned of those with a correct record (any, where none has one)
        chosen = sorted(chosen, key=lambda w: (w.best is not None, max(r.timestamp for r in w.records)), reverse=True)
        print(f"note: {len(chosen)} workloads in {args.records}; exporting the most recently tuned, "
              f"{chosen[0].description} (another: --workload KEY):\n{names}", file=sys.stderr)
    manifest, notes = export_best(chosen[0], args.out, args.device)
    for note in notes:
        print(note, file=sys.stderr)
    out = os.path.abspath(os.path.dirname(manifest))
    print(f"exported {chosen[0].description} (best {chosen[0].best.cost * 1e3:.4f} ms) to {out} "  # type: ignore[union-attr]
          f"(load with tvm_ext.precision.codegen.load_program)")
    return 0
