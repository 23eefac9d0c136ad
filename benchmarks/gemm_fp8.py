"""8-bit float GEMM on wgmma (``tune gemm-fp8``) against cuBLASLt's (``torch._scaled_mm``) in the
same run, both with per-tensor scales, float32 accumulate, float16 C.

Run through the device tool (see ../shared/DEVICE.md):
    source .tvm-device/boot.sh && python benchmarks/gemm_fp8.py --shapes 4096,8192 --rounds 5
For each shape: operands drawn randn in float32, each scaled into e4m3's range by its own
per-tensor scale (amax / 448) and rounded to e4m3, as a quantized model's are; cuBLASLt's
``torch._scaled_mm(A, Btᵀ, scale_a, scale_b)`` (its default, sums promoted, and
``use_fast_accum``) and cuBLAS's float16 GEMM on the same (rounded, scaled) values timed per
call, back to back and replayed from a CUDA graph on rotated operands; then ours at the
template's default (sums promoted every k step) and other tiles and promotions the same three
ways; every output against float64 of the 8-bit operands times their scales, ours on
NaN-poisoned outputs.  Then the stable comparison, each accumulation against its own: our
default against cuBLASLt's default and our fastest unpromoted tile against its fast
accumulation, in ``--rounds`` interleaved rounds, both replayed from CUDA graphs, the SM clock
and power read after each (raw rounds in --out/gemm_fp8_rounds.jsonl); the median of the
per-round ratios is the figure quoted.  ``--tma both``: every config also with its stages loaded
by the TMA, and the rounds take the fastest promoted config in place of the default; ``--promote
1``: only the configs promoting every k step (cuBLASLt's accuracy) and the default, the
rounds the fastest promoted of them; ``--tune-trials N``: each shape tuned too (in --promote's
class), its best among the configs timed.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (compare_in_rounds, l2_rotation, program_launch, rel_error_vs,  # noqa: E402
                    rounds_cells, rounds_header, rows_by_shape, scaled_e4m3, table, time_ours_three, time_vendor,
                    vendor_methods)

from tvm_ext import tune  # noqa: E402
from tvm_ext.core.records import RecordStore  # noqa: E402
from tvm_ext.core.space import Config  # noqa: E402
from tvm_ext.core.template import Workload  # noqa: E402
from tvm_ext.schedules.gemm.gemm_fp8 import Fp8GemmTemplate  # noqa: E402
from tvm_ext.schedules.gemm.wgmma import WgmmaTile  # noqa: E402

SHAPES = {"4096": (4096, 4096, 4096), "8192": (8192, 8192, 8192), "gru_in": (8192, 3072, 1024),
          "bert_ffn_up": (1024, 3072, 768), "bert_ffn_down": (1024, 768, 3072), "bert_proj": (1024, 768, 768)}
# tiles tried beside the default and the default with overlapped promotions: (bm, bn, stages, inflight,
# raster, tiles a block, k steps between promotions, promotions overlapped)
VARIANTS = ((128, 128, 6, 1, 8, 8, 2, 0), (128, 128, 6, 1, 8, 8, 4, 0), (128, 192, 4, 1, 8, 4, 1, 0),
            (64, 192, 6, 1, 8, 4, 1, 0), (128, 128, 6, 1, 8, 1, 1, 1), (128, 128, 4, 1, 8, 8, 1, 1),
            (128, 128, 4, 1, 8, 16, 1, 1), (128, 256, 4, 1, 8, 4, 0, 0), (128, 128, 6, 1, 8, 8, 0, 0),
            (128, 256, 4, 1, 8, 16, 0, 0), (128, 192, 4, 1, 8, 1, 1, 0), (128, 192, 5, 1, 8, 1, 1, 0),
            (128, 192, 5, 1, 8, 2, 1, 0))


def fp8_sets(m: int, n: int, k: int) -> list[dict[str, Any]]:
    """Rotated operand sets: A (m, k) and Bt (n, k) in e4m3 with their float32 scales."""
    import torch

    count = l2_rotation(m * k + n * k + 2 * m * n)
    sets = []
    for _ in range(count):
        a, sa = scaled_e4m3(torch.randn(m, k, device="cuda"))
        bt, sb = scaled_e4m3(torch.randn(n, k, device="cuda"))
        sets.append({"a": a, "bt": bt, "sa": sa, "sb": sb, "scale_ab": torch.stack([sa, sb]).contiguous()})
    return sets


def reference(s: dict[str, Any]) -> Any:
    return (s["a"].double() @ s["bt"].double().T) * (s["sa"].double() * s["sb"].double())


def tvm_of(t: Any) -> Any:
    """A TVM view of torch tensor ``t``, 8-bit floats through a byte view where DLPack lacks them."""
    import torch
    import tvm

    try:
        return tvm.runtime.from_dlpack(t)
    except Exception:
        if t.dtype != torch.float8_e4m3fn:
            raise
        return tvm.runtime.from_dlpack(t.view(torch.uint8))._create_view(tuple(t.shape), "float8_e4m3fn")


def ours(template: Fp8GemmTemplate, cfg: Config, target: Any, sets: list[dict[str, Any]]) -> tuple[Any, float]:
    """``launch(i)`` of ``cfg`` on the sets, and its error against float64 on NaN-poisoned C."""
    import torch

    program = template.build_program(cfg, target)
    outs = [torch.full((template.m, template.n), float("nan"), device="cuda", dtype=torch.float16) for _ in sets]
    a, bt, scales, c = program.params[:4]
    args = [{a: tvm_of(s["a"]), bt: tvm_of(s["bt"]), scales: tvm_of(s["scale_ab"]), c: tvm_of(out)}
            for s, out in zip(sets, outs)]
    launch = program_launch(program, args, outs)
    launch(0)
    torch.cuda.synchronize()
    return launch, rel_error_vs(outs[0], reference(sets[0]))


def config_label(template: Fp8GemmTemplate, cfg: Config) -> str:
    """A config as the tables name it: its tile, its promotion and whether it is overlapped."""
    return f"{template.tile(cfg).name} p{cfg.fp8_promote}{' overlap' * cfg.fp8_promote_overlap}"


def tuned(m: int, n: int, k: int, target: Any, args: argparse.Namespace) -> list[tuple[str, Config]]:
    """``tune gemm-fp8`` of the shape (``--tune-trials`` configs; with ``--promote``, in that
    accuracy class) into ``--out``'s records, resumed there; its best config, labelled."""
    records = os.path.join(args.out, f"gemm_fp8_{m}x{n}x{k}.jsonl")
    promote = [] if args.promote is None else ["--promote", str(args.promote)]
    tune.main(["gemm-fp8", "--shape", f"{m},{n},{k}", "--target", "cuda", "--records", records, "--no-progress",
               "--trials", str(args.tune_trials), *promote])
    template = Fp8GemmTemplate(m, n, k, promote=args.promote)
    best = RecordStore(records).best(Workload.of(template, target).key)
    if best is None:
        return []
    space = template.space(target)
    config = space.make(**space.completed(best.config))
    return [(f"tuned {config_label(template, config)}", config)]


def shape_rows(m: int, n: int, k: int, target: Any, args: argparse.Namespace
               ) -> tuple[list[list[str]], list[list[str]]]:
    import torch

    flops = 2.0 * m * n * k
    sets = fp8_sets(m, n, k)
    ref = reference(sets[0])

    def scaled_mm(i: int, fast: bool = False) -> Any:
        s = sets[i]
        return torch._scaled_mm(s["a"], s["bt"].t(), scale_a=s["sa"], scale_b=s["sb"], out_dtype=torch.float16,
                                use_fast_accum=fast)

    def fast_mm(i: int) -> Any:
        return scaled_mm(i, True)

    vendor = time_vendor(scaled_mm, len(sets))
    fast = time_vendor(fast_mm, len(sets))
    best = vendor.best.seconds
    halves = [((s["a"].float() * s["sa"]).half(), (s["bt"].float() * s["sb"]).half().t().contiguous()) for s in sets]
    fp16 = time_vendor(lambda i: halves[i][0] @ halves[i][1], len(sets))
    fp16_err = rel_error_vs(halves[0][0] @ halves[0][1], ref)

    def row(kernel: str, times: Any, err: float) -> list[str]:
        three = [f"{t.seconds * 1e3:.4f}" if t else "-" for _, t in vendor_methods(times)]
        return [f"{m}x{n}x{k}", kernel, *three, f"{flops / times.best.seconds / 1e12:.0f}",
                f"{best / times.best.seconds:.2f}", f"{err:.1e}"]

    rows = [row("cuBLASLt e4m3 (torch._scaled_mm): the baseline", vendor, rel_error_vs(scaled_mm(0), ref)),
            row("cuBLASLt e4m3, use_fast_accum (sums not promoted)", fast, rel_error_vs(fast_mm(0), ref)),
            row("cuBLAS float16 on the same values (for scale)", fp16, fp16_err)]
    template = Fp8GemmTemplate(m, n, k)
    default = template.default_config(target)
    space = template.space(target)
    configs = [(f"default {config_label(template, default)}", default)]
    candidates = [default.replace(fp8_promote_overlap=1 - default.fp8_promote_overlap)]
    for bm, bn, stages, inflight, raster, tiles, promote, overlap in VARIANTS:
        tile = WgmmaTile(bm, bn, stages, inflight, False, raster, tiles, operand="e4m3")
        candidates.append(space.make(**tile.knobs(), fp8_promote=promote, fp8_promote_overlap=overlap))
    for cfg in [] if args.default_only else candidates:
        if cfg != default and space.is_feasible(cfg) and cfg not in [c for _, c in configs]:
            configs.append((config_label(template, cfg), cfg))
    if args.promote is not None:  # one accumulation class (the default kept for reference)
        configs = configs[:1] + [c for c in configs[1:] if c[1].fp8_promote == args.promote]
    if args.tune_trials:
        configs += tuned(m, n, k, target, args)
    if args.tma != "off":
        loaded = [(f"{label} tma", cfg.replace(wgmma_tma=1)) for label, cfg in configs]
        configs = ([] if args.tma == "on" else configs) + [c for c in loaded if space.is_feasible(c[1])]
    if args.ws:  # each config also warp-specialized (its loads by the TMA)
        split = [(f"{label} ws", cfg.replace(wgmma_tma=1, wgmma_ws=1)) for label, cfg in configs
                 if not cfg.as_dict().get("wgmma_ws")]
        configs += [c for c in split if space.is_feasible(c[1]) and c[1] not in [d for _, d in configs]]
    if args.multicast:  # each warp-specialized config also in clusters of two sharing an operand by multicast
        paired = [(f"{label} multicast", cfg.replace(wgmma_multicast=1)) for label, cfg in configs
                  if cfg.as_dict().get("wgmma_ws") and not cfg.as_dict().get("wgmma_multicast")]
        configs += [c for c in paired if space.is_feasible(c[1]) and c[1] not in [d for _, d in configs]]
    timed = []
    for label, cfg in configs:
        launch, err = ours(template, cfg, target, sets)
        if not err < 1e-2:  # a wrong kernel, not rounding
            raise SystemExit(f"error: {label} at {m}x{n}x{k} differs from float64 by {err:.1e}")
        times = time_ours_three(launch, len(sets))
        rows.append(row(f"ours e4m3, {label}", times, err))
        timed.append((times.best.seconds, label, cfg, launch))
    # the stable comparison, each accuracy class against its own: the default (sums promoted; with
    # --tma, the fastest promoted config) against cuBLASLt's default, the fastest unpromoted tile
    # against its fast accumulation
    unpromoted = [t for t in timed if t[2].fp8_promote == 0]
    promoted = [t for t in timed if t[2].fp8_promote > 0]
    if args.promote:
        promoted = [t for t in promoted if t[2].fp8_promote == args.promote]
    first = min(promoted, key=lambda t: t[0]) if (args.tma != "off" or args.promote) and promoted else timed[0]
    pairs = [(first, "cuBLASLt e4m3", scaled_mm)]
    if unpromoted:
        pairs.append((min(unpromoted, key=lambda t: t[0]), "cuBLASLt e4m3 fast accum", fast_mm))
    round_rows = []
    for (_, label, _, launch), vendor_name, vendor_fn in pairs:
        # the default in the same rounds where another promoted config is compared
        peers = {timed[0][1]: timed[0][3]} if vendor_fn is scaled_mm and launch is not timed[0][3] else None
        summaries, left_out = compare_in_rounds(
            f"{m}x{n}x{k}", launch, {vendor_name: vendor_fn}, len(sets), args.rounds,
            os.path.join(args.out, "gemm_fp8_rounds.jsonl"), peers=peers, config=label)
        round_rows += [[f"{m}x{n}x{k}", label, *rounds_cells(s)] for s in summaries]
        round_rows += [[f"{m}x{n}x{k}", label, f"{v}: left out ({why})"] + ["-"] * 9 for v, why in left_out.items()]
    return rows, round_rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4096,8192",
                   help=f"comma-separated: MxNxK, N for N³, or of {', '.join(SHAPES)}")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the default tile against cuBLASLt")
    p.add_argument("--tma", default="off", choices=("off", "on", "both"),
                   help="every config's stages loaded by the TMA (wgmma_tma): as listed (off), set (on), or each "
                        "config both ways (both); the rounds then take the fastest of each accumulation")
    p.add_argument("--promote", type=int, choices=(1, 2, 4), default=None,
                   help="only configs promoting every that many k steps (and the default); the rounds then "
                        "take the fastest of them: 1 is cuBLASLt's default accuracy")
    p.add_argument("--tune-trials", type=int, default=0,
                   help="also tune each shape (tune gemm-fp8, that many configs, in --promote's class) and time "
                        "its best beside the default")
    p.add_argument("--ws", action="store_true",
                   help="every config also warp-specialized (wgmma_ws, its stages loaded by the TMA)")
    p.add_argument("--default-only", action="store_true",
                   help="the default config alone (and its twins of --tma, --ws, --multicast), not the variants")
    p.add_argument("--multicast", action="store_true",
                   help="every warp-specialized config also in thread-block clusters of two sharing an operand's "
                        "tile by TMA multicast (wgmma_multicast)")
    p.add_argument("--out", default="bench_out", help="folder of the raw rounds (JSON lines)")
    args = p.parse_args()
    run = rows_by_shape(p, args, SHAPES, shape_rows)
    if run is None:
        return 2
    rows, round_rows = run
    print(table("e4m3 GEMM, per-tensor scales, float16 C: ours on wgmma against cuBLASLt",
                ["shape", "kernel", "per call ms", "back-to-back ms", "CUDA graph ms", "TFLOP/s at best",
                 "of cuBLASLt's best", "rel err vs f64"], rows))
    print()
    print(table(f"Stable comparison: e4m3 against torch._scaled_mm of the same accumulation in {args.rounds} "
                "interleaved rounds, both replayed from CUDA graphs on the same operands",
                ["shape", "ours", *rounds_header()], round_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
