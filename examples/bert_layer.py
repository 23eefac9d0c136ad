"""A BERT encoder layer as a model file for ``python -m tvm_ext.tune model``.

    python -m tvm_ext.tune model examples/bert_layer.py [--model-option size=base]
        [--model-option dtype=float16] [--model-option source=transformers]

Options (``--model-option KEY=VALUE``):

- ``size``: ``small`` (default: hidden 64, 4 heads, intermediate 256, sequence 16, batch 2;
  tunes in minutes on a CPU OpenCL device) or ``base`` (BERT-base: hidden 768, 12 heads,
  intermediate 3072, sequence 128, batch 8);
- ``dtype``: ``float32`` (default) or ``float16`` (weights and activations; matmuls accumulate
  in float32, as PyTorch's do);
- ``source``: ``nn`` (default: the layer written with ``relax.frontend.nn``) or ``transformers``
  (``transformers``' ``BertLayer`` with random weights, exported with ``torch.export`` and
  imported with TVM's Relax torch frontend; needs torch and transformers, as on the GPU machine);
- ``seq``: the sequence length of the inputs (default the size's);
- ``symbolic``: ``1`` makes the nn layer's sequence length a symbolic dimension named ``seq``
  (tune it with ``--buckets seq=SIZES``); the inputs still have length ``seq``.

Both sources compute the same layer (self-attention without a mask, output projection,
residual + LayerNorm, GELU feed-forward, residual + LayerNorm) with the same structure after
import: 2-D matmuls for the projections, batched matmuls for attention, weights as constants
(their transposes are folded when the model is compiled).  ``reference`` is float64 numpy of
the same weights.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

SIZES = {
    "small": dict(hidden=64, heads=4, intermediate=256, seq=16, batch=2),
    "base": dict(hidden=768, heads=12, intermediate=3072, seq=128, batch=8),
}
EPS = 1e-12  # BERT's LayerNorm epsilon
SEED = 0
LINEARS = ("query", "key", "value", "attn_out", "inter", "out")


def _options(size: str = "small", dtype: str = "float32", source: str = "nn",
             seq: str | None = None, symbolic: str = "0") -> tuple[dict[str, int], str, str]:
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    if dtype not in ("float32", "float16"):
        raise ValueError(f"dtype must be float32 or float16, got {dtype!r}")
    if source not in ("nn", "transformers"):
        raise ValueError(f"source must be nn or transformers, got {source!r}")
    if symbolic not in ("0", "1") or (symbolic == "1" and source != "nn"):
        raise ValueError(f"symbolic must be 0 or 1 (1 with source=nn), got {symbolic!r}")
    sizes = dict(SIZES[size])
    if seq is not None:
        if not str(seq).isdigit() or int(seq) < 1:
            raise ValueError(f"seq must be a positive integer, got {seq!r}")
        sizes["seq"] = int(seq)
    if symbolic == "1":
        sizes["symbolic"] = 1
    return sizes, dtype, source


def _shapes(s: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Linear weights as PyTorch stores them: (out, in)."""
    h, i = s["hidden"], s["intermediate"]
    return {"query": (h, h), "key": (h, h), "value": (h, h), "attn_out": (h, h), "inter": (i, h), "out": (h, i)}


def weights(size: str = "small", dtype: str = "float32", source: str = "nn") -> dict[str, np.ndarray]:
    """The layer's float32 weights by name (``<linear>.weight/.bias``, ``ln1.*``, ``ln2.*``): from
    a seeded generator, or from the transformers layer's random initialisation."""
    s, _, source = _options(size, dtype, source)
    if source == "transformers":
        return _torch_weights(_transformers_layer(s))
    rng = np.random.default_rng(SEED)
    out = {}
    for name, (n_out, n_in) in _shapes(s).items():
        bound = 1.0 / math.sqrt(n_in)  # PyTorch's Linear initialisation range
        out[f"{name}.weight"] = rng.uniform(-bound, bound, (n_out, n_in)).astype(np.float32)
        out[f"{name}.bias"] = rng.uniform(-bound, bound, n_out).astype(np.float32)
    for ln in ("ln1", "ln2"):
        out[f"{ln}.weight"] = (1.0 + 0.1 * rng.standard_normal(s["hidden"])).astype(np.float32)
        out[f"{ln}.bias"] = (0.1 * rng.standard_normal(s["hidden"])).astype(np.float32)
    return out


# ---- the relax.frontend.nn layer ----------------------------------------------------------------
def _nn_module(s: dict[str, int], dtype: str, w: dict[str, np.ndarray]) -> Any:
    import tvm
    from tvm import relax
    from tvm.relax.frontend import nn

    h, heads, seq, batch = s["hidden"], s["heads"], s["seq"], s["batch"]
    if s.get("symbolic"):
        from tvm import tirx

        seq = tirx.Var("seq", "int64")
    d = h // heads

    class Layer(nn.Module):
        def __init__(self) -> None:
            for name, (n_out, n_in) in _shapes(s).items():
                setattr(self, name, nn.Linear(n_in, n_out, dtype=dtype))
            self.ln1 = nn.LayerNorm(h, eps=EPS, dtype=dtype)
            self.ln2 = nn.LayerNorm(h, eps=EPS, dtype=dtype)

        def heads_first(self, t: Any) -> Any:  # (b·s, h) -> (b, heads, s, d)
            return nn.op.permute_dims(nn.op.reshape(t, (batch, seq, heads, d)), [0, 2, 1, 3])

        def forward(self, x: Any) -> Any:
            flat = nn.op.reshape(x, (batch * seq, h))
            q, k, v = (self.heads_first(getattr(self, n)(flat)) for n in ("query", "key", "value"))
            scores = nn.op.matmul(q, nn.op.permute_dims(k, [0, 1, 3, 2])) / math.sqrt(d)
            context = nn.op.matmul(nn.op.softmax(scores, axis=-1), v)
            context = nn.op.reshape(nn.op.permute_dims(context, [0, 2, 1, 3]), (batch * seq, h))
            attn = self.ln1(nn.op.reshape(self.attn_out(context), (batch, seq, h)) + x)
            inter = nn.op.gelu(self.inter(nn.op.reshape(attn, (batch * seq, h))))
            return self.ln2(nn.op.reshape(self.out(inter), (batch, seq, h)) + attn)

    layer = Layer()
    mod, params = layer.export_tvm(spec={"forward": {"x": nn.spec.Tensor((batch, seq, h), dtype)}})
    # the parameters are named as ``weights`` names them ("query.weight", "ln1.bias"): they become constants
    bound = {name: tvm.runtime.tensor(w[name].astype(dtype)) for name, _ in params}
    return relax.transform.BindParams("forward", bound)(mod)


# ---- transformers' BertLayer through torch.export -------------------------------------------------
def _transformers_config(s: dict[str, int]) -> Any:
    from transformers import BertConfig  # the GPU machine has it; imported only for source=transformers

    kwargs = dict(hidden_size=s["hidden"], num_attention_heads=s["heads"], intermediate_size=s["intermediate"],
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=EPS, hidden_act="gelu")
    try:
        config = BertConfig(attn_implementation="eager", **kwargs)
    except TypeError:
        config = BertConfig(**kwargs)
    config._attn_implementation = "eager"  # explicit matmul / softmax / matmul, as the nn layer has
    return config


def _transformers_layer(s: dict[str, int]) -> Any:
    import torch
    from transformers.models.bert.modeling_bert import BertLayer

    torch.manual_seed(SEED)
    config = _transformers_config(s)
    try:
        layer = BertLayer(config, layer_idx=0)
    except TypeError:
        layer = BertLayer(config)
    return layer.eval()


def _torch_weights(layer: Any) -> dict[str, np.ndarray]:
    state = {k: v.detach().float().cpu().numpy() for k, v in layer.state_dict().items()}
    names = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
             "attn_out": "attention.output.dense", "inter": "intermediate.dense", "out": "output.dense",
             "ln1": "attention.output.LayerNorm", "ln2": "output.LayerNorm"}
    return {f"{ours}.{kind}": state[f"{theirs}.{kind}"]
            for ours, theirs in names.items() for kind in ("weight", "bias")}


def torch_model(size: str = "small", dtype: str = "float32", source: str = "transformers") -> Any:
    """The torch module (the transformers layer, returning a tensor) for export and for the
    benchmark's torch baselines."""
    import torch

    s, dtype, _ = _options(size, dtype, "transformers")
    layer = _transformers_layer(s)

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: Any) -> Any:
            out = self.layer(x)
            return out[0] if isinstance(out, (tuple, list)) else out

    model = Wrapped().eval()
    return model.half() if dtype == "float16" else model


def _transformers_module(s: dict[str, int], dtype: str, size: str) -> Any:
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    from tvm_ext.relax.torch_import import CONVERTERS

    model = torch_model(size, dtype)
    x = torch.zeros((s["batch"], s["seq"], s["hidden"]), dtype=getattr(torch, dtype))
    with torch.no_grad():
        exported = torch.export.export(model, (x,))
    return from_exported_program(exported, unwrap_unit_return_tuple=True, custom_convert_map=CONVERTERS)


# ---- the model file interface ---------------------------------------------------------------------
def get_module(size: str = "small", dtype: str = "float32", source: str = "nn", seq: str | None = None,
               symbolic: str = "0") -> Any:
    s, dtype, source = _options(size, dtype, source, seq, symbolic)
    if source == "transformers":
        return _transformers_module(s, dtype, size)
    return _nn_module(s, dtype, weights(size, dtype, source))


def get_inputs(size: str = "small", dtype: str = "float32", source: str = "nn", seq: str | None = None,
               symbolic: str = "0") -> list[np.ndarray]:
    s, dtype, _ = _options(size, dtype, source, seq, symbolic)
    rng = np.random.default_rng(SEED + 1)
    return [rng.standard_normal((s["batch"], s["seq"], s["hidden"])).astype(dtype)]


def reference(inputs: list[np.ndarray], size: str = "small", dtype: str = "float32", source: str = "nn",
              seq: str | None = None, symbolic: str = "0") -> np.ndarray:
    """float64 numpy forward pass of the float32 weights (a float16 model's error includes the
    rounding of its weights)."""
    from scipy.special import erf

    s, _, _ = _options(size, dtype, source, seq, symbolic)
    w = {k: v.astype(np.float64) for k, v in weights(size, dtype, source).items()}
    h, heads, batch = s["hidden"], s["heads"], s["batch"]
    seq = inputs[0].shape[1]
    d = h // heads
    x = inputs[0].astype(np.float64)

    def linear(t: np.ndarray, name: str) -> np.ndarray:
        return t @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    def layer_norm(t: np.ndarray, name: str) -> np.ndarray:
        centered = t - t.mean(-1, keepdims=True)
        scale = np.sqrt((centered ** 2).mean(-1, keepdims=True) + EPS)
        return centered / scale * w[f"{name}.weight"] + w[f"{name}.bias"]

    def split(t: np.ndarray) -> np.ndarray:
        return t.reshape(batch, seq, heads, d).transpose(0, 2, 1, 3)

    q, k, v = (split(linear(x, n)) for n in ("query", "key", "value"))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    context = (p @ v).transpose(0, 2, 1, 3).reshape(batch, seq, h)
    attn = layer_norm(linear(context, "attn_out") + x, "ln1")
    inter = linear(attn, "inter")
    inter = 0.5 * inter * (1.0 + erf(inter / math.sqrt(2.0)))
    return layer_norm(linear(inter, "out") + attn, "ln2")


def tolerance(size: str = "small", dtype: str = "float32", source: str = "nn", seq: str | None = None,
              symbolic: str = "0") -> float:
    """Largest |error| / max |reference| a correct build stays under: float32 arithmetic, or
    float16 activations (2^-11 per rounding, through two LayerNorms)."""
    return 1e-4 if dtype == "float32" else 2e-2
