"""``aten.scaled_dot_product_attention`` imported as attention in the operands' type.

``torch.export``'s core decompositions (which TVM's frontend runs) rewrite SDPA as the math
path: every operand cast to float32, q and k each scaled, and a float32 softmax; a float16
model's attention then runs as float32 SIMT matmuls.  TVM's own converter makes it
``R.nn.attention``, which takes only a float mask.  Here it becomes what a user writes by
hand and ``tvm_ext``'s matchers tune: ``q·kᵀ`` in the operands' type (tvm_ext's kernels
accumulate in float32), scaled, masked, a softmax over the keys, ``·v``.

Masks as torch takes them, each as a term added to the scores: a float mask itself, a
boolean one 0 where it is true and half the type's lowest finite value where not, ``is_causal``
``-inf`` past the diagonal (torch's top-left alignment).  A boolean tensor is never read by a
matmul's epilogue: TVM 0.27's CUDA codegen vectorizes it into a misaligned load.  A query row
a boolean mask hides from every key gets zeros, as torch's math path gives: its softmax is
finite (half the lowest, not the lowest, which the softmax's scaling by log2 e takes to
``-inf``), and the output is multiplied by whether the row sees any key (1 or 0, a constant
where the mask is one, read in the second matmul's epilogue).  A float mask that is ``-inf``
across a whole row gives NaN there (torch gives zeros).  Dropout (training mode) and
grouped-query attention are refused by name.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.errors import TvmExtError

SDPA_OP = "scaled_dot_product_attention.default"  # the converter table's key


def _argument(node: Any, index: int, name: str, default: Any) -> Any:
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def convert_sdpa(node: Any, importer: Any) -> Any:
    """One SDPA node as matmul, scale, mask, softmax, matmul in the operands' type."""
    from tvm import relax, tirx

    emit = importer.block_builder.emit
    q, k, v = (importer.env[a] for a in node.args[:3])
    mask_node = _argument(node, 3, "attn_mask", None)
    dropout, causal = _argument(node, 4, "dropout_p", 0.0), _argument(node, 5, "is_causal", False)
    scale, gqa = node.kwargs.get("scale"), node.kwargs.get("enable_gqa", False)
    if dropout:
        raise TvmExtError(f"scaled_dot_product_attention with dropout_p={dropout} is not supported (export the "
                          "model in eval mode)")
    q_shape, k_shape = list(q.ty.shape.values), list(k.ty.shape.values)  # sizes may be symbolic
    if gqa or [str(d) for d in q_shape[:-2]] != [str(d) for d in k_shape[:-2]]:
        raise TvmExtError(f"scaled_dot_product_attention with enable_gqa or query/key leading dims {q_shape[:-2]} "
                          f"and {k_shape[:-2]} is not supported (the heads must match)")
    dtype, rank = str(q.ty.dtype), len(q_shape)
    transposed = list(range(rank - 2)) + [rank - 1, rank - 2]
    scores = emit(relax.op.matmul(q, emit(relax.op.permute_dims(k, transposed))))
    if scale is None and not isinstance(q_shape[-1], tirx.IntImm):
        raise TvmExtError(f"scaled_dot_product_attention with a symbolic head size {q_shape[-1]} needs an explicit "
                          "scale")
    factor = scale if scale is not None else 1.0 / math.sqrt(int(q_shape[-1]))
    scores = emit(relax.op.multiply(scores, relax.const(factor, dtype)))
    # masks as additive terms in the scores' type (a boolean tensor read in a matmul's vectorized
    # epilogue is miscompiled by TVM 0.27's CUDA codegen: a misaligned vector load)
    if causal:  # key j <= query i (torch's top-left alignment): -inf past the diagonal
        sizes = (q_shape[-2], k_shape[-2])
        if all(isinstance(d, tirx.IntImm) for d in sizes):
            hidden = relax.const(np.triu(np.full([int(d) for d in sizes], -np.inf, dtype), 1))
        else:  # symbolic lengths: the term made at run time, the scores' shape
            hidden = emit(relax.op.triu(emit(relax.op.full_like(scores, relax.const(-np.inf, dtype))), 1))
        scores = emit(relax.op.add(scores, hidden))
    seen = None  # (.., queries, 1): 1 where a row sees any key of a boolean mask, else 0
    if mask_node is not None:
        mask = importer.env[mask_node]
        if str(mask.ty.dtype) == "bool":
            hide = relax.const(np.finfo(dtype).min / 2, dtype)
            scores = emit(relax.op.add(scores, emit(relax.op.where(mask, relax.const(0, dtype), hide))))
            seen = emit(relax.op.astype(emit(relax.op.max(emit(relax.op.astype(mask, "int8")), axis=[-1],
                                                          keepdims=True)), dtype))
        else:
            scores = emit(relax.op.add(scores, mask if str(mask.ty.dtype) == dtype
                                       else emit(relax.op.astype(mask, dtype))))
    out = emit(relax.op.matmul(emit(relax.op.nn.softmax(scores, axis=-1)), v))
    return out if seen is None else emit(relax.op.multiply(out, seen))
