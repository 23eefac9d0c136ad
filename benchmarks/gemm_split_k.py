"""Split K on the wgmma GEMM (knob ``wgmma_split_k``) at shapes whose output has few tiles, float16
and 3xTF32 float32, against cuBLAS at the same precision in the same run.

Run through the device tool (see ../shared/DEVICE.md), a few minutes on an H100:
    source .tvm-device/boot.sh && python benchmarks/gemm_split_k.py
For each shape and precision: cuBLAS (torch; float32 with TF32 off) timed call by call, back to
back on rotated randn operands and replayed from a CUDA graph (the baseline is its best); then
our kernel at the template's default, at the same tile without a split, and at a grid of tiles
and splits (the slices added by a second kernel, or by a thread-block cluster), each timed the
same three ways on the same operands (a split's kernels together), with its error against
float64 on NaN-poisoned outputs.  Prints a markdown table.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cublas_gemm, gemm_operand_sets, ours_on, shape_names, table, vendor_methods  # noqa: E402

from tvm_ext.schedules.gemm.gemm_3xtf32 import Gemm3xTf32Template  # noqa: E402
from tvm_ext.schedules.gemm.wgmma import WgmmaTile  # noqa: E402
from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402

SHAPES = {"bert_ffn_down": (1024, 768, 3072), "bert_proj": (1024, 768, 768), "bert_ffn_up": (1024, 3072, 768),
          "narrow": (512, 512, 8192), "4096": (4096, 4096, 4096)}
PRECISIONS = ("float16", "float32")
# (bm, bn, stages, inflight, raster, tiles a block) tried with each split of ``SPLITS``
TILES = ((128, 128, 6, 1, 0, 1), (128, 192, 4, 1, 0, 1), (128, 256, 4, 1, 0, 1), (64, 128, 6, 1, 0, 1),
         (128, 64, 6, 1, 0, 1), (64, 64, 8, 1, 0, 1))
SPLITS = (1, 2, 4, 8)  # (3 and 6 were slower than 2 and 4 at every shape of a first H100 sweep)


def candidates(template: Any, target: Any, operand: str) -> list[tuple[str, Any]]:
    """The default config, then every feasible tile x split of the grid (C stored directly)."""
    space = template.space(target)
    default = template.default_config(target)
    extra = {"tf_promote": default.tf_promote, "tf_promote_overlap": 0} if operand == "tf32" else {}
    out = [(f"default: {WgmmaTile.of(default, operand).name}", default)]
    for bm, bn, stages, inflight, raster, tiles in TILES:
        for split in SPLITS:
            for cluster in (False, True) if split > 1 else (False,):  # slices added by a second kernel or a cluster
                tile = WgmmaTile(bm, bn, stages, inflight, False, raster, tiles, split, cluster, operand)
                if operand == "tf32":  # promote within a slice: the default's period where it divides
                    steps = template.depth // tile.bk // split
                    extra = {"tf_promote": next(p for p in (extra["tf_promote"], 4, 2, 1) if steps % p == 0),
                             "tf_promote_overlap": 0}
                cfg = space.make(**tile.knobs(), **extra)
                if space.is_feasible(cfg) and cfg != default:
                    out.append((tile.name, cfg))
    return out


def shape_rows(m: int, n: int, k: int, precision: str, target: Any) -> list[list[str]]:
    """The table's rows of one shape at one precision."""
    import torch

    flops = 2.0 * m * n * k
    sets = gemm_operand_sets(m, n, k, precision)
    torch.backends.cuda.matmul.allow_tf32 = False
    vendor, vendor_err = cublas_gemm(sets)
    best = vendor.best.seconds

    def row(kernel: str, times: Any, err: float) -> list[str]:
        three = [f"{t.seconds * 1e6:.1f}" if t else "-" for _, t in vendor_methods(times)]
        return [f"{m}x{n}x{k}", precision, kernel, *three, f"{flops / times.best.seconds / 1e12:.0f}",
                f"{best / times.best.seconds:.2f}", f"{err:.1e}"]

    rows = [row("cuBLAS (the baseline)", vendor, vendor_err)]
    if precision == "float16":
        template, operand = WgmmaGemmTemplate(m, n, k, b_layout="KN"), "float16"
    else:
        template, operand = Gemm3xTf32Template(m, n, k), "tf32"
    for label, cfg in candidates(template, target, operand):
        times, err = ours_on(template, dict(cfg.items), target, sets)
        if not err < (1e-2 if precision == "float16" else 1e-4):  # a wrong kernel, not rounding
            raise SystemExit(f"error: {label} at {m}x{n}x{k} {precision} differs from float64 by {err:.1e}")
        rows.append(row(f"ours, {label}", times, err))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="bert_ffn_down,bert_proj,narrow",
                   help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help="float16, float32 (3xTF32) or both")
    args = p.parse_args()
    names = shape_names(args.shapes, list(SHAPES))
    precisions = [x for x in args.precisions.split(",") if x]
    if names is None:
        return 2
    if not precisions or any(x not in PRECISIONS for x in precisions):
        print(f"error: precisions are {', '.join(PRECISIONS)}, got {args.precisions!r}", file=sys.stderr)
        return 2
    target = resolve_target("cuda")
    rows = []
    for name in names:
        for precision in precisions:
            rows += shape_rows(*SHAPES[name], precision, target)
            print(f"{name} {precision} done", file=sys.stderr, flush=True)
    print(table("wgmma GEMM with K split (k/S: S slices) against cuBLAS at the same precision, rotated randn operands",
                ["shape", "precision", "kernel", "per call µs", "back-to-back µs", "CUDA graph µs", "TFLOP/s at best",
                 "of cuBLAS best", "rel err vs f64"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
