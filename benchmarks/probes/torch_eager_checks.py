"""Host time and eager wall clock of a repeated ``tvm_ext.torch.GRU`` call: the call that goes
straight to its recorded graph (its input signature checked on an earlier call) against the full
path (the module's cache of checked signatures emptied before each call), in interleaved rounds,
the outputs of both checked against float64 first.  T=128, input = hidden.
Usage: python benchmarks/probes/torch_eager_checks.py [--rounds 5] [--cases fp32:1:256,fp16:8:512]"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import host_and_wall_us  # noqa: E402

from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.schedules.gru import gru_reference  # noqa: E402
from tvm_ext.torch import GRU  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cases", default="fp32:1:256,fp32:8:512,fp16:8:512,fp16:64:1024")
    args = p.parse_args()
    rows = []
    for case in args.cases.split(","):
        name, batch, hidden = case.split(":")
        torch.manual_seed(0)
        net = torch.nn.GRU(int(hidden), int(hidden)).cuda().to(DTYPES[name]).eval()
        gru = GRU.from_module(net, fallback="off")
        x = torch.randn(128, int(batch), int(hidden), device="cuda", dtype=DTYPES[name])
        state = {k: v.detach().float().cpu().numpy() for k, v in net.state_dict().items()}
        ref = gru_reference(x.float().cpu().numpy(), state, None, 1, False)
        with torch.no_grad():
            gru(x)  # records the graph
            errors = {}
            for way in ("full", "fast"):  # the full path's replay registers the signature the next call takes
                if way == "full":
                    gru._eager_calls.clear()
                out, h_n = gru(x)
                errors[way] = relative_error([out.float().cpu().numpy(), h_n.float().cpu().numpy()], ref)
            times: dict[str, list[tuple[float, float]]] = {"full": [], "fast": []}
            for _ in range(args.rounds):
                for way in times:
                    # "full": the cache of checked signatures emptied before each call
                    times[way].append(host_and_wall_us(lambda gru=gru, x=x: gru(x), 100,
                                                       gru._eager_calls.clear if way == "full" else None))
        row = {"case": f"{name} B{batch} H{hidden}", "errors": errors,
               **{f"{way}_{what}_us": statistics.median(t[i] for t in times[way])
                  for way in times for i, what in enumerate(("host", "wall"))}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| case | host, full checks (us) | host, checked signature (us) | eager wall, full (us) "
          "| eager wall, checked (us) | errors |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['full_host_us']:.1f} | {r['fast_host_us']:.1f} | {r['full_wall_us']:.1f} "
              f"| {r['fast_wall_us']:.1f} | {r['errors']['full']:.1e} / {r['errors']['fast']:.1e} |")
    with open(os.path.join(os.environ.get("OUT", "."), "torch_eager_checks.json"), "w") as f:
        json.dump(rows, f)


if __name__ == "__main__":
    main()
