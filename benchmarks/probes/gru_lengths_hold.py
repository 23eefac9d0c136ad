"""Packed input at B64 H1024 T128 (lengths uniform in [64, 128], float16): the hold and the
zeroing as they were before 2026-11-29 (the update gate alone, an element a thread) against
now (every gate, 16 bytes a thread), each through ``tvm_ext.torch.GRU`` on the same packed
inputs, interleaved rounds, and the GPU time per call of each kernel (``torch.profiler``).
(At a12f24c this probe also timed the tensor-core step kernel's blocks stopping at their rows'
longest length: 495.4 against 496.3 us a call, so that was taken out again.)
Usage: python benchmarks/probes/gru_lengths_hold.py"""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import time_vendor  # noqa: E402

import tvm_ext.schedules.gru.template as gru_template  # noqa: E402
import tvm_ext.torch as tt  # noqa: E402
from tvm_ext.schedules.gru.kernels import schedule_elementwise  # noqa: E402

SEQ, BATCH, HIDDEN, SETS, ROUNDS = 128, 64, 1024, 4, 3
NOW = (gru_template.hold_func, gru_template.zero_out_func, gru_template.schedule_elementwise)


def update_gate_hold(steps, batch, hidden, dirs, gi_dtype, vec=1):  # the hold before 2026-11-29
    from tvm.script import tirx as T

    from tvm_ext.schedules.gru.lengths import HOLD, LENGTHS_DTYPE, _constant
    G = 3 * hidden

    @T.prim_func(s_tir=True)
    def hold(lengths: T.Buffer((batch,), LENGTHS_DTYPE), gi: T.Buffer((steps * batch, dirs * G), gi_dtype)):
        T.func_attr({"tirx.noalias": True})
        for r, c in T.grid(steps * batch, dirs * hidden):
            with T.sblock("hold"):
                vr, vc = T.axis.remap("SS", [r, c])
                if vr // batch >= lengths[vr % batch]:
                    gi[vr, vc // hidden * G + hidden + vc % hidden] = _constant(gi_dtype, HOLD)

    return hold


def element_zero_out(steps, batch, width, out_dtype, vec=1):  # the zeroing before 2026-11-29
    return NOW[1](steps, batch, width, out_dtype, 1)


BEFORE = (update_gate_hold, element_zero_out, lambda func, block, threads, vectorized=False: schedule_elementwise(
    func, block, threads, vectorized and block != "hold"))
VARIANTS = {"update-gate hold, an element a thread (before)": BEFORE, "every gate, 16 bytes a thread (now)": NOW}


def build(net, kernels):
    gru_template.hold_func, gru_template.zero_out_func, gru_template.schedule_elementwise = kernels
    mod = tt.GRU(HIDDEN, HIDDEN, device="cuda", dtype=torch.float16, fallback="off")
    mod.load_state_dict(net.state_dict())
    return mod


def main() -> None:
    rng = np.random.default_rng(0)
    lengths = np.sort(rng.integers(64, SEQ + 1, BATCH))[::-1].copy()
    lengths[0] = SEQ
    net = torch.nn.GRU(HIDDEN, HIDDEN).cuda().half().eval()
    xs = [torch.randn(SEQ, BATCH, HIDDEN, device="cuda", dtype=torch.float16) for _ in range(SETS)]
    packs = [torch.nn.utils.rnn.pack_padded_sequence(x, torch.as_tensor(lengths)) for x in xs]
    mods, rows = {}, defaultdict(list)
    with torch.no_grad():
        ref, _ = net(packs[0])
        for name, kernels in VARIANTS.items():
            mods[name] = build(net, kernels)
            out, _ = mods[name](packs[0])  # built here, with the variant's kernels
            err = float((out.data.double() - ref.data.double()).norm() / ref.data.double().norm())
            print(name, "diff from nn.GRU", f"{err:.1e}", flush=True)
        gru_template.hold_func, gru_template.zero_out_func, gru_template.schedule_elementwise = NOW
        for _ in range(ROUNDS):
            for name, mod in mods.items():
                times = time_vendor(lambda i, mod=mod: mod(packs[i])[0].data, SETS)
                best = min(t.seconds for t in (times.per_call, times.back_to_back, times.graph) if t is not None)
                rows[name].append(best * 1e3)
        for name, mod in mods.items():
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    mod(packs[0])
                torch.cuda.synchronize()
            kernels = sorted(((e.key[:60], e.device_time_total / 10) for e in prof.key_averages()),
                             key=lambda kv: -kv[1])[:8]
            print(f"{name}: best ms per round {[round(v, 3) for v in rows[name]]}")
            for key, us in kernels:
                print(f"    {us:8.1f} us  {key}")
    out_dir = os.environ.get("OUT", ".")
    with open(os.path.join(out_dir, "gru_lengths_hold.json"), "w") as f:
        json.dump({"lengths": lengths.tolist(), "rounds": rows}, f)


if __name__ == "__main__":
    main()
