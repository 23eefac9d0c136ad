"""A whole model tuned on 1, 2 and 4 GPUs: wall time to the same model speed.

For each device set (``--device-sets 0/0,1/0,1,2,3``), from empty records and database:
``tune_relax`` with the local runner's process per device and as many kernels searched at once
as devices times ``--tasks-per-device`` (``tasks_in_flight``), the same trials per kernel and seed,
its log with each line's seconds in ``devices_<set>/tune.log``; then the compiled model's
latency (the Relax VM's call, best of per call / back to back / CUDA graph on CUDA) and its
error against the model's float64 reference.  The table gives each set's tuning wall time, its
ratio to the first set's, and the latencies (the same speed is the point: a faster tuning that
found slower kernels is not a result).

    source .tvm-device/boot.sh && python benchmarks/model_scaling.py --out $OUT          # BERT layer, float16
    python benchmarks/model_scaling.py --target opencl --model mlp --device-sets 0/0,0   # CPU smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import table  # noqa: E402
from models import _example  # noqa: E402

from tvm_ext.relax.pipeline import TuneOptions, load_model, tune_relax  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402


def model_parts(name: str, dtype: str) -> tuple[object, list[np.ndarray], np.ndarray]:
    example = _example("bert_layer" if name == "bert" else name)
    if name == "bert":
        kwargs = dict(size="base", dtype=dtype, source="transformers")
        return example.get_module(**kwargs), example.get_inputs(**kwargs), example.reference(
            example.get_inputs(**kwargs), **kwargs)
    inputs = example.get_inputs()
    return example.get_module(), inputs, example.reference(inputs)


def latency(compiled: object, inputs: list[np.ndarray], reference: np.ndarray, target_kind: str) -> tuple[float, float]:
    """(seconds, relative error) of the compiled model's call."""
    out = compiled(*inputs)
    err = float(np.linalg.norm(np.asarray(out, np.float64) - reference) / max(np.linalg.norm(reference), 1e-30))
    if target_kind == "cuda":
        from models import time_tvm

        secs, err, _ = time_tvm(compiled, inputs, reference)
        return secs, err
    return compiled.time(*inputs), err


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out")
    p.add_argument("--target", default="cuda", choices=("cuda", "opencl"))
    p.add_argument("--model", default="bert", choices=("bert", "mlp", "gru_model"))
    p.add_argument("--dtype", default="float16")
    p.add_argument("--device-sets", default="0/0,1/0,1,2,3", help="device sets separated by /")
    p.add_argument("--trials", type=int, default=32, help="trials per kernel (default 32)")
    p.add_argument("--population", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tasks-per-device", type=int, default=1,
                   help="kernels searched at once per device (default 1): more keep a GPU measuring while "
                        "another kernel's candidates build")
    args = p.parse_args()
    target = resolve_target(args.target, 0)
    mod, inputs, reference = model_parts(args.model, args.dtype)
    os.makedirs(args.out, exist_ok=True)
    rows, first = [], None
    for devices in args.device_sets.split("/"):
        count = len(devices.split(","))
        options = TuneOptions(target=args.target, generations=1000, trials=args.trials, population=args.population,
                              tourn_size=1 if args.population <= 4 else 2, seed=args.seed,
                              tasks_in_flight=count * args.tasks_per_device,
                              runner_options=(("devices", devices),))
        work = os.path.join(args.out, f"devices_{devices.replace(',', '-')}")
        start = time.time()
        os.makedirs(work, exist_ok=True)
        with open(os.path.join(work, "tune.log"), "w") as log_file:
            def log(msg: str, start: float = start) -> None:  # the tuner's lines, seconds since the start
                log_file.write(f"{time.time() - start:8.2f} {msg}\n")
                log_file.flush()

            result = tune_relax(mod, target, os.path.join(work, "records.jsonl"), os.path.join(work, "database"),
                                options, log=log)
        wall = time.time() - start
        secs, err = latency(load_model(mod, target, os.path.join(work, "database"), log=None), inputs, reference,
                            target.kind)
        first = first or wall
        tuned = [t for t in result.tasks if t.template]
        row = {"devices": devices, "tasks_in_flight": count * args.tasks_per_device,
               "kernels": len(tuned), "trials": sum(t.trials for t in tuned), "wall_s": wall,
               "wall_vs_first": wall / first, "latency_ms": secs * 1e3, "err": err}
        with open(os.path.join(args.out, "model_scaling.jsonl"), "a") as fh:
            fh.write(json.dumps(row) + "\n")
        rows.append([devices, row["kernels"], row["trials"], f"{wall:.1f}", f"{wall / first:.2f}",
                     f"{secs * 1e3:.3f}", f"{err:.1e}"])
        print(rows[-1], flush=True)
    label = f"{args.model} {args.dtype}" if args.model == "bert" else args.model
    print(table(f"{label} tuned on device sets ({args.trials} trials a kernel, {target.device_name})",
                ["devices", "kernels", "trials", "tuning wall s", "vs first", "model ms", "err"], rows))


if __name__ == "__main__":
    main()
