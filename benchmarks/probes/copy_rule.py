"""BERT-base's attention head split and merge copies (float16, batch 8, sequence 128, 12 heads of
64) under dlight's fallback, the row-copy rule (``tvm_ext/relax/copy_rule.py``) and dlight's
transpose rule, each timed per call, back to back and replayed from a CUDA graph (``common``)
on 4 rotated inputs and checked against torch's permute.
Usage: python benchmarks/probes/copy_rule.py"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import seconds_by_method, time_ours_three, tvm_launch  # noqa: E402

B, S, HEADS, D = 8, 128, 12, 64
SETS = 4


def functions() -> dict[str, tuple[object, tuple[int, ...], object]]:
    """name -> (prim func, input shape, torch reference of the input)."""
    from tvm import te, topi

    x = te.placeholder((B, S, HEADS * D), "float16", name="x")
    y = te.placeholder((B, HEADS, S, D), "float16", name="y")
    split = topi.transpose(topi.reshape(x, (B, S, HEADS, D)), (0, 2, 1, 3))
    split_t = topi.transpose(topi.reshape(x, (B, S, HEADS, D)), (0, 2, 3, 1))
    merge = topi.reshape(topi.transpose(y, (0, 2, 1, 3)), (B, S, HEADS * D))
    return {
        "head split (q, v)": (te.create_prim_func([x, split]), (B, S, HEADS * D),
                              lambda t: t.reshape(B, S, HEADS, D).permute(0, 2, 1, 3)),
        "head split, kᵀ": (te.create_prim_func([x, split_t]), (B, S, HEADS * D),
                           lambda t: t.reshape(B, S, HEADS, D).permute(0, 2, 3, 1)),
        "head merge": (te.create_prim_func([y, merge]), (B, HEADS, S, D),
                       lambda t: t.permute(0, 2, 1, 3).reshape(B, S, HEADS * D)),
    }


def main() -> None:
    import torch
    import tvm
    from tvm.s_tir import dlight as dl

    from tvm_ext.relax.copy_rule import vectorized_copy_rule
    from tvm_ext.target import resolve_target

    target = tvm.target.Target(resolve_target("cuda", 0).tvm_target())
    rules = {"dlight fallback": [dl.gpu.Fallback()], "row copy rule": [vectorized_copy_rule()],
             "dlight transpose": [dl.gpu.Transpose()]}
    rows = []
    for name, (func, shape, ref) in functions().items():
        inputs = [torch.randn(shape, device="cuda").half() for _ in range(SETS)]
        for rule, rule_list in rules.items():
            mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
            with target:
                mod = dl.ApplyDefaultSchedule(*rule_list)(mod)
            if not mod["main"].attrs.get("tirx.is_scheduled", False):
                rows.append({"function": name, "schedule": rule, "note": "does not match"})
                continue
            kernel = tvm.compile(mod, target=target).mod["main"]
            outs = [torch.empty_like(ref(t)).contiguous() for t in inputs]
            args = [[tvm.runtime.from_dlpack(i), tvm.runtime.from_dlpack(o)] for i, o in zip(inputs, outs)]
            launch = tvm_launch(kernel, args, outs)
            launch(0)
            torch.cuda.synchronize()
            exact = all(torch.equal(launch(i), ref(inputs[i])) for i in range(SETS))
            us = {m: (v * 1e6 if v else None) for m, v in seconds_by_method(time_ours_three(launch, SETS)).items()}
            rows.append({"function": name, "schedule": rule, "exact": exact,
                         "best_us": min(v for v in us.values() if v), "us": us})
            print(json.dumps(rows[-1]), flush=True)
    print("\n| function | schedule | best µs | per call / back to back / graph | equal to torch |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "note" in r:
            print(f"| {r['function']} | {r['schedule']} | - | {r['note']} | |")
        else:
            three = " / ".join(f"{v:.2f}" if v else "-" for v in r["us"].values())
            print(f"| {r['function']} | {r['schedule']} | {r['best_us']:.2f} | {three} | {r['exact']} |")
    with open(os.path.join(os.environ.get("OUT", "."), "copy_rule.json"), "w") as f:
        json.dump(rows, f)


if __name__ == "__main__":
    main()
