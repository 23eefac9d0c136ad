"""mma.sync + ldmatrix tensor-core GEMM (``schedules/gemm/mma.py``): CUDA source generated offline
for every knob and dtype variant and assembled by nvcc, the reasons configs are refused, the
template and CLI wiring, and (``-m gpu``) every variant against float64 with NaN-poisoned
outputs."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tvm_ext.measure.builder import compile_module
from tvm_ext.core.errors import TvmExtError
from tvm_ext.schedules.gemm.mma import (AUTO_TILES, MMA_SPACE, NARROW_TILES, MmaGemmTemplate, MmaTile,
                                        mma_reason, pick_mma_tile)
from tvm_ext.target import TargetInfo, offline_cuda

F16, BF16, F32 = "float16", "bfloat16", "float32"
# 128x128x32, 4 warps of 64x64, 3 cp.async stages, swizzled, fragments of 2 k slices together
BASE = dict(mma_warps_m=2, mma_warps_n=2, mma_frags_m=4, mma_frags_n=4, mma_k_frags=2, mma_stages=3,
            mma_swizzle=1, mma_frag_buffers=2, mma_raster=0, mma_out_smem=1, mma_split_k=1)
SMALL = dict(BASE, mma_frags_m=2, mma_frags_n=2)  # 64x64x32

# name -> (template, config changes): every knob value and dtype the template supports
VARIANTS: dict[str, tuple[MmaGemmTemplate, dict[str, int]]] = {
    "f16_out16": (MmaGemmTemplate(256, 512, 128, c_dtype=F16), BASE),
    "f16_out32_direct": (MmaGemmTemplate(256, 512, 128), dict(BASE, mma_out_smem=0)),
    "f16_out32_smem": (MmaGemmTemplate(256, 512, 128), BASE),
    "acc16": (MmaGemmTemplate(256, 512, 128, acc_dtype=F16, c_dtype=F16), BASE),
    "acc16_direct": (MmaGemmTemplate(256, 512, 128, acc_dtype=F16, c_dtype=F16), dict(BASE, mma_out_smem=0)),
    "bf16": (MmaGemmTemplate(256, 512, 128, a_dtype=BF16, b_dtype=BF16), BASE),
    "bf16_out_bf16": (MmaGemmTemplate(256, 512, 128, a_dtype=BF16, b_dtype=BF16, c_dtype=BF16), BASE),
    "padded_rows": (MmaGemmTemplate(256, 512, 128, c_dtype=F16), dict(BASE, mma_swizzle=0)),
    "single_stage": (MmaGemmTemplate(256, 512, 128, c_dtype=F16), dict(BASE, mma_stages=1)),
    "two_stages": (MmaGemmTemplate(256, 512, 128, c_dtype=F16), dict(BASE, mma_stages=2)),
    "four_stages_k64": (MmaGemmTemplate(256, 512, 256, c_dtype=F16), dict(SMALL, mma_stages=4, mma_k_frags=4)),
    "fragments_one_slice": (MmaGemmTemplate(256, 512, 128, c_dtype=F16), dict(BASE, mma_frag_buffers=1)),
    "raster_2": (MmaGemmTemplate(256, 512, 128, c_dtype=F16), dict(SMALL, mma_raster=2)),
    "raster_8": (MmaGemmTemplate(256, 512, 128, c_dtype=F16), dict(SMALL, mma_raster=8)),
    "warps_4x1": (MmaGemmTemplate(256, 512, 128, c_dtype=F16), dict(BASE, mma_warps_m=4, mma_warps_n=1,
                                                                      mma_frags_m=2, mma_frags_n=8)),
    "split_k_2": (MmaGemmTemplate(64, 512, 256, c_dtype=F16), dict(SMALL, mma_split_k=2)),
    "split_k_4_out32": (MmaGemmTemplate(64, 512, 512), dict(SMALL, mma_split_k=4, mma_raster=2)),
    "m_8_padded": (MmaGemmTemplate(8, 1536, 512, c_dtype=F16), dict(SMALL, mma_warps_m=1, mma_frags_m=1)),
    "m_100_padded": (MmaGemmTemplate(100, 256, 128, c_dtype=F16), SMALL),
    # N and K padded: a speech model's 29 classes (B's rows copied an element at a time), its 80
    # features (the last k stage half zeros, A's chunks guarded whole), and all three ragged at once
    # (30 columns two at a time, K = 72 on 16-deep stages)
    "n_29_padded": (MmaGemmTemplate(256, 29, 128, c_dtype=F16), dict(SMALL, mma_warps_n=1)),
    "k_80_padded": (MmaGemmTemplate(256, 128, 80, c_dtype=F16), SMALL),
    "mnk_padded": (MmaGemmTemplate(100, 30, 72, c_dtype=F16),
                   dict(SMALL, mma_warps_n=1, mma_k_frags=1, mma_frag_buffers=1, mma_swizzle=0)),
    # attention's product with V in a small model: batched, N = 16 (the head size) on a 32-wide tile
    "batched_n_16_padded": (MmaGemmTemplate(128, 16, 64, batch=6, c_dtype=F16), dict(SMALL, mma_warps_n=1)),
}


@pytest.fixture(scope="module")
def cuda() -> TargetInfo:
    import tvm

    if tvm.get_global_func("target.build.cuda", allow_missing=True) is None:
        pytest.skip("this TVM has no CUDA code generator")
    return offline_cuda("sm_90")


def _config(changes: dict[str, int]) -> Any:
    return MMA_SPACE.make(**changes)


def _build(template: MmaGemmTemplate, config: Any, target: TargetInfo) -> tuple[Any, str, Any]:
    assert template.reason(config, target) is None, template.reason(config, target)
    ex, source, launches, params = compile_module(template.schedule(config, target).mod, target,
                                                  template.pass_config(config, target))
    return ex, source, launches


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variants_generate_ldmatrix_and_mma_sync(cuda, name):
    template, changes = VARIANTS[name]
    config = _config(changes)
    t = MmaTile.of(config)
    _, src, launches = _build(template, config, cuda)
    op = "bf16" if template.a_dtype == BF16 else "f16"
    acc = "f32" if template.acc_dtype == F32 else "f16"
    assert f"mma.sync.aligned.m16n8k16.row.col.{acc}.{op}.{op}.{acc}" in src
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in src and "ldmatrix.sync.aligned.m8n8.x4.trans" in src
    assert ("cp.async" in src) == (t.stages > 1)
    assert (" ^ " in src) == bool(t.swizzle)  # the XOR swizzle of shared addresses
    # fragments and accumulators stay in registers: one lane's share of each tile, no 32-lane arrays
    lane_arrays = re.findall(r"alignas\(\d+\) \w+ (\w+)_warp_ptr\[(\d+)\];", src)
    tiles = {"A": t.frags_m * t.frag_buffers, "B": t.frags_n * t.frag_buffers, "C": t.frags_m * t.frags_n}
    assert lane_arrays and all(int(size) == 8 * tiles.get(name[0], tiles["C"]) for name, size in lane_arrays), \
        lane_arrays
    kernel = launches[0]
    assert kernel.block == (32, t.warps, 1)
    assert kernel.grid[2] == (template.batch or t.split_k)  # a batch's matrices, or the slices of K
    assert len(launches) == (2 if t.split_k > 1 else 1)  # split-K adds the reduction kernel


@pytest.mark.skipif(not os.path.exists("/usr/local/cuda/bin/nvcc"), reason="nvcc not installed")
@pytest.mark.parametrize("name", ["f16_out16", "bf16", "acc16", "split_k_2", "m_8_padded", "mnk_padded"])
def test_nvcc_assembles_without_local_memory(cuda, name, tmp_path):
    """ptxas accepts the source, and no fragment or accumulator array lands in local memory."""
    template, changes = VARIANTS[name]
    _, src, _ = _build(template, _config(changes), cuda)
    (tmp_path / "k.cu").write_text(src)
    proc = subprocess.run(["/usr/local/cuda/bin/nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o",
                           str(tmp_path / "k.cubin"), str(tmp_path / "k.cu")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "0 bytes stack frame, 0 bytes spill stores" in proc.stderr, proc.stderr


def test_ragged_edges_are_guarded_in_the_source(cuda):
    """Past a ragged K the copies into shared memory write zeros (16-byte cp.async whose
    predicate is the chunk's place before K, zero-filled otherwise); past a ragged N, B's rows
    are read an element at a time below N (29 columns: no aligned vector) and C is stored
    below N only; a shape the tile divides has no guard at all.  Each thread copies one vector
    (as wide as the ragged row allows) of consecutive ones: the kernel's one loop is over k
    stages, no thread walks a vector's elements one after another (uncoalesced)."""
    _, k80, _ = _build(*_variant("k_80_padded"), cuda)
    assert "cp_async_legacy_pred_cg_16" in k80 and "@!p st.shared.v4.u32" in k80
    _, n29, _ = _build(*_variant("n_29_padded"), cuda)
    assert re.search(r"if \(.*< 29\)", n29) and "B_ptr[" in n29  # B's scalar loads under a guard
    assert re.search(r"C_out_ptr\[[^]]*\] = ", n29) and "uint4*)(C_out_ptr" not in n29
    for name in ("n_29_padded", "mnk_padded"):
        assert re.findall(r"for \(int (\w+) = 0", _build(*_variant(name), cuda)[1]) == ["k_0_0"], name
    _, whole, _ = _build(*_variant("f16_out16"), cuda)
    assert "cp_async_legacy_pred" not in whole and "if (" not in whole.split("main_kernel(")[-1]


def _variant(name: str) -> tuple[MmaGemmTemplate, Any]:
    template, changes = VARIANTS[name]
    return template, _config(changes)


def test_tvm_nvcc_compile_cuda(cuda):
    """The project's way to compile offline: ``tvm.support.nvcc.compile_cuda`` to a cubin."""
    import tvm
    from tvm.support import nvcc

    os.environ.setdefault("CUDA_PATH", "/usr/local/cuda")
    template, changes = VARIANTS["f16_out16"]
    _, src, _ = _build(template, _config(changes), cuda)
    with tvm.target.Target(cuda.tvm_target()):
        cubin = nvcc.compile_cuda(src, target_format="cubin", compiler="nvcc")
    assert len(cubin) > 1000


@pytest.mark.parametrize("args,changes,expected", [
    ((64, 64, 64, F32, F16, F32, F32), {}, "float16 or bfloat16 operands of one type"),
    ((64, 64, 64, F16, F16, "float64", F32), {}, "accumulates in float32 or float16"),
    ((64, 64, 64, BF16, BF16, F16, F16), {}, "bfloat16 mma.sync accumulates in float32 only"),
    ((256, 29, 128, F16, F16, F32, F32), {}, "N=29 pads to 64: a whole warp column of the 64-wide block tile"),
    ((256, 256, 40, F16, F16, F32, F32), {}, "K=40 pads to 64: more than half of the last 32-deep k stage"),
    ((64, 500, 256, F16, F16, F32, F32), dict(mma_split_k=2), "N=500 and K=256 to be multiples"),
    ((256, 256, 128, F16, F16, F32, F32), dict(mma_frags_m=8, mma_frags_n=4), "accumulator registers"),
    ((256, 256, 128, F16, F16, F16, F16), dict(mma_split_k=2), "needs a float32 accumulator"),
    ((100, 256, 128, F16, F16, F32, F32), dict(mma_split_k=2), "no padding with split-K"),
    ((4096, 4096, 4096, F16, F16, F32, F32), dict(mma_split_k=2), "MiB of partial sums"),
    ((20, 256, 128, F16, F16, F32, F32), {}, "a whole warp row of the 64-row block tile would compute padding"),
    ((256, 256, 128, F16, F16, F32, F32), dict(mma_swizzle=1, mma_k_frags=1, mma_frag_buffers=1),
     "XOR swizzle needs shared rows of a multiple of 32"),
    ((256, 256, 128, F16, F16, F32, F32), dict(mma_k_frags=1, mma_swizzle=0), "needs at least 2 k slices"),
    ((256, 192, 128, F16, F16, F32, F32), dict(mma_raster=2), "rasterization in strips of 2"),
    ((256, 29, 128, F16, F16, F32, F32), dict(mma_warps_n=1, mma_raster=2),
     "strips of 2 blocks needs the 1 block columns of N=29"),  # a padded N's columns counted
    ((1024, 1024, 1024, F16, F16, F32, F32), dict(mma_warps_m=4, mma_warps_n=4, mma_frags_m=4, mma_frags_n=4,
                                                   mma_k_frags=4, mma_stages=4), "shared memory >"),
    ((256, 256, 128, F16, F16, F32, F32), dict(mma_warps_m=1, mma_warps_n=4, mma_frags_m=1, mma_frags_n=1,
                                               mma_swizzle=0), "does not split into 16-byte copies"),
])
def test_infeasible_configs_name_their_reason(cuda, args, changes, expected):
    config = _config({**SMALL, **changes})
    reason = mma_reason(*args, cuda, config)
    assert reason is not None and expected in reason, reason


def test_target_reasons(cuda):
    config = _config(SMALL)
    assert mma_reason(256, 256, 128, F16, F16, F32, F32, cuda, config) is None
    opencl = dataclasses.replace(cuda, kind="opencl", arch="")
    assert "need a CUDA target, not opencl" in mma_reason(256, 256, 128, F16, F16, F32, F32, opencl, config)
    turing = offline_cuda("sm_75")
    assert "compute capability >= 8.0" in mma_reason(256, 256, 128, F16, F16, F32, F32, turing, config)
    small = dataclasses.replace(cuda, max_threads_per_block=64)
    assert "128 threads per block > device limit 64" in mma_reason(256, 256, 128, F16, F16, F32, F32, small, config)


def test_pick_fits_the_benchmark_shapes_without_measuring(cuda):
    """Every benchmark shape gets a feasible pick: large tiles for large shapes, more blocks
    (smaller tiles or split-K) for the skinny GRU ones."""
    for m, n, k in ((4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 2048), (8192, 3072, 1024),
                    (64, 3072, 1024), (8, 1536, 512)):
        config = pick_mma_tile(m, n, k, F16, F32, F16, cuda)
        assert config is not None and mma_reason(m, n, k, F16, F16, F32, F16, cuda, config) is None, (m, n, k)
    big = MmaTile.of(pick_mma_tile(4096, 4096, 4096, F16, F32, F16, cuda))
    assert (big.block_m, big.block_n) == (128, 128)
    skinny = MmaTile.of(pick_mma_tile(64, 3072, 1024, F16, F32, F16, cuda))
    assert (64 // skinny.block_m) * (3072 // skinny.block_n) * skinny.split_k >= cuda.compute_units
    assert pick_mma_tile(64, 100, 8, F16, F32, F16, cuda) is None  # K = 8: k stages of 32 or 64, mostly zeros
    # a tile that divides N and K is taken before a padded one; the padded one where none does
    whole = MmaTile.of(pick_mma_tile(8192, 96, 1024, F16, F32, F16, cuda, split_k=False))
    assert (whole.block_n, whole.block_k) == (32, 32)
    for m, n, k in ((8192, 29, 1024), (8192, 1024, 80)):
        ragged = pick_mma_tile(m, n, k, F16, F32, F16, cuda, split_k=False)
        assert ragged is not None and mma_reason(m, n, k, F16, F16, F32, F16, cuda, ragged) is None, (m, n, k)
    # an N of 32 or less on 64x32x64 (4 warps along M), padded or whole: 0.020 ms at 8192x29x1024
    # against 16x32x32's 0.037; its weight padded to 32 columns, 0.0076 against 0.014
    for n in (29, 32):
        head = MmaTile.of(pick_mma_tile(8192, n, 1024, F16, F32, F16, cuda, split_k=False))
        assert (head.block_m, head.block_n, head.block_k, head.warps) == (64, 32, 64, 4), n
    # M = 8 (no split-K) fills no SM count: the most warps in flight, on the deeper tile of a tie
    tiny = MmaTile.of(pick_mma_tile(8, 1536, 512, F16, F32, F16, cuda))
    assert (tiny.block_m, tiny.block_n, tiny.warps, tiny.stages, tiny.split_k) == (16, 64, 2, 4, 1)


def test_template_space_default_scratch_and_records(cuda, tmp_path):
    """The template: feasible exactly where ``mma_reason`` allows; the default is the pick;
    skinny shapes get a split-K scratch buffer as the last parameter of every config, large
    ones none; the tuner's builder compiles it under the config's pass options; the record's
    workload rebuilds the template."""
    from tvm_ext.measure.builder import build_one
    from tvm_ext.operators import get_template_class
    from tvm_ext.core.template import Workload

    template = MmaGemmTemplate(64, 512, 256, c_dtype=F16)
    space = template.space(cuda)
    rng = np.random.default_rng(0)
    sample = [space.decode(row) for row in space.random_feasible_indices(rng, 20)]
    assert len(sample) == 20 and all(template.reason(c, cuda) is None for c in sample)
    assert template.scratch()[0].shape == (8, 64, 512)
    assert MmaGemmTemplate(4096, 4096, 4096).scratch() == []
    default = template.default_config(cuda)
    assert space.is_feasible(default)
    for config in (default, default.replace(mma_split_k=1), default.replace(mma_split_k=2)):
        result = build_one(template, config, cuda)
        assert result.ok, result.error_msg
        assert result.artifact.params == ("A", "B", "C_out" if config.mma_split_k == 1 else "C", "partial")
        assert "mma.sync" in result.artifact.source and "cp.async" in result.artifact.source
    workload = Workload.of(template, cuda).as_json()
    assert get_template_class(workload["template"])(**workload["params"]) == template


def test_template_refuses_what_it_cannot_run(cuda):
    with pytest.raises(TvmExtError, match="must both be float16 or both bfloat16"):
        MmaGemmTemplate(64, 64, 64, a_dtype=F32)
    with pytest.raises(TvmExtError, match="no mma.sync tile fits GEMM 64x100x8: K=8 pads to 32"):
        MmaGemmTemplate(64, 100, 8).default_config(cuda)
    with pytest.raises(TvmExtError, match="need a CUDA target, not opencl"):
        MmaGemmTemplate(64, 64, 64).default_config(TargetInfo(kind="opencl", device_name="any"))


def test_sampled_feasible_configs_build(cuda):
    """Random feasible configs (the space a search walks) all build to mma.sync kernels."""
    template = MmaGemmTemplate(128, 512, 256, c_dtype=F16)
    space = template.space(cuda)
    for row in space.random_feasible_indices(np.random.default_rng(1), 8):
        config = space.decode(row)
        assert "mma.sync" in _build(template, config, cuda)[1], str(config)


# ---- the kernel as a knob: tune gemm-tc ------------------------------------------------------
def test_choice_template_builds_both_kernels(cuda, tmp_path):
    """``tc_kernel`` picks mma.sync or WMMA; a config reads only its kernel's knobs (the other
    kernel's give the same source); WMMA configs are infeasible with bfloat16 operands, wgmma
    ones with float16 sums."""
    from tvm_ext.measure.builder import build_one
    from tvm_ext.schedules.gemm.tensor_core_choice import TensorCoreChoiceTemplate

    template = TensorCoreChoiceTemplate(64, 512, 256, c_dtype=F16)
    default = template.default_config(cuda)
    assert default.tc_kernel == "mma" and template.space(cuda).is_feasible(default)
    sources = {}
    wmma = default.replace(tc_kernel="wmma")
    for config in (default, wmma, wmma.replace(mma_raster=4 - default.mma_raster)):
        result = build_one(template, config, cuda)
        assert result.ok, result.error_msg
        assert result.artifact.params[-1] == "partial"  # both kernels take the split-K scratch
        sources[config] = result.artifact.source
    mma, wmma, wmma_again = sources.values()
    assert "mma.sync.aligned.m16n8k16" in mma and "wmma::mma_sync" in wmma
    assert wmma == wmma_again
    bf16 = TensorCoreChoiceTemplate(64, 512, 256, a_dtype=BF16, b_dtype=BF16)
    assert "need float16 operands" in bf16.reason(bf16.default_config(cuda).replace(tc_kernel="wmma"), cuda)
    assert bf16.reason(bf16.default_config(cuda).replace(tc_kernel="wgmma"), cuda) is None
    f16_sums = TensorCoreChoiceTemplate(64, 512, 256, acc_dtype=F16, c_dtype=F16)
    assert "accumulating in float32, not float16/float16 in float16" in f16_sums.reason(
        f16_sums.default_config(cuda).replace(tc_kernel="wgmma"), cuda)


def test_choice_template_runs_wgmma_on_hopper(cuda):
    """``tc_kernel`` wgmma: B (K, N) read N-major (the transpose flag set), the split-K scratch
    parameter kept; the pick takes it where its tiles give every SM a block, mma.sync (with
    split-K) for a skinny GEMM, and nothing of it off Hopper."""
    import dataclasses
    import re

    from tvm_ext.schedules.gemm.tensor_core_choice import TensorCoreChoiceTemplate

    square = TensorCoreChoiceTemplate(2048, 4096, 512)
    config, why = square.analytic_pick(cuda)
    assert config.tc_kernel == "wgmma" and "wgmma 128x256x64" in why
    program = square.build_program(config, cuda)
    assert re.search(r"m64n256k16\.f32\.f16\.f16 \{[^}]*\}, %\d+, %\d+, \w+, 1, 1, 0, 1;", program.source)
    skinny = TensorCoreChoiceTemplate(64, 512, 256, c_dtype=F16)
    assert skinny.analytic_pick(cuda)[0].tc_kernel == "mma"
    wg = skinny.build_program(skinny.default_config(cuda).replace(tc_kernel="wgmma"), cuda)
    assert wg.params[-1] == "partial" and len(wg.params) == 4  # the buffers the runner passes
    ampere = dataclasses.replace(cuda, arch="sm_80")
    assert square.analytic_pick(ampere)[0].tc_kernel == "mma"
    assert "needs a Hopper GPU" in square.reason(config, ampere)


@pytest.mark.parametrize("c_dtype, smem", [(BF16, True), (F32, False)])
def test_choice_template_runs_bfloat16_on_wgmma_on_hopper(cuda, c_dtype, smem):
    """bfloat16 operands: the pick takes wgmma on Hopper as for float16 (mma.sync reached only
    0.54-0.60 of cuBLAS there), its ``.f32.bf16.bf16`` form with B read N-major; the shared-memory
    epilogue where C is bfloat16 (staged in the operands' dtype), C stored directly otherwise,
    and a staged float32 C refused with that reason."""
    import re

    from tvm_ext.schedules.gemm.tensor_core_choice import TensorCoreChoiceTemplate
    from tvm_ext.schedules.gemm.wgmma import WgmmaTile

    square = TensorCoreChoiceTemplate(2048, 4096, 512, a_dtype=BF16, b_dtype=BF16, c_dtype=c_dtype)
    config, why = square.analytic_pick(cuda)
    assert config.tc_kernel == "wgmma" and "wgmma bfloat16 128x256x64" in why
    assert WgmmaTile.of(square.kernel_config(config)[1]).smem_epilogue == smem
    source = square.build_program(config, cuda).source
    assert re.search(r"m64n256k16\.f32\.bf16\.bf16 \{[^}]*\}, %\d+, %\d+, \w+, 1, 1, 0, 1;", source)
    assert ".f32.f16.f16" not in source
    if not smem:
        staged = config.replace(wgmma_smem_epilogue=1)
        assert "stages bfloat16 C only" in square.reason(staged, cuda)


@pytest.mark.parametrize("args, code, expect", [
    (["--shape", "4096,4096,4096", "--target", "cuda", "--strategy", "analytic", "--no-measure"], 0,
     "config: tc_kernel=wgmma "),  # Hopper (the H100's limits offline)
    (["--shape", "4096,4096,4096", "--kernel", "mma", "--target", "cuda", "--strategy", "analytic", "--no-measure"],
     0, "config: mma_warps_m=2 mma_warps_n=2 mma_frags_m=4 mma_frags_n=4 mma_k_frags=2 mma_stages=4"),
    (["--shape", "2048,2048,2048", "--kernel", "mma", "--in-dtype", "bfloat16", "--target", "cuda", "--strategy",
      "analytic", "--no-measure"], 0, "gemm_mma m=2048 n=2048 k=2048 a_dtype=bfloat16"),
    (["--shape", "64,64,64"], 2, "error: no tensor-core tile fits GEMM 64x64x64: tensor cores (mma.sync) need a "
                                 "CUDA target, not opencl"),
    (["--shape", "64,64,64", "--kernel", "wmma"], 2, "error: no tensor-core tile fits GEMM 64x64x64: tensor cores "
                                                     "(WMMA) need a CUDA target"),
    (["--shape", "64,100,8", "--target", "cuda", "--strategy", "analytic", "--no-measure"], 2,
     "error: no tensor-core tile fits GEMM 64x100x8: K=8 pads to 32"),
])
def test_gemm_tc_cli(args, code, expect, tmp_path):
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "gemm-tc", *args, "--records", str(tmp_path / "r.jsonl"),
                        "--no-progress"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == code, p.stderr
    assert expect in (p.stdout if code == 0 else p.stderr), (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    if code == 2:
        assert len([l for l in p.stderr.splitlines() if l.startswith("error:")]) == 1


# ---- on a GPU --------------------------------------------------------------------------------
GPU_CASES = dict(VARIANTS)
GPU_CASES["large_default_4096"] = (MmaGemmTemplate(4096, 4096, 4096, c_dtype=F16), AUTO_TILES[0].as_dict())
GPU_CASES["gru_input_8192x3072x1024"] = (MmaGemmTemplate(8192, 3072, 1024, c_dtype=F16),
                                         dict(AUTO_TILES[1].as_dict(), mma_raster=8))
GPU_CASES["gru_hidden_split_8"] = (MmaGemmTemplate(64, 3072, 1024, c_dtype=F16),
                                   dict(AUTO_TILES[3].as_dict(), mma_split_k=8))
# a speech model's output layer and front end on their picks (N = 29 on 64x32x64, K = 80 in 32-deep stages)
GPU_CASES["speech_head_pick"] = (MmaGemmTemplate(8192, 29, 1024, c_dtype=F16, allow_split_k=False),
                                 NARROW_TILES[0].as_dict())
GPU_CASES["speech_front_pick"] = (MmaGemmTemplate(8192, 1024, 80, c_dtype=F16, allow_split_k=False),
                                  AUTO_TILES[0].as_dict())


def gpu_error(template: MmaGemmTemplate, config: Any, target: TargetInfo, seed: int) -> float:
    """Build ``config``, run it once on fresh random inputs with NaN-poisoned output and
    scratch, and return ‖out − ref‖ / ‖ref‖ against float64 of the rounded inputs (inf if
    any output element is not finite, i.e. unwritten)."""
    import tvm

    from tvm_ext.precision.precision import cast, np_dtype

    ex, _, _ = _build(template, config, target)
    dev = tvm.cuda(target.device_id)
    rng = np.random.default_rng(seed)
    inputs = [cast(rng.uniform(-1, 1, s.shape), s.dtype) for s in template.inputs()]
    outs = [np.full(s.shape, np.nan, np_dtype(s.dtype)) for s in template.outputs() + template.scratch()]
    args = [tvm.runtime.tensor(x, dev) for x in inputs + outs]
    ex.mod["main"](*args)
    dev.sync()
    out = args[len(inputs)].numpy().astype(np.float64)
    ref = inputs[0].astype(np.float64) @ inputs[1].astype(np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def gpu_tolerance(template: MmaGemmTemplate) -> float:
    """Rounding of a correct kernel (a wrong one is off by O(1)): float32 accumulation leaves
    the output's own rounding (2^-11 float16, 2^-8 bfloat16); float16 accumulation adds an
    float16 ulp per step of its running sums."""
    if template.acc_dtype == F16:
        return 2e-3 * np.sqrt(template.k / 16)
    return {F32: 1e-5, F16: 1e-3, BF16: 8e-3}[template.c_dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_matches_float64(case):
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda", 0)
    template, changes = GPU_CASES[case]
    config = _config(changes)
    for seed in (0, 1):  # fresh inputs twice: the same function on any input
        err = gpu_error(template, config, target, seed)
        assert err < gpu_tolerance(template), f"{case} {MmaTile.of(config).label()}: rel err {err:.2e}"


@pytest.mark.gpu
def test_gemm_tc_tunes_on_the_gpu(tmp_path):
    """End to end on a GPU: the GA over the kernels measures correct kernels, mma.sync and WMMA
    at least (wgmma as the GA draws it on Hopper)."""
    from tvm_ext.core.records import RecordStore

    records = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "gemm-tc", "--shape", "512,512,256", "--out-dtype",
                        "float16", "--target", "cuda", "--generations", "2", "--population", "8", "--records",
                        str(records), "--no-progress"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    recs = list(RecordStore(str(records)))
    assert sum(r.ok for r in recs) >= 6
    assert all(r.error_kind != "wrong_answer" for r in recs)
    assert {r.config["tc_kernel"] for r in recs if r.ok} >= {"mma", "wmma"}
