"""Mixed-precision search (method 003) on the GPU: speedup over the all-fp32 program
within an error bound, for a GEMM 4096³ and a GRU layer B64 H1024 T128.

Run through the device tool (see ../shared/DEVICE.md):
    source .tvm-device/boot.sh && python benchmarks/mixed_precision.py --out $OUT
For each case and each bound (1e-3, 1e-2): the search runs at the case's best fp32
schedule (``SCHEDULES``, from the earlier H100 tuning runs), every config is checked
against a float64 reference of the unrounded fp32 inputs (its error is the normwise
relative error of the outputs) and timed by the tuning core's runner; the two bounds
share one records file, so the second run re-uses what the first measured.  With
``--wgmma`` the GEMM's 16-bit pairs with float32 sums run Hopper's wgmma kernel.  With
``--eight-bit`` the GEMM's search may also store A and B as e4m3 or e5m2 with per-tensor
scales (its 8-bit wgmma program), and torch's e4m3 ``_scaled_mm`` (cuBLASLt, same scaling
of the same float32 operands) is timed beside float32 and float16.  The
chosen program is then exported (S7), loaded back with ``tvm_ext.precision.codegen`` and run on
fresh inputs, and its error there is reported too.  The vendor library runs the same
operator in the same process, in float32 and in float16 (torch: cuBLAS for the GEMM, cuDNN
for the GRU; TF32 off), for the last columns: timed per call, back to back and replayed from
a CUDA graph (``benchmarks/common.py``; ratios against its best), with its error against the
same kind of float64 reference as ours (of the unrounded float32 operands).  A markdown
table is printed last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import l2_rotation, rel_error_vs, scaled_e4m3, table, time_vendor, vendor_cells  # noqa: E402

from tvm_ext.precision.codegen import export_program, load_program  # noqa: E402
from tvm_ext.cost_model.precision import PrecisionPredictor  # noqa: E402
from tvm_ext.precision.mixed_precision import MixedPrecisionSettings, MixedPrecisionSearch, PrecisionProgram  # noqa: E402
from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.schedules.gemm.gemm_programs import EightBitGemmProgram, WgmmaGemmProgram  # noqa: E402
from tvm_ext.schedules.gemm.simt import GemmTemplate  # noqa: E402
from tvm_ext.schedules.gru import GruTemplate  # noqa: E402
from tvm_ext.schedules.gemm.tensor_core import parse_tile, pick_tile  # noqa: E402
from tvm_ext.core.session import Session, SessionOptions  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402

GEMM_BEST = dict(wg_x=16, wg_y=8, task_x=8, task_y=8, k_step=16, use_shared=1, pad=1, unroll=512, vec=4,
                 double_buffer=1, a_transposed=1)  # 43.2 TFLOP/s fp32 on the H100 (RESULTS.md)


def gru_schedule(template: GruTemplate, target: Any, text: str) -> Any:
    """The GRU's knobs (``--gru-schedule``, k=v,...) over its default config."""
    values = {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))}
    return template.default_config(target).replace(**values)


def tile(text: str, shapes: list[tuple[int, int, int]], target: Any) -> Any:
    """A tile option: ``auto`` (``pick_tile`` for the shapes), or ``parse_tile``'s text."""
    return pick_tile(shapes, target) if text.strip() == "auto" else parse_tile(text)


def cases(target: Any, args: argparse.Namespace) -> list[tuple[str, Any, Any]]:
    gemm = GemmTemplate(4096, 4096, 4096, tensor_core=tile(args.gemm_tensor_core, [(4096, 4096, 4096)], target))
    gru = GruTemplate(batch=64, hidden=1024, input=1024, seq=128,
                      in_tensor_core=tile(args.gru_in_tensor_core, [(128 * 64, 3 * 1024, 1024)], target),
                      hid_tensor_core=tile(args.gru_hid_tensor_core, [(64, 3 * 1024, 1024)], target))
    return [("GEMM 4096³", gemm, gemm.space(target).make(**GEMM_BEST)),
            ("GRU B64 H1024 T128", gru, gru_schedule(gru, target, args.gru_schedule))]


def vendor_ms(label: str, eight_bit: bool = False) -> dict[str, Any]:
    """torch's time for the case in float32 and float16 (its best of per call, back to back
    and a CUDA graph; NaN where torch cannot run it), every method's time, and its error
    against float64 of the float32 operands (the reference our error is measured against)."""
    out: dict[str, Any] = {"vendor_fp32_ms": float("nan"), "vendor_fp16_ms": float("nan")}
    try:
        import torch
    except ImportError:
        return out
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    with torch.no_grad():
        if label.startswith("GEMM"):
            full = [tuple(torch.randn(4096, 4096, device="cuda") for _ in range(2))
                    for _ in range(l2_rotation(3 * 4 * 4096 * 4096))]
            ref = full[0][0].double() @ full[0][1].double()
        else:
            net32 = torch.nn.GRU(1024, 1024).cuda().eval()
            full = [(torch.randn(128, 64, 1024, device="cuda"),)]
            ref = net32.double()(full[0][0].double())[0]
            net32.float()
        for dtype, tag in ((torch.float32, "fp32"), (torch.float16, "fp16")):
            sets = [tuple(t.to(dtype) for t in group) for group in full]
            if label.startswith("GEMM"):
                call = lambda i, sets=sets: sets[i][0] @ sets[i][1]  # noqa: E731
            else:
                net = net32.to(dtype)
                call = lambda i, net=net, sets=sets: net(sets[i][0])  # noqa: E731
            times = time_vendor(call, len(sets))
            result = call(0)
            out[f"vendor_{tag}_ms"] = times.best.seconds * 1e3
            out[f"vendor_{tag}_cells"] = " / ".join(vendor_cells(times)[:3])
            out[f"vendor_{tag}_error"] = rel_error_vs(result[0] if isinstance(result, tuple) else result, ref)
        if eight_bit and label.startswith("GEMM"):  # cuBLASLt e4m3 with per-tensor scales, float16 out
            quantized = [(*scaled_e4m3(a), *scaled_e4m3(b.t().contiguous())) for a, b in full]
            call = lambda i: torch._scaled_mm(quantized[i][0], quantized[i][2].t(), scale_a=quantized[i][1],  # noqa: E731
                                              scale_b=quantized[i][3], out_dtype=torch.float16)
            times = time_vendor(call, len(quantized))
            out["vendor_e4m3_ms"] = times.best.seconds * 1e3
            out["vendor_e4m3_cells"] = " / ".join(vendor_cells(times)[:3])
            out["vendor_e4m3_error"] = rel_error_vs(call(0), ref)
    return out


def run_case(label: str, base: Any, schedule: Any, target: Any, eb: float, args: argparse.Namespace) -> dict:
    kernels = ((EightBitGemmProgram,) if args.eight_bit else ()) + ((WgmmaGemmProgram,) if args.wgmma else ())
    kernels = kernels if label.startswith("GEMM") else ()
    tag = "".join(f"_{k.name}" for k in kernels)
    records = os.path.join(args.out, f"mp_{label.split()[0].lower()}{tag}.jsonl")
    program = PrecisionProgram(base, schedule, kernels=kernels)
    session = Session(SessionOptions(target=target.kind, records=records, build_timeout=600, run_timeout=300),
                      target=target)
    tuner = session.tuner(program)
    print(f"[{label} eb={eb:g}] {program.tensor_core_note(target)}", flush=True)
    settings = MixedPrecisionSettings(error_bound=eb, max_measurements=args.m, population=4, generated=32,
                                 measured=4, seed=0)
    start = time.perf_counter()
    try:
        result = MixedPrecisionSearch(tuner, settings, PrecisionPredictor(program, target, eb),
                                      log=lambda line: print(f"[{label} eb={eb:g}] {line}", flush=True)).run()
    finally:
        session.close()
    row = {"case": label, "eb": eb, "fp32_ms": result.baseline.cost * 1e3, "measured": result.measured,
           "new": result.new_measurements, "kept": ",".join(result.kept_stages), "secs": time.perf_counter() - start,
           "stage_ms": {k: v * 1e3 for k, v in result.stage_secs.items()}}
    if result.best is None:
        return {**row, "best_ms": float("nan"), "speedup": float("nan"), "error": float("nan"),
                "precision": "none within the bound", "reload_error": float("nan")}
    chosen = tuner.space.make(**result.best.config)
    lowered = program.lowered(chosen)
    folder = os.path.join(args.out, f"program_{label.split()[0].lower()}_{eb:g}")
    export_program(lowered, schedule, target, folder,
                   extra={"error": result.error, "error_bound": eb, "time_s": result.best.cost,
                          "baseline_time_s": result.baseline.cost, "speedup": result.speedup})
    inputs, refs = lowered.make_case(np.random.default_rng(977))  # fresh inputs
    reload_error = relative_error(load_program(folder).run(*inputs), refs)
    lowered_params = {k: v for k, v in result.best.config.items() if v != "float32"}
    return {**row, "best_ms": result.best.cost * 1e3, "speedup": result.speedup, "error": result.error,
            "precision": " ".join(f"{k}={v}" for k, v in sorted(lowered_params.items())) or "all float32",
            "reload_error": reload_error}


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="mp_out")
    parser.add_argument("--m", type=int, default=24, help="max measurements per search (default 24)")
    parser.add_argument("--cases", default="gemm,gru", help="comma list of gemm, gru")
    parser.add_argument("--bounds", default="1e-3,1e-2")
    parser.add_argument("--eight-bit", action="store_true",
                        help="the GEMM's A and B may be e4m3 or e5m2 (scaled per tensor, the 8-bit wgmma program); "
                             "torch's e4m3 _scaled_mm is timed too")
    parser.add_argument("--wgmma", action="store_true",
                        help="the GEMM's 16-bit pairs with float32 sums run the wgmma kernel (its own tile pick) "
                             "instead of the --gemm-tensor-core tile")
    parser.add_argument("--gru-schedule", default="fuse_step=1,step_j=32,step_b=4,step_k=64,step_ks=8",
                        help="the GRU's knobs over its default config (k=v,...; default: the split-K fused "
                             "step kernel)")
    # mma.sync tiles (what ``--tensor-core auto`` picks for these shapes; H100, 2026-11-23: 390
    # TFLOP/s at 4096^3 against WMMA's 345-358, 8.0 us at 64x3072x1024): 128x128x32, 4 warps of
    # 64x64, 4 cp.async stages, swizzled, for the GEMM and the GRU's input GEMM (8192x3072x1024);
    # 16x64x64 in 16-row tiles for the GRU's per-step hidden GEMM (64x3072x1024).
    hidden_tile = ("mma_warps_m=1,mma_warps_n=2,mma_frags_m=1,mma_frags_n=2,mma_k_frags=4,mma_stages=4,"
                   "mma_swizzle=1,mma_frag_buffers=2,mma_raster=0,mma_out_smem=1,mma_split_k=1")
    tile_help = ("tensor-core tile for {} (where both operands are float16 or both bfloat16 on mma.sync, float16 "
                 "on WMMA): mma / wmma (that kernel's 128x128x32 tile), mma_ or tc_ knobs as k=v,..., auto "
                 "(picked for the shape) or none")
    parser.add_argument("--gemm-tensor-core", default="mma", help=tile_help.format("the GEMM"))
    parser.add_argument("--gru-in-tensor-core", default="mma", help=tile_help.format("the GRU's input GEMM"))
    parser.add_argument("--gru-hid-tensor-core", default=hidden_tile,
                        help=tile_help.format("the GRU's hidden GEMM (unfused schedules)"))
    return parser


def main() -> int:
    args = arguments().parse_args()
    os.makedirs(args.out, exist_ok=True)
    target = resolve_target("cuda")
    wanted = args.cases.split(",")
    rows = []
    for label, base, schedule in cases(target, args):
        if label.split()[0].lower() not in wanted:
            continue
        vendor = vendor_ms(label, args.eight_bit)
        print(f"[{label}] torch float32 {vendor['vendor_fp32_ms']:.3f} ms, float16 {vendor['vendor_fp16_ms']:.3f} ms",
              flush=True)
        for eb in (float(b) for b in args.bounds.split(",")):
            try:
                rows.append({**run_case(label, base, schedule, target, eb, args), **vendor})
            except Exception as exc:  # one failed case must not hide the others
                traceback.print_exc()
                rows.append({"case": label, "eb": eb, "error_msg": f"{type(exc).__name__}: {exc}"[:200]})
            with open(os.path.join(args.out, "mixed_precision.json"), "w") as fh:
                json.dump(rows, fh, indent=1, default=str)
    body = []
    for r in rows:
        if "error_msg" in r:
            body.append([r["case"], f"{r['eb']:g}", "-", "-", "-", "-", "-", "-", "-", r["error_msg"], "-", "-", "-",
                         "-", "-", "-", "-"])
            continue
        body.append([r["case"], f"{r['eb']:g}", f"{r['fp32_ms']:.3f}", f"{r['best_ms']:.3f}", f"{r['speedup']:.2f}",
                     f"{r['error']:.2e}", f"{r['reload_error']:.2e}", f"{r['measured']} ({r['new']} new)",
                     r["kept"], r["precision"], r.get("vendor_fp32_cells", "-"), f"{r['vendor_fp32_ms']:.3f}",
                     f"{r.get('vendor_fp32_error', float('nan')):.2e}", r.get("vendor_fp16_cells", "-"),
                     f"{r['vendor_fp16_ms']:.3f}", f"{r.get('vendor_fp16_error', float('nan')):.2e}",
                     f"{r['vendor_fp16_ms'] / r['best_ms']:.2f}"])
    print(table("Mixed-precision search (method 003) vs the all-fp32 program and torch at its best",
                ["case", "eb", "fp32 ms", "chosen ms", "speedup", "error", "error, reloaded program on fresh inputs",
                 "configs measured", "stages kept", "lowered parameters",
                 "torch fp32 ms per call / back-to-back / graph", "torch fp32 best ms", "torch fp32 error",
                 "torch fp16 ms per call / back-to-back / graph", "torch fp16 best ms", "torch fp16 error",
                 "torch fp16 best / chosen"], body))
    for r in rows:
        if "vendor_e4m3_ms" in r and "best_ms" in r:
            print(f"{r['case']} eb={r['eb']:g}: torch e4m3 _scaled_mm {r['vendor_e4m3_cells']} ms (best "
                  f"{r['vendor_e4m3_ms']:.3f}, error {r['vendor_e4m3_error']:.2e}); chosen / it "
                  f"{r['vendor_e4m3_ms'] / r['best_ms']:.2f}")
    for r in rows:
        if "stage_ms" in r:
            print(f"{r['case']} eb={r['eb']:g}: fp32 stage times (ms) {r['stage_ms']}; search {r['secs']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
