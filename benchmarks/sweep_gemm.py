"""Record a large sweep of the GEMM space (for replay: strategies compared without hardware).

    python benchmarks/sweep_gemm.py --target cuda --shape 2048,2048,2048 --count 2000 --out $OUT

Measures ``count`` distinct feasible configs drawn at random (or the whole feasible space
if it is smaller), then writes a compact gzipped JSON-lines file: a header line with the
workload and target (``target_info``: the device's limits, which the replay's hardware
model reads), then one line per config with its median cost (or error kind).

``--rounds R`` measures each block of 64 built configs R times, round by round, and keeps
the median of the R round medians: on a noisy device (PoCL on a shared 2-core CPU, where
one config's time at 64^3 moves by +-40 % from one measurement to the next) a single
measurement makes the sweep's "best" a lucky draw.  Records are appended as they are
made (the full store beside the output), so a rerun resumes.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import statistics
import sys
import time

import numpy as np

from tvm_ext.measure.builder import BuildResult
from tvm_ext.core.records import Record
from tvm_ext.measure.runner import MeasureSettings, RunResult, run_all
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.core.session import Session, SessionOptions
from tvm_ext.core.template import Workload


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", default="opencl")
    p.add_argument("--shape", default="64,64,64")
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_out")
    p.add_argument("--max-minutes", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=1, help="measurements per config, interleaved (median kept)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    name = f"sweep_gemm_{args.target}_{args.shape.replace(',', 'x')}"
    settings = MeasureSettings(warmup=1, repeat=3, min_repeat_secs=0.005)
    session = Session(SessionOptions(target=args.target, workers=args.workers, build_timeout=300, run_timeout=60,
                                     measure=settings, records=os.path.join(args.out, name + ".full.jsonl")))
    target, store, builder, runner = session.target, session.store, session.builder, session.runner
    shape = tuple(int(x) for x in args.shape.split(","))
    template = GemmTemplate(*shape)
    space = template.space(target)
    rng = np.random.default_rng(args.seed)
    rows = space.random_feasible_indices(rng, args.count, max_draws=200 * args.count)
    configs = [space.decode(r) for r in rows]
    workload = Workload.of(template, target)
    records = {r.config_obj(): r for r in store.for_workload(workload.key)}
    start = time.time()
    todo = [c for c in configs if c not in records]
    for i in range(0, len(todo), 64):
        if time.time() - start > args.max_minutes * 60:
            print(f"time limit: stopping with {len(todo) - i} configs left (a rerun resumes)", flush=True)
            break
        builds = builder.build(template, todo[i:i + 64], target)
        rounds = [run_all(runner, template, builds) for _ in range(args.rounds)]
        for j, build in enumerate(builds):
            rec = _record(workload, build, [r[j] for r in rounds])
            store.append(rec)
            records[build.config] = rec
        good = [r.cost for r in records.values() if r.ok]
        print(f"{len(records)}/{len(configs)} measured, best "
              f"{template.flops() / min(good) / 1e9:.1f} GFLOP/s" if good else "-", flush=True)
    session.close()
    with gzip.open(os.path.join(args.out, name + ".jsonl.gz"), "wt") as fh:
        fh.write(json.dumps({"workload": workload.as_json(), "target": target.key(),
                             "target_info": dataclasses.asdict(target), "knobs": list(space.names),
                             "feasible_space": sum(1 for c in space if space.is_feasible(c)),
                             "measured": len(records), "rounds": args.rounds}) + "\n")
        for cfg in configs:
            rec = records.get(cfg)
            if rec is None:
                continue
            fh.write(json.dumps({"config": cfg.as_dict(), "cost": rec.cost if rec.ok else None,
                                 "error_kind": rec.error_kind}, sort_keys=True) + "\n")
    print(f"wrote {name}.jsonl.gz with {len(records)} configs in {time.time() - start:.0f} s")


def _record(workload: Workload, build: BuildResult, results: list[RunResult]) -> Record:
    """One record per config: its costs are the round medians (a failed round fails it; the
    runner reports a failed build as every round's error)."""
    failed = next((r for r in results if not r.ok), None)
    costs = () if failed else tuple(statistics.median(r.costs) for r in results)
    return Record(workload_key=workload.key, workload=workload.as_json(), config=build.config.as_dict(),
                  costs=costs, error_kind=failed.error_kind if failed else "",
                  error_msg=failed.error_msg if failed else "", build_secs=round(build.build_secs, 4),
                  source_hash=build.artifact.source_hash if build.artifact else "")


if __name__ == "__main__":
    sys.exit(main())
