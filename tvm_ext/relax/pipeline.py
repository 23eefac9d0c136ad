"""Tuned schedules inside TVM's Relax pipeline: tune a model's kernels, export, compile, run.

``tune_relax`` rewrites a Relax model for our kernels (``tvm_ext.relax.relax_rewrites``: float32
accumulation of low-precision matmuls, elementwise ops moved before reshapes so they fuse
into the matmul), lowers it the way TVM does (legalize and fuse), extracts meta_schedule's
tasks, matches each PrimFunc to one of our templates (``tvm_ext.relax.tasks``: GEMMs, tensor-core
matmuls, row operators), finds the model's GRU layers (``tvm_ext.relax.relax_gru``), tunes every
template through one session (records appended to the records file, so a rerun resumes)
and exports the best records: schedules as a meta_schedule database
(``tvm_ext.relax.tvm_export``), GRU configs beside it (``tvm_export.OPERATORS_FILE``).
``compile_relax`` then points each GRU at its tuned plan, applies the database exactly as a
TVM user would (``MetaScheduleApplyDatabase``) and gives every PrimFunc without a tuned
schedule TVM's default GPU schedule (dlight), with a printed note rather than a failure.
``load_model`` runs the result: the Relax VM on CUDA, our pyopencl executor on OpenCL (the
TVM wheel has no OpenCL runtime).
"""
from __future__ import annotations

import math
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

import numpy as np

from ..core.errors import TvmExtError, last_line
from ..core.session import Session, SessionOptions
from ..core.space import Config
from ..target import TargetInfo
from .tasks import TaskMatch, match_task

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


TuneOptions = SessionOptions  # search settings for every task (the CLI's tuning arguments)


@dataclass(frozen=True)
class TaskReport:
    """What happened to one PrimFunc (or GRU layer) of the model."""

    name: str
    weight: int
    template: str  # the template's name ("gemm", "rows", "gru", ...), or "" when TVM's default schedule is used
    params: tuple[tuple[str, Any], ...] = ()
    best_secs: float = math.inf  # our kernel's time (the template's compute)
    default_secs: float = math.inf  # the template's default config
    trials: int = 0  # measured in this run
    exported: bool = False
    note: str = ""  # why the task falls back to dlight
    workload: str = ""  # the template at the task's shape (``describe``)
    reused: bool = False  # already in the database: not tuned again


@dataclass(frozen=True)
class RelaxTuning:
    tasks: tuple[TaskReport, ...]
    database: str
    records: str
    target: TargetInfo
    interrupted: bool = False
    wall_secs: float = 0.0


# ---- lowering ------------------------------------------------------------------------------
def legalize_and_fuse(mod: Any, target: TargetInfo | None = None) -> Any:
    """Relax ops -> fused PrimFuncs, the passes TVM's GPU pipelines run before scheduling,
    after ``relax_rewrites.rewrite_model`` (with the ``target`` the model runs on, its rewrites
    for that target's kernels; tuning and compiling pass the same one)."""
    import tvm
    from tvm import relax

    from .relax_rewrites import rewrite_model
    from .scans import check_scan_lengths, scan_legalizations
    from .scatters import scatter_legalizations
    from .sorts import sort_legalizations

    mod = rewrite_model(mod, target)
    legalize = scatter_legalizations() if target is not None else None  # on the GPUs (``scatters``)
    if target is not None and target.kind == "opencl":  # scans and sorts as reductions (``scans``,
        check_scan_lengths(mod)  # ``sorts``); elsewhere TVM's build dispatches them
        legalize = {**legalize, **scan_legalizations(), **sort_legalizations()}
    try:
        return tvm.transform.Sequential([
            relax.transform.LegalizeOps(legalize),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ])(mod)
    except Exception as exc:  # noqa: BLE001 - an op TVM cannot lower as the model has it (an integer power)
        raise TvmExtError(f"TVM cannot lower the model: {last_line(exc)}") from None


def extract_tasks(mod: Any, target: TargetInfo) -> list[Any]:
    """meta_schedule's tasks of a legalized and fused module (one per distinct PrimFunc)."""
    from tvm.s_tir import meta_schedule as ms

    from .tvm_export import tvm_target

    return list(ms.relax_integration.extract_tasks(mod, tvm_target(target)))


def match_tasks(tasks: Sequence[Any], target: TargetInfo, without: Collection[str] = ()) -> list[TaskMatch]:
    """Each task's template (``tasks.match_task``), the matchers in ``without`` turned off."""
    return [match_task(t.task_name, t.dispatched[0]["main"], target, without) for t in tasks]


def default_rules() -> list[Any]:
    """TVM's default GPU schedules, in the order TVM's CUDA pipeline applies them (``Reduction``
    kept off grouped convolutions' reads: ``reduction_rule.py``), with the
    row-copy rule (``copy_rule.py``: attention's head split and merge 16 bytes a thread)
    before the fallback and one rule after it (``outer_loops_rule.py``: where the fallback
    gives up, each top-level block's loops on threads)."""
    from tvm.s_tir import dlight as dl

    from .copy_rule import vectorized_copy_rule
    from .outer_loops_rule import outer_loops_rule
    from .reduction_rule import guarded_reduction_rule

    return [dl.gpu.Matmul(), dl.gpu.GEMV(), guarded_reduction_rule(), dl.gpu.GeneralReduction(),
            vectorized_copy_rule(), dl.gpu.Fallback(), outer_loops_rule()]


def next_rule_on_error(rules: Sequence[Any]) -> list[Any]:
    """``rules``, each passing a function it fails on to the next one: TVM's GEMV rule asserts on
    some reductions it matches (``ReduceLogSumExp``'s), which stopped the whole model instead of
    reaching the fallback."""
    from tvm.s_tir import dlight as dl

    class NextRuleOnError(dl.ScheduleRule):
        def __init__(self, rule: Any):
            self.rule = rule

        def apply(self, func: Any, target: Any, tunable: bool) -> Any:
            try:
                return self.rule.apply(func, target, tunable)
            except Exception:
                return None

    return [NextRuleOnError(rule) for rule in rules]


def _unscheduled(mod: Any) -> list[str]:
    import tvm

    return sorted(gv.name_hint for gv, f in mod.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc) and not _is_scheduled(f))


def _is_scheduled(func: Any) -> bool:
    return func.attrs is not None and "tirx.is_scheduled" in func.attrs and bool(func.attrs["tirx.is_scheduled"])


def model_pass_config(target: TargetInfo) -> dict[str, Any]:
    """PassContext options a model with tuned schedules compiles under: on CUDA those of the
    mma.sync schedule (cp.async copies, no TIR CSE) and of pipelined copies, which act only on
    kernels whose schedule asks for them."""
    return {"tirx.use_async_copy": True, "tirx.disable_cse_tir": True} if target.kind == "cuda" else {}


def build_model(mod: Any, target: TargetInfo, launch_early: bool = False) -> Any:
    """``tvm.compile`` of a scheduled Relax module for CUDA under ``model_pass_config``; with
    ``launch_early`` the kernels marked to launch early (the wgmma picks, ``lowering.launch_early``)
    are launched so behind the kernel ahead.  Off by default: in a model most kernels ahead of a
    wgmma kernel are TVM's, which never let it start early, and the whole model measured slower
    with it (docs/results/models.md)."""
    import tvm

    from ..lowering.launch_early import pipeline_for
    from .tvm_export import tvm_target

    pipeline = pipeline_for(mod) if launch_early else "default"
    with tvm.transform.PassContext(opt_level=3, config=model_pass_config(target)):
        return tvm.compile(mod, target=tvm_target(target), tir_pipeline=pipeline)


def _register_intrinsics(target: TargetInfo) -> None:
    """The tensor intrinsics a database's mma.sync traces name (registered on first use)."""
    if target.kind != "cuda":
        return
    from ..schedules.gemm.mma import ACC_DTYPES, OPERAND_DTYPES, mma_intrinsics

    for operand in OPERAND_DTYPES:
        for acc in ACC_DTYPES:
            if operand == "bfloat16" and acc != "float32":
                continue
            for scope in ("shared.dyn", "global"):
                mma_intrinsics(operand, acc, scope)


def compile_relax(mod: Any, target: TargetInfo, database: str | Any | None = None,
                  log: Log | None = _stderr, without: Collection[str] = (), gru_storage: str | None = None) -> Any:
    """Tuned GRU plans for the GRU layers, then legalize, fuse, apply the database's
    schedules, dlight for the rest.

    Returns the Relax IRModule with every PrimFunc scheduled: give it to ``tvm.compile``
    (CUDA) or to ``OpenCLExecutor`` (OpenCL).  ``database`` is a folder written by
    ``tune_relax``/``export``, a meta_schedule Database, or ``None`` (dlight only; GRUs
    take their analytic config).  ``without``: template matchers turned off (``tasks.MATCHERS``
    names; e.g. ``tf32``: the operators file's 3xTF32 configs are not put in place).
    ``gru_storage`` (float16, bfloat16): float32 GRU layers store their tensors in that type, as
    tuned with the same setting (``relax_gru.gru_template``).
    """
    return schedule_rest(apply_tuned(mod, target, database, log, without, gru_storage), target, log)


def apply_tuned(mod: Any, target: TargetInfo, database: str | Any | None = None,
                log: Log | None = _stderr, without: Collection[str] = (), gru_storage: str | None = None,
                gru_fallback: Callable[[Any], Config | None] | None = None) -> Any:
    """``compile_relax``'s first part: GRU plans, legalize and fuse, the tuned kernels and schedules
    of the database in place; functions without one are left unscheduled.  A GRU the database has
    no config for takes ``gru_fallback``'s (a bucket's: ``buckets``), else its analytic pick."""
    import tvm
    from tvm import relax

    from .relax_gru import lower_grus
    from .tvm_export import open_database, read_operators, tvm_target

    tgt = tvm_target(target)
    operators = read_operators(database) if isinstance(database, str) else {}

    def gru_config(template: Any) -> Config | None:
        config = operator_config(operators, template, target)
        if config is None and gru_fallback is not None:
            config = gru_fallback(template)
        if config is None and log:
            log(f"note: {template.name.upper()} {template.describe()}: no tuned config in the database, using its "
                "analytic pick")
        return config

    lowered = substitute_kernels(legalize_and_fuse(lower_grus(mod, target, gru_config, gru_storage), target), target,
                                 operators, without)
    _register_intrinsics(target)
    if database is not None:
        db = open_database(database) if isinstance(database, str) else database
        with tgt, db, tvm.transform.PassContext(opt_level=3):  # as a TVM user applies tuning logs
            lowered = relax.transform.MetaScheduleApplyDatabase()(lowered)
    return lowered


def schedule_rest(lowered: Any, target: TargetInfo, log: Log | None = _stderr) -> Any:
    """``compile_relax``'s last part: dlight for every function still unscheduled (said in a note)."""
    from tvm.s_tir import dlight as dl

    from .tvm_export import tvm_target

    fallback = _unscheduled(lowered)
    with tvm_target(target):
        lowered = dl.ApplyDefaultSchedule(*next_rule_on_error(default_rules()))(lowered)
    if log:
        for name in fallback:
            log(f"note: {name}: no tuned schedule in the database, using TVM's default (dlight)")
    left = _unscheduled(lowered)
    if left:
        raise TvmExtError(f"no schedule for {', '.join(left)}: neither tuned nor covered by dlight")
    return lowered


def operator_config(operators: dict[str, dict[str, Any]], template: Any, target: TargetInfo) -> Config | None:
    """The operators file's tuned config of ``template`` on ``target``, or None (none there, or
    knobs of another version of the template); knobs added since the file was written take
    their earlier value (``Space.completed``)."""
    from ..core.template import Workload

    entry = operators.get(Workload.of(template, target).key)
    if entry is None:
        return None
    space = template.space(target)
    try:
        return space.decode(space.encode(Config.of(space.completed(entry["config"]))))
    except TvmExtError:
        return None


def substitute_kernels(mod: Any, target: TargetInfo, operators: dict[str, dict[str, Any]],
                       without: Collection[str] = ()) -> Any:
    """Each function a substituting matcher takes (``Matcher.substitute``: float16 matmuls on
    wgmma) and whose template the operators file has a tuned config for, replaced by that
    config's kernel; the rest stay for the database's schedules and dlight."""
    import tvm

    from .tasks import MATCHERS, match_substitute

    if not operators:
        return mod
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, tvm.tirx.PrimFunc) or _is_scheduled(func):
            continue
        match = match_substitute(gv.name_hint, func, target, without)
        config = operator_config(operators, match.template, target) if match else None
        if match and config is not None:
            mod[gv] = MATCHERS[match.matcher].substitute(func, match.template, match.site, config, target)
    return mod


# ---- running --------------------------------------------------------------------------------
def _numpy(out: Any) -> Any:
    """The VM's result as numpy: a tensor, or a tuple of them (tuples inside it too)."""
    return out.numpy() if hasattr(out, "numpy") else tuple(_numpy(o) for o in out)


class CompiledModel:
    """A scheduled Relax module ready to run: ``model(*inputs) -> numpy``, ``model.time(*inputs)``."""

    def __init__(self, mod: Any, target: TargetInfo, function: str | None = None, launch_early: bool = False):
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

            self._dev = tvm.cuda(target.device_id)
            self.executable = build_model(mod, target, launch_early)
            self._vm = relax.VirtualMachine(self.executable, self._dev)

    def _args(self, inputs: Sequence[np.ndarray]) -> list[Any]:
        import tvm

        # asarray, not ascontiguousarray: that makes a 0-d input (a scale) 1-d, which the VM refuses
        return [tvm.runtime.tensor(np.asarray(a, order="C"), self._dev) for a in inputs]

    def __call__(self, *inputs: np.ndarray) -> Any:
        if self._vm is None:
            return self._exec.run(*inputs)
        return _numpy(self._vm[self.function](*self._args(inputs)))

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
               function: str | None = None, log: Log | None = _stderr, without: Collection[str] = (),
               gru_storage: str | None = None) -> CompiledModel:
    """``compile_relax`` then ready to run on the target's device."""
    return CompiledModel(compile_relax(mod, target, database, log, without, gru_storage), target, function)


# ---- tuning ---------------------------------------------------------------------------------
@dataclass
class _Group:
    """One template workload and the tasks it schedules (several PrimFuncs may share one)."""

    template: Any
    tasks: list[int] = field(default_factory=list)
    best: float = math.inf
    default: float = math.inf
    trials: int = 0
    reused: bool = False


def tune_relax(mod: Any, target: TargetInfo, records: str, database: str,
               options: SessionOptions = SessionOptions(), log: Log | None = _stderr,
               on_record: Callable[[Any, Any], None] | None = None, retune: bool = False,
               without: Collection[str] = (), gru_storage: str | None = None) -> RelaxTuning:
    """Tune every PrimFunc of ``mod`` that a template matches, and every GRU layer; export
    the best to ``database``.

    Tasks with no template (or whose tuning found nothing correct) are reported with a
    note and get TVM's default schedule when the model is compiled.  A task the database
    already holds is not tuned again (``retune``: it is, resuming its records).  Ctrl-C
    stops the search, keeps the records and still exports what was found.  Every task is
    tuned with ``options`` (``records`` replaces its records file) through one ``Session``,
    whose build processes start (and warm) while the tasks are found.
    ``without``: template matchers turned off (``tasks.MATCHERS`` names), their tasks going to
    the next template that takes them.  ``gru_storage``: float32 GRU layers tuned with their
    tensors stored in that 16-bit type (``compile_relax`` takes the same).
    """
    import dataclasses
    import time

    from ..core.records import RecordStore
    from ..core.template import Workload
    from .tvm_export import export_operator, export_task, open_database, read_operators

    log = log or (lambda _msg: None)
    start = time.perf_counter()
    store = RecordStore(records)
    db = open_database(database)
    operators = read_operators(database)
    interrupted = False
    with Session(dataclasses.replace(options, records=records), target=target, store=store, log=log) as session:
        session.start_builds()
        tasks, matches, grus, groups = _task_groups(mod, target, db, operators, retune, without, gru_storage, log)
        # one template's workloads one after another: a cost model carries over between its shapes
        todo = [g for _, g in sorted(groups.items(), key=lambda kv: kv[1].template.name) if not g.reused]
        if options.tasks_in_flight > 1 and len(todo) > 1:
            searches = _Searches()
            interrupted = searches.all_at_once(
                todo, options.tasks_in_flight,
                lambda group: _search(session, group, matches, grus, on_record, log, searches), session)
            store = RecordStore(records)  # the records the threads wrote, read afresh for the export
        else:
            for group in todo:
                if _search(session, group, matches, grus, on_record, log):
                    interrupted = True
                    break
    if todo:
        log(f"searched {len(todo)} workloads in {time.perf_counter() - start:.1f} s; exporting the best")

    reports = []
    for i, (task, m) in enumerate(zip(tasks, matches)):
        if not m.matched:
            reports.append(TaskReport(m.name, int(task.weight), "", note=m.reason))
            continue
        group = groups[Workload.of(m.template, target).key]
        if group.reused:
            outcome = None
        elif m.substitutes:  # a kernel in the function's place: its config, as the GRU's
            outcome = export_operator(database, m.template, store, target)
        else:
            outcome = export_task(db, task.dispatched[0], m, store, target)
        reports.append(_report(m.name, int(task.weight), m.template, group, i, outcome, log))
    for j, gru in enumerate(grus):
        group = groups[Workload.of(gru.template, target).key]
        outcome = export_operator(database, gru.template, store, target) if not group.reused else None
        name = f"{gru.template.name} {gru.function}.{gru.var}"
        reports.append(_report(name, 1, gru.template, group, len(matches) + j, outcome, log))
    return RelaxTuning(tuple(reports), database, records, target, interrupted,
                       time.perf_counter() - start)


def _task_groups(mod: Any, target: TargetInfo, db: Any, operators: Any, retune: bool, without: Collection[str],
                 gru_storage: str | None, log: Log) -> tuple[list[Any], list[TaskMatch], list[Any], dict[str, _Group]]:
    """The model's tasks, their template matches, its GRU layers, and the template workloads
    that schedule them (by workload key), each marked ``reused`` where the database holds
    every task it schedules."""
    from ..core.template import Workload
    from .relax_gru import find_grus
    from .tvm_export import already_exported

    tasks = extract_tasks(legalize_and_fuse(mod, target), target)
    matches = match_tasks(tasks, target, without)
    grus = find_grus(mod, target, gru_storage)
    groups: dict[str, _Group] = {}
    in_database: dict[int, bool] = {}  # task index -> the database already holds it
    for i, m in enumerate(matches):
        if m.matched:
            key = Workload.of(m.template, target).key
            groups.setdefault(key, _Group(m.template)).tasks.append(i)
            in_database[i] = not retune and (key in operators if m.substitutes
                                             else already_exported(db, tasks[i].dispatched[0], target))
        else:
            log(f"note: {m.name}: not tuned, no template ({m.reason})")
    for j, gru in enumerate(grus):
        key = Workload.of(gru.template, target).key
        groups.setdefault(key, _Group(gru.template)).tasks.append(len(matches) + j)
        in_database[len(matches) + j] = not retune and key in operators
    for group in groups.values():  # reused when every task it schedules is in the database
        group.reused = all(in_database[i] for i in group.tasks)
        if group.reused:
            log(f"{group.template.describe()}: in the database, not tuned again")
    return tasks, matches, grus, groups


def _search(session: Session, group: _Group, matches: Sequence[TaskMatch], grus: Sequence[Any],
            on_record: Callable[[Any, Any], None] | None, log: Log, searches: "_Searches | None" = None) -> bool:
    """One workload's search (one of ``searches``, in a thread with a handle of its own on the
    records file), its outcome kept in ``group``; True where it was stopped."""
    from ..core.records import RecordStore

    names = ", ".join(_task_name(i, matches, grus) for i in group.tasks)
    tuner = session.tuner(group.template, on_record=on_record,
                          store=None if searches is None else RecordStore(session.options.records))
    log(f"tuning {group.template.describe()} for {names} ({tuner.resumed} records resumed)")
    result = session.search(tuner) if searches is None else searches.run(tuner, session.search)
    group.trials = result.trials
    group.best = result.best.cost if result.best else math.inf
    group.default = result.default.cost if result.default and result.default.ok else math.inf
    return result.interrupted


class _Searches:
    """Several workloads searched at once, each in a thread with its own tuner and records
    handle, sharing the session's builder pool and runner (a model's tasks spread over the
    runner's devices: while one search waits at the end of its generation, the others measure).
    Ctrl-C reaches the main thread: every tuner then ends after its batch in flight, and
    workloads not started yet are not."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tuners: list[Any] = []
        self._stopped = False

    def run(self, tuner: Any, search: Callable[[Any], Any]) -> Any:
        with self._lock:
            self._tuners.append(tuner)
            if self._stopped:
                tuner.stop()
        return search(tuner)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for tuner in self._tuners:
                tuner.stop()

    def _guarded(self, search: Callable[[Any], bool], group: Any) -> bool:
        """``search(group)`` unless the searches were stopped; one that raises stops the rest."""
        if self._stopped:
            return False
        try:
            return search(group)
        except BaseException:
            self.stop()
            raise

    def all_at_once(self, groups: Sequence[Any], at_once: int, search: Callable[[Any], bool], session: Any) -> bool:
        """``search`` of every group, ``at_once`` in flight; True where they were stopped (Ctrl-C
        here, or in a search).  A search that raises stops the others and its error is raised."""
        from concurrent.futures import ThreadPoolExecutor

        _ = (session.builder, session.runner)  # made here, before any thread asks for them
        pool = ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="tvm_ext-search")
        futures = [pool.submit(self._guarded, search, g) for g in groups]
        stopped = False
        try:
            for future in futures:
                stopped = bool(future.result()) or stopped
        except BaseException as exc:
            self.stop()
            for future in futures:
                future.cancel()
            pool.shutdown(wait=True)
            if isinstance(exc, KeyboardInterrupt):
                return True
            raise
        pool.shutdown(wait=True)
        return stopped or self._stopped


def _task_name(index: int, matches: Sequence[TaskMatch], grus: Sequence[Any]) -> str:
    if index < len(matches):
        return matches[index].name
    gru = grus[index - len(matches)]
    return f"{gru.template.name} {gru.function}.{gru.var}"


def _report(name: str, weight: int, template: Any, group: _Group, index: int, outcome: Any,
            log: Log) -> TaskReport:
    """A matched task's report: exported (or reused from the database), or why not."""
    from .tvm_export import Exported

    exported = group.reused or isinstance(outcome, Exported)
    if not exported:
        log(f"note: {name}: not exported ({outcome})")
    return TaskReport(
        name, weight, template.name, tuple(template.params.items()),
        best_secs=outcome.run_secs if isinstance(outcome, Exported) else group.best, default_secs=group.default,
        trials=group.trials if group.tasks[0] == index else 0, exported=exported,
        note="" if exported else str(outcome), workload=template.describe(), reused=group.reused)


def summary(result: RelaxTuning) -> str:
    """A plain-text table of the tasks: template and shape, tuned and default times."""
    width = max([28] + [len(t.name) for t in result.tasks])
    lines = [f"{'task':<{width}} {'template':<48} {'tuned':>12} {'default':>12}  schedule"]
    for t in result.tasks:
        fmt = lambda s: f"{s * 1e3:.4f} ms" if math.isfinite(s) else "-"  # noqa: E731
        if t.reused:
            how = "tuned (database, reused)"
        else:
            plan = t.template.upper() if t.template in ("gru", "lstm") else ""  # a recurrent layer's plan
            how = ("tuned (database)" if t.exported else f"dlight: {t.note}") if not plan else \
                (f"tuned ({plan} plan)" if t.exported else f"analytic {plan} config: {t.note}")
        lines.append(f"{t.name:<{width}} {t.workload or '-':<48} {fmt(t.best_secs):>12} "
                     f"{fmt(t.default_secs):>12}  {how}")
    return "\n".join(lines)
