"""Where a step of the GRU's tensor-core step kernel goes (float16 B64 H1024 T128, the pick:
32 units x 16 rows a block, 4 unit warps, tagged words): the kernel's CUDA source with clock64()
stamps for thread 0 of every block at the points of each step (loop top, before and after the
barrier that ends the poll of h, after the products, after each further block barrier but the
last, before the step's last barrier), written
into gi rows two steps behind (read by no one any more; a block's own rows only), read back and
summarised in cycles per phase.  A probe: the stamps patch the source through TVM's
``tvm_callback_cuda_postproc`` hook; the GRU's outputs of this run are not checked.
``--variant step_tc_kw=4,step_tc_nw=1,step_tc_cell=1``: another block of the same grid.
Usage: python benchmarks/probes/gru_step_timeline.py [--variant knob=v,...]"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

STAMP = ("#define TVM_EXT_STAMP(p) if (s >= 2 && threadIdx.x == 0 && threadIdx.y == 0) { "
         "*(long long*)(gi_ptr + (((s - 2) * 64 + blockIdx.y * 16 + (blockIdx.x & 15)) * 3072 "
         "+ (blockIdx.x >> 4) * 32 + (p) * 4)) = clock64(); }\n")
FIRST = ("poll (warp 0)", "wait for the other warps' polls", "products (warp 0)")
LAST = "last barrier, next step's top"
MAX_POINTS = 8  # a block's stamps fit 32 halves of its gi row


def phase_names(points: int) -> tuple[str, ...]:
    """The phases between ``points`` stamps, and the wrap from the last to the next step's top."""
    middle = tuple(f"to block barrier {i + 2} and past it" for i in range(points - 5))
    return FIRST + middle + ("to the last barrier (warp 0)", LAST)


def stamped(code: str) -> str:
    """``code`` with the stamps in gru_steps_kernel's step loop (unchanged elsewhere)."""
    head = "gru_steps_kernel("
    start = code.rfind(head)
    if start < 0 or "for (int s = 0; s < 128; ++s) {" not in code[start:]:
        return code
    body_end = code.index("\n}\n", start)
    kernel = code[start:body_end]
    top = kernel.index("for (int s = 0; s < 128; ++s) {") + len("for (int s = 0; s < 128; ++s) {")
    first_sync = kernel.index("__syncthreads();", top)
    last_mma = kernel.rindex("mma.sync")
    after_products = kernel.index("\n  }\n", last_mma) + len("\n  }\n")
    last_sync = kernel.rindex("__syncthreads();")
    cuts = [(top, 0), (first_sync, 1), (first_sync + len("__syncthreads();"), 2), (after_products, 3)]
    at = kernel.find("__syncthreads();", after_products)
    while 0 <= at < last_sync:
        cuts.append((at + len("__syncthreads();"), len(cuts)))
        at = kernel.find("__syncthreads();", at + 1)
    cuts.append((last_sync, len(cuts)))
    assert len(cuts) <= MAX_POINTS, len(cuts)
    cuts = [(at, f"TVM_EXT_STAMP({p})") for at, p in cuts]
    for at, text in sorted(cuts, reverse=True):
        kernel = kernel[:at] + "\n" + text + "\n" + kernel[at:]
    return STAMP + code[:start] + kernel + code[body_end:]


def main() -> None:
    import tvm_ffi

    p = argparse.ArgumentParser()
    p.add_argument("--variant", default="", help="knob=v,... over the pick (the same grid of blocks)")
    args = p.parse_args()
    variant = {k: int(v) for k, v in (kv.split("=") for kv in args.variant.split(",") if kv)}

    tvm_ffi.register_global_func("tvm_callback_cuda_postproc", lambda code, target: stamped(code), override=True)
    from gru_step_knob import weights

    from tvm_ext.schedules.gru import GRU, GruTemplate
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda", 0)
    half = {name: "float16" for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}
    template = GruTemplate(batch=64, hidden=1024, input=1024, seq=128).with_precision(half).with_tensor_cores(target)
    config = template.analytic_pick(target)[0]
    assert (config.step_j, config.step_tc_rows, config.step_tc_kw, config.step_tc_nw) == (32, 16, 1, 4)
    config = config.replace(**variant)
    source = template.compile(config, target).source  # stamped by the hook
    points = source[source.index("gru_steps_kernel("):].count("TVM_EXT_STAMP(")
    names = phase_names(points)
    rng = np.random.default_rng(0)
    gru = GRU.build(target, 1024, 1024, batch=64, seq=128, config=config, precision=half).load_numpy(
        weights(rng, 1024))
    x = rng.standard_normal((128, 64, 1024)).astype(np.float32)
    rows = []
    for _ in range(3):
        gru(x)
        gi = gru.executor.read("gi").view(np.int64).reshape(128 * 64, 3072 * 2 // 8)
        stamps = np.zeros((126, 4, 32, points), np.int64)  # steps 2..127, row groups, unit blocks, points
        for s in range(2, 128):
            for by in range(4):
                for bx in range(32):
                    row = (s - 2) * 64 + by * 16 + (bx & 15)
                    stamps[s - 2, by, bx] = gi[row, (bx >> 4) * 8:(bx >> 4) * 8 + points]
        d = np.diff(stamps, axis=-1)
        wrap = stamps[1:, ..., 0] - stamps[:-1, ..., -1]  # the last barrier to the next step's top
        phases = [d[..., i] for i in range(points - 1)] + [wrap]
        rows.append({name: {"median": float(np.median(p)), "p10": float(np.percentile(p, 10)),
                            "p90": float(np.percentile(p, 90))} for name, p in zip(names, phases)})
        step = stamps[1:, ..., 0] - stamps[:-1, ..., 0]
        rows[-1]["whole step"] = {"median": float(np.median(step)), "p10": float(np.percentile(step, 10)),
                                  "p90": float(np.percentile(step, 90))}
    print("| phase of a step (thread 0 of each block, steps 2-127) | cycles, median (p10-p90) |")
    print("|---|---|")
    for name in (*names, "whole step"):
        cell = rows[-1][name]
        print(f"| {name} | {cell['median']:.0f} ({cell['p10']:.0f}-{cell['p90']:.0f}) |")
    suffix = "_" + args.variant.replace(",", "_").replace("=", "") if args.variant else ""
    with open(os.path.join(os.environ.get("OUT", "."), f"gru_step_timeline{suffix}.json"), "w") as f:
        json.dump({"config": config.as_dict(), "rounds": rows}, f)


if __name__ == "__main__":
    sys.exit(main())
