"""The GRU's numbers: its float64 reference (``torch.nn.GRU``'s equations and layouts),
its precision parameters (what the mixed-precision search varies) and which stage each kernel function belongs to.

Precision: every tensor, accumulator and the cell's math type is a ``PrecisionParam``
tied to the stage that owns it (``PRECISION_PARAMS``): stage "input_gemm" (S1: ``x``,
``w_ih``, ``in_acc``, ``gi``), "hidden_gemm" (S2: ``w_hh``, ``hid_acc``, ``gh``) and
"cell" (S3/S4: ``h``, ``cell_math``, ``out``).  Kernels widen what they load to their
accumulator or math type and narrow what they store to the tensor's type; all float32
(the default) is the published program, unchanged.  Choices where a buffer has no
parameter of its own: the biases take their weights' type; h0, the state ping-pong
buffers and h_n are ``h``; the inner layers' output sequences (which feed layer ≥ 1's
input GEMM) are written by the same cell kernel as the final output, so they are ``out``
(layer ≥ 1's input GEMM reads its A operand in ``out``'s type, a kernel of its own when
that differs from ``x``); in the fused step kernel gh never reaches memory, yet its gate
sums are still rounded to ``gh`` before the cell uses them, so a precision assignment
computes the same numbers whatever the fusion knob says.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from tvm_ext.core.errors import TvmExtError
from tvm_ext.precision.precision import HIGH_PRECISION, PrecisionParam

F32 = HIGH_PRECISION
STAGES = ("input_gemm", "hidden_gemm", "cell")
PRECISION_PARAMS = (
    PrecisionParam("x", "input_gemm", "tensor",
                   "input sequence x (the inner layers' output sequences, which layer >= 1's input "
                   "GEMM reads, are stored in out's type)"),
    PrecisionParam("w_ih", "input_gemm", "tensor", "input weights W_ih and their biases b_ih"),
    PrecisionParam("in_acc", "input_gemm", "accumulator", "type S1 accumulates x·W_ihᵀ + b_ih in"),
    PrecisionParam("gi", "input_gemm", "tensor", "input-gate buffer gi (T·B, dirs·3H)"),
    PrecisionParam("w_hh", "hidden_gemm", "tensor", "hidden weights W_hh and their biases b_hh"),
    PrecisionParam("hid_acc", "hidden_gemm", "accumulator", "type S2 accumulates h·W_hhᵀ + b_hh in"),
    PrecisionParam("gh", "hidden_gemm", "tensor",
                   "hidden-gate buffer gh (dirs, B, 3H); in the fused step kernel the register "
                   "gate sums are rounded to it"),
    PrecisionParam("h", "cell", "tensor", "hidden state: h0, the ping-pong state buffers and h_n"),
    PrecisionParam("cell_math", "cell", "math", "type the cell computes sigmoid, tanh and the blend in"),
    PrecisionParam("out", "cell", "tensor", "output sequence (and the inner layers' output sequences)"),
)
# Kernel function (name prefix) -> the stages its time counts toward.  The fused step
# kernel is both the hidden GEMM and the cell, so its time counts toward both.  The init
# (h0 into the state, the persistent kernels' barrier and step tags reset) belongs to both
# too: a stage timed on its own runs its calls alone, and a flag-exchange step kernel run
# without its init would poll stale tags until its spin limit.
FUNCTION_STAGES = {"gru_init": ("hidden_gemm", "cell"), "gru_gemm_x": ("input_gemm",),
                   "gru_split": ("input_gemm",), "gru_gemm_h": ("hidden_gemm",),
                   "gru_cell": ("cell",), "gru_step": ("hidden_gemm", "cell"),
                   "gru_hold": ("input_gemm",), "gru_zero_out": ("cell",)}  # also gru_steps (all steps)


def function_stages(name: str) -> tuple[str, ...]:
    """The stages of a kernel function or of one of its device kernels ("gru_cell_kernel")."""
    for prefix, stages in FUNCTION_STAGES.items():
        if name.startswith(prefix):
            return stages
    raise TvmExtError(f"kernel {name!r} belongs to no GRU stage")


# ---- layouts: PyTorch <-> device ------------------------------------------------------------
def device_layout(weights: Mapping[str, np.ndarray], layers: int, dirs: int) -> dict[str, np.ndarray]:
    """A recurrent stack's PyTorch ``state_dict`` arrays in the device layout (the GRU's and the
    LSTM's, any gate count): w_ih{l} (K, dirs·G) and b_ih{l} (dirs·G,) with the directions side by
    side, w_hh{l} (dirs, H, G) and b_hh{l} (dirs, G), G the gates' rows; in their own types."""
    out = {}
    for layer in range(layers):
        sfx = [f"l{layer}" + ("_reverse" if d else "") for d in range(dirs)]
        out[f"w_ih{layer}"] = np.concatenate([weights[f"weight_ih_{s}"].T for s in sfx], axis=1)
        out[f"b_ih{layer}"] = np.concatenate([weights[f"bias_ih_{s}"] for s in sfx])
        out[f"w_hh{layer}"] = np.stack([weights[f"weight_hh_{s}"].T for s in sfx])
        out[f"b_hh{layer}"] = np.stack([weights[f"bias_hh_{s}"] for s in sfx])
    return out


def torch_layout(device: Mapping[str, np.ndarray], layers: int, dirs: int, rows: int) -> dict[str, np.ndarray]:
    """``device_layout`` undone: PyTorch's ``state_dict`` arrays (``rows``: the gates' rows, G)."""
    out = {}
    for layer in range(layers):
        for d in range(dirs):
            s = f"l{layer}" + ("_reverse" if d else "")
            out[f"weight_ih_{s}"] = device[f"w_ih{layer}"][:, d * rows:(d + 1) * rows].T
            out[f"bias_ih_{s}"] = device[f"b_ih{layer}"][d * rows:(d + 1) * rows]
            out[f"weight_hh_{s}"] = device[f"w_hh{layer}"][d].T
            out[f"bias_hh_{s}"] = device[f"b_hh{layer}"][d]
    return out


# ---- reference ---------------------------------------------------------------------------
def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # exact identity, no overflow warnings


def gru_reference(x: np.ndarray, weights: Mapping[str, np.ndarray], h0: np.ndarray | None = None,
                  num_layers: int = 1, bidirectional: bool = False,
                  batch_first: bool = False, lengths: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``torch.nn.GRU`` forward: (output, h_n), PyTorch's equations and layouts.
    ``lengths``: each batch row's own length, as a ``PackedSequence`` runs it (outputs past
    it zero, h_n at its last step, the backward direction starting there)."""
    x = np.asarray(x, np.float64)
    if batch_first:
        x = x.transpose(1, 0, 2)
    steps, batch, _ = x.shape
    dirs = 2 if bidirectional else 1
    hidden = np.asarray(weights["weight_hh_l0"]).shape[1]
    h_all = np.zeros((num_layers * dirs, batch, hidden)) if h0 is None else np.asarray(h0, np.float64)
    layer_in, h_n = x, []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            sfx = f"l{layer}" + ("_reverse" if d else "")
            w_ih = np.asarray(weights[f"weight_ih_{sfx}"], np.float64)
            w_hh = np.asarray(weights[f"weight_hh_{sfx}"], np.float64)
            b_ih = np.asarray(weights.get(f"bias_ih_{sfx}", np.zeros(3 * hidden)), np.float64)
            b_hh = np.asarray(weights.get(f"bias_hh_{sfx}", np.zeros(3 * hidden)), np.float64)
            gi = layer_in @ w_ih.T + b_ih  # (T, B, 3H): S1 for all steps
            h = h_all[layer * dirs + d]
            seq = np.empty((steps, batch, hidden))
            for t in (range(steps) if d == 0 else reversed(range(steps))):
                live = np.ones((batch, 1), bool) if lengths is None else (t < np.asarray(lengths))[:, None]
                gh = h @ w_hh.T + b_hh
                r = _sigmoid(gi[t, :, :hidden] + gh[:, :hidden])
                z = _sigmoid(gi[t, :, hidden:2 * hidden] + gh[:, hidden:2 * hidden])
                n = np.tanh(gi[t, :, 2 * hidden:] + r * gh[:, 2 * hidden:])
                h_new = (1.0 - z) * n + z * h
                h = np.where(live, h_new, h)
                seq[t] = np.where(live, h_new, 0.0)
            outs.append(seq)
            h_n.append(h)
        layer_in = np.concatenate(outs, axis=2)
    out = layer_in.transpose(1, 0, 2) if batch_first else layer_in
    return out, np.stack(h_n)
