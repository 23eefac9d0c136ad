"""ONNX's ``DFT`` and ``STFT``, which TVM 0.27's ONNX frontend has no converter for (torch's
ONNX exporters write ``torch.fft`` and ``torch.stft`` as them; audio front ends use them).

ONNX carries a complex tensor as a real one with a trailing axis of 2 (real, imaginary), or 1
for a real signal, so no complex type is needed: each transform is two matrix products by the
DFT's cosine and sine matrices (``torch_fft.dft_matrices``, constants of the transform's size),
which ``tune model`` tunes as GEMMs.  As the specification defines them: ``dft_length`` (zero
padding or truncation), ``axis`` (opset 17's attribute, opset 20's input), ``inverse`` (scaled
by 1/n), ``onesided`` (the first n/2 + 1 bins of a real signal's transform; with ``inverse``,
a one-sided spectrum back to its real signal); ``STFT``'s frames of ``frame_length`` every
``frame_step`` samples, times ``window`` (a signal of shape (batch, length), as torch's exporter
writes ``torch.stft``'s, read as a real one).  Lengths and axes must be constants; the windows and
``MelWeightMatrix`` with constant inputs are constants already (``onnx_fold``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import TvmExtError
from .onnx_operators import constant_int
from .torch_fft import along_last, dft_matrices


def _parts(bb: Any, x: Any) -> tuple[Any, Any | None]:
    """The real and imaginary parts of ONNX's layout (..., 1 | 2), the last axis dropped; None for
    the imaginary part of a real signal."""
    from tvm import relax

    width = int(x.ty.shape.values[-1])
    if width not in (1, 2):
        raise TvmExtError(f"ONNX DFT / STFT input's last axis must be 1 (real) or 2 (complex), got {width}")
    last = len(x.ty.shape.values) - 1
    re = bb.emit(relax.op.squeeze(bb.emit(relax.op.strided_slice(x, [last], [0], [1])), [last]))
    if width == 1:
        return re, None
    return re, bb.emit(relax.op.squeeze(bb.emit(relax.op.strided_slice(x, [last], [1], [2])), [last]))


def transformed(bb: Any, re: Any, im: Any | None, axis: int, length: int | None, inverse: bool, onesided: bool,
                weights: np.ndarray | None = None) -> Any:
    """The DFT of (re, im) along ``axis`` in ONNX's layout (..., 2), or (..., 1) for the real
    signal of an inverse one-sided transform; ``weights`` (a window) multiply the input samples."""
    from tvm import relax

    op = relax.op
    size = int(re.ty.shape.values[axis])
    dtype = str(re.ty.dtype)
    hermitian = inverse and onesided  # a one-sided spectrum back to its real signal
    n = length if length is not None else (2 * (size - 1) if hermitian else size)
    if onesided and not inverse and im is not None:
        raise TvmExtError("ONNX DFT with onesided=1 takes a real signal (ONNX defines no one-sided transform of a "
                          "complex one)")
    rows = min(size, n // 2 + 1) if hermitian else min(size, n)
    cols = n if inverse or not onesided else n // 2 + 1
    scale = 1.0 / n if inverse else 1.0
    w = np.ones(rows) if weights is None else np.asarray(weights, np.float64)[:rows]
    if hermitian:  # each bin but the first and the Nyquist one stands for itself and its conjugate
        w = w * np.where((np.arange(rows) == 0) | (2 * np.arange(rows) == n), 1.0, 2.0)
    cos, sin = dft_matrices(rows, cols, n, dtype, -1.0 if inverse else 1.0, w, scale)
    last = len(re.ty.shape.values) - 1

    def products(parts: tuple[Any, ...]) -> Any:
        if rows < size:  # a longer signal truncated to the transform's length
            parts = tuple(bb.emit(op.strided_slice(p, [last], [0], [rows])) for p in parts)
        part_re, part_im = parts if len(parts) == 2 else (parts[0], None)
        out_re = op.matmul(part_re, cos) if part_im is None else \
            op.add(op.matmul(part_re, cos), op.matmul(part_im, sin))
        if hermitian:
            return bb.emit(out_re)
        out_im = op.negative(op.matmul(part_re, sin)) if part_im is None else \
            op.subtract(op.matmul(part_im, cos), op.matmul(part_re, sin))
        return bb.emit(out_re), bb.emit(out_im)

    out = along_last(bb, (re,) if im is None else (re, im), axis, products)
    if hermitian:
        return bb.emit(op.expand_dims(out, -1))
    return bb.emit(op.stack(list(out), axis=-1))


def convert_dft(frontend: Any, bb: Any, inputs: list[Any], attrs: dict[str, Any], params: Any, opset: int) -> Any:
    x = inputs[0]
    length = constant_int(frontend, inputs[1] if len(inputs) > 1 else None, params, "dft_length", "DFT")
    if opset >= 20:
        axis = constant_int(frontend, inputs[2] if len(inputs) > 2 else None, params, "axis", "DFT")
        axis = -2 if axis is None else axis
    else:
        axis = int(attrs.get("axis", 1))
    rank = len(x.ty.shape.values)
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank - 1:
        raise TvmExtError(f"ONNX DFT axis {axis} of an input of rank {rank}: the last axis holds (real, imaginary)")
    re, im = _parts(bb, x)
    return transformed(bb, re, im, axis, length, bool(attrs.get("inverse", 0)), bool(attrs.get("onesided", 0)))


def convert_stft(frontend: Any, bb: Any, inputs: list[Any], attrs: dict[str, Any], params: Any) -> Any:
    import tvm
    from tvm import relax

    x = inputs[0]
    if len(x.ty.shape.values) == 2:  # (batch, length): a real signal as torch's exporter writes it
        x = bb.emit(relax.op.expand_dims(x, -1))
    step = constant_int(frontend, inputs[1], params, "frame_step", "STFT")
    window = inputs[2] if len(inputs) > 2 else None
    if window is not None:
        window = frontend.get_constant(window, params)
        if not isinstance(window, tvm.ir.expr.Constant):
            raise TvmExtError("ONNX STFT window must be a constant (an initializer or a window operator of a "
                              "constant size)")
        window = window.value.numpy().astype(np.float64)
    frame = constant_int(frontend, inputs[3] if len(inputs) > 3 else None, params, "frame_length", "STFT")
    length = int(x.ty.shape.values[1])
    frame = frame if frame is not None else (len(window) if window is not None else length)
    if window is not None and len(window) != frame:
        raise TvmExtError(f"ONNX STFT with a window of {len(window)} samples and frame_length={frame}: only a "
                          "window of the frame's length is supported")
    frames = 1 + (length - frame) // step
    if frames < 1 or step < 1:
        raise TvmExtError(f"ONNX STFT frame_length={frame}, frame_step={step} over a signal of {length} samples "
                          "makes no frame")
    starts = np.arange(frames)[:, None] * step + np.arange(frame)[None, :]  # (frames, frame) sample indices
    re, im = _parts(bb, x)
    index = relax.const(starts.reshape(-1).astype("int64"))

    def framed(part: Any) -> Any:
        taken = bb.emit(relax.op.take(part, index, axis=1))
        return bb.emit(relax.op.reshape(taken, [x.ty.shape.values[0], frames, frame]))

    return transformed(bb, framed(re), framed(im) if im is not None else None, 2, frame, False,
                       bool(attrs.get("onesided", 1)), window)


def spectral_converters(frontend: Any) -> dict[str, Any]:
    """``DFT`` and ``STFT`` as TVM's frontend takes them."""

    class DFT(frontend.OnnxOpConverter):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v17(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            return convert_dft(frontend, bb, list(inputs), attr, params, 17)

        @classmethod
        def _impl_v20(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            return convert_dft(frontend, bb, list(inputs), attr, params, 20)

    class STFT(frontend.OnnxOpConverter):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v17(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            return convert_stft(frontend, bb, list(inputs), attr, params)

    return {"DFT": DFT, "STFT": STFT}
