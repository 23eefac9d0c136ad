"""Measurement as data: a job that checks one built program against its float64 reference,
then times it, in any process (or machine) that has the device and none of the template code.

The driver turns (template, config, artifact) into a ``MeasureJob`` (``make_job``): the
artifact (OpenCL source or the CUDA library as bytes, and the launch plan), every buffer's
name and spec, the check's inputs (how to draw them from the seed, or the arrays when a
template draws its own), their references computed once (per workload and seed) on the
driver, the check itself, and how to run and time the program (``RunPlan``).  A worker runs
it with ``run_job``: the executor of its backend (``tvm_ext.measure.executors``) runs the launches
on the inputs with outputs and scratch poisoned (NaN), the outputs are checked, and only a
correct program is timed.  Failures are data
(``RunResult.error_kind``), never exceptions.
"""
from __future__ import annotations

import math
import statistics
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .checks import OutputCheck
from ..core.errors import ErrorKind
from ..precision.precision import np_dtype, relative_error
from .program import Artifact, FailureFlag, RunPlan, TensorSpec, UniformInputs  # noqa: F401  (re-exported)
from ..target import TargetInfo
from .timing import rotation_count

if TYPE_CHECKING:
    from ..core.space import Config
    from ..core.template import Template

_CASE_CACHE_SIZE = 8  # workloads whose check inputs and references the driver keeps


@dataclass(frozen=True)
class MeasureSettings:
    warmup: int = 2
    repeat: int = 5  # timed repeats; the cost is their median
    min_repeat_secs: float = 0.02  # each repeat loops the kernel at least this long
    seed: int = 0  # inputs used for the correctness check and timing
    cuda_graph: bool = True  # CUDA, device timer: replay the calls from a CUDA graph (``tvm_ext.measure.cuda_graph``)


@dataclass(frozen=True)
class RunResult:
    costs: tuple[float, ...]  # seconds per run, one per repeat
    error_kind: ErrorKind = ErrorKind.OK
    error_msg: str = ""
    metrics: dict = field(default_factory=dict)  # rel_error (also of a wrong answer), stage_secs

    def __post_init__(self) -> None:
        object.__setattr__(self, "error_kind", ErrorKind(self.error_kind))  # a kind's string works too

    @property
    def ok(self) -> bool:
        return not self.error_kind

    @property
    def cost(self) -> float:
        return statistics.median(self.costs) if self.ok and self.costs else math.inf


@dataclass(frozen=True, eq=False)
class MeasureJob:
    """Everything needed to check and time one program, as picklable data."""

    artifact: Artifact
    buffers: tuple[tuple[str, TensorSpec], ...]  # every buffer by name: inputs, outputs, then scratch
    n_inputs: int
    n_outputs: int
    inputs: UniformInputs | tuple[np.ndarray, ...]  # the check's inputs: drawn from ``settings.seed``
    # (by the worker), or the arrays themselves for a template that draws its own
    references: tuple[np.ndarray, ...]  # float64 references of those inputs, computed on the driver
    check: OutputCheck
    plan: RunPlan
    settings: MeasureSettings
    rotation_sets: int = 1  # input sets the timing cycles through
    device_id: int = 0


# ---- the driver's side -------------------------------------------------------------------------
_CASES: dict[tuple[str, int], tuple[list[np.ndarray], list[np.ndarray]]] = {}
_CASES_LOCK = threading.Lock()  # one computation per case: the runners make it ahead on a thread


def reference_case(operator: "Template", seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The check's inputs and float64 references for ``operator`` (``make_case``), computed
    once per workload and seed."""
    key = (repr(operator), seed)
    with _CASES_LOCK:
        if key not in _CASES:
            if len(_CASES) >= _CASE_CACHE_SIZE:
                _CASES.clear()
            _CASES[key] = operator.make_case(np.random.default_rng(seed))
        return _CASES[key]


MAX_ROTATION_SETS = 32  # input sets a measurement cycles through at most


def rotation_sets(nbytes: float, target: TargetInfo) -> int:
    """How many input sets to cycle through so timing does not measure a warm L2: together
    twice the L2 (``tvm_ext.measure.timing.rotation_count``, the benchmarks' rule too)."""
    if target.is_cpu:
        return 1
    return rotation_count(nbytes, target.l2_bytes, MAX_ROTATION_SETS)


def make_job(template: "Template", config: "Config", artifact: Artifact, target: TargetInfo,
             settings: MeasureSettings, device_id: int | None = None) -> MeasureJob:
    """The job measuring ``artifact`` (built from ``config`` of ``template``) on ``target``."""
    operator = template.measured_operator(config)
    inputs, refs = reference_case(operator, settings.seed)
    specs = operator.inputs() + operator.outputs() + operator.scratch()
    if len(specs) != len(artifact.params):
        raise ValueError(f"{operator.name}: the program has {len(artifact.params)} buffers, "
                         f"the operator {len(specs)} tensors")
    plan = template.run_plan(config, artifact)
    sets = rotation_sets(operator.bytes_moved(), target) if plan.rotate_inputs else 1
    drawn, references, check = _check_data(operator, inputs, refs)
    return MeasureJob(artifact, tuple(zip(artifact.params, specs)), len(operator.inputs()), len(operator.outputs()),
                      drawn, references, check, plan, settings, sets,
                      target.device_id if device_id is None else device_id)


def job_case(template: "Template", config: "Config", settings: MeasureSettings) -> tuple[Any, ...]:
    """The case (``tvm_ext.measure.cases``) of every job measuring ``config`` of ``template``:
    known before anything is built, so it can be sent ahead of the first job."""
    operator = template.measured_operator(config)
    drawn, references, check = _check_data(operator, *reference_case(operator, settings.seed))
    return (None if isinstance(drawn, UniformInputs) else drawn), references, check


def keyed_case(template: "Template", config: "Config", settings: MeasureSettings) -> tuple[str, tuple[Any, ...]] | None:
    """``job_case`` with its key, for sending ahead of the jobs (``Runner.prepare``); None where
    it cannot be made or has no key (the jobs then meet the failure and say so, or carry it)."""
    from .cases import case_key_of

    try:
        case = job_case(template, config, settings)
    except Exception:
        return None
    key = case_key_of(case)
    return None if key is None else (key, case)


def _check_data(operator: Any, inputs: Sequence[np.ndarray], refs: Sequence[np.ndarray]
                ) -> tuple[UniformInputs | tuple[np.ndarray, ...], tuple[np.ndarray, ...], OutputCheck]:
    """A job's inputs (drawn from the seed where the measuring side can: large inputs do not
    travel), references and check."""
    full = operator.full_precision()
    if operator.case_drawn_from_seed:
        drawn: UniformInputs | tuple[np.ndarray, ...] = UniformInputs(*full.input_range,
                                                                     tuple(s.dtype for s in full.inputs()))
    else:
        drawn = tuple(np.asarray(a) for a in inputs)
    return drawn, tuple(np.asarray(r) for r in refs), operator.output_check(refs)


# ---- the worker's side ----------------------------------------------------------------------------
def time_loop(launch: Callable[[int], Any], sync: Callable[[], None], settings: MeasureSettings) -> list[float]:
    """Host clock around ``number`` back-to-back launches, synchronised.

    ``launch(i)`` runs the program on input set i.  ``number`` grows until one repeat
    lasts ``min_repeat_secs``, so launch overhead and timer resolution stay small.
    """
    for i in range(settings.warmup):
        launch(i)
    sync()
    number, elapsed = 1, 0.0
    while True:
        start = time.perf_counter()
        for i in range(number):
            launch(i)
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= settings.min_repeat_secs or number >= 1 << 16:
            break
        number = min(1 << 16, max(number * 2, int(number * settings.min_repeat_secs / max(elapsed, 1e-9))))
    costs = [elapsed / number]
    for _ in range(settings.repeat - 1):
        start = time.perf_counter()
        for i in range(number):
            launch(i)
        sync()
        costs.append((time.perf_counter() - start) / number)
    return costs


def _events_loop(one: Callable[[int], float], settings: MeasureSettings) -> list[float]:
    """Device-timed runs (``one(i)``: seconds of a run on input set i), medians of chunks:
    short programs are run more often so the median is stable."""
    for i in range(settings.warmup):
        one(i)
    samples = [one(i) for i in range(max(settings.repeat, 3))]
    while sum(samples) < settings.min_repeat_secs and len(samples) < 200:
        samples.extend(one(i) for i in range(len(samples)))
    chunk = max(1, len(samples) // settings.repeat)
    return [statistics.median(samples[i:i + chunk]) for i in range(0, chunk * settings.repeat, chunk)]


def _poison(spec: TensorSpec) -> np.ndarray:
    """NaN (or all bits set for integer buffers: -1, or an unsigned type's maximum), so an
    unwritten element fails the check; a scratch buffer that declares a ``fill`` (a counter
    that starts at 0) gets that."""
    dtype = np_dtype(spec.dtype)
    if spec.fill is not None:
        return np.full(spec.shape, spec.fill, dtype)
    if spec.dtype.startswith(("float", "bfloat")):
        return np.full(spec.shape, np.nan, dtype)
    return np.full(spec.shape, np.iinfo(dtype).max if dtype.kind == "u" else -1, dtype)


def warm_device(kind: str, device_id: int) -> None:
    """In a measuring process before its first job: load TVM's runtime and, on CUDA, create the
    device's context (seconds that would otherwise delay that process's first measurement)."""
    import tvm

    from . import executors  # noqa: F401  (what every job imports)

    if kind == "cuda":
        from .cuda_graph import cudart

        tvm.runtime.empty((1,), "float32", tvm.cuda(device_id))
        cudart()  # the CUDA runtime the graph timer calls


def executor_for(job: MeasureJob) -> Any:
    from .executors import CudaExecutor, OpenclExecutor

    art, specs = job.artifact, dict(job.buffers)
    if art.kind == "opencl":
        return OpenclExecutor.of(art.source, art.launches, specs, job.device_id, sets=job.rotation_sets,
                                 profiling=job.plan.timer == "device", prepared=job.plan.prepare_steps)
    return CudaExecutor.from_library(art.library, art.calls, specs, job.device_id, sets=job.rotation_sets,
                                     prepared=job.plan.prepare_steps)


def _write_poison(executor: Any, job: MeasureJob, names: Sequence[str], index: int) -> None:
    """Buffers ``names`` of input set ``index`` set to ``_poison`` (NaN, or their fill)."""
    specs = dict(job.buffers)
    for name in names:
        executor.write(name, _poison(specs[name]), index)


def _timed(executor: Any, job: MeasureJob, outputs: Sequence[str]) -> tuple[list[float], str]:
    """The program's seconds per run and how they were taken (``metrics["timer"]``): on
    CUDA with the device timer, from a CUDA graph's replays where the calls can be captured
    (else, and saying why, as before)."""
    from .executors import CudaExecutor

    sets, s = len(executor.sets), job.settings
    if job.plan.timer == "device" and job.artifact.kind == "opencl":
        return _events_loop(lambda i: executor.device_secs(i % sets), s), "opencl events"
    why = ""
    if job.plan.timer == "device" and s.cuda_graph and isinstance(executor, CudaExecutor):
        from .cuda_graph import CudaGraphError

        try:
            return _graph_secs(executor, job, outputs), "cuda graph"
        except CudaGraphError as exc:
            why = f" (cuda graph: {str(exc)[:120]})"
    if job.plan.timer == "device" and sets == 1 and executor.single_main:
        return executor.evaluator_secs(s.repeat, s.min_repeat_secs), "tvm evaluator" + why
    return time_loop(lambda i: executor.run(i % sets), executor.sync, s), "host loop" + why


def _graph_secs(executor: Any, job: MeasureJob, outputs: Sequence[str]) -> list[float]:
    """Seconds per run from CUDA graph replays, after one replay on NaN-poisoned outputs has
    passed the job's check (a graph that does not run the calls must not be timed)."""
    from .cuda_graph import CudaGraphError

    start = time.perf_counter()
    for _ in range(3):  # how many calls a replay of a few ms holds (the host-bound rate: an upper bound)
        executor.run(0)
        executor.sync()
    captured = executor.capture((time.perf_counter() - start) / 3)
    try:
        _write_poison(executor, job, outputs, 0)
        executor.sync()  # the copies done on every stream before the replay's stream starts
        captured.replay()
        captured.sync()
        wrong = job.check([executor.read(name) for name in outputs], job.references)
        if wrong:
            raise CudaGraphError(f"replayed graph gave a wrong answer: {wrong}")
        return captured.seconds(max(job.settings.repeat, 3), job.settings.warmup)
    finally:
        captured.close()


def run_job(job: MeasureJob, executor: Any = None) -> RunResult:
    """Check, then time, one program (inside a runner's worker); any failure is data.

    ``executor``: the program already loaded somewhere else than this process's device
    (a stock TVM RPC server's module and device: ``tvm_ext.remote.rpc_runner``); default: the
    executor of the job's backend here.  ``metrics["measure_secs"]``: the seconds it took."""
    start = time.perf_counter()
    try:
        result = _run(job, executor if executor is not None else executor_for(job))
    except Exception as exc:
        text = str(exc).strip().splitlines()
        result = RunResult((), ErrorKind.RUN_ERROR, (text[-1] if text else type(exc).__name__)[:300])
    return replace(result, metrics={**result.metrics, "measure_secs": round(time.perf_counter() - start, 4)})


def _run(job: MeasureJob, executor: Any) -> RunResult:
    names = [name for name, _ in job.buffers]
    specs = dict(job.buffers)
    inputs, outputs = names[: job.n_inputs], names[job.n_inputs: job.n_inputs + job.n_outputs]
    for index, arrays in enumerate(_input_sets(job, [specs[n] for n in inputs], len(executor.sets))):
        for name, array in zip(inputs, arrays):
            executor.write(name, array, index)
        _write_poison(executor, job, names[job.n_inputs:], index)
        if job.plan.prepare_steps:
            executor.prepare(index)  # from this set's weights, once
    executor.run()
    executor.sync()
    results = [executor.read(name) for name in outputs]
    metrics: dict[str, Any] = {"rel_error": relative_error(results, job.references)}
    flag = job.plan.failure_flag
    if flag is not None and executor.read(flag.buffer).reshape(-1)[flag.word]:
        return RunResult((), ErrorKind.RUN_ERROR, flag.message, metrics=metrics)
    wrong = job.check(results, job.references)
    if wrong:
        return RunResult((), ErrorKind.WRONG_ANSWER, wrong, metrics=metrics)
    timed, metrics["timer"] = _timed(executor, job, outputs)
    costs = tuple(timed)
    if job.plan.stages:
        metrics["stage_secs"] = _stage_secs(executor, job.plan.stages, statistics.median(costs))
    return RunResult(costs, metrics=metrics)


_DRAWN: "OrderedDict[tuple, list[list[np.ndarray]]]" = OrderedDict()  # input sets drawn in this process
DRAWN_KEPT = 2  # workloads whose drawn input sets a measuring process keeps


def _input_sets(job: MeasureJob, specs: list[TensorSpec], count: int) -> list[list[np.ndarray]]:
    """The job's input sets: the check's (drawn from the seed, or given), then ``count`` - 1
    more for timing (from seed + 1).  Drawn sets are the same for every config of a workload,
    so a measuring process draws them once (drawing two 2048² inputs takes about as long as
    timing a kernel)."""
    drawn = isinstance(job.inputs, UniformInputs)
    key = (job.inputs, job.settings.seed, tuple((s.shape, s.dtype) for s in specs), count) if drawn else None
    if key is not None and key in _DRAWN:
        _DRAWN.move_to_end(key)
        return _DRAWN[key]
    draw = job.inputs if drawn else UniformInputs()
    sets = [job.inputs.draw(np.random.default_rng(job.settings.seed), specs) if drawn else list(job.inputs)]
    rng = np.random.default_rng(job.settings.seed + 1)  # other sets: fresh values, for timing only
    sets += [draw.draw(rng, specs) for _ in range(count - 1)]
    if key is not None:
        for arrays in sets:
            for array in arrays:
                array.flags.writeable = False
        _DRAWN[key] = sets
        while len(_DRAWN) > DRAWN_KEPT:
            _DRAWN.popitem(last=False)
    return sets


def _stage_secs(executor: Any, stages: Sequence[Sequence[str]], cost: float) -> dict[str, float]:
    """Seconds per run of each stage; a program of one stage is all of its cost."""
    names = tuple(dict.fromkeys(s for owners in stages for s in owners))
    if len(names) == 1:
        return {names[0]: cost}
    return executor.stage_secs(stages)


def measure(template: "Template", config: "Config", artifact: Artifact, target: TargetInfo,
            settings: MeasureSettings | None = None) -> RunResult:
    """``run_job`` of ``make_job`` in this process (no isolation, no timeout): tests and scripts."""
    return run_job(make_job(template, config, artifact, target, settings or MeasureSettings()))
