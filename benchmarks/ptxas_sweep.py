"""Registers and spills (``nvcc --ptxas-options=-v``) of every config of a CUDA sweep (CPU only).

    git show 88ed8a1:schedules/gemm.py > /tmp/gemm_261df822.py     # the template the sweep measured
    python benchmarks/ptxas_sweep.py benchmarks/data/sweep_gemm_cuda_2048x2048x2048.jsonl.gz \\
        --template-source /tmp/gemm_261df822.py

Writes ``ptxas_<sweep name>.json.gz`` beside the sweep: the cache the cost model's
``ptxas_regs``/``ptxas_spill_bytes`` features read in the replay (``--ptxas`` of
``search_efficiency.py``).  The kernels must be the ones that were measured, so the
template's source hash must equal the sweep header's ``template_hash``.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

from tvm_ext.cost_model.ptxas import PtxasCache
from tvm_ext.cost_model.replay import Sweep


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("sweep")
    p.add_argument("--template-source", default=None, help="the gemm.py the sweep was measured with")
    p.add_argument("--workers", type=int, default=None)
    args = p.parse_args()
    sweep = Sweep.load(args.sweep)
    template = sweep.template()
    if args.template_source:
        folder, name = os.path.split(os.path.abspath(args.template_source))
        sys.path.insert(0, folder)
        os.environ["PYTHONPATH"] = folder + os.pathsep + os.environ.get("PYTHONPATH", "")  # spawned workers
        module = importlib.import_module(name[:-3])
        template = module.GemmTemplate(**sweep.header["workload"]["params"])
    want = sweep.header["workload"]["template_hash"]
    if template.source_hash != want:
        print(f"error: template hash {template.source_hash} != the sweep's {want}; pass --template-source",
              file=sys.stderr)
        return 2
    out = os.path.join(os.path.dirname(os.path.abspath(args.sweep)), f"ptxas_{sweep.name}.json.gz")
    cache = PtxasCache(out)
    configs = [e.config for e in sweep.entries]
    start = time.time()
    for i in range(0, len(configs), 64):  # saved after each chunk: an interrupted run resumes
        added = cache.fill(template, configs[i:i + 64], sweep.target(), args.workers)
        print(f"{min(i + 64, len(configs))}/{len(configs)} ({added} new, {time.time() - start:.0f} s)", flush=True)
    ok = sum(1 for c in configs if cache.lookup(template, c, sweep.target()) is not None)
    print(f"wrote {out}: {ok} of {len(configs)} configs with ptxas data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
