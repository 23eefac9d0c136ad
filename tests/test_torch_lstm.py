"""``tvm_ext.torch.LSTM``: nn.LSTM's arguments, weights and forward, against float64.

The reference is ``nn.LSTM`` itself in float64 on the CPU (the same weights).  Without the
``gpu`` marker: argument handling, the weight copy, and calls on CPU tensors (OpenCL on PoCL):
hx, layers, directions, ``batch_first``, ``PackedSequence``, a float32 module stored in
bfloat16 (``precision``), ``torch.compile`` around it and ``torch.export`` (``aten::lstm``).
``gpu``: CUDA tensors in place (float32 and float16), the eager replay of a recorded graph, a
capture in a user's CUDA graph on NaN-poisoned outputs, a ``PackedSequence``, the choice against
``nn.LSTM``, and a float32 shape served in TF32's class with its inputs range-checked, each
rerun."""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from tvm_ext.core.errors import TvmExtError  # noqa: E402
from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.torch import GRU, LSTM  # noqa: E402

from torch_capture import captured, replay_checked  # noqa: E402


def _float64(net: nn.LSTM) -> nn.LSTM:
    return copy.deepcopy(net).cpu().double().eval()


def _reference(net: nn.LSTM, x, hx=None):
    """(out, (h_n, c_n)) of ``net`` in float64 on the CPU (a PackedSequence's out padded)."""
    hx = None if hx is None else tuple(t.detach().double().cpu() for t in hx)
    with torch.no_grad():
        if isinstance(x, nn.utils.rnn.PackedSequence):
            x = nn.utils.rnn.PackedSequence(x.data.double().cpu(), x.batch_sizes, *(
                None if i is None else i.cpu() for i in (x.sorted_indices, x.unsorted_indices)))
            out, state = _float64(net)(x, hx)
            return nn.utils.rnn.pad_packed_sequence(out)[0], state
        return _float64(net)(x.detach().double().cpu(), hx)


def _close(ours, theirs, bound):
    """``ours`` (out, (h_n, c_n)) within ``bound`` of float64's, each output."""
    out, (h_n, c_n) = ours
    ref_out, (ref_h, ref_c) = theirs
    for got, ref in ((out, ref_out), (h_n, ref_h), (c_n, ref_c)):
        assert got.shape == ref.shape
        assert relative_error(got.detach().float().cpu().numpy(), ref.numpy()) < bound


def test_from_module_copies_arguments_and_weights():
    net = nn.LSTM(6, 5, num_layers=2, bidirectional=True, batch_first=True, bias=False)
    lstm = LSTM.from_module(net)
    assert (lstm.input_size, lstm.hidden_size, lstm.num_layers, lstm.bidirectional, lstm.batch_first, lstm.bias) == \
        (6, 5, 2, True, True, False)
    assert set(lstm.state_dict()) == set(net.state_dict())
    for name, value in net.state_dict().items():
        assert torch.equal(lstm.state_dict()[name], value)
    assert not isinstance(lstm, GRU)


@pytest.mark.parametrize("make,needle", [
    (lambda: LSTM(4, 4, dropout=0.5), "tvm_ext.torch.LSTM is for inference: dropout must be 0"),
    (lambda: LSTM(4, 4, proj_size=2), "does not support proj_size"),
    (lambda: LSTM.from_module(nn.LSTM(4, 4, proj_size=2)), "proj_size is not supported"),
    (lambda: LSTM(4, 4, precision={"x": "float16"}), "precision must be one of float32, float16, bfloat16 or None"),
    (lambda: LSTM(4, 4, precision="float8"), "precision must be one of .* got 'float8'"),
    (lambda: LSTM(4, 0), "hidden_size must be a positive integer, got 0"),
    (lambda: LSTM(4, 4, dtype=torch.float64), "dtype torch.float64 is not supported"),
    (lambda: LSTM.from_module(nn.GRU(4, 4)), "takes a torch.nn.LSTM, got GRU"),
    (lambda: GRU.from_module(nn.LSTM(4, 4)), "takes a torch.nn.GRU, got LSTM"),
])
def test_bad_arguments_are_refused(make, needle):
    with pytest.raises(TvmExtError, match=needle):
        make()


def test_bad_inputs_are_refused_on_cpu():
    lstm = LSTM(4, 3)
    x = torch.zeros(2, 1, 4)
    for hx, needle in ((torch.zeros(1, 1, 3), "hx must be a tuple \\(h_0, c_0\\) of two tensors, got Tensor"),
                       ((torch.zeros(1, 1, 3),) * 3, "got tuple of 3"),
                       ((torch.zeros(1, 1, 3), torch.zeros(1, 2, 3)),
                        "h_0 has shape \\(1, 1, 3\\) and c_0 \\(1, 2, 3\\)"),
                       ((torch.zeros(1, 2, 3), torch.zeros(1, 2, 3)), "h_0 and c_0 have shape \\(1, 2, 3\\), "
                                                                      "expected \\(1, 1, 3\\)"),
                       ((torch.zeros(1, 1, 3, dtype=torch.float64), torch.zeros(1, 1, 3)), "LSTM h_0 has dtype"),
                       ((torch.zeros(1, 1, 3), "c"), "LSTM c_0 must be a torch.Tensor")):
        with pytest.raises(TvmExtError, match=needle):
            lstm(x, hx)
    with pytest.raises(TvmExtError, match=r"LSTM input has shape \(2, 1, 5\), expected \(seq, batch, 4\)"):
        lstm(torch.zeros(2, 1, 5))


@pytest.mark.parametrize("kwargs", [dict(num_layers=2, bidirectional=True), dict(batch_first=True, bias=False)],
                         ids=["2L-bi", "batch-first-no-bias"])
def test_cpu_tensors_run_on_opencl(kwargs):
    """Against nn.LSTM in float64, with and without (h_0, c_0), twice (the second call on the
    compiled LSTM the first made)."""
    torch.manual_seed(0)
    net = nn.LSTM(5, 7, **kwargs).eval()
    lstm = LSTM.from_module(net)
    states = net.num_layers * (2 if net.bidirectional else 1)
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(3, 4, 5, generator=g)
        hx = (torch.randn(states, 3 if net.batch_first else 4, 7, generator=g),
              torch.randn(states, 3 if net.batch_first else 4, 7, generator=g))
        _close(lstm(x, hx), _reference(net, x, hx), 1e-5)
        _close(lstm(x), _reference(net, x), 1e-5)
    assert len(lstm.compiled_shapes) == 1


def test_a_float32_module_stored_in_bfloat16_on_opencl():
    """``precision``: float32 in and out, the LSTM stored in bfloat16 (PoCL has no float16): within
    bfloat16's error of float64, not float32's, and not measured against torch (the user chose
    the kernels)."""
    torch.manual_seed(4)
    net = nn.LSTM(6, 9, num_layers=2).eval()
    lstm = LSTM.from_module(net, precision="bfloat16", fallback="measure")
    x, hx = torch.randn(5, 3, 6), (torch.randn(2, 3, 9), torch.randn(2, 3, 9))
    out, (h_n, c_n) = lstm(x, hx)
    assert out.dtype == h_n.dtype == c_n.dtype == torch.float32
    _close((out, (h_n, c_n)), _reference(net, x, hx), 3e-2)
    assert relative_error(out.numpy(), _reference(net, x, hx)[0].numpy()) > 1e-4  # stored in bfloat16
    (key,) = lstm.compiled_shapes
    assert lstm._engines[key].template.dtype == "bfloat16" and not lstm.choices


def test_packed_sequence_with_hx_on_opencl():
    """Unsorted lengths and (h_0, c_0) in the caller's row order, as nn.LSTM takes them."""
    torch.manual_seed(3)
    net = nn.LSTM(5, 6, bidirectional=True).eval()
    lstm = LSTM.from_module(net)
    x, hx = torch.randn(7, 4, 5), (torch.randn(2, 4, 6), torch.randn(2, 4, 6))
    packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([3, 7, 1, 5]), enforce_sorted=False)
    ours, (h_n, c_n) = lstm(packed, hx)
    assert torch.equal(ours.batch_sizes, packed.batch_sizes) and torch.equal(ours.sorted_indices,
                                                                               packed.sorted_indices)
    padded, _ = nn.utils.rnn.pad_packed_sequence(ours)
    _close((padded, (h_n, c_n)), _reference(net, packed, hx), 1e-5)


def test_buckets_serve_calls_of_many_shapes_on_few_compiled_lstms():
    """``buckets`` as the GRU's: seq and batch padded up to their buckets (steps added run as
    variable lengths, so h_n and c_n are each row's last real step), with and without (h_0, c_0),
    batch-first, two bidirectional layers; every output against float64 nn.LSTM."""
    torch.manual_seed(2)
    net = nn.LSTM(5, 6, num_layers=2, bidirectional=True, batch_first=True).eval()
    lstm = LSTM.from_module(net, buckets={"seq": [8, 4], "batch": [4]})
    for seq, batch, with_hx in ((5, 3, True), (8, 4, False), (3, 1, True), (7, 2, False), (10, 3, True)):
        x = torch.randn(batch, seq, 5)
        hx = (torch.randn(4, batch, 6), torch.randn(4, batch, 6)) if with_hx else None
        _close(lstm(x, hx), _reference(net, x, hx), 1e-5)
    assert [(k.batch, k.seq, k.variable_lengths) for k in lstm.compiled_shapes] == \
        [(4, 4, True), (4, 8, False), (4, 8, True), (4, 10, False)]


@pytest.mark.parametrize("winner", ["torch", "tvm_ext"])
def test_the_side_measured_faster_serves_a_shape_on_the_cpu(monkeypatch, winner):
    """``fallback="measure"`` (any device): a shape's first call times ours against ``nn.LSTM``
    (its twin holds the module's weights; hx joined and split around it) and the faster serves
    it, a tensor shape and a ``PackedSequence`` each; torch's side gives nn.LSTM's own bits, ours
    float64's within 1e-5.  The timer is replaced (the dispatch under test, not the clock)."""
    import tvm_ext.torch as tvm_torch

    def per_call_ms(sides, device):
        for call in sides.values():
            call()
        return {name: (1.0 if name == winner else 10.0) for name in sides}

    monkeypatch.setattr(tvm_torch, "per_call_ms", per_call_ms)
    torch.manual_seed(7)
    net = nn.LSTM(5, 6, num_layers=2, bidirectional=True).eval()
    lstm = LSTM.from_module(net, fallback="measure")
    x, hx = torch.randn(4, 3, 5), (torch.randn(4, 3, 6), torch.randn(4, 3, 6))
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(5, 3, 5), torch.tensor([2, 5, 3]), enforce_sorted=False)
    for _ in range(2):  # the second calls: the choices made, not measured again
        got = lstm(x, hx)
        _close(got, _reference(net, x, hx), 1e-5)
        with torch.no_grad():
            theirs = net(x, hx)
        assert torch.equal(got[1][1], theirs[1][1]) == (winner == "torch")
        ours, state = lstm(packed, hx)
        padded, _ = nn.utils.rnn.pad_packed_sequence(ours)
        _close((padded, state), _reference(net, packed, hx), 1e-5)
    assert {c.backend for c in lstm.choices.values()} == {winner} and len(lstm.choices) == 2


class _Model(nn.Module):
    """A front Linear, a 2-layer bidirectional batch-first LSTM with (h_0, c_0), a head Linear."""

    def __init__(self, lstm: nn.Module):
        super().__init__()
        self.front, self.lstm, self.head = nn.Linear(5, 8), lstm, nn.Linear(16, 3)

    def forward(self, x, h0, c0):
        y, (h_n, c_n) = self.lstm(torch.relu(self.front(x)), (h0, c0))
        return self.head(y), h_n, c_n


def _models(device: str = "cpu", fallback: str = "auto"):
    torch.manual_seed(0)
    net = nn.LSTM(8, 8, num_layers=2, bidirectional=True, batch_first=True).eval()
    ours = _Model(net).eval()
    reference = copy.deepcopy(ours).double()
    ours.lstm = LSTM.from_module(net, fallback=fallback)
    return ours.to(device), reference


def _model_inputs(seed: int, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g).to(device) for shape in ((3, 6, 5), (4, 3, 8), (4, 3, 8)))


def test_a_model_around_the_lstm_compiles_as_one_graph_on_opencl():
    """``fullgraph=True`` holds (a graph break would raise): the LSTM is the op ``tvm_ext::lstm``."""
    ours, reference = _models()
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    for seed in (1, 2):
        inputs = _model_inputs(seed)
        with torch.no_grad():
            got, expected = compiled(*inputs), reference(*(t.double() for t in inputs))
        for g, e in zip(got, expected):
            assert g.shape == e.shape and relative_error(g.float().numpy(), e.numpy()) < 1e-5


def test_export_records_aten_lstm():
    """``torch.export`` records nn.LSTM's own op on the module's parameters (a program that runs
    anywhere, and that ``tune model FILE.pt2`` imports as tvm_ext's LSTM), with nn.LSTM's outputs."""
    ours, reference = _models()
    inputs = _model_inputs(4)
    program = torch.export.export(ours, inputs)
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert "aten.lstm.input" in targets and not any("tvm_ext" in t for t in targets)
    with torch.no_grad():
        got, expected = program.module()(*inputs), reference(*(t.double() for t in inputs))
    for g, e in zip(got, expected):
        assert relative_error(g.numpy(), e.numpy()) < 1e-5


# ---- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("kwargs", [dict(input_size=17, hidden_size=33, num_layers=3, bidirectional=True),
                                    dict(input_size=64, hidden_size=128, batch_first=True)],
                         ids=["3L-bi", "batch-first"])
def test_cuda_tensors_in_place_against_float64(kwargs, dtype):
    """Our kernels whatever nn.LSTM measures (``fallback="off"``), a shape rerun, then another
    (another compiled LSTM); with (h_0, c_0)."""
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    net = nn.LSTM(**kwargs).cuda().eval().to(dt)
    lstm = LSTM.from_module(net, fallback="off")
    bound = 1e-5 if dtype == "float32" else 1e-2
    states = net.num_layers * (2 if net.bidirectional else 1)
    for batch, seq in ((5, 9), (5, 9), (2, 4)):
        x = torch.randn(*((batch, seq) if net.batch_first else (seq, batch)), net.input_size, device="cuda").to(dt)
        hx = tuple(torch.randn(states, batch, net.hidden_size, device="cuda").to(dt) for _ in range(2))
        out, (h_n, c_n) = lstm(x, hx)
        assert out.device.type == "cuda" and out.dtype == dt and h_n.dtype == dt
        _close((out, (h_n, c_n)), _reference(net, x, hx), bound)
    lstm.check()


@pytest.mark.gpu
def test_captured_in_a_users_cuda_graph():
    torch.manual_seed(2)
    net = nn.LSTM(96, 96, bidirectional=True).cuda().eval()
    lstm = LSTM.from_module(net, fallback="off")
    static_x = torch.randn(16, 4, 96, device="cuda")
    graph, (out, (h_n, c_n)) = captured(lstm, static_x)
    replay_checked(graph, static_x, (out, h_n, c_n),
                   lambda: _close((out, (h_n, c_n)), _reference(net, static_x), 1e-5))
    lstm.check()


@pytest.mark.gpu
def test_eager_calls_replay_a_recorded_graph_and_packed_input():
    """A shape's second eager call replays the graph its first recorded (``EagerCall``), with and
    without hx, its outputs fresh tensors; a PackedSequence on CUDA; each against float64."""
    torch.manual_seed(5)
    net = nn.LSTM(24, 40, num_layers=2, bidirectional=True).cuda().eval()
    lstm = LSTM.from_module(net, fallback="off")
    outputs = []
    for seed in (1, 2, 3):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(11, 6, 24, generator=g).cuda()
        hx = tuple(torch.randn(4, 6, 40, generator=g).cuda() for _ in range(2))
        for state in (hx, None):
            got = lstm(x, state)
            outputs.append(got[0])
            _close(got, _reference(net, x, state), 1e-5)
    assert outputs[0].data_ptr() != outputs[2].data_ptr()  # copied out of the static outputs
    assert len(lstm._eager_calls) == 2
    x = torch.randn(11, 6, 24, device="cuda")
    packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([11, 3, 7, 1, 11, 5]), enforce_sorted=False)
    for _ in range(2):
        ours, state = lstm(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(ours, total_length=11)
        _close((padded, state), _reference(net, packed), 1e-5)
    lstm.check()


@pytest.mark.gpu
def test_the_first_call_of_a_shape_times_ours_against_nn_lstm():
    """``fallback="auto"``: a shape's first eager call records which side serves it, and every
    call is right whichever side serves (torch's under TF32 off, float32's accuracy)."""
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        ours, reference = _models("cuda")
        for seed in (1, 2):
            inputs = _model_inputs(seed, "cuda")
            with torch.no_grad():
                got, expected = ours(*inputs), reference(*(t.double().cpu() for t in inputs))
            for g, e in zip(got, expected):
                assert relative_error(g.float().cpu().numpy(), e.numpy()) < 1e-5
        (choice,) = ours.lstm.choices.values()
        assert choice.backend in ("tvm_ext", "torch") and choice.ours_ms > 0 and choice.torch_ms > 0


@pytest.mark.gpu
def test_a_float32_shape_served_in_tf32_class_with_its_inputs_range_checked(monkeypatch):
    """Where torch's TF32 call beat our float32 and ours in TF32's class beat torch's (the timer
    says so): float32 in and out, float16 storage inside (TF32's error class against float64,
    not float32's), on eager calls and inside a user's CUDA graph on NaN-poisoned outputs; a c_0
    past what float16 storage holds over the call's steps is reported at the next call, naming
    c_0 and the TF32 flag; with TF32 off the shape is measured again and ours serves it at
    float32's accuracy."""
    import tvm_ext.torch as tvm_torch
    from tvm_ext.torch_fallback import TVM_EXT, TVM_EXT_TF32

    def timer(ms):
        def per_call_ms(sides, device):
            for call in sides.values():
                call()
            return {name: ms[name] for name in sides}
        return per_call_ms

    monkeypatch.setattr(tvm_torch, "per_call_ms", timer({TVM_EXT: 2.0, "torch": 1.0, TVM_EXT_TF32: 0.5}))
    torch.manual_seed(0)
    net = nn.LSTM(256, 256, num_layers=2).cuda().eval()
    lstm = LSTM.from_module(net)
    x = torch.randn(32, 8, 256, device="cuda")
    hx = tuple(torch.randn(2, 8, 256, device="cuda") for _ in range(2))
    ref = _reference(net, x, hx)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=True), torch.no_grad():
        for _ in range(3):  # the first call measures and records, the next replay
            out, (h_n, c_n) = lstm(x, hx)
            assert out.dtype == c_n.dtype == torch.float32
            _close((out, (h_n, c_n)), ref, 1e-3)
            assert relative_error(out.cpu().numpy(), ref[0].numpy()) > 1e-6  # float16 storage
        (choice,) = lstm.choices.values()
        assert choice.backend == TVM_EXT_TF32 and choice.tf32_class_ms == 0.5
        assert [k.tf32_class for k in lstm.compiled_shapes] == [True]  # the float32 LSTM let go
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured, _ = lstm(x, hx)
        captured.fill_(float("nan"))
        graph.replay()
        assert relative_error(captured.cpu().numpy(), ref[0].numpy()) < 1e-3
        lstm(x, (hx[0], hx[1] * 1e5))  # runs; its flag is read at the next call
        with pytest.raises(TvmExtError, match="LSTM c_0 held a value whose .*allow_tf32 = False"):
            lstm(x, hx)
        _close(lstm(x, hx), ref, 1e-3)
    monkeypatch.setattr(tvm_torch, "per_call_ms", timer({TVM_EXT: 1.0, "torch": 2.0}))
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False), torch.no_grad():
        _close(lstm(x, hx), ref, 1e-5)
        assert lstm.choices[tvm_torch.EngineKey(8, 32, False, "cuda:0")].backend == TVM_EXT
    lstm.check()
