"""``torch.fft`` in a torch program, which TVM 0.27's torch frontend has no converter for (and
Relax has no complex type): FNet's ``fftn(x).real``, ``rfft`` / ``irfft`` and their n-dimensional
forms.

A complex tensor is carried as a real tensor with a trailing axis of two (real, imaginary), the
layout ``view_as_real`` gives, so ``view_as_real`` and ``view_as_complex`` are the identity and
torch's ``select(..., -1, 0)`` after them reads the real part; ``abs``, ``angle``, ``conj``,
``mul`` (by a complex or real tensor or number), ``permute`` and ``view`` are converted on it
(a spectrogram's magnitude, an FFT convolution).  Each transformed dimension is two
matrix products by the DFT's cosine and sine matrices (constants of the dimension's size), which
``tune model`` tunes as GEMMs.  A complex tensor reaching any other operator (an ``abs``, a
product) is refused by name before the import (``complex_consumers``).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.errors import TvmExtError

REAL_TYPE = {"complex64": "float32", "complex128": "float64"}


def _is_complex(value: Any) -> bool:
    val = value.meta.get("val") if hasattr(value, "meta") else None
    return bool(getattr(getattr(val, "dtype", None), "is_complex", False))


def complex_consumers(program: Any) -> list[Any]:
    """The program's complex inputs, and the nodes that take a complex tensor but are neither
    converted here (``CONVERTERS``) nor a copy of it, the program's output among them (its caller
    would read the pairs)."""
    found = []
    complex_operators = {*CONVERTERS, "clone.default", "alias.default"}  # ours, and the layout's copies
    for node in program.graph.nodes:
        args = [a for a in node.args if hasattr(a, "meta")] + [a for v in node.args if isinstance(v, (list, tuple))
                                                                for a in v if hasattr(a, "meta")]
        if any(_is_complex(a) for a in args) and \
                (node.op == "output" or getattr(node.target, "__name__", None) not in complex_operators):
            found.append(node)
    complex_inputs = [n for n in program.graph.nodes if n.op == "placeholder" and _is_complex(n)]
    return complex_inputs + found


def refuse_complex(program: Any, name_of: Any) -> None:
    """One ``TvmExtError`` naming the first node that would read a complex tensor we cannot carry."""
    found = complex_consumers(program)
    if found:
        what = "is a complex input" if found[0].op == "placeholder" else "reads a complex tensor"
        raise TvmExtError(f"{name_of(found[0])} {what}: on complex tensors only torch.fft's transforms, "
                          "view_as_real / view_as_complex (real, imag), abs, angle, conj, mul, permute and view "
                          "are converted (Relax has no complex type)")


def _pair(importer: Any, real: Any, imaginary: Any) -> Any:
    from tvm import relax

    return importer.block_builder.emit(relax.op.stack([real, imaginary], axis=-1))


def _parts(importer: Any, pair: Any) -> tuple[Any, Any]:
    from tvm import relax

    emit = importer.block_builder.emit
    rank = len(pair.ty.shape.values)
    return tuple(emit(relax.op.squeeze(relax.op.strided_slice(pair, [rank - 1], [i], [i + 1]), [rank - 1]))
                 for i in (0, 1))


def _to_complex_or_as_torch(node: Any, importer: Any) -> Any:
    """``_to_copy`` to a complex type: the real tensor with a zero imaginary part; any other
    ``_to_copy`` as TVM's frontend converts it."""
    from tvm import relax

    dtype = str(node.kwargs.get("dtype", "")).replace("torch.", "")
    x = importer.env[node.args[0]]
    if dtype not in REAL_TYPE:
        if _is_complex(node.args[0]):
            raise TvmExtError(f"a complex tensor cast to {dtype or 'another type'} is not converted")
        return _frontends_own(importer, "_to_copy.default")(node)
    if _is_complex(node.args[0]):  # complex64 <-> complex128: both parts
        return x if str(x.ty.dtype) == REAL_TYPE[dtype] else importer.block_builder.emit(
            relax.op.astype(x, REAL_TYPE[dtype]))
    real = importer.block_builder.emit(relax.op.astype(x, REAL_TYPE[dtype]))
    return _pair(importer, real, importer.block_builder.emit(relax.op.zeros_like(real)))


def _scale(normalization: int, size: int) -> float:
    """aten's ``normalization``: 0 none, 1 by 1/sqrt(n) ("ortho"), 2 by 1/n."""
    return {0: 1.0, 1: 1.0 / math.sqrt(size), 2: 1.0 / size}[int(normalization)]


def along_last(bb: Any, parts: tuple[Any, ...], axis: int, fn: Any) -> Any:
    """``fn`` of ``parts`` (tensors of one shape) with ``axis`` moved last, where the matrices
    multiply from the right; what it gives (a tensor or a tuple of them) moved back (``bb``: the
    block builder the permutations are emitted into)."""
    from tvm import relax

    emit = bb.emit
    rank = len(parts[0].ty.shape.values)
    if axis == rank - 1:
        return fn(parts)
    order = [d for d in range(rank) if d != axis] + [axis]
    back = [order.index(d) for d in range(rank)]
    out = fn(tuple(emit(relax.op.permute_dims(p, order)) for p in parts))
    if isinstance(out, tuple):
        return tuple(emit(relax.op.permute_dims(p, back)) for p in out)
    return emit(relax.op.permute_dims(out, back))


def dft_matrices(rows: int, cols: int, size: int, dtype: str, sign: float, weights: np.ndarray | None = None,
                  scale: float = 1.0) -> tuple[Any, Any]:
    """cos and sign * sin of 2 pi j k / size for j < rows, k < cols, times ``weights`` (by row) and
    ``scale``, as constants of ``dtype`` (computed in float64)."""
    from tvm import relax

    angle = 2 * np.pi * (np.outer(np.arange(rows), np.arange(cols)) % size) / size
    w = (np.ones(rows) if weights is None else weights)[:, None] * scale
    return (relax.const((np.cos(angle) * w).astype(dtype)), relax.const((sign * np.sin(angle) * w).astype(dtype)))


def _transform(importer: Any, pair: Any, axis: int, forward: bool, scale: float) -> Any:
    """The DFT of ``pair`` (a complex tensor's layout) along ``axis``: (re, im) times (C, S) with
    S's sign the direction's, re' = re C + im S and im' = im C - re S."""
    from tvm import relax

    emit = importer.block_builder.emit
    re, im = _parts(importer, pair)
    size = int(re.ty.shape.values[axis])
    cos, sin = dft_matrices(size, size, size, str(re.ty.dtype), 1.0 if forward else -1.0, scale=scale)

    def products(parts: tuple[Any, Any]) -> tuple[Any, Any]:
        part_re, part_im = parts
        return (emit(relax.op.add(relax.op.matmul(part_re, cos), relax.op.matmul(part_im, sin))),
                emit(relax.op.subtract(relax.op.matmul(part_im, cos), relax.op.matmul(part_re, sin))))

    return _pair(importer, *along_last(importer.block_builder, (re, im), axis, products))


def _dims(node: Any, rank: int) -> list[int]:
    return [int(d) % rank for d in node.args[1]]


def _fft_c2c(node: Any, importer: Any) -> Any:
    """``_fft_c2c(x, dim, normalization, forward)``: the DFT along each of ``dim``."""
    pair = importer.env[node.args[0]]
    rank = len(pair.ty.shape.values) - 1
    dims, forward = _dims(node, rank), bool(node.args[3])
    for d in dims:
        pair = _transform(importer, pair, d, forward, _scale(node.args[2], int(pair.ty.shape.values[d])))
    return pair


def _fft_r2c(node: Any, importer: Any) -> Any:
    """``_fft_r2c(x, dim, normalization, onesided)``: x real; with ``onesided`` the last of ``dim``
    keeps its first n // 2 + 1 frequencies, as ``rfft`` gives them."""
    from tvm import relax

    x = importer.env[node.args[0]]
    rank = len(x.ty.shape.values)
    pair = _pair(importer, x, importer.block_builder.emit(relax.op.zeros_like(x)))
    dims = _dims(node, rank)
    for d in dims:
        pair = _transform(importer, pair, d, True, _scale(node.args[2], int(x.ty.shape.values[d])))
    if bool(node.args[3]):
        last = dims[-1]
        pair = importer.block_builder.emit(relax.op.strided_slice(
            pair, [last], [0], [int(x.ty.shape.values[last]) // 2 + 1]))
    return pair


def _fft_c2r(node: Any, importer: Any) -> Any:
    """``_fft_c2r(x, dim, normalization, last_dim_size)``: the inverse DFT along ``dim`` of a
    spectrum whose last dimension holds frequencies 0 .. n // 2 (n = ``last_dim_size``), the rest
    being their conjugates, as ``irfft`` reads it (the imaginary parts of 0 and n / 2 unread)."""
    from tvm import relax

    emit = importer.block_builder.emit
    pair = importer.env[node.args[0]]
    rank = len(pair.ty.shape.values) - 1
    dims, size = _dims(node, rank), int(node.args[3])
    total = size * int(np.prod([int(pair.ty.shape.values[d]) for d in dims[:-1]]))
    for d in dims[:-1]:
        pair = _transform(importer, pair, d, False, 1.0)
    re, im = _parts(importer, pair)
    kept = int(re.ty.shape.values[dims[-1]])
    weights = np.where((np.arange(kept) == 0) | (2 * np.arange(kept) == size), 1.0, 2.0)
    cos, sin = dft_matrices(kept, size, size, str(re.ty.dtype), 1.0, weights, _scale(node.args[2], total))

    def real_part(parts: tuple[Any, Any]) -> Any:
        return emit(relax.op.subtract(relax.op.matmul(parts[0], cos), relax.op.matmul(parts[1], sin)))

    return along_last(importer.block_builder, (re, im), dims[-1], real_part)


def _frontends_own(importer: Any, key: str) -> Any:
    """TVM's own converter of ``key`` (which ours replace in the importer's table), its table made
    once an import."""
    table = getattr(importer, "_tvm_ext_frontends_own", None)
    if table is None:
        table = importer._tvm_ext_frontends_own = type(importer).create_convert_map(importer)
    return table[key]


def _complex_or_as_torch(key: str, on_complex: Any) -> Any:
    """A converter that runs ``on_complex`` where an argument is complex, else TVM's own."""
    def convert(node: Any, importer: Any) -> Any:
        if any(_is_complex(a) for a in node.args):
            return on_complex(node, importer)
        return _frontends_own(importer, key)(node)

    return convert


def _conjugate(node: Any, importer: Any) -> Any:
    from tvm import relax

    re, im = _parts(importer, importer.env[node.args[0]])
    return _pair(importer, re, importer.block_builder.emit(relax.op.negative(im)))


def _magnitude(node: Any, importer: Any) -> Any:
    """``abs`` of a complex tensor: sqrt(re^2 + im^2), real (a spectrum's magnitude)."""
    from tvm import relax

    re, im = _parts(importer, importer.env[node.args[0]])
    return importer.block_builder.emit(relax.op.sqrt(relax.op.add(relax.op.multiply(re, re),
                                                                  relax.op.multiply(im, im))))


def _complex_product(node: Any, importer: Any) -> Any:
    """``mul`` with a complex operand (a filter applied to a spectrum): by a complex tensor or
    number, (a + bi)(c + di) = (ac - bd) + (ad + bc)i; by a real tensor or number, each part."""
    from tvm import relax

    emit = importer.block_builder.emit
    a, b = node.args[:2]
    if not _is_complex(a):
        a, b = b, a
    a_re, a_im = _parts(importer, importer.env[a])
    if isinstance(b, complex):
        b_re, b_im = (relax.const(v, str(a_re.ty.dtype)) for v in (b.real, b.imag))
    elif _is_complex(b):
        b_re, b_im = _parts(importer, importer.env[b])
    else:
        factor = importer.env[b] if hasattr(b, "meta") else relax.const(float(b), str(a_re.ty.dtype))
        return _pair(importer, emit(relax.op.multiply(a_re, factor)), emit(relax.op.multiply(a_im, factor)))
    return _pair(importer, emit(relax.op.subtract(relax.op.multiply(a_re, b_re), relax.op.multiply(a_im, b_im))),
                 emit(relax.op.add(relax.op.multiply(a_re, b_im), relax.op.multiply(a_im, b_re))))


def _phase(node: Any, importer: Any) -> Any:
    """``angle`` of a complex tensor: atan2(im, re)."""
    from tvm import relax

    re, im = _parts(importer, importer.env[node.args[0]])
    return importer.block_builder.emit(relax.op.atan2(im, re))


def _permuted(node: Any, importer: Any) -> Any:
    """``permute`` of a complex tensor: its dimensions moved, the (real, imaginary) axis kept last."""
    from tvm import relax

    pair = importer.env[node.args[0]]
    rank = len(pair.ty.shape.values) - 1
    return importer.block_builder.emit(relax.op.permute_dims(pair, [int(d) % rank for d in node.args[1]] + [rank]))


def _viewed(node: Any, importer: Any) -> Any:
    """``view`` of a complex tensor: its shape with the (real, imaginary) axis kept last."""
    from tvm import relax

    shape = [int(d) if not hasattr(d, "meta") else importer.env[d] for d in node.args[1]]
    return importer.block_builder.emit(relax.op.reshape(importer.env[node.args[0]], shape + [2]))


def _window(kind: str) -> Any:
    """``hann_window`` / ``hamming_window`` / ``blackman_window`` / ``bartlett_window`` (an
    ``stft``'s window) as a constant, by torch's formulas: torch 2.11 exports them without a
    decomposition, and TVM's frontend has no converter for them."""
    def convert(node: Any, importer: Any) -> Any:
        from tvm import relax

        length, periodic = int(node.args[0]), bool(node.args[1]) if len(node.args) > 1 else True
        dtype = str(node.kwargs.get("dtype") or "torch.float32").replace("torch.", "")
        if length == 1:
            return relax.const(np.ones(1, dtype))
        n = np.arange(length, dtype=np.float64)
        phase = 2 * np.pi * n / (length if periodic else length - 1)
        if kind == "hann":
            values = 0.5 - 0.5 * np.cos(phase)
        elif kind == "hamming":
            alpha = float(node.args[2]) if len(node.args) > 2 else 0.54
            beta = float(node.args[3]) if len(node.args) > 3 else 0.46
            values = alpha - beta * np.cos(phase)
        elif kind == "blackman":
            values = 0.42 - 0.5 * np.cos(phase) + 0.08 * np.cos(2 * phase)
        else:  # bartlett
            values = 1 - np.abs(phase / np.pi - 1)
        return relax.const(values.astype(dtype))

    return convert


WINDOWS = {f"{kind}_window.{overload}": _window(kind) for kind in ("hann", "hamming", "blackman", "bartlett")
           for overload in ("default", "periodic")} | {
    f"hamming_window.{overload}": _window("hamming") for overload in ("periodic_alpha", "periodic_alpha_beta")}


def _identity(node: Any, importer: Any) -> Any:
    """``view_as_real`` / ``view_as_complex``: the (real, imaginary) layout is both."""
    return importer.env[node.args[0]]


CONVERTERS = {"_fft_c2c.default": _fft_c2c, "_fft_r2c.default": _fft_r2c, "_fft_c2r.default": _fft_c2r,
              "view_as_real.default": _identity, "view_as_complex.default": _identity,
              "_to_copy.default": _to_complex_or_as_torch, "_conj.default": _conjugate,
              "abs.default": _complex_or_as_torch("abs.default", _magnitude),
              "mul.Tensor": _complex_or_as_torch("mul.Tensor", _complex_product), "angle.default": _phase,
              "permute.default": _complex_or_as_torch("permute.default", _permuted),
              "view.default": _complex_or_as_torch("view.default", _viewed), **WINDOWS}
