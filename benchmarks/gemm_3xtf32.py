"""float32 GEMM at float32 accuracy on the TF32 tensor cores (``tune gemm-3xtf32``, three TF32
products) against cuBLAS's float32 GEMM (torch, TF32 off) in the same run.

Run through the device tool (see ../shared/DEVICE.md), about a minute on an H100:
    source .tvm-device/boot.sh && python benchmarks/gemm_3xtf32.py
For each shape: cuBLAS float32 timed call by call, back to back on rotated randn operands and
replayed from a CUDA graph (the baseline is its best); cuBLAS with TF32 allowed the same ways,
beside it with its error (faster, a thousand times less accurate: not the baseline); then our
program (both splits and the GEMM, every call) at the template's default tile and a few other
tiles, timed the same three ways on the same operands, with its error against float64 on
NaN-poisoned outputs.  Then the stable comparison: the default tile, with its promotions
overlapped, and loaded by the TMA from three stored parts and from two read in turn
(``tf_parts``), against cuBLAS float32 in
``--rounds`` interleaved rounds, both replayed from CUDA graphs on the same operands, the SM
clock and power read after each (raw rounds in --out/gemm_3xtf32_rounds.jsonl); the last
table quotes the median of the per-round ratios first.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (compare_in_rounds, cublas_gemm, gemm_operand_sets, ours_launch, ours_on,  # noqa: E402
                    rounds_cells, rounds_header, rows_by_shape, table, time_ours_three, vendor_methods)

from tvm_ext.core.space import Config  # noqa: E402
from tvm_ext.schedules.gemm.gemm_3xtf32 import Gemm3xTf32Template  # noqa: E402
from tvm_ext.schedules.gemm.wgmma import WgmmaTile  # noqa: E402

SHAPES = {"4096": (4096, 4096, 4096), "8192": (8192, 8192, 8192), "2048": (2048, 2048, 2048),
          "gru_in": (8192, 3072, 1024), "bert_ffn_up": (1024, 3072, 768), "bert_ffn_down": (1024, 768, 3072),
          "bert_proj": (1024, 768, 768)}  # BERT-base at batch 8, sequence 128
# other tiles tried beside the default (bm, bn, stages, inflight, raster, tiles a block, promote)
VARIANTS = ((128, 256, 4, 1, 8, 4, 0), (128, 128, 6, 1, 8, 8, 0), (128, 128, 6, 1, 8, 8, 1), (128, 128, 6, 1, 8, 8, 2),
            (128, 128, 6, 1, 8, 8, 8), (128, 128, 4, 1, 8, 8, 4), (128, 128, 6, 0, 8, 8, 4), (128, 128, 6, 1, 8, 4, 4),
            # narrow outputs (BERT's 768 columns): fewer, wider tiles against the most tiles
            (64, 192, 4, 0, 4, 1, 2), (64, 192, 4, 1, 4, 1, 4), (64, 128, 6, 1, 4, 1, 4), (128, 64, 6, 1, 4, 1, 4),
            (128, 128, 6, 1, 4, 1, 4), (128, 192, 4, 1, 4, 1, 4), (64, 64, 8, 1, 8, 1, 4))


def shape_rows(m: int, n: int, k: int, target: object, args: argparse.Namespace
               ) -> tuple[list[list[str]], list[list[str]]]:
    """The table's rows of one shape (cuBLAS float32, cuBLAS TF32, and ours at each tile) and
    the rounds table's rows (the default tile against cuBLAS float32)."""
    import torch

    flops = 2.0 * m * n * k
    sets = gemm_operand_sets(m, n, k)
    torch.backends.cuda.matmul.allow_tf32 = False
    vendor, vendor_err = cublas_gemm(sets)
    best = vendor.best.seconds

    def row(kernel: str, times: object, err: float) -> list[str]:
        three = [f"{t.seconds * 1e3:.3f}" if t else "-" for _, t in vendor_methods(times)]
        return [f"{m}x{n}x{k}", kernel, *three, f"{flops / times.best.seconds / 1e12:.1f}",
                f"{best / times.best.seconds:.2f}", f"{err:.1e}"]

    rows = [row("cuBLAS float32 (TF32 off): the baseline", vendor, vendor_err)]
    torch.backends.cuda.matmul.allow_tf32 = True
    rows.append(row("cuBLAS with TF32 allowed (not float32-accurate)", *cublas_gemm(sets)))
    torch.backends.cuda.matmul.allow_tf32 = False
    template = Gemm3xTf32Template(m, n, k)
    default = template.default_config(target)
    space = template.space(target)
    def name(cfg: Config) -> str:
        return (f"{WgmmaTile.of(cfg, 'tf32').name} p{cfg.tf_promote}{' overlap' * cfg.tf_promote_overlap}"
                f"{' two parts' * (cfg.tf_parts == 2)}")

    configs = [(f"default {name(default)}", default)]
    # in the rounds beside the default: its promotions overlapped, and its tile loaded by the TMA
    # with three stored parts and with two read in turn
    in_rounds = [default.replace(tf_promote_overlap=1 - default.tf_promote_overlap),
                 default.replace(wgmma_tma=1, tf_parts=3), default.replace(wgmma_tma=1, tf_parts=2)]
    candidates = [*in_rounds, in_rounds[0].replace(wgmma_tma=1 - in_rounds[0].wgmma_tma)]
    for bm, bn, stages, inflight, raster, tiles, promote in VARIANTS if args.variants else ():
        tile = WgmmaTile(bm, bn, stages, inflight, False, raster, tiles, operand="tf32")  # unsplit
        candidates.append(space.make(**tile.knobs(), tf_promote=promote, tf_promote_overlap=0))
    for cfg in candidates:
        if cfg != default and space.is_feasible(cfg) and cfg not in [c for _, c in configs]:
            configs.append((name(cfg), cfg))
    round_rows, peers = [], {}
    for label, cfg in configs:
        if cfg == default or cfg in in_rounds:
            launch, err = ours_launch(template, dict(cfg.items), target, sets)
            times = time_ours_three(launch, len(sets))
            if cfg == default:
                ours = launch
            else:
                peers[label] = launch
        else:
            times, err = ours_on(template, dict(cfg.items), target, sets)
        if not err < 1e-3:  # a wrong kernel, not rounding
            raise SystemExit(f"error: {label} at {m}x{n}x{k} differs from float64 by {err:.1e}")
        rows.append(row(f"ours 3xTF32, {label}", times, err))
    summaries, left_out = compare_in_rounds(
        f"{m}x{n}x{k}", ours, {"cuBLAS float32": lambda i: sets[i][0] @ sets[i][1]}, len(sets),
        args.rounds, os.path.join(args.out, "gemm_3xtf32_rounds.jsonl"), peers=peers, config=configs[0][0])
    round_rows += [[f"{m}x{n}x{k}", *rounds_cells(s)] for s in summaries]
    round_rows += [[f"{m}x{n}x{k}", f"{v}: left out ({why})"] + ["-"] * 9 for v, why in left_out.items()]
    return rows, round_rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4096,8192,2048",
                   help=f"comma-separated: MxNxK (e.g. 1024x768x3072), N for N³, or of {', '.join(SHAPES)}")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the default tile against cuBLAS")
    p.add_argument("--no-variants", dest="variants", action="store_false",
                   help="leave out the other tiles (the rounds' configs only)")
    p.add_argument("--out", default="bench_out", help="folder of the raw rounds (JSON lines)")
    args = p.parse_args()
    run = rows_by_shape(p, args, SHAPES, shape_rows)
    if run is None:
        return 2
    rows, round_rows = run
    print(table("float32 GEMM: 3xTF32 on wgmma against cuBLAS float32, rotated randn operands",
                ["shape", "kernel", "per call ms", "back-to-back ms", "CUDA graph ms", "TFLOP/s at best",
                 "of cuBLAS float32 best", "rel err vs f64"], rows))
    print()
    print(table(f"Stable comparison: 3xTF32 (default tile) against cuBLAS float32 in {args.rounds} interleaved "
                "rounds, both replayed from CUDA graphs on the same operands", ["shape", *rounds_header()], round_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
