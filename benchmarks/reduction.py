"""Reductions on the GPU: tune fp32 sums for CUDA (and OpenCL) and compare with torch in the same run.

Run through the device tool (see ../shared/DEVICE.md):
    source .tvm-device/boot.sh && python benchmarks/reduction.py --out $OUT
Workloads: torch.sum of 2^28 and 2^20 floats, x.sum(dim=1) of 4096×4096.  For each, the
patent 001 plan (the template's default), the same plan spread over enough blocks to
fill the GPU (a second GA seed), and the GA's best are timed next to torch; the OpenCL
build of those configs runs on the same GPU through NVIDIA's OpenCL driver.  Prints a
markdown table last; records go to --out so nothing measured is lost.  About 3-4 min
with the defaults (2 generations × 12).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import table, time_torch  # noqa: E402

from tvm_ext.schedules.reduction import ReductionTemplate  # noqa: E402
from tvm_ext.session import Session, SessionOptions  # noqa: E402
from tvm_ext.target import TargetInfo  # noqa: E402
from tvm_ext.tuner import Tuner  # noqa: E402

# (label, shape): 1-D shapes are torch.sum(x), 2-D shapes x.sum(dim=1)
WORKLOADS = (("sum 2^28", (1 << 28,)), ("sum 2^20", (1 << 20,)), ("row sum 4096x4096", (4096, 4096)))


def template_of(workload: tuple[str, tuple[int, ...]]) -> ReductionTemplate:
    return ReductionTemplate(workload[1], "sum", "float32")


def seed_configs(template: ReductionTemplate, target: TargetInfo) -> list[Any]:
    """GA seeds: the patent plan (default config) first, then that plan filling the GPU."""
    configs = [template.default_config(target), template.filled_config(target)]
    return list(dict.fromkeys(configs))


def torch_seconds(shape: tuple[int, ...]) -> float:
    import torch

    x = torch.rand(shape, device="cuda", dtype=torch.float32)
    if len(shape) == 1:
        return time_torch(lambda: torch.sum(x))
    return time_torch(lambda: x.sum(dim=1))


def _progress(kind: str, template: ReductionTemplate):
    def show(rec: Any, tuner: Tuner) -> None:
        speed = (f"{template.bytes_moved() / rec.cost / 1e9:.0f} GB/s" if rec.ok
                 else f"{rec.error_kind} {rec.error_msg[:120]}")
        print(f"  [{kind}] trial {tuner.trials}: {rec.config} -> {speed}", flush=True)
    return show


def _measured(tuner: Tuner, configs: list[Any]) -> list[tuple[Any, float, str]]:
    """(config, seconds, error) per config; a config whose kernel equals one measured
    before shares that measurement (the tuner dedups by generated source)."""
    costs = tuner.evaluate(configs)
    out = []
    for cfg, cost in zip(configs, costs):
        rec = tuner.record_of(cfg)
        error = "" if np.isfinite(cost) else (rec.error_kind + " " + rec.error_msg[:80] if rec else "not measured")
        out.append((cfg, float(cost), error))
    return out


def tune_cuda(workload: tuple[str, tuple[int, ...]], args: argparse.Namespace) -> dict:
    template = template_of(workload)
    tag = "x".join(map(str, workload[1]))
    options = SessionOptions(target="cuda", generations=args.generations, population=args.population,
                             trials=args.trials, workers=args.workers, seed=args.seed, build_timeout=300,
                             run_timeout=120, records=os.path.join(args.out, f"reduce_cuda_{tag}.jsonl"))
    with Session(options) as session:
        tuner = session.tuner(template, on_record=_progress("cuda", template))
        seeds = seed_configs(template, session.target)
        start = time.time()
        result = session.search(tuner, seeds=seeds)
        wall = time.time() - start
        tuner.trials_budget += len(seeds)  # a seed cut off by the budget is still reported
        seeded = _measured(tuner, seeds)
    return {"template": template, "result": result, "wall": wall, "seeds": seeded}


def run_opencl(workload: tuple[str, tuple[int, ...]], configs: list[Any],
               args: argparse.Namespace) -> list[tuple[Any, float, str]]:
    """The given configs (patent plan, filled plan, CUDA's best) built for OpenCL on the same GPU."""
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
        return _measured(tuner, wanted)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--generations", type=int, default=2)
    p.add_argument("--population", type=int, default=12)
    p.add_argument("--trials", type=int, default=36, help="max CUDA kernels measured per workload")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_out")
    p.add_argument("--skip-opencl", action="store_true")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)

    rows = []
    for workload in WORKLOADS:
        label, shape = workload
        template = template_of(workload)
        nbytes = template.bytes_moved()
        base = torch_seconds(shape)
        base_gbs = nbytes / base / 1e9
        print(f"{label}: torch {base * 1e6:.1f} us = {base_gbs:.0f} GB/s", flush=True)
        op = "torch.sum(x)" if len(shape) == 1 else "x.sum(dim=1)"
        rows.append([label, f"torch {op}", f"{base * 1e6:.1f}", f"{base_gbs:.0f}", "1.00", "-", "-", "-"])
        out = tune_cuda(workload, args)
        res = out["result"]
        labelled = []
        if res.best is not None:
            labelled.append(("cuda tuned (GA)", res.best.config_obj(), res.best.cost, ""))
        names = ["cuda patent plan (default)", "cuda patent plan, filled (seed)"]
        labelled += [(name, cfg, cost, err) for name, (cfg, cost, err) in zip(names, out["seeds"])]
        if not args.skip_opencl:  # the same configs, built for OpenCL on the same GPU
            measured = {cfg: (cost, err) for cfg, cost, err in
                        run_opencl(workload, [cfg for _, cfg, _, _ in labelled], args)}
            labelled += [("opencl" + name[len("cuda"):], cfg, *measured[cfg])
                         for name, cfg, _, _ in labelled if cfg in measured]
        for name, cfg, cost, err in labelled:
            tuned = name.startswith("cuda tuned")
            if err or not np.isfinite(cost):
                rows.append([label, f"tvm_ext {name}", err or "failed", "-", "-", "-", "-", str(cfg)])
                continue
            gbs = nbytes / cost / 1e9
            rows.append([label, f"tvm_ext {name}", f"{cost * 1e6:.1f}", f"{gbs:.0f}",
                         f"{base / cost:.2f}", res.trials if tuned else "-",
                         f"{out['wall']:.0f}" if tuned else "-", str(cfg)])
    print()
    print(table("fp32 reductions vs torch (ratio > 1: faster than torch)",
                ["workload", "kernel", "us", "GB/s", "vs torch", "trials", "tuning s", "config"], rows))


if __name__ == "__main__":
    main()
