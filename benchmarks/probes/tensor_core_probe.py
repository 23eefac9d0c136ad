"""Tensor-core (WMMA) GEMM probe: a dozen hand-picked configs per workload, each checked
against float64 and timed, next to torch fp16 (cuBLAS) in the same run.

Run through the device tool (see ../shared/DEVICE.md), about 2.5 minutes on an H100:
    source .tvm-device/boot.sh && python benchmarks/probes/tensor_core_probe.py --out $OUT
Each config runs in a worker process: a kernel that faults poisons its CUDA context, so
the worker is replaced and the probe goes on with the next config.  Prints one table per
workload; ``--out DIR`` gets every result as JSON lines (tensor_core_probe.jsonl).
Inputs stay resident in L2 only for the small 64x3072x1024 workload (the others' operands
exceed H100's 50 MB L2 together with the output); time_evaluator does not rotate them.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import table, time_vendor  # noqa: E402

from tvm_ext.schedules.gemm.tensor_core import TC_SPACE, MatmulProblem, WmmaTile  # noqa: E402

WORKLOADS = {
    "gemm4096_c32": MatmulProblem("gemm", 4096, 4096, 4096),
    "gemm4096_c16": MatmulProblem("gemm", 4096, 4096, 4096, c="float16"),
    "bias8192x3072x1024": MatmulProblem("bias", 8192, 3072, 1024),
    "bias64x3072x1024_b2": MatmulProblem("bias", 64, 3072, 1024, batch=2),
    "gemm2048_acc16": MatmulProblem("gemm", 2048, 2048, 2048, acc="float16", c="float16"),
}


def config(wm: int, wn: int, fm: int, fn: int, kf: int, pipeline: int = 2, out_smem: int = 1, vec: int = 8) -> Any:
    return TC_SPACE.make(tc_warps_m=wm, tc_warps_n=wn, tc_frags_m=fm, tc_frags_n=fn, tc_k_frags=kf, tc_vec=vec,
                         tc_pipeline=pipeline, tc_out_smem=out_smem)


# Large M: 128x128 and 128x256 / 256x128 block tiles (4-16 warps), with and without the
# pipeline, cp.async, direct fragment stores; one small tile as the floor.
LARGE_CONFIGS = [
    config(2, 2, 2, 2, 2, pipeline=0, out_smem=0),  # 64x64x32, no pipeline: the textbook start
    config(2, 4, 4, 2, 2, pipeline=0),               # 128x128x32, 8 warps
    config(2, 4, 4, 2, 2, pipeline=1),               # + double buffer
    config(2, 4, 4, 2, 2),                           # + cp.async
    config(2, 4, 4, 2, 2, out_smem=0),               # fragments straight to global (no epilogue only)
    config(2, 4, 4, 2, 4),                           # k stage 64
    config(4, 2, 2, 4, 2),                           # 128x128, warps 4x2
    config(2, 2, 4, 4, 2),                           # 128x128, 4 warps of 64x64
    config(4, 4, 2, 2, 2),                           # 128x128, 16 warps
    config(2, 4, 4, 4, 2),                           # 128x256
    config(4, 2, 4, 4, 2),                           # 256x128
    config(4, 4, 4, 2, 2),                           # 256x128, 16 warps
    config(2, 4, 4, 2, 2, vec=4),                    # 8-byte copies
    config(2, 4, 4, 2, 2, pipeline=3),               # 3 stages in flight
    config(4, 2, 2, 4, 2, pipeline=3),
    config(2, 4, 4, 2, 4, pipeline=3),
    config(2, 4, 4, 4, 2, pipeline=3),               # 128x256, 3 stages
    config(4, 2, 4, 4, 2, pipeline=3),               # 256x128, 3 stages
]
# M = 64: block tiles 64 x (32..256); narrow ones give more blocks than the 132 SMs
# (64x3072 batch 2 is only 48 blocks of 64x128).
SMALL_M_CONFIGS = [
    config(2, 2, 2, 2, 2, pipeline=0),               # 64x64x32
    config(2, 2, 2, 2, 4),                           # 64x64x64
    config(1, 4, 4, 1, 4),                           # 64x64x64, 4 warps in a row
    config(2, 2, 2, 1, 4),                           # 64x32x64
    config(1, 2, 4, 1, 4),                           # 64x32x64, 2 warps
    config(1, 4, 4, 2, 2),                           # 64x128x32
    config(1, 4, 4, 2, 4),                           # 64x128x64
    config(2, 4, 2, 2, 4),                           # 64x128x64, 8 warps
    config(2, 4, 2, 2, 2),                           # 64x128x32, 8 warps
    config(1, 2, 4, 4, 4, pipeline=1),               # 64x128x64, double buffer only
    config(1, 4, 4, 4, 2),                           # 64x256x32
    config(2, 2, 2, 2, 4, pipeline=3),               # 64x64x64, 3 stages
    config(2, 2, 2, 1, 4, pipeline=3),               # 64x32x64, 3 stages
]
MEDIUM_CONFIGS = [LARGE_CONFIGS[i] for i in (0, 3, 5, 7, 9, 16)]


def configs_for(name: str) -> list[Any]:
    problem = WORKLOADS[name]
    if problem.m <= 64:
        return SMALL_M_CONFIGS
    return MEDIUM_CONFIGS if name == "gemm2048_acc16" else LARGE_CONFIGS


def short(cfg: Any) -> str:
    """128x128x32 w2x4 f4x2 v8 p2 smem: the tile first, then how it is cut."""
    t = WmmaTile.of(cfg)
    return (f"{t.block_m}x{t.block_n}x{t.block_k} w{t.warps_m}x{t.warps_n} f{t.frags_m}x{t.frags_n} "
            f"v{t.vec} p{t.pipeline}{' smem-out' if t.out_smem else ''}")


# ---- worker process: builds, checks and times one config ----------------------------------
_CACHE: dict[str, Any] = {}


def _workload_data(name: str, ref_dir: str) -> tuple[Any, list[Any], np.ndarray]:
    """Device inputs and the float64 reference (computed once, by the parent, on disk)."""
    if name not in _CACHE:
        import tvm

        problem = WORKLOADS[name]
        inputs = problem.inputs(np.random.default_rng(0))
        dev = tvm.cuda(0)
        _CACHE.clear()  # one workload's buffers at a time
        _CACHE[name] = (dev, [tvm.runtime.tensor(x, dev) for x in inputs],
                        np.load(os.path.join(ref_dir, f"{name}.npy")))
    return _CACHE[name]


def run_config(name: str, values: dict[str, int], ref_dir: str, repeat: int) -> dict[str, Any]:
    import tvm

    from tvm_ext.schedules.gemm.tensor_core import compile_wmma
    from tvm_ext.target import resolve_target

    problem, cfg = WORKLOADS[name], TC_SPACE.make(**values)
    target = resolve_target("cuda", 0)
    reason = problem.reason(cfg, target)
    if reason:
        return {"skipped": reason}
    start = time.perf_counter()
    ex = compile_wmma(problem.schedule(cfg), cfg, target)
    build_s = time.perf_counter() - start
    dev, args, ref = _workload_data(name, ref_dir)
    out = tvm.runtime.empty(problem.out_shape(), problem.c, dev)
    func = ex.mod["main"]
    func(*args, out)
    dev.sync()
    err = float(np.max(np.abs(out.numpy().astype(np.float64) - ref)) / np.max(np.abs(ref)))
    timer = ex.mod.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=20)
    secs = statistics.median(timer(*args, out).results)
    return {"ms": secs * 1e3, "tflops": problem.flops() / secs / 1e12, "max_rel_err": err,
            "correct": err < problem.tolerance(), "build_s": build_s}


def run_torch(name: str) -> dict[str, Any]:
    """torch fp16 on the same shapes: matmul, addmm (bias) or baddbmm (batched bias)."""
    import torch

    problem = WORKLOADS[name]
    inputs = [torch.from_numpy(x).cuda() for x in problem.inputs(np.random.default_rng(0))]
    if problem.form == "gemm":
        fn = lambda: torch.matmul(inputs[0], inputs[1])  # noqa: E731
    elif problem.batch:
        bias = inputs[2][:, None, :]
        fn = lambda: torch.baddbmm(bias, inputs[0], inputs[1])  # noqa: E731
    else:
        fn = lambda: torch.addmm(inputs[2], inputs[0], inputs[1])  # noqa: E731
    secs = time_vendor(lambda i: fn()).best.seconds  # the vendor at its best of the three methods
    return {"ms": secs * 1e3, "tflops": problem.flops() / secs / 1e12}


# ---- parent ---------------------------------------------------------------------------------
class Worker:
    """One spawned process at a time; replaced after any failure (its CUDA context may be
    poisoned) or a timeout."""

    def __init__(self) -> None:
        self.pool: cf.ProcessPoolExecutor | None = None

    def call(self, fn: Any, *args: Any, timeout: float) -> dict[str, Any]:
        if self.pool is None:
            self.pool = cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        try:
            return self.pool.submit(fn, *args).result(timeout=timeout)
        except Exception as exc:  # a fault, a timeout, a compile error: data, not the end
            self.restart()
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
            return {"error": (text[-1] if text else type(exc).__name__)[:400]}

    def restart(self) -> None:
        if self.pool is not None:
            for proc in list(getattr(self.pool, "_processes", {}).values()):
                proc.kill()  # our own worker, by handle
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="", help="folder for tensor_core_probe.jsonl")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats (>= 20 ms each)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per config")
    args = parser.parse_args()
    names = [n for n in args.workloads.split(",") if n]
    records: list[dict[str, Any]] = []
    out_path = os.path.join(args.out, "tensor_core_probe.jsonl") if args.out else ""
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        open(out_path, "w").close()
    worker = Worker()
    tables = []
    t0 = time.time()
    with tempfile.TemporaryDirectory() as ref_dir:
        for name in names:
            problem = WORKLOADS[name]
            start = time.time()
            ref = problem.reference(problem.inputs(np.random.default_rng(0)))
            np.save(os.path.join(ref_dir, f"{name}.npy"), ref)
            print(f"== {name} {problem}: reference in {time.time() - start:.1f} s", flush=True)
            rows = []
            for cfg in configs_for(name):
                rec = {"workload": name, "problem": dataclasses.asdict(problem), "config": cfg.as_dict(),
                       "label": short(cfg)}
                rec.update(worker.call(run_config, name, cfg.as_dict(), ref_dir, args.repeat,
                                       timeout=args.timeout))
                records.append(rec)
                print(f"  {rec['label']}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                       for k, v in rec.items()
                                                       if k not in ("workload", "problem", "config", "label")),
                      flush=True)
                rows.append(_row(rec))
            rec = {"workload": name, "problem": dataclasses.asdict(problem), "config": None, "label": "torch fp16"}
            rec.update(worker.call(run_torch, name, timeout=args.timeout))
            records.append(rec)
            rows.append(_row(rec))
            print(f"  torch: {rec}", flush=True)
            if out_path:
                with open(out_path, "a") as f:
                    for r in records[-len(rows):]:
                        f.write(json.dumps(r) + "\n")
            tables.append(table(f"{name}: {problem.m}x{problem.n}x{problem.k}"
                                + (f" batch {problem.batch}" if problem.batch else "")
                                + f", acc {problem.acc}, out {problem.c}",
                                ["config", "ms", "TFLOP/s", "max rel err", "note"], rows))
    worker.restart()
    print(f"\nprobe took {time.time() - t0:.0f} s\n")
    print("\n\n".join(tables))


def _row(rec: dict[str, Any]) -> list[str]:
    if "ms" in rec:
        err = f"{rec['max_rel_err']:.2e}" if "max_rel_err" in rec else ""
        note = "" if rec.get("correct", True) else "WRONG"
        return [rec["label"], f"{rec['ms']:.3f}", f"{rec['tflops']:.1f}", err, note]
    return [rec["label"], "", "", "", rec.get("skipped") or rec.get("error", "")]


if __name__ == "__main__":
    main()
