"""ONNX models into Relax with their GRU and LSTM layers on tvm_ext's kernels, RNN layers unrolled.

TVM's ONNX frontend has no ``GRU`` operator, so a GRU model cannot be imported at all.  Here
the frontend runs with one more converter: an ONNX ``GRU`` node becomes tvm_ext's GRU
placeholder (``relax_gru``: ``call_dps_packed("tvm_ext.gru", ...)``), which ``tune model``
tunes as one task and lowers to the tuned plan.  ONNX's gates come in the order z, r, h and
PyTorch's (ours) r, z, n; the weights are reordered into the device layout once, at import.

On the kernel as PyTorch exports it: ``linear_before_reset=1``, ``direction`` forward or
bidirectional (or reverse without ``sequence_lens``: the kernel runs the reversed sequence), the
default activations, no ``clip``, ``layout`` 0 or 1, optional ``B``, ``sequence_lens`` and
``initial_h``, W, R and B initializers.  An ``LSTM`` node of the same form
(gates i, o, f, c in ONNX, i, f, g, o in PyTorch; no peepholes) becomes
tvm_ext's LSTM placeholder (``tvm_ext.lstm``, ``schedules.lstm``).  Any other GRU or LSTM, and
every ``RNN`` node, runs unrolled in Relax (``onnx_rnn``, a note on stderr saying why); what
that form cannot run either is refused with the attribute named.
"""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Iterator, Mapping

import numpy as np

from ..core.errors import TvmExtError, last_line, run_frontend, unconverted_error
from ..precision.precision import example_array
from .onnx_fold import fold_static_shapes
from .onnx_attention import attention_converter
from .onnx_operators import missing_operators
from .onnx_quantized import quantized_converters
from .onnx_rnn import DEFAULT_ACTIVATIONS, GATES, Activation, RecurrentNode, convert_unrolled, read_node
from .onnx_spectral import spectral_converters
from .recurrent_fold import fold_linears_into_recurrent
from .relax_gru import GRU_FUNCTION, LSTM_FUNCTION

ONNX_GATES = ("z", "r", "h")  # ONNX's order of the three gates in W, R and B
TORCH_GATES = ("r", "z", "h")  # PyTorch's (and the device layout's): reset, update, new
ONNX_LSTM_GATES = ("i", "o", "f", "c")  # the LSTM's: input, output, forget, cell
TORCH_LSTM_GATES = ("i", "f", "c", "o")  # PyTorch's i, f, g, o
KERNEL_DTYPES = ("float32", "float16", "bfloat16")  # what the LSTM kernel stores


def _gates_to_torch(array: np.ndarray, hidden: int, onnx: tuple[str, ...] = ONNX_GATES,
                    torch: tuple[str, ...] = TORCH_GATES) -> np.ndarray:
    """Rows of gate blocks in ONNX's order ([z; r; h]) in PyTorch's ([r; z; h]), along the first axis."""
    blocks = {g: array[i * hidden:(i + 1) * hidden] for i, g in enumerate(onnx)}
    return np.concatenate([blocks[g] for g in torch])


def _constant(expr: Any, name: str) -> np.ndarray:
    import tvm

    if not isinstance(expr, tvm.ir.expr.Constant):
        raise TvmExtError(f"ONNX GRU input {name} must be an initializer (a constant), got {type(expr).__name__}")
    return expr.value.numpy()


def _kernel_refusal(node: RecurrentNode) -> str | None:
    """Why tvm_ext's GRU kernel cannot run a GRU node of these attributes (``read_node``'s reading;
    it then runs unrolled, ``onnx_rnn``), or None."""
    if node.linear_before_reset != 1:
        return "linear_before_reset=0 (the kernel applies the reset gate after the recurrent product, as PyTorch)"
    if node.clip is not None:
        return f"clip={node.clip}"
    kernels = tuple(Activation(name) for name in DEFAULT_ACTIVATIONS["GRU"])  # sigmoid gates, tanh candidate
    if any(functions != kernels for functions in node.activations):
        return f"activations={[act.name for functions in node.activations for act in functions]}"
    return None


def convert_gru(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """One ONNX GRU node as tvm_ext's GRU placeholder: (Y (T, dirs, B, H), Y_h (dirs, B, H))."""
    import tvm

    from ..schedules.gru import GruTemplate

    node = read_node("GRU", attrs)
    refusal = _kernel_refusal(node)
    x, w, r = inputs[0], inputs[1], inputs[2]
    extra = list(inputs[3:]) + [None] * (6 - len(inputs))
    b, lengths, h0 = extra[0], extra[1], extra[2]
    if refusal is None and not all(isinstance(v, tvm.ir.expr.Constant) for v in (w, r, b) if v is not None):
        refusal = "W, R or B computed in the graph (the kernel takes them as initializers)"
    if refusal is None and node.direction == "reverse" and lengths is not None:
        refusal = "direction='reverse' with sequence_lens (each row would start at its own last step)"
    if refusal is not None:
        return convert_unrolled(bb, "GRU", list(inputs), attrs, why=f"tvm_ext's GRU kernel does not run {refusal}")
    direction = node.direction
    w_array, r_array = _constant(w, "W"), _constant(r, "R")
    dirs, gates, _ = w_array.shape
    hidden = gates // 3
    if int(attrs.get("hidden_size", hidden)) != hidden or r_array.shape != (dirs, gates, hidden):
        raise TvmExtError(f"ONNX GRU hidden_size={attrs.get('hidden_size')} disagrees with W {w_array.shape} "
                          f"and R {r_array.shape}")
    if dirs != node.dirs:
        raise TvmExtError(f"ONNX GRU direction={direction} with W of {dirs} directions")
    b_array = np.zeros((dirs, 2 * gates), w_array.dtype) if b is None else _constant(b, "B")
    state = _torch_state(w_array, r_array, b_array, hidden, ONNX_GATES, TORCH_GATES)
    return _kernel_call(bb, node, GRU_FUNCTION, GruTemplate, x, [h0], state, lengths)


def _reversed_in_time(bb: Any, value: Any, node: RecurrentNode) -> Any:
    """``value`` (sequence-first) with its steps in reverse order where the node runs one direction
    backwards (``direction="reverse"``, as Keras' ``go_backwards`` exports): our kernels run it
    forwards on the reversed sequence, its output reversed back; the final states are the same."""
    from tvm import relax

    return bb.emit(relax.op.flip(value, axis=0)) if node.direction == "reverse" else value


def _lstm_kernel_refusal(node: RecurrentNode, inputs: list[Any]) -> str | None:
    """Why tvm_ext's LSTM kernel cannot run this LSTM node (it then runs unrolled), or None."""
    import tvm

    x, w, r, b, lengths, _, _, p = inputs[:8]
    if node.clip is not None:
        return f"clip={node.clip}"
    kernels = tuple(Activation(name) for name in DEFAULT_ACTIVATIONS["LSTM"])
    if any(functions != kernels for functions in node.activations):
        return f"activations={[act.name for functions in node.activations for act in functions]}"
    if lengths is not None and node.direction == "reverse":
        return "direction='reverse' with sequence_lens (each row would start at its own last step)"
    if str(x.ty.dtype) not in KERNEL_DTYPES:
        return f"{x.ty.dtype} (it stores {', '.join(KERNEL_DTYPES)})"
    if not all(isinstance(v, tvm.ir.expr.Constant) for v in (w, r, b, p) if v is not None):
        return "W, R, B or P computed in the graph (the kernel takes them as initializers)"
    if p is not None and np.any(_constant(p, "P")):
        return "peepholes (P)"
    return None


def convert_lstm(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """One ONNX LSTM node as tvm_ext's LSTM placeholder: (Y (T, dirs, B, H), Y_h, Y_c (dirs, B, H)),
    or unrolled (``onnx_rnn``) where the kernel does not run its form."""
    from ..schedules.lstm import LstmTemplate

    node = read_node("LSTM", attrs)
    inputs = list(inputs) + [None] * (8 - len(inputs))
    refusal = _lstm_kernel_refusal(node, inputs)
    if refusal is not None:
        return convert_unrolled(bb, "LSTM", inputs, attrs, why=f"tvm_ext's LSTM kernel does not run {refusal}")
    x, w, r, b, lengths, h0, c0, _ = inputs[:8]
    w_array, r_array = _constant(w, "W"), _constant(r, "R")
    dirs, gates, _ = w_array.shape
    hidden = gates // 4
    if int(attrs.get("hidden_size", hidden)) != hidden or r_array.shape != (dirs, gates, hidden) or dirs != node.dirs:
        raise TvmExtError(f"ONNX LSTM hidden_size={attrs.get('hidden_size')} and direction={node.direction} "
                          f"disagree with W {w_array.shape} and R {r_array.shape}")
    b_array = np.zeros((dirs, 2 * gates), w_array.dtype) if b is None else _constant(b, "B")
    state = _torch_state(w_array, r_array, b_array, hidden, ONNX_LSTM_GATES, TORCH_LSTM_GATES)
    return _kernel_call(bb, node, LSTM_FUNCTION, LstmTemplate, x, [h0, c0], state, lengths)


def _torch_state(w: np.ndarray, r: np.ndarray, b: np.ndarray, hidden: int, onnx: tuple[str, ...],
                 torch: tuple[str, ...]) -> dict[str, np.ndarray]:
    """A one-layer recurrent node's W (dirs, G, I), R (dirs, G, H) and B (dirs, 2G) as PyTorch's
    ``state_dict`` (float64), each gate block moved from ONNX's order to PyTorch's."""
    state = {}
    for d in range(w.shape[0]):
        sfx = "_reverse" if d else ""
        gates = w.shape[1]
        for name, rows in (("weight_ih", w[d]), ("weight_hh", r[d]), ("bias_ih", b[d, :gates]),
                           ("bias_hh", b[d, gates:])):
            state[f"{name}_l0{sfx}"] = _gates_to_torch(rows, hidden, onnx, torch).astype(np.float64)
    return state


def _kernel_call(bb: Any, node: RecurrentNode, function: str, template_class: Any, x: Any, states: list[Any],
                 state: dict[str, np.ndarray], lengths: Any) -> Any:
    """A one-layer GRU or LSTM node as its placeholder ``function``: x and the initial ``states``
    (h0; the LSTM's h0 and c0; None: zeros) in the node's ``layout``, the weights (``state``, PyTorch's
    names) in the device layout of ``template_class`` as constants, int32 ``lengths`` last where
    given; (Y (T, dirs, B, H), then each final state (dirs, B, H)) in the node's layout, a reverse
    direction run over the reversed sequence."""
    from tvm import relax

    input_size, dirs = int(x.ty.shape.values[2]), node.dirs
    hidden = state["weight_hh_l0"].shape[1]
    if node.layout == 1:  # (B, T, I) -> (T, B, I); states (B, dirs, H) -> (dirs, B, H)
        x = bb.emit(relax.op.permute_dims(x, [1, 0, 2]))
        states = [bb.emit(relax.op.permute_dims(v, [1, 0, 2])) if v is not None else None for v in states]
    x = _reversed_in_time(bb, x, node)
    steps, batch = x.ty.shape.values[:2]  # symbolic where the file's axes are (bound by --buckets)
    dtype = str(x.ty.dtype)
    template = template_class(batch=1, hidden=hidden, input=input_size, seq=1, bidirectional=dirs == 2)  # the layout
    weights = template.device_weights(state)
    zeros = relax.ShapeExpr([dirs, batch, hidden])
    args = [bb.emit(relax.op.reshape(x, (steps * batch, input_size))),
            *(v if v is not None else bb.emit(relax.op.zeros(zeros, dtype)) for v in states),
            *(relax.const(weights[f"{n}0"].astype(dtype)) for n in ("w_ih", "b_ih", "w_hh", "b_hh"))]
    if lengths is not None:  # each row stops at its own length
        args.append(bb.emit(relax.op.astype(lengths, "int32")))
    final = relax.TensorType([dirs, batch, hidden], dtype)
    call = bb.emit(relax.call_dps_packed(
        function, relax.Tuple(args), [relax.TensorType([steps * batch, dirs * hidden], dtype), *[final] * len(states)]))
    out = bb.emit(relax.op.reshape(relax.TupleGetItem(call, 0), (steps, batch, dirs, hidden)))
    outputs = [_reversed_in_time(bb, bb.emit(relax.op.permute_dims(out, [0, 2, 1, 3])), node)]  # (T, dirs, B, H)
    outputs += [bb.emit(relax.TupleGetItem(call, i + 1)) for i in range(len(states))]
    if node.layout == 1:  # Y (B, T, dirs, H), states (B, dirs, H)
        outputs = [bb.emit(relax.op.permute_dims(outputs[0], [2, 0, 1, 3]))] + \
            [bb.emit(relax.op.permute_dims(v, [1, 0, 2])) for v in outputs[1:]]
    return relax.Tuple(outputs)


def _scalar_constant_of_shape(frontend: Any) -> Any:
    """TVM's ``ConstantOfShape`` with an empty shape (a scalar: what the torch exporter writes
    for ``torch.tensor(True)`` and masks' fill values) made a scalar constant; TVM's broadcast
    the value's one-element tensor to rank 0 and stopped the import."""
    import tvm
    from tvm import relax

    class ConstantOfShape(frontend.ConstantOfShape):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v9(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            shape = frontend.get_constant(inputs[0], params)
            empty = (isinstance(shape, tvm.ir.GenericConst) and shape.value.numpy().size == 0) or \
                (isinstance(shape, relax.ShapeExpr) and len(shape.values) == 0)
            if not empty:
                return super()._impl_v9(bb, inputs, attr, params)
            value = frontend.get_numpy(attr["value"]) if attr.get("value") is not None else np.float32(0)
            return relax.const(np.asarray(value).reshape(()))

    return ConstantOfShape


def _symbolic_range(frontend: Any) -> Any:
    """TVM's ``Range`` to a symbolic limit (transformers' position ids, ``arange(seq)``) with its
    length written in the limit's symbols: TVM's computed the length as a tensor and read it back
    as a fresh symbol (``range_len_0``) that no shape relates to ``seq``, so every kernel after it
    stayed symbolic and untuned at the sizes ``--buckets`` binds, and TVM's ``Expand`` stopped on
    comparing it with a known size ('Cannot use and / or / not operator to Expr').  Integer ranges
    with a constant start and a positive constant step, the limit at or past the start (as a
    sequence length is); any other stays TVM's."""
    import tvm
    from tvm import relax
    from tvm.sym.analyzer import Analyzer

    class Range(frontend.Range):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v12(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            start, limit, delta = (frontend.get_constant(x, params) for x in inputs[:3])
            if not (isinstance(start, tvm.ir.GenericConst) and isinstance(delta, tvm.ir.GenericConst)
                    and tvm.ir.is_prim_expr(limit)):
                return super()._impl_v12(bb, inputs, attr, params)
            first, step = start.value.numpy(), delta.value.numpy()
            dtype = str(start.ty.dtype)
            if first.size != 1 or step.size != 1 or dtype not in ("int32", "int64") or int(step) <= 0:
                return super()._impl_v12(bb, inputs, attr, params)
            first, step = int(first), int(step)
            end = limit if str(getattr(limit, "dtype", None) or limit.ty) == "int64" else tvm.tirx.Cast("int64", limit)
            count = Analyzer().simplify(tvm.tirx.floordiv(end - first + step - 1, step))
            return relax.op.arange(first, first + count * step, step, dtype)

    return Range


def _flat_repeats_tile(frontend: Any) -> Any:
    """TVM's ``Tile`` with constant repeats of more than one dimension read flat: torch's exporter
    writes Mamba2's repeats as ``[[8]] - Mod(...)``, a (1, 1) tensor, and TVM's converter passed
    the nested list to ``topi.tile``, which stopped ('Cannot convert from type Array')."""
    import tvm
    from tvm import relax

    class Tile(frontend.Tile):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v13(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            reps = frontend.get_constant(inputs[1], params)
            if isinstance(reps, tvm.ir.GenericConst) and reps.value.numpy().ndim > 1:
                inputs = [inputs[0], relax.const(reps.value.numpy().reshape(-1)), *inputs[2:]]
            return super()._impl_v13(bb, inputs, attr, params)

    return Tile


@contextlib.contextmanager
def _converters() -> Iterator[None]:
    """TVM's ONNX frontend with ``GRU``, ``LSTM``, ``RNN``, the operators of ``onnx_operators`` and the
    quantized ``QLinearConv``, ``QLinearMatMul`` and ``ConvInteger``, ``DFT``, ``STFT`` and ONNX's own
    ``Attention`` in its converter table and
    ``ConstantOfShape``, ``Range`` and ``Tile`` mended (``_scalar_constant_of_shape``,
    ``_symbolic_range``, ``_flat_repeats_tile``), for the duration (its ``Gather`` takes in clip mode
    once the model is rewritten: ``relax_rewrites.clamp_takes``)."""
    from tvm.relax.frontend.onnx import onnx_frontend as frontend

    class GRU(frontend.OnnxOpConverter):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v7(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            return convert_gru(bb, list(inputs), attr)

        _impl_v14 = _impl_v22 = _impl_v7

    class LSTM(frontend.OnnxOpConverter):  # type: ignore[misc, name-defined]
        @classmethod
        def _impl_v7(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
            return convert_lstm(bb, list(inputs), attr)

        _impl_v14 = _impl_v22 = _impl_v7

    def unrolled(op_name: str) -> Any:
        class Unrolled(frontend.OnnxOpConverter):  # type: ignore[misc, name-defined]
            @classmethod
            def _impl_v7(cls, bb: Any, inputs: list[Any], attr: dict[str, Any], params: Any) -> Any:
                return convert_unrolled(bb, op_name, list(inputs), attr)

            _impl_v14 = _impl_v22 = _impl_v7

        return Unrolled

    original = frontend._get_convert_map
    ours = {"GRU": GRU, "LSTM": LSTM, "RNN": unrolled("RNN"),
            "ConstantOfShape": _scalar_constant_of_shape(frontend), "Range": _symbolic_range(frontend),
            "Tile": _flat_repeats_tile(frontend), **missing_operators(frontend),
            **quantized_converters(frontend), **spectral_converters(frontend), **attention_converter(frontend)}

    def with_ours() -> dict[str, Any]:
        return {**original(), **ours}

    frontend._get_convert_map = with_ours
    try:
        yield
    finally:
        frontend._get_convert_map = original


def _node_name(node: Any) -> str:
    """How an error names an ONNX node: its name (or its first output), its operator."""
    return f"node {node.name or (node.output[0] if node.output else '(unnamed)')!r} ({node.op_type})"


def _refuse_before_converting(model: Any) -> None:
    """Each top-level node the frontend would refuse, as one ``TvmExtError`` naming the node,
    before the frontend starts building (a refusal from inside it leaves TVM's block builder
    open, which then warns on stderr): an operator with no converter (``convert_map``: the
    frontend's with ``GRU``; the frontend itself runs ``If`` and ``Constant``), a GRU
    attribute of a recurrent node (LSTM, GRU, RNN) no form runs (``onnx_rnn.read_node``)."""
    from onnx import helper
    from tvm.relax.frontend.onnx import onnx_frontend as frontend

    convert_map = frontend._get_convert_map()
    missing = [n for n in model.graph.node if n.op_type not in convert_map and n.op_type not in ("If", "Constant")]
    if missing:
        raise unconverted_error(_node_name(missing[0]), sorted({n.op_type for n in missing}), len(missing), "ONNX")
    for node in model.graph.node:
        if node.op_type in GATES:
            try:
                read_node(node.op_type, {a.name: helper.get_attribute_value(a) for a in node.attribute})
            except TvmExtError as exc:
                raise TvmExtError(f"{_node_name(node)}: {exc}") from None


def _sized(model: Any, sizes: Mapping[str, int]) -> Any:
    """``model`` with its inputs' named dimensions (``dim_param``) in ``sizes`` made those numbers,
    so that the whole graph is static before TVM imports it (its shape arithmetic folded by
    ``fold_static_shapes``, its kernels of known sizes)."""
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in sizes:
                dim.dim_value = int(sizes[dim.dim_param])
    return model


def read_onnx(path: str) -> Any:
    """The parsed and checked model of an ONNX file, one ``TvmExtError`` for a file that is not one;
    parsed once per version of the file (``tune model`` reads it for its dimensions, the import, the
    inputs and the reference check). Callers that change it change a copy (``load_onnx``)."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise TvmExtError("importing an ONNX model needs the onnx package: pip install onnx") from None
    if not os.path.isfile(path):
        raise TvmExtError(f"ONNX file {path} does not exist")
    stat = os.stat(path)
    return _parsed(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _parsed(path: str, mtime_ns: int, size: int) -> Any:
    import onnx

    try:
        model = onnx.load(path)
        _check(model, path)
    except Exception as exc:  # noqa: BLE001 - whatever the parser says is the file's problem
        raise TvmExtError(f"{path} is not a valid ONNX model: {str(exc).strip().splitlines()[0][:200]}") from None
    return model


def _check(model: Any, path: str) -> None:
    """ONNX's checker on the parsed model, or on the file where the model with its weights is past
    protobuf's 2 GiB (an LLM's external-data file: the checker then asks for the path)."""
    import onnx

    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # noqa: BLE001 - the checker's own error, or protobuf's size limit
        if "2G" not in str(exc):
            raise
        onnx.checker.check_model(path)


def load_onnx(path: str, sizes: Mapping[str, int] | None = None, fold_linears: bool = True) -> Any:
    """The Relax IRModule of an ONNX file (function ``main``), its GRUs as tvm_ext's (``fold_linears``:
    a ``Linear`` feeding one folded into its input projection, ``recurrent_fold``), its named
    dimensions in ``sizes`` bound to them; bad input (a file that does not parse, an operator no
    converter takes, a GRU we cannot run) is one ``TvmExtError`` naming the node."""
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(read_onnx(path))
    from tvm.relax.frontend.onnx import from_onnx

    model = fold_static_shapes(_sized(model, sizes or {}))

    def imported() -> Any:
        with _converters(), open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            _refuse_before_converting(model)
            return from_onnx(model)

    mod = run_frontend(imported, functools.partial(_import_failure, path))
    return fold_linears_into_recurrent(mod) if fold_linears else mod


def _import_failure(path: str, failure: BaseException) -> str:
    """One line for a model the frontend could not import: our refusal, a missing converter (the
    frontend's "Operator X not implemented."), or a converter's own check (an integer Pow)."""
    if isinstance(failure, TvmExtError):
        return f"{path}: {failure}"
    if isinstance(failure, NotImplementedError):
        return f"{path}: {failure} (no converter in TVM's ONNX frontend)"
    return f"{path}: TVM's ONNX frontend cannot import the model: {last_line(failure)}"


def _graph_inputs(path: str) -> Iterator[Any]:
    """An ONNX model's graph inputs that are not initializers (what a caller passes)."""
    return caller_inputs(read_onnx(path))


def caller_inputs(model: Any) -> Iterator[Any]:
    initializers = {i.name for i in model.graph.initializer}
    return (value for value in model.graph.input if value.name not in initializers)


def onnx_symbolic_dims(path: str) -> list[str]:
    """The named symbolic dimensions (``dim_param``) of an ONNX model's graph inputs, in order."""
    names: list[str] = []
    for value in _graph_inputs(path):
        names += [d.dim_param for d in value.type.tensor_type.shape.dim
                  if not d.dim_value and d.dim_param and d.dim_param not in names]
    return names


def onnx_inputs(path: str, seed: int = 0, sizes: Mapping[str, int] | None = None) -> list[np.ndarray]:
    """Random inputs of an ONNX model's graph inputs, symbolic dimensions at ``sizes`` (by name):
    floats from a standard normal, integers zero (one in a mask: ``example_array``), a recurrent node's
    ``sequence_lens`` at its step count T (every row its whole length; zero lengths would hold
    every row from its first step)."""
    import onnx

    rng = np.random.default_rng(seed)
    sizes = dict(sizes or {})
    shapes: dict[str, list[int]] = {}
    arrays = []
    model = read_onnx(path)
    for value in caller_inputs(model):
        dims = []
        for d in value.type.tensor_type.shape.dim:
            if d.dim_value:
                dims.append(d.dim_value)
            elif d.dim_param in sizes:
                dims.append(int(sizes[d.dim_param]))
            else:
                name = d.dim_param or "?"
                raise TvmExtError(f"ONNX input {value.name} has a symbolic dimension {name}; give it a size: "
                                  f"--model-option {name}=N")
        shapes[value.name] = dims
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        arrays.append(example_array(rng, dims, dtype, value.name))
    names = list(shapes)
    for name, steps in _sequence_lengths(model, shapes).items():
        arrays[names.index(name)] = np.full(shapes[name], steps, arrays[names.index(name)].dtype)
    return arrays


def _sequence_lengths(model: Any, shapes: Mapping[str, list[int]]) -> dict[str, int]:
    """The graph inputs that are a recurrent node's (LSTM, GRU, RNN) ``sequence_lens``, each with the node's step count
    (from its X's shape, X a graph input; 1 where X is computed inside the graph)."""
    found = {}
    for node in model.graph.node:
        if node.op_type not in GATES or len(node.input) < 5 or node.input[4] not in shapes:
            continue
        layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
        x = shapes.get(node.input[0])
        found[node.input[4]] = x[1 if layout else 0] if x else 1
    return found
