"""``tvm_ext.torch.GRU``'s fallback to ``torch.nn.GRU``: a shape's first call timed on both
sides, the faster kept for that shape.

Without the ``gpu`` marker (OpenCL, torch's CPU GRU): the rule that decides, which calls are
measured, a measured shape served by the side its times name (the timer replaced where a
test needs torch to win, since on the CPU either side can), weights reloaded into torch's
copy; a ``PackedSequence`` measured as its own shape against torch's packed call.  ``gpu``:
float16 B8 H512, where ours leads, served by ours, and B200 H1536 by the side measured faster
(bit-equal to ``nn.GRU`` where torch serves); both against float64, with and without h0, and
captured in a user's CUDA graph on NaN-poisoned outputs; packed batches served by the side
measured faster; a float32 shape torch serves run as ``nn.GRU`` runs under the user's TF32
flag, measured under each value of it."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tvm_ext.torch as tvm_torch  # noqa: E402
from tvm_ext.core.errors import TvmExtError  # noqa: E402
from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.schedules.gru import gru_reference  # noqa: E402
from tvm_ext.torch import GRU  # noqa: E402
from tvm_ext.torch_fallback import MARGIN, TORCH, TVM_EXT, BackendChoice  # noqa: E402


def _net(**kwargs):
    torch.manual_seed(0)
    return torch.nn.GRU(**{"input_size": 5, "hidden_size": 7, **kwargs}).eval()


def _times(ours_ms, torch_ms):
    """A timer reporting these per-call times (the dispatch under test, not the clock)."""
    def per_call_ms(sides, device):
        for call in sides.values():
            call()
        return {TVM_EXT: ours_ms, TORCH: torch_ms}
    return per_call_ms


def test_torch_is_taken_only_past_the_margin():
    assert BackendChoice.of(1.0, 1.0).backend == TVM_EXT
    assert BackendChoice.of(1.0, 1.0 / (1 + MARGIN) + 1e-6).backend == TVM_EXT
    assert BackendChoice.of(1.0, 1.0 / (1 + MARGIN) - 1e-3).backend == TORCH
    assert BackendChoice.of(0.5, 2.0) == BackendChoice(TVM_EXT, 0.5, 2.0)


def test_a_bad_fallback_is_refused():
    with pytest.raises(TvmExtError, match="fallback must be one of auto, measure, off"):
        GRU(4, 4, fallback="always")


def test_measured_shapes_on_the_cpu_match_nn_gru_and_are_recorded():
    net = _net(num_layers=2, bidirectional=True, batch_first=True)
    gru = GRU.from_module(net, fallback="measure")
    x, h0 = torch.randn(3, 6, 5), torch.randn(4, 3, 7)
    out, h_n = gru(x, h0)
    with torch.no_grad():
        ref_out, ref_h = net(x, h0)
    assert torch.allclose(out, ref_out, atol=1e-5) and torch.allclose(h_n, ref_h, atol=1e-5)
    (key, choice), = gru.choices.items()
    assert (key.batch, key.seq, key.device) == (3, 6, "cpu")
    assert choice.ours_ms > 0 and choice.torch_ms > 0
    assert choice == BackendChoice.of(choice.ours_ms, choice.torch_ms)


@pytest.mark.parametrize("make, reason", [
    (lambda net: GRU.from_module(net), "auto: CUDA calls only"),
    (lambda net: GRU.from_module(net, fallback="off"), "off"),
    (lambda net: GRU.from_module(net, fallback="measure", config={"cell_block": 64}), "a config"),
    (lambda net: GRU.from_module(net, fallback="measure", precision="float32"), "a precision"),
])
def test_calls_the_fallback_does_not_measure(monkeypatch, make, reason):
    monkeypatch.setattr(tvm_torch, "per_call_ms", _times(10.0, 1.0))
    gru = make(_net())
    gru(torch.randn(4, 2, 5))
    assert gru.choices == {}, reason


def _packed(lengths, batch_first=False):
    """A PackedSequence of unsorted ``lengths`` (enforce_sorted off: the sorted and unsorted
    indices both in play) and an h0 for a 1-layer, 7-unit GRU."""
    x = torch.randn(max(lengths), len(lengths), 5)
    h0 = torch.randn(1, len(lengths), 7)
    return torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=False), h0


@pytest.mark.parametrize("winner", [TORCH, TVM_EXT])
def test_packed_input_is_measured_and_served_by_the_faster_side(monkeypatch, winner):
    monkeypatch.setattr(tvm_torch, "per_call_ms", _times(10.0, 1.0) if winner == TORCH else _times(1.0, 10.0))
    net = _net()
    gru = GRU.from_module(net, fallback="measure")
    for lengths in ([3, 5, 2], [5, 1, 4]):  # the second call: the same shape, other lengths, not measured again
        packed, h0 = _packed(lengths)
        out, h_n = gru(packed, h0)
        with torch.no_grad():
            ref_out, ref_h = net(packed, h0)
        assert isinstance(out, torch.nn.utils.rnn.PackedSequence)
        assert torch.equal(out.batch_sizes, ref_out.batch_sizes)
        assert torch.equal(out.unsorted_indices, ref_out.unsorted_indices)
        assert torch.allclose(out.data, ref_out.data, atol=1e-5) and torch.allclose(h_n, ref_h, atol=1e-5)
        # torch's own packed call where torch serves (its bits), ours elsewhere (not its bits)
        assert torch.equal(out.data, ref_out.data) == (winner == TORCH)
        assert torch.equal(h_n, ref_h) == (winner == TORCH)
    (key, choice), = gru.choices.items()
    assert (key.batch, key.seq, key.variable_lengths) == (3, 5, True) and choice.backend == winner
    assert len(gru._engines) == (winner == TVM_EXT)  # where torch serves, our compiled GRU let go
    gru(torch.randn(5, 3, 5))  # the padded shape of the same size is a shape of its own
    assert len(gru.choices) == 2


def test_a_shape_torch_wins_is_served_by_torch_with_the_current_weights(monkeypatch):
    monkeypatch.setattr(tvm_torch, "per_call_ms", _times(10.0, 1.0))
    net = _net(batch_first=True)
    gru = GRU.from_module(net, fallback="measure")
    x = torch.randn(2, 4, 5)
    out, h_n = gru(x)
    with torch.no_grad():
        ref_out, ref_h = net(x)
    assert torch.equal(out, ref_out) and torch.equal(h_n, ref_h)  # torch's own call, not ours
    assert [c.backend for c in gru.choices.values()] == [TORCH]
    assert gru._engines == {}  # our compiled GRU let go
    again, _ = gru(x)
    assert torch.equal(again, ref_out)
    other = _net(batch_first=True, bias=True)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-0.5)
    gru.load_state_dict(other.state_dict())
    with torch.no_grad():
        assert torch.equal(gru(x)[0], other(x)[0])  # torch's copy of the weights reloaded
    ours_elsewhere, _ = gru(torch.randn(3, 4, 5))  # another shape: measured on its own
    assert len(gru.choices) == 2


def test_a_shape_ours_wins_is_served_by_ours(monkeypatch):
    monkeypatch.setattr(tvm_torch, "per_call_ms", _times(1.0, 10.0))
    net = _net()
    gru = GRU.from_module(net, fallback="measure")
    x = torch.randn(4, 2, 5)
    out, _ = gru(x)
    with torch.no_grad():
        ref_out, _ = net(x)
    assert not torch.equal(out, ref_out) and torch.allclose(out, ref_out, atol=1e-5)  # ours: not torch's bits
    assert [c.backend for c in gru.choices.values()] == [TVM_EXT]
    assert len(gru._engines) == 1


def _float64(net, x):
    state = {k: v.detach().double().cpu().numpy() for k, v in net.state_dict().items()}
    return gru_reference(x.detach().double().cpu().numpy(), state, None, net.num_layers, net.bidirectional)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, batch, hidden, backend", [("float16", 200, 1536, None),
                                                            ("float16", 8, 512, TVM_EXT)])
def test_cuda_shapes_are_served_by_the_faster_side(dtype, batch, hidden, backend):
    """float16 B8 H512, where ours leads cuDNN twice over, is ours; B200 H1536, where the two
    were last measured near each other (cuDNN ahead by 8-12 %), is whichever side its first
    call measured faster: torch's bits exactly where torch serves."""
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    net = torch.nn.GRU(hidden, hidden).cuda().eval().to(dt)
    gru = GRU.from_module(net)
    x = torch.randn(128, batch, hidden, device="cuda").to(dt)
    out, h_n = gru(x)
    (choice,) = gru.choices.values()
    assert choice.backend == (backend or choice.backend), choice
    backend = choice.backend
    ref_out, ref_h = _float64(net, x)
    bound = 1e-5 if dtype == "float32" else 1e-2
    assert relative_error(out.float().cpu().numpy(), ref_out) < bound
    assert relative_error(h_n.float().cpu().numpy(), ref_h) < bound
    h0 = torch.randn(1, batch, hidden, device="cuda").to(dt)
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        torch_out, torch_h = net(x, h0)
    for _ in range(2):  # the first call with an h0 records its own graph, the second replays it
        out, h_n = gru(x, h0)
        assert torch.equal(out, torch_out) == (backend == TORCH)  # torch's bits only where torch serves
        assert relative_error(h_n.float().cpu().numpy(), torch_h.double().cpu().numpy()) < bound
    graph = torch.cuda.CUDAGraph()  # inside a user's capture: the chosen side launched directly
    with torch.cuda.graph(graph):
        captured, _ = gru(x, h0)
    captured.fill_(float("nan"))
    graph.replay()
    assert relative_error(captured.float().cpu().numpy(), torch_out.double().cpu().numpy()) < bound


@pytest.mark.gpu
@pytest.mark.parametrize("batch, hidden", [(192, 1024), (8, 512)])
def test_cuda_packed_input_is_served_by_the_measured_side(batch, hidden):
    """float16 packed batches, lengths in [64, 128] unsorted: whichever side the first call
    measured faster serves every call of the shape, torch's bits exactly where torch serves,
    both within float16's bound of float64, h0 in the caller's row order."""
    torch.manual_seed(0)
    net = torch.nn.GRU(hidden, hidden).cuda().eval().half()
    gru = GRU.from_module(net)
    for call in range(3):
        lengths = torch.randint(64, 129, (batch,))
        lengths[call % batch] = 128
        x = torch.randn(128, batch, hidden, device="cuda").half()
        h0 = torch.randn(1, batch, hidden, device="cuda").half()
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        out, h_n = gru(packed, h0)
        with torch.no_grad():
            theirs, their_h = net(packed, h0)
        (choice,) = gru.choices.values()
        print(f"B{batch} H{hidden} packed: {choice}")
        assert torch.equal(out.data, theirs.data) == (choice.backend == TORCH), choice
        padded, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=128)
        state = {k: v.detach().double().cpu().numpy() for k, v in net.state_dict().items()}
        ref_out, ref_h = gru_reference(x.double().cpu().numpy(), state, h0.double().cpu().numpy(),
                                       lengths=lengths.numpy())
        assert relative_error(padded.float().cpu().numpy(), ref_out) < 1e-2
        assert relative_error(h_n.float().cpu().numpy(), ref_h) < 1e-2


@pytest.mark.gpu
def test_torch_serves_a_float32_shape_as_nn_gru_runs_under_the_users_tf32_flag(monkeypatch):
    """torch's side of a float32 shape is ``nn.GRU`` under the user's cuDNN flags: where torch
    serves (the timer says it is faster), each call's output is ``nn.GRU``'s own under the flag
    of the moment, bit for bit, TF32 (torch's default) and not; the choice records the flag and
    is made again when the flag changes."""
    monkeypatch.setattr(tvm_torch, "per_call_ms", _times(2.0, 1.0))
    torch.manual_seed(0)
    net = torch.nn.GRU(512, 512).cuda().eval()
    gru = GRU.from_module(net)
    x = torch.randn(64, 8, 512, device="cuda")
    outputs = {}
    for tf32 in (True, False, True):
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32), torch.no_grad():
            for _ in range(2):  # the first call records torch's graph, the second replays it
                out, h_n = gru(x)
                theirs, their_h = net(x)
                assert torch.equal(out, theirs) and torch.equal(h_n, their_h)
        (choice,) = gru.choices.values()
        assert choice.backend == TORCH and choice.torch_tf32 is tf32
        outputs[tf32] = out
    assert not torch.equal(outputs[True], outputs[False])  # TF32 did run where it was allowed
