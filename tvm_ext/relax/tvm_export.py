"""Export tuned schedules as a meta_schedule database, the format TVM's pipelines read.

Our records hold a config and the trace of *our* compute (the template's own TE
PrimFunc).  A TVM user's Relax pipeline looks schedules up by the exact PrimFunc its
lowering produced (e.g. ``fused_matmul_add_relu``), so a record is exported by
replaying its config on that PrimFunc with the template (``schedule(config, target,
func=..., site=...)``) and committing the resulting trace with the task's workload.
``relax.transform.MetaScheduleApplyDatabase`` or ``with target, database:`` then
applies it unchanged.  The measured time of our kernel becomes the record's
``run_secs`` (the fused epilogue is not part of that measurement).

An operator of several kernels and a host plan (the GRU) has no PrimFunc to hang a
meta_schedule record on: its best config goes to ``OPERATORS_FILE`` in the same folder, by
workload key, and ``pipeline.compile_relax`` builds the plan from it.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from ..core.errors import TvmExtError
from ..core.records import Record, RecordStore, current_knob_names
from ..core.space import Config
from ..target import TargetInfo
from .tasks import TaskMatch
from ..core.template import Workload

MAX_REPLAY_TRIES = 5  # best records tried in order when a replay does not compile
OPERATORS_FILE = "tvm_ext_operators.json"  # configs of multi-kernel operators (GRU plans), by workload key


@dataclass(frozen=True)
class Exported:
    """One task's committed record: which of our records, on which PrimFunc."""

    task: str
    workload_key: str  # our records' workload key (the template's)
    config: dict[str, Any]
    run_secs: float


def open_database(work_dir: str) -> Any:
    """A meta_schedule JSONDatabase in ``work_dir`` (created if missing)."""
    from tvm.s_tir import meta_schedule as ms

    try:
        os.makedirs(work_dir, exist_ok=True)
    except OSError as exc:
        raise TvmExtError(f"cannot create database folder {work_dir}: {exc.strerror}") from None
    return ms.database.JSONDatabase(work_dir=work_dir)


def tvm_target(target: TargetInfo) -> Any:
    import tvm

    return tvm.target.Target(target.tvm_target())


def ranked_records(store: RecordStore, match: TaskMatch | Any, target: TargetInfo) -> list[Record]:
    """The records of the task's template workload (or of a template) that rank
    (``Record.ranks``: correct, timed as today's), fastest first."""
    template = match.template if isinstance(match, TaskMatch) else match
    assert template is not None
    key = Workload.of(template, target).key
    return sorted((r for r in store.for_workload(key) if r.ranks), key=lambda r: r.cost)


def already_exported(db: Any, task_mod: Any, target: TargetInfo) -> bool:
    """Whether the database holds a tuning record for the task's PrimFunc on ``target``."""
    return bool(db.has_workload(task_mod)) and db.query_tuning_record(task_mod, tvm_target(target), "main") is not None


def read_operators(database: str) -> dict[str, dict[str, Any]]:
    """``OPERATORS_FILE`` of a database folder: workload key -> entry (empty when absent)."""
    path = os.path.join(database, OPERATORS_FILE)
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return {key: _current_names(entry) for key, entry in dict(data["operators"]).items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TvmExtError(f"{path} is not a tvm_ext operators file: {exc}") from None


def _current_names(entry: Any) -> Any:
    """An operators file's entry with its config's renamed knobs under their current names."""
    if not (isinstance(entry, dict) and isinstance(entry.get("config"), dict)):
        return entry
    return {**entry, "config": current_knob_names(entry.get("template"), entry["config"])}


def export_operator(database: str, template: Any, store: RecordStore, target: TargetInfo) -> Exported | str:
    """The best record of ``template`` (a GRU) into ``OPERATORS_FILE``; else why none."""
    records = ranked_records(store, template, target)
    if not records:
        return f"no correct record for its {template.name} template yet"
    best = records[0]
    key = Workload.of(template, target).key
    operators = read_operators(database)
    entry = {"template": template.name, "workload": template.describe(), "config": dict(best.config),
             "run_secs": best.cost, "target": target.kind}
    if operators.get(key) != entry:
        operators[key] = entry
        fd, tmp = tempfile.mkstemp(dir=database, prefix=".operators")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"version": 1, "operators": operators}, fh, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(database, OPERATORS_FILE))
    return Exported(template.describe(), best.workload_key, dict(best.config), best.cost)


def replay(match: TaskMatch, config: Config, task_mod: Any, target: TargetInfo) -> Any:
    """Schedule the task's PrimFunc with ``config``; lowers it as a check."""
    from ..measure.program import lower_check

    assert match.template is not None and match.site is not None
    sch = match.template.schedule(config, target, func=task_mod["main"], site=match.site)
    # a trace that does not lower must not be exported (its own compute was compiled and run)
    lower_check(sch.mod, target, match.template.pass_config(config, target))
    return sch


def commit(db: Any, task_mod: Any, match: TaskMatch, config: Config, run_secs: float,
           target: TargetInfo) -> Any:
    """Replay ``config`` on the task and commit the trace as the task's tuning record."""
    from tvm.s_tir import meta_schedule as ms

    if not math.isfinite(run_secs):  # JSONDatabase writes it but can no longer read the file back
        raise ValueError(f"run_secs must be finite, got {run_secs}")
    sch = replay(match, config, task_mod, target)
    workload = db.commit_workload(task_mod)
    if not _already_committed(db, workload, run_secs):  # a rerun exports the same record again
        db.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, workload, run_secs=[float(run_secs)], target=tvm_target(target),
            args_info=ms.arg_info.ArgInfo.from_prim_func(task_mod["main"])))
    return sch


def export_task(db: Any, task_mod: Any, match: TaskMatch, store: RecordStore,
                target: TargetInfo) -> Exported | str:
    """Commit the best record that replays on ``task_mod``; else the reason none did."""
    if not match.matched:
        return match.reason
    records = ranked_records(store, match, target)
    if not records:
        return f"no correct record for its {match.template.name} template yet"
    errors = []
    for record in records[:MAX_REPLAY_TRIES]:
        try:
            commit(db, task_mod, match, record.config_obj(), record.cost, target)
        except Exception as exc:
            lines = [l for l in str(exc).strip().splitlines() if l.strip()]
            errors.append(lines[-1] if lines else type(exc).__name__)
            continue
        return Exported(match.name, record.workload_key, dict(record.config), record.cost)
    return f"no record replays on the task: {errors[0][:200]}"


def _already_committed(db: Any, workload: Any, run_secs: float) -> bool:
    top = db.get_top_k(workload, 1)
    return bool(top) and top[0].run_secs is not None and len(top[0].run_secs) == 1 \
        and abs(float(top[0].run_secs[0]) - run_secs) <= 1e-12 * max(1.0, run_secs)

