"""The wgmma GEMM's default pick (Bt stored (N, K), a ``Linear``'s weight) against the pick with one
of its rules turned off (``--without``), and against cuBLAS and cuBLASLt, in interleaved rounds,
all replayed from CUDA graphs on the same rotated operands, each checked against float64 on
NaN-poisoned C: how a pick rule is measured before it lands.  Raw rounds in
--out/wgmma_pick_rounds.jsonl.

    source .tvm-device/boot.sh && python benchmarks/probes/wgmma_pick_probe.py --out $OUT \\
        --shapes 1024x768x2048,1024x768x4096 --without narrow_whole_wave
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, Iterator

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import (compare_in_rounds, cublas_launches, gemm_operand_sets, ours_launch, parse_shapes,  # noqa: E402
                    rel_error_vs, rounds_cells, rounds_header, table)

# the pick's rules that ``--without`` can turn off (predicates of ``wgmma_template``)
RULES = ("narrow_whole_wave", "narrow_suits", "few_waves_problem")
SHAPES = "1024x768x1024,1024x768x2048,1024x768x3072,1024x768x4096"


@contextlib.contextmanager
def rule_off(name: str) -> Iterator[None]:
    """``wgmma_template``'s predicate ``name`` answering False while the block runs."""
    from tvm_ext.schedules.gemm import wgmma_template

    kept = getattr(wgmma_template, name)
    setattr(wgmma_template, name, lambda *args, **kwargs: False)
    try:
        yield
    finally:
        setattr(wgmma_template, name, kept)


def shape_rows(m: int, n: int, k: int, dtype: str, without: str, target: Any, rounds: int,
               out: str) -> tuple[list[list[str]], list[list[str]]]:
    """The configs' rows (label, tile, error) and the rounds' rows of one shape."""
    import torch

    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate

    template = WgmmaGemmTemplate(m, n, k, dtype=dtype)
    pick = template.default_config(target)
    with rule_off(without):
        before = template.default_config(target)
    sets = gemm_operand_sets(m, n, k, dtype)
    label = f"{dtype} {m}x{n}x{k}"
    launch, err = ours_launch(template, pick.as_dict(), target, sets)
    configs = [[label, "pick", template.tile(pick).name, f"{err:.2e}"]]
    peers = {}
    if before != pick:
        peers[f"without {without}"], before_err = ours_launch(template, before.as_dict(), target, sets)
        configs.append([label, f"without {without}", template.tile(before).name, f"{before_err:.2e}"])
    else:
        configs.append([label, f"without {without}", "the same config", "-"])
    a, b = sets[0]
    vendor_err = rel_error_vs(torch.matmul(a, b), a.double() @ b.double())
    configs.append([label, "cuBLAS", "torch.matmul", f"{vendor_err:.2e}"])
    summaries, left = compare_in_rounds(label, launch, cublas_launches(sets, lt=True), len(sets), rounds,
                                        os.path.join(out, "wgmma_pick_rounds.jsonl"), peers=peers)
    rows = [[label, *rounds_cells(s, scale=1e6, digits=2)] for s in summaries]
    rows += [[label, name, f"left out: {why}", *[""] * 8] for name, why in left.items()]
    return configs, rows


def main(argv: list[str] | None = None) -> int:
    from tvm_ext.target import resolve_target

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=SHAPES, help="MxNxK,... (Bt stored (N, K))")
    p.add_argument("--without", default=RULES[0], choices=RULES, help="the pick rule turned off for the peer")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"), help="A, Bt and C")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default="bench_out")
    args = p.parse_args(argv)
    if args.rounds < 1:
        print(f"error: --rounds must be at least 1, got {args.rounds}", file=sys.stderr)
        return 2
    shapes = parse_shapes(args.shapes, {})
    if shapes is None:
        return 2
    os.makedirs(args.out, exist_ok=True)
    target = resolve_target("cuda")
    configs, rows = [], []
    for _, (m, n, k) in shapes:
        c, r = shape_rows(m, n, k, args.dtype, args.without, target, args.rounds, args.out)
        configs += c
        rows += r
        print(table("rounds", ["shape", *rounds_header("us")], r), flush=True)
    print(table("The configs compared", ["shape", "label", "config", "rel err vs f64"], configs))
    print()
    print(table(f"The pick against the vendors and the pick without {args.without} in {args.rounds} interleaved "
                "rounds, all replayed from CUDA graphs", ["shape", *rounds_header("us")], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
