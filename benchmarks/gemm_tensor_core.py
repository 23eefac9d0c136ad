"""Tensor-core GEMM on the GPU: ``python -m tvm_ext.tune gemm-tc`` (the GA over the kernel,
mma.sync or WMMA, and its tile) against cuBLAS float16 (torch) in the same run.

Run through the device tool (see ../shared/DEVICE.md), about 7 minutes on an H100:
    source .tvm-device/boot.sh && python benchmarks/gemm_tensor_core.py --out $OUT
For each shape (float16 A, B and C, float32 accumulation): the zero-measurement pick
(``--strategy analytic``), then the tuning run (which resumes the pick from the same records
file), both through the CLI's own code; then torch.matmul on the same dtypes, timed call by
call, back to back on rotated inputs and replayed from a CUDA graph, compared at its best.
Prints a markdown table last; records go to --out.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import table  # noqa: E402
from vendor_timing import rotation_sets, vendor_times  # noqa: E402

from tvm_ext import tune  # noqa: E402
from tvm_ext.records import RecordStore  # noqa: E402
from tvm_ext.schedules.mma import MmaGemmTemplate, MmaTile  # noqa: E402
from tvm_ext.schedules.tensor_core import TensorCoreGemmTemplate, WmmaTile  # noqa: E402
from tvm_ext.schedules.tensor_core_choice import TensorCoreChoiceTemplate  # noqa: E402
from tvm_ext.space import Config  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402
from tvm_ext.template import Workload  # noqa: E402

SHAPES = {"4096": (4096, 4096, 4096), "8192": (8192, 8192, 8192), "2048": (2048, 2048, 2048),
          "gru_in": (8192, 3072, 1024), "gru_hid": (64, 3072, 1024), "gru_hid8": (8, 1536, 512)}
LABELS = {"4096": "4096³", "8192": "8192³", "2048": "2048³", "gru_in": "GRU input 8192x3072x1024",
          "gru_hid": "GRU hidden 64x3072x1024", "gru_hid8": "GRU hidden 8x1536x512"}
TEMPLATES = {"any": TensorCoreChoiceTemplate, "mma": MmaGemmTemplate, "wmma": TensorCoreGemmTemplate}


def cublas_fp16(m: int, n: int, k: int) -> dict[str, float]:
    import torch

    sets = rotation_sets(2 * (m * k + k * n + m * n))
    data = [(torch.randn(m, k, device="cuda", dtype=torch.float16),
             torch.randn(k, n, device="cuda", dtype=torch.float16)) for _ in range(sets)]
    return vendor_times([lambda a=a, b=b: a @ b for a, b in data])


def label(template: Any, config: dict) -> str:
    """The tile of a record's config: '128x128x32 w2x2 s4 swz fb2 r0 smem k1' or 'wmma 128x256x32 8w p2'."""
    cfg = Config.of(config)
    kernel = "mma"
    if isinstance(template, TensorCoreChoiceTemplate):
        kernel, cfg = template.kernel_config(cfg)
    elif isinstance(template, TensorCoreGemmTemplate):
        kernel = "wmma"
    if kernel == "mma":
        return "mma " + MmaTile.of(cfg).label()
    t = WmmaTile.of(cfg)
    return f"wmma {t.block_m}x{t.block_n}x{t.block_k} {t.warps}w p{t.pipeline}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated subset of {', '.join(SHAPES)}")
    p.add_argument("--kernel", default="any", choices=tuple(TEMPLATES))
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--population", type=int, default=12)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--out", default="bench_out")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    target = resolve_target("cuda")
    rows = []
    for name in args.shapes.split(","):
        m, n, k = SHAPES[name]
        template = TEMPLATES[args.kernel](m, n, k, c_dtype="float16")
        flops = template.flops()
        records = os.path.join(args.out, f"gemm_tc_{name}.jsonl")
        common = ["gemm-tc", "--shape", f"{m},{n},{k}", "--out-dtype", "float16", "--target", "cuda", "--kernel",
                  args.kernel, "--records", records, "--no-progress", "--workers", str(args.workers)]
        start = time.time()
        tune.main(common + ["--strategy", "analytic"])
        pick = [r for r in RecordStore(records) if r.ok]
        code = tune.main(common + ["--generations", str(args.generations), "--population", str(args.population)])
        wall = time.time() - start
        recs = RecordStore(records).for_workload(Workload.of(template, target).key)
        ok = [r for r in recs if r.ok]
        vendor = cublas_fp16(m, n, k)
        best_cublas = f"{vendor['best'] * 1e3:.4f} ({flops / vendor['best'] / 1e12:.0f})"
        modes = "/".join(f"{vendor[mode] * 1e3:.4f}" for mode in ("per_call", "back_to_back", "graph"))
        if not ok:
            rows.append([LABELS[name], best_cublas, modes, "-", "-", "-", f"{len(recs)} (all failed)", "-",
                         f"{wall:.0f}", str(code)])
            continue
        best = min(ok, key=lambda r: r.cost)
        trial_of_best = next(i for i, r in enumerate(recs, 1) if r is best)

        def cell(rec: Any) -> str:
            return f"{rec.cost * 1e3:.4f} ({flops / rec.cost / 1e12:.0f}, {vendor['best'] / rec.cost:.2f})"

        rows.append([LABELS[name], best_cublas, modes, cell(pick[0]) if pick else "-", cell(best),
                     label(template, best.config), f"{len(recs)} ({len(recs) - len(ok)} failed)", str(trial_of_best),
                     f"{wall:.0f}", str(code)])
        print(rows[-1], flush=True)
    print(table("Tensor-core GEMM (float16 A, B, C; float32 accumulation) vs cuBLAS float16",
                ["shape", "cuBLAS ms (TFLOP/s), best mode", "cuBLAS per call / back to back / graph ms",
                 "analytic pick ms (TFLOP/s, of cuBLAS)", "tuned ms (TFLOP/s, of cuBLAS)", "tuned config",
                 "configs measured", "trial of the best", "tuning s", "CLI exit"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
