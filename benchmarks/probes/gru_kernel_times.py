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

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from common import kernel_calls, parse_knob_sets  # noqa: E402
from probe_helpers import gru_weights  # noqa: E402
from gru_step_knob import SEQ, STORED, variant_gru  # noqa: E402

from tvm_ext.schedules.gru import GruTemplate  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402


def show(label: str, times: dict[str, tuple[float, int]]) -> None:
    """The kernels' total, then the six that take most time (``common.kernel_calls``'s order)."""
    print(f"## {label}: kernels {sum(us for us, _ in times.values()) / 1e3:.3f} ms a call")
    for name, (us, n) in list(times.items())[:6]:
        print(f"   {us / 1e3:8.3f} ms  {n:4d} launches  {us / n:8.2f} us each  {name[:60]}")


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
        w = gru_weights(np.random.default_rng(0), hidden)
        x = np.random.default_rng(1).standard_normal((SEQ, batch, hidden)).astype(np.float32)
        template = GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=SEQ).with_precision(
            precision).with_tensor_cores(target)
        pick = template.analytic_pick(target)[0]
        for label, changes in variants.items():
            gru = variant_gru(template, pick, changes, target)
            if isinstance(gru, str):  # the space refuses it
                print(f"## ours {label} B{batch} H{hidden}: infeasible: {gru}")
                continue
            gru.load_numpy(w)
            gru(x)
            show(f"ours {label} B{batch} H{hidden}", kernel_calls(gru.executor.run, args.calls, warm=3))
        module = torch.nn.GRU(hidden, hidden).cuda().half()
        xt = torch.randn(SEQ, batch, hidden, device="cuda", dtype=torch.half)
        with torch.no_grad():
            times = kernel_calls(lambda m=module, t=xt: m(t), args.calls, warm=3)
        show(f"torch.nn.GRU (cuDNN STANDARD) B{batch} H{hidden}", times)
    return 0


if __name__ == "__main__":
    sys.exit(main())
