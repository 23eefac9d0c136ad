"""Record a large sweep of the GEMM space (for replay: strategies compared without hardware).

    python benchmarks/sweep_gemm.py --target cuda --shape 2048,2048,2048 --count 2000 --out $OUT

Measures ``count`` distinct feasible configs drawn at random (or the whole feasible space
if it is smaller), then writes a compact gzipped JSON-lines file: a header line with the
workload and target (``target_info``: the device's limits, which the replay's hardware
model reads), then one line per config with its median cost (or error kind).
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import sys
import time

import numpy as np

from tvm_ext.builder import LocalBuilder
from tvm_ext.records import RecordStore
from tvm_ext.runner import LocalRunner, MeasureSettings
from tvm_ext.schedules.gemm import GemmTemplate
from tvm_ext.target import resolve_target
from tvm_ext.tuner import Tuner


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", default="opencl")
    p.add_argument("--shape", default="64,64,64")
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_out")
    p.add_argument("--max-minutes", type=float, default=8.0)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    target = resolve_target(args.target)
    shape = tuple(int(x) for x in args.shape.split(","))
    template = GemmTemplate(*shape)
    space = template.space(target)
    rng = np.random.default_rng(args.seed)
    rows = space.random_feasible_indices(rng, args.count, max_draws=200 * args.count)
    configs = [space.decode(r) for r in rows]
    name = f"sweep_gemm_{args.target}_{'x'.join(map(str, shape))}"
    store = RecordStore(os.path.join(args.out, name + ".full.jsonl"))
    settings = MeasureSettings(warmup=1, repeat=3, min_repeat_secs=0.005)
    tuner = Tuner(template, target, LocalBuilder(workers=args.workers, timeout=300),
                  LocalRunner(target, settings, timeout=60), store)
    start = time.time()
    for i in range(0, len(configs), 64):
        if time.time() - start > args.max_minutes * 60:
            print(f"time limit: stopping after {i} configs", flush=True)
            break
        tuner.evaluate(configs[i:i + 64])
        best = tuner.best
        print(f"{min(i + 64, len(configs))}/{len(configs)} measured, best "
              f"{template.flops() / best.cost / 1e9:.0f} GFLOP/s" if best else "-", flush=True)
    tuner.builder.close(), tuner.runner.close()
    with gzip.open(os.path.join(args.out, name + ".jsonl.gz"), "wt") as fh:
        fh.write(json.dumps({"workload": tuner.workload.as_json(), "target": target.key(),
                             "target_info": dataclasses.asdict(target), "knobs": list(space.names),
                             "feasible_space": sum(1 for c in space if space.is_feasible(c)),
                             "measured": len(tuner._records)}) + "\n")
        for cfg in configs:
            rec = tuner.record_of(cfg)
            if rec is None:
                continue
            fh.write(json.dumps({"config": cfg.as_dict(), "cost": rec.cost if rec.ok else None,
                                 "error_kind": rec.error_kind}, sort_keys=True) + "\n")
    print(f"wrote {name}.jsonl.gz with {len(tuner._records)} configs in {time.time() - start:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
