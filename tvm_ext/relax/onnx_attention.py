"""ONNX's own ``Attention`` operator (opset 23 and later), which torch's default ONNX exporter writes
for ``scaled_dot_product_attention`` from opset 23: TVM 0.27's converter of that name takes
onnxruntime's ``com.microsoft`` Attention (a packed QKV projection, ``num_heads``) and stopped on
it ('num_heads').  A node with ``num_heads`` is still that one, given to TVM's converter.

As the specification (and ONNX's reference evaluator) computes it: Q, K, V of 4 dimensions
(batch, heads, sequence, head size) or of 3 (batch, sequence, heads · head size, with
``q_num_heads`` / ``kv_num_heads``); ``past_key`` / ``past_value`` concatenated before K and V
(``present_key`` / ``present_value``); keys and values repeated for grouped queries; scores
``Q Kᵀ · scale`` (1/√head size by default), ``softcap``, then a boolean or additive
``attn_mask`` (padded to the keys' length) and the causal mask aligned to the last query
(``is_causal``, offset by the past's length); softmax (a row with every key masked gives zeros);
``qk_matmul_output`` at each of its four modes.  The
sliding window and ``nonpad_kv_seqlen`` of later opsets are refused by name.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.errors import TvmExtError


def _heads_first(bb: Any, x: Any, heads: int | None, what: str) -> Any:
    """(B, S, H·D) as (B, H, S, D) where ``x`` is 3-D; a 4-D ``x`` as it is."""
    from tvm import relax

    if len(x.ty.shape.values) == 4:
        return x
    if heads is None:
        raise TvmExtError(f"ONNX Attention with 3-D inputs needs {what} (the heads packed in the last axis)")
    batch, seq, hidden = x.ty.shape.values
    split = bb.emit(relax.op.reshape(x, [batch, seq, heads, int(hidden) // heads]))
    return bb.emit(relax.op.permute_dims(split, [0, 2, 1, 3]))


def _masked(bb: Any, scores: Any, mask: Any | None, causal_offset: int | None) -> Any:
    """``scores`` (B, H, Sq, Sk) plus the additive form of ``mask`` (a boolean keeps True) padded to
    Sk with masked keys, and the causal bias where key j > query i + ``causal_offset``."""
    from tvm import relax

    op = relax.op
    dtype = str(scores.ty.dtype)
    q_len, k_len = (int(v) for v in scores.ty.shape.values[2:])
    if mask is not None:
        if str(mask.ty.dtype) == "bool":
            mask = bb.emit(op.where(mask, relax.const(0.0, dtype), relax.const(-np.inf, dtype)))
        short = k_len - int(mask.ty.shape.values[-1])
        if short > 0:
            rank = len(mask.ty.shape.values)
            pad = relax.const(np.full([1] * (rank - 1) + [short], -np.inf, dtype))
            pad = bb.emit(op.broadcast_to(pad, relax.ShapeExpr(list(mask.ty.shape.values[:-1]) + [short])))
            mask = bb.emit(op.concat([mask, pad], axis=-1))
        scores = bb.emit(op.add(scores, mask))
    if causal_offset is not None:
        allowed = np.arange(k_len)[None, :] <= np.arange(q_len)[:, None] + causal_offset
        scores = bb.emit(op.add(scores, relax.const(np.where(allowed, 0.0, -np.inf).astype(dtype))))
    return scores


def convert_attention(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """One ONNX ``Attention`` node: (Y, present_key, present_value, qk_matmul_output)."""
    from tvm import relax

    op = relax.op
    inputs = list(inputs) + [None] * (7 - len(inputs))
    q, k, v, mask, past_k, past_v, nonpad = inputs[:7]
    for name in ("left_window_size", "right_window_size"):
        if int(attrs.get(name, -1)) != -1:
            raise TvmExtError(f"ONNX Attention attribute {name}={attrs[name]} (a sliding window) is not supported")
    if nonpad is not None:
        raise TvmExtError("ONNX Attention input nonpad_kv_seqlen (an external cache) is not supported")
    mode = int(attrs.get("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise TvmExtError(f"ONNX Attention attribute qk_matmul_output_mode={mode}: ONNX defines 0 to 3")
    three_d = len(q.ty.shape.values) == 3
    q_heads = attrs.get("q_num_heads")
    kv_heads = attrs.get("kv_num_heads")
    q = _heads_first(bb, q, None if q_heads is None else int(q_heads), "q_num_heads")
    k = _heads_first(bb, k, None if kv_heads is None else int(kv_heads), "kv_num_heads")
    v = _heads_first(bb, v, None if kv_heads is None else int(kv_heads), "kv_num_heads")
    past = 0
    if past_k is not None:
        past = int(past_k.ty.shape.values[2])
        k = bb.emit(op.concat([past_k, k], axis=2))
        v = bb.emit(op.concat([past_v, v], axis=2))
    present_k, present_v = k, v
    heads, kv = int(q.ty.shape.values[1]), int(k.ty.shape.values[1])
    if heads != kv:  # grouped queries: each key and value head serves heads / kv query heads in turn
        k = bb.emit(op.repeat(k, heads // kv, axis=1))
        v = bb.emit(op.repeat(v, heads // kv, axis=1))
    dtype = str(q.ty.dtype)
    scale = float(attrs["scale"]) if "scale" in attrs else 1.0 / math.sqrt(int(q.ty.shape.values[3]))
    qk = bb.emit(op.multiply(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])), relax.const(scale, dtype)))
    softcap = float(attrs.get("softcap", 0.0))
    capped = qk
    if softcap > 0:
        cap = relax.const(softcap, dtype)
        capped = bb.emit(op.multiply(op.tanh(op.divide(qk, cap)), cap))
    scores = _masked(bb, capped, mask, past if int(attrs.get("is_causal", 0)) else None)
    probs = bb.emit(op.nn.softmax(scores, axis=-1))
    probs = bb.emit(op.where(op.isnan(probs), relax.const(0.0, dtype), probs))  # every key masked: zeros
    y = bb.emit(op.matmul(probs, v))
    if three_d:  # (B, H, S, Dv) -> (B, S, H · Dv)
        batch, _, seq, dv = y.ty.shape.values
        y = bb.emit(op.reshape(op.permute_dims(y, [0, 2, 1, 3]), [batch, seq, heads * int(dv)]))
    # as the specification numbers them: the raw product (0), after softcap (1), with the masks
    # added (2), the probabilities (3)
    qk_out = {0: qk, 1: capped, 2: scores, 3: probs}[mode]
    return relax.Tuple([y, present_k, present_v, qk_out])


def attention_converter(frontend: Any) -> dict[str, Any]:
    """``Attention``: ONNX's own (opset 23+) here, onnxruntime's contrib form (``num_heads``) TVM's."""
    contrib = frontend.Attention

    class Attention(frontend.OnnxOpConverter):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v1(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            if "num_heads" in attr:
                return contrib._impl_v1(bb, inputs, attr, params)
            return convert_attention(bb, list(inputs), attr)

    return {"Attention": Attention}
