"""``python -m tvm_ext.tune model FILE.py``: tune a Relax model's kernels, export, compile, run.

FILE.py defines ``get_module() -> tvm.IRModule`` (a Relax module, e.g. from
``relax.frontend.nn`` + ``export_tvm``) and optionally ``get_inputs() -> list of numpy
arrays`` (every parameter of the Relax function, weights included),
``reference(inputs) -> numpy array`` and ``tolerance() -> float`` (largest |error| over
max |reference| accepted; default 1e-4).  With inputs the compiled model is run (and
checked when a reference exists); without, it is only compiled.  ``--model-option
KEY=VALUE`` passes keyword arguments (strings) to every one of these functions.
"""
from __future__ import annotations

import argparse
import functools
import importlib.machinery
import importlib.util
import math
import os
import sys
from typing import Any

from .cli_args import TASKS_PER_DEVICE, format_speed, session_options
from ..core.errors import TvmExtError, last_line

# the reference check's default bound (largest |error| over the output's scale) with --gru-storage:
# 16-bit storage keeps normwise errors near 4e-4 (float16) and 4e-3 (bfloat16), the largest element more
STORAGE_TOLERANCE = 3e-2

DEFAULT_DATABASE = "tvm_ext_database"


def add_model_parser(sub: Any, add_tuning_args: Any) -> None:
    model = sub.add_parser(
        "model", help="a Relax model: tune its kernels, export a meta_schedule database, compile and run",
        description="Lower a Relax model (FILE.py: get_module(), optionally get_inputs(), reference(inputs) and "
                    "tolerance()) with TVM, tune every kernel a template matches (GEMMs and tensor-core "
                    "matmuls with their fused elementwise epilogues, softmax, norms and row reductions) and "
                    "every GRU layer, export the best schedules as a meta_schedule database (GRU configs "
                    "beside it), compile the model with them (TVM's default dlight schedules for the other "
                    "kernels) and run it. Tuning arguments apply to each distinct kernel; --trials caps each "
                    "one. Kernels already in the database are reused.",
    )
    model.add_argument("file", metavar="FILE.py|FILE.onnx|FILE.pt2",
                       help="Python file defining get_module(), an ONNX model (checked against onnxruntime, or ONNX's "
                            "reference evaluator where onnxruntime is not installed) or a torch.export program "
                            "saved with torch.export.save (checked against torch); in both, GRU layers run on "
                            "tvm_ext's GRU, on random inputs")
    model.add_argument("--database", default=DEFAULT_DATABASE,
                       help=f"meta_schedule database folder to write (default {DEFAULT_DATABASE})")
    model.add_argument("--function", default=None, help="Relax function to run (default: the only one, or main)")
    model.add_argument("--model-option", action="append", default=[], metavar="KEY=VALUE",
                       help="keyword argument for the file's get_module/get_inputs/reference/tolerance "
                            "(e.g. size=base, dtype=float16; an ONNX or .pt2 file: NAME=N sizes its symbolic "
                            "dimension NAME; repeatable)")
    model.add_argument("--retune", action="store_true",
                       help="tune kernels the database already holds (default: reuse them)")
    matchers = _matcher_names()
    model.add_argument("--without", action="append", default=[], metavar="MATCHER", choices=matchers,
                       help="turn a template matcher off, its kernels going to the next template that takes them "
                            "(e.g. tf32: float32 matmuls on the CUDA-core GEMM template instead of 3xTF32; "
                            f"choices: {', '.join(matchers)}; repeatable)")
    model.add_argument("--gru-storage", choices=("float16", "bfloat16"), default=None, metavar="TYPE",
                       help="a float32 model's GRU (and LSTM) layers store x, weights, gate inputs, h (and c) and "
                            "out in TYPE (float16 or bfloat16), their sums and cell in float32: errors near 4e-4 with "
                            "float16, the class of cuDNN's TF32 GRU that torch runs by default; the reference check's "
                            f"tolerance becomes at least {STORAGE_TOLERANCE:g} (default: float32 storage)")
    model.add_argument("--buckets", default=None, metavar="NAME=SIZES",
                       help="a model with a symbolic dimension NAME (tokens, sequence length): tune it at each "
                            "size of SIZES (e.g. n=1,16,128,512) and run any size on the configs of the nearest "
                            "bucket that fits (nearest by ratio), compiled on its first call; a .pt2 program's "
                            "dimensions have torch's names (s77: an error lists them)")
    model.add_argument("--tasks-in-flight", type=int, default=None, metavar="N",
                       help=f"kernels tuned at once (default {TASKS_PER_DEVICE} a device: while one kernel's "
                            "candidates build or its search waits at the end of a generation, the others keep "
                            "the devices measuring; 1: one after another, the default with --cost-model)")
    add_tuning_args(model)
    model.set_defaults(run=run_model)


def _matcher_names() -> list[str]:
    from ..relax.tasks import MATCHERS

    return list(MATCHERS)


def describe_dims(dims: dict[str, tuple[int, int | None]]) -> str:
    """``batch, s77 (2..64)``: symbolic dimensions for messages, a range where it is not 1 and up."""
    return ", ".join(name if bounds == (1, None) else f"{name} ({bounds[0]}..{bounds[1] or ''})"
                     for name, bounds in dims.items())


def _gather_elements() -> type:
    """ONNX ``GatherElements`` for ONNX's reference evaluator, whose own (``np.choose``) takes at
    most 32 values along the axis and past that reads the wrong ones (BERT's token type ids)."""
    import numpy as np
    from onnx.reference.op_run import OpRun

    class GatherElements(OpRun):  # type: ignore[misc]
        op_domain = ""

        def _run(self, data: Any, indices: Any, axis: int | None = None) -> tuple[Any]:
            axis = int(axis or 0)
            wrapped = np.where(indices < 0, indices + data.shape[axis], indices)
            return (np.take_along_axis(data, wrapped, axis=axis),)

    return GatherElements


class OnnxModel:
    """An ONNX file standing in for a model file: ``get_module`` imports it (``onnx_import``),
    ``get_inputs`` draws inputs of its graph's shapes, and ``reference`` runs the file with
    onnxruntime where it is installed, else with ONNX's reference evaluator (numpy)."""

    def __init__(self, path: str):
        self.path = path

    kind = "an ONNX file"

    @functools.cached_property
    def symbolic_dims(self) -> dict[str, tuple[int, int | None]]:
        """The inputs' named symbolic dimensions: name -> (lowest, highest or None) size (read once:
        each option and bucket size is checked against them)."""
        from ..relax.onnx_import import onnx_symbolic_dims

        return {name: (1, None) for name in onnx_symbolic_dims(self.path)}

    def check_size(self, name: str, value: str, flag: str) -> int:
        """``value`` as a size of the symbolic dimension ``name``, within the range the model takes
        (``flag``: the option that gave it, for the error)."""
        dims = self.symbolic_dims
        if name not in dims:
            raise TvmExtError(f"{flag} {name}: {self.kind} takes sizes of its inputs' symbolic dimensions "
                              f"({describe_dims(dims) or 'it has none'})")
        low, high = dims[name]
        if not str(value).isdigit() or not low <= int(value) <= (high or int(value)):
            raise TvmExtError(f"{flag} {name}={value}: a size from {low} to {high or 'any'}")
        return int(value)

    def _sizes(self, options: dict[str, str]) -> dict[str, int]:
        """``--model-option NAME=N``: sizes of the inputs' named symbolic dimensions."""
        return {name: self.check_size(name, value, "--model-option") for name, value in options.items()}

    def get_module(self, **options: str) -> Any:
        """The imported model, the symbolic dimensions named in ``options`` bound to their sizes."""
        return self.imported(self._sizes(options))

    def imported(self, sizes: dict[str, int] | None = None) -> Any:
        """The model imported, ``sizes`` bound in the file's graph before the import (ONNX)."""
        from ..relax.onnx_import import load_onnx

        return load_onnx(self.path, sizes)

    def get_inputs(self, **options: str) -> list[Any]:
        from ..relax.onnx_import import onnx_inputs

        return onnx_inputs(self.path, sizes=self._sizes(options))

    def reference(self, inputs: list[Any], **options: str) -> list[Any] | None:
        """The file's outputs on ``inputs`` by onnxruntime, or by ONNX's reference evaluator where
        onnxruntime is not installed; None (not checked) where the evaluator cannot run the model."""
        try:
            import onnxruntime
        except ImportError:
            return self._evaluated(inputs)
        session = onnxruntime.InferenceSession(self.path, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return session.run(None, dict(zip(names, inputs)))

    def _evaluated(self, inputs: list[Any]) -> list[Any] | None:
        import warnings

        import numpy as np
        from onnx.reference import ReferenceEvaluator

        from ..relax.onnx_import import caller_inputs, read_onnx

        model = read_onnx(self.path)
        feed = dict(zip([value.name for value in caller_inputs(model)], inputs))
        try:  # quietly: a mask's log(0) = -inf is the model's, as in torch
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return list(ReferenceEvaluator(model, new_ops=[_gather_elements()]).run(None, feed))
        except Exception as exc:  # noqa: BLE001 - an operator the evaluator lacks: the run goes unchecked
            print(f"not checked: ONNX's reference evaluator cannot run {self.path} ({last_line(exc)}); "
                  "pip install onnxruntime checks it", file=sys.stderr)
            return None


class ExportedProgramModel(OnnxModel):
    """A ``torch.export`` program file (``.pt2``) standing in for a model file: ``get_module``
    imports it (``torch_import``), ``get_inputs`` draws inputs of its shapes, ``reference``
    runs the program with torch on the CPU."""

    kind = "a torch.export program"

    def __init__(self, path: str):
        from ..relax.torch_import import load_exported_program

        self.path = path
        self.program = load_exported_program(path)

    @functools.cached_property
    def symbolic_dims(self) -> dict[str, tuple[int, int | None]]:
        """The program's symbolic input sizes (torch's names, ``s77``) and their exported ranges."""
        from ..relax.torch_import import program_symbols

        return program_symbols(self.program)

    def imported(self, sizes: dict[str, int] | None = None) -> Any:
        """The program imported, ``sizes`` bound after the import (in Relax)."""
        from tvm import relax

        from ..relax.torch_import import import_exported_program

        try:
            mod = import_exported_program(self.program)
        except TvmExtError as exc:  # which file, as an ONNX model's refusals say
            raise TvmExtError(f"{self.path}: {exc}") from None
        return relax.transform.BindSymbolicVars(sizes)(mod) if sizes else mod

    def get_inputs(self, **options: str) -> list[Any]:
        from ..relax.torch_import import program_inputs

        return program_inputs(self.program, sizes=self._sizes(options))

    def reference(self, inputs: list[Any], **options: str) -> list[Any]:
        import torch

        from torch.utils import _pytree

        # the inputs as the program was called: positional, keyword (transformers' models are
        # exported with keyword inputs) or nested
        args, kwargs = _pytree.tree_unflatten([torch.from_numpy(a) for a in inputs], self.program.call_spec.in_spec)
        with torch.no_grad():
            outputs = self.program.module()(*args, **kwargs)
        # the program's outputs in its order, flat: a model output class (transformers' ModelOutput)
        # holds them as fields, as the imported function's tuple does
        return [o.detach().cpu().numpy() for o in _pytree.tree_leaves(outputs) if hasattr(o, "detach")]


def load_model_file(path: str) -> Any:
    """Import FILE.py as a module (an ONNX file becomes an ``OnnxModel``, a ``.pt2`` file an
    ``ExportedProgramModel``); a clear error when it is missing, named otherwise (a text or
    weights file is never run as code), not Python, or lacks get_module."""
    if os.path.isdir(path):
        raise TvmExtError(f"model file {path} is a folder: give the .py, .onnx or .pt2 file")
    if not os.path.isfile(path):
        raise TvmExtError(f"model file {path} does not exist")
    from ..core.records import check_regular_file

    check_regular_file(path, "model file")
    if path.lower().endswith(".onnx"):
        return OnnxModel(path)
    if path.lower().endswith(".pt2"):
        return ExportedProgramModel(path)
    if not path.lower().endswith(".py"):
        raise TvmExtError(f"{path}: a model file is Python (.py), ONNX (.onnx) or a torch.export program (.pt2); "
                          f"other files are not run")
    # A .py file that is not Python fails to compile: bad input (one line), never an import
    # machinery error.
    name = "tvm_ext_user_model"
    loader = importlib.machinery.SourceFileLoader(name, os.path.abspath(path))
    try:
        spec = importlib.util.spec_from_loader(name, loader)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        loader.exec_module(module)
    except Exception as exc:
        raise TvmExtError(f"cannot import {path}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    if not callable(getattr(module, "get_module", None)):
        raise TvmExtError(f"{path} must define get_module() returning a Relax IRModule")
    return module


def model_options(pairs: list[str]) -> dict[str, str]:
    """``--model-option KEY=VALUE`` pairs as keyword arguments."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise TvmExtError(f"--model-option must be KEY=VALUE with KEY a Python name, got {pair!r}")
        options[key.strip()] = value.strip()
    return options


def run_model(args: argparse.Namespace) -> int:
    import numpy as np

    from ..relax.buckets import BucketedModel, Buckets, check_buckets, tune_buckets
    from ..relax.pipeline import load_model, summary, tune_relax
    from ..target import resolve_target
    from .cli_checks import call_user, model_module

    options = session_options(args)
    extra = model_options(args.model_option)
    from ..core.session import RUNNERS

    options = _devices_here(options)
    if RUNNERS[options.runner].remote_target:
        raise TvmExtError(f"--runner {options.runner}: the model command compiles and runs the tuned model on this "
                          "machine, so it measures here too (--runner local, or --devices 0,1 for this machine's "
                          "GPUs); tune single operators on servers with tune gemm / gemm-tc / reduce / gru")
    user = load_model_file(args.file)
    buckets = Buckets.parse(args.buckets) if args.buckets else None
    # an ONNX or .pt2 file's symbolic dimension tuned at buckets stays symbolic; its option sizes the inputs only
    keep = buckets.var if buckets and isinstance(user, OnnxModel) else None
    mod = model_module(user, args.file, **{k: v for k, v in extra.items() if k != keep})
    target = resolve_target(args.target, args.device)
    if buckets:
        check_buckets(mod, buckets, args.function)
        if isinstance(user, OnnxModel):  # an ONNX or .pt2 file: its sizes within the range it takes
            for size in buckets.sizes:
                user.check_size(buckets.var, str(size), "--buckets")
    progress = _Progress(disabled=args.no_progress)

    def tune(static: Any) -> Any:
        return tune_relax(static, target, args.records, args.database, options, log=progress.write,
                          on_record=progress.update, retune=args.retune, without=args.without,
                          gru_storage=args.gru_storage)

    try:
        results = [tune(mod)] if buckets is None else \
            tune_buckets(mod, target, args.records, args.database, buckets, tune, args.without, args.function,
                         args.gru_storage)
    finally:
        progress.close()
    for i, result in enumerate(results):
        title = f"model {args.file}" + (f", {buckets.var} = {buckets.sizes[i]}" if buckets else "")
        print(f"\n{title}  target={target.kind} device={target.device_name}  "
              f"wall {result.wall_secs:.1f} s, records: {os.path.abspath(args.records)}, "
              f"database: {os.path.abspath(args.database)}")
        print(summary(result))
    if any(result.interrupted for result in results):
        print("interrupted: records so far are kept and exported; rerun the same command to resume",
              file=sys.stderr)
        return 130
    if buckets is None:
        model = load_model(mod, target, args.database, args.function, without=args.without,
                           gru_storage=args.gru_storage)
    else:
        model = BucketedModel(mod, target, args.database, args.function, without=args.without,
                              gru_storage=args.gru_storage)
    if not callable(getattr(user, "get_inputs", None)):
        print("compiled (the file has no get_inputs(): not run)")
        return 0
    if buckets is not None and isinstance(user, OnnxModel) and buckets.var not in extra:
        extra[buckets.var] = str(buckets.sizes[-1])  # run where it was tuned: the largest bucket
        print(f"running at {buckets.var} = {extra[buckets.var]}, the largest bucket (--model-option "
              f"{buckets.var}=N runs another size)")
    inputs = [np.asarray(a) for a in call_user(user, args.file, "get_inputs", **extra)]
    out = model(*inputs)
    if buckets is not None:
        size = model.size_of(inputs)
        print(f"{buckets.var} = {size}: " + ", ".join(f"{name} {how}" for name, how in model.schedules[size].items()))
    secs = model.time(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    line = f"ran: output {', '.join(str(o.shape) for o in outs)}, latency {secs * 1e3:.3f} ms"
    if callable(getattr(user, "reference", None)):
        ref = call_user(user, args.file, "reference", inputs, **extra)
        if ref is None:  # the reference could not run: said on stderr
            print(line)
            return 0
        refs = ref if isinstance(ref, (tuple, list)) else (ref,)
        tol = float(call_user(user, args.file, "tolerance", **extra)) if callable(getattr(user, "tolerance", None)) \
            else 1e-4
        if args.gru_storage:  # the GRU's storage chosen on the command line bounds the error, not the file
            tol = max(tol, STORAGE_TOLERANCE)
        err = max(float(np.abs(o.astype(np.float64) - r).max()) for o, r in zip(outs, refs))
        scale = max(float(np.abs(r).max()) for r in refs) or 1.0
        ok = math.isfinite(err) and err <= tol * max(1.0, scale)
        print(f"{line}, max |error| vs reference {err:.2e} ({'ok' if ok else 'WRONG'})")
        return 0 if ok else 1
    print(line)
    return 0


def _devices_here(options: Any) -> Any:
    """``--devices 0,1`` alone: the model is measured on this machine's devices, so by the local
    runner's isolated process per device (no tracker to start)."""
    import dataclasses

    devices = options.runner_option("devices")
    if options.runner != "rpc" or not devices or set(dict(options.runner_options)) != {"devices"}:
        return options
    return dataclasses.replace(options, runner="local", runner_options=(("devices", devices),))


class _Progress:
    """One bar over all tasks: trials measured, current kernel, its best so far."""

    def __init__(self, disabled: bool):
        from tqdm import tqdm

        # not on a terminal (a log file, a pipe): no bar, whose redraws would leave blank lines there
        self.bar = tqdm(unit="trial", disable=disabled or not sys.stderr.isatty(), file=sys.stderr,
                        dynamic_ncols=True)

    def update(self, record: Any, tuner: Any) -> None:
        best = tuner.best
        self.bar.update(1)
        self.bar.set_postfix(kernel=tuner.template.describe(),
                             best=format_speed(tuner.template, best.cost) if best else "-", errors=tuner.errors)

    def write(self, message: str) -> None:
        """A log line on stderr that does not break the bar."""
        self.bar.write(message, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()
