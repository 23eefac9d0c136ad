"""The 16-bit GRU step's hidden GEMM (B x 3H x H, W_hh warm in L2 as it is from step to step) as
a plain wgmma GEMM on the cell form's tiles (64 or 128 rows x 96 columns, warp-specialized, TMA,
launched early), W_hh read as stored (B (K, N): three 64-byte boxes a k step) against W_hh
transposed (Bt (N, K): one 128-byte box), and cuBLAS on the same operands: how much of a step
the GEMM takes, and whether W_hh's layout is what holds it back.  Every side back to back and
replayed from a CUDA graph on one operand set (L2 warm), checked against float64.

    source .tvm-device/boot.sh && python benchmarks/probes/gru_hidden_gemm_probe.py --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

SHAPES = "96x6144x2048,192x4608x1536,256x6144x2048"
# label -> (rows, stages, B layout, multicast, columns, K slices): K whole behind a producer warpgroup,
# K in slices added in a cluster (the cell forms 2, 3 and 5)
TILES = {"64x96 s8 B(K,N)": (64, 8, "KN", 0, 96, 1), "64x96 s8 Bt(N,K)": (64, 8, "NK", 0, 96, 1),
         "128x96 s6 B(K,N)": (128, 6, "KN", 0, 96, 1), "128x96 s6 Bt(N,K)": (128, 6, "NK", 0, 96, 1),
         "64x96 s8 Bt(N,K) multicast": (64, 8, "NK", 1, 96, 1), "64x192 s6 Bt(N,K)": (64, 6, "NK", 0, 192, 1),
         "128x192 s4 Bt(N,K)": (128, 4, "NK", 0, 192, 1), "64x96 s8 Bt(N,K) k/2": (64, 8, "NK", 0, 96, 2),
         "128x96 s6 Bt(N,K) k/2": (128, 6, "NK", 0, 96, 2), "192x96 s6 Bt(N,K) k/2": (192, 6, "NK", 0, 96, 2),
         "192x96 s5 Bt(N,K) k/2": (192, 5, "NK", 0, 96, 2)}


def main() -> None:
    from common import cublas_gemm, methods_text, ours_launch, seconds_by_method, time_ours_three
    from probe_helpers import full_a_box

    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate
    from tvm_ext.target import resolve_target

    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=SHAPES, help="MxNxK,...")
    p.add_argument("--tiles", default=";".join(TILES), help="labels of TILES, separated by semicolons")
    p.add_argument("--full-box", action="store_true",
                   help="each tile also loading A's whole tile where M is below one (the code before "
                        "KernelLayout.a_box_rows), labelled 'full box'")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    tiles = {label: TILES[label] for label in args.tiles.split(";")}
    boxes = {"": False, " full box": True} if args.full_box else {"": False}
    import torch

    target = resolve_target("cuda", 0)
    rows = []
    for text in args.shapes.split(","):
        m, n, k = (int(v) for v in text.split("x"))
        sets = [(torch.randn(m, k, device="cuda", dtype=torch.float16) * 0.1,
                 torch.randn(k, n, device="cuda", dtype=torch.float16) * 0.1)]
        vendor, vendor_err = cublas_gemm(sets)
        row = {"shape": text, "cuBLAS": seconds_by_method(vendor), "cuBLAS_err": vendor_err}
        print(f"[{text}] cuBLAS {methods_text(vendor)} err {vendor_err:.1e}", flush=True)
        for label, (bm, stages, layout, multicast, bn, split) in tiles.items():
            template = WgmmaGemmTemplate(m, n, k, b_layout=layout)
            space = template.space(target)
            cfg = template.default_config(target).replace(
                wgmma_bm=bm, wgmma_bn=bn, wgmma_stages=stages, wgmma_inflight=1, wgmma_smem_epilogue=0,
                wgmma_raster=0, wgmma_tiles=1, wgmma_split_k=split, wgmma_split_cluster=int(split > 1), wgmma_tma=1,
                wgmma_ws=int(split == 1), wgmma_multicast=multicast, wgmma_pdl=1)
            reason = space.infeasible_reason(cfg)
            if reason:
                print(f"[{text}] {label}: refused: {reason}", flush=True)
                continue
            for suffix, full in boxes.items():
                try:
                    with full_a_box(full):
                        launch, err = ours_launch(template, cfg.as_dict(), target, sets)
                    times = time_ours_three(launch, len(sets))
                except Exception as exc:  # noqa: BLE001 (a config that does not run is a row)
                    print(f"[{text}] {label}{suffix}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                    continue
                row[label + suffix] = {"s": seconds_by_method(times), "err": err}
                print(f"[{text}] {label}{suffix}: {methods_text(times)} err {err:.1e}", flush=True)
        rows.append(row)
    with open(os.path.join(args.out, "gru_hidden_gemm_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)
    labels = ["cuBLAS", *(label + suffix for label in tiles for suffix in boxes)]
    print("\n| M x N x K | " + " | ".join(f"{label} µs" for label in labels) + " |")
    print("|---|" + "---|" * len(labels))
    for row in rows:
        cells = []
        for label in labels:
            s = row.get(label)
            s = s if label == "cuBLAS" else (s or {}).get("s")
            best = min((v for v in (s or {}).values() if v), default=None)
            cells.append(f"{best * 1e6:.2f}" if best else "-")
        print(f"| {row['shape']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
