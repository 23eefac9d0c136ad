"""Append-only JSON-lines records: one line per measured candidate, safe to share.

Each line is written and flushed as soon as the measurement exists, so an
interrupted run loses nothing; a rerun with the same file reads them back and
never measures a config twice.

The file survives damage: a line that is not a record (torn by a kill mid-write,
invalid UTF-8, valid JSON of the wrong shape or with fields of the wrong type) is
skipped, and one warning per store counts such lines; a new record always starts
on its own line, even after a torn last line.

The file can be shared by several tuners (processes, or machines on a shared file
system): every write holds an exclusive ``flock`` on the file and every read a
shared one, so no reader sees half a line.  Before measuring, a tuner *claims* its
configs in a small side file (``RECORDS.claims``) under the same lock, after
catching up with the records appended by the others; configs another live tuner
has claimed are waited for instead of measured (``claim_batches``), so each config
is measured once.  A claim dies with its process (same host) or after
``claim_secs``.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Container, Iterator, Sequence

from .errors import ErrorKind, TvmExtError
from .space import Config

_SCALARS = (int, float, str, bool, type(None))


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
    # Which search made it, in which run, how long after that run started: enough to
    # compare strategies and plot convergence against wall time.  Older records lack
    # them and read back as "" / "" / None.
    strategy: str = ""
    run: str = ""
    elapsed: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "error_kind", ErrorKind(self.error_kind))  # a kind's string works too

    @property
    def ok(self) -> bool:
        return not self.error_kind and bool(self.costs)

    @property
    def timed_before_timers(self) -> bool:
        """A correct CUDA measurement without ``metrics["timer"]``: taken before each record
        named its timer, by the host loop or TVM's evaluator rather than from a CUDA graph, so
        its cost does not compare with today's.  The tuner measures such a config again
        instead of resuming it, and exports rank without it."""
        target = self.workload.get("target") if isinstance(self.workload, dict) else None
        return self.ok and isinstance(target, dict) and target.get("kind") == "cuda" and "timer" not in self.metrics

    @property
    def ranks(self) -> bool:
        """Whether rankings of the best (exports, summaries) take this record: correct, and
        timed as today's records are (not ``timed_before_timers``)."""
        return self.ok and not self.timed_before_timers

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

    def __str__(self) -> str:
        """One line: time (or error) and config; the trace stays out of sight."""
        config = " ".join(f"{k}={v}" for k, v in self.config.items())
        if self.ok:
            return f"{self.cost * 1e3:.4f} ms  {config}"
        return f"{self.error_kind}: {self.error_msg[:80]}  {config}"

    def to_json(self) -> str:
        data = asdict(self)
        data["costs"] = list(self.costs)
        if self.elapsed is None:
            del data["elapsed"]  # unknown (a record made outside a tuner)
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, line: str | bytes) -> "Record":
        """Parse one line; ``ValueError`` when it is not a well-typed record."""
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError(f"a record is a JSON object, not {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}  # fields of newer versions are ignored
        missing = {"workload_key", "workload", "config", "costs"} - set(data)
        if missing:
            raise ValueError(f"missing fields {sorted(missing)}")
        _check_types(data)
        data["costs"] = tuple(float(c) for c in data["costs"])
        return cls(**data)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_types(data: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the first field whose type a record cannot have."""
    for name in ("workload_key", "error_kind", "error_msg", "source_hash", "strategy", "run"):
        if name in data and not isinstance(data[name], str):
            raise ValueError(f"{name} must be a string")
    for name in ("workload", "config", "metrics"):
        if name in data and not isinstance(data[name], dict):
            raise ValueError(f"{name} must be an object")
    for name in ("build_secs", "timestamp", "elapsed"):
        if name in data and not _is_number(data[name]) and not (name == "elapsed" and data[name] is None):
            raise ValueError(f"{name} must be a number")
    if not all(isinstance(v, _SCALARS) for v in data["config"].values()):
        raise ValueError("config values must be numbers, strings or booleans")
    costs = data["costs"]
    if not isinstance(costs, list) or not all(_is_number(c) and math.isfinite(c) and c >= 0 for c in costs):
        raise ValueError("costs must be a list of seconds")


def _parse_lines(data: bytes) -> tuple[list[Record], int]:
    """The records in ``data`` and how many of its lines are not records.

    Read under the lock, no write is half done: a last line without its newline was
    torn by a killed writer, and counts as not a record."""
    records, skipped = [], 0
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            records.append(Record.from_json(raw.decode("utf-8")))
        except (ValueError, TypeError):  # torn, foreign or ill-typed: never fatal
            skipped += 1
    return records, skipped


def _warn_stderr(message: str) -> None:
    print(message, file=sys.stderr)


def _config_key(config: Config | dict[str, Any]) -> str:
    items = config.as_dict() if isinstance(config, Config) else config
    return json.dumps(sorted(items.items()), separators=(",", ":"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class RecordFeed:
    """The records appended to a store since this feed last looked (by any process).

    Each consumer (a tuner) has its own feed, so several can follow one store.
    """

    def __init__(self, store: "RecordStore"):
        self.store = store
        self._offset = 0
        self._inode: int | None = None
        self._skipped = 0  # lines read so far that are not records

    def new(self) -> list[Record]:
        """Every record added since the previous call (all of them on the first)."""
        with self.store._lock(exclusive=False) as fh:
            st = os.fstat(fh.fileno())
            if st.st_ino != self._inode or st.st_size < self._offset:  # replaced or truncated: start over
                self._inode, self._offset, self._skipped = st.st_ino, 0, 0
            fh.seek(self._offset)
            data = fh.read()
        records, skipped = _parse_lines(data)
        self._offset += len(data)
        self._skipped += skipped
        self.store._saw_skipped(self._skipped)
        return records


class RecordStore:
    """A JSON-lines file of records, appended as results arrive, shareable between processes."""

    # A claim of a process on another host (whose death this host cannot see) expires after
    # this long; a batch that takes longer may then be measured twice, never lost.
    claim_secs = 900.0
    poll_secs = 0.25  # how often a tuner looks for configs another tuner is measuring

    def __init__(self, path: str | os.PathLike[str], warn: Callable[[str], None] | None = None):
        self.path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(directory, exist_ok=True)
            with open(self.path, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise TvmExtError(f"cannot write records file {self.path}: {exc.strerror}") from None
        self.warn = warn or _warn_stderr
        self.skipped_lines = 0  # lines of the file that are not records (last full read)
        self._warned = 0
        self._lock_fh: Any = None
        self._lock_depth = 0
        self._host = socket.gethostname()

    # ---- locking ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _lock(self, exclusive: bool) -> Iterator[Any]:
        """The records file open for reading and appending, under ``flock``; re-entrant
        (a nested call reuses the outer lock, which is exclusive wherever one must be)."""
        if self._lock_fh is not None:
            self._lock_depth += 1
            try:
                yield self._lock_fh
            finally:
                self._lock_depth -= 1
            return
        fh = open(self.path, "a+b")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            self._lock_fh = fh
            yield fh
        finally:
            self._lock_fh = None
            fh.close()  # closing releases the lock

    # ---- reading ---------------------------------------------------------------------------------
    def _saw_skipped(self, count: int) -> None:
        """A reader found ``count`` lines that are not records: one warning per store,
        repeated only when there are more than it already counted."""
        self.skipped_lines = count
        if count > self._warned:
            self.warn(f"warning: {self.path}: skipped {count} unreadable line{'s' * (count != 1)} "
                      f"(not a record: torn by a kill, invalid UTF-8, or fields of the wrong type)")
            self._warned = count

    def __iter__(self) -> Iterator[Record]:
        with self._lock(exclusive=False) as fh:
            fh.seek(0)
            data = fh.read()
        records, skipped = _parse_lines(data)
        self._saw_skipped(skipped)
        return iter(records)

    def feed(self) -> RecordFeed:
        return RecordFeed(self)

    def for_workload(self, workload_key: str) -> list[Record]:
        return [r for r in self if r.workload_key == workload_key]

    def best(self, workload_key: str) -> Record | None:
        """The fastest correct record of a workload, or ``None``."""
        good = [r for r in self.for_workload(workload_key) if r.ok]
        return min(good, key=lambda r: r.cost) if good else None

    # ---- writing ---------------------------------------------------------------------------------
    def append(self, record: Record) -> None:
        line = record.to_json().encode("utf-8") + b"\n"
        with self._lock(exclusive=True) as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() > 0:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":  # a torn last line: ours must not be glued to it
                    line = b"\n" + line
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    # ---- claims: each config measured once by whoever claims it first ------------------------------
    @property
    def claims_path(self) -> str:
        return self.path + ".claims"

    def _read_claims(self) -> list[dict[str, Any]]:
        """Live claims (the caller holds the lock): dead processes' and expired ones dropped."""
        try:
            with open(self.claims_path, encoding="utf-8") as fh:
                claims = json.load(fh)
        except (OSError, ValueError):
            return []
        now = time.time()
        live = []
        for c in claims if isinstance(claims, list) else []:
            try:
                if c["until"] < now or (c["host"] == self._host and not _pid_alive(int(c["pid"]))):
                    continue
                live.append(c)
            except (KeyError, TypeError, ValueError):
                continue
        return live

    def _write_claims(self, claims: list[dict[str, Any]]) -> None:
        if not claims:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.claims_path)
            return
        tmp = f"{self.claims_path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(claims, fh)
        os.replace(tmp, self.claims_path)

    def _mine(self, claim: dict[str, Any]) -> bool:
        return claim["host"] == self._host and claim["pid"] == os.getpid()

    def claim_batches(self, workload_key: str, configs: Sequence[Config],
                      known: Callable[[], Container[Config]]) -> Iterator[list[Config]]:
        """Yield the configs of ``configs`` this process should measure now, claimed for it.

        ``known()`` catches the caller up with the records appended so far (it is called
        under the lock) and returns what is already measured.  Configs another live
        process has claimed are not yielded: they are waited for until their records
        appear, or measured here if that process drops them.  Claims are released when
        the caller comes back for the next batch (or stops).
        """
        todo = list(dict.fromkeys(configs))
        while todo:
            with self._lock(exclusive=True):
                done = known()
                todo = [c for c in todo if c not in done]
                claims = self._read_claims()
                taken = {c["config"] for c in claims if c["workload_key"] == workload_key and not self._mine(c)}
                theirs = [c for c in todo if _config_key(c) in taken]
                mine = [c for c in todo if _config_key(c) not in taken]
                if mine:
                    now = time.time()
                    claims += [{"workload_key": workload_key, "config": _config_key(c), "host": self._host,
                                "pid": os.getpid(), "until": now + self.claim_secs} for c in mine]
                    self._write_claims(claims)
            if mine:
                try:
                    yield mine
                finally:
                    self._release(workload_key, mine)
            elif theirs:
                time.sleep(self.poll_secs)
            todo = theirs

    def _release(self, workload_key: str, configs: Sequence[Config]) -> None:
        keys = {_config_key(c) for c in configs}
        with self._lock(exclusive=True):
            claims = self._read_claims()
            kept = [c for c in claims
                    if not (self._mine(c) and c["workload_key"] == workload_key and c["config"] in keys)]
            self._write_claims(kept)
