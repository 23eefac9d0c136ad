"""Compiled programs: every kernel of a config in one TVM module, with the plan that runs it.

``CompiledProgram`` is what a template's ``build_program`` returns (one scheduled PrimFunc,
or several kernels and a host plan such as the GRU's); ``Artifact`` is the same program as
plain data (the device source, the launches, the library as bytes) that a builder hands
to a runner and a runner runs anywhere, without the template.  The launches of a program
are read from the lowered TIR (``extract_launches``), not parsed from generated source.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..precision.precision import cast, np_dtype
from ..target import TargetInfo

THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
CLUSTER_TAGS = ("clusterCtaIdx.x", "clusterCtaIdx.y", "clusterCtaIdx.z")  # thread-block clusters (Hopper)
DYN_SHARED_TAG = "tirx.use_dyn_shared_memory"  # launch parameter: bytes of dynamic shared memory
MAIN = "main"  # the function a single-PrimFunc program is called by
WORKSPACE = "workspace:"  # a launch argument that is a buffer of the function's own (TVM allocates it)
TENSOR_MAP = "tensormap:"  # a launch argument that is a TMA tensor map the host function encodes


@dataclass(frozen=True)
class TensorSpec:
    """A buffer's shape and dtype."""

    shape: tuple[int, ...]
    dtype: str
    # What a scratch buffer must hold before the first launch (e.g. 0 for a counter the
    # kernel itself resets after use); None: runners poison it (NaN, or -1 for integers).
    fill: float | None = None


@dataclass(frozen=True)
class KernelLaunch:
    """One call in launch order: a device kernel (OpenCL, or read from the host function), or
    a host function of a TVM module (CUDA), with its arguments."""

    name: str
    args: tuple[Any, ...]  # parameter names (str: buffers, or scalar parameters), constant ints, or
    # "loop:<var>" for the index of a loop in the host function (a kernel launched once per step)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dyn_shared_bytes: int = 0  # CUDA dynamic shared memory (TVM's runtime passes it at launch)
    cluster: tuple[int, int, int] = (1, 1, 1)  # CUDA thread-block cluster (TVM's runtime launches it so)

    @property
    def global_size(self) -> tuple[int, int, int]:
        return tuple(g * b for g, b in zip(self.grid, self.block))  # type: ignore[return-value]


@dataclass(frozen=True)
class Artifact:
    """A built program as data: everything a runner needs to run it, and nothing of the template."""

    kind: str  # "opencl" | "cuda"
    source: str  # device source (OpenCL C, built by the runner; CUDA C, for reading)
    launches: tuple[KernelLaunch, ...]  # device kernels in order, arguments bound to buffer names
    params: tuple[str, ...]  # every buffer by name: inputs, outputs, then scratch
    library: bytes = field(default=b"", repr=False)  # CUDA: the exported TVM module (a shared library)
    calls: tuple[KernelLaunch, ...] = ()  # CUDA: the functions of ``library`` called in order
    # OpenCL: buffers the launches take as ``workspace:NAME`` (TVM's runtime allocates them on CUDA)
    workspaces: tuple[tuple[str, TensorSpec], ...] = ()

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CompiledProgram:
    """Every kernel function of one config compiled into one module, and how to run it."""

    kind: str
    executable: Any  # tvm.runtime.Executable
    source: str
    launches: tuple[KernelLaunch, ...]  # device kernels in order, arguments bound to buffer names
    calls: tuple[KernelLaunch, ...]  # host functions of the module in order (what TVM's runtime calls)
    params: tuple[str, ...]  # every buffer by name: inputs, outputs, then scratch
    modules: Mapping[str, Any] = field(default_factory=dict, repr=False)  # function -> scheduled IRModule
    trace: Any = field(default=None, repr=False)  # schedule trace(s) as plain JSON

    @property
    def single_function(self) -> bool:
        """One PrimFunc called once with every buffer (``main``), no host plan."""
        return len(self.calls) == 1 and self.calls[0].name == MAIN and self.calls[0].args == self.params

    def artifact(self) -> Artifact:
        """The program as data; on CUDA the module is exported and travels as bytes."""
        library = export_library_bytes(self.executable) if self.kind == "cuda" else b""
        calls = self.calls if self.kind == "cuda" else ()
        return Artifact(self.kind, self.source, self.launches, self.params, library, calls)


def export_library_bytes(executable: Any) -> bytes:
    """``export_library`` into a temporary file, read back."""
    with tempfile.TemporaryDirectory(prefix="tvm_ext_lib_") as tmp:
        path = os.path.join(tmp, "program.so")
        executable.export_library(path)
        with open(path, "rb") as fh:
            return fh.read()


def plain_json(value: Any) -> Any:
    """TVM objects (IntImm, String, Array, Map) inside a trace -> plain Python for json."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__") and hasattr(value, "__getitem__"):
        return [plain_json(v) for v in value]
    if hasattr(value, "value"):
        return value.value
    return str(value)


def _is_tensor_map(arg: Any) -> bool:
    """Whether a kernel call's argument is a CUDA tensor map (a pointer to ``TensorMapType``)."""
    import tvm

    ty = getattr(arg, "ty", None)
    return isinstance(ty, tvm.ir.PointerType) and isinstance(ty.element_type, tvm.tirx.TensorMapType)


def extract_launches(mod: Any, target: TargetInfo) -> tuple[tuple[KernelLaunch, ...], tuple[str, ...]]:
    """Lower ``mod`` as ``tvm.compile`` does and read the host's kernel calls.

    The host function calls each device kernel with its buffer arguments followed
    by the launch extents named by ``launch_params``; that gives launch order,
    argument order and grid/block sizes without parsing generated source.
    """
    launches, params, _ = host_launches(mod, target)
    return launches, params


def host_launches(mod: Any, target: TargetInfo
                  ) -> tuple[tuple[KernelLaunch, ...], tuple[str, ...], dict[str, TensorSpec]]:
    """``extract_launches``, and the global buffers the host function allocates for its kernels
    (TVM's workspace: a schedule's intermediate between two kernels), each by the name its
    launches give it (``workspace:NAME``) with its size."""
    import tvm
    import tvm_ffi
    from tvm.target import Target
    from tvm.tirx.build import split_host_device_mods

    tgt = Target(target.tvm_target()).with_host(Target("llvm"))
    main = mod["main"]
    params = tuple(p.name for p in main.params)
    if len(set(params)) != len(params):  # launches bind buffers by name: two alike would be one
        raise RuntimeError(f"parameters share a name: {', '.join(params)}")
    by_data = {}  # "fc1_bias.data" -> "fc1.bias": Relax tasks' parameter names are not identifiers
    for p in main.params:
        try:
            by_data[str(p.data)] = p.name
        except Exception:  # a scalar parameter has no data pointer
            pass
    lowered = tvm.tirx.transform.BindTarget(tgt)(mod)
    pipeline, _, _ = tvm.tirx.get_default_tir_pipeline(tgt)
    host, _ = split_host_device_mods(pipeline(lowered))
    calls: list[Any] = []
    workspaces: dict[str, TensorSpec] = {}  # the buffers the host function allocates (TVM's workspace)

    def allocated(node: Any) -> None:
        buffer = node.buffer
        elements = int(np.prod([int(d) for d in buffer.shape]))  # 1 for a scalar
        workspaces[str(buffer.data).removesuffix(".data")] = TensorSpec((elements,), str(buffer.dtype))

    def visit(node: Any) -> None:
        if getattr(node.op, "name", "") == "tirx.call_ffi_kernel":
            calls.append(node)

    for func in host.functions.values():
        tvm_ffi.structural_walk(func.body, [(tvm.ir.Call, visit), (tvm.tirx.AllocBuffer, allocated)])
    launches = []
    for call in calls:
        tags = list(call.attrs.launch_params)
        unknown = [t for t in tags if t not in THREAD_TAGS + CLUSTER_TAGS and t != DYN_SHARED_TAG]
        if unknown:
            raise RuntimeError(f"unsupported launch parameters {unknown}")
        values = call.args[len(call.args) - len(tags):]
        extents = {t: int(v) for t, v in zip(tags, values)}
        args: list[Any] = []
        for arg in call.args[1 : len(call.args) - len(tags)]:
            if isinstance(arg, tvm.tirx.IntImm):
                args.append(int(arg))
                continue
            text = str(arg)
            if isinstance(arg, tvm.tirx.Var) and text in params:  # a scalar parameter, by name
                args.append(text)
                continue
            if text in by_data:
                args.append(by_data[text])
                continue
            if isinstance(arg, tvm.tirx.Var) and "int" in str(arg.ty):  # a host loop's index
                args.append(f"loop:{text}")
                continue
            if text.removesuffix(".data") in workspaces:  # a global buffer of the function's own
                args.append(f"{WORKSPACE}{text.removesuffix('.data')}")
                continue
            if _is_tensor_map(arg):  # encoded by the host function before the launch
                args.append(f"{TENSOR_MAP}{text}")
                continue
            if not text.endswith(".data") or text[:-5] not in params:
                raise RuntimeError(f"kernel argument {text!r} is not a function parameter")
            args.append(text[:-5])
        grid = tuple(extents.get(f"blockIdx.{d}", 1) for d in "xyz")
        block = tuple(extents.get(f"threadIdx.{d}", 1) for d in "xyz")
        cluster = tuple(extents.get(tag, 1) for tag in CLUSTER_TAGS)
        launches.append(KernelLaunch(str(call.args[0].value), tuple(args), grid, block,  # type: ignore[arg-type]
                                     extents.get(DYN_SHARED_TAG, 0), cluster))  # type: ignore[arg-type]
    return tuple(launches), params, workspaces


def lower_check(mod: Any, target: TargetInfo, pass_config: Mapping[str, Any] | None = None) -> None:
    """Run ``tvm.compile``'s TIR pipeline on a scheduled module without generating code: what a
    schedule that cannot build fails in, at a fraction of a CUDA compile (NVRTC on a GPU host)."""
    import tvm
    from tvm.target import Target

    tgt = Target(target.tvm_target()).with_host(Target("llvm"))
    with tvm.transform.PassContext(config=dict(pass_config or {})):
        pipeline, _, _ = tvm.tirx.get_default_tir_pipeline(tgt)
        pipeline(tvm.tirx.transform.BindTarget(tgt)(mod))


def compile_module(mod: Any, target: TargetInfo, pass_config: Mapping[str, Any] | None = None
                   ) -> tuple[Any, str, tuple[KernelLaunch, ...], tuple[str, ...]]:
    """``tvm.compile`` of one scheduled PrimFunc module under the template's ``pass_config``
    (a function marked to launch its kernels early through ``launch_early.PIPELINE``): the
    executable, its kernel source, and its launches and parameters (read under the same
    options, so they describe the kernel that was built)."""
    import tvm

    from tvm_ext.lowering.launch_early import pipeline_for
    from tvm_ext.lowering.opencl_constants import install_exact_opencl_constants

    install_exact_opencl_constants()
    with tvm.transform.PassContext(config=dict(pass_config or {})):
        ex = tvm.compile(mod, target=tvm.target.Target(target.tvm_target()), tir_pipeline=pipeline_for(mod))
        launches, params = extract_launches(mod, target)
    return ex, ex.mod.imports[0].inspect_source(), launches, params


def compile_functions(funcs: Mapping[str, Any], target: TargetInfo, pass_config: Mapping[str, Any] | None = None,
                      arch: TargetInfo | None = None) -> tuple[Any, dict[str, Any]]:
    """PrimFuncs by name compiled into one module under ``pass_config`` (a host plan's kernels: the
    GRU's, the LSTM's), OpenCL's float constants exact (``opencl_constants``) and functions marked
    to launch early on their pipeline: the executable and each function's (launches, parameter
    names), read under the same options so they describe the kernels built.  ``arch``: the target
    to build for where it is not ``target`` (Hopper's sm_90a for wgmma)."""
    import tvm

    from tvm_ext.lowering.launch_early import pipeline_for
    from tvm_ext.lowering.opencl_constants import install_exact_opencl_constants

    install_exact_opencl_constants()
    with tvm.transform.PassContext(config=dict(pass_config or {})):
        module = tvm.IRModule(dict(funcs))
        executable = tvm.compile(module, target=tvm.target.Target((arch or target).tvm_target()),
                                 tir_pipeline=pipeline_for(module))
        launches = {name: extract_launches(tvm.IRModule({"main": func}), target) for name, func in funcs.items()}
    return executable, launches


def compile_schedule(sch: Any, target: TargetInfo, pass_config: Mapping[str, Any] | None = None
                     ) -> CompiledProgram:
    """One scheduled PrimFunc (a ``tvm.s_tir.Schedule``) as a program called through ``main``."""
    return _main_program(sch.mod, target, pass_config, plain_json(sch.trace.as_json()))


def compile_module_program(func: Any, target: TargetInfo, record: Any,
                           pass_config: Mapping[str, Any] | None = None) -> CompiledProgram:
    """One PrimFunc written rather than scheduled (no trace: ``record`` says what built it) as a
    program called through ``main``."""
    import tvm

    mod = tvm.IRModule({MAIN: func.with_attr("global_symbol", MAIN)})
    return _main_program(mod, target, pass_config, plain_json(record))


def bind_launches(launches: Mapping[str, Any], calls: Sequence[tuple[str, tuple[Any, ...]]]
                  ) -> tuple[KernelLaunch, ...]:
    """Host calls (function, arguments) as the device kernel launches they make, each kernel's
    arguments bound to the call's buffers and scalars (``launches``: function -> its kernels
    and parameter names, ``extract_launches``'s)."""
    out = []
    for func, args in calls:
        kernels, params = launches[func]
        bound = dict(zip(params, args))
        for k in kernels:
            out.append(KernelLaunch(k.name, tuple(bound.get(a, a) if isinstance(a, str) else a for a in k.args),
                                    k.grid, k.block, k.dyn_shared_bytes, k.cluster))
    return tuple(out)


def function_calls(launches: Mapping[str, Any], calls: Sequence[tuple[str, tuple[Any, ...]]]
                   ) -> tuple[KernelLaunch, ...]:
    """Host calls for TVM's runtime (CUDA): one entry per call, named by function; grid and
    block are the function's first kernel's (for reading only)."""
    return tuple(KernelLaunch(func, args, launches[func][0][0].grid, launches[func][0][0].block)
                 for func, args in calls)


def compile_calls_program(funcs: Mapping[str, Any], calls: Sequence[tuple[str, tuple[str, ...]]],
                          target: TargetInfo, params: tuple[str, ...], record: Any) -> CompiledProgram:
    """PrimFuncs written rather than scheduled (``record`` says what built them), compiled into
    one module and called in the order of ``calls`` (function, buffer names) on the program's
    buffers ``params``: an operator of a few kernels without a host loop."""
    import tvm

    from tvm_ext.lowering.opencl_constants import install_exact_opencl_constants

    install_exact_opencl_constants()
    named = {name: func.with_attr("global_symbol", name) for name, func in funcs.items()}
    executable = tvm.compile(tvm.IRModule(named), target=tvm.target.Target(target.tvm_target()))
    modules = {name: tvm.IRModule({MAIN: func}) for name, func in named.items()}
    launches = {name: extract_launches(mod, target) for name, mod in modules.items()}
    source = "\n".join(m.inspect_source() for m in executable.mod.imports)
    return CompiledProgram(target.kind, executable, source, bind_launches(launches, calls),
                           function_calls(launches, calls), params, modules, plain_json(record))


def _main_program(mod: Any, target: TargetInfo, pass_config: Mapping[str, Any] | None, trace: Any
                  ) -> CompiledProgram:
    """``mod`` (one PrimFunc, ``main``) compiled, as a program of one call of ``main``."""
    ex, source, launches, params = compile_module(mod, target, pass_config)
    first = launches[0] if launches else KernelLaunch(MAIN, (), (1, 1, 1), (1, 1, 1))
    main = KernelLaunch(MAIN, params, first.grid, first.block, first.dyn_shared_bytes)
    return CompiledProgram(target.kind, ex, source, launches, (main,), params, {MAIN: mod}, trace)


# ---- how a program is run and checked (a template says; the runner follows) ------------------
TIMERS = ("device", "host")


@dataclass(frozen=True)
class FailureFlag:
    """A word the program sets when it knows its results are wrong (e.g. a grid barrier that
    timed out): nonzero after the check run makes the run a ``run_error`` with ``message``."""

    buffer: str
    word: int
    message: str


@dataclass(frozen=True)
class RunPlan:
    """How a program is run and timed beyond its launches (a template's ``run_plan``).

    ``timer``: "device" times one run by the device (OpenCL profiling events, first start to
    last end; CUDA: TVM's time evaluator for one function, else the host clock around
    synchronised back-to-back runs); "host" always takes the host clock around back-to-back
    runs (what a caller of the whole program waits, launch overhead included).
    ``stages``: for each executed step (OpenCL: launch; CUDA: call) after the prepared ones,
    the stages its time counts toward; given, the result carries ``stage_secs`` per stage.
    ``prepare_steps``: the first steps prepare what the weights give once (a GRU's W_ih
    split into its parts): run once after each input set is written, not timed."""

    timer: str = "device"
    rotate_inputs: bool = True  # rotate input sets that fit in L2 together (timing a cold cache)
    failure_flag: FailureFlag | None = None
    stages: tuple[tuple[str, ...], ...] = ()
    prepare_steps: int = 0

    def __post_init__(self) -> None:
        if self.timer not in TIMERS:
            raise ValueError(f"unknown timer {self.timer!r}; allowed: {', '.join(TIMERS)}")


@dataclass(frozen=True)
class UniformInputs:
    """How ``Template.make_inputs`` draws inputs, as data: each input in order uniform in
    [low, high), rounded to the full-precision operator's dtype, then to the program's (the
    rounding ``make_case`` applies), so a worker draws the same arrays from the seed."""

    low: float = -1.0
    high: float = 1.0
    full_dtypes: tuple[str, ...] = ()  # the full-precision operator's input dtypes

    def draw(self, rng: np.random.Generator, specs: Sequence[TensorSpec]) -> list[np.ndarray]:
        full = self.full_dtypes or tuple(s.dtype for s in specs)
        values = [cast(rng.uniform(self.low, self.high, size=s.shape), d) for s, d in zip(specs, full)]
        return [v if v.dtype == np_dtype(s.dtype) else cast(v, s.dtype) for v, s in zip(values, specs)]
