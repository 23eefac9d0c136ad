"""``tvm_ext.torch.GRU`` inside ``torch.compile``: one opaque op (``tvm_ext::gru``) of the user's
graph, no graph break, the same outputs as its eager calls and nn.GRU's float64 reference.

Without the ``gpu`` marker: CPU tensors (PoCL through OpenCL) under ``aot_eager`` (fake tensors
and functionalization, as inductor traces) and inductor itself.  ``gpu``: CUDA tensors under
``mode="reduce-overhead"`` (the GRU recorded inside torch's CUDA graphs) on new inputs."""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.torch import GRU  # noqa: E402


class _Model(nn.Module):
    """A front Linear, a 2-layer bidirectional batch-first GRU with h0, a head Linear."""

    def __init__(self, gru: nn.Module):
        super().__init__()
        self.front, self.gru, self.head = nn.Linear(5, 8), gru, nn.Linear(16, 3)

    def forward(self, x, h0):
        y, h_n = self.gru(torch.relu(self.front(x)), h0)
        return self.head(y), h_n


def _models(device: str = "cpu", fallback: str = "auto"):
    """(ours, the same model on nn.GRU in float64): the same weights."""
    torch.manual_seed(0)
    net = nn.GRU(8, 8, num_layers=2, bidirectional=True, batch_first=True).eval()
    ours = _Model(net).eval()
    reference = copy.deepcopy(ours)
    ours.gru = GRU.from_module(net, fallback=fallback)
    return ours.to(device), reference.double()


def _inputs(seed: int, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, 6, 5, generator=g).to(device), torch.randn(4, 3, 8, generator=g).to(device)


def _against_float64(outputs, reference, x, h0, bound):
    with torch.no_grad():
        expected = reference(x.double().cpu(), h0.double().cpu())
    for ours, ref in zip(outputs, expected):
        assert ours.shape == ref.shape
        assert relative_error(ours.detach().float().cpu().numpy(), ref.numpy()) < bound


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_model_around_the_gru_compiles_as_one_graph_on_opencl(backend):
    ours, reference = _models()
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend=backend, fullgraph=True)  # a graph break would raise
    with torch.no_grad():
        for seed in (1, 2):
            x, h0 = _inputs(seed)
            out = compiled(x, h0)
            _against_float64(out, reference, x, h0, 1e-5)
            eager = ours(x, h0)
            assert torch.equal(out[0], eager[0]) and torch.equal(out[1], eager[1])  # the same kernels


def test_the_gru_is_one_op_of_the_captured_graph():
    ours, _ = _models()
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(ours)(*_inputs(1))
    assert explained.graph_break_count == 0
    ops = [str(node.target) for graph in explained.graphs for node in graph.graph.nodes if node.op == "call_function"]
    assert ops.count("tvm_ext.gru.default") == 1


def test_a_packed_sequence_compiles_on_opencl():
    torch.manual_seed(3)
    net = nn.GRU(5, 6).eval()
    gru = GRU.from_module(net)
    x, h0 = torch.randn(7, 4, 5), torch.randn(1, 4, 6)
    packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([3, 7, 1, 5]), enforce_sorted=False)
    torch._dynamo.reset()
    with torch.no_grad():
        ours, h_n = torch.compile(gru, backend="aot_eager", fullgraph=True)(packed, h0)
        theirs, their_h = net(packed, h0)
    assert isinstance(ours, nn.utils.rnn.PackedSequence)
    assert torch.equal(ours.batch_sizes, theirs.batch_sizes) and torch.equal(ours.unsorted_indices,
                                                                             theirs.unsorted_indices)
    assert relative_error(ours.data.numpy(), theirs.data.numpy()) < 1e-4
    assert relative_error(h_n.numpy(), their_h.numpy()) < 1e-4


def test_a_bad_hx_is_refused_at_compile_time_with_the_modules_message():
    ours, _ = _models()
    x, _ = _inputs(1)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"GRU hx has shape \(2, 3, 8\), expected \(4, 3, 8\)"):
        torch.compile(ours, backend="aot_eager")(x, torch.zeros(2, 3, 8))


def test_a_copy_runs_its_own_weights_when_compiled():
    """The op names its module by a number: a deep copy gets its own, so compiling the copy runs
    the copy's weights, not the original's."""
    gru = GRU(4, 4)
    twin = copy.deepcopy(gru)
    with torch.no_grad():
        twin.weight_hh_l0.mul_(2)
        twin.reload_weights()
        x = torch.randn(3, 2, 4)
        torch._dynamo.reset()
        compiled = torch.compile(twin, backend="aot_eager", fullgraph=True)(x)[0]
        assert torch.equal(compiled, twin(x)[0]) and not torch.equal(compiled, gru(x)[0])


def test_other_lengths_and_batches_run_on_one_compiled_graph():
    """``dynamic=True``: the fake implementation gives symbolic sizes, so one compiled frame takes
    every (seq, batch) (each runs the module's GRU compiled for it), each against float64."""
    import torch._dynamo.testing

    torch.manual_seed(5)
    net = nn.GRU(5, 6, num_layers=2).eval()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    compiled = torch.compile(GRU.from_module(net), backend=counter, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for seq, batch in ((4, 2), (7, 3), (3, 5)):
            x = torch.randn(seq, batch, 5)
            out, h_n = compiled(x)
            ref_out, ref_h = net.double()(x.double())
            net.float()
            assert relative_error(out.numpy(), ref_out.numpy()) < 1e-5
            assert relative_error(h_n.numpy(), ref_h.numpy()) < 1e-5
    assert counter.frame_count == 1


def test_a_compiled_model_with_dynamic_sizes_runs_on_its_buckets_grus():
    """``buckets`` under ``dynamic=True``: one compiled frame, every (seq, batch) served by the
    GRU of its bucket (one compiled GRU for three shapes), each against float64."""
    torch.manual_seed(6)
    net = nn.GRU(5, 6).eval()
    gru = GRU.from_module(net, buckets={"seq": [8], "batch": [4]})
    torch._dynamo.reset()
    compiled = torch.compile(gru, backend="aot_eager", fullgraph=True, dynamic=True)
    with torch.no_grad():
        for seq, batch in ((5, 3), (7, 2), (6, 4)):
            x = torch.randn(seq, batch, 5)
            out, h_n = compiled(x)
            ref_out, ref_h = copy.deepcopy(net).double()(x.double())
            assert relative_error(out.numpy(), ref_out.numpy()) < 1e-5
            assert relative_error(h_n.numpy(), ref_h.numpy()) < 1e-5
    assert [(k.batch, k.seq) for k in gru.compiled_shapes] == [(4, 8)]


def test_torch_export_records_aten_gru_which_tune_model_imports_as_ours(opencl):
    """``torch.export`` of a model holding the module records ``aten::gru`` on its parameters, as
    for ``nn.GRU`` (the op's module number would mean nothing in another process): the program
    runs in torch as the model does, and ``tune model``'s import makes it tvm_ext's GRU again."""
    import numpy as np

    from tvm_ext.relax.pipeline import load_model
    from tvm_ext.relax.relax_gru import find_grus
    from tvm_ext.relax.torch_import import import_exported_program

    ours, reference = _models()
    x, h0 = _inputs(1)
    program = torch.export.export(ours, (x, h0))
    targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert "aten.gru.input" in targets and not any("tvm_ext" in t for t in targets)
    with torch.no_grad():
        _against_float64(program.module()(x, h0), reference, x, h0, 1e-5)
    mod = import_exported_program(program)
    (gru,) = find_grus(mod)
    assert (gru.template.layers, gru.template.bidirectional) == (2, True)
    outputs = load_model(mod, opencl, None, function="main", log=None)(x.numpy(), h0.numpy())
    _against_float64([torch.from_numpy(np.asarray(o.numpy() if hasattr(o, "numpy") else o)) for o in outputs],
                     reference, x, h0, 1e-5)


@pytest.mark.parametrize("packed", [False, True], ids=["tensor", "packed"])
@pytest.mark.parametrize("with_h0", [False, True], ids=["zero-h0", "h0"])
def test_what_export_records_is_nn_grus_computation(packed, with_h0):
    """``as_torch_call`` (what ``torch.export`` records) gives nn.GRU's outputs exactly: the weights
    in nn.GRU's order, h0 into and h_n out of a PackedSequence's sorted row order."""
    from tvm_ext.torch_op import as_torch_call

    torch.manual_seed(6)
    net = nn.GRU(5, 6, bidirectional=True).eval()
    x, h0 = torch.randn(7, 4, 5), torch.randn(2, 4, 6) if with_h0 else None
    if packed:
        x = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([3, 7, 1, 5]), enforce_sorted=False)
    with torch.no_grad():
        out, h_n = as_torch_call(GRU.from_module(net), x, h0)
        theirs, their_h = net(x, h0)
    assert torch.equal(out.data if packed else out, theirs.data if packed else theirs)
    assert torch.equal(h_n, their_h)


def test_torch_records_the_op_in_its_cuda_graphs_and_stops_at_the_packed_one():
    """A tensor input's op is captured in torch's CUDA graphs (no ``cudagraph_unsafe`` tag: its
    kernels replay with the model's); the packed op's padding depends on the batch sizes' values
    (a CPU tensor), so torch's graphs are recorded around it."""
    assert torch.Tag.cudagraph_unsafe not in torch.ops.tvm_ext.gru.default.tags
    assert torch.Tag.cudagraph_unsafe in torch.ops.tvm_ext.gru_packed.default.tags


@pytest.mark.gpu
@pytest.mark.parametrize("fallback, tf32, bound", [("off", True, 1e-5), ("auto", False, 1e-5), ("auto", True, 2e-3)])
def test_reduce_overhead_replays_the_gru_inside_torchs_cuda_graph(fallback, tf32, bound, monkeypatch):
    """``mode="reduce-overhead"``: torch warms the model up, records it whole (the GRU's kernels
    in its graph) and replays it: after the warm-up and recording calls the op's host code runs
    no more.  Each call on new inputs matches float64 (outputs of an earlier call are not
    reused: each is checked before the next call): float32's accuracy with the fallback off or
    cuDNN's TF32 off, TF32's class where the fallback may serve the shape in it."""
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        _reduce_overhead_replays(fallback, bound, monkeypatch)


def _reduce_overhead_replays(fallback, bound, monkeypatch):
    ours, reference = _models("cuda", fallback)
    calls: list[int] = []
    forward = ours.gru.eager_forward
    monkeypatch.setattr(ours.gru, "eager_forward", lambda *args: calls.append(1) or forward(*args))
    torch._dynamo.reset()
    compiled = torch.compile(ours, mode="reduce-overhead", fullgraph=True)
    counts = []
    with torch.no_grad():
        for seed in (1, 2, 3, 4, 5, 6):
            x, h0 = _inputs(seed, "cuda")
            out = compiled(x, h0)
            _against_float64([t.clone() for t in out], reference, x, h0, bound)
            counts.append(len(calls))
    assert counts[0] >= 1 and counts[-1] == counts[-3]  # the last calls were replays of torch's graph
    ours.gru.check()


@pytest.mark.gpu
def test_reduce_overhead_serves_packed_sequences_of_new_lengths():
    """A ``PackedSequence`` is the op torch's graphs stop at: each call's lengths (a CPU tensor)
    decide its padding, so calls of new lengths on one compiled model each match float64."""
    torch.manual_seed(7)
    net = nn.GRU(5, 6, num_layers=2, bidirectional=True).eval()
    gru = GRU.from_module(net, fallback="off").cuda()
    reference = copy.deepcopy(net).double()
    torch._dynamo.reset()
    compiled = torch.compile(gru, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for lengths in ([3, 7, 1, 5], [7, 2, 6, 4], [1, 1, 7, 3], [3, 7, 1, 5]):
            x, h0 = torch.randn(7, 4, 5), torch.randn(4, 4, 6)
            packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=False)
            ours, h_n = compiled(packed.to("cuda"), h0.cuda())
            theirs, their_h = reference(nn.utils.rnn.pack_padded_sequence(x.double(), torch.tensor(lengths),
                                                                           enforce_sorted=False), h0.double())
            assert torch.equal(ours.batch_sizes, theirs.batch_sizes)
            assert relative_error(ours.data.float().cpu().numpy(), theirs.data.numpy()) < 1e-5
            assert relative_error(h_n.float().cpu().numpy(), their_h.numpy()) < 1e-5
    gru.check()
