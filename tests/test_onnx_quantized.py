"""ONNX's QOperator quantized nodes (``tvm_ext.relax.onnx_quantized``: ``QLinearConv``,
``QLinearMatMul``, ``ConvInteger``) run on PoCL and compared bit for bit with ONNX's reference
evaluator: uint8 and int8, per-tensor and per-channel scales and zero points, a bias, strides,
padding and groups, power-of-two scales whose products land on ties (rounded half to even);
8-bit floats refused by name."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from tvm_ext.core.errors import TvmExtError  # noqa: E402
from tvm_ext.relax.onnx_import import load_onnx  # noqa: E402

KINDS = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}


def _ints(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _zero_points(rng, dtype, shape=()):
    """Zero points near the middle of the type's range, as calibrated ones are."""
    middle = 128 if dtype == "uint8" else 0
    return (middle + rng.integers(-6, 7, shape)).astype(dtype)


def _save(tmp_path, name, node, x, inits, y_dtype, opset=13):
    graph = helper.make_graph([node], name, [helper.make_tensor_value_info("x", KINDS[str(x.dtype)], list(x.shape))],
                              [helper.make_tensor_value_info("y", y_dtype, [f"d{i}" for i in range(x.ndim)])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(model, path)
    return path, model


def _ours_and_reference(path, model, x, opencl):
    from tvm_ext.relax.pipeline import load_model

    got = load_model(load_onnx(path), opencl, None, function="main", log=None)(x)
    got = np.asarray(got[0] if isinstance(got, (tuple, list)) else got)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    return got, want


CONV_CASES = {
    "uint8-per-tensor-bias-pad": dict(dtype="uint8", per_channel=False, bias=True, pads=[1, 1, 1, 1]),
    "int8-per-channel-stride": dict(dtype="int8", per_channel=True, bias=True, strides=[2, 2]),
    "uint8-groups-ties": dict(dtype="uint8", per_channel=False, bias=False, group=2, pow2=True),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_qlinear_conv_matches_onnxs_reference_bit_for_bit(opencl, tmp_path, case):
    kw = dict(CONV_CASES[case])
    dtype, per_channel, bias, pow2 = kw.pop("dtype"), kw.pop("per_channel"), kw.pop("bias"), kw.pop("pow2", False)
    rng = np.random.default_rng(0)
    group = kw.get("group", 1)
    x = _ints(rng, dtype, (2, 4, 7, 6))
    w = _ints(rng, dtype, (6, 4 // group, 3, 3))
    scales = (lambda n: (2.0 ** -rng.integers(4, 8, n)).astype(np.float32)) if pow2 else \
        (lambda n: rng.uniform(0.01, 0.05, n).astype(np.float32))
    xs, ws = scales(()), scales(6) if per_channel else scales(())
    # y's scale puts the sums' spread (about 70 x 70 x sqrt(36)) over the output's range; with
    # power-of-two scales the requantizing factor is 2^-10 exactly, so sums land on ties
    ys = np.float32(xs * np.max(ws) * (1024 if pow2 else 400))
    inits = {"xs": xs, "xz": _zero_points(rng, dtype), "w": w, "ws": ws,
             "wz": _zero_points(rng, dtype, 6) if per_channel else _zero_points(rng, dtype), "ys": ys,
             "yz": _zero_points(rng, dtype)}
    names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if bias:
        inits["b"] = rng.integers(-2000, 2000, 6).astype(np.int32)
        names.append("b")
    node = helper.make_node("QLinearConv", names, ["y"], kernel_shape=[3, 3], **kw)
    path, model = _save(tmp_path, "qconv", node, x, inits, KINDS[dtype])
    got, want = _ours_and_reference(path, model, x, opencl)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 20  # not saturated everywhere


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_qlinear_matmul_matches_onnxs_reference_bit_for_bit(opencl, tmp_path, dtype):
    """a per tensor, b per column (N scales and zero points), output zero point in its type."""
    rng = np.random.default_rng(1)
    x = _ints(rng, dtype, (3, 5, 16))
    inits = {"as": np.float32(0.02), "az": _zero_points(rng, dtype), "b": _ints(rng, dtype, (16, 9)),
             "bs": rng.uniform(0.005, 0.02, 9).astype(np.float32), "bz": _zero_points(rng, dtype, 9),
             "ys": np.float32(0.25), "yz": _zero_points(rng, dtype)}
    node = helper.make_node("QLinearMatMul", ["x", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    path, model = _save(tmp_path, "qmatmul", node, x, inits, KINDS[dtype])
    got, want = _ours_and_reference(path, model, x, opencl)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 20


def test_ties_round_half_to_even(opencl, tmp_path):
    """y = a / 2 lands on every half: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2 (numpy's rint, as ONNX rounds;
    TVM's round would take each away from zero)."""
    x = np.arange(0, 60, dtype=np.uint8).reshape(1, 60, 1)
    inits = {"as": np.float32(1.0), "az": np.array(0, np.uint8), "b": np.ones((1, 1), np.uint8),
             "bs": np.float32(1.0), "bz": np.array(0, np.uint8), "ys": np.float32(2.0), "yz": np.array(0, np.uint8)}
    node = helper.make_node("QLinearMatMul", ["x", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    path, model = _save(tmp_path, "ties", node, x, inits, TensorProto.UINT8)
    got, want = _ours_and_reference(path, model, x, opencl)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got.reshape(-1)[:6], [0, 0, 1, 2, 2, 2])


def test_conv_integer_is_the_exact_int32_convolution(opencl, tmp_path):
    rng = np.random.default_rng(2)
    x = _ints(rng, "uint8", (1, 3, 6, 6))
    inits = {"w": _ints(rng, "uint8", (4, 3, 3, 3)), "xz": np.array(128, np.uint8), "wz": np.array(3, np.uint8)}
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 1, 1, 1])
    path, model = _save(tmp_path, "convint", node, x, inits, TensorProto.INT32)
    got, want = _ours_and_reference(path, model, x, opencl)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_an_8_bit_float_qlinear_matmul_is_refused_by_name(tmp_path):
    b = helper.make_tensor("b", TensorProto.FLOAT8E4M3FN, [4, 3], np.zeros(12, np.float32).tolist())
    inits = {"as": np.float32(0.1), "az": np.array(0, np.uint8), "bs": np.float32(0.1), "ys": np.float32(0.1),
             "yz": np.array(0, np.uint8)}
    node = helper.make_node("QLinearMatMul", ["x", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    graph = helper.make_graph([node], "f8", [helper.make_tensor_value_info("x", TensorProto.UINT8, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [2, 3])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()]
                              + [b, helper.make_tensor("bz", TensorProto.FLOAT8E4M3FN, [], [0.0])])
    path = str(tmp_path / "f8.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)
    with pytest.raises(TvmExtError, match="ONNX QLinearMatMul with b of type float8_e4m3fn is not supported"):
        load_onnx(path)
