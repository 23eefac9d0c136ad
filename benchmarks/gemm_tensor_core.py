"""Tensor-core GEMM on the GPU: ``python -m tvm_ext.tune gemm-tc`` (the GA over the kernel,
mma.sync, WMMA or on Hopper wgmma, and its tile) against cuBLAS float16 (torch) in the same run.

Run through the device tool (see ../shared/DEVICE.md), about 7 minutes on an H100:
    source .tvm-device/boot.sh && python benchmarks/gemm_tensor_core.py --out $OUT
For each shape (float16 A, B and C, float32 accumulation): the zero-measurement pick
(``--strategy analytic``), then the tuning run (which resumes the pick from the same records
file), both through the CLI's own code; then torch.matmul on the same dtypes, timed call by
call, back to back on rotated inputs and replayed from a CUDA graph, compared at its best.
The tuned config is then built again and timed the same three ways on cuBLAS's own operands
(tensor-core clocks depend on the data: the tuner's figure, on its uniform inputs, is shown
beside it but is not the comparison).  Prints a markdown table last; records go to --out.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cublas_gemm, gemm_operand_sets, ours_on, table, vendor_methods  # noqa: E402

from tvm_ext import tune  # noqa: E402
from tvm_ext.records import RecordStore  # noqa: E402
from tvm_ext.schedules.mma import MmaGemmTemplate, MmaTile  # noqa: E402
from tvm_ext.schedules.tensor_core import TensorCoreGemmTemplate  # noqa: E402
from tvm_ext.schedules.tensor_core_choice import TensorCoreChoiceTemplate  # noqa: E402
from tvm_ext.space import Config  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402
from tvm_ext.schedules.wgmma import WgmmaTile  # noqa: E402
from tvm_ext.schedules.wmma import WmmaTile  # noqa: E402
from tvm_ext.template import Workload  # noqa: E402

SHAPES = {"4096": (4096, 4096, 4096), "8192": (8192, 8192, 8192), "2048": (2048, 2048, 2048),
          "gru_in": (8192, 3072, 1024), "gru_hid": (64, 3072, 1024), "gru_hid8": (8, 1536, 512)}
LABELS = {"4096": "4096³", "8192": "8192³", "2048": "2048³", "gru_in": "GRU input 8192x3072x1024",
          "gru_hid": "GRU hidden 64x3072x1024", "gru_hid8": "GRU hidden 8x1536x512"}
TEMPLATES = {"any": TensorCoreChoiceTemplate, "mma": MmaGemmTemplate, "wmma": TensorCoreGemmTemplate}


def ours_cell(ours: Any, vendor: Any, flops: float) -> str:
    """'per call / back-to-back / graph ms (TFLOP/s at our best; best/best and graph/graph
    ratios to cuBLAS)'."""
    three = " / ".join(f"{t.seconds * 1e3:.4f}" if t else "-" for _, t in vendor_methods(ours))
    graphs = f", graph/graph {vendor.graph.seconds / ours.graph.seconds:.2f}" if ours.graph and vendor.graph else ""
    return f"{three} ({flops / ours.best.seconds / 1e12:.0f}; best/best {vendor.best.seconds / ours.best.seconds:.2f}" \
           f"{graphs})"


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
    if kernel == "wgmma":
        return WgmmaTile.of(cfg).name
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
        sets = gemm_operand_sets(m, n, k, "float16")
        times, vendor_err = cublas_gemm(sets)
        vendor = times.best.seconds  # cuBLAS at its best of the three methods
        shown = [f"{t.seconds * 1e3:.4f} ({flops / t.seconds / 1e12:.0f})" if t else method
                 for method, t in vendor_methods(times)]
        if not ok:
            rows.append([LABELS[name], *shown, f"{vendor_err:.1e}", "-", "-", "-", "-", "-", "-",
                         f"{len(recs)} (all failed)", "-", f"{wall:.0f}", str(code)])
            continue
        best = min(ok, key=lambda r: r.cost)
        trial_of_best = next(i for i, r in enumerate(recs, 1) if r is best)

        def cell(rec: Any, flops: float = flops, vendor: float = vendor) -> str:
            return f"{rec.cost * 1e3:.4f} ({flops / rec.cost / 1e12:.0f}, {vendor / rec.cost:.2f})"

        try:
            ours, ours_err = ours_on(template, best.config, target, sets)
            same = ours_cell(ours, times, flops)
            same_err = f"{ours_err:.1e}"
        except Exception as exc:  # reported in the table, never the end of the run
            text = [line for line in str(exc).strip().splitlines() if line.strip()]
            same, same_err = f"failed: {(text[-1] if text else type(exc).__name__)[:80]}", "-"
        err = best.metrics.get("rel_error")
        rows.append([LABELS[name], *shown, f"{vendor_err:.1e}", cell(pick[0]) if pick else "-", cell(best),
                     same, same_err if same_err != "-" else (f"{err:.1e}" if err is not None else "-"),
                     label(template, best.config),
                     f"{len(recs)} ({len(recs) - len(ok)} failed)", str(trial_of_best), f"{wall:.0f}", str(code)])
        print(rows[-1], flush=True)
    print(table("Tensor-core GEMM (float16 A, B, C; float32 accumulation) vs cuBLAS float16",
                ["shape", "cuBLAS per call ms (TFLOP/s)", "cuBLAS back-to-back", "cuBLAS CUDA graph",
                 "cuBLAS rel err vs f64", "analytic pick ms (TFLOP/s, of cuBLAS best), tuner's inputs",
                 "tuned ms, tuner's inputs",
                 "tuned on cuBLAS's operands: per call / back-to-back / graph ms (TFLOP/s; of cuBLAS)",
                 "tuned rel err vs f64", "tuned config", "configs measured",
                 "trial of the best", "analytic + tuning s", "CLI exit"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
