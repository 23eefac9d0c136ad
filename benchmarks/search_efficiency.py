"""How many measurements each search strategy needs, replayed on recorded sweeps (CPU only).

    python benchmarks/search_efficiency.py [--seeds 20] [--sweeps benchmarks/data/sweep_*.jsonl.gz]

For each sweep and strategy (random, GA, GA + XGBoost predictor, the predictor-stage GA
with the model off, and method 002's analytic pick) it runs the real Tuner on the sweep's
replay (a config outside the sweep is infeasible) with 20 seeds and reports the trials
until the best config found reaches 95 % of the best recorded speed: median, interquartile
range and min–max over the seeds, and the median as a share of the recorded space.  When
records of another shape of the same template on the same device exist
(``benchmarks/data/gemm_*_ga.jsonl.gz``), GA + XGB also runs warm-started from them
("ga+xgb transfer"); when ``ptxas_<sweep>.json.gz`` exists (``benchmarks/ptxas_sweep.py``) it
also runs with ptxas registers/spills as features.  The markdown table (for
``benchmarks/RESULTS.md``) is printed last.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import gzip
import math
import os
import statistics
import sys
import time

import numpy as np

from tvm_ext.cost_model.compare import SearchSettings, replay_run
from tvm_ext.cost_model.replay import Sweep
from tvm_ext.core.records import Record

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = ("random", "ga", "ga+s6", "ga+xgb", "ga+xgb ptxas", "ga+xgb transfer", "analytic")
LABELS = {
    "random": "random (feasible, uniform)",
    "ga": "GA (method 000)",
    "ga+s6": "GA, predictor stage without a model",
    "ga+xgb": "GA + XGB predictor (cold)",
    "ga+xgb ptxas": "GA + XGB predictor, ptxas features",
    "ga+xgb transfer": "GA + XGB predictor (warm: other shape)",
    "analytic": "analytic (method 002)",
}


def transfer_records(sweep: Sweep) -> list[Record]:
    """Records of other shapes of the sweep's template on the sweep's device."""
    out = []
    for path in sorted(glob.glob(os.path.join(HERE, "data", "*_ga.jsonl.gz"))):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            recs = [Record.from_json(line) for line in fh if line.strip()]
        out += [r for r in recs if r.workload.get("template") == sweep.header["workload"]["template"]
                and r.workload.get("target") == sweep.header["target"]
                and r.workload.get("params") != sweep.header["workload"]["params"]]
    return out


def summarize(values: list[int | None], recorded: int) -> list[str]:
    """Median, IQR, min–max of trials; a run that never got there counts as infinitely many."""
    got = [v for v in values if v is not None]
    full = np.array([math.inf if v is None else v for v in values], dtype=np.float64)
    q1, med, q3 = np.percentile(full, [25, 50, 75], method="nearest")
    text = lambda x: "never" if math.isinf(x) else f"{x:.0f}"  # noqa: E731
    share = f"{100 * med / recorded:.1f} %" if math.isfinite(med) else "-"
    return [text(med), f"{text(q1)}–{text(q3)}", f"{min(got, default='-')}–{text(full.max())}", share,
            f"{len(got)}/{len(values)}"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sweeps", nargs="*", default=sorted(glob.glob(os.path.join(HERE, "data", "sweep_*.jsonl.gz"))))
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--seed-base", type=int, default=1000, help="first seed (the sweeps were drawn with seed 0)")
    p.add_argument("--fraction", type=float, default=0.95)
    p.add_argument("--rows", default=",".join(ROWS))
    args = p.parse_args()
    settings = SearchSettings()
    rows = args.rows.split(",")
    table: list[list[str]] = []
    devices: list[str] = []
    for path in args.sweeps:
        sweep = Sweep.load(path)
        recorded = len(sweep.entries)
        wl = sweep.header["workload"]
        shape = "x".join(str(wl["params"][d]) for d in ("m", "n", "k"))
        title = f"{sweep.header['target']['kind']} {shape} ({recorded} configs)"
        devices.append(f"{title}: {sweep.header['target']['device']}, best {fmt_speed(sweep)}")
        transfer = transfer_records(sweep)
        for row in rows:
            strategy = row.split(" ")[0]
            if row.endswith("transfer") and not transfer:
                continue
            ptxas = os.path.join(os.path.dirname(path), f"ptxas_{sweep.name}.json.gz")
            if row.endswith("ptxas") and not os.path.exists(ptxas):
                continue
            run_settings = dataclasses.replace(settings, ptxas_cache=ptxas if row.endswith("ptxas") else "")
            start = time.time()
            runs = [replay_run(sweep, strategy, seed, settings=run_settings, stop_at=args.fraction,
                               transfer=transfer if row.endswith("transfer") else ())
                    for seed in range(args.seed_base, args.seed_base + args.seeds)]
            trials = [r.trials_to(args.fraction) for r in runs]
            rho = [x for r in runs for x in r.rank_correlations if not math.isnan(x)]
            if strategy == "analytic":
                cells = ["0", "-", "-", "0.0 %", f"pick: {100 * runs[0].best_fraction:.1f} % of best"]
            else:
                cells = summarize(trials, recorded)
            extra = f"{statistics.median(rho):+.2f}" if rho else "-"
            table.append([title, LABELS[row], *cells, extra])
            print(f"{title} | {row}: trials {trials} ({time.time() - start:.0f} s)", file=sys.stderr, flush=True)
    header = ["sweep", "strategy", f"trials to {args.fraction:.0%} (median)", "IQR", "min–max",
              "median / recorded space", "runs that got there", "predictor Spearman (median)"]
    print(f"\nTrials until the best config found is within {args.fraction:.0%} of the best recorded speed, "
          f"{args.seeds} seeds ({args.seed_base}..{args.seed_base + args.seeds - 1}); settings: {settings}")
    print("\n".join(f"- {d}" for d in devices) + "\n")
    print(markdown(header, table))
    return 0


def fmt_speed(sweep: Sweep) -> str:
    flops = 2.0 * math.prod(int(sweep.header["workload"]["params"][d]) for d in ("m", "n", "k"))
    return f"{sweep.best_cost * 1e6:.1f} us = {flops / sweep.best_cost / 1e9:.1f} GFLOP/s"


def markdown(header: list[str], rows: list[list[str]]) -> str:
    cells = [header] + rows
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


if __name__ == "__main__":
    sys.exit(main())
