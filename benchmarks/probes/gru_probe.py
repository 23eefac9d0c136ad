"""GRU probe: chosen configs of our layer against cuDNN replayed from a CUDA graph, fp32.

Run through the device tool (see ../shared/DEVICE.md):
    source .tvm-device/boot.sh && python benchmarks/probes/gru_probe.py --out $OUT
How each side is measured (the same for both, in one process):

- inputs: ``--rotate`` input sets x (seq, batch, input), drawn once (seeded); the runs
  cycle through them, so back-to-back runs do not re-read one x from L2;
- cuDNN (``torch.nn.GRU``, TF32 off): one CUDA graph captured per input set, replayed
  round-robin; ours: the layer's calls enqueued back to back, x rotated the same way;
- time: CUDA events around ``--reps`` back-to-back runs, per run; the median of 5 such
  loops after a warm-up loop;
- error: the outputs of input set 0 (ours after its outputs were poisoned with NaN)
  against the float64 reference (``gru_reference``), ‖out − ref‖ / ‖ref‖, output and h_n.

Cases and configs are listed in ``CASES``; ``--cases`` picks some by label.  Records go
to --out/gru_probe.jsonl as they are measured; a markdown table is printed last.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import table  # noqa: E402

from tvm_ext.schedules.gru import GRU, GruTemplate, gru_reference  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402

PICK = "pick"  # the analytic pick (GRU.build without a config), with some knobs overridden


@dataclass(frozen=True)
class Case:
    label: str
    batch: int
    hidden: int
    seq: int = 128
    layers: int = 1
    bidirectional: bool = False
    configs: tuple[Any, ...] = field(default=())  # knob dicts over the default config, or (PICK, overrides)


def _fused(j: int, b: int, k: int, ks: int, loop: int = 2, barrier: int = 0, **more: int) -> dict[str, int]:
    return dict(fuse_step=1, step_j=j, step_b=b, step_k=k, step_ks=ks, step_loop=loop, step_barrier=barrier,
                **{f"step_{name}": value for name, value in more.items()})


def _new(j: int, b: int, k: int, ks: int, **more: int) -> dict[str, int]:
    """A persistent tile with the acquire barrier and gi/b_h prefetched a step ahead."""
    return _fused(j, b, k, ks, barrier=2, prefetch=1, **more)


def _pick(**overrides: int) -> tuple[str, dict[str, int]]:
    return (PICK, overrides)


# Per case: the best config before the barrier, prefetch, W-in-registers and row-thread knobs
# (RESULTS.md, 2026-11-22; the patent default where no fused config was feasible), the
# analytic pick, and variants that show where the pick's gain comes from.
CASES = (
    Case("B1 H256", 1, 256, configs=(_fused(32, 1, 64, 4), _pick(), _pick(step_barrier=0, step_prefetch=0))),
    Case("B8 H512", 8, 512, configs=(_fused(32, 1, 64, 8), _pick(), _pick(step_barrier=0, step_prefetch=0))),
    Case("B64 H1024", 64, 1024, configs=(
        _fused(32, 8, 32, 4), _pick(),
        _pick(in_wg_x=16, in_wg_y=16, in_task_x=4, in_task_y=4, in_k_step=8, in_pad=0, in_unroll=64, in_vec=1,
              in_double_buffer=0, in_a_transposed=0),  # the pick with the default input GEMM tile
        _pick(step_pipeline=0))),
    Case("B8 H512 bidirectional", 8, 512, bidirectional=True,
         configs=(_fused(16, 2, 64, 8), _pick(), _pick(step_barrier=0, step_prefetch=0))),
    Case("B5 H200 T129", 5, 200, seq=129, configs=({}, _pick(), _pick(step_w_onchip=0))),
    Case("B3 H33 T7 3 layers bidirectional", 3, 33, seq=7, layers=3, bidirectional=True,
         configs=({}, _pick(), _new(16, 1, 16, 4, w_onchip=2))),
)


def rel_err(outs: list[np.ndarray], refs: list[np.ndarray]) -> float:
    """The larger normwise relative error of (output, h_n)."""
    return max(float(np.linalg.norm(np.asarray(o, np.float64) - r) / max(np.linalg.norm(r), 1e-30))
               for o, r in zip(outs, refs))


def time_runs(run: Callable[[int], Any], rotate: int, reps: int, loops: int = 5) -> float:
    """Median seconds per run over ``loops`` event-timed loops of ``reps`` back-to-back runs
    (input set i % rotate), after one warm-up loop."""
    import torch

    times = []
    for loop in range(loops + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(reps):
            run(i % rotate)
        end.record()
        end.synchronize()
        if loop:
            times.append(start.elapsed_time(end) * 1e-3 / reps)
    return statistics.median(times)


def cudnn_graph(net: Any, xs: list[Any]) -> tuple[Callable[[int], Any], Any]:
    """One CUDA graph per input set (``net(x)`` captured); returns (replay(i), output of set 0)."""
    import torch

    graphs, outs = [], []
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(3):  # warm up on the capture stream (cuDNN picks its algorithms)
            net(xs[0])
    torch.cuda.current_stream().wait_stream(stream)
    for x in xs:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
            outs.append(net(x))
        graphs.append(graph)
    return (lambda i: graphs[i].replay()), outs[0]


def rotated_runs(gru: GRU, xs: list[np.ndarray]) -> Callable[[int], Any]:
    """``gru``'s plan enqueued back to back with input set i in its x buffer (one device copy
    of each set, uploaded once; the plan's calls are re-bound to it)."""
    import tvm

    executor = gru.executor
    x_buf = executor.tensors["x"]
    plans = []
    for x in xs:
        device = tvm.runtime.tensor(np.ascontiguousarray(x.reshape(x_buf.shape)), executor.dev)
        plans.append([(func, [device if a is x_buf else a for a in args]) for func, args in executor.calls])

    def run(i: int) -> None:
        for func, args in plans[i]:
            func(*args)
    return run


def run_case(case: Case, args: argparse.Namespace, target: Any, log: Any) -> list[list[str]]:
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    net = torch.nn.GRU(case.hidden, case.hidden, num_layers=case.layers,
                       bidirectional=case.bidirectional).cuda().eval()
    state = {k: v.detach().cpu().numpy() for k, v in net.state_dict().items()}
    rng = np.random.default_rng(0)
    xs = [rng.uniform(-1, 1, (case.seq, case.batch, case.hidden)).astype(np.float32) for _ in range(args.rotate)]
    refs = list(gru_reference(xs[0], state, None, case.layers, case.bidirectional))
    replay, (cudnn_out, cudnn_h) = cudnn_graph(net, [torch.from_numpy(x).cuda() for x in xs])
    replay(0)
    torch.cuda.synchronize()
    cudnn_err = rel_err([cudnn_out.cpu().numpy(), cudnn_h.cpu().numpy()], refs)
    cudnn_s = time_runs(replay, args.rotate, args.reps)
    print(f"[{case.label}] cuDNN graph {cudnn_s * 1e3:.4f} ms, err {cudnn_err:.1e}", flush=True)
    rows = []
    for entry in case.configs:
        row: dict[str, Any] = {"case": case.label, "cudnn_graph_s": cudnn_s, "cudnn_err": cudnn_err}
        try:
            template = GruTemplate(batch=case.batch, hidden=case.hidden, input=case.hidden, seq=case.seq,
                                   layers=case.layers, bidirectional=case.bidirectional)
            if isinstance(entry, tuple):
                config = template.analytic_pick(target)[0].replace(**entry[1])
                row["label"] = "pick" + "".join(f" {k.replace('step_', '')}={v}" for k, v in entry[1].items()
                                                if not k.startswith("in_")) + (" default input GEMM tile" if any(
                                                    k.startswith("in_") for k in entry[1]) else "")
            else:
                config = template.default_config(target).replace(**entry)
                row["label"] = ("default" if not entry else
                                " ".join(f"{k.replace('step_', '')}={v}" for k, v in entry.items() if k != "fuse_step"))
            row["config"] = config.as_dict()
            t0 = time.perf_counter()
            gru = GRU.build(target, case.hidden, case.hidden, num_layers=case.layers,
                            bidirectional=case.bidirectional, batch=case.batch, seq=case.seq,
                            config=config).load_numpy(state)
            gru.executor.write("out", np.full(template.output_specs()["out"].shape, np.nan, np.float32))
            gru.executor.write("h_n", np.full(template.output_specs()["h_n"].shape, np.nan, np.float32))
            row["err"] = rel_err(list(gru(xs[0])), refs)  # also compiles (NVRTC) on the first call
            row["build_s"] = time.perf_counter() - t0
            if not row["err"] <= 1e-4:
                row["error"] = f"wrong answer: rel err {row['err']:.2e} vs float64"
            else:
                row["ours_s"] = time_runs(rotated_runs(gru, xs), args.rotate, args.reps)
                gru(xs[0])  # the barrier flag is checked per call: a timed-out run raises here
                row["stage_s"] = gru.executor.stage_secs()  # input GEMM vs the step kernel (run alone)
        except Exception as exc:  # one failing config is a row, not the end of the run
            last = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ""
            row["error"] = f"{type(exc).__name__}: {last}"
        log.write(json.dumps(row) + "\n")
        log.flush()
        shown = f"{row['ours_s'] * 1e3:.4f} ms err {row['err']:.1e}" if "ours_s" in row else row["error"]
        print(f"[{case.label}] {row.get('label')}: {shown}", flush=True)
        if "ours_s" in row:
            rows.append([case.label, f"{cudnn_s * 1e3:.4f}", f"{cudnn_err:.1e}", row["label"],
                         f"{row['ours_s'] * 1e3:.4f}", f"{cudnn_s / row['ours_s']:.2f}", f"{row['err']:.1e}"])
        else:
            rows.append([case.label, f"{cudnn_s * 1e3:.4f}", f"{cudnn_err:.1e}", row.get("label", "?"), "failed",
                         "-", row["error"][:60]])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="probe_out")
    p.add_argument("--cases", default="", help="comma-separated labels, spaces as underscores (default: all)")
    p.add_argument("--rotate", type=int, default=4, help="input sets cycled through (default 4)")
    p.add_argument("--reps", type=int, default=20, help="back-to-back runs per timed loop (default 20)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    wanted = {c.strip().lower() for c in args.cases.split(",") if c.strip()}
    target = resolve_target("cuda", 0)
    rows = []
    with open(os.path.join(args.out, "gru_probe.jsonl"), "a") as log:
        for case in CASES:
            if wanted and case.label.lower().replace(" ", "_") not in wanted:
                continue
            rows += run_case(case, args, target, log)
    print()
    print(table("GRU fp32: ours back-to-back vs cuDNN replayed from a CUDA graph, rotated inputs",
                ["case", "cuDNN graph ms", "cuDNN err vs f64", "ours", "ours ms", "cuDNN / ours", "ours err vs f64"],
                rows))


if __name__ == "__main__":
    main()
