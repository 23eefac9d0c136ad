"""GEMM on the GPU: tune fp32 GEMM for CUDA (and OpenCL) and compare with cuBLAS in the same run.

Run through the device tool (see ../shared/DEVICE.md), about 6 minutes on an H100:
    source .tvm-device/boot.sh && python benchmarks/gemm.py --out $OUT
The template searches its staging knobs too (register-staged or cp.async prefetch, warp
tiling, 16-byte fills; ``--no-staging``: the original knobs only), seeded with the default,
method 002's picks and ``STAGED_SEEDS``.
Then the stable comparison: the tuned CUDA config, built again on cuBLAS's operands, against
cuBLAS in ``--rounds`` interleaved rounds, both replayed from CUDA graphs, the SM clock and power
read after each (raw rounds in --out/gemm_rounds.jsonl; the median of the per-round ratios first).
Prints a markdown table last; records go to --out so nothing measured is lost.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (compare_in_rounds, l2_rotation, ours_launch, rel_error_vs, rounds_cells,  # noqa: E402
                    rounds_header, table, time_vendor, vendor_methods)

from tvm_ext.cost_model.analytic import analytic_seeds  # noqa: E402
from tvm_ext.schedules.gemm.simt import REGISTER_STAGED_TILE, STAGING_DEFAULTS, GemmTemplate  # noqa: E402
from tvm_ext.core.session import Session, SessionOptions  # noqa: E402


# The two leaders of the H100 staging probe (benchmarks/probes/sgemm_probe.py, 2026-11-23: 43.8 and
# 43.4 TFLOP/s = 0.85 and 0.84 of cuBLAS fp32 at 4096^3): GA seeds.
STAGED_SEEDS = (
    {**STAGING_DEFAULTS, **REGISTER_STAGED_TILE},  # the template's own known-good tile
    dict(wg_x=8, wg_y=16, task_x=8, task_y=8, k_step=16, use_shared=1, pad=1, unroll=16, vec=4, double_buffer=1,
         a_transposed=1, prefetch=0, warp_x=8, load_vec=0),
)


def cublas_fp32(n: int) -> tuple[Any, float, list[tuple[Any, Any]]]:
    """cuBLAS (TF32 off) per call, back to back and from a CUDA graph, on rotated operands,
    its error vs float64, and the operands."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    sets = [(torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda"))
            for _ in range(l2_rotation(3 * 4 * n * n))]
    times = time_vendor(lambda i: torch.matmul(*sets[i]), len(sets))
    a, b = sets[0]
    return times, rel_error_vs(torch.matmul(a, b), a.double() @ b.double()), sets


def tune(target_kind: str, n: int, args: argparse.Namespace, hand_picked=()) -> dict:
    template = GemmTemplate(n, n, n, staging=not args.no_staging)
    xgb = args.cost_model == "xgb" and target_kind == "cuda"
    options = SessionOptions(
        target=target_kind, strategy="ga+xgb" if xgb else "ga", generations=args.generations,
        population=args.population, trials=args.trials, workers=args.workers, seed=args.seed,
        records=os.path.join(args.out, f"gemm_{target_kind}_{n}.jsonl"), build_timeout=300, run_timeout=120,
        nm=args.nm, ng=16 * args.nm, model_file=False)
    transfer = sweep_records(args.transfer, template.staging) if xgb and args.transfer else ()
    if xgb:
        print(f"cost model: {len(transfer)} transfer records from {args.transfer}", flush=True)
    with Session(options, transfer=transfer, log=print) as session:
        target = session.target
        tuner = session.tuner(template, on_record=lambda rec, t: print(
            f"  [{target_kind}] trial {t.trials}: {rec.config} -> "
            f"{(template.flops() / rec.cost / 1e12) if rec.ok else rec.error_kind + ' ' + rec.error_msg[:120]}",
            flush=True))
        space = tuner.space
        seeds = [template.default_config(target)]
        if not args.no_analytic_seeds:  # method 002's zero-measurement picks join generation 0
            seeds += analytic_seeds(template, target)
        if template.staging:
            staged = [space.make(**c) for c in STAGED_SEEDS]
            seeds += [c for c in staged if space.is_feasible(c)]
        start = time.time()
        result = session.search(tuner, seeds=seeds)
        wall = time.time() - start
        tuner.trials_budget += len(hand_picked)
        picked = []
        for text in hand_picked:
            values = {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))}
            cfg = space.make(**{**(STAGING_DEFAULTS if template.staging else {}), **values})
            tuner.evaluate([cfg])
            picked.append(tuner.record_of(cfg))
    analytic = [tuner.record_of(c) for c in seeds[1:2]]
    return {"target": target, "template": template, "result": result, "wall": wall, "picked": picked,
            "analytic": analytic}


def sweep_records(path: str, staging: bool = False) -> list[Any]:
    """A recorded sweep (benchmarks/data/sweep_*.jsonl.gz) as records of its workload (the
    staging knobs, which the sweep predates, at their first values when ``staging``)."""
    import gzip

    from tvm_ext.core.records import Record

    with gzip.open(path, "rt", encoding="utf-8") as fh:
        header, *rows = [json.loads(line) for line in fh if line.strip()]
    key = "sweep:" + os.path.basename(path)
    extra = STAGING_DEFAULTS if staging else {}
    return [Record(key, header["workload"], {**extra, **r["config"]}, (r["cost"],) if r.get("cost") else (),
                   r.get("error_kind", "")) for r in rows]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--opencl-size", type=int, default=2048)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--population", type=int, default=24)
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--opencl-trials", type=int, default=60)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_out")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the tuned config against cuBLAS")
    p.add_argument("--skip-opencl", action="store_true")
    p.add_argument("--no-analytic-seeds", action="store_true",
                   help="seed the GA with the default config only (no method-002 picks)")
    p.add_argument("--cost-model", default="none", choices=("none", "xgb"),
                   help="xgb: the GA breeds 16*nm per generation, the XGBoost model picks nm (CUDA run only)")
    p.add_argument("--nm", type=int, default=16, help="measured per generation with --cost-model xgb")
    p.add_argument("--transfer", default=None,
                   help="records of another shape to warm-start the model "
                        "(e.g. data/sweep_gemm_cuda_2048x2048x2048.jsonl.gz)")
    p.add_argument("--no-staging", action="store_true", help="the template's original knobs only (no STAGING_KNOBS)")
    p.add_argument("--hand-picked", action="append", default=[],
                   help="also measure this config (k=v,k=v...) after tuning, reported on its own row")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    os.makedirs(args.out, exist_ok=True)

    n = args.size
    vendor, vendor_err, sets = cublas_fp32(n)
    round_rows = []
    cublas = vendor.best.seconds  # ratios against cuBLAS at its best of the three methods
    cublas_tflops = 2 * n**3 / cublas / 1e12
    print(f"cuBLAS fp32 {n}^3: best {cublas * 1e3:.3f} ms ({vendor.best.method}) = {cublas_tflops:.1f} TFLOP/s",
          flush=True)
    rows = []
    for method, t in vendor_methods(vendor):
        rows.append([f"cuBLAS (torch.matmul, TF32 off), {method}", f"{n}³",
                     f"{t.seconds * 1e3:.3f}" if t else "-", f"{2 * n**3 / t.seconds / 1e12:.1f}" if t else "-",
                     f"{cublas / t.seconds:.2f}" if t else "-", f"{vendor_err:.1e}", "-", "-", "-"])
    runs = [("cuda", n, args.trials)]
    if not args.skip_opencl:
        runs.append(("opencl", args.opencl_size, args.opencl_trials))
    for kind, size, trials in runs:
        args.trials = trials
        out = tune(kind, size, args, args.hand_picked if kind == "cuda" else ())
        res = out["result"]
        flops = out["template"].flops()
        strategy = "GA+XGB" if args.cost_model == "xgb" and kind == "cuda" else "GA"
        labelled = [(f"tuned ({strategy})", res.best), ("default config", res.default)]
        labelled += [("analytic pick (0 trials)", rec) for rec in out["analytic"]]
        labelled += [("hand-picked", rec) for rec in out["picked"]]
        if kind == "cuda" and res.best is not None and res.best.ok:
            round_rows += rounds_rows(out["template"], res.best.config, out["target"], sets, args)
        for label, rec in labelled:
            if rec is None or not rec.ok:
                rows.append([f"tvm_ext {kind} {label}", f"{size}³", "failed", "-", "-", "-", "-", "-", "-"])
                continue
            tf = flops / rec.cost / 1e12
            err = rec.metrics.get("rel_error")
            rows.append([f"tvm_ext {kind} {label}", f"{size}³", f"{rec.cost * 1e3:.3f}", f"{tf:.1f}",
                         f"{tf / cublas_tflops:.2f}", f"{err:.1e}" if err is not None else "-",
                         res.trials if label.startswith("tuned") else "-",
                         f"{out['wall']:.0f}" if label.startswith("tuned") else "-",
                         " ".join(f"{k}={v}" for k, v in rec.config.items())])
    print()
    print(table("fp32 GEMM vs cuBLAS at its best (ours: the runner's back-to-back timer)",
                ["kernel", "shape", "ms", "TFLOP/s", "vs cuBLAS best 4096³", "rel err vs f64", "trials", "tuning s",
                 "config"], rows))
    print()
    print(table(f"Stable comparison: tuned fp32 GEMM against cuBLAS (TF32 off) in {args.rounds} interleaved rounds, "
                "both replayed from CUDA graphs on the same operands", ["shape", *rounds_header()], round_rows))


def rounds_rows(template: Any, config: dict, target: Any, sets: list, args: argparse.Namespace) -> list[list[str]]:
    """The tuned config against cuBLAS in interleaved rounds on cuBLAS's operands: the rounds
    table's rows (a failure is a row)."""
    shape = "x".join(map(str, sets[0][0].shape)) + f"x{sets[0][1].shape[1]}"
    try:
        launch, err = ours_launch(template, config, target, sets)
        summaries, left_out = compare_in_rounds(shape, launch, {"cuBLAS": lambda i: sets[i][0] @ sets[i][1]},
                                                len(sets), args.rounds, os.path.join(args.out, "gemm_rounds.jsonl"),
                                                rel_error=err)
    except Exception as exc:  # reported in the table, never the end of the run
        return [[shape, f"failed: {str(exc).strip()[:80]}"] + ["-"] * 9]
    return [[shape, *rounds_cells(s)] for s in summaries] + \
        [[shape, f"{v}: left out ({why})"] + ["-"] * 9 for v, why in left_out.items()]


if __name__ == "__main__":
    main()
