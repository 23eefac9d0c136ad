"""Relax rewrites applied before a model is legalized, so its kernels take the shapes our
templates tune: every variant of a model (tuned, TVM's default schedules, meta_schedule) is
built from the same rewritten module.

- ``accumulate_fp32``: a float16/bfloat16 ``matmul`` accumulating in its operand type becomes
  a float32-accumulating matmul and a cast back, as cuBLAS and PyTorch compute it; the cast
  is an elementwise epilogue the matmul kernel stores.
- ``sink_reshapes``: an elementwise op applied after a ``reshape`` (PyTorch's exported
  ``Linear`` flattens to 2-D for the matmul and reshapes back before GELU or a residual add)
  is applied before it, and reshapes of reshapes collapse.  TVM's ``FuseOps`` stops fusing at
  a reshape, so this is what lets the bias, the GELU and the residual add join the matmul's
  store instead of running as kernels of their own.
- ``fp8_weight_rows``: a ``matmul`` of 8-bit floats whose second operand is a 2-D weight
  transposed (``permute_dims(w)``, a ``Linear`` as quantized models write it) becomes one
  computation reading ``w[n, k]`` as stored, accumulating in float32, and a cast to the
  matmul's dtype.  Hopper's 8-bit wgmma reads both operands K-major only; left as it was, the
  transpose is a kernel of its own (or, for a constant weight, folded into a [k, n] copy) and
  the matmul gets B as [k, n], which no 8-bit kernel reads.
- ``ragged_weight_rows``: on a GPU with wgmma, the same for a 16-bit ``Linear`` whose even N no
  wgmma tile divides (a vocabulary of 30522, 1000 classes), whose K is a multiple of 64, and
  whose N and rows fill more than half of a 64-wide tile (else mma.sync, which reads B as (K, N),
  takes it: 10 classes, a batch of 8):
  B stored (K, N) takes
  no such N on wgmma (its rows no multiple of 16 bytes, its atoms of 64 columns), B read as
  stored (N, K) does, its last tile column guarded (on the H200, 1024x30522x768 at 1.65x cuBLAS
  against mma.sync's 0.68x; docs/results/gemm.md).
- ``narrow_weight_rows``: on a GPU with wgmma, the same for a 16-bit ``Linear`` whose wgmma
  pick with B read as stored (N, K) is the warp-specialized narrow tile (``narrow_specialized``:
  BERT-base's 1024x768x768 projections and its 1024x768x3072 FFN down), which B stored (K, N)
  does not take (on the H200 the projections at 1.23x cuBLAS read as stored, 1.10-1.15x as (K,
  N); docs/results/gemm.md).  For both
  16-bit rules a constant ``[k, n]`` weight (an ONNX ``MatMul`` on a ``Linear``'s initializer,
  folded to ``[k, n]`` by its exporter) is transposed here, once, and read as stored the same way.
- ``plain_matmul_operands``: a ``matmul`` whose operand is a ``broadcast_to`` of a tensor to its
  own shape, or of a 2-D weight to a batch of copies (torch's decomposed ``Linear`` on a 3-D
  input writes both), takes the tensor itself (the matmul broadcasts a 2-D B over A's batch); and
  a ``matmul`` of a transpose (and reshapes, squeezes) that keep the last axis (a ``batch_first``
  GRU's output going into its head, from either importer) by a 2-D weight no wider than it is
  deep multiplies first, as one GEMM, and transposes and reshapes the narrower product.  Left as
  they were, the copies and the wide transpose are kernels of their own and the matmul a batched
  GEMM.
- ``narrow_padded_columns``: a 16-bit ``matmul`` storing its operand type by a constant weight
  narrower than 32 columns whose rows are no whole 16 bytes (a speech model's 29 classes, 10
  classes) multiplies by that weight with zero columns to 32 and takes the product's first
  columns with a gather.  Rows of 58 bytes cannot be copied 16 bytes at a time: the GEMM read them
  a value at a time, outside its asynchronous copy pipeline.  The gather is a kernel of its own
  (a slice would fuse into the GEMM's function, whose store no template composes).
- ``whole_reductions``: a reduction over every axis (``x.sum()``, ``x.mean()``, an argmax of the
  flattened tensor) reduces a ``(1, n)`` reshape of its input over the last axis, reshaped to
  its output's shape.  A reduction to one value has no spatial axis for dlight's rules: their
  fallback launched one kernel per element (12 launches for 12 elements, a million for a
  million) and kept the sum in a buffer of the host's, which the OpenCL executor does not have;
  as one row it takes the row schedules and the row template.
- ``empty_concats``: a ``concat`` drops its operands of no elements (a model's partial rotary
  embedding whose rotated part is the whole head: Phi-3 concatenates ``q[..., 16:]`` of a
  16-wide head): their blocks have loops of extent 0, which dlight's fallback divides by.
- ``clamp_takes``: a ``take`` in fast mode takes in clip mode.  TVM 0.27's frontends take rows
  in fast mode (torch's ``embedding``, ONNX's ``Gather``), which reads outside the data for an
  index past it (a token id past an embedding table; torch raises there): an illegal address on
  CUDA, which ends the process's CUDA context.  Clamped, a bad id reads the last (or first) row:
  wrong for that token, never out of bounds.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

LOW_PRECISION = ("float16", "bfloat16")
UNARY = ("relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.relu", "relax.nn.silu", "relax.sigmoid", "relax.tanh",
         "relax.exp", "relax.astype", "relax.negative", "relax.sqrt", "relax.erf")
BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")
LAYOUT_OPS = ("relax.reshape", "relax.permute_dims", "relax.squeeze", "relax.expand_dims")
MAX_LAYOUT_OPS = 8  # of them followed back from a value (``layout_source``)
# ``narrow_padded_columns``: a weight's rows are read 16 bytes at a time where they are whole
# 16-byte rows (8 16-bit values); one narrower than a tile's 32 columns is padded to them
ROW_ALIGN, PADDED_COLUMNS = 8, 32
WEIGHT_ROWS = "matmul_weight_rows"  # the PrimFunc of a matmul reading its weight (N, K) as stored
WHOLE_REDUCTIONS = ("relax.sum", "relax.mean", "relax.max", "relax.min", "relax.prod", "relax.variance", "relax.std",
                    "relax.argmax", "relax.argmin")


def _shape(expr: Any) -> tuple[Any, ...] | None:
    values = getattr(getattr(getattr(expr, "ty", None), "shape", None), "values", None)
    return None if values is None else tuple(values)


def _static(shape: tuple[Any, ...] | None) -> tuple[int, ...] | None:
    if shape is None or not all(hasattr(d, "value") for d in shape):
        return None
    return tuple(int(d.value) for d in shape)


def keeps_last_axis(call: Any) -> bool:
    """Whether a reshape, transpose, squeeze or expand_dims (``LAYOUT_OPS``) leaves the last axis
    where and as it was (the others being a reshape of the same data but for a transpose)."""
    before, after = _shape(call.args[0]), _shape(call)
    if not before or not after:
        return False
    name = _op_name(call)
    if name == "relax.permute_dims":
        axes = call.attrs.axes
        return axes is not None and int(axes[-1]) == len(before) - 1
    if name in ("relax.squeeze", "relax.expand_dims"):  # no axis of theirs the last
        axes, rank = call.attrs.axis, len(before if name == "relax.squeeze" else after)
        return axes is not None and all(int(a) % rank != rank - 1 for a in axes)
    import tvm_ffi

    return bool(tvm_ffi.structural_equal(before[-1], after[-1]))


def bound_value(mutator: Any, expr: Any) -> Any:
    """What a ``relax.PyExprMutator`` has ``expr`` (a variable) bound to, else ``expr``."""
    from tvm import relax

    bound = mutator.lookup_binding(expr) if isinstance(expr, relax.Var) else None
    return bound if bound is not None else expr


def layout_source(expr: Any, producer: Any) -> tuple[Any, list[Any]]:
    """(the value under ``expr``'s ``LAYOUT_OPS`` that keep the last axis, those ops from the
    outermost in), each op found by ``producer`` (a variable's bound value)."""
    layout: list[Any] = []
    op = producer(expr)
    while len(layout) < MAX_LAYOUT_OPS and _op_name(op) in LAYOUT_OPS and keeps_last_axis(op):
        layout.append(op)
        expr = op.args[0]
        op = producer(expr)
    return expr, layout


def replay_layout(emit: Any, value: Any, layout: list[Any], last: Any) -> Any:
    """``value`` through ``layout``'s ops (``layout_source``'s, innermost first), its last axis
    ``last`` long: each transpose as it was, every other op as a reshape to its shape with that
    last axis; each operand that is a call emitted first, the last op returned unemitted."""
    from tvm import relax

    for op in reversed(layout):
        value = emit(value) if isinstance(value, relax.Call) else value
        value = relax.op.permute_dims(value, op.attrs.axes) if _op_name(op) == "relax.permute_dims" \
            else relax.op.reshape(value, [*_shape(op)[:-1], last])
    return value


def _op_name(expr: Any) -> str:
    from tvm.ir.expr import Call

    return str(getattr(expr.op, "name", "")) if isinstance(expr, Call) else ""


def _transposed_matrix(value: Any) -> Any:
    """The matrix ``value`` is the transpose of (``permute_dims``, axes ``[1, 0]`` or none given),
    else None: how a ``Linear``'s weight ``[n, k]`` reaches its matmul as B ``[k, n]``."""
    if _op_name(value) != "relax.permute_dims":
        return None
    axes = value.attrs.axes
    return value.args[0] if axes is None or [int(x) for x in axes] == [1, 0] else None


def constant_columns(b: Any, producer: Callable[[Any], Any]) -> np.ndarray | None:
    """The numpy value ``[k, n]`` of a matmul's B where it is constant: a constant ``[k, n]``
    itself, or the transpose (``permute_dims``, axes ``[1, 0]`` or none given) of a constant
    ``[n, k]``, each seen through ``producer`` (the binding a variable names); else None.  The
    narrow-head padding and the fold of a ``Linear`` into a GRU's or LSTM's input projection both
    read a weight this way."""
    from tvm.ir.expr import Constant
    from tvm.runtime import Tensor

    value = producer(b)
    source = _transposed_matrix(value)
    transposed = source is not None
    if transposed:
        value = producer(source)
    tensor = getattr(value, "value", None) if isinstance(value, Constant) else None
    if not isinstance(tensor, Tensor) or len(tensor.shape) != 2:
        return None
    return tensor.numpy().T if transposed else tensor.numpy()


def _wgmma_takes_ragged_n(rows: int, n: int, k: int) -> bool:
    """``ragged_weight_rows``'s rule, by the wgmma template's own: an even N its smallest tile
    (64x64) does not divide, K a whole number of its k steps, and M and N filling more than
    ``RAGGED_PADDING`` of that tile's last row and column (else mma.sync takes the matmul)."""
    from ..schedules.gemm.wgmma import BK, WgmmaTile
    from ..schedules.gemm.wgmma_template import RAGGED_PADDING, column_padding, padding

    smallest, shapes = WgmmaTile(64, 64), [(rows, n, k)]
    return (n % 2 == 0 and k % BK == 0 and 0 < column_padding(smallest, shapes) < RAGGED_PADDING
            and padding(smallest, shapes) < RAGGED_PADDING)


def _wgmma_picks_specialized(rows: int, n: int, k: int, dtype: str, target: Any) -> bool:
    """``narrow_weight_rows``'s rule, by the wgmma template's own: its pick for the matmul with Bt
    stored (N, K) is warp-specialized (B stored (K, N) keeps such a tile not specialized)."""
    from ..core.errors import TvmExtError
    from ..schedules.gemm.wgmma_template import WgmmaGemmTemplate

    try:
        config = WgmmaGemmTemplate(rows, n, k, b_layout="NK", dtype=dtype).default_config(target)
    except TvmExtError:  # no tile fits: the matmul stays as it is
        return False
    return bool(config.as_dict()["wgmma_ws"])


def _matmul_weight_rows(a: Any, w: Any) -> Any:
    """TE: ``a[..., m, k] · w[n, k]ᵀ`` in float32 (the block named ``matmul``, as a legalized
    ``matmul``'s)."""
    from tvm import te

    k = te.reduce_axis((0, a.shape[-1]), "k")
    return te.compute((*a.shape[:-1], w.shape[0]), lambda *at: te.sum(
        a[(*at[:-1], k)].astype("float32") * w[at[-1], k].astype("float32"), axis=k), name="matmul")


def _make_mutator() -> Any:
    from tvm import relax
    from tvm.ir.expr import GenericConst  # TVM 0.27's Relax constant (its ``value`` a tensor)
    from tvm.runtime import Tensor

    @relax.expr_functor.mutator
    class Rewriter(relax.PyExprMutator):  # type: ignore[misc]
        def __init__(self, mod: Any, target: Any = None) -> None:
            from ..hardware import has_wgmma

            super().__init__(mod)
            self.changed = 0
            self.wgmma_target = target if target is not None and has_wgmma(target) else None  # ``*_weight_rows``

        def _producer(self, expr: Any) -> Any:
            return bound_value(self, expr)

        def _from_matmul(self, expr: Any, depth: int = 0) -> bool:
            """Whether ``expr`` is a matmul (or the ``*_weight_rows`` computation one became), or
            elementwise ops on one: where an op moved before a reshape ends up in a fused matmul
            kernel (moving ops toward anything else could move them back and forth)."""
            bound = self._producer(expr)
            name = _op_name(bound)
            if name == "relax.matmul" or (name == "relax.call_tir" and str(
                    getattr(bound.args[0], "name_hint", "")).startswith(WEIGHT_ROWS)):
                return True
            if depth < 8 and name in UNARY + BINARY:
                return any(self._from_matmul(a, depth + 1) for a in bound.args[:2])
            return False

        def _reshape_source(self, expr: Any, anchored: bool = True) -> tuple[Any, tuple[int, ...]] | None:
            """(y, shape of the reshape) when ``expr`` is bound to reshape(y, ...) of static shapes
            (and, ``anchored``, y comes from a matmul)."""
            bound = self._producer(expr)
            if _op_name(bound) != "relax.reshape":
                return None
            src = bound.args[0]
            if _static(_shape(src)) is None or _static(_shape(expr)) is None:
                return None
            if anchored and not self._from_matmul(src):
                return None
            return src, _static(_shape(expr))

        def visit_call_(self, call: Any) -> Any:  # noqa: N802 (TVM's visitor name)
            call = self.visit_expr_post_order(call)
            name = _op_name(call)
            if name == "relax.matmul":
                simpler = self._plain_operands(call)
                if simpler is None:
                    simpler = self._padded_columns(call)
                if simpler is not None:
                    return simpler
                rows = self._weight_rows(call)
                return rows if rows is not None else self._accumulate_fp32(call)
            if name == "relax.reshape":
                inner = self._reshape_source(call.args[0], anchored=False)
                if inner is not None:
                    src, _ = inner
                    self.changed += 1
                    if _static(_shape(src)) == _static(_shape(call)):
                        return src
                    return relax.op.reshape(src, call.args[1])
                return call
            if name in UNARY:
                inner = self._reshape_source(call.args[0])
                if inner is None:
                    return call
                src, shape = inner
                self.changed += 1
                moved = self.builder_.emit(relax.Call(call.op, [src] + list(call.args[1:]), call.attrs))
                return relax.op.reshape(moved, shape)
            if name in BINARY:
                return self._binary(call)
            if name in WHOLE_REDUCTIONS:
                return self._whole_reduction(call)
            if name == "relax.concat":
                return self._without_empty_operands(call)
            if name == "relax.take" and call.attrs.mode == "fast":  # clamp_takes (idempotent: not counted)
                return relax.op.take(call.args[0], call.args[1], call.attrs.axis, mode="clip")
            return call

        def _whole_reduction(self, call: Any) -> Any:
            """``whole_reductions``: ``call`` over a ``(1, n)`` reshape of its input where it
            reduces every axis of a static shape (else ``call``)."""
            shape, out = _static(_shape(call.args[0])), _static(_shape(call))
            axis = call.attrs.axis
            if not shape or out is None:
                return call
            axes = range(len(shape)) if axis is None else [axis] if isinstance(axis, int) or hasattr(axis, "value") \
                else list(axis)
            if {int(a) % len(shape) for a in axes} != set(range(len(shape))):
                return call
            self.changed += 1
            row = self.builder_.emit(relax.op.reshape(call.args[0], (1, int(np.prod(shape)))))
            op = getattr(relax.op, _op_name(call).removeprefix("relax."))
            reduced = self.builder_.emit(op(row, 1) if _op_name(call) in ("relax.argmax", "relax.argmin")
                                         else op(row, [1]))
            return relax.op.reshape(reduced, out)

        def _without_empty_operands(self, call: Any) -> Any:
            """``empty_concats``: ``call`` without its operands of no elements (static shapes with
            a zero), where a non-empty one is left (else ``call``)."""
            operands = self._producer(call.args[0])
            if not isinstance(operands, relax.Tuple):
                return call
            shapes = [_static(_shape(f)) for f in operands.fields]
            kept = [f for f, shape in zip(operands.fields, shapes) if shape is None or 0 not in shape]
            if len(kept) == len(shapes) or not kept:
                return call
            self.changed += 1
            return kept[0] if len(kept) == 1 else relax.op.concat(kept, call.attrs.axis)

        def _binary(self, call: Any) -> Any:
            for side in (0, 1):
                inner = self._reshape_source(call.args[side])
                if inner is None:
                    continue
                src, shape = inner
                other = call.args[1 - side]
                src_shape, other_shape = _static(_shape(src)), _static(_shape(other))
                if other_shape is None:
                    continue
                if other_shape == shape:  # the same shape: reshape the other operand too
                    other = self.builder_.emit(relax.op.reshape(other, src_shape))
                elif not (len(other_shape) <= 1 and src_shape and shape[-1] == src_shape[-1]):
                    continue  # a broadcast that the reshape changes
                args = [src, other] if side == 0 else [other, src]
                self.changed += 1
                moved = self.builder_.emit(relax.Call(call.op, args, call.attrs))
                return relax.op.reshape(moved, shape)
            return call

        def _stored_rows(self, b: Any, eight_bit: bool) -> tuple[Any, tuple[int, ...] | None, bool]:
            """The weight ``w[n, k]`` a matmul's B (``[k, n]``) is the transpose of, its static shape,
            and whether it is still to be transposed: ``w`` of ``permute_dims(w)``, or a 16-bit
            constant B itself (an ONNX ``MatMul`` on a ``Linear``'s initializer, which its exporter
            folded to ``[k, n]``), which the caller transposes once a rule takes the matmul; else
            (None, None, False)."""
            transposed = self._producer(b)
            source = _transposed_matrix(transposed)
            if source is not None:
                return source, _static(_shape(source)), False
            value = getattr(transposed, "value", None) if isinstance(transposed, GenericConst) else None
            if not eight_bit and isinstance(value, Tensor) and len(value.shape) == 2:
                return value, (int(value.shape[1]), int(value.shape[0])), True
            return None, None, False

        def _wgmma_reads_rows(self, rows: int, n: int, k: int, dtype: str) -> bool:
            """``ragged_weight_rows`` or ``narrow_weight_rows`` takes a 16-bit (rows, n, k) matmul."""
            return self.wgmma_target is not None and (_wgmma_takes_ragged_n(rows, n, k) or _wgmma_picks_specialized(
                rows, n, k, dtype, self.wgmma_target))

        def _weight_rows(self, call: Any) -> Any:
            """``fp8_weight_rows``, ``ragged_weight_rows`` and ``narrow_weight_rows`` (None where
            ``call`` is none of them): a matmul reading its transposed 2-D weight ``w[n, k]`` as
            stored."""
            from ..schedules.gemm.gemm_fp8 import FP8_FORMATS

            a, b = call.args
            dtype, operand = str(call.ty.dtype), str(a.ty.dtype)
            eight_bit = operand in FP8_FORMATS and dtype in (*LOW_PRECISION, "float32")
            if str(b.ty.dtype) != operand or not (eight_bit or (operand in LOW_PRECISION and dtype == operand)):
                return None
            w, w_shape, to_transpose = self._stored_rows(b, eight_bit)
            a_shape = _static(_shape(a))
            if w_shape is None or len(w_shape) != 2 or a_shape is None or len(a_shape) < 2:
                return None
            if not (eight_bit or self._wgmma_reads_rows(int(np.prod(a_shape[:-1])), *w_shape, operand)):
                return None
            if to_transpose:  # a constant [k, n]: transposed once, only where a rule takes it
                w = relax.const(np.ascontiguousarray(w.numpy().T), str(w.dtype))
            self.changed += 1
            wide = self.builder_.emit(self.builder_.call_te(_matmul_weight_rows, a, w, primfunc_name_hint=WEIGHT_ROWS))
            return wide if dtype == "float32" else relax.op.astype(wide, dtype)

        def _plain_operands(self, call: Any) -> Any:
            """``plain_matmul_operands`` (None where it changes nothing): a matmul's operands
            without broadcasts to shapes the matmul broadcasts them to itself, and with a 2-D B its
            A's transpose that keeps the last axis moved past it onto the narrower product."""
            a, b = call.args
            a_src, b_src = self._producer(a), self._producer(b)
            a_shape, b_shape = _static(_shape(a)), _static(_shape(b))
            if _op_name(a_src) == "relax.broadcast_to" and _static(_shape(a_src.args[0])) == a_shape:
                a = a_src.args[0]
            if _op_name(b_src) == "relax.broadcast_to" and b_shape is not None and 2 < len(b_shape) and \
                    a_shape is not None and len(b_shape) <= len(a_shape) and \
                    _static(_shape(b_src.args[0])) == b_shape[-2:]:
                b, b_shape = b_src.args[0], b_shape[-2:]
            source, layout = layout_source(a, self._through_tuples)
            transposed = any(_op_name(op) == "relax.permute_dims" for op in layout)  # a copy to save
            if transposed and b_shape is not None and len(b_shape) == 2 and b_shape[1] <= b_shape[0]:
                self.changed += 1  # the transposes and reshapes, now of the narrower product
                return replay_layout(self.builder_.emit, relax.Call(call.op, [source, b], call.attrs), layout,
                                     b_shape[1])
            if a.same_as(call.args[0]) and b.same_as(call.args[1]):
                return None
            self.changed += 1
            return relax.Call(call.op, [a, b], call.attrs)

        def _padded_columns(self, call: Any) -> Any:
            """``narrow_padded_columns`` (None where it does not apply): a 16-bit matmul storing its
            operand type, by a constant 2-D weight ``[k, n]`` (or the transpose of one ``[n, k]``)
            of fewer than ``PADDED_COLUMNS`` columns whose rows are no whole 16 bytes, multiplies by
            the weight with zero columns to ``PADDED_COLUMNS`` and takes its first n columns."""
            a, b = call.args
            operand = str(a.ty.dtype)
            if operand not in LOW_PRECISION or str(b.ty.dtype) != operand or str(call.ty.dtype) != operand:
                return None
            value = constant_columns(b, self._producer)
            if value is None or value.shape[1] % ROW_ALIGN == 0 or value.shape[1] >= PADDED_COLUMNS:
                return None
            k, n = value.shape
            padded = np.zeros((k, PADDED_COLUMNS), value.dtype)
            padded[:, :n] = value
            self.changed += 1
            wide = self.builder_.emit(relax.Call(call.op, [a, relax.const(padded, operand)], call.attrs))
            # the first n columns taken (a gather: not fused into the GEMM's store as a slice would be)
            return relax.op.take(wide, relax.const(np.arange(n, dtype="int32")), axis=len(_shape(call)) - 1,
                                 mode="clip")

        def _through_tuples(self, expr: Any) -> Any:
            """``_producer``'s value, a field of a tuple made here taken for the field's own."""
            op = self._producer(expr)
            while isinstance(op, relax.TupleGetItem):
                fields = self._producer(op.tuple_value)
                if not isinstance(fields, relax.Tuple):
                    break
                op = self._producer(fields.fields[op.index])
            return op

        def _accumulate_fp32(self, call: Any) -> Any:
            dtype = str(call.ty.dtype)
            a, b = call.args
            if dtype not in LOW_PRECISION or str(a.ty.dtype) != dtype or str(b.ty.dtype) != dtype:
                return call
            self.changed += 1
            wide = self.builder_.emit(relax.op.matmul(a, b, out_dtype="float32"))
            return relax.op.astype(wide, dtype)

    return Rewriter


def rewrite_model(mod: Any, target: Any = None) -> Any:
    """``plain_matmul_operands``, ``narrow_padded_columns``, ``accumulate_fp32``, ``fp8_weight_rows``,
    ``ragged_weight_rows`` and ``narrow_weight_rows`` (for a ``target`` with wgmma), ``sink_reshapes``,
    ``whole_reductions``, ``empty_concats`` and ``clamp_takes`` on every Relax function, until nothing
    changes; dead bindings are removed."""
    import tvm
    from tvm import relax

    rewriter_class = _make_mutator()
    for _ in range(8):  # each round moves an op past one reshape
        rewriter = rewriter_class(mod, target)
        funcs = {gv: f for gv, f in mod.functions_items() if isinstance(f, relax.Function)}
        for gv, func in funcs.items():
            new = rewriter.visit_expr(func)
            rewriter.builder_.update_func(gv, new)
        mod = rewriter.builder_.get()
        mod = relax.transform.DeadCodeElimination()(mod)
        if not rewriter.changed:
            break
    return tvm.ir.transform.Sequential([relax.transform.CanonicalizeBindings()])(mod)
