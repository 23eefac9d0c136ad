"""The warp-specialized wgmma kernel's C staged through a shared-memory stage of its own
(``wgmma_smem_epilogue`` 1 with ``wgmma_ws`` 1: 16-byte stores, whole rows a warp) against the
same config storing C straight from its registers, and the default pick, each checked against
float64 on NaN-poisoned C, then in interleaved rounds against the vendor (cuBLASLt's
``torch._scaled_mm`` for e4m3, cuBLAS and cuBLASLt for float16), all replayed from CUDA graphs on
the same rotated operands.  Where C's stage does not fit beside the config's stages, the staged
config takes the most stages that fit.  Raw rounds in --out/staged_epilogue_rounds.jsonl.

    source .tvm-device/boot.sh && python benchmarks/probes/staged_epilogue_probe.py --out $OUT
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import (compare_in_rounds, cublas_launches, gemm_operand_sets, ours_launch,  # noqa: E402
                    rounds_cells, rounds_header, table)

FP8_SHAPES = "4096x4096x4096,8192x8192x8192"
F16_SHAPES = "4096x4096x4096,8192x8192x8192,1024x768x3072,1024x768x768"


def variants(template: Any, space: Any, pick: Any, tiles: list[tuple[int, int, int]],
             multicast: bool = False) -> dict[str, Any]:
    """Label -> config: the pick (and where it is warp-specialized, the same not); the pick (and
    each of ``tiles``: bm, bn, stages, raster, one C tile a block) warp-specialized storing C from its
    registers; the same staged through its own C stage (fewer stages where C's does not fit), and
    through a 64-row stage its two consumer warpgroups take in turn (``wgmma_c_turns``); with
    ``multicast`` each staged config also in clusters of two sharing an operand's tile
    (``wgmma_multicast``).  Infeasible ones are left out."""
    found = {"pick": pick}
    if pick.wgmma_ws and space.is_feasible(pick.replace(wgmma_ws=0)):
        found["the pick not warp-specialized"] = pick.replace(wgmma_ws=0)
    bases = {"": pick, **{f"{bm}x{bn} s{st}{f' r{raster}' if raster else ''} ": pick.replace(
        wgmma_bm=bm, wgmma_bn=bn, wgmma_stages=st, wgmma_tiles=1, wgmma_raster=raster) for bm, bn, st, raster in tiles}}
    for name, base in bases.items():
        direct = base.replace(wgmma_ws=1, wgmma_tma=1, wgmma_smem_epilogue=0, wgmma_split_k=1,
                              wgmma_split_cluster=0)
        if space.is_feasible(direct):
            found[f"{name}ws, C from registers"] = direct
        for turns, how in ((0, "staged"), (1, "staged in turn")):  # the whole tile's C, or 64 rows in turn
            for stages in sorted((s for s in space.knob("wgmma_stages").choices if s <= direct.wgmma_stages),
                                 reverse=True):
                staged = direct.replace(wgmma_smem_epilogue=1, wgmma_stages=stages, wgmma_c_turns=turns)
                if space.is_feasible(staged):
                    found[f"{name}ws, C {how} (s{stages})"] = staged
                    if multicast and space.is_feasible(staged.replace(wgmma_multicast=1)):
                        found[f"{name}ws, C {how} (s{stages}), multicast"] = staged.replace(wgmma_multicast=1)
                    break
    unique: dict[str, Any] = {}
    for label, cfg in found.items():
        if cfg not in unique.values():
            unique[label] = cfg
    return unique


def parse_tile(text: str) -> tuple[int, int, int, int]:
    """'64x96s10r2' -> (64, 96, 10, 2): bm, bn, stages and raster (0 where no 'r' is given)."""
    found = re.fullmatch(r"(\d+)x(\d+)s(\d+)(?:r(\d+))?", text)
    if not found:
        raise ValueError(text)
    bm, bn, stages, raster = found.groups()
    return int(bm), int(bn), int(stages), int(raster or 0)


def compared(label: str, template: Any, target: Any, sets: list, launch_of: Any, vendors: dict, rounds: int,
             out: str, tiles: list, multicast: bool = False) -> tuple[list, list]:
    """Each of ``variants``' configs launched (``launch_of(cfg) -> (launch, error)``) and checked
    against float64, then the pick against ``vendors`` and the others in interleaved rounds."""
    launches, rows = {}, []
    for name, cfg in variants(template, template.space(target), template.default_config(target), tiles,
                              multicast).items():
        launch, err = launch_of(cfg)
        if not err < 1e-3:
            raise SystemExit(f"error: {name} at {label} differs from float64 by {err:.1e}")
        launches[name] = launch
        rows.append([label, name, template.tile(cfg).name, f"{err:.1e}"])
    first, *others = launches
    summaries, left_out = compare_in_rounds(label, launches[first], vendors, len(sets), rounds,
                                            os.path.join(out, "staged_epilogue_rounds.jsonl"),
                                            peers={o: launches[o] for o in others})
    return rows, [[label, *rounds_cells(s)] for s in summaries] + \
        [[label, f"{v}: left out ({why})"] + ["-"] * 9 for v, why in left_out.items()]


def fp8_rows(shape: str, target: Any, rounds: int, out: str, tiles: list, multicast: bool) -> tuple[list, list]:
    import torch
    from gemm_fp8 import fp8_sets, ours

    from tvm_ext.schedules.gemm.gemm_fp8 import Fp8GemmTemplate

    m, n, k = (int(x) for x in shape.split("x"))
    template = Fp8GemmTemplate(m, n, k)
    sets = fp8_sets(m, n, k)

    def scaled_mm(i: int) -> Any:
        s = sets[i]
        return torch._scaled_mm(s["a"], s["bt"].t(), scale_a=s["sa"], scale_b=s["sb"], out_dtype=torch.float16)

    return compared(f"e4m3 {shape}", template, target, sets, lambda cfg: ours(template, cfg, target, sets),
                    {"cuBLASLt e4m3": scaled_mm}, rounds, out, tiles, multicast)


def f16_rows(shape: str, target: Any, rounds: int, out: str, tiles: list, multicast: bool) -> tuple[list, list]:
    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate

    m, n, k = (int(x) for x in shape.split("x"))
    template = WgmmaGemmTemplate(m, n, k)
    sets = gemm_operand_sets(m, n, k, "float16")
    return compared(f"float16 {shape}", template, target, sets,
                    lambda cfg: ours_launch(template, cfg.as_dict(), target, sets),
                    cublas_launches(sets, lt=True), rounds, out, tiles, multicast)


def main(argv: list[str] | None = None) -> int:
    from tvm_ext.target import resolve_target

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fp8-shapes", default=FP8_SHAPES, help="MxNxK,... ('' for none)")
    p.add_argument("--f16-shapes", default=F16_SHAPES, help="MxNxK,... ('' for none)")
    p.add_argument("--tiles", default="", help="more tiles to compare both ways, bm x bn s stages [r raster]: "
                                                "64x96s8,64x96s10r2,... (raster groups: multicast shares Bt's tile)")
    p.add_argument("--multicast", action="store_true", help="each staged config also in clusters of two sharing "
                                                            "an operand's tile by TMA multicast")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="bench_out")
    args = p.parse_args(argv)
    if args.rounds < 1:
        print(f"error: --rounds must be at least 1, got {args.rounds}", file=sys.stderr)
        return 2
    try:
        tiles = [parse_tile(t) for t in filter(None, args.tiles.split(","))]
    except ValueError:
        print(f"error: --tiles takes bm x bn s stages [r raster] (64x96s8, 64x96s10r2), got {args.tiles!r}",
              file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    target = resolve_target("cuda")
    rows, round_rows = [], []
    for kind, shapes in ((fp8_rows, args.fp8_shapes), (f16_rows, args.f16_shapes)):
        for shape in filter(None, shapes.split(",")):
            r, rr = kind(shape, target, args.rounds, args.out, tiles, args.multicast)
            rows += r
            round_rows += rr
            print(table("configs", ["shape", "label", "config", "rel err vs f64"], r), flush=True)
            print(table("rounds", ["shape", *rounds_header()], rr), flush=True)
    print(table("The configs compared", ["shape", "label", "config", "rel err vs f64"], rows))
    print()
    print(table(f"The pick against the vendor and the other configs in {args.rounds} interleaved rounds, all "
                "replayed from CUDA graphs", ["shape", *rounds_header()], round_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
