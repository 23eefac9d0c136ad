"""The unfused GRU step's cell in its hidden GEMM's store (``hid_cell``): one wgmma kernel a step
whose tiles read W_hh's columns as three gates of 32 units, the space's refusals, and ``-m gpu``
runs against float64 and against the two-kernel step."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from gru_checks import assert_reruns_match_float64
from test_gru import Shape, _inputs, _weights

from tvm_ext.core.errors import TvmExtError
from tvm_ext.schedules.gemm.wgmma import WgmmaTile, wgmma_gemm
from tvm_ext.schedules.gemm.wgmma_layout import KernelLayout
from tvm_ext.schedules.gru import GRU, GruTemplate
from tvm_ext.schedules.gru.cell_epilogue import cell_blocks, cell_tile, cell_tile_reason
from tvm_ext.target import offline_cuda

HALF = {name: "float16" for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}
BF16 = {name: "bfloat16" for name in HALF}
CELL_IN_GEMM = {"fuse_step": 0, "hid_wgmma": 1, "hid_cell": 1}


def _template(batch: int, hidden: int, bidirectional: bool = False, precision: dict | None = HALF,
              seq: int = 5) -> GruTemplate:
    t = GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=seq, bidirectional=bidirectional)
    return (t.with_precision(precision) if precision else t).with_tensor_cores(offline_cuda("sm_90"))


def _kernel_source(source: str, name: str) -> str:
    body = source[re.search(name + r"_kernel\([^)]*\) \{", source).end():]
    return body[:body.index("\n}\n")]


def test_a_tile_reads_the_three_gates_of_its_units():
    """Tile t's 96 columns are W_hh's columns of units 32t..32t+31 of r, then z, then n."""
    layout = KernelLayout.of(WgmmaTile(64, 96, 8, smem_epilogue=False), 64, 3 * 512, 512, "KN", (), True, 0,
                             gates=512)
    tile = 3 * 96  # the fourth tile: units 96..127
    assert [layout.b_col(tile, offset) for offset in (0, 31, 32, 63, 64, 95)] == [96, 127, 608, 639, 1120, 1151]
    plain = KernelLayout.of(WgmmaTile(64, 96, 8, smem_epilogue=False), 64, 3 * 512, 512, "KN", (), True, 0)
    assert plain.b_col(tile, 40) == tile + 40


CELL_TILES = {1: "wgmma 64x96x64 s8 w1 direct tma ws pdl", 2: "wgmma 64x96x64 s8 w1 direct k/2 cluster tma pdl",
              3: "wgmma 128x96x64 s6 w1 direct k/2 cluster tma pdl", 4: "wgmma 128x96x64 s6 w1 direct tma ws pdl",
              5: "wgmma 192x96x64 s6 w1 direct k/2 cluster tma pdl",
              6: "wgmma 256x96x64 s5 w1 direct k/2 cluster tma pdl"}


@pytest.mark.parametrize("batch, hidden, bidirectional, precision, cell", [
    # 128-row tiles' K halves: 128 or 96 blocks
    (128, 2048, False, HALF, 3), (256, 1024, False, HALF, 3), (128, 1024, True, HALF, 3), (128, 1536, False, HALF, 3),
    (128, 2048, False, BF16, 3),
    # over the tensor-core step kernel's resident grid from B128 H1024: 64-row tiles' K halves, 128 blocks
    (128, 1024, False, HALF, 2), (128, 1024, False, BF16, 2),
    # 129-192 rows: one row of 192-row tiles with K in halves where they make a wave at most (96 or 128
    # halves; B192 H1024 takes the resident-W kernel: test_gru_resident_cell.py), the last rows ragged or not
    (192, 1536, False, BF16, 5), (192, 1024, True, HALF, 5), (160, 2048, False, HALF, 5), (144, 768, True, HALF, 5),
    # 193-256 rows: one row of 256-row tiles with K in halves, ragged or not (128, 96 or 96 halves)
    (256, 2048, False, HALF, 6), (256, 1536, False, BF16, 6), (200, 1536, False, HALF, 6), (256, 768, True, HALF, 6),
    (192, 1760, False, HALF, 4),  # K's 27.5 k steps: no halves; 128-row tiles with K whole (the last one ragged)
    (64, 2048, False, HALF, 2), (64, 1536, False, HALF, 2),  # 64 or 48 tiles: 128 or 96 halves in clusters of two
    (64, 2560, False, HALF, 0),  # 80 tiles, 160 halves (past a wave)
    # a ragged last row tile: 128-row tiles' K halves where they make a wave at most (one tile row, or
    # two), 64-row tiles' where the batch fits one, else 64-row tiles with K whole
    (96, 2048, False, HALF, 3), (96, 1024, True, HALF, 3), (96, 1536, False, HALF, 3), (96, 2048, False, BF16, 3),
    (100, 1536, False, HALF, 3), (200, 768, False, HALF, 3), (160, 512, True, HALF, 3),
    (48, 2048, False, HALF, 2), (48, 1536, False, BF16, 2),  # 128 / 96 halves of 64-row tiles (two kernels before)
    (48, 2048, True, HALF, 1),  # 128 64-row tiles; 256 halves (past a wave)
    (96, 1760, False, HALF, 1),  # K's 27.5 k steps: no halves
])
def test_pick_runs_the_cell_in_the_gemm_where_its_tiles_make_a_wave(batch, hidden, bidirectional, precision, cell):
    """The unfused steps take the cell into the hidden GEMM's store in the first form whose tiles
    fill 70 % of the SMs (and at most all where K is split, the last row tile is ragged or 128-row
    tiles keep K whole, those past 128 rows; 128-row tiles past 64 rows, 192-row ones past 128,
    256-row ones past 192): 128-row tiles with K in halves, 192-row ones, 256-row ones, 128-row
    ones with K whole, 64-row tiles with K whole, their K halves (each faster than two kernels a
    step there, and slower where it is not picked: docs/results/gru.md); a 16-bit W_hh read from
    its transposed copy."""
    target = offline_cuda("sm_90")
    t = _template(batch, hidden, bidirectional, precision)
    cfg, why = t.analytic_pick(target)
    assert (cfg.fuse_step, cfg.hid_wgmma, cfg.hid_cell, cfg.hid_cell_bt) == (0, 1, cell, int(cell > 0))
    tile = CELL_TILES.get(cell, "").replace("wgmma ", "wgmma bfloat16 " if precision is BF16 else "wgmma ")
    assert (f"({tile}) with the cell in its store" in why) if cell else "then the cell kernel" in why
    assert t.space(target).infeasible_reason(cfg) is None


@pytest.mark.parametrize("batch, hidden, bidirectional", [(128, 768, False), (64, 768, True), (256, 512, False)])
def test_pick_keeps_the_tensor_core_step_kernel_below_b128_h1024(batch, hidden, bidirectional):
    """Where the tensor-core step kernel's grid is resident and a cell form's tiles would make a
    wave, the step kernel stays below B128 H1024 (not measured against the cell form there; at
    H1024 from B96, both directions from B64, the resident-W kernel is taken: test_gru_resident_cell)."""
    target = offline_cuda("sm_90")
    cfg, why = _template(batch, hidden, bidirectional).analytic_pick(target)
    assert (cfg.fuse_step, cfg.step_tc, cfg.hid_cell) == (1, 1, 0) and why.startswith("tensor-core persistent step")


def test_one_kernel_a_step_runs_the_gemm_and_the_cell():
    """No gh in memory and no cell kernel: a step is one call, reading h twice (the GEMM's A
    and the state it blends) and writing the next state, out[t] and h_n; its B boxes are the
    three gates' 32 columns of the block's units."""
    target = offline_cuda("sm_90")
    t = _template(64, 2048)
    cfg = t.analytic_pick(target)[0].replace(**CELL_IN_GEMM, hid_cell_bt=0)  # W_hh as stored
    assert t.space(target).infeasible_reason(cfg) is None
    lowered = t.lowered_kernels(cfg)
    assert "gru_cell" not in t.kernels(cfg, target) and "gru_gemm_cell" in lowered and "gru_gemm_h" not in lowered
    compiled = t.compile(cfg, target)
    steps = [c for c in compiled.function_calls() if c.name == "gru_gemm_cell"]
    assert len(steps) == t.seq
    assert steps[2].args == ("p0", "w_hh0", "b_hh0", "gi", "p0", 2, 0, "p1", "out", "h_n")
    assert not any(c.name in ("gru_cell", "gru_gemm_h") for c in compiled.function_calls())
    kernel = _kernel_source(compiled.source, "gru_gemm_cell")
    boxes = re.findall(r"&\(b_map\)\)\)\), (.*?), \(it \* 64\)", kernel)
    tile = "((int)blockIdx.x) * 32)"
    assert boxes == [f"({tile}", f"(({tile} + 2048)", f"(({tile} + 4096)"]
    assert "griddepcontrol_wait()" in kernel and "mma_async_sync_aligned_m64n96k16" in kernel
    assert all(f"{name}_ptr[" in kernel for name in ("gi", "h", "h_out", "out", "h_n"))


def test_k_split_in_a_cluster_adds_each_gates_halves_before_the_cell():
    """hid_cell 2: two blocks a tile, each adding its band of rows from both blocks' float32 sums
    (distributed shared memory, each gate's four units a load), then the cell."""
    target = offline_cuda("sm_90")
    t = _template(64, 2048)
    cfg = t.analytic_pick(target)[0].replace(**{**CELL_IN_GEMM, "hid_cell": 2})
    assert t.space(target).infeasible_reason(cfg) is None
    assert t.step_variant(cfg).wgmma.name == "wgmma 64x96x64 s8 w1 direct k/2 cluster tma pdl"
    kernel = _kernel_source(t.compile(cfg, target).source, "gru_gemm_cell")
    loads = re.findall(r"ld_vec_shared__cluster_v4_f32\(.*?\(peer_ptr\[(\d)\] \+ .*?(\+ (\d+))?\)+;", kernel)
    assert len(loads) == 12  # a band of 32 rows x 8 quads of units on 128 threads: two quads a thread
    assert [(peer, offset) for peer, _, offset in loads[:6]] == [("0", ""), ("1", ""), ("0", "128"), ("1", "128"),
                                                                 ("0", "256"), ("1", "256")]  # r, z, n 32 units apart
    assert "h_out_ptr[" in kernel and "barrier_cluster_wait" in kernel


def test_tall_tiles_split_k_over_two_consumer_warpgroups():
    """hid_cell 3: 128-row tiles (two consumer warpgroups on W_hh's tile) with K in halves."""
    target = offline_cuda("sm_90")
    t = _template(128, 2048)
    cfg = t.analytic_pick(target)[0].replace(**{**CELL_IN_GEMM, "hid_cell": 3})
    assert t.space(target).infeasible_reason(cfg) is None
    assert t.step_variant(cfg).wgmma.name == "wgmma 128x96x64 s6 w1 direct k/2 cluster tma pdl"
    source = t.compile(cfg, target).source
    assert "__launch_bounds__(256) gru_gemm_cell_kernel" in source and "mapa" in _kernel_source(source, "gru_gemm_cell")
    bf16 = _template(128, 2048, precision=BF16)
    bf16_cfg = bf16.default_config(target).replace(**{**CELL_IN_GEMM, "hid_cell": 3})
    assert bf16.space(target).infeasible_reason(bf16_cfg) is None
    assert bf16.step_variant(bf16_cfg).wgmma.name == "wgmma bfloat16 128x96x64 s6 w1 direct k/2 cluster tma pdl"
    short = _template(96, 2048)  # 96 rows: one 128-row tile, its rows past the batch guarded
    short_cfg = short.default_config(target).replace(**{**CELL_IN_GEMM, "hid_cell": 3})
    assert short.space(target).infeasible_reason(short_cfg) is None
    assert " < 96) {" in _kernel_source(short.compile(short_cfg, target).source, "gru_gemm_cell")


@pytest.mark.parametrize("form, batch, hidden, guards", [
    (5, 192, 1536, []), (5, 160, 1536, ["160"] * 4 + ["112"] * 4),  # 112: the second quads' rows, 48 further
    (6, 256, 2048, []), (6, 200, 2048, ["200"] * 4 + ["136"] * 4),  # 136: 64 further
])
def test_taller_tiles_split_k_over_three_or_four_consumer_warpgroups(form, batch, hidden, guards):
    """hid_cell 5 / 6: 192- / 256-row tiles (three / four consumer warpgroups on W_hh's tile; 256
    rows' stages do not split into 16-byte chunks over 512 threads, which the TMA's boxes need not)
    with K in halves, each block of a cluster adding its band of half the tile's rows, two quads of
    four units a thread; where the batch ends inside the tile each h' is stored only where its
    row (in the block's band, from the tile's first) is below it, elsewhere unguarded."""
    target = offline_cuda("sm_90")
    t = _template(batch, hidden)
    cfg = t.default_config(target).replace(**{**CELL_IN_GEMM, "hid_cell": form, "hid_cell_bt": 1})
    assert t.space(target).infeasible_reason(cfg) is None
    tile = t.step_variant(cfg).wgmma
    assert tile.name == CELL_TILES[form]
    source = t.compile(cfg, target).source
    kernel = _kernel_source(source, "gru_gemm_cell")
    assert f"__launch_bounds__({tile.threads}) gru_gemm_cell_kernel" in source and "mapa" in kernel
    assert tile.threads == tile.bm * 2 and kernel.count("h_out_ptr[") == 8
    band_row = r"\(\(\(\(\(\(int\)blockIdx.x\) & 1\) \* " + str(tile.bm // 2) + r"\) \+ .{0,50}\)"
    assert re.findall(band_row + r" < (\d+)\) \{\n *h_out_ptr\[", kernel) == guards


def test_paired_tiles_share_h_by_multicast():
    """hid_cell_share: two adjacent tiles of a row a cluster, each block's producer loading its
    rank's half of h's k tile (64 of 128 rows) and multicasting it into both blocks; W_hh's three
    gate boxes as the lone block loads them."""
    target = offline_cuda("sm_90")
    t = _template(200, 512)
    alone = t.analytic_pick(target)[0].replace(**{**CELL_IN_GEMM, "hid_cell": 4})
    shared = alone.replace(hid_cell_share=1)
    assert t.space(target).infeasible_reason(shared) is None
    assert t.step_variant(shared).wgmma.name == "wgmma 128x96x64 s6 w1 direct tma ws multicast pdl"
    kernels = {c: _kernel_source(t.compile(c, target).source, "gru_gemm_cell") for c in (alone, shared)}
    h_copies = re.findall(r"multicast__cluster\(.*?smem_ptr\[(.*?)\]", kernels[shared])
    assert h_copies == ["(((it % 6) * 14336) + ((((int)blockIdx.x) & 1) * 4096))"]  # rank x 64 rows x 64
    assert "multicast" not in kernels[alone]

    def w_boxes(kernel: str) -> list[str]:
        return re.findall(r"&\(b_map\)\)\)\), (.*?), \(it", kernel)

    assert len(w_boxes(kernels[shared])) == 3 and w_boxes(kernels[shared]) == w_boxes(kernels[alone])
    assert "barrier_cluster_wait" in kernels[shared] and "barrier_cluster_wait" not in kernels[alone]


def test_transposed_w_hh_is_one_box_a_k_step_from_a_copy_made_as_the_weights_load():
    """hid_cell_bt: W_hh transposed once (``gru_split_wh``, a prepare call) into (dirs, 3H, H) with
    each tile's 96 rows its units' r, z and n, so a k step loads one 128-byte-row box of it
    instead of three 64-byte ones; every step reads the copy."""
    target = offline_cuda("sm_90")
    t = _template(96, 2048, bidirectional=True)
    alone = t.analytic_pick(target)[0].replace(**CELL_IN_GEMM, hid_cell_bt=0)
    bt = alone.replace(hid_cell_bt=1)
    assert t.space(target).infeasible_reason(bt) is None
    compiled = {c: t.compile(c, target) for c in (alone, bt)}
    boxes = {c: re.findall(r"&\(b_map\)\)\)\), (.*?), \(tvm_builtin", _kernel_source(compiled[c].source,
                                                                                       "gru_gemm_cell"))
             for c in compiled}
    assert len(boxes[alone]) == 3  # (its units' columns of a gate, k, direction): r, z and n
    # (k, the tile's first row of the copy: 96 a tile, direction)
    assert boxes[bt] == ["(it * 64), ((((int)blockIdx.x) & 63) * 96), (((int)blockIdx.x) >> 7)"]
    calls = compiled[bt].function_calls()
    assert calls[0].name == "gru_split_wh" and calls[0].args == ("w_hh0", "wh0")
    assert [c.args[1] for c in calls if c.name == "gru_gemm_cell"] == ["wh0"] * t.seq
    assert t.for_config(bt).scratch_specs()["wh0"].shape == (2, 3 * 2048, 2048)
    assert "wh0" not in t.for_config(alone).scratch_specs()


def test_24_unit_tiles_read_72_rows_of_the_copy_a_box_and_fill_128_blocks_at_h1536():
    """hid_cell_units 24: 72-column tiles (m64n72 wgmma) over the transposed copy in 24-unit tile
    order, 64 column tiles where 32 units make 48 (B128 H1536: 128 blocks in K halves, not 96).
    A 128x72 tile's C is 1152 16-byte chunks, no multiple of its 256 threads: the cell's own store
    takes it from the registers, so the space takes the tile (a plain GEMM's staged C could not)."""
    target = offline_cuda("sm_90")
    t = _template(128, 1536)
    pick = t.analytic_pick(target)[0]
    assert (pick.hid_cell, pick.hid_cell_bt, pick.hid_cell_units) == (3, 1, 32)
    narrow = pick.replace(hid_cell_units=24)
    assert t.space(target).infeasible_reason(narrow) is None
    assert t.step_variant(narrow).wgmma.name == "wgmma 128x72x64 s6 w1 direct k/2 cluster tma pdl"
    assert [cell_blocks(128, 1536, 1, 3, units) for units in (32, 24)] == [96, 128]
    compiled = t.compile(narrow, target)
    kernel = _kernel_source(compiled.source, "gru_gemm_cell")
    assert "m64n72k16" in kernel and "m64n96k16" not in kernel
    # each block's first row of the copy: its tile's (two K halves a tile), 72 rows a tile
    assert re.findall(r"col0_ptr\[0\] = (.*?);", kernel) == ["((((int)blockIdx.x) >> 1) * 72)"]
    assert compiled.function_calls()[0].name == "gru_split_wh"
    with pytest.raises(TvmExtError, match="16-byte chunks of C"):  # C staged: whole chunks a thread
        wgmma_gemm(replace(t.step_variant(narrow).wgmma, split=1, cluster=False, smem_epilogue=True), 128, 4608,
                   1536, b_layout="NK")


def test_24_unit_tiles_need_w_hh_in_tile_order():
    """W_hh as stored (B (K, N)) is read in whole 32-column atoms: 72 columns are refused, naming
    them; the copy in tile order is made in 32 x 32 tiles, so H must be a multiple of 32 too."""
    target = offline_cuda("sm_90")
    t = _template(128, 1536)
    stored = t.analytic_pick(target)[0].replace(hid_cell_bt=0, hid_cell_units=24)
    assert "72" in t.space(target).infeasible_reason(stored)
    # K whole (its last k step ragged): 63 tiles of 24 units at H1512, but no whole 32 x 32 tiles of the copy
    tile = cell_tile(WgmmaTile(64, 64, 8, smem_epilogue=False, tma=True), 1512, 1, units=24)
    assert "hidden 1512 is no multiple of 32" in cell_tile_reason(tile, 64, 1512, transposed=True)
    assert cell_tile_reason(cell_tile(tile, 1536, 1, units=24), 64, 1536, transposed=True) is None


def test_k_split_in_a_cluster_stores_only_the_rows_below_a_ragged_batch():
    """B70 on 64-row tiles with K in a cluster's halves: every cell the cluster's sums feed
    stores h' (h_out, out, h_n) only where its row is below the batch (each block's band of 32
    rows: below 70, or 54 for the second band's threads); B64 has no guard."""
    target = offline_cuda("sm_90")
    kernels = {}
    for batch in (70, 64):
        t = _template(batch, 512)
        cfg = t.default_config(target).replace(**{**CELL_IN_GEMM, "hid_cell": 2})
        assert t.space(target).infeasible_reason(cfg) is None
        kernels[batch] = _kernel_source(t.compile(cfg, target).source, "gru_gemm_cell")
    guarded = re.findall(r"\) < (\d+)\) \{\n    h_out_ptr\[", kernels[70])
    assert len(guarded) == kernels[70].count("h_out_ptr[") == kernels[64].count("h_out_ptr[") == 8
    assert set(guarded) == {"70", "54"}
    assert not re.findall(r"\) < \d+\) \{\n    h_out_ptr\[", kernels[64])


NO_WGMMA_GEMM = "runs the cell in the store of the hidden GEMM on wgmma"


@pytest.mark.parametrize("knobs, reason", [
    ({"fuse_step": 0, "hid_wgmma": 0, "hid_cell": 1}, "hid_cell 1 " + NO_WGMMA_GEMM),
    ({"fuse_step": 1, "hid_wgmma": 0, "hid_cell": 1}, "hid_cell 1 " + NO_WGMMA_GEMM),
    ({"fuse_step": 0, "hid_wgmma": 0, "hid_cell": 3}, "hid_cell 3 " + NO_WGMMA_GEMM),  # the form named
    ({"fuse_step": 0, "hid_wgmma": 1, "hid_cell": 0, "hid_cell_share": 1}, "pairs the tiles of the cell in the"),
    ({"fuse_step": 0, "hid_wgmma": 1, "hid_cell": 2, "hid_cell_share": 1}, "not hid_cell 2's halves of K"),
    ({"fuse_step": 0, "hid_wgmma": 1, "hid_cell": 3, "hid_cell_share": 1}, "not hid_cell 3's halves of K"),
    ({"fuse_step": 0, "hid_wgmma": 1, "hid_cell": 0, "hid_cell_bt": 1}, "hid_cell_bt 1 (W_hh transposed)"),
    ({"fuse_step": 0, "hid_wgmma": 1, "hid_cell": 0, "hid_cell_units": 24}, "hid_cell_units 24 (narrower"),
])
def test_space_refuses_hid_cell_without_the_wgmma_hidden_gemm(knobs, reason):
    target = offline_cuda("sm_90")
    t = _template(64, 1024)
    cfg = t.default_config(target).replace(**knobs)
    assert reason in t.space(target).infeasible_reason(cfg)


@pytest.mark.parametrize("tile, n, layout, gates", [
    (WgmmaTile(64, 96, 8, smem_epilogue=False), 3 * 80, "KN", 80),  # 80 units: no whole tiles of 32
    (WgmmaTile(64, 96, 8, smem_epilogue=False), 3 * 80, "NK", 80),  # Bt (N, K) in tile order: whole tiles too
    (WgmmaTile(64, 96, 8, smem_epilogue=True), 3 * 64, "KN", 64),  # C staged: the store is the caller's
    (WgmmaTile(64, 64, 8, smem_epilogue=False), 3 * 64, "KN", 64),  # 64 columns: no three gates
    # a pair sharing Bt's tile (raster groups) would split the gates' rows between its blocks
    (WgmmaTile(64, 96, 8, smem_epilogue=False, raster=2, tma=True, specialized=True, multicast=True), 3 * 64,
     "NK", 64),
])
def test_a_gate_grouped_tile_refuses_what_it_cannot_read(tile, n, layout, gates):
    with pytest.raises(TvmExtError, match="three gates"):
        wgmma_gemm(tile, 64, n, 512, b_layout=layout, gates=gates)


def test_records_key_the_knob_with_the_tile_it_derives_from():
    """The cell's tile is the hidden GEMM's tile made 96 columns wide: the workload key names that
    tile (``hid_wgmma``), the config the knob; configs without the knob keep their value."""
    target = offline_cuda("sm_90")
    t = _template(64, 2048)
    assert t.params["hid_wgmma"] == "wgmma 64x64x64 s8 w1 direct tma ws pdl"
    assert t.default_config(target).hid_cell == 0
    assert t.step_variant(t.default_config(target).replace(**CELL_IN_GEMM)).wgmma.name == \
        "wgmma 64x96x64 s8 w1 direct tma ws pdl"


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
GPU_SHAPES = {
    # both directions (each its own bias row), two layers, 70 rows: the last 64-row tile guarded
    "b70-h512-2layer-bi": (Shape(seq=5, batch=70, input=64, hidden=512, layers=2, bidirectional=True), 1),
    # K split in a cluster, two layers, both directions
    "b64-h512-2layer-bi-split": (Shape(seq=5, batch=64, input=64, hidden=512, layers=2, bidirectional=True), 2),
    "b64-h1536": (Shape(seq=4, batch=64, input=96, hidden=1536), 1),
    "b64-h1536-split": (Shape(seq=4, batch=64, input=96, hidden=1536), 2),
    # two 64-row tiles a column of them, both directions
    "b128-h256-bi": (Shape(seq=4, batch=128, input=64, hidden=256, bidirectional=True), 1),
    # 128-row tiles with K split, two layers, both directions
    "b128-h512-2layer-bi-tall": (Shape(seq=5, batch=128, input=64, hidden=512, layers=2, bidirectional=True), 3),
    # 128-row tiles with K whole, the last one ragged (72 of its rows), two layers, both directions
    "b200-h512-2layer-bi-tall-whole": (Shape(seq=5, batch=200, input=64, hidden=512, layers=2, bidirectional=True),
                                       4),
    # h's k tiles shared by a cluster's two blocks (hid_cell_share): 64-row tiles, the last guarded,
    # and 128-row tiles (the last ragged), two layers, both directions
    "b70-h512-2layer-bi-shared": (Shape(seq=5, batch=70, input=64, hidden=512, layers=2, bidirectional=True),
                                  {"hid_cell": 1, "hid_cell_share": 1}),
    "b200-h512-2layer-bi-tall-whole-shared": (Shape(seq=5, batch=200, input=64, hidden=512, layers=2,
                                                    bidirectional=True), {"hid_cell": 4, "hid_cell_share": 1}),
    # W_hh from its transposed copy (hid_cell_bt) on every form: 64-row tiles (the last guarded),
    # K split in a cluster, 128-row tiles with K in halves and whole (the last ragged)
    "b70-h512-2layer-bi-bt": (Shape(seq=5, batch=70, input=64, hidden=512, layers=2, bidirectional=True),
                              {"hid_cell": 1, "hid_cell_bt": 1}),
    "b64-h1536-split-bt": (Shape(seq=4, batch=64, input=96, hidden=1536), {"hid_cell": 2, "hid_cell_bt": 1}),
    "b128-h512-2layer-bi-tall-bt": (Shape(seq=5, batch=128, input=64, hidden=512, layers=2, bidirectional=True),
                                    {"hid_cell": 3, "hid_cell_bt": 1}),
    "b200-h512-2layer-bi-tall-whole-bt": (Shape(seq=5, batch=200, input=64, hidden=512, layers=2, bidirectional=True),
                                          {"hid_cell": 4, "hid_cell_bt": 1, "hid_cell_share": 1}),
    # K split in a cluster with the last row tile ragged: 64-row tiles (6 of the last one's rows),
    # 128-row tiles (96 rows, one tile a column; W_hh transposed too), two layers, both directions
    "b70-h512-2layer-bi-split": (Shape(seq=5, batch=70, input=64, hidden=512, layers=2, bidirectional=True), 2),
    "b96-h512-2layer-bi-tall": (Shape(seq=5, batch=96, input=64, hidden=512, layers=2, bidirectional=True), 3),
    "b100-h1536-tall-bt": (Shape(seq=4, batch=100, input=96, hidden=1536), {"hid_cell": 3, "hid_cell_bt": 1}),
    # 192-row tiles with K in halves: one tile row (160 of its rows), two layers, both directions; two
    # tile rows, the last ragged (108 of 192), W_hh transposed; a whole one at H1536
    "b160-h512-2layer-bi-192": (Shape(seq=5, batch=160, input=64, hidden=512, layers=2, bidirectional=True), 5),
    "b300-h256-bi-192-bt": (Shape(seq=4, batch=300, input=64, hidden=256, bidirectional=True),
                            {"hid_cell": 5, "hid_cell_bt": 1}),
    "b192-h1536-192-bt": (Shape(seq=4, batch=192, input=96, hidden=1536), {"hid_cell": 5, "hid_cell_bt": 1}),
    # 256-row tiles (four consumer warpgroups) with K in halves: 250 of 256 rows, two layers, both
    # directions, W_hh transposed; two tile rows (300: 44 of the last)
    "b250-h512-2layer-bi-256-bt": (Shape(seq=5, batch=250, input=64, hidden=512, layers=2, bidirectional=True),
                                   {"hid_cell": 6, "hid_cell_bt": 1}),
    "b300-h256-256": (Shape(seq=4, batch=300, input=64, hidden=256), 6),
    # 24-unit tiles (hid_cell_units, W_hh transposed) on every form: 64-row tiles (the last guarded),
    # two layers, both directions; K split over a ragged 128-row tile; 128-row tiles with K whole
    # shared by a pair (the last ragged); 192 and 256 rows with K in halves (ragged)
    "b70-h768-2layer-bi-u24": (Shape(seq=5, batch=70, input=64, hidden=768, layers=2, bidirectional=True),
                               {"hid_cell": 1, "hid_cell_bt": 1, "hid_cell_units": 24}),
    "b64-h1536-split-u24": (Shape(seq=4, batch=64, input=96, hidden=1536),
                            {"hid_cell": 2, "hid_cell_bt": 1, "hid_cell_units": 24}),
    "b100-h1536-tall-u24": (Shape(seq=4, batch=100, input=96, hidden=1536),
                            {"hid_cell": 3, "hid_cell_bt": 1, "hid_cell_units": 24}),
    "b200-h768-tall-whole-shared-u24": (Shape(seq=4, batch=200, input=64, hidden=768),
                                        {"hid_cell": 4, "hid_cell_bt": 1, "hid_cell_share": 1, "hid_cell_units": 24}),
    "b160-h1536-192-u24": (Shape(seq=4, batch=160, input=96, hidden=1536),
                           {"hid_cell": 5, "hid_cell_bt": 1, "hid_cell_units": 24}),
    "b200-h1536-256-u24": (Shape(seq=4, batch=200, input=96, hidden=1536),
                           {"hid_cell": 6, "hid_cell_bt": 1, "hid_cell_units": 24}),
}
# (precision, bound against float64, bound against the two-kernel step): the two steps add a
# tile's sums in different orders, which may round an output element one unit of its last place
# apart (2^-11 in float16, 2^-8 in bfloat16 at |h| in [0.5, 1)); the bound is two such units
PRECISIONS = {"float16": (HALF, 5e-3, 2e-3), "bfloat16": (BF16, 3e-2, 8e-3)}
GPU_CASES = [(key, dtype) for key in GPU_SHAPES for dtype in PRECISIONS]


@pytest.mark.gpu
@pytest.mark.parametrize("key, dtype", GPU_CASES)
def test_cuda_cell_in_the_hidden_gemm_matches_float64_and_the_two_kernel_step(key, dtype):
    (s, cell), (precision, bound, two_kernel_bound) = GPU_SHAPES[key], PRECISIONS[dtype]
    knobs = cell if isinstance(cell, dict) else {"hid_cell": cell}

    def build(config: dict) -> GRU:
        return GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional,
                         batch=s.batch, seq=s.seq, config=config, precision=precision).load_numpy(_weights(s))

    gru = build({**CELL_IN_GEMM, **knobs})
    x, h0 = _inputs(s)
    assert_reruns_match_float64(gru, s, x, h0, bound, 1e-6)
    assert_reruns_match_float64(gru, s, x[::-1].copy(), -h0, bound, 1e-6, reruns=1)
    two_kernels = build({**CELL_IN_GEMM, "hid_cell": 0})
    ours, theirs = gru(x, h0), two_kernels(x, h0)
    for a, b in zip(ours, theirs):  # the same sums and the same cell: equal but for the sums' order
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=0,
                                   atol=two_kernel_bound)
