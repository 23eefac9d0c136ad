"""The warp-specialized wgmma kernel (``wgmma_ws``): a producer warpgroup issuing the TMA loads,
consumer warpgroups multiplying and releasing each stage on a barrier of its own.

CI (no GPU): the kernel's structure in the CUDA TVM generates (the producer's and consumers'
``setmaxnreg``, a load and a release barrier a stage, no block barrier past the barriers'
init), ptxas assembling every kind of it without spills, and the refusals.  ``-m gpu``: every
kind against float64 on NaN-poisoned outputs, twice (the barriers' phases from a fresh launch).
"""
from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
from test_wgmma_tma import _source

from tvm_ext.schedules.gemm.wgmma import WgmmaTile, wgmma_gemm, wgmma_reason
from tvm_ext.schedules.gemm.wgmma_specialized import CONSUMER_REGISTERS, PRODUCER_REGISTERS
from tvm_ext.target import offline_cuda

WS = dict(tma=True, specialized=True, smem_epilogue=False)
STAGED = dict(WS, smem_epilogue=True)  # C through the kernel's own stage, 16 bytes a thread
TURNS = dict(STAGED, c_turns=True)  # that stage 64 rows, the consumer warpgroups' in turn
K_TURNS = dict(STAGED, wg_k=2)  # two consumer warpgroups taking a 64-row tile's k steps in turn
# (tile, m, n, k, wgmma_gemm's keywords)
KINDS = {
    "one unit": (WgmmaTile(128, 256, 4, 1, **WS), 512, 512, 512, {}),
    "several units, raster": (WgmmaTile(128, 128, 6, 1, raster=2, tiles=4, **WS), 1024, 1024, 512, {}),
    "one warpgroup, no wgmma in flight": (WgmmaTile(64, 128, 3, 0, **WS), 256, 256, 512, {}),
    "ragged m": (WgmmaTile(128, 64, 6, 1, **WS), 700, 768, 768, {}),
    "batched b (k, n) bias": (WgmmaTile(128, 128, 4, 1, **WS), 128, 256, 256,
                              {"batch": (2, 3), "b_layout": "KN"}),
    "bias": (WgmmaTile(128, 128, 4, 1, tiles=2, **WS), 256, 512, 256, {"bias_dtype": "float16"}),
    "e4m3 promoted, overlapped": (WgmmaTile(128, 128, 6, 1, tiles=2, operand="e4m3", **WS), 512, 512, 1024,
                                  {"promote": 1, "overlap": True, "scales": True}),
    "tf32 promoted": (WgmmaTile(128, 128, 4, 1, operand="tf32", **WS), 256, 256, 512,
                      {"promote": 4, "c_dtype": "float32"}),
    # clusters of two blocks sharing an operand's tile by TMA multicast (``wgmma_multicast``)
    "multicast a, e4m3 promoted, overlapped": (
        WgmmaTile(128, 128, 6, 1, tiles=2, operand="e4m3", multicast=True, **WS), 512, 512, 1024,
        {"promote": 1, "overlap": True, "scales": True}),
    "multicast bt, one warpgroup of 96 columns": (WgmmaTile(64, 96, 8, 1, raster=2, multicast=True, **WS),
                                                  512, 768, 1024, {}),
    "multicast a, ragged m": (WgmmaTile(128, 64, 6, 1, multicast=True, **WS), 700, 768, 768, {}),
    "multicast bt, batched, bias": (WgmmaTile(128, 128, 4, 1, raster=2, multicast=True, **WS), 256, 256, 256,
                                    {"batch": (2, 3), "bias_dtype": "float16"}),
    # two consumer warpgroups a 64-row band, each half of the tile's columns (``wgmma_wg_cols``)
    "columns split, 96 wide, raster": (WgmmaTile(64, 96, 8, 1, raster=2, wg_cols=2, **WS), 512, 768, 1024, {}),
    "columns split, ragged m and n, bias, several units": (
        WgmmaTile(64, 128, 6, 1, tiles=3, wg_cols=2, **WS), 200, 400, 512, {"bias_dtype": "float16"}),
    "columns split, e4m3 promoted, multicast a": (
        WgmmaTile(64, 256, 4, 1, tiles=2, operand="e4m3", multicast=True, wg_cols=2, **WS), 256, 1024, 1024,
        {"promote": 1, "scales": True}),
    # C staged in shared memory of its own past the stages' barriers (``staged_apart``)
    "staged c, e4m3 promoted, overlapped, several units": (
        WgmmaTile(128, 128, 6, 1, tiles=2, operand="e4m3", **STAGED), 512, 512, 1024,
        {"promote": 1, "overlap": True, "scales": True}),
    "staged c, 96 columns padded, ragged m and n, bias, several units": (
        WgmmaTile(64, 96, 8, 1, tiles=3, **STAGED), 200, 400, 512, {"bias_dtype": "float16"}),
    "staged c, e4m3 into bfloat16, multicast a, 256 columns": (
        WgmmaTile(128, 256, 3, 1, operand="e4m3", multicast=True, **STAGED), 256, 1024, 1024,
        {"scales": True, "c_dtype": "bfloat16"}),
    "staged c, batched b (k, n), raster": (WgmmaTile(128, 128, 4, 1, raster=2, **STAGED), 256, 256, 256,
                                           {"batch": (2, 3), "b_layout": "KN"}),
    # C's stage one warpgroup's 64 rows, the two consumers' in turn (``wgmma_c_turns``)
    "c in turn, 256 columns, blocks of 3 and 2 units": (WgmmaTile(128, 256, 4, 1, tiles=3, **TURNS), 512, 1024, 512,
                                                        {}),
    "c in turn, 96 columns padded, ragged m and n, bias": (
        WgmmaTile(128, 96, 6, 1, tiles=3, **TURNS), 200, 400, 512, {"bias_dtype": "float16"}),
    "c in turn, e4m3 promoted into bfloat16, multicast a": (
        WgmmaTile(128, 192, 4, 1, tiles=2, operand="e4m3", multicast=True, **TURNS), 256, 1536, 1024,
        {"promote": 1, "scales": True, "c_dtype": "bfloat16"}),
    "k in turn, 96 wide (BERT-base's FFN down)": (WgmmaTile(64, 96, 8, 1, **K_TURNS), 1024, 768, 3072, {}),
    "k in turn, ragged m and n, bias, blocks of 3 units, c direct": (
        WgmmaTile(64, 128, 6, 1, tiles=3, **dict(WS, wg_k=2)), 200, 400, 512, {"bias_dtype": "float16"}),
    "k in turn, no wgmma in flight, b (k, n), raster": (WgmmaTile(64, 64, 4, 0, raster=2, tiles=2, **K_TURNS),
                                                        256, 512, 1024, {"b_layout": "KN"}),
}


def _kernel(source: str) -> str:
    start = source.index("main_kernel(")
    return source[source.index("main_kernel(", start + 1):]


def test_producer_and_consumers_meet_only_on_the_stages_barriers():
    """One block barrier (after the barriers' init: a load and a release barrier a stage); the
    producer warpgroup gives up registers and issues the TMA loads; the consumers take the
    registers, wait on the load barriers and release each stage; no thread copies by cp.async."""
    tile, m, n, k, kw = KINDS["several units, raster"]
    body = _kernel(_source(tile, m, n, k, **kw))
    init = body[:body.index("__syncthreads()")]
    assert body.count("__syncthreads()") == 1
    assert init.count("tvm_builtin_ptx_mbarrier_init_init_shared__cta_b64(") == 2 * tile.stages
    assert f"setmaxnreg_dec_sync_aligned_u32_{PRODUCER_REGISTERS}();" in body
    assert f"setmaxnreg_inc_sync_aligned_u32_{CONSUMER_REGISTERS}();" in body
    assert "mbarrier_arrive_nocount_arrive_shared__cta_b64(" in body  # a consumer releases a stage
    assert "mbarrier_arrive_expect_tx" in body and "cp_async_bulk_tensor" in body  # the producer's loads
    assert "cp_async_cg" not in body


def test_a_multicast_pair_loads_half_the_shared_tile_each_and_releases_both_blocks_stages():
    """A cluster of two (the launch's cluster rank); each producer multicasts half of the shared
    tile (Bt's here: raster groups) into both blocks (mask 3) and loads its own A tile alone, each
    barrier expecting the whole stage; one thread of the consumer warpgroup arrives on each
    block's release barrier (two arrivals a round), through the cluster's shared window; the
    blocks meet at cluster barriers after the barriers' init and before leaving."""
    tile, m, n, k, kw = KINDS["multicast bt, one warpgroup of 96 columns"]
    body = _kernel(_source(tile, m, n, k, **kw))
    copies = [line for line in body.splitlines() if "cp_async_bulk_tensor_g2s" in line]
    shared = [line for line in copies if "multicast__cluster(" in line]
    assert len(copies) == 2 and len(shared) == 1 and "b_map" in shared[0] and shared[0].rstrip().endswith("(ushort)3);")
    assert f"(uint){(64 + 96) * 64 * 2})" in body  # expect_tx: the whole stage, both halves of Bt
    inits = [line for line in body.splitlines() if "mbarrier_init_init_shared__cta_b64(" in line]
    assert sorted(line.rstrip()[-9:] for line in inits) == ["(uint)1);"] * 8 + ["(uint)2);"] * 8
    assert "mapa_u32_shared__cluster_u32(" in body
    assert "mbarrier_arrive_nocount_arrive_shared__cluster_b64(" in body
    assert body.count("barrier_cluster_arrive_cluster_arrive_release();") == 2
    assert "mbarrier_arrive_nocount_arrive_shared__cta_b64(" not in body


def test_without_multicast_the_kernel_has_no_cluster():
    tile, m, n, k, kw = KINDS["several units, raster"]
    body = _kernel(_source(tile, m, n, k, **kw))
    assert "multicast" not in body and "barrier_cluster" not in body and "mapa" not in body


@pytest.mark.parametrize("tile, m, n, layout, needle", [
    (WgmmaTile(128, 128, 4, 1, tma=True, smem_epilogue=False, multicast=True), 512, 512, "NK", "wgmma_ws 1"),
    (WgmmaTile(128, 128, 4, 1, multicast=True, **WS), 512, 384, "NK", "tile columns (3) must be even"),
    (WgmmaTile(128, 128, 4, 1, raster=2, multicast=True, **WS), 512, 512, "KN", "Bt stored (N, K) only"),
    (WgmmaTile(128, 128, 4, 1, tiles=4, multicast=True, **WS), 384, 512, "NK", "pairs of blocks of 4 tile(s)"),
])
def test_multicast_refused_where_the_pair_shares_no_tile(tile, m, n, layout, needle):
    assert needle in wgmma_reason(tile, m, n, 1024, b_layout=layout)


def test_four_consumer_warpgroups_are_refused_their_registers_would_never_come():
    """``setmaxnreg`` raises each consumer warpgroup to 232 registers a thread: two fit an SM's
    65,536 beside the producer's 40, four (bm 256) do not, and the kernel would wait for them
    forever (a tuning run's e4m3 256x64 config hung to its run timeout)."""
    from tvm_ext.schedules.gemm.gemm_fp8 import Fp8GemmTemplate

    tile = WgmmaTile(256, 64, 3, 1, raster=2, tiles=4, operand="e4m3", **WS)
    assert "(the consumers would wait for them forever)" in wgmma_reason(tile, 8192, 8192, 8192)
    assert wgmma_reason(dataclasses.replace(tile, bm=128), 8192, 8192, 8192) is None
    template = Fp8GemmTemplate(8192, 8192, 8192)
    space = template.space(offline_cuda("sm_90"))
    hung = template.default_config(offline_cuda("sm_90")).replace(wgmma_bm=256, wgmma_bn=64, wgmma_stages=3,
                                                                    wgmma_tiles=4, wgmma_raster=2)
    assert "setmaxnreg" in space.infeasible_reason(hung)


def test_split_columns_run_two_consumer_warpgroups_each_on_its_half_of_bt():
    """With ``wg_cols`` 2 the block has the producer and two consumer warpgroups (384 threads);
    each issues m64n48 wgmma on the same A rows and its own half of the stage's Bt rows (48 rows
    of 128 bytes apart), and each releases the stage (256 arrivals)."""
    tile, m, n, k, kw = KINDS["columns split, 96 wide, raster"]
    source = _source(tile, m, n, k, **kw)
    body = _kernel(source)
    assert "__launch_bounds__(384)" in source and "m64n48k16" in body and "m64n96k16" not in body
    inits = [line for line in body.splitlines() if "mbarrier_init_init_shared__cta_b64(" in line]
    assert [line.rstrip().endswith(" (uint)256);") for line in inits].count(True) == 8 and len(inits) == 16
    assert f"{48 * 128})" in body  # the second warpgroup's Bt rows: 48 rows of 128 bytes further
    one = _kernel(_source(dataclasses.replace(tile, wg_cols=1), m, n, k, **kw))
    assert "m64n96k16" in one and f"{48 * 128})" not in one


@pytest.mark.parametrize("change, layout, needle", [
    (dict(specialized=False, tma=True), "NK", "warp-specialized kernel"),
    (dict(), "KN", "Bt stored (N, K)"),
    (dict(bn=64, wg_cols=3), "NK", "in two at most"),
    (dict(bn=80), "NK", "multiple of 16 columns"),
    (dict(bm=128, bn=128, stages=4), "NK", "wait for them forever"),  # four consumer warpgroups
])
def test_split_columns_refused_where_the_kernel_cannot_run_them(change, layout, needle):
    tile = dataclasses.replace(WgmmaTile(64, 96, 8, 1, raster=2, wg_cols=2, **WS), **change)
    assert needle in wgmma_reason(tile, 512, 960, 1024, b_layout=layout)


def test_split_columns_name_their_tile_and_round_trip_through_the_knob():
    tile = WgmmaTile(64, 96, 8, 1, raster=2, wg_cols=2, **WS)
    assert tile.name.endswith(" tma ws c2") and tile.threads == 256 and tile.acc_registers == 24
    assert WgmmaTile.of(_config(tile)) == tile
    assert _config(dataclasses.replace(tile, wg_cols=1)).wgmma_wg_cols == 1


def test_k_turns_run_two_consumers_on_alternate_k_steps_and_add_the_second_ones_sums():
    """With ``wg_k`` 2 the block has the producer and two consumer warpgroups (384 threads) on one
    64-row tile: each waits for and releases only the stages of its k steps (their release
    barriers count one warpgroup, 128), both issue the tile's m64n96 wgmma; the second stores its
    float32 sums in shared memory of their own past C's stage and arrives at named barrier 5, the
    first waits there, adds them, arrives at 6 and alone stores C."""
    from tvm_ext.schedules.gemm.wgmma_layout import k_turn_sums_bytes
    from tvm_ext.schedules.gemm.wgmma_specialized import SUMS_READ, SUMS_WRITTEN

    tile, m, n, k, kw = KINDS["k in turn, 96 wide (BERT-base's FFN down)"]
    source = _source(tile, m, n, k, **kw)
    body = _kernel(source)
    assert "__launch_bounds__(384)" in source and "m64n96k16" in body
    inits = [line for line in body.splitlines() if "mbarrier_init_init_shared__cta_b64(" in line]
    assert [line.rstrip().endswith(" (uint)128);") for line in inits].count(True) == 8 and len(inits) == 16
    assert "for (int j = 0; j < 24; ++j)" in body  # 48 k steps, 24 a warpgroup
    assert body.count("st_shared_f32(") == body.count("ld_shared_f32(") == 48  # bn / 2 sums a thread
    assert f"bar_arrive_arrive((uint){SUMS_WRITTEN}, (uint)256)" in body
    assert f"bar_sync_count_sync((uint){SUMS_WRITTEN}, (uint)256)" in body
    assert f"bar_arrive_arrive((uint){SUMS_READ}, (uint)256)" in body
    assert f"bar_sync_count_sync((uint){SUMS_READ}, (uint)256)" in body  # the second meets the first's last
    assert k_turn_sums_bytes(2, 96) == 16 + 64 * 96 * 4 and k_turn_sums_bytes(1, 96) == 0
    one = dataclasses.replace(tile, wg_k=1)
    assert tile.block_smem_bytes() == one.block_smem_bytes() + k_turn_sums_bytes(2, 96)
    plain = _kernel(_source(one, m, n, k, **kw))
    assert "__launch_bounds__(256)" in _source(one, m, n, k, **kw) and "st_shared_f32(" not in plain


@pytest.mark.parametrize("change, needle", [
    (dict(specialized=False), "in turn (wgmma_wg_k 2) two at most"),
    (dict(bm=128), "one 64-row band"),
    (dict(wg_cols=2), "its columns unsplit"),
    (dict(split=2), "K unsplit"),
    (dict(wg_k=3), "two at most"),
])
def test_k_turns_refused_where_the_kernel_cannot_run_them(change, needle):
    tile = dataclasses.replace(WgmmaTile(64, 96, 8, 1, **K_TURNS), **change)
    assert needle in wgmma_reason(tile, 1024, 768, 3072)
    assert "an even count of k steps" in wgmma_reason(WgmmaTile(64, 96, 8, 1, **K_TURNS), 1024, 768, 64 * 45)


def test_k_turns_refuse_promoted_sums_and_round_trip_through_the_knob():
    from tvm_ext.schedules.gemm.wgmma import promote_reason

    tile = WgmmaTile(64, 96, 8, 1, **K_TURNS)
    assert "do not promote" in promote_reason(dataclasses.replace(tile, operand="e4m3"), 4096, 4)
    assert promote_reason(tile, 4096, 0) is None
    assert tile.name.endswith(" tma ws kw2") and tile.threads == 256 and tile.acc_registers == 48
    assert WgmmaTile.of(_config(tile)) == tile
    assert _config(dataclasses.replace(tile, wg_k=1)).wgmma_wg_k == 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc to run ptxas")
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_assembles_for_sm_90a_without_spills(kind):
    from tvm_ext.cost_model.ptxas import ptxas_of_source

    tile, m, n, k, kw = KINDS[kind]
    info = ptxas_of_source(_source(tile, m, n, k, **kw), "sm_90a")
    assert info is not None and info.spill_bytes == 0


@pytest.mark.parametrize("change, needle", [
    (dict(tma=False), "TMA loads (wgmma_tma 1)"),
    (dict(bm=64, smem_epilogue=True, wg_cols=2), "warpgroups of whole rows"),
    (dict(split=2), "K unsplit"),
    (dict(bn=256, stages=6, operand="e4m3", smem_epilogue=True), "bytes of shared memory"),  # C's stage too
])
def test_refused_without_tma_with_split_columns_staged_or_a_split_k(change, needle):
    tile = dataclasses.replace(WgmmaTile(128, 128, 4, 1, **WS), **change)
    assert needle in wgmma_reason(tile, 512, 512, 1024)


def test_a_staged_c_has_a_stage_of_its_own_past_the_barriers():
    """The staged kernel's block takes C's own stage (its 2-byte rows, 128-byte aligned past the
    barriers) on top of the stages and barriers: 6 e4m3 stages of 128x128 and their C fit a
    block's 227 KiB, the same with 256 columns do not; C is staged as float16 or bfloat16 whatever
    the operands (the stages' dtype otherwise), float32 not."""
    from tvm_ext.schedules.gemm.wgmma import epilogue_reason

    tile = WgmmaTile(128, 128, 6, 1, operand="e4m3", **STAGED)
    assert tile.c_stage_bytes() == 128 + 128 * 128 * 2
    assert tile.block_smem_bytes() == 6 * 256 * 128 + tile.barrier_bytes() + tile.c_stage_bytes() <= 232448
    assert dataclasses.replace(tile, smem_epilogue=False).block_smem_bytes() == 6 * 256 * 128 + tile.barrier_bytes()
    assert dataclasses.replace(tile, bn=96).c_stage_bytes() == 128 + 128 * 104 * 2  # rows padded by 8
    assert wgmma_reason(tile, 4096, 4096, 4096) is None
    assert epilogue_reason(tile, "bfloat16") is None and epilogue_reason(tile, "float16") is None
    assert "float16 or bfloat16 C only" in epilogue_reason(tile, "float32")
    assert "smem epilogue 0" in wgmma_reason(dataclasses.replace(tile, specialized=False, tma=True), 512, 512, 1024)


def test_the_staged_consumers_meet_at_their_own_named_barriers_and_store_16_bytes():
    """Each consumer warpgroup stages its rows with shared stores, meets its 128 threads at a
    named barrier (1 + its number: never the block's barrier, which the producer does not reach)
    before and after copying them out in 16-byte loads and stores; the direct kernel has none."""
    tile, m, n, k, kw = KINDS["staged c, e4m3 promoted, overlapped, several units"]
    body = _kernel(_source(tile, m, n, k, **kw))
    assert body.count("__syncthreads()") == 1  # the barriers' init only
    assert body.count("tvm_builtin_ptx_bar_sync_count_sync(") == 2
    assert "(uint)128)" in body.split("tvm_builtin_ptx_bar_sync_count_sync(")[1].split(";")[0]
    assert "tvm_builtin_ptx_st_shared_b32(" in body and "tvm_builtin_ptx_ld_vec_shared_v4_b32(" in body
    assert "tvm_builtin_ptx_st_vec_global_v4_b32(" in body
    direct = _kernel(_source(dataclasses.replace(tile, smem_epilogue=False), m, n, k, **kw))
    assert "bar_sync_count" not in direct and "st_vec_global" not in direct
    # C's stage addressed from its last byte: TVM sizes the dynamic shared memory by the largest
    # index of the buffer it sees, and a stage addressed from the base alone was cut off
    end = 6 * 256 * 128 + tile.barrier_bytes()
    end = -(-end // 128) * 128 + 128 * 128 * 2
    assert f"smem_ptr[{end - 1}]" in body


def test_consumers_taking_c_stage_in_turn_hand_it_over_at_named_barriers_of_both():
    """With ``c_turns`` C's stage is one warpgroup's 64 rows (a 128x256 tile keeps 4 stages in a
    block's 227 KiB, 3 with the whole tile's C): the second consumer waits at named barrier 3
    for the first's hand-over, the first (from its second unit on, and once more before it
    leaves) at barrier 4 for the second's, each barrier of both warpgroups' 256 threads; the
    warpgroup's own barrier before the copy stays, the one after it goes."""
    tile, m, n, k, kw = KINDS["c in turn, 256 columns, blocks of 3 and 2 units"]
    whole = dataclasses.replace(tile, c_turns=False)
    assert tile.c_stage_bytes() == 128 + 64 * 256 * 2 and whole.c_stage_bytes() == 128 + 128 * 256 * 2
    assert tile.block_smem_bytes() <= 232448 < whole.block_smem_bytes()
    assert wgmma_reason(tile, m, n, k) is None and "bytes of shared memory" in wgmma_reason(whole, m, n, k)
    body = _kernel(_source(tile, m, n, k, **kw))
    assert body.count("tvm_builtin_ptx_bar_sync_count_sync((uint)3, (uint)256);") == 1
    assert body.count("tvm_builtin_ptx_bar_sync_count_sync((uint)4, (uint)256);") == 2  # in the loop, at the end
    assert body.count("tvm_builtin_ptx_bar_arrive_arrive((uint)3, (uint)256);") == 1
    assert body.count("tvm_builtin_ptx_bar_arrive_arrive((uint)4, (uint)256);") == 1
    assert body.count("(uint)128);") == 1  # the warpgroup's rows staged; no barrier after the copy
    end = -(-(4 * 384 * 128 + tile.barrier_bytes()) // 128) * 128 + 64 * 256 * 2  # addressed from its last byte
    assert f"smem_ptr[{end // 2 - 1}]" in body
    staged = _kernel(_source(*KINDS["staged c, e4m3 promoted, overlapped, several units"][:4],
                             **KINDS["staged c, e4m3 promoted, overlapped, several units"][4]))
    assert "bar_arrive" not in staged and "((uint)4, (uint)256)" not in staged


@pytest.mark.parametrize("change, needle", [
    (dict(smem_epilogue=False), "staged C"),
    (dict(bm=64), "two consumer warpgroups (bm 128)"),
    (dict(specialized=False), "two consumer warpgroups (bm 128)"),
])
def test_c_in_turn_refused_without_two_consumers_staging_c(change, needle):
    tile = dataclasses.replace(WgmmaTile(128, 128, 4, 1, **TURNS), **change)
    assert needle in wgmma_reason(tile, 512, 512, 1024)


def test_the_knob_names_the_tile_and_counts_its_barriers():
    tile = WgmmaTile(128, 256, 4, 1, **WS)
    assert tile.name.endswith(" tma ws") and WgmmaTile.of(_config(tile)) == tile
    paired = dataclasses.replace(tile, multicast=True)
    assert paired.name.endswith(" tma ws multicast") and WgmmaTile.of(_config(paired)) == paired
    turns = WgmmaTile(128, 256, 4, 1, **TURNS)
    assert turns.name.endswith(" tma ws turns") and WgmmaTile.of(_config(turns)) == turns
    assert tile.barrier_bytes() == 2 * dataclasses.replace(tile, specialized=False).barrier_bytes()


def _config(tile: WgmmaTile):
    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate

    t = WgmmaGemmTemplate(512, 512, 512)
    return t.space(offline_cuda()).make(**tile.knobs())


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("kind", list(KINDS))
def test_cuda_ws_kernels_match_float64(kind):
    """Each kind against float64 of its operands on NaN-poisoned C, twice: a barrier phase or a
    stage released too early gives an O(1) error or NaN."""
    import tvm

    from tvm_ext.hardware import sm_90a
    from tvm_ext.precision.precision import np_dtype
    from tvm_ext.schedules.gemm.wgmma_layout import OPERAND_STORAGE
    from tvm_ext.target import resolve_target

    tile, m, n, k, kw = KINDS[kind]
    func = wgmma_gemm(tile, m, n, k, **kw)
    target = tvm.target.Target(sm_90a(resolve_target("cuda")).tvm_target())
    mod = tvm.compile(tvm.IRModule({"main": func}), target=target).mod
    rng = np.random.default_rng(0)
    shapes = [tuple(int(x) for x in p.shape) for p in func.params]
    stored = np_dtype(OPERAND_STORAGE[tile.operand])
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = rng.standard_normal(shapes[1]).astype(np.float32)
    if tile.operand in ("e4m3", "e5m2"):
        a, b = (x.astype(stored).astype(np.float32) for x in (a, b))
    elif tile.operand == "float16":
        a, b = a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)
    bt = b if kw.get("b_layout") == "KN" else np.swapaxes(b, -1, -2)  # as (..., k, n)
    ref = np.matmul(a.astype(np.float64), bt.astype(np.float64))
    extra = []
    if kw.get("bias_dtype"):
        bias = rng.standard_normal(n).astype(np.float16)
        ref = ref + bias.astype(np.float64)
        extra = [bias]
    if kw.get("scales"):
        scales = np.array([0.5, 0.25], np.float32)
        ref = ref * 0.125
        extra = [scales]
    dev = tvm.cuda(0)
    c_dtype = kw.get("c_dtype", "float16")
    args = [tvm.runtime.tensor(a.astype(stored) if tile.operand != "tf32" else a, dev),
            tvm.runtime.tensor(b.astype(stored) if tile.operand != "tf32" else b, dev),
            *[tvm.runtime.tensor(x, dev) for x in extra]]
    for _ in range(2):
        c = tvm.runtime.tensor(np.full(ref.shape, np.nan, np_dtype(c_dtype)), dev)
        mod["main"](*args, c)
        out = c.numpy().astype(np.float64)
        assert np.isfinite(out).all()
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert err < (5e-3 if tile.operand != "tf32" else 1e-3), err
