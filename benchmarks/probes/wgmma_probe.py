"""Hopper warpgroup MMA (``wgmma.mma_async``) probe: a 4096^3 GEMM, float16 in, float32
accumulate, float16 out, written as a TVMScript (``tvm.script.tirx``) PrimFunc and built by
``tvm.compile`` for ``{"kind": "cuda", "arch": "sm_90a"}``; checked against float64 and timed
next to cuBLAS float16 in the same run.

The kernel is the wgmma GEMM template's (``tvm_ext.schedules.gemm.wgmma``: C = A @ Bt^T with A (M, K)
and Bt (N, K) both K-major, the layout wgmma reads without a transpose; cuBLAS is timed on the
same layout, ``a @ bt.t()``, and on the plain ``a @ b`` for reference); this script builds its
tiles at one shape and times them beside cuBLAS, both the same three ways (per call, back to
back, replayed from a CUDA graph that captures TVM's launches: at skinny shapes a kernel takes
a few microseconds and a loop of launches measures the host).

Measured (H100 80GB HBM3, 2026-11-23, two runs): every config bit-identical to cuBLAS, rel error
2.08e-4 vs float64; the best, 128x256x64 s4 w1 with the shared-memory epilogue, 0.238 ms = 578
TFLOP/s = 0.85-0.86 of cuBLAS's best on the same layout (670-681 TFLOP/s), 0.84 of ``a @ b``
(686-695).  Knobs: shared-memory epilogue +10% (520 -> 578), wgmma wait_group 1 over 0 +5%,
128x256 = 256x128, rasterization no effect, 128x128 tiles 0.69-0.76.

    python benchmarks/probes/wgmma_probe.py --compile-only [--out DIR]     # no GPU: CUDA, PTX, ptxas -v
    source .tvm-device/boot.sh && python benchmarks/probes/wgmma_probe.py --out $OUT   # on the H100
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/

from tvm_ext.schedules.gemm.wgmma import WgmmaTile, wgmma_gemm, wgmma_reason  # noqa: E402

TARGET = {"kind": "cuda", "arch": "sm_90a"}
SHAPE = (4096, 4096, 4096)  # M, N, K


def spec(cfg: WgmmaTile) -> str:
    tiles = f":{cfg.tiles}" if cfg.tiles > 1 else ""
    return f"{cfg.bm}x{cfg.bn}x{cfg.bk}:{cfg.stages}:{cfg.inflight}:{int(cfg.smem_epilogue)}:{cfg.raster}{tiles}"


CONFIGS = [  # the first: plain; then one knob at a time (the last 128x128: two CTAs per SM)
    WgmmaTile(128, 256, 4, 1, False), WgmmaTile(128, 256, 4, 1, True), WgmmaTile(128, 256, 4, 0, True),
    WgmmaTile(128, 256, 4, 1, True, 8), WgmmaTile(256, 128, 4, 1, True), WgmmaTile(256, 128, 4, 1, True, 4),
    WgmmaTile(128, 128, 6, 1, True), WgmmaTile(128, 128, 3, 0, True)]


def build(cfg: WgmmaTile, shape: tuple[int, int, int] = SHAPE, b_layout: str = "NK") -> tuple[Any, str, float]:
    """``tvm.compile`` the kernel for sm_90a: (executable, generated CUDA source, seconds)."""
    import tvm

    start = time.perf_counter()
    with tvm.target.Target(TARGET):
        ex = tvm.compile(tvm.IRModule({"main": wgmma_gemm(cfg, *shape, b_layout=b_layout)}), target=TARGET)
    source = ex.mod.imports[0].inspect_source()
    return ex, source, time.perf_counter() - start


def ptxas_report(ptx: str) -> dict[str, Any]:
    """Registers, spills, shared memory and wgmma serialization warnings from ``ptxas -v``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        res = subprocess.run(["ptxas", "-v", "-arch=sm_90a", path, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True)
    text = res.stdout + res.stderr
    find = lambda pat: int(m.group(1)) if (m := re.search(pat, text)) else -1  # noqa: E731
    return {"ok": res.returncode == 0, "registers": find(r"Used (\d+) registers"),
            "spill_stores": find(r"(\d+) bytes spill stores"), "spill_loads": find(r"(\d+) bytes spill loads"),
            "serialized": "serialized" in text, "log": text.strip()[-2000:]}


def compile_only(configs: list[WgmmaTile], out: str | None, shape: tuple[int, int, int] = SHAPE) -> int:
    """Build every config (TVM -> CUDA), compile its CUDA to PTX with nvcc and assemble it with
    ptxas: the kernels must contain ``wgmma.mma_async`` and assemble without spills."""
    import tvm
    from tvm.support import nvcc

    failures = 0
    for cfg in configs:
        _, source, secs = build(cfg, shape)
        tag = spec(cfg).replace(":", "_")
        line = f"{cfg.name}: TVM source {len(source)} chars in {secs:.1f} s, " \
               f"{source.count('wgmma.mma_async')} wgmma.mma_async helper(s)"
        ok = "wgmma.mma_async" in source
        with tvm.target.Target(TARGET):
            ptx = nvcc.compile_cuda(source, target_format="ptx", compiler="nvcc")
        ptx = ptx if isinstance(ptx, str) else bytes(ptx).decode()
        n_wgmma = ptx.count("wgmma.mma_async")
        report = ptxas_report(ptx)
        ok = ok and n_wgmma > 0 and report["ok"] and report["spill_stores"] == 0 and not report["serialized"]
        print(f"{line}; PTX: {n_wgmma} wgmma.mma_async; ptxas sm_90a: {report['registers']} registers, "
              f"spills {report['spill_stores']}/{report['spill_loads']} B, "
              f"{'SERIALIZED wgmma' if report['serialized'] else 'wgmma not serialized'}, "
              f"{cfg.smem_bytes()} B dynamic shared -> {'ok' if ok else 'FAILED'}")
        if not report["ok"]:
            print(report["log"])
        if out:
            os.makedirs(out, exist_ok=True)
            for ext, text in (("cu", source), ("ptx", ptx)):
                with open(os.path.join(out, f"wgmma_{tag}.{ext}"), "w") as f:
                    f.write(text)
        failures += not ok
    return 1 if failures else 0


def error_pattern(out: Any, ref: Any, cfg: WgmmaTile) -> str:
    """Where a wrong result is wrong, folded onto one block tile (for a failed check)."""
    import torch

    bad = ((out.double() - ref).abs() > 1e-2 * ref.abs().max()) | ~torch.isfinite(out)
    if not bool(bad.any()):
        return ""
    m, n = bad.shape
    tile = bad.reshape(m // cfg.bm, cfg.bm, n // cfg.bn, cfg.bn).any(dim=2).any(dim=0)  # (bm, bn)
    rows = tile.any(dim=1).nonzero().flatten().tolist()
    cols = tile.any(dim=0).nonzero().flatten().tolist()
    return (f"{int(bad.sum())} of {m * n} elements off; tile rows {rows[:16]}{'...' if len(rows) > 16 else ''}, "
            f"tile cols {cols[:16]}{'...' if len(cols) > 16 else ''}")


def gpu_run(configs: list[WgmmaTile], out: str | None, shape: tuple[int, int, int] = SHAPE,
            b_layout: str = "NK") -> int:
    import torch
    import tvm
    from common import (TimingSettings, l2_rotation, rel_error_vs, seconds_by_method, table, time_ours_three,
                        time_vendor, tvm_launch, vendor_methods)

    m, n, k = shape
    flops = 2.0 * m * n * k
    set_bytes = 2 * (m * k + n * k + m * n)
    sets = min(4, max(2, l2_rotation(set_bytes)))
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = [torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen) for _ in range(sets)]
    bt = [torch.randn(n, k, device="cuda", dtype=torch.float16, generator=gen) for _ in range(sets)]
    c = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(sets)]
    b_kn = [x.t().contiguous() for x in bt]
    b_ours = b_kn if b_layout == "KN" else bt  # the operand our kernel reads
    ref = a[0].double() @ bt[0].double().t()  # float64 on the GPU
    vendor_out = a[0] @ bt[0].t()
    settings = TimingSettings()
    results: dict[str, Any] = {"shape": shape, "sets": sets, "device": torch.cuda.get_device_name(0),
                               "date": time.strftime("%Y-%m-%d"), "kernels": []}
    rows = []
    for cfg in configs:
        rec: dict[str, Any] = {"config": asdict(cfg), "name": cfg.name}
        try:
            ex, source, secs = build(cfg, shape, b_layout)
            func = ex.mod["main"]
            args = [[tvm.runtime.from_dlpack(t) for t in (a[i], b_ours[i], c[i])] for i in range(sets)]
            c[0].fill_(float("nan"))  # poison: a kernel that writes nothing fails the check
            func(*args[0])
            torch.cuda.synchronize()
            rec["build_s"] = secs
            rec["rel_error"] = rel_error_vs(c[0], ref)
            rec["error_pattern"] = error_pattern(c[0], ref, cfg)
            rec["bitwise_equal_to_cublas"] = float((c[0] == vendor_out).double().mean())
            ours = time_ours_three(tvm_launch(func, args, c), sets, settings)
            rec["seconds_by_method"] = seconds_by_method(ours)
            rec["seconds"], rec["method"] = ours.best.seconds, ours.best.method
        except Exception as exc:  # one failing config is a result, not the end of the run
            rec["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc) else ''}"
        results["kernels"].append(rec)
        print(f"{cfg.name}: {json.dumps({key: v for key, v in rec.items() if key != 'config'})}", flush=True)

    def cublas(i: int) -> Any:
        return a[i] @ bt[i].t()

    vendor = time_vendor(cublas, sets, settings)
    vendor_err = rel_error_vs(vendor_out, ref)
    vendor_nn = time_vendor(lambda i: a[i] @ b_kn[i], sets, settings)
    best = vendor.best.seconds
    results["cublas_nt"] = seconds_by_method(vendor)
    results["cublas_nn"] = seconds_by_method(vendor_nn)
    results["cublas_rel_error"] = vendor_err

    def row(name: str, secs: float | None, err: float | str, same: str = "-") -> list[str]:
        if secs is None:
            return [name, "-", "-", "-", str(err), same]
        err_cell = f"{err:.2e}" if isinstance(err, float) else err
        return [name, f"{secs * 1e3:.3f}", f"{flops / secs / 1e12:.0f}", f"{best / secs:.3f}", err_cell, same]

    for rec in results["kernels"]:
        if "error" in rec:
            rows.append(row(f"{rec['name']} (TVM)", None, rec["error"][:100]))
            continue
        err = rec["rel_error"]
        note = f"{err:.2e}" + (f" WRONG: {rec['error_pattern']}" if rec["error_pattern"] else "")
        for meth, secs in rec["seconds_by_method"].items():  # the same three ways as cuBLAS
            rows.append(row(f"{rec['name']} (TVM, {meth})", secs, note if secs else meth,
                            f"{rec['bitwise_equal_to_cublas']:.4f}"))
    for meth, t in vendor_methods(vendor):
        rows.append(row(f"cuBLAS fp16 A@Bt^T, {meth}", t.seconds if t else None, vendor_err))
    nn_best = vendor_nn.best
    rows.append(row(f"cuBLAS fp16 A@B (N-major B), best ({nn_best.method})", nn_best.seconds, "-"))
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"wgmma_probe_{m}x{n}x{k}{'_kn' if b_layout == 'KN' else ''}.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    print()
    layout = "B (K, N) read N-major" if b_layout == "KN" else "Bt (N, K)"
    print(table(f"wgmma probe, {m}x{n}x{k} fp16 in / fp32 acc / fp16 out, {layout}, {sets} rotated input sets",
                ["kernel", "ms", "TFLOP/s", "of cuBLAS best", "rel err vs float64", "bits = cuBLAS"], rows))
    ok = any("error" not in r and not r["error_pattern"] and r["rel_error"] < 1e-2 for r in results["kernels"])
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true",
                        help="no GPU: build with TVM, compile to PTX (nvcc) and assemble (ptxas -v), then stop")
    parser.add_argument("--shape", default="4096,4096,4096", help="M,N,K (default 4096,4096,4096)")
    parser.add_argument("--b-layout", choices=("NK", "KN"), default="NK",
                        help="NK: Bt (N, K), C = A @ Bt^T (default); KN: B (K, N), C = A @ B")
    parser.add_argument("--out", default=None, help="folder for the JSON results (and sources with --compile-only)")
    parser.add_argument("--config", action="append", default=None, metavar="BMxBNxBK:S[:W[:E[:R[:T]]]]",
                        help="a kernel to probe: tile, stages, wgmma groups in flight (0/1, default 1), "
                        "shared-memory epilogue (0/1, default 1), raster group (tile rows, 0 = row-major), C tiles a "
                        "block computes in turn (default 1); "
                        "repeatable; default: %s"
                        % ", ".join(spec(c) for c in CONFIGS))
    args = parser.parse_args(argv)
    try:
        shape = tuple(int(x) for x in args.shape.split(","))
        if len(shape) != 3:
            raise ValueError
    except ValueError:
        print(f"error: --shape is M,N,K, got {args.shape!r}", file=sys.stderr)
        return 2
    configs = [c for c in CONFIGS if wgmma_reason(c, *shape, b_layout=args.b_layout) is None]
    if args.config:
        try:
            configs = []
            for text in args.config:
                tile, *rest = text.split(":")
                bm, bn, bk = (int(x) for x in tile.split("x"))
                stages, inflight, epilogue, raster, tiles = [int(x) for x in rest] + [4, 1, 1, 0, 1][len(rest):]
                configs.append(WgmmaTile(bm, bn, stages, inflight, bool(epilogue), raster, bk, tiles))
                reason = wgmma_reason(configs[-1], *shape, b_layout=args.b_layout)
                if reason:
                    raise ValueError(reason)
        except ValueError as exc:
            print(f"error: bad --config: {exc}", file=sys.stderr)
            return 2
    if args.compile_only:
        return compile_only(configs, args.out, shape)
    return gpu_run(configs, args.out, shape, args.b_layout)


if __name__ == "__main__":
    sys.exit(main())
