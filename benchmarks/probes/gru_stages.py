"""Where a GRU config's time goes on the GPU: each kernel function's share of one forward pass
(the runner's stage times) for the configs named on the command line, at one shape.

    source .tvm-device/boot.sh && python benchmarks/probes/gru_stages.py --batch 64 --hidden 1024 \
        --precision float16 --config '{"fuse_step": 1, "step_loop": 2, "step_tc": 1, ...}'
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from gru import SEQ, precision_of  # noqa: E402

from tvm_ext.measure.builder import build_one  # noqa: E402
from tvm_ext.measure.measure import MeasureSettings, measure  # noqa: E402
from tvm_ext.schedules.gru import GruTemplate  # noqa: E402
from tvm_ext.schedules.gemm.tensor_core_tile import parse_tile  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--seq", type=int, default=SEQ)
    p.add_argument("--precision", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--config", action="append", default=[], help="JSON knobs over the analytic pick (repeatable)")
    p.add_argument("--in-tile", action="append", default=[],
                   help="the input GEMM's tensor-core tile, in float32 the split GEMM's (parse_tile's k=v,... "
                        "text; repeatable: each with every --config)")
    args = p.parse_args()
    target = resolve_target("cuda", 0)
    template = GruTemplate(batch=args.batch, hidden=args.hidden, input=args.hidden, seq=args.seq)
    template = template.with_precision(precision_of(args.precision)).with_tensor_cores(target)
    pick = template.analytic_pick(target)[0]
    for tile in args.in_tile or [None]:
        # float32: the tile of the split input GEMM (in_split 1); 16-bit: of the input GEMM
        field = "in_split_tensor_core" if args.precision == "float32" else "in_tensor_core"
        tiled = template if tile is None else replace(template, **{field: parse_tile(tile)})
        for knobs in args.config or ["{}"]:
            cfg = pick.replace(**json.loads(knobs))
            label = f"input tile {getattr(tiled, field)}; {knobs}"
            refused = tiled.space(target).infeasible_reason(cfg)
            if refused:  # a config the space refuses is not built (it could only fail or time out)
                print(f"{label}: refused: {refused}")
                continue
            build = build_one(tiled, cfg, target)
            if not build.ok:
                print(f"{label}: {build.error_msg}")
                continue
            result = measure(tiled, cfg, build.artifact, target, MeasureSettings(warmup=2, repeat=5))
            stages = {k: f"{v * 1e3:.3f}" for k, v in result.metrics.get("stage_secs", {}).items()}
            shown = f"{result.cost * 1e3:.3f} ms" if result.ok else f"{result.error_kind}: {result.error_msg}"
            print(f"{label}: {shown}, stages ms {stages}, rel err {result.metrics.get('rel_error', float('nan')):.1e}",
                  flush=True)


if __name__ == "__main__":
    main()
