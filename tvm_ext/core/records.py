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
``claim_secs``; a claim whose ``until`` lies further ahead than ``MAX_LEASE_FACTOR``
leases (forged, or a clock far ahead) is ignored with one message, so no claim
stalls a tuner for longer than that.

Every line is data until proven a record: whatever one line makes the parser raise
(deep nesting, huge numbers, NaN, wrong types, costs that are not positive seconds)
is that line's problem, skipped and counted in the one warning with its reasons.  A
reader may add a ``check`` (a config against its template's space) whose refusals
are skipped and counted the same way.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import socket
import stat
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Container, Iterator, Sequence

from .errors import ErrorKind, TvmExtError
from .space import Config

# The files a records file keeps beside it, by kind, named in this one place
SIDE_FILES = {"claims": ".claims", "model": ".xgb.json", "ptxas": ".ptxas.json"}


def side_file(records_path: str | os.PathLike[str], kind: str) -> str:
    """The ``kind`` side file of a records file (``SIDE_FILES``): RECORDS.claims beside the file
    itself; the cost model (RECORDS.xgb.json) and the ptxas cache (RECORDS.ptxas.json) named
    from the records file without its .jsonl / .json."""
    path = os.fspath(records_path)
    if kind == "claims":
        return path + SIDE_FILES[kind]
    for ext in (".jsonl", ".json"):
        if path.endswith(ext):
            path = path[: -len(ext)]
            break
    return path + SIDE_FILES[kind]

# Knobs renamed since records were written, per template: a config (a record's, or an exported
# one) naming a knob by its earlier name reads back under today's.  The warpgroup MMA's tile knobs
# were ``wg_*``, the prefix of the CUDA-core GEMM's work-group knobs; three templates carry them.
_WGMMA_EARLIER_NAMES = {f"wg_{name}": f"wgmma_{name}" for name in (
    "bm", "bn", "stages", "inflight", "smem_epilogue", "raster", "tiles", "split_k", "split_cluster")}
RENAMED_KNOBS: dict[str, dict[str, str]] = {
    "gemm_wgmma": _WGMMA_EARLIER_NAMES, "gemm_3xtf32": _WGMMA_EARLIER_NAMES, "gemm_tc_any": _WGMMA_EARLIER_NAMES}


def current_knob_names(template: Any, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` of a ``template`` (its name) with each renamed knob (``RENAMED_KNOBS``) under
    its current name (a new dict); a knob given under both names keeps the current name's value."""
    renames = RENAMED_KNOBS.get(template, {}) if isinstance(template, str) else {}
    if not any(k in renames for k in config):
        return config
    return {renames.get(k, k): v for k, v in config.items() if renames.get(k) not in config}


_SCALARS = (int, float, str, bool, type(None))
MAX_DEPTH = 32  # nesting of a record's JSON (a trace is a few levels deep); deeper is not a record
MAX_COST_SECS = 1e6  # a measured run slower than this (11 days) is not a measurement
MAX_LEASE_FACTOR = 2.0  # a claim's ``until`` at most this many ``claim_secs`` ahead of now

RecordCheck = Callable[["Record"], "str | None"]
"""A reader's extra test of a parsed record: ``None`` to keep it, else why it is skipped."""


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
        """Parse one line; ``ValueError`` when it is not a well-typed record (any other
        exception a hostile line provokes is caught by the readers too)."""
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError(f"a record is a JSON object, not {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}  # fields of newer versions are ignored
        missing = {"workload_key", "workload", "config", "costs"} - set(data)
        if missing:
            raise ValueError(f"missing fields {sorted(missing)}")
        _check_shape(data, line)
        _check_types(data)
        data["costs"] = tuple(float(c) for c in data["costs"])
        template = data["workload"].get("template")
        data["config"] = current_knob_names(template, data["config"])
        trace = data.get("trace")
        if isinstance(trace, dict) and isinstance(trace.get("config"), dict):  # a written kernel's: its config
            data["trace"] = {**trace, "config": current_knob_names(template, trace["config"])}
        return cls(**data)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_shape(data: Any, line: str | bytes) -> None:
    """Raise ``ValueError`` when parsed JSON nests deeper than ``MAX_DEPTH`` (every later
    reader, printer and plot would recurse into it) or holds a lone surrogate (a string no
    file or terminal can take); both checks only run when the text could hold them."""
    text = line if isinstance(line, str) else line.decode("utf-8", "replace")
    if text.count("[") + text.count("{") > MAX_DEPTH:
        stack = [(data, 1)]
        while stack:
            value, depth = stack.pop()
            if depth > MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
            children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    if "\\ud" in text.lower():
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a string holds a lone UTF-16 surrogate") from None


def _finite(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value)


def _check_types(data: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the first field whose type or value a record cannot have."""
    for name in ("workload_key", "error_kind", "error_msg", "source_hash", "strategy", "run"):
        if name in data and not isinstance(data[name], str):
            raise ValueError(f"{name} must be a string")
    for name in ("workload", "config", "metrics"):
        if name in data and not isinstance(data[name], dict):
            raise ValueError(f"{name} must be an object")
    for name in ("build_secs", "timestamp", "elapsed"):
        if name in data and not _finite(data[name]) and not (name == "elapsed" and data[name] is None):
            raise ValueError(f"{name} must be a finite number")
    workload = data["workload"]
    for name, kind in (("template", str), ("params", dict), ("target", dict)):
        if name in workload and not isinstance(workload[name], kind):
            raise ValueError(f"workload {name} must be {'a string' if kind is str else 'an object'}")
    if not all(isinstance(v, _SCALARS) and (not isinstance(v, float) or math.isfinite(v))
               for v in data["config"].values()):
        raise ValueError("config values must be finite numbers, strings or booleans")
    costs = data["costs"]
    if not isinstance(costs, list) or not all(_finite(c) and 0 < c < MAX_COST_SECS for c in costs):
        raise ValueError(f"costs must be a list of seconds, each > 0 and < {MAX_COST_SECS:g}")


def _reason(exc: BaseException) -> str:
    """A short, printable reason for a skipped line (its text may come from the line)."""
    if isinstance(exc, UnicodeDecodeError):
        text = "invalid UTF-8"
    elif isinstance(exc, json.JSONDecodeError):
        text = "not JSON (torn by a kill?)"
    elif isinstance(exc, RecursionError):
        text = "nested too deeply"
    elif isinstance(exc, ValueError):
        text = str(exc)
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= 100 else text[:97] + "..."


def _parse_lines(data: bytes, check: RecordCheck | None = None) -> tuple[list[Record], Counter[str]]:
    """The records in ``data`` and, per reason, how many of its lines are not records.

    Read under the lock, no write is half done: a last line without its newline was
    torn by a killed writer, and counts as not a record.  Whatever a line makes the
    parser or ``check`` raise is that line's problem: it is skipped, never fatal."""
    records: list[Record] = []
    skipped: Counter[str] = Counter()
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            rec = Record.from_json(raw.decode("utf-8"))
            why = check(rec) if check is not None else None
        except Exception as exc:  # torn, foreign, ill-typed or hostile: never fatal
            why = _reason(exc)
        if why is None:
            records.append(rec)
        else:
            skipped[why] += 1
    return records, skipped


def check_regular_file(path: str, what: str = "records file") -> None:
    """Refuse a path that exists and is not a regular file (a FIFO would block the reader or
    writer that opens it forever, a folder cannot be read), before anything opens it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TvmExtError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "not a file")
        raise TvmExtError(f"{path}: the {what} is {kind}, not a regular file")


def _warn_stderr(message: str) -> None:
    print(message, file=sys.stderr)


def _config_key(config: Config | dict[str, Any]) -> str:
    items = config.as_dict() if isinstance(config, Config) else config
    return json.dumps(sorted(items.items()), separators=(",", ":"))


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


def _claim_problem(claim: Any, now: float, max_lease: float) -> str | None:
    """Why a claims-file entry cannot be honest (``None`` when it can): the wrong shape, or
    an ``until`` beyond ``now + max_lease`` (forged, or a clock far ahead): it would keep
    every other tuner waiting for configs nobody measures."""
    if not (isinstance(claim, dict) and isinstance(claim.get("workload_key"), str)
            and isinstance(claim.get("config"), str) and isinstance(claim.get("host"), str)
            and isinstance(claim.get("pid"), int) and not isinstance(claim.get("pid"), bool)
            and _finite(claim.get("until"))):
        return "not a claim"
    if claim["until"] > now + max_lease:
        return f"it runs {claim['until'] - now:.0f} s ahead, more than the {max_lease:.0f} s a claim may"
    return None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:  # 0 and -1 would signal a process group: no process of a claim
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class RecordFeed:
    """The records appended to a store since this feed last looked (by any process).

    Each consumer (a tuner) has its own feed, so several can follow one store.
    """

    def __init__(self, store: "RecordStore", check: RecordCheck | None = None):
        self.store = store
        self.check = check  # e.g. the tuner's: a config of its workload must be in its space
        self._offset = 0
        self._inode: int | None = None
        self._skipped: Counter[str] = Counter()  # lines read so far that are not records, per reason

    def new(self) -> list[Record]:
        """Every record added since the previous call (all of them on the first)."""
        with self.store._lock(exclusive=False) as fh:
            st = os.fstat(fh.fileno())
            if st.st_ino != self._inode or st.st_size < self._offset:  # replaced or truncated: start over
                self._inode, self._offset, self._skipped = st.st_ino, 0, Counter()
            fh.seek(self._offset)
            data = fh.read()
        records, skipped = _parse_lines(data, self.check)
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

    def __init__(self, path: str | os.PathLike[str], warn: Callable[[str], None] | None = None,
                 check: RecordCheck | None = None):
        self.path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(self.path))
        check_regular_file(self.path)  # a FIFO would block the open below forever
        try:
            os.makedirs(directory, exist_ok=True)
            with open(self.path, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise TvmExtError(f"cannot write records file {self.path}: {exc.strerror}") from None
        self.warn = warn or _warn_stderr
        self.check = check  # what every full read (iteration) also asks of a record
        self.skipped_lines = 0  # lines of the file that are not records (last full read)
        self._warned = 0
        self._ignored_claims: set[str] = set()  # forged or stale claims already reported
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
            with contextlib.suppress(OSError):  # a write that failed (full disk) fails its flush again
                fh.close()  # closing releases the lock

    # ---- reading ---------------------------------------------------------------------------------
    def _saw_skipped(self, reasons: Counter[str]) -> None:
        """A reader found lines that are not records (counted per reason): one warning per
        store naming the commonest reasons, repeated only when there are more than it
        already counted."""
        count = sum(reasons.values())
        self.skipped_lines = count
        if count > self._warned:
            common = reasons.most_common(3)
            why = "; ".join(f"{n} {text}" for text, n in common)
            others = len(reasons) - len(common)
            why += f"; {others} other reason{'s' * (others != 1)}" if others > 0 else ""
            self.warn(f"warning: {self.path}: skipped {count} unreadable line{'s' * (count != 1)} "
                      f"(not a record: {why})")
            self._warned = count

    def __iter__(self) -> Iterator[Record]:
        with self._lock(exclusive=False) as fh:
            fh.seek(0)
            data = fh.read()
        records, skipped = _parse_lines(data, self.check)
        self._saw_skipped(skipped)
        return iter(records)

    def feed(self, check: RecordCheck | None = None) -> RecordFeed:
        """A feed of the records appended from now on; ``check`` (else the store's) may
        refuse some, counted in the warning with its reason."""
        return RecordFeed(self, check or self.check)

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
            try:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
            except OSError as exc:  # a full disk: the line may be torn, which readers skip
                raise TvmExtError(f"cannot write records file {self.path}: {exc.strerror or exc}") from None

    # ---- claims: each config measured once by whoever claims it first ------------------------------
    @property
    def claims_path(self) -> str:
        return side_file(self.path, "claims")

    def _read_claims(self) -> list[dict[str, Any]]:
        """Live claims (the caller holds the lock): dead processes' and expired ones dropped,
        and those that cannot be honest (a malformed entry, an ``until`` further ahead than
        ``MAX_LEASE_FACTOR`` leases) ignored with one message each."""
        try:
            check_regular_file(self.claims_path, "claims file")  # a FIFO there would block the read
            with open(self.claims_path, encoding="utf-8") as fh:
                claims = json.load(fh)
        except Exception:  # missing, unreadable, torn or hostile: no claims
            return []
        now = time.time()
        live = []
        for c in claims if isinstance(claims, list) else []:
            why = _claim_problem(c, now, self.claim_secs * MAX_LEASE_FACTOR)
            if why is not None:
                self._ignore_claim(c, why)
            elif c["until"] < now:
                if c["host"] != self._host:  # its owner is gone or hung: whoever measures it now says so
                    self._ignore_claim(c, "expired; its owner on another host did not release it")
            elif not (c["host"] == self._host and not _pid_alive(c["pid"])):
                live.append(c)
        return live

    def _ignore_claim(self, claim: Any, why: str) -> None:
        """Say once per claim that it is ignored, and why."""
        text = _printable(json.dumps(claim, sort_keys=True, default=str)[:200])
        if text not in self._ignored_claims:
            self._ignored_claims.add(text)
            self.warn(f"warning: {self.claims_path}: ignoring a claim ({why}): {text}")

    def _write_claims(self, claims: list[dict[str, Any]]) -> None:
        """Replace the claims file (atomically); a failed write (a full disk) leaves no
        temporary file behind and is one ``TvmExtError`` naming the file."""
        if not claims:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.claims_path)
            return
        tmp = f"{self.claims_path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(claims, fh)
            os.replace(tmp, self.claims_path)
        except OSError as exc:
            raise TvmExtError(f"cannot write claims file {self.claims_path}: {exc.strerror or exc}") from None
        finally:
            with contextlib.suppress(OSError):
                os.remove(tmp)

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
