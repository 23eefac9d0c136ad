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
from typing import Any, Sequence

from .cli_args import Parser, add_tuning_args, format_speed, knob_help, parse_batch, parse_shape, session_options
from .errors import TvmExtError


def build_parser() -> argparse.ArgumentParser:
    from .schedules.gemm import KNOBS as GEMM_KNOBS, STAGING_KNOBS

    parser = Parser(
        prog="python -m tvm_ext.tune",
        description="Search the schedule space of a TVM operator template and keep the fastest kernel.",
    )
    sub = parser.add_subparsers(dest="command", metavar="TEMPLATE", required=True,
                                parser_class=Parser)
    gemm = sub.add_parser(
        "gemm", help="fp32 GEMM C[M,N] = A[M,K]·B[K,N]",
        description="Tune fp32 GEMM C[M,N] = A[M,K]·B[K,N] with the parallel genetic algorithm (patent 000).",
        epilog=knob_help(GEMM_KNOBS + STAGING_KNOBS), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gemm.add_argument("--shape", required=True, help="M,N,K (e.g. 512,512,512)")
    gemm.add_argument("--staging", action="store_true",
                      help="also search the staging knobs (prefetch, warp_x, load_vec; listed last below)")
    gemm.add_argument("--feasibility", default="tvm", choices=("tvm", "patent"),
                      help="tvm: tile fits the device limits (default); patent: also wg_x·wg_y·task_x·task_y | P·P")
    add_tuning_args(gemm)
    _add_json_arg(gemm)
    gemm.set_defaults(make_template=_gemm_template)

    from .schedules.mma import ACC_DTYPES, OPERAND_DTYPES
    from .schedules.tensor_core_choice import CHOICE_KNOBS

    gemm_tc = sub.add_parser(
        "gemm-tc", help="float16/bfloat16 GEMM on tensor cores (CUDA): the kernel (mma.sync, WMMA or Hopper's "
                        "wgmma) and its tile are what is searched",
        description="Tune C[M,N] = A[M,K]·B[K,N] with float16 (or bfloat16) A and B on the tensor cores (CUDA): "
                    "the GA searches the kernel (--kernel any: mma.sync with ldmatrix, WMMA, or on Hopper wgmma) "
                    "and its tile; --strategy analytic gives a tile without measuring.",
        epilog=knob_help(CHOICE_KNOBS), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gemm_tc.add_argument("--shape", required=True, help="M,N,K; N and K multiples of 16 (e.g. 4096,4096,4096)")
    gemm_tc.add_argument("--kernel", default="any", choices=("any", "mma", "wmma"),
                         help="any: the search picks mma.sync, WMMA or (Hopper) wgmma (default); mma / wmma: that "
                              "kernel only")
    gemm_tc.add_argument("--in-dtype", default="float16", choices=OPERAND_DTYPES,
                         help="A and B (default float16; WMMA takes float16 only)")
    gemm_tc.add_argument("--acc-dtype", default="float32", choices=ACC_DTYPES, help="accumulator (default float32)")
    gemm_tc.add_argument("--out-dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                         help="C's dtype (default float32)")
    add_tuning_args(gemm_tc)
    _add_json_arg(gemm_tc)
    gemm_tc.set_defaults(make_template=_gemm_tc_template)

    from .schedules.wgmma import KNOBS as WGMMA_KNOBS

    gemm_wgmma = sub.add_parser(
        "gemm-wgmma", help="float16 GEMM C = A·Btᵀ (Bt stored N×K, a Linear weight) on Hopper's warpgroup MMA",
        description="Tune C[M,N] = A[M,K]·Bt[N,K]ᵀ, float16 in and out, float32 accumulate, on Hopper's "
                    "wgmma (sm_90): the tile, the cp.async pipeline and the epilogue are what is searched.",
        epilog=knob_help(WGMMA_KNOBS), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gemm_wgmma.add_argument("--shape", required=True, help="M,N,K; multiples of the tile (e.g. 4096,4096,4096)")
    gemm_wgmma.add_argument("--b-layout", choices=("nk", "kn"), default="nk",
                            help="nk: Bt stored N×K, C = A·Btᵀ (default); kn: B stored K×N, C = A·B (wgmma reads it "
                                 "N-major)")
    gemm_wgmma.add_argument("--batch", default="",
                            help="leading batch axes of A, B and C, one GEMM each (e.g. 8,12: attention's batch "
                                 "and heads); default none")
    gemm_wgmma.add_argument("--b-shared", action="store_true", help="with --batch: B has no batch axes (one B for all)")
    add_tuning_args(gemm_wgmma)
    _add_json_arg(gemm_wgmma)
    gemm_wgmma.set_defaults(make_template=_gemm_wgmma_template)

    from .schedules.gemm_3xtf32 import KNOBS as TF32_KNOBS

    gemm_3xtf32 = sub.add_parser(
        "gemm-3xtf32", help="float32 GEMM C = A·B at float32 accuracy on Hopper's TF32 tensor cores (3 products)",
        description="Tune float32 C[M,N] = A[M,K]·B[K,N] computed as three TF32 products on Hopper's wgmma "
                    "(sm_90), each operand split into two TF32 parts, the tensor cores' sums promoted into "
                    "round-to-nearest float32 adds: the tile, the pipeline and the promotion are what is searched.",
        epilog=knob_help(TF32_KNOBS), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gemm_3xtf32.add_argument("--shape", required=True,
                             help="M,N,K; M, N multiples of 64, K of 32 (e.g. 4096,4096,4096)")
    add_tuning_args(gemm_3xtf32)
    _add_json_arg(gemm_3xtf32)
    gemm_3xtf32.set_defaults(make_template=_gemm_3xtf32_template)

    from .schedules.reduction import DTYPES as REDUCE_DTYPES, KNOBS as REDUCE_KNOBS, OPS as REDUCE_OPS

    reduce = sub.add_parser(
        "reduce", help="reduction of a vector, or of each row of a matrix (sum, max, min, mean, sumsq)",
        description="Tune a full 1-D reduction (--shape N) or a row-wise reduction (--shape ROWS,COLS) "
                    "from patent 001's x/z/w plan (the default config) with the genetic algorithm.",
        epilog=knob_help(REDUCE_KNOBS), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    reduce.add_argument("--op", default="sum", choices=REDUCE_OPS, help="reduction (default sum)")
    reduce.add_argument("--shape", required=True, help="N (e.g. 1048576) or ROWS,COLS (e.g. 4096,4096)")
    reduce.add_argument("--dtype", default="float32", choices=REDUCE_DTYPES,
                        help="input type; float16 accumulates in float32 (default float32)")
    add_tuning_args(reduce)
    _add_json_arg(reduce)
    reduce.set_defaults(make_template=_reduce_template)
    _add_gru_parser(sub)
    from .model_cli import add_model_parser

    add_model_parser(sub, add_tuning_args)
    from .mp_cli import add_mixed_precision_parser

    add_mixed_precision_parser(sub)
    from .results.cli import add_result_parsers

    add_result_parsers(sub)
    return parser


def _add_json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="print the final result as JSON on stdout (progress and notes stay on stderr)")


def _add_gru_parser(sub: Any) -> None:
    from .schedules.gru import KNOBS as GRU_KNOBS

    gru = sub.add_parser(
        "gru", help="GRU inference layer (torch.nn.GRU semantics): the whole forward pass",
        description="Tune a GRU layer stack (patent 004's pipeline and its fusions): cell block size, "
                    "step fusion and both gate GEMMs' tiles, timing the whole forward pass.",
        epilog=knob_help(GRU_KNOBS), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gru.add_argument("--batch", type=int, required=True, help="batch size B")
    gru.add_argument("--hidden", type=int, required=True, help="hidden size H")
    gru.add_argument("--input", type=int, required=True, help="input size I")
    gru.add_argument("--seq", type=int, required=True, help="sequence length T")
    gru.add_argument("--layers", type=int, default=1, help="stacked layers (default 1)")
    gru.add_argument("--bidirectional", action="store_true", help="two directions per layer")
    add_tuning_args(gru)
    _add_json_arg(gru)
    gru.set_defaults(make_template=_gru_template)


def _gru_template(args: argparse.Namespace) -> Any:
    from .schedules.gru import GruTemplate

    return GruTemplate(batch=args.batch, hidden=args.hidden, input=args.input, seq=args.seq,
                       layers=args.layers, bidirectional=args.bidirectional)


def _gemm_template(args: argparse.Namespace) -> Any:
    from .schedules.gemm import GemmTemplate

    return GemmTemplate.from_shape(parse_shape(args.shape, ("M", "N", "K")), feasibility=args.feasibility,
                                   staging=args.staging)


def _gemm_wgmma_template(args: argparse.Namespace) -> Any:
    from .schedules.wgmma_template import WgmmaGemmTemplate

    batch = parse_batch(args.batch)
    if args.b_shared and not batch:
        raise TvmExtError("--b-shared needs --batch (a B shared by the matrices of a batch)")
    return WgmmaGemmTemplate.from_shape(parse_shape(args.shape, ("M", "N", "K")), b_layout=args.b_layout.upper(),
                                        batch=batch, b_shared=args.b_shared)


def _gemm_3xtf32_template(args: argparse.Namespace) -> Any:
    from .schedules.gemm_3xtf32 import Gemm3xTf32Template

    return Gemm3xTf32Template.from_shape(parse_shape(args.shape, ("M", "N", "K")))


def _gemm_tc_template(args: argparse.Namespace) -> Any:
    from .schedules.mma import MmaGemmTemplate
    from .schedules.tensor_core import TensorCoreGemmTemplate
    from .schedules.tensor_core_choice import TensorCoreChoiceTemplate

    kind = {"any": TensorCoreChoiceTemplate, "mma": MmaGemmTemplate, "wmma": TensorCoreGemmTemplate}[args.kernel]
    return kind.from_shape(parse_shape(args.shape, ("M", "N", "K")), a_dtype=args.in_dtype, b_dtype=args.in_dtype,
                           acc_dtype=args.acc_dtype, c_dtype=args.out_dtype)


def _reduce_template(args: argparse.Namespace) -> Any:
    from .schedules.reduction import ReductionTemplate

    names = ("ROWS", "COLS") if "," in args.shape.replace("x", ",") else ("N",)
    return ReductionTemplate.from_shape(parse_shape(args.shape, names), op=args.op, dtype=args.dtype)


def run_tuning(args: argparse.Namespace) -> int:
    from .records import RecordStore
    from .session import Session

    from .cli_checks import check_index_range, check_memory

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
    """Method 002 (or the template's own rule): print the pick; measure it once."""
    import dataclasses

    from .session import RUNNERS, Session
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
    from .session import analytic_pick

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
    is glued to it; ``finish`` makes the total the trials really made."""

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
        kernel cost no trial, so the bar ends at the trials made, full."""
        if self.bar is not None and self.bar.n != self.bar.total:
            self.bar.total = self.bar.n
            self.bar.refresh()

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
    from .interrupts import EXIT_INTERRUPTED, stop_signals

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
    sys.exit(main())
