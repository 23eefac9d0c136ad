"""``tvm_ext.torch.GRU``: nn.GRU's arguments, weights and forward, against float64.

Needs torch (skipped without it).  The GPU cases run our kernels whatever torch's GRU
measures (``fallback="off"``; the fallback has its own tests).  Without the ``gpu`` marker:
argument handling and the weight copy on CPU tensors (OpenCL).  ``gpu``: CUDA tensors in place, h0, batch_first,
layers, directions, PackedSequence input, 16-bit dtypes, and a capture in a user's CUDA graph
on NaN-poisoned outputs, each rerun."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tvm_ext.core.errors import TvmExtError  # noqa: E402
from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.schedules.gru import gru_reference  # noqa: E402
from tvm_ext.torch import GRU  # noqa: E402

from torch_capture import captured, replay_checked  # noqa: E402


def _reference(net, x, h0=None, lengths=None, batch_first=False):
    state = {k: v.detach().float().cpu().numpy() for k, v in net.state_dict().items()}
    return gru_reference(x.detach().float().cpu().numpy(), state, None if h0 is None else h0.float().cpu().numpy(),
                         net.num_layers, net.bidirectional, batch_first, lengths=lengths)


def test_from_module_copies_arguments_and_weights():
    net = torch.nn.GRU(6, 5, num_layers=2, bidirectional=True, batch_first=True, bias=False)
    gru = GRU.from_module(net)
    assert (gru.input_size, gru.hidden_size, gru.num_layers, gru.bidirectional, gru.batch_first, gru.bias) == \
        (6, 5, 2, True, True, False)
    assert set(gru.state_dict()) == set(net.state_dict())
    for name, value in net.state_dict().items():
        assert torch.equal(gru.state_dict()[name], value)


@pytest.mark.parametrize("make,needle", [
    (lambda: GRU(4, 4, dropout=0.5), "dropout must be 0"),
    (lambda: GRU(4, 0), "hidden_size must be a positive integer, got 0"),  # nn.GRU: ValueError, not 1/sqrt(0)
    (lambda: GRU(0, 4), "input_size must be a positive integer, got 0"),
    (lambda: GRU(4, 4, num_layers=0), "num_layers must be a positive integer, got 0"),  # not StopIteration at a call
    (lambda: GRU(4, 4, num_layers=1.5), "num_layers must be a positive integer, got 1.5"),
    (lambda: GRU(4, 4, dtype=torch.float64), "dtype torch.float64 is not supported"),
    (lambda: GRU.from_module(torch.nn.LSTM(4, 4)), "takes a torch.nn.GRU"),
])
def test_bad_arguments_are_refused(make, needle):
    with pytest.raises(TvmExtError, match=needle):
        make()


def test_bad_inputs_are_refused_on_cpu():
    gru = GRU(4, 3)
    with pytest.raises(TvmExtError, match="expected torch.float32"):
        gru(torch.zeros(2, 1, 4, dtype=torch.float64))
    with pytest.raises(TvmExtError, match=r"expected \(seq, batch, 4\)"):
        gru(torch.zeros(2, 1, 5))
    with pytest.raises(TvmExtError, match="hx has shape"):
        gru(torch.zeros(2, 1, 4), torch.zeros(1, 2, 3))
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.zeros(3, 2, 5), torch.tensor([3, 2]))
    with pytest.raises(TvmExtError, match=r"PackedSequence data has shape \(5, 5\), expected \(rows, 4\)"):
        gru(packed)


def test_cpu_tensors_run_on_opencl():
    net = torch.nn.GRU(5, 7, bidirectional=True).eval()
    gru = GRU.from_module(net)
    x, h0 = torch.randn(4, 3, 5), torch.randn(2, 3, 7)
    out, h_n = gru(x, h0)
    ref_out, ref_h = _reference(net, x, h0)
    assert relative_error(out.numpy(), ref_out) < 1e-5 and relative_error(h_n.numpy(), ref_h) < 1e-5


def test_packed_sequence_with_hx_on_opencl():
    """Unsorted lengths and an h0 in the caller's row order: the module pads the packed rows in
    their packed order, so h0 goes in sorted and h_n comes out unsorted, as nn.GRU does."""
    torch.manual_seed(3)
    net = torch.nn.GRU(5, 6, bidirectional=True).eval()
    gru = GRU.from_module(net)
    x, h0 = torch.randn(7, 4, 5), torch.randn(2, 4, 6)
    lengths = torch.tensor([3, 7, 1, 5])
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    ours, h_n = gru(packed, h0)
    with torch.no_grad():
        theirs, their_h = net(packed, h0)
    assert torch.equal(ours.batch_sizes, theirs.batch_sizes)
    assert torch.equal(ours.sorted_indices, theirs.sorted_indices)
    assert ours.data.shape == theirs.data.shape
    padded, _ = torch.nn.utils.rnn.pad_packed_sequence(ours, total_length=7)
    ref_out, ref_h = _reference(net, x, h0, lengths=lengths.numpy())
    assert relative_error(padded.numpy(), ref_out) < 1e-5 and relative_error(h_n.numpy(), ref_h) < 1e-5
    assert relative_error(ours.data.numpy(), theirs.data.numpy()) < 1e-4


def test_packed_sequences_of_other_lengths_in_turn_on_opencl():
    """One module, packed batches of the same size and length but other lengths in turn (each
    pads and unpacks by its own batch sizes, kept per distinct value), the first again last."""
    torch.manual_seed(4)
    net = torch.nn.GRU(5, 6).eval()
    gru = GRU.from_module(net)
    x = torch.randn(6, 3, 5)
    for lengths in ([6, 4, 2], [6, 6, 1], [6, 3, 3], [6, 4, 2]):
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths))
        ours, h_n = gru(packed)
        padded, _ = torch.nn.utils.rnn.pad_packed_sequence(ours, total_length=6)
        ref_out, ref_h = _reference(net, x, lengths=lengths)
        assert relative_error(padded.numpy(), ref_out) < 1e-5 and relative_error(h_n.numpy(), ref_h) < 1e-5


# ---- GPU ------------------------------------------------------------------------------------
SHAPES = [dict(input_size=17, hidden_size=33, num_layers=3, bidirectional=True),
          dict(input_size=64, hidden_size=128, batch_first=True),
          dict(input_size=200, hidden_size=200, num_layers=2)]


@pytest.mark.gpu
@pytest.mark.parametrize("kwargs", SHAPES, ids=["3L-bi", "batch-first", "2L"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cuda_tensors_in_place_against_float64(kwargs, dtype):
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    net32 = torch.nn.GRU(**kwargs).cuda().eval()
    gru = GRU.from_module(net32.to(dt), fallback="off")
    bound = 1e-5 if dtype == "float32" else 1e-2
    dirs = 2 if net32.bidirectional else 1
    for batch, seq in ((5, 9), (5, 9), (2, 4)):  # a rerun, then another shape (another compiled GRU)
        x = torch.randn(batch, seq, net32.input_size, device="cuda")
        if not net32.batch_first:
            x = x.transpose(0, 1).contiguous()
        h0 = torch.randn(net32.num_layers * dirs, batch, net32.hidden_size, device="cuda")
        out, h_n = gru(x.to(dt), h0.to(dt))
        assert out.device.type == "cuda" and out.dtype == dt
        ref_out, ref_h = _reference(net32, x.to(dt), h0.to(dt), batch_first=net32.batch_first)
        assert relative_error(out.float().cpu().numpy(), ref_out) < bound
        assert relative_error(h_n.float().cpu().numpy(), ref_h) < bound
    gru.check()


@pytest.mark.gpu
def test_packed_sequence_like_nn_gru():
    torch.manual_seed(1)
    net = torch.nn.GRU(24, 40, num_layers=2, bidirectional=True).cuda().eval()
    gru = GRU.from_module(net, fallback="off")
    x = torch.randn(11, 6, 24, device="cuda")
    lengths = torch.tensor([11, 3, 7, 1, 11, 5])
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    ours, h_n = gru(packed)
    # torch's default for RNNs is TF32 (errors near 3e-4): off for this call only
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        theirs, their_h = net(packed)
    assert torch.equal(ours.batch_sizes, theirs.batch_sizes)
    assert torch.equal(ours.sorted_indices.cpu(), theirs.sorted_indices.cpu())
    padded, _ = torch.nn.utils.rnn.pad_packed_sequence(ours, total_length=11)
    ref_out, ref_h = _reference(net, x, lengths=lengths.numpy())
    assert relative_error(padded.cpu().numpy(), ref_out) < 1e-5 and relative_error(h_n.cpu().numpy(), ref_h) < 1e-5
    assert relative_error(ours.data.cpu().numpy(), theirs.data.cpu().numpy()) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("config", [None, {"fuse_step": 1, "step_loop": 1}, {"fuse_step": 0}],
                         ids=["pick", "host-loop", "per-step-calls"])
def test_captured_in_a_users_cuda_graph(config):
    """float32 accuracy: cuDNN's TF32 off, as a user asks for it (under TF32, where torch's call
    erred as TF32 does, the module may serve the shape in TF32's class: ``test_torch_fallback``)."""
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        _captured_in_a_users_cuda_graph(config)


def _captured_in_a_users_cuda_graph(config):
    torch.manual_seed(2)
    net = torch.nn.GRU(96, 96, bidirectional=True).cuda().eval()
    gru = GRU.from_module(net, config=config)
    static_x = torch.randn(16, 4, 96, device="cuda")
    graph, (out, h_n) = captured(gru, static_x)

    def check() -> None:
        ref_out, ref_h = _reference(net, static_x)
        assert relative_error(out.cpu().numpy(), ref_out) < 1e-5 and relative_error(h_n.cpu().numpy(), ref_h) < 1e-5

    replay_checked(graph, static_x, (out, h_n), check)
    gru.check()


@pytest.mark.gpu
def test_wrong_device_is_refused():
    gru = GRU.from_module(torch.nn.GRU(8, 8).cuda())
    with pytest.raises(TvmExtError, match="is on cpu, expected cuda"):
        gru(torch.zeros(3, 2, 8))


@pytest.mark.gpu
def test_float32_module_with_float16_storage():
    """precision="float16" behind a float32 module: float32 tensors in and out, float16 storage
    inside, errors of the TF32 class (well under 1e-3), not float16's own I/O rounding twice."""
    torch.manual_seed(5)
    net = torch.nn.GRU(128, 128, num_layers=2).cuda().eval()
    gru = GRU.from_module(net, precision="float16")
    x = torch.randn(32, 8, 128, device="cuda")
    out, h_n = gru(x)
    assert out.dtype == torch.float32 and h_n.dtype == torch.float32
    ref_out, ref_h = _reference(net, x)
    assert 1e-6 < relative_error(out.cpu().numpy(), ref_out) < 1e-3
    assert relative_error(h_n.cpu().numpy(), ref_h) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("config", [None, {"fuse_step": 0}], ids=["pick", "per-step-calls"])
def test_eager_calls_replay_a_recorded_graph(config):
    """Eager CUDA calls replay the shape's recorded graph: every call on new inputs (with and
    without h0, batch_first, new lengths) matches float64 with the graph's static outputs
    poisoned before it, results are fresh tensors (a later call leaves them alone), new weights
    are picked up, and graphs=False gives the same bits."""
    torch.manual_seed(6)
    net = torch.nn.GRU(48, 64, num_layers=2, bidirectional=True, batch_first=True).cuda().eval()
    gru, direct = (GRU.from_module(net, config=config, fallback="off") for _ in range(2))
    direct.graphs = False
    xs = [torch.randn(5, 12, 48, device="cuda") for _ in range(3)]
    h0 = torch.randn(4, 5, 64, device="cuda")
    gru(xs[0])  # records the graph
    assert len(gru._call_graphs) == 1
    results = []
    for x in xs:
        for hx in (None, h0):
            for record in gru._call_graphs.values():
                record.out.fill_(float("nan"))
                record.h_n.fill_(float("nan"))
            out, h_n = gru(x, hx)
            ref_out, ref_h = _reference(net, x, hx, batch_first=True)
            assert relative_error(out.cpu().numpy(), ref_out) < 1e-5 and relative_error(h_n.cpu().numpy(), ref_h) < 1e-5
            mine, theirs = direct(x, hx)
            assert relative_error(out.cpu().numpy(), mine.cpu().numpy()) < 1e-6
            assert relative_error(h_n.cpu().numpy(), theirs.cpu().numpy()) < 1e-6
            results.append((out, out.clone()))
    assert len(gru._call_graphs) == 2  # with and without h0
    assert all(torch.equal(out, kept) for out, kept in results)  # each call's result is its own tensor
    with torch.no_grad():  # new weights reach the next call
        for p in net.parameters():
            p.mul_(0.5)
    gru.load_state_dict(net.state_dict())
    out, h_n = gru(xs[1])
    ref_out, ref_h = _reference(net, xs[1], batch_first=True)
    assert relative_error(out.cpu().numpy(), ref_out) < 1e-5 and relative_error(h_n.cpu().numpy(), ref_h) < 1e-5
    # variable lengths: each call's lengths reach the replay (padded straight into its static
    # input, the lengths copied when another layout's were copied last), the static input poisoned
    x = torch.randn(12, 5, 48, device="cuda")
    seq_first = GRU.from_module(torch.nn.GRU(48, 64).cuda().eval(), fallback="off")
    for lengths in (torch.tensor([12, 9, 9, 4, 1]), torch.tensor([12, 12, 3, 2, 2]), torch.tensor([12, 9, 9, 4, 1]),
                    torch.tensor([12, 9, 9, 4, 1]), torch.tensor([12, 12, 3, 2, 2])):
        for record in seq_first._call_graphs.values():
            record.x.fill_(float("nan"))
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths)
        ours, h_n = seq_first(packed)
        padded, _ = torch.nn.utils.rnn.pad_packed_sequence(ours, total_length=12)
        state_net = torch.nn.GRU(48, 64).cuda().eval()
        state_net.load_state_dict(seq_first.state_dict())
        ref_out, ref_h = _reference(state_net, x, lengths=lengths.numpy())
        assert relative_error(padded.cpu().numpy(), ref_out) < 1e-5 and relative_error(h_n.cpu().numpy(), ref_h) < 1e-5
    gru.check()


@pytest.mark.gpu
def test_w_ih_parts_are_split_at_loading_and_again_for_new_weights():
    """float32 B8 H512 T128, whose pick runs the input GEMM on TF32 parts: W_ih is split once as
    the weights are loaded (no split among a call's kernels), and new weights (``load_state_dict``)
    are split again before the next call, direct and replayed from the recorded graph."""
    torch.manual_seed(0)
    net = torch.nn.GRU(512, 512).cuda().eval()
    gru = GRU.from_module(net, fallback="off")
    xs = [torch.randn(128, 8, 512, device="cuda") for _ in range(2)]
    with torch.no_grad():
        for x in xs:
            out, h_n = gru(x)
            ref_out, ref_h = _reference(net, x)
            assert relative_error(out.cpu().numpy(), ref_out) < 1e-5 and relative_error(h_n.cpu().numpy(), ref_h) < 1e-5
        engine = next(iter(gru._engines.values()))
        assert engine.config.in_split == 3 and engine.executor.prepared == 1
        assert engine.executor.names[0] == "gru_split_w0" and "gru_split_w0" not in engine.executor.names[1:]
        for p in net.parameters():
            p.uniform_(-0.04, 0.04)
        gru.load_state_dict(net.state_dict())
        for x in xs + xs:  # the first call of the new weights direct, then from the graph
            out, h_n = gru(x)
            ref_out, ref_h = _reference(net, x)
            assert relative_error(out.cpu().numpy(), ref_out) < 1e-5 and relative_error(h_n.cpu().numpy(), ref_h) < 1e-5


@pytest.mark.gpu
def test_repeated_eager_calls_skip_the_checks_but_not_a_changed_input():
    """From the second eager call of an input and hx signature on, a call goes straight to the
    replay (the checks are not repeated): it still matches float64 on poisoned static outputs,
    and an input or hx of another dtype, shape or device, or a module moved to another dtype,
    still gets its error."""
    torch.manual_seed(7)
    net = torch.nn.GRU(16, 32).cuda().eval()
    gru = GRU.from_module(net, fallback="off")
    x, h0 = torch.randn(6, 3, 16, device="cuda"), torch.randn(1, 3, 32, device="cuda")
    gru(x, h0)
    gru(x, h0)
    assert len(gru._eager_calls) == 1
    for _ in range(2):
        xi = torch.randn_like(x)
        for record in gru._call_graphs.values():
            record.out.fill_(float("nan"))
            record.h_n.fill_(float("nan"))
        out, h_n = gru(xi, h0)
        ref_out, ref_h = _reference(net, xi, h0)
        assert relative_error(out.cpu().numpy(), ref_out) < 1e-5 and relative_error(h_n.cpu().numpy(), ref_h) < 1e-5
    with pytest.raises(TvmExtError, match="has dtype torch.float16"):
        gru(x.half(), h0)
    with pytest.raises(TvmExtError, match="hx has shape"):
        gru(x, h0[:, :2])
    with pytest.raises(TvmExtError, match="is on cpu"):
        gru(x, h0.cpu())
    gru.half()
    assert not gru._eager_calls
    with pytest.raises(TvmExtError, match="has dtype torch.float32"):
        gru(x, h0)


@pytest.mark.gpu
@pytest.mark.parametrize("config, bad, needle", [
    ({"in_split": 1}, "x", "GRU input held a value .* build without in_split"),
    (None, "hx", "GRU hx held a value .* build without step_tc 2"),  # the pick at batch 8 splits the state
])
@pytest.mark.parametrize("value", [7e4, -7e4, float("nan")])
def test_inputs_past_their_float16_parts_are_reported_at_the_next_call(config, bad, needle, value):
    """A float32 GRU whose config splits x (in_split 1) or the state (step_tc 2) into float16 parts,
    as the numpy path refuses them: a |value| of 65504 or more (or NaN) is found on the device before
    the plan (no sync), the next call raises naming the knob (replayed graph, direct launches, or
    ``check``), and the calls after it match float64 again."""
    torch.manual_seed(3)
    net = torch.nn.GRU(64, 64).cuda().eval()
    gru = GRU.from_module(net, config=config, fallback="off")
    x, h0 = torch.randn(16, 8, 64, device="cuda"), torch.randn(1, 8, 64, device="cuda")
    huge = (x.clone(), h0) if bad == "x" else (x, h0.clone())
    huge[0 if bad == "x" else 1][0, 3, 5] = value
    for graphs in (True, False):
        gru.graphs = graphs
        gru(x, h0)
        gru(x, h0)  # a replay of the recorded graph (graphs on)
        gru(*huge)
        torch.cuda.synchronize()  # its flags landed (a call reads those of the calls before it that have)
        with pytest.raises(TvmExtError, match=needle):
            gru(x, h0)
        out, h_n = gru(x, h0)
        ref_out, ref_h = _reference(net, x, h0)
        assert relative_error(out.cpu().numpy(), ref_out) < 1e-5 and relative_error(h_n.cpu().numpy(), ref_h) < 1e-5
        gru(*huge)
        with pytest.raises(TvmExtError, match=needle):
            gru.check()
        gru.check()


@pytest.mark.gpu
@pytest.mark.parametrize("view", [True, False], ids=["flags-in-pinned-words", "flags-copied-out"])
def test_a_timed_out_barrier_is_reported_at_the_next_call(monkeypatch, view):
    """A grid that cannot be resident (a target claiming 4096 SMs lets 1120 blocks through the
    residency check: blocks wait at a barrier for blocks that never start) times out; the call
    returns, and the next call (a replayed graph) or ``check`` (direct launches) raises the
    barrier's error.  With the flags the device writes into pinned host memory, and with the
    fallback that copies them out after the call."""
    import dataclasses

    import tvm_ext.target as targets
    import tvm_ext.torch_watch as torch_watch

    real = targets.resolve_target
    monkeypatch.setattr(targets, "resolve_target",
                        lambda kind, device=0: dataclasses.replace(real(kind, device), compute_units=4096))
    if not view:
        monkeypatch.setattr(torch_watch, "device_view", lambda host, device: None)
    torch.manual_seed(5)
    net = torch.nn.GRU(16, 1024).cuda().eval()
    gru = GRU.from_module(net, config=dict(fuse_step=1, step_j=32, step_b=1, step_k=64, step_ks=8, step_loop=2,
                                           step_barrier=2))
    x = torch.randn(2, 35, 16, device="cuda")  # 32 x 35 = 1120 blocks of 256 threads > 132 x 8
    gru(x)
    watch = next(iter(gru._watches.values()))
    assert (watch.mapped is not None) == view
    torch.cuda.synchronize()
    with pytest.raises(TvmExtError, match="grid barrier timed out"):
        gru(x)
    gru.graphs = False
    gru(x)
    with pytest.raises(TvmExtError, match="grid barrier timed out"):
        gru.check()
    gru.check()  # reported once


def test_buckets_serve_calls_of_many_shapes_on_few_compiled_grus():
    """``buckets``: each call's seq and batch padded up to their buckets (a size past the largest
    is its own), every output against float64 nn.GRU, with and without h0, batch-first, two
    bidirectional layers (the reverse direction starts at the call's last step, not the bucket's)."""
    torch.manual_seed(2)
    net = torch.nn.GRU(5, 6, num_layers=2, bidirectional=True, batch_first=True).eval()
    gru = GRU.from_module(net, buckets={"seq": [8, 4], "batch": [4]})
    for seq, batch, with_h0 in ((5, 3, True), (8, 4, False), (3, 1, True), (7, 2, False), (10, 3, True)):
        x = torch.randn(batch, seq, 5)
        h0 = torch.randn(4, batch, 6) if with_h0 else None
        out, h_n = gru(x, h0)
        ref_out, ref_h = _reference(net, x, h0, batch_first=True)
        assert out.shape == (batch, seq, 12) and h_n.shape == (4, batch, 6)
        assert relative_error(out.numpy(), ref_out) < 1e-5 and relative_error(h_n.numpy(), ref_h) < 1e-5
    assert [(k.batch, k.seq, k.variable_lengths) for k in gru.compiled_shapes] == \
        [(4, 4, True), (4, 8, False), (4, 8, True), (4, 10, False)]


def test_a_padded_call_zeroes_what_a_call_of_another_shape_left_in_the_static_input():
    """``PaddedCall`` on a stand-in recorded graph whose replay sums the whole static input and h0
    into every output (so whatever is left past the call's steps and rows shows): calls of the
    bucket's own shape (``EagerCall``) and of smaller shapes in turn each see only their own
    values; a shape repeated skips the zeroing (``filled``)."""
    from types import SimpleNamespace

    from tvm_ext import torch_buckets
    from tvm_ext.torch import CallGraph, EagerCall

    x, h0 = torch.zeros(4, 3, 2), torch.zeros(1, 3, 5)
    out, h_n = torch.zeros(4, 3, 5), torch.zeros(1, 3, 5)
    zeroed = []

    def replay():
        out.fill_(float(x.sum()))
        h_n.fill_(float(h0.sum()))

    record = CallGraph(SimpleNamespace(replay=replay), x, h0, None, out, h_n, [None], [None])
    watch = SimpleNamespace(check=lambda: None, mark=lambda: None)
    whole = EagerCall(record, watch, torch.float32)
    small, middle = (torch_buckets.PaddedCall(record, watch, torch.float32, seq, batch, None)
                     for seq, batch in ((2, 1), (3, 2)))
    real_zero = torch.Tensor.zero_
    for call, seq, batch, zeroes in ((whole, 4, 3, False), (small, 2, 1, True), (small, 2, 1, False),
                                     (middle, 3, 2, True), (small, 2, 1, True), (whole, 4, 3, False),
                                     (small, 2, 1, True), (middle, 3, 2, True)):
        zeroed.clear()
        torch.Tensor.zero_ = lambda t: zeroed.append(t.shape) or real_zero(t)
        try:
            got_out, got_h = call.run(torch.ones(seq, batch, 2), torch.ones(1, batch, 5))
        finally:
            torch.Tensor.zero_ = real_zero
        assert got_out.shape == (seq, batch, 5) and got_h.shape == (1, batch, 5)
        assert torch.all(got_out == 2 * seq * batch) and torch.all(got_h == 5 * batch)
        assert bool(zeroed) == zeroes


@pytest.mark.parametrize("buckets, needle", [
    ({"tokens": [4]}, "buckets takes a mapping of seq and batch"),
    ({"seq": [0, 4]}, r"buckets\['seq'\] must be positive integers"),
    ({"batch": []}, r"buckets\['batch'\] must be positive integers"),
    ([4, 8], "buckets takes a mapping"),
])
def test_bad_buckets_are_refused(buckets, needle):
    with pytest.raises(TvmExtError, match=needle):
        GRU(4, 4, buckets=buckets)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_bucketed_shape_seen_before_goes_straight_to_its_buckets_graph(dtype, monkeypatch):
    """From the moment its bucket's graph is recorded, a bucketed call copies x and hx into that
    graph's leading steps and rows and its outputs out of them (``PaddedCall``): no padded tensor
    is made (``torch_buckets.pad`` runs only where no graph of the bucket exists yet).  Shapes in
    turn, with and without h0, batch-first, two bidirectional layers, steps added or only rows, the
    bucket's own shape between them; each output against float64 on NaN-poisoned static outputs."""
    from tvm_ext import torch_buckets

    torch.manual_seed(5)
    dt = getattr(torch, dtype)
    net = torch.nn.GRU(24, 32, num_layers=2, bidirectional=True, batch_first=True).cuda().eval().to(dt)
    gru = GRU.from_module(net, buckets={"seq": [8, 16], "batch": [4, 8]})
    pads, pad = [], torch_buckets.pad
    monkeypatch.setattr(torch_buckets, "pad",
                        lambda x, hx, seq, batch: pads.append((seq, batch)) or pad(x, hx, seq, batch))
    bound = 1e-5 if dtype == "float32" else 1e-2
    for seq, batch, with_h0 in ((5, 3, True), (5, 3, True), (8, 4, False), (5, 3, True), (3, 1, False),
                                (8, 2, False), (12, 7, True), (8, 2, False), (3, 1, False), (12, 7, True),
                                (8, 4, False), (8, 2, False)):
        for record in gru._call_graphs.values():
            record.out.fill_(float("nan"))
            record.h_n.fill_(float("nan"))
        x = torch.randn(batch, seq, 24, device="cuda").to(dt)
        h0 = torch.randn(4, batch, 32, device="cuda").to(dt) if with_h0 else None
        out, h_n = gru(x, h0)
        ref_out, ref_h = _reference(net, x, h0, batch_first=True)
        assert out.shape == (batch, seq, 64) and h_n.shape == (4, batch, 32) and out.dtype == dt
        assert relative_error(out.float().cpu().numpy(), ref_out) < bound
        assert relative_error(h_n.float().cpu().numpy(), ref_h) < bound
    assert pads == [(8, 4), (8, 4), (16, 8)]  # the first call of each bucket graph (with h0, without)
    assert sum(isinstance(c, torch_buckets.PaddedCall) for c in gru._eager_calls.values()) == 4
    gru.check()


@pytest.mark.gpu
def test_what_a_call_left_in_its_buckets_graph_is_not_run_as_the_next_calls_padding():
    """A bucket's recorded input is shared by every shape of the bucket: where a call of its own
    shape held a value past the float16 limit in row 3 (reported at the next call, as it should
    be), a later call of two rows must not run that row again as its padding (zeroed, not left):
    its second call raises nothing and matches float64."""
    torch.manual_seed(6)
    net = torch.nn.GRU(24, 32).cuda().eval()
    gru = GRU.from_module(net, precision="float16", buckets={"batch": [4]})
    x, small = torch.randn(8, 4, 24, device="cuda"), torch.randn(8, 2, 24, device="cuda")
    gru(x)
    bad = x.clone()
    bad[2, 3, 5] = 1e6
    gru(bad)  # the shape's second call: through its recorded graph, row 3 written there
    torch.cuda.synchronize()
    with pytest.raises(TvmExtError, match="GRU input held a value"):
        gru(small)
    for _ in range(2):
        out, h_n = gru(small)
        torch.cuda.synchronize()
        ref_out, ref_h = _reference(net, small)
        assert relative_error(out.cpu().numpy(), ref_out) < 2e-3 and relative_error(h_n.cpu().numpy(), ref_h) < 2e-3
    gru.check()
    assert not gru._call_graphs[next(iter(gru._call_graphs))].x[:, 2:].any()
