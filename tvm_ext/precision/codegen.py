"""Generated programs (method 003's S7): write a chosen program out, load it, run it.

``export_program`` writes a directory:

- ``kernels/<function>.py``: the TVMScript of every scheduled kernel function, with
  its dtypes (readable, and ``tvm.script.from_source`` parses it back);
- ``program.so``: the compiled library (``Executable.export_library``) for the
  target; ``program.cl`` / ``program.cu``: the device source it contains;
- ``manifest.json``: operator, shapes, the precision of every parameter and the
  dtype of every tensor, the schedule, the launches, the error measured and the
  speedup over the all-float32 program.

``load_program`` needs only numpy and TVM's runtime (CUDA) or pyopencl (OpenCL:
the PyPI TVM wheel has no OpenCL runtime, so the kernels in ``program.cl`` are
launched as the manifest lists them), through the executors of ``tvm_ext.measure.executors``.
No search code is involved.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.errors import TvmExtError
from ..hardware import host_memory_bytes
from ..measure.executors import CudaExecutor, OpenclExecutor
from .precision import MixedPrecisionOperator, cast, np_dtype, precision_reason, scaled_cast
from ..measure.program import MAIN, KernelLaunch, TensorSpec

MANIFEST = "manifest.json"
FORMAT = "tvm_ext.measure.program/1"


def _specs(op: Any) -> list[dict[str, Any]]:
    roles = [("input", op.inputs()), ("output", op.outputs()), ("scratch", op.scratch())]
    return [{"role": role, "shape": list(s.shape), "dtype": s.dtype} for role, specs in roles for s in specs]


def export_program(op: Any, schedule_config: Any, target: Any, out_dir: str,
                   extra: Mapping[str, Any] | None = None) -> str:
    """Write ``op`` (an operator at its chosen precision) scheduled with ``schedule_config``;
    returns the manifest's path.  ``extra`` (error, speedup, ...) goes into the manifest."""
    import tvm

    params_of = op.precision_params() if isinstance(op, MixedPrecisionOperator) else ()
    precision = dict(op.precision) if isinstance(op, MixedPrecisionOperator) else {}
    unhonoured = precision_reason(params_of, precision, target.kind)
    if unhonoured:  # the manifest would claim a precision the kernel does not have
        raise TvmExtError(f"cannot export {op.name} for {target.kind}: {unhonoured}")
    os.makedirs(os.path.join(out_dir, "kernels"), exist_ok=True)
    program = op.build_program(schedule_config, target)
    modules, executable, source, params = program.modules, program.executable, program.source, program.params
    if target.kind != "cuda":
        entry, launches = "launches", program.launches
    elif program.single_function:  # one PrimFunc: called as main, its kernels listed for reading
        entry, launches = MAIN, program.launches
    else:  # a host plan: the module's functions called in order
        entry, launches = "calls", program.calls
    for name, mod in modules.items():
        with open(os.path.join(out_dir, "kernels", f"{name}.py"), "w", encoding="utf-8") as fh:
            fh.write(mod.script())
    library = os.path.join(out_dir, "program.so")
    executable.export_library(library)
    source_file = "program.cu" if target.kind == "cuda" else "program.cl"
    with open(os.path.join(out_dir, source_file), "w", encoding="utf-8") as fh:
        fh.write(source)
    specs = _specs(op.measured_operator(schedule_config))  # the buffers this config's program takes
    if len(specs) != len(params):
        raise TvmExtError(f"{op.name}: {len(params)} kernel parameters but {len(specs)} tensors")
    manifest = {
        "format": FORMAT,
        "operator": op.name,
        "params": {k: v for k, v in op.params.items()},
        "precision": precision,
        "schedule": schedule_config.as_dict(),
        "target": target.key(),
        "tvm_target": target.tvm_target(),
        "tvm_version": str(tvm.__version__),
        "tensors": [{"name": n, **s} for n, s in zip(params, specs)],
        "library": "program.so",
        "source": source_file,
        "entry": entry,
        "launches": [asdict(l) for l in launches],
        **({"float_inputs": op.float_inputs()} if hasattr(op, "float_inputs") else {}),
        **dict(extra or {}),
    }
    path = os.path.join(out_dir, MANIFEST)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1, default=_plain)
    return path


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


class GeneratedProgram:
    """A program written by ``export_program``: ``run(*inputs)`` returns its outputs.

    Inputs may be any float arrays of the declared shapes; they are rounded to the
    declared dtypes (as the search measured).  A program with 8-bit operands also takes the
    float operator's inputs (``float_inputs`` in the manifest: a GEMM's A and B), scaled per
    tensor into its 8-bit tensors and their scales as the search measured them.  Outputs
    come back in their declared dtypes (``bfloat16`` as ml_dtypes' type).
    """

    def __init__(self, path: str, device_id: int = 0):
        directory = path if os.path.isdir(path) else os.path.dirname(path)
        try:
            with open(os.path.join(directory, MANIFEST), encoding="utf-8") as fh:
                self.manifest = json.load(fh)
        except (OSError, ValueError) as exc:
            raise TvmExtError(f"no readable {MANIFEST} in {directory}: {exc}") from None
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT:
            raise TvmExtError(f"{directory}: not a tvm_ext program (format "
                              f"{self.manifest.get('format') if isinstance(self.manifest, dict) else None!r})")
        check_manifest(self.manifest, directory)
        self.directory = directory
        self.device_id = device_id
        self.tensors = self.manifest["tensors"]
        self.kind = self.manifest["target"]["kind"]
        self._impl: Any = None

    @property
    def inputs(self) -> list[dict[str, Any]]:
        return [t for t in self.tensors if t["role"] == "input"]

    @property
    def outputs(self) -> list[dict[str, Any]]:
        return [t for t in self.tensors if t["role"] == "output"]

    def _prepare(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        scaled = self.manifest.get("float_inputs")
        if scaled and len(arrays) == len(scaled) != len(self.inputs):
            arrays = _scaled_inputs(scaled, self.inputs, arrays)
        if len(arrays) != len(self.inputs):
            raise TvmExtError(f"the program takes {len(self.inputs)} inputs "
                              f"({', '.join(t['name'] for t in self.inputs)}), got {len(arrays)}")
        out = []
        for spec, array in zip(self.inputs, arrays):
            array = np.asarray(array)
            if list(array.shape) != spec["shape"]:
                raise TvmExtError(f"input {spec['name']} must have shape {tuple(spec['shape'])}, "
                                  f"got {array.shape}")
            out.append(array if array.dtype == np_dtype(spec["dtype"]) else cast(array, spec["dtype"]))
        return out

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        inputs = self._prepare(arrays)
        executor = self.executor
        for spec in self.tensors:
            values = inputs.pop(0) if spec["role"] == "input" else np.zeros(spec["shape"], np_dtype(spec["dtype"]))
            executor.write(spec["name"], values)
        executor.run()
        executor.sync()
        return [executor.read(t["name"]) for t in self.outputs]

    @property
    def executor(self) -> Any:
        """The program's executor (made once): the library's functions through TVM's runtime
        (CUDA), or the kernels of the source through pyopencl (OpenCL), as the manifest lists them."""
        if self._impl is not None:
            return self._impl
        specs = {t["name"]: TensorSpec(tuple(t["shape"]), t["dtype"]) for t in self.tensors}
        names = tuple(t["name"] for t in self.tensors)
        if self.kind == "cuda":
            import tvm

            module = tvm.runtime.load_module(os.path.join(self.directory, self.manifest["library"]))
            calls = ([KernelLaunch(MAIN, names, (1, 1, 1), (1, 1, 1))] if self.manifest["entry"] == MAIN
                     else _launches(self.manifest["launches"]))
            self._impl = CudaExecutor(module, calls, specs, self.device_id)
        else:
            with open(os.path.join(self.directory, self.manifest["source"]), encoding="utf-8") as fh:
                source = fh.read()
            self._impl = OpenclExecutor.of(source, _launches(self.manifest["launches"]), specs, self.device_id)
        return self._impl


ROLES = ("input", "output", "scratch")
MAX_RANK = 8


def check_manifest(manifest: Mapping[str, Any], directory: str) -> None:
    """A manifest read from a user's folder is data until it checks out: the library and
    source it names are files of that folder (never a path out of it), its tensors have a
    name, a role, a known dtype and a shape of non-negative sizes that fits this host's
    memory, its launches name their kernels, arguments and launch sizes; else one error."""
    def bad(what: str) -> TvmExtError:
        return TvmExtError(f"{directory}: the manifest's {what}")

    for key in ("library", "source"):
        name = manifest.get(key)
        if not isinstance(name, str) or not name or os.path.basename(name) != name or name.startswith("."):
            raise bad(f"{key} {str(name)[:80]!r} is not a file name of its folder")
    tensors = manifest.get("tensors")
    if not isinstance(tensors, list) or not tensors:
        raise bad("tensors are not a list of tensors")
    total = 0
    for t in tensors:
        shape = t.get("shape") if isinstance(t, dict) else None
        if (not isinstance(t.get("name") if isinstance(t, dict) else None, str) or t.get("role") not in ROLES
                or not isinstance(shape, list) or len(shape) > MAX_RANK
                or not all(type(d) is int and d >= 0 for d in shape)):
            raise bad(f"tensor {str(t)[:80]} is not one (a name, a role of {', '.join(ROLES)}, a shape)")
        try:
            total += int(np.prod(shape, dtype=object)) * np_dtype(str(t.get("dtype"))).itemsize
        except (TypeError, AttributeError) as exc:  # numpy's and ml_dtypes' words for a dtype they do not know
            raise bad(f"tensor {t['name']} has dtype {str(t.get('dtype'))[:40]!r}: {exc}") from None
    available = host_memory_bytes()
    if available is not None and total > available:
        raise bad(f"tensors need {total / 2**30:.1f} GiB, more than the {available / 2**30:.1f} GiB this host has free")
    try:
        _launches(manifest.get("launches") or [])
    except (KeyError, TypeError, ValueError) as exc:
        raise bad(f"launches are not launches ({type(exc).__name__}: {str(exc)[:80]})") from None


def _scaled_inputs(entries: Sequence[Mapping[str, Any]], inputs: Sequence[Mapping[str, Any]],
                   arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The program's tensors from the float operator's inputs: each scaled to its 8-bit
    tensor (transposed where the entry says), its scale written into the scale tensor."""
    tensors: list[np.ndarray | None] = [None] * len(inputs)
    for entry, array in zip(entries, arrays):
        index, (scale_index, scale_at) = entry.get("tensor"), entry.get("scale", (None, None))
        if (not all(type(i) is int and 0 <= i < len(inputs) for i in (index, scale_index)) or index == scale_index
                or type(scale_at) is not int or not 0 <= scale_at < int(np.prod(inputs[scale_index]["shape"]))):
            raise TvmExtError(f"the manifest's float input {str(entry)[:80]} names no tensor of the program")
        array = np.asarray(array)
        if list(array.shape) != entry.get("shape"):
            raise TvmExtError(f"input {entry.get('name')} must have shape {tuple(entry.get('shape') or ())}, "
                              f"got {array.shape}")
        tensors[index], scale = scaled_cast(array.T if entry.get("transpose") else array, inputs[index]["dtype"])
        if tensors[scale_index] is None:
            tensors[scale_index] = np.zeros(inputs[scale_index]["shape"], np.float32)
        tensors[scale_index][scale_at] = scale  # type: ignore[index]
    if any(t is None for t in tensors):
        raise TvmExtError("the manifest's float inputs leave a tensor of the program unset")
    return tensors  # type: ignore[return-value]


def _launches(entries: Sequence[Mapping[str, Any]]) -> list[KernelLaunch]:
    return [KernelLaunch(e["name"], tuple(e["args"]), tuple(e["grid"]), tuple(e["block"])) for e in entries]


def load_program(path: str, device_id: int = 0) -> GeneratedProgram:
    return GeneratedProgram(path, device_id)
