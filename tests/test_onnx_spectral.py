"""ONNX ``DFT`` and ``STFT`` (``tvm_ext.relax.onnx_spectral``) run on PoCL against ONNX's reference
evaluator: real and complex signals, padded and truncated lengths, every axis form, inverse and
one-sided transforms (and the one-sided inverse back to a real signal), an STFT with a Hann
window folded to a constant (``onnx_fold``); non-constant lengths refused by name."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from tvm_ext.core.errors import TvmExtError  # noqa: E402
from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.relax.onnx_import import load_onnx  # noqa: E402


def _run_both(tmp_path, nodes, x, inits, opset, opencl, name="spectral"):
    from tvm_ext.relax.pipeline import load_model

    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"d{i}" for i in
                                                                                      range(x.ndim + 1)])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(model, path)
    got = load_model(load_onnx(path), opencl, None, function="main", log=None)(x)
    got = np.asarray(got[0] if isinstance(got, (tuple, list)) else got)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    return got, want


DFT_CASES = {  # x's shape, opset, dft_length, axis, inverse, onesided
    "real-17-axis1": ((3, 10, 1), 17, None, 1, 0, 0),
    "complex-20-padded": ((2, 7, 5, 2), 20, 9, 1, 0, 0),
    "complex-20-truncated-axis-2": ((2, 4, 12, 2), 20, 8, -2, 0, 0),
    "real-onesided-20": ((3, 11, 1), 20, None, None, 0, 1),
    "complex-inverse-20": ((2, 9, 2), 20, None, 1, 1, 0),
    "onesided-inverse-to-real-20": ((2, 6, 2), 20, 10, 1, 1, 1),
    "real-inverse-17": ((2, 8, 1), 17, None, 1, 1, 0),
}


@pytest.mark.parametrize("case", list(DFT_CASES))
def test_dft_matches_onnxs_reference(opencl, tmp_path, case):
    shape, opset, length, axis, inverse, onesided = DFT_CASES[case]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    inits, names, attrs = {}, ["x", "", ""], dict(inverse=inverse, onesided=onesided)
    if length is not None:
        inits["n"] = np.array(length, np.int64)
        names[1] = "n"
    if opset >= 20 and axis is not None:
        inits["axis"] = np.array(axis, np.int64)
        names[2] = "axis"
    elif opset < 20:
        attrs["axis"] = axis
    while names[-1] == "":
        names.pop()
    got, want = _run_both(tmp_path, [helper.make_node("DFT", names, ["y"], **attrs)], x, inits, opset, opencl)
    assert got.shape == want.shape
    assert relative_error(got, want) < 2e-6, relative_error(got, want)


@pytest.mark.parametrize("onesided", [1, 0])
def test_stft_with_a_folded_hann_window_matches_onnxs_reference(opencl, tmp_path, onesided):
    """A spectrogram's front end as an exporter writes it: a ``HannWindow`` of a constant size
    (folded to a constant at import), frames of 16 every 5 samples of a 61-sample signal."""
    x = np.random.default_rng(1).standard_normal((2, 61, 1)).astype(np.float32)
    inits = {"size": np.array(16, np.int64), "step": np.array(5, np.int64), "frame": np.array(16, np.int64)}
    nodes = [helper.make_node("HannWindow", ["size"], ["window"]),
             helper.make_node("STFT", ["x", "step", "window", "frame"], ["y"], onesided=onesided)]
    got, want = _run_both(tmp_path, nodes, x, inits, 17, opencl, name="stft")
    assert got.shape == want.shape == (2, 10, 9 if onesided else 16, 2)
    assert relative_error(got, want) < 2e-6


def test_a_dft_length_computed_at_run_time_is_refused_by_name(tmp_path):
    graph = helper.make_graph([helper.make_node("DFT", ["x", "n"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 1]),
                               helper.make_tensor_value_info("n", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 2])])
    path = str(tmp_path / "dft.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    with pytest.raises(TvmExtError, match="ONNX DFT input dft_length must be a constant"):
        load_onnx(path)


def test_torch_stft_exported_to_onnx_matches_torch_in_float64(opencl, tmp_path):
    """What torch's ONNX exporter writes for ``torch.stft`` (a (batch, length) signal, which ONNX's
    reference evaluator cannot run): a magnitude spectrogram against torch's in float64."""
    torch = pytest.importorskip("torch")
    from tvm_ext.relax.pipeline import load_model

    class Spectrogram(torch.nn.Module):
        def forward(self, x):
            window = torch.hann_window(32, dtype=x.dtype)
            spec = torch.stft(x, n_fft=32, hop_length=8, window=window, center=False, return_complex=False)
            return spec.pow(2).sum(-1).sqrt()  # the exporter takes no complex tensor

    x = torch.randn(2, 203)
    path = str(tmp_path / "stft.onnx")
    torch.onnx.export(Spectrogram(), (x,), path, dynamo=False, opset_version=17, input_names=["x"])
    got = load_model(load_onnx(path), opencl, None, function="main", log=None)(x.numpy())
    got = np.asarray(got[0] if isinstance(got, (tuple, list)) else got)
    want = Spectrogram()(x.double()).numpy()
    assert got.shape == want.shape and relative_error(got, want) < 2e-6
