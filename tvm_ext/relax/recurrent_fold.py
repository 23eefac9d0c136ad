"""A ``Linear`` feeding a GRU or an LSTM folded into the layer's input projection.

A model that projects its features with a ``Linear`` and hands the result straight to a GRU or
an LSTM (a speech model's ``Linear(80, 1024)`` front end) computes, for every step and row,
``(x·Wᵀ + b)·W_ih + b_ih``: a GEMM of K = 1024 after one of K = 80.  The product is associative,
so ``x·(Wᵀ·W_ih) + (b·W_ih + b_ih)`` is the same map, and the layer's own input GEMM then runs
at K = 80 (the speech model's layer 0: 51.5 GFLOP → 4 GFLOP at B64, T = 128).  Where the weights
are constants (as both importers bind them), the folded W_ih and b_ih are computed once here, in
float64, and stored in the layer's types.

``fold_linears_into_recurrent`` rewrites every GRU and LSTM placeholder (``relax_gru``) whose x
comes from ``matmul(a, w)`` (plus a bias) through reshapes and transposes that keep the last axis
(the importers' ``batch_first`` transpose and their flattening to (T·B, I)), with ``w`` a constant
(or a constant's transpose) of fewer input features than it has outputs: the layer then reads
``a`` through the same reshapes and transposes.  The ``Linear`` stays where something else reads
its output.  The rounding moves from the ``Linear``'s stored output to the folded weights, the
same size of error in the same type.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .relax_gru import LSTM_FUNCTION, _out_types, _placeholder
from .relax_rewrites import _op_name, bound_value, constant_columns, layout_source, replay_layout


def _constant_array(expr: Any) -> np.ndarray | None:
    from tvm.ir.expr import Constant

    return expr.value.numpy() if isinstance(expr, Constant) else None


def _make_folder() -> Any:
    from tvm import relax

    @relax.expr_functor.mutator
    class Folder(relax.PyExprMutator):  # type: ignore[misc]
        def __init__(self, mod: Any) -> None:
            super().__init__(mod)
            self.folded = 0

        def _producer(self, expr: Any) -> Any:
            return bound_value(self, expr)

        def visit_call_(self, call: Any) -> Any:  # noqa: N802 (TVM's visitor name)
            call = self.visit_expr_post_order(call)
            if _placeholder(call) is None:
                return call
            folded = self._folded(call)
            if folded is None:
                return call
            self.folded += 1
            return folded

        def _linear(self, value: Any) -> tuple[Any, np.ndarray, np.ndarray | None] | None:
            """(a, Wᵀ (I, K), b (K,) or None) where ``value`` is ``matmul(a, w) [+ b]`` with constant
            w (or w's transpose) and b, else None."""
            bias = None
            if _op_name(value) == "relax.add":
                lhs, rhs = value.args
                bias = _constant_array(rhs)
                if bias is None:
                    lhs, rhs = rhs, lhs
                    bias = _constant_array(rhs)
                if bias is None or bias.ndim != 1:
                    return None
                value = self._producer(lhs)
            if _op_name(value) != "relax.matmul":
                return None
            a, w = value.args
            weight = constant_columns(w, self._producer)
            if weight is None or (bias is not None and bias.shape[0] != weight.shape[1]):
                return None
            return a, weight, bias

        def _folded(self, call: Any) -> Any:
            """``call`` reading the Linear's input with the folded layer-0 W_ih and b_ih, or None."""
            fields = list(call.args[1].fields)
            first = 3 if _placeholder(call) == LSTM_FUNCTION else 2  # x, h0 (and c0), then w_ih0, b_ih0
            w_ih, b_ih = (_constant_array(fields[first]), _constant_array(fields[first + 1]))
            if w_ih is None or b_ih is None:
                return None
            under, chain = layout_source(fields[0], self._producer)
            linear = self._linear(self._producer(under))
            if linear is None:
                return None
            a, weight, bias = linear
            features, width = weight.shape
            x_dtype = str(fields[0].ty.dtype)
            if features >= width or width != w_ih.shape[0] or str(a.ty.dtype) != x_dtype:
                return None  # no fewer products, or not the layer's input
            product = w_ih.astype(np.float64)
            w_new = (weight.astype(np.float64) @ product).astype(w_ih.dtype)
            b_new = b_ih.astype(np.float64) + (0.0 if bias is None else bias.astype(np.float64) @ product)
            x = replay_layout(self.builder_.emit, a, chain, features)  # the last axis now ``features``
            x = self.builder_.emit(x) if isinstance(x, relax.Call) else x
            args = [x, *fields[1:first], relax.const(w_new), relax.const(b_new.astype(b_ih.dtype)),
                    *fields[first + 2:]]
            return relax.call_dps_packed(call.args[0], relax.Tuple(args), _out_types(call))

    return Folder


def fold_linears_into_recurrent(mod: Any) -> Any:
    """``mod`` with every ``Linear`` that feeds a GRU or LSTM placeholder folded into the layer's
    input projection where that leaves it fewer products (see the module's docstring); dead
    bindings removed.  Unchanged where there is none."""
    from tvm import relax

    folder = _make_folder()(mod)
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            folder.builder_.update_func(gv, folder.visit_expr(func))
    if not folder.folded:
        return mod
    return relax.transform.DeadCodeElimination()(folder.builder_.get())
