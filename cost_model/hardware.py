"""The hardware model of method 002: what limits a thread block's tile on one device.

Built from :class:`~tvm_ext.target.TargetInfo` (read from the device when one is
present).  TargetInfo has the per-block limits; the per-SM limits (threads, blocks,
registers, shared memory per multiprocessor) and the matrix unit's smallest shape are
not exposed by TVM or OpenCL, so they come from the CUDA architecture's documented
numbers (CUDA C Programming Guide, "Compute capabilities" table) or, for OpenCL
devices, from conservative defaults stated below.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tvm_ext.hardware import TargetInfo, cuda_arch


@dataclass(frozen=True)
class HardwareModel:
    """Per-SM and per-block resources, the numbers the analytic tile's filters read.

    ``registers_per_sm == 0`` means registers do not limit residency (a CPU device).
    ``mma_min_m/n`` is the matrix unit's smallest M/N shape (0: no matrix unit).
    """

    kind: str
    device: str
    sm_count: int
    warp_size: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int
    registers_per_block: int
    max_registers_per_thread: int
    shared_per_sm: int
    shared_per_block: int
    mma_min_m: int = 0
    mma_min_n: int = 0
    is_cpu: bool = False

    @classmethod
    def from_target(cls, target: TargetInfo) -> "HardwareModel":
        if target.kind == "cuda":
            cc = int((target.arch or "sm_90").split("_")[-1].rstrip("a"))
            arch = cuda_arch(cc)
            threads_sm, blocks_sm, smem_kib = arch.threads_per_sm, arch.blocks_per_sm, arch.shared_per_sm_kib
            return cls(
                kind="cuda", device=target.device_name, sm_count=max(1, target.compute_units),
                warp_size=target.warp_size, max_threads_per_block=target.max_threads_per_block,
                max_threads_per_sm=threads_sm, max_blocks_per_sm=blocks_sm,
                registers_per_sm=65536, registers_per_block=target.registers_per_block,
                max_registers_per_thread=255, shared_per_sm=smem_kib * 1024,
                shared_per_block=target.max_shared_memory_per_block,
                mma_min_m=16 if cc >= 70 else 0, mma_min_n=8 if cc >= 70 else 0,
            )
        if target.is_cpu:
            # A CPU OpenCL device (PoCL) runs one work-group per core at a time; local
            # memory is ordinary cached memory and there is no register file to share.
            return cls(
                kind=target.kind, device=target.device_name, sm_count=max(1, target.compute_units),
                warp_size=max(1, target.warp_size), max_threads_per_block=target.max_threads_per_block,
                max_threads_per_sm=target.max_threads_per_block, max_blocks_per_sm=1,
                registers_per_sm=0, registers_per_block=0, max_registers_per_thread=0,
                shared_per_sm=target.max_shared_memory_per_block,
                shared_per_block=target.max_shared_memory_per_block, is_cpu=True,
            )
        # An OpenCL GPU: per-block limits from the device; per-SM limits of a typical
        # GPU (two blocks of the largest size, a 64K-register file).
        return cls(
            kind=target.kind, device=target.device_name, sm_count=max(1, target.compute_units),
            warp_size=max(1, target.warp_size), max_threads_per_block=target.max_threads_per_block,
            max_threads_per_sm=2 * target.max_threads_per_block, max_blocks_per_sm=16,
            registers_per_sm=65536, registers_per_block=target.registers_per_block or 65536,
            max_registers_per_thread=255, shared_per_sm=target.max_shared_memory_per_block,
            shared_per_block=target.max_shared_memory_per_block,
        )

    @property
    def shared_per_block_optin(self) -> int:
        """Shared memory one block may use: on CUDA a kernel can opt in (dynamic shared
        memory) to all of an SM's but the 1 KiB the SM reserves per block; elsewhere the
        per-block limit."""
        if self.kind == "cuda":
            return max(self.shared_per_block, self.shared_per_sm - 1024)
        return self.shared_per_block

    # ---- residency (vectorized over candidates) --------------------------------------------
    def blocks_per_sm(self, threads: np.ndarray, registers: np.ndarray, shared: np.ndarray) -> np.ndarray:
        """Resident blocks per SM given threads, registers per thread and shared bytes per block."""
        threads = np.maximum(np.asarray(threads, dtype=np.float64), 1.0)
        limit = np.minimum(self.max_blocks_per_sm, np.floor(self.max_threads_per_sm / threads))
        if self.registers_per_sm:
            # registers are allocated per warp in units of 256 (8 per thread of a warp)
            regs = np.ceil(np.maximum(np.asarray(registers, dtype=np.float64), 1.0) / 8.0) * 8.0
            warps = np.ceil(threads / self.warp_size)
            limit = np.minimum(limit, np.floor(self.registers_per_sm / (regs * warps * self.warp_size)))
        shared = np.asarray(shared, dtype=np.float64)
        with np.errstate(divide="ignore"):
            by_smem = np.where(shared > 0, np.floor(self.shared_per_sm / np.maximum(shared, 1.0)), np.inf)
        return np.maximum(np.minimum(limit, by_smem), 0.0)

    def occupancy(self, threads: np.ndarray, registers: np.ndarray, shared: np.ndarray) -> np.ndarray:
        """Fraction of the SM's thread slots that are resident (0..1)."""
        active = self.blocks_per_sm(threads, registers, shared) * np.asarray(threads, dtype=np.float64)
        return active / self.max_threads_per_sm

    def describe(self) -> str:
        regs = f"{self.registers_per_sm} regs/SM" if self.registers_per_sm else "no register limit"
        return (f"{self.device}: {self.sm_count} SMs, {self.max_threads_per_block} threads/block, "
                f"{self.max_threads_per_sm} threads/SM, {regs}, {self.shared_per_block // 1024} KiB "
                f"shared/block, {self.shared_per_sm // 1024} KiB/SM, warp {self.warp_size}")


def ceil_div(a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
    return -(-np.asarray(a) // np.asarray(b))


def waves(blocks: np.ndarray, resident: np.ndarray, sm_count: int) -> np.ndarray:
    """Rounds of block issue: blocks over (SMs × resident blocks per SM); inf if none fit."""
    slots = np.asarray(resident, dtype=np.float64) * sm_count
    with np.errstate(divide="ignore"):
        return np.where(slots > 0, np.asarray(blocks, dtype=np.float64) / np.maximum(slots, 1e-9), math.inf)
