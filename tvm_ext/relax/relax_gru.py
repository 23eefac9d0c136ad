"""The GRU inside Relax: a ``relax.frontend.nn`` layer, and its lowering to the tuned GRU plan (and
the LSTM's: ``lstm_layer``, its placeholder and plan).

A GRU is several kernels and a host loop over the steps (``schedules/gru``), which no Relax
op or single PrimFunc pattern covers (TVM's torch frontend unrolls ``torch.nn.GRU`` per step
and refuses stacked layers).  So the layer (``gru_layer``) emits one placeholder call,
``call_dps_packed("tvm_ext.gru", [x, h0, weights...])``, that says everything about the
layer through its arguments' shapes and dtypes (``gru_template``).  ``tune_relax`` tunes the
``GruTemplate`` each placeholder stands for like any task, and ``lower_grus`` points the
placeholder at the tuned config's compiled plan (``GruProgram``: the very kernels the tuner
measured, the persistent step kernel included), registered as a packed function: the Relax
VM calls it with the model's tensors (CUDA), and the OpenCL executor runs its kernel
launches on its own buffers (``tvm_ext.relax.relax_opencl``).  The plan's scratch buffers belong to
the program.

Weights are parameters in the device layout (``GruTemplate.input_specs``: W_ih as (K, dirs·3H),
W_hh as (dirs, H, 3H)); ``device_weights`` converts a ``torch.nn.GRU`` state dict.

An LSTM has a placeholder of its own, ``call_dps_packed("tvm_ext.lstm", [x, h0, c0, weights...])``
(the ONNX and torch.export importers write it), tuned and lowered the same way to the plan of
``schedules.lstm`` (``lstm_template``); the functions here take either.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ..core.errors import TvmExtError, check_sizes
from ..core.space import Config
from ..target import TargetInfo

GRU_FUNCTION = "tvm_ext.gru"  # the placeholder's extern name
LSTM_FUNCTION = "tvm_ext.lstm"  # the LSTM's
ACC_DTYPE = "float32"  # gate GEMM accumulators, gh and the cell math of a low-precision GRU
# what a float32 GRU stores in a 16-bit ``storage`` type (the torch module's ``precision="float16"``)
STORED_TENSORS = ("x", "w_ih", "gi", "w_hh", "h", "out")
STORAGE_DTYPES = ("float16", "bfloat16")


# ---- the frontend layer -----------------------------------------------------------------------
def gru_layer(input_size: int, hidden_size: int, num_layers: int = 1, bidirectional: bool = False,
              dtype: str = "float32") -> Any:
    """A ``relax.frontend.nn`` GRU layer (``torch.nn.GRU`` semantics, sequence-first): call it
    on x (T, B, input) and optionally h0 (layers·dirs, B, hidden); it returns (out (T, B,
    dirs·hidden), h_n).  Parameters ``w_ih{l}``, ``b_ih{l}``, ``w_hh{l}``, ``b_hh{l}`` are in
    the device layout (``device_weights``)."""
    base = _recurrent_module("gru", input_size, hidden_size, num_layers, bidirectional, dtype)

    class GRU(base):  # type: ignore[misc, valid-type]
        def forward(self, x: Any, h0: Any = None) -> Any:
            out, (h_n,) = self.placeholder(x, (h0,))
            return out, h_n

    return GRU()


def lstm_layer(input_size: int, hidden_size: int, num_layers: int = 1, bidirectional: bool = False,
               dtype: str = "float32") -> Any:
    """A ``relax.frontend.nn`` LSTM layer (``torch.nn.LSTM`` semantics, sequence-first, gates i, f,
    g, o): call it on x (T, B, input) and optionally h0 and c0 (layers·dirs, B, hidden); it
    returns (out (T, B, dirs·hidden), h_n, c_n).  Parameters as ``gru_layer``'s, four gates a
    unit (``device_weights(..., cell="lstm")``)."""
    base = _recurrent_module("lstm", input_size, hidden_size, num_layers, bidirectional, dtype)

    class LSTM(base):  # type: ignore[misc, valid-type]
        def forward(self, x: Any, h0: Any = None, c0: Any = None) -> Any:
            out, (h_n, c_n) = self.placeholder(x, (h0, c0))
            return out, h_n, c_n

    return LSTM()


def _recurrent_module(cell: str, input_size: int, hidden_size: int, num_layers: int, bidirectional: bool,
                      dtype: str) -> Any:
    """The ``nn.Module`` base of ``gru_layer`` / ``lstm_layer``: the weights as parameters and
    ``placeholder``, the one call (``GRU_FUNCTION`` / ``LSTM_FUNCTION``) the layer stands for."""
    from tvm import relax
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn.core import wrap_nested

    check_sizes(f"{cell}_layer", input_size=input_size, hidden_size=hidden_size, num_layers=num_layers)
    dirs, rows = 2 if bidirectional else 1, (4 if cell == "lstm" else 3) * hidden_size
    function = LSTM_FUNCTION if cell == "lstm" else GRU_FUNCTION

    class Recurrent(nn.Module):
        def __init__(self) -> None:
            for layer in range(num_layers):
                k = input_size if layer == 0 else dirs * hidden_size
                setattr(self, f"w_ih{layer}", nn.Parameter((k, dirs * rows), dtype))
                setattr(self, f"b_ih{layer}", nn.Parameter((dirs * rows,), dtype))
                setattr(self, f"w_hh{layer}", nn.Parameter((dirs, hidden_size, rows), dtype))
                setattr(self, f"b_hh{layer}", nn.Parameter((dirs, rows), dtype))

        def placeholder(self, x: Any, states: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
            """(out (T, B, dirs·hidden), final states) of x and the initial ``states`` (None: zeros)."""
            seq, batch, features = x.shape  # seq and batch may be symbolic (bound before tuning: ``buckets``)
            if int(features) != input_size:
                raise TvmExtError(f"{cell.upper()} input has {features} features, the layer takes {input_size}")
            shape = (num_layers * dirs, batch, hidden_size)
            states = tuple(nn.op.zeros(shape, dtype) if s is None else s for s in states)
            weights = []
            for layer in range(num_layers):
                weights += [getattr(self, f"{name}{layer}") for name in ("w_ih", "b_ih", "w_hh", "b_hh")]
            args = [nn.op.reshape(x, (seq * batch, input_size)), *states, *weights]
            state_type = relax.TensorType(list(shape), dtype)
            call = relax.call_dps_packed(  # (nn.op.extern cannot declare two outputs in TVM 0.27)
                function, relax.Tuple([a._expr for a in args]),
                [relax.TensorType([seq * batch, dirs * hidden_size], dtype), *[state_type] * len(states)])
            out, *finals = wrap_nested(call, cell)
            return nn.op.reshape(out, (seq, batch, dirs * hidden_size)), tuple(finals)

    return Recurrent


def device_weights(state_dict: Mapping[str, Any], input_size: int, hidden_size: int, num_layers: int = 1,
                   bidirectional: bool = False, dtype: str = "float32", cell: str = "gru") -> dict[str, np.ndarray]:
    """A ``torch.nn.GRU`` state dict (numpy arrays or tensors; ``cell="lstm"``: a ``torch.nn.LSTM``'s)
    -> the layer's parameters by name (``w_ih0``, ...), in the device layout and ``dtype``."""
    from ..schedules.gru import GruTemplate
    from ..schedules.lstm import LstmTemplate

    def as_numpy(value: Any) -> np.ndarray:  # a torch tensor on any device, or an array
        return value.detach().cpu().double().numpy() if hasattr(value, "detach") else np.asarray(value, np.float64)

    template = (LstmTemplate if cell == "lstm" else GruTemplate)(
        batch=1, hidden=hidden_size, input=input_size, seq=1, layers=num_layers, bidirectional=bidirectional)
    arrays = template.device_weights({k: as_numpy(v) for k, v in state_dict.items()})
    return {k: np.asarray(v, dtype=np.float64).astype(dtype) for k, v in arrays.items()}


# ---- finding the placeholders ---------------------------------------------------------------------
@dataclass(frozen=True)
class GruCall:
    """A placeholder in a Relax function, and the GRU it stands for."""

    function: str
    var: str
    template: Any  # schedules.gru.GruTemplate


def _placeholder(value: Any) -> str | None:
    """The extern name of a GRU or LSTM placeholder call (``GRU_FUNCTION``, ``LSTM_FUNCTION``), else None."""
    import tvm
    from tvm import relax

    if not isinstance(value, relax.Call) or not value.op.same_as(tvm.ir.Op.get("relax.call_dps_packed")):
        return None
    func = value.args[0]
    name = str(func.global_symbol) if isinstance(func, relax.ExternFunc) else ""
    return name if name in (GRU_FUNCTION, LSTM_FUNCTION) else None


def _is_gru_call(value: Any) -> bool:
    """Whether ``value`` is a placeholder of a recurrent layer (a GRU's or an LSTM's)."""
    return _placeholder(value) is not None


def _tensor(expr_type: Any, what: str, op: str = "GRU") -> tuple[tuple[int, ...], str]:
    import tvm

    values = getattr(getattr(expr_type, "shape", None), "values", None)
    if values is None:
        raise TvmExtError(f"{op} {what} needs a static shape, got {getattr(expr_type, 'shape', None)}")
    if not all(hasattr(v, "value") for v in values):
        names = sorted({str(var) for v in values for var in tvm.tirx.analysis.undefined_vars(v)})
        shape = ", ".join(str(int(v.value)) if hasattr(v, "value") else str(v) for v in values)
        raise TvmExtError(f"{op} {what} of shape ({shape}) has symbolic dimensions ({', '.join(names)}): the "
                          f"{op} is built for known sizes; give each a size (tune model: --model-option NAME=N) or "
                          "tune it at buckets (--buckets NAME=SIZES)")
    return tuple(int(v.value) for v in values), str(expr_type.dtype)


def _out_types(call: Any) -> list[Any]:
    """A placeholder's result types, one per output."""
    types = list(call.ty_args)
    return list(types[0].fields) if len(types) == 1 and hasattr(types[0], "fields") else types


def lstm_template(call: Any, target: TargetInfo | None = None, storage: str | None = None) -> Any:
    """The ``LstmTemplate`` an LSTM placeholder stands for (x (T·B, I), h0, c0, then W_ih, b_ih,
    W_hh, b_hh of each layer in the device layout, optionally int32 lengths): sizes from the
    shapes, its storage type x's;
    ``storage`` (float16, bfloat16) that of a float32 LSTM (``lower_grus`` casts its arguments and
    results), its products and cell staying float32, as ``gru_template``'s."""
    from ..schedules.lstm import LstmTemplate

    args = list(call.args[1].fields)
    lengths = len(args) > 7 and (len(args) - 3) % 4 == 1 and _tensor(args[-1].ty, "lengths", "LSTM")[1] == "int32"
    if lengths:  # each row's own length, last (``LstmTemplate.input_specs``'s order)
        args = args[:-1]
    if len(args) < 7 or (len(args) - 3) % 4:
        raise TvmExtError(f"LSTM call takes x, h0, c0, 4 weights per layer and optionally int32 lengths, got "
                          f"{len(call.args[1].fields)} arguments")
    (rows, features), dtype = _tensor(args[0].ty, "input", "LSTM")
    (states, batch, hidden), _ = _tensor(args[1].ty, "h0", "LSTM")
    layers = (len(args) - 3) // 4
    (dirs, _, _), _ = _tensor(args[5].ty, "w_hh0", "LSTM")
    if rows % batch or states != layers * dirs:
        raise TvmExtError(f"LSTM shapes disagree: input rows {rows}, h0 {states}x{batch}x{hidden}")
    if storage is not None and storage not in STORAGE_DTYPES:
        raise TvmExtError(f"LSTM storage {storage!r} is not supported; allowed: {', '.join(STORAGE_DTYPES)}")
    if storage is not None and dtype == "float32":
        dtype = storage
    template = LstmTemplate(batch=batch, hidden=hidden, input=features, seq=rows // batch, layers=layers,
                            bidirectional=dirs == 2, dtype=dtype, variable_lengths=bool(lengths))
    return template.with_tensor_cores(target) if target is not None else template


def gru_template(call: Any, target: TargetInfo | None = None, storage: str | None = None) -> Any:
    """The ``GruTemplate`` a placeholder call stands for: sizes from its arguments' shapes,
    precision from their dtypes (accumulators, gh and the cell math float32; gi in x's type
    where x and W_ih share a 16-bit type, else float32).  ``storage``
    (float16 or bfloat16): a float32 GRU stores x, the weights, gi, h and out in that type
    (``lower_grus`` casts its arguments and results), its sums and cell staying float32.  An
    LSTM placeholder's ``LstmTemplate`` (``lstm_template``, ``storage`` as here)."""
    from ..schedules.gru import GruTemplate

    if _placeholder(call) == LSTM_FUNCTION:
        return lstm_template(call, target, storage)
    args = list(call.args[1].fields)
    lengths = len(args) > 6 and (len(args) - 2) % 4 == 1 and _tensor(args[-1].ty, "lengths")[1] == "int32"
    if lengths:  # each row's own length, last (``GruTemplate.input_specs``'s order)
        args = args[:-1]
    if len(args) < 6 or (len(args) - 2) % 4:
        raise TvmExtError(f"GRU call takes x, h0, 4 weights per layer and optionally int32 lengths, "
                          f"got {len(call.args[1].fields)} arguments")
    (rows, features), x_dtype = _tensor(args[0].ty, "input")
    (states, batch, hidden), h_dtype = _tensor(args[1].ty, "h0")
    layers = (len(args) - 2) // 4
    (dirs, _, _), w_hh_dtype = _tensor(args[4].ty, "w_hh0")
    _, w_ih_dtype = _tensor(args[2].ty, "w_ih0")
    _, out_dtype = _tensor(_out_types(call)[0], "output")
    if rows % batch or states != layers * dirs:
        raise TvmExtError(f"GRU shapes disagree: input rows {rows}, h0 {states}x{batch}x{hidden}")
    template = GruTemplate(batch=batch, hidden=hidden, input=features, seq=rows // batch, layers=layers,
                           bidirectional=dirs == 2, variable_lengths=bool(lengths))
    acc = ACC_DTYPE if x_dtype != "float32" else "float32"
    # a 16-bit GRU stores gi in its input GEMM's operand type, as cuDNN and ``tvm_ext.torch.GRU`` do
    gi = w_ih_dtype if x_dtype == w_ih_dtype != "float32" else acc
    template = template.with_precision({
        "x": x_dtype, "w_ih": w_ih_dtype, "in_acc": acc, "gi": gi, "w_hh": w_hh_dtype, "hid_acc": acc,
        "gh": acc, "h": h_dtype, "cell_math": acc, "out": out_dtype})
    if storage is not None:
        if storage not in STORAGE_DTYPES:
            raise TvmExtError(f"GRU storage {storage!r} is not supported; allowed: {', '.join(STORAGE_DTYPES)}")
        if {x_dtype, w_ih_dtype, w_hh_dtype, h_dtype, out_dtype} == {"float32"}:
            template = template.with_precision({name: storage for name in STORED_TENSORS})
    if target is not None:
        template = template.with_tensor_cores(target)
    return template


def find_grus(mod: Any, target: TargetInfo | None = None, storage: str | None = None) -> list[GruCall]:
    """Every GRU and LSTM placeholder of the module's Relax functions, in order (``storage``: as
    ``gru_template``'s)."""
    from tvm import relax

    found = []
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                if isinstance(binding, relax.VarBinding) and _is_gru_call(binding.value):
                    found.append(GruCall(gv.name_hint, str(binding.var.name),
                                         gru_template(binding.value, target, storage)))
    return found


# ---- the tuned plan behind a packed function ------------------------------------------------------
class GruProgram:
    """One GRU config compiled (``GruTemplate.compile``: the kernels the tuner measured) and run
    in destination-passing style: inputs and outputs are the caller's tensors, the plan's
    scratch buffers are its own.  On CUDA it is a packed function the Relax VM calls (the
    plan's calls, the persistent kernel included, through TVM's runtime); on OpenCL the
    executor of ``tvm_ext.relax.relax_opencl`` runs its kernel launches (``artifact``)."""

    def __init__(self, template: Any, config: Config, target: TargetInfo):
        self.template = template.for_config(config)  # its buffers are the plan's
        self.config = config
        self.target = target
        self.compiled = template.compile(config, target)
        self.name = program_name(template, config, target)  # the packed function's name
        self.specs = self.template.buffers()
        self.inputs = list(template.input_specs())
        self.outputs = list(template.output_specs())
        self._scratch: dict[str, Any] | None = None  # on the device of the first call
        self._funcs: dict[str, Any] = {}
        self._checked = False

    def artifact(self) -> Any:
        """The plan as OpenCL kernel launches on the buffers ``buffers()`` names."""
        from ..measure.program import Artifact

        return Artifact("opencl", self.compiled.source, self.compiled.kernel_launches(), tuple(self.specs))

    def __call__(self, *tensors: Any) -> None:
        """The Relax VM's call: every input, then every output (TVM tensors on the device); the
        weights are this call's inputs, so W_ih's parts (``prepare``) are split in it too."""
        self.launch(tensors, self.compiled.prepare + self.compiled.calls)
        self.check_barrier()

    def launch(self, tensors: tuple[Any, ...], calls: tuple[Any, ...], own: Mapping[str, Any] | None = None) -> None:
        """``calls`` on the caller's ``tensors``, the program's scratch buffers and ``own``
        (buffers of a caller's in place of the scratch ones of those names)."""
        if len(tensors) != len(self.inputs) + len(self.outputs):
            raise TvmExtError(f"{self.name} takes {len(self.inputs) + len(self.outputs)} tensors, got {len(tensors)}")
        if self._scratch is None:
            self._scratch = _allocated(self.template.scratch_specs(), tensors[0].device)
            self._funcs = {c.func: self.compiled.executable.mod[c.func]
                           for c in self.compiled.prepare + self.compiled.calls}
        bound = {**dict(zip(self.inputs + self.outputs, tensors)), **self._scratch, **(own or {})}
        for call in calls:
            self._funcs[call.func](*[bound[a] if isinstance(a, str) else int(a) for a in call.args])

    def check_barrier(self) -> None:
        """After the first pass of a persistent step kernel: its barrier held (once)."""
        if not self._checked and "bar" in (self._scratch or {}):
            from ..schedules.gru.plan import BARRIER_TIMEOUT
            from ..schedules.lstm.plan import BARRIER_TIMEOUT as LSTM_BARRIER_TIMEOUT

            self._checked = True
            if int(self._scratch["bar"].numpy()[1]):
                raise TvmExtError(LSTM_BARRIER_TIMEOUT if self.template.name == "lstm" else BARRIER_TIMEOUT)


def _allocated(specs: Mapping[str, Any], dev: Any) -> dict[str, Any]:
    """A TVM tensor on ``dev`` for each of ``specs`` (TensorSpec by name)."""
    import tvm

    return {name: tvm.runtime.empty(spec.shape, spec.dtype, dev) for name, spec in specs.items()}


class PreparedGruCall:
    """A GRU call site whose W_ih are constants of the model (``weights_digest`` names their
    values): the program's ``prepare`` (W_ih's parts) runs on its first call, into part buffers
    of the site's own, and every later call runs the pass alone, as ``schedules.gru.GRU`` does
    after loading its weights.  Keyed by the values, not by where the tensors lie: sites with
    the same weights share the parts, sites with others never do."""

    def __init__(self, program: GruProgram, weights_digest: str):
        self.program = program
        self.name = f"{program.name}.w{weights_digest}"
        self._parts: dict[str, Any] | None = None

    def __call__(self, *tensors: Any) -> None:
        compiled, specs = self.program.compiled, self.program.specs
        if self._parts is None:
            parts = _allocated({c.args[1]: specs[c.args[1]] for c in compiled.prepare}, tensors[0].device)
            self.program.launch(tensors, compiled.prepare, parts)
            self._parts = parts
        self.program.launch(tensors, compiled.calls, self._parts)
        self.program.check_barrier()


_PROGRAMS: dict[str, GruProgram] = {}  # by packed-function name: what the lowered modules call
_PREPARED: dict[str, PreparedGruCall] = {}  # call sites with constant W_ih, by packed-function name


def program(name: str) -> GruProgram | None:
    """The GRU program a lowered module calls by ``name``, directly or through a call site with
    constant weights (``prepared_call``); None: not a GRU of this process."""
    site = _PREPARED.get(name)
    return site.program if site is not None else _PROGRAMS.get(name)


def program_name(template: Any, config: Config, target: TargetInfo) -> str:
    """``tvm_ext.gru.<workload key>.<config digest>`` (``tvm_ext.lstm...`` an LSTM's): one name per
    compiled plan."""
    from ..core.template import Workload

    digest = hashlib.sha256(json.dumps(config.as_dict(), sort_keys=True).encode()).hexdigest()[:10]
    prefix = LSTM_FUNCTION if template.name == "lstm" else GRU_FUNCTION
    return f"{prefix}.{Workload.of(template, target).key}.{digest}"


def prepared_call(program: GruProgram, weights_digest: str) -> PreparedGruCall:
    """The call site of ``program`` with constant W_ih of ``weights_digest`` (made once per
    process), registered as a packed function (CUDA: where a plan prepares W_ih's parts)."""
    import tvm

    name = f"{program.name}.w{weights_digest}"
    if name not in _PREPARED:
        made = _PREPARED[name] = PreparedGruCall(program, weights_digest)
        tvm.register_global_func(name, made, override=True)
    return _PREPARED[name]


def constant_weights_digest(weights: list[Any]) -> str | None:
    """A digest of the values of ``weights`` (Relax expressions) where every one is a constant,
    else None."""
    from tvm.ir.expr import Constant

    if not weights or not all(isinstance(w, Constant) for w in weights):
        return None
    digest = hashlib.sha256()
    for w in weights:
        array = np.ascontiguousarray(w.value.numpy())
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()[:16]


def gru_program(template: Any, config: Config, target: TargetInfo) -> GruProgram:
    """The compiled program of ``config`` (compiled once per process), registered under its
    name: a packed function on CUDA, an ``EXTERN_PROGRAMS`` entry for the OpenCL executor."""
    import tvm

    from .relax_opencl import EXTERN_PROGRAMS

    name = program_name(template, config, target)
    if name not in _PROGRAMS:
        made = _PROGRAMS[name] = GruProgram(template, config, target)
        if target.kind == "cuda":
            tvm.register_global_func(name, made, override=True)
        else:
            EXTERN_PROGRAMS[name] = made
    return _PROGRAMS[name]


# ---- lowering the placeholders -------------------------------------------------------------------
ConfigFor = Callable[[Any], "Config | None"]  # GruTemplate -> its tuned config (None: the analytic pick)


def lower_grus(mod: Any, target: TargetInfo, config_for: ConfigFor, storage: str | None = None) -> Any:
    """Every GRU (and LSTM) placeholder calling the compiled program of ``config_for``'s config (its own
    packed function, ``gru_program``) instead of ``tvm_ext.gru``; where the program stores
    tensors in another type (``storage``), the arguments are cast to it and the results back."""
    from tvm import relax

    if not find_grus(mod):
        return mod
    programs: dict[Any, GruProgram] = {}

    @relax.expr_functor.mutator
    class Lower(relax.PyExprMutator):  # type: ignore[misc]
        def visit_call_(self, call: Any) -> Any:  # noqa: N802
            call = self.visit_expr_post_order(call)
            if not _is_gru_call(call):
                return call
            template = gru_template(call, target, storage)
            if template not in programs:
                config = config_for(template) or template.analytic_pick(target)[0]
                programs[template] = gru_program(template, config, target)
            types = _out_types(call)
            fields = dict(zip(template.input_specs(), call.args[1].fields))
            args = [_cast(arg, spec.dtype) for arg, spec in zip(fields.values(), template.input_specs().values())]
            stored = [relax.TensorType(t.shape, spec.dtype) for t, spec in zip(types, template.output_specs().values())]
            name = programs[template].name
            if target.kind == "cuda" and programs[template].compiled.prepare:  # W_ih's parts, once a site
                digest = constant_weights_digest([arg for n, arg in fields.items() if n.startswith("w_ih")])
                name = prepared_call(programs[template], digest).name if digest else name
            result = relax.call_dps_packed(name, relax.Tuple(args), stored)
            if [str(t.dtype) for t in stored] == [str(t.dtype) for t in types]:
                return result
            return relax.Tuple([_cast(relax.TupleGetItem(result, i), str(t.dtype)) for i, t in enumerate(types)])

    lower = Lower(mod)
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            lower.builder_.update_func(gv, lower.visit_expr(func))
    return lower.builder_.get()


def _cast(expr: Any, dtype: str) -> Any:
    """``expr`` as ``dtype`` (itself where it is already)."""
    from tvm import relax

    ty = getattr(expr, "ty", None) or getattr(expr, "struct_info", None)
    if ty is not None and str(getattr(ty, "dtype", "")) == dtype:
        return expr
    return relax.op.astype(expr, dtype)
