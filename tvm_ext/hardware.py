"""What a device is and what it can do: ``TargetInfo`` (read from the device, or documented
defaults when only generating code) and the per-architecture facts no runtime reports.

Every "can this GPU do X / how much of Y does it have" question of the templates, the picks
and the cost model is answered here, so a new GPU is one row of ``CUDA_ARCHS``.  Numbers are
NVIDIA's (CUDA C Programming Guide, "Compute capabilities"; PTX ISA for the instructions).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from .precision.precision import FLOAT_DTYPES


@dataclass(frozen=True)
class TargetInfo:
    kind: str  # "opencl" | "cuda"
    device_id: int = 0
    device_name: str = "unknown"
    max_threads_per_block: int = 1024
    max_shared_memory_per_block: int = 48 * 1024
    warp_size: int = 32
    compute_units: int = 1
    l2_bytes: int = 0
    arch: str = ""  # CUDA "sm_90"; empty for OpenCL
    registers_per_block: int = 65536
    is_cpu: bool = False  # OpenCL on a CPU device (PoCL)
    # Float types kernels may use here.  OpenCL: float16 needs cl_khr_fp16 and float64
    # cl_khr_fp64; bfloat16 always works (TVM stores it as ushort and computes in fp32).
    float_dtypes: tuple[str, ...] = FLOAT_DTYPES

    def tvm_target(self) -> dict[str, Any]:
        """The target dict given to ``tvm.compile``."""
        common = {
            "max_threads_per_block": self.max_threads_per_block,
            "max_shared_memory_per_block": self.max_shared_memory_per_block,
        }
        if self.kind == "cuda":
            return {"kind": "cuda", "arch": self.arch or "sm_90", "thread_warp_size": 32, **common}
        return {"kind": "opencl", "max_num_threads": self.max_threads_per_block, **common}

    def key(self) -> dict[str, Any]:
        """What identifies this target in a workload key (the device, not its index)."""
        return {"kind": self.kind, "device": self.device_name, "arch": self.arch}


@dataclass(frozen=True)
class CudaArch:
    """One compute capability's per-SM limits and the dynamic shared memory a block may opt
    into (None: not recorded here, so only the 48 KiB without opting in is assumed)."""

    threads_per_sm: int
    blocks_per_sm: int
    shared_per_sm_kib: int
    shared_opt_in_bytes: int | None


CUDA_ARCHS: dict[int, CudaArch] = {
    70: CudaArch(2048, 32, 96, 96 * 1024), 72: CudaArch(2048, 32, 96, 48 * 1024),
    75: CudaArch(1024, 16, 64, 64 * 1024), 80: CudaArch(2048, 32, 164, 163 * 1024),
    86: CudaArch(1536, 16, 100, 99 * 1024), 87: CudaArch(2048, 16, 164, 163 * 1024),
    89: CudaArch(1536, 24, 100, 99 * 1024), 90: CudaArch(2048, 32, 228, 227 * 1024),
    100: CudaArch(2048, 32, 228, None), 120: CudaArch(1536, 32, 100, None),
}
# Opt-in dynamic shared memory per block, by compute capability (the architectures that record it)
SMEM_OPT_IN_BYTES = {cc: a.shared_opt_in_bytes for cc, a in CUDA_ARCHS.items() if a.shared_opt_in_bytes}
HOPPER = 90  # wgmma, TMA, thread-block clusters and distributed shared memory
AMPERE = 80  # cp.async, ldmatrix, mma.sync with bfloat16
WGMMA_SHARED_BYTES = CUDA_ARCHS[HOPPER].shared_opt_in_bytes  # what a wgmma kernel's block may take
WGMMA_SHARED_PER_SM = CUDA_ARCHS[HOPPER].shared_per_sm_kib * 1024  # what an SM's resident blocks share
SHARED_RESERVED_PER_BLOCK = 1024  # shared memory the CUDA runtime keeps for each resident block (sm_80 on)
CLUSTER_MAX_PORTABLE = 8  # blocks of a thread-block cluster launched without the non-portable attribute
CLUSTER_MAX = 16  # with it (Hopper; TVM's runtime sets the attribute for clusters past 8)


def compute_capability(target: TargetInfo) -> int | None:
    """90 for "sm_90" or "sm_90a"; None when the arch is unknown (OpenCL, no arch)."""
    arch = (target.arch or "").rstrip("a")
    return int(arch[3:]) if arch.startswith("sm_") and arch[3:].isdigit() else None


def cuda_arch(cc: int) -> CudaArch:
    """The limits of ``cc``, or of the newest recorded architecture before it."""
    return CUDA_ARCHS[max((a for a in CUDA_ARCHS if a <= cc), default=min(CUDA_ARCHS))]


def max_dynamic_smem(target: TargetInfo) -> int:
    """Dynamic shared memory a block may take: the device's limit, or the opt-in one."""
    cc = compute_capability(target)
    opt_in = SMEM_OPT_IN_BYTES.get(cc, 0) if cc else 0
    return max(target.max_shared_memory_per_block, opt_in)


def has_wgmma(target: TargetInfo) -> bool:
    """Hopper's warpgroup MMA (sm_90 exactly: sm_90a's arch-specific instructions)."""
    return target.kind == "cuda" and compute_capability(target) == HOPPER


def supports_clusters(target: TargetInfo) -> bool:
    """Thread-block clusters with distributed shared memory (sm_90 and later)."""
    cc = compute_capability(target)
    return target.kind == "cuda" and cc is not None and cc >= HOPPER


def sm_90a(target: TargetInfo) -> TargetInfo:
    """``target`` built for sm_90a, the arch that has wgmma."""
    return dataclasses.replace(target, arch="sm_90a")


def host_memory_bytes() -> int | None:
    """Memory this host can give a run now: ``MemAvailable`` (Linux), else its physical
    memory; None where neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None
