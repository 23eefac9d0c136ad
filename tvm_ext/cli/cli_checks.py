"""Checks of command-line input that run before any work starts.

Every bad value becomes one ``TvmExtError`` (the CLI prints ``error: ...`` and exits
with code 2) instead of a traceback, a silently ignored option, or a failure found
only after a whole search ran.
"""
from __future__ import annotations

import argparse
import math
import os
from typing import Any

import numpy as np

from ..core.errors import TvmExtError
from ..core.search import default_tourn_size
from ..hardware import host_memory_bytes

INDEX_LIMIT = 2**31 - 1  # TVM indexes buffers with int32 expressions


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump) and exit code 2."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def check_run_inputs(args: argparse.Namespace) -> None:
    """Build, run and seed settings every tuning command shares."""
    if args.seed < 0:
        raise TvmExtError(f"--seed must be >= 0, got {args.seed}")
    if args.workers is not None and args.workers < 1:
        raise TvmExtError(f"--workers must be >= 1 (build processes), got {args.workers}")
    for name in ("build_timeout", "run_timeout"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            raise TvmExtError(f"--{name.replace('_', '-')} must be a positive number of seconds, got {value:g}")


def check_tuning_inputs(args: argparse.Namespace) -> None:
    """The tuning options of ``gemm``/``reduce``/``gru``/``gemm-tc``/``model`` (before the
    range checks of each option); fills in the default ``--tourn-size`` for the population."""
    check_run_inputs(args)
    if args.tourn_size is None:
        args.tourn_size = default_tourn_size(args.population)
    if args.strategy == "ga" and args.population < 2:
        raise TvmExtError(f"--population must be >= 2 for the GA (crossover pairs parents), got {args.population}")
    if getattr(args, "no_measure", False) and args.strategy != "analytic":
        raise TvmExtError("--no-measure needs --strategy analytic (the other strategies measure every candidate)")


def check_index_range(template: Any) -> None:
    """Refuse a workload whose buffers TVM's int32 indexing cannot address, with the
    reason, instead of letting every build fail."""
    for spec in template.inputs() + template.outputs() + template.scratch():
        elements = int(np.prod([int(d) for d in spec.shape], dtype=object))
        if elements > INDEX_LIMIT:
            shape = "x".join(str(d) for d in spec.shape)
            raise TvmExtError(f"{template.describe()}: a {shape} tensor has {elements} elements, more than "
                              f"TVM's int32 indices reach ({INDEX_LIMIT}); use smaller shapes")


def buffer_bytes(template: Any) -> tuple[int, int]:
    """(device, host) bytes one measurement of ``template`` needs: every buffer in its dtype
    on the device; on the host each buffer twice in its dtype (the driver's copy and the
    measuring process's) and once in float64 (inputs drawn at full precision, the reference)."""
    from ..precision.precision import np_dtype

    device = host = 0
    for spec in template.inputs() + template.outputs() + template.scratch():
        elements = int(np.prod([int(d) for d in spec.shape], dtype=object))
        size = elements * np_dtype(spec.dtype).itemsize
        device += size
        host += 2 * size + elements * 8
    return device, host


def device_memory_bytes(target: Any) -> int | None:
    """Global memory of a CUDA device of this host (None for others, or when unknown)."""
    if getattr(target, "kind", None) != "cuda":
        return None
    try:
        import tvm

        dev = tvm.cuda(target.device_id)
        return int(dev.total_global_memory) if dev.exist else None
    except Exception:  # a driver that cannot say: not checked
        return None


def _gib(size: int) -> str:
    """``size`` bytes in GiB, MiB or KiB, whichever gives a number of at least 1."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 2**10:.1f} KiB"


def check_memory(template: Any, target: Any = None) -> None:
    """Refuse a workload whose buffers cannot fit this host's memory (or, given a CUDA
    ``target`` here, the device's) before anything runs: it would be killed by the OOM
    killer without a word, or fail every measurement."""
    device, host = buffer_bytes(template)
    if target is not None and getattr(target, "is_cpu", False):
        host += device  # an OpenCL CPU device's buffers are host memory too
    available = host_memory_bytes()
    if available is not None and host > available:
        raise TvmExtError(f"{template.describe()}: its buffers need about {_gib(host)} of host memory "
                          f"(data and float64 references), more than the {_gib(available)} available; "
                          f"use smaller shapes")
    total = device_memory_bytes(target) if target is not None else None
    if total is not None and device > total:
        raise TvmExtError(f"{template.describe()}: its buffers need {_gib(device)} of device memory, more than "
                          f"the {_gib(total)} of {target.device_name}; use smaller shapes")


def check_out_dir(path: str, option: str = "--out") -> None:
    """A folder the command will write into: it, or its nearest existing parent, must be
    a writable folder (checked before a search whose result would have nowhere to go)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise TvmExtError(f"{option} {path}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise TvmExtError(f"{option} {path}: {probe} is not writable")


def call_user(user: Any, path: str, name: str, *args: Any, **options: str) -> Any:
    """A function of the model file; what it raises is bad input (one line), not our crash. Our
    own refusal (an ONNX or .pt2 file that does not parse) is its line as it is."""
    try:
        return getattr(user, name)(*args, **options)
    except TvmExtError:
        raise
    except Exception as exc:
        first = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        raise TvmExtError(f"{path}: {name}() raised {first}") from None


def model_module(user: Any, path: str, **options: str) -> Any:
    """``get_module(**options)`` of a model file, or the reason it gave no Relax module."""
    import tvm

    mod = call_user(user, path, "get_module", **options)
    if not isinstance(mod, tvm.IRModule):
        raise TvmExtError(f"{path}: get_module() returned {type(mod).__name__}, expected a Relax IRModule")
    return mod
