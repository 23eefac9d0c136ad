"""Two real models end to end on the GPU: the BERT-base encoder layer (transformers'
``BertLayer``, hidden 768, 12 heads, sequence 128, batch 8) and the GRU sequence model
(embedding -> 2-layer GRU hidden 512 -> linear), each in float32 and float16.

Per model, every variant is run in one process, checked against a float64 reference and
timed with ``benchmarks/common.py``'s protocol:

- tvm_ext: ``tune_relax`` (our templates: GEMMs, mma.sync matmuls, row operators, the GRU
  plan; ``--trials`` per task), compiled in the Relax VM with the exported database;
- dlight: TVM's default schedules only (the GRU at its analytic config: TVM has no GRU);
- meta_schedule: ``ms.tune_tasks`` on the same tasks as ours, the same trial budget per task
  (BERT only: the GRU is no TIR task for it), ``--seeds`` seeds (a row per seed);
- torch eager, replayed from a CUDA graph (cuDNN for the GRU), and ``torch.compile``.

TVM variants and torch are timed the same three ways on input sets rotated past the L2:
per call, back to back, and replayed from a CUDA graph (``time_vendor``; for the Relax VM's
call ``time_ours_three``, which captures TVM's launches in the graph); a TVM row is its best
of the three, its note gives all three; ratios are against meta_schedule and torch's best.  Tuning wall
time counts every build and measurement.  Budget: one run within ``--time-limit`` (510 s):
the models run in the order of ``MODELS`` (BERT float16, GRU float32, BERT float32, GRU
float16), ours first within each, and a stage that would not fit the time left is skipped
and says so in the table (``--quick``: 4 trials per task, so that more of it fits;
``--models`` and ``--variants`` pick what a run does).  Every row is appended to
``OUT/models_rows.jsonl`` as it is made and each model's table is printed when the model is
done, so a run stopped by its time limit keeps what it measured.

meta_schedule's tuning alone can take most of a run (BERT: about 8 minutes for 8 trials on
each of its 8 tasks), so it can run by itself (``--variants meta_schedule``), leaving its
database and ``tuning.json`` (wall time, trials) under ``OUT/bert_<dtype>/ms_<seed>``; a
later run times that database beside ours and torch in one process (``--ms-database DIR``,
one per seed, its tuning time read from ``tuning.json``).  Where one seed does not fit a run,
``--ms-tasks 0:4,4:8`` tunes it in parts (each part's tasks by index, each part saved as it
ends, under ``ms_<seed>_tasks<a>-<b>``), and ``--ms-database A+B`` joins a seed's parts (their
tuning times added).

    source .tvm-device/boot.sh && python benchmarks/models.py --out $OUT [--quick]
    python benchmarks/models.py --dry-run   # no GPU: import, lower, match, compile for CUDA (source only)
    ... --models bert:float32 --variants meta_schedule            # meta_schedule's tuning alone
    ... --models bert:float32 --ms-database benchmarks/data/ms_bert_float32_seed0  # then all, it timed
    ... --variants meta_schedule --seed 1 --ms-tasks 0:4,4:8   # a seed in parts, in one or more runs
    ... --ms-database seed0,seed1_part1+seed1_part2            # a seed's parts joined
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from common import (l2_rotation, methods_text, rel_error_vs, table, time_ours_three, time_vendor,  # noqa: E402
                    tvm_launch, vendor_methods)

from tvm_ext.relax.pipeline import (build_model, compile_relax, extract_tasks, legalize_and_fuse,  # noqa: E402
                                    load_model, match_tasks, summary, tune_relax)
from tvm_ext.core.session import SessionOptions  # noqa: E402
from tvm_ext.target import TargetInfo, offline_cuda, resolve_target  # noqa: E402

MODELS = ("bert:float16", "gru:float32", "bert:float32", "gru:float16")  # in the order they run
VARIANTS = ("tvm_ext", "torch", "dlight", "meta_schedule", "compile")
# meta_schedule on the H100, per BERT task: about 50 s to build and measure 8 candidates, most of it
# its builder's fixed cost (a fresh process per batch)
MS_TASK_SECONDS, MS_CANDIDATE_SECONDS = 20, 4


def _example(name: str) -> Any:
    path = os.path.join(ROOT, "examples", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Clock:
    """The run's deadline: a stage starts only if its estimate fits."""

    limit: float
    start: float = field(default_factory=time.time)

    def left(self) -> float:
        return self.limit - (time.time() - self.start)

    def allows(self, estimate: float) -> bool:
        return self.left() >= estimate


@dataclass
class Row:
    model: str
    variant: str
    ms: float | None = None
    err: float | None = None
    tune_s: float | None = None
    trials: str = "-"
    note: str = ""


# ---- the models --------------------------------------------------------------------------------
@dataclass
class Model:
    """One model at one dtype: its Relax module, inputs, float64 reference and torch module."""

    kind: str  # "bert" | "gru"
    dtype: str
    mod: Any
    inputs: list[np.ndarray]
    reference: np.ndarray
    torch_model: Any
    label: str


def make_model(kind: str, dtype: str, size: str = "base") -> Model:
    import torch

    if kind == "bert":
        bert = _example("bert_layer")
        mod = bert.get_module(size=size, dtype=dtype, source="transformers")
        inputs = bert.get_inputs(size=size, dtype=dtype)
        reference = bert.reference(inputs, size=size, dtype=dtype, source="transformers")
        model = bert.torch_model(size=size, dtype=dtype)
        s = bert.SIZES[size]
        label = f"BERT layer h{s['hidden']} {s['heads']} heads s{s['seq']} b{s['batch']} {dtype}"
    else:
        gru = _example("gru_model")
        mod = gru.get_module(size=size, dtype=dtype)
        inputs = gru.get_inputs(size=size, dtype=dtype)
        reference = gru.reference(inputs, size=size, dtype=dtype)
        model = gru.torch_model(size=size, dtype=dtype)
        s = gru.SIZES[size]
        label = (f"GRU model v{s['vocab']} e{s['embed']} {s['layers']}x{s['hidden']} T{s['seq']} b{s['batch']} "
                 f"{dtype}")
    return Model(kind, dtype, mod, inputs, reference, model.cuda().eval() if torch.cuda.is_available() else model,
                 label)


# ---- TVM variants ------------------------------------------------------------------------------
def time_tvm(compiled: Any, inputs: list[np.ndarray], reference: np.ndarray) -> tuple[float, float, str]:
    """(seconds, relative error, how): the Relax VM's call on rotated input sets, timed as
    torch is (per call, back to back, replayed from a CUDA graph with TVM's launches captured);
    the seconds are the best of the three, ``how`` names it and gives the others."""
    import tvm

    dev = tvm.cuda(0)
    set_bytes = sum(a.nbytes for a in inputs) + reference.size * np.dtype(inputs[0].dtype).itemsize
    sets = l2_rotation(set_bytes)
    rng = np.random.default_rng(1)
    arg_sets = [[tvm.runtime.tensor(a, dev) for a in inputs]]
    for _ in range(sets - 1):  # the same kind of data: token ids permuted, activations drawn again
        arg_sets.append([tvm.runtime.tensor(rng.permutation(a.reshape(-1)).reshape(a.shape), dev) for a in inputs])
    out = compiled(*inputs)
    err = rel_error_vs(out, reference)
    func = compiled._vm[compiled.function]
    times = time_ours_three(tvm_launch(func, arg_sets), len(arg_sets))
    best = times.best
    return best.seconds, err, f"best {best.method} ({methods_text(times)})"


def tvm_variant(model: Model, target: TargetInfo, database: Any, label: str, tune_s: float | None = None,
                trials: str = "-", note: str = "") -> Row:
    try:
        compiled = load_model(model.mod, target, database, log=None)
        secs, err, how = time_tvm(compiled, model.inputs, model.reference)
        return Row(model.label, label, secs * 1e3, err, tune_s, trials, "; ".join(x for x in (note, how) if x))
    except Exception as exc:  # a variant that fails is a row of the table, not the end of the run
        return Row(model.label, label, None, None, tune_s, trials, f"failed: {_last_line(exc)}")


def tune_ours(model: Model, target: TargetInfo, args: argparse.Namespace, work: str) -> tuple[str, float, str]:
    options = SessionOptions(target="cuda", population=args.population, generations=1000, trials=args.trials,
                             tourn_size=1 if args.population <= 4 else 2, workers=args.workers, seed=args.seed,
                             build_timeout=300, run_timeout=120)
    start = time.time()
    result = tune_relax(model.mod, target, os.path.join(work, "records.jsonl"), os.path.join(work, "database"),
                        options, log=lambda m: print(f"  {m}", flush=True))
    wall = time.time() - start
    print(summary(result), flush=True)
    tuned = [t for t in result.tasks if t.template]
    trials = f"{sum(t.trials for t in tuned)} ({args.trials}/task, {len(tuned)} tasks)"
    return os.path.join(work, "database"), wall, trials


def matched_tasks(model: Model, target: TargetInfo) -> list[Any]:
    """The model's tasks our templates match: the ones meta_schedule tunes too."""
    tasks = extract_tasks(legalize_and_fuse(model.mod, target), target)
    return [t for t, m in zip(tasks, match_tasks(tasks, target)) if m.matched]


def tune_meta_schedule(model: Model, chosen: list[Any], args: argparse.Namespace, work: str,
                       seed: int) -> tuple[Any, float, str]:
    """meta_schedule on ``chosen`` (the tasks our templates match), ``args.trials`` each; its
    database and ``tuning.json`` stay in ``work`` for a later run (``--ms-database``)."""
    from tvm.s_tir import meta_schedule as ms

    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    start = time.time()
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(chosen, work, seed=seed)
    builder = ms.builder.LocalBuilder(max_workers=args.workers, timeout_sec=300)
    db = ms.tune_tasks(tasks=contexts, task_weights=weights, work_dir=work,
                       max_trials_global=args.trials * len(contexts), max_trials_per_task=args.trials,
                       num_trials_per_iter=args.trials, builder=builder)
    wall = time.time() - start
    trials = f"{len(db.get_all_tuning_records())} ({args.trials}/task, {len(contexts)} tasks)"
    with open(os.path.join(work, "tuning.json"), "w") as f:
        json.dump({"wall_s": wall, "trials": trials, "seed": seed, "model": model.label}, f)
    return db, wall, trials


def load_meta_schedule(folders: list[str]) -> tuple[Any, float, str]:
    """The database(s) ``tune_meta_schedule`` left in ``folders`` (an earlier run: one seed, whole or
    in parts of its tasks), joined, with their tuning time added."""
    import tvm.s_tir.tensor_intrin.cuda  # noqa: F401  (its tensor-core traces name these intrinsics)
    from tvm.s_tir import meta_schedule as ms

    parts = [_load_meta_schedule_part(folder) for folder in folders]
    if len(parts) == 1:
        db, wall, trials = parts[0]
    else:
        db = ms.database.MemoryDatabase()
        for part_db, _, _ in parts:
            for record in part_db.get_all_tuning_records():
                db.commit_workload(record.workload.mod)
                db.commit_tuning_record(record)
        wall = sum(p[1] for p in parts)
        trials = " + ".join(p[2].removesuffix(" (tuned in an earlier run)") for p in parts)
        trials += " (tuned in an earlier run, in parts)"
    failed = _tasks_without_a_record(db)
    return db, wall, trials + (f"; {failed} task(s) with no candidate that ran: dlight's schedule" if failed else "")


def _tasks_without_a_record(db: Any) -> int:
    """Tasks whose every candidate failed to build or run: they compile with dlight's schedule."""
    workloads: dict[str, Any] = {}
    for record in db.get_all_tuning_records():
        workloads.setdefault(record.workload.mod.script(), record)
    return sum(db.query_tuning_record(r.workload.mod, r.target, "main") is None for r in workloads.values())


def _load_meta_schedule_part(work: str) -> tuple[Any, float, str]:
    from tvm.s_tir import meta_schedule as ms

    with open(os.path.join(work, "tuning.json")) as f:
        info = json.load(f)
    paths = []
    for name in ("database_workload.json", "database_tuning_record.json"):
        path = os.path.join(work, name)
        if not os.path.exists(path) and os.path.exists(path + ".gz"):  # as kept under benchmarks/data
            path = os.path.join(tempfile.mkdtemp(prefix="ms_db_"), name)
            with gzip.open(os.path.join(work, name + ".gz"), "rb") as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
        paths.append(path)
    db = ms.database.JSONDatabase(*paths, allow_missing=False)
    return db, info["wall_s"], info["trials"] + " (tuned in an earlier run)"


# ---- torch -------------------------------------------------------------------------------------
def _torch_sets(model: Model) -> list[list[Any]]:
    import torch

    sets = l2_rotation(sum(a.nbytes for a in model.inputs) + model.reference.size * 4)
    rng = np.random.default_rng(1)
    return [[torch.from_numpy(a).cuda() for a in model.inputs]] + [
        [torch.from_numpy(rng.permutation(a.reshape(-1)).reshape(a.shape)).cuda() for a in model.inputs]
        for _ in range(sets - 1)]


def torch_rows(model: Model) -> list[Row]:
    """torch eager per call, back to back and replayed from a CUDA graph (cuDNN for the GRU)."""
    import torch

    arg_sets = _torch_sets(model)
    rows = []
    with torch.no_grad():
        eager = model.torch_model
        err = rel_error_vs(eager(*arg_sets[0]), model.reference)
        times = time_vendor(lambda i: eager(*arg_sets[i]), len(arg_sets))
        names = {"per call": "torch eager (per call)", "back-to-back": "torch eager", "CUDA graph": "torch CUDA graph"}
        for method, t in vendor_methods(times):
            label = names.get(method, f"torch {method}")
            rows.append(Row(model.label, label, t.seconds * 1e3 if t else None, err if t else None,
                            note="" if t else label))
    return rows


def torch_compile_row(model: Model) -> Row:
    """``torch.compile`` (default mode), back to back; its compile time as the tuning time."""
    import torch

    arg_sets = _torch_sets(model)
    try:
        with torch.no_grad():
            start = time.time()
            compiled = torch.compile(model.torch_model)
            out = compiled(*arg_sets[0])
            torch.cuda.synchronize()
            compile_s = time.time() - start
            times = time_vendor(lambda i: compiled(*arg_sets[i]), len(arg_sets), graph=False)
        return Row(model.label, "torch.compile", times.back_to_back.seconds * 1e3, rel_error_vs(out, model.reference),
                   compile_s, note="back to back; tuning s = compile")
    except Exception as exc:
        return Row(model.label, "torch.compile", note=f"failed: {_last_line(exc)}")


# ---- one model ---------------------------------------------------------------------------------
class RowLog:
    """The run's rows: each appended to ``OUT/name`` and printed as it is made."""

    def __init__(self, out: str, name: str = "models_rows.jsonl") -> None:
        self.path = os.path.join(out, name)
        self.rows: list[Row] = []

    def add(self, *rows: Row) -> None:
        with open(self.path, "a") as f:
            for row in rows:
                self.rows.append(row)
                f.write(json.dumps(dataclasses.asdict(row)) + "\n")
                ms = f"{row.ms:.3f} ms" if row.ms else "-"
                print(f"  row: {row.variant}: {ms} {row.note}".rstrip(), flush=True)


VERSUS_COMPILE_HEADER = ["model", "variant", "ms", "ours vs: compile max-autotune (best)", "torch CUDA graph", "err",
                         "tune s", "trials", "note"]


def versus_compile(rows: list[Row]) -> list[list[str]]:
    """Every row (``VERSUS_COMPILE_HEADER``) with ours against ``torch.compile`` max-autotune (its
    best over modes and ways of calling) and against torch in a CUDA graph, per model."""
    out = []
    for label in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == label]
        compiled = min((r.ms for r in mine if r.ms and r.variant.startswith("torch.compile max-autotune")),
                       default=None)
        graph = next((r.ms for r in mine if r.ms and r.variant == "torch CUDA graph"), None)
        for r in mine:
            vs = lambda base, r=r: f"{base / r.ms:.2f}" if base and r.ms else "-"  # noqa: E731
            out.append([label, r.variant, f"{r.ms:.3f}" if r.ms else "-", vs(compiled), vs(graph),
                        f"{r.err:.1e}" if r.err is not None else "-", f"{r.tune_s:.0f}" if r.tune_s else "-",
                        r.trials, r.note])
    return out


def bench(kind: str, dtype: str, target: TargetInfo, args: argparse.Namespace, clock: Clock, log: RowLog) -> None:
    """One model: ours first (the point of the run), then torch, dlight, meta_schedule and
    torch.compile (those of ``args.variants``), each only if it fits the run's time."""
    print(f"== {kind} {dtype} ({clock.left():.0f} s left)", flush=True)
    model = make_model(kind, dtype)
    work = os.path.join(args.out, f"{kind}_{dtype}")
    wants = args.variants.__contains__
    if wants("tvm_ext"):
        if clock.allows(120):
            database, wall, trials = tune_ours(model, target, args, os.path.join(work, "tvm_ext"))
            log.add(tvm_variant(model, target, database, "tvm_ext", wall, trials))
        else:
            log.add(Row(model.label, "tvm_ext", note="skipped (time)"))
    if wants("torch"):
        log.add(*torch_rows(model))
    dlight = "dlight" if kind == "bert" else "dlight + GRU analytic config"
    if wants("dlight"):
        log.add(tvm_variant(model, target, None, dlight) if clock.allows(30) else
                Row(model.label, dlight, note="skipped (time)"))
    if kind == "bert" and wants("meta_schedule"):
        meta_schedule_rows(model, target, args, clock, work, log)
    if wants("compile"):
        if args.no_compile or not clock.allows(75):
            log.add(Row(model.label, "torch.compile",
                        note="skipped (" + ("--no-compile" if args.no_compile else "time") + ")"))
        else:
            log.add(torch_compile_row(model))


def meta_schedule_rows(model: Model, target: TargetInfo, args: argparse.Namespace, clock: Clock, work: str,
                       log: RowLog) -> None:
    """A row per seed: the databases of ``--ms-database`` (tuned in an earlier run), else a tuning
    run per seed where its estimated time fits."""
    if args.ms_database:
        for seed, folders in enumerate(args.ms_database):
            label = f"meta_schedule (seed {args.seed + seed})"
            try:
                db, wall, trials = load_meta_schedule(folders)
                log.add(tvm_variant(model, target, db, label, wall, trials))
            except Exception as exc:
                log.add(Row(model.label, label, note=f"failed: {_last_line(exc)}"))
        return
    chosen = matched_tasks(model, target)  # lowered once for every seed
    parts = args.ms_tasks or [(0, len(chosen))]
    for seed in range(args.seeds):
        for first, end in parts:
            part = chosen[first:end]
            whole = (first, end) == (0, len(chosen))
            label = f"meta_schedule (seed {args.seed + seed})" + ("" if whole else f", tasks {first}-{end}")
            estimate = 60 + (MS_TASK_SECONDS + MS_CANDIDATE_SECONDS * args.trials) * len(part)
            if not part or not clock.allows(estimate):
                why = "no such tasks" if not part else f"time: about {estimate:.0f} s"
                log.add(Row(model.label, label, note=f"skipped ({why})"))
                continue
            folder = f"ms_{args.seed + seed}" + ("" if whole else f"_tasks{first}-{end}")
            try:
                db, wall, trials = tune_meta_schedule(model, part, args, os.path.join(work, folder),
                                                      args.seed + seed)
                # a part's database holds some tasks only: timed once its parts are joined (--ms-database)
                log.add(tvm_variant(model, target, db, label, wall, trials) if whole else
                        Row(model.label, label, None, None, wall, trials, note=f"tuned part, in {folder}"))
            except Exception as exc:
                log.add(Row(model.label, label, note=f"failed: {_last_line(exc)}"))


def ratios(rows: list[Row]) -> list[list[str]]:
    """Every row with its speedup over meta_schedule (best seed) and over torch's best."""
    out = []
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        timed = lambda prefix, mine=mine: [r.ms for r in mine if r.variant.startswith(prefix) and r.ms]  # noqa: E731
        ms_best = min(timed("meta_schedule"), default=None)
        torch_best = min(timed("torch"), default=None)
        for r in mine:
            vs = lambda base, r=r: f"{base / r.ms:.2f}" if base and r.ms else "-"  # noqa: E731
            out.append([r.model, r.variant, f"{r.ms:.3f}" if r.ms else "-", vs(ms_best), vs(torch_best),
                        f"{r.err:.1e}" if r.err is not None else "-", f"{r.tune_s:.0f}" if r.tune_s else "-",
                        r.trials, r.note])
    return out


def targets(rows: list[Row]) -> list[str]:
    """The issue's targets, met or not, from the measured rows."""
    lines = []
    for model in dict.fromkeys(r.model for r in rows):
        mine = {r.variant: r.ms for r in rows if r.model == model and r.ms}
        ours = mine.get("tvm_ext")
        if not ours:
            continue
        ms = min((v for k, v in mine.items() if k.startswith("meta_schedule")), default=None)
        # torch eager at its best: back to back or per call (a host-bound eager run moves with the host)
        eager = min((v for k, v in mine.items() if k.startswith("torch eager")), default=None)
        graph = mine.get("torch CUDA graph")
        if model.startswith("BERT"):
            if ms:
                lines.append(f"{model}: tvm_ext {ms / ours:.2f}x meta_schedule (target >= 1.3)")
            if eager:
                lines.append(f"{model}: tvm_ext {eager / ours:.2f}x torch eager at its best (target >= 1.0)")
        elif graph:
            lines.append(f"{model}: tvm_ext {graph / ours:.2f}x torch in a CUDA graph (cuDNN; target >= 1.5)")
    return lines


def _last_line(exc: Exception) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:160]


# ---- CPU-only check ----------------------------------------------------------------------------------
def dry_run(args: argparse.Namespace) -> None:
    """No GPU: each model's module (the nn BERT, or transformers' when importable), its tasks
    and matches for CUDA, and the model compiled for CUDA with default configs (source only)."""

    target = offline_cuda()
    rows = []
    for spec in args.models:
        kind, dtype = spec.split(":")
        start = time.time()
        if kind == "bert":
            bert = _example("bert_layer")
            try:
                mod = bert.get_module(size=args.size, dtype=dtype, source="transformers")
                source = "transformers"
            except ImportError:
                mod, source = bert.get_module(size=args.size, dtype=dtype, source="nn"), "nn (no transformers here)"
        else:
            mod, source = _example("gru_model").get_module(size=args.size, dtype=dtype), "nn"
        tasks = extract_tasks(legalize_and_fuse(mod, target), target)
        matches = match_tasks(tasks, target)
        scheduled = compile_relax(mod, target, None, log=None)
        build_model(scheduled, target)
        from tvm_ext.relax.relax_gru import find_grus

        matched = [f"{m.name}: {m.template.describe()}" for m in matches if m.matched]
        matched += [f"GRU: {g.template.describe()}" for g in find_grus(mod, target)]
        rows.append([f"{kind} {dtype} ({source})", len(tasks), "; ".join(matched) or "-", f"{time.time() - start:.0f}"])
    print(table(f"dry run (no GPU, {args.size})", ["model", "tasks", "matched", "s"], rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated of {', '.join(MODELS)}")
    p.add_argument("--trials", type=int, default=None, help="trials per task, ours and meta_schedule's (default 8; "
                                                            "--quick 4)")
    p.add_argument("--seeds", type=int, default=1, help="meta_schedule seeds (3 if time allows; default 1)")
    p.add_argument("--population", type=int, default=None, help="our GA's population (default 8; --quick 4)")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=510.0, help="seconds; later stages are skipped past it")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated of {', '.join(VARIANTS)}")
    p.add_argument("--ms-database", default="",
                   help="comma-separated meta_schedule work folders of an earlier run (one per seed; a seed "
                        "tuned in parts as PART+PART) to time instead of tuning")
    p.add_argument("--ms-tasks", default="",
                   help="tune meta_schedule in parts of its tasks, comma-separated index slices such as 0:4,4:8")
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--quick", action="store_true", help="smaller budgets")
    p.add_argument("--dry-run", action="store_true", help="no GPU: import, lower, match, compile for CUDA")
    p.add_argument("--size", default="base", help="model sizes for --dry-run (base or small)")
    args = p.parse_args()
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        p.error(f"unknown models {unknown}; allowed: {', '.join(MODELS)}")
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; allowed: {', '.join(VARIANTS)}")
    args.ms_database = [[d.strip() for d in seed.split("+") if d.strip()]
                        for seed in args.ms_database.split(",") if seed.strip()]
    missing = [d for seed in args.ms_database for d in seed if not os.path.isfile(os.path.join(d, "tuning.json"))]
    if missing:
        p.error(f"no meta_schedule run in {missing[0]} (tuning.json missing)")
    try:
        args.ms_tasks = [tuple(int(i) for i in part.split(":")) for part in args.ms_tasks.split(",") if part.strip()]
    except ValueError:
        p.error(f"--ms-tasks {args.ms_tasks!r}: comma-separated FIRST:END task index slices, such as 0:4,4:8")
    if any(len(part) != 2 or not 0 <= part[0] < part[1] for part in args.ms_tasks):
        p.error(f"--ms-tasks {args.ms_tasks}: each part is FIRST:END with 0 <= FIRST < END")
    args.trials = args.trials or (4 if args.quick else 8)
    args.population = args.population or (4 if args.quick else 8)
    os.makedirs(args.out, exist_ok=True)
    if args.dry_run:
        dry_run(args)
        return
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 GEMMs in float32, as ours
    torch.backends.cudnn.allow_tf32 = False
    clock = Clock(args.time_limit)
    target = resolve_target("cuda", 0)
    log = RowLog(args.out)
    seeds = len(args.ms_database) or args.seeds
    seeds_text = f"meta_schedule {seeds} seed(s)" + ("" if seeds >= 3 else " (3 did not fit the run's time)")
    for spec in args.models:
        kind, dtype = spec.split(":")
        if not clock.allows(60):
            log.add(Row(spec, "all variants", note="skipped (time)"))
            continue
        try:
            bench(kind, dtype, target, args, clock, log)
        except Exception as exc:  # one model failing leaves the others' rows
            log.add(Row(spec, "all variants", note=f"failed: {_last_line(exc)}"))
        print(f"  ({time.time() - clock.start:.0f} s so far)", flush=True)
        print_table(log.rows, args.trials, seeds_text)


def print_table(rows: list[Row], trials: int, seeds: str) -> None:
    print()
    print(table(f"models end to end: ms per forward pass; {trials} trials per task; {seeds}",
                ["model", "variant", "ms", "vs meta_schedule", "vs torch best", "rel err vs f64", "tuning s",
                 "trials", "note"], ratios(rows)))
    for line in targets(rows):
        print(line)


if __name__ == "__main__":
    main()
