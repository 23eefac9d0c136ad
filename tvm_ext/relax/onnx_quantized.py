"""ONNX's quantized operators in the QOperator form (``QLinearConv``, ``QLinearMatMul``,
``ConvInteger``), which TVM 0.27's ONNX frontend has no converter for: what onnxruntime's
quantization tool writes for int8 / uint8 models (the other form, ``QuantizeLinear`` /
``DequantizeLinear`` around float operators, TVM converts).

As the specification defines them: the inputs less their zero points in int32, the convolution or
matmul in int32 (exact), then requantized — times ``x_scale · w_scale / y_scale`` (that product
in float32, as the scales are), in float64, plus the output's zero point, rounded half to even,
saturated to its type.  Per-tensor and per-channel scales and zero points (a convolution's
weights per output channel; a matmul's ``a`` per row and ``b`` per column).  Other element types
(8-bit floats) are refused by name.
"""
from __future__ import annotations

from typing import Any

from ..core.errors import TvmExtError

INTEGER_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


def _checked_dtype(op: str, what: str, value: Any) -> str:
    dtype = str(value.ty.dtype)
    if dtype not in INTEGER_RANGES:
        raise TvmExtError(f"ONNX {op} with {what} of type {dtype} is not supported; allowed: int8, uint8")
    return dtype


def _shifted(bb: Any, value: Any, zero_point: Any, shape: list[int] | None = None) -> Any:
    """``value`` less ``zero_point`` in int32; a per-channel zero point reshaped to ``shape``."""
    from tvm import relax

    wide = bb.emit(relax.op.astype(value, "int32"))
    if zero_point is None:
        return wide
    zp = bb.emit(relax.op.astype(zero_point, "int32"))
    if shape is not None and len(zp.ty.shape.values) == 1:
        zp = bb.emit(relax.op.reshape(zp, shape))
    return bb.emit(relax.op.subtract(wide, zp))


def _per_channel(bb: Any, value: Any, shape: list[int]) -> Any:
    """A scale or zero point, reshaped to ``shape`` where it is 1-D (per channel, row or column)."""
    from tvm import relax

    if len(value.ty.shape.values) == 1 and int(value.ty.shape.values[0]) != 1:
        return bb.emit(relax.op.reshape(value, shape))
    return bb.emit(relax.op.reshape(value, [1] * len(shape))) if len(value.ty.shape.values) else value


def _round_half_even(bb: Any, x: Any) -> Any:
    """``x`` (float64) rounded to the nearest integer, ties to even (numpy's ``rint``, ONNX's
    rounding): TVM's ``round`` takes ties away from zero, and power-of-two scales make ties common."""
    from tvm import relax

    op = relax.op
    half, one, two = (relax.const(v, "float64") for v in (0.5, 1.0, 2.0))
    nearest = bb.emit(op.floor(op.add(x, half)))
    tie = op.equal(op.subtract(nearest, x), half)
    odd = op.equal(op.subtract(nearest, op.multiply(two, op.floor(op.divide(nearest, two)))), one)
    return bb.emit(op.where(op.logical_and(tie, odd), op.subtract(nearest, one), nearest))


def requantized(bb: Any, acc: Any, scale: Any, y_zero_point: Any, dtype: str) -> Any:
    """int32 ``acc`` times float32 ``scale`` in float64, plus ``y_zero_point``, rounded half to even
    and saturated to ``dtype``."""
    from tvm import relax

    op = relax.op
    value = op.multiply(op.astype(acc, "float64"), op.astype(scale, "float64"))
    if y_zero_point is not None:
        value = op.add(value, op.astype(y_zero_point, "float64"))
    rounded = _round_half_even(bb, bb.emit(value))
    low, high = INTEGER_RANGES[dtype]
    clipped = op.minimum(op.maximum(rounded, relax.const(float(low), "float64")), relax.const(float(high), "float64"))
    return bb.emit(op.astype(clipped, dtype))


def _conv(frontend: Any, bb: Any, x: Any, w: Any, attrs: dict[str, Any], params: Any) -> Any:
    """TVM's own ``Conv`` converter on int32 operands (its padding, auto_pad, groups and layouts):
    zeros pad the shifted input, which is the input's zero point before the shift."""
    return bb.normalize(frontend.Conv._impl_v11(bb, [x, w, None], dict(attrs), params))


def convert_qlinear_conv(frontend: Any, bb: Any, inputs: list[Any], attrs: dict[str, Any], params: Any) -> Any:
    from tvm import relax

    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    _checked_dtype("QLinearConv", "x", x)
    _checked_dtype("QLinearConv", "w", w)
    rank = len(x.ty.shape.values)
    channels = [-1] + [1] * (rank - 1)  # (M, 1, ...) over the weights
    acc = _conv(frontend, bb, _shifted(bb, x, x_zp), _shifted(bb, w, w_zp, channels), attrs, params)
    if bias is not None:
        wide = bb.emit(relax.op.astype(bias, "int32"))
        acc = bb.emit(relax.op.add(acc, relax.op.reshape(wide, [1, -1] + [1] * (rank - 2))))
    by_output = [1, -1] + [1] * (rank - 2)
    x_s, w_s, y_s = (_per_channel(bb, s, by_output) for s in (x_scale, w_scale, y_scale))
    scale = relax.op.divide(relax.op.multiply(x_s, w_s), y_s)
    dtype = _checked_dtype("QLinearConv", "y", y_zp if y_zp is not None else x)
    return requantized(bb, acc, bb.emit(scale), y_zp, dtype)


def convert_qlinear_matmul(bb: Any, inputs: list[Any]) -> Any:
    from tvm import relax

    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = inputs[:8]
    _checked_dtype("QLinearMatMul", "a", a)
    _checked_dtype("QLinearMatMul", "b", b)
    rows, columns = [-1, 1], [1, -1]  # a's per row, b's per column (the output's per row)
    acc = bb.emit(relax.op.matmul(_shifted(bb, a, a_zp, rows), _shifted(bb, b, b_zp, columns), out_dtype="int32"))
    scale = relax.op.divide(relax.op.multiply(_per_channel(bb, a_scale, rows), _per_channel(bb, b_scale, columns)),
                            _per_channel(bb, y_scale, rows))
    dtype = _checked_dtype("QLinearMatMul", "y", y_zp if y_zp is not None else a)
    return requantized(bb, acc, bb.emit(scale), y_zp, dtype)


def convert_conv_integer(frontend: Any, bb: Any, inputs: list[Any], attrs: dict[str, Any], params: Any) -> Any:
    x, w = inputs[0], inputs[1]
    x_zp = inputs[2] if len(inputs) > 2 else None
    w_zp = inputs[3] if len(inputs) > 3 else None
    _checked_dtype("ConvInteger", "x", x)
    _checked_dtype("ConvInteger", "w", w)
    channels = [-1] + [1] * (len(x.ty.shape.values) - 1)
    return _conv(frontend, bb, _shifted(bb, x, x_zp), _shifted(bb, w, w_zp, channels), attrs, params)


def quantized_converters(frontend: Any) -> dict[str, Any]:
    """The three converters as TVM's frontend takes them."""

    class QLinearConv(frontend.OnnxOpConverter):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v10(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            return convert_qlinear_conv(frontend, bb, list(inputs), attr, params)

    class QLinearMatMul(frontend.OnnxOpConverter):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v10(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            return convert_qlinear_matmul(bb, list(inputs))

        _impl_v21 = _impl_v10

    class ConvInteger(frontend.OnnxOpConverter):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v10(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            return convert_conv_integer(frontend, bb, list(inputs), attr, params)

    return {"QLinearConv": QLinearConv, "QLinearMatMul": QLinearMatMul, "ConvInteger": ConvInteger}
