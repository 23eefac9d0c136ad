"""torch's order statistics that TVM 0.27's torch frontend has no converter for, or no GPU
schedule: ``sort`` with ``stable=True``, ``kthvalue``, ``median`` over a dimension or the whole
tensor, ``bucketize`` / ``searchsorted``, and ``adaptive_max_pool2d`` (a max over each window).

Each is one ``argsort`` and a gather by it: on OpenCL the argsort is ``relax/sorts.py``'s counted
rank (stable, NaN above every number, as torch orders them), on CUDA TVM's sort.  ``median`` is
the lower of the two middle values, as torch's, and NaN with the index of the first NaN where
the reduced slice holds one (torch's median propagates NaN; its ``kthvalue`` orders NaN last).
"""
from __future__ import annotations

from typing import Any

from ..core.errors import TvmExtError


def _arg(node: Any, position: int, name: str, default: Any) -> Any:
    return node.args[position] if len(node.args) > position else node.kwargs.get(name, default)


def stable_sort(node: Any, importer: Any) -> Any:
    """``sort.stable(x, *, stable, dim=-1, descending=False)``: (values, int64 indices)."""
    from tvm import relax

    x = importer.env[node.args[0]]
    dim, descending = int(node.kwargs.get("dim", -1)), bool(node.kwargs.get("descending", False))
    emit = importer.block_builder.emit
    indices = emit(relax.op.argsort(x, dim, descending, dtype="int64"))
    return emit(relax.Tuple([emit(relax.op.gather_elements(x, indices, axis=dim)), indices]))


def _ranked(importer: Any, x: Any, rank: int, dim: int, keepdim: bool, nan_wins: bool) -> Any:
    """The ``rank``-th smallest along ``dim`` (0-based) and its index, as a (values, indices)
    tuple; ``nan_wins``: NaN and the first NaN's index where the slice holds a NaN."""
    from tvm import relax

    emit = importer.block_builder.emit
    at = emit(relax.op.take(emit(relax.op.argsort(x, dim, False, dtype="int64")),
                            relax.const([rank], "int64"), axis=dim))
    values = emit(relax.op.gather_elements(x, at, axis=dim))
    dtype = str(x.ty.dtype)
    if nan_wins and dtype.startswith(("float", "bfloat")):
        nans = emit(relax.op.astype(emit(relax.op.isnan(x)), "int32"))
        first = emit(relax.op.argmax(nans, axis=dim, keepdims=True))
        has_nan = emit(relax.op.greater(emit(relax.op.max(nans, axis=[dim], keepdims=True)), relax.const(0, "int32")))
        values = emit(relax.op.where(has_nan, relax.const(float("nan"), dtype), values))
        at = emit(relax.op.where(has_nan, emit(relax.op.astype(first, "int64")), at))
    if not keepdim:
        values, at = emit(relax.op.squeeze(values, [dim])), emit(relax.op.squeeze(at, [dim]))
    return emit(relax.Tuple([values, at]))


def _size(x: Any, dim: int) -> int:
    return int(x.ty.shape[dim])


def kthvalue(node: Any, importer: Any) -> Any:
    """``kthvalue(x, k, dim=-1, keepdim=False)``: the k-th smallest (1-based) and its index."""
    x = importer.env[node.args[0]]
    dim = int(_arg(node, 2, "dim", -1))
    return _ranked(importer, x, int(node.args[1]) - 1, dim, bool(_arg(node, 3, "keepdim", False)), nan_wins=False)


def median_dim(node: Any, importer: Any) -> Any:
    """``median(x, dim, keepdim=False)``: the lower middle value and its index."""
    x = importer.env[node.args[0]]
    dim = int(_arg(node, 1, "dim", -1))
    return _ranked(importer, x, (_size(x, dim) - 1) // 2, dim, bool(_arg(node, 2, "keepdim", False)), nan_wins=True)


def median_all(node: Any, importer: Any) -> Any:
    """``median(x)``: the lower middle value of every element (a 0-d tensor)."""
    from tvm import relax

    x = importer.env[node.args[0]]
    flat = importer.block_builder.emit(relax.op.reshape(x, [-1]))
    ranked = _ranked(importer, flat, (_size(flat, 0) - 1) // 2, 0, False, nan_wins=True)
    return importer.block_builder.emit(relax.TupleGetItem(ranked, 0))


def _positions(importer: Any, sequence: Any, values: Any, right: bool, int32: bool) -> Any:
    """Where each of ``values`` goes in the sorted ``sequence`` (1-D, or rows matching ``values``'
    leading dimensions): how many of its entries are below the value (at most the value where
    ``right``), one comparison an entry and a sum.  TVM's binary search has no GPU schedule."""
    from tvm import relax

    emit = importer.block_builder.emit
    if sequence.ty.ndim == 1:  # one sequence for every value: its entries along a new last axis
        lined = emit(relax.op.reshape(sequence, [1] * values.ty.ndim + [-1]))
    else:  # a sequence a row: (..., 1, m) against the row's values (..., k, 1)
        lined = emit(relax.op.expand_dims(sequence, [-2]))
    below = (relax.op.less_equal if right else relax.op.less)(lined, emit(relax.op.expand_dims(values, [-1])))
    return emit(relax.op.sum(emit(relax.op.astype(emit(below), "int32" if int32 else "int64")), axis=[-1]))


def bucketize(node: Any, importer: Any) -> Any:
    """``bucketize(x, boundaries, *, out_int32=False, right=False)``."""
    return _positions(importer, importer.env[node.args[1]], importer.env[node.args[0]],
                      bool(node.kwargs.get("right", False)), bool(node.kwargs.get("out_int32", False)))


def searchsorted(node: Any, importer: Any) -> Any:
    """``searchsorted(sorted_sequence, values, *, out_int32=False, right=False, side=None)``."""
    right = bool(node.kwargs.get("right", False)) or node.kwargs.get("side") == "right"
    if node.kwargs.get("sorter") is not None:
        raise TvmExtError("searchsorted with a sorter is not converted (sort the sequence first)")
    return _positions(importer, importer.env[node.args[0]], importer.env[node.args[1]], right,
                      bool(node.kwargs.get("out_int32", False)))


def reads_indices(node: Any) -> bool:
    """Whether a node of (values, indices) has a user that reads its indices (for an unpooling)."""
    import operator

    return any(user.target is operator.getitem and user.args[1] != 0 for user in node.users)


def adaptive_max_pool2d(node: Any, importer: Any) -> Any:
    """``adaptive_max_pool2d(x, output_size)`` as TVM's adaptive pooling with ``max`` (each output
    a max over its window, windows as torch cuts them), a 1-tuple: where the model reads the
    indices (for an unpooling), it is refused by name."""
    from tvm import relax, topi

    if reads_indices(node):
        raise TvmExtError("adaptive_max_pool2d's indices are not converted (its values are)")
    x, size = importer.env[node.args[0]], [int(s) for s in node.args[1]]
    layout = "NCHW" if x.ty.ndim == 4 else "CHW"
    pooled = importer.block_builder.emit_te(topi.nn.adaptive_pool, x, size, "max", layout)
    return importer.block_builder.emit(relax.Tuple([pooled]))


CONVERTERS = {"adaptive_max_pool2d.default": adaptive_max_pool2d, "bucketize.Tensor": bucketize,
              "searchsorted.Tensor": searchsorted, "sort.stable": stable_sort, "kthvalue.default": kthvalue,
              "median.dim": median_dim, "median.default": median_all}
