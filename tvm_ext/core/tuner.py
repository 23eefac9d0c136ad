"""The tuning driver: strategy → feasibility → dedup → build (parallel) → measure (batch) → record.

It owns the measure loop so every strategy gets the same guarantees: infeasible
configs cost +inf without a build, a config (or a generated source) already
measured is never measured again, a generation is deduplicated by config and by
generated source before the runner gets it, each result is appended to the records
file as it arrives, and Ctrl-C returns the best so far.  Before each batch it catches
up with the records other processes appended to the same file and claims what it
measures (``RecordStore.claim_batches``), so tuners sharing a file measure each config
once.

Builds overlap measurement (``overlap``): a batch goes to the build pool in chunks of one
round of the pool, each build handed to the runner as soon as it ends (not when its chunk
does), and the next chunk starts while the runner measures; at most ``2 x chunk``
candidates are building or built and not yet measured (the bounded queue ``BuildQueue``).
The next batch is not built ahead: a strategy proposes it from this batch's costs (the
GA's generation barrier).  The default config is measured with the first batch, not alone
before it.
"""
from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from ..measure.builder import BuildResult
from ..measure.pools import settle
from .errors import ErrorKind
from .records import Record, RecordStore
from ..measure.runner import Runner, RunResult
from .search import SearchStrategy
from .space import Config
from ..target import TargetInfo
from .template import Template, Workload

AHEAD_AFTER = 4  # the next batch starts building when this many jobs per device are left to measure
AHEAD_KEPT = 256  # candidates built ahead and kept for a later batch at most


class Builder(Protocol):
    def build(self, template: Template, configs: Sequence[Config], target: TargetInfo) -> list[BuildResult]: ...

    def close(self) -> None: ...


@dataclass
class TuneResult:
    workload: Workload
    best: Record | None
    default: Record | None
    trials: int  # measurements made in this run
    errors: int  # of which failed
    resumed: int  # records read back from an earlier run
    wall_secs: float
    interrupted: bool = False
    history: list[float] = field(default_factory=list)  # best cost after each batch

    def speedup_over_default(self) -> float:
        if self.best is None or self.default is None or not self.default.ok:
            return math.nan
        return self.default.cost / self.best.cost


ProgressHook = Callable[[Record, "Tuner"], None]


def in_completion_order(futures: Sequence[Future]) -> Iterator[int]:
    """Indices of ``futures`` as they complete; those done together in submission order
    (a runner that resolves at once then gives a reproducible order)."""
    left = list(range(len(futures)))
    while left:
        done = [i for i in left if futures[i].done()]
        if not done:
            wait([futures[i] for i in left], return_when=FIRST_COMPLETED)
            continue
        for i in done:
            yield i
        left = [i for i in left if i not in set(done)]


def in_thread(function: Callable[..., Any], *args: Any) -> Future:
    """``function(*args)`` on a daemon thread (a build in flight never holds up the exit)."""
    future: Future = Future()

    def run() -> None:  # settled once: the caller may have cancelled it (a build ahead no longer wanted)
        try:
            settle(future, function(*args))
        except BaseException as exc:  # the caller sees it at ``result()``
            settle(future, None, exc)

    threading.Thread(target=run, name="tvm_ext-build-ahead", daemon=True).start()
    return future


@dataclass
class BuildQueue:
    """How many candidates are building, or built and waiting for or in measurement
    (``waiting``), never more than ``limit``: a chunk starts building only when it fits
    beside them."""

    limit: int
    waiting: int = 0
    most: int = 0  # the most that ever waited

    def fits(self, chunk: int) -> bool:
        return self.waiting + chunk <= self.limit

    def add(self, count: int) -> None:
        self.waiting += count
        self.most = max(self.most, self.waiting)
        assert self.waiting <= self.limit, (self.waiting, self.limit)

    def done(self) -> None:
        self.waiting -= 1


class Tuner:
    """Measures configs of one workload, with resume and dedup, under a trial budget.

    ``overlap`` sends a batch to the builder in chunks of ``chunk`` configs (default: the
    builder's ``workers``, one round of its pool; a builder without a pool, a replay's, builds
    each batch whole), each build measured as it ends, the next chunk started while the runner
    measures the ones before it."""

    def __init__(self, template: Template, target: TargetInfo, builder: Builder, runner: Runner,
                 store: RecordStore, trials: int = 1 << 30, on_record: ProgressHook | None = None,
                 strategy: str = "", overlap: bool = True, chunk: int | None = None):
        self.template = template
        self.target = target
        self.space = template.space(target)
        self.builder = builder
        self.runner = runner
        self.store = store
        self.workload = Workload.of(template, target)
        self.trials_budget = trials
        self.on_record = on_record
        self.overlap = overlap
        self.chunk = chunk
        self.most_waiting = 0  # the most candidates building or waiting for measurement at once
        self.built_ahead = 0  # candidates whose build was started by ``_build_ahead`` and then measured
        self._ahead: OrderedDict[Config, Future] = OrderedDict()  # builds started ahead of their batch
        self._peek: tuple[Any, np.ndarray, list[Config]] | None = None  # the batch in measurement, to peek past
        self.trials = 0
        self.errors = 0
        self._cost: dict[Config, float] = {}
        self._by_source: dict[str, Record] = {}
        self._records: dict[Config, Record] = {}
        self.strategy = strategy  # recorded with each measurement; tune() names it if empty
        self._started = time.time()
        self.run = f"{socket.gethostname()}-{os.getpid()}-{int(self._started)}"
        self._stop = threading.Event()  # ``stop()``: no new batch (a stop seen by another thread)
        self._feed = store.feed(check=self._outside_reason)
        self.stale = 0  # records set aside by ``_catch_up``: timed by an older protocol
        self._catch_up()
        self.resumed = len(self._records)

    def _outside_reason(self, rec: Record) -> str | None:
        """A record of this workload whose config is not in the space (a forged or foreign
        line) is skipped by the feed with this reason: never resumed, never the best."""
        if rec.workload_key != self.workload.key:
            return None
        why = self.space.outside_reason(rec.config_obj())
        return f"config outside its template's space: {why}" if why else None

    def _catch_up(self) -> Mapping[Config, float]:
        """Take in the records appended since the last look (ours, or another process's
        sharing the file); returns every config whose cost is known."""
        for rec in self._feed.new():
            if rec.workload_key != self.workload.key or rec.config_obj() in self._records:
                continue
            if rec.timed_before_timers:  # its cost does not compare with this run's: measure again
                self.stale += 1
                continue
            self._remember(rec)
        return self._cost

    def _remember(self, rec: Record) -> None:
        cfg = rec.config_obj()
        self._records[cfg] = rec
        self._cost[cfg] = rec.cost
        if rec.source_hash and rec.ok:
            self._by_source[rec.source_hash] = rec

    @property
    def best(self) -> Record | None:
        good = [r for r in self._records.values() if r.ok]
        return min(good, key=lambda r: r.cost) if good else None

    def record_of(self, config: Config) -> Record | None:
        return self._records.get(config)

    def known_configs(self) -> list[Config]:
        """Every config of this workload with a record: measured here, resumed, or appended
        since by another process sharing the file."""
        return list(self._catch_up())

    @property
    def budget_left(self) -> int:
        return self.trials_budget - self.trials

    def stop(self) -> None:
        """End the search after the batch in flight (its results recorded), as Ctrl-C does; for
        a tuner in another thread than the one the stop reached."""
        self._stop.set()

    def evaluate(self, configs: Sequence[Config]) -> np.ndarray:
        """Cost (s) of each config; measures only what is new, feasible and within budget.

        Configs beyond the budget get +inf (unmeasured) so a strategy can still rank.
        """
        pending: list[Config] = []
        for cfg in dict.fromkeys(configs):  # unique, in order
            if cfg in self._cost:
                continue
            if not self.space.is_feasible(cfg):
                self._cost[cfg] = math.inf  # kept, never built
                continue
            if len(pending) < self.budget_left:
                pending.append(cfg)
        if pending:
            for mine in self.store.claim_batches(self.workload.key, pending, self._catch_up):
                self._build_and_measure(mine)
        return np.array([self._cost.get(c, math.inf) for c in configs], dtype=np.float64)

    def chunk_size(self, batch: int) -> int:
        """Configs sent to the builder at once with overlap: the whole batch for a builder
        without a pool."""
        chunk = self.chunk or getattr(self.builder, "workers", None)
        return max(1, min(batch, int(chunk))) if chunk else batch

    def _build_and_measure(self, configs: Sequence[Config]) -> None:
        """Build ``configs`` and hand each build to the runner as soon as it ends, while more
        build; at most ``2 x chunk`` candidates are building or built and not yet measured (the
        queue).  Each result is recorded as it arrives (those done together in submission
        order).  Without overlap the batch is built whole, then measured."""
        if not self.overlap or len(configs) == 1:
            batch = _Batch(BuildQueue(len(configs)))
            batch.queue.add(len(configs))
            self._submit(self.builder.build(self.template, list(configs), self.target), batch)
            self._collect(batch, block=True)
            return
        size = self.chunk_size(len(configs))
        batch = _Batch(BuildQueue(2 * size))
        left = list(configs)
        building: list[Future] = []
        while left or building or batch.inflight:
            while left and batch.queue.fits(min(size, len(left))):
                group, left = left[:size], left[size:]
                batch.queue.add(len(group))
                building += self._start_builds(group)
            wait([f for f, _, _ in batch.inflight] + building, return_when=FIRST_COMPLETED)
            self._collect(batch, block=False)
            ended = [f.done() for f in building]
            built = [f.result() for f, end in zip(building, ended) if end]
            building = [f for f, end in zip(building, ended) if not end]
            if built:
                self._submit(built, batch)
            if not left and not building:
                self._build_ahead(batch, size)
        self.most_waiting = max(self.most_waiting, batch.queue.most)

    def _build_ahead(self, batch: "_Batch", size: int) -> None:
        """Once a batch is built and its last few candidates measure, start building the next
        batch as the strategy would propose it were the unmeasured ones to fail (``peek``): the
        GA's next generation is then built, not waited for, when its turn comes.  Nothing is
        measured ahead, so the search and its records are those of a run without it; a
        candidate the real batch does not hold stays built for a later one (``AHEAD_KEPT``)."""
        if self._peek is None or len(batch.inflight) > AHEAD_AFTER * max(1, getattr(self.runner, "in_flight", 1)):
            return
        room = min(size, batch.queue.limit - batch.queue.waiting, self.budget_left - len(batch.inflight))
        if room <= 0:  # the queue is full: look again when a measurement frees a place
            return
        strategy, rows, configs = self._peek
        self._peek = None
        rows_next = strategy.peek(rows, np.array([self._cost.get(c, math.inf) for c in configs]))
        if rows_next is None:
            return
        fresh = [c for c in dict.fromkeys(self.space.decode(r) for r in rows_next)
                 if c not in self._cost and c not in self._ahead and self.space.is_feasible(c)][:room]
        if fresh:
            self._ahead.update(zip(fresh, self.builder.submit(self.template, fresh, self.target)))  # type: ignore[attr-defined]
        while len(self._ahead) > AHEAD_KEPT:
            self._ahead.popitem(last=False)[1].cancel()

    def _start_builds(self, configs: Sequence[Config]) -> list[Future]:
        """A future per config for its ``BuildResult``: the builder's own (``submit``, each
        resolved as its build ends), or, for a builder that only builds lists, the list's
        build on a thread, every future resolved when it ends."""
        submit = getattr(self.builder, "submit", None)
        if submit is not None:
            ahead = [self._ahead.pop(c, None) for c in configs]
            ahead = [None if f is None or f.cancelled() else f for f in ahead]
            self.built_ahead += sum(f is not None for f in ahead)
            rest = [c for c, f in zip(configs, ahead) if f is None]
            started = iter(submit(self.template, rest, self.target) if rest else ())
            return [f if f is not None else next(started) for f in ahead]
        whole = in_thread(self.builder.build, self.template, configs, self.target)
        futures: list[Future] = [Future() for _ in configs]

        def fan_out(done: Future) -> None:
            try:
                results = done.result()
            except BaseException as exc:
                for future in futures:
                    settle(future, None, exc)
                return
            for future, result in zip(futures, results):
                settle(future, result)

        whole.add_done_callback(fan_out)
        return futures

    def _submit(self, builds: Sequence[BuildResult], batch: "_Batch") -> None:
        """Builds that ended (each counted in the queue when it started): failed builds are
        recorded as they are; a program already measured (same generated source) is not
        measured again, nor twice within the batch; the runner gets the rest at once."""
        fresh: list[BuildResult] = []
        for build in builds:
            if build.artifact is None:
                batch.queue.done()
                self._record(build, RunResult((), build.error_kind or ErrorKind.BUILD_ERROR, build.error_msg))
                continue
            source_hash = build.artifact.source_hash
            known = self._by_source.get(source_hash) or batch.recorded.get(source_hash)
            if known is not None:  # same kernel as one already measured
                batch.queue.done()
                self._alias(build.config, known)
            elif source_hash in batch.twins:  # same kernel as one in measurement
                batch.queue.done()
                batch.twins[source_hash].append(build.config)
            else:
                batch.twins[source_hash] = []
                fresh.append(build)
        if not fresh:
            return
        futures = self.runner.submit(self.template, fresh)
        batch.inflight += [(future, build.artifact.source_hash, build)  # type: ignore[union-attr]
                           for future, build in zip(futures, fresh)]

    def _collect(self, batch: "_Batch", block: bool) -> None:
        """Record the measurements that are done (``block``: every one, as they arrive)."""
        while batch.inflight:
            futures = [f for f, _, _ in batch.inflight]
            if block:
                index = next(in_completion_order(futures))
            else:
                index = next((i for i, f in enumerate(futures) if f.done()), -1)
                if index < 0:
                    return
            future, source_hash, build = batch.inflight.pop(index)
            batch.queue.done()
            rec = self._record(build, future.result())
            batch.recorded[source_hash] = rec
            for config in batch.twins.pop(source_hash):
                self._alias(config, rec)

    def _alias(self, config: Config, rec: Record) -> None:
        self._cost[config] = rec.cost
        self._records[config] = rec

    def _record(self, build: BuildResult, result: RunResult) -> Record:
        rec = Record(
            workload_key=self.workload.key,
            workload=self.workload.as_json(),
            config=build.config.as_dict(),
            costs=result.costs,
            error_kind=result.error_kind,
            error_msg=result.error_msg,
            build_secs=round(build.build_secs, 4),
            source_hash=build.artifact.source_hash if build.artifact else "",
            trace=build.trace,
            metrics=result.metrics,
            strategy=self.strategy,
            run=self.run,
            elapsed=round(time.time() - self._started, 3),
        )
        self.store.append(rec)
        self._remember(rec)
        self.trials += 1
        self.errors += 0 if rec.ok else 1
        if self.on_record:
            self.on_record(rec, self)
        return rec

    def tune(self, strategy: SearchStrategy, default: Config | None = None,
             measure_default: bool = True) -> TuneResult:
        """Run ``strategy`` until it is done or the budget is spent, the default config (the
        baseline the result's speedup is over) measured first unless ``measure_default`` is off."""
        start = time.perf_counter()
        interrupted = False
        history: list[float] = []
        default = default or self.template.default_config(self.target)
        self.strategy = self.strategy or type(strategy).__name__
        first = [default] if measure_default else []  # measured with the first batch, first in it
        peeks = self.overlap and hasattr(strategy, "peek") and hasattr(self.builder, "submit")
        prepare = getattr(self.runner, "prepare", None)
        if prepare is not None:  # the check's data travels while the first batch builds
            prepare(self.template, default)
        try:
            while not strategy.done and self.budget_left > 0 and not self._stop.is_set():
                batch = strategy.propose()
                configs = [self.space.decode(row) for row in batch]
                self._peek = (strategy, batch, configs) if peeks else None
                costs = self.evaluate(first + configs)[len(first):]
                first = []
                strategy.observe(batch, costs)
                history.append(self.best.cost if self.best else math.inf)
            if first and self.budget_left > 0 and not self._stop.is_set():  # no batch came
                self.evaluate(first)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            self._peek = None
            while self._ahead:
                self._ahead.popitem()[1].cancel()
        return TuneResult(
            workload=self.workload, best=self.best, default=self.record_of(default),
            trials=self.trials, errors=self.errors, resumed=self.resumed,
            wall_secs=time.perf_counter() - start, interrupted=interrupted or self._stop.is_set(), history=history,
        )


@dataclass
class _Batch:
    """One claimed batch in flight: its queue of built candidates, the runner's futures with
    what they measure, the configs waiting for a twin's record, and the records made."""

    queue: BuildQueue
    inflight: list[tuple[Future, str, BuildResult]] = field(default_factory=list)
    twins: dict[str, list[Config]] = field(default_factory=dict)
    recorded: dict[str, Record] = field(default_factory=dict)
