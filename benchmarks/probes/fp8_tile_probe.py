"""The 8-bit default's tiles side by side: the default, the default as it was without its wide
tile (128x128, promotions overlapped, warp-specialized), and the wide tile (128x192,
warp-specialized, promotions not overlapped, one C tile a block) where the default is not it;
every one promoting every k step (cuBLASLt's accuracy) and checked against float64 on
NaN-poisoned C, then in ``--rounds`` interleaved rounds against ``torch._scaled_mm``, all replayed
from CUDA graphs on the same rotated operands (the median of the per-round ratios, the SM clock
and power after each round).  Raw rounds in --out/fp8_tile_rounds.jsonl.
Usage: python benchmarks/probes/fp8_tile_probe.py [--shapes 8192,4096,4096x6144x4096] [--rounds 5]"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import (compare_in_rounds, rounds_cells, rounds_header, rows_by_shape,  # noqa: E402
                    table)
from gemm_fp8 import SHAPES, config_label, fp8_sets, ours  # noqa: E402

from tvm_ext.schedules.gemm.gemm_fp8 import Fp8GemmTemplate  # noqa: E402


class WithoutWide(Fp8GemmTemplate):
    """The template whose default never takes ``WIDE_TILE`` (the default before it)."""

    def _wide_config(self, *args: Any) -> None:
        return None


def configs(m: int, n: int, k: int, target: Any) -> dict[str, Any]:
    """Label -> config: the default, the default without the wide tile, the wide tile (each once)."""
    template = Fp8GemmTemplate(m, n, k)
    space = template.space(target)
    found = {"default": template.default_config(target), "without wide": WithoutWide(m, n, k).default_config(target)}
    wide = template.wide_config(space, 1)
    if wide is not None:
        found["wide"] = wide
    unique: dict[str, Any] = {}
    for label, cfg in found.items():
        if cfg not in unique.values():
            unique[label] = cfg
    return unique


def shape_rows(m: int, n: int, k: int, target: Any, args: argparse.Namespace) -> tuple[list, list]:
    import torch

    sets = fp8_sets(m, n, k)
    template = Fp8GemmTemplate(m, n, k)

    def scaled_mm(i: int) -> Any:
        s = sets[i]
        return torch._scaled_mm(s["a"], s["bt"].t(), scale_a=s["sa"], scale_b=s["sb"], out_dtype=torch.float16)

    launches, rows = {}, []
    for label, cfg in configs(m, n, k, target).items():
        launch, err = ours(template, cfg, target, sets)
        if not err < 1e-3:  # promoted sums: C's rounding only
            raise SystemExit(f"error: {label} at {m}x{n}x{k} differs from float64 by {err:.1e}")
        launches[label] = launch
        rows.append([f"{m}x{n}x{k}", label, config_label(template, cfg), f"{err:.1e}"])
    first, *others = launches
    summaries, left_out = compare_in_rounds(
        f"{m}x{n}x{k}", launches[first], {"cuBLASLt e4m3": scaled_mm}, len(sets), args.rounds,
        os.path.join(args.out, "fp8_tile_rounds.jsonl"), peers={o: launches[o] for o in others}, config=first)
    round_rows = [[f"{m}x{n}x{k}", first, *rounds_cells(s)] for s in summaries]
    round_rows += [[f"{m}x{n}x{k}", first, f"{v}: left out ({why})"] + ["-"] * 9 for v, why in left_out.items()]
    return rows, round_rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="8192,4096,4096x6144x4096,8192x11008x4096",
                   help=f"comma-separated: MxNxK, N for N³, or of {', '.join(SHAPES)}")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="bench_out")
    args = p.parse_args(argv)
    run = rows_by_shape(p, args, SHAPES, shape_rows)
    if run is None:
        return 2
    rows, round_rows = run
    print(table("e4m3 GEMM, sums promoted every k step: the configs compared", ["shape", "label", "config",
                                                                               "rel err vs f64"], rows))
    print()
    print(table(f"The default against torch._scaled_mm and the other configs in {args.rounds} interleaved rounds, "
                "all replayed from CUDA graphs", ["shape", "ours", *rounds_header()], round_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
