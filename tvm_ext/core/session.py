"""One way in: options -> builder, runner, search strategy, records, tuner.

Every tuning run goes through a ``Session``: the CLI's subcommands (``tune gemm``, ``gru``,
``model``, ``mixed-precision``), the Relax pipeline, the replay of recorded sweeps, the
benchmarks and the examples.  What a name means is decided in one place, the registries:
``STRATEGIES`` maps a strategy name to the factory of its search, ``RUNNERS`` a runner
name to its entry (the factory of the runner and the check of its options; ``rpc``'s
devices are elsewhere, so its runner is made first and the run's target is its servers').
A new strategy or runner is one entry there; the CLI's choices and the errors for unknown names follow from them.

    with Session(SessionOptions(generations=2, records="r.jsonl")) as session:
        result = session.tune(GemmTemplate(512, 512, 512))
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..measure.builder import LocalBuilder
from .errors import TvmExtError
from ..measure.measure import MeasureSettings
from .records import Record, RecordStore, side_file
from ..measure.runner import LocalRunner, Runner
from .search import GeneticSearch, RandomSearch, SearchStrategy, default_tourn_size, tourn_size_reason
from .space import Config, Space
from ..target import TargetInfo
from .template import Template
from .tuner import Builder, ProgressHook, Tuner, TuneResult

DEFAULT_RECORDS = "tvm_ext_records.jsonl"
Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class SessionOptions:
    """Everything a tuning run is made of, by name (the CLI's tuning arguments)."""

    target: str = "opencl"
    device: int = 0
    strategy: str = "ga"  # a name in STRATEGIES
    runner: str = "local"  # a name in RUNNERS
    generations: int = 6
    population: int = 12
    tourn_size: int | None = None  # None: the GA's default for the population
    mutation: float = 0.1
    trials: int | None = None  # measurements per workload in this run (None: no cap)
    workers: int | None = None  # parallel build processes (None: all cores)
    overlap: bool = True  # build a batch's next chunk while the runner measures the ones before it
    tasks_in_flight: int = 1  # a model's workloads searched at once (``pipeline.tune_relax``)
    seed: int = 0
    records: str = DEFAULT_RECORDS
    build_timeout: float = 120.0
    run_timeout: float = 60.0
    measure: MeasureSettings = MeasureSettings()
    analytic_seeds: int = 4  # analytic GEMM tile picks seeding the GA after the default config
    # the predictor stage (strategy "ga+xgb"): breed ng, measure the model's nm
    ng: int | None = None  # default 16 x nm
    nm: int | None = None  # default population / 2
    explore: float = 0.2
    ptxas: bool = False  # CUDA: ptxas registers/spills as features, filled as needed (RECORDS.ptxas.json)
    ptxas_cache: str = ""  # a ptxas cache file read as it is (a replayed sweep's)
    model_file: bool = True  # load and save the cost model beside the records (RECORDS.xgb.json)
    runner_options: tuple[tuple[str, str], ...] = ()  # what a runner reads by name (``runner_option``)

    def __post_init__(self) -> None:
        if self.tourn_size is None:
            object.__setattr__(self, "tourn_size", default_tourn_size(self.population))
        for name in ("generations", "population", "tourn_size"):
            if getattr(self, name) < 1:
                raise TvmExtError(f"--{name.replace('_', '-')} must be >= 1")
        if self.trials is not None and self.trials < 1:
            raise TvmExtError("--trials must be >= 1")
        if not 0.0 <= self.mutation <= 1.0:
            raise TvmExtError("--mutation must be a probability in [0, 1]")
        reason = tourn_size_reason(self.population, self.tourn_size)
        if reason:
            raise TvmExtError(f"--tourn-size {reason}")
        for name in ("ng", "nm"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise TvmExtError(f"--{name} must be >= 1")
        if self.ng is not None and self.nm is not None and self.ng < self.nm:
            raise TvmExtError("--ng must be >= --nm (the model picks nm of ng candidates)")
        if not 0.0 <= self.explore <= 1.0:
            raise TvmExtError("--explore must be a share in [0, 1]")
        if self.tasks_in_flight < 1:
            raise TvmExtError(f"--tasks-in-flight must be >= 1, got {self.tasks_in_flight}")
        check_name("strategy", self.strategy, STRATEGIES)
        check_name("runner", self.runner, RUNNERS)
        RUNNERS[self.runner].check(self)
        if STRATEGIES[self.strategy].breeds and self.population < 2:
            raise TvmExtError(f"--population must be >= 2 for the GA (crossover pairs parents), got {self.population}")

    @property
    def measured_per_generation(self) -> int:
        if STRATEGIES[self.strategy].predictor:
            return self.nm or max(1, self.population // 2)
        return self.population

    def runner_option(self, name: str, default: str | None = None) -> str | None:
        return dict(self.runner_options).get(name, default)


def check_name(what: str, name: str, registry: Mapping[str, Any]) -> None:
    if name not in registry:
        raise TvmExtError(f"unknown {what} {name!r}; allowed: {', '.join(registry)}")


# ---- strategies -----------------------------------------------------------------------------------
@dataclass
class StrategyContext:
    """What a strategy factory builds its search from."""

    options: SessionOptions
    tuner: Tuner
    seeds: list[np.ndarray]  # index rows: the default config, then the analytic picks
    rng: np.random.Generator
    log: Log | None = None
    repair: Any = None  # maps offspring onto measurable configs (a replayed sweep: the nearest recorded)
    feasible_only: bool = False  # random search draws feasible configs only (a sparse replayed sweep)
    candidates: Sequence[Config] | None = None  # what an analytic pick chooses among (None: every tile)
    transfer: Sequence[Record] = ()  # more records for a cost model (other shapes), beside the store's
    model: Any = None  # the cost model a factory made (the session saves it after the run)

    @property
    def space(self) -> Space:
        return self.tuner.space


@dataclass(frozen=True)
class StrategyEntry:
    make: Callable[[StrategyContext], SearchStrategy]
    doc: str
    predictor: bool = False  # measures nm per generation, ranked by a cost model
    breeds: bool = False  # a GA: crossover pairs parents (a population of at least 2)
    measures_default: bool = True  # the template's default config is measured first (the baseline)


def _ga(ctx: StrategyContext) -> SearchStrategy:
    o = ctx.options
    return GeneticSearch(ctx.space, ctx.rng, size_pop=o.population, generations=o.generations, tourn_size=o.tourn_size,
                         mutation_rate=o.mutation, seeds=ctx.seeds, repair=ctx.repair)


def _random(ctx: StrategyContext) -> SearchStrategy:
    o = ctx.options
    return RandomSearch(ctx.space, ctx.rng, batch=o.population, generations=o.generations,
                        feasible_only=ctx.feasible_only)


def _predictor_stage(ctx: StrategyContext, model: Any) -> SearchStrategy:
    from ..cost_model.search import ModelGuidedSearch

    o = ctx.options
    nm = o.nm or max(1, o.population // 2)
    return ModelGuidedSearch(ctx.space, ctx.rng, model, size_pop=o.population, ng=o.ng or max(16 * nm, o.population),
                             nm=nm, explore=o.explore, generations=o.generations, tourn_size=o.tourn_size,
                             mutation_rate=o.mutation, seeds=ctx.seeds, repair=ctx.repair, log=ctx.log)


def _ga_xgb(ctx: StrategyContext) -> SearchStrategy:
    """The GA with the XGBoost predictor stage, its model warm from the records (this
    workload's, and other shapes' as transfer) and from the model saved beside them."""
    from ..cost_model.model import XGBCostModel, model_path
    from ..cost_model.ptxas import PtxasCache, nvcc_available

    o, tuner = ctx.options, ctx.tuner
    ptxas = None
    if o.ptxas:
        if tuner.target.kind != "cuda" or not nvcc_available():
            raise TvmExtError("--ptxas needs --target cuda and nvcc on PATH")
        ptxas = PtxasCache(side_file(o.records, "ptxas"))
    elif o.ptxas_cache:
        ptxas = PtxasCache(o.ptxas_cache)
    model = XGBCostModel(tuner.template, tuner.target, seed=o.seed, ptxas=ptxas)
    loaded = ""
    path = model_path(o.records)
    if o.model_file and os.path.exists(path):
        try:
            model = XGBCostModel.load(path, tuner.template, tuner.target, seed=o.seed, ptxas=ptxas)
            loaded = f", loaded {path}"
        except TvmExtError as exc:
            if ctx.log:
                ctx.log(f"note: {exc}; training a new model")
    model.fill_ptxas = o.ptxas
    model.ptxas_workers = o.workers
    transfer = model.add_records(itertools.chain(tuner.store, ctx.transfer), tuner.workload.key)
    model.fit()
    if ctx.log:
        ctx.log(f"cost model: {model.n_current} records of this workload, {transfer} of other shapes{loaded}")
    ctx.model = model
    return _predictor_stage(ctx, model)


def _ga_s6(ctx: StrategyContext) -> SearchStrategy:
    return _predictor_stage(ctx, None)


@dataclass
class AnalyticPick:
    """One config chosen without measuring (the template's rule, or the analytic GEMM tile), then done."""

    space: Space
    config: Config
    explanation: str
    generation: int = 0
    history: list[float] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.generation > 0

    def propose(self) -> np.ndarray:
        return self.space.encode(self.config).reshape(1, -1)

    def observe(self, indices: np.ndarray, costs: np.ndarray) -> None:
        self.history.append(float(np.min(costs)))
        self.generation += 1


def analytic_pick(template: Template, target: TargetInfo, candidates: Iterable[Config] | None = None
                  ) -> tuple[Config, str]:
    """The template's own zero-measurement pick, else the analytic GEMM tile, and why."""
    own = template.analytic_pick(target)
    if own is not None:
        return own
    from ..cost_model.analytic import select_tile

    result = select_tile(template, target, candidates)
    return result.config, result.explain()


def _analytic(ctx: StrategyContext) -> SearchStrategy:
    config, explanation = analytic_pick(ctx.tuner.template, ctx.tuner.target, ctx.candidates)
    return AnalyticPick(ctx.space, config, explanation)


STRATEGIES: dict[str, StrategyEntry] = {
    "random": StrategyEntry(_random, "uniform random configs, batch by batch (the baseline)"),
    "ga": StrategyEntry(_ga, "the parallel genetic algorithm", breeds=True),
    "ga+xgb": StrategyEntry(_ga_xgb, "the GA with the XGBoost predictor stage (breed ng, measure nm)",
                            predictor=True, breeds=True),
    "ga+s6": StrategyEntry(_ga_s6, "the predictor-stage GA with the model off (nm offspring at random)",
                           predictor=True, breeds=True),
    "analytic": StrategyEntry(_analytic, "the analytic GEMM tile (or the template's own pick), measured once",
                              measures_default=False),
}


# ---- runners --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunnerEntry:
    """``make(options, target, log)``: the runner; ``check(options)``: its runner options,
    checked before anything starts (one ``TvmExtError``).  A runner with ``remote_target``
    measures on devices elsewhere: it is made first (``target`` None) and the run's target is
    its ``target`` (a ``RemoteRunner``: the servers' device), not this machine's."""

    make: Callable[["SessionOptions", TargetInfo | None, Log], Runner]
    doc: str
    check: Callable[["SessionOptions"], None] = lambda options: None
    remote_target: bool = False


def _device_list(text: str, what: str) -> tuple[int, ...]:
    """``text`` ("0,1") as device indices; ``what`` names it in errors ("--devices '0,x'")."""
    try:
        ids = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise TvmExtError(f"{what} is not a comma-separated list of integers") from None
    if any(i < 0 for i in ids):
        raise TvmExtError(f"{what}: device indices must be >= 0")
    return ids


def _local_runner(options: SessionOptions, target: TargetInfo | None, log: Log) -> Runner:
    """This machine: an isolated worker per device (runner option ``devices=0,1``; default
    the target's device)."""
    devices = options.runner_option("devices")
    ids = _device_list(devices, f"runner option devices={devices!r}") if devices else None
    assert target is not None
    if ids:
        _check_devices_exist(target, ids, f"runner option devices={devices!r}")
    runner = LocalRunner(target, options.measure, timeout=options.run_timeout, devices=ids)
    runner.warm()  # the measuring processes start while the first candidates build
    return runner


def _check_devices_exist(target: TargetInfo, ids: Sequence[int], what: str) -> None:
    """Every device index of ``ids`` names a device of ``target``'s kind here (a missing one
    would record every config it measures as a run error); one listed twice gets two workers."""
    if target.kind == "opencl":
        from ..target import opencl_device

        for i in ids:
            try:
                opencl_device(i)
            except TvmExtError as exc:
                raise TvmExtError(f"{what}: {exc}") from None
    elif target.kind == "cuda":
        import tvm

        missing = [i for i in ids if not tvm.cuda(i).exist]
        if missing:
            raise TvmExtError(f"{what}: no CUDA GPU {missing[0]} on this host")


def _check_local(options: SessionOptions) -> None:
    devices = options.runner_option("devices")
    if devices:
        _device_list(devices, f"runner option devices={devices!r}")
    extra = sorted({k for k, _ in options.runner_options} - {"devices"})
    if extra:
        raise TvmExtError(f"runner option {extra[0]!r} is not an option of the local runner (devices); "
                          "--tracker, --key and --parallel belong to --runner rpc")


def _check_rpc(options: SessionOptions) -> None:
    from ..remote.worker import parse_address

    tracker, key = options.runner_option("tracker"), options.runner_option("key")
    devices, parallel = options.runner_option("devices"), options.runner_option("parallel")
    if devices and tracker:
        raise TvmExtError("--devices starts a tracker of its own: give either --devices or --tracker")
    if not devices and not tracker:
        raise TvmExtError("--runner rpc needs --tracker HOST:PORT and --key KEY (servers started with python -m "
                          "tvm_ext.worker), or --devices 0,1 (a local tracker and a worker per device)")
    if tracker:
        parse_address(tracker)
        if not key:
            raise TvmExtError("--tracker needs --key KEY (the servers' key at the tracker)")
    if devices:
        _device_list(devices, f"--devices {devices!r}")
    if tracker and options.runner_option("secret_file"):
        from ..remote.wire import load_secret

        load_secret(options.runner_option("secret_file"))  # readable and not empty, before anything runs
    if parallel is not None and (not parallel.isdigit() or int(parallel) < 1):
        raise TvmExtError(f"--parallel must be an integer >= 1, got {parallel!r}")


def _rpc_runner(options: SessionOptions, target: TargetInfo | None, log: Log) -> Runner:
    """Servers of a key at a TVM RPC tracker (``tracker``, ``key``), or (``devices``) a local
    tracker with a worker per device, started here and stopped with the runner."""
    from ..remote.rpc_runner import RpcRunner
    from ..remote.worker import parse_address

    from ..remote.wire import load_secret

    parallel = options.runner_option("parallel")
    devices = options.runner_option("devices")
    cluster = None
    if devices:
        from ..remote.cluster import LocalCluster

        cluster = LocalCluster(_device_list(devices, f"--devices {devices!r}"), options.target.lower(), log).start()
        tracker, key, secret = cluster.tracker, cluster.key, cluster.secret.encode()
    else:
        tracker, key = parse_address(options.runner_option("tracker") or ""), options.runner_option("key") or ""
        secret = load_secret(options.runner_option("secret_file"))
    runner = RpcRunner(tracker, key, options.target.lower(), options.measure, timeout=options.run_timeout,
                       parallel=int(parallel) if parallel else None, log=log, cluster=cluster, secret=secret)
    try:
        return runner.start()
    except BaseException:
        runner.close()
        raise


RUNNERS: dict[str, RunnerEntry] = {
    "local": RunnerEntry(_local_runner, "this machine: an isolated process per device", _check_local),
    "rpc": RunnerEntry(_rpc_runner, "the servers of a key at a TVM RPC tracker (tvm_ext workers or stock TVM "
                                    "servers), or --devices: a local tracker and a worker per device",
                       _check_rpc, remote_target=True),
}


# ---- the session ---------------------------------------------------------------------------------
class Session:
    """The parts of tuning runs, made from ``options`` once and shared by every workload
    tuned through it (a builder pool, a runner, the records file).  Parts given here
    (e.g. a replay's builder and runner, an in-memory store) are used instead."""

    def __init__(self, options: SessionOptions | None = None, *, target: TargetInfo | None = None,
                 builder: Builder | None = None, runner: Runner | None = None, store: RecordStore | None = None,
                 transfer: Sequence[Record] = (), log: Log | None = None):
        self.options = options or SessionOptions()
        self.transfer = tuple(transfer)  # records of other shapes for a cost model, beside the records file's
        self.log = log
        self._target = target
        self._builder = builder
        self._runner = runner
        self._store = store
        self._models: list[Any] = []  # cost models made by strategies, saved after their search
        self._models_lock = threading.Lock()  # workloads searched at once (threads) share the list

    @property
    def target(self) -> TargetInfo:
        """This machine's ``--target``/``--device``, or a remote runner's devices (made first)."""
        if self._target is None:
            if RUNNERS[self.options.runner].remote_target:
                self._target = self.runner.target  # type: ignore[attr-defined]
            else:
                from ..target import resolve_target

                self._target = resolve_target(self.options.target, self.options.device)
        return self._target

    @property
    def store(self) -> RecordStore:
        if self._store is None:
            self._store = RecordStore(self.options.records)
        return self._store

    @property
    def builder(self) -> Builder:
        if self._builder is None:
            self._builder = LocalBuilder(workers=self.options.workers, timeout=self.options.build_timeout)
        return self._builder

    def start_builds(self) -> None:
        """Start a ``LocalBuilder``'s processes now (``LocalBuilder.start``): they are ready,
        TVM and the templates imported, when the first candidates come."""
        if isinstance(self.builder, LocalBuilder):
            self.builder.start()

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            entry = RUNNERS[self.options.runner]
            self._runner = entry.make(self.options, None if entry.remote_target else self.target, self._log)
        return self._runner

    def _log(self, message: str) -> None:
        (self.log or _stderr)(message)

    def tuner(self, template: Template, on_record: ProgressHook | None = None,
              recorded_as: str | None = None, store: RecordStore | None = None) -> Tuner:
        """A tuner of ``template`` on the session's parts; its records name the options'
        strategy (or ``recorded_as``, a search that drives the tuner itself).  ``store``: its own
        handle on the records file (a tuner in a thread of its own: each handle holds the file's
        lock apart, as tuners in separate processes do)."""
        trials = self.options.trials or (1 << 30)
        return Tuner(template, self.target, self.builder, self.runner, store or self.store, trials=trials,
                     on_record=on_record, strategy=recorded_as or self.options.strategy, overlap=self.options.overlap)

    def seeds(self, template: Template, space: Space, default: Config,
              candidates: Iterable[Config] | None = None) -> list[np.ndarray]:
        """The GA's first individuals: the default config, the template's own zero-measurement
        pick (so a short search never ends below what ``--strategy analytic`` gives: the GRU's
        pick is a persistent kernel a few random draws rarely find), the template's
        ``known_good`` configs, then the analytic tile picks (GEMM only)."""
        from ..cost_model.analytic import analytic_seeds

        picks: list[Config] = []
        if self.options.analytic_seeds > 0 and candidates is None:  # a replayed sweep seeds from its own picks
            try:
                own = template.analytic_pick(self.target)
            except TvmExtError:  # a pick that cannot be made here: the GA still runs
                own = None
            if own is not None and own[0] != default and space.is_feasible(own[0]):
                picks.append(own[0])
            picks += [c for c in template.known_good(self.target) if c not in picks and c != default]
        try:
            picks += [c for c in analytic_seeds(template, self.target, self.options.analytic_seeds, candidates)
                      if c not in picks]
        except TvmExtError:  # no tile passes the template's own rule: the GA still runs
            pass
        return [space.encode(c) for c in [default] + picks]

    def tune(self, template: Template, *, on_record: ProgressHook | None = None, **fit: Any) -> TuneResult:
        """Tune one workload with the options' strategy; the records file gets every result as
        it arrives and a rerun resumes.  ``fit`` (``strategy``'s keywords) fits the search to a
        workload: its ``seeds``, or to a replayed sweep the analytic pick's ``candidates``, a
        ``repair`` of offspring onto recorded configs and random draws ``feasible_only``."""
        template.default_config(self.target)  # a template that cannot run here says so first
        return self.search(self.tuner(template, on_record), **fit)

    def strategy(self, tuner: Tuner, *, candidates: Sequence[Config] | None = None,
                 repair: Callable[[Space], Any] | None = None, feasible_only: bool = False,
                 seeds: Sequence[Config] | None = None) -> SearchStrategy:
        """The options' strategy (a ``STRATEGIES`` factory) for ``tuner``'s workload; ``seeds``
        replace the first individuals it is given (the default config and the analytic picks)."""
        default = tuner.template.default_config(self.target)
        rows = ([tuner.space.encode(c) for c in seeds] if seeds is not None
                else self.seeds(tuner.template, tuner.space, default, candidates))
        ctx = StrategyContext(self.options, tuner, rows,
                              np.random.default_rng(self.options.seed), self.log,
                              repair(tuner.space) if repair else None, feasible_only, candidates, self.transfer)
        strategy = STRATEGIES[self.options.strategy].make(ctx)
        if ctx.model is not None:
            with self._models_lock:
                self._models.append(ctx.model)
        return strategy

    def search(self, tuner: Tuner, strategy: SearchStrategy | None = None, **fit: Any) -> TuneResult:
        """``tune`` on a tuner from ``tuner`` (to report on it before the search starts), with
        ``strategy`` or the options' (``fit``: as ``tune`` takes them)."""
        default = tuner.template.default_config(self.target)
        if strategy is None:
            strategy = self.strategy(tuner, **fit)
        try:
            return tuner.tune(strategy, default, measure_default=STRATEGIES[self.options.strategy].measures_default)
        finally:
            self._save_models()

    def _save_models(self) -> None:
        """Cost models trained in this session, kept beside the records (``model_file``)."""
        with self._models_lock:
            models, self._models = self._models, []
        if self.options.model_file:
            from ..cost_model.model import model_path

            for model in models:
                if model.ready:
                    model.save(model_path(self.options.records))

    def close(self) -> None:
        from ..measure.pools import close_all

        close_all([part for part in (self._builder, self._runner) if part is not None])

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

