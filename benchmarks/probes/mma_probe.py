"""mma.sync GEMM probe: hand-picked and random feasible configs per shape, built in parallel and
measured by the project's runner (float64 check, NaN-poisoned outputs), next to cuBLAS fp16
timed three ways in the same run.

    source .tvm-device/boot.sh && python benchmarks/probes/mma_probe.py --out $OUT
Records go to --out (one JSON-lines file per shape); prints one table per shape last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import table  # noqa: E402
from common import (l2_rotation, methods_text, rel_error_vs, seconds_by_method, time_ours_three,  # noqa: E402
                    time_vendor, tvm_launch)

from tvm_ext.schedules.gemm.mma import AUTO_TILES, MMA_SPACE, MmaGemmTemplate, MmaTile  # noqa: E402
from tvm_ext.core.session import Session, SessionOptions  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402

SHAPES = {"4096": (4096, 4096, 4096), "8192": (8192, 8192, 8192), "2048": (2048, 2048, 2048),
          "gru_in": (8192, 3072, 1024), "gru_hid": (64, 3072, 1024), "gru_hid8": (8, 1536, 512),
          # a speech model's output layer (29 classes: N padded) and front end (80 features: K padded)
          "speech_head": (8192, 29, 1024), "speech_front": (8192, 1024, 80),
          # the head with its weight padded to 32 columns (``relax_rewrites``: narrow_padded_columns)
          "speech_head32": (8192, 32, 1024)}


def variations(base: Any) -> list[Any]:
    """The base config and one-knob changes of it (what each knob is worth there)."""
    out = [base]
    for knob, values in (("mma_swizzle", (0, 1)), ("mma_stages", (2, 3, 4)), ("mma_frag_buffers", (1, 2)),
                         ("mma_raster", (0, 4, 8)), ("mma_out_smem", (0, 1)), ("mma_split_k", (1, 2, 4, 8)),
                         ("mma_k_frags", (2, 4))):
        out += [base.replace(**{knob: v}) for v in values if v != base[knob]]
    return out


def _tile(warps: tuple[int, int], frags: tuple[int, int], k_frags: int, stages: int, **changes: int) -> Any:
    """A config of the template's space (a value outside a knob's choices is refused)."""
    return MMA_SPACE.make(**{**AUTO_TILES[0].as_dict(), "mma_warps_m": warps[0], "mma_warps_n": warps[1],
                             "mma_frags_m": frags[0], "mma_frags_n": frags[1], "mma_k_frags": k_frags,
                             "mma_stages": stages, **changes})


# Large tiles around the first probe's leaders (128x128x32 4 stages, 128x256x64): deeper k
# stages, 8-warp blocks with 64x32 / 32x64 warp tiles, rasterized grids.
FOCUS = [
    _tile((2, 2), (4, 4), 4, 3), _tile((2, 2), (4, 4), 4, 2), _tile((2, 2), (4, 4), 2, 4, mma_raster=8),
    _tile((2, 2), (4, 4), 4, 3, mma_raster=8), _tile((2, 2), (4, 4), 2, 4, mma_frag_buffers=1),
    _tile((2, 4), (4, 2), 2, 4), _tile((2, 4), (4, 2), 4, 3), _tile((4, 2), (2, 4), 4, 3),
    _tile((2, 4), (4, 4), 4, 3, mma_raster=8), _tile((4, 2), (4, 4), 2, 3), _tile((4, 2), (4, 4), 4, 2),
    _tile((2, 2), (4, 4), 2, 4, mma_out_smem=0), _tile((1, 4), (8, 2), 2, 4), _tile((4, 1), (2, 8), 2, 4),
]

# Narrow tiles for an N of 32 or less: 2-8 warps along M, one warp column
NARROW = [_tile((4, 1), (1, 2), 4, 4, mma_swizzle=1), _tile((4, 1), (2, 2), 4, 4), _tile((2, 1), (1, 2), 4, 4),
          _tile((4, 1), (1, 2), 2, 4)]


def cublas_fp16(m: int, n: int, k: int) -> Any:
    """cuBLAS float16 per call, back to back and from a CUDA graph, on rotated operands."""
    import torch

    sets = [(torch.randn(m, k, device="cuda", dtype=torch.float16),
             torch.randn(k, n, device="cuda", dtype=torch.float16))
            for _ in range(l2_rotation(2 * (m * k + k * n + m * n)))]
    return time_vendor(lambda i: sets[i][0] @ sets[i][1], len(sets))


def describe(times: Any, flops: float) -> str:
    """'0.186 ms (738 TFLOP/s, CUDA graph; per call 0.206, back-to-back 0.188, CUDA graph 0.186)'."""
    best = times.best
    return (f"{best.seconds * 1e3:.3f} ms ({flops / best.seconds / 1e12:.0f} TFLOP/s, {best.method}; "
            f"{methods_text(times)})")


def in_graph(template: Any, config: Any, target: Any) -> tuple[Any, float]:
    """``config`` built again and timed the vendor's three ways (the graph capturing TVM's
    launches), on rotated operands; with its error against float64 (NaN-poisoned output)."""
    import torch
    import tvm

    program = template.build_program(config, target)
    if not program.single_function:
        raise ValueError("a program of several calls: not timed in a graph here")
    func = program.executable.mod["main"]
    specs = template.inputs() + template.outputs() + template.scratch()
    sets = l2_rotation(sum(2 * int(np.prod(s.shape)) for s in specs))
    buffers = [[torch.randn(s.shape, device="cuda").to(getattr(torch, s.dtype)) for s in specs] for _ in range(sets)]
    args = [[tvm.runtime.from_dlpack(t) for t in b] for b in buffers]
    out = len(template.inputs())  # the output's position among the buffers
    buffers[0][out].fill_(float("nan"))
    func(*args[0])
    ref = template.reference([t.double().cpu().numpy() for t in buffers[0][:out]])[0]
    err = rel_error_vs(buffers[0][out], ref)
    return time_ours_three(tvm_launch(func, args, [b[out] for b in buffers]), sets), err


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4096,gru_hid,gru_hid8")
    p.add_argument("--random", type=int, default=4, help="random feasible configs per shape, besides the hand-picked")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--focus", action="store_true", help="also the FOCUS tiles (large shapes)")
    p.add_argument("--no-variations", dest="variations", action="store_false",
                   help="not the one-knob changes of the default config")
    p.add_argument("--graph", type=int, default=0,
                   help="the N fastest configs of each shape built again and timed three ways, "
                   "from a CUDA graph too (kernels of a few microseconds: a loop measures the host)")
    p.add_argument("--out", default="bench_out")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    target = resolve_target("cuda")
    tables = []
    for name in args.shapes.split(","):
        m, n, k = SHAPES[name]
        template = MmaGemmTemplate(m, n, k, c_dtype="float16", allow_split_k=bool(n % 32 == 0 and k % 32 == 0))
        options = SessionOptions(target="cuda", workers=args.workers, build_timeout=300, run_timeout=120,
                                 records=os.path.join(args.out, f"mma_probe_{name}.jsonl"))  # a file per shape
        with Session(options, target=target) as session:
            tuner = session.tuner(template)
            default = template.default_config(target)
            configs = variations(default) if args.variations else [default]
            configs += [c for c in list(AUTO_TILES) + (FOCUS if args.focus else []) + (NARROW if n <= 32 else [])
                        if c not in configs]
            space = tuner.space
            configs += [space.decode(r) for r in space.random_feasible_indices(np.random.default_rng(0), args.random)]
            feasible = [c for c in configs if space.is_feasible(c)]
            start = time.time()
            tuner.evaluate(feasible)
            wall = time.time() - start
            vendor = cublas_fp16(m, n, k)
            rows, measured = [], []
            for config in feasible:
                rec = tuner.record_of(config)
                if rec is None:
                    continue
                if rec.ok:
                    measured.append((rec.cost, config))
                speed = f"{template.flops() / rec.cost / 1e12:.0f}" if rec.ok else rec.error_kind
                rows.append((rec.cost if rec.ok else float("inf"), [
                    MmaTile.of(config).label(), f"{rec.cost * 1e3:.4f}" if rec.ok else "-", speed,
                    f"{vendor.best.seconds / rec.cost:.2f}" if rec.ok else "-",
                    f"{rec.metrics.get('rel_error', float('nan')):.1e}" if rec.ok else rec.error_msg[:80]]))
            fastest = [config for _, config in sorted(measured, key=lambda m: m[0])[:args.graph]]
            for config in fastest:
                try:
                    ours, err = in_graph(template, config, target)
                except Exception as exc:  # a row, never the end of the run
                    rows.append((float("inf"), [MmaTile.of(config).label() + ", three ways", "-", "-", "-",
                                                str(exc).strip().splitlines()[0][:80]]))
                    continue
                best = ours.best.seconds
                with open(os.path.join(args.out, f"mma_probe_{name}_three_ways.jsonl"), "a") as f:
                    f.write(json.dumps({"config": config.as_dict(), "rel_error": err,
                                        "seconds": seconds_by_method(ours),
                                        "cublas_seconds": seconds_by_method(vendor)}) + "\n")
                rows.append((best, [f"{MmaTile.of(config).label()}, {describe(ours, template.flops())}",
                                    f"{best * 1e3:.4f}", f"{template.flops() / best / 1e12:.0f}",
                                    f"{vendor.best.seconds / best:.2f}", f"{err:.1e}"]))
            rows.sort(key=lambda r: r[0])
            print(f"{name}: {len(feasible)} configs in {wall:.0f} s; cuBLAS fp16 {describe(vendor, template.flops())}",
                  flush=True)
            title = f"mma.sync {m}x{n}x{k} (fp16, fp32 acc, fp16 C); cuBLAS {describe(vendor, template.flops())}"
            tables.append(table(title,
                                ["config", "ms", "TFLOP/s", "of cuBLAS", "rel err / error"], [r for _, r in rows]))
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
