"""Relax's sorts (``R.sort``, ``R.argsort``, ``R.topk``) on OpenCL: ranks by counting, then a gather by rank.

Why: as for the scans (``scans.py``), TVM's GPU sorts launch their kernels from host loops, which
the OpenCL executor does not replay.  So on OpenCL an element's rank along the axis is counted (the
elements before it in the order, an equal one before it when its index is lower: a stable sort),
and the r-th output reduces the elements over the one whose rank is r: two reductions dlight
schedules, ``n * n`` work a row of length ``n`` each (``scans.MAX_SCAN_LENGTH`` bounds it).  NaN
orders above every number, as in torch (last ascending, first descending).  On CUDA TVM's
dispatch stays.
"""
from __future__ import annotations

from typing import Any

SORT_OPS = ("relax.sort", "relax.argsort", "relax.topk")


def sort_legalizations() -> dict[str, Any]:
    """``LegalizeOps``' map for the OpenCL path: each sort op to ``legalize_sort``."""
    return {op: legalize_sort for op in SORT_OPS}


def legalize_sort(bb: Any, call: Any) -> Any:
    """``R.sort`` (values), ``R.argsort`` (indices in ``dtype``), ``R.topk`` (the first ``k`` of
    the order, values and / or indices as ``ret_type`` says) as a rank ``call_te`` and a gather."""
    from tvm import relax

    x, attrs, name = call.args[0], call.attrs, call.op.name
    rank_of = len(x.ty.shape.values)
    axis = int(attrs.axis) % rank_of
    descending = bool(attrs.largest) if name == "relax.topk" else bool(attrs.descending)
    count = int(attrs.k) if name == "relax.topk" else None
    if count is not None and count < 1:  # topk's k < 1: the whole axis
        count = None
    ranks = bb.emit(bb.call_te(lambda data: rank_compute(data, axis, descending), x, primfunc_name_hint="ranks"))
    index_dtype = str(attrs.dtype) if name != "relax.sort" else "int64"

    def gathered(what: str) -> Any:
        return bb.emit(bb.call_te(lambda data, rank: gather_by_rank(data, rank, axis, count, what, index_dtype),
                                  x, ranks, primfunc_name_hint=f"sorted_{what}"))

    if name == "relax.sort":
        return gathered("values")
    if name == "relax.argsort":
        return gathered("indices")
    ret = str(attrs.ret_type)
    if ret == "values":
        return gathered("values")
    if ret == "indices":
        return gathered("indices")
    return relax.Tuple([gathered("values"), gathered("indices")])


def rank_compute(data: Any, axis: int, descending: bool) -> Any:
    """int32 rank of each element along ``axis``: how many come before it (stable; NaN above all)."""
    from tvm import te, tirx

    k = te.reduce_axis((0, data.shape[axis]), "k")

    def before(a: Any, b: Any) -> Any:  # a orders strictly before b (NaN above every number)
        first = a > b if descending else a < b
        if not str(data.dtype).startswith("float"):
            return first
        if descending:
            return tirx.Or(tirx.And(tirx.isnan(a), tirx.Not(tirx.isnan(b))), first)
        return tirx.And(tirx.Not(tirx.isnan(a)), tirx.Or(tirx.isnan(b), first))

    def same(a: Any, b: Any) -> Any:
        if str(data.dtype).startswith("float"):
            return tirx.Or(a == b, tirx.And(tirx.isnan(a), tirx.isnan(b)))
        return a == b

    def element(*index: Any) -> Any:
        other = list(index)
        other[axis] = k
        a, b = data[tuple(other)], data[index]
        ahead = tirx.Or(before(a, b), tirx.And(same(a, b), k < index[axis]))
        return te.sum(tirx.if_then_else(ahead, tirx.const(1, "int32"), tirx.const(0, "int32")), axis=k)

    return te.compute(data.shape, element, name="rank")


def gather_by_rank(data: Any, rank: Any, axis: int, count: int | None, what: str, index_dtype: str) -> Any:
    """The first ``count`` (all where None) places of the order along ``axis``: each place's
    value (``what="values"``) or index (``"indices"``, in ``index_dtype``), the one element whose
    rank it is picked by a reduction."""
    from tvm import te, tirx

    n = data.shape[axis]
    j = te.reduce_axis((0, n), "j")
    shape = list(data.shape)
    if count is not None:
        shape[axis] = count
    dtype = str(data.dtype) if what == "values" else index_dtype

    def element(*index: Any) -> Any:
        source = list(index)
        source[axis] = j
        picked = rank[tuple(source)] == index[axis].astype("int32")
        value = data[tuple(source)] if what == "values" else j.astype(dtype)
        return te.sum(tirx.if_then_else(picked, value, tirx.const(0, dtype)), axis=j)

    return te.compute(shape, element, name=f"sorted_{what}")
