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


def grid(space) -> list:
    """Feasible configs of the sweep's grid at this shape."""
    configs = []
    for (bm, bn), stages, tiles, raster, split in itertools.product(TILES, (4, 6, 8), (1, 2), (0, 8), (1, 2)):
        if split > 1 and (bm, bn) != (64, 64):
            continue
        knobs = dict(wgmma_bm=bm, wgmma_bn=bn, wgmma_stages=stages, wgmma_inflight=1,
                     wgmma_smem_epilogue=int(split == 1), wgmma_raster=raster, wgmma_tiles=tiles,
                     wgmma_split_k=split, wgmma_split_cluster=0)
        try:
            config = space.make(**knobs)
        except Exception:  # noqa: BLE001 - a value the space does not offer
            continue
        if space.is_feasible(config):
            configs.append(config)
    return configs


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
        if args.picks:  # the pick against the first-wave rule it replaces where a problem is a wave or two
            first = pick_wgmma_tile([(m, n, k)], session.target, "float16", split_k=True, ragged_m=True)
            configs = [pick, space.make(**first.knobs())]
        else:
            configs = [pick] + [c for c in grid(space) if c != pick]
        if time.time() - start > args.max_seconds:
            break
        builds = session.builder.build(template, configs, session.target)
        results = run_all(session.runner, template, builds)
        measured = []
        for build, result in zip(builds, results):
            knobs = {kk.replace("wgmma_", ""): v for kk, v in build.config.as_dict().items()}
            measured.append({"knobs": knobs, "ms": min(result.costs) * 1e3 if result.ok else None,
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


if __name__ == "__main__":
    main()
