"""Which kernels the vendor runs for a GEMM: cuBLAS and cuBLASLt (``a @ b`` as the GEMM benchmarks
call it, A (M, K) and B (K, N) row-major) and cuBLASLt's e4m3 (``torch._scaled_mm``, sums promoted,
as ``gemm_fp8.py`` calls it), each kernel's name, grid, block, registers, shared memory and median
duration from torch's profiler over a few calls after a warm-up.  The name says the tile, the
cluster and the split of K cuBLAS chose; what our pick might copy.  With ``--ours``, our analytic
pick for each float16 shape (``gemm-tc``'s, A·Btᵀ as ``gemm_tensor_core.py`` runs it) and any
``--ours-peers`` (the pick with knobs changed) profiled the same way: kernel time beside the
vendor's, without the launches between calls that a CUDA graph's timing counts.  A kernel launched
early (``wgmma_pdl`` 1, the picks') waits for the one ahead inside its own duration, up to twice
its time back to back: a peer with ``wgmma_pdl=0`` gives its own time.
Usage: python benchmarks/probes/vendor_kernels.py [--shapes 1024x768x768,...] [--fp8 4096,8192]
[--ours] [--ours-peers 'label:knob=v,...;...'] [--out DIR]"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # benchmarks/common.py

DEFAULT_SHAPES = "1024x768x768,1024x768x3072,1024x3072x768,4096x4096x4096,8192x8192x8192"
CALLS = 20


def kernels_of(fn: Callable[[], Any], calls: int = CALLS) -> list[dict[str, Any]]:
    """The kernels ``fn`` launches: one row per distinct (name, grid, block) with its launch
    parameters from the profiler's trace and the median of its durations (µs)."""
    from common import profiled

    prof = profiled(fn, calls, warm=3)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    rows: dict[tuple, dict[str, Any]] = {}
    for e in events:
        if e.get("cat") != "kernel":
            continue
        args = e.get("args", {})
        key = (e["name"], str(args.get("grid")), str(args.get("block")))
        row = rows.setdefault(key, {"name": e["name"], "grid": args.get("grid"), "block": args.get("block"),
                                    "registers": args.get("registers per thread"),
                                    "shared_memory": args.get("shared memory"), "durations_us": []})
        row["durations_us"].append(e.get("dur"))
    out = []
    for row in rows.values():
        durations = [d for d in row.pop("durations_us") if d is not None]
        median = statistics.median(durations) if durations else None
        out.append({**row, "launches": len(durations), "median_us": median})
    return out


def cases(shapes: list[tuple[int, int, int]], fp8: list[int]) -> list[tuple[str, Callable[[], Any]]]:
    """(label, call) for each vendor side measured."""
    import torch
    from common import scaled_e4m3

    made = []
    choose = getattr(torch.backends.cuda, "preferred_blas_library", None)
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16)
        for library in ("cublas", "cublaslt") if choose else ("default",):
            def call(a: Any = a, b: Any = b, library: str = library) -> Any:
                if choose:
                    choose(library)
                return a @ b
            made.append((f"float16 {m}x{n}x{k} {library}", call))
    for size in fp8:
        a, sa = scaled_e4m3(torch.randn(size, size, device="cuda"))
        bt, sb = scaled_e4m3(torch.randn(size, size, device="cuda"))
        made.append((f"e4m3 {size}^3 torch._scaled_mm",
                     lambda a=a, bt=bt, sa=sa, sb=sb: torch._scaled_mm(a, bt.t(), scale_a=sa, scale_b=sb,
                                                                      out_dtype=torch.float16)))
    return made


def ours_cases(shapes: list[tuple[int, int, int]], peers: dict[str, dict[str, int]]
               ) -> list[tuple[str, Callable[[], Any]]]:
    """(label, call) of our analytic pick at each float16 shape and of each peer (the pick with
    knobs changed), each on one operand set (L2 warm, as the vendor's calls here)."""
    from common import gemm_operand_sets, ours_launch

    from tvm_ext.core.session import analytic_pick
    from tvm_ext.schedules.gemm.tensor_core_choice import TensorCoreChoiceTemplate
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    made = []
    for m, n, k in shapes:
        template = TensorCoreChoiceTemplate(m, n, k, a_dtype="float16", b_dtype="float16", c_dtype="float16")
        pick = analytic_pick(template.for_target(target), target)[0].as_dict()
        sets = gemm_operand_sets(m, n, k, "float16", count=1)
        for label, changes in {"pick": {}, **peers}.items():
            try:
                launch, err = ours_launch(template, {**pick, **changes}, target, sets)
            except Exception as exc:  # a peer the shape cannot take is reported, the rest go on
                print(f"float16 {m}x{n}x{k} ours {label}: left out: {str(exc).splitlines()[0]}", flush=True)
                continue
            print(f"float16 {m}x{n}x{k} ours {label}: error {err:.1e}", flush=True)
            made.append((f"float16 {m}x{n}x{k} ours {label}", lambda launch=launch: launch(0)))
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="MxNxK,... (float16)")
    parser.add_argument("--fp8", default="4096,8192", help="square e4m3 sizes, or empty")
    parser.add_argument("--ours", action="store_true", help="also our analytic pick at each float16 shape")
    parser.add_argument("--ours-peers", default="", help="with --ours, the pick with knobs changed: "
                                                         "'label:knob=v,knob=v;...'")
    parser.add_argument("--out", default=".", help="folder for vendor_kernels.json")
    args = parser.parse_args(argv)
    from common import parse_knob_sets
    try:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
        fp8 = [int(v) for v in args.fp8.split(",") if v]
        if any(len(s) != 3 or min(s) < 1 for s in shapes) or any(v < 1 for v in fp8):
            raise ValueError
    except ValueError:
        print(f"error: --shapes takes MxNxK,... and --fp8 sizes,... of positive integers, got "
              f"{args.shapes!r} / {args.fp8!r}", file=sys.stderr)
        return 2
    try:
        peers = parse_knob_sets(args.ours_peers, "--ours-peers")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from common import device_name

    found = {}
    for label, call in cases(shapes, fp8) + (ours_cases(shapes, peers) if args.ours else []):
        found[label] = kernels_of(call)
        for row in found[label]:
            print(f"{label}: {row['median_us']} us  grid {row['grid']} block {row['block']} regs {row['registers']} "
                  f"smem {row['shared_memory']}  {row['name']}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "vendor_kernels.json"), "w") as f:
        json.dump({"device": device_name(), "cases": found}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
