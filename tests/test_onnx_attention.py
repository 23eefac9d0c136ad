"""ONNX's own ``Attention`` (opset 23, ``tvm_ext.relax.onnx_attention``), what torch's default ONNX
exporter writes for ``scaled_dot_product_attention`` from opset 23, run on PoCL against ONNX's
reference evaluator: 4-D and 3-D inputs, grouped queries, a past cache, boolean and additive masks
shorter than the keys, causal masking offset by the past, softcap, a row with every key masked,
each ``qk_matmul_output`` mode; onnxruntime's contrib form (``num_heads``) still TVM's; a sliding
window refused by name."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from tvm_ext.core.errors import TvmExtError  # noqa: E402
from tvm_ext.relax.onnx_import import load_onnx  # noqa: E402

F = TensorProto.FLOAT


def _case(name):
    """(inputs by name, the node's input names, attributes, outputs) of each case."""
    rng = np.random.default_rng(0)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    cases = {
        "4d": (dict(Q=r(2, 4, 5, 8), K=r(2, 4, 7, 8), V=r(2, 4, 7, 6)), ["Q", "K", "V"], {}, ["Y"]),
        "3d-gqa-causal": (dict(Q=r(2, 5, 32), K=r(2, 5, 16), V=r(2, 5, 16)), ["Q", "K", "V"],
                          dict(q_num_heads=4, kv_num_heads=2, is_causal=1), ["Y"]),
        "past-causal-bool-mask": (dict(Q=r(1, 2, 3, 4), K=r(1, 2, 3, 4), V=r(1, 2, 3, 4),
                                       M=rng.random((3, 4)) > 0.3, PK=r(1, 2, 2, 4), PV=r(1, 2, 2, 4)),
                                  ["Q", "K", "V", "M", "PK", "PV"], dict(is_causal=1),
                                  ["Y", "present_key", "present_value"]),
        "additive-short-mask-softcap-scale": (dict(Q=r(2, 2, 4, 8), K=r(2, 2, 6, 8), V=r(2, 2, 6, 8),
                                                   M=r(4, 5)), ["Q", "K", "V", "M"],
                                              dict(softcap=2.0, scale=0.3, qk_matmul_output_mode=3),
                                              ["Y", "", "", "qk"]),
        "a-row-fully-masked": (dict(Q=r(1, 1, 3, 4), K=r(1, 1, 3, 4), V=r(1, 1, 3, 4),
                                    M=np.array([[True, False, True], [False, False, False], [True, True, True]])),
                               ["Q", "K", "V", "M"], {}, ["Y"]),
        "qk-mode-0": (dict(Q=r(1, 2, 3, 4), K=r(1, 2, 5, 4), V=r(1, 2, 5, 4)), ["Q", "K", "V"],
                      dict(qk_matmul_output_mode=0), ["Y", "", "", "qk"]),
        "qk-mode-1": (dict(Q=r(1, 2, 3, 4), K=r(1, 2, 5, 4), V=r(1, 2, 5, 4), M=r(3, 5)), ["Q", "K", "V", "M"],
                      dict(qk_matmul_output_mode=1, softcap=1.5), ["Y", "", "", "qk"]),
        "qk-mode-2": (dict(Q=r(1, 2, 3, 4), K=r(1, 2, 5, 4), V=r(1, 2, 5, 4), M=r(3, 5)), ["Q", "K", "V", "M"],
                      dict(qk_matmul_output_mode=2, softcap=1.5), ["Y", "", "", "qk"]),
    }
    return cases[name]


def _model(tmp_path, arrays, names, attrs, outputs, opset=23):
    kinds = {np.dtype("float32"): F, np.dtype("bool"): TensorProto.BOOL}
    graph = helper.make_graph(
        [helper.make_node("Attention", names, outputs, **attrs)], "attention",
        [helper.make_tensor_value_info(n, kinds[a.dtype], list(a.shape)) for n, a in arrays.items()],
        [helper.make_tensor_value_info(o, F, [f"{o}{i}" for i in range(arrays["Q"].ndim if o == "Y" else 4)])
         for o in outputs if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    path = str(tmp_path / "attention.onnx")
    onnx.save(model, path)
    return path, model


@pytest.mark.parametrize("case", ["4d", "3d-gqa-causal", "past-causal-bool-mask", "additive-short-mask-softcap-scale",
                                  "a-row-fully-masked", "qk-mode-0", "qk-mode-1", "qk-mode-2"])
def test_attention_matches_onnxs_reference(opencl, tmp_path, case):
    from tvm_ext.relax.pipeline import load_model

    arrays, names, attrs, outputs = _case(case)
    path, model = _model(tmp_path, arrays, names, attrs, outputs)
    want = ReferenceEvaluator(model).run(None, arrays)
    got = load_model(load_onnx(path), opencl, None, function="main", log=None)(*arrays.values())
    got = [np.asarray(g) for g in (got if isinstance(got, (tuple, list)) else (got,))]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


def test_a_sliding_window_is_refused_by_name(tmp_path):
    arrays, names, _, outputs = _case("4d")
    path, _ = _model(tmp_path, arrays, names, dict(left_window_size=2), outputs, opset=25)
    with pytest.raises(TvmExtError, match="ONNX Attention attribute left_window_size=2"):
        load_onnx(path)


def test_torch_sdpa_exported_at_opset_23_matches_torch_in_float64(opencl, tmp_path):
    """What torch's default exporter writes for ``scaled_dot_product_attention`` at opset 23 (ONNX's
    ``Attention``, which TVM's converter of that name stopped on): causal, and with a boolean mask
    and grouped queries, against torch in float64."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    from tvm_ext.relax.pipeline import load_model

    class Attend(torch.nn.Module):
        def forward(self, q, k, v, mask):
            causal = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            masked = torch.nn.functional.scaled_dot_product_attention(q, k[:, :2].repeat_interleave(2, 1),
                                                                      v[:, :2].repeat_interleave(2, 1), attn_mask=mask)
            return causal + masked

    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(2, 4, 6, 8, generator=gen), torch.randn(2, 4, 6, 8, generator=gen),
            torch.randn(2, 4, 6, 8, generator=gen), torch.rand(6, 6, generator=gen) > 0.2)
    path = str(tmp_path / "sdpa.onnx")
    torch.onnx.export(Attend(), args, path, dynamo=True, opset_version=23, input_names=["q", "k", "v", "mask"])
    assert "Attention" in {n.op_type for n in onnx.load(path).graph.node}
    got = load_model(load_onnx(path), opencl, None, function="main", log=None)(*(a.numpy() for a in args))
    got = np.asarray(got[0] if isinstance(got, (tuple, list)) else got)
    want = Attend()(*(a.double() if a.is_floating_point() else a for a in args)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
