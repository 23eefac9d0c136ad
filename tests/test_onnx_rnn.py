"""ONNX LSTM, RNN and GRU nodes, on our LSTM and GRU kernels where they run the node's form
(``onnx_import``) and unrolled (``tvm_ext.relax.onnx_rnn``) otherwise, run on PoCL against a
float64 numpy recurrence written from the ONNX specification (not the converters' code), at odd
sizes: every direction, layout 1, initial states, sequence_lens, peepholes, clip, non-default
activations with their parameters; a torch ``nn.LSTM`` exported by torch against torch in
float64; the refusals name the attribute."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tvm_ext.core.errors import TvmExtError  # noqa: E402
from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.relax.onnx_import import load_onnx  # noqa: E402

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
FUNCS = {
    "Sigmoid": lambda v, a, b: 1 / (1 + np.exp(-v)), "Tanh": lambda v, a, b: np.tanh(v),
    "Relu": lambda v, a, b: np.maximum(v, 0), "Softsign": lambda v, a, b: v / (1 + np.abs(v)),
    "HardSigmoid": lambda v, a, b: np.clip(a * v + b, 0, 1), "LeakyRelu": lambda v, a, b: np.where(v >= 0, v, a * v),
}
TAKES = {"HardSigmoid": (0.2, 0.5), "LeakyRelu": (0.01, None)}


def _functions(names, alphas, betas):
    alphas, betas, out = list(alphas), list(betas), []
    for name in names:
        da, db = TAKES.get(name, (None, None))
        a = (alphas.pop(0) if alphas else da) if da is not None else None
        b = (betas.pop(0) if betas else db) if db is not None else None
        out.append(lambda v, f=FUNCS[name], a=a, b=b: f(v, a, b))
    return out


def reference(op, x, w, r, b, lengths, h0, c0, p, direction, acts, alphas=(), betas=(), clip=None, lbr=0):
    """float64 ONNX ``op`` (layout 0): Y (T, dirs, B, H), Y_h (dirs, B, H), Y_c (LSTM)."""
    steps, batch, _ = x.shape
    dirs, hid = w.shape[0], w.shape[1] // GATES[op]
    per = len(DEFAULTS[op])
    funcs = _functions(acts or DEFAULTS[op] * dirs, alphas, betas)
    cl = (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)
    lengths = np.full(batch, steps) if lengths is None else lengths
    y = np.zeros((steps, dirs, batch, hid))
    y_h, y_c = np.zeros((dirs, batch, hid)), np.zeros((dirs, batch, hid))
    for d in range(dirs):
        f = funcs[d * per:(d + 1) * per]
        wd, rd = w[d].astype(np.float64), r[d].astype(np.float64)
        wb, rb = np.split(b[d].astype(np.float64), 2)
        h, c = h0[d].astype(np.float64).copy(), c0[d].astype(np.float64).copy()
        reverse = direction == "reverse" or d == 1
        for t in (reversed(range(steps)) if reverse else range(steps)):
            live = (t < lengths)[:, None]
            xt = x[t].astype(np.float64)
            if op == "RNN":
                h_new, c_new = f[0](cl(xt @ wd.T + h @ rd.T + wb + rb)), c
            elif op == "LSTM":
                pi, po, pf = np.split(p[d].astype(np.float64), 3)
                gi, go, gf, gc = np.split(xt @ wd.T + h @ rd.T + wb + rb, 4, axis=1)
                i, fg = f[0](cl(gi + pi * c)), f[0](cl(gf + pf * c))
                c_new = fg * c + i * f[1](cl(gc))
                h_new = f[0](cl(go + po * c_new)) * f[2](c_new)
            else:
                (wz, wr, wh), (rz, rr, rh) = np.split(wd, 3), np.split(rd, 3)
                (wbz, wbr, wbh), (rbz, rbr, rbh) = np.split(wb, 3), np.split(rb, 3)
                z = f[0](cl(xt @ wz.T + h @ rz.T + wbz + rbz))
                rg = f[0](cl(xt @ wr.T + h @ rr.T + wbr + rbr))
                inner = rg * (h @ rh.T + rbh) if lbr else (rg * h) @ rh.T + rbh
                h_new, c_new = (1 - z) * f[1](cl(xt @ wh.T + inner + wbh)) + z * h, c
            h, c = np.where(live, h_new, h), np.where(live, c_new, c)
            y[t, d] = np.where(live, h_new, 0.0)
        y_h[d], y_c[d] = h, c
    return y, y_h, y_c


def _model(tmp_path, op, steps=6, batch=3, inp=5, hid=7, direction="forward", layout=0, bias=True, states=True,
           lengths=False, peepholes=False, seed=0, **attrs):
    """An ONNX file of one ``op`` node and its arrays (the graph's inputs, then W, R, B, P)."""
    rng = np.random.default_rng(seed)
    dirs, gates = (2 if direction == "bidirectional" else 1), GATES[op]
    w = rng.uniform(-0.5, 0.5, (dirs, gates * hid, inp)).astype(np.float32)
    r = rng.uniform(-0.5, 0.5, (dirs, gates * hid, hid)).astype(np.float32)
    b = rng.uniform(-0.5, 0.5, (dirs, 2 * gates * hid)).astype(np.float32) if bias else None
    p = rng.uniform(-0.5, 0.5, (dirs, 3 * hid)).astype(np.float32) if peepholes else None
    x = rng.standard_normal((batch, steps, inp) if layout else (steps, batch, inp)).astype(np.float32)
    s_shape = (batch, dirs, hid) if layout else (dirs, batch, hid)
    h0 = rng.standard_normal(s_shape).astype(np.float32) if states else None
    c0 = rng.standard_normal(s_shape).astype(np.float32) if states and op == "LSTM" else None
    lens = np.array([steps, 2, steps - 1][:batch], np.int32) if lengths else None
    feeds = {"X": x, "sequence_lens": lens, "initial_h": h0, "initial_c": c0}
    names = ["X", "W", "R", "B" if bias else "", "sequence_lens" if lengths else "", "initial_h" if states else ""]
    if op == "LSTM":
        names += ["initial_c" if states else "", "P" if peepholes else ""]
    while names[-1] == "":
        names.pop()
    kinds = {"X": TensorProto.FLOAT, "sequence_lens": TensorProto.INT32, "initial_h": TensorProto.FLOAT,
             "initial_c": TensorProto.FLOAT}
    inputs = [helper.make_tensor_value_info(n, kinds[n], list(feeds[n].shape)) for n in names
              if n in feeds and feeds[n] is not None]
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, hidden_size=hid, direction=direction, **attrs,
                            **({"layout": 1} if layout else {}))
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"), (p, "P")) if a is not None]
    y_shape = [batch, steps, dirs, hid] if layout else [steps, dirs, batch, hid]
    out_infos = [helper.make_tensor_value_info(o, TensorProto.FLOAT, y_shape if o == "Y" else list(s_shape))
                 for o in outs]
    graph = helper.make_graph([node], op.lower(), inputs, out_infos, inits)
    path = tmp_path / f"{op.lower()}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), str(path))
    arrays = [feeds[i.name] for i in inputs]
    return str(path), arrays, dict(x=x, w=w, r=r, b=b, p=p, h0=h0, c0=c0, lengths=lens)


def _run(path, arrays, opencl):
    from tvm_ext.relax.pipeline import load_model

    out = load_model(load_onnx(path), opencl, None, function="main", log=None)(*arrays)
    return [np.asarray(a.numpy() if hasattr(a, "numpy") else a) for a in out]


def _expected(op, parts, direction, layout, **kw):
    x, h0, c0 = parts["x"], parts["h0"], parts["c0"]
    if layout:
        x = x.transpose(1, 0, 2)
        h0, c0 = (s.transpose(1, 0, 2) if s is not None else None for s in (h0, c0))
    dirs, hid = parts["w"].shape[0], parts["r"].shape[2]
    zeros = np.zeros((dirs, x.shape[1], hid))
    b = parts["b"] if parts["b"] is not None else np.zeros((dirs, 2 * parts["w"].shape[1]))
    p = parts["p"] if parts["p"] is not None else np.zeros((dirs, 3 * hid))
    y, y_h, y_c = reference(op, x, parts["w"], parts["r"], b, parts["lengths"], zeros if h0 is None else h0,
                            zeros if c0 is None else c0, p, direction, **kw)
    if layout:
        y, y_h, y_c = y.transpose(2, 0, 1, 3), y_h.transpose(1, 0, 2), y_c.transpose(1, 0, 2)
    return [y, y_h] + ([y_c] if op == "LSTM" else [])


CASES = {
    "lstm-forward": ("LSTM", dict()),
    "lstm-reverse-lengths": ("LSTM", dict(direction="reverse", lengths=True)),
    "lstm-bi-lengths-peepholes-clip": ("LSTM", dict(direction="bidirectional", lengths=True, peepholes=True,
                                                    clip=0.7)),
    "lstm-layout1-no-bias": ("LSTM", dict(layout=1, bias=False, direction="bidirectional")),
    "lstm-no-states-activations": ("LSTM", dict(states=False, activations=["HardSigmoid", "Softsign", "Relu"],
                                                 activation_alpha=[0.3], activation_beta=[0.4])),
    "rnn-bi-lengths": ("RNN", dict(direction="bidirectional", lengths=True)),
    "rnn-relu-layout1": ("RNN", dict(layout=1, activations=["Relu"])),
    "gru-reset-before": ("GRU", dict(linear_before_reset=0, direction="bidirectional", lengths=True)),
    "gru-reverse-after": ("GRU", dict(linear_before_reset=1, direction="reverse")),  # (our kernel, reversed)
    "gru-reverse-lengths-layout1": ("GRU", dict(linear_before_reset=1, direction="reverse", lengths=True, layout=1)),
    "gru-clip-leaky": ("GRU", dict(clip=0.9, activations=["Sigmoid", "LeakyRelu"], activation_alpha=[0.2])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_unrolled_recurrences_match_the_specification_on_pocl(opencl, tmp_path, case):
    op, kw = CASES[case]
    attrs = {k: kw[k] for k in ("clip", "activations", "activation_alpha", "activation_beta", "linear_before_reset")
             if k in kw}
    shape = {k: v for k, v in kw.items() if k not in attrs}
    path, arrays, parts = _model(tmp_path, op, **shape, **attrs)
    got = _run(path, arrays, opencl)
    want = _expected(op, parts, kw.get("direction", "forward"), kw.get("layout", 0), acts=kw.get("activations"),
                     alphas=kw.get("activation_alpha", ()), betas=kw.get("activation_beta", ()),
                     clip=kw.get("clip"), lbr=kw.get("linear_before_reset", 0))
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        assert relative_error(g, w) < 1e-5


@pytest.mark.parametrize("kw, why", [
    (dict(), None), (dict(layout=1, bias=False, direction="bidirectional"), None), (dict(states=False), None),
    (dict(direction="reverse"), None), (dict(lengths=True, direction="bidirectional"), None),
    (dict(lengths=True, direction="reverse"), "direction='reverse' with sequence_lens"),
    (dict(peepholes=True), "peepholes (P)"), (dict(clip=0.5), "clip=0.5"),
])
def test_an_lstm_runs_on_our_kernel_where_its_form_allows_and_says_why_not_elsewhere(opencl, tmp_path, capfd, kw,
                                                                                       why):
    """The forms torch writes (forward or bidirectional, layout 0 or 1, with or without B and initial
    states) become tvm_ext's LSTM placeholder silently and match the specification; the others run
    unrolled with the reason on stderr."""
    path, arrays, parts = _model(tmp_path, "LSTM", steps=5, batch=2, inp=4, hid=6, **kw)
    text = load_onnx(path).script()
    err = capfd.readouterr().err
    if why is None:
        assert "tvm_ext.lstm" in text and "unrolled" not in err
        got = _run(path, arrays, opencl)
        want = _expected("LSTM", parts, kw.get("direction", "forward"), kw.get("layout", 0), acts=None)
        for g, w in zip(got, want):
            assert g.shape == w.shape and relative_error(g, w) < 1e-5
    else:
        assert "tvm_ext.lstm" not in text and f"LSTM kernel does not run {why}" in err


def test_a_gru_the_kernel_cannot_run_says_so_on_stderr(tmp_path, capfd):
    """A reverse GRU with sequence_lens runs unrolled and says why; a PyTorch-style one, and a
    reverse one without lengths (the kernel on the reversed sequence), stay on our kernel silently."""
    path, *_ = _model(tmp_path, "GRU", direction="reverse", linear_before_reset=1, lengths=True)
    text = load_onnx(path).script()
    assert "tvm_ext.gru" not in text
    err = capfd.readouterr().err
    assert "note: an ONNX GRU runs unrolled" in err and "GRU kernel does not run direction='reverse' with" in err
    path, *_ = _model(tmp_path, "GRU", direction="reverse", linear_before_reset=1)
    assert "tvm_ext.gru" in load_onnx(path).script() and "unrolled" not in capfd.readouterr().err
    path, *_ = _model(tmp_path, "GRU", direction="forward", linear_before_reset=1)
    assert "tvm_ext.gru" in load_onnx(path).script() and "unrolled" not in capfd.readouterr().err


@pytest.mark.parametrize("kind, dynamo", [("opencl", False), ("opencl", True),
                                          pytest.param("cuda", False, marks=pytest.mark.gpu)])
def test_torch_lstm_exported_to_onnx_matches_torch_in_float64(tmp_path, kind, dynamo):
    """What a user has: a two-layer bidirectional ``nn.LSTM`` with ``batch_first``, written by torch's
    ONNX exporters (the TorchScript one and the default ``dynamo=True`` one, opset 20), against the
    same module in float64."""
    from tvm_ext.target import resolve_target

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(5, 9, num_layers=2, batch_first=True, bidirectional=True).eval()
    x = torch.randn(3, 6, 5)
    path = str(tmp_path / "lstm.onnx")
    if dynamo:
        pytest.importorskip("onnxscript")
    torch.onnx.export(lstm, (x,), path, dynamo=dynamo, input_names=["x"], output_names=["y", "h", "c"])
    got = _run(path, [x.numpy()], resolve_target(kind, 0))
    with torch.no_grad():
        y, (h, c) = lstm.double()(x.double())
    for g, w in zip(got, (y, h, c)):
        assert g.shape == tuple(w.shape) and relative_error(g, w.numpy()) < 1e-5


def test_a_packed_torch_lstm_exported_to_onnx_runs_on_our_kernel_with_its_lengths(tmp_path, opencl):
    """A model packing its batch (``pack_padded_sequence`` with the lengths an input), through torch's
    TorchScript exporter: an LSTM node with ``sequence_lens``, on our LSTM's unfused steps, against
    torch in float64 (outputs past each row's length zero, final states at its last step)."""
    torch = pytest.importorskip("torch")
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    class Packed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(4, 7, bidirectional=True)

        def forward(self, x, lengths):
            y, (h, c) = self.lstm(pack_padded_sequence(x, lengths, enforce_sorted=False))
            return pad_packed_sequence(y, total_length=x.shape[0])[0], h, c

    torch.manual_seed(0)
    model = Packed().eval()
    x, lengths = torch.randn(5, 3, 4), torch.tensor([2, 5, 3])
    path = str(tmp_path / "packed.onnx")
    torch.onnx.export(model, (x, lengths), path, dynamo=False, input_names=["x", "lengths"])
    text = load_onnx(path).script()
    assert "tvm_ext.lstm" in text
    got = _run(path, [x.numpy(), lengths.numpy()], opencl)
    with torch.no_grad():
        want = model.double()(x.double(), lengths)
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape) and relative_error(g, w.numpy()) < 1e-5


@pytest.mark.parametrize("op, attrs, needle", [
    ("LSTM", dict(input_forget=1), "ONNX LSTM attribute input_forget=1"),
    ("LSTM", dict(direction="sideways"), "ONNX LSTM attribute direction='sideways'"),
    ("RNN", dict(activations=["Swish"]), "'Swish' is not an ONNX activation"),
    ("RNN", dict(activations=["ScaledTanh"]), "ScaledTanh needs its activation_alpha"),
    ("GRU", dict(activations=["Sigmoid"]), "names 1 functions; GRU takes 2 a direction"),
])
def test_what_no_form_runs_is_refused_naming_the_node_and_attribute(tmp_path, op, attrs, needle):
    path, *_ = _model(tmp_path, op, **attrs)
    with pytest.raises(TvmExtError, match=needle.replace("(", r"\(").replace("[", r"\[")) as err:
        load_onnx(path)
    assert f"node 'Y' ({op})" in str(err.value)


def test_a_symbolic_sequence_length_is_one_error_naming_the_dimension_where_the_node_is_unrolled(tmp_path):
    """Unrolled (peepholes), the sequence length must be known: one error naming the dimension; on our
    LSTM kernel it stays symbolic in the placeholder (bound by --model-option or --buckets)."""
    for peepholes in (True, False):
        path, *_ = _model(tmp_path, "LSTM", peepholes=peepholes)
        model = onnx.load(path)
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "frames"
        onnx.save(model, path)
        if peepholes:
            with pytest.raises(TvmExtError, match=r"symbolic sequence length \(frames\).*--model-option frames=N"):
                load_onnx(path)
        else:
            assert "tvm_ext.lstm" in load_onnx(path).script() and "frames" in load_onnx(path).script()
