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
flag, measured under each value of it; a float32 shape served by ours in TF32's class where
torch's TF32 call beat our float32, its inputs range-checked.  Without a GPU also the rule of
that class and what it serves and lets go (a CUDA shape's bookkeeping, the timer replaced)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tvm_ext.torch as tvm_torch  # noqa: E402
from tvm_ext.core.errors import TvmExtError  # noqa: E402
from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.schedules.gru import gru_reference  # noqa: E402
from tvm_ext.torch import GRU  # noqa: E402
from tvm_ext.schedules.gru.split import FLOAT16_MAX  # noqa: E402
from tvm_ext.torch_fallback import MARGIN, TORCH, TVM_EXT, TVM_EXT_TF32, BackendChoice, float16_input_limit  # noqa: E402


def _net(**kwargs):
    torch.manual_seed(0)
    return torch.nn.GRU(**{"input_size": 5, "hidden_size": 7, **kwargs}).eval()


def _times(ours_ms, torch_ms, tf32_class_ms=None):
    """A timer reporting these per-call times (the dispatch under test, not the clock); ours
    in TF32's class as slow as ours unless given."""
    ms = {TVM_EXT: ours_ms, TORCH: torch_ms, TVM_EXT_TF32: ours_ms if tf32_class_ms is None else tf32_class_ms}

    def per_call_ms(sides, device):
        for call in sides.values():
            call()
        return {name: ms[name] for name in sides}
    return per_call_ms


def test_torch_is_taken_only_past_the_margin():
    assert BackendChoice.of(1.0, 1.0).backend == TVM_EXT
    assert BackendChoice.of(1.0, 1.0 / (1 + MARGIN) + 1e-6).backend == TVM_EXT
    assert BackendChoice.of(1.0, 1.0 / (1 + MARGIN) - 1e-3).backend == TORCH
    assert BackendChoice.of(0.5, 2.0) == BackendChoice(TVM_EXT, 0.5, 2.0)


def test_ours_in_tf32_class_against_the_side_chosen_with_the_margin_toward_accuracy_or_ours():
    torch_won = BackendChoice.of(2.0, 1.0, torch_tf32=True)
    assert torch_won.with_tf32_class(0.5, 1.0) == BackendChoice(TVM_EXT_TF32, 2.0, 1.0, True, 0.5)
    assert torch_won.with_tf32_class(1.0, 1.0).backend == TVM_EXT_TF32  # ours where near, as against torch
    assert torch_won.with_tf32_class(1.0 + 2 * MARGIN, 1.0).backend == TORCH
    ours_won = BackendChoice.of(1.0, 2.0, torch_tf32=True)
    assert ours_won.with_tf32_class(0.5, 1.0) == BackendChoice(TVM_EXT_TF32, 1.0, 2.0, True, 0.5)
    assert ours_won.with_tf32_class(1.0 / (1 + 2 * MARGIN), 1.0).backend == TVM_EXT_TF32
    assert ours_won.with_tf32_class(1.0, 1.0).backend == TVM_EXT  # float32's accuracy where near
    assert ours_won.with_tf32_class(1.0 / (1 + MARGIN / 2), 1.0) == BackendChoice(TVM_EXT, 1.0, 2.0, True,
                                                                                  1.0 / (1 + MARGIN / 2))


def test_float16_input_limit_is_where_an_input_gemm_product_would_pass_float16():
    """The limit is the largest |x| for which every row's worst product, Σ|W_ih|·|x| + |b_ih|
    (x of each weight's sign), stays within float16; a layer or direction whose rows are
    heavier sets it, rows of zeros do not, and it is never past what float16 holds."""
    rng = np.random.default_rng(0)
    light, bias = rng.uniform(-0.1, 0.1, (12, 5)), rng.uniform(-0.5, 0.5, 12)
    heavy = rng.uniform(-2.0, 2.0, (12, 4))

    def worst(w, b, x):
        return float((np.abs(w).sum(axis=1) * x + (np.abs(b) if b is not None else 0.0)).max())

    limit = float16_input_limit([(light, bias), (heavy, None)])
    assert max(worst(light, bias, limit), worst(heavy, None, limit)) == pytest.approx(FLOAT16_MAX, rel=1e-12)
    assert max(worst(light, bias, limit * 1.001), worst(heavy, None, limit * 1.001)) > FLOAT16_MAX
    assert float16_input_limit([(light, bias)]) > limit  # the heavy layer set it
    assert float16_input_limit([(np.zeros((3, 2)), np.ones(3)), (light * 1e-9, None)]) == FLOAT16_MAX


OURS_OUT = torch.linspace(-1.0, 1.0, 64)
TF32_OUT = OURS_OUT * (1 + 3e-4)  # off ours by TF32's error class
FLOAT32_OUT = OURS_OUT * (1 + 1e-6)  # float32's math (cuDNN's at small sizes)
PAIR = ["ours", "torch"]


@pytest.mark.parametrize("tf32, times, torch_out, backend, timed, kept", [
    # torch's TF32 call beat our float32 and ours in TF32's class beat torch: it serves
    (True, (2.0, 1.0, 0.5), TF32_OUT, TVM_EXT_TF32, PAIR + PAIR + ["tf32", "torch"], {"tf32"}),
    # ... and torch beat it too: torch serves, both of ours let go
    (True, (2.0, 1.0, 1.5), TF32_OUT, TORCH, PAIR + PAIR + ["tf32", "torch"], set()),
    # our float32 beat torch's call, and ours in TF32's class beat our float32 past the margin
    (True, (1.0, 2.0, 0.5), TF32_OUT, TVM_EXT_TF32, PAIR + PAIR + ["tf32", "ours"], {"tf32"}),
    # ... not past it: float32's accuracy kept
    (True, (1.0, 2.0, 0.99), TF32_OUT, TVM_EXT, PAIR + PAIR + ["tf32", "ours"], {"float32"}),
    # torch's call was float32-accurate (cuDNN ran float32's math): no TF32-class side
    (True, (2.0, 1.0, 0.5), FLOAT32_OUT, TORCH, PAIR + PAIR, set()),
    # TF32 off: no TF32-class side
    (False, (2.0, 1.0, 0.5), TF32_OUT, TORCH, PAIR, set()),
])
def test_a_float32_cuda_shape_is_timed_in_tf32_class_where_torch_had_its_error(monkeypatch, tf32, times, torch_out,
                                                                             backend, timed, kept):
    """A float32 shape's first call: ours and torch's timed; where torch's output is off ours by
    TF32's error, ours in TF32's class timed against the faster of them and taken where faster
    still (past the margin against our float32); the compiled GRUs no choice serves let go.  A
    CUDA shape's bookkeeping on the CPU (the timer replaced, sentinels for the compiled GRUs: no
    CUDA call is made)."""
    def side(name, out=OURS_OUT):
        return lambda: calls.append(name) or (out, out[:4])

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # no CUDA here
    monkeypatch.setattr(tvm_torch, "per_call_ms", _times(*times[:2], tf32_class_ms=times[2]))
    key = tvm_torch.EngineKey(2, 3, False, "cuda:0")
    engines = {"float32": key, "tf32": dataclasses.replace(key, tf32_class=True)}
    gru = GRU.from_module(_net(), fallback="measure")
    gru._engines.update({k: object() for k in engines.values()})
    calls = []
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        assert gru._backend(key, side("ours"), side("torch", torch_out), "cpu", side("tf32")) == backend
        (choice,) = gru.choices.values()
    assert calls == timed  # timed, outputs compared, the TF32-class side timed against the faster
    assert choice.tf32_class_ms == (times[2] if "tf32" in timed else None) and choice.torch_tf32 is tf32
    assert set(gru._engines) == {engines[name] for name in kept}


def test_a_tf32_class_gru_serving_a_shape_under_tf32_is_kept_when_torch_serves_it_with_tf32_off(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # no CUDA here
    key = tvm_torch.EngineKey(2, 3, False, "cuda:0")
    tf32_key = dataclasses.replace(key, tf32_class=True)
    gru = GRU.from_module(_net(), fallback="measure")
    gru._engines.update({key: object(), tf32_key: object()})
    monkeypatch.setattr(tvm_torch, "per_call_ms", _times(2.0, 1.0, tf32_class_ms=0.5))
    sides = (lambda: (OURS_OUT, OURS_OUT), lambda: (TF32_OUT, TF32_OUT), "cpu", lambda: (OURS_OUT, OURS_OUT))
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=True):
        assert gru._backend(key, *sides) == TVM_EXT_TF32
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        assert gru._backend(key, *sides) == TORCH
    assert set(gru._engines) == {tf32_key}


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
            (choice,) = gru.choices.values()  # the choice of the flag of the moment
        assert choice.backend == TORCH and choice.torch_tf32 is tf32
        outputs[tf32] = out
    assert not torch.equal(outputs[True], outputs[False])  # TF32 did run where it was allowed


@pytest.mark.gpu
def test_a_float32_shape_served_in_tf32_class_with_its_inputs_range_checked(monkeypatch):
    """Where torch's TF32 call beat our float32 and ours in TF32's class beat torch's (the timer
    says so): float32 in and out, float16 storage inside (an error of TF32's class against
    float64, not float32's, and not torch's bits), on eager calls and replays, inside a user's
    CUDA graph on a NaN-poisoned output; an input past what its input GEMM's float16 products
    hold is reported at the next call, naming the TF32 flag; with TF32 off the shape is measured
    again and ours serves it at float32 accuracy."""
    monkeypatch.setattr(tvm_torch, "per_call_ms", _times(2.0, 1.0, tf32_class_ms=0.5))
    torch.manual_seed(0)
    net = torch.nn.GRU(512, 512, num_layers=2).cuda().eval()
    gru = GRU.from_module(net)
    x = torch.randn(64, 8, 512, device="cuda")
    ref_out, ref_h = _float64(net, x)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=True), torch.no_grad():
        for _ in range(3):  # the first call measures and records, the next replay
            out, h_n = gru(x)
            assert out.dtype == torch.float32
            assert 1e-6 < relative_error(out.cpu().numpy(), ref_out) < 1e-3
            assert relative_error(h_n.cpu().numpy(), ref_h) < 1e-3
        theirs, _ = net(x)
        assert not torch.equal(out, theirs)
        (choice,) = gru.choices.values()
        assert choice.backend == TVM_EXT_TF32 and choice.tf32_class_ms == 0.5
        assert [k.tf32_class for k in gru.compiled_shapes] == [True]  # the float32 GRU let go
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured, _ = gru(x)
        captured.fill_(float("nan"))
        graph.replay()
        assert relative_error(captured.cpu().numpy(), ref_out) < 1e-3
        gru(x * 1e5)  # runs; its flag is read at the next call
        with pytest.raises(TvmExtError, match="allow_tf32 = False"):
            gru(x)
        out, _ = gru(x)
        assert relative_error(out.cpu().numpy(), ref_out) < 1e-3
    monkeypatch.setattr(tvm_torch, "per_call_ms", _times(1.0, 2.0))
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False), torch.no_grad():
        out, h_n = gru(x)
        assert relative_error(out.cpu().numpy(), ref_out) < 1e-5 and relative_error(h_n.cpu().numpy(), ref_h) < 1e-5
        assert gru.choices[tvm_torch.EngineKey(8, 64, False, "cuda:0")].backend == TVM_EXT
