"""What shape buckets cost: ``tvm_ext.torch.GRU(buckets=...)`` (each call padded with zero steps and
rows up to its bucket, run on the bucket's GRU with every row's length the call's seq where steps
were added, cut back) against the same module compiled for each exact shape (``fallback="off"``,
no buckets) and against ``nn.GRU`` on the same input, each called as a user calls it (eager, a
synchronize after each call; the median of interleaved rounds, ``torch_fallback.per_call_ms``),
every output checked against float64 first; beside them the bucketed module called on an input of
its bucket's shape (the bucket's kernels alone, no padding or cutting).
Usage: python benchmarks/probes/gru_bucket_cost.py [--dtype float16] [--device cuda] [--hidden 1024] [--layers 1]
       [--shapes 5x50,12x100,30x128,64x128] [--seq-buckets 64,128] [--batch-buckets 8,16,32,64] [--out F]"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.schedules.gru import gru_reference  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="float16")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--shapes", default="5x50,12x100,30x128,64x128", help="BATCHxSEQ,...")
    p.add_argument("--seq-buckets", default="64,128")
    p.add_argument("--batch-buckets", default="8,16,32,64")
    p.add_argument("--device", default="cuda", help="cpu: OpenCL on PoCL (a check of the probe, not a timing)")
    p.add_argument("--out", default="")
    args = p.parse_args()
    import torch

    from tvm_ext.torch import GRU
    from tvm_ext.torch_fallback import per_call_ms

    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    net = torch.nn.GRU(args.hidden, args.hidden, args.layers).to(args.device).eval().to(dtype)
    buckets = {"seq": [int(v) for v in args.seq_buckets.split(",")],
               "batch": [int(v) for v in args.batch_buckets.split(",")]}
    bucketed = GRU.from_module(net, buckets=buckets)
    exact = GRU.from_module(net, fallback="off")
    state = {k: v.detach().double().cpu().numpy() for k, v in net.state_dict().items()}
    rows = []
    print(f"{args.dtype} H{args.hidden} {args.layers} layer(s), buckets {buckets}, ms a call (eager, synchronized)")
    print("| batch x seq | bucket | buckets | exact shape | nn.GRU | buckets / exact | the bucket's shape called | "
          "errors (buckets, exact, nn.GRU) |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        batch, seq = (int(v) for v in shape.split("x"))
        x = torch.randn(seq, batch, args.hidden, device=args.device).to(dtype)
        ref, _ = gru_reference(x.double().cpu().numpy(), state, num_layers=args.layers)
        with torch.no_grad():
            bucket_seq, bucket_batch = bucketed.buckets.round(seq, batch)
            whole = torch.zeros(bucket_seq, bucket_batch, args.hidden, device=args.device, dtype=dtype)
            whole[:seq, :batch] = x  # the bucket's shape itself: its kernels without the padding and cutting
            sides = {"buckets": lambda x=x: bucketed(x), "exact": lambda x=x: exact(x), "nn.GRU": lambda x=x: net(x),
                     "bucket shape": lambda w=whole: bucketed(w)}
            errors = {name: float(relative_error([call()[0][:seq, :batch].float().cpu().numpy()], [ref]))
                      for name, call in sides.items() if name != "bucket shape"}
            ms = per_call_ms(sides, args.device)
        bucket = bucketed.buckets.round(seq, batch)
        rows.append({"batch": batch, "seq": seq, "bucket": bucket, "ms": ms, "errors": errors})
        print(f"| {batch} x {seq} | {bucket[1]} x {bucket[0]} | {ms['buckets']:.3f} | {ms['exact']:.3f} | "
              f"{ms['nn.GRU']:.3f} | {ms['buckets'] / ms['exact']:.2f} | {ms['bucket shape']:.3f} | "
              f"{errors['buckets']:.1e}, "
              f"{errors['exact']:.1e}, {errors['nn.GRU']:.1e} |", flush=True)
    print("compiled for buckets:", [(k.batch, k.seq, k.variable_lengths) for k in bucketed.compiled_shapes])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
