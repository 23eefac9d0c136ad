"""Where a step of the GRU's tensor-core step kernel goes (float16 T128, or ``--dtype float32``
on its float32-parts form; by default B64 H1024,
the pick: 32 units x 16 rows a block, 4 unit warps, tagged words): the kernel's CUDA source with
clock64() stamps for thread 0 of every block at the points of each step (loop top, the end of the
poll of h (its barrier, or with one unit warp the warp's sync), after the products, after each
further block barrier but the last, before the step's last barrier), written into gi's rows of
the step two behind (read by no one any more), read back and summarised in cycles per phase.  A
probe: the stamps patch the source through TVM's ``tvm_callback_cuda_postproc`` hook; the GRU's
outputs of this run are not checked.
``--variant step_tc_kw=4,step_tc_nw=1``: another block of the same grid; ``--case 8,512``:
another batch and hidden size (its pick).
Usage: python benchmarks/probes/gru_step_timeline.py [--case B,H] [--variant knob=v,...]"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # benchmarks/common.py

STAMP = ("#define TVM_EXT_STAMP(p) if (s >= 2 && threadIdx.x == 0 && threadIdx.y == 0) {{ "
         "*(long long*)(gi_ptr + (long long)(s - 2) * {step_values} "
         "+ (blockIdx.y * gridDim.x + blockIdx.x) * {block_values} + (p) * {point_values}) = clock64(); }}\n")
FIRST = ("poll (warp 0)", "wait for the other warps' polls", "products (warp 0)")
LAST = "last barrier, next step's top"
MAX_POINTS = 8  # a block's stamps fit 64 bytes of its gi row


def phase_names(points: int) -> tuple[str, ...]:
    """The phases between ``points`` stamps, and the wrap from the last to the next step's top."""
    middle = tuple(f"to block barrier {i + 2} and past it" for i in range(points - 5))
    return FIRST + middle + ("to the last barrier (warp 0)", LAST)


def stamped(code: str, step_values: int, itemsize: int = 2) -> str:
    """``code`` with the stamps in gru_steps_kernel's step loop (unchanged elsewhere); a step's
    gi rows hold ``step_values`` values of ``itemsize`` bytes."""
    head = "gru_steps_kernel("
    start = code.rfind(head)
    if start < 0 or "for (int s = 0; s < 128; ++s) {" not in code[start:]:
        return code
    body_end = code.index("\n}\n", start)
    kernel = code[start:body_end]
    top = kernel.index("for (int s = 0; s < 128; ++s) {") + len("for (int s = 0; s < 128; ++s) {")
    first_mma = kernel.index("mma.sync", top)
    poll_end = max(kernel.rfind(sync, top, first_mma) for sync in ("__syncthreads();", "__syncwarp();"))
    sync = "__syncthreads();" if kernel.startswith("__syncthreads();", poll_end) else "__syncwarp();"
    last_mma = kernel.rindex("mma.sync")
    after_products = kernel.index("\n  }\n", last_mma) + len("\n  }\n")
    last_sync = kernel.rindex("__syncthreads();")
    cuts = [(top, 0), (poll_end, 1), (poll_end + len(sync), 2), (after_products, 3)]
    at = kernel.find("__syncthreads();", after_products)
    while 0 <= at < last_sync:
        cuts.append((at + len("__syncthreads();"), len(cuts)))
        at = kernel.find("__syncthreads();", at + 1)
    cuts.append((last_sync, len(cuts)))
    assert len(cuts) <= MAX_POINTS, len(cuts)
    cuts = [(at, f"TVM_EXT_STAMP({p})") for at, p in cuts]
    for at, text in sorted(cuts, reverse=True):
        kernel = kernel[:at] + "\n" + text + "\n" + kernel[at:]
    stamp = STAMP.format(step_values=step_values, block_values=64 // itemsize, point_values=8 // itemsize)
    return stamp + code[:start] + kernel + code[body_end:]


def main() -> None:
    import tvm_ffi

    p = argparse.ArgumentParser()
    p.add_argument("--variant", default="", help="knob=v,... over the pick (the same grid of blocks)")
    p.add_argument("--case", default="64,1024", help="batch,hidden (T128, input = hidden)")
    p.add_argument("--dtype", default="float16", help="float16, or float32 (its tagged-word kernel, step_tc 2)")
    args = p.parse_args()
    variant = {k: int(v) for k, v in (kv.split("=") for kv in args.variant.split(",") if kv)}
    batch, hidden = (int(v) for v in args.case.split(","))
    step_values, itemsize = batch * 3 * hidden, 4 if args.dtype == "float32" else 2

    tvm_ffi.register_global_func("tvm_callback_cuda_postproc",
                                 lambda code, target: stamped(code, step_values, itemsize), override=True)
    from common import time_ours
    from probe_helpers import gru_weights

    from tvm_ext.schedules.gru import GRU, GruTemplate
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda", 0)
    precision = {name: args.dtype for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}
    template = GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=128).with_precision(precision) \
        .with_tensor_cores(target)
    config = template.analytic_pick(target)[0].replace(**variant)
    assert config.step_tc in (1, 2) and config.step_flags == 1, "the stamps' points are the tagged-word kernel's"
    source = template.compile(config, target).source  # stamped by the hook
    points = source[source.index("gru_steps_kernel("):].count("TVM_EXT_STAMP(")
    names = phase_names(points)
    rng = np.random.default_rng(0)
    gru = GRU.build(target, hidden, hidden, batch=batch, seq=128, config=config, precision=precision).load_numpy(
        gru_weights(rng, hidden))
    x = rng.standard_normal((128, batch, hidden)).astype(np.float32)
    blocks = template.step_variant(config).shape.blocks
    assert blocks * 64 <= step_values * itemsize, "a step's gi rows hold every block's stamps"
    rows = []
    for _ in range(3):
        gru(x)
        gi = gru.executor.read("gi").view(np.int64).reshape(128, step_values * itemsize // 8)
        # steps 2..127, blocks (y major, as the stamps are written), points
        stamps = gi[:126, :blocks * 8].reshape(126, blocks, 8)[..., :points]
        d = np.diff(stamps, axis=-1)
        wrap = stamps[1:, ..., 0] - stamps[:-1, ..., -1]  # the last barrier to the next step's top
        phases = [d[..., i] for i in range(points - 1)] + [wrap]
        rows.append({name: {"median": float(np.median(p)), "p10": float(np.percentile(p, 10)),
                            "p90": float(np.percentile(p, 90))} for name, p in zip(names, phases)})
        step = stamps[1:, ..., 0] - stamps[:-1, ..., 0]
        rows[-1]["whole step"] = {"median": float(np.median(step)), "p10": float(np.percentile(step, 10)),
                                  "p90": float(np.percentile(step, 90))}
    # the stamped build timed back to back, and its steps 2-127 by the stamps: tells whether the
    # stamps' cycles account for the kernel's time (compare with the unstamped build's, gru_step_knob.py)
    ms = time_ours(lambda i: gru.executor.run()).seconds * 1e3
    span = float(np.median(stamps[-1, :, -1] - stamps[0, :, 0]))
    rows[-1]["stamped build ms"] = ms
    rows[-1]["steps 2-127 by the stamps, cycles"] = span
    print(f"stamped build back to back: {ms:.4f} ms; steps 2-127 by the stamps: {span:.0f} cycles "
          f"({span / 1980e3:.4f} ms at 1980 MHz)")
    print("| phase of a step (thread 0 of each block, steps 2-127) | cycles, median (p10-p90) |")
    print("|---|---|")
    for name in (*names, "whole step"):
        cell = rows[-1][name]
        print(f"| {name} | {cell['median']:.0f} ({cell['p10']:.0f}-{cell['p90']:.0f}) |")
    suffix = ("" if args.case == "64,1024" else f"_b{batch}_h{hidden}") + ("_float32" if itemsize == 4 else "") + \
        ("_" + args.variant.replace(",", "_").replace("=", "") if args.variant else "")
    with open(os.path.join(os.environ.get("OUT", "."), f"gru_step_timeline{suffix}.json"), "w") as f:
        json.dump({"config": config.as_dict(), "rounds": rows}, f)


if __name__ == "__main__":
    sys.exit(main())
