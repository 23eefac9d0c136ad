"""The warp-specialized wgmma kernel with and without TMA multicast in clusters of two
(``wgmma_multicast``), built directly (no tuner) and timed by TVM's time evaluator back to back;
``strict`` builds the multicast kernel with its releases at cluster scope
(``mbarrier.arrive.release.cluster``, patched into the CUDA through TVM's
``tvm_callback_cuda_postproc`` hook) to see what the scope of a release costs.  Outputs not
checked here (``tests/test_wgmma_ws.py -m gpu`` does).
Usage: python benchmarks/probes/multicast_probe.py [--cases fp8_4096,fp8_8192,bert_down] [--out DIR]"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import numpy as np

WS = dict(tma=True, specialized=True, smem_epilogue=False)
RELEASE = "mbarrier.arrive.shared::cluster.b64"
STRICT = "mbarrier.arrive.release.cluster.shared::cluster.b64"


def cases() -> dict:
    from tvm_ext.schedules.gemm.wgmma import WgmmaTile

    fp8 = dict(promote=1, overlap=True, scales=True)
    return {  # name: (tile, m, n, k, wgmma_gemm's keywords)
        "fp8_4096": (WgmmaTile(128, 128, 6, 1, raster=8, tiles=8, operand="e4m3", **WS), 4096, 4096, 4096, fp8),
        "fp8_8192": (WgmmaTile(128, 128, 6, 1, raster=8, tiles=16, operand="e4m3", **WS), 8192, 8192, 8192, fp8),
        "bert_down": (WgmmaTile(64, 96, 8, 1, raster=2, **WS), 1024, 768, 3072, {}),
        "bert_proj": (WgmmaTile(64, 96, 8, 1, raster=2, **WS), 1024, 768, 768, {}),
        "f16_4096": (WgmmaTile(128, 256, 4, 1, raster=8, tiles=4, **WS), 4096, 4096, 4096, {}),
    }


def host_arguments(func) -> list[np.ndarray]:
    """Zero operands and C, unit scales, in the dtypes of ``func``'s parameters."""
    import ml_dtypes

    out = []
    for p in func.params:
        shape, dtype = tuple(int(x) for x in p.shape), str(p.dtype)
        np_dtype = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float16": np.float16}.get(dtype, np.float32)
        out.append(np.ones(shape, np_dtype) if len(shape) == 1 else np.zeros(shape, np_dtype))
    return out


def timed(tile, m: int, n: int, k: int, kw: dict, strict: bool) -> float:
    """Median ms of the kernel back to back (TVM's time evaluator, 50 calls a repeat, 5 repeats)."""
    import tvm
    import tvm_ffi

    from tvm_ext.hardware import sm_90a
    from tvm_ext.schedules.gemm.wgmma import wgmma_gemm
    from tvm_ext.target import resolve_target

    tvm_ffi.register_global_func("tvm_callback_cuda_postproc",
                                 lambda code, target: code.replace(RELEASE, STRICT) if strict else code,
                                 override=True)
    func = wgmma_gemm(tile, m, n, k, **kw)
    target = tvm.target.Target(sm_90a(resolve_target("cuda")).tvm_target())
    mod = tvm.compile(tvm.IRModule({"main": func}), target=target).mod
    dev = tvm.cuda(0)
    args = [tvm.runtime.tensor(x, dev) for x in host_arguments(func)]
    evaluator = mod.time_evaluator("main", dev, number=50, repeat=5)
    return float(np.median(evaluator(*args).results)) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="fp8_4096,fp8_8192,bert_down,bert_proj,f16_4096")
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    known = cases()
    names = [c for c in args.cases.split(",") if c]
    if not names or any(c not in known for c in names):
        print(f"error: --cases takes names of {', '.join(known)}, got {args.cases!r}", file=sys.stderr)
        return 2
    rows = []
    for name in names:
        tile, m, n, k, kw = known[name]
        row = {"case": name, "tile": tile.name}
        for label, variant, strict in (("ws", tile, False), ("multicast", dataclasses.replace(tile, multicast=True),
                                                              False),
                                       ("multicast strict", dataclasses.replace(tile, multicast=True), True)):
            try:
                row[label] = timed(variant, m, n, k, kw, strict)
            except Exception as exc:  # a refused or failed variant is a row, not the end of the run
                row[label] = f"failed: {str(exc).strip().splitlines()[-1][:120]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "multicast_probe.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
