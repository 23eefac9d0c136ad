"""A small MLP classifier built with ``relax.frontend.nn``, tuned with tvm_ext, compiled
with TVM's Relax pipeline using the tuned schedules, run, and checked against numpy.

    python examples/mlp.py [--target opencl|cuda] [--generations 1 --population 6]

The model is LayerNorm -> Linear + ReLU -> Linear (no bias, like an LM head) -> softmax.
Its two matmuls are GEMM tasks our template tunes (the first with its bias add and
ReLU fused into the kernel's store); LayerNorm, softmax and the weight transposes
have no template and get TVM's default GPU schedules (dlight).  On OpenCL (PoCL on a
CPU machine) the model runs through tvm_ext's pyopencl executor, since the TVM wheel
has no OpenCL runtime; on CUDA through the Relax VM.

This file is also a model file for the CLI (it defines ``get_module``, ``get_inputs``
and ``reference``):

    python -m tvm_ext.tune model examples/mlp.py --generations 1 --population 6
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np

SIZES = {"batch": 64, "features": 128, "hidden": 256, "classes": 48}
EPS = 1e-5


def get_module(batch: int = SIZES["batch"], features: int = SIZES["features"],
               hidden: int = SIZES["hidden"], classes: int = SIZES["classes"]) -> Any:
    """The Relax IRModule (function ``forward``: x, then the weights as parameters)."""
    from tvm.relax.frontend import nn

    class MLP(nn.Module):
        def __init__(self) -> None:
            self.norm = nn.LayerNorm(features, eps=EPS)
            self.fc1 = nn.Linear(features, hidden)
            self.head = nn.Linear(hidden, classes, bias=False)

        def forward(self, x: Any) -> Any:
            return nn.softmax(self.head(nn.relu(self.fc1(self.norm(x)))), axis=-1)

    mod, _ = MLP().export_tvm(spec={"forward": {"x": nn.spec.Tensor((batch, features), "float32")}})
    return mod


def get_inputs(seed: int = 0, batch: int = SIZES["batch"], features: int = SIZES["features"],
               hidden: int = SIZES["hidden"], classes: int = SIZES["classes"]) -> list[np.ndarray]:
    """x and the weights, in the order of ``forward``'s parameters."""
    rng = np.random.default_rng(seed)
    f32 = lambda *shape, scale=1.0: (rng.standard_normal(shape) * scale).astype("float32")  # noqa: E731
    return [
        f32(batch, features),                       # x
        1.0 + f32(features, scale=0.1),             # norm.weight
        f32(features, scale=0.1),                   # norm.bias
        f32(hidden, features, scale=features ** -0.5),  # fc1.weight (out, in)
        f32(hidden, scale=0.1),                     # fc1.bias
        f32(classes, hidden, scale=hidden ** -0.5),  # head.weight
    ]


def reference(inputs: list[np.ndarray]) -> np.ndarray:
    """float64 numpy forward pass."""
    x, gamma, beta, w1, b1, w2 = (a.astype(np.float64) for a in inputs)
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    h = (x - mean) / np.sqrt(var + EPS) * gamma + beta
    h = np.maximum(h @ w1.T + b1, 0.0)
    z = h @ w2.T
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from tvm_ext.core.errors import TvmExtError
    from tvm_ext.relax.pipeline import load_model, summary, tune_relax
    from tvm_ext.core.session import SessionOptions
    from tvm_ext.target import resolve_target

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="opencl", choices=("opencl", "cuda"))
    p.add_argument("--generations", type=int, default=1)
    p.add_argument("--population", type=int, default=6)
    p.add_argument("--records", default="tvm_ext_records.jsonl", help="tuning records (resumed if present)")
    p.add_argument("--database", default="tvm_ext_database", help="meta_schedule database folder to write")
    p.add_argument("--workers", type=int, default=None)
    for name, value in SIZES.items():
        p.add_argument(f"--{name}", type=int, default=value)
    args = p.parse_args(argv)
    sizes = {k: getattr(args, k) for k in SIZES}
    try:
        target = resolve_target(args.target)
        mod = get_module(**sizes)
        tuning = tune_relax(mod, target, args.records, args.database,
                            SessionOptions(generations=args.generations, population=args.population,
                                           workers=args.workers))
        print(summary(tuning))
        model = load_model(mod, target, args.database)
        inputs = get_inputs(**sizes)
        out = model(*inputs)
        ref = reference(inputs)
        err = float(np.abs(out - ref).max())
        secs = model.time(*inputs)
    except TvmExtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ok = err < 1e-4
    print(f"\n{target.kind}:{target.device_name}  output {out.shape}  max |error| vs numpy {err:.2e} "
          f"({'ok' if ok else 'WRONG'})  latency {secs * 1e3:.3f} ms")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
