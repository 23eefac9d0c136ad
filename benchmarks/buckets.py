"""A symbolic token dimension tuned at buckets: sizes between the buckets against a config tuned
for that very size, and against dlight.

Two models (``--model``):

- ``ffn``: a BERT-base feed-forward up-projection, ``GELU(x · Wᵀ + b)`` with x (n, 768) and W
  (3072, 768), n symbolic (the token count);
- ``bert``: transformers' ``BertModel`` (``--layers``, base sizes, random weights, SDPA attention) on
  token ids (8, s), the sequence length s exported symbolic with ``torch.export`` (at most 512) and
  imported as ``tune model FILE.pt2`` imports it: every GEMM, the attention products, softmax and
  layer norm have s in their shapes; with ``--via onnx`` the same model exported to ONNX with a
  dynamic axis ``seq`` and imported as ``tune model FILE.onnx`` imports it.

``tune_buckets`` tunes the model at ``--buckets``; then, at each size of ``--sizes`` (between the
buckets by default), one process times three builds of the static model at that size through the
Relax VM on the same input, each checked against float64 (numpy; torch for BERT):

- ``buckets``: ``BucketedModel`` (the nearest fitting bucket's config, ``tvm_ext.relax.buckets``);
- ``tuned``: ``tune_relax`` on the model bound to that size (``--trials`` as for the buckets), its own
  database;
- ``dlight``: TVM's default schedules.

Targets: buckets >= 0.9x tuned at every size, and >= dlight everywhere.  Rows go to
``OUT/buckets_rows.jsonl`` as they are made; a table is printed last.

    source .tvm-device/boot.sh && python benchmarks/buckets.py --out $OUT
    python benchmarks/buckets.py --model bert --buckets 32,128,512 --sizes 64,200 --trials 8 --out $OUT
    python benchmarks/buckets.py --model bert --via onnx --buckets 32,128,512 --sizes 64,200 --trials 8 --out $OUT
    python benchmarks/buckets.py --target opencl --dtype float32 --hidden 64 --buckets 4,16 --sizes 10 --trials 2
    python benchmarks/buckets.py --target opencl --model bert --layers 1 --hidden 32 --buckets 8,32 --sizes 20 \
        --trials 2 --dtype float32  # no GPU
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from math import erf

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import table  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Row:
    size: int
    variant: str  # buckets | tuned | dlight
    ms: float | None
    err: float | None
    note: str = ""


def weights(hidden: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    bound = 1.0 / np.sqrt(hidden)
    w = rng.uniform(-bound, bound, (4 * hidden, hidden)).astype(dtype)
    return w, rng.uniform(-bound, bound, 4 * hidden).astype(dtype)


class FfnCase:
    """GELU(x · Wᵀ + b) on x (n, hidden), n symbolic, the weights bound as constants."""

    def __init__(self, args: argparse.Namespace):
        self.hidden, self.dtype, self.var = args.hidden, args.dtype, "n"

    def title(self, buckets: str) -> str:
        return f"GELU(x·Wᵀ+b), x (n, {self.hidden}) {self.dtype}, buckets {buckets}"

    def module(self):
        import tvm
        from tvm import relax, tirx
        from tvm.relax.frontend import nn

        hidden, dtype = self.hidden, self.dtype

        class Up(nn.Module):
            def __init__(self):
                self.fc = nn.Linear(hidden, 4 * hidden, dtype=dtype)

            def forward(self, x):
                return nn.op.gelu(self.fc(x))

        n = tirx.Var("n", "int64")
        mod, params = Up().export_tvm(spec={"forward": {"x": nn.spec.Tensor((n, hidden), dtype)}})
        w, b = weights(hidden, dtype)
        values = {"fc.weight": w, "fc.bias": b}
        bound = {name: tvm.runtime.tensor(values[name]) for name, _ in params}
        return relax.transform.BindParams("forward", bound)(mod)

    def inputs(self, size: int) -> list[np.ndarray]:
        return [np.random.default_rng(size).standard_normal((size, self.hidden)).astype(self.dtype)]

    def reference(self, inputs: list[np.ndarray]) -> np.ndarray:
        w, b = (a.astype(np.float64) for a in weights(self.hidden, self.dtype))
        y = inputs[0].astype(np.float64) @ w.T + b
        return 0.5 * y * (1 + np.vectorize(erf)(y / np.sqrt(2)))


class BertCase:
    """transformers' BertModel on token ids (8, s), s symbolic (``torch.export.Dim``, 2..512)."""

    batch, max_seq = 8, 512

    def __init__(self, args: argparse.Namespace):
        import copy

        import torch
        from transformers import BertConfig, BertModel

        from tvm_ext.relax.torch_import import program_symbols

        self.dtype, self.layers, self.hidden = args.dtype, args.layers, args.hidden
        heads = max(1, self.hidden // 64)
        torch.manual_seed(0)
        config = BertConfig(num_hidden_layers=self.layers, hidden_size=self.hidden, num_attention_heads=heads,
                            intermediate_size=4 * self.hidden, max_position_embeddings=self.max_seq)
        self.model = BertModel(config, add_pooling_layer=False).eval()
        self.vocab = config.vocab_size
        seq = torch.export.Dim("seq", min=2, max=self.max_seq)
        ids = torch.zeros(self.batch, 16, dtype=torch.int64)
        typed = copy.deepcopy(self.model).to(getattr(torch, self.dtype))
        self.program = torch.export.export(typed, (ids,), dynamic_shapes=({1: seq},))
        (self.var,) = program_symbols(self.program)

    def title(self, buckets: str) -> str:
        return f"BertModel ({self.layers} layers, hidden {self.hidden}), ids (8, s) {self.dtype}, buckets {buckets}"

    def module(self):
        from tvm_ext.relax.torch_import import import_exported_program

        return import_exported_program(self.program)

    def inputs(self, size: int) -> list[np.ndarray]:
        return [np.random.default_rng(size).integers(0, self.vocab, (self.batch, size)).astype(np.int64)]

    def reference(self, inputs: list[np.ndarray]) -> np.ndarray:
        import copy

        import torch

        with torch.no_grad():
            return copy.deepcopy(self.model).double()(torch.from_numpy(inputs[0])).last_hidden_state.numpy()


class BertOnnxCase(BertCase):
    """The same BertModel exported to ONNX by torch's exporter with a dynamic sequence axis named
    ``seq``, imported as ``tune model FILE.onnx`` imports it (``load_onnx``)."""

    def __init__(self, args: argparse.Namespace):
        import copy

        import torch

        super().__init__(args)
        model = copy.deepcopy(self.model).to(getattr(torch, self.dtype))

        class Ids(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.bert = model

            def forward(self, ids):
                return self.bert(input_ids=ids).last_hidden_state

        self.path = os.path.join(args.out, "bert_seq.onnx")
        os.makedirs(args.out, exist_ok=True)
        with torch.no_grad():
            torch.onnx.export(Ids().eval(), (torch.zeros(self.batch, 16, dtype=torch.int64),), self.path, dynamo=False,
                              input_names=["ids"], output_names=["out"], opset_version=17,
                              dynamic_axes={"ids": {1: "seq"}, "out": {1: "seq"}})
        self.var = "seq"

    def title(self, buckets: str) -> str:
        return super().title(buckets) + ", from ONNX"

    def module(self):
        from tvm_ext.relax.onnx_import import load_onnx

        return load_onnx(self.path)


def timed(model, case, size: int) -> tuple[float, float]:
    """(seconds, normwise error against float64) of ``model`` at ``size``."""
    inputs = case.inputs(size)
    ref = case.reference(inputs)
    out = model(*inputs)
    out = np.asarray(out[0] if isinstance(out, (tuple, list)) else out, np.float64)
    err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    return model.time(*inputs), err


def _ratio(ms: dict, ours: str, other: str) -> str:
    """How many times faster ``ours`` ran than ``other`` ("-" where either failed)."""
    return f"{ms[other] / ms[ours]:.2f}" if ms[ours] and ms[other] else "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out")
    p.add_argument("--target", default="cuda", choices=("cuda", "opencl"))
    p.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    p.add_argument("--model", default="ffn", choices=("ffn", "bert"))
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=12, help="BertModel's layers (--model bert)")
    p.add_argument("--via", default="torch.export", choices=("torch.export", "onnx"),
                   help="how BertModel reaches TVM (--model bert): a torch.export program or an ONNX file")
    p.add_argument("--buckets", default="1,16,128,512,2048")
    p.add_argument("--sizes", default="8,48,200,700,1500", help="sizes timed (default: between the buckets)")
    p.add_argument("--trials", type=int, default=16, help="trials per task, at every bucket and size (default 16)")
    p.add_argument("--population", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    from tvm_ext.core.session import SessionOptions
    from tvm_ext.relax.buckets import BucketedModel, Buckets, specialize, tune_buckets
    from tvm_ext.relax.pipeline import load_model, tune_relax
    from tvm_ext.target import resolve_target

    target = resolve_target(args.target, 0)
    options = SessionOptions(target=args.target, population=args.population, generations=1000, trials=args.trials,
                             tourn_size=2, seed=args.seed)
    os.makedirs(args.out, exist_ok=True)
    rows_path = os.path.join(args.out, "buckets_rows.jsonl")
    case = FfnCase(args) if args.model == "ffn" else BertOnnxCase(args) if args.via == "onnx" else BertCase(args)
    mod = case.module()
    buckets = Buckets.parse(f"{case.var}={args.buckets}")
    work = os.path.join(args.out, "work")
    records, database = os.path.join(work, "records.jsonl"), os.path.join(work, "database")
    start = time.time()
    tune_buckets(mod, target, records, database, buckets,
                 lambda static: tune_relax(static, target, records, database, options, log=None))
    print(f"buckets {buckets.sizes} tuned in {time.time() - start:.0f} s", flush=True)
    bucketed = BucketedModel(mod, target, database)
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        static = specialize(mod, case.var, size)
        own = os.path.join(work, f"size{size}")
        tune_relax(static, target, os.path.join(own, "records.jsonl"), os.path.join(own, "database"), options,
                   log=None)
        models = {"buckets": bucketed, "tuned": load_model(static, target, os.path.join(own, "database"), log=None),
                  "dlight": load_model(static, target, None, log=None)}
        for variant, model in models.items():
            try:
                secs, err = timed(model, case, size)
                how = bucketed.schedules[size].items() if variant == "buckets" else ()
                note = ", ".join(f"{k} {v}" for k, v in how)
                row = Row(size, variant, secs * 1e3, err, note)
            except Exception as exc:  # noqa: BLE001 - a build that fails is a row
                row = Row(size, variant, None, None, f"failed: {str(exc).strip().splitlines()[-1][:160]}")
            rows.append(row)
            with open(rows_path, "a") as fh:
                fh.write(json.dumps(dataclasses.asdict(row)) + "\n")
            print(f"  n={size} {variant}: {row.ms if row.ms is None else round(row.ms, 4)} ms {row.note}", flush=True)
    by = {(r.size, r.variant): r for r in rows}
    table_rows = []
    for size in sorted({r.size for r in rows}):
        ms = {v: by[(size, v)].ms for v in ("buckets", "tuned", "dlight")}
        table_rows.append([size, *(f"{ms[v]:.4f}" if ms[v] else "-" for v in ("buckets", "tuned", "dlight")),
                           _ratio(ms, "buckets", "tuned"), _ratio(ms, "buckets", "dlight"),
                           f"{by[(size, 'buckets')].err:.1e}" if by[(size, "buckets")].err is not None else "-",
                           by[(size, "buckets")].note])
    print(table(case.title(args.buckets),
                ["n", "buckets ms", "tuned for n ms", "dlight ms", "buckets vs tuned", "buckets vs dlight",
                 "err", "schedules"], table_rows))


if __name__ == "__main__":
    main()
