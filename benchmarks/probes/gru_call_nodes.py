"""What a ``tvm_ext.torch.GRU`` call costs beyond its plan's kernels: the module's call and the
plan alone (the executor's calls), each per call, back to back and replayed from a CUDA graph
(``time_vendor``), in rounds; the kernels and copies of one graph replay of the module's calls,
start and duration (torch's profiler), where the gaps between them show; and an eager call as a
user makes it, with and without hx: the host's time in the call (after a synchronize) and the
wall clock of the call and a synchronize, medians.
T=128 (``--seq``), input = hidden, the pick (``--config``: knob values over it, e.g.
``step_overlap_bn=64,step_overlap=8``).
Usage: python benchmarks/probes/gru_call_nodes.py [--cases float16:8:512,float32:8:512] [--rounds 2]
       [--config K=V,...] [--seq 128] [--out DIR]"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import capture_graph, host_and_wall_us, parse_knob_sets, time_vendor  # noqa: E402

from tvm_ext.torch import GRU, LOW_PRECISION_TENSORS  # noqa: E402

SETS, SEQ = 4, 128


def three(times) -> dict:
    return {"per_call": times.per_call.seconds * 1e3, "back_to_back": times.back_to_back.seconds * 1e3,
            "graph": times.graph.seconds * 1e3 if times.graph else None, "graph_note": times.graph_note}


def replay_nodes(fn) -> list[tuple[str, float, float]]:
    """(name, start, duration) in microseconds of every kernel and copy of one replay of a graph
    of 8 calls of ``fn``, from the first one's start."""
    from torch.profiler import ProfilerActivity, profile

    graph, _ = capture_graph(fn, SETS, 8)
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    t0 = events[0].time_range.start if events else 0
    return [(e.name[:60], round(e.time_range.start - t0, 2), round(e.time_range.end - e.time_range.start, 2))
            for e in events]


def eager_us(call, n: int = 200) -> dict:
    """Median host microseconds inside ``call()`` (the GPU idle before it) and median wall
    microseconds of ``call()`` and a synchronize (``common.host_and_wall_us``)."""
    host, wall = host_and_wall_us(call, n)
    return {"host_us": host, "wall_us": wall}


def pick_with(dtype: str, batch: int, hidden: int, config: dict | None, seq: int = SEQ) -> dict | None:
    """The pick's whole config with ``config``'s knob values over it (None: the pick itself)."""
    if not config:
        return None
    from tvm_ext.schedules.gru import GruTemplate
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda", 0)
    precision = {} if dtype == "float32" else dict.fromkeys(LOW_PRECISION_TENSORS, dtype)  # as the module's
    template = GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=seq, layers=1, bidirectional=False,
                           variable_lengths=False).with_precision(precision).with_tensor_cores(target)
    return template.analytic_pick(target)[0].replace(**config).as_dict()


def measure(dtype: str, batch: int, hidden: int, rounds: int, config: dict | None = None, seq: int = SEQ) -> dict:
    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    net = torch.nn.GRU(hidden, hidden).cuda().to(dt).eval()
    xs = [torch.randn(seq, batch, hidden, device="cuda").to(dt) for _ in range(SETS)]
    module = GRU(hidden, hidden, 1, device="cuda", dtype=dt, config=pick_with(dtype, batch, hidden, config, seq))
    module.load_state_dict(net.state_dict())
    with torch.no_grad():
        module(xs[0])
        engine = next(iter(module._engines.values()))
        plan_out = torch.from_dlpack(engine.executor.sets[0]["out"])
        call = lambda i: module(xs[i])[0]  # noqa: E731
        plan = lambda i: (engine.executor.run(), plan_out)[1]  # noqa: E731
        row: dict = {"module": [], "plan": []}
        for _ in range(rounds):
            row["module"].append(three(time_vendor(call, SETS)))
            row["plan"].append(three(time_vendor(plan, SETS, tvm_stream=True)))
        row["nodes"] = replay_nodes(call)
        h0 = torch.randn(1, batch, hidden, device="cuda").to(dt)
        module(xs[0], h0)
        row["eager"] = eager_us(lambda: module(xs[0]))
        row["eager_hx"] = eager_us(lambda: module(xs[0], h0))
    watch = next(iter(module._watches.values()), None)
    row["flags_in_pinned_words"] = bool(watch is not None and getattr(watch, "mapped", None) is not None)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="float16:8:512,float32:8:512")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--config", default="", help="knob values over the pick: K=V,K=V")
    p.add_argument("--seq", type=int, default=SEQ, help="time steps (two lengths apart: a step's time and the rest)")
    p.add_argument("--out", default="bench_out")
    args = p.parse_args()
    try:
        config = parse_knob_sets(f"config:{args.config}", "--config")["config"] if args.config else {}
    except ValueError as exc:
        p.error(str(exc))
    os.makedirs(args.out, exist_ok=True)
    result = {}
    for case in args.cases.split(","):
        dtype, batch, hidden = case.split(":")
        row = result[case] = measure(dtype, int(batch), int(hidden), args.rounds, config, args.seq)
        for side in ("module", "plan"):
            cells = [f"{r['back_to_back']:.4f}/" + (f"{r['graph']:.4f}" if r["graph"] else f"({r['graph_note']})")
                     for r in row[side]]
            print(case, side, " ".join(cells), "ms (back to back / graph)")
        print(case, "eager host / wall us:", *(f"{k} {row[k]['host_us']:.1f} / {row[k]['wall_us']:.1f}"
                                                for k in ("eager", "eager_hx")))
        for node in row["nodes"][:12]:
            print("   ", node)
    with open(os.path.join(args.out, "gru_call_nodes.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
