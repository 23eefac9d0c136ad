"""Append-only JSON-lines records: one line per measured candidate.

Each line is written and flushed as soon as the measurement exists, so an
interrupted run loses nothing; a rerun with the same file reads them back and
never measures a config twice.  A torn last line (killed mid-write) is skipped.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from .errors import ErrorKind, TvmExtError
from .space import Config


@dataclass(frozen=True)
class Record:
    workload_key: str
    workload: dict[str, Any]
    config: dict[str, Any]
    costs: tuple[float, ...]
    error_kind: ErrorKind = ErrorKind.OK
    error_msg: str = ""
    build_secs: float = 0.0
    source_hash: str = ""
    trace: Any = None
    metrics: dict[str, Any] = field(default_factory=dict)  # rel_error, stage_secs, ...
    timestamp: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        object.__setattr__(self, "error_kind", ErrorKind(self.error_kind))  # a kind's string works too

    @property
    def ok(self) -> bool:
        return not self.error_kind and bool(self.costs)

    @property
    def cost(self) -> float:
        """Median seconds per run; +inf for a failed candidate."""
        if not self.ok:
            return math.inf
        ordered = sorted(self.costs)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])

    def config_obj(self) -> Config:
        return Config.of(self.config)

    def to_json(self) -> str:
        data = asdict(self)
        data["costs"] = list(self.costs)
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> "Record":
        data = json.loads(line)
        data["costs"] = tuple(data.get("costs", ()))
        return cls(**data)


class RecordStore:
    """A JSON-lines file of records, appended as results arrive."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(directory, exist_ok=True)
            with open(self.path, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise TvmExtError(f"cannot write records file {self.path}: {exc.strerror}") from None
        self.skipped_lines = 0

    def __iter__(self) -> Iterator[Record]:
        self.skipped_lines = 0
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    yield Record.from_json(line)
                except (ValueError, TypeError):
                    self.skipped_lines += 1  # torn or foreign line: never fatal

    def append(self, record: Record) -> None:
        line = record.to_json() + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def for_workload(self, workload_key: str) -> list[Record]:
        return [r for r in self if r.workload_key == workload_key]

    def best(self, workload_key: str) -> Record | None:
        """The fastest correct record of a workload, or ``None``."""
        good = [r for r in self.for_workload(workload_key) if r.ok]
        return min(good, key=lambda r: r.cost) if good else None
