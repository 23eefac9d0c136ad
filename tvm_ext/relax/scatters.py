"""``R.scatter_elements`` and ``R.scatter_nd`` on GPUs: each output element reduces the updates aimed at it.

Why: TVM 0.27 picks its GPU kernel only under a GPU target's context, which models are not
legalized in here, and otherwise its CPU kernel (parallel host-style loops in an opaque block),
which no GPU schedule takes: a model with ``torch.scatter`` / ``scatter_reduce`` or ONNX
``ScatterElements`` stopped with "no schedule", on CUDA and OpenCL alike.  Here each output
element looks along the scattered axis of the indices for the positions that name it: ``update``
takes the last such update (duplicates have no defined order in torch or ONNX), ``add`` / ``mul``
/ ``max`` / ``min`` fold them into the data's value; reductions dlight schedules, the work the
output's size times the indices' extent along the axis.  ``scatter_nd`` (ONNX ``ScatterND``)
likewise looks through the index rows; TVM's kernel for it launched from host loops, which the
OpenCL executor does not replay.
"""
from __future__ import annotations

from typing import Any

REDUCERS = ("update", "add", "mul", "max", "min")


def scatter_legalizations() -> dict[str, Any]:
    """``LegalizeOps``' map for GPU targets."""
    return {"relax.scatter_elements": legalize_scatter_elements, "relax.scatter_nd": legalize_scatter_nd}


def legalize_scatter_elements(bb: Any, call: Any) -> Any:
    """``call`` as ``scatter_compute`` (a reduction it has none for: TVM's own legalization)."""
    from tvm.relax.transform.legalize_ops.manipulate import _scatter_elements as tvm_legalization

    data, indices, updates = call.args
    kind = str(call.attrs.reduction)
    if kind not in REDUCERS:
        return tvm_legalization(bb, call)
    axis = int(call.attrs.axis) % len(data.ty.shape.values)
    if kind == "update":
        last = bb.emit(bb.call_te(lambda d, i: last_match(d, i, axis), data, indices,
                                  primfunc_name_hint="scatter_last"))
        return bb.call_te(lambda d, i, u, k: take_last(d, i, u, k, axis), data, indices, updates, last,
                          primfunc_name_hint="scatter_update")
    return bb.call_te(lambda d, i, u: fold_matches(d, i, u, axis, kind), data, indices, updates,
                      primfunc_name_hint=f"scatter_{kind}")


def _matches(data: Any, indices: Any, axis: int, index: tuple[Any, ...], k: Any) -> tuple[Any, tuple[Any, ...]]:
    """Whether indices' position (``index`` with ``k`` on the axis) names output element ``index``
    (a negative index counted from the end), and that position."""
    from tvm import tirx

    position = list(index)
    position[axis] = k
    inside = tirx.const(True, "bool")
    for d, extent in enumerate(indices.shape):
        if d != axis:
            inside = tirx.And(inside, index[d] < extent)
    target, dtype = indices[tuple(position)], str(indices.dtype)
    size = data.shape[axis].astype(dtype)
    target = tirx.if_then_else(target < 0, target + size, target)
    return tirx.And(inside, target == index[axis].astype(dtype)), tuple(position)


def last_match(data: Any, indices: Any, axis: int) -> Any:
    """int64: the last position along the axis whose index names each output element, else -1."""
    from tvm import te, tirx

    k = te.reduce_axis((0, indices.shape[axis]), "k")

    def element(*index: Any) -> Any:
        hit, _ = _matches(data, indices, axis, index, k)
        return te.max(tirx.if_then_else(hit, k.astype("int64"), tirx.const(-1, "int64")), axis=k)

    return te.compute(data.shape, element, name="last")


def take_last(data: Any, indices: Any, updates: Any, last: Any, axis: int) -> Any:
    """Each output element: the update at its last naming position, or the data's value."""
    from tvm import te, tirx

    def element(*index: Any) -> Any:
        position = list(index)
        position[axis] = tirx.max(last[index], 0)
        return tirx.if_then_else(last[index] >= 0, updates[tuple(position)], data[index])

    return te.compute(data.shape, element, name="scattered")


def fold_matches(data: Any, indices: Any, updates: Any, axis: int, kind: str) -> Any:
    """Each output element: the data's value folded with every update aimed at it."""
    from tvm import te

    k = te.reduce_axis((0, indices.shape[axis]), "k")

    def aimed(index: tuple[Any, ...]) -> tuple[Any, Any]:
        hit, position = _matches(data, indices, axis, index, k)
        return hit, updates[position]

    return _folded_into(data, kind, aimed, k, kind)


def _folded_into(data: Any, kind: str, aimed: Any, axes: Any, name: str) -> Any:
    """``data``'s values folded (``scans.fold_of``) with the updates ``aimed(index)`` gives each
    output element over the reduce ``axes`` (a hit and the update): their fold, then the data's."""
    from tvm import te, tirx

    from .scans import fold_of

    reducer, identity, combine = fold_of(kind, str(data.dtype))

    def folded(*index: Any) -> Any:
        hit, update = aimed(index)
        return reducer(tirx.if_then_else(hit, update, identity), axis=axes)

    gathered = te.compute(data.shape, folded, name=f"gathered_{name}")
    return te.compute(data.shape, lambda *index: combine(data[index], gathered[index]), name=f"scatter_{name}")


def legalize_scatter_nd(bb: Any, call: Any) -> Any:
    """``R.scatter_nd`` (ONNX ``ScatterND``: a slice assignment or a cache update as exporters
    write it) the same way: each output element looks through the index rows for those naming
    its leading coordinates (TVM's kernel for it launched from host loops the OpenCL executor
    does not replay)."""
    from tvm.relax.transform.legalize_ops.manipulate import _scatter_nd as tvm_legalization

    data, indices, updates = call.args
    kind = str(call.attrs.reduction)
    if kind not in REDUCERS:
        return tvm_legalization(bb, call)
    if kind == "update":
        rows, k = len(indices.ty.shape.values) - 1, int(indices.ty.shape.values[-1])
        last = bb.emit(bb.call_te(last_row, data, indices, primfunc_name_hint="scatter_nd_last"))
        return bb.call_te(lambda d, u, n: take_row(d, u, n, rows, k), data, updates, last,
                          primfunc_name_hint="scatter_nd_update")
    return bb.call_te(lambda d, i, u: fold_rows(d, i, u, kind), data, indices, updates,
                      primfunc_name_hint=f"scatter_nd_{kind}")


def _row_axes(indices: Any) -> tuple[list[Any], Any]:
    """A reduce axis over each leading dimension of ``indices`` (its rows), and the rows' linear number."""
    from tvm import te

    axes = [te.reduce_axis((0, extent), f"r{d}") for d, extent in enumerate(indices.shape[:-1])]
    number = 0
    for axis, extent in zip(axes, indices.shape[:-1]):
        number = number * extent + axis
    return axes, number


def _row_names(data: Any, indices: Any, axes: list[Any], index: tuple[Any, ...]) -> Any:
    """Whether the index row at ``axes`` names output element ``index``'s leading coordinates."""
    from tvm import tirx

    hit = tirx.const(True, "bool")
    for j in range(int(indices.shape[-1])):
        coordinate = indices[tuple(axes) + (j,)]
        hit = tirx.And(hit, coordinate == index[j].astype(str(indices.dtype)))
    return hit


def last_row(data: Any, indices: Any) -> Any:
    """int64: the last index row naming each output element's leading coordinates, else -1."""
    from tvm import te, tirx

    axes, number = _row_axes(indices)

    def element(*index: Any) -> Any:
        hit = _row_names(data, indices, axes, index)
        return te.max(tirx.if_then_else(hit, number.astype("int64"), tirx.const(-1, "int64")), axis=axes)

    return te.compute(data.shape, element, name="last_row")


def take_row(data: Any, updates: Any, last: Any, rows: int, k: int) -> Any:
    """Each output element: its last naming row's update (``updates`` holds the ``rows`` row
    dimensions, then data's dimensions past the ``k`` leading ones), or the data's value."""
    from tvm import te, tirx

    def element(*index: Any) -> Any:
        row, position = tirx.max(last[index], tirx.const(0, "int64")), []
        for extent in reversed(updates.shape[:rows]):
            position.insert(0, row % extent.astype("int64"))
            row = row // extent.astype("int64")
        picked = updates[tuple(position) + tuple(index[k:])]
        return tirx.if_then_else(last[index] >= 0, picked, data[index])

    return te.compute(data.shape, element, name="scattered_nd")


def fold_rows(data: Any, indices: Any, updates: Any, kind: str) -> Any:
    """Each output element: the data's value folded with the updates of every row naming it."""
    axes, _ = _row_axes(indices)
    k = int(indices.shape[-1])

    def aimed(index: tuple[Any, ...]) -> tuple[Any, Any]:
        return _row_names(data, indices, axes, index), updates[tuple(axes) + tuple(index[k:])]

    return _folded_into(data, kind, aimed, axes, f"nd_{kind}")
