"""The LSTM's float64 reference: ``torch.nn.LSTM``'s equations and layouts (gates i, f, g, o)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

GATES = 4


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # exact identity, no overflow warnings


def lstm_reference(x: np.ndarray, weights: Mapping[str, np.ndarray], h0: np.ndarray | None = None,
                   c0: np.ndarray | None = None, num_layers: int = 1, bidirectional: bool = False,
                   batch_first: bool = False, lengths: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 ``torch.nn.LSTM`` forward: (output, h_n, c_n), PyTorch's equations and layouts
    (weights named as its ``state_dict``; biases may be left out).  ``lengths``: each batch row's
    own length, as a ``PackedSequence`` runs it (outputs past it zero, h_n and c_n at its last
    step, the backward direction starting there)."""
    x = np.asarray(x, np.float64)
    if batch_first:
        x = x.transpose(1, 0, 2)
    steps, batch, _ = x.shape
    dirs = 2 if bidirectional else 1
    hidden = np.asarray(weights["weight_hh_l0"]).shape[1]
    states = (num_layers * dirs, batch, hidden)
    h_all = np.zeros(states) if h0 is None else np.asarray(h0, np.float64)
    c_all = np.zeros(states) if c0 is None else np.asarray(c0, np.float64)
    layer_in, h_n, c_n = x, [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            sfx = f"l{layer}" + ("_reverse" if d else "")
            w_ih = np.asarray(weights[f"weight_ih_{sfx}"], np.float64)
            w_hh = np.asarray(weights[f"weight_hh_{sfx}"], np.float64)
            b_ih = np.asarray(weights.get(f"bias_ih_{sfx}", np.zeros(GATES * hidden)), np.float64)
            b_hh = np.asarray(weights.get(f"bias_hh_{sfx}", np.zeros(GATES * hidden)), np.float64)
            gi = layer_in @ w_ih.T + b_ih  # (T, B, 4H): all steps' input products
            h, c = h_all[layer * dirs + d], c_all[layer * dirs + d]
            seq = np.empty((steps, batch, hidden))
            for t in (range(steps) if d == 0 else reversed(range(steps))):
                live = np.ones((batch, 1), bool) if lengths is None else (t < np.asarray(lengths))[:, None]
                g = gi[t] + h @ w_hh.T + b_hh
                i, f = _sigmoid(g[:, :hidden]), _sigmoid(g[:, hidden:2 * hidden])
                cand, o = np.tanh(g[:, 2 * hidden:3 * hidden]), _sigmoid(g[:, 3 * hidden:])
                c_new = f * c + i * cand
                h_new = o * np.tanh(c_new)
                h, c = np.where(live, h_new, h), np.where(live, c_new, c)
                seq[t] = np.where(live, h_new, 0.0)
            outs.append(seq)
            h_n.append(h)
            c_n.append(c)
        layer_in = np.concatenate(outs, axis=2)
    out = layer_in.transpose(1, 0, 2) if batch_first else layer_in
    return out, np.stack(h_n), np.stack(c_n)
