"""The float16 wgmma GEMM's tile, pipeline depth, tiles a block and raster swept at medium shapes
(BERT-base's three, token counts no tile divides), against the analytic pick and cuBLAS in the
same process: the evidence for the pick's rules where a problem is a wave or two of tiles.

Every config is built and measured by the tuner's own builder and runner (a records file under
--out, so a rerun resumes); cuBLAS on the same shape is timed after them as every GEMM benchmark
times it (``common.cublas_gemm``: per call, back to back and from a CUDA graph, the best).
``--picks``: the pick and the first-wave rule it replaced only.  Rows go to
--out/wgmma_pick_sweep.jsonl, one per shape.

    source .tvm-device/boot.sh && python benchmarks/probes/wgmma_pick_sweep.py --out $OUT
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

SHAPES = "1024x768x768,1024x3072x768,1024x768x3072,700x3072x768,1500x768x768,1500x3072x768,200x3072x768"
TILES = ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256))
WIDE_TILES = ((64, 128), (128, 64), (128, 128), (128, 192), (128, 256), (256, 128), (256, 192))


def feasible(space, knob_sets) -> list:
    """The configs of ``knob_sets`` the space offers and finds feasible at this shape (a set that
    leaves a knob out is an error of the grid, not a value the space does not offer)."""
    configs = []
    for knobs in knob_sets:
        if missing := set(space.names) - set(knobs):
            raise ValueError(f"the grid leaves out {sorted(missing)}")
        try:
            config = space.make(**knobs)
        except Exception:  # noqa: BLE001 - a value the space does not offer
            continue
        if space.is_feasible(config):
            configs.append(config)
    return configs


def knob_set(bm: int, bn: int, stages: int, *, split: int = 1, cluster: int = 0, tma: int = 0, ws: int = 0,
             raster: int = 0, tiles: int = 1, wg_cols: int = 1) -> dict:
    """A grid point's knobs: one wgmma group in flight, C through shared memory where K is unsplit
    and the warps are not specialized (those store from registers), no multicast, no early launch."""
    return dict(wgmma_bm=bm, wgmma_bn=bn, wgmma_stages=stages, wgmma_inflight=1,
                wgmma_smem_epilogue=int(split == 1 and not ws), wgmma_raster=raster, wgmma_tiles=tiles,
                wgmma_split_k=split, wgmma_split_cluster=cluster, wgmma_tma=tma, wgmma_ws=ws, wgmma_multicast=0,
                wgmma_pdl=0, wgmma_wg_cols=wg_cols, wgmma_c_turns=0, wgmma_wg_k=1)


def wide_grid(space) -> list:
    """Feasible configs of the wider grid at this shape: K split 1-6 (in a cluster, or through
    global memory at 2), every tile up to 256x192, TMA or ``cp.async`` loads, one tile a block."""
    return feasible(space, (
        knob_set(bm, bn, stages, split=split, cluster=cluster, tma=tma)
        for (bm, bn), stages, (split, cluster), tma in itertools.product(
            WIDE_TILES, (4, 6), ((1, 0), (2, 0), (2, 1), (3, 1), (4, 1), (6, 1)), (0, 1))))


NARROW_TILES = ((64, 96), (128, 96), (64, 192), (128, 192), (192, 96), (256, 96))


def narrow_grid(space) -> list:
    """Feasible configs of tiles 96 or 192 columns wide (cuBLAS's at BERT-base's 768-column
    outputs): K split 1-4 in a cluster, 4-8 stages, TMA loads, warp-specialized or not."""
    return feasible(space, (
        knob_set(bm, bn, stages, split=split, cluster=int(split > 1), tma=1, ws=ws)
        for (bm, bn), stages, split, ws in itertools.product(NARROW_TILES, (4, 6, 8), (1, 2, 3, 4), (0, 1))))


COLUMN_TILES = ((64, 96), (64, 128), (64, 192), (64, 256))


def columns_grid(space) -> list:
    """Feasible warp-specialized configs of 64-row tiles with one consumer warpgroup or two
    splitting the columns (``wgmma_wg_cols``, cuBLAS's 384 threads on a 64x96 tile): 4-8 stages,
    row-major or rastered by 2."""
    return feasible(space, (
        knob_set(bm, bn, stages, tma=1, ws=1, raster=raster, wg_cols=cols)
        for (bm, bn), stages, raster, cols in itertools.product(COLUMN_TILES, (4, 6, 8), (0, 2), (1, 2))))


def grid(space) -> list:
    """Feasible configs of the sweep's grid at this shape (``cp.async`` loads)."""
    return feasible(space, (
        knob_set(bm, bn, stages, split=split, raster=raster, tiles=tiles)
        for (bm, bn), stages, tiles, raster, split in itertools.product(TILES, (4, 6, 8), (1, 2), (0, 8), (1, 2))
        if split == 1 or (bm, bn) == (64, 64)))


def cublas_ms(m: int, n: int, k: int) -> float:
    """cuBLAS (torch's ``a @ b``) at its best of per call, back to back and from a CUDA graph, on
    rotated operands (``common.cublas_gemm``)."""
    from common import cublas_gemm, gemm_operand_sets, seconds_by_method

    times, _ = cublas_gemm(gemm_operand_sets(m, n, k, "float16"))
    return min(s for s in seconds_by_method(times).values() if s is not None) * 1e3


def main() -> None:
    from tvm_ext.core.session import Session, SessionOptions
    from tvm_ext.measure.runner import run_all
    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate, pick_wgmma_tile

    p = argparse.ArgumentParser()
    p.add_argument("--out", default="probe_out")
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--max-seconds", type=float, default=420)
    p.add_argument("--picks", action="store_true",
                   help="only the pick and the pick without few_waves (the first-wave rule), no sweep")
    p.add_argument("--grid", choices=("tiles", "wide", "narrow", "columns"), default="tiles",
                   help="tiles: tile, depth, tiles a block, raster; wide: K split in clusters and TMA loads too; "
                        "narrow: tiles 96 or 192 columns wide, warp-specialized or not, K split in clusters; "
                        "columns: 64-row warp-specialized tiles, their columns split over two consumer "
                        "warpgroups or not")
    p.add_argument("--rounds", type=int, default=0,
                   help="then the pick and the sweep's --top fastest against cuBLAS and cuBLASLt in this many "
                        "interleaved rounds, each replayed from a CUDA graph (common.compare_in_rounds)")
    p.add_argument("--top", type=int, default=3)
    p.add_argument("--pdl", action="store_true",
                   help="every config of the grid launched early behind the kernel ahead (wgmma_pdl 1), as the "
                        "picks are")
    p.add_argument("--before", default=None,
                   help="a JSON file {shape: knobs} of an earlier pick: only the pick and it, no sweep (with "
                        "--rounds, the earlier pick is the peer)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    session = Session(SessionOptions(target="cuda", workers=16, build_timeout=300,
                                     records=os.path.join(args.out, "sweep_records.jsonl")))
    start, rows = time.time(), []
    for shape in args.shapes.split(","):
        m, n, k = (int(x) for x in shape.split("x"))
        template = WgmmaGemmTemplate(m, n, k)
        space = template.space(session.target)
        pick = template.default_config(session.target)
        if args.before:  # the pick against an earlier pick (knobs saved from the code before a change)
            with open(args.before) as fh:
                configs = [pick, space.make(**json.load(fh)[shape])]
        elif args.picks:  # the pick against the first-wave rule it replaces where a problem is a wave or two
            first = pick_wgmma_tile([(m, n, k)], session.target, "float16", split_k=True, ragged_m=True)
            configs = [pick, space.make(**first.knobs())]
        else:
            swept = {"wide": wide_grid, "narrow": narrow_grid, "tiles": grid, "columns": columns_grid}[args.grid](space)
            if args.pdl:
                swept = [c.replace(wgmma_pdl=1) for c in swept]
            configs = [pick] + [c for c in swept if c != pick]
        if time.time() - start > args.max_seconds:
            break
        builds = session.builder.build(template, configs, session.target)
        results = run_all(session.runner, template, builds)
        measured = []
        for build, result in zip(builds, results):
            knobs = {kk.replace("wgmma_", ""): v for kk, v in build.config.as_dict().items()}
            measured.append({"knobs": knobs, "config": build.config.as_dict(),
                             "ms": min(result.costs) * 1e3 if result.ok else None,
                             "error": "" if result.ok else str(result.error_kind.value)})
        rows.append({"shape": shape, "pick": measured[0], "configs": measured})
        ok = sorted((r for r in measured if r["ms"]), key=lambda r: r["ms"])
        print(shape, "pick", measured[0]["ms"], "best", ok[0] if ok else None, flush=True)
    session.close()
    for row in rows:
        m, n, k = (int(x) for x in row["shape"].split("x"))
        row["cublas_ms"] = cublas_ms(m, n, k)
        with open(os.path.join(args.out, "wgmma_pick_sweep.jsonl"), "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(row["shape"], "cuBLAS", row["cublas_ms"], flush=True)
        if args.rounds:
            print(in_rounds(row, args.rounds, args.top, args.out), flush=True)


def in_rounds(row: dict, rounds: int, top: int, out: str) -> str:
    """The pick (ours) and the sweep's ``top`` fastest (peers) against cuBLAS and cuBLASLt in
    interleaved rounds on the same rotated operands; the medians of the per-round ratios."""
    from common import compare_in_rounds, cublas_launches, gemm_operand_sets, ours_launch

    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate
    from tvm_ext.target import resolve_target

    m, n, k = (int(x) for x in row["shape"].split("x"))
    template, target = WgmmaGemmTemplate(m, n, k), resolve_target("cuda")
    sets = gemm_operand_sets(m, n, k, "float16")
    ours, err = ours_launch(template, row["pick"]["config"], target, sets)
    fastest = sorted((c for c in row["configs"][1:] if c["ms"]), key=lambda c: c["ms"])[:top]
    peers, lines = {}, [f"{row['shape']}: pick {row['pick']['knobs']} error {err:.1e}"]
    for i, c in enumerate(fastest):
        peers[f"top{i + 1}"], peer_err = ours_launch(template, c["config"], target, sets)
        lines.append(f"  top{i + 1} {c['knobs']} error {peer_err:.1e}")
    summaries, left_out = compare_in_rounds(row["shape"], ours, cublas_launches(sets, lt=True), len(sets), rounds,
                                            os.path.join(out, "wgmma_sweep_rounds.jsonl"), peers=peers)
    lines += [f"  {s.vendor}: median {s.median:.3f}" for s in summaries]
    lines += [f"  {name} left out: {why}" for name, why in left_out.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
