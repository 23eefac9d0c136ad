"""``torch.fft`` in a torch.export program (``tvm_ext.relax.torch_fft``): each transform, inverse,
normalization and the operators on its complex results, run on PoCL (and CUDA) against torch in
float64; what we cannot carry is refused by name."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tvm_ext.core.errors import TvmExtError  # noqa: E402
from tvm_ext.relax.torch_import import import_exported_program  # noqa: E402

F = torch.fft


class _Spectra(nn.Module):
    """FNet's ``fftn(x).real`` and each transform torch exports (c2c, r2c, c2r), every norm, odd and
    even lengths, an FFT convolution, a magnitude spectrogram (``stft``), phase and conjugate."""

    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hann_window(8))  # a constant: torch 2.11 exports no decomposition

    def forward(self, x, k):
        window = self.window.to(x.dtype)
        return (F.fftn(x.to(torch.complex64 if x.dtype == torch.float32 else torch.complex128), dim=(1, 2)).real,
                F.fft2(x).imag, torch.view_as_real(F.rfft(x, dim=-1, norm="ortho")),
                F.irfft(F.rfft(x, dim=1), n=x.shape[1], dim=1), F.irfft(F.rfft(x), n=7),
                torch.view_as_real(F.ifft(x.to(torch.complex64 if x.dtype == torch.float32 else torch.complex128),
                                          dim=0, norm="forward")),
                torch.view_as_real(F.rfftn(x)), F.irfftn(F.rfftn(x), s=x.shape[-2:]), F.hfft(F.rfft(x), n=6),
                F.rfft(x).abs(), F.rfft(x).angle(), F.irfft(F.rfft(x, n=14) * F.rfft(k, n=14) * (0.5 - 2j), n=14),
                torch.stft(x.reshape(3, 35), n_fft=8, hop_length=4, window=window, return_complex=True).abs())


@pytest.mark.parametrize("kind", ["opencl", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fft_transforms_run_as_torch_computes_them(kind):
    """Every output against torch's in float64: a complex tensor carried as (real, imaginary)
    pairs, each transformed dimension two products by the DFT's cosine and sine matrices."""
    from tvm_ext.relax.pipeline import load_model
    from tvm_ext.target import resolve_target

    gen = torch.Generator().manual_seed(3)
    x, k = torch.randn(3, 5, 7, generator=gen), torch.randn(7, generator=gen)
    model = load_model(import_exported_program(torch.export.export(_Spectra(), (x, k))), resolve_target(kind, 0),
                       None, function="main", log=None)
    outputs = model(x.numpy(), k.numpy())
    with torch.no_grad():
        expected = _Spectra()(x.double(), k.double())
    for ours, theirs in zip(outputs, expected, strict=True):
        assert ours.shape == tuple(theirs.shape)
        scale = float(theirs.abs().max())
        assert np.abs(ours - theirs.numpy()).max() <= 2e-6 * scale, np.abs(ours - theirs.numpy()).max() / scale


@pytest.mark.parametrize("forward, needle", [
    (lambda x: F.rfft(x).sum(), r"node 'sum.*reads a complex tensor"),
    (lambda x: F.rfft(x), r"node 'output'.*reads a complex tensor"),
    (lambda x: F.rfft(x).exp().real, r"node 'exp'.*reads a complex tensor: on complex tensors only"),
])
def test_what_reads_a_complex_tensor_we_do_not_carry_is_refused_by_name(forward, needle):
    """A complex tensor reaching an operator we do not convert for it (a sum), or leaving the
    program, is one error naming the node before the import."""

    class Model(nn.Module):
        def forward(self, x):
            return forward(x)

    program = torch.export.export(Model(), (torch.randn(2, 6),))
    with pytest.raises(TvmExtError, match=needle):
        import_exported_program(program)


def test_windows_exported_without_a_decomposition_are_torchs_constants(opencl, monkeypatch):
    """``hann_window`` and its kin, as torch 2.11 exports them (no decomposition: here the table
    without them), are constants by torch's formulas, periodic or not, of one sample too."""
    from tvm_ext.relax.pipeline import load_model

    windows = (torch.ops.aten.hann_window, torch.ops.aten.hamming_window, torch.ops.aten.blackman_window,
               torch.ops.aten.bartlett_window)
    table = torch.export.default_decompositions

    def without_windows():
        kept = table()
        for window in windows:
            for overload in window.overloads():
                kept.pop(getattr(window, overload), None)
        return kept

    class Windows(nn.Module):
        def forward(self, x):
            return (x + torch.hann_window(8), x[:7] + torch.hann_window(7, periodic=False),
                    x + torch.hamming_window(8), x[:5] + torch.hamming_window(5, False, alpha=0.6, beta=0.3),
                    x + torch.blackman_window(8), x[:6] + torch.bartlett_window(6, periodic=False),
                    x[:1] + torch.hann_window(1))

    x = torch.zeros(8)
    monkeypatch.setattr(torch.export, "default_decompositions", without_windows)
    program = torch.export.export(Windows(), (x,))
    assert "hann_window" in str(program.run_decompositions(without_windows()).graph)
    outputs = load_model(import_exported_program(program), opencl, None, function="main", log=None)(x.numpy())
    for ours, theirs in zip(outputs, Windows()(x), strict=True):
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6, atol=1e-7)
