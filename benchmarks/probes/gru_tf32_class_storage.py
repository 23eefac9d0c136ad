"""Which tensors a float32 GRU in TF32's class stores in float16: every one (the module's
``TF32_CLASS_PRECISION``, as ``precision="float16"``), or gi and/or out kept in float32 (TF32 rounds a matmul's
operands only: x, W and h), each built from its pick, timed back to back in interleaved rounds
and checked against float64 (float32 in and out), at the float32 GRU models' shapes.
Usage: python benchmarks/probes/gru_tf32_class_storage.py [--rounds 3] [--out FILE.json]"""
from __future__ import annotations

import argparse
import json
import math
import statistics

import numpy as np

from tvm_ext.precision.precision import relative_error
from tvm_ext.schedules.gru import GRU, gru_reference
from tvm_ext.target import resolve_target
from tvm_ext.torch import TF32_CLASS_PRECISION

MAPS = {"none": {}, "gi": {"gi": "float32"}, "out": {"out": "float32"},
        "gi, out": {"gi": "float32", "out": "float32"}}  # kept in float32, the rest float16
# (batch, hidden, layers, bidirectional): the classifier's GRU at B64 / B8, the speech model's at B64 / B8
SHAPES = ((64, 512, 2, True), (8, 512, 2, True), (64, 1024, 3, False), (8, 1024, 3, False))
SEQ = 128


def weights(rng: np.random.Generator, hidden: int, layers: int, dirs: int) -> dict[str, np.ndarray]:
    g, k = 3 * hidden, 1 / math.sqrt(hidden)
    out = {}
    for layer in range(layers):
        width = hidden if layer == 0 else dirs * hidden
        for sfx in ("", "_reverse")[:dirs]:
            for name, shape in (("weight_ih", (g, width)), ("weight_hh", (g, hidden)), ("bias_ih", (g,)),
                                ("bias_hh", (g,))):
                out[f"{name}_l{layer}{sfx}"] = rng.uniform(-k, k, shape).astype("float32")
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="")
    args = p.parse_args()
    target = resolve_target("cuda", 0)
    rows = []
    print("| batch, hidden, layers | kept in float32 (the rest float16) | ms (median of rounds) | error |")
    print("|---|---|---|---|")
    for batch, hidden, layers, bi in SHAPES:
        rng = np.random.default_rng(0)
        w = weights(rng, hidden, layers, 2 if bi else 1)
        x = rng.standard_normal((SEQ, batch, hidden)).astype("float32")
        ref, _ = gru_reference(x, w, num_layers=layers, bidirectional=bi)
        grus, errors = {}, {}
        for name, change in MAPS.items():
            precision = TF32_CLASS_PRECISION | change
            gru = GRU.build(target, hidden, hidden, layers, bi, False, batch, SEQ, precision=precision)
            gru.load_numpy(w)
            out, _ = gru(x)
            grus[name], errors[name] = gru, float(relative_error([out], [ref]))
        times: dict[str, list[float]] = {name: [] for name in MAPS}
        for _ in range(args.rounds):
            for name, gru in grus.items():
                times[name].append(gru.time(x) * 1e3)
        for name in MAPS:
            ms = statistics.median(times[name])
            label = f"B{batch} H{hidden} {layers} layers{' bidirectional' if bi else ''}"
            print(f"| {label} | {name} | {ms:.3f} | {errors[name]:.1e} |", flush=True)
            rows.append({"shape": label, "stored": name, "ms": times[name], "error": errors[name]})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
