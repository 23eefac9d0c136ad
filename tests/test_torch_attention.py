"""``scaled_dot_product_attention`` in a ``torch.export`` program imported as attention in the
operands' type (``tvm_ext.relax.torch_attention``), run on PoCL against torch in float64: no
mask, a float mask, a boolean mask hiding a whole row, causal, an explicit scale; the refusals.
Needs torch (the test extra installs the CPU build)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from tvm_ext.core.errors import TvmExtError  # noqa: E402
from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.relax.torch_import import import_exported_program  # noqa: E402


class Attention(nn.Module):
    """Heads from one projection, SDPA as transformers' BERT calls it, the heads merged."""

    def __init__(self, mask: str, heads: int = 3, width: int = 12):
        super().__init__()
        self.qkv, self.heads, self.mask = nn.Linear(width, 3 * width), heads, mask

    def forward(self, x, mask=None):
        b, s, w = x.shape
        q, k, v = (t.reshape(b, s, self.heads, w // self.heads).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        kwargs = {"attn_mask": mask} if mask is not None else {}
        if self.mask == "causal":
            kwargs["is_causal"] = True
        if self.mask == "scale":
            kwargs["scale"] = 0.3
        return F.scaled_dot_product_attention(q, k, v, **kwargs).transpose(1, 2).reshape(b, s, w)


def _mask(kind: str, batch: int, seq: int) -> torch.Tensor | None:
    rng = np.random.default_rng(3)
    if kind == "bool":  # random keys hidden, and query 2 of batch row 1 hidden from every key
        keep = rng.random((batch, 1, seq, seq)) > 0.3
        keep[:, :, :, 0] = True
        keep[1, 0, 2, :] = False
        return torch.from_numpy(keep)
    if kind == "float":
        return torch.from_numpy(rng.normal(size=(batch, 1, seq, seq)))
    return None


@pytest.mark.parametrize("kind", ["none", "float", "bool", "causal", "scale"])
def test_exported_attention_runs_against_float64(opencl, kind):
    from tvm_ext.relax.pipeline import load_model

    torch.manual_seed(0)
    batch, seq = 2, 7
    model = Attention(kind).eval()
    x = torch.randn(batch, seq, 12)
    mask = _mask(kind, batch, seq)
    args = (x,) if mask is None else (x, mask.float() if kind == "float" else mask)
    mod = import_exported_program(torch.export.export(model, args))
    text = mod["main"].script()
    assert "R.nn.softmax" in text and "float64" not in text
    inputs = [a.numpy() for a in args]
    (ours,) = load_model(mod, opencl, None, function="main", log=None)(*inputs)
    ours = np.asarray(ours.numpy() if hasattr(ours, "numpy") else ours)
    with torch.no_grad():
        reference = model.double()(*(a.double() if a.is_floating_point() else a for a in args)).numpy()
    assert np.isfinite(ours).all()
    if kind == "bool":  # the hidden row is zeros, as torch gives
        assert not reference[1, 2].any() and not ours[1, 2].any()
    assert ours.shape == reference.shape and relative_error(ours, reference) < 1e-5


def test_attention_stays_in_float16():
    """A float16 model's attention: both matmuls and the softmax in float16 (kernels accumulate in
    float32), not the float32 math of torch's decomposition."""
    model = Attention("none").eval().half()
    mod = import_exported_program(torch.export.export(model, (torch.randn(2, 7, 12).half(),)))
    text = mod["main"].script()
    assert 'R.Tensor((2, 3, 7, 7), dtype="float16") = R.matmul' in text
    assert 'dtype="float16") = R.nn.softmax' in text and '"float32"' not in text


def test_dropout_and_grouped_heads_are_refused():
    class Dropped(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)

    class Grouped(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    q = torch.randn(1, 4, 5, 8)
    with pytest.raises(TvmExtError, match="dropout_p=0.1"):
        import_exported_program(torch.export.export(Dropped(), (q, q, q)))
    kv = torch.randn(1, 2, 5, 8)
    with pytest.raises(TvmExtError, match="enable_gqa"):
        import_exported_program(torch.export.export(Grouped(), (q, kv, kv)))


class TinyEncoder(nn.Module):
    """Token and position embeddings (positions sliced from a fixed table, as transformers does),
    attention and a layer norm: a sequence length exported symbolic."""

    def __init__(self):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(50, 12), nn.Embedding(16, 12)
        self.register_buffer("ids", torch.arange(16)[None])
        self.attention, self.norm = Attention("none"), nn.LayerNorm(12)

    def forward(self, x):
        h = self.tokens(x) + self.positions(self.ids[:, :x.shape[1]])
        return self.norm(h + self.attention(h))


def test_a_symbolic_sequence_length_keeps_its_shapes_and_runs_at_buckets(tmp_path):
    """The position slice of a symbolic length stays in bounds (TVM's own converter sizes it
    ``min(s, 16)`` and the shapes after it are lost); ``tune model --buckets`` tunes at two
    lengths and runs the model at a third, checked against torch."""
    import subprocess
    import sys

    from tvm_ext.relax.torch_import import program_symbols

    torch.manual_seed(0)
    program = torch.export.export(TinyEncoder().eval(), (torch.randint(0, 50, (2, 8)),),
                                  dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=16)},))
    (name,) = program_symbols(program)
    text = import_exported_program(program)["main"].script()
    assert "ndim=" not in text and "T.min" not in text, text  # every shape known
    path = tmp_path / "encoder.pt2"
    torch.export.save(program, str(path))
    cmd = [sys.executable, "-m", "tvm_ext.tune", "model", str(path), "--generations", "1", "--population", "2",
           "--no-progress",
           "--buckets", f"{name}=4,16", "--model-option", f"{name}=10", "--records", str(tmp_path / "r.jsonl"),
           "--database", str(tmp_path / "db")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    dispatch = next(line for line in p.stdout.splitlines() if line.startswith(f"{name} = 10:"))
    assert "layer_norm bucket" in dispatch and "softmax bucket" in dispatch and "dlight" not in dispatch, dispatch
    assert "ran: output (2, 10, 12)" in p.stdout and "(ok)" in p.stdout, p.stdout
