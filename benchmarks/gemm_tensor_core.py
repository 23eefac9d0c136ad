"""Tensor-core GEMM on the GPU: ``python -m tvm_ext.tune gemm-tc`` (the GA over WMMA tiles, with
the XGBoost predictor) against cuBLAS float16 (torch) in the same run.

Run through the device tool (see ../shared/DEVICE.md):
    source .tvm-device/boot.sh && python benchmarks/gemm_tensor_core.py --out $OUT
For each size: the zero-measurement pick (``--strategy analytic``), then the tuning run
(which resumes the pick from the same records file), both through the CLI's own code;
then torch.matmul on float16 operands (float16 result, as ours: A, B, C float16, float32
accumulation).  Prints a markdown table last; records go to --out.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import l2_rotation, rel_error_vs, table, time_vendor, vendor_methods  # noqa: E402

from tvm_ext import tune  # noqa: E402
from tvm_ext.records import RecordStore  # noqa: E402
from tvm_ext.schedules.tensor_core import TensorCoreGemmTemplate, WmmaTile  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402
from tvm_ext.template import Workload  # noqa: E402


def cublas_fp16(n: int) -> tuple[Any, float]:
    """cuBLAS float16 per call, back to back and from a CUDA graph on rotated operands, and
    its error vs float64 (of the float16 operands)."""
    import torch

    sets = [tuple(torch.randn(n, n, device="cuda", dtype=torch.float16) for _ in range(2))
            for _ in range(l2_rotation(3 * 2 * n * n))]
    times = time_vendor(lambda i: sets[i][0] @ sets[i][1], len(sets))
    a, b = sets[0]
    return times, rel_error_vs(a @ b, a.double() @ b.double())


def tile_label(config: dict) -> str:
    t = WmmaTile(*(config[k] for k in ("tc_warps_m", "tc_warps_n", "tc_frags_m", "tc_frags_n", "tc_k_frags",
                                       "tc_vec", "tc_pipeline", "tc_out_smem")))
    return f"{t.block_m}x{t.block_n}x{t.block_k} {t.warps}w p{t.pipeline}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="4096,2048")
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--population", type=int, default=12)
    p.add_argument("--out", default="bench_out")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    target = resolve_target("cuda")
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        records = os.path.join(args.out, f"gemm_tc_{n}.jsonl")
        common = ["gemm-tc", "--shape", f"{n},{n},{n}", "--out-dtype", "float16", "--target", "cuda",
                  "--records", records, "--no-progress"]
        tune.main(common + ["--strategy", "analytic"])
        pick = [r for r in RecordStore(records) if r.ok]
        code = tune.main(common + ["--generations", str(args.generations), "--population", str(args.population),
                                   "--cost-model", "xgb"])
        template = TensorCoreGemmTemplate(n, n, n, c_dtype="float16")
        recs = RecordStore(records).for_workload(Workload.of(template, target).key)
        ok = [r for r in recs if r.ok]
        if not ok:
            rows.append([f"{n}³", "-", "-", "-", "-", "-", "-", "-", "-", f"{len(recs)} (all failed)", "-", "-",
                         str(code)])
            continue
        best = min(ok, key=lambda r: r.cost)
        trials_to_best = next(i for i, r in enumerate(recs, 1) if r is best)
        times, vendor_err = cublas_fp16(n)
        vendor = times.best.seconds  # cuBLAS at its best of the three methods
        tflops = lambda s: template.flops() / s / 1e12  # noqa: E731
        shown = [f"{t.seconds * 1e3:.3f} ({tflops(t.seconds):.0f})" if t else method
                 for method, t in vendor_methods(times)]
        err = best.metrics.get("rel_error")
        rows.append([f"{n}³", *shown, f"{vendor_err:.1e}",
                     f"{pick[0].cost * 1e3:.3f} ({tflops(pick[0].cost):.0f})" if pick else "-",
                     f"{best.cost * 1e3:.3f} ({tflops(best.cost):.0f})", f"{err:.1e}" if err is not None else "-",
                     tile_label(best.config), f"{len(recs)} ({len(recs) - len(ok)} failed)", str(trials_to_best),
                     f"{vendor / best.cost:.2f}", str(code)])
        print(rows[-1], flush=True)
    print(table("Tensor-core GEMM (float16 A, B, C; float32 accumulation) vs cuBLAS float16",
                ["size", "cuBLAS fp16 per call ms (TFLOP/s)", "cuBLAS back-to-back", "cuBLAS CUDA graph",
                 "cuBLAS rel err vs f64", "analytic pick ms (TFLOP/s)", "tuned ms (TFLOP/s)", "tuned rel err vs f64",
                 "tuned tile", "configs measured", "trial of the best", "cuBLAS best / tuned", "CLI exit"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
