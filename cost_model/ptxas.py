"""Registers and spills of a CUDA candidate from ``ptxas -v``: a free feature, no GPU needed.

Generating a candidate's CUDA source takes TVM about a second and ``nvcc -cubin`` another
second or two, so results are cached in a JSON file (one entry per workload and config)
and computing them is optional: without nvcc, or for configs not in the cache, the cost
model sees NaN ("unknown") and falls back to its register estimate.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Sequence

from tvm_ext.core.space import Config
from tvm_ext.target import TargetInfo
from tvm_ext.core.template import Template

_USED = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


@dataclass(frozen=True)
class PtxasInfo:
    registers: int
    spill_bytes: int  # spill stores + loads of the kernel (the worst kernel if several)


def nvcc_available() -> bool:
    return shutil.which("nvcc") is not None


def parse_ptxas(text: str) -> PtxasInfo | None:
    """The most register-hungry kernel's registers and spills from ``ptxas -v`` output."""
    regs = [int(m.group(1)) for m in _USED.finditer(text)]
    spills = [int(a) + int(b) for a, b in _SPILL.findall(text)]
    if not regs:
        return None
    return PtxasInfo(max(regs), max(spills, default=0))


def ptxas_of_source(source: str, arch: str, timeout: float = 120.0) -> PtxasInfo | None:
    """Compile CUDA source to a cubin with ``nvcc --ptxas-options=-v``; None on failure."""
    with tempfile.TemporaryDirectory(prefix="tvm_ext_ptxas_") as tmp:
        src = os.path.join(tmp, "kernel.cu")
        with open(src, "w", encoding="utf-8") as fh:
            fh.write(source)
        try:
            proc = subprocess.run(
                ["nvcc", "-cubin", f"-arch={arch}", "-O3", "--ptxas-options=-v", "-o",
                 os.path.join(tmp, "kernel.cubin"), src],
                capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return parse_ptxas(proc.stderr + proc.stdout) if proc.returncode == 0 else None


def ptxas_of_config(template: Template, config: Config, target: TargetInfo) -> PtxasInfo | None:
    """Generate the candidate's CUDA source with TVM (no GPU needed) and run ptxas on it."""
    import tvm

    try:
        sch = template.schedule(config, target)
        ex = tvm.compile(sch.mod, target=tvm.target.Target(target.tvm_target()))
        source = ex.mod.imports[0].inspect_source()
    except Exception:
        return None
    return ptxas_of_source(source, target.arch or "sm_90")


class PtxasCache:
    """``ptxas -v`` results per (workload, config), kept in a JSON file."""

    def __init__(self, path: str | os.PathLike[str] | None = None):
        self.path = os.fspath(path) if path else None
        self._data: dict[str, dict[str, int] | None] = {}
        if self.path and os.path.exists(self.path):
            try:
                with _open(self.path, "rt") as fh:
                    self._data = json.load(fh)
            except (OSError, ValueError):
                self._data = {}  # a torn cache is only lost time, never an error

    @staticmethod
    def key(template: Template, config: Config, target: TargetInfo) -> str:
        return f"{template.name}|{json.dumps(template.params, sort_keys=True)}|{target.arch}|{config}"

    def __len__(self) -> int:
        return len(self._data)

    def lookup(self, template: Template, config: Config, target: TargetInfo) -> PtxasInfo | None:
        found = self._data.get(self.key(template, config, target))
        return PtxasInfo(**found) if found else None

    def missing(self, template: Template, configs: Sequence[Config], target: TargetInfo) -> list[Config]:
        return [c for c in configs if self.key(template, c, target) not in self._data]

    def fill(self, template: Template, configs: Sequence[Config], target: TargetInfo,
             workers: int | None = None) -> int:
        """Compute what is missing (in worker processes) and save; returns entries added."""
        todo = self.missing(template, configs, target)
        if not todo or target.kind != "cuda" or not nvcc_available():
            return 0
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=max(1, workers or os.cpu_count() or 1), mp_context=ctx) as pool:
            results = list(pool.map(ptxas_of_config, [template] * len(todo), todo, [target] * len(todo)))
        for cfg, info in zip(todo, results):
            self._data[self.key(template, cfg, target)] = asdict(info) if info else None
        self.save()
        return len(todo)

    def save(self) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with _open(tmp if not self.path.endswith(".gz") else tmp + ".gz", "wt") as fh:
            json.dump(self._data, fh, sort_keys=True)
        os.replace(tmp if not self.path.endswith(".gz") else tmp + ".gz", self.path)


def _open(path: str, mode: str):  # type: ignore[no-untyped-def]
    """Plain or gzipped JSON (caches shipped with a sweep are gzipped)."""
    import gzip

    return gzip.open(path, mode, encoding="utf-8") if path.endswith(".gz") else open(path, mode, encoding="utf-8")
