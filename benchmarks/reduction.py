"""Reductions on the GPU: tune fp32 sums for CUDA (and OpenCL) and compare with torch in the same run.

Run through the device tool (see ../shared/DEVICE.md):
    source .tvm-device/boot.sh && python benchmarks/reduction.py --out $OUT
Workloads: torch.sum of 2^28 and 2^20 floats, x.sum(dim=1) of 4096×4096 (``--workloads``
picks some: 2^28, 2^20, rows).  Timing protocol (``benchmarks/common.py``): for each workload
the inputs are rotated through enough sets to be twice the L2 (``l2_rotation``); torch is
timed per call, back to back and replayed from a CUDA graph on those sets, and our kernels
the same three ways on the very same tensors (shared through DLPack; the graph captures TVM's
launches); ratios are best against best.  For the row sum, torch.sum over the whole matrix
(the same bytes read) is timed too: the read rate the GPU reaches, beside the rate a target
would need.  Our candidates: the GA's best few (the runner's ranking),
the patent plan (default), the patent plan spread over the GPU (two partials kernels, or one
launch: ``combine=1``) and row groups (a warp per row) — the seeds of the GA.  Every output
is checked against float64 before it is timed; both sides' errors vs float64 are printed.
The OpenCL build of the winner, the patent plan and the filled plan runs on the same GPU
through NVIDIA's OpenCL driver, timed by the runner (profiling events around each launch).
Prints a markdown table last; records go to --out.  About 5-6 min with the defaults
(2 generations × 12, at most 30 CUDA trials per workload; 2^20 and rows alone with 1
generation × 10 took 2 min on an H100).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (TimingSettings, l2_rotation, rel_error_vs, table,  # noqa: E402
                    time_ours_three, time_vendor, tvm_launch, vendor_methods)

from tvm_ext.measure.builder import build_one  # noqa: E402
from tvm_ext.measure.executors import load_library  # noqa: E402
from tvm_ext.schedules.reduce.reduction import ReductionTemplate  # noqa: E402
from tvm_ext.core.session import Session, SessionOptions  # noqa: E402
from tvm_ext.core.space import Config  # noqa: E402
from tvm_ext.target import TargetInfo  # noqa: E402
from tvm_ext.core.tuner import Tuner  # noqa: E402

# (label, shape, --workloads name): 1-D shapes are torch.sum(x), 2-D shapes x.sum(dim=1)
WORKLOADS = (("sum 2^28", (1 << 28,), "2^28"), ("sum 2^20", (1 << 20,), "2^20"),
             ("row sum 4096x4096", (4096, 4096), "rows"))
SETTINGS = TimingSettings(warmup=5, repeat=15, min_secs=0.02)


def template_of(workload: tuple[Any, ...]) -> ReductionTemplate:
    return ReductionTemplate(workload[1], "sum", "float32")


def seed_configs(template: ReductionTemplate, target: TargetInfo) -> list[tuple[str, Config]]:
    """GA seeds, named: the patent plan (default config) first, then that plan filling the GPU
    (partials summed by a second kernel, or by the last block in the same launch), then
    row groups (a warp, or two, per row) for many rows.  Unique configs only."""
    named = [("patent plan (default)", template.default_config(target)),
             ("patent plan, filled", template.filled_config(target)),
             ("patent plan, filled, one launch", template.filled_config(target, combine=1)),
             ("patent plan, half filled, one launch", template.filled_config(target, 1024, combine=1)),
             ("patent plan, twice filled, one launch", template.filled_config(target, 4096, combine=1))]
    if template.rows > 1:
        named += [("warp per row, 8 rows/block", template.row_group_config(target, 32, 256)),
                  ("warp per row, 4 rows/block", template.row_group_config(target, 32, 128)),
                  ("2 warps per row, 8 rows/block", template.row_group_config(target, 64, 512))]
    out: dict[Config, str] = {}
    for name, cfg in named:
        out.setdefault(cfg, name)
    return [(name, cfg) for cfg, name in out.items()]


def _progress(kind: str, template: ReductionTemplate):
    def show(rec: Any, tuner: Tuner) -> None:
        speed = (f"{template.bytes_moved() / rec.cost / 1e9:.0f} GB/s" if rec.ok
                 else f"{rec.error_kind} {rec.error_msg[:120]}")
        print(f"  [{kind}] trial {tuner.trials}: {rec.config} -> {speed}", flush=True)
    return show


def tune_cuda(workload: tuple[Any, ...], args: argparse.Namespace) -> dict:
    """The GA (seeded with ``seed_configs``) on CUDA, ranked by the runner's back-to-back timer."""
    template = template_of(workload)
    tag = "x".join(map(str, workload[1]))
    options = SessionOptions(target="cuda", generations=args.generations, population=args.population,
                             trials=args.trials, workers=args.workers, seed=args.seed, build_timeout=300,
                             run_timeout=120, records=os.path.join(args.out, f"reduce_cuda_{tag}.jsonl"))
    with Session(options) as session:
        target = session.target
        tuner = session.tuner(template, on_record=_progress("cuda", template))
        seeds = seed_configs(template, target)
        start = time.time()
        result = session.search(tuner, seeds=[c for _, c in seeds])
        wall = time.time() - start
        tuner.trials_budget += len(seeds)  # a seed cut off by the budget is still measured
        tuner.evaluate([c for _, c in seeds])
    ranked = sorted((r for r in session.store.for_workload(tuner.workload.key) if r.ok), key=lambda r: r.cost)
    return {"target": target, "result": result, "wall": wall, "seeds": seeds, "ranked": ranked}


class Inputs(NamedTuple):
    """The rotated input sets, as torch tensors, and their float64 references."""

    torch_sets: list[Any]
    refs: list[np.ndarray]  # float64, carrying the template's error bound


def make_inputs(template: ReductionTemplate, seed: int) -> Inputs:
    import torch

    sets = l2_rotation(template.bytes_moved())
    rng = np.random.default_rng(seed)
    arrays = [template.make_inputs(rng)[0] for _ in range(sets)]
    refs = [template.reference([a])[0] for a in arrays]
    return Inputs([torch.from_numpy(a).cuda() for a in arrays], refs)


def time_torch_op(template: ReductionTemplate, inputs: Inputs) -> tuple[Any, float]:
    """torch's sum timed three ways on the rotated sets, and its error vs float64 (set 0)."""
    import torch

    if template.rows == 1:
        op = lambda i: torch.sum(inputs.torch_sets[i])  # noqa: E731
    else:
        op = lambda i: inputs.torch_sets[i].sum(dim=1)  # noqa: E731
    times = time_vendor(op, len(inputs.torch_sets), SETTINGS)
    err = rel_error_vs(op(0).reshape(-1), inputs.refs[0])
    return times, err


def time_read_ceiling(inputs: Inputs) -> Any:
    """torch.sum over the whole of each rotated set, timed three ways: a full reduction reads
    the same bytes as the row sum and writes one number, so its best is a read rate this GPU
    reaches, the yardstick for what a row-sum target asks of memory."""
    import torch

    return time_vendor(lambda i: torch.sum(inputs.torch_sets[i]), len(inputs.torch_sets), SETTINGS)


def time_ours_config(template: ReductionTemplate, cfg: Config, target: TargetInfo,
                     inputs: Inputs) -> tuple[float, float, str, str]:
    """(seconds, rel error vs float64, problem, timing method) of one config: built here,
    every set checked once against float64 (outputs NaN-poisoned), then timed the vendor's
    three ways on the same tensors (the graph capturing TVM's launches); its best."""
    import tvm

    build = build_one(template, cfg, target)
    if not build.ok:
        return float("nan"), float("nan"), f"build: {build.error_msg[:100]}", ""
    func = load_library(build.artifact.library)["main"]
    dev = tvm.cuda(target.device_id)
    arg_sets, errors = [], []
    for x, ref in zip(inputs.torch_sets, inputs.refs):
        rest = [np.full(s.shape, np.nan if s.fill is None else s.fill, s.dtype)
                for s in template.outputs() + template.scratch()]
        args = [tvm.runtime.from_dlpack(x)] + [tvm.runtime.tensor(a, dev) for a in rest]
        func(*args)
        dev.sync()
        out = args[1].numpy()
        wrong = template.check([out], [ref])
        if wrong:
            return float("nan"), float("nan"), f"wrong answer: {wrong[:100]}", ""
        errors.append(rel_error_vs(out, ref))
        arg_sets.append(args)
    times = time_ours_three(tvm_launch(func, arg_sets, [args[1] for args in arg_sets]), len(arg_sets), SETTINGS)
    for args, ref in zip(arg_sets, inputs.refs):  # still right after the timing loops
        wrong = template.check([args[1].numpy()], [ref])
        if wrong:
            return float("nan"), float("nan"), f"wrong after repeated launches: {wrong[:100]}", ""
    return times.best.seconds, max(errors), "", times.best.method


def run_opencl(workload: tuple[Any, ...], configs: list[Config],
               args: argparse.Namespace) -> list[tuple[Config, float, str]]:
    """The given configs built for OpenCL on the same GPU, timed by the runner."""
    template = template_of(workload)
    tag = "x".join(map(str, workload[1]))
    options = SessionOptions(target="opencl", workers=min(args.workers, 4), build_timeout=300, run_timeout=120,
                             records=os.path.join(args.out, f"reduce_opencl_{tag}.jsonl"))
    with Session(options) as session:
        space = template.space(session.target)
        wanted = []
        for cfg in configs:
            try:
                cfg = space.make(**cfg.as_dict())
            except Exception:  # a block size this OpenCL device does not allow
                continue
            if space.is_feasible(cfg):
                wanted.append(cfg)
        wanted = list(dict.fromkeys(wanted))
        tuner = session.tuner(template, on_record=_progress("opencl", template))
        tuner.trials_budget = len(wanted)
        costs = tuner.evaluate(wanted)
    out = []
    for cfg, cost in zip(wanted, costs):
        rec = tuner.record_of(cfg)
        error = "" if np.isfinite(cost) else (rec.error_kind + " " + rec.error_msg[:80] if rec else "not measured")
        out.append((cfg, float(cost), error))
    return out


def bench_workload(workload: tuple[Any, ...], args: argparse.Namespace) -> list[list[Any]]:
    label, shape, _ = workload
    template = template_of(workload)
    nbytes = template.bytes_moved()
    gbs = lambda s: f"{nbytes / s / 1e9:.0f}"  # noqa: E731
    op = "torch.sum(x)" if len(shape) == 1 else "x.sum(dim=1)"
    tuned = tune_cuda(workload, args)
    target, res = tuned["target"], tuned["result"]
    inputs = make_inputs(template, args.seed)
    vendor, vendor_err = time_torch_op(template, inputs)
    best = vendor.best.seconds
    print(f"{label}: torch per call {vendor.per_call.seconds * 1e6:.1f} us, back-to-back "
          f"{vendor.back_to_back.seconds * 1e6:.1f} us, graph "
          f"{vendor.graph.seconds * 1e6 if vendor.graph else float('nan'):.1f} us "
          f"({vendor.graph_note or len(inputs.torch_sets)} sets)", flush=True)
    rows = []
    if len(shape) == 2:  # what this GPU reads at, and what a 1.3x row-sum target would need
        ceiling = time_read_ceiling(inputs)
        print(f"{label}: torch.sum over the whole matrix {ceiling.best.seconds * 1e6:.1f} us "
              f"({ceiling.best.method}), {gbs(ceiling.best.seconds)} GB/s; 1.3x torch's row-sum best needs "
              f"{gbs(best / 1.3)} GB/s", flush=True)
        for method, t in vendor_methods(ceiling):
            rows.append([label, "torch torch.sum(x), whole matrix (read rate)", method,
                         f"{t.seconds * 1e6:.1f}" if t else "-", gbs(t.seconds) if t else "-", "-", "-", "-", "-",
                         "-"])
    for method, t in vendor_methods(vendor):
        if t is None:
            rows.append([label, f"torch {op}", method, "-", "-", "-", f"{vendor_err:.1e}", "-", "-", "-"])
            continue
        rows.append([label, f"torch {op}", method, f"{t.seconds * 1e6:.1f}", gbs(t.seconds),
                     f"{best / t.seconds:.2f}", f"{vendor_err:.1e}", "-", "-", "-"])
    # ours: the GA's best few by the runner's timer, then every seed
    candidates: dict[Config, str] = {}
    for rec in tuned["ranked"][: args.retime]:
        candidates.setdefault(rec.config_obj(), "GA rank")
    for name, cfg in tuned["seeds"]:
        candidates.setdefault(cfg, name)
    ours = []
    for cfg, name in candidates.items():
        secs, err, problem, method = time_ours_config(template, cfg, target, inputs)
        print(f"  [protocol] {name}: {cfg} -> {problem or f'{secs * 1e6:.2f} us ({method})'}", flush=True)
        ours.append((name, cfg, secs, err, problem, method))
    timed = [o for o in ours if not o[4]]
    winner = min(timed, key=lambda o: o[2]) if timed else None
    for name, cfg, secs, err, problem, method in ours:
        if problem:
            rows.append([label, f"tvm_ext cuda {name}", "-", problem, "-", "-", "-", "-", "-", str(cfg)])
            continue
        star = " (best)" if winner is not None and cfg == winner[1] else ""
        rows.append([label, f"tvm_ext cuda {name}{star}", f"best of three: {method}", f"{secs * 1e6:.1f}", gbs(secs),
                     f"{best / secs:.2f}", f"{err:.1e}", res.trials if star else "-",
                     f"{tuned['wall']:.0f}" if star else "-", str(cfg)])
    if not args.skip_opencl:  # the same configs, built for OpenCL on the same GPU
        # the protocol's winner and the first two seeds (the patent plan, and filled)
        opencl_configs = ([winner[1]] if winner else []) + [cfg for _, cfg in tuned["seeds"][:2]]
        for cfg, cost, err in run_opencl(workload, opencl_configs, args):
            name = candidates.get(cfg, "")
            timing = "runner (OpenCL events, per launch)"
            if err or not np.isfinite(cost):
                rows.append([label, f"tvm_ext opencl {name}", timing, err or "failed", "-", "-", "-", "-", "-",
                             str(cfg)])
                continue
            rows.append([label, f"tvm_ext opencl {name}", timing, f"{cost * 1e6:.1f}", gbs(cost),
                         f"{best / cost:.2f}", "-", "-", "-", str(cfg)])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--generations", type=int, default=2)
    p.add_argument("--population", type=int, default=12)
    p.add_argument("--trials", type=int, default=30, help="max CUDA kernels measured per workload")
    p.add_argument("--retime", type=int, default=3, help="the GA's best N re-timed under the protocol (default 3)")
    p.add_argument("--workloads", default="2^28,2^20,rows", help="comma list of 2^28, 2^20, rows")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_out")
    p.add_argument("--skip-opencl", action="store_true")
    args = p.parse_args()
    wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = set(wanted) - {w[2] for w in WORKLOADS}
    if unknown:
        print(f"error: unknown workloads {sorted(unknown)}; allowed: {', '.join(w[2] for w in WORKLOADS)}",
              file=sys.stderr)
        sys.exit(2)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for workload in WORKLOADS:
        if workload[2] in wanted:
            rows += bench_workload(workload, args)
    print()
    print(table("fp32 reductions vs torch (ratio > 1: faster than torch at its best)",
                ["workload", "kernel", "timing", "us", "GB/s", "vs torch best", "rel err vs f64", "trials",
                 "tuning s", "config"], rows))


if __name__ == "__main__":
    main()
