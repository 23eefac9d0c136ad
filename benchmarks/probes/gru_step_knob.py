"""A knob of the tensor-core step kernel at each of its values, the pick's config otherwise: the
accumulator sets (``step_tc_acc`` 1, 2, 4: the default) or the fragments loaded a k slice ahead
(``--knob step_tc_frag --values 0,1``), or named sets of knob values over the pick (``--variants
"kw4:step_tc_kw=4,step_tc_nw=1;kw4-cell:step_tc_kw=4,step_tc_nw=1,step_tc_cell=1"``, the pick itself
first; ``--variants pick``: the pick alone, to time one build of the code against another; ``mma_``
knobs in a set change the unfused pipeline's hidden-GEMM tile instead, e.g. "m64:mma_warps_m=4,
mma_warps_n=1", ``hidw_`` ones its wgmma tile's fields (``hid_wgmma`` 1, ``hid_cell`` 0: the cell's
own tiles take only its operand), e.g. "s6:hidw_stages=6"; ``cellw_`` ones the fields of the tile with the
cell in its store, ``hid_cell`` 1-6, e.g. "c2s4:hid_cell=2,cellw_stages=4"; ``inw_`` / ``intf_`` ones
the fields of the 16-bit input GEMM's wgmma tile / the float32 one's on TF32 parts, e.g.
"t16:inw_tiles=16"; ``full_box=1``: A's whole tile loaded where M is below one, as before
``KernelLayout.a_box_rows``); timed
back to back (``time_ours`` around the executor) in interleaved rounds, each checked against float64
first; T=128, input = hidden.
Usage: python benchmarks/probes/gru_step_knob.py [--rounds 3] [--knob K --values a,b | --variants V] [--cases 0,1]"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import parse_knob_sets, time_ours  # noqa: E402
from probe_helpers import full_a_box, gru_weights  # noqa: E402

from tvm_ext.core.space import Config  # noqa: E402
from tvm_ext.precision.precision import relative_error  # noqa: E402
from tvm_ext.schedules.gemm.mma import MmaGemmTile  # noqa: E402
from tvm_ext.schedules.gru import GRU, GruTemplate, cell_step, gru_reference  # noqa: E402
from tvm_ext.target import TargetInfo, resolve_target  # noqa: E402

CASES = (("float16", 64, 1024), ("bfloat16", 64, 1024), ("float16", 8, 512), ("float16", 16, 512),
         ("float16", 32, 1024), ("float16", 64, 512),
         # the small-batch picks on the flag-exchange kernel (CUDA cores)
         ("float32", 1, 256), ("float32", 4, 512), ("float32", 8, 512), ("float32", 16, 512), ("float16", 4, 512),
         # float32 at larger batch: the CUDA-core step kernel's picks, against the split kernel (step_tc 2)
         ("float32", 64, 1024), ("float32", 32, 512), ("float32", 32, 1024), ("float32", 64, 512),
         ("float32", 128, 1024),
         ("bfloat16", 8, 512),
         ("float16", 8, 1024),
         # float16 at the smallest batches: the flag-exchange kernel's picks, against the tensor-core kernel
         ("float16", 1, 256), ("float16", 2, 512),
         # float32 at H1024 and small batch: the flag-exchange kernel against the tagged-word split kernel
         ("float32", 8, 1024), ("float32", 16, 1024),
         # the flag-exchange kernel at batch 2-7, with and without the input projected in it
         ("float32", 2, 512), ("float32", 4, 256), ("float32", 7, 256),
         # float32 at an odd hidden size: the input GEMM on float16 parts with its depth padded
         ("float32", 32, 1000), ("float32", 64, 1000),
         # float32 at batch 4-7: the flag-exchange kernel's picks, against the split kernel with stacked parts
         ("float32", 5, 512), ("float32", 6, 512), ("float32", 7, 512), ("float32", 4, 1024), ("float32", 6, 1024),
         # float16 at batch 5 and 7: the input GEMM counted where its tiles a block divide all its tiles
         ("float16", 5, 512), ("float16", 7, 512),
         # bidirectional where both directions' step blocks leave SMs for a counted GEMM (its tile rows from
         # both ends)
         ("float16", 8, 256, True), ("float32", 16, 256, True), ("float16", 16, 256, True),
         ("float16", 4, 256, True), ("float16", 8, 128, True), ("float16", 8, 384, True),
         # 16-bit at H1024 and batch 2-16: 8-unit blocks (128) against 16-unit ones with the GEMM counted beside
         ("float16", 4, 1024), ("float16", 16, 1024), ("bfloat16", 8, 1024), ("float16", 2, 1024),
         # bidirectional 16-bit B8 H512: both directions' 8-unit blocks (128) against 16-unit ones, GEMM counted
         ("float16", 8, 512, True), ("bfloat16", 8, 512, True),
         # 16-bit past H1024, where W_hh's slice no longer fits shared memory: fragments streamed from global
         # memory into registers (step_tc_wreg 3) against the CUDA-core kernels picked before
         ("float16", 8, 2048), ("float16", 16, 2048), ("float16", 32, 1536), ("float16", 32, 2048),
         ("float16", 1, 2048), ("float16", 64, 2048), ("float16", 64, 1536),
         ("float16", 64, 1024, True), ("float16", 8, 2048, True), ("float16", 128, 1024),
         ("float16", 32, 1760), ("float16", 16, 1760),
         # the unfused steps with the hidden GEMM on wgmma (hid_wgmma) at larger batches, against mma.sync
         ("float16", 128, 2048), ("float16", 256, 1024),
         # the cell in the hidden GEMM's store (hid_cell) at more shapes of a wave of its tiles or more
         ("float16", 128, 1024, True), ("float16", 256, 2048), ("bfloat16", 128, 2048), ("float16", 64, 4096),
         ("float16", 64, 2048, True), ("float16", 128, 1536), ("float16", 192, 1024),
         # the cell forms against the tensor-core step kernel where its grid is resident (picked there)
         ("float16", 64, 768, True), ("float16", 128, 512, True), ("float16", 128, 768), ("float16", 128, 512),
         ("float16", 192, 512), ("float16", 256, 512), ("float16", 192, 768), ("float16", 256, 256),
         # a hidden size that is no multiple of 64 (K and 3H ragged on wgmma's tiles)
         ("float16", 32, 1000), ("float16", 64, 1000),
         # float32 past the resident grids: the cell in the hidden GEMM's store on TF32 parts, against the
         # CUDA-core kernels picked before
         ("float32", 64, 2048), ("float32", 128, 2048), ("float32", 256, 1024), ("float32", 64, 1536),
         ("float32", 32, 2048), ("float32", 128, 1536), ("float32", 192, 1024), ("float32", 64, 2048, True),
         # the resident-W cell step kernel (step_cell) where the cell form would be on 64-row tiles
         ("float16", 160, 1024),
         # bfloat16 where float16 takes the resident-W cell step kernel
         ("bfloat16", 192, 1024), ("bfloat16", 160, 1024),
         # the resident-W kernel with its input GEMM counted beside it, where other kernels are picked
         ("bfloat16", 128, 1024), ("float16", 96, 1024),
         # 16-bit past H1024 where 64-row cell tiles pass a wave: 128-row tiles with K whole (hid_cell 4)
         ("float16", 192, 1536), ("float16", 192, 2048), ("float16", 200, 1536), ("float16", 256, 1536),
         ("bfloat16", 192, 2048), ("float16", 96, 2048), ("float16", 128, 2048, True),
         ("float16", 192, 1024, True), ("float16", 256, 768, True), ("bfloat16", 192, 1536),
         # K split in a cluster over a ragged last row tile (hid_cell 2 and 3): one 128-row tile where
         # two 64-row ones were read
         ("float16", 96, 1536), ("float16", 48, 2048), ("float16", 96, 1024, True), ("float16", 200, 768),
         ("float16", 160, 512, True), ("float32", 96, 2048),
         # 129-192 rows past H1024: one row of 192-row cell tiles with K in halves (hid_cell 5)
         ("float16", 160, 1536), ("float16", 160, 2048), ("float32", 192, 1536))
STORED = ("x", "w_ih", "gi", "w_hh", "h", "out")
SEQ = 128


@contextmanager
def cell_tile_fields(fields: dict[str, int]) -> Iterator[None]:
    """While open, the tile of the hidden GEMM with the cell in its store (``cell_step.cell_tile``)
    with ``fields`` changed, each as its type: a probe of tiles the knobs do not name."""
    own = cell_step.cell_tile

    def changed(tile: Any, hidden: int, *args: Any) -> Any:
        made = own(tile, hidden, *args)
        return replace(made, **{k: type(getattr(made, k))(v) for k, v in fields.items()})

    cell_step.cell_tile = changed if fields else own
    try:
        yield
    finally:
        cell_step.cell_tile = own


# knob prefixes of a variant naming a wgmma tile's fields: the template attribute each changes
WGMMA_TILE_PREFIXES = {"hidw_": "hid_wgmma_tile", "inw_": "in_wgmma_tile", "intf_": "in_split_tf32"}


def variant_gru(template: GruTemplate, pick: Config, changes: dict[str, int], target: TargetInfo) -> GRU | str:
    """The GRU of ``pick`` with ``changes``: knobs of its config, ``mma_`` knobs of the unfused
    steps' hidden-GEMM mma.sync tile, ``hidw_`` fields of its wgmma tile (``hid_wgmma`` 1),
    ``inw_`` / ``intf_`` of the input GEMM's (``WGMMA_TILE_PREFIXES``), ``cellw_`` fields of the
    tile with the cell in its store (built, not loaded); or why the space refuses the config."""
    tile = {k: v for k, v in changes.items() if k.startswith("mma_")}
    cell = {k[6:]: v for k, v in changes.items() if k.startswith("cellw_")}
    cfg = pick.replace(**{k: v for k, v in changes.items() if k not in tile and k != "full_box"
                          and not k.startswith(("cellw_", *WGMMA_TILE_PREFIXES))})
    refused = template.space(target).infeasible_reason(cfg)
    if refused:
        return refused
    built = template
    if tile:  # the hidden GEMM's mma.sync tile, the pick's otherwise
        built = replace(template, hid_tensor_core=MmaGemmTile(template.hid_tensor_core.config.replace(**tile)))
    for prefix, field in WGMMA_TILE_PREFIXES.items():  # a wgmma tile's fields, each as its type (tma=1 -> True)
        fields = {k[len(prefix):]: v for k, v in changes.items() if k.startswith(prefix)}
        own = getattr(template, field)
        if not fields:
            continue
        if own is None:
            return f"the template has no {field} for {prefix} knobs"
        built = replace(built, **{field: replace(own, **{k: type(getattr(own, k))(v) for k, v in fields.items()})})
    with cell_tile_fields(cell), full_a_box(bool(changes.get("full_box"))):
        return GRU(built, cfg, target, False, built.compile(cfg, target))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--knob", default="step_tc_acc")
    p.add_argument("--values", default="1,2,4")
    p.add_argument("--variants", default="", help="name:knob=v,knob=v;name:... over the pick (instead of --knob)")
    p.add_argument("--cases", default="", help="indices into CASES (default all)")
    args = p.parse_args()
    if args.variants:
        try:
            variants = {"pick": {}, **parse_knob_sets(args.variants, "--variants", bare=("pick",))}
        except ValueError as exc:
            p.error(str(exc))
        args.knob = "variant"
    else:
        variants = {int(v): {args.knob: int(v)} for v in args.values.split(",")}
    values = tuple(variants)
    cases = [CASES[int(i)] for i in args.cases.split(",")] if args.cases else CASES
    target = resolve_target("cuda", 0)
    rows = []
    for dtype, batch, hidden, *bi in cases:
        bi = bool(bi and bi[0])
        rng = np.random.default_rng(0)
        w = gru_weights(rng, hidden, bi)
        x = rng.standard_normal((SEQ, batch, hidden)).astype(np.float32)
        ref = gru_reference(x, w, None, 1, bi)
        precision = {name: dtype for name in STORED}
        template = GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=SEQ, bidirectional=bi).with_precision(
            precision).with_tensor_cores(target)
        pick = template.analytic_pick(target)[0]
        grus = {}
        for sets in values:
            try:
                gru = variant_gru(template, pick, variants[sets], target)
                if isinstance(gru, str):  # the space refuses it
                    print(f"[{dtype} B{batch} H{hidden}] {sets}: refused: {gru}", flush=True)
                    continue
                gru.load_numpy(w)
                err = relative_error(list(gru(x)), ref)
            except Exception as exc:  # noqa: BLE001 (a variant that does not build or run is a row, not the end)
                print(f"[{dtype} B{batch} H{hidden}] {sets}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            grus[sets] = (gru, err)
        times = {sets: [] for sets in grus}
        for _ in range(args.rounds):
            for sets, (gru, _) in grus.items():
                times[sets].append(time_ours(lambda i, gru=gru: gru.executor.run()).seconds * 1e3)
        row = {"case": f"{dtype}{' bidirectional' if bi else ''} B{batch} H{hidden}",
               "block": [pick.step_j, pick.step_tc_rows, pick.step_tc_kw, pick.step_tc_nw],
               "ms": {s: statistics.median(v) for s, v in times.items()}, "rounds": times,
               "err": {s: e for s, (_, e) in grus.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n| case | block (units, rows, k warps, unit warps) | {' | '.join(f'{args.knob} {v} ms' for v in values)} "
          "| errors |")
    print("|---|---|" + "---|" * len(values) + "---|")
    for r in rows:
        ms = [f"{r['ms'][v]:.3f}" if v in r["ms"] else "-" for v in values]
        errs = " / ".join(f"{r['err'][v]:.1e}" for v in values if v in r["err"])
        print(f"| {r['case']} | {tuple(r['block'])} | {' | '.join(ms)} | {errs} |")
    with open(os.path.join(os.environ.get("OUT", "."), f"gru_{args.knob}.json"), "w") as f:
        json.dump(rows, f)


if __name__ == "__main__":
    main()
