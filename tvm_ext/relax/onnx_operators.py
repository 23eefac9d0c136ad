"""ONNX operators TVM 0.27's ONNX frontend has no converter for, as the specification defines
them: ``Celu`` (``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``), ``LpNormalization`` (``x``
over its L1 or L2 norm along ``axis``), ``Swish`` (``x * sigmoid(alpha * x)``), ``CumProd``
(``exclusive`` and ``reverse`` as ``CumSum``'s) and ``ReverseSequence`` (each batch row's first
``sequence_lens`` steps reversed, the rest as they are: what TensorFlow's exporter writes around a
bidirectional recurrence).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import TvmExtError


def constant_int(frontend: Any, value: Any, params: Any, what: str, op: str) -> int | None:
    """An integer input the conversion needs known (a length, an axis) as a Python int, None where
    the input is absent; one ``TvmExtError`` naming it where it is computed at run time."""
    import tvm

    if value is None:
        return None
    value = frontend.get_constant(value, params)
    if not isinstance(value, tvm.ir.expr.Constant):
        raise TvmExtError(f"ONNX {op} input {what} must be a constant (an initializer or a folded size), got "
                          f"{type(value).__name__}")
    return int(value.value.numpy().reshape(-1)[0])


def _reverse_sequence(bb: Any, x: Any, lengths: Any, time_axis: int, batch_axis: int) -> Any:
    """``x`` with row b's steps t < lengths[b] read from step lengths[b] - 1 - t (a gather along the
    time axis by an index of x's shape)."""
    from tvm import relax

    op = relax.op
    shape = list(x.ty.shape.values)
    steps = int(shape[time_axis])
    t = relax.const(np.arange(steps, dtype="int64"), "int64")
    n = bb.emit(op.astype(lengths, "int64"))
    grid = [1] * len(shape)
    grid[time_axis] = steps
    t = bb.emit(op.reshape(t, grid))
    grid = [1] * len(shape)
    grid[batch_axis] = -1
    n = bb.emit(op.reshape(n, grid))
    index = bb.emit(op.where(op.less(t, n), op.subtract(op.subtract(n, relax.const(1, "int64")), t), t))
    index = bb.emit(op.broadcast_to(index, relax.ShapeExpr(shape)))
    return bb.emit(op.gather_elements(x, index, axis=time_axis))


def missing_operators(frontend: Any) -> dict[str, Any]:
    """The converters as TVM's frontend takes them."""
    from tvm import relax

    class Celu(frontend.OnnxOpConverter):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v12(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            x, dtype = inputs[0], str(inputs[0].ty.dtype)
            alpha = relax.const(float(attr.get("alpha", 1.0)), dtype)
            negative = relax.op.multiply(alpha, relax.op.subtract(relax.op.exp(relax.op.divide(x, alpha)),
                                                                  relax.const(1.0, dtype)))
            return relax.op.add(relax.op.nn.relu(x), relax.op.minimum(relax.const(0.0, dtype), negative))

    class LpNormalization(frontend.OnnxOpConverter):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v1(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            x, axis, p = inputs[0], int(attr.get("axis", -1)), int(attr.get("p", 2))
            if p not in (1, 2):
                raise TvmExtError(f"LpNormalization with p={p} (ONNX defines p = 1 and 2)")
            norm = relax.op.sum(relax.op.abs(x), axis=[axis], keepdims=True) if p == 1 else \
                relax.op.sqrt(relax.op.sum(relax.op.multiply(x, x), axis=[axis], keepdims=True))
            return relax.op.divide(x, norm)

    class Swish(frontend.OnnxOpConverter):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v24(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            x, dtype = inputs[0], str(inputs[0].ty.dtype)
            alpha = relax.const(float(attr.get("alpha", 1.0)), dtype)
            return relax.op.multiply(x, relax.op.sigmoid(relax.op.multiply(alpha, x)))

    class CumProd(frontend.OnnxOpConverter):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v26(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            x = inputs[0]
            axis = constant_int(frontend, inputs[1], params, "axis", "CumProd")
            axis = axis + len(x.ty.shape.values) if axis < 0 else axis
            reverse = bool(attr.get("reverse", 0))
            if reverse:
                x = bb.emit(relax.op.flip(x, axis))
            out = bb.emit(relax.op.cumprod(x, axis, exclusive=bool(attr.get("exclusive", 0))))
            return relax.op.flip(out, axis) if reverse else out

    class ReverseSequence(frontend.OnnxOpConverter):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v10(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            time_axis, batch_axis = int(attr.get("time_axis", 0)), int(attr.get("batch_axis", 1))
            if {time_axis, batch_axis} != {0, 1}:
                raise TvmExtError(f"ONNX ReverseSequence time_axis={time_axis}, batch_axis={batch_axis}: ONNX "
                                  "allows 0 and 1, one each")
            return _reverse_sequence(bb, inputs[0], inputs[1], time_axis, batch_axis)

    return {"Celu": Celu, "LpNormalization": LpNormalization, "Swish": Swish, "CumProd": CumProd,
            "ReverseSequence": ReverseSequence}
