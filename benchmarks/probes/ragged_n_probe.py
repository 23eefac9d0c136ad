"""GEMMs whose N no tile divides (a classifier's 1000 classes, BERT's 30522-token vocabulary):
the wgmma pick (Bt stored (N, K), its last tile column guarded; where it stages C, also with C
stored directly) and the mma.sync pick (N padded) against cuBLAS and cuBLASLt, all replayed from
CUDA graphs on the same rotated operands, in interleaved rounds (the medians of the per-round
ratios), errors against float64.

    source .tvm-device/boot.sh && python benchmarks/probes/ragged_n_probe.py --out $OUT
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from common import (compare_in_rounds, cublas_launches, gemm_operand_sets, ours_launch, rounds_cells,  # noqa: E402
                    rounds_header, table)

from tvm_ext.schedules.gemm.mma import MmaGemmTemplate, MmaTile  # noqa: E402
from tvm_ext.schedules.gemm.wgmma import WgmmaTile  # noqa: E402
from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402

SHAPES = {"classifier": (8192, 1000, 1024), "bert_mlm_head": (1024, 30522, 768), "gpt2_head": (1024, 50258, 768)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"names of {sorted(SHAPES)}")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="bench_out")
    args = p.parse_args()
    names = args.shapes.split(",")
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise SystemExit(f"error: unknown shape {unknown[0]!r}; known: {', '.join(SHAPES)}")
    os.makedirs(args.out, exist_ok=True)
    target = resolve_target("cuda")
    rows, notes = [], []
    for name in names:
        m, n, k = SHAPES[name]
        shape = f"{name} {m}x{n}x{k}"
        sets = gemm_operand_sets(m, n, k, "float16")
        wgmma = WgmmaGemmTemplate(m, n, k)
        wgmma_config = wgmma.default_config(target)
        ours, err = ours_launch(wgmma, wgmma_config.as_dict(), target, sets)
        notes.append(f"{shape}: ours {WgmmaTile.of(wgmma_config).name}, error {err:.1e}")
        mma = MmaGemmTemplate(m, n, k, c_dtype="float16", allow_split_k=False)
        mma_config = mma.default_config(target)
        peer, peer_err = ours_launch(mma, mma_config.as_dict(), target, sets)
        notes.append(f"{shape}: mma.sync {MmaTile.of(mma_config).label()}, error {peer_err:.1e}")
        peers = {"mma.sync": peer}
        if wgmma_config.wgmma_smem_epilogue:  # C staged (N a multiple of 8): against the direct store too
            peers["wgmma, C stored directly"], direct_err = ours_launch(
                wgmma, wgmma_config.replace(wgmma_smem_epilogue=0).as_dict(), target, sets)
            notes.append(f"{shape}: wgmma, C stored directly, error {direct_err:.1e}")
        summaries, left_out = compare_in_rounds(shape, ours, cublas_launches(sets, lt=True), len(sets), args.rounds,
                                                os.path.join(args.out, "ragged_n_rounds.jsonl"), peers=peers)
        rows += [[shape, *rounds_cells(s)] for s in summaries]
        notes += [f"{shape}: {vendor} left out of the rounds: {why}" for vendor, why in left_out.items()]
    text = table("ragged N: wgmma (ours) and mma.sync against cuBLAS, interleaved rounds from CUDA graphs",
                 ["shape", *rounds_header()], rows)
    print(text + "\n\n" + "\n".join(notes), flush=True)
    with open(os.path.join(args.out, "ragged_n_probe.md"), "w") as f:
        f.write(text + "\n\n" + "\n".join(notes) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
