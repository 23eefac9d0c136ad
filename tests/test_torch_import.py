"""``torch.export`` programs imported with their ``nn.GRU`` layers on tvm_ext's GRU
(``tvm_ext.relax.torch_import``), run on PoCL against torch in float64: layers, bidirectional,
batch_first, a given h0, no bias; ``tune model FILE.pt2``; the refusals.  Needs torch (the
test extra installs the CPU build)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tvm_ext.core.errors import TvmExtError  # noqa: E402
from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.relax.relax_gru import find_grus  # noqa: E402
from tvm_ext.relax.torch_import import import_exported_program, load_exported_program, program_inputs  # noqa: E402


class GruThenLinear(nn.Module):
    def __init__(self, with_h0: bool, **gru):
        super().__init__()
        self.gru, self.with_h0 = nn.GRU(**gru), with_h0
        self.fc = nn.Linear(self.gru.hidden_size * (2 if self.gru.bidirectional else 1), 3)

    def forward(self, x, h0=None):
        y, h_n = self.gru(x, h0) if self.with_h0 else self.gru(x)
        return self.fc(y), h_n


CASES = {
    "2L-bi-batch-first": dict(input_size=7, hidden_size=13, num_layers=2, bidirectional=True, batch_first=True),
    "h0-no-bias": dict(input_size=5, hidden_size=9, bias=False),
}


def _export(case, seed=0):
    torch.manual_seed(seed)
    kwargs = dict(CASES[case])
    with_h0 = case.startswith("h0")
    model = GruThenLinear(with_h0, **kwargs).eval()
    x = torch.randn(*((3, 6) if kwargs.get("batch_first") else (6, 3)), kwargs["input_size"])
    args = (x, torch.randn(model.gru.num_layers * (2 if model.gru.bidirectional else 1), 3, kwargs["hidden_size"])) \
        if with_h0 else (x,)
    return model, torch.export.export(model, args)


@pytest.mark.parametrize("case", list(CASES))
def test_exported_gru_runs_on_tvm_ext_gru_against_float64(opencl, case):
    from tvm_ext.relax.pipeline import load_model

    model, program = _export(case)
    mod = import_exported_program(program)
    (gru,) = find_grus(mod)  # the GRU is one placeholder (TVM's frontend alone unrolls one layer or refuses)
    assert (gru.template.layers, gru.template.bidirectional) == (model.gru.num_layers, model.gru.bidirectional)
    inputs = program_inputs(program, seed=1)
    outputs = load_model(mod, opencl, None, function="main", log=None)(*inputs)
    with torch.no_grad():
        reference = model.double()(*(torch.from_numpy(a).double() for a in inputs))
    for ours, ref in zip(outputs, reference):
        ours = np.asarray(ours.numpy() if hasattr(ours, "numpy") else ours)
        assert ours.shape == tuple(ref.shape) and relative_error(ours, ref.numpy()) < 1e-5


class LstmThenLinear(nn.Module):
    def __init__(self, with_states: bool, **lstm):
        super().__init__()
        self.lstm, self.with_states = nn.LSTM(**lstm), with_states
        self.fc = nn.Linear(self.lstm.hidden_size * (2 if self.lstm.bidirectional else 1), 3)

    def forward(self, x, h0=None, c0=None):
        y, (h_n, c_n) = self.lstm(x, (h0, c0)) if self.with_states else self.lstm(x)
        return self.fc(y), h_n, c_n


@pytest.mark.parametrize("kwargs, states", [
    (dict(input_size=7, hidden_size=13, num_layers=2, bidirectional=True, batch_first=True), False),
    (dict(input_size=5, hidden_size=9, bias=False), True),
])
def test_exported_lstm_runs_on_tvm_ext_lstm_against_float64(opencl, kwargs, states):
    """``nn.LSTM`` in a program: one tvm_ext LSTM placeholder (layers and directions in it), run on
    PoCL against the model in float64; ``proj_size`` is refused naming it."""
    from tvm_ext.relax.pipeline import load_model

    torch.manual_seed(0)
    model = LstmThenLinear(states, **kwargs).eval()
    x = torch.randn(*((3, 6) if kwargs.get("batch_first") else (6, 3)), kwargs["input_size"])
    shape = (model.lstm.num_layers * (2 if model.lstm.bidirectional else 1), 3, kwargs["hidden_size"])
    program = torch.export.export(model, (x, torch.randn(shape), torch.randn(shape)) if states else (x,))
    mod = import_exported_program(program)
    (lstm,) = find_grus(mod)
    assert lstm.template.name == "lstm" and lstm.template.layers == model.lstm.num_layers
    inputs = program_inputs(program, seed=1)
    outputs = load_model(mod, opencl, None, function="main", log=None)(*inputs)
    with torch.no_grad():
        reference = model.double()(*(torch.from_numpy(a).double() for a in inputs))
    for ours, ref in zip(outputs, reference):
        ours = np.asarray(ours.numpy() if hasattr(ours, "numpy") else ours)
        assert ours.shape == tuple(ref.shape) and relative_error(ours, ref.numpy()) < 1e-5
    projected = torch.export.export(nn.LSTM(4, 6, proj_size=3).eval(), (torch.randn(2, 1, 4),))
    with pytest.raises(TvmExtError, match="proj_size is not supported"):
        import_exported_program(projected)


def test_training_mode_dropout_is_refused():
    model = nn.GRU(4, 6, num_layers=2, dropout=0.5).train()
    program = torch.export.export(model, (torch.randn(3, 2, 4),))
    with pytest.raises(TvmExtError, match="training mode with dropout=0.5"):
        import_exported_program(program)


def test_a_file_that_is_not_a_program_is_one_error(tmp_path):
    path = tmp_path / "m.pt2"
    path.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(TvmExtError, match="is not a torch.export program"):
        load_exported_program(str(path))


def test_tune_model_takes_a_pt2_file(tmp_path):
    """``tune model FILE.pt2``: the GRU is one tuned task, the model runs on PoCL and is checked
    against the program run by torch."""
    import subprocess
    import sys

    _, program = _export("2L-bi-batch-first")
    path = tmp_path / "model.pt2"
    torch.export.save(program, str(path))
    cmd = [sys.executable, "-m", "tvm_ext.tune", "model", str(path), "--generations", "1", "--population", "2",
           "--no-progress", "--records", str(tmp_path / "r.jsonl"), "--database", str(tmp_path / "db")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "tuned (GRU plan)" in p.stdout and "ran: output (3, 6, 3), (4, 3, 13)" in p.stdout, p.stdout
    bad = tmp_path / "bad.pt2"
    bad.write_text("not a program")
    p = subprocess.run(cmd[:4] + [str(bad)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().startswith("error:") and "Traceback" not in p.stderr, p.stderr


class _Keyed(nn.Module):
    """A model called with keyword inputs, as transformers' models are exported
    (``torch.export.export(model, (), {"input_ids": ..., "attention_mask": ...})``)."""

    def forward(self, input_ids, attention_mask=None, x=None):
        return (input_ids * attention_mask).float() + x.sum(), x * 2


def test_a_program_exported_with_keyword_inputs_is_checked_against_torch(tmp_path, opencl):
    """``tune model``'s check runs the program with the inputs as it was called: keyword inputs
    by name (``reference()`` once passed them by position and torch refused: "kwarg keyword
    mismatch"), matching the imported model's outputs on PoCL."""
    from tvm_ext.cli.model_cli import ExportedProgramModel
    from tvm_ext.relax.pipeline import load_model

    keyed = {"input_ids": torch.tensor([[3, 1, 4]]), "attention_mask": torch.tensor([[1, 1, 0]]),
             "x": torch.randn(2, 3)}
    path = tmp_path / "keyed.pt2"
    torch.export.save(torch.export.export(_Keyed(), (), keyed), str(path))
    user = ExportedProgramModel(str(path))
    inputs = user.get_inputs()
    reference = user.reference(inputs)
    with torch.no_grad():
        expected = _Keyed()(**{name: torch.from_numpy(a) for name, a in zip(keyed, inputs)})
    for ours, theirs in zip(reference, expected, strict=True):
        np.testing.assert_array_equal(ours, theirs.numpy())
    outputs = load_model(user.get_module(), opencl, None, function="main", log=None)(*inputs)
    for ours, theirs in zip(outputs, reference, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_the_torch_import_keeps_matmuls_in_their_operands_type(dtype):
    """TVM 0.27's torch frontend gives mm/bmm/addmm a float32 result whatever the operands (a
    float16 BERT failed adding the float16 bias); the importer's converters keep the operands'
    type, and compute the same numbers (run here on the CPU)."""
    import types

    import tvm
    from tvm import relax

    from tvm_ext.relax import torch_import

    rng = np.random.default_rng(0)
    values = {"bias": rng.standard_normal(3), "a": rng.standard_normal((4, 8)), "b": rng.standard_normal((8, 3)),
              "p": rng.standard_normal((2, 4, 8)), "q": rng.standard_normal((2, 8, 3))}
    params = {k: relax.Var(k, relax.TensorType(v.shape, dtype)) for k, v in values.items()}
    bb = relax.BlockBuilder()
    with bb.function("main", list(params.values())):
        with bb.dataflow():
            importer = types.SimpleNamespace(env=params, block_builder=bb,
                                             retrieve_args=lambda node: [params[a] for a in node.args])
            addmm = torch_import._addmm_in_operand_type(types.SimpleNamespace(args=("bias", "a", "b"),
                                                                      kwargs={"alpha": 2.0, "beta": 0.5}), importer)
            bmm = torch_import._matmul_in_operand_type(types.SimpleNamespace(args=("p", "q"), kwargs={}), importer)
            assert str(addmm.ty.dtype) == str(bmm.ty.dtype) == dtype
            out = bb.emit_output(relax.Tuple([addmm, bmm]))
        bb.emit_func_output(out)
    exe = tvm.compile(bb.get(), target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(v.astype(dtype)) for v in values.values()])
    v = {k: x.astype(dtype).astype(np.float64) for k, x in values.items()}
    tol = 1e-2 if dtype == "float16" else 1e-5
    np.testing.assert_allclose(got[0].numpy(), 0.5 * v["bias"] + 2.0 * v["a"] @ v["b"], rtol=tol, atol=tol)
    np.testing.assert_allclose(got[1].numpy(), v["p"] @ v["q"], rtol=tol, atol=tol)


def test_a_float16_program_with_linear_layers_stays_float16_and_runs(opencl):
    """A ``Linear`` on 3-D input (``addmm``/``mm`` after torch's decomposition): in float16 the
    frontend's own converters made float32 results and failed adding the float16 bias; the
    import keeps every tensor float16 and it compiles for CUDA (PoCL has no float16); the same
    model in float32 goes through the same converters and matches float64 on PoCL."""
    from tvm_ext.relax.pipeline import build_model, compile_relax, load_model
    from tvm_ext.target import offline_cuda

    class TwoLinears(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(6, 5), nn.Linear(5, 4)

        def forward(self, x):
            return self.b(torch.relu(self.a(x))).sum(dim=1)

    torch.manual_seed(0)
    half = TwoLinears().half().eval()
    mod = import_exported_program(torch.export.export(half, (torch.randn(3, 7, 6).half(),)))
    assert "float32" not in mod["main"].script() and "float16" in mod["main"].script()
    cuda = offline_cuda()
    build_model(compile_relax(mod, cuda, None, log=None), cuda)
    model = half.float()
    program = torch.export.export(model, (torch.randn(3, 7, 6),))
    (x,) = program_inputs(program, seed=1)
    out = load_model(import_exported_program(program), opencl, None, function="main", log=None)(x)
    out = np.asarray(out.numpy() if hasattr(out, "numpy") else out)
    with torch.no_grad():
        reference = model.double()(torch.from_numpy(x).double()).numpy()
    assert relative_error([out], [reference]) < 1e-5


@pytest.mark.parametrize("index", [-1, -3, 2])
def test_a_negative_index_selects_from_the_end(opencl, index):
    """``out[:, -1]`` (a classifier's last step) is ``select.int`` with a negative index: TVM's
    frontend makes it a ``take`` in fast mode, which reads before the row (wrong numbers here,
    an illegal address on CUDA); the import selects from the end, as torch does."""
    from tvm_ext.pipeline import load_model

    class LastStep(nn.Module):
        def forward(self, x):
            return x[:, index] * 2.0

    model = LastStep().eval()
    program = torch.export.export(model, (torch.randn(3, 5, 4),))
    mod = import_exported_program(program)
    (x,) = program_inputs(program, seed=1)
    (out,) = load_model(mod, opencl, None, function="main", log=None)(x)
    np.testing.assert_array_equal(np.asarray(out.numpy() if hasattr(out, "numpy") else out), 2.0 * x[:, index])


def test_an_output_class_of_a_known_package_is_registered_on_load(tmp_path, monkeypatch):
    """A program whose output is a class torch reads back only once its package registered it
    (transformers' ``ModelOutput``): refused with the class named, and loaded where the package
    is one ``torch_import`` imports for its output classes."""
    import sys
    import textwrap

    from tvm_ext.relax import torch_import

    (tmp_path / "outpkg").mkdir()
    (tmp_path / "outpkg" / "__init__.py").write_text("")
    (tmp_path / "outpkg" / "outputs.py").write_text(textwrap.dedent('''
        import dataclasses
        import torch

        @dataclasses.dataclass
        class Out:
            y: torch.Tensor

        torch.export.register_dataclass(Out, serialized_type_name="outpkg.outputs.Out")
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    import outpkg.outputs

    class Doubles(nn.Module):
        def forward(self, x):
            return outpkg.outputs.Out(x * 2)

    path = str(tmp_path / "m.pt2")
    torch.export.save(torch.export.export(Doubles(), (torch.randn(2, 3),)), path)
    torch.utils._pytree._deregister_pytree_node(outpkg.outputs.Out)  # as a fresh process has it
    monkeypatch.delitem(sys.modules, "outpkg.outputs")
    with pytest.raises(TvmExtError, match="output type outpkg.outputs.Out is not known to torch here"):
        load_exported_program(path)
    monkeypatch.setattr(torch_import, "_OUTPUT_PACKAGES", ("outpkg",))
    program = load_exported_program(path)
    assert "outpkg.outputs" in sys.modules and program.module()(torch.ones(2, 3)).y.tolist() == [[2.0] * 3] * 2
    from tvm_ext.cli.model_cli import ExportedProgramModel  # the check's reference: the class's fields, flat

    (reference,) = ExportedProgramModel(path).reference([np.ones((2, 3), np.float32)])
    np.testing.assert_array_equal(reference, np.full((2, 3), 2.0))


def test_an_embedding_id_past_the_table_reads_inside_it(opencl):
    """Token ids past the table (torch raises) read its last row, never outside it: TVM's own
    converter reads out of bounds there, an illegal address on CUDA."""
    from tvm_ext.relax.pipeline import load_model

    torch.manual_seed(0)
    model = nn.Embedding(10, 4).eval()
    mod = import_exported_program(torch.export.export(model, (torch.tensor([[1, 9, 3]]),)))
    from tvm_ext.relax.relax_rewrites import rewrite_model

    assert 'mode="clip"' in rewrite_model(mod)["main"].script()  # as every model is compiled
    run = load_model(mod, opencl, None, function="main", log=None)
    weight = model.weight.detach().numpy()
    (inside,) = run(np.array([[1, 9, 3]], np.int64))
    (past,) = run(np.array([[12, 1000000, 3]], np.int64))
    np.testing.assert_array_equal(np.asarray(inside), weight[[[1, 9, 3]]])
    np.testing.assert_array_equal(np.asarray(past), weight[[[9, 9, 3]]])


def test_an_operator_with_side_effects_is_refused_by_name():
    """``linalg.inv`` decomposes into an error check torch runs with an effect token, which TVM's
    frontend refuses as "Unsupported input kind: InputKind.TOKEN"; the refusal names the operator."""
    class Inverts(nn.Module):
        def forward(self, x):
            return torch.linalg.inv(x) * 2

    program = torch.export.export(Inverts(), (torch.randn(3, 3),))
    with pytest.raises(TvmExtError, match=r"side effects.*_linalg_check_errors.*\(from aten\.linalg_inv"):
        import_exported_program(program)


class _Unconverted(nn.Module):
    """Two operators TVM's torch frontend has no converter for (``i0``, ``logcumsumexp``)."""

    def forward(self, x):
        y = torch.special.i0(x) + 1
        return torch.logcumsumexp(y, 0)


def test_an_operator_no_converter_takes_is_refused_naming_its_node_and_line():
    program = torch.export.export(_Unconverted(), (torch.randn(4, 8),))
    with pytest.raises(TvmExtError, match=r"^node 'i0' \(aten\.i0\.default, test_torch_import\.py:\d+ in forward\) "
                                          r"and 1 more node\(s\) of \['i0\.default', 'logcumsumexp\.default'\]: "
                                          r"no converter in TVM's torch frontend$"):
        import_exported_program(program)


@torch.library.custom_op("tvm_ext_test::grouped_mm_fallback", mutates_args=())
def _grouped_mm_fallback(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Stands in for transformers' MoE experts op of that name (the refusal names it, not its body)."""
    return x @ w


@_grouped_mm_fallback.register_fake
def _(x, w):
    return x.new_empty(x.shape[0], w.shape[1])


def test_a_transformers_mixture_of_experts_is_refused_with_the_export_that_runs():
    """Transformers' default MoE experts (``grouped_mm_fallback``): the refusal says how to export
    the model so it imports (its ``batched_mm`` experts are plain batched matmuls)."""
    class Experts(nn.Module):
        def forward(self, x, w):
            return _grouped_mm_fallback(x, w)

    program = torch.export.export(Experts(), (torch.randn(3, 4), torch.randn(4, 5)))
    with pytest.raises(TvmExtError, match=r"no converter in TVM's torch frontend \(a transformers mixture of "
                                          r"experts: export it with experts_implementation=\"batched_mm\"\)$"):
        import_exported_program(program)


def test_tune_model_refuses_an_unconverted_operator_of_a_pt2_in_one_line(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(_Unconverted(), (torch.randn(4, 8),)), str(path))
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "model", str(path), "--no-progress"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith(f"error: {path}: node 'i0' (aten.i0.default, test_torch_import.py:")
    assert line.endswith("no converter in TVM's torch frontend")


def test_example_inputs_attend_where_a_mask_is_named():
    """tune model's example inputs: ids zero (valid in any table), a mask named as one ones (zeros
    would hide every key from attention), floats random."""
    class Masked(nn.Module):
        def forward(self, input_ids, attention_mask, x):
            return x * attention_mask + input_ids

    args = (torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3, dtype=torch.int64), torch.randn(2, 3))
    ids, mask, x = program_inputs(torch.export.export(Masked(), args), seed=1)
    assert not ids.any() and mask.all() and x.dtype == np.float32 and x.std() > 0
