"""The GRU against cuDNN at its best, and as a user calls it.

Run through the device tool (see ../shared/DEVICE.md):
    source .tvm-device/boot.sh && python benchmarks/gru_vendor.py --out $OUT

Each case, same process, same rotated inputs (``SETS`` input sets):
- cuDNN's GRU through ``cudnnRNNForward`` (``cudnn_rnn.py``) with every algorithm (STANDARD,
  PERSIST_STATIC, PERSIST_DYNAMIC, PERSIST_STATIC_SMALL_H; a refusal is a row), float32 with
  FMA math (no TF32), 16-bit with float32 math precision and tensor-op math, each per call,
  back to back and replayed from a CUDA graph: the baseline is the best over algorithms and
  methods.  cuDNN with TF32 allowed is reported beside it, labelled: every algorithm and
  ``torch.nn.GRU`` with ``allow_tf32`` (torch's default for RNNs).  ``torch.nn.GRU`` too.
- ours through ``tvm_ext.torch.GRU`` (the pick, torch tensors in place, torch's stream) the
  same three ways, and so each of ``--candidates`` more configs (first the pick with ``--knobs``
  changed, where given).
- the module as it ships (``fallback="auto"``): the side its first call measured faster
  (ours or ``nn.GRU``), timed the same three ways and as a user calls it.
- as a user calls it: eager calls with a synchronize, wall clock (ours and ``nn.GRU``; ours
  as it ships, replaying its recorded graph, and with ``graphs=False``; against our back-to-back
  time plus the wall of one kernel launch and a synchronize), and the numpy path
  (``tvm_ext.schedules.gru.GRU``) against ``nn.GRU`` with its own host copies.
Outputs of every side are checked against float64 (ours on NaN-poisoned buffers).  Cases
with ``lengths`` time packed input: cuDNN with padded I/O and per-row lengths (every
algorithm), ``nn.GRU`` on a ``PackedSequence``, ours with ``lengths``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import case_rows, device_name, parse_knob_sets, table, time_vendor  # noqa: E402
from cudnn_rnn import ALGOS, CudnnError, CudnnGru, api, cudnn_version  # noqa: E402

from tvm_ext.schedules.gru import gru_reference  # noqa: E402

SETS = 4  # rotated input sets (x of B64 H1024 T128 float32 is 32 MB: four pass L2)
MAX_ERROR = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}
REDUCED = ("fp32 B64 H1024", "fp32 B32 H512", "fp32 B8 H512", "fp32 B64 H1024 3L")  # float16 storage vs cuDNN TF32 here


@dataclass(frozen=True)
class Case:
    label: str
    batch: int
    hidden: int
    input: int = 0  # 0: = hidden
    seq: int = 128
    layers: int = 1
    bidirectional: bool = False
    dtype: str = "float32"
    lengths: tuple[int, int] | None = None  # uniform in [lo, hi], the longest row = seq

    @property
    def width(self) -> int:
        return self.input or self.hidden


CASES = (
    Case("fp32 B1 H256", 1, 256), Case("fp32 B8 H512", 8, 512), Case("fp32 B64 H1024", 64, 1024),
    Case("fp32 bi B8 H512", 8, 512, bidirectional=True), Case("fp32 B32 H512", 32, 512),
    Case("fp32 B16 H1024", 16, 1024), Case("fp32 B64 H512", 64, 512), Case("fp32 B16 H512", 16, 512),
    Case("fp16 B8 H512", 8, 512, dtype="float16"), Case("fp16 B64 H1024", 64, 1024, dtype="float16"),
    Case("fp16 B8 H1024", 8, 1024, dtype="float16"), Case("fp16 B1 H256", 1, 256, dtype="float16"),
    Case("bf16 B8 H512", 8, 512, dtype="bfloat16"), Case("bf16 B64 H1024", 64, 1024, dtype="bfloat16"),
    Case("fp16 bi B32 H1024", 32, 1024, dtype="float16", bidirectional=True),
    Case("fp32 I200 H200 B5 T129", 5, 200, input=200, seq=129),
    Case("fp32 I17 H33 B3 T7 3L bi", 3, 33, input=17, seq=7, layers=3, bidirectional=True),
    # stacks as a speech model runs them: cuDNN runs a stack's layers in one call, overlapping them
    Case("fp32 B64 H1024 3L", 64, 1024, layers=3), Case("fp32 B8 H1024 3L", 8, 1024, layers=3),
    Case("fp16 B64 H1024 3L", 64, 1024, dtype="float16", layers=3),
    Case("fp16 B8 H1024 3L", 8, 1024, dtype="float16", layers=3),
    Case("fp32 B64 H1024 lengths", 64, 1024, lengths=(64, 128)),
    Case("fp16 B64 H1024 lengths", 64, 1024, dtype="float16", lengths=(64, 128)),
    # packed where cuDNN's STANDARD leads our padded kernels: the module as it ships measures the packed call
    Case("fp16 B192 H1024 lengths", 192, 1024, dtype="float16", lengths=(64, 128)),
    Case("fp16 B128 H2048 lengths", 128, 2048, dtype="float16", lengths=(64, 128)),
    Case("fp32 B4 H512", 4, 512), Case("fp32 B5 H512", 5, 512), Case("fp32 B6 H512", 6, 512),
    Case("fp32 B7 H512", 7, 512), Case("fp32 B6 H1024", 6, 1024),
    Case("fp32 bi B4 H512", 4, 512, bidirectional=True), Case("fp32 bi B6 H512", 6, 512, bidirectional=True),
    Case("fp32 bi B16 H256", 16, 256, bidirectional=True),
    Case("fp16 bi B8 H256", 8, 256, dtype="float16", bidirectional=True),
    Case("fp16 B16 H1024", 16, 1024, dtype="float16"), Case("bf16 B8 H1024", 8, 1024, dtype="bfloat16"),
    Case("fp16 B2 H1024", 2, 1024, dtype="float16"),
    # past H1024 (DeepSpeech2-sized layers): W_hh no longer fits the SMs as the tensor-core step kernel holds it
    Case("fp16 B8 H2048", 8, 2048, dtype="float16"), Case("fp16 B16 H2048", 16, 2048, dtype="float16"),
    Case("fp16 B64 H2048", 64, 2048, dtype="float16"), Case("fp16 B64 H1536", 64, 1536, dtype="float16"),
    Case("fp16 B32 H1536", 32, 1536, dtype="float16"), Case("fp16 B32 H2048", 32, 2048, dtype="float16"),
    Case("fp16 bi B64 H1024", 64, 1024, dtype="float16", bidirectional=True),
    Case("fp16 bi B8 H2048", 8, 2048, dtype="float16", bidirectional=True),
    Case("fp16 B128 H1024", 128, 1024, dtype="float16"),
    Case("fp16 B16 H1760", 16, 1760, dtype="float16"), Case("fp16 B32 H1760", 32, 1760, dtype="float16"),
    Case("fp32 B8 H1536", 8, 1536), Case("fp32 B16 H2048", 16, 2048), Case("fp32 B64 H2048", 64, 2048),
    # larger batches, the unfused steps' hidden GEMM on wgmma
    Case("fp16 B128 H2048", 128, 2048, dtype="float16"), Case("fp16 B256 H1024", 256, 1024, dtype="float16"),
    # the cell in the hidden GEMM's store (a wave of its tiles)
    Case("fp16 bi B128 H1024", 128, 1024, dtype="float16", bidirectional=True),
    Case("bf16 B128 H2048", 128, 2048, dtype="bfloat16"),
    Case("fp16 B192 H1024", 192, 1024, dtype="float16"), Case("fp16 B128 H1536", 128, 1536, dtype="float16"),
    Case("bf16 B128 H1024", 128, 1024, dtype="bfloat16"),
    # where the tensor-core step kernel's grid is resident and the cell forms' tiles make a wave too
    Case("fp16 B128 H512", 128, 512, dtype="float16"), Case("fp16 B128 H768", 128, 768, dtype="float16"),
    Case("fp16 B256 H512", 256, 512, dtype="float16"), Case("fp16 B192 H768", 192, 768, dtype="float16"),
    Case("fp16 B32 H1000", 32, 1000, dtype="float16"), Case("fp16 B64 H1000", 64, 1000, dtype="float16"),
    Case("fp16 bi B64 H768", 64, 768, dtype="float16", bidirectional=True),
    Case("fp16 bi B128 H512", 128, 512, dtype="float16", bidirectional=True),
    # float32 past the resident grids: the cell in the hidden GEMM's store on TF32 parts
    Case("fp32 B128 H1024", 128, 1024), Case("fp32 B128 H2048", 128, 2048), Case("fp32 B256 H1024", 256, 1024),
    Case("fp32 B64 H1536", 64, 1536), Case("fp32 B32 H2048", 32, 2048), Case("fp32 B128 H1536", 128, 1536),
    Case("fp32 B192 H1024", 192, 1024), Case("fp32 bi B64 H2048", 64, 2048, bidirectional=True),
    # the resident-W cell step kernel (step_cell) with a ragged last row tile
    Case("fp16 B160 H1024", 160, 1024, dtype="float16"), Case("bf16 B192 H1024", 192, 1024, dtype="bfloat16"),
    Case("bf16 B160 H1024", 160, 1024, dtype="bfloat16"),
    # the resident-W kernel with its input GEMM counted beside it, under the tensor-core step kernel's batch
    Case("fp16 B96 H1024", 96, 1024, dtype="float16"), Case("bf16 B96 H1024", 96, 1024, dtype="bfloat16"),
    Case("bf16 bi B64 H1024", 64, 1024, dtype="bfloat16", bidirectional=True),
    Case("fp16 B160 H768", 160, 768, dtype="float16"), Case("bf16 B192 H768", 192, 768, dtype="bfloat16"),
    Case("fp16 bi B96 H768", 96, 768, dtype="float16", bidirectional=True),
    Case("bf16 B160 H768", 160, 768, dtype="bfloat16"),
    Case("bf16 bi B96 H768", 96, 768, dtype="bfloat16", bidirectional=True),
    Case("fp16 B96 H768", 96, 768, dtype="float16"), Case("bf16 B128 H768", 128, 768, dtype="bfloat16"),
    Case("bf16 bi B64 H768", 64, 768, dtype="bfloat16", bidirectional=True),
    # batches no multiple of the cell form's rows past H1024, and other shapes the picks had not been timed at
    Case("fp16 B96 H1536", 96, 1536, dtype="float16"), Case("fp16 B96 H2048", 96, 2048, dtype="float16"),
    Case("fp16 B200 H1536", 200, 1536, dtype="float16"), Case("fp16 B192 H1536", 192, 1536, dtype="float16"),
    Case("fp16 B192 H2048", 192, 2048, dtype="float16"), Case("fp16 B256 H768", 256, 768, dtype="float16"),
    Case("fp16 B256 H2048", 256, 2048, dtype="float16"),
    Case("fp16 bi B64 H1536", 64, 1536, dtype="float16", bidirectional=True),
    # the cell in the hidden GEMM's store with a ragged last row tile, one wave of tiles or less
    Case("fp16 bi B96 H1024", 96, 1024, dtype="float16", bidirectional=True),
    Case("fp16 B200 H768", 200, 768, dtype="float16"),
    Case("fp16 bi B160 H512", 160, 512, dtype="float16", bidirectional=True),
    Case("fp16 bi B48 H2048", 48, 2048, dtype="float16", bidirectional=True),
    Case("fp16 B100 H1536", 100, 1536, dtype="float16"), Case("bf16 B96 H2048", 96, 2048, dtype="bfloat16"),
    # 129-192 rows past H1024: one 192-row tile row (three consumer warpgroups) with K in halves
    Case("fp16 B160 H1536", 160, 1536, dtype="float16"), Case("fp16 B160 H2048", 160, 2048, dtype="float16"),
    Case("bf16 B192 H1536", 192, 1536, dtype="bfloat16"), Case("bf16 B192 H2048", 192, 2048, dtype="bfloat16"),
    Case("fp16 bi B192 H1024", 192, 1024, dtype="float16", bidirectional=True),
    Case("fp16 bi B192 H768", 192, 768, dtype="float16", bidirectional=True),
    Case("fp32 B192 H1536", 192, 1536), Case("fp32 B160 H2048", 160, 2048),
    Case("fp32 bi B192 H1024", 192, 1024, bidirectional=True),
)


def rel_err(a: Any, ref: np.ndarray) -> float:
    if hasattr(a, "detach"):
        a = a.detach().double().cpu().numpy()
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(a - ref) / max(np.linalg.norm(ref), 1e-30))


def wall_ms(fn: Any, repeat: int = 30) -> float:
    """Median wall milliseconds of ``fn()`` followed by a synchronize (after two warm-ups)."""
    import torch

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def three(times: Any) -> dict[str, Any]:
    cells = {"per_call": times.per_call.seconds * 1e3, "back_to_back": times.back_to_back.seconds * 1e3,
             "graph": times.graph.seconds * 1e3 if times.graph is not None else None}
    cells["best"] = min(v for v in cells.values() if v is not None)
    if times.graph is None:
        cells["graph_note"] = times.graph_note
    return cells


def run_case(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from tvm_ext.torch import GRU as TvmGRU

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    dt = getattr(torch, case.dtype)
    net32 = torch.nn.GRU(case.width, case.hidden, num_layers=case.layers, bidirectional=case.bidirectional).cuda()
    net32.eval()
    state = {k: v.detach().cpu().numpy() for k, v in net32.state_dict().items()}
    net = net32.to(dt) if case.dtype != "float32" else net32
    xs32 = [torch.randn(case.seq, case.batch, case.width, device="cuda") for _ in range(SETS)]
    xs = [x.to(dt) for x in xs32]
    lengths = None
    if case.lengths:
        lo, hi = case.lengths
        lengths = np.sort(rng.integers(lo, hi + 1, case.batch))[::-1].copy()
        lengths[0] = case.seq
    refs = [gru_reference(x.cpu().numpy(), state, None, case.layers, case.bidirectional, lengths=lengths)
            for x in xs32[:1]]
    ref_out, ref_h = refs[0]
    row: dict[str, Any] = {"case": asdict(case), "cudnn": {}, "cudnn_tf32": {}}

    def err(out: Any, h: Any) -> float:
        o = out.detach().double().cpu().numpy()
        return max(rel_err(o, ref_out), rel_err(h, ref_h))

    # ---- cuDNN direct, every algorithm -------------------------------------------------------
    maths = [("cudnn", "fma" if case.dtype == "float32" else "tensor_op")]
    if case.dtype == "float32":
        maths.append(("cudnn_tf32", "tf32"))
    for column, math in maths:
        for algo in ALGOS:
            try:
                gru = CudnnGru(net, case.batch, case.seq, algo=algo, math=math,
                               lengths=None if lengths is None else lengths.tolist())
                y, hy = gru(xs[0])
                e = err(y, hy)
                times = time_vendor(lambda i, gru=gru: gru(xs[i])[0], SETS)
                row[column][algo] = {**three(times), "err": e}
                if e > 10 * MAX_ERROR[case.dtype]:
                    row[column][algo]["wrong"] = True
            except CudnnError as exc:
                row[column][algo] = {"refused": exc.status}
            except Exception as exc:  # noqa: BLE001 - a failure is a row
                row[column][algo] = {"refused": f"{type(exc).__name__}: {str(exc)[:120]}"}
    # ---- torch.nn.GRU (STANDARD) --------------------------------------------------------------
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        if lengths is None:
            fn = lambda i: net(xs[i])[0]  # noqa: E731
        else:
            tl = torch.as_tensor(lengths)
            packs = [torch.nn.utils.rnn.pack_padded_sequence(x, tl) for x in xs]
            fn = lambda i: net(packs[i])[0].data  # noqa: E731
        def torch_err() -> float:  # nn.GRU's first output (padded where packed) and h_n against float64
            out = net(xs[0]) if lengths is None else net(packs[0])
            o = out[0] if lengths is None else torch.nn.utils.rnn.pad_packed_sequence(out[0], total_length=case.seq)[0]
            return err(o, out[1])

        row["torch_err"] = torch_err()
        row["torch"] = three(time_vendor(fn, SETS))
        row["torch_eager_wall"] = wall_ms(lambda: fn(0))
        if case.dtype == "float32":  # torch's default for RNNs: cuDNN with TF32 allowed, as torch sets it up
            torch.backends.cudnn.allow_tf32 = True
            row["cudnn_tf32"]["nn.GRU"] = {**three(time_vendor(fn, SETS)), "err": torch_err()}
            torch.backends.cudnn.allow_tf32 = False
    # ---- ours through tvm_ext.torch.GRU ---------------------------------------------------------
    t0 = time.perf_counter()
    mod = TvmGRU(case.width, case.hidden, case.layers, bidirectional=case.bidirectional, device="cuda", dtype=dt,
                 fallback="off")  # our kernels whatever nn.GRU measures (the module as it ships: below)
    mod.load_state_dict(net.state_dict())
    with torch.no_grad():
        if lengths is None:
            ours = lambda i: mod(xs[i])[0]  # noqa: E731
            out, h_n = mod(xs[0])
            poisoned_out = out
        else:
            ours = lambda i: mod(packs[i])[0].data  # noqa: E731
            packed, h_n = mod(packs[0])
            poisoned_out, _ = torch.nn.utils.rnn.pad_packed_sequence(packed, total_length=case.seq)
        row["build_s"] = time.perf_counter() - t0
        row["ours_err"] = err(poisoned_out, h_n)
        engine = next(iter(mod._engines.values()))
        row["ours_config"] = engine.config.as_dict()
        row["ours"] = three(time_vendor(ours, SETS))
        row["ours_eager_wall"] = wall_ms(lambda: ours(0))  # the module's recorded graph, replayed
        mod.graphs = False
        row["ours_eager_wall_direct"] = wall_ms(lambda: ours(0))  # every kernel launched
        mod.graphs = True
        tiny = torch.zeros(1, device="cuda")
        row["one_launch_wall"] = wall_ms(lambda: tiny.add_(1))  # one kernel launch and a synchronize
        # NaN-poisoned outputs inside a user's CUDA graph: every element rewritten on replay
        if lengths is None:
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                mod(xs[0])
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph):
                g_out, g_h = mod(xs[0])
            g_out.fill_(float("nan"))
            g_h.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            row["ours_graph_err"] = err(g_out, g_h)
            mod.check()
    # ---- the module as it ships: ours or nn.GRU, whichever the shape's first call measured faster -
    shipped = TvmGRU(case.width, case.hidden, case.layers, bidirectional=case.bidirectional, device="cuda", dtype=dt)
    shipped.load_state_dict(net.state_dict())
    with torch.no_grad():
        if lengths is None:
            served = lambda i: shipped(xs[i])[0]  # noqa: E731
            o, h = shipped(xs[0])
        else:  # packed: measured against nn.GRU's packed call
            served = lambda i: shipped(packs[i])[0].data  # noqa: E731
            p, h = shipped(packs[0])
            o, _ = torch.nn.utils.rnn.pad_packed_sequence(p, total_length=case.seq)
        (choice,) = shipped.choices.values()
        row["shipped"] = {"backend": choice.backend, "ours_ms": choice.ours_ms, "torch_ms": choice.torch_ms,
                          "err": err(o, h), "eager_wall": wall_ms(lambda: served(0)),
                          **three(time_vendor(served, SETS))}
    # ---- float32 in and out, float16 storage: against cuDNN with TF32 allowed -----------------
    if case.dtype == "float32" and lengths is None and case.label in REDUCED:
        reduced = TvmGRU(case.width, case.hidden, case.layers, bidirectional=case.bidirectional, device="cuda",
                         precision="float16")
        reduced.load_state_dict(net.state_dict())
        with torch.no_grad():
            o, h = reduced(xs[0])
            row["reduced_err"] = err(o, h)
            row["reduced"] = three(time_vendor(lambda i: reduced(xs[i])[0], SETS))
    # ---- the numpy path against nn.GRU with its host copies -------------------------------------
    if lengths is None and case.dtype != "bfloat16":
        x_np = xs[0].float().cpu().numpy() if case.dtype == "float32" else xs[0].cpu().numpy()
        row["ours_numpy_wall"] = wall_ms(lambda: engine(x_np), repeat=10)
        with torch.no_grad():
            row["torch_numpy_wall"] = wall_ms(lambda: net(torch.from_numpy(x_np).cuda())[0].cpu().numpy(), repeat=10)
    # ---- a few more configs, back to back -----------------------------------------------------
    row["candidates"] = []
    if (args.candidates or args.knob_changes) and lengths is None:
        from gru import candidates, precision_of  # noqa: E402

        from tvm_ext.schedules.gru import GruTemplate
        from tvm_ext.target import resolve_target

        target = resolve_target("cuda", 0)
        template = GruTemplate(batch=case.batch, hidden=case.hidden, input=case.width, seq=case.seq,
                               layers=case.layers, bidirectional=case.bidirectional)
        template = template.with_precision(precision_of(case.dtype)).with_tensor_cores(target)
        start = time.perf_counter()
        changed = [template.analytic_pick(target)[0].replace(**args.knob_changes)] if args.knob_changes else []
        for cfg in [*changed, *(candidates(template, target, args.candidates) if args.candidates else [])]:
            if time.perf_counter() - start > args.budget and cfg not in changed:
                break
            try:
                cand = TvmGRU(case.width, case.hidden, case.layers, bidirectional=case.bidirectional, device="cuda",
                              dtype=dt, config=cfg.as_dict())
                cand.load_state_dict(net.state_dict())
                with torch.no_grad():
                    o, h = cand(xs[0])
                    e = err(o, h)
                    entry = {"config": cfg.as_dict(), "err": e}
                    if e <= MAX_ERROR[case.dtype]:
                        entry.update(three(time_vendor(lambda i, cand=cand: cand(xs[i])[0], SETS)))
                    row["candidates"].append(entry)
            except Exception as exc:  # noqa: BLE001
                row["candidates"].append({"config": cfg.as_dict(), "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
    return row


def summary(row: dict[str, Any]) -> list[str]:
    def ms(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}"

    algos = row["cudnn"]
    cells = []
    for algo in ALGOS:
        a = algos.get(algo, {})
        cells.append("refused" if "refused" in a else ms(a.get("best")) + (" WRONG" if a.get("wrong") else ""))
    valid = [a["best"] for a in algos.values() if "best" in a and not a.get("wrong")]
    best = min(valid + [row["torch"]["best"]])  # nn.GRU is cuDNN too (STANDARD, as torch sets it up)
    tf32 = [a["best"] for a in row["cudnn_tf32"].values() if "best" in a and not a.get("wrong")]
    tf32_err = min((a["err"] for a in row["cudnn_tf32"].values() if "err" in a), default=np.nan)
    reduced = (f"{row['reduced']['best']:.3f} ({row['reduced_err']:.1e}) = {min(tf32) / row['reduced']['best']:.2f}x"
               if "reduced" in row and tf32 else "-")
    timed = [c["best"] for c in row["candidates"] if "best" in c]
    ours_best = min([row["ours"]["best"], *timed])
    return [row["case"]["label"], ms(row["torch"]["best"]), *cells, ms(best),
            f"{min(tf32):.3f} ({tf32_err:.1e})" if tf32 else "-", reduced,
            ms(row["ours"]["best"]), f"{best / row['ours']['best']:.2f}", ms(ours_best), f"{best / ours_best:.2f}",
            ms(row["ours_eager_wall"]), ms(row.get("ours_eager_wall_direct")),
            f"{row['ours_eager_wall'] / (row['ours']['back_to_back'] + row['one_launch_wall']):.2f}"
            if "one_launch_wall" in row else "-", ms(row["torch_eager_wall"]),
            ms(row.get("ours_numpy_wall")), ms(row.get("torch_numpy_wall")),
            f"{row['ours_err']:.1e}", f"{min((a['err'] for a in algos.values() if 'err' in a), default=np.nan):.1e}",
            *shipped_cells(row)]


def shipped_cells(row: dict[str, Any]) -> list[str]:
    """The module as it ships: the side its first call chose (with the per-call times that chose
    it), its best time against cuDNN's best, its eager wall against nn.GRU's, its error."""
    if "shipped" not in row:
        return ["-"] * 4
    s = row["shipped"]
    algos = [a["best"] for a in row["cudnn"].values() if "best" in a and not a.get("wrong")]
    best = min(algos + [row["torch"]["best"]])
    return [f"{s['backend']} ({s['ours_ms']:.3f} / {s['torch_ms']:.3f})", f"{best / s['best']:.2f}",
            f"{row['torch_eager_wall'] / s['eager_wall']:.2f}", f"{s['err']:.1e}"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out")
    p.add_argument("--cases", default="", help="comma-separated labels (spaces as _), default all")
    p.add_argument("--candidates", type=int, default=0, help="more configs tried per case (default 0: the pick)")
    p.add_argument("--budget", type=float, default=60.0, help="seconds of candidates per case")
    p.add_argument("--knobs", default="", help="knob=value,... over the pick: timed first among the candidates")
    args = p.parse_args()
    try:  # the pick's knobs changed for the first candidate (``--knobs``), as gru_call_nodes' --config
        args.knob_changes = parse_knob_sets(f"knobs:{args.knobs}", "--knobs")["knobs"] if args.knobs else {}
    except ValueError as exc:
        p.error(str(exc))
    os.makedirs(args.out, exist_ok=True)
    print(f"device {device_name()}, cuDNN {cudnn_version()}, enums from {api().enum_source}", flush=True)
    rows = case_rows(CASES, args.cases, lambda case: run_case(case, args), summary,
                     os.path.join(args.out, "gru_vendor.jsonl"))
    print()
    print(table("GRU inference, T=128 unless named: ours vs cuDNN's best algorithm (ms; best of per call, back to back "
                "and CUDA graph; same rotated inputs)",
                ["case", "torch.nn.GRU", *ALGOS, "cuDNN best (incl. nn.GRU)", "cuDNN TF32 best (err)",
                 "ours fp16 storage (err) vs TF32", "ours (pick)",
                 "pick / cuDNN",
                 "ours best", "best / cuDNN", "ours eager wall", "ours eager, graphs off",
                 "eager / (back to back + one launch)", "nn.GRU eager wall", "ours numpy wall",
                 "nn.GRU numpy wall", "ours err", "cuDNN err", "module as shipped: side (ours / nn.GRU ms a call)",
                 "shipped / cuDNN best", "nn.GRU eager wall / shipped", "shipped err"], rows))


if __name__ == "__main__":
    main()
