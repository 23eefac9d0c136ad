"""Tensor-core GEMM on the GPU: ``python -m tvm_ext.tune gemm-tc`` (the GA over the kernel,
mma.sync, WMMA or on Hopper wgmma, and its tile) against cuBLAS float16 (torch) in the same run.

Run through the device tool (see ../shared/DEVICE.md), about 7 minutes on an H100:
    source .tvm-device/boot.sh && python benchmarks/gemm_tensor_core.py --out $OUT
For each shape (float16 A, B and C, float32 accumulation): the zero-measurement pick
(``--strategy analytic``), then the tuning run (which resumes the pick from the same records
file), both through the CLI's own code; then torch.matmul on the same dtypes, timed call by
call, back to back on rotated inputs and replayed from a CUDA graph, compared at its best.
The tuned config is then built again and timed the same three ways on cuBLAS's own operands
(tensor-core clocks depend on the data: the tuner's figure, on its uniform inputs, is shown
beside it but is not the comparison).  Then the stable comparison: ours (the tuned config, or
with ``--no-tune`` the analytic pick built directly) against cuBLAS and cuBLASLt in ``--rounds``
interleaved rounds, each replayed from its CUDA graph on the same rotated operands, the SM
clock and power read after each round; the raw rounds go to --out/gemm_tc_rounds.jsonl and
the last table quotes the median of the per-round ratios first.  Records go to --out.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (compare_in_rounds, cublas_gemm, cublas_launches, gemm_operand_sets, ours_launch,  # noqa: E402
                    parse_knob_sets, parse_shapes, rounds_cells, rounds_header, table, time_ours_three,
                    vendor_methods)

from tvm_ext import tune  # noqa: E402
from tvm_ext.core.records import RecordStore  # noqa: E402
from tvm_ext.schedules.gemm.mma import MmaGemmTemplate, MmaTile  # noqa: E402
from tvm_ext.schedules.gemm.tensor_core import TensorCoreGemmTemplate  # noqa: E402
from tvm_ext.schedules.gemm.tensor_core_choice import TensorCoreChoiceTemplate  # noqa: E402
from tvm_ext.core.space import Config  # noqa: E402
from tvm_ext.target import resolve_target  # noqa: E402
from tvm_ext.schedules.gemm.wgmma import WgmmaTile  # noqa: E402
from tvm_ext.schedules.gemm.wmma import WmmaTile  # noqa: E402
from tvm_ext.core.template import Workload  # noqa: E402

SHAPES = {"4096": (4096, 4096, 4096), "8192": (8192, 8192, 8192), "2048": (2048, 2048, 2048),
          "gru_in": (8192, 3072, 1024), "gru_hid": (64, 3072, 1024), "gru_hid8": (8, 1536, 512)}
DEFAULT_SHAPES = ",".join(SHAPES)
SHAPES.update({"bert_proj": (1024, 768, 768), "bert_ffn_up": (1024, 3072, 768),  # BERT-base, batch 8 x 128
               "bert_ffn_down": (1024, 768, 3072)})
LABELS = {"4096": "4096³", "8192": "8192³", "2048": "2048³", "gru_in": "GRU input 8192x3072x1024",
          "gru_hid": "GRU hidden 64x3072x1024", "gru_hid8": "GRU hidden 8x1536x512",
          "bert_proj": "BERT 1024x768x768", "bert_ffn_up": "BERT 1024x3072x768", "bert_ffn_down": "BERT 1024x768x3072"}
TEMPLATES = {"any": TensorCoreChoiceTemplate, "mma": MmaGemmTemplate, "wmma": TensorCoreGemmTemplate}


def ours_cell(ours: Any, vendor: Any, flops: float) -> str:
    """'per call / back-to-back / graph ms (TFLOP/s at our best; best/best and graph/graph
    ratios to cuBLAS)'."""
    three = " / ".join(f"{t.seconds * 1e3:.4f}" if t else "-" for _, t in vendor_methods(ours))
    graphs = f", graph/graph {vendor.graph.seconds / ours.graph.seconds:.2f}" if ours.graph and vendor.graph else ""
    return f"{three} ({flops / ours.best.seconds / 1e12:.0f}; best/best {vendor.best.seconds / ours.best.seconds:.2f}" \
           f"{graphs})"


def label(template: Any, config: dict) -> str:
    """The tile of a record's config: '128x128x32 w2x2 s4 swz fb2 r0 smem k1' or 'wmma 128x256x32 8w p2'."""
    cfg = Config.of(config)
    kernel = "mma"
    if isinstance(template, TensorCoreChoiceTemplate):
        kernel, cfg = template.kernel_config(cfg)
    elif isinstance(template, TensorCoreGemmTemplate):
        kernel = "wmma"
    if kernel == "mma":
        return "mma " + MmaTile.of(cfg).label()
    if kernel == "wgmma":
        return WgmmaTile.of(cfg).name
    t = WmmaTile.of(cfg)
    return f"wmma {t.block_m}x{t.block_n}x{t.block_k} {t.warps}w p{t.pipeline}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES,
                   help=f"comma-separated: MxNxK (e.g. 1024x768x3072), N for N³, or of {', '.join(SHAPES)}")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"), help="A, B and C")
    p.add_argument("--kernel", default="any", choices=tuple(TEMPLATES))
    p.add_argument("--no-tune", action="store_true",
                   help="no tuning: compare the analytic pick, built directly (no records, no workers)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of ours against the vendors (>= 1)")
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--population", type=int, default=12)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--tma", default="off", choices=("off", "on", "both"),
                   help="a wgmma config's stages loaded by the TMA (wgmma_tma): as picked or tuned (off), set "
                        "(on), or both kernels in the same rounds (both: ours by cp.async, its TMA twin a peer)")
    p.add_argument("--ws", action="store_true",
                   help="also the wgmma config warp-specialized (wgmma_ws: TMA loads, C from registers) in the rounds")
    p.add_argument("--peers", default="",
                   help="more wgmma configs in the same rounds, each the pick with knobs changed: "
                        "'label:knob=v,knob=v;label2:...' (e.g. mc:wgmma_ws=1,wgmma_multicast=1)")
    p.add_argument("--out", default="bench_out")
    args = p.parse_args(argv)
    try:
        args.peers = parse_peers(args.peers)
    except ValueError as exc:
        p.error(str(exc))
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.kernel == "wmma" and args.dtype != "float16":
        p.error("--kernel wmma takes float16 operands only")
    return args


def tuned(template: Any, name: str, m: int, n: int, k: int, target: Any, args: argparse.Namespace) -> dict:
    """The analytic pick and the tuning run through the CLI (one records file): the pick's
    record, every record of the workload, the ok ones, wall seconds and the CLI's exit."""
    suffix = "" if args.dtype == "float16" else f"_{args.dtype}"  # float16 keeps its records file
    records = os.path.join(args.out, f"gemm_tc_{name}{suffix}.jsonl")
    common = ["gemm-tc", "--shape", f"{m},{n},{k}", "--in-dtype", args.dtype, "--out-dtype", args.dtype,
              "--target", "cuda", "--kernel", args.kernel, "--records", records, "--no-progress",
              "--workers", str(args.workers)]
    start = time.time()
    tune.main(common + ["--strategy", "analytic"])
    pick = [r for r in RecordStore(records) if r.ok]
    code = tune.main(common + ["--generations", str(args.generations), "--population", str(args.population)])
    recs = RecordStore(records).for_workload(Workload.of(template, target).key)
    return {"pick": pick[0] if pick else None, "recs": recs, "ok": [r for r in recs if r.ok],
            "wall": time.time() - start, "code": code}


def with_knob(config: dict, knob: str, value: int) -> dict | None:
    """``config`` with ``knob`` set to ``value`` where it names a wgmma kernel with that knob."""
    if knob not in config or config.get("tc_kernel", "wgmma") != "wgmma":
        return None
    return {**config, knob: value}


def parse_peers(text: str) -> dict[str, dict[str, int]]:
    """``--peers``: 'label:knob=v,knob=v;...' -> {label: {knob: v}} (``common.parse_knob_sets``)."""
    return parse_knob_sets(text, "--peers")


def failure(exc: Exception) -> str:
    text = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"failed: {(text[-1] if text else type(exc).__name__)[:80]}"


def main() -> int:
    args = parse_args()
    shapes = parse_shapes(args.shapes, SHAPES)
    if shapes is None:
        return 2
    os.makedirs(args.out, exist_ok=True)
    from tvm_ext.core.session import analytic_pick

    target = resolve_target("cuda")
    rows, round_rows, notes = [], [], []
    for name, (m, n, k) in shapes:
        shape = LABELS.get(name, name)
        template = TEMPLATES[args.kernel](m, n, k, a_dtype=args.dtype, b_dtype=args.dtype, c_dtype=args.dtype)
        flops = template.flops()
        run = None if args.no_tune else tuned(template, name, m, n, k, target, args)
        sets = gemm_operand_sets(m, n, k, args.dtype)
        times, vendor_err = cublas_gemm(sets)
        vendor = times.best.seconds  # cuBLAS at its best of the three methods
        shown = [f"{t.seconds * 1e3:.4f} ({flops / t.seconds / 1e12:.0f})" if t else method
                 for method, t in vendor_methods(times)]
        if run is not None and not run["ok"]:
            rows.append([shape, "-", *shown, f"{vendor_err:.1e}", "-", "-", "-", "-", "-",
                         f"{len(run['recs'])} (all failed)", "-", f"{run['wall']:.0f}", str(run["code"])])
            continue
        if run is None:
            config = analytic_pick(template.for_target(target), target)[0].as_dict()
        else:
            best = min(run["ok"], key=lambda r: r.cost)
            config = best.config

        def cell(rec: Any, flops: float = flops, vendor: float = vendor) -> str:
            return f"{rec.cost * 1e3:.4f} ({flops / rec.cost / 1e12:.0f}, {vendor / rec.cost:.2f})" if rec else "-"

        median = "-"
        with_tma = with_knob(config, "wgmma_tma", 1)
        if args.tma != "off" and with_tma is not None:  # both: ours the cp.async kernel, its TMA twin a peer
            config = with_tma if args.tma == "on" else with_knob(config, "wgmma_tma", 0)
        try:
            launch, ours_err = ours_launch(template, config, target, sets)
            same, same_err = ours_cell(time_ours_three(launch, len(sets)), times, flops), f"{ours_err:.1e}"
            peers = {}
            if args.tma == "both" and with_tma is not None:
                peers["tma"], tma_err = ours_launch(template, with_tma, target, sets)
                notes.append(f"{shape}: ours with TMA loads ({label(template, with_tma)}): error {tma_err:.1e}")
            specialized = with_knob(config, "wgmma_ws", 1)
            if args.ws and specialized is not None:  # the warp-specialized twin (TMA loads, C from registers)
                specialized = {**specialized, "wgmma_tma": 1, "wgmma_smem_epilogue": 0}
                peers["ws"], ws_err = ours_launch(template, specialized, target, sets)
                notes.append(f"{shape}: ours warp-specialized ({label(template, specialized)}): error {ws_err:.1e}")
            for peer_label, changes in args.peers.items():
                peer = {**config, **changes} if config.get("tc_kernel", "wgmma") == "wgmma" else None
                if peer is None:
                    notes.append(f"{shape}: peer {peer_label} left out: the config is no wgmma kernel's")
                    continue
                try:
                    peers[peer_label], peer_err = ours_launch(template, peer, target, sets)
                    notes.append(f"{shape}: peer {peer_label} ({label(template, peer)}): error {peer_err:.1e}")
                except Exception as exc:  # an infeasible peer is reported, the rounds go on
                    notes.append(f"{shape}: peer {peer_label} left out: {failure(exc)}")
            summaries, left_out = compare_in_rounds(
                shape, launch, cublas_launches(sets, lt=True), len(sets), args.rounds,
                os.path.join(args.out, "gemm_tc_rounds.jsonl"), peers=peers, dtype=args.dtype,
                config=label(template, config), tuned=run is not None)
            median = ", ".join(f"{s.median:.3f} ({s.vendor})" for s in summaries)
            round_rows += [[shape, *rounds_cells(s)] for s in summaries]
            notes += [f"{shape}: {vendor_name} left out of the rounds: {why}" for vendor_name, why in left_out.items()]
        except Exception as exc:  # reported in the table, never the end of the run
            same, same_err = failure(exc), "-"
        if run is None:
            rows.append([shape, median, *shown, f"{vendor_err:.1e}", "-", "-", same, same_err,
                         label(template, config), "0 (analytic pick, not tuned)", "-", "-", "-"])
        else:
            err = best.metrics.get("rel_error")
            trial_of_best = next(i for i, r in enumerate(run["recs"], 1) if r is best)
            rows.append([shape, median, *shown, f"{vendor_err:.1e}", cell(run["pick"]), cell(best), same,
                         same_err if same_err != "-" else (f"{err:.1e}" if err is not None else "-"),
                         label(template, config), f"{len(run['recs'])} ({len(run['recs']) - len(run['ok'])} failed)",
                         str(trial_of_best), f"{run['wall']:.0f}", str(run["code"])])
        print(rows[-1], flush=True)
    ours = "analytic pick" if args.no_tune else "tuned"
    print(table(f"Tensor-core GEMM ({args.dtype} A, B, C; float32 accumulation) vs cuBLAS {args.dtype}",
                ["shape", f"{ours} / vendor: median of {args.rounds} rounds", "cuBLAS per call ms (TFLOP/s)",
                 "cuBLAS back-to-back", "cuBLAS CUDA graph", "cuBLAS rel err vs f64",
                 "analytic pick ms (TFLOP/s, of cuBLAS best), tuner's inputs", "tuned ms, tuner's inputs",
                 f"{ours} on cuBLAS's operands: per call / back-to-back / graph ms (TFLOP/s; of cuBLAS)",
                 f"{ours} rel err vs f64", f"{ours} config", "configs measured", "trial of the best",
                 "analytic + tuning s", "CLI exit"], rows))
    print()
    print(table(f"Stable comparison ({args.dtype}): {ours} against the vendor in {args.rounds} interleaved rounds, "
                "both replayed from CUDA graphs on the same rotated operands", ["shape", *rounds_header()],
                round_rows))
    for note in notes:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
