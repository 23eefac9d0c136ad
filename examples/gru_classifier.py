"""A GRU sequence classifier: tvm_ext's GRU layer (tuned) feeds a Relax head (Linear +
softmax) compiled by TVM with tvm_ext's tuned schedules; checked against numpy.

    python examples/gru_classifier.py [--target opencl|cuda] [--generations 1 --population 6]

The recurrent part is ``tvm_ext.schedules.gru.GRU`` (method 004's kernels plus the
fused, split-K step kernel), its knobs tuned by the GA on the whole forward pass; the
classifier head is a ``relax.frontend.nn`` module whose GEMM (with its bias add) is a
task our GEMM template tunes and whose softmax gets TVM's default schedule (dlight), all
through a meta_schedule database, as in ``examples/mlp.py``.  The last hidden state of
the GRU is the head's input; the probabilities are compared with a float64 numpy
forward pass of ``torch.nn.GRU``'s equations.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np

SIZES = {"seq": 12, "batch": 8, "features": 16, "hidden": 32, "classes": 5}


def get_head_module(batch: int, hidden: int, classes: int) -> Any:
    """Relax module ``forward(h, head.weight, head.bias)`` -> class probabilities."""
    from tvm.relax.frontend import nn

    class Head(nn.Module):
        def __init__(self) -> None:
            self.head = nn.Linear(hidden, classes)

        def forward(self, h: Any) -> Any:
            return nn.softmax(self.head(h), axis=-1)

    mod, _ = Head().export_tvm(spec={"forward": {"h": nn.spec.Tensor((batch, hidden), "float32")}})
    return mod


def get_weights(seed: int, features: int, hidden: int, classes: int) -> dict[str, np.ndarray]:
    """torch.nn.GRU's parameter names and layout, plus the head's."""
    rng = np.random.default_rng(seed)
    u = lambda *shape: rng.uniform(-hidden ** -0.5, hidden ** -0.5, shape).astype(np.float32)  # noqa: E731
    return {"weight_ih_l0": u(3 * hidden, features), "weight_hh_l0": u(3 * hidden, hidden),
            "bias_ih_l0": u(3 * hidden), "bias_hh_l0": u(3 * hidden),
            "head.weight": u(classes, hidden), "head.bias": u(classes)}


def reference(x: np.ndarray, weights: dict[str, np.ndarray]) -> np.ndarray:
    """float64: GRU over the sequence, last hidden state, Linear, softmax."""
    from tvm_ext.schedules.gru import gru_reference

    _, h_n = gru_reference(x, {k: v for k, v in weights.items() if k.endswith("_l0")}, None, 1, False)
    z = h_n[-1] @ weights["head.weight"].astype(np.float64).T + weights["head.bias"]
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def tune_gru(target: Any, sizes: dict[str, int], args: argparse.Namespace) -> Any:
    """The GRU layer's best config after a short GA (records resumed from --records)."""
    from tvm_ext.schedules.gru import GruTemplate
    from tvm_ext.core.session import Session, SessionOptions

    template = GruTemplate(batch=sizes["batch"], hidden=sizes["hidden"], input=sizes["features"], seq=sizes["seq"])
    options = SessionOptions(generations=args.generations, population=args.population, seed=args.seed,
                             workers=args.workers, records=args.records)
    with Session(options, target=target) as session:
        space = template.space(target)
        default = template.default_config(target)
        fused = default.replace(fuse_step=1, step_j=32, step_b=1, step_k=8, step_ks=4)
        result = session.tune(template, seeds=[c for c in (default, fused) if space.is_feasible(c)])
    if result.best is None:
        from tvm_ext.core.errors import TvmExtError

        raise TvmExtError("no GRU config compiled and ran correctly (see the records)")
    print(f"GRU layer: best of {result.trials} trials ({result.resumed} resumed) "
          f"{result.best.cost * 1e3:.3f} ms: {result.best.config_obj()}")
    return result.best.config_obj()


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from tvm_ext.core.errors import TvmExtError
    from tvm_ext.relax.pipeline import load_model, summary, tune_relax
    from tvm_ext.schedules.gru import GRU
    from tvm_ext.core.session import SessionOptions
    from tvm_ext.target import resolve_target

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="opencl", choices=("opencl", "cuda"))
    p.add_argument("--generations", type=int, default=1)
    p.add_argument("--population", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--records", default="tvm_ext_records.jsonl", help="tuning records (resumed if present)")
    p.add_argument("--database", default="tvm_ext_database", help="meta_schedule database folder to write")
    p.add_argument("--workers", type=int, default=None)
    for name, value in SIZES.items():
        p.add_argument(f"--{name}", type=int, default=value)
    args = p.parse_args(argv)
    sizes = {k: getattr(args, k) for k in SIZES}
    try:
        target = resolve_target(args.target)
        weights = get_weights(args.seed, sizes["features"], sizes["hidden"], sizes["classes"])
        config = tune_gru(target, sizes, args)
        gru = GRU.build(target, sizes["features"], sizes["hidden"], batch=sizes["batch"], seq=sizes["seq"],
                        config=config).load_state_dict({k: v for k, v in weights.items() if k.endswith("_l0")})
        head = get_head_module(sizes["batch"], sizes["hidden"], sizes["classes"])
        tuning = tune_relax(head, target, args.records, args.database,
                            SessionOptions(generations=args.generations, population=max(args.population, 4),
                                           workers=args.workers))
        print(summary(tuning))
        model = load_model(head, target, args.database)
        x = np.random.default_rng(args.seed + 1).uniform(-1, 1, (sizes["seq"], sizes["batch"], sizes["features"]))
        x = x.astype(np.float32)
        _, h_n = gru(x)
        probs = model(np.ascontiguousarray(h_n[-1]), weights["head.weight"], weights["head.bias"])
        err = float(np.abs(probs - reference(x, weights)).max())
    except TvmExtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ok = err < 1e-4
    print(f"\n{target.kind}:{target.device_name}  probabilities {probs.shape}  max |error| vs numpy "
          f"{err:.2e} ({'ok' if ok else 'WRONG'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
