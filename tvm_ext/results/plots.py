"""``report``: convergence and per-knob plots of a records file (PNG) and a page showing them.

Per workload: the best result so far against trials and against wall time, one
line per strategy (records name the strategy and run that made them), and for each
knob the speed of every correct record at each of its values.  Speeds are GFLOP/s
(or GB/s) where the template is known, else times in milliseconds.

Every string of the records file is data: the page escapes each one it shows, the
plots show them as plain text (no math markup), and file names are a sanitized slug
of the workload key and a hash of it, always inside the output folder.
"""
from __future__ import annotations

import hashlib
import html
import math
import os
import re
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..core.records import Record
from .summary import WorkloadRecords, config_items, config_text, speed_text, throughput


@dataclass(frozen=True)
class Series:
    """One strategy's records in the order they were made: trial number, wall seconds
    since its first run started, and the best value so far after each."""

    strategy: str
    trials: np.ndarray
    wall_secs: np.ndarray
    best: np.ndarray


def _text(value: object, limit: int = 120) -> str:
    """A string of the records file as matplotlib shows it: printable, not too long, and
    with ``$`` escaped so that it is never parsed as math markup (which can raise)."""
    text = "".join(c if c.isprintable() else "?" for c in str(value))
    text = text if len(text) <= limit else text[:limit - 3] + "..."
    return text.replace("$", r"\$")


def file_stem(key: str) -> str:
    """A file name for a workload key: its safe characters (at most 40) and a hash of the
    whole key, so that two keys never share a name and no key leaves the folder."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "_", key)[:40].strip("_") or "workload"
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{slug}-{digest}"


def _inside(out_dir: str, name: str) -> str:
    """``out_dir/name``, asserted to lie inside ``out_dir``."""
    path = Path(out_dir, name)
    assert path.resolve().is_relative_to(Path(out_dir).resolve()), path
    return str(path)


def _value(wr: WorkloadRecords, rec: Record) -> float:
    """A record's speed (higher is better) or, without a template, its time in ms."""
    if throughput(wr.template, 1.0) is not None:
        rate = throughput(wr.template, rec.cost)
        return rate[0] if rate else 0.0
    return rec.cost * 1e3 if rec.ok else math.inf


def _higher_is_better(wr: WorkloadRecords) -> bool:
    return throughput(wr.template, 1.0) is not None


def _axis_label(wr: WorkloadRecords) -> str:
    rate = throughput(wr.template, 1.0)
    return f"best {rate[1]}" if rate else "best time (ms)"


def convergence(wr: WorkloadRecords) -> list[Series]:
    """Best-so-far per strategy; the runs of one strategy follow each other in wall time."""
    by_strategy: dict[str, list[Record]] = defaultdict(list)
    for rec in sorted(wr.records, key=lambda r: r.timestamp):
        by_strategy[rec.strategy or "unlabelled"].append(rec)
    higher = _higher_is_better(wr)
    series = []
    for strategy, recs in by_strategy.items():
        runs: dict[str, list[Record]] = defaultdict(list)
        for rec in recs:
            runs[rec.run].append(rec)
        timed: list[tuple[float, Record]] = []
        offset = 0.0
        for run_recs in runs.values():  # in order of each run's first record
            start = run_recs[0].timestamp - (run_recs[0].elapsed or 0.0)
            times = [r.elapsed if r.elapsed is not None else r.timestamp - start for r in run_recs]
            timed += [(offset + t, r) for t, r in zip(times, run_recs)]
            offset += max(times)
        timed.sort(key=lambda pair: pair[0])
        values = np.array([_value(wr, r) for _, r in timed])
        best = np.maximum.accumulate(values) if higher else np.minimum.accumulate(values)
        if higher:
            best = np.where(best > 0, best, np.nan)
        else:
            best = np.where(np.isfinite(best), best, np.nan)
        series.append(Series(_text(strategy, 40), np.arange(1, len(values) + 1), np.array([t for t, _ in timed]), best))
    return series


def _figure(width: float, height: float):  # -> matplotlib.figure.Figure
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def plot_convergence(wr: WorkloadRecords, path: str) -> None:
    fig = _figure(11, 4)
    by_trial, by_time = fig.subplots(1, 2)
    for s in convergence(wr):
        by_trial.step(s.trials, s.best, where="post", label=s.strategy)
        by_time.step(s.wall_secs, s.best, where="post", label=s.strategy)
    for ax, xlabel in ((by_trial, "trials (measured kernels)"), (by_time, "wall time (s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(_axis_label(wr))
        ax.grid(True, alpha=0.3)
        ax.legend(title="strategy")
    fig.suptitle(_text(f"{wr.description} on {wr.target_text}: best so far", 160))
    _save(fig, path)


def plot_knobs(wr: WorkloadRecords, path: str) -> None:
    """Per knob: every correct record's value at each choice (dots) and the best (diamonds)."""
    ok = [r for r in wr.records if r.ok]
    knobs = [k for k, _ in config_items(wr.template, wr.target, wr.records[0].config, shown_only=False)]
    cols = min(4, max(1, len(knobs)))
    rows = max(1, math.ceil(len(knobs) / cols))
    fig = _figure(3.2 * cols, 2.6 * rows)
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    rng = np.random.default_rng(0)  # jitter only: the same picture on every run
    higher = _higher_is_better(wr)
    for ax, knob in zip(axes, knobs):
        choices = sorted({r.config.get(knob) for r in wr.records}, key=lambda v: (str(type(v)), v))
        xs, ys = [], []
        for rec in ok:
            xs.append(choices.index(rec.config.get(knob)))
            ys.append(_value(wr, rec))
        if xs:
            ax.scatter(np.array(xs) + rng.uniform(-0.15, 0.15, len(xs)), ys, s=9, alpha=0.5, label="a record")
            pick = max if higher else min
            best = [pick([y for x, y in zip(xs, ys) if x == i], default=np.nan) for i in range(len(choices))]
            ax.plot(range(len(choices)), best, "D", color="black", markersize=4, label="best at this value")
        ax.set_xticks(range(len(choices)), [_text(c, 16) for c in choices], fontsize=8)
        ax.set_ylabel(_axis_label(wr).replace("best ", ""), fontsize=8)
        ax.set_title(_text(knob, 40), fontsize=9)
        ax.grid(True, alpha=0.3)
    for ax in axes[len(knobs):]:
        ax.set_visible(False)
    if knobs and axes[0].has_data():
        fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8)
    fig.suptitle(_text(f"{wr.description}: {_axis_label(wr).replace('best ', '')} of each correct record per "
                       f"knob value", 160))
    _save(fig, path)


def _save(fig, path: str) -> None:  # fig: matplotlib.figure.Figure
    """Write the PNG; a glyph the font lacks (a record's exotic string) is not worth a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig.savefig(path)


def write_report(workloads: Sequence[WorkloadRecords], out_dir: str, records_path: str) -> str:
    """PNG plots per workload and ``index.html`` showing them; returns the page's path.
    Every string from the records is escaped on the page; files are named by ``file_stem``."""
    os.makedirs(out_dir, exist_ok=True)
    esc = html.escape
    sections = []
    for wr in workloads:
        stem = file_stem(wr.key)
        conv, knobs = f"{stem}-convergence.png", f"{stem}-knobs.png"
        plot_convergence(wr, _inside(out_dir, conv))
        plot_knobs(wr, _inside(out_dir, knobs))
        best = wr.best
        best_line = (f"{best.cost * 1e3:.4f} ms, {speed_text(wr.template, best.cost)}: "
                     f"<code>{esc(config_text(wr.template, wr.target, best.config))}</code>"
                     if best else "no correct record")
        errors = ", ".join(f"{k} {n}" for k, n in sorted(wr.errors().items())) or "none"
        strategies = ", ".join(f"{k} ({n})" for k, n in wr.strategies().items())
        sections.append(f"""<section>
<h2>{esc(wr.description)} <small>on {esc(wr.target_text)}</small></h2>
<p>workload <code>{esc(wr.key)}</code>: {len(wr.records)} trials ({sum(r.ok for r in wr.records)} correct; errors:
{esc(errors)}), tuning time {wr.tuning_secs():.1f} s, strategies: {esc(strategies)}</p>
<p>best: {esc(best_line) if best is None else best_line}</p>
<img src="{esc(conv)}" alt="best so far against trials and wall time">
<img src="{esc(knobs)}" alt="speed per knob value">
</section>""")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>tvm_ext report: {esc(os.path.basename(records_path))}</title>
<style>body{{font-family:sans-serif;margin:2em}} img{{max-width:100%;display:block;margin:1em 0}}</style>
</head><body>
<h1>Tuning report: {esc(os.path.abspath(records_path))}</h1>
{"".join(sections)}
</body></html>
"""
    path = _inside(out_dir, "index.html")
    with open(path, "w", encoding="utf-8", errors="replace") as fh:
        fh.write(page)
    return path
