"""A ``Linear`` feeding a GRU or an LSTM folded into the layer's input projection at import
(``tvm_ext.relax.recurrent_fold``): from a ``torch.export`` program and from an ONNX file, the
layer reads the Linear's input (its template's input is the Linear's in-features) and the model
runs on PoCL against torch in float64; where folding would not leave fewer products, where
something else reads the Linear's output, or where an activation stands between them, the
model is as imported.  Needs torch (the test extra installs the CPU build)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.relax.relax_gru import find_grus  # noqa: E402
from tvm_ext.relax.torch_import import import_exported_program, program_inputs  # noqa: E402


class FrontEndThenRecurrent(nn.Module):
    """A speech model's shape: Linear(features, width) -> [activation] -> GRU or LSTM
    (batch_first) -> Linear; ``tap``: the front end's output is also returned."""

    def __init__(self, cell: str, features: int, width: int, hidden: int, layers: int = 2,
                 bidirectional: bool = False, activation: bool = False, tap: bool = False):
        super().__init__()
        self.front = nn.Linear(features, width)
        self.act = nn.ReLU() if activation else nn.Identity()
        self.rnn = getattr(nn, cell)(width, hidden, num_layers=layers, batch_first=True,
                                     bidirectional=bidirectional)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), 3)
        self.tap = tap

    def forward(self, x):
        front = self.act(self.front(x))
        out = self.head(self.rnn(front)[0])
        return (out, front) if self.tap else out


def _rewritten_calls(mod) -> list:
    """The Relax op calls of ``main`` after ``rewrite_model``, in order."""
    from tvm import relax

    from tvm_ext.relax.relax_rewrites import rewrite_model

    calls = []
    relax.analysis.post_order_visit(rewrite_model(mod)["main"], lambda e: calls.append(e) if isinstance(
        e, relax.Call) and hasattr(e.op, "name") else None)
    return calls


def _head_input_shape(mod) -> list[int]:
    """The shape of the last matmul's A after ``rewrite_model`` (the model's head)."""
    head = [c for c in _rewritten_calls(mod) if c.op.name == "relax.matmul"][-1]
    return [int(v) for v in head.args[0].ty.shape.values]


def _run(opencl, model, mod, inputs):
    from tvm_ext.relax.pipeline import load_model

    outputs = load_model(mod, opencl, None, function="main", log=None)(*inputs)
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    with torch.no_grad():
        reference = model.double()(*(torch.from_numpy(a).double() for a in inputs))
    reference = reference if isinstance(reference, tuple) else (reference,)
    for ours, ref in zip(outputs, reference):
        ours = np.asarray(ours.numpy() if hasattr(ours, "numpy") else ours)
        assert ours.shape == tuple(ref.shape) and relative_error(ours, ref.numpy()) < 1e-5


@pytest.mark.parametrize("cell, bidirectional", [("GRU", False), ("LSTM", True)])
def test_a_linear_feeding_the_layer_is_folded_into_its_input_projection(opencl, cell, bidirectional):
    """From a ``.pt2``: the layer's x is the Linear's input (7 features, not 12), its layer-0 W_ih
    (7, dirs·gates·H), and the model matches float64; imported without the fold, the layer reads
    the Linear's 12 outputs."""
    torch.manual_seed(0)
    model = FrontEndThenRecurrent(cell, 7, 12, 10, bidirectional=bidirectional).eval()
    program = torch.export.export(model, (torch.randn(3, 6, 7),))
    (folded,) = find_grus(import_exported_program(program))
    (kept,) = find_grus(import_exported_program(program, fold_linears=False))
    gates = 4 if cell == "LSTM" else 3
    assert (folded.template.input, kept.template.input) == (7, 12)
    assert folded.template.input_specs()["w_ih0"].shape == (7, (2 if bidirectional else 1) * gates * 10)
    _run(opencl, model, import_exported_program(program), program_inputs(program, seed=1))


def test_an_onnx_linear_feeding_a_gru_is_folded(opencl, tmp_path):
    """From an ONNX file (torch's TorchScript exporter: MatMul on the transposed weight, Add, a
    Transpose for ``batch_first``, a GRU node a layer): the first layer reads the 5 features, the
    second the first's output; the model matches float64."""
    from tvm_ext.cli.model_cli import load_model_file
    from tvm_ext.relax.pipeline import load_model

    torch.manual_seed(1)
    model = FrontEndThenRecurrent("GRU", 5, 16, 8).eval()
    path = str(tmp_path / "speech.onnx")
    torch.onnx.export(model, (torch.randn(2, 4, 5),), path, dynamo=False, opset_version=17)
    onnx_model = load_model_file(path)
    mod = onnx_model.get_module()
    first, second = find_grus(mod)  # the exporter writes a GRU node a layer
    assert (first.template.input, second.template.input) == (5, 8)
    assert _head_input_shape(mod) == [8, 8]  # the head: one GEMM on the last layer's (T·B, H) output
    inputs = onnx_model.get_inputs()
    ours = load_model(mod, opencl, None, function="main", log=None)(*inputs)
    ours = ours[0] if isinstance(ours, (list, tuple)) else ours
    ours = np.asarray(ours.numpy() if hasattr(ours, "numpy") else ours)
    with torch.no_grad():
        ref = model.double()(torch.from_numpy(inputs[0]).double()).numpy()
    assert relative_error(ours, ref) < 1e-5


@pytest.mark.parametrize("why, kwargs", [
    ("wider input than output", dict(features=12, width=7)),
    ("an activation between", dict(features=7, width=12, activation=True)),
])
def test_no_fold_where_it_would_not_hold_or_not_gain(why, kwargs):
    """A Linear with more inputs than outputs (folding would add products) or a ReLU after it:
    the layer reads the Linear's output as imported."""
    torch.manual_seed(2)
    model = FrontEndThenRecurrent("GRU", hidden=6, **kwargs).eval()
    program = torch.export.export(model, (torch.randn(2, 5, kwargs["features"]),))
    (gru,) = find_grus(import_exported_program(program))
    assert gru.template.input == kwargs["width"], why


def test_a_linear_read_elsewhere_too_stays_and_the_layer_still_folds(opencl):
    """The front end's output is also a model output: the Linear stays for it, the GRU reads the
    Linear's input, both outputs match float64."""
    torch.manual_seed(3)
    model = FrontEndThenRecurrent("GRU", 4, 9, 5, layers=1, tap=True).eval()
    program = torch.export.export(model, (torch.randn(2, 3, 4),))
    mod = import_exported_program(program)
    (gru,) = find_grus(mod)
    assert gru.template.input == 4
    _run(opencl, model, mod, program_inputs(program, seed=4))


def test_the_head_of_a_batch_first_layer_is_one_2d_gemm_on_its_output(opencl):
    """``plain_matmul_operands``: the head ``Linear`` on a ``batch_first`` GRU's output, which torch
    decomposes into broadcast copies and a batched matmul of the transposed output, becomes one
    2-D matmul of the GRU's (T·B, H) output, the narrow product transposed after it: no
    ``broadcast_to`` and no transpose of the wide output are left; the model matches float64."""
    torch.manual_seed(5)
    model = FrontEndThenRecurrent("GRU", 4, 9, 6, layers=1).eval()
    program = torch.export.export(model, (torch.randn(3, 5, 4),))
    mod = import_exported_program(program)
    calls = _rewritten_calls(mod)
    assert "relax.broadcast_to" not in [c.op.name for c in calls]
    assert _head_input_shape(mod) == [15, 6]  # the GRU's (T·B, H) output
    transposes = [c for c in calls if c.op.name == "relax.permute_dims" and c.ty.shape is not None]
    assert all(int(c.ty.shape.values[-1]) in (3, 4) for c in transposes)  # of the input (4) or the head's (3)
    _run(opencl, model, mod, program_inputs(program, seed=6))
