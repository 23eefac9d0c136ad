"""The wall time of a model's task matching and of one wgmma kernel's generated source, no GPU.

The BERT-base layer (``--dtype``) lowered and its tasks extracted for an offline CUDA target
(``--arch``), then matched ``--rounds`` times (each wgmma task's default kernel built as the
match's check) and the 1024x3072x768 wgmma GEMM's default kernel generated ``--rounds`` times;
prints the best of each.  Run it against two checkouts (``PYTHONPATH``) to compare them.

    python benchmarks/probes/match_time.py --rounds 3
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from models import _example  # noqa: E402

from tvm_ext.relax.pipeline import extract_tasks, legalize_and_fuse, match_tasks  # noqa: E402
from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate  # noqa: E402
from tvm_ext.target import offline_cuda  # noqa: E402


def best_of(rounds: int, work) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="float16")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    target = offline_cuda(args.arch)
    mod = _example("bert_layer").get_module(size="base", dtype=args.dtype)
    tasks = extract_tasks(legalize_and_fuse(mod, target), target)
    matches = match_tasks(tasks, target)  # warm: the templates' modules imported
    matched = sum(m.matched for m in matches)
    gemm = WgmmaGemmTemplate(1024, 3072, 768)
    config = gemm.default_config(target)
    gemm.build_program(config, target)
    match = best_of(args.rounds, lambda: match_tasks(tasks, target))
    build = best_of(args.rounds, lambda: gemm.build_program(config, target))
    print(f"{len(tasks)} tasks, {matched} matched: match {match:.2f} s; wgmma 1024x3072x768 source {build:.3f} s "
          f"(best of {args.rounds})")


if __name__ == "__main__":
    main()
