"""Whole BERT-base as a PyTorch user has it, through ``torch.export``, against ``torch.compile``.

transformers' ``BertModel`` (12 layers, hidden 768, 12 heads, no pooler, random weights from a
fixed seed, eval mode, its default SDPA attention), token ids of batch 8 and sequence 128,
float16 and float32; with ``--mlm`` ``BertForMaskedLM``, the encoder and its masked-language-model
head (a transform and a Linear to the 30522-token vocabulary, the logits its output). Per case,
one process, the same rotated inputs, every output against the model in float64 on the CPU:

- torch eager per call, back to back and replayed from a CUDA graph; ``torch.compile`` default
  and ``mode="max-autotune"`` (its own CUDA graphs), back to back, their compile time as their
  tuning time. Float32 runs with TF32 off on both sides (float32-accurate), labelled.
- ours: the model saved as a ``.pt2`` and imported as ``tune model FILE.pt2`` imports it, tuned
  from empty records (``tune_relax``, ``--trials`` per task: the time to a fast model), tuned a
  second time on the same database (what a rerun costs: nothing measured, builds only), compiled
  in the Relax VM and timed per call, back to back and replayed from a CUDA graph (the best).
- where the time goes: one ``torch.profiler`` trace of a few back-to-back calls of ours and of
  ``torch.compile`` max-autotune (CUPTI sees TVM's kernels too), GPU time per kernel name, the
  largest first.

Targets: ours >= 1.15x ``torch.compile(mode="max-autotune")`` in float16 and >= 1.3x in float32
(TF32 off on both sides); tuned from empty records in <= 10 minutes, a rerun on the same
database in under a minute. Rows go to ``OUT/bert_model_rows.jsonl`` as they are made.

    source .tvm-device/boot.sh && python benchmarks/bert_model.py --out $OUT --dtypes float16
    python benchmarks/bert_model.py --dry-run --layers 2   # no GPU: export, import, match, compile for CUDA
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import (breakdown_table, kernel_breakdown, l2_rotation, rel_error_vs, table, time_vendor,  # noqa: E402
                    vendor_methods)
from models import VERSUS_COMPILE_HEADER, Row, RowLog, _last_line, time_tvm, versus_compile  # noqa: E402

BATCH, SEQ, VOCAB = 8, 128, 30522


def torch_model(layers: int, mlm: bool = False) -> Any:
    """BertModel base with ``layers`` layers (with ``mlm``, BertForMaskedLM: its masked-language-model
    head too, a transform and a Linear to the 30522-token vocabulary), weights from seed 0, float32,
    CPU, eval mode."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertModel

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=layers)
    return (BertForMaskedLM(config) if mlm else BertModel(config, add_pooling_layer=False)).eval()


def output(result: Any) -> Any:
    """The tensor a model's call returns: the vocabulary's logits (the head), else the last hidden state."""
    return result.logits if hasattr(result, "logits") else result.last_hidden_state


def inputs() -> np.ndarray:
    return np.random.default_rng(1).integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64)


def reference(model: Any, ids: np.ndarray) -> np.ndarray:
    """The last hidden state in float64 on the CPU (the float32 weights widened)."""
    import copy

    import torch

    with torch.no_grad():
        return output(copy.deepcopy(model).double()(torch.from_numpy(ids))).numpy()


def export(model: Any, dtype: str, ids: np.ndarray, path: str) -> str:
    import torch

    program = torch.export.export(model.to(getattr(torch, dtype)), (torch.from_numpy(ids),))
    torch.export.save(program, path)
    return path


def tf32(enabled: bool) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled


def torch_rows(label: str, model: Any, sets: list[Any], ref: np.ndarray) -> list[Row]:
    import torch

    rows = []
    with torch.no_grad():
        err = rel_error_vs(output(model(sets[0])), ref)
        times = time_vendor(lambda i: output(model(sets[i])), len(sets))
        names = {"per call": "torch eager (per call)", "back-to-back": "torch eager", "CUDA graph": "torch CUDA graph"}
        for method, t in vendor_methods(times):
            rows.append(Row(label, names.get(method, f"torch {method}"), t.seconds * 1e3 if t else None,
                            err if t else None, note="" if t else "failed"))
    return rows


def compiled_model(model: Any, mode: str | None, sample: Any) -> tuple[Any, float]:
    import torch

    start = time.time()
    compiled = torch.compile(model, mode=mode) if mode else torch.compile(model)
    with torch.no_grad():
        compiled(sample)
        torch.cuda.synchronize()
    return compiled, time.time() - start


def compile_rows(label: str, compiled: Any, compile_s: float, mode: str, sets: list[Any], ref: np.ndarray) -> list[Row]:
    """A compiled model back to back; a mode without CUDA graphs of its own also per call and
    replayed from a graph of ours."""
    import torch

    name = f"torch.compile {mode}"
    own_graphs = mode != "max-autotune-no-cudagraphs" and mode != "default"
    try:
        with torch.no_grad():
            err = rel_error_vs(output(compiled(sets[0])), ref)
            times = time_vendor(lambda i: output(compiled(sets[i])), len(sets), graph=not own_graphs)
    except Exception as exc:
        return [Row(label, name, note=f"failed: {_last_line(exc)}")]
    if own_graphs:
        return [Row(label, name, times.back_to_back.seconds * 1e3, err, compile_s,
                    note="back to back (its own CUDA graphs); tuning s = compile")]
    return [Row(label, f"{name} ({method})", t.seconds * 1e3 if t else None, err if t else None, compile_s,
                note="tuning s = compile" if t else "failed") for method, t in vendor_methods(times)]


def tune_and_time(label: str, path: str, ids: np.ndarray, ref: np.ndarray, args: argparse.Namespace,
                  work: str) -> tuple[list[Row], Any]:
    """Ours from empty records, then again on the same database; the compiled model."""
    from tvm_ext.cli.model_cli import load_model_file
    from tvm_ext.core.session import SessionOptions
    from tvm_ext.relax.pipeline import load_model, summary, tune_relax
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda", 0)
    options = SessionOptions(target="cuda", population=args.population, generations=1000, trials=args.trials,
                             tourn_size=1 if args.population <= 4 else 2, workers=args.workers, seed=args.seed,
                             build_timeout=300, run_timeout=120)
    database, records = os.path.join(work, "database"), os.path.join(work, "records.jsonl")
    rows: list[Row] = []
    start = time.time()
    mod = load_model_file(path).get_module()
    import_s = time.time() - start
    walls = []
    for attempt in range(2):
        start = time.time()
        result = tune_relax(mod, target, records, database, options, log=lambda m: print(f"  {m}", flush=True))
        walls.append(time.time() - start)
        print(summary(result), flush=True)
        if attempt == 0:
            tuned = [t for t in result.tasks if t.template]
            trials = f"{sum(t.trials for t in tuned)} ({len(tuned)} tasks)"
    start = time.time()
    compiled = load_model(mod, target, database, log=None)
    load_s = time.time() - start
    secs, err, how = time_tvm(compiled, [ids], ref)
    rows.append(Row(label, "tvm_ext from .pt2", secs * 1e3, err, walls[0] + import_s + load_s, trials,
                    f"{how}; import {import_s:.0f} s, tune {walls[0]:.0f} s, compile {load_s:.0f} s; "
                    f"rerun on the same database {walls[1]:.0f} s + compile"))
    if args.early_launch_rounds:
        rows += early_launch_rounds(label, compiled, ids, ref, args.early_launch_rounds)
    return rows, compiled


def early_launch_rounds(label: str, compiled: Any, ids: np.ndarray, ref: np.ndarray, rounds: int) -> list[Row]:
    """The same scheduled model built with its wgmma kernels launched early and without (the
    default, TVM's pipeline), timed in interleaved rounds: one row each, the median of its
    rounds, the per-round ratios in the note."""
    from tvm_ext.relax.pipeline import CompiledModel

    builds = {early: CompiledModel(compiled.mod, compiled.target, compiled.function, launch_early=early)
              for early in (True, False)}
    secs: dict[bool, list[float]] = {True: [], False: []}
    errs: dict[bool, float] = {}
    for _ in range(rounds):
        for early, model in builds.items():
            t, errs[early], _ = time_tvm(model, [ids], ref)
            secs[early].append(t)
    ratios = " ".join(f"{off / on:.3f}" for on, off in zip(secs[True], secs[False]))
    return [Row(label, f"tvm_ext, kernels {'' if early else 'not '}launched early", float(np.median(s)) * 1e3,
                errs[early], note=f"median of {rounds} interleaved rounds; without / with each round: {ratios}")
            for early, s in secs.items()]


def bench(dtype: str, args: argparse.Namespace, log: RowLog) -> None:
    import torch

    label = f"BERT-base {args.layers} layers{' + MLM head' if args.mlm else ''} {dtype} B{BATCH} S{SEQ}"
    print(f"== {label}", flush=True)
    work = os.path.join(args.out, f"bert_{dtype}")
    os.makedirs(work, exist_ok=True)
    ids = inputs()
    model = torch_model(args.layers, args.mlm)
    ref = reference(model, ids)
    path = export(model, dtype, ids, os.path.join(work, "model.pt2"))
    if dtype == "float32":
        tf32(False)  # float32-accurate on both sides: cuBLAS and cuDNN without TF32
    if not args.torch_only:
        ours, compiled_ours = tune_and_time(label, path, ids, ref, args, work)
        log.add(*ours)
    rng = np.random.default_rng(2)
    sets = [torch.from_numpy(ids).cuda()] + [torch.from_numpy(rng.permutation(ids.reshape(-1)).reshape(ids.shape))
                                             .cuda() for _ in range(l2_rotation(ref.size * 4) - 1)]
    cuda_model = model.to(getattr(torch, dtype)).cuda()
    log.add(*torch_rows(label, cuda_model, sets, ref))
    sides = {}
    for mode in [] if args.no_compile else args.compile_modes:
        try:
            compiled, compile_s = compiled_model(cuda_model, None if mode == "default" else mode, sets[0])
        except Exception as exc:
            log.add(Row(label, f"torch.compile {mode}", note=f"failed: {_last_line(exc)}"))
            continue
        log.add(*compile_rows(label, compiled, compile_s, mode, sets, ref))
        if mode == "max-autotune":
            with torch.no_grad():
                sides["torch.compile max-autotune"] = kernel_breakdown(lambda c=compiled: c(sets[0]))
    if args.torch_only:
        return
    import tvm

    arg = tvm.runtime.tensor(ids, tvm.cuda(0))
    func = compiled_ours._vm[compiled_ours.function]
    sides = {"tvm_ext": kernel_breakdown(lambda: func(arg)), **sides}
    text = breakdown_table(label, sides, args.top)
    print(text, flush=True)
    with open(os.path.join(args.out, f"bert_breakdown_{dtype}.json"), "w") as f:
        json.dump({"label": label, "sides": sides}, f, indent=1)
    with open(os.path.join(args.out, f"bert_breakdown_{dtype}.md"), "w") as f:
        f.write(text + "\n")


def dry_run(args: argparse.Namespace) -> None:
    """No GPU: export, import, tasks matched for CUDA, compiled for CUDA with default configs."""
    import tempfile


    from tvm_ext.cli.model_cli import load_model_file
    from tvm_ext.relax.pipeline import build_model, compile_relax, extract_tasks, legalize_and_fuse, match_tasks
    from tvm_ext.target import offline_cuda

    target = offline_cuda()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for dtype in args.dtypes:
            start = time.time()
            path = export(torch_model(args.layers, args.mlm), dtype, inputs(), os.path.join(work, f"{dtype}.pt2"))
            mod = load_model_file(path).get_module()
            tasks = extract_tasks(legalize_and_fuse(mod, target), target)
            matched = [m.template.describe() for m in match_tasks(tasks, target) if m.matched]
            scheduled = compile_relax(mod, target, None, log=None)
            build_model(scheduled, target)
            rows.append([dtype, len(tasks), len(matched), "; ".join(matched), f"{time.time() - start:.0f}"])
    print(table(f"BERT-base {args.layers} layers, dry run (no GPU)", ["dtype", "tasks", "matched", "templates", "s"],
                rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out")
    p.add_argument("--dtypes", default="float16,float32", help="comma-separated of float16, float32")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--mlm", action="store_true", help="BertForMaskedLM: the model and its head to the vocabulary")
    p.add_argument("--trials", type=int, default=8, help="trials per task (default 8)")
    p.add_argument("--population", type=int, default=8)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top", type=int, default=12, help="kernels shown per side in the breakdown")
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--compile-modes", default="default,max-autotune,max-autotune-no-cudagraphs",
                   help="torch.compile modes (comma-separated); without CUDA graphs of its own a mode is also "
                        "replayed from a graph of ours")
    p.add_argument("--torch-only", action="store_true", help="torch's rows only (no tuning, no breakdown)")
    p.add_argument("--early-launch-rounds", type=int, default=0,
                   help="also time ours built with its wgmma kernels launched early and without, in this many "
                        "interleaved rounds")
    p.add_argument("--dry-run", action="store_true", help="no GPU: export, import, match, compile for CUDA")
    args = p.parse_args()
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.compile_modes = [m for m in args.compile_modes.split(",") if m]
    if any(d not in ("float16", "float32") for d in args.dtypes):
        raise SystemExit(f"error: --dtypes {args.dtypes}: float16, float32")
    if args.dry_run:
        dry_run(args)
        return
    os.makedirs(args.out, exist_ok=True)
    log = RowLog(args.out, "bert_model_rows.jsonl")
    for dtype in args.dtypes:
        bench(dtype, args, log)
    print(table(f"BERT-base, batch {BATCH}, sequence {SEQ}", VERSUS_COMPILE_HEADER, versus_compile(log.rows)))


if __name__ == "__main__":
    main()
