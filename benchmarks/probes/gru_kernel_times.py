"""Each kernel's GPU time in one call of our GRU and of ``torch.nn.GRU`` (cuDNN), from CUPTI
through ``torch.profiler``: where a layer's time goes (the input GEMM, each step's hidden GEMM
and cell kernel), beside cuDNN's kernels for the same shape.  Variants as in
``gru_step_knob.py`` (``--variants "pick;mma:hid_wgmma=0;pdl:hidw_pdl=1"``: knobs over the pick,
``mma_`` / ``hidw_`` the unfused steps' hidden-GEMM tile); T=128, input = hidden, float16.
Usage: python benchmarks/probes/gru_kernel_times.py --cases 64:2048,64:1536 [--variants V] [--calls 5]"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from common import parse_knob_sets, profiled  # noqa: E402
from gru_step_knob import SEQ, STORED, variant_gru, weights  # noqa: E402

from tvm_ext.schedules.gru import GruTemplate  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402


def kernel_times(call, calls: int) -> dict[str, tuple[float, int]]:
    """Microseconds a call of each kernel (by name, cut at 60 characters) and its launches a call."""
    import torch

    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in profiled(call, calls, warm=3).events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total = totals[event.name[:60]]
            total[0] += event.device_time_total
            total[1] += 1
    return {name: (us / calls, n // calls) for name, (us, n) in totals.items()}


def show(label: str, times: dict[str, tuple[float, int]]) -> None:
    print(f"## {label}: kernels {sum(us for us, _ in times.values()) / 1e3:.3f} ms a call")
    for name, (us, n) in sorted(times.items(), key=lambda kv: -kv[1][0])[:6]:
        print(f"   {us / 1e3:8.3f} ms  {n:4d} launches  {us / n:8.2f} us each  {name}")


def parse_cases(text: str) -> list[tuple[int, int]]:
    """'64:2048,128:1024' -> [(64, 2048), (128, 1024)]; ValueError naming the option."""
    try:
        cases = [tuple(int(v) for v in case.split(":")) for case in text.split(",")]
    except ValueError:
        cases = []
    if not cases or any(len(c) != 2 or min(c) < 1 for c in cases):
        raise ValueError(f"--cases takes BATCH:HIDDEN,... of positive integers, got {text!r}")
    return cases  # type: ignore[return-value]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="64:2048", help="batch:hidden,...")
    p.add_argument("--variants", default="pick")
    p.add_argument("--calls", type=int, default=5)
    args = p.parse_args()
    try:
        variants = parse_knob_sets(args.variants, "--variants", bare=("pick",))
        cases = parse_cases(args.cases)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    target = resolve_target("cuda", 0)
    precision = {name: "float16" for name in STORED}
    for batch, hidden in cases:
        w = weights(np.random.default_rng(0), hidden)
        x = np.random.default_rng(1).standard_normal((SEQ, batch, hidden)).astype(np.float32)
        template = GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=SEQ).with_precision(
            precision).with_tensor_cores(target)
        pick = template.analytic_pick(target)[0]
        for label, changes in variants.items():
            gru = variant_gru(template, pick, changes, target)
            if gru is None:
                print(f"## ours {label} B{batch} H{hidden}: infeasible")
                continue
            gru.load_numpy(w)
            gru(x)
            show(f"ours {label} B{batch} H{hidden}", kernel_times(gru.executor.run, args.calls))
        module = torch.nn.GRU(hidden, hidden).cuda().half()
        xt = torch.randn(SEQ, batch, hidden, device="cuda", dtype=torch.half)
        with torch.no_grad():
            times = kernel_times(lambda m=module, t=xt: m(t), args.calls)
        show(f"torch.nn.GRU (cuDNN STANDARD) B{batch} H{hidden}", times)
    return 0


if __name__ == "__main__":
    sys.exit(main())
