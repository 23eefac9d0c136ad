"""Every kind of GRU pick against float64 on the GPU: the picks over a grid of shapes (dtype, batch,
hidden, direction) grouped by the kernel their reason names and by whether their grid holds more
than a block an SM; of each group the shapes of the most and of the fewest blocks, those of more
than a block an SM first, run until --budget seconds are spent.  A pick is wrong where its error
passes ``BOUNDS``' figure for its dtype (several times the errors the picks measure), or where it raises.  One JSON line
a shape in $OUT/gru_pick_check.jsonl, the wrong ones listed at the end.

    source .tvm-device/boot.sh && python benchmarks/probes/gru_pick_check.py --budget 400
    python benchmarks/probes/gru_pick_check.py --shapes float32:192x256:bi --knobs step_tc_kw=4
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from probe_helpers import gru_weights  # noqa: E402
from tvm_ext.cost_model.hardware import HardwareModel  # noqa: E402
from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.schedules.gru import GRU, GruTemplate, gru_reference  # noqa: E402
from tvm_ext.target import TargetInfo, resolve_target  # noqa: E402

DTYPES = ("float32", "float16", "bfloat16")
BATCHES = (1, 3, 8, 16, 32, 48, 64, 96, 128, 192, 256)
HIDDENS = (128, 256, 384, 512, 768, 1024, 1536, 2048)
STORED = ("x", "w_ih", "gi", "w_hh", "h", "out")
BOUNDS = {"float32": 1e-5, "float16": 3e-3, "bfloat16": 2e-2}  # the picks measure 1e-7-1e-6 / 4e-4 / 4e-3


def template(dtype: str, batch: int, hidden: int, bidirectional: bool, seq: int, target: TargetInfo) -> GruTemplate:
    return GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=seq, bidirectional=bidirectional).with_precision(
        {name: dtype for name in STORED}).with_tensor_cores(target)


def grid_blocks(t: GruTemplate, cfg: object) -> int:
    """The step kernel's blocks where the pick has one (0 for the unfused steps)."""
    try:
        variant = t.step_variant(cfg)
    except Exception:  # noqa: BLE001 (the unfused steps have no step kernel)
        return 0
    shape = getattr(variant, "shape", variant)
    return int(getattr(shape, "blocks", 0) or 0)


def shapes_to_check(seq: int, target: TargetInfo, sm_count: int) -> list[tuple[str, int, int, bool]]:
    """Of each (kernel named by the pick's reason, more than a block an SM, float32 or not) group
    the shapes of the most and of the fewest blocks, the groups of more than a block an SM first."""
    groups: dict[tuple[str, bool, bool], list[tuple[int, tuple[str, int, int, bool]]]] = defaultdict(list)
    for dtype, batch, hidden, bi in itertools.product(DTYPES, BATCHES, HIDDENS, (False, True)):
        t = template(dtype, batch, hidden, bi, seq, target)
        cfg, why = t.analytic_pick(target)
        blocks = grid_blocks(t, cfg)
        kernel = re.sub(r"\d+", "#", why.split(";")[0])
        groups[(kernel, blocks > sm_count, dtype == "float32")].append((blocks, (dtype, batch, hidden, bi)))
    chosen: list[tuple[bool, tuple[str, int, int, bool]]] = []
    for (_, crowded, _), members in groups.items():
        members.sort()
        chosen += [(crowded, shape) for shape in dict.fromkeys((members[-1][1], members[0][1]))]
    return [shape for crowded, shape in sorted(chosen, key=lambda c: not c[0])]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--budget", type=float, default=400.0, help="seconds to spend (the rest of the shapes skipped)")
    p.add_argument("--shapes", default="", help="these instead: dtype:BATCHxHIDDEN[:bi],... (e.g. float32:192x256:bi)")
    p.add_argument("--knobs", default="", help="knob=value,... changed in each pick (configs no longer picked)")
    args = p.parse_args()
    target = resolve_target("cuda", 0)
    sm_count = HardwareModel.from_target(target).sm_count
    shapes = ([(d, int(bh.split("x")[0]), int(bh.split("x")[1]), bool(bi)) for d, bh, *bi in
               (item.split(":") for item in args.shapes.split(","))] if args.shapes
              else shapes_to_check(args.seq, target, sm_count))
    knobs = {k: int(v) for k, v in (item.split("=") for item in args.knobs.split(",") if item)}
    print(f"{len(shapes)} shapes", flush=True)
    start, wrong = time.monotonic(), []
    path = os.path.join(os.environ.get("OUT", "."), "gru_pick_check.jsonl")
    with open(path, "w") as f:
        for dtype, batch, hidden, bi in shapes:
            if time.monotonic() - start > args.budget:
                print("budget spent", flush=True)
                break
            rng = np.random.default_rng(0)
            t = template(dtype, batch, hidden, bi, args.seq, target)
            cfg, why = t.analytic_pick(target)
            cfg = cfg.replace(**knobs) if knobs else cfg
            w = gru_weights(rng, hidden, bi)
            x = rng.standard_normal((args.seq, batch, hidden)).astype(np.float32)
            row = {"dtype": dtype, "batch": batch, "hidden": hidden, "bidirectional": bi,
                   "blocks": grid_blocks(t, cfg), "why": why}
            try:
                gru = GRU(t, cfg, target, False, t.compile(cfg, target))
                gru.load_numpy(w)
                ref = gru_reference(x, w, None, 1, bi)
                row["errors"] = [relative_error(list(gru(x)), ref) for _ in range(3)]
                row["wrong"] = max(row["errors"]) > BOUNDS[dtype]
            except Exception as exc:  # noqa: BLE001 (a pick that fails is a row, not the end)
                row["failed"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                row["wrong"] = True
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(json.dumps({k: v for k, v in row.items() if k != "why"}), flush=True)
            if row["wrong"]:
                wrong.append(row)
    print(f"\n{len(wrong)} wrong:")
    for row in wrong:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
