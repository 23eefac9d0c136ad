"""The wgmma GEMM template (``tvm_ext.schedules.gemm.wgmma``): C = A·Btᵀ on Hopper's warpgroup MMA,
a TVMScript PrimFunc in TVM's PTX dialect built by ``tvm.compile`` for sm_90a.

CI (no GPU): TVM builds the template's program for an offline sm_90 target and emits the
wgmma, fence and cp.async instructions; tiles, shapes and targets that cannot work are refused
with their reason, in the space and on the command line.  ``-m gpu``: each kind of variant
against float64 on NaN-poisoned outputs, and a real ``tune gemm-wgmma`` run.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tvm_ext.core.errors import TvmExtError
from tvm_ext.schedules.gemm.wgmma import WgmmaTile, compile_wgmma, wgmma_reason
from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate
from tvm_ext.target import offline_cuda

CLI = [sys.executable, "-m", "tvm_ext.tune"]


def _config(template, target, **knobs):
    """``knobs`` over the probe's best tile at 4096^3 (128x256, 4 stages, a group in flight,
    shared-memory epilogue), whatever the shape's default."""
    return template.space(target).make(**{**WgmmaTile(128, 256, 4, 1, True, 0).knobs(), **knobs})


def _c_against_float64(t, program, reruns=2):
    """``program`` of template ``t`` on standard normal float16 operands, C a view of a
    NaN-poisoned buffer a tile row (256 rows) longer, ``reruns`` times: C finite and within 1e-3
    of float64, the buffer's tail still NaN (a store past M or N writes there)."""
    import tvm

    rng = np.random.default_rng(0)
    operands = [rng.standard_normal(x.shape).astype(np.float16) for x in t.inputs()[:2]]
    ref = t.reference(operands)[0]
    m, n = ref.shape
    dev = tvm.cuda(0)
    for _ in range(reruns):  # a rerun: the same answer
        poisoned = tvm.runtime.tensor(np.full(m * n + 256 * n, np.nan, np.float16), dev)
        c = poisoned._create_view((m, n))
        program.executable.mod["main"](*(tvm.runtime.tensor(x, dev) for x in operands), c)
        out = c.numpy().astype(np.float64)
        assert np.isfinite(out).all()
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-3
        assert np.isnan(poisoned.numpy()[m * n:]).all()


def test_the_template_builds_the_warpgroup_mma_kernel():
    target = offline_cuda()
    t = WgmmaGemmTemplate(256, 256, 256)
    cfg = _config(t, target, wgmma_bm=128, wgmma_bn=128, wgmma_stages=3, wgmma_inflight=0)
    program = t.build_program(cfg, target)
    source = program.source
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in source
    assert "wgmma.commit_group" in source and "wgmma.wait_group" in source
    assert "fence.proxy.async.shared::cta" in source and "cp.async" in source
    assert program.params == ("A", "Bt", "C")
    assert program.trace == {"lowered": "wgmma", "config": cfg.as_dict()}  # the config is the record
    wide = WgmmaGemmTemplate(2048, 2048, 128)  # 128 tiles of 128x256 give 90 % of the SMs a block
    assert (wide.default_config(target).as_dict()["wgmma_bm"], wide.default_config(target).as_dict()["wgmma_bn"]) == \
        (128, 256)  # the probe's best tile
    assert "m64n256k16" in wide.build_program(wide.default_config(target), target).source
    small = WgmmaGemmTemplate(1024, 768, 768)  # 24 blocks of 128x256: the few-waves pick instead
    assert WgmmaTile.of(small.default_config(target)) == WgmmaTile(64, 96, 8, 1, True, 0, pdl=True, tma=True,
                                                                   specialized=True)


def test_a_gemm_of_a_wave_or_two_takes_the_cheapest_tile_its_blocks_resident_together():
    """Where 128x256 tiles make fewer than two waves, the pick (``few_waves``) takes the tile of
    least modelled time (the busiest SM's tiles over the tile's rate) where it beats the first-wave
    rule's, one C tile a block with the pipeline shallow enough for every block to be resident at
    once; where they cannot be, the first-wave rule's tile stands (and without ``few_waves``, as
    the GRU's, FP8's and 3xTF32's callers ask, always)."""
    from tvm_ext.hardware import SHARED_RESERVED_PER_BLOCK, WGMMA_SHARED_PER_SM
    from tvm_ext.schedules.gemm.tensor_core_choice import TensorCoreChoiceTemplate
    from tvm_ext.schedules.gemm.wgmma_template import pick_wgmma_tile

    target = offline_cuda()

    def pick(m, n, k, few_waves=True):
        return pick_wgmma_tile([(m, n, k)], target, "float16", split_k=True, ragged_m=True, few_waves=few_waves)

    # 128 tiles of 64x96, one wave: K is 12 k steps and M a multiple of 64 (the narrow tile weighed),
    # 8 stages (every block resident alone), by the TMA (10 16-byte copies a thread a stage),
    # warp-specialized with C staged through a stage of its own (``narrow_specialized``)
    assert pick(1024, 768, 768) == WgmmaTile(64, 96, 8, 1, True, 0, tma=True, specialized=True)
    kn = pick_wgmma_tile([(1024, 768, 768)], target, "float16", "KN", split_k=True, ragged_m=True, few_waves=True)
    assert kn == WgmmaTile(64, 96, 8, 1, True, 0, tma=True)  # B (K, N): not specialized (not measured so)
    assert pick(1024, 768, 1536) == pick(1024, 768, 768)  # 24 k steps: the narrow tiles too (``narrow_whole_wave``)
    assert pick(1000, 768, 768) == WgmmaTile(128, 64, 6, 1, True, 0)  # M ragged: the same
    assert pick(1024, 768, 768, few_waves=False) == WgmmaTile(64, 64, 8, 1, True, 8, tiles=2, tma=True)  # 24 k steps
    tokens = pick(700, 3072, 768)  # 264 tiles of 64x128: two a SM, so 4 stages rather than 6
    assert (tokens.bm, tokens.bn, tokens.stages, tokens.tiles) == (64, 128, 4, 1)
    assert tokens.tma  # 12 k steps, but 12 16-byte copies a thread a stage by cp.async (128x64: 6, and no TMA)
    assert pick(1024, 3072, 768) == WgmmaTile(128, 192, 4, 1, True, 0, tma=True)  # 128 tiles: one wave, not 1.5
    assert 2 * (tokens.smem_bytes() + SHARED_RESERVED_PER_BLOCK) <= WGMMA_SHARED_PER_SM
    assert 2 * (dataclasses.replace(tokens, stages=5).smem_bytes() + SHARED_RESERVED_PER_BLOCK) > WGMMA_SHARED_PER_SM
    assert pick(1500, 768, 768) == WgmmaTile(128, 128, 6, 1, True, 0)  # 72 tiles rather than 144 two a block
    for m, n, k in ((1500, 3072, 768), (2048, 3072, 768), (4096, 4096, 4096)):
        assert pick(m, n, k) == pick(m, n, k, few_waves=False)  # not resident together, or many waves
    assert WgmmaGemmTemplate(700, 3072, 768).default_config(target).as_dict()["wgmma_bn"] == 128
    choice = TensorCoreChoiceTemplate(1024, 768, 768, a_dtype="float16", b_dtype="float16", c_dtype="float16")
    config, why = choice.analytic_pick(target)  # 128 tiles of 64x96, B (K, N) in 32-wide N atoms: wgmma
    assert config.as_dict()["tc_kernel"] == "wgmma" and "64x96" in why
    for c_dtype in ("float16", "float32"):  # B (K, N) over 48 k steps: K split in a cluster, as gemm-wgmma's
        choice = TensorCoreChoiceTemplate(1024, 768, 3072, a_dtype="float16", b_dtype="float16", c_dtype=c_dtype)
        config, why = choice.analytic_pick(target)
        tile = WgmmaTile.of(choice.kernel_config(config)[1])
        assert (tile.bm, tile.bn, tile.split, tile.cluster) == (128, 128, 2, True), why
        assert tile == WgmmaTile.of(WgmmaGemmTemplate(1024, 768, 3072, b_layout="KN").default_config(target))
    # Bt (N, K) at 16 k steps or more (BERT-base's FFN down: 48): the 128 narrow tiles, one wave, K
    # whole, warp-specialized; a wave of fewer tiles (M 512: 64), a shallower K, a K no multiple of 64
    # or B (K, N) keep the pick they had
    narrow = WgmmaTile(64, 96, 8, 1, True, 0, tma=True, specialized=True)
    for k in (1024, 1280, 2048, 3072, 4096, 8192):
        assert pick(1024, 768, k) == pick(960, 768, k) == pick(512, 1536, k) == narrow, k
    ffn_down = WgmmaTile.of(WgmmaGemmTemplate(1024, 768, 3072).default_config(target))
    assert ffn_down.name == "wgmma 64x96x64 s8 w1 smem tma ws pdl"
    assert pick(512, 768, 3072).split > 1 and pick(512, 768, 3072).bn != 96
    for k in (960, 3000):
        assert pick(1024, 768, k).bn != 96, k
    kn_deep = pick_wgmma_tile([(1024, 768, 3072)], target, "float16", "KN", split_k=True, ragged_m=True, few_waves=True)
    assert kn_deep.split == 2
    wide_c = pick_wgmma_tile([(1024, 768, 3072)], target, "float32", split_k=True, ragged_m=True, few_waves=True)
    assert wide_c.split == 2 and wide_c.bn == 128  # C not staged (float32): not the tile measured


def test_a_skinny_gemm_gets_the_deep_64x64_pipeline():
    """64x3072x1024 (a GRU step's hidden GEMM at batch 64) takes only 64-row tiles; there 8
    shared-memory stages measured 0.93-0.94 of cuBLAS on the H100 (both replayed from CUDA
    graphs) against 0.88-0.91 with 4-6, so the default tile and the pick take 8."""
    from tvm_ext.schedules.gemm.wgmma_template import pick_wgmma_tile

    target = offline_cuda()
    t = WgmmaGemmTemplate(64, 3072, 1024)
    cfg = t.default_config(target)
    assert WgmmaTile.of(cfg) == WgmmaTile(64, 64, 8, 1, True, 0, pdl=True)
    assert t.space(target).is_feasible(cfg) and 8 in t.space(target).knob("wgmma_stages").choices
    assert pick_wgmma_tile([(64, 3072, 1024)], target, "float16") == WgmmaTile(64, 64, 8, 1, True, 0)
    source = t.build_program(cfg, target).source
    assert "m64n64k16" in source and "cp.async.wait_group 5" in source  # 8 stages: 6 tiles loaded ahead


def test_b_stored_k_by_n_is_read_n_major():
    """B (K, N): the wgmma's transposed-B flag set, B's 16-byte chunks laid out in 64-wide N atoms
    (``B_LAYOUTS``); the K-major kernel keeps the flag clear."""
    import re

    target = offline_cuda()
    t = WgmmaGemmTemplate(256, 512, 128, b_layout="KN")
    assert t.inputs()[1].shape == (128, 512) and t.params["b_layout"] == "KN"
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((256, 128)), rng.standard_normal((128, 512))
    assert np.allclose(t.reference([a, b])[0], a @ b)
    flags = lambda source: re.findall(r"m64n\d+k16\.f32\.f16\.f16 \{[^}]*\}, %\d+, %\d+, \w+, 1, 1, 0, (\d);",  # noqa: E731
                                      source)
    assert flags(t.build_program(t.default_config(target), target).source) == ["1"]
    nk = WgmmaGemmTemplate(256, 512, 128)
    assert flags(nk.build_program(nk.default_config(target), target).source) == ["0"]
    assert "multiple of 32" in wgmma_reason(WgmmaTile(128, 80, 4, 1, False, 0), 256, 160, 128, b_layout="KN")
    assert wgmma_reason(WgmmaTile(128, 96, 4, 1, False, 0), 256, 192, 128, b_layout="KN") is None
    assert wgmma_reason(WgmmaTile(128, 96, 4, 1, False, 0), 256, 192, 128) is None
    with pytest.raises(TvmExtError, match="allowed: NK, KN"):
        WgmmaGemmTemplate(64, 64, 64, b_layout="MN")


def test_more_tiles_than_a_wave_are_spread_over_one_block_an_sm():
    """Where C has more tiles than the SMs, the default and the pick give each block several
    (the fewest that fit one block an SM) in raster groups of 8 tile rows; the kernel loops over
    the block's tiles, its k loop inside, the store after it; a wave's worth keeps one a block."""
    from tvm_ext.schedules.gemm.wgmma_template import pick_wgmma_tile

    target = offline_cuda()  # 132 SMs
    gru_input = WgmmaGemmTemplate(8192, 3072, 1024)  # 64 x 12 tiles of 128x256
    tile = WgmmaTile.of(gru_input.default_config(target))
    assert (tile.bm, tile.bn, tile.tiles, tile.raster, tile.smem_epilogue) == (128, 256, 6, 8, True)
    assert pick_wgmma_tile([(8192, 3072, 1024)], target, "float32") == WgmmaTile(128, 256, 4, 1, False, 8, tiles=6,
                                                                                  tma=True)
    assert WgmmaTile.of(WgmmaGemmTemplate(8192, 8192, 8192).default_config(target)).tiles == 16
    assert WgmmaTile.of(WgmmaGemmTemplate(2048, 2048, 2048).default_config(target)).tiles == 1  # 128 tiles
    source = gru_input.build_program(gru_input.default_config(target), target).source
    kernel = source[source.index("main_kernel(half"):]
    kernel = kernel[kernel.index("{"):]
    # block b's tiles: b, b + 128, ... below 768 (6 each); 16 k tiles of 64 for each
    assert "for (int t = 0; t < (((767 - ((int)blockIdx.x)) >> 7) + 1); ++t)" in kernel
    tiles_loop, k_loop = kernel.index("for (int t = 0;"), kernel.index("for (int kt = 0; kt < 16; ++kt)")
    assert tiles_loop < k_loop


def test_past_a_wave_of_sixteen_tiles_a_block_the_waves_take_the_fewest_tile_times():
    """Where no choice of tiles a block fits one wave (more than 16 x 132 tiles), the blocks take
    the tiles a block whose waves cost fewest tile times, not 16: the GRU's input GEMM at B96 H2048
    (12288x6144x2048, 2304 tiles of 128x256) runs 384 blocks of 6 (3 waves, 18 tile times) where
    144 blocks of 16 took two waves (32); at B128 (3072 tiles) 256 blocks of 12 (24, not 32);
    at 6144 tiles 16 stays (3 waves, 48)."""
    from tvm_ext.schedules.gemm.wgmma_template import pick_wgmma_tile, spread_waves
    from tvm_ext.schedules.gru import GruTemplate

    target = offline_cuda()  # 132 SMs
    assert [spread_waves(count, 132) for count in (2304, 3072, 3600, 4608, 6144)] == [6, 12, 4, 12, 16]
    b96 = WgmmaGemmTemplate(12288, 6144, 2048)
    cfg = b96.default_config(target)
    assert (WgmmaTile.of(cfg).tiles, WgmmaTile.of(cfg).raster) == (6, 8)
    assert b96.build_program(cfg, target).launches[0].grid == (384, 1, 1)
    assert pick_wgmma_tile([(16384, 6144, 2048)], target, "float16", b_layout="KN").tiles == 12
    assert pick_wgmma_tile([(32768, 6144, 1024)], target, "float16", b_layout="KN").tiles == 16
    f16 = {n: "float16" for n in ("x", "w_ih", "gi", "w_hh", "h", "out")}
    gru = GruTemplate(batch=96, hidden=2048, input=2048, seq=128).with_precision(f16).with_tensor_cores(target)
    assert gru.in_wgmma_tile.tiles == 6


def test_a_split_k_runs_each_slice_as_a_unit_and_adds_the_slices_in_a_second_kernel():
    """BERT's FFN down (1024x768x3072): 48 tiles of 128x128 for 132 SMs, so the default splits K
    in two: 96 units, unit u the slice u // 48 of tile u % 48 (its k steps start at slice x 1536,
    its float32 sums go to slice x 1024 x 768 of the partial sums), then a kernel adds the two
    slices and stores C.  The partial sums are the function's own buffer (TVM's workspace)."""
    target = offline_cuda()
    t = WgmmaGemmTemplate(1024, 768, 3072)
    cfg = _config(t, target, wgmma_bn=128, wgmma_stages=6, wgmma_smem_epilogue=0, wgmma_split_k=2,
                  wgmma_pdl=1)  # cp.async: the operands named
    assert WgmmaTile.of(cfg) == WgmmaTile(128, 128, 6, 1, False, 0, split=2, pdl=True)
    program = t.build_program(cfg, target)
    assert program.params == ("A", "Bt", "C")
    gemm, add = program.launches
    assert gemm.grid == (96, 1, 1) and gemm.args == ("A", "Bt", "workspace:P")
    assert add.grid == (1024 * 768 // 4 // 256, 1, 1) and add.args == ("C", "workspace:P")
    source = program.source
    start = source.index("main_kernel(half* __restrict__ A_ptr, half* __restrict__ Bt_ptr, float* "
                         "__restrict__ P_ptr) {")
    kernel = source[start:source.rindex("main_kernel_1(half* __restrict__ C_ptr, float")]
    assert "for (int kt = 0; kt < 24; ++kt)" in kernel  # a slice's 24 k steps of 64
    assert "blockIdx.x) / 48) * 1536)" in kernel and "blockIdx.x) / 48) * 786432)" in kernel
    assert "m64n128k16" in kernel and "*(float2*)(P_ptr" in kernel
    adder = source[source.rindex("main_kernel_1(half* __restrict__ C_ptr, float"):]
    assert adder.count("*(float4*)(P_ptr") == 2  # both slices, 16 bytes a thread


def test_a_cluster_adds_the_slices_of_a_tile_in_its_shared_memory_in_one_kernel():
    """The default at BERT's FFN down with B (K, N): K in two, the two slices of a tile one thread-block cluster
    (adjacent blocks: slice blockIdx % 2, its k steps from slice x 1536); each block's float32
    sums go to its own shared memory, and block rank r adds rows [64r, 64r + 64) of both blocks'
    (``ld.shared::cluster``, 16 bytes at a time, 8 quads a thread) and stores them: one launch, no
    partial sums in global memory."""
    target = offline_cuda()
    t = WgmmaGemmTemplate(1024, 768, 3072, b_layout="KN")
    cfg = t.default_config(target)
    assert WgmmaTile.of(cfg) == WgmmaTile(128, 128, 6, 1, False, 0, split=2, cluster=True, tma=True, pdl=True)
    program = t.build_program(cfg.replace(wgmma_tma=0), target)  # cp.async: the operands named
    (gemm,) = program.launches
    assert gemm.grid == (96, 1, 1) and gemm.cluster == (2, 1, 1) and gemm.args == ("A", "Bt", "C")
    kernel = program.source[program.source.index("main_kernel(half* __restrict__ A_ptr"):]
    assert "for (int kt = 0; kt < 24; ++kt)" in kernel
    assert "((((int)blockIdx.x) & 1) * 1536)" in kernel  # the slice's first k column
    assert "(((int)blockIdx.x) & 1) * 49152)" in kernel  # the rank's 64 rows of C (x 768)
    assert kernel.count("tvm_builtin_ptx_ld_vec_shared__cluster_v4_f32(") == 2 * 8
    assert kernel.count("tvm_builtin_ptx_mapa_u32_shared__cluster_u32(") == 2
    assert kernel.count("tvm_builtin_ptx_barrier_cluster_arrive_cluster_arrive_release()") == 2
    assert "P_ptr" not in program.source


def test_a_cluster_adding_k_slices_stores_only_the_rows_below_a_ragged_m():
    """M = 700 on 128-row tiles with K in a cluster's two slices: the last tile row's sums are
    added as any other's, and each of C's stores is guarded below M; M = 768 has no guard."""
    import re

    target = offline_cuda()
    knobs = dict(wgmma_bm=128, wgmma_bn=96, wgmma_smem_epilogue=0, wgmma_split_k=2, wgmma_split_cluster=1, wgmma_tma=1)
    kernels = {}
    for m in (700, 768):
        t = WgmmaGemmTemplate(m, 768, 640)
        cfg = _config(t, target, **knobs)
        assert t.space(target).infeasible_reason(cfg) is None
        kernels[m] = t.build_program(cfg, target).source
    stores = kernels[700].count("*(half4*)(C_ptr")
    assert stores == kernels[768].count("*(half4*)(C_ptr") > 0
    guarded = r"\) < \d+\) \{\n    half4 "  # e.g. (row >> 2) < 175: row < 700, offsets folded in
    assert len(re.findall(guarded, kernels[700])) == stores and not re.findall(guarded, kernels[768])


def test_the_pick_splits_k_only_where_the_output_has_too_few_tiles():
    """``split_pick``: few wide tiles and a deep K split (FFN down, a 512x512 output of depth
    8192: 1.04x cuBLAS on the H100 against 0.57 unsplit); K too short to split (12 k steps) or
    enough tiles keep the unsplit pick; callers without the partial sums' buffer (the GRU) get
    no split."""
    from tvm_ext.schedules.gemm.wgmma_template import pick_wgmma_tile

    target = offline_cuda()

    def split_of(*shape, b_layout="NK"):
        return WgmmaTile.of(WgmmaGemmTemplate(*shape, b_layout=b_layout).default_config(target)).split

    assert split_of(1024, 768, 3072, b_layout="KN") == 2 and split_of(512, 512, 8192) == 8
    cluster = WgmmaTile.of(WgmmaGemmTemplate(1024, 768, 3072, b_layout="KN").default_config(target)).cluster
    assert cluster and not WgmmaTile.of(WgmmaGemmTemplate(512, 512, 8192).default_config(target)).cluster
    assert split_of(1024, 768, 768) == split_of(1024, 3072, 768) == split_of(4096, 4096, 4096) == 1
    assert pick_wgmma_tile([(1024, 768, 3072)], target, "float16").split == 1
    assert pick_wgmma_tile([(1024, 768, 3072)], target, "float16", split_k=True).split == 2


@pytest.mark.parametrize("shape, knobs, reason", [
    ((4096, 4096, 4096), dict(wgmma_stages=2, wgmma_inflight=1), "at least 3 stages"),
    ((4096, 4096, 4096), dict(wgmma_inflight=0, wgmma_tiles=4, wgmma_stages=4), "too few for 2"),
    ((4096, 4096, 4096), dict(wgmma_stages=6), "bytes of shared memory"),
    ((4096, 4002, 4096), dict(), "N = 4002 is no multiple of bn 256: its last tile column is guarded with Bt"),
    ((4096, 4096, 4000), dict(wgmma_smem_epilogue=0, wgmma_tma=0), "K (4000) must divide the tile's k step 64 but"),
    ((4096, 4096, 4000), dict(wgmma_smem_epilogue=0, wgmma_tma=1, wgmma_split_k=2), "K (4000) must divide the tile"),
    ((4096, 4096, 4004), dict(wgmma_smem_epilogue=0, wgmma_tma=1), "K (4004) must be a multiple of 8"),
    ((700, 768, 3072), dict(wgmma_smem_epilogue=0, wgmma_split_k=2), "guarded in the unsplit kernel and where a"),
    ((256, 256, 256), dict(wgmma_bn=128, wgmma_raster=4), "raster group (4) must divide the 2 tile rows"),
    ((700, 256, 256), dict(wgmma_bn=128, wgmma_raster=4), "raster group (4) must divide the 6 tile rows"),
    ((256, 250, 256), dict(wgmma_bm=64, wgmma_bn=192), "staged through shared memory only where N is a multiple"),
    ((512, 512, 256), dict(wgmma_bm=256, wgmma_bn=256, wgmma_stages=3),
     "registers"),  # failed to launch on the H100
    ((1024, 768, 768), dict(wgmma_smem_epilogue=0, wgmma_split_k=8),
     "12 steps of 64 must split into 8 equal slices"),
    ((1024, 768, 3072), dict(wgmma_split_k=2), "split K stores float32 sums"),
    ((1024, 768, 3072), dict(wgmma_smem_epilogue=0, wgmma_split_k=3, wgmma_split_cluster=1),
     "the split must divide bm"),
    ((1024, 768, 3072), dict(wgmma_smem_epilogue=0, wgmma_split_k=2, wgmma_split_cluster=1, wgmma_tiles=2,
                             wgmma_stages=3), "wgmma_tiles 1"),
    ((1024, 768, 3072), dict(wgmma_smem_epilogue=0, wgmma_split_cluster=1, wgmma_stages=3), "wgmma_split_k > 1"),
    ((1024, 768, 3072), dict(wgmma_bn=256, wgmma_stages=2, wgmma_inflight=0, wgmma_smem_epilogue=0, wgmma_split_k=2,
                             wgmma_tiles=1, wgmma_split_cluster=1), "do not fit in the stages' shared memory"),
    # 512 threads: a 96-row Bt tile's 768 chunks of a stage do not split evenly (the TMA's boxes do)
    ((1024, 768, 3072), dict(wgmma_bm=256, wgmma_bn=96, wgmma_stages=4, wgmma_smem_epilogue=0, wgmma_split_k=2,
                             wgmma_tiles=1, wgmma_split_cluster=1, wgmma_raster=0, wgmma_tma=0, wgmma_ws=0,
                             wgmma_multicast=0), "a stage copied by cp.async, must split evenly"),
])
def test_tiles_and_shapes_that_cannot_work_are_refused_with_their_reason(shape, knobs, reason):
    target = offline_cuda()
    t = WgmmaGemmTemplate(*shape)
    cfg = WgmmaGemmTemplate(4096, 4096, 4096).default_config(target).replace(**knobs)
    assert reason in t.space(target).infeasible_reason(cfg)
    with pytest.raises(TvmExtError, match="must divide|no multiple|multiple of 8|stages|shared memory|registers|split"):
        t.build_program(cfg, target)


def test_tma_loads_a_stage_whose_chunks_do_not_split_over_the_threads():
    """256x96 with K split in a cluster: 512 threads could not copy a stage's 96-row Bt tile by
    cp.async (768 chunks); the TMA loads it whole, so the space takes it and it builds."""
    target = offline_cuda()
    t = WgmmaGemmTemplate(1024, 768, 3072)
    cfg = t.default_config(target).replace(wgmma_bm=256, wgmma_bn=96, wgmma_stages=4, wgmma_smem_epilogue=0,
                                           wgmma_split_k=2, wgmma_tiles=1, wgmma_split_cluster=1, wgmma_tma=1,
                                           wgmma_ws=0, wgmma_multicast=0)
    assert t.space(target).infeasible_reason(cfg) is None
    assert "__launch_bounds__(512)" in t.build_program(cfg, target).source


def test_targets_without_wgmma_and_untileable_shapes_are_errors(opencl):
    t = WgmmaGemmTemplate(256, 256, 256)
    with pytest.raises(TvmExtError, match="Hopper GPU \\(sm_90\\); this one is sm_80"):
        t.default_config(offline_cuda("sm_80"))
    with pytest.raises(TvmExtError, match="not opencl's"):
        t.default_config(opencl)
    assert WgmmaGemmTemplate(192, 128, 128).default_config(offline_cuda()).as_dict()["wgmma_bm"] == 64
    with pytest.raises(TvmExtError, match="no wgmma tile fits 30x128x128: .* more than half of their last tile"):
        WgmmaGemmTemplate(30, 128, 128).default_config(offline_cuda())  # mma.sync's 16-row tiles take it
    with pytest.raises(TvmExtError, match="no wgmma tile fits 128x99x128: K must be a multiple of 64 \\(of 8 on "
                                          "16-bit operands"):
        WgmmaGemmTemplate(128, 99, 128).default_config(offline_cuda())
    with pytest.raises(TvmExtError, match="no wgmma tile fits 128x128x100"):
        WgmmaGemmTemplate(128, 128, 100).default_config(offline_cuda())
    assert WgmmaGemmTemplate(128, 100, 128).default_config(offline_cuda()).as_dict()["wgmma_smem_epilogue"] == 0
    assert WgmmaTile().name == "wgmma 128x256x64 s4 w1 smem"


def test_cli_refuses_a_target_without_wgmma(tmp_path):
    p = subprocess.run(CLI + ["gemm-wgmma", "--shape", "512,512,512", "--target", "opencl", "--records",
                              str(tmp_path / "r.jsonl"), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0] == "error: wgmma is a CUDA (Hopper, sm_90) instruction, not opencl's"


def test_a_batch_of_gemms_indexes_each_matrix_and_counts_its_tiles():
    """Attention's (batch, heads) products: A, B and C carry the leading axes (B without them when
    shared), the tiles of every matrix count for the pick (96 matrices of 128x128: 192 tiles of
    128x64, two a block, not 96 blocks of 128x128), and the kernel offsets each tile's matrix."""
    import re

    target = offline_cuda()
    t = WgmmaGemmTemplate(128, 128, 64, b_layout="KN", batch=(8, 12))
    assert [s.shape for s in t.inputs()] == [(8, 12, 128, 64), (8, 12, 64, 128)]
    assert t.outputs()[0].shape == (8, 12, 128, 128) and t.flops() == 2 * 128 * 128 * 64 * 96
    assert t.params["batch"] == [8, 12] and "batch" not in WgmmaGemmTemplate(128, 128, 64).params
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 12, 128, 64)), rng.standard_normal((8, 12, 64, 128))
    assert np.allclose(t.reference([a, b])[0][5, 7], a[5, 7] @ b[5, 7])
    tile = WgmmaTile.of(t.default_config(target))
    assert (tile.bm, tile.bn, tile.tiles) == (128, 64, 2)  # 96 blocks of two 128x64 tiles
    source = t.build_program(t.default_config(target), target).source
    kernel = source[source.index("main_kernel(half"):]
    # tile t of block b is b + 96 t, of matrix (b + 96 t) // 2; the first one's A at 8192 halves a matrix
    assert "for (int t = 0; t < (((191 - ((int)blockIdx.x)) / 96) + 1); ++t)" in kernel
    assert re.search(r"A_ptr\[\(+\(\(int\)blockIdx\.x\) >> 1\) \* 8192\)", kernel)
    shared = WgmmaGemmTemplate(128, 256, 256, batch=(3,), b_shared=True)
    assert [s.shape for s in shared.inputs()] == [(3, 128, 256), (256, 256)]
    a3, bt = rng.standard_normal((3, 128, 256)), rng.standard_normal((256, 256))
    assert np.allclose(shared.reference([a3, bt])[0][2], a3[2] @ bt.T)
    with pytest.raises(TvmExtError, match="batch axes must be >= 1"):
        WgmmaGemmTemplate(128, 128, 64, batch=(8, 0))


def test_cli_batch_options_are_checked(tmp_path):
    for extra, message in ((["--batch", "8,x"], "malformed"), (["--b-shared"], "--b-shared needs --batch")):
        p = subprocess.run(CLI + ["gemm-wgmma", "--shape", "128,128,64", "--target", "cuda", *extra, "--records",
                                  str(tmp_path / "r.jsonl"), "--no-progress"], capture_output=True, text=True,
                           timeout=300)
        err = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(err) == 1 and message in err[0], p.stdout + p.stderr


def _cubin_builds(source: str) -> bool:
    """Whether nvcc (ptxas) assembles ``source`` for sm_90a: the wgmma forms are real PTX."""
    from tvm_ext.cost_model.ptxas import ptxas_of_source

    return ptxas_of_source(source, "sm_90a") is not None


@pytest.mark.parametrize("shape, b_layout, knobs, c_dtype", [
    ((512, 768, 640), "NK", dict(), None),  # staged through shared memory as bfloat16
    ((512, 768, 640), "KN", dict(wgmma_smem_epilogue=0), "float32"),
    ((1024, 768, 3072), "NK", None, None),  # the default: K split in a cluster
])
def test_bfloat16_operands_take_the_bf16_wgmma_form(shape, b_layout, knobs, c_dtype):
    """``dtype`` bfloat16: A, B and C bfloat16 (the record's params say so), the
    ``m64nNk16.f32.bf16.bf16`` form on the same 2-byte stages, swizzle and descriptors, C
    bfloat16 (staged in shared memory or stored directly) or float32; ptxas assembles it for
    sm_90a where nvcc is installed."""
    target = offline_cuda()
    t = WgmmaGemmTemplate(*shape, b_layout=b_layout, dtype="bfloat16")
    assert [s.dtype for s in t.inputs() + t.outputs()] == ["bfloat16"] * 3
    assert (t.params["a_dtype"], t.params["b_dtype"], t.params["c_dtype"]) == ("bfloat16",) * 3
    cfg = t.default_config(target) if knobs is None else _config(t, target, **knobs)
    assert t.tile(cfg).name.startswith("wgmma bfloat16 ")
    source = (t.build_program(cfg, target).source if c_dtype is None
              else compile_wgmma(t.kernel_func(cfg, c_dtype), target, cfg).source)
    bn = t.tile(cfg).bn
    assert f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.bf16.bf16" in source and ".f16.f16" not in source
    assert "half" not in source.split("extern \"C\" __global__")[1]  # no float16 left in the kernels
    out = "float" if c_dtype else "nv_bfloat16"
    assert f"{out}* __restrict__ C_ptr" in source
    if shutil.which("nvcc"):
        assert _cubin_builds(source)


def test_the_float16_kernel_is_unchanged_by_the_operand_parameter():
    """float16 stays the default: the same params (old records load) and the same source."""
    target = offline_cuda()
    t, explicit = WgmmaGemmTemplate(512, 768, 640), WgmmaGemmTemplate(512, 768, 640, dtype="float16")
    cfg = t.default_config(target)
    assert t.params == explicit.params and "dtype" not in t.params and t.tolerance == 2e-3
    assert t.build_program(cfg, target).source == explicit.build_program(cfg, target).source
    with pytest.raises(TvmExtError, match="allowed: float16, bfloat16"):
        WgmmaGemmTemplate(128, 128, 128, dtype="float32")


def test_the_shared_memory_epilogue_stages_c_in_the_operands_dtype():
    """The stages hold the operands' dtype, so C staged there must be it: a bfloat16 GEMM
    storing float16 or float32 C (or a float16 one storing bfloat16) stores it directly, and a
    staged one is refused with that reason."""
    from tvm_ext.schedules.gemm.wgmma import epilogue_reason, wgmma_gemm

    bf16, f16 = WgmmaTile(operand="bfloat16"), WgmmaTile()
    assert epilogue_reason(bf16, "bfloat16") is None and epilogue_reason(f16, "float16") is None
    for tile, c_dtype in ((bf16, "float16"), (bf16, "float32"), (f16, "bfloat16"), (f16, "float32")):
        assert f"stages {tile.operand} C only" in epilogue_reason(tile, c_dtype)
        assert epilogue_reason(dataclasses.replace(tile, smem_epilogue=False), c_dtype) is None
    assert "not int8" in epilogue_reason(dataclasses.replace(bf16, smem_epilogue=False), "int8")
    with pytest.raises(TvmExtError, match="stages bfloat16 C only"):
        wgmma_gemm(bf16, 256, 256, 256, c_dtype="float16")
    direct = wgmma_gemm(dataclasses.replace(bf16, smem_epilogue=False), 256, 256, 256, c_dtype="float16",
                        bias_dtype="bfloat16")
    assert [str(p.dtype) for p in direct.params] == ["bfloat16", "bfloat16", "bfloat16", "float16"]  # A, Bt, bias, C


def test_the_bfloat16_check_is_float64_of_the_rounded_inputs_within_bfloat16_rounding():
    """The CPU side of a bfloat16 run: the reference is float64 of the bfloat16 inputs, and the
    check passes their product rounded to bfloat16 (about 2e-3 of error) but fails a kernel that
    drops one k step of 64 (a wrong stage) or leaves a tile unwritten (NaN)."""
    from tvm_ext.precision.precision import cast

    t = WgmmaGemmTemplate(128, 128, 256, dtype="bfloat16")
    rng = np.random.default_rng(0)
    a, bt = (cast(rng.uniform(-1, 1, s.shape), "bfloat16") for s in t.inputs())
    (ref,) = t.reference([a, bt])
    assert np.array_equal(ref, a.astype(np.float64) @ bt.astype(np.float64).T)
    good = cast(ref, "bfloat16")
    assert t.check([good], [ref]) is None
    err = np.linalg.norm(good.astype(np.float64) - ref) / np.linalg.norm(ref)
    assert 5e-4 < err < t.tolerance  # bfloat16's rounding, within the tolerance
    short = cast(a[:, 64:].astype(np.float64) @ bt[:, 64:].astype(np.float64).T, "bfloat16")
    assert "exceeds" in t.check([short], [ref])
    unwritten = good.copy()
    unwritten[:64, :64] = np.nan
    assert t.check([unwritten], [ref]) is not None


def test_a_bfloat16_record_names_its_dtype_and_loads_back():
    """Records: a bfloat16 GEMM's params name bfloat16 A, B and C and load as that template;
    operands of two types, or C of another, are no wgmma GEMM's."""
    from tvm_ext.operators import template_of
    from tvm_ext.core.template import Workload

    target = offline_cuda()
    t = WgmmaGemmTemplate(256, 256, 128, b_layout="KN", dtype="bfloat16")
    params = Workload.of(t, target).as_json()["params"]
    assert template_of({"template": "gemm_wgmma", "params": params}) == t
    assert template_of({"template": "gemm_wgmma", "params": {**params, "b_dtype": "float16"}}) is None
    assert template_of({"template": "gemm_wgmma", "params": {**params, "c_dtype": "float32"}}) is None
    f16 = Workload.of(WgmmaGemmTemplate(256, 256, 128), target).as_json()["params"]
    assert template_of({"template": "gemm_wgmma", "params": f16}) == WgmmaGemmTemplate(256, 256, 128)


def test_cli_takes_bfloat16_for_gemm_wgmma_and_gemm_tc_picks_wgmma_for_it(tmp_path):
    """``tune gemm-wgmma --dtype bfloat16`` makes the bfloat16 template (other dtypes: one error
    line); ``tune gemm-tc`` with bfloat16 in and out picks the wgmma kernel on Hopper."""
    from tvm_ext.cli.operator_cli import gemm_wgmma_template
    from tvm_ext.tune import build_parser

    args = build_parser().parse_args(["gemm-wgmma", "--shape", "256,128,64", "--dtype", "bfloat16"])
    assert gemm_wgmma_template(args) == WgmmaGemmTemplate(256, 128, 64, dtype="bfloat16")
    bad = subprocess.run(CLI + ["gemm-wgmma", "--shape", "128,128,64", "--dtype", "float32", "--records",
                                str(tmp_path / "r.jsonl")], capture_output=True, text=True, timeout=300)
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 2 and len(errors) == 1 and "float32" in errors[0], bad.stderr
    p = subprocess.run(CLI + ["gemm-tc", "--shape", "4096,4096,4096", "--in-dtype", "bfloat16", "--out-dtype",
                              "bfloat16", "--target", "cuda", "--strategy", "analytic", "--no-measure", "--records",
                              str(tmp_path / "tc.jsonl"), "--no-progress"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "config: tc_kernel=wgmma " in p.stdout and "wgmma bfloat16 128x256x64" in p.stdout, p.stdout


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("b_layout", ["NK", "KN"])
@pytest.mark.parametrize("knobs", [dict(), dict(wgmma_smem_epilogue=0), dict(wgmma_inflight=0),
                                   dict(wgmma_bm=256, wgmma_bn=128, wgmma_raster=2), dict(wgmma_bn=128, wgmma_stages=6),
                                   dict(wgmma_bm=64, wgmma_bn=64, wgmma_stages=2, wgmma_inflight=0), dict(wgmma_bn=192),
                                   dict(wgmma_bn=192, wgmma_tiles=6),
                                   dict(wgmma_tiles=4, wgmma_smem_epilogue=0, wgmma_raster=2),
                                   dict(wgmma_bm=256, wgmma_bn=128, wgmma_tiles=3),
                                   dict(wgmma_smem_epilogue=0, wgmma_split_k=2),
                                   dict(wgmma_bn=128, wgmma_smem_epilogue=0, wgmma_split_k=2, wgmma_tiles=3,
                                        wgmma_raster=2),
                                   dict(wgmma_bn=128, wgmma_smem_epilogue=0, wgmma_split_k=2, wgmma_split_cluster=1,
                                        wgmma_raster=2),
                                   dict(wgmma_bm=64, wgmma_bn=192, wgmma_stages=4, wgmma_smem_epilogue=0,
                                        wgmma_split_k=2, wgmma_split_cluster=1)])
def test_cuda_wgmma_variants_match_float64(knobs, b_layout):
    """Both B layouts (KN: the transposed-B descriptors, N atoms and their swizzle; a wrong
    stride or swizzle scrambles B and the error is O(1)); several tiles a block, unevenly
    (16 tiles of 128x192 over 3 blocks: 6, 5 and 5), through the free stages or directly; K split
    in two (a wrong slice offset adds one half twice: O(1) error), with several units a block."""
    import tvm

    from tvm_ext.target import resolve_target

    m, n, k = 512, 768, 640  # 2-8 x 3-12 blocks, 10 k tiles: every stage is reused
    target = resolve_target("cuda")
    t = WgmmaGemmTemplate(m, n, k, b_layout=b_layout)
    program = t.build_program(_config(t, target, **knobs), target)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float16)
    bt = rng.standard_normal(t.inputs()[1].shape).astype(np.float16)
    ref = t.reference([a, bt])[0]
    dev = tvm.cuda(0)
    c = tvm.runtime.tensor(np.full((m, n), np.nan, np.float16), dev)  # poisoned: unwritten tiles fail
    program.executable.mod["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(bt, dev), c)
    out = c.numpy().astype(np.float64)
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-3  # float16 output rounding: about 2e-4


@pytest.mark.gpu
@pytest.mark.parametrize("shape, knobs", [
    ((512, 768, 640), dict(wgmma_bm=64, wgmma_bn=96, wgmma_stages=6)),
    ((1024, 768, 768), dict(wgmma_bm=64, wgmma_bn=96, wgmma_stages=6, wgmma_tma=1)),
    ((512, 768, 640), dict(wgmma_bm=128, wgmma_bn=96, wgmma_smem_epilogue=0, wgmma_tiles=2)),
    # a ragged M with K split in a cluster: the last tile row's sums added, its rows below M stored
    ((700, 768, 640), dict(wgmma_bm=128, wgmma_bn=96, wgmma_smem_epilogue=0, wgmma_split_k=2, wgmma_split_cluster=1,
                           wgmma_tma=1)),
    ((700, 768, 640), dict(wgmma_bm=128, wgmma_bn=96, wgmma_smem_epilogue=0, wgmma_split_k=2, wgmma_split_cluster=1,
                           wgmma_tma=0)),
])
def test_cuda_96_column_tiles_match_float64(shape, knobs):
    """Tiles of 96 columns (Bt stored (N, K): m64n96k16, twelve 8-row groups of Bt a stage),
    through shared memory or directly, by cp.async or the TMA, against float64 on poisoned C;
    a ragged M with K split in a cluster."""
    from tvm_ext.target import resolve_target

    m, n, k = shape
    target = resolve_target("cuda")
    t = WgmmaGemmTemplate(m, n, k)
    program = t.build_program(_config(t, target, **knobs), target)
    assert "m64n96k16" in program.source
    _c_against_float64(t, program)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(960, 768, 1280), (1024, 768, 4096), (512, 1536, 2048)])
def test_cuda_narrow_whole_wave_picks_match_float64(shape):
    """The default picks taking the narrow tiles from 16 k steps on (64x96, 8 stages,
    warp-specialized, C staged; 15 tile rows at 960, 16 at 512 x 1536) against float64 on
    poisoned C: a stage released before its wgmma retired, or C's stage read before all of it
    was written, gives an O(1) error or NaN."""
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    t = WgmmaGemmTemplate(*shape)
    cfg = t.default_config(target)
    assert WgmmaTile.of(cfg).name == "wgmma 64x96x64 s8 w1 smem tma ws pdl"
    _c_against_float64(t, t.build_program(cfg, target))


@pytest.mark.gpu
def test_cuda_tune_gemm_wgmma(tmp_path):
    """A real tuning run: every record measured and checked against float64 on the GPU."""
    rec = tmp_path / "r.jsonl"
    p = subprocess.run(CLI + ["gemm-wgmma", "--shape", "1024,1024,1024", "--target", "cuda", "--trials", "6",
                              "--b-layout", "kn",
                              "--records", str(rec), "--no-progress", "--seed", "0"],
                       capture_output=True, text=True, timeout=600, env={**os.environ})
    assert p.returncode == 0, p.stdout + p.stderr
    records = [json.loads(line) for line in rec.read_text().splitlines()]
    assert len(records) >= 6
    ok = [r for r in records if r["error_kind"] == "" and r["costs"]]  # measured and checked
    assert ok and all(r["error_kind"] in ("", "build_error") for r in records), [r["error_msg"] for r in records]
    assert "GFLOP/s" in p.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("case", [
    dict(shape=(128, 128, 64), batch=(8, 12), b_layout="KN",
         knobs=dict(wgmma_bm=128, wgmma_bn=64, wgmma_stages=6, wgmma_tiles=2)),
    dict(shape=(128, 64, 128), batch=(8, 12), b_layout="KN", knobs=dict(wgmma_bm=64, wgmma_bn=64, wgmma_stages=3)),
    dict(shape=(256, 128, 192), batch=(5,), b_layout="NK",
         knobs=dict(wgmma_bm=128, wgmma_bn=128, wgmma_stages=3, wgmma_smem_epilogue=0, wgmma_tiles=3, wgmma_raster=2)),
    dict(shape=(256, 256, 128), batch=(2, 3), b_layout="NK", b_shared=True,
         knobs=dict(wgmma_bm=128, wgmma_bn=256, wgmma_stages=3)),
    dict(shape=(128, 256, 128), batch=(3,), b_layout="KN", b_shared=True,
         knobs=dict(wgmma_bm=64, wgmma_bn=128, wgmma_stages=4, wgmma_tiles=4, wgmma_smem_epilogue=1)),
    dict(shape=(256, 128, 256), batch=(3,), b_layout="KN",
         knobs=dict(wgmma_bm=128, wgmma_bn=128, wgmma_stages=3, wgmma_smem_epilogue=0, wgmma_split_k=2,
                    wgmma_tiles=2)),
    dict(shape=(256, 128, 512), batch=(3,), b_layout="KN",
         knobs=dict(wgmma_bm=128, wgmma_bn=128, wgmma_stages=4, wgmma_smem_epilogue=0, wgmma_split_k=4,
                    wgmma_split_cluster=1)),
    dict(shape=(128, 64, 1024), batch=(2,), b_layout="NK",
         knobs=dict(wgmma_bm=64, wgmma_bn=64, wgmma_stages=4, wgmma_smem_epilogue=0, wgmma_split_k=8,
                    wgmma_split_cluster=1)),
])
def test_cuda_batched_wgmma_matches_float64(case):
    """Each matrix of a batch at its own offset (a wrong matrix index repeats or skips one: the
    poisoned C keeps NaN, or a matrix's product lands on another's), B batched or shared, one or
    several tiles a block across matrices, both epilogues."""
    import tvm

    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    t = WgmmaGemmTemplate(*case["shape"], b_layout=case["b_layout"], batch=case["batch"],
                          b_shared=case.get("b_shared", False))
    program = t.build_program(_config(t, target, **{"wgmma_smem_epilogue": 1, "wgmma_inflight": 1, "wgmma_raster": 0,
                                                     **case["knobs"]}), target)
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(spec.shape).astype(np.float16) for spec in t.inputs())
    ref = t.reference([a, b])[0]
    dev = tvm.cuda(0)
    c = tvm.runtime.tensor(np.full(t.outputs()[0].shape, np.nan, np.float16), dev)
    program.executable.mod["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
    out = c.numpy().astype(np.float64)
    assert np.isfinite(out).all()
    per_matrix = np.linalg.norm((out - ref).reshape(-1, *ref.shape[-2:]), axis=(1, 2)) / \
        np.linalg.norm(ref.reshape(-1, *ref.shape[-2:]), axis=(1, 2))
    assert per_matrix.max() < 1e-3, per_matrix


@pytest.mark.gpu
@pytest.mark.parametrize("shape, b_layout, knobs, c_dtype", [
    ((512, 768, 640), "NK", dict(), "bfloat16"),  # bfloat16 staged through shared memory
    ((512, 768, 640), "KN", dict(wgmma_smem_epilogue=0, wgmma_tiles=4, wgmma_raster=2), "bfloat16"),
    ((512, 768, 640), "KN", dict(wgmma_smem_epilogue=0), "float32"),
    # odd tile counts (3 x 5 tiles of 64x64, 9 k steps): every stage reused, no tile twice
    ((192, 320, 576), "NK", dict(wgmma_bm=64, wgmma_bn=64, wgmma_stages=4), "bfloat16"),
    ((256, 128, 1024), "NK", dict(wgmma_bn=128, wgmma_smem_epilogue=0, wgmma_split_k=2, wgmma_split_cluster=1),
     "bfloat16"),
])
def test_cuda_bfloat16_wgmma_matches_float64(shape, b_layout, knobs, c_dtype):
    """bfloat16 operands on the GPU against float64 of the same bfloat16 inputs, C NaN-poisoned:
    the bf16 wgmma form (read as float16, the values would be O(1) wrong), both B layouts,
    both epilogues, float32 C, a split K in a cluster."""
    import tvm

    from tvm_ext.precision.precision import cast, np_dtype
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    t = WgmmaGemmTemplate(*shape, b_layout=b_layout, dtype="bfloat16")
    cfg = _config(t, target, **knobs)
    program = t.build_program(cfg, target) if c_dtype == "bfloat16" else \
        compile_wgmma(t.kernel_func(cfg, c_dtype), target, cfg)
    rng = np.random.default_rng(2)
    a, b = (cast(rng.standard_normal(spec.shape), "bfloat16") for spec in t.inputs())
    ref = t.reference([a, b])[0]
    dev = tvm.cuda(0)
    c = tvm.runtime.tensor(np.full(ref.shape, np.nan, np_dtype(c_dtype)), dev)
    program.executable.mod["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
    out = c.numpy().astype(np.float64)
    assert np.isfinite(out).all()
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < (1e-5 if c_dtype == "float32" else 8e-3), err  # bfloat16 output rounding: about 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, shape", [("bfloat16", (2048, 4096, 512)), ("bfloat16", (1024, 1024, 1536)),
                                          ("float16", (1024, 768, 3072)), ("float16", (2048, 768, 3072))])
def test_cuda_gemm_tc_picks_wgmma_and_matches_float64(dtype, shape):
    """``gemm_tc_any``'s analytic pick with 16-bit A, B and C on Hopper: the wgmma kernel
    (B (K, N) read N-major; at x768x3072 K split in two in a cluster), against float64 on
    NaN-poisoned C and scratch."""
    import tvm

    from tvm_ext.precision.precision import cast, np_dtype
    from tvm_ext.schedules.gemm.tensor_core_choice import TensorCoreChoiceTemplate
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    t = TensorCoreChoiceTemplate(*shape, a_dtype=dtype, b_dtype=dtype, c_dtype=dtype)
    config, why = t.analytic_pick(target)
    assert config.tc_kernel == "wgmma", why
    program = t.build_program(config, target)
    rng = np.random.default_rng(3)
    a, b = (cast(rng.uniform(-1, 1, s.shape), s.dtype) for s in t.inputs())
    dev = tvm.cuda(0)
    outs = [tvm.runtime.tensor(np.full(s.shape, np.nan, np_dtype(s.dtype)), dev) for s in t.outputs() + t.scratch()]
    program.executable.mod["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), *outs)
    out = outs[0].numpy().astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 8e-3


def test_no_tile_loads_ahead_past_k():
    """A one-tile block's prologue loads stages - 1 - inflight k tiles before its loop; past K
    those reads run beyond A and B (an illegal address on the GPU, depending on what lies
    there). Such a tile is refused, and the pick takes fewer stages where K is short (the
    GRU's input GEMM with 256 inputs: 4 k tiles)."""
    from tvm_ext.schedules.gemm.wgmma_template import pick_wgmma_tile

    deep = WgmmaTile(64, 64, 8, 1, True, 0)
    assert "loads 6 k tiles ahead, past K's 4" in wgmma_reason(deep, 64, 3072, 256)
    assert wgmma_reason(dataclasses.replace(deep, stages=6), 64, 3072, 256) is None
    assert wgmma_reason(deep, 64, 3072, 1024) is None
    for shapes in ([(64, 3072, 256), (64, 3072, 1024)], [(64, 3072, 256)], [(4096, 4096, 4096)]):
        tile = pick_wgmma_tile(shapes, offline_cuda(), "float16")
        assert tile is not None
        assert all(wgmma_reason(tile, m, n, k) is None for m, n, k in shapes), tile
    assert pick_wgmma_tile([(4096, 4096, 4096)], offline_cuda(), "float16").stages == 4  # long K: unchanged
    # 5 k tiles fill at most 7 stages, a depth the knob does not offer: the template's default takes 6
    t = WgmmaGemmTemplate(128, 128, 320)
    cfg = t.default_config(offline_cuda())
    assert cfg.wgmma_stages == 6 and t.space(offline_cuda()).infeasible_reason(cfg) is None


def test_the_pick_sweep_probes_grids_give_configs_and_a_knob_left_out_is_an_error():
    """The sweep probe's grids give configs at BERT-base's projection (its tile grid gave none from
    the day TMA became a knob: every set lacked ``wgmma_tma`` and the space's refusal was taken for
    a value it does not offer), and a grid that leaves a knob out now says so."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "probes",
                        "wgmma_pick_sweep.py")
    spec = importlib.util.spec_from_file_location("wgmma_pick_sweep_probe", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    space = WgmmaGemmTemplate(1024, 768, 768).space(offline_cuda())
    tiles, wide = sweep.grid(space), sweep.wide_grid(space)
    assert len(tiles) >= 40 and len(wide) >= 60
    assert {c.wgmma_tma for c in wide} == {0, 1} and {c.wgmma_split_k for c in wide} >= {1, 2, 4}
    with pytest.raises(ValueError, match="wgmma_tma"):
        sweep.feasible(space, [{k: v for k, v in tiles[0].as_dict().items() if k != "wgmma_tma"}])
