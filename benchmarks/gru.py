"""GRU inference on the GPU: our CUDA layer (patent 004 + step fusion) vs torch.nn.GRU (cuDNN), fp32 or fp16.

Run through the device tool (see ../shared/DEVICE.md):
    source .tvm-device/boot.sh && python benchmarks/gru.py --out $OUT
T=128, input size = hidden size: B1 H256, B8 H512, B64 H1024, and bidirectional B8 H512; and two
hidden sizes no tuned tile divides: B5 H200 T129, and B3 H33 T7 with 3 bidirectional layers;
B16 H512 T64 (the GRU model's layer) and B32 H512.
Each case: torch's output and a float64 numpy reference first; then a short hand-picked
search over our knobs (patent pipeline, cell block, step fusion tiles), every candidate
checked against both before it is timed.  Timing protocol (``benchmarks/common.py``): cuDNN
per call, back to back and replayed from a CUDA graph (its best is the baseline of the
ratio), ours back to back (``time_ours`` around the layer's executor), the same CUDA events,
inputs resident on both sides (one input set: the layer's executor owns its buffers; x is
at most 32 MB and the weights, which both sides keep on the GPU, dominate).  Records go to
--out as they are measured; a markdown table is printed last.  ``--dry-run`` only generates the CUDA
source of every candidate (no GPU, no torch): the check this script still builds.

``--precision float16`` (or bfloat16): both sides store x, the weights, h, gi and the output
in that type and accumulate in float32 (torch: the module and x cast with ``.to(dtype)``,
cuDNN's half-precision path; ours: ``GRU.build(precision=...)``, every gate sum and the cell
in float32).  Both errors are against float64 of the unrounded float32 weights and input,
and a candidate passes at 1e-2 (method 003's bound) instead of fp32's 1e-4.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import table, time_ours, time_vendor, vendor_cells, vendor_header  # noqa: E402

from tvm_ext.schedules.gru import GRU, GruTemplate, gru_reference  # noqa: E402
from tvm_ext.core.space import Config  # noqa: E402
from tvm_ext.target import TargetInfo, offline_cuda, resolve_target  # noqa: E402

SEQ = 128
# --precision: the stored tensors in the low type, accumulation and the cell in float32
LOW_PRECISION_TENSORS = ("x", "w_ih", "gi", "w_hh", "h", "out")
MAX_ERROR = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}


def precision_of(dtype: str) -> dict[str, str]:
    """``GRU.build``'s precision for a run in ``dtype`` (empty: all float32)."""
    return {} if dtype == "float32" else {name: dtype for name in LOW_PRECISION_TENSORS}


@dataclass(frozen=True)
class Case:
    label: str
    batch: int
    hidden: int
    bidirectional: bool = False
    seq: int = SEQ
    layers: int = 1

    def template(self) -> GruTemplate:
        return GruTemplate(batch=self.batch, hidden=self.hidden, input=self.hidden, seq=self.seq,
                           layers=self.layers, bidirectional=self.bidirectional)


CASES = (Case("B1 H256", 1, 256), Case("B8 H512", 8, 512), Case("B64 H1024", 64, 1024),
         Case("B8 H512 bidirectional", 8, 512, True),
         # batches between the flag-exchange kernel's pick limit and the many-rows tiles (the
         # GRU model's layer: B16 H512 T64)
         Case("B16 H512 T64", 16, 512, seq=64), Case("B32 H512", 32, 512),
         # hidden sizes no tuned tile divides (the k split is padded)
         Case("B5 H200 T129", 5, 200, seq=129), Case("B3 H33 T7 3 layers bidirectional", 3, 33, True, seq=7, layers=3))


def candidates(template: GruTemplate, target: TargetInfo, count: int) -> list[Config]:
    """The patent's default first, then step-fusion tiles, per-step GEMM tiles and a smaller
    cell block, alternating (feasible and unique only); each fused tile is tried as a
    persistent kernel (step_loop 2; where its grid cannot all be resident, with the step
    loop in TVM's host code, 1) and with one Python call per step (0)."""
    base = template.default_config(target)
    pick = template.analytic_pick(target)[0]
    step_b = min(8, 1 << max(0, (template.batch - 1).bit_length()))
    wide_b = min(16, 1 << max(0, (template.batch - 1).bit_length()))
    # W_hh on chip (small batch): every block holds all batch rows of its units and their W
    # slice in shared memory, which the persistent kernel fills once for all T steps
    onchip = [base.replace(fuse_step=1, step_j=j, step_b=wide_b, step_k=64, step_ks=ks, step_w_onchip=1)
              for j, ks in ((8, 8), (16, 8), (8, 4), (16, 4), (32, 4), (32, 8))] if template.batch <= 16 else []
    latency = dict(step_barrier=2, step_prefetch=1)  # the acquire barrier, gi a step ahead
    # blocks of 32 rows (large batch): 4-16 units, a thread's share of them in registers (step_u)
    rows32 = [pick.replace(step_tc=0, step_flags=0, fuse_step=1, step_j=j, step_u=u, step_b=b, step_bt=32 // b,
                           step_k=k, step_ks=256 * b // (32 * j), step_w_onchip=1, step_pipeline=1, step_loop=2,
                           **latency)
              for j, u, b, k in ((8, 2, 4, 32), (16, 1, 8, 32), (4, 1, 4, 64), (8, 1, 4, 64), (2, 2, 4, 64),
                                 (4, 4, 4, 32))] if template.batch >= 32 else []
    # the tensor-core persistent step kernel (16-bit h and W_hh; the space refuses it otherwise)
    tensor_core = [base.replace(fuse_step=1, step_loop=2, step_barrier=2, step_tc=1, step_j=j, step_tc_rows=rows,
                                step_tc_kw=kw)
                   for j, rows, kw in ((16, 16, 1), (32, 16, 2), (16, 16, 8), (16, 16, 4), (16, 32, 2), (16, 32, 4),
                                       (16, 32, 8), (32, 16, 4), (32, 16, 8), (16, 64, 4), (32, 32, 4), (16, 16, 2),
                                       (32, 64, 4))]
    # the flag-exchange persistent step kernel (batch <= 32; no grid barrier)
    flags = [base.replace(fuse_step=1, step_loop=2, step_flags=1, step_flag_units=u) for u in (4, 8, 16)]
    # its blocks as one thread-block cluster a direction, h through distributed shared memory (sm_90+)
    clusters = [pick.replace(fuse_step=1, step_loop=2, step_tc=0, step_flags=2, step_flag_units=u)
                for u in (32, 16, 8, 4)]
    # the tensor-core kernel exchanging h through tagged words instead of a grid barrier
    tensor_core_flags = [base.replace(fuse_step=1, step_loop=2, step_tc=1, step_flags=1, step_j=j, step_tc_rows=rows,
                                      step_tc_kw=kw)
                         for j, rows, kw in ((16, 16, 2), (16, 16, 4), (16, 32, 2), (16, 16, 1), (16, 64, 2))]
    # the tensor-core kernel with warps splitting the units (no partial sums; W unpadded, so
    # 32 units fit with 16 rows at H1024: half the h a block reads a step of 32-row blocks)
    unit_warps = [pick.replace(fuse_step=1, step_loop=2, step_barrier=2, step_tc=1, step_flags=flags, step_j=j,
                               step_tc_rows=16, step_tc_kw=kw, step_tc_nw=nw)
                  for j, kw, nw, flags in ((32, 1, 4, 1), (32, 2, 2, 1), (16, 2, 2, 1), (32, 1, 4, 0), (32, 1, 2, 1),
                                           (16, 1, 2, 1))]
    picks = [
        base,
        pick,  # GRU.build without a config
        *clusters,
        *unit_warps,
        # (no step launched early: it needs the GEMM on wgmma, counting its rows)
        pick.replace(in_split=0, step_overlap=0),  # the pick with the input GEMM on the CUDA cores (float32)
        pick.replace(in_split=1, step_overlap=0),  # split on an mma.sync tile (where the pick has wgmma)
        pick.replace(in_split=2),  # float16 parts on wgmma (where the pick has TF32 parts)
        pick.replace(in_wgmma=0, step_overlap=0),  # float16: the input GEMM on its mma.sync tile (the pick's: wgmma)
        *rows32,
        *tensor_core_flags,
        *flags,
        *tensor_core,
        pick.replace(step_w_onchip=2) if pick.fuse_step and pick.step_bt == 1 else pick,  # W_hh in registers
        base.replace(fuse_step=1, step_j=8, step_b=8, step_bt=8, step_k=64, step_ks=4, step_w_onchip=1,
                     step_pipeline=1, **latency),  # blocks of 64 rows sharing the W slice (large batch)
        base.replace(fuse_step=1, step_j=32, step_b=1, step_k=64, step_ks=8, **latency),
        base.replace(fuse_step=1, step_j=16, step_b=2, step_k=64, step_ks=8, **latency),
        *onchip,
        # split-K step kernels (step_ks threads per dot product): more warps in flight
        base.replace(fuse_step=1, step_j=32, step_b=min(step_b, 4), step_k=64, step_ks=8),
        base.replace(fuse_step=1, step_j=32, step_b=wide_b, step_k=64, step_ks=4),
        # narrow blocks: more of them share each step's work (persistent grids up to the SM count)
        base.replace(fuse_step=1, step_j=16, step_b=min(step_b, 2), step_k=64, step_ks=8),
        base.replace(fuse_step=1, step_j=16, step_b=1, step_k=64, step_ks=8),
        base.replace(fuse_step=1, step_j=16, step_b=min(step_b, 4), step_k=64, step_ks=8),
        base.replace(fuse_step=1, step_j=64, step_b=1, step_k=64, step_ks=8),  # one row: no W reuse, 2x the blocks
        base.replace(fuse_step=1, step_j=64, step_b=1, step_k=64, step_ks=4),
        base.replace(fuse_step=1, step_j=64, step_b=step_b, step_k=32, step_ks=4),
        base.replace(fuse_step=1, step_j=32, step_b=step_b, step_k=32, step_ks=4),
        base.replace(fuse_step=1, step_j=32, step_b=1, step_k=64, step_ks=8),
        base.replace(fuse_step=1, step_j=32, step_b=min(step_b, 2), step_k=64, step_ks=8),
        base.replace(fuse_step=1, step_j=32, step_b=step_b, step_k=64, step_ks=8),
        base.replace(fuse_step=1, step_j=64, step_b=min(step_b, 4), step_k=64, step_ks=8),
        base.replace(fuse_step=1, step_j=64, step_b=1, step_k=32),
        base.replace(hid_wg_x=16, hid_wg_y=8, hid_task_x=4, hid_task_y=4, hid_k_step=16),
        base.replace(fuse_step=1, step_j=128, step_b=min(step_b, 2), step_k=32),
        base.replace(hid_wg_x=32, hid_wg_y=4, hid_task_x=2, hid_task_y=2, hid_k_step=16),
        base.replace(fuse_step=1, step_j=32, step_b=min(step_b, 4), step_k=64),
        base.replace(cell_block=128),
        base.replace(fuse_step=1, step_j=256, step_b=step_b, step_k=16),
        # few, wide blocks: grids small enough for the persistent kernel at large batch
        base.replace(fuse_step=1, step_j=64, step_b=wide_b, step_k=64, step_ks=4),
        base.replace(fuse_step=1, step_j=128, step_b=wide_b, step_k=32, step_ks=2),
    ]
    space = template.space(target)
    out: list[Config] = [base] if space.is_feasible(base) else []
    for cfg in picks:
        variants = [cfg]
        if cfg.step_loop:  # set by the pick or above: as it is
            pass
        elif cfg.step_w_onchip:  # only the persistent kernel keeps W on chip across steps
            variants = [cfg.replace(step_loop=2)]
        elif cfg.fuse_step:  # the host loop (1) only where the persistent grid does not fit
            persistent = cfg.replace(step_loop=2)
            variants = [persistent if space.is_feasible(persistent) else cfg.replace(step_loop=1), cfg]
        for variant in variants:
            if variant not in out and space.is_feasible(variant):
                out.append(variant)
    return out[:count]


def short(cfg: Config) -> str:
    split = ("", " + input GEMM as float16 parts", " + input GEMM as float16 parts on wgmma",
             " + input GEMM as TF32 parts on wgmma")[cfg.in_split]
    return _step(cfg) + split + (" + input GEMM on wgmma" if cfg.in_wgmma else "")


def _step(cfg: Config) -> str:
    if cfg.fuse_step and cfg.step_tc:
        exchange = " flags" if cfg.step_flags else ""
        units = f" nw={cfg.step_tc_nw}" if cfg.step_tc_nw > 1 else ""
        return (f"tensor-core step j={cfg.step_j} rows={cfg.step_tc_rows} kw={cfg.step_tc_kw}{units}{exchange} "
                "persistent")
    if cfg.fuse_step and cfg.step_flags:
        return f"flag-exchange step units={cfg.step_flag_units} persistent"
    if cfg.fuse_step:
        loop = ("", " host-loop", " persistent")[cfg.step_loop]
        onchip = ("", " W on chip", " W in registers")[cfg.step_w_onchip]
        more = "".join(f" {name}={cfg.as_dict()['step_' + name]}"
                       for name in ("u", "bt", "pipeline", "prefetch", "barrier")
                       if cfg.as_dict()["step_" + name] != (1 if name in ("u", "bt") else 0))
        return f"fused step j={cfg.step_j} b={cfg.step_b} k={cfg.step_k} ks={cfg.step_ks}{more}{onchip}{loop}"
    return (f"patent cell_block={cfg.cell_block} "
            f"hid_gemm={cfg.hid_wg_x}x{cfg.hid_wg_y}/{cfg.hid_task_x}x{cfg.hid_task_y}")


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(np.asarray(a, np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


def dry_run(args: argparse.Namespace) -> None:
    target = offline_cuda()
    for case in selected(args):
        template = case.template().with_precision(precision_of(args.precision)).with_tensor_cores(target)
        for cfg in candidates(template, target, args.candidates):
            start = time.perf_counter()
            source = template.compile(cfg, target).source
            print(f"{case.label}: {short(cfg)}: CUDA source {len(source)} chars, "
                  f"{source.count('__global__')} kernels, {time.perf_counter() - start:.1f} s", flush=True)


def selected(args: argparse.Namespace) -> list[Case]:
    """The cases named by --cases (labels, spaces as underscores: b8_h512_bidirectional)."""
    if not args.cases:
        return list(CASES)
    wanted = {c.strip().lower() for c in args.cases.split(",")}
    return [c for c in CASES if c.label.lower().replace(" ", "_") in wanted]


def run_case(case: Case, args: argparse.Namespace, target: TargetInfo, log: Any) -> list[Any]:
    import torch

    torch.manual_seed(0)
    net = torch.nn.GRU(case.hidden, case.hidden, num_layers=case.layers, bidirectional=case.bidirectional).cuda().eval()
    x = torch.randn(case.seq, case.batch, case.hidden, device="cuda")
    x_np = x.cpu().numpy()
    state = {k: v.detach().cpu().numpy() for k, v in net.state_dict().items()}  # float32: the reference's
    low = args.precision != "float32"
    if low:  # cuDNN's half-precision GRU on the same weights and input, rounded once
        net, x = net.to(getattr(torch, args.precision)), x.to(getattr(torch, args.precision))
    with torch.no_grad():
        torch.backends.cudnn.allow_tf32 = False
        ref_out, ref_h = (t.float().cpu().numpy() for t in net(x))
        vendor = time_vendor(lambda i: net(x))
        torch.backends.cudnn.allow_tf32 = True
        vendor_tf32 = vendor if low else time_vendor(lambda i: net(x))  # TF32 only acts on float32
        tf32_out, tf32_h = (t.float().cpu().numpy() for t in net(x))
        torch.backends.cudnn.allow_tf32 = False
    cudnn, cudnn_tf32 = vendor.best.seconds, vendor_tf32.best.seconds  # each at its best of three
    ref64_out, ref64_h = gru_reference(x_np, state, None, case.layers, case.bidirectional)
    torch_err = max(rel_err(ref_out, ref64_out), rel_err(ref_h, ref64_h))
    tf32_err = max(rel_err(tf32_out, ref64_out), rel_err(tf32_h, ref64_h))
    print(f"[{case.label}] cuDNN {args.precision} per call / back-to-back / graph: "
          f"{' / '.join(vendor_cells(vendor))} ms, rel err vs float64 {torch_err:.2e} "
          f"(TF32 allowed: best {cudnn_tf32 * 1e3:.3f} ms, rel err {tf32_err:.2e})", flush=True)

    template = case.template().with_precision(precision_of(args.precision)).with_tensor_cores(target)
    results = []
    start = time.perf_counter()
    for cfg in candidates(template, target, args.candidates):
        if time.perf_counter() - start > args.budget and results:
            print(f"[{case.label}] search budget {args.budget:g} s spent", flush=True)
            break
        row: dict[str, Any] = {"case": case.label, "config": cfg.as_dict(), "cudnn_s": cudnn,
                               "cudnn_tf32_s": cudnn_tf32, "cudnn_cells": vendor_cells(vendor),
                               "cudnn_err_vs_f64": torch_err, "cudnn_tf32_err_vs_f64": tf32_err}
        try:
            t0 = time.perf_counter()
            gru = GRU.build(target, case.hidden, case.hidden, num_layers=case.layers,
                            bidirectional=case.bidirectional, batch=case.batch, seq=case.seq,
                            config=cfg, precision=precision_of(args.precision)).load_numpy(state)
            out, h_n = gru(x_np)  # the first call also compiles the kernels (NVRTC)
            row["build_s"] = time.perf_counter() - t0
            row["err_vs_torch"] = max(rel_err(out, ref_out), rel_err(h_n, ref_h))
            row["err_vs_f64"] = max(rel_err(out, ref64_out), rel_err(h_n, ref64_h))
            if not row["err_vs_f64"] <= MAX_ERROR[args.precision]:
                row["error"] = f"wrong answer: rel err {row['err_vs_f64']:.2e} vs float64"
            else:
                row["ours_s"] = time_ours(lambda i, gru=gru: gru.executor.run()).seconds
                row["ours_wall_s"] = gru.time(x_np)
        except Exception as exc:  # a candidate that fails is a row, not the end of the run
            last = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ""
            row["error"] = f"{type(exc).__name__}: {last}"
        log.write(json.dumps(row) + "\n")
        log.flush()
        shown = (f"{row['ours_s'] * 1e3:.3f} ms (wall {row['ours_wall_s'] * 1e3:.3f})" if "ours_s" in row
                 else row["error"])
        print(f"[{case.label}] {short(cfg)}: {shown}", flush=True)
        results.append((cfg, row))
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out", help="folder for the JSON-lines records")
    p.add_argument("--candidates", type=int, default=40, help="configs tried per case (default 40)")
    p.add_argument("--budget", type=float, default=90.0, help="seconds of search per case (default 90)")
    p.add_argument("--cases", default="",
                   help="comma-separated cases, e.g. b1_h256,b8_h512_bidirectional (default: all)")
    p.add_argument("--precision", default="float32", choices=sorted(MAX_ERROR),
                   help="type of the stored tensors on both sides (accumulation in float32; default float32)")
    p.add_argument("--dry-run", action="store_true", help="only generate CUDA source (no GPU needed)")
    args = p.parse_args()
    if args.dry_run:
        dry_run(args)
        return
    os.makedirs(args.out, exist_ok=True)
    target = resolve_target("cuda", 0)
    rows = []
    suffix = "" if args.precision == "float32" else f"_{args.precision}"
    with open(os.path.join(args.out, f"gru_cuda{suffix}.jsonl"), "a") as log:
        for case in selected(args):
            results = run_case(case, args, target, log)
            timed = [(cfg, r) for cfg, r in results if "ours_s" in r]
            cudnn = results[0][1]["cudnn_s"] if results else float("nan")
            tf32 = results[0][1]["cudnn_tf32_s"] if results else float("nan")
            tf32_err = f"{results[0][1]['cudnn_tf32_err_vs_f64']:.1e}" if results else "-"
            default = next((r for cfg, r in results if cfg == results[0][0] and "ours_s" in r), None)
            cells = results[0][1]["cudnn_cells"] if results else ["-"] * 4
            cudnn_err = f"{results[0][1]['cudnn_err_vs_f64']:.1e}" if results else "-"
            if not timed:
                rows.append([case.label, *cells, f"{tf32 * 1e3:.3f}", tf32_err, "failed", "-", "-", "-", "-", cudnn_err,
                             "-"])
                continue
            cfg, best = min(timed, key=lambda cr: cr[1]["ours_s"])
            per_call = [r["ours_s"] for c, r in timed if not (c.fuse_step and c.step_loop)]
            rows.append([case.label, *cells, f"{tf32 * 1e3:.3f}", tf32_err, f"{best['ours_s'] * 1e3:.3f}",
                         f"{cudnn / best['ours_s']:.2f}",
                         f"{default['ours_s'] * 1e3:.3f}" if default else "failed",
                         f"{min(per_call) * 1e3:.3f}" if per_call else "-",
                         f"{best['err_vs_f64']:.1e}", cudnn_err, short(cfg)])
    print()
    print(table(f"GRU inference {args.precision}, input = hidden: ours (back-to-back) vs torch.nn.GRU (cuDNN) "
                "at its best", ["case", *vendor_header("ms", "cuDNN"), "cuDNN TF32-allowed best ms",
                 "cuDNN TF32 rel err vs f64", "ours ms",
                 "speed vs cuDNN best", "patent default ms", "best with a call per step ms",
                 "ours rel err vs f64", "cuDNN rel err vs f64", "best config"], rows))


if __name__ == "__main__":
    main()
