"""float32 GEMM as three TF32 products on Hopper's wgmma (``tune gemm-3xtf32``).

- The TF32 parts (numpy): 13 low bits zero, hi + lo = x to 2^-22 at any normal magnitude (the
  largest floats stay finite, NaN and infinity are kept),
  three products float32-accurate where one TF32 product is not.
- The split kernels, built by TVM for OpenCL and run on PoCL: the parts they store, in order.
- The program (generated CUDA, no GPU): split, split, TF32 wgmma GEMM of depth 3K; promotion
  in the source only where the config asks; the refusals.
- ``-m gpu``: against float64 on NaN-poisoned outputs; promotion cuts the error of the tensor
  cores' sums at K = 4096 below cuBLAS float32's order, without it it is ten times that.
"""
from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest
from cubin_checks import assert_wgmma_asynchronous_without_spills, ptxas_report

from tvm_ext.core.errors import TvmExtError
from tvm_ext.schedules.gemm.gemm_3xtf32 import (A_ORDER, A_TWO_PARTS, B_ORDER, B_TWO_PARTS, TF32_K_PARTS,
                                                Gemm3xTf32Template, split_a_func, split_b_func, split_product,
                                                tf32_parts)
from tvm_ext.target import offline_cuda

CLI = [sys.executable, "-m", "tvm_ext.tune"]


FLOAT32_MAX = float(np.finfo(np.float32).max)
CUDA_NAN = np.array([0x7FFFFFFF], np.uint32).view(np.float32)[0]  # the NaN CUDA's arithmetic makes


def _operands(rng, m, n, k):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    a[0, :4] = (3e30, -1e-30, 7e-39, 0.0)  # beyond float16's range both ways, a subnormal
    return a, b


def _special(rng, m, n, k):
    """``_operands`` with float32's largest (which would round past it) in A's second row, NaN
    (all payload bits set) and infinities in its last."""
    a, b = _operands(rng, m, n, k)
    a[1, :2] = (FLOAT32_MAX, -FLOAT32_MAX)
    a[-1, :3] = (CUDA_NAN, np.inf, -np.inf)
    return a, b


def test_tf32_parts_keep_the_largest_floats_finite_and_nan_and_infinity_as_they_are():
    a, _ = _special(np.random.default_rng(0), 8, 8, 64)
    hi, lo = tf32_parts(a)
    assert np.all(np.isfinite(hi[:2])) and np.all(np.isfinite(lo[:2]))
    assert hi[1, 0] + np.float64(lo[1, 0]) == pytest.approx(FLOAT32_MAX, rel=2.0 ** -22)
    assert np.isnan(hi[-1, 0]) and np.isnan(lo[-1, 0])  # a NaN's carry must not make it zero
    assert hi[-1, 1] == np.inf and hi[-1, 2] == -np.inf


def test_tf32_parts_hold_22_bits_at_any_magnitude():
    a, _ = _operands(np.random.default_rng(0), 8, 8, 64)
    hi, lo = tf32_parts(a)
    assert not (hi.view(np.uint32) & 0x1FFF).any() and not (lo.view(np.uint32) & 0x1FFF).any()
    rebuilt = hi.astype(np.float64) + lo.astype(np.float64)
    # subnormals keep what TF32 can: bits down to 2^-136
    assert np.all(np.abs(rebuilt - a) <= np.abs(a) * 2.0 ** -22 + 2.0 ** -137)


def test_three_tf32_products_are_float32_accurate_where_one_is_not():
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((64, 512), (512, 48)))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = lambda x: np.linalg.norm(x - ref) / np.linalg.norm(ref)  # noqa: E731
    one = tf32_parts(a)[0].astype(np.float64) @ tf32_parts(b)[0].astype(np.float64)
    assert err(split_product(a, b)) < 2e-7 < 1e-4 < err(one)


@pytest.mark.parametrize("b_layout", ["KN", "NK"])
@pytest.mark.parametrize("stored", [3, 2])
def test_split_kernels_store_the_parts_in_order(opencl, b_layout, stored):
    """A: [lo | hi | hi] along each row; B (k, n), or Bᵀ (n, k) stored: [hi | lo | hi] along each
    row of Bᵀ; with two stored parts [lo | hi] and [hi | lo]."""
    from opencl_calls import run_calls

    m, n, k = 6, 64, 32
    a, b = _special(np.random.default_rng(2), m, n, k)
    b_in = b if b_layout == "KN" else b.T.copy()
    orders = {3: (A_ORDER, B_ORDER), 2: (A_TWO_PARTS, B_TWO_PARTS)}[stored]
    funcs = {"split_a": split_a_func(m, k, orders[0]), "split_b": split_b_func(k, n, b_layout, orders[1])}
    out = run_calls(opencl, funcs, [("split_a", ("A", "a_parts")), ("split_b", ("B", "b_parts"))],
                    {"A": a, "B": b_in}, {"a_parts": (m, stored * k), "b_parts": (n, stored * k)})
    a_hi, a_lo = tf32_parts(a)
    b_hi, b_lo = tf32_parts(b.T.copy())
    want_a, want_b = ([a_lo, a_hi, a_hi], [b_hi, b_lo, b_hi]) if stored == 3 else ([a_lo, a_hi], [b_hi, b_lo])
    assert np.array_equal(out["a_parts"], np.concatenate(want_a, axis=1), equal_nan=True)
    assert np.array_equal(out["b_parts"], np.concatenate(want_b, axis=1))


def test_two_stored_parts_are_read_in_turn_by_one_function():
    """``tf_parts`` 2: the program is ``kernel_func``'s one function (its part buffers two parts
    deep, its own), the GEMM's k steps taking (A part, B part) (lo, hi), (hi, lo), (hi, hi) of
    each k tile in turn (the layout's coordinates), loaded by the TMA; refused without it; a
    record written before the knob reads as three parts."""
    from tvm_ext.schedules.gemm.wgmma import WgmmaTile
    from tvm_ext.schedules.gemm.wgmma_layout import KernelLayout

    target = offline_cuda()
    t = Gemm3xTf32Template(256, 256, 128, b_layout="NK")
    two = t.default_config(target)
    assert two.tf_parts == 2 and two.wgmma_tma == 1  # the pick, where its tile can
    cfg = two.replace(tf_parts=3, wgmma_tma=0)
    assert "loaded by the TMA" in t.space(target).infeasible_reason(cfg.replace(tf_parts=2))
    program = t.build_program(two, target)
    assert [(c.name, c.args) for c in program.calls] == [("main", ("A", "B", "C"))]
    assert "tf32.tf32" in program.source and program.source.count('extern "C" __global__') >= 3
    from tvm import tirx
    from tvm.sym.analyzer import Analyzer

    layout = KernelLayout.of(WgmmaTile.of(two, "tf32"), t.m, t.n, t.depth, "NK", (), False, two.tf_promote,
                             k_parts=TF32_K_PARTS)
    assert tuple(layout.a_shape) == (256, 256) and tuple(layout.bt_shape) == (256, 256)  # two parts of K = 128
    at = lambda kt, operand: int(Analyzer().simplify(  # noqa: E731
        layout.k_coordinate(tirx.const(kt, "int32"), operand)))
    # k steps 0-5: (A_lo, B_hi), (A_hi, B_lo), (A_hi, B_hi) of k tile 0, then of k tile 1 (32 deep)
    assert [(at(kt, 0), at(kt, 1)) for kt in range(6)] == [(0, 0), (128, 128), (128, 0), (32, 32), (160, 160),
                                                           (160, 32)]
    assert t.build_program(cfg.replace(wgmma_tma=1), target).source != program.source
    old = {k: v for k, v in two.as_dict().items() if k != "tf_parts"}
    assert t.space(target).completed(old)["tf_parts"] == 3


def test_two_stored_parts_take_no_scratch_and_three_parts_keep_theirs(tmp_path):
    """The two-part program's parts are buffers of its one function's own: its measurement and
    its exported manifest take A, B and C only, not the three-part scratch it never touches (400 MB
    at 4096³); a three-part program keeps its two; the workload is the same either way."""
    import json

    from tvm_ext.measure.builder import build_one
    from tvm_ext.measure.measure import MeasureSettings, make_job
    from tvm_ext.precision.codegen import export_program

    target = offline_cuda()
    t = Gemm3xTf32Template(256, 256, 128)
    two = t.default_config(target)
    three = two.replace(tf_parts=3, wgmma_tma=0)
    assert two.tf_parts == 2 and t.measured_operator(two).scratch() == []
    assert [s.shape for s in t.measured_operator(three).scratch()] == [(256, 384), (256, 384)]
    assert t.measured_operator(two).params == t.params == t.measured_operator(three).params
    for cfg, names in ((two, ["A", "B", "C"]), (three, ["A", "B", "C", "a_parts", "b_parts"])):
        built = build_one(t, cfg, target)
        assert built.ok, built.error_msg
        job = make_job(t, cfg, built.artifact, target, MeasureSettings())
        assert [name for name, _ in job.buffers] == names
        folder = tmp_path / f"parts{cfg.tf_parts}"
        export_program(t, cfg, target, str(folder))
        manifest = json.loads((folder / "manifest.json").read_text())
        assert [tensor["name"] for tensor in manifest["tensors"]] == names


def test_the_program_splits_then_multiplies_tf32_at_depth_3k():
    target = offline_cuda()
    t = Gemm3xTf32Template(256, 256, 128)
    cfg = t.default_config(target).replace(tf_parts=3)  # three stored parts: three kernels of their own
    assert cfg.tf_promote == 4 and cfg.wgmma_smem_epilogue == 0
    program = t.build_program(cfg, target)
    assert [(c.name, c.args) for c in program.calls] == [
        ("split_a", ("A", "a_parts")), ("split_b", ("B", "b_parts")), ("gemm", ("a_parts", "b_parts", "C"))]
    assert [s.shape for s in t.scratch()] == [(256, 384), (256, 384)]
    assert f"wgmma.mma_async.sync.aligned.m64n{cfg.wgmma_bn}k8.f32.tf32.tf32" in program.source
    plain = t.build_program(cfg.replace(tf_promote=0), target).source
    # promoting: C is stored from the second set of sums (the promoted ones); without, from the accumulators
    assert "(total_ptr + " in program.source and "total" not in plain


def test_the_default_tile_is_64_columns_wide_only_where_nothing_wider_divides():
    """An m64n64k8 TF32 wgmma underfeeds the tensor cores: 64 columns only where N allows no more.
    BERT's 1024x768 outputs have few wide tiles, so K is split: 128x192 in 4 slices, 128 units
    (H100: 1.32x and 1.19x cuBLAS float32 at K = 3072 and 768, against 1.00 and 1.09 with 96
    unsplit tiles of 64x128); the wide shapes keep their tiles, unsplit."""
    from tvm_ext.schedules.gemm.wgmma import WgmmaTile

    target = offline_cuda()

    def tile(*shape):
        t = WgmmaTile.of(Gemm3xTf32Template(*shape).default_config(target), "tf32")
        return t.bm, t.bn, t.tiles, t.split

    assert tile(1024, 768, 3072) == tile(1024, 768, 768) == (128, 192, 1, 4)
    assert tile(1024, 3072, 768) == (128, 192, 1, 1) and tile(4096, 4096, 4096) == (128, 128, 8, 1)
    assert tile(128, 64, 64) == (64, 64, 1, 1)


@pytest.mark.parametrize("shape, knobs, reason", [
    ((256, 256, 128), dict(wgmma_smem_epilogue=1), "C stored directly"),
    ((256, 256, 128), dict(wgmma_smem_epilogue=1, wgmma_ws=1, wgmma_tma=1, wgmma_pdl=0),
     "stages float16 or bfloat16 C only"),  # C float32: the warp-specialized kernel's own stage refuses it
    ((256, 256, 128), dict(wgmma_bm=128, wgmma_bn=256, wgmma_stages=4, tf_promote=4), "bn <= 192"),
    ((256, 256, 96), dict(tf_promote=8), "must divide the 9 k steps"),
    ((256, 256, 128), dict(wgmma_stages=2, wgmma_inflight=1), "at least 3 stages"),
])
def test_configs_that_cannot_work_are_refused_with_their_reason(shape, knobs, reason):
    target = offline_cuda()
    t = Gemm3xTf32Template(*shape)
    cfg = t.default_config(target).replace(**knobs)
    assert reason in t.space(target).infeasible_reason(cfg)


def test_targets_without_wgmma_and_untileable_shapes_are_errors(tmp_path):
    with pytest.raises(TvmExtError, match="Hopper GPU"):
        Gemm3xTf32Template(256, 256, 256).default_config(offline_cuda("sm_80"))
    with pytest.raises(TvmExtError, match="no TF32 wgmma tile fits 100x256x256"):
        Gemm3xTf32Template(100, 256, 256).default_config(offline_cuda())
    p = subprocess.run(CLI + ["gemm-3xtf32", "--shape", "256,256,256", "--target", "opencl", "--records",
                              str(tmp_path / "r.jsonl"), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "error: wgmma is a CUDA (Hopper, sm_90) instruction, not opencl's"]


def test_one_function_splits_then_multiplies():
    """``kernel_func``: the splits and the TF32 GEMM in one PrimFunc (what a Relax model's float32
    matmul is replaced by), its part buffers its own, three kernels in its module in that order;
    B stored (N, K) is split row by row as A is."""
    import tvm

    from tvm_ext.schedules.gemm.wgmma import sm_90a

    target = offline_cuda()
    for b_layout, b_stored in (("KN", (128, 256)), ("NK", (256, 128))):
        t = Gemm3xTf32Template(256, 256, 128, b_layout=b_layout)
        func = t.kernel_func(t.default_config(target))
        assert [tuple(p.shape) for p in func.params] == [(256, 128), b_stored, (256, 256)]
        source = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target(sm_90a(target).tvm_target())) \
            .mod.imports[0].inspect_source()
        kernels = [line for line in source.splitlines() if line.startswith('extern "C" __global__') and
                   line.endswith("{")]  # definitions, not the declarations before them
        assert len(kernels) == 3 and "tf32.tf32" in source
        assert "A_in_ptr" in kernels[0] and "B_in_ptr" in kernels[1] and "C_ptr" in kernels[2]  # split, split, GEMM
        assert ("threadIdx.y" in source.split(kernels[1])[1].split(kernels[2])[0]) == (b_layout == "KN")
    assert Gemm3xTf32Template(64, 64, 64, b_layout="NK").params["b_layout"] == "NK"
    assert "b_layout" not in Gemm3xTf32Template(64, 64, 64).params  # records of B (K, N) keep their key


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
def _gpu_error(t, cfg, a, b):
    import tvm

    from tvm_ext.target import resolve_target

    program = t.build_program(cfg, resolve_target("cuda"))
    dev = tvm.cuda(0)
    bufs = {"A": a, "B": b, "C": np.full((t.m, t.n), np.nan, np.float32),
            **{name: np.full(s.shape, np.nan, np.float32) for name, s in zip(("a_parts", "b_parts"), t.scratch())}}
    bufs = {name: tvm.runtime.tensor(x, dev) for name, x in bufs.items()}
    for call in program.calls:
        program.executable.mod[call.name](*[bufs[name] for name in call.args])
    out = bufs["C"].numpy().astype(np.float64)
    ref = t.reference([a, b])[0]
    return np.linalg.norm(out - ref) / np.linalg.norm(ref), out


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [None,  # the pick as it is (two stored parts, loaded by the TMA)
                                   dict(),  # the rest on the pick's tile with three stored parts, cp.async
                                   dict(wgmma_bm=128, wgmma_bn=192, wgmma_stages=4, wgmma_tiles=1, wgmma_raster=0,
                                        tf_promote=2),
                                   dict(wgmma_bm=64, wgmma_bn=64, wgmma_tiles=3),
                                   dict(wgmma_inflight=0, tf_promote=1),
                                   dict(wgmma_bm=128, wgmma_bn=128, wgmma_tiles=1, wgmma_split_k=4, tf_promote=4),
                                   dict(wgmma_bm=64, wgmma_bn=128, wgmma_tiles=2, wgmma_split_k=3, tf_promote=2),
                                   dict(wgmma_bm=128, wgmma_bn=128, wgmma_tiles=1, wgmma_split_k=2,
                                        wgmma_split_cluster=1, tf_promote=4),
                                   dict(wgmma_bm=128, wgmma_bn=192, wgmma_stages=4, wgmma_tiles=1, wgmma_raster=0,
                                        wgmma_split_k=4, wgmma_split_cluster=1, tf_promote=2),
                                   dict(wgmma_tma=1), dict(wgmma_bm=64, wgmma_bn=64, wgmma_tiles=3, wgmma_tma=1),
                                   # two stored parts read in turn: one wave, K split by a second kernel and in
                                   # a cluster, promotions overlapped
                                   dict(wgmma_tma=1, tf_parts=2),
                                   dict(wgmma_bm=128, wgmma_bn=128, wgmma_tiles=1, wgmma_split_k=4, tf_promote=4,
                                        wgmma_tma=1, tf_parts=2),
                                   dict(wgmma_bm=128, wgmma_bn=192, wgmma_stages=4, wgmma_tiles=1, wgmma_raster=0,
                                        wgmma_split_k=4, wgmma_split_cluster=1, tf_promote=2, wgmma_tma=1,
                                        tf_parts=2),
                                   dict(wgmma_bm=128, wgmma_bn=128, wgmma_tiles=2, tf_promote_overlap=1, wgmma_tma=1,
                                        tf_parts=2)])
def test_cuda_3xtf32_matches_float64(knobs):
    t = Gemm3xTf32Template(384, 768, 512)
    pick = t.default_config(offline_cuda())
    a, b = _operands(np.random.default_rng(3), t.m, t.n, t.k)
    a[0, :4] = 0.5  # finite products: the huge values stay in the split test
    cfg = pick if knobs is None else pick.replace(wgmma_tma=0, tf_parts=3).replace(**knobs)
    err, out = _gpu_error(t, cfg, a, b)
    assert np.isfinite(out).all() and err < 1e-6


@pytest.mark.skipif(not shutil.which("nvcc"), reason="needs nvcc (ptxas)")
def test_overlapped_promotions_keep_the_tf32_wgmma_asynchronous(tmp_path):
    """The default tile with ``tf_promote_overlap``: ptxas keeps its wgmma asynchronous (no C7514
    report) and every value in registers (no spills)."""
    target = offline_cuda()
    t = Gemm3xTf32Template(1024, 1024, 1024)
    cfg = t.default_config(target).replace(tf_promote_overlap=1)
    assert t.space(target).infeasible_reason(cfg) is None
    assert_wgmma_asynchronous_without_spills(ptxas_report(t.build_program(cfg, target).source, tmp_path))


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [dict(), dict(wgmma_tma=1), dict(wgmma_tiles=1, tf_promote=2)])
def test_cuda_3xtf32_overlapped_promotions_give_the_same_c(knobs):
    """The same sums in the same order: C bit for bit the kernel's without overlap."""
    t = Gemm3xTf32Template(384, 512, 640)
    cfg = t.default_config(offline_cuda()).replace(wgmma_bm=128, wgmma_bn=128, wgmma_stages=6, wgmma_raster=0,
                                                   wgmma_tma=0, tf_parts=3).replace(**knobs)
    a, b = _operands(np.random.default_rng(5), t.m, t.n, t.k)
    err0, plain = _gpu_error(t, cfg, a, b)
    err1, overlapped = _gpu_error(t, cfg.replace(tf_promote_overlap=1), a, b)
    assert np.isfinite(overlapped).all() and err1 < 1e-6
    np.testing.assert_array_equal(plain, overlapped)


@pytest.mark.gpu
def test_cuda_promotion_keeps_the_sums_float32_accurate_at_depth_4096():
    t = Gemm3xTf32Template(256, 256, 4096)
    cfg = t.default_config(offline_cuda())
    rng = np.random.default_rng(4)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((256, 4096), (4096, 256)))
    promoted, _ = _gpu_error(t, cfg, a, b)
    plain, _ = _gpu_error(t, cfg.replace(tf_promote=0), a, b)
    assert promoted < 1e-6 < 3 * promoted < plain


@pytest.mark.gpu
@pytest.mark.parametrize("b_layout", ["KN", "NK"])
@pytest.mark.parametrize("stored", [3, 2])
def test_cuda_one_function_matches_float64(b_layout, stored):
    """The splits and the GEMM in one function (its own part buffers), both B layouts, three
    stored parts or two read in turn."""
    import tvm

    from tvm_ext.schedules.gemm.wgmma import sm_90a
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    t = Gemm3xTf32Template(384, 768, 512, b_layout=b_layout)
    cfg = t.default_config(target)
    cfg = cfg.replace(wgmma_tma=0, tf_parts=3) if stored == 3 else cfg.replace(wgmma_tma=1, tf_parts=2)
    main = tvm.compile(tvm.IRModule({"main": t.kernel_func(cfg)}),
                       target=tvm.target.Target(sm_90a(target).tvm_target()))["main"]  # the parts allocated inside
    a, b = _operands(np.random.default_rng(5), t.m, t.n, t.k)
    a[0, :4] = 0.5
    b = b if b_layout == "KN" else b.T.copy()
    dev = tvm.cuda(0)
    c = tvm.runtime.tensor(np.full((t.m, t.n), np.nan, np.float32), dev)
    main(tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
    out = c.numpy().astype(np.float64)
    ref = t.reference([a, b])[0]
    assert np.isfinite(out).all() and np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-6


def test_the_k_slices_sums_keep_memory_of_their_own_beside_parts_the_tma_reads():
    """K split over slices added by a second kernel, the parts the function's own and read by the
    TMA (two stored parts, several tiles a block): TVM sees the TMA's reads of the parts only where
    their tensor maps are encoded, so unless the slices' sums are allocated apart it gives them the
    parts' memory (C was wrong by 7.8 on the GPU).  Three device allocations: A's parts, Bᵀ's, the
    sums."""
    import tvm

    from tvm_ext.schedules.gemm.wgmma import sm_90a

    target = offline_cuda()
    t = Gemm3xTf32Template(384, 768, 512)
    cfg = t.default_config(target).replace(wgmma_bm=128, wgmma_bn=128, wgmma_tiles=2, wgmma_split_k=3,
                                           wgmma_split_cluster=0, wgmma_tma=1, tf_parts=2)
    assert t.space(target).infeasible_reason(cfg) is None
    built = tvm.compile(tvm.IRModule({"main": t.kernel_func(cfg)}),
                        target=tvm.target.Target(sm_90a(target).tvm_target()))
    assert built.mod.inspect_source("ll").count("load ptr, ptr @__TVMBackendAllocWorkspace") == 3
