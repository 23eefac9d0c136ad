"""The user-facing ``GRU``: ``torch.nn.GRU`` inference compiled for one shape, PyTorch's
weights and layouts in, numpy arrays out."""
from __future__ import annotations

import statistics
import time
from typing import Any, Mapping

import numpy as np

from tvm_ext.core.errors import TvmExtError
from tvm_ext.measure.executors import CudaExecutor, OpenclExecutor
from tvm_ext.precision.precision import np_dtype
from tvm_ext.core.space import Config
from tvm_ext.target import TargetInfo

from .lengths import checked_lengths
from .plan import BARRIER_TIMEOUT, CompiledGru, barrier_timed_out
from .split import FLOAT16_SPLITS, SPLIT_WEIGHT_SCALE, split_range_reason
from .template import GruTemplate


def _numpy(value: Any) -> np.ndarray:
    """A numpy array of a numpy array, a list or a torch tensor on any device (torch's
    bfloat16 and other types numpy lacks come out as float32)."""
    if hasattr(value, "detach"):
        tensor = value.detach().cpu()
        try:
            return tensor.numpy()
        except TypeError:
            return tensor.float().numpy()
    return np.asarray(value)


def check_split_weights(arrays: Mapping[str, np.ndarray], split: Mapping[str, str]) -> None:
    """One ``TvmExtError`` where a weight stored as scaled float16 parts (``split``: PyTorch name
    prefix -> the knob that splits it) holds a value its parts cannot (``split_range_reason``)."""
    for name, array in arrays.items():
        knob = next((k for prefix, k in split.items() if name.startswith(prefix)), None)
        reason = split_range_reason(name, array, SPLIT_WEIGHT_SCALE, knob) if knob else None
        if reason:
            raise TvmExtError(reason)


def plan_executor(compiled: CompiledGru, specs: Mapping[str, Any], target: TargetInfo, prepared: int = 0) -> Any:
    """The executor of a compiled plan (the GRU's, the LSTM's) on its buffers ``specs``: OpenCL
    runs its kernel launches, CUDA calls its functions through TVM's runtime; ``prepared``: how
    many of the first steps prepare what the weights give (``CompiledGru.prepared_steps``)."""
    if target.kind == "opencl":
        return OpenclExecutor.of(compiled.source, compiled.kernel_launches(), specs, target.device_id,
                                 prepared=prepared)
    return CudaExecutor(compiled.executable.mod, compiled.function_calls(), specs, target.device_id,
                        prepared=prepared)


def built_config(template: Any, info: TargetInfo, config: Config | Mapping[str, Any] | None, what: str) -> Config:
    """The config a layer's ``build`` compiles: ``template``'s analytic pick (``config`` None), a full
    config, or a few knob values over the default; one ``TvmExtError`` where a knob is unknown or the
    config cannot run on ``info`` (``what``: the layer's name in the message)."""
    space = template.space(info)
    if config is None:
        cfg = template.analytic_pick(info)[0]
    elif isinstance(config, Config):
        cfg = config
        space.encode(cfg)
    else:
        unknown = set(config) - set(space.names)
        if unknown:
            raise TvmExtError(f"unknown {what} knobs {sorted(unknown)}; knobs: {', '.join(space.names)}")
        cfg = template.default_config(info).replace(**config)
        space.encode(cfg)
    reason = space.infeasible_reason(cfg)
    if reason:
        raise TvmExtError(f"{what} config not feasible on {info.kind}: {reason}")
    return cfg


def expected_weight_shapes(template: Any, gates: int) -> dict[str, tuple[int, ...]]:
    """A recurrent stack's ``state_dict`` shapes in PyTorch's names (``gates`` blocks of rows a matrix)."""
    g, shapes = gates * template.hidden, {}
    for layer in range(template.layers):
        for sfx in ("", "_reverse")[: template.dirs]:
            shapes[f"weight_ih_l{layer}{sfx}"] = (g, template.layer_input(layer))
            shapes[f"weight_hh_l{layer}{sfx}"] = (g, template.hidden)
            shapes[f"bias_ih_l{layer}{sfx}"] = (g,)
            shapes[f"bias_hh_l{layer}{sfx}"] = (g,)
    return shapes


def weight_arrays(weights: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]], what: str) -> dict[str, Any]:
    """PyTorch-named weights checked against ``expected`` as numpy arrays: biases may be left out
    altogether (zeros, as ``bias=False``); integers and bools as float64 (exact); one
    ``TvmExtError`` naming an unexpected, missing or misshapen weight."""
    unknown = sorted(set(weights) - set(expected))
    if unknown:
        hint = " (proj_size is not supported)" if any("weight_hr" in k for k in unknown) else ""
        raise TvmExtError(f"unexpected {what} weight {unknown[0]!r}{hint}; expected keys: {', '.join(expected)}")
    has_bias = any(k.startswith("bias") for k in weights)
    arrays = {}
    for name, shape in expected.items():
        if name not in weights:
            if name.startswith("bias") and not has_bias:
                arrays[name] = np.zeros(shape, np.float32)
                continue
            raise TvmExtError(f"missing {what} weight {name!r} of shape {shape}")
        array = _numpy(weights[name])
        if array.dtype.kind not in "f" and array.dtype != np_dtype("bfloat16"):
            array = array.astype(np.float64)  # integers, bools: exact in float64
        if array.shape != shape:
            raise TvmExtError(f"{what} weight {name!r} has shape {array.shape}, expected {shape}")
        arrays[name] = array
    return arrays


class GRU:
    """``torch.nn.GRU`` inference compiled for one (batch, seq) shape: build once, run many times.

    >>> gru = GRU.build("opencl", input_size=16, hidden_size=32, batch=4, seq=10)
    >>> gru.load_state_dict(torch_gru.state_dict())
    >>> output, h_n = gru(x)            # numpy in, numpy out, PyTorch's shapes

    Mixed precision: ``GRU.build(..., precision={"w_ih": "bfloat16", "w_hh": "bfloat16"})``
    (names and stages in ``PRECISION_PARAMS``).  The interface stays float32: weights are
    given as usual (float32 numpy arrays or a torch ``state_dict``) and rounded to their
    dtypes as they are loaded, x and h0 are rounded to ``x`` and ``h``, and the outputs come
    back as float32 arrays (widened from bfloat16/float16, rounded from float64).
    """

    barrier_timeout = BARRIER_TIMEOUT  # what a timed-out grid barrier of its step kernel raises

    def __init__(self, template: GruTemplate, config: Config, target: TargetInfo, batch_first: bool,
                 compiled: CompiledGru):
        self.template = template
        self.config = config
        self.target = target
        self.batch_first = batch_first
        self.compiled = compiled
        self.persistent = any("bar" in c.args for c in compiled.calls)  # its barrier flag is read per call
        self._splits_state = template.step_variant(config).splits_state  # h0 and W_hh split into float16 parts
        specs = template.for_config(config).buffers()
        # W_ih's parts: split as the weights are loaded
        self.executor = plan_executor(compiled, specs, target, compiled.prepared_steps(target.kind))
        self._loaded = False

    @classmethod
    def build(cls, target: TargetInfo | str, input_size: int, hidden_size: int, num_layers: int = 1,
              bidirectional: bool = False, batch_first: bool = False, batch: int = 1, seq: int = 1,
              config: Config | Mapping[str, Any] | None = None, device_id: int = 0,
              precision: Mapping[str, str] | None = None, variable_lengths: bool = False) -> "GRU":
        """Compile every kernel for this shape. ``config``: a full GRU config, or a few knob
        values that override the default (e.g. ``{"fuse_step": 1}``); none: the template's
        ``analytic_pick`` for this shape and device (on a GPU, the fused split-K step kernel, or with
        16-bit h and W_hh the tensor-core one).  ``variable_lengths``: calls take ``lengths`` (each
        row stops at its own length, as a ``PackedSequence``).  ``precision``: dtypes of some of ``PRECISION_PARAMS``
        (e.g. ``{"gi": "bfloat16"}``), the rest float32; GEMM operands both float16 or both bfloat16
        run on a tensor-core tile on CUDA (``GruTemplate.with_tensor_cores``)."""
        from tvm_ext.target import resolve_target

        info = resolve_target(target, device_id) if isinstance(target, str) else target
        template = GruTemplate(batch=batch, hidden=hidden_size, input=input_size, seq=seq,
                               layers=num_layers, bidirectional=bool(bidirectional),
                               variable_lengths=bool(variable_lengths))
        template = template.with_precision(dict(precision or {})).with_tensor_cores(info)
        cfg = built_config(template, info, config, "GRU")
        return cls(template, cfg, info, bool(batch_first), template.compile(cfg, info))

    @property
    def precision(self) -> dict[str, str]:
        """The dtype of each precision parameter (``PRECISION_PARAMS``)."""
        return self.template.precision

    # ---- weights --------------------------------------------------------------------------
    def expected_weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return expected_weight_shapes(self.template, 3)

    def load_numpy(self, weights: Mapping[str, Any]) -> "GRU":
        """Load PyTorch-named weights (``weight_ih_l0``, ``bias_hh_l1_reverse``, ...); biases may
        be left out altogether (``nn.GRU(bias=False)``).  Any float type is accepted; they are
        rounded once, to the dtypes of ``w_ih`` / ``w_hh``."""
        arrays = weight_arrays(weights, self.expected_weight_shapes(), "GRU")
        # the weights stored as scaled float16 parts (``split.py``), by the knob that splits them
        split = {"weight_ih": "in_split"} if self.config.in_split in FLOAT16_SPLITS else {}
        if self._splits_state:
            split["weight_hh"] = "step_tc 2"
        check_split_weights(arrays, split)
        for name, array in self.template.device_weights(arrays).items():
            self.executor.write(name, array)
        self.executor.prepare()  # what the weights give once (``plan.prepare_calls``)
        self._loaded = True
        return self

    def split_inputs(self) -> dict[str, str]:
        """The call inputs this config splits into float16 parts, each with the knob that does
        (``split.split_range_reason``: such an input must stay below ``FLOAT16_MAX``): x with a
        float16-parts input GEMM, h0 where the step kernel splits the state."""
        return {**({"x": "in_split"} if self.config.in_split in FLOAT16_SPLITS else {}),
                **({"h0": "step_tc 2"} if self._splits_state else {})}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> "GRU":
        """Load ``torch.nn.GRU.state_dict()`` (tensors on any device)."""
        return self.load_numpy({k: _numpy(v) for k, v in state_dict.items()})

    # ---- forward ----------------------------------------------------------------------------
    def __call__(self, x: Any, h0: Any = None, lengths: Any = None,
                 enforce_sorted: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(output, h_n) as ``torch.nn.GRU`` returns them: float32 numpy arrays, or, where x comes
        in the type the output is stored in (float16 x to a float16 GRU), in that type, as
        torch returns them (no widening on the host); x and h0 (any float type) are rounded to
        ``x`` and ``h``.
        ``lengths`` (a GRU built with ``variable_lengths``): each row's length, as
        ``pack_padded_sequence`` takes them (sorted decreasing only with ``enforce_sorted``)."""
        t = self.template
        if not self._loaded:
            raise TvmExtError("GRU weights are not loaded: call load_numpy or load_state_dict first")
        if t.variable_lengths:
            lengths = (np.full(t.batch, t.seq, np.int32) if lengths is None
                       else checked_lengths(lengths, t.batch, t.seq, enforce_sorted))
        elif lengths is not None:
            raise TvmExtError("this GRU was built for full-length rows: build it with variable_lengths=True "
                              "to pass lengths")
        x = _numpy(x)
        result = x.dtype if x.dtype == np_dtype(t.out_dtype) == np_dtype(t.h_dtype) else np.dtype(np.float32)
        want = (t.batch, t.seq, t.input) if self.batch_first else (t.seq, t.batch, t.input)
        if x.shape != want:
            layout = "(batch, seq, input)" if self.batch_first else "(seq, batch, input)"
            raise TvmExtError(f"GRU input has shape {x.shape}, expected {want} {layout}")
        if self.batch_first:
            x = x.transpose(1, 0, 2)
        limits = self.split_inputs()
        reason = split_range_reason("GRU input x", x, knob=limits["x"]) if "x" in limits else None
        if reason:
            raise TvmExtError(reason)
        state_shape = (t.layers * t.dirs, t.batch, t.hidden)
        if h0 is None:
            h0 = np.zeros(state_shape, np.float32)
        else:
            h0 = _numpy(h0)
            if h0.shape != state_shape:
                raise TvmExtError(f"GRU h0 has shape {h0.shape}, expected {state_shape} "
                                  "(layers·directions, batch, hidden)")
            reason = split_range_reason("GRU h0", h0, knob=limits["h0"]) if "h0" in limits else None
            if reason:
                raise TvmExtError(reason)
        ex = self.executor
        ex.write("x", x)
        ex.write("h0", h0)
        if t.variable_lengths:
            ex.write("lengths", lengths)
        ex.run()
        if barrier_timed_out(self.persistent, ex):
            raise TvmExtError(BARRIER_TIMEOUT)
        out = ex.read("out").reshape(t.seq, t.batch, t.dirs * t.hidden).astype(result, copy=False)
        h_n = ex.read("h_n").astype(result, copy=False)
        ex.sync()
        if self.batch_first:
            out = np.ascontiguousarray(out.transpose(1, 0, 2))
        return out, h_n

    def time(self, x: Any, h0: Any = None, repeat: int = 20) -> float:
        """Median seconds of one forward pass (inputs already on the device, after a warm-up)."""
        self(x, h0)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            self.executor.run()
            self.executor.sync()
            times.append(time.perf_counter() - start)
        return statistics.median(times)
