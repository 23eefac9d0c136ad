"""torch's own rules that TVM's torch frontend misses, kept by ``tvm_ext.relax.torch_import``:
``cat``'s legacy empty operands and type promotion, runtime checks of values read from tensors,
and a converter failing inside the frontend as one error line; each run on PoCL against torch."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tvm_ext.core.errors import TvmExtError  # noqa: E402
from tvm_ext.relax.torch_import import import_exported_program  # noqa: E402


def _run(module, inputs, opencl):
    from tvm_ext.relax.pipeline import load_model

    program = torch.export.export(module, tuple(inputs))
    model = load_model(import_exported_program(program), opencl, None, function="main", log=None)
    return program, model(*[x.numpy() for x in inputs])


def test_cat_skips_legacy_empty_operands_and_promotes_types(opencl):
    """``cat`` of a ``(0,)`` tensor and 4-D ones (XLM's cache: TVM's converter stopped on the
    ranks) skips it as torch does, and ``cat`` of int32 and float32 gives float32 (TVM's kept
    the first operand's type)."""

    class Model(nn.Module):
        def forward(self, x, i):
            return torch.cat([x.new_zeros(0), x], dim=-2), torch.cat([i, x[0, 0]], dim=0)

    x, i = torch.randn(2, 3, 4, 5), torch.arange(20, dtype=torch.int32).reshape(4, 5)
    _, (joined, promoted) = _run(Model(), [x, i], opencl)
    expected = Model()(x, i)
    np.testing.assert_array_equal(joined, expected[0].numpy())
    assert promoted.dtype == np.float32
    np.testing.assert_array_equal(promoted, expected[1].numpy())


def test_a_runtime_check_of_a_value_read_from_a_tensor_is_dropped_with_the_read(opencl):
    """``torch._check`` on ``item()`` of a tensor (XLM's ``lengths.max() <= slen``): the read and
    its check go, where TVM made the read a host copy the OpenCL executor cannot run; a read the
    model uses otherwise keeps its check."""

    class Model(nn.Module):
        def forward(self, ids):
            longest = (ids != 0).sum(1).max().item()
            torch._check(longest <= ids.shape[1])
            return ids * 2

    ids = torch.tensor([[1, 2, 0], [3, 0, 0]])
    program, (out,) = _run(Model(), [ids], opencl)
    np.testing.assert_array_equal(out, ids.numpy() * 2)
    assert any("_assert_scalar" in str(n.target) for n in program.graph.nodes)  # the user's program kept


def test_a_converter_failing_inside_the_frontend_is_one_error_without_the_builders_warning(monkeypatch, capfd):
    """A converter that raises inside TVM's torch frontend leaves its block builder open; the
    import is one ``TvmExtError`` with the converter's reason, and TVM's C++ warning on freeing
    that builder ('BlockBuilder destroyed with remaining blocks!') is not printed."""
    from tvm_ext.relax import torch_import

    class Model(nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1

    def refuses(*_):
        raise ValueError("this converter refuses")

    program = torch.export.export(Model(), (torch.randn(3, 4),))
    monkeypatch.setitem(torch_import.CONVERTERS, "relu.default", refuses)
    capfd.readouterr()
    with pytest.raises(TvmExtError, match="cannot import the program: this converter refuses"):
        import_exported_program(program)
    assert "BlockBuilder" not in capfd.readouterr().err
