"""Attention's batched float16 products on wgmma (the template's batch axis) against cuBLAS's
batched GEMM (torch.matmul on (batch, heads, ...) tensors) in the same run.

Run through the device tool (see ../shared/DEVICE.md), about two minutes on an H100:
    source .tvm-device/boot.sh && python benchmarks/attention_wgmma.py
For each shape (BERT-base at batch 8, sequence 128 and 512: the scores Q·Kᵀ with Kᵀ stored
(K, N), and the context P·V): torch.matmul timed call by call, back to back on rotated randn
operands and replayed from a CUDA graph (the baseline is its best); then our kernel at the
template's default tile and at a grid of tiles, timed the same three ways on the same operands,
with its error against float64 on NaN-poisoned outputs.  Prints a markdown table;
``--records FILE`` adds the best of a tuning run's records of each shape.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (l2_rotation, ours_on, rel_error_vs, shape_names, table, time_vendor,  # noqa: E402
                    vendor_methods)

from tvm_ext.core.records import RecordStore  # noqa: E402
from tvm_ext.schedules.gemm.wgmma import WgmmaTile  # noqa: E402
from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402
from tvm_ext.core.template import Workload  # noqa: E402

BATCH = (8, 12)  # BERT-base: batch 8, 12 heads
SHAPES = {"scores128": (128, 128, 64), "context128": (128, 64, 128), "scores512": (512, 512, 64),
          "context512": (512, 64, 512)}  # (M, N, K) of each (batch, head)
GRID = dict(bm=(64, 128), bn=(64, 128), stages=(3,), inflight=(1,), tiles=(1, 2))  # and both epilogues


def shape_rows(name: str, m: int, n: int, k: int, target: object, records: str | None) -> list[list[str]]:
    import torch

    matrices = BATCH[0] * BATCH[1]
    flops = 2.0 * m * n * k * matrices
    sets = [(torch.randn(*BATCH, m, k, device="cuda", dtype=torch.float16),
             torch.randn(*BATCH, k, n, device="cuda", dtype=torch.float16))
            for _ in range(l2_rotation(2 * matrices * (m * k + k * n + m * n)))]
    a, b = sets[0]
    ref = a.double() @ b.double()
    vendor = time_vendor(lambda i: torch.matmul(sets[i][0], sets[i][1]), len(sets))
    best = vendor.best.seconds

    def row(kernel: str, times: object, err: float) -> list[str]:
        three = [f"{t.seconds * 1e6:.1f}" if t else "-" for _, t in vendor_methods(times)]
        return [f"{name} {'x'.join(map(str, BATCH))} x {m}x{n}x{k}", kernel, *three,
                f"{flops / times.best.seconds / 1e12:.1f}", f"{best / times.best.seconds:.2f}", f"{err:.1e}"]

    rows = [row("cuBLAS batched (torch.matmul): the baseline", vendor, rel_error_vs(torch.matmul(a, b), ref))]
    template = WgmmaGemmTemplate(m, n, k, b_layout="KN", batch=BATCH)
    space = template.space(target)
    default = template.default_config(target)
    configs = {f"default {WgmmaTile.of(default).name}": default}
    if records:
        tuned = RecordStore(records).best(Workload.of(template, target).key)
        if tuned is not None:
            cfg = space.make(**tuned.config)
            configs[f"tuned {WgmmaTile.of(cfg).name}"] = cfg
    for bm, bn, stages, inflight, tiles in itertools.product(*GRID.values()):
        for smem in (0, 1):
            tile = WgmmaTile(bm, bn, stages, inflight, bool(smem), 0, tiles=tiles)
            cfg = space.make(**tile.knobs())
            if space.is_feasible(cfg) and cfg not in configs.values():
                configs[tile.name] = cfg
    results = []
    for label, cfg in configs.items():
        times, err = ours_on(template, dict(cfg.items), target, sets)
        if not err < 1e-2:  # a wrong kernel, not float16 rounding
            raise SystemExit(f"error: {label} at {name} differs from float64 by {err:.1e}")
        results.append((label, times, err))
    fixed = [r for r in results if r[0].startswith(("default", "tuned"))]
    grid = sorted((r for r in results if r not in fixed), key=lambda r: r[1].best.seconds)
    rows += [row(f"ours, {label}", times, err) for label, times, err in fixed + grid[:4]]
    print("\n".join(" | ".join(r) for r in rows), file=sys.stderr, flush=True)  # kept if a later shape fails
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--records", help="a tuning run's records (tune gemm-wgmma --batch 8,12 --b-layout kn)")
    args = p.parse_args()
    names = shape_names(args.shapes, list(SHAPES))
    if names is None:
        return 2
    target = resolve_target("cuda")
    rows = []
    for name in names:
        rows += shape_rows(name, *SHAPES[name], target, args.records)
    print(table("attention's batched float16 products: wgmma against cuBLAS batched, rotated randn operands "
                "(the four fastest of the grid shown)",
                ["shape", "kernel", "per call µs", "back-to-back µs", "CUDA graph µs", "TFLOP/s at best",
                 "of cuBLAS best", "rel err vs f64"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
