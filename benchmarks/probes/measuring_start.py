"""Where a measuring process's start goes: a fresh pool process (spawned, as the worker's session
makes it) times its own imports and the device's load step by step; the parent times the whole
wait (``IsolatedMeasurer.warm``).  Printed as one JSON line per round.

    source .tvm-device/boot.sh && python benchmarks/probes/measuring_start.py --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def steps(device_id: int, kind: str = "cuda") -> dict[str, float]:
    """In the pool process: seconds of each step of ``measure.warm_device``, in order."""
    out: dict[str, float] = {}
    start = time.perf_counter()

    def mark(name: str) -> None:
        nonlocal start
        now = time.perf_counter()
        out[name] = round(now - start, 3)
        start = now

    import numpy  # noqa: F401
    mark("numpy")
    import tvm
    mark("tvm")
    from tvm_ext.measure import executors  # noqa: F401
    mark("tvm_ext.measure.executors")
    if kind == "cuda":
        tvm.runtime.empty((1,), "float32", tvm.cuda(device_id))
        mark("cuda context")
        from tvm_ext.measure.cuda_graph import cudart
        cudart()
        mark("cudart")
    out["torch imported"] = float("torch" in sys.modules)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--kind", default="cuda", choices=("cuda", "opencl"))
    args = p.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import measuring_start  # the pool process imports ``steps`` from here, not from __main__

    from tvm_ext.measure.runner import IsolatedMeasurer

    for _ in range(args.rounds):
        measurer = IsolatedMeasurer(timeout=120)
        start = time.perf_counter()
        pool = measurer._started()
        got = pool.schedule(measuring_start.steps, (args.device, args.kind), 120).result()
        total = time.perf_counter() - start
        measurer.close()
        print(json.dumps({"wait": round(total, 3), **got}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
