"""SGEMM staging probe: the fp32 GEMM template with its staging knobs (register-staged or
cp.async prefetch, warp tiling, 16-byte fills) around the best tiles found so far, built in
parallel and measured by the project's runner (float64 check), against cuBLAS fp32 (TF32 off)
timed three ways in the same run.

    source .tvm-device/boot.sh && python benchmarks/sgemm_probe.py --out $OUT
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import table  # noqa: E402
from common import l2_rotation, time_vendor  # noqa: E402
from mma_probe import describe  # noqa: E402

from tvm_ext.schedules.gemm import STAGING_DEFAULTS, GemmTemplate  # noqa: E402
from tvm_ext.session import Session, SessionOptions  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402

# The two best tiles of the earlier H100 searches (43.4 TFLOP/s), and the 128x128 / 256-thread tile.
TILES = (
    dict(wg_x=16, wg_y=8, task_x=8, task_y=8, k_step=16, use_shared=1, pad=1, unroll=16, vec=4, double_buffer=1,
         a_transposed=1),
    dict(wg_x=8, wg_y=16, task_x=8, task_y=8, k_step=16, use_shared=1, pad=1, unroll=16, vec=4, double_buffer=1,
         a_transposed=1),
    dict(wg_x=16, wg_y=16, task_x=8, task_y=8, k_step=8, use_shared=1, pad=1, unroll=16, vec=4, double_buffer=1,
         a_transposed=1),
)
STAGING = [dict(prefetch=p, warp_x=w) for p, w in itertools.product((0, 1), (0, 8))]
STAGING += [dict(prefetch=2, a_transposed=0), dict(prefetch=1, k_step=32)]


def cublas_fp32(n: int) -> Any:
    """cuBLAS fp32 (TF32 off) per call, back to back and from a CUDA graph, on rotated operands."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    sets = [(torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda"))
            for _ in range(l2_rotation(3 * 4 * n * n))]
    return time_vendor(lambda i: torch.matmul(*sets[i]), len(sets))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--out", default="bench_out")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    target = resolve_target("cuda")
    n = args.size
    template = GemmTemplate(n, n, n, staging=True)
    space = template.space(target)
    configs = []
    for tile, staging in itertools.product(TILES, STAGING):
        config = space.make(**{**tile, **STAGING_DEFAULTS, **staging})
        if space.is_feasible(config) and config not in configs:
            configs.append(config)
    options = SessionOptions(target="cuda", workers=args.workers, build_timeout=300, run_timeout=120,
                             records=os.path.join(args.out, f"sgemm_probe_{n}.jsonl"))
    start = time.time()
    with Session(options, target=target) as session:
        tuner = session.tuner(template)
        tuner.evaluate(configs)
    vendor = cublas_fp32(n)
    rows = []
    for config in configs:
        rec = tuner.record_of(config)
        if rec is None:
            continue
        shown = " ".join(f"{k}={v}" for k, v in config.items if k in ("wg_x", "wg_y", "k_step", "a_transposed",
                                                                         "unroll", "prefetch", "warp_x"))
        rows.append((rec.cost if rec.ok else float("inf"), [
            shown, f"{rec.cost * 1e3:.3f}" if rec.ok else rec.error_kind,
            f"{template.flops() / rec.cost / 1e12:.1f}" if rec.ok else rec.error_msg[:60],
            f"{vendor.best.seconds / rec.cost:.3f}" if rec.ok else "-"]))
    rows.sort(key=lambda r: r[0])
    print(table(f"SGEMM {n}^3 staging probe ({len(configs)} configs, {time.time() - start:.0f} s); cuBLAS fp32 "
                f"{describe(vendor, template.flops())}", ["config (8x8 per thread, vec 4, pad)", "ms", "TFLOP/s",
                                                            "of cuBLAS"], [r for _, r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
