"""``torch.export`` programs into Relax with their GRU and LSTM layers on tvm_ext's kernels.

TVM's torch frontend (``from_exported_program``) unrolls ``aten::gru`` and ``aten::lstm`` step by
step.  Here it runs with more converters: an ``aten.gru.input`` or ``aten.lstm.input`` node
becomes tvm_ext's placeholder (``torch_recurrent``, ``relax_gru``), which ``tune model`` tunes as
one task and lowers to the tuned plan, and the matmuls keep their operands' type (the frontend's own
converters give float32 results, which breaks a float16 model's biases).  The weights must be
the program's parameters (constants at import); training-mode dropout is refused.
``scaled_dot_product_attention`` is kept out of torch's decompositions (which make it float32
math) and imported in the operands' type (``torch_attention``).

A ``.pt2`` file is read with ``torch.export.load``, which loads tensors without running code
from the file (torch's weights-only loading).  A program whose output is a class torch reads
back only once its package registered it (transformers' ``ModelOutput``, as every Hugging Face
model returns) loads once that package's module is imported: done for known packages only
(``_OUTPUT_PACKAGES``), else one error naming the class and the way around it.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import re
import warnings
import zipfile
from typing import Any, Iterator

import numpy as np

from ..core.errors import TvmExtError, run_frontend, unconverted_error
from ..precision.precision import example_array
from .torch_attention import SDPA_OP, convert_sdpa
from .torch_fft import CONVERTERS as FFT_CONVERTERS
from .torch_fft import refuse_complex
from .torch_indexing import CONVERTERS as INDEXING_CONVERTERS
from .torch_ranks import CONVERTERS as RANK_CONVERTERS
from .torch_ranks import reads_indices
from .recurrent_fold import fold_linears_into_recurrent
from .torch_recurrent import GRU_OP, LSTM_OP, convert_gru, convert_lstm

def _matmul_in_operand_type(node: Any, importer: Any) -> Any:
    """``mm`` / ``bmm`` / ``matmul`` with the result in the operands' type.  TVM 0.27's torch
    frontend gives them a float32 result whatever the operands, so a float16 model would run
    everything after each matmul in float32 (and its ``addmm`` fails adding the float16 bias);
    ``tvm_ext``'s model rewrite then makes a float16 matmul accumulate in float32, as torch does."""
    from tvm import relax

    a, b = importer.retrieve_args(node)[:2]
    return importer.block_builder.emit(relax.op.matmul(a, b))


def _linear_in_operand_type(node: Any, importer: Any) -> Any:
    """``linear`` (x·Wᵀ + b) with the result in the operands' type (see ``_matmul_in_operand_type``)."""
    from tvm import relax

    args = importer.retrieve_args(node)
    bias = args[2] if len(args) > 2 else None
    return importer.block_builder.emit(relax.op.linear(args[0], args[1], bias))


def _addmm_in_operand_type(node: Any, importer: Any) -> Any:
    """``addmm`` (beta·bias + alpha·a·b: a ``Linear`` on 2-D input after torch's decomposition)
    with the result in the operands' type (see ``_matmul_in_operand_type``)."""
    from tvm import relax

    bias, a, b = importer.retrieve_args(node)[:3]
    alpha, beta = node.kwargs.get("alpha", 1), node.kwargs.get("beta", 1)
    emit = importer.block_builder.emit
    product = emit(relax.op.matmul(a, b))
    if alpha != 1:
        product = emit(relax.op.multiply(product, relax.const(alpha, str(product.ty.dtype))))
    if beta == 0:
        return product
    if beta != 1:
        bias = emit(relax.op.multiply(bias, relax.const(beta, str(bias.ty.dtype))))
    return emit(relax.op.add(product, bias))


def _select_from_the_end(node: Any, importer: Any) -> Any:
    """``select.int`` (``x[:, i]``) with a negative index counted from the end, as torch does.
    TVM 0.27's converter makes every index a ``take`` in fast mode, which for ``-1`` (a
    classifier's last step) reads before the row: wrong numbers, an illegal address on CUDA."""
    from tvm import relax, tirx

    x, dim, index = importer.env[node.args[0]], int(node.args[1]), int(node.args[2])
    size = x.ty.shape[dim] if x.ty.shape is not None else None
    if index < 0 and isinstance(size, tirx.IntImm):
        index += int(size)
    mode = "fast" if index >= 0 else "wrap"  # a size known only at run time: wrapped there
    return importer.block_builder.emit(relax.op.take(x, relax.const(index, "int64"), dim, mode=mode))


def _dtype_name(dtype: Any) -> str:
    """A torch dtype's name as Relax spells it (numpy's: ``torch.float64`` -> ``float64``)."""
    import torch

    return str(torch.empty((), dtype=dtype).numpy().dtype)


def _extreme_and_index(largest: bool) -> Any:
    """``max.dim`` / ``min.dim`` (values and int64 indices along ``dim``) as a reduction and an
    arg-reduction, each the first index of a tie as torch gives it.  TVM 0.27's frontend makes
    ``max.dim`` a top-k of one, which only TVM's GPU sort runs (not the OpenCL path), and has no
    ``min.dim`` at all."""
    def convert(node: Any, importer: Any) -> Any:
        from tvm import relax

        x, dim = importer.env[node.args[0]], int(node.args[1])
        keep = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
        emit = importer.block_builder.emit
        values = emit((relax.op.max if largest else relax.op.min)(x, axis=[dim], keepdims=keep))
        indices = emit((relax.op.argmax if largest else relax.op.argmin)(x, axis=dim, keepdims=keep))
        return emit(relax.Tuple([values, indices]))

    return convert


def _reduction(op_name: str) -> Any:
    """``amax`` / ``amin`` (over ``dim``, every axis where it is empty) and ``prod`` (``prod.dim_int``
    over one axis, ``prod.default`` over all, in ``dtype`` where given), which TVM 0.27's torch
    frontend has no converter for (``logsumexp`` decomposes to ``amax``)."""
    def convert(node: Any, importer: Any) -> Any:
        from tvm import relax

        x = importer.env[node.args[0]]
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", [])
        dims = [int(d) for d in (dims if isinstance(dims, (list, tuple)) else [dims])] or None
        keep = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
        emit = importer.block_builder.emit
        dtype = node.kwargs.get("dtype")
        if dtype is not None:
            x = emit(relax.op.astype(x, _dtype_name(dtype)))
        return emit(getattr(relax.op, op_name)(x, axis=dims, keepdims=keep))

    return convert


def _elu_scaled(node: Any, importer: Any) -> Any:
    """``elu(x, alpha, scale, input_scale)``: scale · (x where x > 0, else alpha · (exp(input_scale · x) - 1)).
    TVM 0.27's converter drops ``scale`` and ``input_scale``, and SELU is decomposed to an ``elu``
    with both: its outputs were off by the scale (1.0507), silently."""
    from tvm import relax

    x = importer.env[node.args[0]]
    alpha, scale, input_scale = (float(node.args[i]) if len(node.args) > i else float(node.kwargs.get(k, 1.0))
                                 for i, k in ((1, "alpha"), (2, "scale"), (3, "input_scale")))
    dtype = str(x.ty.dtype)
    emit = importer.block_builder.emit
    inside = emit(relax.op.multiply(x, relax.const(input_scale, dtype))) if input_scale != 1 else x
    negative = emit(relax.op.multiply(relax.op.subtract(relax.op.exp(inside), relax.const(1.0, dtype)),
                                      relax.const(alpha, dtype)))
    out = emit(relax.op.where(relax.op.greater(x, relax.const(0.0, dtype)), x, negative))
    return emit(relax.op.multiply(out, relax.const(scale, dtype))) if scale != 1 else out


def _scan_as_torch(op_name: str) -> Any:
    """``cumsum`` / ``cumprod`` in torch's result type: an integral or boolean input without a
    ``dtype`` sums in int64.  TVM 0.27's converter keeps the input's type: a cumulative sum of a
    mask (RoBERTa's positions) ran in bool, every count 1, silently."""
    def convert(node: Any, importer: Any) -> Any:
        from tvm import relax

        x, dim = importer.env[node.args[0]], int(node.args[1])
        dtype = node.kwargs.get("dtype")
        if dtype is not None:
            dtype = _dtype_name(dtype)
        elif not str(x.ty.dtype).startswith(("float", "bfloat")):
            dtype = "int64"
        return importer.block_builder.emit(getattr(relax.op, op_name)(x, axis=dim, dtype=dtype))

    return convert


def _cat_as_torch(node: Any, importer: Any) -> Any:
    """``cat`` as torch runs it: a 1-D empty operand beside tensors of more dimensions is skipped
    (torch's legacy rule; XLM's cache concatenates its keys to a ``(0,)`` tensor, where TVM's
    converter stopped on the ranks), and the operands are cast to the result's type (torch
    promotes them; TVM's converter does not)."""
    from tvm import relax

    emit = importer.block_builder.emit
    tensors = [importer.env[t] for t in node.args[0]]
    axis = int(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0))
    ranks = {len(t.ty.shape.values) for t in tensors}

    def legacy_empty(t: Any) -> bool:
        dims = t.ty.shape.values
        return len(dims) == 1 and hasattr(dims[0], "value") and int(dims[0].value) == 0 and max(ranks) > 1

    kept = [t for t in tensors if not legacy_empty(t)] or tensors[:1]
    dtype = str(node.meta["val"].dtype).replace("torch.", "")
    kept = [t if str(t.ty.dtype) == dtype else emit(relax.op.astype(t, dtype)) for t in kept]
    return kept[0] if len(kept) == 1 else emit(relax.op.concat(kept, axis=axis))


def _grid_sample_grid_last(node: Any, importer: Any) -> Any:
    """``grid_sampler_2d`` with torch's grid (N, H, W, 2) made Relax's (N, 2, H, W).  TVM 0.27's
    converter passes torch's grid as it is, so the output took the wrong size, silently."""
    from tvm import relax

    args = importer.retrieve_args(node)
    data, grid = args[0], args[1]
    mode = {0: "bilinear", 1: "nearest", 2: "bicubic"}[int(args[2]) if len(args) > 2 else 0]
    padding = {0: "zeros", 1: "border", 2: "reflection"}[int(args[3]) if len(args) > 3 else 0]
    corners = bool(args[4]) if len(args) > 4 else False
    emit = importer.block_builder.emit
    return emit(relax.op.image.grid_sample(data, emit(relax.op.permute_dims(grid, [0, 3, 1, 2])), method=mode,
                                           layout="NCHW", padding_mode=padding, align_corners=corners))


def _divide_as_torch(node: Any, importer: Any) -> Any:
    """``div`` (``div.Tensor``, ``div.Scalar``, ``div.Tensor_mode``) as torch computes it: true
    division of integers in float32, ``floor`` and ``trunc`` in the operands' promoted type, a
    Python scalar in the tensor's type.  TVM 0.27's converters divided integer tensors as
    integers (``i / 3`` truncated, silently) and made a rounding mode's scalar an int32 or
    float32 constant the int64 or float16 tensor then refused."""
    import numpy as np
    from tvm import relax

    args = importer.retrieve_args(node)
    a, b = args[0], args[1]
    mode = node.kwargs.get("rounding_mode", args[2] if len(args) > 2 else None)
    tensors = [str(v.ty.dtype) for v in (a, b) if isinstance(v, relax.Expr)]
    floats = [d for d in tensors if d.startswith(("float", "bfloat"))]
    if floats:
        common = floats[0] if len(set(floats)) == 1 else str(np.promote_types(*floats))
    elif mode is None or any(isinstance(v, float) for v in (a, b)):
        common = "float32"  # torch's default type: a true division of integers, or by a float
    else:
        common = str(np.promote_types(*tensors)) if len(tensors) > 1 else tensors[0]
    emit = importer.block_builder.emit

    def operand(v: Any, dtype: str) -> Any:
        if not isinstance(v, relax.Expr):
            return relax.const(v, dtype)
        return v if str(v.ty.dtype) == dtype else emit(relax.op.astype(v, dtype))

    if mode == "floor":
        return emit(relax.op.floor_divide(operand(a, common), operand(b, common)))
    if mode == "trunc":  # integers through float64 (exact below 2**53), then back
        wide = common if common.startswith(("float", "bfloat")) else "float64"
        out = emit(relax.op.trunc(relax.op.divide(operand(a, wide), operand(b, wide))))
        return out if wide == common else emit(relax.op.astype(out, common))
    return emit(relax.op.divide(operand(a, common), operand(b, common)))


def _clamp_as_torch(bounds: str) -> Any:
    """``clamp`` / ``clamp_min`` / ``clamp_max`` (``bounds``: "both", "min", "max") as a maximum
    and a minimum with each bound given, a scalar in the tensor's type.  TVM 0.27's converter fills
    a missing bound with an infinity, which an integer tensor cannot hold (``i.clamp(min=1)``
    stopped the import with "Cannot convert infinity to BigInt")."""
    def convert(node: Any, importer: Any) -> Any:
        from tvm import relax

        args = importer.retrieve_args(node)
        x = args[0]
        given = list(args[1:]) + [None] * 2
        low, high = ((given[0] if len(args) > 1 else node.kwargs.get("min"),
                      given[1] if len(args) > 2 else node.kwargs.get("max")) if bounds == "both"
                     else (given[0], None) if bounds == "min" else (None, given[0]))
        dtype, emit = str(x.ty.dtype), importer.block_builder.emit
        for bound, op in ((low, relax.op.maximum), (high, relax.op.minimum)):
            if bound is None:
                continue
            if not isinstance(bound, relax.Expr):
                bound = relax.const(bound, dtype)
            elif str(bound.ty.dtype) != dtype:
                bound = emit(relax.op.astype(bound, dtype))
            x = emit(op(x, bound))
        return x

    return convert


def _nan_ignoring(largest: bool) -> Any:
    """``fmax`` / ``fmin``: the larger (smaller) of two, NaN only where both are NaN (TVM 0.27's
    torch frontend has no converter for either)."""
    def convert(node: Any, importer: Any) -> Any:
        from tvm import relax

        a, b = importer.retrieve_args(node)[:2]
        emit = importer.block_builder.emit
        both = emit((relax.op.maximum if largest else relax.op.minimum)(a, b))
        return emit(relax.op.where(relax.op.isnan(a), b, relax.op.where(relax.op.isnan(b), a, both)))

    return convert


def _hypot(node: Any, importer: Any) -> Any:
    """``hypot``: sqrt(a² + b²) (no converter in TVM 0.27's torch frontend)."""
    from tvm import relax

    a, b = importer.retrieve_args(node)[:2]
    return importer.block_builder.emit(relax.op.sqrt(relax.op.add(relax.op.multiply(a, a), relax.op.multiply(b, b))))


def _copysign(node: Any, importer: Any) -> Any:
    """``copysign(a, b)``: |a| with b's sign bit (``-0.0`` negative, as ``1 / b`` shows; no
    converter in TVM 0.27's torch frontend)."""
    from tvm import relax

    a, b = importer.retrieve_args(node)[:2]
    dtype = str(a.ty.dtype)
    b = b if isinstance(b, relax.Expr) else relax.const(float(b), dtype)
    zero = relax.const(0, dtype)
    negative = relax.op.logical_or(relax.op.less(b, zero), relax.op.less(relax.op.divide(relax.const(1, dtype), b),
                                                                         zero))
    magnitude = relax.op.abs(a)
    return importer.block_builder.emit(relax.op.where(negative, relax.op.negative(magnitude), magnitude))


def _rrelu_in_eval(node: Any, importer: Any) -> Any:
    """``rrelu`` in eval mode: a leaky ReLU of slope (lower + upper) / 2, as torch computes it then
    (torch exports it with a noise tensor that eval leaves unread); training mode is refused."""
    from tvm import relax

    args = importer.retrieve_args(node)
    lower, upper = float(args[2]) if len(args) > 2 else 1 / 8, float(args[3]) if len(args) > 3 else 1 / 3
    if bool(args[4] if len(args) > 4 else node.kwargs.get("training", False)):
        raise TvmExtError("rrelu in training mode (random slopes) is not converted")
    slope = importer.block_builder.emit(relax.op.nn.leakyrelu(args[0], (lower + upper) / 2))
    return importer.block_builder.emit(relax.Tuple([slope, args[1]]))


def _cdist(node: Any, importer: Any) -> Any:
    """``cdist`` (``_cdist_forward``) at p = 2 or 1: the distance of every row of x1 to every row
    of x2, batched; other p are refused by name (no converter in TVM 0.27's torch frontend)."""
    from tvm import relax

    args = importer.retrieve_args(node)
    x1, x2, p = args[0], args[1], float(args[2])
    if p not in (1.0, 2.0):
        raise TvmExtError(f"cdist with p={p:g} is not supported (p=1 and p=2 are)")
    emit = importer.block_builder.emit
    rank = len(x1.ty.shape.values)
    diff = emit(relax.op.subtract(relax.op.expand_dims(x1, rank - 1), relax.op.expand_dims(x2, rank - 2)))
    if p == 1.0:
        return emit(relax.op.sum(relax.op.abs(diff), axis=[-1]))
    return emit(relax.op.sqrt(relax.op.sum(relax.op.multiply(diff, diff), axis=[-1])))


def _stride_of_the_kernel(method: str) -> Any:
    """A pool whose stride torch exports as ``[]`` (not given, so the kernel's, with a padding or a
    dilation given after it: ``F.max_pool2d(x, 2, dilation=2)``), handed to TVM's converter with
    no stride, which it takes as the kernel's; TVM 0.27's read ``[]`` as strides of no dimensions
    and the import stopped ("the input strides length is expected to be 2").  A max pool whose
    indices the model reads is refused: TVM's converter gives them as a placeholder."""
    def convert(node: Any, importer: Any) -> Any:
        if method.endswith("_with_indices") and reads_indices(node):
            raise TvmExtError(f"{method.lstrip('_')}'s indices are not converted (its values are)")
        given = node.args
        if len(given) > 2 and isinstance(given[2], (list, tuple)) and not given[2]:
            node.args = given[:2] + (None,) + given[3:]
        try:
            return getattr(importer, method)(node)
        finally:
            node.args = given  # the program is the user's: left as exported

    return convert


def _arange_as_torch(node: Any, importer: Any) -> Any:
    """``arange`` with a negative step as ``start + step * arange(0, n)``, ``n`` as torch counts it.
    TVM 0.27's ``relax.op.arange`` gives a negative step a length of ``(end - start + step - 1) //
    step`` (18 for ``arange(8, -8, -1)``, Funnel Transformer's relative positions), while its kernel
    writes 16 values; the import then stopped at the next broadcast, or the buffer held two values
    never written.  A positive step, or a bound known only at run time, keeps TVM's converter."""
    import math

    from tvm import relax

    named = ("end",) if len(node.args) == 1 else ("start", "end", "step")  # arange(end), (start, end[, step])
    bounds = {"start": 0, "end": None, "step": 1, **{k: v for k, v in node.kwargs.items()
                                                     if k in ("start", "end", "step")}, **dict(zip(named, node.args))}
    start, end, step = bounds["start"], bounds["end"], bounds["step"]
    if not all(isinstance(v, (int, float)) for v in (start, end, step)) or step >= 0:
        return importer._arange(node)
    dtype = node.kwargs.get("dtype")
    dtype = _dtype_name(dtype) if dtype is not None else \
        "float32" if any(isinstance(v, float) for v in (start, end, step)) else "int64"
    count = max(0, math.ceil((end - start) / step))
    emit = importer.block_builder.emit
    steps = emit(relax.op.arange(0, count, 1, dtype=dtype))
    return emit(relax.op.add(relax.const(start, dtype), emit(relax.op.multiply(steps, relax.const(step, dtype)))))


def _slice_within_bounds(node: Any, importer: Any, highest: dict[str, int]) -> Any:
    """``slice`` (``x[:, :n]``) whose end is a symbolic size the program bounds by the sliced
    dimension (``highest``: each symbol's upper bound), as an in-bound slice.  TVM 0.27's converter
    gives it the size ``min(n, dim)``, which no later pass reduces to ``n``: a model with a
    symbolic sequence length slicing a fixed table (transformers' position ids) loses its shapes
    at the next broadcast.  Any other slice is the frontend's."""
    from tvm import relax, tirx

    x, dim = importer.env[node.args[0]], int(node.args[1]) if len(node.args) > 1 else 0
    start, end = (node.args[2] if len(node.args) > 2 else None) or 0, node.args[3] if len(node.args) > 3 else None
    step = node.args[4] if len(node.args) > 4 else 1
    end = importer.env.get(end, end) if hasattr(end, "op") else end
    size = x.ty.shape.values[dim] if x.ty.shape is not None else None
    if (start == 0 and step == 1 and isinstance(end, tirx.Var) and isinstance(size, tirx.IntImm)
            and highest.get(end.name) is not None and highest[end.name] <= int(size)):
        return importer.block_builder.emit(relax.op.strided_slice(x, [dim], [0], [end], [1], assume_inbound=True))
    return importer._slice(node)


# The torch frontend's converters replaced on import: the matmuls' results in their operands'
# type, a negative index selecting from the end, attention in the operands' type (embedding ids
# are kept inside the table for every model: ``relax_rewrites.clamp_takes``)
CONVERTERS = {"linear.default": _linear_in_operand_type, "addmm.default": _addmm_in_operand_type,
              "mm.default": _matmul_in_operand_type, "bmm.default": _matmul_in_operand_type,
              "matmul.default": _matmul_in_operand_type, "select.int": _select_from_the_end,
              "max.dim": _extreme_and_index(True), "min.dim": _extreme_and_index(False),
              "amax.default": _reduction("max"), "amin.default": _reduction("min"),
              "prod.dim_int": _reduction("prod"), "prod.default": _reduction("prod"), "elu.default": _elu_scaled,
              "cumsum.default": _scan_as_torch("cumsum"), "cumprod.default": _scan_as_torch("cumprod"),
              "grid_sampler_2d.default": _grid_sample_grid_last, "div.Tensor": _divide_as_torch,
              "div.Scalar": _divide_as_torch, "div.Tensor_mode": _divide_as_torch,
              "clamp.default": _clamp_as_torch("both"), "clamp.Tensor": _clamp_as_torch("both"),
              "clamp_min.default": _clamp_as_torch("min"), "clamp_max.default": _clamp_as_torch("max"),
              "fmax.default": _nan_ignoring(True), "fmin.default": _nan_ignoring(False), "hypot.default": _hypot,
              "copysign.Tensor": _copysign, "copysign.Scalar": _copysign, "cat.default": _cat_as_torch,
              "rrelu_with_noise_functional.default": _rrelu_in_eval,
              "_cdist_forward.default": _cdist, **INDEXING_CONVERTERS, **FFT_CONVERTERS,
              "arange.start_step": _arange_as_torch, SDPA_OP: convert_sdpa, **RANK_CONVERTERS,
              **{f"{pool}.default": _stride_of_the_kernel(f"_{pool}") for pool in (
                  "max_pool2d", "max_pool2d_with_indices", "max_pool3d", "max_pool3d_with_indices", "avg_pool2d",
                  "avg_pool3d")}}


def import_exported_program(program: Any, fold_linears: bool = True) -> Any:
    """The Relax IRModule (function ``main``) of a ``torch.export.ExportedProgram``, its GRUs and
    LSTMs as tvm_ext's (``fold_linears``: a ``Linear`` feeding one folded into its input
    projection, ``recurrent_fold``); an operator TVM's frontend has no converter for is one
    ``TvmExtError``."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    table = torch.export.default_decompositions()  # Core ATen, as TVM's frontend runs it, but the GRU,
    table.pop(torch.ops.aten.gru.input, None)  # the LSTM and attention kept (``torch_attention``)
    table.pop(torch.ops.aten.lstm.input, None)
    table.pop(torch.ops.aten.scaled_dot_product_attention.default, None)

    def imported() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecations inside it
            decomposed = program.run_decompositions(table)
        effects = _effectful_operators(decomposed)
        if effects:
            raise TvmExtError("TVM's torch frontend cannot import the program: operators with side effects "
                              f"(torch.export's effect tokens) are not supported: {', '.join(effects)}")
        _drop_checks_of_unused_reads(decomposed)
        converter = functools.partial(convert_gru, program=decomposed)
        lstm = functools.partial(convert_lstm, program=decomposed)
        highest = {name: high for name, (_, high) in program_symbols(decomposed).items() if high is not None}
        slicer = functools.partial(_slice_within_bounds, highest=highest)
        custom = {**CONVERTERS, GRU_OP: converter, LSTM_OP: lstm, "slice.Tensor": slicer}
        _refuse_unconverted(decomposed, custom)
        refuse_complex(decomposed, _torch_node_name)
        return from_exported_program(decomposed, custom_convert_map=custom, run_ep_decomposition=False)

    # the frontend's refusals, and TVM's checks failing inside it (tvm.error.InternalError)
    mod = run_frontend(imported, _import_failure, (TvmExtError, AssertionError, NotImplementedError, KeyError,
                                                   ValueError, TypeError, RuntimeError))
    return fold_linears_into_recurrent(mod) if fold_linears else mod


def _import_failure(failure: BaseException) -> str:
    """Our refusal as it is; anything else the frontend raised as its first line."""
    if isinstance(failure, TvmExtError):
        return str(failure)
    first = (str(failure).strip().splitlines() or [type(failure).__name__])[0][:200]
    return f"TVM's torch frontend cannot import the program: {first}"


def _drop_checks_of_unused_reads(program: Any) -> None:
    """torch.export's runtime checks (``_assert_scalar``) of a value read from a tensor (``item``)
    that nothing else reads, removed with the read: XLM checks ``lengths.max() <= slen``, whose
    read TVM makes a ``tensor_to_shape`` (a device-to-host copy; the OpenCL executor has none) only
    to check it.  A read another node uses keeps its checks (they guard a shape)."""
    graph, dropped = program.graph, False
    for check in [n for n in graph.nodes if n.op == "call_function"
                  and getattr(n.target, "__name__", "") == "_assert_scalar.default"]:
        chain, frontier = set(), [a for a in check.args if hasattr(a, "users")]
        while frontier:  # what the check reads, back to the tensor reads
            node = frontier.pop()
            if node in chain or node.op != "call_function":
                continue
            chain.add(node)
            if getattr(node.target, "__name__", "") not in ("item.default", "_local_scalar_dense.default"):
                frontier += [a for a in node.args if hasattr(a, "users")]
        if all(user in chain or user is check for node in chain for user in node.users):
            graph.erase_node(check)
            for node in reversed([n for n in graph.nodes if n in chain]):  # each after the nodes reading it
                if not node.users:
                    graph.erase_node(node)
            dropped = True
    if dropped:
        program.graph_module.recompile()


def _refuse_unconverted(program: Any, custom: dict[str, Any]) -> None:
    """The program's operators that no converter takes (the frontend's and ``custom``), as one
    ``TvmExtError`` naming the first node with the line of the user's code it came from, before
    the frontend starts (which names only the operators' types)."""
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    known = set(ExportedProgramImporter().create_convert_map()) | set(custom)
    missing = [n for n in program.graph.nodes
               if n.op == "call_function" and getattr(n.target, "__name__", None) not in known]
    if missing:
        kinds = sorted({n.target.__name__ for n in missing})
        error = unconverted_error(_torch_node_name(missing[0]), kinds, len(missing), "torch")
        if "grouped_mm_fallback.default" in kinds:  # a transformers MoE model's default experts
            error = TvmExtError(f"{error} (a transformers mixture of experts: export it with "
                                "experts_implementation=\"batched_mm\")")
        raise error


def _torch_node_name(node: Any) -> str:
    """How an error names a node of an exported program: its name, its operator and, where torch
    recorded it, the innermost line of the model's source it was traced from."""
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    where = f", {os.path.basename(frames[-1][0])}:{frames[-1][1]} in {frames[-1][2]}" if frames else ""
    return f"node {node.name!r} ({node.target}{where})"


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\w+)')


def _effectful_operators(program: Any) -> list[str]:
    """The operators the program runs with side effects (``with_effects`` nodes: torch threads an
    effect token through them, an input kind TVM's frontend refuses without naming the operator),
    each with the operator of the user's program it came from where torch recorded it."""
    found = []
    for node in program.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "__name__", "") == "with_effects" and len(node.args) > 1:
            origin = [getattr(source, "target", None) for source in node.meta.get("from_node") or []]
            origin = [str(t) for t in origin if t]
            found.append(str(node.args[1]) + (f" (from {origin[-1]})" if origin else ""))
    return list(dict.fromkeys(found))


def load_exported_program(path: str) -> Any:
    """A ``.pt2`` file (``torch.export.save``) as an ``ExportedProgram``; bad input is one error."""
    try:
        import torch
    except ImportError:
        raise TvmExtError("importing a .pt2 program needs torch: pip install torch") from None
    if not os.path.isfile(path):
        raise TvmExtError(f"program file {path} does not exist")
    if not zipfile.is_zipfile(path):
        raise TvmExtError(f"{path} is not a torch.export program (.pt2): not a zip archive")
    with _loader_log() as logged, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecations inside its loader
        try:
            try:
                return torch.export.load(path)
            except Exception:  # noqa: BLE001 - an output type torch cannot read back without its package
                if not _register_output_types("\n".join(logged)):
                    raise
                logged.clear()
                return torch.export.load(path)
        except Exception as exc:  # noqa: BLE001 - whatever the loader says is the file's problem
            first = (f"{type(exc).__name__}: {exc}".strip().splitlines() or ["?"])[0][:200]
            unread = _UNREGISTERED.search("\n".join(logged))
            if unread:
                first = (f"its output type {unread.group(1)} is not known to torch here (install its package, "
                         "or export the model with a tuple output, e.g. transformers' return_dict=False)")
            raise TvmExtError(f"{path} is not a torch.export program (.pt2): {first}") from None


# torch.export.load's complaint about a pytree type (a model's output class) it has no reader for
_UNREGISTERED = re.compile(r"Deserializing ([A-Za-z_][\w.]*) in pytree is not registered")
# packages whose output classes register themselves with torch's pytree when their module is imported
_OUTPUT_PACKAGES = ("transformers",)


@contextlib.contextmanager
def _loader_log() -> Iterator[list[str]]:
    """What ``torch.export.load`` logs while it runs (it logs the real error, with its traceback,
    then raises a generic one), kept instead of printed."""
    texts: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            texts.append(record.getMessage() + ("\n" + logging.Formatter().formatException(record.exc_info)
                                                 if record.exc_info else ""))

    logger = logging.getLogger("torch.export")
    saved = logger.handlers, logger.propagate, logger.level
    logger.handlers, logger.propagate, logger.level = [Keep()], False, logging.WARNING
    try:
        yield texts
    finally:
        logger.handlers, logger.propagate, logger.level = saved


def _register_output_types(message: str) -> bool:
    """Import the module of an output class the loader could not read, where it belongs to a
    package in ``_OUTPUT_PACKAGES`` that is installed (transformers' ``ModelOutput`` classes
    register with torch's pytree as they are defined).  Only modules of those packages are
    imported; the file names which one, and nothing from the file is run.  True if one was."""
    found = _UNREGISTERED.search(message)
    if not found or found.group(1).split(".")[0] not in _OUTPUT_PACKAGES:
        return False
    module = found.group(1).rsplit(".", 1)[0]
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - not installed, or not importable here: the load error stands
        return False
    return True


def program_symbols(program: Any) -> dict[str, tuple[int, int | None]]:
    """The symbolic sizes of the program's user inputs (``torch.export.Dim``; torch names them,
    e.g. ``s77``, and so does the imported Relax function) with the range each was exported for:
    name -> (lowest, highest or None)."""
    ranges = {str(symbol): bounds for symbol, bounds in program.range_constraints.items()}
    found: dict[str, tuple[int, int | None]] = {}
    for _, value in _user_inputs(program):
        for size in getattr(value, "shape", ()):
            for symbol in () if isinstance(size, int) else size.node.expr.free_symbols:
                bounds = ranges.get(str(symbol))
                found[str(symbol)] = (int(bounds.lower), int(bounds.upper) if bounds.upper.is_finite else None) \
                    if bounds is not None else (1, None)
    return found


def _user_inputs(program: Any) -> list[tuple[str, Any]]:
    """(name, example value) of each user input of the program, in order."""
    user_inputs = set(program.graph_signature.user_inputs)
    return [(node.name, node.meta.get("val")) for node in program.graph.nodes
            if node.op == "placeholder" and node.name in user_inputs]


def program_inputs(program: Any, seed: int = 0, sizes: dict[str, int] | None = None) -> list[np.ndarray]:
    """Random inputs of the program's user inputs: floats from a standard normal, integers zero
    (one in a mask: ``example_array``); a symbolic size takes its value from ``sizes`` (by
    torch's name of it)."""
    rng = np.random.default_rng(seed)
    sizes = sizes or {}
    arrays = []
    for name, value in _user_inputs(program):
        if value is None:
            raise TvmExtError(f"program input {name} has no recorded shape; export it with example inputs")
        shape = []
        for size in value.shape:
            if isinstance(size, int):
                shape.append(size)
                continue
            missing = sorted(str(s) for s in size.node.expr.free_symbols if str(s) not in sizes)
            if missing:
                raise TvmExtError(f"program input {name} has the symbolic dimension {size}; give it a size: "
                                  f"--model-option {missing[0]}=N (or tune it at buckets: --buckets {missing[0]}=...)")
            shape.append(int(size.node.expr.subs({s: sizes[str(s)] for s in size.node.expr.free_symbols})))
        dtype = np.dtype(str(value.dtype).removeprefix("torch."))
        arrays.append(example_array(rng, shape, dtype, name))
    return arrays
