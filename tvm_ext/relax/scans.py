"""Relax's scans (``R.cumsum``, ``R.cumprod``) on OpenCL: legalized to a reduction dlight schedules.

Why: Relax has no legalization of the scans; TVM's build hands them to ``DispatchSortScan``,
whose GPU kernels do not fit the OpenCL executor (``relax_opencl``): its general scan launches
from host loops whose grids change with the loop, and its one-kernel scan relies on a warp's
threads running in step, which OpenCL does not promise and PoCL does not do.  So on OpenCL each
output element reduces the elements up to it along the axis (``n * n`` work a row of length
``n``: models scan short axes, e.g. positions from an attention mask).  On CUDA TVM's dispatch stays.
"""
from __future__ import annotations

from typing import Any

import numpy as np

SCAN_OPS = {"relax.cumsum": "sum", "relax.cumprod": "product"}
MAX_SCAN_LENGTH = 16384  # the longest scanned axis legalized so (its square: the work a row)


def scan_legalizations() -> dict[str, Any]:
    """``LegalizeOps``' map for the OpenCL path: each scan op to ``legalize_scan``."""
    return {op: legalize_scan for op in SCAN_OPS}


def check_scan_lengths(mod: Any) -> None:
    """One ``TvmExtError`` for a scan or sort (``sorts.py``) of the module's Relax functions whose length is past
    ``MAX_SCAN_LENGTH`` (checked before legalizing: an error raised inside TVM's pass comes out
    as TVM's own); a symbolic length is not checked (the OpenCL path runs static shapes)."""
    from tvm import relax

    from ..core.errors import TvmExtError

    from .sorts import SORT_OPS

    found: list[str] = []

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", None) in (*SCAN_OPS, *SORT_OPS):
            dims = [int(d.value) if hasattr(d, "value") else None for d in expr.args[0].ty.shape.values]
            axis = expr.attrs.axis
            length = (None if None in dims else int(np.prod(dims))) if axis is None else dims[int(axis)]
            if length is not None and length > MAX_SCAN_LENGTH:
                found.append(f"{expr.op.name.removeprefix('relax.')} over {length} elements")

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    if found:
        raise TvmExtError(f"{found[0]}: on OpenCL a scan or sort runs as reductions, their work the square of "
                          f"its length; at most {MAX_SCAN_LENGTH} here")


def legalize_scan(bb: Any, call: Any) -> Any:
    """``R.cumsum`` / ``R.cumprod`` (any axis, or ``axis=None``: the flattened input; ``dtype``;
    ``exclusive``) as one ``call_te`` of ``scan_compute``."""
    from tvm import topi

    x = call.args[0]
    attrs = call.attrs
    dtype = str(attrs.dtype) if attrs.dtype is not None and str(attrs.dtype) else str(x.ty.dtype)
    exclusive = bool(attrs.exclusive) if attrs.exclusive is not None else False
    kind = SCAN_OPS[call.op.name]

    def compute(data: Any) -> Any:
        if attrs.axis is None:
            size = 1
            for extent in data.shape:
                size = size * extent
            return scan_compute(topi.reshape(data, (size,)), 0, dtype, exclusive, kind)
        axis = int(attrs.axis)
        return scan_compute(data, axis + len(data.shape) if axis < 0 else axis, dtype, exclusive, kind)

    return bb.call_te(compute, x, primfunc_name_hint=call.op.name.split(".")[-1])


def scan_compute(data: Any, axis: int, dtype: str, exclusive: bool, kind: str = "sum") -> Any:
    """The inclusive (or exclusive) scan of ``data`` along ``axis`` in ``dtype`` as a TE
    reduction: out[..., j, ...] reduces data[..., k, ...] over k <= j (k < j), the identity past j."""
    from tvm import te, tirx

    k = te.reduce_axis((0, data.shape[axis]), "k")
    reducer, identity, _ = fold_of({"sum": "add", "product": "mul"}[kind], dtype)

    def element(*index: Any) -> Any:
        source = list(index)
        source[axis] = k
        taken = k < index[axis] if exclusive else k <= index[axis]
        return reducer(tirx.if_then_else(taken, data[tuple(source)].astype(dtype), identity), axis=k)

    return te.compute(data.shape, element, name=f"cum{kind}")


def fold_of(kind: str, dtype: str) -> tuple[Any, Any, Any]:
    """A fold ("add", "mul", "max" or "min") in ``dtype``: its TE reducer, its identity, and the
    same fold of two values (the scans here, the scatters' updates into the data's values)."""
    from tvm import te, tirx

    reducer = {"add": te.sum, "max": te.max, "min": te.min,
               "mul": te.comm_reducer(lambda a, b: a * b, lambda t: tirx.const(1, dtype=t), name="product")}[kind]
    identity = {"add": tirx.const(0, dtype), "mul": tirx.const(1, dtype),
                "max": tirx.min_value(dtype), "min": tirx.max_value(dtype)}[kind]
    combine = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "max": tirx.max, "min": tirx.min}[kind]
    return reducer, identity, combine
