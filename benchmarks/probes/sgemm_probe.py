"""SGEMM staging probe: the fp32 GEMM template with its staging knobs (register-staged or
cp.async prefetch, warp tiling, 16-byte fills) around the best tiles found so far, and method
002's picks, built in parallel and measured by the project's runner (float64 check), against
cuBLAS fp32 (TF32 off) timed three ways in the same run, at 4096^3 or at any ``--shape``
(``--b-transposed``: B stored N x K, a Linear layer's weight, as the Relax tasks of a model
read it; cuBLAS then runs ``torch.nn.functional.linear``).

    source .tvm-device/boot.sh && python benchmarks/probes/sgemm_probe.py --out $OUT
    ... --shape 1024,3072,768 --shape 1024,768,3072 --b-transposed   # BERT-base's FFN at b8 s128
    ... --registers-only   # register-staged prefetch into one shared buffer or two, large tiles
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import table  # noqa: E402
from common import l2_rotation, time_vendor  # noqa: E402
from mma_probe import describe  # noqa: E402

from tvm_ext.cost_model.analytic import analytic_seeds  # noqa: E402
from tvm_ext.schedules.gemm.simt import STAGING_DEFAULTS, GemmTemplate  # noqa: E402
from tvm_ext.core.session import Session, SessionOptions  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402


def tile(wg_x: int, wg_y: int, task_x: int, task_y: int, k_step: int = 16) -> dict[str, int]:
    """A shared-memory tile with 16-byte vectors, padded rows, double buffering, a K-major A."""
    return dict(wg_x=wg_x, wg_y=wg_y, task_x=task_x, task_y=task_y, k_step=k_step, use_shared=1, pad=1, unroll=16,
                vec=4, double_buffer=1, a_transposed=1)


# The two best tiles of the earlier H100 searches (43.4 TFLOP/s), and the 128x128 / 256-thread tile.
TILES = (tile(16, 8, 8, 8), tile(8, 16, 8, 8), tile(16, 16, 8, 8, k_step=8))
# Smaller blocks for shapes whose 64x128 tiles leave SMs idle (M = 1024: 96 blocks at N = 768)
SMALL_TILES = (tile(8, 8, 8, 8), tile(16, 8, 4, 8), tile(16, 16, 4, 4))
STAGING = [dict(prefetch=p, warp_x=w) for p, w in itertools.product((0, 1, 3), (0, 8))]
STAGING += [dict(prefetch=2, a_transposed=0), dict(prefetch=1, k_step=32), dict(prefetch=3, k_step=32)]
# --registers-only: the register-staged variants (one shared buffer or two) of the large tiles
REGISTER_STAGING = [dict(prefetch=p, warp_x=w) for p, w in itertools.product((1, 3), (0, 8))]


def cublas_fp32(m: int, n: int, k: int, b_transposed: bool) -> Any:
    """cuBLAS fp32 (TF32 off) per call, back to back and from a CUDA graph, on rotated operands."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    b_shape = (n, k) if b_transposed else (k, n)
    sets = [(torch.randn(m, k, device="cuda"), torch.randn(*b_shape, device="cuda"))
            for _ in range(l2_rotation(4 * (m * k + k * n + m * n)))]
    if b_transposed:
        return time_vendor(lambda i: torch.nn.functional.linear(*sets[i]), len(sets))
    return time_vendor(lambda i: torch.matmul(*sets[i]), len(sets))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=4096, help="an n^3 GEMM (without --shape)")
    p.add_argument("--shape", action="append", default=[], help="M,N,K (repeatable)")
    p.add_argument("--b-transposed", action="store_true", help="B stored N x K")
    p.add_argument("--registers-only", action="store_true",
                   help="only the register-staged variants (prefetch 1 and 3) of the large tiles")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--out", default="bench_out")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    target = resolve_target("cuda")
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shape] or [(args.size,) * 3]
    for m, n, k in shapes:
        probe(m, n, k, args, target)
    return 0


def probe(m: int, n: int, k: int, args: argparse.Namespace, target: Any) -> None:
    """Every tile x staging variant and method 002's picks at one shape, then the table."""
    template = GemmTemplate(m, n, k, staging=True, b_transposed=args.b_transposed)
    space = template.space(target)
    configs = [space.make(**{**c.as_dict(), **STAGING_DEFAULTS})
               for c in analytic_seeds(dataclasses.replace(template, staging=False), target, 4)]
    variants = itertools.product(TILES, REGISTER_STAGING) if args.registers_only else \
        itertools.product(TILES + SMALL_TILES, STAGING)
    for tile, staging in variants:
        config = space.make(**{**tile, **STAGING_DEFAULTS, **staging})
        if space.is_feasible(config) and config not in configs:
            configs.append(config)
    configs = [c for c in configs if space.is_feasible(c)]
    label = f"{m}x{n}x{k}" + (" B^T" if args.b_transposed else "")
    options = SessionOptions(target="cuda", workers=args.workers, build_timeout=300, run_timeout=120,
                             records=os.path.join(args.out, f"sgemm_probe_{m}x{n}x{k}.jsonl"))
    start = time.time()
    with Session(options, target=target) as session:
        tuner = session.tuner(template)
        tuner.evaluate(configs)
    vendor = cublas_fp32(m, n, k, args.b_transposed)
    rows = []
    for config in configs:
        rec = tuner.record_of(config)
        if rec is None:
            continue
        shown = " ".join(f"{k}={v}" for k, v in config.items if k in ("wg_x", "wg_y", "task_x", "task_y", "k_step",
                                                                         "a_transposed", "unroll", "prefetch",
                                                                         "warp_x"))
        rows.append((rec.cost if rec.ok else float("inf"), [
            shown, f"{rec.cost * 1e3:.3f}" if rec.ok else rec.error_kind,
            f"{template.flops() / rec.cost / 1e12:.1f}" if rec.ok else rec.error_msg[:60],
            f"{vendor.best.seconds / rec.cost:.3f}" if rec.ok else "-"]))
    rows.sort(key=lambda r: r[0])
    print(table(f"SGEMM {label} staging probe ({len(configs)} configs, {time.time() - start:.0f} s); cuBLAS fp32 "
                f"{describe(vendor, template.flops())}", ["config", "ms", "TFLOP/s", "of cuBLAS"],
                [r for _, r in rows[:12]]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
