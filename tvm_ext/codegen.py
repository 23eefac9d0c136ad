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
launched as the manifest lists them).  No search code is involved.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import TvmExtError
from .precision import MixedPrecisionOperator, cast, np_dtype, precision_reason

MANIFEST = "manifest.json"
FORMAT = "tvm_ext.program/1"


def _specs(op: Any) -> list[dict[str, Any]]:
    roles = [("input", op.inputs()), ("output", op.outputs()), ("scratch", op.scratch())]
    return [{"role": role, "shape": list(s.shape), "dtype": s.dtype} for role, specs in roles for s in specs]


def export_program(op: Any, schedule_config: Any, target: Any, out_dir: str,
                   extra: Mapping[str, Any] | None = None) -> str:
    """Write ``op`` (an operator at its chosen precision) scheduled with ``schedule_config``;
    returns the manifest's path.  ``extra`` (error, speedup, ...) goes into the manifest."""
    import tvm

    from .builder import compile_module

    params_of = op.precision_params() if isinstance(op, MixedPrecisionOperator) else ()
    precision = dict(op.precision) if isinstance(op, MixedPrecisionOperator) else {}
    unhonoured = precision_reason(params_of, precision, target.kind)
    if unhonoured:  # the manifest would claim a precision the kernel does not have
        raise TvmExtError(f"cannot export {op.name} for {target.kind}: {unhonoured}")
    os.makedirs(os.path.join(out_dir, "kernels"), exist_ok=True)
    if hasattr(op, "compile"):  # several kernels and a host plan (GRU)
        compiled = op.compile(schedule_config, target)
        modules = compiled.modules
        executable, source = compiled.executable, compiled.source
        params = tuple(op.buffers())
        art = compiled.artifact(target.kind, params)
        launches, entry = art.launches, "calls" if target.kind == "cuda" else "launches"
    else:
        sch = op.schedule(schedule_config, target)
        modules = {"main": sch.mod}
        executable, source, launches, params = compile_module(sch.mod, target,
                                                              op.pass_config(schedule_config, target))
        entry = "main" if target.kind == "cuda" else "launches"
    for name, mod in modules.items():
        with open(os.path.join(out_dir, "kernels", f"{name}.py"), "w", encoding="utf-8") as fh:
            fh.write(mod.script())
    library = os.path.join(out_dir, "program.so")
    executable.export_library(library)
    source_file = "program.cu" if target.kind == "cuda" else "program.cl"
    with open(os.path.join(out_dir, source_file), "w", encoding="utf-8") as fh:
        fh.write(source)
    specs = _specs(op)
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
    declared dtypes (as the search measured).  Outputs come back in their declared
    dtypes (``bfloat16`` as ml_dtypes' type).
    """

    def __init__(self, path: str, device_id: int = 0):
        directory = path if os.path.isdir(path) else os.path.dirname(path)
        try:
            with open(os.path.join(directory, MANIFEST), encoding="utf-8") as fh:
                self.manifest = json.load(fh)
        except (OSError, ValueError) as exc:
            raise TvmExtError(f"no readable {MANIFEST} in {directory}: {exc}") from None
        if self.manifest.get("format") != FORMAT:
            raise TvmExtError(f"{directory}: not a tvm_ext program (format {self.manifest.get('format')!r})")
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
        if self.kind == "cuda":
            return self._run_cuda(inputs)
        return self._run_opencl(inputs)

    def _run_cuda(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        import tvm

        dev = tvm.cuda(self.device_id)
        if self._impl is None:
            self._impl = tvm.runtime.load_module(os.path.join(self.directory, self.manifest["library"]))
        values = iter(inputs)
        bufs = {t["name"]: tvm.runtime.tensor(next(values) if t["role"] == "input"
                                              else np.zeros(t["shape"], np_dtype(t["dtype"])), dev)
                for t in self.tensors}
        if self.manifest["entry"] == "main":
            self._impl["main"](*(bufs[t["name"]] for t in self.tensors))
        else:  # a host plan: one call per entry, scalars inline
            for call in self.manifest["launches"]:
                self._impl[call["name"]](*(bufs[a] if isinstance(a, str) else a for a in call["args"]))
        dev.sync()
        return [bufs[t["name"]].numpy() for t in self.outputs]

    def _run_opencl(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        import pyopencl as cl

        from .builder import KernelLaunch
        from .runner import enqueue_launches
        from .target import opencl_device

        if self._impl is None:
            ctx = cl.Context([opencl_device(self.device_id)])
            with open(os.path.join(self.directory, self.manifest["source"]), encoding="utf-8") as fh:
                program = cl.Program(ctx, fh.read()).build()
            launches = [KernelLaunch(l["name"], tuple(l["args"]), tuple(l["grid"]), tuple(l["block"]))
                        for l in self.manifest["launches"]]
            by_name = {name: cl.Kernel(program, name) for name in dict.fromkeys(l.name for l in launches)}
            self._impl = (ctx, cl.CommandQueue(ctx), [(by_name[l.name], l) for l in launches])
        ctx, queue, kernels = self._impl
        mf = cl.mem_flags
        values = iter(inputs)
        host = {t["name"]: (next(values) if t["role"] == "input" else np.zeros(t["shape"], np_dtype(t["dtype"])))
                for t in self.tensors}
        bufs = {n: cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=a) for n, a in host.items()}
        enqueue_launches(queue, kernels, bufs)
        outs = []
        for t in self.outputs:
            cl.enqueue_copy(queue, host[t["name"]], bufs[t["name"]])
            outs.append(host[t["name"]])
        queue.finish()
        return outs


def load_program(path: str, device_id: int = 0) -> GeneratedProgram:
    return GeneratedProgram(path, device_id)
