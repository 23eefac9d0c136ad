"""Run a compiled Relax model on OpenCL through pyopencl.

Why this exists: the PyPI TVM wheel is built without TVM's OpenCL runtime
(``USE_OPENCL=OFF``), so ``relax.VirtualMachine`` cannot run OpenCL kernels at all,
even though ``tvm.compile`` generates correct OpenCL C.  On CUDA the Relax VM runs
the model and this module is not needed.  For OpenCL (PoCL on a CPU machine, NVIDIA's
OpenCL driver on the GPU machine) this is the smallest executor that still runs
exactly TVM's kernels: it takes a static-shape Relax function of ``call_tir`` bindings
(what ``legalize + fuse + schedule`` leaves), builds every scheduled PrimFunc for OpenCL
with TVM, reads each one's launches from the lowered TIR (``program.extract_launches``) and
runs them with the OpenCL executor every other OpenCL path uses
(``tvm_ext.measure.executors``), one device buffer per Relax value (a scalar constant a 0-d
one; a tuple inside the output tuple read back nested).  A ``call_dps_packed`` of a program
registered in ``EXTERN_PROGRAMS`` (a tuned GRU plan, ``tvm_ext.relax.relax_gru``) runs that
program's kernel launches, its scratch buffers its own; a frontend's ``relax.run.assert_op``
is read after the run and raises its message.  A kernel TVM launches from a host loop, an op
nothing lowered for OpenCL, or a kernel the driver cannot compile is one ``TvmExtError``.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from ..core.errors import TvmExtError
from ..lowering.opencl_constants import install_exact_opencl_constants
from ..measure.executors import OpenclExecutor
from ..measure.program import WORKSPACE, Artifact, TensorSpec, host_launches
from ..target import TargetInfo


class ExternProgram(Protocol):
    """A program a Relax function calls by name (``call_dps_packed``) that runs here as kernel
    launches: ``specs`` names every buffer (inputs, then outputs, then scratch)."""

    specs: Mapping[str, TensorSpec]
    inputs: list[str]
    outputs: list[str]

    def artifact(self) -> Artifact: ...


EXTERN_PROGRAMS: dict[str, ExternProgram] = {}  # packed-function name -> its program (filled by who lowers to it)


@dataclass(frozen=True)
class Value:
    """A tensor of the Relax function: parameter, constant or call_tir result."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Step:
    """One ``call_tir``: the PrimFunc's kernels and the values bound to its parameters."""

    func: str  # PrimFunc name in the IRModule
    artifact: Artifact
    args: tuple[str, ...]  # value names, positionally matching ``artifact.params``
    workspaces: tuple[str, ...] = ()  # value names, positionally matching ``artifact.workspaces``


@dataclass(frozen=True)
class Plan:
    """The whole function as data: inputs, constants, steps in order, outputs."""

    function: str
    inputs: tuple[Value, ...]
    values: tuple[Value, ...]  # every value (inputs, constants, intermediates, outputs)
    constants: tuple[tuple[str, np.ndarray], ...]
    steps: tuple[Step, ...]
    outputs: tuple[Any, ...]  # value names, or tuples of them (a tuple inside the output tuple)
    tuple_output: bool
    checks: tuple[tuple[str, str], ...] = ()  # (a boolean value that must hold after the run, its message)


def relax_function_name(mod: Any, name: str | None = None) -> str:
    """``name`` if given, else the module's only Relax function (or ``main``)."""
    from tvm import relax

    funcs = [gv.name_hint for gv, f in mod.functions_items() if isinstance(f, relax.Function)]
    if name is not None:
        if name not in funcs:
            raise TvmExtError(f"no Relax function {name!r} in the module; functions: {', '.join(funcs) or 'none'}")
        return name
    if len(funcs) == 1:
        return funcs[0]
    if "main" in funcs:
        return "main"
    raise TvmExtError(f"the module has several Relax functions ({', '.join(funcs)}): name one")


def _vname(var: Any) -> str:
    """A Relax variable's name (0.27 Relax and TIR share ``tvm.ir.Var``)."""
    return str(getattr(var, "name_hint", None) or var.name)


def _static_tensor(ty: Any, what: str) -> tuple[tuple[int, ...], str]:
    shape = getattr(ty, "shape", None)
    values = getattr(shape, "values", None)
    if values is None:
        raise TvmExtError(f"{what} is not a tensor of known rank (the OpenCL executor needs static shapes)")
    dims = []
    for v in values:
        if not hasattr(v, "value"):
            raise TvmExtError(f"{what} has a dynamic shape {shape}; the OpenCL executor needs static shapes "
                              "(tune model --buckets NAME=SIZES binds a symbolic dimension to each size)")
        dims.append(int(v.value))
    return tuple(dims), str(ty.dtype)


def distinct_param_names(func: Any) -> Any:
    """``func`` with every buffer parameter named apart: launches bind buffers by parameter name,
    and a legalized op of several outputs (``split``) names them all alike (``T_split``), so the
    kernels of both would write one buffer.  TVMScript prints each name once (``T_split_1``):
    the function read back from its script is the same function under distinct names."""
    import tvm

    names = [p.name for p in func.params]
    if len(set(names)) == len(names):
        return func
    renamed = tvm.script.from_source(func.script())
    tvm.ir.assert_structural_equal(renamed, func)
    return renamed


_OPENCL_INTRINSICS: list[str] = []  # the TIR intrinsics given their OpenCL names (once a process)


def register_opencl_intrinsics() -> None:
    """TIR intrinsics given their OpenCL names where TVM 0.27 gets them wrong: ``atan2`` came out
    as C's ``atan2f``, which no OpenCL compiler declares (the model stopped in the driver's build);
    ``exp`` is right, but importing ``tvm.target.intrin`` (an example module) registers a rule
    that names it ``.exp`` (a ``tir.``-era slice), so ours is registered above it."""
    if _OPENCL_INTRINSICS:
        return
    from tvm.tirx import call_pure_extern, register_intrin_lowering

    for name in ("atan2", "exp"):
        register_intrin_lowering(f"tirx.{name}", "opencl", level=100,
                                 f=lambda op, name=name: call_pure_extern(op.ty, name, *op.args)
                                 if str(op.ty.dtype).startswith("float") else op)
        _OPENCL_INTRINSICS.append(name)


def build_primfunc(func: Any, target: TargetInfo) -> Artifact:
    """Compile one scheduled PrimFunc for OpenCL with TVM; its source and launches."""
    import tvm

    register_opencl_intrinsics()
    install_exact_opencl_constants()
    func = distinct_param_names(func)
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    ex = tvm.compile(mod, target=tvm.target.Target(target.tvm_target()))
    source = ex.mod.imports[0].inspect_source() if ex.mod.imports else ""
    launches, params, workspaces = host_launches(mod, target)
    for launch in launches:  # what only TVM's runtime gives a kernel: a host loop's index
        unbound = [a for a in launch.args if isinstance(a, str) and a not in params
                   and a.removeprefix(WORKSPACE) not in workspaces]
        if unbound:
            raise TvmExtError(f"its kernels take {unbound[0]!r} from the host function (a loop's index), "
                              "which the OpenCL executor does not run")
    return Artifact("opencl", source, launches, params, workspaces=tuple(workspaces.items()))


def plan_relax(mod: Any, target: TargetInfo, function: str | None = None) -> Plan:
    """Walk the Relax function and build each PrimFunc it calls (each one once)."""
    from tvm import relax

    name = relax_function_name(mod, function)
    func = mod[name]
    planner = _Planner(mod, target)
    inputs = []
    for param in func.params:
        vname = planner.new_value(_vname(param), param.ty)
        planner.env[param] = vname
        inputs.append(planner.values[vname])
    for block in func.body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                raise TvmExtError(f"the OpenCL executor cannot run {type(binding).__name__} bindings")
            planner.bind(binding.var, binding.value)
    result = planner.resolve(func.body.body)
    outputs = result if isinstance(result, tuple) else (result,)
    return Plan(name, tuple(inputs), tuple(planner.values.values()), tuple(planner.constants),
                tuple(planner.steps), tuple(outputs), isinstance(result, tuple), tuple(planner.checks))


class _Planner:
    """``plan_relax``'s walk: the function's values, constants, steps and checks as it binds them."""

    def __init__(self, mod: Any, target: TargetInfo):
        import tvm

        self.mod, self.target = mod, target
        self.call_tir = tvm.ir.Op.get("relax.call_tir")
        self.call_packed = tvm.ir.Op.get("relax.call_dps_packed")
        self.values: dict[str, Value] = {}
        self.env: dict[Any, Any] = {}  # relax Var -> value name, or tuple of names
        self.constants: list[tuple[str, np.ndarray]] = []
        self.steps: list[Step] = []
        self.checks: list[tuple[str, str]] = []
        self.built: dict[str, Artifact] = {}

    def new_value(self, base: str, ty: Any) -> str:
        return self.add_value(base, *_static_tensor(ty, f"value {base!r}"))

    def add_value(self, base: str, shape: tuple[int, ...], dtype: str) -> str:
        vname = base if base not in self.values else f"{base}.{len(self.values)}"
        self.values[vname] = Value(vname, tuple(shape), dtype)
        return vname

    def bind(self, var: Any, value: Any) -> None:
        """One binding: a call_tir, a packed program, a frontend's check, or a value's alias."""
        from tvm import relax
        from tvm.ir.expr import Call

        if isinstance(value, Call) and value.op.same_as(self.call_tir):
            self.tir_step(var, value)
        elif isinstance(value, Call) and value.op.same_as(self.call_packed):
            self.packed_step(var, value)
        elif isinstance(value, Call) and isinstance(value.op, relax.ExternFunc) \
                and str(value.op.global_symbol) == "relax.run.assert_op":
            self.check(var, value)
        else:
            self.env[var] = self.resolve(value)

    def resolve(self, expr: Any) -> Any:
        """The value name (or tuple of names) ``expr`` is: a bound variable, a constant, a tuple."""
        from tvm import relax
        from tvm.ir.expr import Constant, Tuple, Var

        if isinstance(expr, Var):
            if expr not in self.env:
                raise TvmExtError(f"value {_vname(expr)} is used before it is defined")
            return self.env[expr]
        if isinstance(expr, Constant):
            if hasattr(expr.value, "numpy"):
                array = expr.value.numpy()
                vname = self.new_value(f"const{len(self.constants)}", expr.ty)
            else:  # a scalar (an int or float Relax folds a shape's dimension to): a 0-d tensor
                array = np.array(expr.value, dtype=str(expr.ty))
                vname = self.add_value(f"const{len(self.constants)}", (), str(array.dtype))
            self.constants.append((vname, array))
            return vname
        if isinstance(expr, Tuple):
            return tuple(self.resolve(f) for f in expr.fields)
        if isinstance(expr, relax.TupleGetItem):
            return self.resolve(expr.tuple_value)[int(expr.index)]
        op = getattr(getattr(expr, "op", None), "name", None)
        if op is not None:  # an op nothing legalized for OpenCL
            raise TvmExtError(f"the OpenCL executor cannot run {op}: it has no OpenCL lowering here "
                              "(on CUDA TVM's build dispatches it)")
        raise TvmExtError(f"the OpenCL executor only runs call_tir bindings; found {type(expr).__name__}: "
                          f"{str(expr)[:120]}")

    def outputs(self, var: Any, call: Any) -> list[str]:
        """New values for ``call``'s results, bound to ``var`` (a tuple where it has several)."""
        types = list(call.ty_args)
        types = list(types[0].fields) if len(types) == 1 and hasattr(types[0], "fields") else types
        outs = [self.new_value(_vname(var) if len(types) == 1 else f"{_vname(var)}.{i}", t)
                for i, t in enumerate(types)]
        self.env[var] = outs[0] if len(outs) == 1 and not hasattr(var.ty, "fields") else tuple(outs)
        return outs

    def tir_step(self, var: Any, call: Any) -> None:
        from tvm.ir.expr import GlobalVar

        if len(call.args) > 2:
            raise TvmExtError("call_tir with symbolic shape arguments: the OpenCL executor needs static shapes")
        gv = call.args[0]
        assert isinstance(gv, GlobalVar)
        args = [self.resolve(a) for a in call.args[1].fields]
        if any(isinstance(a, tuple) for a in args):
            raise TvmExtError(f"call_tir {gv.name_hint} takes a tuple argument")
        outs = self.outputs(var, call)
        if gv.name_hint not in self.built:
            try:
                self.built[gv.name_hint] = build_primfunc(self.mod[gv], self.target)
            except TvmExtError as exc:
                raise TvmExtError(f"PrimFunc {gv.name_hint} cannot run on OpenCL here: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - TVM's build of a function nothing scheduled
                lines = [line for line in str(exc).strip().splitlines() if line.strip()]
                raise TvmExtError(f"PrimFunc {gv.name_hint} does not build for OpenCL "
                                  f"(is it scheduled?): {lines[-1] if lines else type(exc).__name__}") from None
        artifact = self.built[gv.name_hint]
        step_args = tuple(args) + tuple(outs)
        if len(step_args) != len(artifact.params):
            raise TvmExtError(f"call_tir {gv.name_hint} passes {len(step_args)} tensors, "
                              f"the PrimFunc takes {len(artifact.params)}")
        workspaces = tuple(self.add_value(f"{gv.name_hint}.{name}", spec.shape, spec.dtype)
                           for name, spec in artifact.workspaces)  # a schedule's buffer between two kernels
        self.steps.append(Step(gv.name_hint, artifact, step_args, workspaces))

    def packed_step(self, var: Any, call: Any) -> None:
        program_name = str(call.args[0].global_symbol)
        program = EXTERN_PROGRAMS.get(program_name)
        if program is None:
            raise TvmExtError(f"the OpenCL executor cannot run the packed function {program_name}")
        args = [self.resolve(a) for a in call.args[1].fields]
        outs = self.outputs(var, call)
        if len(args) != len(program.inputs) or len(outs) != len(program.outputs):
            raise TvmExtError(f"{program_name} takes {len(program.inputs)} inputs and {len(program.outputs)} "
                              f"outputs, the call passes {len(args)} and {len(outs)}")
        scratch = [self.add_value(f"{_vname(var)}.{n}", spec.shape, spec.dtype)
                   for n, spec in program.specs.items() if n not in program.inputs + program.outputs]
        self.steps.append(Step(program_name, program.artifact(), tuple(args) + tuple(outs) + tuple(scratch)))

    def check(self, var: Any, call: Any) -> None:
        """A frontend's check of the inputs (``one_hot``'s class values): its condition read after
        the run, its message raised where it does not hold."""
        from tvm.ir.expr import StringImm

        condition = self.resolve(call.args[0])
        texts = [str(a.value) for a in call.args[1:] if isinstance(a, StringImm)]
        self.checks.append((condition, texts[-1] if texts else f"assertion {_vname(var)} failed"))
        self.env[var] = ()


class OpenCLExecutor:
    """Runs a ``Plan`` on an OpenCL device through the OpenCL executor of ``tvm_ext.measure.executors``:
    one buffer per value, every PrimFunc's kernels in binding order."""

    def __init__(self, plan: Plan, target: TargetInfo):
        self.plan = plan
        self.target = target
        specs = {v.name: TensorSpec(v.shape, v.dtype) for v in plan.values}
        steps = []
        for step in plan.steps:
            bound = dict(zip(step.artifact.params, step.args))
            bound.update((f"{WORKSPACE}{name}", value) for (name, _), value in zip(step.artifact.workspaces,
                                                                                   step.workspaces))
            steps += [(step.artifact.source, replace(launch, args=tuple(bound[a] if isinstance(a, str) else a
                                                                          for a in launch.args)))
                      for launch in step.artifact.launches]
        import pyopencl as cl

        try:
            self.executor = OpenclExecutor(steps, specs, target.device_id, profiling=True)
        except cl.Error as exc:  # the driver's compile failed: its first error (PoCL has no float16)
            errors = [line.split("error:", 1)[1].strip() for line in str(exc).splitlines() if "error:" in line]
            first = errors[0] if errors else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise TvmExtError(f"the model's OpenCL kernels do not build on this device: {first}") from None
        for vname, array in plan.constants:
            self.executor.write(vname, array)

    @classmethod
    def from_module(cls, mod: Any, target: TargetInfo, function: str | None = None) -> "OpenCLExecutor":
        return cls(plan_relax(mod, target, function), target)

    def sources(self) -> dict[str, str]:
        """OpenCL C of every PrimFunc that runs, by PrimFunc name."""
        return {s.func: s.artifact.source for s in self.plan.steps}

    def _upload(self, inputs: Sequence[np.ndarray]) -> None:
        if len(inputs) != len(self.plan.inputs):
            names = ", ".join(v.name for v in self.plan.inputs)
            raise TvmExtError(f"{self.plan.function} takes {len(self.plan.inputs)} inputs ({names}), got {len(inputs)}")
        for spec, array in zip(self.plan.inputs, inputs):
            array = np.asarray(array)
            if tuple(array.shape) != spec.shape or str(array.dtype) != spec.dtype:
                raise TvmExtError(f"input {spec.name} must be {spec.dtype}{list(spec.shape)}, "
                                  f"got {array.dtype}{list(array.shape)}")
            self.executor.write(spec.name, array)

    def run(self, *inputs: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        """Inputs in the Relax function's parameter order; numpy output(s)."""
        self._upload(inputs)
        self.executor.run()
        def read(output: Any) -> Any:  # a value's name, or a tuple of them (a nested tuple output)
            return tuple(read(o) for o in output) if isinstance(output, tuple) else self.executor.read(output)

        outs = [read(output) for output in self.plan.outputs]
        held = [self.executor.read(condition) for condition, _ in self.plan.checks]
        self.executor.sync()
        for value, (_, message) in zip(held, self.plan.checks):
            if not bool(np.all(value)):
                raise TvmExtError(message)
        return tuple(outs) if self.plan.tuple_output else outs[0]

    __call__ = run

    def time(self, *inputs: np.ndarray, warmup: int = 2, repeat: int = 10) -> float:
        """Median seconds of one forward pass (device events, first start to last end)."""
        self._upload(inputs)
        samples = []
        for i in range(warmup + repeat):
            secs = self.executor.device_secs()
            self.executor.sync()
            if i >= warmup:
                samples.append(secs)
        return statistics.median(samples) if samples else float("nan")
