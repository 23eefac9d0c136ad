"""``aten.gru.input`` and ``aten.lstm.input`` nodes of a ``torch.export`` program as tvm_ext's
GRU and LSTM placeholders (``relax_gru``): every ``nn.GRU`` and every ``nn.LSTM`` but
``proj_size`` (layers, bidirectional, ``batch_first``, initial states, with or without bias), the
weights read from the program's parameters into the device layout at import."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import TvmExtError
from .relax_gru import GRU_FUNCTION, LSTM_FUNCTION

GRU_OP = "gru.input"  # the converter table's key for aten.gru.input
LSTM_OP = "lstm.input"  # and for aten.lstm.input


def _weight(node: Any, program: Any, what: str, op: str = "gru") -> np.ndarray:
    """The tensor behind one of aten::gru's (``op``'s) weight arguments: a parameter, buffer or
    constant of the program (read from its state dict, as the frontend binds them at the end)."""
    signature = program.graph_signature
    name = getattr(node, "name", None)
    for table, values in ((signature.inputs_to_parameters, program.state_dict),
                          (signature.inputs_to_buffers, program.state_dict),
                          (signature.inputs_to_lifted_tensor_constants, program.constants)):
        if name in table and table[name] in values:
            return values[table[name]].detach().cpu().double().numpy()
    raise TvmExtError(f"aten::{op} {what} must be a parameter of the program, got {name or type(node).__name__}")


def _torch_state(params: list[Any], program: Any, layers: int, dirs: int, has_biases: bool,
                 op: str = "gru") -> dict[str, np.ndarray]:
    """aten::gru's (``op``'s) flat weight list as ``nn.GRU``'s state dict (per layer, per direction:
    w_ih, w_hh, then b_ih, b_hh when the layer has biases)."""
    names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if has_biases else [])
    expected = layers * dirs * len(names)
    if len(params) != expected:
        projected = " (an LSTM's proj_size is not supported)" if op == "lstm" and len(params) > expected else ""
        raise TvmExtError(f"aten::{op} has {len(params)} weights, expected {expected} for {layers} layers, "
                          f"{dirs} directions{'' if has_biases else ', no bias'}{projected}")
    state, flat = {}, iter(params)
    for layer in range(layers):
        for d in range(dirs):
            for name in names:
                key = f"{name}_l{layer}{'_reverse' if d else ''}"
                state[key] = _weight(next(flat), program, key, op)
            if not has_biases:  # nn.GRU(bias=False): zero biases, as the kernels always add one
                for name in ("bias_ih", "bias_hh"):
                    state[f"{name}_l{layer}{'_reverse' if d else ''}"] = np.zeros(state[key].shape[0])
    return state


def convert_gru(node: Any, importer: Any, program: Any) -> Any:
    """One ``aten.gru.input`` node of ``program`` as tvm_ext's GRU placeholder: (output, h_n) as
    torch returns them."""
    return _convert(node, importer, program, "gru")


def convert_lstm(node: Any, importer: Any, program: Any) -> Any:
    """One ``aten.lstm.input`` node of ``program`` as tvm_ext's LSTM placeholder: (output, h_n, c_n)
    as torch returns them (``nn.LSTM``'s every variant but ``proj_size``)."""
    return _convert(node, importer, program, "lstm")


def _convert(node: Any, importer: Any, program: Any, op: str) -> Any:
    """``aten.<op>.input`` (``op`` "gru" or "lstm") as its placeholder: x sequence-first as (T·B, I),
    the initial states (h0; the LSTM's h0 and c0; zeros where the call gives none), then each
    layer's weights in the device layout as constants; the output back in the call's layout."""
    from tvm import relax

    from ..schedules.gru import GruTemplate
    from ..schedules.lstm import LstmTemplate

    args = list(importer.retrieve_args(node)) + [None] * 9
    x, hx, _, has_biases, layers, dropout, train, bidirectional, batch_first = args[:9]
    layers, dirs = int(layers or 1), 2 if bidirectional else 1
    if train and dropout:
        raise TvmExtError(f"aten::{op} in training mode with dropout={dropout} is not supported (export the "
                          "model in eval mode)")
    bb = importer.block_builder
    if batch_first:
        x = bb.emit(relax.op.permute_dims(x, [1, 0, 2]))
    steps, batch, input_size = (int(d) for d in x.ty.shape.values)
    dtype = str(x.ty.dtype)
    state = _torch_state(list(node.args[2]), program, layers, dirs, bool(has_biases), op)
    hidden = state["weight_hh_l0"].shape[1]
    template = (LstmTemplate if op == "lstm" else GruTemplate)(
        batch=batch, hidden=hidden, input=input_size, seq=steps, layers=layers, bidirectional=dirs == 2)
    weights = template.device_weights(state)  # biases left out: zeros
    zeros = relax.const(np.zeros((layers * dirs, batch, hidden), dtype))
    initial = list(hx) if op == "lstm" and hx is not None else [hx]  # the LSTM's hx: [h0, c0]
    initial = (initial + [None, None])[:2 if op == "lstm" else 1]
    call_args = [bb.emit(relax.op.reshape(x, (steps * batch, input_size))),
                 *(zeros if value is None else value for value in initial)]
    for layer in range(layers):
        call_args += [relax.const(np.asarray(weights[f"{n}{layer}"]).astype(dtype))
                      for n in ("w_ih", "b_ih", "w_hh", "b_hh")]
    states = relax.TensorType([layers * dirs, batch, hidden], dtype)
    call = bb.emit(relax.call_dps_packed(
        LSTM_FUNCTION if op == "lstm" else GRU_FUNCTION, relax.Tuple(call_args),
        [relax.TensorType([steps * batch, dirs * hidden], dtype), *[states] * len(initial)]))
    out = bb.emit(relax.op.reshape(relax.TupleGetItem(call, 0), (steps, batch, dirs * hidden)))
    if batch_first:
        out = bb.emit(relax.op.permute_dims(out, [1, 0, 2]))
    return bb.emit(relax.Tuple([out, *(bb.emit(relax.TupleGetItem(call, i + 1)) for i in range(len(initial)))]))
