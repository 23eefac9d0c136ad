"""The LSTM (``schedules.lstm``) against cuDNN's LSTM at its best.

Run through the device tool (see ../shared/DEVICE.md):
    source .tvm-device/boot.sh && python benchmarks/lstm_vendor.py --out $OUT [--trials 64]

Each case, same process, same rotated inputs (``SETS`` input sets), T=128 and input = hidden
unless named:
- cuDNN's LSTM through ``cudnnRNNForward`` (``cudnn_rnn.py``) with every algorithm (a refusal is
  a row), float32 with FMA math (no TF32), 16-bit with float32 math precision and tensor-op math;
  ``torch.nn.LSTM`` (TF32 off); each per call, back to back and replayed from a CUDA graph: the
  baseline is the best over algorithms and methods.
- float32 cases also against cuDNN with TF32 allowed (every algorithm with ``CUDNN_DEFAULT_MATH``,
  and ``nn.LSTM`` under ``allow_tf32``, torch's default for RNNs): ours in TF32's error class
  (``tvm_ext.torch.LSTM(precision="float16")``: float32 in and out, float16 storage), and
  ``tvm_ext.torch.LSTM`` as it ships under torch's default flag (the side its first call chose).
- ours: the analytic pick, and with ``--trials`` the best of a GA search of that many configs
  (records in ``$OUT``), each timed the same three ways (its TVM launches on torch's stream, so
  the CUDA graph records them); with ``--variants "label:knob=v,...;..."`` also each named set
  of knob values over the pick (a set the case's space refuses is a row saying why).
Outputs and final states of every side are checked against float64 on set 0 (ours on
NaN-poisoned outputs).

A case with ``lengths`` times packed input (each row's length uniform in the range, the longest
T): cuDNN with padded I/O and per-row lengths (every algorithm), ``nn.LSTM`` on a
``PackedSequence``, ours with ``lengths`` (``variable_lengths``), and ``tvm_ext.torch.LSTM`` as it
ships on the ``PackedSequence`` (the side its first call chose); no TF32 section.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import case_rows, device_name, parse_knob_sets, table, time_ours_three, time_vendor  # noqa: E402
from cudnn_rnn import ALGOS, CudnnError, CudnnGru, api, cudnn_version  # noqa: E402

from tvm_ext.schedules.lstm import LstmTemplate, lstm_reference  # noqa: E402

SETS = 4  # rotated input sets
MAX_ERROR = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}


@dataclass(frozen=True)
class Case:
    label: str
    batch: int
    hidden: int
    seq: int = 128
    layers: int = 1
    bidirectional: bool = False
    dtype: str = "float32"
    lengths: tuple[int, int] | None = None  # uniform in [lo, hi], the longest row = seq

    def template(self) -> LstmTemplate:
        return LstmTemplate(batch=self.batch, hidden=self.hidden, input=self.hidden, seq=self.seq, layers=self.layers,
                            bidirectional=self.bidirectional, dtype=self.dtype,
                            variable_lengths=self.lengths is not None)


CASES = (
    Case("fp32 B1 H256", 1, 256), Case("fp32 B8 H512", 8, 512), Case("fp32 B64 H1024", 64, 1024),
    Case("fp32 bi B8 H512", 8, 512, bidirectional=True), Case("fp16 B8 H512", 8, 512, dtype="float16"),
    Case("fp16 B64 H1024", 64, 1024, dtype="float16"), Case("fp32 B8 H1024 3L", 8, 1024, layers=3),
    Case("fp32 B4 H1024", 4, 1024), Case("fp32 B8 H768", 8, 768), Case("fp16 B1 H256", 1, 256, dtype="float16"),
    Case("fp16 bi B8 H512", 8, 512, bidirectional=True, dtype="float16"),
    Case("fp16 B32 H1024", 32, 1024, dtype="float16"), Case("fp32 B32 H512", 32, 512),
    Case("fp32 B32 H1024", 32, 1024), Case("fp16 B16 H1024", 16, 1024, dtype="float16"),
    Case("fp16 B32 H768", 32, 768, dtype="float16"),
    Case("fp32 B64 H1024 lengths", 64, 1024, lengths=(64, 128)),
    Case("fp16 B64 H1024 lengths", 64, 1024, dtype="float16", lengths=(64, 128)),
    Case("fp32 B8 H512 lengths", 8, 512, lengths=(64, 128)),
    Case("fp16 bi B8 H512 lengths", 8, 512, bidirectional=True, dtype="float16", lengths=(64, 128)),
    Case("fp32 bi B16 H512 lengths", 16, 512, bidirectional=True, lengths=(64, 128)),
)


def rel_err(out: Any, ref: np.ndarray) -> float:
    o = np.asarray(out, np.float64)
    return float(np.linalg.norm(o - ref) / max(np.linalg.norm(ref), 1e-300)) if np.isfinite(o).all() else float("inf")


def best_of(times: Any) -> dict[str, Any]:
    """The three methods' ms and the best of them."""
    methods = {"per_call": times.per_call, "back_to_back": times.back_to_back, "graph": times.graph}
    ms = {k: (t.seconds * 1e3 if t is not None else None) for k, t in methods.items()}
    return {**ms, "best": min(v for v in ms.values() if v is not None), "graph_note": times.graph_note}


def tuned_config(template: LstmTemplate, target: Any, args: argparse.Namespace, label: str) -> Any:
    """The best config of a GA search of ``args.trials`` (records under ``args.out``)."""
    from tvm_ext.core.session import Session, SessionOptions
    from tvm_ext.core.space import Config

    records = os.path.join(args.out, f"lstm_{label.replace(' ', '_')}.jsonl")
    options = SessionOptions(target="cuda", population=16, generations=1000, trials=args.trials, records=records)
    with Session(options) as session:
        best = session.tune(template).best
    if best is None:
        raise RuntimeError(f"{label}: the search measured no config")
    return Config.of(best.config)


def ours(case: Case, config: Any, target: Any, xs: list[Any], weights: dict[str, np.ndarray],
         ref: tuple[np.ndarray, ...], lengths: np.ndarray | None = None) -> dict[str, Any]:
    """Our plan of ``config`` timed three ways on the rotated sets (``lengths`` each row's,
    where the case has them), its error on set 0."""
    from tvm_ext.measure.executors import CudaExecutor

    template = case.template().with_tensor_cores(target)
    compiled = template.compile(config, target)
    ex = CudaExecutor(compiled.executable.mod, compiled.function_calls(), template.for_config(config).buffers(), 0,
                      sets=SETS, prepared=compiled.prepared_steps("cuda"))
    zeros = np.zeros((case.layers * template.dirs, case.batch, case.hidden), np.float32)
    for i, x in enumerate(xs):
        for name, array in template.device_weights(weights).items():
            ex.write(name, array, i)
        ex.prepare(i)  # W_ih's TF32 parts (``in_split`` 3), as the weights load
        ex.write("x", x.reshape(-1, case.hidden), i)
        ex.write("h0", zeros, i)
        ex.write("c0", zeros, i)
        if lengths is not None:
            ex.write("lengths", lengths.astype(np.int32), i)
    for name in ("out", "h_n", "c_n"):
        ex.write(name, np.full(template.output_specs()[name].shape, np.nan, np.float32), 0)
    ex.run(0)
    ex.sync()
    if int(ex.read("bar")[1]):
        return {"refused": "the grid barrier timed out"}
    out = ex.read("out").reshape(case.seq, case.batch, -1)
    err = max(rel_err(out, ref[0]), rel_err(ex.read("h_n"), ref[1]), rel_err(ex.read("c_n"), ref[2]))

    def launch(i: int) -> Any:
        ex.run(i)
        return ex.sets[i]["out"]

    return {**best_of(time_ours_three(launch, SETS)), "err": err, "config": dict(config.items)}


def cudnn_rows(net: Any, case: Case, xs: list[Any], err: Any, math: str,
               max_error: float | None = None, lengths: np.ndarray | None = None) -> dict[str, Any]:
    """cuDNN's LSTM through ``cudnnRNNForward`` with every algorithm in ``math``: each timed the
    three ways with its error against float64 (marked wrong past ten times ``max_error``), or
    the refusal as its row."""
    rows: dict[str, Any] = {}
    for algo in ALGOS:
        try:
            rnn = CudnnGru(net, case.batch, case.seq, algo=algo, math=math,
                           lengths=None if lengths is None else lengths.tolist())
            e = err(*rnn(xs[0]))
            rows[algo] = {**best_of(time_vendor(lambda i, rnn=rnn: rnn(xs[i])[0], SETS)), "err": e}
            if max_error is not None and e > 10 * max_error:
                rows[algo]["wrong"] = True
        except CudnnError as exc:
            rows[algo] = {"refused": exc.status}
        except Exception as exc:  # noqa: BLE001 - a failure is a row
            rows[algo] = {"refused": f"{type(exc).__name__}: {str(exc)[:120]}"}
    return rows


def tf32_rows(net: Any, case: Case, xs: list[Any], err: Any) -> dict[str, Any]:
    """A float32 case against cuDNN with TF32 allowed: every algorithm and ``nn.LSTM`` under
    ``allow_tf32``; ours in TF32's class (float16 storage) and the module as it ships under that
    flag, each timed the three ways, errors against float64."""
    import torch

    from tvm_ext.torch import LSTM as TvmLSTM

    rows: dict[str, Any] = {"cudnn_tf32": cudnn_rows(net, case, xs, err, "tf32")}
    torch.backends.cudnn.allow_tf32 = True
    try:
        with torch.no_grad():
            y, (h, c) = net(xs[0])
            rows["cudnn_tf32"]["nn.LSTM"] = {**best_of(time_vendor(lambda i: net(xs[i])[0], SETS)), "err": err(y, h, c)}
            reduced = TvmLSTM.from_module(net, precision="float16")
            y, (h, c) = reduced(xs[0])
            rows["reduced"] = {**best_of(time_vendor(lambda i: reduced(xs[i])[0], SETS)), "err": err(y, h, c)}
            shipped = TvmLSTM.from_module(net)
            y, (h, c) = shipped(xs[0])
            (choice,) = shipped.choices.values()
            rows["shipped"] = {**best_of(time_vendor(lambda i: shipped(xs[i])[0], SETS)), "err": err(y, h, c),
                               "backend": choice.backend, "ours_ms": choice.ours_ms, "torch_ms": choice.torch_ms,
                               "tf32_class_ms": choice.tf32_class_ms}
    finally:
        torch.backends.cudnn.allow_tf32 = False
    return rows


def packed_rows(net: Any, case: Case, xs: list[Any], lengths: np.ndarray, err: Any) -> dict[str, Any]:
    """Packed input: ``nn.LSTM`` on a ``PackedSequence`` of each set, and ``tvm_ext.torch.LSTM`` as it
    ships on them (the side its first call chose), each timed the three ways, errors of the
    padded outputs against float64."""
    import torch

    from tvm_ext.torch import LSTM as TvmLSTM

    pad = torch.nn.utils.rnn.pad_packed_sequence
    packs = [torch.nn.utils.rnn.pack_padded_sequence(x, torch.as_tensor(lengths)) for x in xs]
    y, (h, c) = net(packs[0])
    rows = {"torch": {**best_of(time_vendor(lambda i: net(packs[i])[0].data, SETS)),
                      "err": err(pad(y, total_length=case.seq)[0], h, c)}}
    shipped = TvmLSTM.from_module(net)
    y, (h, c) = shipped(packs[0])
    (choice,) = shipped.choices.values()
    rows["shipped"] = {**best_of(time_vendor(lambda i: shipped(packs[i])[0].data, SETS)),
                       "err": err(pad(y, total_length=case.seq)[0], h, c), "backend": choice.backend,
                       "ours_ms": choice.ours_ms, "torch_ms": choice.torch_ms}
    return rows


def tf32_summary(row: dict[str, Any]) -> list[str] | None:
    """A float32 case's TF32 row: cuDNN with TF32's best, ours in TF32's class, the module as it
    ships (its side), and the ratios to cuDNN's TF32 best."""
    if "cudnn_tf32" not in row:
        return None
    tf32 = {k: v for k, v in row["cudnn_tf32"].items() if "best" in v}
    if not tf32:
        return None
    name = min(tf32, key=lambda k: tf32[k]["best"])
    best, reduced, shipped = tf32[name]["best"], row["reduced"], row["shipped"]
    return [row["case"]["label"], f"{best:.3f} ({name}, {tf32[name]['err']:.1e})",
            f"{reduced['best']:.3f} ({reduced['err']:.1e})", f"{best / reduced['best']:.2f}x",
            f"{shipped['best']:.3f} ({shipped['backend']}, {shipped['err']:.1e})", f"{best / shipped['best']:.2f}x"]


def run_case(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from tvm_ext.target import resolve_target

    torch.manual_seed(0)
    dt = getattr(torch, case.dtype)
    net32 = torch.nn.LSTM(case.hidden, case.hidden, num_layers=case.layers, bidirectional=case.bidirectional)
    net32 = net32.cuda().eval()
    weights = {k: v.detach().cpu().numpy() for k, v in net32.state_dict().items()}
    net = net32.to(dt) if case.dtype != "float32" else net32
    xs32 = [torch.randn(case.seq, case.batch, case.hidden, device="cuda") for _ in range(SETS)]
    xs = [x.to(dt) for x in xs32]
    lengths = None
    if case.lengths:
        lo, hi = case.lengths
        lengths = np.sort(np.random.default_rng(0).integers(lo, hi + 1, case.batch))[::-1].astype(np.int32)
        lengths[0] = case.seq
        row_lengths = lengths.tolist()
    ref = lstm_reference(xs[0].double().cpu().numpy(), weights, None, None, case.layers, case.bidirectional,
                         lengths=lengths)
    row: dict[str, Any] = {"case": asdict(case)}
    if lengths is not None:
        row["lengths"] = row_lengths

    def err(out: Any, h: Any, c: Any) -> float:
        return max(rel_err(t.detach().double().cpu().numpy(), r) for t, r in zip((out, h, c), ref))

    row["cudnn"] = cudnn_rows(net, case, xs, err, "fma" if case.dtype == "float32" else "tensor_op",
                              MAX_ERROR[case.dtype], lengths)
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        if lengths is None:
            y, (h, c) = net(xs[0])
            row["torch"] = {**best_of(time_vendor(lambda i: net(xs[i])[0], SETS)), "err": err(y, h, c)}
        else:
            row.update(packed_rows(net, case, xs, lengths, err))
    if case.dtype == "float32" and lengths is None:
        row.update(tf32_rows(net, case, xs, err))
    target = resolve_target("cuda")
    template = case.template().with_tensor_cores(target)
    x_sets = [x.cpu().float().numpy() for x in xs32]
    pick, why = template.analytic_pick(target)
    row["pick_why"] = why
    row["ours_pick"] = ours(case, pick, target, x_sets, weights, ref, lengths)
    space = template.space(target)
    for label, changes in args.variants.items():
        variant = pick.replace(**changes)
        reason = space.infeasible_reason(variant)
        row.setdefault("variants", {})[label] = {"refused": reason} if reason else \
            ours(case, variant, target, x_sets, weights, ref, lengths)
    if args.trials:
        t0 = time.perf_counter()
        best = tuned_config(template, target, args, case.label)
        row["tuning_s"] = time.perf_counter() - t0
        row["ours_tuned"] = ours(case, best, target, x_sets, weights, ref, lengths)
    return row


def summary(row: dict[str, Any]) -> list[str]:
    vendor = [v["best"] for v in row["cudnn"].values() if "best" in v and not v.get("wrong")]
    vendor_best = min(vendor + [row["torch"]["best"]])
    sides = [row[k] for k in ("ours_pick", "ours_tuned") if k in row and "best" in row[k]]
    sides += [v for v in row.get("variants", {}).values() if "best" in v]
    ours_best = min(s["best"] for s in sides) if sides else float("nan")
    cells = [row["case"]["label"], f"{row['torch']['best']:.3f}"]
    cells += [f"{v['best']:.3f}" if "best" in v else f"refused ({v['refused']})" for v in row["cudnn"].values()]
    cells += [f"{vendor_best:.3f}"]
    cells += [f"{row[k]['best']:.3f}" if k in row and "best" in row[k] else "-" for k in ("ours_pick", "ours_tuned")]
    cells += [" ".join(f"{label} {v['best']:.3f}" if "best" in v else f"{label} refused"
                       for label, v in row.get("variants", {}).items()) or "-"]
    cells += [f"{vendor_best / ours_best:.2f}x", f"{max(s['err'] for s in sides):.1e}" if sides else "-",
              f"{min(v['err'] for v in row['cudnn'].values() if 'err' in v):.1e}"]
    return cells


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out")
    p.add_argument("--cases", default="", help="comma-separated labels (spaces as _), default all")
    p.add_argument("--trials", type=int, default=0, help="configs a GA search measures per case (0: the pick only)")
    p.add_argument("--variants", default="", help="'label:knob=v,...;...': knob sets over the pick, each timed too")
    args = p.parse_args()
    try:
        args.variants = parse_knob_sets(args.variants, "--variants")
    except ValueError as exc:
        p.error(str(exc))
    os.makedirs(args.out, exist_ok=True)
    print(f"device {device_name()}, cuDNN {cudnn_version()}, enums from {api().enum_source}", flush=True)
    tf32: list[list[str]] = []  # this run's float32 cases against cuDNN with TF32 (``tf32_summary``)

    packed: list[list[str]] = []  # this run's cases with lengths: the module as it ships on packed input

    def run(case: Case) -> dict[str, Any]:
        row = run_case(case, args)
        cells = tf32_summary(row)
        if cells:
            tf32.append(cells)
        if "shipped" in row and "lengths" in row:
            shipped = row["shipped"]
            vendor = min([v["best"] for v in row["cudnn"].values() if "best" in v and not v.get("wrong")]
                         + [row["torch"]["best"]])
            packed.append([case.label, f"{row['torch']['best']:.3f}", f"{vendor:.3f}",
                           f"{row['ours_pick']['best']:.3f}" if "best" in row["ours_pick"] else "-",
                           f"{shipped['best']:.3f} ({shipped['backend']}, {shipped['err']:.1e})",
                           f"{vendor / shipped['best']:.2f}x"])
        return row

    rows = case_rows(CASES, args.cases, run, summary, os.path.join(args.out, "lstm_vendor.jsonl"))
    print()
    print(table("LSTM inference: ours vs cuDNN's best algorithm (ms; best of per call, back to back and CUDA graph; "
                "same rotated inputs)",
                ["case", "torch.nn.LSTM", *ALGOS, "cuDNN best", "ours (pick)", "ours (tuned)", "variants",
                 "cuDNN / ours (best of ours)",
                 "ours err", "cuDNN err"], rows))
    if packed:
        print()
        print(table("packed input (PackedSequence): tvm_ext.torch.LSTM as it ships (ms)",
                    ["case", "nn.LSTM packed", "cuDNN best", "ours (pick)", "shipped (side, err)",
                     "cuDNN best / shipped"], packed))
    if tf32:
        print()
        print(table("float32 LSTM against cuDNN with TF32 allowed (ms, err)",
                    ["case", "cuDNN TF32 best", "ours, float16 storage", "TF32 best / ours",
                     "tvm_ext.torch.LSTM as it ships (side)", "TF32 best / shipped"], tf32))


if __name__ == "__main__":
    main()
