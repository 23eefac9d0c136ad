"""Replay a recorded sweep: strategies are compared, and CI tests them, without hardware.

A sweep file (``benchmarks/sweep_gemm.py``) is gzipped JSON lines: a header
``{"workload", "target", "knobs", "feasible_space", "measured"}`` (newer files also carry
``"target_info"``, the full :class:`TargetInfo`), then one line per measured config
``{"config": {...}, "cost": seconds | null, "error_kind": ""}``.

The replay plugs into the real :class:`~tvm_ext.core.tuner.Tuner`: :class:`ReplayTemplate`
wraps the operator's template and adds one constraint to its space, "recorded in the
sweep", so every strategy (GA, random, GA + cost model, analytic) only gets measurements
for recorded configs and a config outside the sweep costs +inf without a trial, exactly
like a config that breaks a hardware limit.  :class:`ReplayBuilder` and
:class:`ReplayRunner` implement the Builder/Runner protocols by looking costs up.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Iterator, Mapping, Sequence

import numpy as np

from tvm_ext.measure.builder import Artifact, BuildResult
from tvm_ext.core.errors import ErrorKind, TvmExtError
from tvm_ext.core.records import Record, RecordStore
from tvm_ext.measure.runner import RunResult, resolved
from tvm_ext.core.space import Config, Space
from tvm_ext.target import TargetInfo, offline_cuda
from tvm_ext.operators import get_template_class
from tvm_ext.core.template import Template, TensorSpec


@dataclass(frozen=True)
class SweepEntry:
    """One recorded measurement: cost in seconds, +inf when the config failed."""

    config: Config
    cost: float
    error_kind: str = ""


@dataclass(frozen=True)
class Sweep:
    """A recorded sweep of one workload, loaded in the template's knob order."""

    path: str
    header: Mapping[str, Any]
    entries: tuple[SweepEntry, ...]
    costs: Mapping[Config, float] = field(repr=False, compare=False)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Sweep":
        path = os.fspath(path)
        try:
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                lines = [line for line in fh if line.strip()]
        except (OSError, EOFError) as exc:
            raise TvmExtError(f"cannot read sweep {path}: {exc}") from None
        if not lines:
            raise TvmExtError(f"sweep {path} is empty")
        header = json.loads(lines[0])
        for key in ("workload", "target", "knobs"):
            if key not in header:
                raise TvmExtError(f"sweep {path} has no {key!r} in its header line")
        names = tuple(header["knobs"])
        entries = []
        for line in lines[1:]:
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a torn last line (the sweep was killed): skip it
            cfg = Config(tuple((k, row["config"][k]) for k in names))
            cost = row.get("cost")
            ok = cost is not None and math.isfinite(cost) and cost > 0
            entries.append(SweepEntry(cfg, float(cost) if ok else math.inf,
                                      row.get("error_kind", "") or ("" if ok else "run_error")))
        costs = {e.config: e.cost for e in entries}
        return cls(path, header, tuple(entries), costs)

    # ---- what the sweep measured --------------------------------------------------------
    @property
    def name(self) -> str:
        return os.path.basename(self.path).split(".jsonl")[0]

    @property
    def best(self) -> SweepEntry:
        return min(self.entries, key=lambda e: e.cost)

    @property
    def best_cost(self) -> float:
        return self.best.cost

    def cost(self, config: Config) -> float:
        """Recorded seconds of ``config``; +inf when it failed or was not recorded."""
        return self.costs.get(config, math.inf)

    def template(self) -> Template:
        """The operator's real template at the recorded shape."""
        wl = self.header["workload"]
        return get_template_class(wl["template"])(**wl["params"])

    def target(self) -> TargetInfo:
        """The recording device's limits: the header's ``target_info`` when present, else
        the documented offline limits of the CUDA arch (sweeps recorded before it existed)."""
        info = self.header.get("target_info")
        key = self.header["target"]
        if info:
            return TargetInfo(**info)
        if key["kind"] == "cuda":
            return dataclasses.replace(offline_cuda(key.get("arch") or "sm_90"), device_name=key["device"])
        raise TvmExtError(f"sweep {self.path} has no target_info for its {key['kind']} device")


@dataclass(frozen=True)
class ReplaySpace(Space):
    """The template's space restricted to the recorded configs (fast sampling and masks)."""

    recorded: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), compare=False, repr=False)

    @classmethod
    def of(cls, base: Space, sweep: Sweep) -> "ReplaySpace":
        costs = sweep.costs
        def in_sweep(c: Config) -> str | None:
            return None if c in costs else "not recorded in the sweep"

        rows = np.array([base.encode(e.config) for e in sweep.entries], dtype=np.int64)
        flat = np.unique(np.ravel_multi_index(rows.T, base.cardinalities))
        return cls(base.knobs, (in_sweep,), flat)

    def feasible_mask(self, indices: np.ndarray) -> np.ndarray:
        """Vectorized ``is_feasible`` over index rows: recorded or not."""
        flat = np.ravel_multi_index(np.asarray(indices, dtype=np.int64).T, self.cardinalities)
        return np.isin(flat, self.recorded)

    def random_feasible_indices(self, rng: np.random.Generator, count: int,
                                max_draws: int = 10_000) -> np.ndarray:
        """Distinct recorded configs drawn uniformly: what rejection sampling would give."""
        take = rng.choice(len(self.recorded), size=min(count, len(self.recorded)), replace=False)
        return self.rows_of(self.recorded[take])

    def flat(self, indices: np.ndarray) -> np.ndarray:
        """One integer per index row (its position in the cross product)."""
        return np.ravel_multi_index(np.asarray(indices, dtype=np.int64).reshape(-1, len(self.knobs)).T,
                                    self.cardinalities)

    def rows_of(self, flat: np.ndarray) -> np.ndarray:
        return np.stack(np.unravel_index(np.asarray(flat, dtype=np.int64), tuple(self.cardinalities)),
                        axis=1).astype(np.int64).reshape(-1, len(self.knobs))

    def nearest_recorded(self, indices: np.ndarray, rng: np.random.Generator,
                         exclude: set[int] | None = None) -> np.ndarray:
        """Each row moved to the closest recorded config (L1 over choice indices: the knobs
        are ordered) that is not in ``exclude`` and not taken by an earlier row; ties are
        broken at random.  A row with nothing left to move to is returned unchanged."""
        indices = np.asarray(indices, dtype=np.int64)
        table = self.rows_of(self.recorded)
        free = ~np.isin(self.recorded, np.fromiter(exclude or (), dtype=np.int64))
        dist = np.abs(indices[:, None, :] - table[None, :, :]).sum(axis=2).astype(np.float64)
        dist += rng.random(dist.shape) * 0.5  # random tie-break below one step
        out = indices.copy()
        for i in range(len(indices)):
            if not free.any():
                break
            j = int(np.argmin(np.where(free, dist[i], np.inf)))
            out[i] = table[j]
            free[j] = False
        return out


@dataclass(frozen=True)
class ReplayTemplate(Template):
    """The recorded workload: the real template's identity, the sweep's configs only."""

    base: Template
    sweep: Sweep = field(repr=False)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.base.name

    @property
    def params(self) -> dict[str, Any]:
        return self.base.params

    @property
    def source_hash(self) -> str:  # type: ignore[override]
        return str(self.sweep.header["workload"].get("template_hash", "replay"))

    def space(self, target: TargetInfo) -> Space:
        return ReplaySpace.of(self.base.space(target), self.sweep)

    def default_config(self, target: TargetInfo) -> Config:
        return self.base.default_config(target)

    def schedule(self, config: Config, target: TargetInfo) -> Any:
        return self.base.schedule(config, target)

    def inputs(self) -> list[TensorSpec]:
        return self.base.inputs()

    def outputs(self) -> list[TensorSpec]:
        return self.base.outputs()

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return self.base.reference(inputs)

    def flops(self) -> float:
        return self.base.flops()

    def bytes_moved(self) -> float:
        return self.base.bytes_moved()

    def describe(self) -> str:
        return f"replay of {self.base.describe()}"


class NearestRecorded:
    """A GA ``repair`` for replays: offspring are moved to the nearest recorded config not
    proposed before, as if the child's closest measured neighbour had been measured.

    Without it a GA in a sparse sweep (1 recorded config in 100+) rarely breeds a recorded
    child and stalls; with it each generation measures a full batch of new configs.
    """

    def __init__(self, space: ReplaySpace):
        self.space = space
        self.proposed: set[int] = set()

    def __call__(self, indices: np.ndarray, rng: np.random.Generator,
                 exclude: set[int] | None = None) -> np.ndarray:
        own = exclude is None
        out = self.space.nearest_recorded(indices, rng, self.proposed if own else exclude)
        if own:
            self.proposed.update(int(f) for f in self.space.flat(out))
        return out


class ReplayBuilder:
    """Builder protocol: an 'artifact' per recorded config; recorded build errors stay errors."""

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        self._errors = {e.config: e.error_kind for e in sweep.entries}

    def build(self, template: Template, configs: Sequence[Config], target: TargetInfo) -> list[BuildResult]:
        out = []
        for cfg in configs:
            kind = self._errors.get(cfg)
            if kind is None:
                out.append(BuildResult(cfg, None, None, 0.0, ErrorKind.BUILD_ERROR, "not recorded in the sweep"))
            elif kind.startswith("build"):
                out.append(BuildResult(cfg, None, None, 0.0, ErrorKind(kind), "recorded failure"))
            else:  # the source only has to be unique: the tuner dedups by its hash
                out.append(BuildResult(cfg, Artifact(target.kind, f"// replay {cfg}", (), ()), None, 0.0))
        return out

    def close(self) -> None:
        pass


class ReplayRunner:
    """Runner protocol: the recorded cost, or the recorded error kind (futures already done)."""

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        self._entries = {e.config: e for e in sweep.entries}

    def submit(self, template: Template, builds: Sequence[BuildResult]) -> list["Future[RunResult]"]:
        return [resolved(self._result(build)) for build in builds]

    def _result(self, build: BuildResult) -> RunResult:
        entry = self._entries.get(build.config)
        if build.artifact is None or entry is None:
            return RunResult((), build.error_kind or ErrorKind.RUN_ERROR, build.error_msg or "not recorded")
        if math.isfinite(entry.cost):
            return RunResult((entry.cost,), metrics={"timer": "replay of a recorded sweep"})
        return RunResult((), ErrorKind(entry.error_kind or ErrorKind.RUN_ERROR), "recorded failure")

    def close(self) -> None:
        pass


class MemoryRecordStore(RecordStore):
    """A record store that never touches the disk (thousands of replayed tuning runs)."""

    def __init__(self, records: Sequence[Record] = ()):  # noqa: D107 - no file, no super()
        self.path = ":memory:"
        self.skipped_lines = 0
        self._records: list[Record] = list(records)

    def __iter__(self) -> Iterator[Record]:
        return iter(list(self._records))

    def append(self, record: Record) -> None:
        self._records.append(record)

    def feed(self, check: Any = None) -> "_MemoryFeed":
        """The records appended from now on; made in this process, so ``check`` (a reader's
        test of records from a file) is not asked."""
        return _MemoryFeed(self._records)

    def claim_batches(self, workload_key: str, configs: Sequence[Config],
                      known: Callable[[], Container[Config]]) -> Iterator[list[Config]]:
        """One process, no one to share with: everything not yet known, at once."""
        todo = [c for c in dict.fromkeys(configs) if c not in known()]
        if todo:
            yield todo


@dataclass
class _MemoryFeed:
    """``RecordFeed`` of a list: the records appended since the last call."""

    records: list[Record]
    seen: int = 0

    def new(self) -> list[Record]:
        fresh = self.records[self.seen:]
        self.seen = len(self.records)
        return fresh


def sweep_records(sweep: Sweep) -> list[Record]:
    """The sweep as tuner records (for training a cost model on another shape's sweep)."""
    from tvm_ext.core.template import Workload

    template, target = sweep.template(), sweep.target()
    wl = Workload(template.name, tuple(sorted(template.params.items())), tuple(sorted(target.key().items())),
                  str(sweep.header["workload"].get("tvm_version", "")),
                  str(sweep.header["workload"].get("template_hash", "")))
    out = []
    for e in sweep.entries:
        ok = math.isfinite(e.cost)
        out.append(Record(wl.key, wl.as_json(), e.config.as_dict(), (e.cost,) if ok else (),
                          "" if ok else (e.error_kind or "run_error"), timestamp=0.0))
    return out
