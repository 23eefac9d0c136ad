"""ONNX ``LSTM`` and ``RNN`` nodes, and the ``GRU`` forms tvm_ext's GRU kernel does not run, as
Relax unrolled one step after another.

TVM's ONNX frontend has no recurrent operator; its torch frontend unrolls ``aten::lstm`` the same
way.  Each direction's input product for all T steps is one matmul ((T·B, I) × (I, gates·H),
biases folded in), then each step is one (B, H) × (H, gates·H) matmul and the gates' element-wise
cell, which ``tune model`` tunes as ordinary kernels (the step matmuls share one task).  T must be
known at import (bind a named sequence dimension with ``--model-option``); the batch may stay
symbolic.

As the ONNX specification defines them: every ``direction`` (forward, reverse, bidirectional),
``layout`` 0 and 1, optional ``B``, ``sequence_lens`` (a row's steps past its length keep its
state and write zeros to Y; a reverse direction starts at the row's last step), ``initial_h``,
``initial_c`` and the peepholes ``P``, ``clip`` on every gate's input before its activation (the
LSTM's cell state itself is not clipped), the GRU's ``linear_before_reset`` 0 and 1, and the
activations below with ``activation_alpha`` / ``activation_beta`` consumed in order by the
functions that take them.  ``input_forget=1`` and the functions ONNX gives no default parameters
(``Affine``, ``ScaledTanh``) without them are refused with the attribute named.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..core.errors import TvmExtError

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}  # gate blocks in W and R: LSTM i, o, f, c; GRU z, r, h; RNN i
FUNCTIONS = {"LSTM": 3, "GRU": 2, "RNN": 1}  # activations a direction names: f, g, h / f, g / f
DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
# name: (default alpha, default beta); None where the function takes no such parameter, NaN where
# ONNX gives no default (the model must give it).
ACTIVATION_PARAMS: dict[str, tuple[float | None, float | None]] = {
    "Sigmoid": (None, None), "Tanh": (None, None), "Relu": (None, None), "Softsign": (None, None),
    "Softplus": (None, None), "LeakyRelu": (0.01, None), "ThresholdedRelu": (1.0, None), "Elu": (1.0, None),
    "HardSigmoid": (0.2, 0.5), "Affine": (float("nan"), float("nan")), "ScaledTanh": (float("nan"), float("nan")),
}


@dataclass(frozen=True)
class Activation:
    """One activation function of a recurrent node with its parameters (``None`` where unused)."""

    name: str
    alpha: float | None = None
    beta: float | None = None


@dataclass(frozen=True)
class RecurrentNode:
    """What an ONNX recurrent node's attributes ask for, checked (``read_node``)."""

    op: str  # "LSTM", "GRU" or "RNN"
    direction: str  # "forward", "reverse" or "bidirectional"
    activations: tuple[tuple[Activation, ...], ...]  # per direction, FUNCTIONS[op] each
    clip: float | None
    layout: int
    linear_before_reset: int = 0  # GRU only

    @property
    def dirs(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    def reversed(self, d: int) -> bool:
        """Whether direction ``d`` runs from the last step to the first."""
        return self.direction == "reverse" or d == 1


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _activations(op: str, attrs: dict[str, Any], dirs: int) -> tuple[tuple[Activation, ...], ...]:
    names = [_text(a) for a in attrs.get("activations", ())] or list(DEFAULT_ACTIVATIONS[op]) * dirs
    if len(names) != FUNCTIONS[op] * dirs:
        raise TvmExtError(f"ONNX {op} attribute activations={names} names {len(names)} functions; "
                          f"{op} takes {FUNCTIONS[op]} a direction ({dirs} direction(s))")
    alphas, betas = list(attrs.get("activation_alpha", ())), list(attrs.get("activation_beta", ()))
    chosen = []
    for name in names:
        key = next((k for k in ACTIVATION_PARAMS if k.lower() == name.lower()), None)
        if key is None:
            raise TvmExtError(f"ONNX {op} attribute activations={names}: {name!r} is not an ONNX activation; "
                              f"allowed: {', '.join(ACTIVATION_PARAMS)}")
        default_alpha, default_beta = ACTIVATION_PARAMS[key]
        alpha = None if default_alpha is None else float(alphas.pop(0)) if alphas else default_alpha
        beta = None if default_beta is None else float(betas.pop(0)) if betas else default_beta
        if (alpha is not None and np.isnan(alpha)) or (beta is not None and np.isnan(beta)):
            raise TvmExtError(f"ONNX {op} attribute activations={names}: {key} needs its activation_alpha and "
                              "activation_beta (ONNX gives it no defaults)")
        chosen.append(Activation(key, alpha, beta))
    per = FUNCTIONS[op]
    return tuple(tuple(chosen[d * per:(d + 1) * per]) for d in range(dirs))


def read_node(op: str, attrs: dict[str, Any]) -> RecurrentNode:
    """The node's attributes checked against what the unrolled form runs; one ``TvmExtError``
    naming the attribute otherwise."""
    direction = _text(attrs.get("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise TvmExtError(f"ONNX {op} attribute direction={direction!r} is not one ONNX defines: forward, "
                          "reverse, bidirectional")
    if int(attrs.get("input_forget", 0)) != 0:
        raise TvmExtError(f"ONNX {op} attribute input_forget={attrs['input_forget']} (coupled input and forget "
                          "gates) is not supported; allowed: 0")
    layout = int(attrs.get("layout", 0))
    if layout not in (0, 1):
        raise TvmExtError(f"ONNX {op} attribute layout={layout} is not one ONNX defines: 0, 1")
    clip = attrs.get("clip")
    if clip is not None and not float(clip) > 0:
        raise TvmExtError(f"ONNX {op} attribute clip={clip} must be positive")
    dirs = 2 if direction == "bidirectional" else 1
    return RecurrentNode(op, direction, _activations(op, attrs, dirs), None if clip is None else float(clip), layout,
                         int(attrs.get("linear_before_reset", 0)))


def _apply(act: Activation, x: Any, dtype: str) -> Any:
    """``act`` on ``x`` as the ONNX specification writes it."""
    from tvm import relax

    op = relax.op

    def c(v: float) -> Any:
        return relax.const(v, dtype)

    forms: dict[str, Callable[[], Any]] = {
        "Sigmoid": lambda: op.sigmoid(x), "Tanh": lambda: op.tanh(x), "Relu": lambda: op.nn.relu(x),
        "Softsign": lambda: op.divide(x, op.add(c(1.0), op.abs(x))),
        "Softplus": lambda: op.log(op.add(c(1.0), op.exp(x))),
        "LeakyRelu": lambda: op.where(op.greater_equal(x, c(0.0)), x, op.multiply(c(act.alpha), x)),
        "ThresholdedRelu": lambda: op.where(op.greater_equal(x, c(act.alpha)), x, c(0.0)),
        "Elu": lambda: op.where(op.greater_equal(x, c(0.0)), x,
                                op.multiply(c(act.alpha), op.subtract(op.exp(x), c(1.0)))),
        "HardSigmoid": lambda: op.minimum(op.maximum(op.add(op.multiply(c(act.alpha), x), c(act.beta)), c(0.0)),
                                          c(1.0)),
        "Affine": lambda: op.add(op.multiply(c(act.alpha), x), c(act.beta)),
        "ScaledTanh": lambda: op.multiply(c(act.alpha), op.tanh(op.multiply(c(act.beta), x))),
    }
    return forms[act.name]()


@dataclass(frozen=True)
class _Direction:
    """One direction's operands as Relax values: W_d (G·H, I), R_d (G·H, H), biases (G·H,) each,
    the peepholes (3H,) or None, and the initial state (B, H)."""

    w: Any
    r: Any
    wb: Any
    rb: Any
    p: Any
    h0: Any
    c0: Any


class _Unroller:
    """Emits one node's steps into the block builder ``bb``."""

    def __init__(self, bb: Any, node: RecurrentNode, dtype: str, hidden: int):
        self.bb, self.node, self.dtype, self.hidden = bb, node, dtype, hidden

    def emit(self, expr: Any) -> Any:
        return self.bb.emit(expr)

    def const(self, value: float) -> Any:
        from tvm import relax

        return relax.const(value, self.dtype)

    def act(self, d: int, k: int, x: Any) -> Any:
        """Activation ``k`` of direction ``d`` on ``x``, its input clipped where the node says."""
        from tvm import relax

        if self.node.clip is not None:
            x = relax.op.minimum(relax.op.maximum(x, self.const(-self.node.clip)), self.const(self.node.clip))
        return self.emit(_apply(self.node.activations[d][k], x, self.dtype))

    def gates(self, value: Any, count: int, axis: int = 1) -> list[Any]:
        from tvm import relax

        if count == 1:
            return [value]
        parts = self.emit(relax.op.split(value, count, axis=axis))
        return [self.emit(relax.TupleGetItem(parts, i)) for i in range(count)]

    def cell(self, d: int, ops: _Direction, xt: Any, h: Any, c: Any) -> tuple[Any, Any]:
        """One step of direction ``d``: (H_t, C_t) from x_t's projection ``xt`` (biases in it but
        the GRU's R_bh with ``linear_before_reset``) and (H_{t-1}, C_{t-1})."""
        from tvm import relax

        op, e = relax.op, self.emit
        rt = e(op.permute_dims(ops.r))
        if self.node.op == "RNN":
            return self.act(d, 0, op.add(xt, op.matmul(h, rt))), c
        if self.node.op == "LSTM":
            i, o, f, g = self.gates(self.emit(op.add(xt, op.matmul(h, rt))), 4)
            pi, po, pf = self.gates(ops.p, 3, axis=0) if ops.p is not None else (None, None, None)

            def peep(gate: Any, p: Any, state: Any) -> Any:
                return gate if p is None else op.add(gate, op.multiply(p, state))

            i, f, g = self.act(d, 0, peep(i, pi, c)), self.act(d, 0, peep(f, pf, c)), self.act(d, 1, g)
            c_new = self.emit(op.add(op.multiply(f, c), op.multiply(i, g)))
            o = self.act(d, 0, peep(o, po, c_new))
            return self.emit(op.multiply(o, _apply(self.node.activations[d][2], c_new, self.dtype))), c_new
        hid = self.hidden
        x_zr, x_h = e(op.strided_slice(xt, [1], [0], [2 * hid])), e(op.strided_slice(xt, [1], [2 * hid], [3 * hid]))
        r_zr = e(op.permute_dims(e(op.strided_slice(ops.r, [0], [0], [2 * hid]))))
        r_h = e(op.permute_dims(e(op.strided_slice(ops.r, [0], [2 * hid], [3 * hid]))))
        z, r = self.gates(e(op.add(x_zr, op.matmul(h, r_zr))), 2)
        z, r = self.act(d, 0, z), self.act(d, 0, r)
        if self.node.linear_before_reset:
            rb_h = e(op.strided_slice(ops.rb, [0], [2 * hid], [3 * hid]))
            recurrent = op.multiply(r, op.add(op.matmul(h, r_h), rb_h))
        else:
            recurrent = op.matmul(e(op.multiply(r, h)), r_h)
        n = self.act(d, 1, op.add(x_h, recurrent))
        return self.emit(op.add(op.multiply(op.subtract(self.const(1.0), z), n), op.multiply(z, h))), c

    def direction(self, d: int, ops: _Direction, x: Any, steps: int, lengths: Any) -> tuple[Any, Any, Any]:
        """Y (T, B, H), H_T and C_T of direction ``d``."""
        from tvm import relax

        op, e = relax.op, self.emit
        gates_h = GATES[self.node.op] * self.hidden
        bias = e(op.add(ops.wb, ops.rb))
        if self.node.op == "GRU" and self.node.linear_before_reset:  # R_bh stays inside r * (...)
            bias = e(op.concat([e(op.strided_slice(bias, [0], [0], [2 * self.hidden])),
                                e(op.strided_slice(ops.wb, [0], [2 * self.hidden], [gates_h]))], axis=0))
        flat = e(op.reshape(x, (-1, x.ty.shape.values[2])))
        xw = e(op.reshape(e(op.add(op.matmul(flat, e(op.permute_dims(ops.w))), bias)), (steps, -1, gates_h)))
        h, c = ops.h0, ops.c0
        ys: list[Any] = [None] * steps
        zero = self.const(0.0)
        for t in (reversed(range(steps)) if self.node.reversed(d) else range(steps)):
            xt = self.emit(op.take(xw, relax.const(t, "int64"), axis=0))
            h_new, c_new = self.cell(d, ops, xt, h, c)
            if lengths is None:
                h, c, ys[t] = h_new, c_new, h_new
                continue
            live = self.emit(op.expand_dims(op.less(relax.const(t, "int32"), lengths), 1))
            ys[t] = self.emit(op.where(live, h_new, zero))
            h = self.emit(op.where(live, h_new, h))
            c = self.emit(op.where(live, c_new, c)) if c is not None else None
        return self.emit(op.stack(ys, axis=0)), h, c


def _direction_slice(value: Any, d: int) -> Any:
    from tvm import relax

    return relax.op.take(value, relax.const(d, "int64"), axis=0)


def convert_unrolled(bb: Any, op_name: str, inputs: list[Any], attrs: dict[str, Any], why: str = "") -> Any:
    """One ONNX LSTM / GRU / RNN node, unrolled: (Y, Y_h[, Y_c]) as the node's outputs are; a note
    on stderr says so (``why``: the reason a GRU is not on our kernel), since the form is correct
    but not fast: a kernel or two for every step."""
    import tvm
    from tvm import relax

    node = read_node(op_name, attrs)
    inputs = list(inputs) + [None] * (8 - len(inputs))
    x, w, r, b, lengths, h0, c0, p = inputs[:8]
    dirs = node.dirs
    steps_dim = x.ty.shape.values[1 if node.layout else 0]
    if not isinstance(steps_dim, tvm.tirx.IntImm):
        raise TvmExtError(f"ONNX {op_name} over a symbolic sequence length ({steps_dim}) is unrolled step by step, so "
                          f"its length must be known: give the named dimension a size (--model-option {steps_dim}=N)")
    steps = int(steps_dim)
    print(f"note: an ONNX {op_name} runs unrolled in Relax, a recurrent matmul and a cell for each of its {steps} "
          f"steps (correct, not fast): {why or f'tvm_ext has no {op_name} kernel'}", file=sys.stderr)
    gates_h = int(w.ty.shape.values[1])
    hidden = gates_h // GATES[op_name]
    if int(attrs.get("hidden_size", hidden)) != hidden or int(w.ty.shape.values[0]) != dirs:
        raise TvmExtError(f"ONNX {op_name} hidden_size={attrs.get('hidden_size')} and direction={node.direction} "
                          f"disagree with W of shape {[int(v) for v in w.ty.shape.values]}")
    op = relax.op
    if node.layout:  # (B, T, I) -> (T, B, I); states (B, dirs, H) -> (dirs, B, H)
        x = bb.emit(op.permute_dims(x, [1, 0, 2]))
        h0, c0 = (bb.emit(op.permute_dims(s, [1, 0, 2])) if s is not None else None for s in (h0, c0))
    dtype = str(x.ty.dtype)
    batch = x.ty.shape.values[1]
    zeros = bb.emit(op.zeros(relax.ShapeExpr([batch, hidden]), dtype))
    if lengths is not None:
        lengths = bb.emit(op.astype(lengths, "int32"))
    unroller = _Unroller(bb, node, dtype, hidden)
    ys, hs, cs = [], [], []
    for d in range(dirs):
        bias = bb.emit(_direction_slice(b, d)) if b is not None else None
        ops = _Direction(
            w=bb.emit(_direction_slice(w, d)), r=bb.emit(_direction_slice(r, d)),
            wb=bb.emit(op.strided_slice(bias, [0], [0], [gates_h])) if bias is not None else
            relax.const(np.zeros(gates_h, dtype)),
            rb=bb.emit(op.strided_slice(bias, [0], [gates_h], [2 * gates_h])) if bias is not None else
            relax.const(np.zeros(gates_h, dtype)),
            p=bb.emit(_direction_slice(p, d)) if p is not None and op_name == "LSTM" else None,
            h0=bb.emit(_direction_slice(h0, d)) if h0 is not None else zeros,
            c0=(bb.emit(_direction_slice(c0, d)) if c0 is not None else zeros) if op_name == "LSTM" else None)
        y, h, c = unroller.direction(d, ops, x, steps, lengths)
        ys, hs, cs = ys + [y], hs + [h], cs + [c]
    y = bb.emit(op.stack(ys, axis=1))  # (T, dirs, B, H)
    outputs = [y, bb.emit(op.stack(hs, axis=0))] + ([bb.emit(op.stack(cs, axis=0))] if op_name == "LSTM" else [])
    if node.layout:  # Y (B, T, dirs, H), states (B, dirs, H)
        outputs = [bb.emit(op.permute_dims(outputs[0], [2, 0, 1, 3]))] + \
            [bb.emit(op.permute_dims(s, [1, 0, 2])) for s in outputs[1:]]
    return relax.Tuple(outputs)
