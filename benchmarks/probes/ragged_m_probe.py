"""A wgmma config at an M its tile does not divide: the bare GEMM and the Relax model's fused
GELU(x·Wᵀ+b) with that config, at ragged and aligned M, next to torch (cuBLAS) on the same shape,
to tell the kernel's cost of the guarded last tile row from the model's.

    source .tvm-device/boot.sh && python benchmarks/probes/ragged_m_probe.py --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

CONFIGS = {  # tiles as the buckets benchmark's tuning chose them (2026-11-28, H200), rasters that divide
    "128x256 r4 t2": dict(wgmma_bm=128, wgmma_bn=256, wgmma_inflight=1, wgmma_raster=4, wgmma_smem_epilogue=1,
                          wgmma_split_cluster=0, wgmma_split_k=1, wgmma_stages=4, wgmma_tiles=2, wgmma_tma=0,
                          wgmma_ws=0, wgmma_multicast=0, wgmma_pdl=0, wgmma_wg_cols=1, wgmma_c_turns=0, wgmma_wg_k=1),
    "64x64 s8": dict(wgmma_bm=64, wgmma_bn=64, wgmma_inflight=1, wgmma_raster=0, wgmma_smem_epilogue=1,
                     wgmma_split_cluster=0, wgmma_split_k=1, wgmma_stages=8, wgmma_tiles=1, wgmma_tma=0,
                     wgmma_ws=0, wgmma_multicast=0, wgmma_pdl=0, wgmma_wg_cols=1, wgmma_c_turns=0, wgmma_wg_k=1),
}


def gemm_ms(m: int, n: int, k: int, knobs: dict) -> float:
    import tvm

    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    t = WgmmaGemmTemplate(m, n, k)
    program = t.build_program(t.space(target).make(**knobs), target)
    dev = tvm.cuda(0)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal(s.shape).astype(s.dtype), dev) for s in t.inputs()]
    c = tvm.runtime.tensor(np.zeros(t.outputs()[0].shape, np.float16), dev)
    f = program.executable.mod.time_evaluator("main", dev, number=100, repeat=5)
    return float(np.median(f(*args, c).results)) * 1e3


def model_ms(m: int, knobs: dict) -> tuple[float, str]:
    from buckets import symbolic_module

    from tvm_ext.relax.buckets import borrow_schedules, call_sites, specialize
    from tvm_ext.relax.pipeline import CompiledModel, apply_tuned, schedule_rest
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    static = specialize(symbolic_module(768, "float16"), "n", m)
    tuned = apply_tuned(static, target, None, None)
    name = call_sites(tuned)[0]
    tuned, how = borrow_schedules(tuned, target, {name: [(0, knobs)]})
    model = CompiledModel(schedule_rest(tuned, target, None), target, None)
    x = np.random.default_rng(m).standard_normal((m, 768)).astype(np.float16)
    return model.time(x) * 1e3, how[name]


def torch_ms(m: int, n: int, k: int) -> tuple[float, float]:
    """torch's GEMM (cuBLAS) and Linear + GELU on the same shape, each at its best of per call,
    back to back and from a CUDA graph (``common.time_vendor``)."""
    import torch
    from common import seconds_by_method, time_vendor

    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, device="cuda", dtype=torch.float16)
    gemm = time_vendor(lambda i: a @ w.t())
    linear_gelu = time_vendor(lambda i: torch.nn.functional.gelu(torch.nn.functional.linear(a, w, b)))
    def best_ms(times: Any) -> float:
        return min(s for s in seconds_by_method(times).values() if s is not None) * 1e3

    return best_ms(gemm), best_ms(linear_gelu)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="probe_out")
    p.add_argument("--sizes", default="1500,1536,2048,700,768,200,256")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for m in (int(s) for s in args.sizes.split(",")):
        row = {"m": m}
        row["torch_gemm_ms"], row["torch_linear_gelu_ms"] = torch_ms(m, 3072, 768)
        for name, knobs in CONFIGS.items():
            try:
                row[f"gemm_{name}_ms"] = gemm_ms(m, 3072, 768, knobs)
                row[f"model_{name}_ms"], row[f"model_{name}_how"] = model_ms(m, knobs)
            except Exception as exc:  # noqa: BLE001
                row[f"{name}_error"] = str(exc).strip().splitlines()[-1][:200]
        print(json.dumps(row), flush=True)
        with open(os.path.join(args.out, "ragged_m_probe.jsonl"), "a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
