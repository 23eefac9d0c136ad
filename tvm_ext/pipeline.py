"""Tuned schedules inside TVM's Relax pipeline: tune a model's kernels, export, compile, run.

``tune_relax`` lowers a Relax model the way TVM does (legalize and fuse), extracts
meta_schedule's tasks, matches each PrimFunc to one of our templates
(``tvm_ext.tasks``), tunes the templates with the usual Tuner and search (records
appended to the records file, so a rerun resumes) and exports the best records as a
meta_schedule database (``tvm_ext.tvm_export``).  ``compile_relax`` then applies the
database exactly as a TVM user would (``MetaScheduleApplyDatabase``) and gives every
PrimFunc without a tuned schedule TVM's default GPU schedule (dlight), with a printed
note rather than a failure.  ``load_model`` runs the result: the Relax VM on CUDA, our
pyopencl executor on OpenCL (the TVM wheel has no OpenCL runtime).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .errors import TvmExtError
from .target import TargetInfo
from .tasks import TaskMatch, match_task

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class TuneOptions:
    """Search settings for every task (same meaning as the CLI's tuning arguments)."""

    strategy: str = "ga"
    generations: int = 6
    population: int = 12
    tourn_size: int = 2
    mutation: float = 0.1
    trials: int | None = None  # per distinct template workload
    workers: int | None = None
    seed: int = 0
    build_timeout: float = 120.0
    run_timeout: float = 60.0


@dataclass(frozen=True)
class TaskReport:
    """What happened to one PrimFunc of the model."""

    name: str
    weight: int
    template: str  # "gemm", or "" when TVM's default schedule is used
    params: tuple[tuple[str, Any], ...] = ()
    best_secs: float = math.inf  # our kernel's time (the template's compute)
    default_secs: float = math.inf  # the template's default config
    trials: int = 0  # measured in this run
    exported: bool = False
    note: str = ""  # why the task falls back to dlight


@dataclass(frozen=True)
class RelaxTuning:
    tasks: tuple[TaskReport, ...]
    database: str
    records: str
    target: TargetInfo
    interrupted: bool = False
    wall_secs: float = 0.0


# ---- lowering ------------------------------------------------------------------------------
def legalize_and_fuse(mod: Any) -> Any:
    """Relax ops -> fused PrimFuncs, the passes TVM's GPU pipelines run before scheduling."""
    import tvm
    from tvm import relax

    return tvm.transform.Sequential([
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ])(mod)


def extract_tasks(mod: Any, target: TargetInfo) -> list[Any]:
    """meta_schedule's tasks of a legalized and fused module (one per distinct PrimFunc)."""
    from tvm.s_tir import meta_schedule as ms

    from .tvm_export import tvm_target

    return list(ms.relax_integration.extract_tasks(mod, tvm_target(target)))


def match_tasks(tasks: Sequence[Any], target: TargetInfo) -> list[TaskMatch]:
    return [match_task(t.task_name, t.dispatched[0]["main"], target) for t in tasks]


def default_rules() -> list[Any]:
    """TVM's default GPU schedules, in the order TVM's CUDA pipeline applies them."""
    from tvm.s_tir import dlight as dl

    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]


def _unscheduled(mod: Any) -> list[str]:
    import tvm

    return sorted(gv.name_hint for gv, f in mod.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc) and not _is_scheduled(f))


def _is_scheduled(func: Any) -> bool:
    return func.attrs is not None and "tirx.is_scheduled" in func.attrs and bool(func.attrs["tirx.is_scheduled"])


def compile_relax(mod: Any, target: TargetInfo, database: str | Any | None = None,
                  log: Log | None = _stderr) -> Any:
    """Legalize, fuse, apply the database's schedules, dlight for the rest.

    Returns the Relax IRModule with every PrimFunc scheduled: give it to ``tvm.compile``
    (CUDA) or to ``OpenCLExecutor`` (OpenCL).  ``database`` is a folder written by
    ``tune_relax``/``export``, a meta_schedule Database, or ``None`` (dlight only).
    """
    import tvm
    from tvm import relax
    from tvm.s_tir import dlight as dl

    from .tvm_export import open_database, tvm_target

    tgt = tvm_target(target)
    lowered = legalize_and_fuse(mod)
    if database is not None:
        db = open_database(database) if isinstance(database, str) else database
        with tgt, db, tvm.transform.PassContext(opt_level=3):  # as a TVM user applies tuning logs
            lowered = relax.transform.MetaScheduleApplyDatabase()(lowered)
    fallback = _unscheduled(lowered)
    with tgt:
        lowered = dl.ApplyDefaultSchedule(*default_rules())(lowered)
    if log:
        for name in fallback:
            log(f"note: {name}: no tuned schedule in the database, using TVM's default (dlight)")
    left = _unscheduled(lowered)
    if left:
        raise TvmExtError(f"no schedule for {', '.join(left)}: neither tuned nor covered by dlight")
    return lowered


# ---- running --------------------------------------------------------------------------------
class CompiledModel:
    """A scheduled Relax module ready to run: ``model(*inputs) -> numpy``, ``model.time(*inputs)``."""

    def __init__(self, mod: Any, target: TargetInfo, function: str | None = None):
        from .relax_opencl import OpenCLExecutor, relax_function_name

        self.target = target
        self.function = relax_function_name(mod, function)
        self.mod = mod
        if target.kind == "opencl":
            self._exec = OpenCLExecutor.from_module(mod, target, self.function)
            self._vm = None
        else:
            import tvm
            from tvm import relax

            from .tvm_export import tvm_target

            self._dev = tvm.cuda(target.device_id)
            self.executable = tvm.compile(mod, target=tvm_target(target))
            self._vm = relax.VirtualMachine(self.executable, self._dev)

    def _args(self, inputs: Sequence[np.ndarray]) -> list[Any]:
        import tvm

        return [tvm.runtime.tensor(np.ascontiguousarray(a), self._dev) for a in inputs]

    def __call__(self, *inputs: np.ndarray) -> Any:
        if self._vm is None:
            return self._exec.run(*inputs)
        out = self._vm[self.function](*self._args(inputs))
        return out.numpy() if hasattr(out, "numpy") else tuple(o.numpy() for o in out)  # tensor or tuple

    def time(self, *inputs: np.ndarray, repeat: int = 10) -> float:
        """Median seconds per forward pass (device-synchronised)."""
        if self._vm is None:
            return self._exec.time(*inputs, repeat=repeat)
        self._vm.set_input(self.function, *self._args(inputs))
        timer = self._vm.time_evaluator("invoke_stateful", self._dev, number=10, repeat=repeat,
                                        min_repeat_ms=50)
        return float(np.median(timer(self.function).results))

    def sources(self) -> dict[str, str]:
        """Generated kernel source by PrimFunc name (OpenCL only)."""
        return self._exec.sources() if self._vm is None else {}


def load_model(mod: Any, target: TargetInfo, database: str | Any | None = None,
               function: str | None = None, log: Log | None = _stderr) -> CompiledModel:
    """``compile_relax`` then ready to run on the target's device."""
    return CompiledModel(compile_relax(mod, target, database, log), target, function)


# ---- tuning ---------------------------------------------------------------------------------
@dataclass
class _Group:
    template: Any
    tasks: list[int] = field(default_factory=list)
    best: float = math.inf
    default: float = math.inf
    trials: int = 0


def tune_relax(mod: Any, target: TargetInfo, records: str, database: str,
               options: TuneOptions = TuneOptions(), log: Log | None = _stderr,
               on_record: Callable[[Any, Any], None] | None = None) -> RelaxTuning:
    """Tune every PrimFunc of ``mod`` that a template matches; export the best to ``database``.

    Tasks with no template (or whose tuning found nothing correct) are reported with a
    note and get TVM's default schedule when the model is compiled.  Ctrl-C stops the
    search, keeps the records and still exports what was found.
    """
    import time

    from .builder import LocalBuilder
    from .records import RecordStore
    from .runner import LocalRunner
    from .search import make_strategy
    from .template import Workload
    from .tuner import Tuner
    from .tvm_export import Exported, export_task, open_database

    log = log or (lambda _msg: None)
    start = time.perf_counter()
    store = RecordStore(records)
    db = open_database(database)
    lowered = legalize_and_fuse(mod)
    tasks = extract_tasks(lowered, target)
    matches = match_tasks(tasks, target)
    groups: dict[str, _Group] = {}
    for i, m in enumerate(matches):
        if m.matched:
            key = Workload.of(m.template, target).key
            groups.setdefault(key, _Group(m.template)).tasks.append(i)
        else:
            log(f"note: {m.name}: not tuned, no template ({m.reason})")

    interrupted = False
    if groups:
        builder = LocalBuilder(workers=options.workers, timeout=options.build_timeout)
        runner = LocalRunner(target, timeout=options.run_timeout)
        try:
            for key, group in groups.items():
                names = ", ".join(matches[i].name for i in group.tasks)
                tuner = Tuner(group.template, target, builder, runner, store,
                              trials=options.trials or (1 << 30), on_record=on_record,
                              strategy=options.strategy)
                default = group.template.default_config(target)
                strategy = make_strategy(
                    options.strategy, tuner.space, np.random.default_rng(options.seed),
                    population=options.population, generations=options.generations,
                    seeds=[tuner.space.encode(default)], tourn_size=options.tourn_size,
                    mutation_rate=options.mutation)
                log(f"tuning {group.template.describe()} for {names} "
                    f"({tuner.resumed} records resumed)")
                result = tuner.tune(strategy, default)
                group.trials = result.trials
                group.best = result.best.cost if result.best else math.inf
                group.default = result.default.cost if result.default and result.default.ok else math.inf
                if result.interrupted:
                    interrupted = True
                    break
        finally:
            builder.close()
            runner.close()

    reports = []
    for i, (task, m) in enumerate(zip(tasks, matches)):
        if not m.matched:
            reports.append(TaskReport(m.name, int(task.weight), "", note=m.reason))
            continue
        group = groups[Workload.of(m.template, target).key]
        outcome = export_task(db, task.dispatched[0], m, store, target)
        exported = isinstance(outcome, Exported)
        if not exported:
            log(f"note: {m.name}: not exported ({outcome})")
        reports.append(TaskReport(
            m.name, int(task.weight), m.template.name, tuple(m.template.params.items()),
            best_secs=outcome.run_secs if exported else group.best, default_secs=group.default,
            trials=group.trials if group.tasks[0] == i else 0, exported=exported,
            note="" if exported else str(outcome)))
    return RelaxTuning(tuple(reports), database, records, target, interrupted,
                       time.perf_counter() - start)


def summary(result: RelaxTuning) -> str:
    """A plain-text table of the tasks: template, shape, tuned and default times."""
    lines = [f"{'task':<28} {'template':<10} {'shape':<16} {'tuned':>12} {'default':>12}  schedule"]
    for t in result.tasks:
        params = dict(t.params)
        shape = f"{params.get('m')}x{params.get('n')}x{params.get('k')}" if t.template == "gemm" else "-"
        fmt = lambda s: f"{s * 1e3:.4f} ms" if math.isfinite(s) else "-"  # noqa: E731
        how = "tuned (database)" if t.exported else f"dlight: {t.note}"
        lines.append(f"{t.name:<28} {t.template or '-':<10} {shape:<16} {fmt(t.best_secs):>12} "
                     f"{fmt(t.default_secs):>12}  {how}")
    return "\n".join(lines)
