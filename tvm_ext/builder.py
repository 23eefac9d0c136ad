"""Builder: turn (template, config) into a runnable artifact, in parallel worker processes.

Mirrors meta_schedule's builder role: ``build`` takes a list of candidates and returns
a list of ``BuildResult``; a failure or a timeout is data (``error_msg``), never an
exception, so one bad candidate never stops a search.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .space import Config
from .target import TargetInfo
from .template import Template

THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
DYN_SHARED_TAG = "tirx.use_dyn_shared_memory"  # launch parameter: bytes of dynamic shared memory


@dataclass(frozen=True)
class KernelLaunch:
    """One device kernel call of the host function, in launch order."""

    name: str
    args: tuple[Any, ...]  # parameter names (str: buffers, or scalar parameters), constant ints, or
    # "loop:<var>" for the index of a loop in the host function (a kernel launched once per step)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dyn_shared_bytes: int = 0  # CUDA dynamic shared memory (TVM's runtime passes it at launch)

    @property
    def global_size(self) -> tuple[int, int, int]:
        return tuple(g * b for g, b in zip(self.grid, self.block))  # type: ignore[return-value]


@dataclass(frozen=True)
class Artifact:
    """What a runner needs: the device source and launches, or a TVM library path."""

    kind: str  # "opencl" | "cuda"
    source: str
    launches: tuple[KernelLaunch, ...]
    params: tuple[str, ...]  # PrimFunc buffer parameters, inputs then outputs
    library: str = ""  # exported TVM module (CUDA)
    precision: tuple[tuple[str, str], ...] = ()  # dtype assignment of a mixed-precision program

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class BuildResult:
    config: Config
    artifact: Artifact | None
    trace: Any  # schedule trace as plain JSON, replayable by TVM
    build_secs: float
    error_kind: str = ""
    error_msg: str = ""

    @property
    def ok(self) -> bool:
        return self.artifact is not None


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


def extract_launches(mod: Any, target: TargetInfo) -> tuple[tuple[KernelLaunch, ...], tuple[str, ...]]:
    """Lower ``mod`` as ``tvm.compile`` does and read the host's kernel calls.

    The host function calls each device kernel with its buffer arguments followed
    by the launch extents named by ``launch_params``; that gives launch order,
    argument order and grid/block sizes without parsing generated source.
    """
    import tvm
    import tvm_ffi
    from tvm.target import Target
    from tvm.tirx.build import split_host_device_mods

    tgt = Target(target.tvm_target()).with_host(Target("llvm"))
    main = mod["main"]
    params = tuple(p.name for p in main.params)
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

    def visit(node: Any) -> None:
        if getattr(node.op, "name", "") == "tirx.call_ffi_kernel":
            calls.append(node)

    for func in host.functions.values():
        tvm_ffi.structural_walk(func.body, [(tvm.ir.Call, visit)])
    launches = []
    for call in calls:
        tags = list(call.attrs.launch_params)
        unknown = [t for t in tags if t not in THREAD_TAGS and t != DYN_SHARED_TAG]
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
            if not text.endswith(".data") or text[:-5] not in params:
                raise RuntimeError(f"kernel argument {text!r} is not a function parameter")
            args.append(text[:-5])
        grid = tuple(extents.get(f"blockIdx.{d}", 1) for d in "xyz")
        block = tuple(extents.get(f"threadIdx.{d}", 1) for d in "xyz")
        launches.append(KernelLaunch(str(call.args[0].value), tuple(args), grid, block,  # type: ignore[arg-type]
                                     extents.get(DYN_SHARED_TAG, 0)))
    return tuple(launches), params


def build_one(template: Template, config: Config, target: TargetInfo, out_dir: str) -> BuildResult:
    """Schedule, compile and package one config (runs inside a worker process)."""
    start = time.perf_counter()
    trace: Any = None
    try:
        if hasattr(template, "build_artifact"):  # several kernels and a host plan (e.g. GRU)
            artifact, trace = template.build_artifact(config, target, out_dir)
            return BuildResult(config, artifact, trace, time.perf_counter() - start)
        sch = template.schedule(config, target)
        trace = plain_json(sch.trace.as_json())
        artifact = compile_schedule(template.name, sch, target, out_dir, template.pass_config(config, target))
        return BuildResult(config, artifact, trace, time.perf_counter() - start)
    except Exception as exc:  # a config that does not compile is data, not a crash
        return BuildResult(config, None, trace, time.perf_counter() - start, "build_error",
                           error_summary(exc))


def compile_module(mod: Any, target: TargetInfo, pass_config: Mapping[str, Any] | None = None
                   ) -> tuple[Any, str, tuple[KernelLaunch, ...], tuple[str, ...]]:
    """``tvm.compile`` of one scheduled PrimFunc module under the template's ``pass_config``:
    the executable, its kernel source, and its launches and parameters (read under the
    same options, so they describe the kernel that was built)."""
    import tvm

    with tvm.transform.PassContext(config=dict(pass_config or {})):
        ex = tvm.compile(mod, target=tvm.target.Target(target.tvm_target()))
        launches, params = extract_launches(mod, target)
    return ex, ex.mod.imports[0].inspect_source(), launches, params


def compile_schedule(name: str, sch: Any, target: TargetInfo, out_dir: str,
                     pass_config: Mapping[str, Any] | None = None) -> Artifact:
    """Compile one scheduled PrimFunc (under the template's ``pass_config``); on CUDA also
    export the library the runner loads."""
    ex, source, launches, params = compile_module(sch.mod, target, pass_config)
    library = ""
    if target.kind == "cuda":
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        os.makedirs(out_dir, exist_ok=True)
        library = os.path.join(out_dir, f"{name}-{digest}.so")
        if not os.path.exists(library):
            tmp = f"{library}.{os.getpid()}.tmp.so"
            ex.export_library(tmp)
            os.replace(tmp, library)
    return Artifact(target.kind, source, launches, params, library)


def error_summary(exc: BaseException) -> str:
    """One line for a record: TVM's errors put the useful line last, compilers first."""
    lines = [l.strip() for l in str(exc).strip().splitlines() if l.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[-1] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return _short(text)


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _init_worker() -> None:
    # Workers compile; they never touch a device.  Keep their threads modest.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


class LocalBuilder:
    """Builds candidates in a pool of worker processes with a per-build timeout."""

    def __init__(self, workers: int | None = None, timeout: float = 60.0, out_dir: str | None = None):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.timeout = timeout
        self.out_dir = out_dir or tempfile.mkdtemp(prefix="tvm_ext_build_")
        self._pool: Any = None

    def _get_pool(self) -> Any:
        if self._pool is None:
            import multiprocessing

            from pebble import ProcessPool

            self._pool = ProcessPool(
                max_workers=self.workers, initializer=_init_worker,
                context=multiprocessing.get_context("spawn"),
            )
        return self._pool

    def build(self, template: Template, configs: Sequence[Config], target: TargetInfo) -> list[BuildResult]:
        if not configs:
            return []
        pool = self._get_pool()
        futures = [
            pool.schedule(build_one, args=(template, c, target, self.out_dir), timeout=self.timeout)
            for c in configs
        ]
        results = []
        for config, fut in zip(configs, futures):
            try:
                results.append(fut.result())
            except FutureTimeout:
                results.append(BuildResult(config, None, None, self.timeout, "build_timeout",
                                           f"build took longer than {self.timeout:g} s"))
            except Exception as exc:  # worker died (e.g. segfault in codegen)
                results.append(BuildResult(config, None, None, 0.0, "build_error",
                                           _short(f"{type(exc).__name__}: {exc}")))
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> "LocalBuilder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
