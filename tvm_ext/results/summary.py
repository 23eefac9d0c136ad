"""A records file read back per workload: best configs, errors by kind, trials, tuning time.

Records carry their workload (template name and parameters, target), so the
template is rebuilt to print speeds (GFLOP/s or GB/s) and configs in the space's
knob order, showing only the knobs that matter for each config
(``Template.shown_knobs``).  Workloads whose template cannot be rebuilt (another
version's parameters, a mixed-precision program) are still summarized, with times
instead of speeds and the knobs as recorded.

A records file is data, not trusted: a record whose config is not a point of its
template's space (``Space.outside_reason``), or whose workload differs from the one
the first record of its key named, is skipped with the reason (``RecordsCheck``), so
it is never shown as the best nor exported.  A record of another version of the
template (its ``template_hash`` is not today's) may lack knobs added since or hold
knobs removed since: only the values of the knobs both have are checked.
"""
from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping, Sequence

from ..core.errors import TvmExtError
from ..core.records import Record, RecordStore, check_regular_file
from ..core.space import Config, Space
from ..target import TargetInfo
from ..operators import template_of
from ..core.template import Template
from ..precision.mixed_precision import PrecisionProgram


def speed_text(template: Template | None, cost: float) -> str:
    """Throughput of one run taking ``cost`` seconds: GFLOP/s, else GB/s ("-" if unknown)."""
    rate = throughput(template, cost)
    return "-" if rate is None else f"{rate[0]:.1f} {rate[1]}"


def throughput(template: Template | None, cost: float) -> tuple[float, str] | None:
    """(value, unit) of one run taking ``cost`` seconds, or None when it is not a speed."""
    if template is None or not math.isfinite(cost) or cost <= 0:
        return None
    if template.flops():
        return template.flops() / cost / 1e9, "GFLOP/s"
    if template.bytes_moved():
        return template.bytes_moved() / cost / 1e9, "GB/s"
    return None


def target_of(workload: Mapping[str, Any]) -> TargetInfo:
    """The recorded target as far as the record names it (the kind, device and arch;
    limits at their defaults): enough for a space's knob order."""
    target = workload.get("target", {})
    return TargetInfo(kind=str(target.get("kind", "opencl")), device_name=str(target.get("device", "unknown")),
                      arch=str(target.get("arch", "")))


def config_items(template: Template | None, target: TargetInfo, config: Mapping[str, Any],
                 shown_only: bool = True) -> list[tuple[str, Any]]:
    """``config``'s knobs in the space's order (records store them sorted); with
    ``shown_only``, only those ``Template.shown_knobs`` keeps for it."""
    if template is None:
        return list(config.items())
    try:
        names = template.space(target).names
    except Exception:  # a space that cannot be built for the recorded target: keep the file's order
        return list(config.items())
    ordered = [n for n in names if n in config] + [n for n in config if n not in names]
    cfg = Config(tuple((n, config[n]) for n in ordered))
    if not shown_only:
        return list(cfg.items)
    shown = set(template.shown_knobs(cfg))
    return [(k, v) for k, v in cfg.items if k in shown]


def config_text(template: Template | None, target: TargetInfo, config: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in config_items(template, target, config))


def _readable(value: Any) -> str:
    """A workload parameter as a reader writes it: a list of (name, value) pairs (a
    mixed-precision program's schedule) as ``(name=value, ...)``, anything else as it prints."""
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) for p in value):
        return "(" + ", ".join(f"{k}={v}" for k, v in value) + ")"
    return str(value)


@dataclass(frozen=True)
class WorkloadRecords:
    """The records of one workload, in file order."""

    key: str
    workload: dict[str, Any]
    records: tuple[Record, ...]

    @cached_property
    def template(self) -> Template | None:
        return template_of(self.workload)

    @cached_property
    def target(self) -> TargetInfo:
        return target_of(self.workload)

    @property
    def description(self) -> str:
        if self.template is not None:
            return self.template.describe()
        params = self.workload.get("params", {})
        name = str(self.workload.get("template", "?")).replace("_", "-")
        return f"{name} " + " ".join(f"{k}={_readable(v)}" for k, v in params.items())

    @property
    def target_text(self) -> str:
        return f"{self.target.kind}:{self.target.device_name}"

    def ranked(self) -> list[Record]:
        """The records that rank (``Record.ranks``: correct, timed as today's), fastest first."""
        return sorted((r for r in self.records if r.ranks), key=lambda r: r.cost)

    @property
    def best(self) -> Record | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def errors(self) -> dict[str, int]:
        return dict(Counter(r.error_kind or "no_time" for r in self.records if not r.ok))

    def strategies(self) -> dict[str, int]:
        return dict(Counter(r.strategy or "unlabelled" for r in self.records))

    def tuning_secs(self) -> float:
        """Wall time the runs took: per run its last record's time since the run started
        (records without it: the span of their timestamps), summed over runs."""
        runs: dict[str, list[Record]] = defaultdict(list)
        for r in self.records:
            runs[r.run].append(r)
        total = 0.0
        for run, recs in runs.items():
            elapsed = [r.elapsed for r in recs if r.elapsed is not None]
            if run and elapsed:
                total += max(elapsed)
            else:
                stamps = [r.timestamp for r in recs]
                total += max(stamps) - min(stamps)
        return total

    def record_json(self, rec: Record) -> dict[str, Any]:
        rate = throughput(self.template, rec.cost)
        return {
            "cost_secs": rec.cost if rec.ok else None,
            "costs": list(rec.costs),
            "speed": None if rate is None else {"value": rate[0], "unit": rate[1]},
            "config": dict(config_items(self.template, self.target, rec.config, shown_only=False)),
            "shown_knobs": [k for k, _ in config_items(self.template, self.target, rec.config)],
            "error_kind": rec.error_kind,
            "error_msg": rec.error_msg,
            "strategy": rec.strategy,
            "metrics": rec.metrics,
        }

    def as_json(self, top: int) -> dict[str, Any]:
        return {
            "workload_key": self.key,
            "description": self.description,
            "workload": self.workload,
            "target": self.target_text,
            "trials": len(self.records),
            "ok": sum(r.ok for r in self.records),
            "errors": self.errors(),
            "strategies": self.strategies(),
            "tuning_secs": self.tuning_secs(),
            "top": [self.record_json(r) for r in self.ranked()[:top]],
        }

    def text(self, top: int) -> str:
        errors = ", ".join(f"{k} {n}" for k, n in sorted(self.errors().items())) or "none"
        strategies = ", ".join(f"{k} ({n})" for k, n in self.strategies().items())
        lines = [f"{self.description}  target={self.target_text}  [workload {self.key}]",
                 f"  trials {len(self.records)} (correct {sum(r.ok for r in self.records)}; errors: {errors}), "
                 f"tuning time {self.tuning_secs():.1f} s, strategies: {strategies}"]
        ranked = self.ranked()
        precision = self.workload.get("template") == PrecisionProgram.name  # configs that trade error for time
        if not ranked:
            lines.append("  no correct record")
        for i, rec in enumerate(ranked[:top]):
            label = "best" if i == 0 else f"#{i + 1}"
            error = rec.metrics.get("rel_error") if precision else None  # what the program's time buys
            lines.append(f"  {label:<5} {rec.cost * 1e3:.4f} ms  {speed_text(self.template, rec.cost):>16}  "
                         + (f"error {error:.1e}  " if isinstance(error, (int, float)) else "")
                         + f"{config_text(self.template, self.target, rec.config)}")
        return "\n".join(lines)


class RecordsCheck:
    """The ``RecordStore`` check of one reading of a file (in file order): a key's records
    all name its first record's workload, and where the template can be rebuilt each
    config is a point of its space (for the recorded target's kind and arch)."""

    def __init__(self) -> None:
        self._workloads: dict[str, str] = {}
        self._spaces: dict[str, tuple[Space, bool] | None] = {}

    def __call__(self, rec: Record) -> str | None:
        blob = json.dumps(rec.workload, sort_keys=True, default=str)
        if self._workloads.setdefault(rec.workload_key, blob) != blob:
            return "its workload differs from the first record of its key"
        if rec.workload_key not in self._spaces:
            self._spaces[rec.workload_key] = self._space(rec.workload)
        found = self._spaces[rec.workload_key]
        if found is None:
            return None
        space, current = found
        why = space.outside_reason(rec.config_obj(), knobs_only=not current)
        return f"config outside its template's space: {why}" if why else None

    @staticmethod
    def _space(workload: dict[str, Any]) -> tuple[Space, bool] | None:
        """The space of the workload's template, and whether the record was made by today's
        version of it; None when the template or its space cannot be rebuilt."""
        template = template_of(workload)
        if template is None:
            return None
        try:
            return template.space(target_of(workload)), workload.get("template_hash") == template.source_hash
        except Exception:  # no space for the recorded target: the configs cannot be checked
            return None


def load_workloads(path: str) -> list[WorkloadRecords]:
    """Every workload of a records file, in order of first appearance; records that fail
    ``RecordsCheck`` are skipped (counted in the store's one warning, with the reason)."""
    check_regular_file(path)
    if not os.path.isfile(path):
        raise TvmExtError(f"no records file {path}")
    groups: dict[str, list[Record]] = {}
    for rec in RecordStore(path, check=RecordsCheck()):
        groups.setdefault(rec.workload_key, []).append(rec)
    if not groups:
        raise TvmExtError(f"{path} holds no records")
    return [WorkloadRecords(key, recs[0].workload, tuple(recs)) for key, recs in groups.items()]


def select(workloads: Sequence[WorkloadRecords], pattern: str | None) -> list[WorkloadRecords]:
    """Workloads matching ``pattern``: a workload key (or its start), or words that all
    appear in the description and target (``gemm m=256``); all when it is None."""
    if not pattern:
        return list(workloads)
    by_key = [w for w in workloads if w.key.startswith(pattern)]
    if by_key:
        return by_key
    words = pattern.split()
    chosen = [w for w in workloads
              if all(word in (w.description.split() + [w.workload.get("template", ""), w.target.kind])
                     for word in words)]
    if not chosen:
        known = "; ".join(f"{w.key} {w.description}" for w in workloads)
        raise TvmExtError(f"no workload matches {pattern!r}; the file has: {known}")
    return chosen


def tune_result_json(template: Template, target: TargetInfo, result: Any, records: str) -> dict[str, Any]:
    """A ``TuneResult`` as JSON (``tune --json``): workload, best and default, counts."""
    def rec_json(rec: Record | None) -> dict[str, Any] | None:
        if rec is None:
            return None
        rate = throughput(template, rec.cost)
        return {"cost_secs": rec.cost if rec.ok else None, "costs": list(rec.costs),
                "speed": None if rate is None else {"value": rate[0], "unit": rate[1]},
                "config": dict(config_items(template, target, rec.config, shown_only=False)),
                "error_kind": rec.error_kind, "error_msg": rec.error_msg}

    speedup = result.speedup_over_default()
    return {
        "workload_key": result.workload.key,
        "description": template.describe(),
        "target": {"kind": target.kind, "device": target.device_name, "arch": target.arch},
        "best": rec_json(result.best),
        "default": rec_json(result.default),
        "speedup_over_default": speedup if math.isfinite(speedup) else None,
        "trials": result.trials,
        "errors": result.errors,
        "resumed": result.resumed,
        "wall_secs": result.wall_secs,
        "interrupted": result.interrupted,
        "records": os.path.abspath(records),
    }
