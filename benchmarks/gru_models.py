"""GRU models as a PyTorch user has them, imported both ways tvm_ext takes them, against torch at its best.

Three models, random weights, T=128, batch 1, 8 and 64, float32 and float16:

- ``classifier``: Embedding(10000, 256) -> 2-layer bidirectional GRU, hidden 512 (batch_first)
  -> Linear(1024, 10) on the last step;
- ``speech``: Linear(80, 1024) -> 3-layer GRU, hidden 1024 (batch_first) -> Linear(1024, 29) at
  every step;
- ``lstm``: Linear(80, 512) -> 2-layer LSTM, hidden 512 (batch_first) -> Linear(512, 29) at every
  step: imported onto tvm_ext's LSTM (``schedules/lstm``), swapped for ``tvm_ext.torch.LSTM``.

Per case, one process, the same rotated inputs, every output against the float64 model:

- torch eager per call, back to back and replayed from a CUDA graph (``nn.GRU`` runs cuDNN;
  float32 with torch's defaults, which let cuDNN use TF32, and again with TF32 off, labelled);
- ``torch.compile(mode="max-autotune")`` back to back (the mode records CUDA graphs itself;
  ``nn.GRU`` breaks its graph), its compile time as its tuning time;
- the torch model with its ``nn.GRU`` swapped for ``tvm_ext.torch.GRU`` (``nn.LSTM`` for
  ``tvm_ext.torch.LSTM``; as it ships: a shape's first call keeps the faster of ours and torch's),
  as a torch user drops it in: eager, in a CUDA graph, and under ``torch.compile(mode=
  "max-autotune", fullgraph=True)`` (one graph: the GRU is the op ``tvm_ext::gru``, the LSTM
  ``tvm_ext::lstm``);
- ours imported from a ``torch.export`` program (``.pt2``, ``tvm_ext.relax.torch_import``) and from
  an ONNX file (TorchScript exporter, ``tvm_ext.relax.onnx_import``): ``tune_relax`` on the imported
  module (``--trials`` per task; the two imports give the same tasks, so the second reuses the
  first's database), compiled in the Relax VM and timed per call, back to back and replayed
  from a CUDA graph (the best of the three); both imports fold a ``Linear`` feeding the GRU into its
  input projection (``tvm_ext.relax.recurrent_fold``), ``--imports pt2-unfolded`` times the
  ``.pt2`` without that; for float32 also the ``.pt2`` import with its GRU in
  float16 storage (``tune model --gru-storage float16``: sums and cell float32, errors the class
  of torch's default TF32 cuDNN).

With ``--rounds N`` (2 or more) each import of ours and torch's model run again, each replayed
from its own CUDA graph on the same rotated inputs, in N interleaved rounds with the SM clock and
power read after each: the median of the per-round ratios is the figure to quote (torch's graph of
the speech model moved 8 % between two runs on one H100).

Targets: ours >= 2x ``torch.compile(mode="max-autotune")`` and >= 1.5x torch eager in a CUDA
graph.  Rows go to ``OUT/gru_models_rows.jsonl`` as they are made.

    source .tvm-device/boot.sh && python benchmarks/gru_models.py --out $OUT --cases speech:float32:8
    python benchmarks/gru_models.py --dry-run   # no GPU: export, import both ways, match, compile for CUDA
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import (breakdown_table, compare_in_rounds, kernel_breakdown, rel_error_vs, rounds_cells,  # noqa: E402
                    rounds_header, table, time_vendor, tvm_launch, vendor_methods)
from models import VERSUS_COMPILE_HEADER, Row, RowLog, _last_line, time_tvm, versus_compile  # noqa: E402

SEQ = 128
MODELS = ("classifier", "speech", "lstm")
BATCHES = (1, 8, 64)
DTYPES = ("float32", "float16")
IMPORTS = ("pt2", "onnx")
UNFOLDED = "pt2-unfolded"  # an import way: the .pt2 with its front-end Linear left unfolded (``recurrent_fold``)


@dataclass(frozen=True)
class Case:
    model: str
    dtype: str
    batch: int

    @property
    def label(self) -> str:
        return f"{self.model} {self.dtype} B{self.batch} T{SEQ}"


def torch_model(name: str) -> Any:
    """The model with its weights drawn from a fixed seed (float32, CPU, eval mode)."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10000, 256)
            self.gru = nn.GRU(256, 512, num_layers=2, bidirectional=True, batch_first=True)
            self.head = nn.Linear(1024, 10)

        def forward(self, tokens: Any) -> Any:
            out, _ = self.gru(self.embed(tokens))
            return self.head(out[:, -1])

    class Speech(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.front = nn.Linear(80, 1024)
            self.gru = nn.GRU(1024, 1024, num_layers=3, batch_first=True)
            self.head = nn.Linear(1024, 29)

        def forward(self, features: Any) -> Any:
            out, _ = self.gru(self.front(features))
            return self.head(out)

    class SpeechLstm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.front = nn.Linear(80, 512)
            self.lstm = nn.LSTM(512, 512, num_layers=2, batch_first=True)
            self.head = nn.Linear(512, 29)

        def forward(self, features: Any) -> Any:
            out, _ = self.lstm(self.front(features))
            return self.head(out)

    return {"classifier": Classifier, "speech": Speech, "lstm": SpeechLstm}[name]().eval()


def case_inputs(case: Case) -> np.ndarray:
    rng = np.random.default_rng(1)
    if case.model == "classifier":
        return rng.integers(0, 10000, (case.batch, SEQ)).astype(np.int64)
    return rng.uniform(-1, 1, (case.batch, SEQ, 80)).astype(case.dtype)


def reference(case: Case, x: np.ndarray) -> np.ndarray:
    """The model in float64 on the CPU (its float32 weights widened, so both sides' errors are
    against the same exact answer)."""
    import torch

    with torch.no_grad():
        model = torch_model(case.model).double()
        arg = torch.from_numpy(x if x.dtype == np.int64 else x.astype(np.float64))
        return model(arg).numpy()


def export(case: Case, x: np.ndarray, work: str) -> dict[str, str]:
    """The model at ``case.dtype`` written as a ``.pt2`` program and an ONNX file (on the CPU);
    a way that fails is left out with its reason printed."""
    import torch

    model = torch_model(case.model).to(getattr(torch, case.dtype))
    arg = torch.from_numpy(x)
    os.makedirs(work, exist_ok=True)
    writers = {"pt2": lambda path: torch.export.save(torch.export.export(model, (arg,)), path),
               "onnx": lambda path: torch.onnx.export(model, (arg,), path, dynamo=False, opset_version=17)}
    files = {}
    for way, write in writers.items():
        path = os.path.join(work, f"model.{way}")
        try:
            write(path)
            files[way] = path
        except Exception as exc:
            print(f"  export {way} failed: {_last_line(exc)}", flush=True)
    return files


def imported(path: str, fold_linears: bool = True) -> Any:
    """The Relax module of an exported file, as ``tune model FILE`` imports it; without
    ``fold_linears`` a ``.pt2`` whose Linear feeding the GRU stays a GEMM of its own."""
    from tvm_ext.cli.model_cli import load_model_file
    from tvm_ext.relax.torch_import import import_exported_program

    if not fold_linears:
        return import_exported_program(load_model_file(path).program, fold_linears=False)
    return load_model_file(path).get_module()


def cuda_model(case: Case, swap: bool = False) -> Any:
    """The case's torch model on CUDA in its dtype; ``swap``: its ``nn.GRU`` (``nn.LSTM``) replaced
    by ``tvm_ext.torch.GRU`` (``LSTM``) with the same weights, as a torch user drops it in."""
    import torch

    model = torch_model(case.model).to(getattr(torch, case.dtype)).cuda()
    if swap:
        import tvm_ext.torch

        name = recurrent_name(case)
        setattr(model, name, getattr(tvm_ext.torch, name.upper()).from_module(getattr(model, name)))
    return model


def recurrent_name(case: Case) -> str:
    """The model's recurrent module's attribute (``gru``, ``lstm``): ``tvm_ext.torch`` has a module
    of that name in capitals taking its place."""
    return "lstm" if case.model == "lstm" else "gru"


def torch_rows(case: Case, x: np.ndarray, ref: np.ndarray, sets: list[Any], suffix: str = "",
               swap: bool = False) -> list[Row]:
    import torch

    model = cuda_model(case, swap)
    rows = []
    with torch.no_grad():
        err = rel_error_vs(model(sets[0]), ref)
        times = time_vendor(lambda i: model(sets[i]), len(sets))
        names = {"per call": "torch eager (per call)", "back-to-back": "torch eager", "CUDA graph": "torch CUDA graph"}
        # the swapped module's side for the shape: ours, ours in TF32's class, or torch (its first call's measure)
        swapped = getattr(model, recurrent_name(case)) if swap else None
        served = "served by " + ", ".join(sorted({c.backend for c in swapped.choices.values()})) \
            if swap and swapped.choices else ""
        for method, t in vendor_methods(times):
            label = names.get(method, f"torch {method}") + suffix
            rows.append(Row(case.label, label, t.seconds * 1e3 if t else None, err if t else None,
                            note=served if t else f"{label} failed"))
    return rows


def compile_row(case: Case, ref: np.ndarray, sets: list[Any], swap: bool = False) -> Row:
    """``torch.compile(mode="max-autotune")`` of the torch model; ``swap``: with
    ``tvm_ext.torch.GRU`` in it, compiled as one graph (``fullgraph``: a break would fail)."""
    import torch

    model = cuda_model(case, swap)
    label = f"tvm_ext.torch.{recurrent_name(case).upper()} in torch.compile max-autotune" if swap \
        else "torch.compile max-autotune"
    try:
        with torch.no_grad():
            torch._dynamo.reset()
            start = time.time()
            compiled = torch.compile(model, mode="max-autotune", fullgraph=swap)
            out = compiled(sets[0])
            torch.cuda.synchronize()
            compile_s = time.time() - start
            err = rel_error_vs(out, ref)  # before the next call: its CUDA graphs reuse their outputs
            times = time_vendor(lambda i: compiled(sets[i]), len(sets), graph=False)
        return Row(case.label, label, times.back_to_back.seconds * 1e3,
                   err, compile_s, note="back to back (its own CUDA graphs); tuning s = compile")
    except Exception as exc:
        return Row(case.label, label, note=f"failed: {_last_line(exc)}")


def ours_rows(case: Case, files: dict[str, str], x: np.ndarray, ref: np.ndarray, args: argparse.Namespace,
              work: str, kernels: dict[str, dict[str, float]], compiled_by_label: dict[str, Any]) -> list[Row]:
    """Each import tuned into one database (the second import's tasks are the first's) and timed;
    with ``--breakdown`` each one's GPU time by kernel goes into ``kernels``; each compiled model
    into ``compiled_by_label`` (``--rounds``)."""
    from tvm_ext.relax.pipeline import load_model, tune_relax
    from tvm_ext.core.session import SessionOptions
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda", 0)
    options = SessionOptions(target="cuda", population=args.population, generations=1000, trials=args.trials,
                             tourn_size=1 if args.population <= 4 else 2, workers=args.workers, seed=args.seed,
                             build_timeout=300, run_timeout=120)
    database, records = os.path.join(work, "database"), os.path.join(work, "records.jsonl")
    rows = []
    # float32: also the GRU with float16 storage (its errors the class of torch's default TF32 cuDNN)
    storage16 = case.dtype == "float32" and case.model != "lstm"
    variants = [(way, None) for way in args.imports.split(",")] + ([("pt2", "float16")] if storage16 else [])
    for way, storage in variants:
        label = f"tvm_ext from {'ONNX' if way == 'onnx' else '.pt2'}" + (f", GRU {storage} storage" if storage else "")
        label += ", front end not folded" if way == UNFOLDED else ""
        way, fold = ("pt2", False) if way == UNFOLDED else (way, True)
        if way not in files:
            rows.append(Row(case.label, label, note="export failed"))
            continue
        try:
            mod = imported(files[way], fold)
            start = time.time()
            result = tune_relax(mod, target, records, database, options, log=lambda m: print(f"  {m}", flush=True),
                                gru_storage=storage)
            wall = time.time() - start
            tuned = [t for t in result.tasks if t.template]
            trials = f"{sum(t.trials for t in tuned)} ({len(tuned)} tasks)"
            compiled = load_model(mod, target, database, log=None, gru_storage=storage)
            secs, err, how = time_tvm(compiled, [x], ref)
            rows.append(Row(case.label, label, secs * 1e3, err, wall, trials, how))
            compiled_by_label[label] = compiled
            if args.breakdown:
                import tvm

                func, arg = compiled._vm[compiled.function], tvm.runtime.tensor(x, tvm.cuda(0))
                kernels[label] = kernel_breakdown(lambda f=func, a=arg: f(a))
        except Exception as exc:  # a variant that fails is a row, not the end of the run
            rows.append(Row(case.label, label, note=f"failed: {_last_line(exc)}"))
    return rows


def bench(case: Case, args: argparse.Namespace, log: RowLog) -> None:
    import torch

    from common import l2_rotation

    print(f"== {case.label}", flush=True)
    x = case_inputs(case)
    ref = reference(case, x)
    work = os.path.join(args.out, f"{case.model}_{case.dtype}_b{case.batch}")
    files = export(case, x, work)
    kernels: dict[str, dict[str, float]] = {}
    compiled: dict[str, Any] = {}
    if not args.no_import:
        log.add(*ours_rows(case, files, x, ref, args, work, kernels, compiled))
    rng = np.random.default_rng(2)
    count = l2_rotation(x.nbytes + ref.size * np.dtype(case.dtype).itemsize)
    sets = [torch.from_numpy(x).cuda()] + [torch.from_numpy(rng.permutation(x.reshape(-1)).reshape(x.shape)).cuda()
                                           for _ in range(count - 1)]
    log.add(*torch_rows(case, x, ref, sets))
    swapped = f", tvm_ext.torch.{recurrent_name(case).upper()}"
    if case.dtype == "float32":  # torch's default lets cuDNN and cuBLAS use TF32: also float32 math, labelled
        tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        try:
            log.add(*torch_rows(case, x, ref, sets, suffix=", TF32 off"))
            log.add(*torch_rows(case, x, ref, sets, suffix=swapped + ", TF32 off", swap=True))
        finally:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    log.add(*torch_rows(case, x, ref, sets, suffix=swapped, swap=True))
    if not args.no_compile:
        log.add(compile_row(case, ref, sets))
        log.add(compile_row(case, ref, sets, swap=True))
    if args.rounds > 1 and compiled:
        rounds_against_torch(case, compiled, sets, args)
    if args.breakdown:
        with torch.no_grad():
            model = cuda_model(case)
            kernels["torch eager"] = kernel_breakdown(lambda: model(sets[0]))
        text = breakdown_table(case.label, kernels, args.top)
        print(text, flush=True)
        with open(os.path.join(args.out, f"{case.model}_{case.dtype}_b{case.batch}_breakdown.md"), "w") as f:
            f.write(text + "\n")


def rounds_against_torch(case: Case, compiled: dict[str, Any], sets: list[Any], args: argparse.Namespace) -> None:
    """``--rounds``: each compiled import of ours and torch's model, each replayed from its own CUDA
    graph on the same rotated inputs, in interleaved rounds with the GPU's clock and power read
    after each (``compare_in_rounds``); the median of the per-round ratios printed, the rounds
    appended to ``OUT/gru_models_rounds.jsonl``."""
    import torch
    import tvm

    model = cuda_model(case)
    dev = tvm.cuda(0)
    arg_sets = [[tvm.runtime.tensor(s.cpu().numpy(), dev)] for s in sets]  # torch's rotated inputs
    rows = []
    with torch.no_grad():
        for label, program in compiled.items():
            launch = tvm_launch(program._vm[program.function], arg_sets)
            summaries, left_out = compare_in_rounds(
                f"{case.label}: {label}", launch, {"torch CUDA graph": lambda i: model(sets[i])}, len(sets),
                args.rounds, os.path.join(args.out, "gru_models_rounds.jsonl"), ours_label=label)
            rows += [[label, *rounds_cells(summary)] for summary in summaries]
            rows += [[label, name, f"left out: {why}"] + [""] * 8 for name, why in left_out.items()]
    print(table(f"{case.label}: ours and torch in {args.rounds} interleaved rounds (median of per-round ratios)",
                ["ours", *rounds_header()], rows), flush=True)


def dry_run(cases: list[Case]) -> None:
    """No GPU: each case exported both ways, imported, its tasks matched for CUDA and compiled
    for CUDA with default configs (source only); the torch model checked against float64 on the CPU."""
    import tempfile


    from tvm_ext.relax.pipeline import build_model, compile_relax, extract_tasks, legalize_and_fuse, match_tasks
    from tvm_ext.relax.relax_gru import find_grus
    from tvm_ext.target import offline_cuda

    target = offline_cuda()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for case in cases:
            x = case_inputs(case)
            files = export(case, x, os.path.join(work, case.label.replace(" ", "_")))
            for way, path in files.items():
                start = time.time()
                try:
                    mod = imported(path)
                    tasks = extract_tasks(legalize_and_fuse(mod, target), target)
                    matched = [m.template.describe() for m in match_tasks(tasks, target) if m.matched]
                    matched += [f"GRU {g.template.describe()}" for g in find_grus(mod, target)]
                    scheduled = compile_relax(mod, target, None, log=None)
                    build_model(scheduled, target)
                    rows.append([case.label, way, len(tasks), "; ".join(matched) or "-", f"{time.time() - start:.0f}"])
                except Exception as exc:
                    rows.append([case.label, way, "-", f"failed: {_last_line(exc)}", f"{time.time() - start:.0f}"])
    print(table("dry run (no GPU)", ["case", "import", "tasks", "matched", "s"], rows))


def parse_cases(text: str) -> list[Case]:
    """``model:dtype:batch`` items, comma-separated; a part left out means all of its values."""
    if not text:
        return [Case(m, d, b) for m in MODELS for d in DTYPES for b in BATCHES]
    cases = []
    for item in text.split(","):
        model, dtype, batch = (item.split(":") + ["", "", ""])[:3]
        for m in [model] if model else MODELS:
            for d in [dtype] if dtype else DTYPES:
                for b in [int(batch)] if batch else BATCHES:
                    if m not in MODELS or d not in DTYPES:
                        raise SystemExit(f"error: case {item!r}: models {MODELS}, dtypes {DTYPES}")
                    cases.append(Case(m, d, b))
    return cases


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out")
    p.add_argument("--cases", default="", help="model:dtype:batch,... (a part left out: all), default all 18")
    p.add_argument("--trials", type=int, default=8, help="trials per task (default 8)")
    p.add_argument("--population", type=int, default=8)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--no-import", action="store_true", help="leave out ours imported from .pt2 and ONNX")
    p.add_argument("--imports", default=",".join(IMPORTS),
                   help=f"the imports of ours timed (default pt2,onnx; {UNFOLDED}: the .pt2 with the Linear feeding "
                        "the GRU not folded into its input projection)")
    p.add_argument("--rounds", type=int, default=1,
                   help="with 2 or more, also each import of ours and torch's CUDA graph in that many interleaved "
                        "rounds, the median ratio quoted with the SM clock and power")
    p.add_argument("--dry-run", action="store_true", help="no GPU: export, import both ways, match, compile")
    p.add_argument("--breakdown", action="store_true", help="GPU time a call by kernel (torch.profiler), each side")
    p.add_argument("--top", type=int, default=16, help="kernels shown a side in the breakdown")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    cases = parse_cases(args.cases)
    if args.dry_run:
        dry_run(cases)
        return
    os.makedirs(args.out, exist_ok=True)
    log = RowLog(args.out, "gru_models_rows.jsonl")
    for case in cases:
        bench(case, args, log)
    print(table(f"GRU models, T={SEQ}", VERSUS_COMPILE_HEADER, versus_compile(log.rows)))


if __name__ == "__main__":
    main()
