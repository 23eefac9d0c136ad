"""The wgmma GEMM's stages loaded by the Tensor Memory Accelerator (``wgmma_tma``).

CI (no GPU): the kernel TVM generates for an offline sm_90a target takes A's and B's tensor maps
as ``__grid_constant__`` parameters, one thread issues a stage's boxes counted on that stage's
barrier (``mbarrier`` with ``complete_tx``), and no thread copies with ``cp.async``; the boxes
follow B's layout and the batch; ptxas assembles every kind of kernel; the barriers' shared
memory counts against the limit.  ``-m gpu``: each kind of kernel against float64 on
NaN-poisoned outputs.
"""
from __future__ import annotations

import dataclasses
import re
import shutil

import numpy as np
import pytest

from tvm_ext.schedules.gemm.wgmma import WgmmaTile, wgmma_gemm, wgmma_reason
from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate
from tvm_ext.target import offline_cuda

# (tile, m, n, k, wgmma_gemm's keywords): a unit a block, several, a ragged M, K split by a second
# kernel and in a cluster, a batch, B stored (K, N), a bias, 8-bit operands with scales
KINDS = {
    "one unit": (WgmmaTile(128, 256, 4, 1, True), 512, 512, 512, {}),
    "several units": (WgmmaTile(128, 128, 6, 1, True, 2, tiles=4), 1024, 1024, 512, {}),
    "ragged m": (WgmmaTile(128, 64, 6, 1, False), 700, 768, 768, {}),
    "split": (WgmmaTile(128, 128, 4, 1, False, split=2), 512, 512, 1024, {}),
    "cluster": (WgmmaTile(128, 128, 6, 1, False, split=2, cluster=True), 512, 512, 1024, {}),
    "batched": (WgmmaTile(128, 64, 4, 1, False), 128, 128, 256, {"batch": (2, 3)}),
    "b (k, n)": (WgmmaTile(128, 128, 4, 1, True), 256, 256, 256, {"b_layout": "KN"}),
    "bias": (WgmmaTile(128, 128, 4, 1, True), 256, 256, 256, {"bias_dtype": "float16"}),
    "e4m3": (WgmmaTile(128, 128, 6, 1, False, operand="e4m3"), 512, 512, 1024, {"promote": 1, "scales": True}),
}


def _source(tile: WgmmaTile, m: int, n: int, k: int, **kw) -> str:
    import tvm

    from tvm_ext.hardware import sm_90a

    target = tvm.target.Target(sm_90a(offline_cuda("sm_90")).tvm_target())
    return tvm.compile(tvm.IRModule({"main": wgmma_gemm(tile, m, n, k, **kw)}), target=target) \
        .mod.imports[0].inspect_source()


def _gemm_kernel(source: str) -> str:
    """The wgmma kernel's definition (the first kernel defined; a split's sum kernel follows)."""
    start = source.index("main_kernel(")
    start = source.index("main_kernel(", start + 1)  # the definition, after the declaration
    end = source.find('extern "C" __global__', start)
    return source[start:end if end > 0 else len(source)]


def test_a_tma_kernel_takes_tensor_maps_and_one_thread_loads_each_stage_counted_on_its_barrier():
    tile = WgmmaTile(128, 256, 4, 1, True, tma=True)
    kernel = _gemm_kernel(_source(tile, 512, 512, 512))
    params = kernel[:kernel.index("{")]
    assert params.count("const __grid_constant__ CUtensorMap") == 2 and "A_ptr" not in params
    assert "cp_async_cg" not in kernel and "cp_async_commit" not in kernel  # no thread copies
    assert kernel.count("mbarrier_init_init_shared") == tile.stages  # a barrier a stage, after the stages
    stage_bytes = (128 + 256) * 128
    first_barrier_end = tile.stages * stage_bytes // 2 + 3  # its last half, after the stages
    assert re.search(rf"smem_ptr\[{first_barrier_end}\]\)\)\) - \(uint\)6\), \(uint\)1\)", kernel)
    assert kernel.count("expect_tx_shared__cta_b64(") == kernel.count("bulk_tensor_2d") // 2
    assert f"(uint){stage_bytes})" in kernel  # a stage's bytes expected on its barrier
    assert "try_wait_parity" in kernel


def test_a_tma_program_lists_its_tensor_maps_among_the_kernel_s_arguments():
    """The program's launches (what export and summaries read) name the tensor maps the host
    function encodes from A and Bt, where they would have named A and Bt."""
    template = WgmmaGemmTemplate(512, 512, 512)
    target = offline_cuda("sm_90")
    config = template.space(target).make(**{**WgmmaTile(128, 256, 4, 1, True).knobs(), "wgmma_tma": 1})
    (launch,) = template.build_program(config, target).launches
    assert launch.args == ("C", "tensormap:a_map", "tensormap:b_map")
    assert launch.dyn_shared_bytes == 4 * (128 + 256) * 128 + 8 * 4  # the stages, then their barriers


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_of_tma_kernel_launches_with_shared_memory_for_its_stages_and_barriers(kind):
    """TVM sizes a kernel's dynamic shared memory by the indexes it sees; the TMA writes a stage
    and the barriers are addresses it cannot see into (a block of several tiles launched with
    163,842 bytes of its 196,640 and faulted on the GPU)."""
    import tvm

    from tvm_ext.hardware import sm_90a
    from tvm_ext.measure.program import extract_launches

    tile, m, n, k, kw = KINDS[kind]
    tile = dataclasses.replace(tile, tma=True)
    func = wgmma_gemm(tile, m, n, k, **kw).with_attr("global_symbol", "main")
    launches, _ = extract_launches(tvm.IRModule({"main": func}), sm_90a(offline_cuda("sm_90")))
    assert launches[0].dyn_shared_bytes == tile.smem_bytes() + tile.barrier_bytes()


def test_without_tma_the_kernel_copies_with_cp_async():
    kernel = _gemm_kernel(_source(WgmmaTile(128, 256, 4, 1, True), 512, 512, 512))
    assert "CUtensorMap" not in kernel and "bulk_tensor" not in kernel and "mbarrier" not in kernel
    assert "cp_async_cg" in kernel


def test_the_boxes_follow_b_s_layout_and_the_batch():
    """B stored (K, N): one box a 64-wide N atom (bn / 64 a stage); a batch: one more dimension
    of the tensor maps a batch axis."""
    kn = _gemm_kernel(_source(WgmmaTile(128, 256, 4, 1, True, tma=True), 256, 256, 256, b_layout="KN"))
    issues = kn.count("bulk_tensor_2d")
    assert issues == 5 * kn.count("expect_tx_shared__cta_b64(")  # A's box and B's four N atoms a stage
    batched = _gemm_kernel(_source(WgmmaTile(128, 64, 4, 1, False, tma=True), 128, 128, 256, batch=(2, 3)))
    assert "bulk_tensor_4d" in batched and "bulk_tensor_2d" not in batched  # (k, m, 3, 2)
    shared_b = _gemm_kernel(_source(WgmmaTile(128, 64, 4, 1, False, tma=True), 128, 128, 256, batch=(3,),
                                    b_batched=False))
    assert shared_b.count("bulk_tensor_3d") == shared_b.count("bulk_tensor_2d")  # A batched, B shared


def test_b_stored_k_n_in_96_columns_is_read_in_three_32_wide_n_atoms_swizzled_by_64_bytes():
    """B (K, N) with bn 96 (no multiple of a 64-wide atom): three boxes of 32 columns a stage from
    a tensor map swizzling 64-byte rows, wgmma descriptors of that swizzle (bits 62-63 = 2, 8-row
    groups 512 bytes apart, atoms bk x 64 bytes apart), and the cp.async chunks placed where the
    64-byte swizzle (CuTe's Swizzle<2, 4, 3>: byte bits 7-8 XORed into bits 4-5) puts them."""
    from tvm_ext.schedules.gemm.wgmma import wgmma_gemm
    from tvm_ext.schedules.gemm.wgmma_layout import KernelLayout

    tile = WgmmaTile(64, 96, 8, 1, True, tma=True)
    kernel = _gemm_kernel(_source(tile, 1024, 768, 768, b_layout="KN"))
    assert kernel.count("bulk_tensor_2d") == 4 * kernel.count("expect_tx_shared__cta_b64(")  # A, B's three atoms
    script = wgmma_gemm(tile, 1024, 768, 768, b_layout="KN").script()
    assert re.search(r"tensormap_encode_tiled\(b_map, Bt.data, 768, 768, 1536, 32, 64, .*swizzle=2", script)
    assert re.search(r"tensormap_encode_tiled\(a_map, .*swizzle=3", script)
    b_desc = f"((uint64_t){(1 << 31) | (512 >> 4)}ULL << (uint64_t)32ULL)"
    wgmmas = kernel.count("m64n96k16_f32_f16_f16_1_1_0_1(")
    assert wgmmas >= 4 and kernel.count(b_desc) >= wgmmas and f"| (uint){(64 * 64 >> 4) << 16})" in kernel
    layout = KernelLayout.of(dataclasses.replace(tile, tma=False), 1024, 768, 768, "KN", (), False, 0)
    assert (layout.b_atom, layout.b_swizzle) == (32, 64)
    chunks = 96 * 64 // 8  # a stage's B: 64 k rows of 96 columns, 8 halves a chunk
    placed = [layout.b_chunk(c) for c in range(chunks)]
    expected = []
    for c in range(chunks):
        row, column = divmod(c, 96 // 8)
        atom, within = divmod(column, 4)
        byte = row * 64 + within * 16
        expected.append(atom * 64 * 32 + (byte ^ ((byte >> 7 & 3) << 4)) // 2)
    assert placed == expected and sorted(placed) == list(range(0, 96 * 64, 8))


def test_the_barriers_count_against_the_shared_memory_limit():
    tile = WgmmaTile(128, 128, 4, 1, True)
    limit = tile.smem_bytes()  # the stages fit exactly; their barriers do not
    assert wgmma_reason(tile, 512, 512, 512, shared_limit=limit) is None
    reason = wgmma_reason(dataclasses.replace(tile, tma=True), 512, 512, 512, shared_limit=limit)
    assert reason and f"{limit + 8 * tile.stages} bytes of shared memory" in reason


def test_the_knob_is_in_the_space_and_names_the_tile():
    from tvm_ext.operators import wgmma_tile_named

    template = WgmmaGemmTemplate(512, 512, 512)
    target = offline_cuda("sm_90")
    config = template.space(target).make(**{**template.default_config(target).as_dict(), "wgmma_tma": 1,
                                             "wgmma_pdl": 0, "wgmma_wg_cols": 1, "wgmma_c_turns": 0, "wgmma_wg_k": 1})
    tile = template.tile(config)
    assert tile.tma and tile.name.endswith(" tma") and wgmma_tile_named(tile.name) == tile
    for other in (dataclasses.replace(tile, smem_epilogue=False, specialized=True),
                  dataclasses.replace(tile, smem_epilogue=False, specialized=True, multicast=True, pdl=True),
                  dataclasses.replace(tile, pdl=True, operand="e4m3")):  # every knob's word read back
        assert wgmma_tile_named(other.name) == other
    assert not template.tile(template.default_config(target)).tma  # the pick keeps cp.async until measured


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc to run ptxas")
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_of_tma_kernel_assembles_for_sm_90a(kind):
    from tvm_ext.cost_model.ptxas import ptxas_of_source

    tile, m, n, k, kw = KINDS[kind]
    assert ptxas_of_source(_source(dataclasses.replace(tile, tma=True), m, n, k, **kw), "sm_90a") is not None


def test_below_one_tile_the_tma_loads_m_rows_and_its_barriers_expect_them():
    """Where M is less than one tile (the GRU's cell tiles at a ragged batch: 96 rows of 128), A's
    tensor map's box holds M's rows, not the tile's (a box past A's rows is slower), and each
    stage's barrier expects the bytes of those rows and B's tile; at M of a tile or more the box
    is the tile's, rows past M of the last tile row loaded as the TMA's zeros."""
    tile = WgmmaTile(128, 96, 6, 1, False, split=2, cluster=True, tma=True)
    expected = {96: (96, (96 + 96) * 64 * 2), 128: (128, (128 + 96) * 64 * 2), 200: (128, (128 + 96) * 64 * 2)}
    for m, (rows, stage_bytes) in expected.items():
        script = wgmma_gemm(tile, m, 768, 1024).script()
        assert re.search(rf"tensormap_encode_tiled\(a_map, A.data, 1024, {m}, 2048, 64, {rows}, 1, 1,", script)
        kernel = _gemm_kernel(_source(tile, m, 768, 1024))
        assert set(re.findall(r"expect_tx_shared__cta_b64\(.*?, \(uint\)(\d+)\);", kernel)) == {str(stage_bytes)}
    batched = wgmma_gemm(WgmmaTile(64, 96, 4, 1, False, tma=True), 40, 192, 256, b_layout="KN", batch=(2,)).script()
    assert re.search(r"tensormap_encode_tiled\(a_map, A.data, 256, 40, 2, 512, 20480, 64, 40, 1,", batched)
    shared = dataclasses.replace(tile, split=1, cluster=False, specialized=True, multicast=True)
    assert re.search(r"tensormap_encode_tiled\(a_map, A.data, 1024, 96, 2048, 64, 64, 1, 1,",
                     wgmma_gemm(shared, 96, 768, 1024).script())  # multicast: each block half the tile's rows


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("shape, batch, b_layout, b_shared, knobs", [
    ((512, 768, 640), (), "NK", False, dict()),
    ((512, 768, 640), (), "KN", False, dict(wgmma_smem_epilogue=0, wgmma_tiles=4, wgmma_raster=2)),
    ((512, 768, 640), (), "NK", False, dict(wgmma_bn=192, wgmma_tiles=6)),  # uneven tiles, C through the stages
    ((512, 768, 640), (), "KN", False, dict(wgmma_bm=64, wgmma_bn=64, wgmma_stages=2, wgmma_inflight=0)),
    ((512, 768, 640), (), "NK", False, dict(wgmma_smem_epilogue=0, wgmma_split_k=2)),
    ((256, 128, 1024), (), "NK", False, dict(wgmma_bn=128, wgmma_smem_epilogue=0, wgmma_split_k=2,
                                             wgmma_split_cluster=1)),
    ((700, 768, 768), (), "NK", False, dict(wgmma_bm=128, wgmma_bn=128, wgmma_stages=4, wgmma_raster=2)),
    ((1500, 3072, 768), (), "KN", False, dict(wgmma_smem_epilogue=0, wgmma_tiles=2, wgmma_raster=4)),
    ((200, 256, 128), (5,), "NK", False, dict(wgmma_bm=128, wgmma_bn=128, wgmma_stages=3, wgmma_tiles=2)),
    ((100, 128, 64), (3, 4), "KN", False, dict(wgmma_bm=64, wgmma_bn=64, wgmma_stages=2, wgmma_inflight=0)),
    ((256, 256, 128), (2, 3), "NK", True, dict(wgmma_bn=256, wgmma_stages=3)),
    ((1000, 768, 768), (), "KN", False, dict(wgmma_bm=64, wgmma_bn=96, wgmma_stages=8)),  # 32-wide N atoms
    ((1024, 768, 3072), (), "KN", False, dict(wgmma_bm=128, wgmma_bn=96, wgmma_stages=8, wgmma_smem_epilogue=0,
                                              wgmma_split_k=2, wgmma_split_cluster=1)),
    ((256, 192, 256), (2,), "KN", True, dict(wgmma_bm=64, wgmma_bn=96, wgmma_stages=4, wgmma_tiles=2,
                                             wgmma_smem_epilogue=0)),
    # M below one tile: A's box holds M's rows alone, the stage's rows past them left as they are
    ((96, 768, 1024), (), "NK", False, dict(wgmma_bm=128, wgmma_bn=96, wgmma_stages=6, wgmma_smem_epilogue=0,
                                            wgmma_split_k=2, wgmma_split_cluster=1)),
    ((40, 192, 256), (2,), "KN", False, dict(wgmma_bm=64, wgmma_bn=96, wgmma_stages=4)),
    ((100, 256, 512), (), "NK", False, dict(wgmma_bm=128, wgmma_bn=128, wgmma_stages=4, wgmma_ws=1,
                                            wgmma_smem_epilogue=0)),
])
def test_cuda_tma_kernels_match_float64_and_write_nothing_past_m(shape, batch, b_layout, b_shared, knobs):
    """Every kind of TMA kernel against float64: a wrong box coordinate, swizzle or barrier
    phase gives an O(1) error or NaN; C is a view of a NaN-poisoned buffer a tile row longer per
    matrix, whose rows past it must stay NaN (rows past M load as zeros and are never stored)."""
    import tvm

    from tvm_ext.target import resolve_target

    m, n, k = shape
    target = resolve_target("cuda")
    t = WgmmaGemmTemplate(m, n, k, b_layout=b_layout, batch=batch, b_shared=b_shared)
    base = {**WgmmaTile(128, 256, 4, 1, True, 0).knobs(), "wgmma_tma": 1}
    program = t.build_program(t.space(target).make(**{**base, **knobs}), target)
    rng = np.random.default_rng(0)
    a, bt = (rng.standard_normal(spec.shape).astype(np.float16) for spec in t.inputs())
    ref = t.reference([a, bt])[0]
    dev = tvm.cuda(0)
    spare = int(np.prod(batch, dtype=np.int64)) * 256 * n
    poisoned = tvm.runtime.tensor(np.full(int(np.prod(ref.shape)) + spare, np.nan, np.float16), dev)
    c = poisoned._create_view(ref.shape)
    for _ in range(2):  # the second call reuses the barriers' phases from a fresh launch
        program.executable.mod["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(bt, dev), c)
    out = c.numpy().astype(np.float64)
    assert np.isfinite(out).all()
    per_matrix = np.linalg.norm((out - ref).reshape(-1, m, n), axis=(1, 2)) / \
        np.linalg.norm(ref.reshape(-1, m, n), axis=(1, 2))
    assert per_matrix.max() < 1e-3, per_matrix
    assert np.isnan(poisoned.numpy()[int(np.prod(ref.shape)):]).all()
