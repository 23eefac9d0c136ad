"""A model's tuning with the build pool started cold (at the first build) or warmed (started
before the tasks are found, ``LocalBuilder.start``), interleaved: the tuning wall of each round.

The float16 BERT layer (8 kernels, 8 trials a kernel, population 4) tuned from empty records
with ``tune_relax`` on ``--devices``, ``--tasks-per-device`` kernels searched at once a device;
each round's tuner log (with the seconds each workload's check data took to make) under
``--out``.  Rows: one JSON line a round, in ``--out``/walls.jsonl.

    source .tvm-device/boot.sh && python benchmarks/probes/warm_build_pool.py --out $OUT/p --devices 0,1,2,3
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from model_scaling import model_parts  # noqa: E402

from tvm_ext.measure import builder, runner  # noqa: E402
from tvm_ext.relax.pipeline import TuneOptions, tune_relax  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out/warm_build_pool")
    p.add_argument("--devices", default="0")
    p.add_argument("--tasks-per-device", type=int, default=4)
    p.add_argument("--rounds", default="cold,warm,cold,warm", help="cold or warm, comma-separated, in order")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    target = resolve_target("cuda", 0)
    mod, _, _ = model_parts("bert", "float16")
    start_pool, keyed_case = builder.LocalBuilder.start, runner.keyed_case
    clock = {"t0": 0.0, "log": None}

    def log(message: str) -> None:
        clock["log"].write(f"{time.time() - clock['t0']:8.2f} {message}\n")
        clock["log"].flush()

    def timed_case(*a, **k):  # the runner's check data, made as each search starts
        began = time.time()
        out = keyed_case(*a, **k)
        log(f"check data made in {time.time() - began:.2f} s")
        return out

    runner.keyed_case = timed_case
    for i, how in enumerate(args.rounds.split(",")):
        builder.LocalBuilder.start = start_pool if how == "warm" else (lambda self: None)
        work = os.path.join(args.out, f"{i}_{how}")
        os.makedirs(work, exist_ok=True)
        options = TuneOptions(target="cuda", generations=1000, trials=8, population=4, tourn_size=1, seed=0,
                              tasks_in_flight=len(args.devices.split(",")) * args.tasks_per_device,
                              runner_options=(("devices", args.devices),))
        with open(os.path.join(work, "tune.log"), "w") as clock["log"]:
            clock["t0"] = time.time()
            tune_relax(mod, target, os.path.join(work, "records.jsonl"), os.path.join(work, "db"), options, log=log)
            wall = time.time() - clock["t0"]
        shutil.rmtree(os.path.join(work, "db"), ignore_errors=True)
        row = {"round": i, "pool": how, "devices": args.devices, "tasks_per_device": args.tasks_per_device,
               "wall_s": round(wall, 2), "cpus": os.cpu_count()}
        print(json.dumps(row), flush=True)
        with open(os.path.join(args.out, "walls.jsonl"), "a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
