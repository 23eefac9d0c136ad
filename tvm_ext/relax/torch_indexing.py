"""torch's advanced indexing, read and written, as torch computes it: ``index.Tensor``
(``x[:, i, j]``), ``index_put`` (``x[i] = v``, ``x[:, i] += v``, ``x[mask] = 0``,
``index_add``) and ``unfold``'s sliding windows, which TVM 0.27's torch frontend refuses or
converts wrongly in the forms models write (index tensors of several dimensions beside a full
slice; fewer index tensors than dimensions; a boolean mask; no converter for ``unfold``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import TvmExtError


def _from_the_end(emit: Any, index: Any, size: int) -> Any:
    """An index tensor in int64, a negative index counted from the end of a dimension of ``size``."""
    from tvm import relax

    index = emit(relax.op.astype(index, "int64"))
    return emit(relax.op.where(relax.op.less(index, relax.const(0, "int64")),
                               relax.op.add(index, relax.const(size, "int64")), index))


def _static_shape(x: Any) -> list[int] | None:
    from tvm import tirx

    dims = [int(d) if isinstance(d, tirx.IntImm) else None for d in (x.ty.shape or [])]
    return None if None in dims or x.ty.shape is None else dims


def index_tensor(node: Any, importer: Any) -> Any:
    """``index.Tensor`` (``x[:, i, j]``) as torch indexes: the index tensors broadcast together,
    a negative index counts from the end, and the broadcast shape takes the indexed dimensions'
    place where they are adjacent (else it comes first); computed as one ``take`` of a linear
    index over the indexed dimensions merged.  TVM 0.27's converter refused index tensors of
    several dimensions beside a full slice ("cannot broadcast index shapes": ``F.unfold``,
    ConvBERT's).  A boolean mask or a shape known only at run time keeps TVM's converter."""
    from tvm import relax

    x = importer.env[node.args[0]]
    indices = list(node.args[1]) + [None] * (x.ty.ndim - len(node.args[1]))
    shape = _static_shape(x)
    dims = [d for d, index in enumerate(indices) if index is not None]
    tensors = [importer.env[indices[d]] for d in dims]
    if not shape or any(str(t.ty.dtype) == "bool" for t in tensors):
        return importer._index_tensor(node)
    emit = importer.block_builder.emit
    linear = None
    for d, index in zip(dims, tensors):
        index = _from_the_end(emit, index, shape[d])
        size = relax.const(shape[d], "int64")
        linear = index if linear is None else emit(relax.op.add(emit(relax.op.multiply(linear, size)), index))
    others = [d for d in range(len(shape)) if d not in dims]
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    order = list(range(len(shape))) if adjacent else dims + others
    if not adjacent:
        x = emit(relax.op.permute_dims(x, order))
    front = dims[0] if adjacent else 0
    merged = [shape[o] for o in order]
    merged = merged[:front] + [int(np.prod([shape[d] for d in dims]))] + merged[front + len(dims):]
    return emit(relax.op.take(emit(relax.op.reshape(x, merged)), linear, axis=front))


def index_put(node: Any, importer: Any) -> Any:
    """``index_put(x, indices, values, accumulate)``: a boolean mask of x's leading dimensions with
    one value as a ``where``; integer index tensors on adjacent dimensions (full slices before and
    after them) as a ``scatter_nd`` of every element of ``x[indices]``'s region, its coordinates
    through the indexed dimensions (``relax/scatters.py`` runs it on the GPUs), ``values``
    broadcast to the region, added where ``accumulate``."""
    from tvm import relax

    x, values = importer.env[node.args[0]], importer.env[node.args[2]]
    accumulate = bool(node.args[3]) if len(node.args) > 3 else bool(node.kwargs.get("accumulate", False))
    shape = _static_shape(x)
    given = list(node.args[1])
    dims = [d for d, index in enumerate(given) if index is not None]
    tensors = [importer.env[given[d]] for d in dims]
    if shape is None or any(_static_shape(t) is None for t in tensors + [values]):
        raise TvmExtError("index_put with a shape known only at run time is not converted")
    emit = importer.block_builder.emit
    if any(str(t.ty.dtype) == "bool" for t in tensors):
        return _masked_put(emit, x, shape, dims, tensors, values, accumulate)
    if dims != list(range(dims[0], dims[-1] + 1)):
        raise TvmExtError("index_put with index tensors on dimensions apart is not converted")
    first, depth = dims[0], dims[-1] + 1
    spread = list(np.broadcast_shapes(*[tuple(_static_shape(t)) for t in tensors]))
    region = shape[:first] + spread  # the coordinates' shape, before their depth
    coords = []
    for d in range(first):  # a full slice before the indexed dimensions: every position
        axis = [1] * len(region)
        axis[d] = shape[d]
        coords.append(emit(relax.op.broadcast_to(emit(relax.op.reshape(
            relax.op.arange(0, shape[d], 1, "int64"), axis)), region)))
    for d, index in zip(dims, tensors):
        index = emit(relax.op.broadcast_to(_from_the_end(emit, index, shape[d]), spread))
        coords.append(emit(relax.op.broadcast_to(emit(relax.op.reshape(index, [1] * first + spread)), region)))
    updates = emit(relax.op.broadcast_to(emit(relax.op.astype(values, str(x.ty.dtype))), region + shape[depth:]))
    return emit(relax.op.scatter_nd(x, emit(relax.op.stack(coords, axis=-1)), updates,
                                    "add" if accumulate else "update"))


def _masked_put(emit: Any, x: Any, shape: list[int], dims: list[int], tensors: list[Any], values: Any,
                accumulate: bool) -> Any:
    """``x[mask] = v`` (or ``+=``) for a mask of x's leading dimensions and one value."""
    from tvm import relax

    mask_shape = _static_shape(tensors[0])
    if dims != [0] or mask_shape != shape[:len(mask_shape)] or int(np.prod(_static_shape(values))) != 1:
        raise TvmExtError("index_put with a boolean mask is converted for a mask of the leading dimensions "
                          "and one value (x[mask] = v)")
    mask = emit(relax.op.reshape(tensors[0], mask_shape + [1] * (len(shape) - len(mask_shape))))
    value = emit(relax.op.astype(emit(relax.op.reshape(values, [])), str(x.ty.dtype)))
    if accumulate:
        return emit(relax.op.add(x, emit(relax.op.where(mask, value, relax.const(0, str(x.ty.dtype))))))
    return emit(relax.op.where(mask, value, x))


def unfold(node: Any, importer: Any) -> Any:
    """``x.unfold(dim, size, step)``: the windows of ``size`` every ``step`` along ``dim``, in that
    dimension's place, each window's elements in a new last dimension (torch's view), as one
    ``take`` of the windows' positions.  TVM 0.27's torch frontend has no converter for it."""
    from tvm import relax

    x, dim, size, step = importer.env[node.args[0]], int(node.args[1]), int(node.args[2]), int(node.args[3])
    shape = _static_shape(x)
    if shape is None:
        raise TvmExtError("unfold of a shape known only at run time is not converted")
    dim %= len(shape)
    windows = (shape[dim] - size) // step + 1
    positions = np.arange(windows)[:, None] * step + np.arange(size)[None, :]
    emit = importer.block_builder.emit
    taken = emit(relax.op.take(x, relax.const(positions.astype(np.int64)), axis=dim))
    order = list(range(len(shape) + 1))
    order.append(order.pop(dim + 1))  # the window's elements last
    return emit(relax.op.permute_dims(taken, order))


SCATTER_REDUCTIONS = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}  # torch's -> Relax's


def scatter_reduce(node: Any, importer: Any) -> Any:
    """``scatter_add`` and ``scatter_reduce`` (sum, prod, amax, amin, mean; the data's own values
    included or not) as ``scatter_elements`` with that reduction (``scatters.py`` on the GPUs);
    TVM 0.27's torch frontend has no converter for either.  Without the data's values, each
    position an update reaches starts from the reduction's identity; ``mean`` is the sum over a
    count scattered alike (floored for integers, as torch's)."""
    from tvm import relax

    args = importer.retrieve_args(node)
    data, dim, index, src = args[0], int(args[1]), args[2], args[3]
    reduce = "sum" if node.target.__name__.startswith("scatter_add") else str(args[4])
    include_self = bool(args[5]) if len(args) > 5 else bool(node.kwargs.get("include_self", True))
    if reduce not in (*SCATTER_REDUCTIONS, "mean"):
        raise TvmExtError(f"scatter_reduce with reduce={reduce!r} is not supported "
                          "(sum, prod, mean, amax and amin are)")
    emit = importer.block_builder.emit
    index_shape, src_shape = _static_shape(index), _static_shape(src)
    if index_shape != src_shape:  # torch reads src where index has positions
        src = emit(relax.op.strided_slice(src, list(range(len(index_shape))), [0] * len(index_shape), index_shape))
    dtype = str(data.ty.dtype)

    def scattered(into: Any, values: Any, reduction: str) -> Any:
        return emit(relax.op.scatter_elements(into, index, values, axis=dim, reduction=reduction))

    if include_self and reduce != "mean":
        return scattered(data, src, SCATTER_REDUCTIONS[reduce])
    ones = emit(relax.op.ones_like(src))
    counts = scattered(emit(relax.op.ones_like(data) if include_self else relax.op.zeros_like(data)), ones, "add")
    reached = emit(relax.op.greater(counts, relax.const(0, dtype)))
    if not include_self:  # every position an update reaches starts from the identity
        data = emit(relax.op.where(reached, _identity(reduce, dtype), data))
    result = scattered(data, src, SCATTER_REDUCTIONS.get(reduce, "add"))
    if reduce != "mean":
        return result
    divide = relax.op.floor_divide if not dtype.startswith(("float", "bfloat")) else relax.op.divide
    return emit(relax.op.where(reached, emit(divide(result, counts)), result))


def _identity(reduce: str, dtype: str) -> Any:
    """The start of a scatter reduction that leaves its first update as it is."""
    from tvm import relax

    if reduce in ("sum", "mean", "prod"):
        return relax.const(1 if reduce == "prod" else 0, dtype)
    if dtype.startswith(("float", "bfloat")):  # numpy has no bfloat16 to ask its range of
        return relax.const(-np.inf if reduce == "amax" else np.inf, dtype)
    return relax.const(np.iinfo(dtype).min if reduce == "amax" else np.iinfo(dtype).max, dtype)


CONVERTERS = {"scatter_add.default": scatter_reduce, "scatter_reduce.two": scatter_reduce,
              "index.Tensor": index_tensor, "index_put.default": index_put, "index_put_.default": index_put,
              "unfold.default": unfold}
