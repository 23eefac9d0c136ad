"""Tuned schedules inside TVM's pipeline, on the GPU: (a) the example MLP compiled with our
tuned schedules vs TVM's default (dlight) schedules, both run by the Relax VM; (b) our GEMM
tuner vs meta_schedule's own ``ms.tune_tir`` on the same fp32 GEMM at equal trial budgets.

Run through the device tool (see ../shared/DEVICE.md):
    source .tvm-device/boot.sh && python benchmarks/tvm_pipeline.py --out $OUT
Budgets: 64 trials by default (``--budget 256`` or ``--with-256`` adds the larger one; GPU
time is scarce).  About 4-5 min with the defaults.  Both GEMM kernels are checked against a
float64 numpy reference and timed the same way (``benchmarks/common.py``: back to back on
operand sets rotated past the L2, CUDA events, median of repeats), with cuBLAS (TF32 off)
per call, back to back and from a CUDA graph on the same sets as the vendor reference;
tuning wall time includes each tuner's builds and measurements.  Records, the exported
database and meta_schedule's work dir go under --out.

Without a GPU, ``--dry-run`` runs every step that needs none: task extraction, matching,
database export (default configs), compiling the model for CUDA (source only, with
``tvm_ext.target.offline_cuda()``) and our GEMM's CUDA source.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
from common import l2_rotation, rel_error_vs, table, time_ours, time_vendor, tvm_launch  # noqa: E402
from common import vendor_methods  # noqa: E402

import mlp  # noqa: E402  (examples/mlp.py: the model, its inputs and numpy reference)

from tvm_ext.measure.builder import build_one  # noqa: E402
from tvm_ext.relax.pipeline import compile_relax, extract_tasks, legalize_and_fuse  # noqa: E402
from tvm_ext.relax.pipeline import load_model, match_tasks, summary, tune_relax  # noqa: E402
from tvm_ext.schedules.gemm.simt import GemmTemplate  # noqa: E402
from tvm_ext.core.session import Session, SessionOptions  # noqa: E402
from tvm_ext.target import TargetInfo, offline_cuda, resolve_target  # noqa: E402
from tvm_ext.core.tuner import Tuner  # noqa: E402
from tvm_ext.relax.tvm_export import commit, open_database, tvm_target  # noqa: E402

# The example model at a size where the GEMMs dominate on an H100.
MODEL_SIZES = {"batch": 2048, "features": 1024, "hidden": 4096, "classes": 1024}


def model_label(sizes: dict[str, int]) -> str:
    return f"MLP B{sizes['batch']} {sizes['features']}->{sizes['hidden']}->{sizes['classes']}"


def max_error(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out.astype(np.float64) - ref).max())


# ---- (a) the example model: tuned vs dlight -------------------------------------------------
def bench_model(target: TargetInfo, args: argparse.Namespace) -> list[list[Any]]:
    sizes = dict(MODEL_SIZES, batch=args.batch)
    mod = mlp.get_module(**sizes)
    inputs = mlp.get_inputs(**sizes)
    ref = mlp.reference(inputs)
    db = os.path.join(args.out, "model_database")
    start = time.time()
    tuning = tune_relax(mod, target, os.path.join(args.out, "model_records.jsonl"), db,
                        SessionOptions(population=args.population, generations=1000, trials=args.model_trials,
                                       workers=args.workers, seed=args.seed, build_timeout=300, run_timeout=120,
                                       analytic_seeds=0),  # the GA from the default config, as recorded
                        on_record=_progress("model"))
    tune_secs = time.time() - start
    print(summary(tuning), flush=True)
    rows = []
    results = {}
    for label, database in (("tuned schedules (tvm_ext database)", db), ("TVM default schedules (dlight)", None)):
        model = load_model(mod, target, database)
        err = max_error(model(*inputs), ref)
        secs = model.time(*inputs, repeat=20)
        results[label] = secs
        print(f"  {label}: {secs * 1e3:.3f} ms, max |error| {err:.1e}", flush=True)
        rows.append([model_label(sizes), label, f"{secs * 1e3:.3f}", f"{err:.1e}",
                     f"{tune_secs:.0f}" if database else "-"])
    base = results["TVM default schedules (dlight)"]
    for row, secs in zip(rows, results.values()):
        row.insert(3, f"{base / secs:.2f}")
    return rows


# ---- (b) GEMM: our tuner vs ms.tune_tir ------------------------------------------------------
def operand_sets(n: int, seed: int) -> list[list[np.ndarray]]:
    """GEMM operands (A, B), as many sets as take twice the L2 with C (the timing rotation)."""
    rng = np.random.default_rng(seed)
    return [[rng.uniform(-1, 1, (n, n)).astype("float32") for _ in range(2)]
            for _ in range(l2_rotation(3 * 4 * n * n))]


def time_prim_module(mod: Any, target: TargetInfo, n: int, sets: list[list[np.ndarray]],
                     ref: np.ndarray) -> tuple[float, float]:
    """(median seconds, relative error vs float64 of set 0): compile, check (C poisoned with
    NaN), time back to back on the rotated sets with CUDA events."""
    import tvm

    ex = tvm.compile(mod, target=tvm_target(target))
    dev = tvm.cuda(target.device_id)
    arg_sets = [[tvm.runtime.tensor(a, dev) for a in ab + [np.full((n, n), np.nan, "float32")]] for ab in sets]
    ex.mod["main"](*arg_sets[0])
    dev.sync()
    err = rel_error_vs(arg_sets[0][-1].numpy(), ref)
    return time_ours(tvm_launch(ex.mod["main"], arg_sets), len(arg_sets)).seconds, err


def cublas_rows(n: int, sets: list[list[np.ndarray]], ref: np.ndarray) -> list[list[Any]]:
    """cuBLAS fp32 (TF32 off) on the same operand sets, per call, back to back, CUDA graph."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    pairs = [[torch.from_numpy(a).cuda() for a in ab] for ab in sets]
    times = time_vendor(lambda i: torch.matmul(*pairs[i]), len(pairs))
    err = rel_error_vs(torch.matmul(*pairs[0]), ref)
    flops = 2 * n ** 3
    return [[f"{n}³", "-", f"cuBLAS (torch.matmul), {method}", f"{t.seconds * 1e3:.3f}" if t else "-",
             f"{flops / t.seconds / 1e12:.1f}" if t else "-", "-", "-", f"rel err vs f64 {err:.1e}"]
            for method, t in vendor_methods(times)]


def ours(template: GemmTemplate, target: TargetInfo, budget: int, args: argparse.Namespace) -> dict[str, Any]:
    path = os.path.join(args.out, f"gemm_ours_{budget}.jsonl")
    if os.path.exists(path):
        os.remove(path)  # each budget is an independent run, not a resume
    options = SessionOptions(target=target.kind, device=target.device_id, population=args.population,
                             generations=1000, trials=budget, workers=args.workers, seed=args.seed,
                             records=path, build_timeout=300, run_timeout=120,
                             analytic_seeds=0)  # the GA from the default config, like ms from scratch
    start = time.time()
    with Session(options, target=target) as session:
        result = session.tune(template, on_record=_progress(f"ours {budget}"))
    wall = time.time() - start
    if result.best is None:
        return {"wall": wall, "trials": result.trials, "error": "no correct kernel"}
    sch = template.schedule(result.best.config_obj(), target)
    return {"wall": wall, "trials": result.trials, "mod": sch.mod, "config": str(result.best.config_obj())}


def meta_schedule(template: GemmTemplate, target: TargetInfo, budget: int, args: argparse.Namespace) -> dict[str, Any]:
    try:
        import cloudpickle  # noqa: F401  (meta_schedule's builder and runner pools need both)
        import psutil  # noqa: F401
        from tvm.s_tir import meta_schedule as ms
    except ImportError as exc:
        return {"wall": 0.0, "trials": 0, "error": f"meta_schedule unavailable: {exc}"}
    import tvm

    work_dir = os.path.join(args.out, f"ms_{budget}")
    shutil.rmtree(work_dir, ignore_errors=True)
    mod = tvm.IRModule({"main": template.prim_func()})
    start = time.time()
    try:
        # meta_schedule's builder restarts its workers every batch and each imports
        # tvm.s_tir.tensor_intrin (tens of seconds on a slow host): its default 30 s build
        # timeout can fail every candidate, so it gets the same 300 s as our builder.
        builder = ms.builder.LocalBuilder(max_workers=args.workers, timeout_sec=300)
        db = ms.tune_tir(mod, tvm_target(target), work_dir, max_trials_global=budget,
                         num_trials_per_iter=min(64, budget), seed=args.seed, builder=builder,
                         num_tuning_cores=args.workers)
        wall = time.time() - start
        sch = ms.tir_integration.compile_tir(db, mod, tvm_target(target))
    except Exception as exc:  # a failed baseline is a row of the table, not a crash
        lines = [l for l in str(exc).strip().splitlines() if l.strip()]
        return {"wall": time.time() - start, "trials": 0, "error": (lines[-1] if lines else type(exc).__name__)[:120]}
    if sch is None:
        return {"wall": wall, "trials": budget, "error": "no valid schedule in the database"}
    trials = len(db.get_all_tuning_records())  # measured candidates, failed ones included
    return {"wall": wall, "trials": trials, "mod": sch.mod, "config": "meta_schedule best trace"}


def bench_gemm(target: TargetInfo, args: argparse.Namespace) -> list[list[Any]]:
    n = args.size
    template = GemmTemplate(n, n, n)
    sets = operand_sets(n, args.seed)
    ref = sets[0][0].astype(np.float64) @ sets[0][1].astype(np.float64)
    rows = cublas_rows(n, sets, ref)
    for budget in args.budgets:
        for name, fn in (("tvm_ext GA (ours)", ours), ("meta_schedule tune_tir", meta_schedule)):
            print(f"== {name}, budget {budget}", flush=True)
            res = fn(template, target, budget, args)
            if "error" in res:
                rows.append([f"{n}³", budget, name, "failed", "-", f"{res['wall']:.0f}", res["trials"], res["error"]])
                continue
            secs, err = time_prim_module(res["mod"], target, n, sets, ref)
            ok = err <= 1e-4
            rows.append([f"{n}³", budget, name, f"{secs * 1e3:.3f}" if ok else f"WRONG ({err:.1e})",
                         f"{template.flops() / secs / 1e12:.1f}", f"{res['wall']:.0f}", res["trials"], res["config"]])
            print(f"   {rows[-1]}", flush=True)
    return rows


def _progress(tag: str):
    def show(rec: Any, tuner: Tuner) -> None:
        what = f"{rec.cost * 1e3:.3f} ms" if rec.ok else f"{rec.error_kind} {rec.error_msg[:100]}"
        print(f"  [{tag}] {tuner.template.describe()} trial {tuner.trials}: {what}", flush=True)
    return show


# ---- CPU-only check -------------------------------------------------------------------------------
def dry_run(args: argparse.Namespace) -> None:
    """Everything that needs no GPU: tasks, matching, export, CUDA source for model and GEMM."""
    import tvm

    target = offline_cuda()
    sizes = dict(MODEL_SIZES, batch=args.batch)
    mod = mlp.get_module(**sizes)
    lowered = legalize_and_fuse(mod, target)
    tasks = extract_tasks(lowered, target)
    db_dir = os.path.join(args.out, "dry_run_database")
    shutil.rmtree(db_dir, ignore_errors=True)
    db = open_database(db_dir)
    rows = []
    for task, match in zip(tasks, match_tasks(tasks, target)):
        if match.matched:
            # unmeasured: a placeholder time (the database format needs a finite one)
            commit(db, task.dispatched[0], match, match.template.default_config(target), 1.0, target)
        rows.append([task.task_name, match.template.describe() if match.matched else "-",
                     "exported (default config)" if match.matched else f"dlight: {match.reason}"])
    scheduled = compile_relax(mod, target, db_dir)
    ex = tvm.compile(scheduled, target=tvm_target(target))
    source = ex.mod.imports[0].imports[0].inspect_source()
    kernels = list(dict.fromkeys(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source)))
    rows.append(["(compiled model)", f"{len(kernels)} CUDA kernels", ", ".join(kernels)])
    gemm = GemmTemplate(args.size, args.size, args.size)
    build = build_one(gemm, gemm.default_config(target), target)
    rows.append([gemm.describe(), "default config", "CUDA source ok" if build.ok else build.error_msg])
    print(table(f"dry run (no GPU): {model_label(sizes)}, GEMM {args.size}³", ["task", "template", "result"], rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out")
    p.add_argument("--budget", type=int, action="append", dest="budgets", default=None,
                   help="trial budget for the GEMM comparison (repeatable; default 64)")
    p.add_argument("--with-256", action="store_true", help="also compare at 256 trials (several minutes more)")
    p.add_argument("--size", type=int, default=2048, help="GEMM size N (N×N×N, default 2048)")
    p.add_argument("--batch", type=int, default=MODEL_SIZES["batch"], help="the model's batch size")
    p.add_argument("--model-trials", type=int, default=48, help="trials per GEMM of the model (default 48)")
    p.add_argument("--population", type=int, default=16)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-model", action="store_true")
    p.add_argument("--skip-gemm", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="no GPU: check extraction, export and CUDA codegen")
    args = p.parse_args()
    args.budgets = sorted(set((args.budgets or [64]) + ([256] if args.with_256 else [])))
    os.makedirs(args.out, exist_ok=True)
    if args.dry_run:
        dry_run(args)
        return
    target = resolve_target("cuda", 0)
    model_rows = [] if args.skip_model else bench_model(target, args)
    gemm_rows = [] if args.skip_gemm else bench_gemm(target, args)
    print()
    if model_rows:
        print(table("example MLP in the Relax VM: tuned vs default schedules",
                    ["model", "schedules", "ms", "speedup vs dlight", "max |error|", "tuning s"], model_rows))
        print()
    if gemm_rows:
        print(table("fp32 GEMM: tvm_ext GA vs meta_schedule at equal trial budgets",
                    ["shape", "budget", "tuner", "ms", "TFLOP/s", "tuning s", "trials", "best"], gemm_rows))


if __name__ == "__main__":
    main()
