"""Targets: which backend, which device, and the hardware limits a schedule must respect.

A ``TargetInfo`` is what templates and the hardware model read (threads per block,
shared memory, warp width, SM count); it is filled from the device when one is
present, and from documented defaults when we only generate code (CUDA on a
machine with no GPU).
"""
from __future__ import annotations

import contextlib
import functools
import signal
import threading
from typing import Any, Iterator

from .core.errors import TvmExtError
from .hardware import TargetInfo
from .precision.precision import FLOAT_DTYPES

TARGET_KINDS = ("opencl", "cuda")
__all__ = ["TARGET_KINDS", "TargetInfo", "offline_cuda", "resolve_target", "cuda_target_of", "opencl_device"]


_PROBE_KERNEL = "__kernel void tvm_ext_probe(__global float* a) { a[get_global_id(0)] = 1.0f; }"


@contextlib.contextmanager
def _keeping_signal_handlers() -> Iterator[None]:
    """This process's SIGINT and SIGTERM handlers put back after the block (OpenCL discovery).
    PoCL installs its own as it loads (the system PoCL in ``get_platforms``, the pip one when
    it first makes a context or builds), and its SIGTERM handler can end the process without
    running ours: a cluster worker then died without ending its TVM server.  (Handlers can
    only be set from the main thread; elsewhere PoCL's stay.)"""
    main = threading.current_thread() is threading.main_thread()
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:
                signal.signal(signum, handler)


@functools.lru_cache(maxsize=None)
def _opencl_devices() -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """OpenCL devices that can build a kernel (GPUs first), and why the others were left out.

    A device whose compiler cannot build a trivial kernel is skipped: e.g. the PoCL 3.0 that
    pyopencl's wheel bundles (LLVM 14) does not know CPUs newer than it (AMD Zen 5) and fails
    every build with "unknown target CPU 'generic'".  Every process filters the same way, so a
    device index means the same device in the tuner and in its measurement workers.
    """
    try:
        import pyopencl as cl
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise TvmExtError(
            "OpenCL target needs pyopencl: pip install 'tvm_ext[opencl]'"
        ) from exc
    with _keeping_signal_handlers():  # PoCL's first context and build too
        return _discover_devices(cl)


def _discover_devices(cl: Any) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    devices = []
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    for platform in platforms:
        try:
            devices.extend(platform.get_devices())
        except cl.Error:
            continue
    # Prefer GPUs over CPUs, keep platform order otherwise.
    devices.sort(key=lambda d: 0 if d.type & cl.device_type.GPU else 1)
    usable, skipped = [], []
    for dev in devices:
        reason = _build_failure(cl, dev)
        if reason is None:
            usable.append(dev)
        else:
            skipped.append(f"{dev.platform.name.strip()}/{dev.name.strip()}: {reason}")
    return tuple(usable), tuple(skipped)


def _build_failure(cl: Any, dev: Any) -> str | None:
    """``None`` if ``dev`` builds a trivial kernel, else the compiler's first error line."""
    try:
        cl.Program(cl.Context([dev]), _PROBE_KERNEL).build()
        return None
    except cl.Error as exc:
        lines = [l.strip() for l in str(exc).splitlines() if "error" in l.lower() and "clBuild" not in l]
        return lines[0] if lines else "cannot build a kernel"


def opencl_devices() -> tuple[Any, ...]:
    """The OpenCL devices that can build kernels, in the order device ids number them."""
    return _opencl_devices()[0]


def opencl_device(device_id: int) -> Any:
    devices, skipped = _opencl_devices()
    if not devices:
        if skipped:
            raise TvmExtError(
                "no OpenCL device can build kernels (" + "; ".join(skipped) + "); on a CPU that PoCL 3.0 "
                "does not know, install the system PoCL: apt-get install pocl-opencl-icd"
            )
        raise TvmExtError(
            "no OpenCL platform found; install a driver or 'pip install pocl-binary-distribution'"
        )
    if not 0 <= device_id < len(devices):
        names = ", ".join(f"{i}: {d.name.strip()}" for i, d in enumerate(devices))
        raise TvmExtError(f"no OpenCL device {device_id}; devices: {names}")
    return devices[device_id]


def _opencl_info(device_id: int) -> TargetInfo:
    import pyopencl as cl

    dev = opencl_device(device_id)
    is_cpu = bool(dev.type & cl.device_type.CPU)
    name = f"{dev.platform.name.strip()}/{dev.name.strip()}"
    warp = 32 if "NVIDIA" in dev.vendor.upper() else 1
    extensions = str(dev.extensions).split()
    dtypes = tuple(d for d in FLOAT_DTYPES
                   if d in ("float32", "bfloat16") or (d == "float16" and "cl_khr_fp16" in extensions)
                   or (d == "float64" and "cl_khr_fp64" in extensions))
    return TargetInfo(
        kind="opencl",
        float_dtypes=dtypes,
        device_id=device_id,
        device_name=name,
        max_threads_per_block=int(dev.max_work_group_size),
        max_shared_memory_per_block=int(dev.local_mem_size),
        warp_size=warp,
        compute_units=int(dev.max_compute_units),
        l2_bytes=int(getattr(dev, "global_mem_cache_size", 0) or 0),
        is_cpu=is_cpu,
    )


def _cuda_info(device_id: int) -> TargetInfo:
    import tvm

    dev = tvm.cuda(device_id)
    if not dev.exist:
        raise TvmExtError(
            f"no CUDA GPU {device_id} found (use --target opencl, or run on a GPU machine)"
        )
    l2 = 0
    try:  # L2 size decides whether timing must rotate inputs; cupy/torch know it.
        from cuda.bindings import runtime as cudart  # type: ignore

        err, l2 = cudart.cudaDeviceGetAttribute(cudart.cudaDeviceAttr.cudaDevAttrL2CacheSize, device_id)
    except Exception:
        l2 = 50 * 1024 * 1024
    return cuda_target_of(dev, device_id, l2)


def cuda_target_of(dev: Any, device_id: int, l2_bytes: int) -> TargetInfo:
    """The limits of a CUDA device TVM can see (here, or a remote device of an RPC session)."""
    major, minor = (int(x) for x in str(dev.compute_version).split("."))
    return TargetInfo(
        kind="cuda",
        device_id=device_id,
        device_name=str(dev.device_name),
        max_threads_per_block=int(dev.max_threads_per_block),
        max_shared_memory_per_block=int(dev.max_shared_memory_per_block),
        warp_size=int(dev.warp_size),
        compute_units=int(dev.multi_processor_count),
        l2_bytes=int(l2_bytes),
        arch=f"sm_{major}{minor}",
    )


def offline_cuda(arch: str = "sm_90") -> TargetInfo:
    """CUDA limits for code generation without a GPU (H100 defaults)."""
    return TargetInfo(
        kind="cuda", device_name=f"offline-{arch}", arch=arch, compute_units=132,
        l2_bytes=50 * 1024 * 1024,
    )


def resolve_target(kind: str, device_id: int = 0) -> TargetInfo:
    """Look the device up and return its limits; a clear error if it is not there."""
    kind = kind.lower()
    if kind not in TARGET_KINDS:
        raise TvmExtError(f"unknown target {kind!r}; allowed: {', '.join(TARGET_KINDS)}")
    if device_id < 0:
        raise TvmExtError(f"device index must be >= 0, got {device_id}")
    if kind == "opencl":
        return _opencl_info(device_id)
    return _cuda_info(device_id)
