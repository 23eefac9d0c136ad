"""The user-facing ``LSTM``: ``torch.nn.LSTM`` inference compiled for one shape, PyTorch's
weights and layouts in, numpy arrays out."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from tvm_ext.core.errors import TvmExtError
from tvm_ext.core.space import Config
from tvm_ext.precision.precision import np_dtype
from tvm_ext.schedules.gru.layer import (_numpy, built_config, check_split_weights, expected_weight_shapes,
                                        plan_executor, weight_arrays)
from tvm_ext.schedules.gru.lengths import checked_lengths
from tvm_ext.schedules.gru.split import split_range_reason
from tvm_ext.target import TargetInfo

from .compute import GATES
from .plan import BARRIER_TIMEOUT
from .template import LstmTemplate


class LSTM:
    """``torch.nn.LSTM`` inference compiled for one (batch, seq) shape: build once, run many times.

    >>> lstm = LSTM.build("opencl", input_size=16, hidden_size=32, batch=4, seq=10)
    >>> lstm.load_state_dict(torch_lstm.state_dict())
    >>> output, (h_n, c_n) = lstm(x)    # numpy in, numpy out, PyTorch's shapes

    ``dtype`` float16 or bfloat16 stores x, the weights, h, c and the outputs in that type (the
    products and the cell stay float32); weights and inputs are rounded to it as they are loaded.
    A float32 LSTM on the split tensor-core step kernel (``step_tc`` 2) splits h and W_hh into
    float16 parts: |h_0| and |W_hh| · ``SPLIT_WEIGHT_SCALE`` must stay below float16's largest.
    """

    barrier_timeout = BARRIER_TIMEOUT  # what a timed-out grid barrier of its step kernel raises

    def __init__(self, template: LstmTemplate, config: Config, target: TargetInfo, batch_first: bool,
                 compiled: Any):
        self.template = template
        self.config = config
        self.target = target
        self.batch_first = batch_first
        self.compiled = compiled
        self.persistent = any("bar" in c.args for c in compiled.calls)
        # with the input GEMM on TF32 parts (``in_split`` 3) W_ih's are split as the weights are loaded
        self.executor = plan_executor(compiled, template.for_config(config).buffers(), target,
                                      compiled.prepared_steps(target.kind))
        self._splits_state = template.step_variant(config).splits_state  # h0 and W_hh split into float16 parts
        self._loaded = False

    @classmethod
    def build(cls, target: TargetInfo | str, input_size: int, hidden_size: int, num_layers: int = 1,
              bidirectional: bool = False, batch_first: bool = False, batch: int = 1, seq: int = 1,
              config: Config | Mapping[str, Any] | None = None, device_id: int = 0,
              dtype: str = "float32", variable_lengths: bool = False) -> "LSTM":
        """Compile every kernel for this shape.  ``config``: a full LSTM config, or a few knob
        values overriding the default (e.g. ``{"step_ks": 2}``); none: ``analytic_pick``.
        ``variable_lengths``: calls take ``lengths`` (each row stops at its own length, as a
        ``PackedSequence``; the unfused steps run it)."""
        from tvm_ext.target import resolve_target

        info = resolve_target(target, device_id) if isinstance(target, str) else target
        template = LstmTemplate(batch=batch, hidden=hidden_size, input=input_size, seq=seq, layers=num_layers,
                                bidirectional=bool(bidirectional), dtype=dtype,
                                variable_lengths=bool(variable_lengths)).with_tensor_cores(info)
        cfg = built_config(template, info, config, "LSTM")
        return cls(template, cfg, info, bool(batch_first), template.compile(cfg, info))

    # ---- weights --------------------------------------------------------------------------
    def expected_weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return expected_weight_shapes(self.template, GATES)

    def load_numpy(self, weights: Mapping[str, Any]) -> "LSTM":
        """Load PyTorch-named weights (``weight_ih_l0``, ``bias_hh_l1_reverse``, ...); biases may
        be left out altogether (``nn.LSTM(bias=False)``).  ``proj_size`` is not supported."""
        arrays = weight_arrays(weights, self.expected_weight_shapes(), "LSTM")
        check_split_weights(arrays, {"weight_hh": "step_tc 2"} if self._splits_state else {})
        for name, array in self.template.device_weights(arrays).items():
            self.executor.write(name, array)
        self.executor.prepare()  # what the weights give once (``plan.prepare_calls``)
        self._loaded = True
        return self

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> "LSTM":
        """Load ``torch.nn.LSTM.state_dict()`` (tensors on any device)."""
        return self.load_numpy({k: _numpy(v) for k, v in state_dict.items()})

    def split_inputs(self) -> dict[str, str]:
        """The call inputs split into float16 parts (``GRU.split_inputs``), each with the knob that
        does: h0 where the step kernel splits the state."""
        return {"h0": "step_tc 2"} if self._splits_state else {}

    # ---- forward ----------------------------------------------------------------------------
    def _state(self, value: Any, name: str) -> np.ndarray:
        t = self.template
        shape = (t.layers * t.dirs, t.batch, t.hidden)
        if value is None:
            return np.zeros(shape, np.float32)
        array = _numpy(value)
        if array.shape != shape:
            raise TvmExtError(f"LSTM {name} has shape {array.shape}, expected {shape} (layers·directions, batch, "
                              "hidden)")
        return array

    def __call__(self, x: Any, state: tuple[Any, Any] | None = None, lengths: Any = None,
                 enforce_sorted: bool = False) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """(output, (h_n, c_n)) as ``torch.nn.LSTM`` returns them, float32 numpy arrays (x's type
        where x comes in the LSTM's 16-bit ``dtype``); ``state``: (h0, c0), zeros when left out.
        ``lengths`` (an LSTM built with ``variable_lengths``): each row's length, as
        ``pack_padded_sequence`` takes them (sorted decreasing only with ``enforce_sorted``)."""
        t = self.template
        if not self._loaded:
            raise TvmExtError("LSTM weights are not loaded: call load_numpy or load_state_dict first")
        if t.variable_lengths:
            lengths = (np.full(t.batch, t.seq, np.int32) if lengths is None
                       else checked_lengths(lengths, t.batch, t.seq, enforce_sorted, "LSTM"))
        elif lengths is not None:
            raise TvmExtError("this LSTM was built for full-length rows: build it with variable_lengths=True to "
                              "pass lengths")
        x = _numpy(x)
        result = x.dtype if x.dtype == np_dtype(t.dtype) else np.dtype(np.float32)
        want = (t.batch, t.seq, t.input) if self.batch_first else (t.seq, t.batch, t.input)
        if x.shape != want:
            layout = "(batch, seq, input)" if self.batch_first else "(seq, batch, input)"
            raise TvmExtError(f"LSTM input has shape {x.shape}, expected {want} {layout}")
        if self.batch_first:
            x = x.transpose(1, 0, 2)
        h0, c0 = state if state is not None else (None, None)
        h0 = self._state(h0, "h0")
        reason = split_range_reason("LSTM h0", h0, knob="step_tc 2") if self._splits_state else None
        if reason:
            raise TvmExtError(reason)
        ex = self.executor
        ex.write("x", np.ascontiguousarray(x))
        ex.write("h0", h0)
        ex.write("c0", self._state(c0, "c0"))
        if t.variable_lengths:
            ex.write("lengths", lengths)
        ex.run()
        if self.persistent and bool(ex.read("bar")[1]):
            raise TvmExtError(BARRIER_TIMEOUT)
        out = ex.read("out").reshape(t.seq, t.batch, t.dirs * t.hidden).astype(result, copy=False)
        h_n, c_n = (ex.read(name).astype(result, copy=False) for name in ("h_n", "c_n"))
        ex.sync()
        if self.batch_first:
            out = np.ascontiguousarray(out.transpose(1, 0, 2))
        return out, (h_n, c_n)
