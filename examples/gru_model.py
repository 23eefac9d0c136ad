"""A GRU sequence model (embedding -> stacked GRU -> linear) as a model file for
``python -m tvm_ext.tune model``: its GRU is tvm_ext's (``tvm_ext.relax.relax_gru``), tuned as one
task with the model's kernels and run inside the compiled Relax model.

    python -m tvm_ext.tune model examples/gru_model.py [--model-option size=base]
        [--model-option dtype=float16]

Options (``--model-option KEY=VALUE``):

- ``size``: ``small`` (default: vocabulary 64, embedding 16, hidden 32, 2 layers, 6 steps,
  batch 2; tunes in minutes on a CPU OpenCL device) or ``base`` (vocabulary 1024, embedding
  256, hidden 512, 2 layers, 64 steps, batch 16);
- ``dtype``: ``float32`` (default) or ``float16`` (embedding, GRU and head weights and
  activations; the GRU's gates and the head's matmul accumulate in float32);
- ``seq``: the number of steps of the inputs (default the size's);
- ``symbolic``: ``1`` makes the step count a symbolic dimension named ``seq`` (tune it with
  ``--buckets seq=SIZES``).

Tokens (seq, batch) int32 in, logits (seq, batch, vocabulary) out: the next-token scores at
every step.  Weights are constants of the module; ``torch_model`` is the same model in
PyTorch (``torch.nn.GRU``, cuDNN on a GPU) with the same weights.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

SIZES = {
    "small": dict(vocab=64, embed=16, hidden=32, layers=2, seq=6, batch=2),
    "base": dict(vocab=1024, embed=256, hidden=512, layers=2, seq=64, batch=16),
}
SEED = 0


def _options(size: str = "small", dtype: str = "float32", seq: str | None = None,
             symbolic: str = "0") -> tuple[dict[str, int], str]:
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    if dtype not in ("float32", "float16"):
        raise ValueError(f"dtype must be float32 or float16, got {dtype!r}")
    if symbolic not in ("0", "1"):
        raise ValueError(f"symbolic must be 0 or 1, got {symbolic!r}")
    sizes = dict(SIZES[size], symbolic=int(symbolic))
    if seq is not None:
        if not str(seq).isdigit() or int(seq) < 1:
            raise ValueError(f"seq must be a positive integer, got {seq!r}")
        sizes["seq"] = int(seq)
    return sizes, dtype


def weights(size: str = "small", dtype: str = "float32") -> dict[str, np.ndarray]:
    """float32 weights as PyTorch names them (``embedding.weight``, ``gru.weight_ih_l0``, ...,
    ``head.weight``, ``head.bias``), in PyTorch's initialisation ranges, from a seeded generator."""
    s, _ = _options(size, dtype)
    rng = np.random.default_rng(SEED)
    h = s["hidden"]
    bound = 1.0 / math.sqrt(h)
    out = {"embedding.weight": rng.standard_normal((s["vocab"], s["embed"])).astype(np.float32)}
    for layer in range(s["layers"]):
        k = s["embed"] if layer == 0 else h
        for name, shape in ((f"weight_ih_l{layer}", (3 * h, k)), (f"weight_hh_l{layer}", (3 * h, h)),
                            (f"bias_ih_l{layer}", (3 * h,)), (f"bias_hh_l{layer}", (3 * h,))):
            out[f"gru.{name}"] = rng.uniform(-bound, bound, shape).astype(np.float32)
    out["head.weight"] = rng.uniform(-bound, bound, (s["vocab"], h)).astype(np.float32)
    out["head.bias"] = rng.uniform(-bound, bound, s["vocab"]).astype(np.float32)
    return out


def get_module(size: str = "small", dtype: str = "float32", seq: str | None = None, symbolic: str = "0") -> Any:
    import tvm
    from tvm import relax
    from tvm.relax.frontend import nn

    from tvm_ext.relax.relax_gru import device_weights, gru_layer

    s, dtype = _options(size, dtype, seq, symbolic)
    seq, batch, h = s["seq"], s["batch"], s["hidden"]
    if s["symbolic"]:
        from tvm import tirx

        seq = tirx.Var("seq", "int64")

    class Model(nn.Module):
        def __init__(self) -> None:
            self.embedding = nn.Embedding(s["vocab"], s["embed"], dtype=dtype)
            self.gru = gru_layer(s["embed"], h, s["layers"], dtype=dtype)
            self.head = nn.Linear(h, s["vocab"], dtype=dtype)

        def forward(self, tokens: Any) -> Any:
            out, _ = self.gru(self.embedding(tokens))
            logits = self.head(nn.op.reshape(out, (seq * batch, h)))
            return nn.op.reshape(logits, (seq, batch, s["vocab"]))

    mod, params = Model().export_tvm(spec={"forward": {"tokens": nn.spec.Tensor((seq, batch), "int32")}})
    w = weights(size, dtype)
    gru = device_weights({k[4:]: v for k, v in w.items() if k.startswith("gru.")}, s["embed"], h, s["layers"])
    values = {**{k: v for k, v in w.items() if not k.startswith("gru.")}, **{f"gru.{k}": v for k, v in gru.items()}}
    bound = {name: tvm.runtime.tensor(values[name].astype(dtype)) for name, _ in params}
    return relax.transform.BindParams("forward", bound)(mod)


def get_inputs(size: str = "small", dtype: str = "float32", seq: str | None = None,
               symbolic: str = "0") -> list[np.ndarray]:
    s, _ = _options(size, dtype, seq, symbolic)
    rng = np.random.default_rng(SEED + 1)
    return [rng.integers(0, s["vocab"], (s["seq"], s["batch"])).astype(np.int32)]


def reference(inputs: list[np.ndarray], size: str = "small", dtype: str = "float32", seq: str | None = None,
              symbolic: str = "0") -> np.ndarray:
    """float64 numpy forward pass of the float32 weights."""
    from tvm_ext.schedules.gru import gru_reference

    s, _ = _options(size, dtype, seq, symbolic)
    w = {k: v.astype(np.float64) for k, v in weights(size, dtype).items()}
    x = w["embedding.weight"][inputs[0]]
    gru = {k[4:]: v for k, v in w.items() if k.startswith("gru.")}
    h0 = np.zeros((s["layers"], s["batch"], s["hidden"]))
    out, _ = gru_reference(x, gru, h0, s["layers"], False)
    return out @ w["head.weight"].T + w["head.bias"]


def tolerance(size: str = "small", dtype: str = "float32", seq: str | None = None, symbolic: str = "0") -> float:
    """Largest |error| / max |reference| of a correct build: float32 arithmetic, or float16
    storage of the weights, the state and the activations (2^-11 per rounding)."""
    return 1e-4 if dtype == "float32" else 2e-2


def torch_model(size: str = "small", dtype: str = "float32") -> Any:
    """The same model in PyTorch (``torch.nn.GRU``) with the same weights: the benchmark's baseline."""
    import torch

    s, dtype = _options(size, dtype)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(s["vocab"], s["embed"])
            self.gru = torch.nn.GRU(s["embed"], s["hidden"], s["layers"])
            self.head = torch.nn.Linear(s["hidden"], s["vocab"])

        def forward(self, tokens: Any) -> Any:
            out, _ = self.gru(self.embedding(tokens.long()))
            return self.head(out)

    model = Model().eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights(size, dtype).items()})
    return model.half() if dtype == "float16" else model
