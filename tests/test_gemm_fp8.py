"""The 8-bit float GEMM (``tvm_ext.schedules.gemm.gemm_fp8``): C = (A·Btᵀ) x scale_a x scale_b with
e4m3 or e5m2 operands on Hopper's wgmma, as ``torch._scaled_mm`` computes it.

CI (no GPU): the program built for an offline sm_90 target takes the ``m64nNk32`` e4m3 / e5m2
form on 1-byte stages (a k step of 128) and reads the two scales; what cannot work is refused
with its reason; the check is float64 of the rounded 8-bit operands times the scales; records
load back.  ``-m gpu``: tiles against float64 on NaN-poisoned outputs, and ``tune gemm-fp8``.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from cubin_checks import assert_wgmma_asynchronous_without_spills, ptxas_report

from tvm_ext.core.errors import TvmExtError
from tvm_ext.schedules.gemm.gemm_fp8 import Fp8GemmTemplate
from tvm_ext.schedules.gemm.wgmma import WgmmaTile
from tvm_ext.target import offline_cuda


def _config(template, target, **knobs):
    """``knobs`` over a 128x256 tile, 4 stages, sums not promoted."""
    return template.space(target).make(**{**WgmmaTile(128, 256, 4, 1, False, 0).knobs(), "fp8_promote": 0,
                                          "fp8_promote_overlap": 0, **knobs})


def _cubin_builds(source: str) -> bool:
    from tvm_ext.cost_model.ptxas import ptxas_of_source

    return ptxas_of_source(source, "sm_90a") is not None


@pytest.mark.parametrize("fp8, out_dtype, storage, c_type", [
    ("e4m3", "float16", "__nv_fp8_e4m3", "half"),
    ("e5m2", "bfloat16", "__nv_fp8_e5m2", "nv_bfloat16"),
])
def test_the_program_takes_the_k32_fp8_wgmma_form_and_reads_both_scales(fp8, out_dtype, storage, c_type):
    target = offline_cuda()
    t = Fp8GemmTemplate(512, 768, 1024, fp8=fp8, out_dtype=out_dtype)
    cfg = t.default_config(target)
    tile = t.tile(cfg)
    assert tile.bk == 128 and not tile.smem_epilogue and tile.split == 1 and tile.name.startswith(f"wgmma {fp8} ")
    assert cfg.fp8_promote == 1 and tile.bn <= 192  # the default promotes the sums every k step
    source = t.build_program(cfg, target).source
    assert f"wgmma.mma_async.sync.aligned.m64n{tile.bn}k32.f32.{fp8}.{fp8}" in source
    assert ".f16.f16" not in source and "k16" not in source
    loaded = t.build_program(cfg.replace(wgmma_tma=1, fp8_promote_overlap=1), target).source
    assert "CUtensorMap a_map" in loaded and f"k32.f32.{fp8}.{fp8}" in loaded  # TMA boxes of 1-byte elements
    kernel = source.split('extern "C" __global__', 1)[1]  # the declarations and the kernels
    assert f"{storage}* __restrict__ A_ptr" in kernel and f"{c_type}* __restrict__ C_ptr" in kernel
    assert "scale_ab_ptr[0] * scale_ab_ptr[1]" in kernel  # both scales multiply the sum
    assert [s.dtype for s in t.inputs()] == [f"float8_{fp8}fn" if fp8 == "e4m3" else "float8_e5m2"] * 2 + ["float32"]
    if shutil.which("nvcc"):
        assert _cubin_builds(source)


@pytest.mark.parametrize("knobs, reason", [
    (dict(wgmma_split_k=2), "does not split K"),
    (dict(wgmma_smem_epilogue=1), "read K-major only"),
    (dict(fp8_promote=1), "2 sets of 128 accumulators"),  # bn 256: no room for the promoted set
])
def test_what_the_fp8_kernel_cannot_do_is_refused_with_its_reason(knobs, reason):
    target = offline_cuda()
    t = Fp8GemmTemplate(512, 512, 1024)
    assert reason in t.space(target).infeasible_reason(_config(t, target, **knobs))
    with pytest.raises(TvmExtError, match="multiples of 64 and K of 128"):
        Fp8GemmTemplate(512, 512, 192).default_config(target)  # K = 1.5 k steps of 128
    with pytest.raises(TvmExtError, match="allowed: e4m3, e5m2"):
        Fp8GemmTemplate(128, 128, 128, fp8="e3m4")
    with pytest.raises(TvmExtError, match="not float32"):
        Fp8GemmTemplate(128, 128, 128, out_dtype="float32")


def test_the_check_is_float64_of_the_rounded_operands_times_the_scales():
    """The reference multiplies the 8-bit values exactly and scales them; the check passes their
    product rounded to float16 but fails one that drops a k step of 128 or leaves a tile
    unwritten."""
    from tvm_ext.precision.precision import cast

    t = Fp8GemmTemplate(128, 128, 512)
    inputs, (ref,) = t.make_case(np.random.default_rng(0))
    a, bt, scales = inputs
    assert a.dtype.name == "float8_e4m3fn" and scales.dtype == np.float32
    exact = a.astype(np.float64) @ bt.astype(np.float64).T * float(scales[0]) * float(scales[1])
    assert np.array_equal(ref, exact)
    good = cast(ref, "float16")
    assert t.check([good], [ref]) is None
    short = a[:, 128:].astype(np.float64) @ bt[:, 128:].astype(np.float64).T * float(scales[0]) * float(scales[1])
    assert "exceeds" in t.check([cast(short, "float16")], [ref])
    unwritten = good.copy()
    unwritten[:64, :64] = np.nan
    assert t.check([unwritten], [ref]) is not None


def test_an_fp8_record_names_its_formats_and_loads_back():
    from tvm_ext.operators import template_of
    from tvm_ext.core.template import Workload

    t = Fp8GemmTemplate(256, 256, 512, fp8="e5m2", out_dtype="bfloat16")
    workload = json.loads(json.dumps(Workload.of(t, offline_cuda()).as_json()))
    assert workload["params"]["a_dtype"] == "float8_e5m2" and workload["params"]["scales"] == "per_tensor"
    assert template_of(workload) == t
    other = dict(workload, params=dict(workload["params"], a_dtype="float16"))
    assert template_of(other) is None
    assert template_of(dict(workload, params=dict(workload["params"], scales="per_row"))) is None


def test_an_accuracy_class_keeps_the_search_to_its_promotion_and_is_its_own_workload():
    """``promote`` (``tune gemm-fp8 --promote``): every other promotion refused, the default at
    it, the workload naming it (records of another class are another workload's), loaded back."""
    from tvm_ext.core.template import Workload
    from tvm_ext.operators import template_of

    target = offline_cuda()
    t = Fp8GemmTemplate(1024, 1024, 1024, promote=1)
    space = t.space(target)
    cfg = t.default_config(target)
    assert cfg.fp8_promote == 1 and space.infeasible_reason(cfg) is None
    for other in (0, 2, 4):
        assert "promotes every 1 k steps" in space.infeasible_reason(cfg.replace(fp8_promote=other,
                                                                                 fp8_promote_overlap=0))
    drawn = [space.decode(i) for i in space.random_feasible_indices(np.random.default_rng(0), 20)]
    assert drawn and all(c.fp8_promote == 1 for c in drawn)
    unpromoted = dataclasses.replace(t, promote=0)
    assert unpromoted.default_config(target).fp8_promote == 0
    keys = {Workload.of(x, target).key for x in (t, unpromoted, dataclasses.replace(t, promote=None))}
    assert len(keys) == 3
    assert Workload.of(dataclasses.replace(t, promote=None), target).key == \
        Workload.of(Fp8GemmTemplate(1024, 1024, 1024), target).key  # a searched promotion: the key as before
    assert template_of(json.loads(json.dumps(Workload.of(t, target).as_json()))) == t
    with pytest.raises(TvmExtError, match="allowed: 0, 1, 2, 4"):
        Fp8GemmTemplate(128, 128, 128, promote=3)
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "gemm-fp8", "--shape", "128,128,128", "--promote", "3"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--promote: invalid choice: 3" in p.stderr


def test_the_float16_wgmma_kernel_is_unchanged_by_the_fp8_operands():
    """The operand table grew 1-byte entries; float16's and TF32's programs read the same."""
    from tvm_ext.schedules.gemm.wgmma import wgmma_gemm
    from tvm_ext.schedules.gemm.wgmma_layout import K_MAJOR_ONLY, KernelLayout

    assert "float16" not in K_MAJOR_ONLY and "tf32" in K_MAJOR_ONLY
    layout = KernelLayout.of(WgmmaTile(operand="e4m3"), 256, 256, 256, "NK", (), True, 0)
    assert (layout.bk, layout.k_inst, layout.chunk_elems, layout.k_major_only) == (128, 32, 16, True)
    scaled = wgmma_gemm(dataclasses.replace(WgmmaTile(operand="e4m3"), smem_epilogue=False), 256, 256, 256,
                        scales=True)
    assert [str(p.dtype) for p in scaled.params] == ["float8_e4m3fn", "float8_e4m3fn", "float32", "float16"]
    with pytest.raises(TvmExtError, match="per-tensor scales are the whole epilogue"):
        wgmma_gemm(dataclasses.replace(WgmmaTile(operand="e4m3"), smem_epilogue=False), 256, 256, 256,
                   bias_dtype="float16", scales=True)


def test_cli_takes_gemm_fp8_and_refuses_a_target_without_wgmma():
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "gemm-fp8", "--shape", "128,128,128"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "error: wgmma is a CUDA (Hopper, sm_90) instruction, not opencl's"], p.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("shape, fp8, out_dtype, knobs", [
    ((512, 768, 1024), "e4m3", "float16", None),  # the default pick
    ((512, 768, 1024), "e5m2", "bfloat16", None),
    ((1024, 2176, 3072), "e4m3", "float16", None),  # the wide default, its last tile column past N
    ((192, 320, 640), "e4m3", "float16", dict(wgmma_bm=64, wgmma_bn=64, wgmma_stages=4)),  # odd tile counts
    ((1024, 1024, 2048), "e4m3", "float16", dict(wgmma_bn=128, wgmma_stages=6, wgmma_tiles=4, wgmma_raster=2)),
    ((1024, 1024, 2048), "e4m3", "float16", dict(wgmma_bn=128, wgmma_stages=6, wgmma_tiles=4, wgmma_raster=2,
                                                 wgmma_tma=1)),  # 128-byte boxes of 128 one-byte elements
    ((64, 512, 1024), "e4m3", "float16", dict(wgmma_bm=128, wgmma_tma=1)),  # M below one tile: A's box of 64 rows
])
def test_cuda_fp8_gemm_matches_float64(shape, fp8, out_dtype, knobs):
    """On the GPU against float64 of the same 8-bit operands times the scales, C NaN-poisoned."""
    import tvm

    from tvm_ext.precision.precision import np_dtype
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    t = Fp8GemmTemplate(*shape, fp8=fp8, out_dtype=out_dtype)
    cfg = t.default_config(target) if knobs is None else _config(t, target, **knobs)
    program = t.build_program(cfg, target)
    for seed in (1, 2):
        inputs, (ref,) = t.make_case(np.random.default_rng(seed))
        dev = tvm.cuda(0)
        c = tvm.runtime.tensor(np.full(ref.shape, np.nan, np_dtype(out_dtype)), dev)
        program.executable.mod["main"](*[tvm.runtime.tensor(x, dev) for x in inputs], c)
        out = c.numpy().astype(np.float64)
        assert np.isfinite(out).all()
        # promoted sums: C's rounding alone (float16 about 2.5e-4, bfloat16 2e-3); else the tolerance
        bound = (1e-3 if out_dtype == "float16" else 4e-3) if cfg.fp8_promote else t.tolerance
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < bound


@pytest.mark.parametrize("shape, overlapped, tma, bn", [
    ((4096, 4096, 4096), 1, 1, 128),  # 6 waves of 128x192: 1.125x the area of 8 waves of 128x128
    ((256, 256, 8192), 1, 1, 64), ((2048, 8192, 8192), 1, 1, 128),
    ((8192, 8192, 8192), 0, 1, 192),  # the wide tile: 21 waves of 128x192 against 32 of 128x128
    ((8192, 11008, 4096), 0, 1, 192),  # 29 waves against 42: 1.036x the area
    ((4096, 6144, 4096), 0, 1, 192), ((1024, 2176, 3072), 0, 1, 192),  # 192 divides N / 96 tiles against 136
    ((8192, 3072, 1024), 0, 0, 192),  # 8 k steps a block of the wide tile: as before
    ((1024, 768, 768), 0, 0, 64),  # 12 k steps a block: not measured there, as before
    ((192, 320, 640), 0, 0, 64), ((256, 256, 384), 0, 0, 64),  # K fills fewer k steps than the tile's stages
])
def test_the_default_promotes_overlapped_or_on_the_wide_tile_where_k_is_long(shape, overlapped, tma, bn):
    """The default promotes every k step; where its busiest block runs at least 24 k steps, TMA-loaded
    and warp-specialized, on ``WIDE_TILE`` (one C tile a block, not overlapped) where its waves of
    C tiles make at most ``WIDE_RATE`` times the area and its own blocks run 24 k steps, else
    overlapped on a tile of bn <= 128;
    elsewhere as before, also where K fills fewer k steps than the tile's stages (its stages cut to
    a depth the knob offers)."""
    target = offline_cuda()
    t = Fp8GemmTemplate(*shape)
    cfg = t.default_config(target)
    assert t.space(target).infeasible_reason(cfg) is None and cfg.fp8_promote == 1
    assert (cfg.fp8_promote_overlap, cfg.wgmma_tma, cfg.wgmma_ws, cfg.wgmma_bn) == (overlapped, tma, tma, bn)
    if bn == 192 and tma:
        assert (cfg.wgmma_bm, cfg.wgmma_tiles) == (128, 1)
    assert cfg.wgmma_smem_epilogue == tma  # the warp-specialized picks stage C through a stage of their own


def test_a_staged_default_is_the_same_config_storing_from_its_registers_where_c_does_not_fit():
    """``staged_c`` stages C only where the space takes it: the warp-specialized kernel, and its
    stage fitting beside the config's (6 stages of 128x256 e4m3 leave no room for C's 64 KiB)."""
    from tvm_ext.schedules.gemm.gemm_fp8 import staged_c

    target = offline_cuda()
    t = Fp8GemmTemplate(4096, 4096, 4096)
    space = t.space(target)
    cfg = t.default_config(target)
    direct = cfg.replace(wgmma_smem_epilogue=0)
    assert staged_c(space, direct) == cfg
    assert staged_c(space, direct.replace(wgmma_ws=0)) == direct.replace(wgmma_ws=0)  # not warp-specialized
    too_big = _config(t, target, **{**direct.as_dict(), "wgmma_bn": 256, "fp8_promote_overlap": 0})
    assert staged_c(space, too_big) == too_big and "shared memory" in space.infeasible_reason(
        too_big.replace(wgmma_smem_epilogue=1))


def test_a_relax_float32_c_is_stored_from_the_registers_whatever_the_config():
    """A Relax model's 8-bit matmul into float32 takes the default's config (C staged), or a tuned
    one taking C's stage in turn, and stores C straight from the registers (the stage holds 2-byte
    C only)."""
    target = offline_cuda()
    t = Fp8GemmTemplate(512, 512, 4096)
    cfg = t.default_config(target)
    assert cfg.wgmma_smem_epilogue == 1
    assert t.kernel_func(cfg, "float32", lambda v, row, col, lead: v) is not None
    big = Fp8GemmTemplate(4096, 4096, 4096)  # two consumer warpgroups: a tuned config may take C's stage in turn
    turns = big.default_config(target).replace(wgmma_c_turns=1)
    assert big.space(target).is_feasible(turns)
    assert big.kernel_func(turns, "float32", lambda v, row, col, lead: v) is not None


@pytest.mark.parametrize("knobs, reason", [
    (dict(fp8_promote=0), "needs promoted sums"),
    (dict(wgmma_bn=192, wgmma_stages=4), "3 sets of 96 accumulators"),
    (dict(wgmma_inflight=0), "wgmma_inflight 1"),
])
def test_overlapped_promotions_are_refused_where_they_cannot_run(knobs, reason):
    target = offline_cuda()
    t = Fp8GemmTemplate(512, 768, 1024)
    cfg = _config(t, target, **{"wgmma_bn": 128, "wgmma_stages": 6, "fp8_promote": 1, "fp8_promote_overlap": 1,
                                **knobs})
    assert reason in t.space(target).infeasible_reason(cfg)


@pytest.mark.skipif(not shutil.which("nvcc"), reason="needs nvcc (ptxas)")
@pytest.mark.parametrize("knobs", [dict(wgmma_tiles=4), dict(wgmma_tiles=4, wgmma_tma=1), dict(wgmma_tma=1)])
def test_overlapped_promotions_keep_the_wgmma_asynchronous(knobs, tmp_path):
    """ptxas keeps the overlapped kernel's wgmma asynchronous (no C7514 "serialized" report: no
    accumulator set read while a wgmma that writes it may run, as ptxas sees the loops) and in
    registers (no spills), where the promoted kernel without overlap needs no unrolling."""
    target = offline_cuda()
    t = Fp8GemmTemplate(1024, 1024, 4096)
    cfg = _config(t, target, **{"wgmma_bn": 128, "wgmma_stages": 6, "wgmma_raster": 8, "fp8_promote": 1,
                                "fp8_promote_overlap": 1, **knobs})
    assert_wgmma_asynchronous_without_spills(ptxas_report(t.build_program(cfg, target).source, tmp_path))


@pytest.mark.skipif(not shutil.which("nvcc"), reason="needs nvcc (ptxas)")
def test_the_wide_default_keeps_its_two_sets_in_registers_and_the_wgmma_asynchronous(tmp_path):
    """The wide default (128x192, warp-specialized: two sets of 96 accumulators a consumer thread
    under ``setmaxnreg``'s 232) builds with no spill and no serialized wgmma."""
    target = offline_cuda()
    t = Fp8GemmTemplate(8192, 8192, 8192)
    cfg = t.default_config(target)
    assert (cfg.wgmma_bn, cfg.wgmma_ws, cfg.wgmma_smem_epilogue) == (192, 1, 1)
    assert_wgmma_asynchronous_without_spills(ptxas_report(t.build_program(cfg, target).source, tmp_path))


@pytest.mark.skipif(not shutil.which("nvcc"), reason="needs nvcc (ptxas)")
def test_overlapped_promotions_unroll_a_chunk_of_k_not_the_whole_loop(tmp_path):
    """The overlapped kernel's code does not grow with K (an unrolled loop of 64 k steps ran at
    half speed, its code past the instruction cache): the same cubin size at K 4096 and 16384."""
    target = offline_cuda()
    sizes = []
    for k in (4096, 16384):
        t = Fp8GemmTemplate(1024, 1024, k)
        cfg = _config(t, target, **{"wgmma_bn": 128, "wgmma_stages": 4, "wgmma_raster": 8, "wgmma_tiles": 4,
                                    "wgmma_tma": 1, "fp8_promote": 1, "fp8_promote_overlap": 1})
        ptxas_report(t.build_program(cfg, target).source, tmp_path, f"k{k}")
        sizes.append((tmp_path / f"k{k}.cubin").stat().st_size)
    assert abs(sizes[1] - sizes[0]) < 0.05 * sizes[0], sizes


@pytest.mark.gpu
@pytest.mark.parametrize("shape, knobs", [
    ((512, 768, 1024), dict(wgmma_tiles=1)),  # 8 windows: an even count
    ((384, 512, 640), dict(wgmma_tiles=4, wgmma_raster=0)),  # 5 windows: the last one after the unrolled pairs
    ((384, 512, 640), dict(wgmma_tiles=4, wgmma_raster=0, wgmma_tma=1)),
    ((512, 768, 1024), dict(wgmma_tiles=3, fp8_promote=2)),  # 4 windows of 2 k steps
    ((256, 512, 1536), dict(wgmma_bm=64, wgmma_tiles=2)),
])
def test_cuda_overlapped_promotions_give_the_same_c(shape, knobs):
    """Overlapped promotions add the same sums in the same order: C bit for bit the kernel's
    without overlap, on NaN-poisoned outputs, and within C's rounding of float64."""
    import tvm

    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    t = Fp8GemmTemplate(*shape)
    base = {"wgmma_bn": 128, "wgmma_stages": 6, "wgmma_raster": 2, "fp8_promote": 1, **knobs}
    assert t.space(target).infeasible_reason(_config(t, target, **base, fp8_promote_overlap=1)) is None
    outs = []
    inputs, (ref,) = t.make_case(np.random.default_rng(3))
    dev = tvm.cuda(0)
    for overlap in (0, 1):
        program = t.build_program(_config(t, target, **base, fp8_promote_overlap=overlap), target)
        c = tvm.runtime.tensor(np.full(ref.shape, np.nan, np.float16), dev)
        program.executable.mod["main"](*[tvm.runtime.tensor(x, dev) for x in inputs], c)
        outs.append(c.numpy())
    assert np.isfinite(outs[1]).all()
    np.testing.assert_array_equal(outs[0], outs[1])
    out = outs[1].astype(np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-3


@pytest.mark.gpu
def test_cuda_tune_gemm_fp8(tmp_path):
    records = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "gemm-fp8", "--shape", "1024,1024,1024",
                        "--target", "cuda", "--trials", "6", "--population", "3", "--records", str(records)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    recs = [json.loads(line) for line in records.read_text().splitlines()]
    assert recs and all(r["workload"]["template"] == "gemm_fp8" for r in recs)
    assert any(not r["error_kind"] for r in recs)


@pytest.mark.gpu
def test_cuda_tune_gemm_fp8_in_one_accuracy_class(tmp_path):
    """``--promote 1``: every config measured promotes every k step, under the class's workload."""
    records = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "gemm-fp8", "--shape", "1024,1024,1024",
                        "--target", "cuda", "--trials", "6", "--population", "3", "--promote", "1",
                        "--records", str(records)], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    recs = [json.loads(line) for line in records.read_text().splitlines()]
    assert recs and all(r["workload"]["params"]["promote"] == 1 and r["config"]["fp8_promote"] == 1 for r in recs)
    assert any(not r["error_kind"] for r in recs)
