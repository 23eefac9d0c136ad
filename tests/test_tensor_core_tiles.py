"""Tensor-core tiles wherever a float16/bfloat16 GEMM runs on CUDA (``schedules/gemm/tensor_core_tile.py``):
the GEMM template, the GRU's input and hidden GEMMs and the mixed-precision programs take an
mma.sync or a WMMA tile.  CUDA source generated offline (and compiled by nvcc), which operand
types reach which kernel, the tile's text and pick, refusals with reasons, generated programs;
(``-m gpu``) results against float64 on NaN-poisoned outputs."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import pathlib
import re
import sys
from typing import Any

import numpy as np
import pytest

from tvm_ext.measure.builder import build_one
from tvm_ext.core.errors import TvmExtError
from tvm_ext.precision.mixed_precision import PrecisionProgram
from tvm_ext.schedules.gemm.simt import BiasGemmTemplate, GemmTemplate
from tvm_ext.schedules.gru import GruTemplate
from tvm_ext.schedules.gemm.mma import AUTO_TILES as MMA_TILES
from tvm_ext.schedules.gemm.mma import MmaGemmTile
from tvm_ext.schedules.gemm.tensor_core import WmmaGemmTile, parse_tile, pick_tile, pick_wmma_tile
from tvm_ext.target import TargetInfo, offline_cuda

F16, BF16, F32 = "float16", "bfloat16", "float32"
# 64x64x32 tiles of either kernel: 2x2 warps of 2x2 16x16 fragments
TILES = {"mma": parse_tile("mma_warps_m=2,mma_warps_n=2,mma_frags_m=2,mma_frags_n=2,mma_k_frags=2,mma_stages=3"),
         "wmma": parse_tile("tc_warps_m=2,tc_warps_n=2,tc_frags_m=2,tc_frags_n=2,tc_k_frags=2,tc_pipeline=1")}
NVCC = "/usr/local/cuda/bin/nvcc"


@pytest.fixture(scope="module")
def cuda() -> TargetInfo:
    import tvm

    if tvm.get_global_func("target.build.cuda", allow_missing=True) is None:
        pytest.skip("this TVM has no CUDA code generator")
    return offline_cuda("sm_90")


def tensor_core_kernels(source: str) -> dict[str, set[str]]:
    """Kernel name -> the tensor-core kernels its code uses: "mma" (ldmatrix and mma.sync
    PTX), "wmma" (the WMMA C++ API)."""
    found = {}
    for text in source.split('extern "C" __global__')[1:]:
        name = re.search(r"(\w+_kernel)\(", text).group(1)
        kinds = found.setdefault(name, set())
        if "ldmatrix.sync.aligned" in text and "mma.sync.aligned.m16n8k16" in text:
            kinds.add("mma")
        if "wmma::mma_sync" in text:
            kinds.add("wmma")
    return found


def using(source: str) -> set[str]:
    """The tensor-core kernels any kernel of ``source`` uses."""
    return set().union(*tensor_core_kernels(source).values())


def nvcc_compiles(source: str, target: TargetInfo) -> None:
    """The project's offline compile: ``tvm.support.nvcc.compile_cuda`` to PTX."""
    import tvm
    from tvm.support import nvcc

    if not os.path.exists(NVCC):
        pytest.skip("nvcc not installed")
    os.environ.setdefault("CUDA_PATH", "/usr/local/cuda")
    with tvm.target.Target(target.tvm_target()):
        ptx = nvcc.compile_cuda(source, target_format="ptx", compiler="nvcc")
    assert b".entry" in ptx


# ---- the mixed-precision GEMM ------------------------------------------------------------------
def gemm_program(tile: Any, target: TargetInfo, shape: tuple[int, int, int] = (128, 128, 64)) -> PrecisionProgram:
    base = GemmTemplate(*shape, tensor_core=tile)
    return PrecisionProgram(base, base.default_config(target))


def precision(program: PrecisionProgram, target: TargetInfo, a: str, b: str, acc: str, c: str) -> Any:
    return program.space(target).make(a=a, b=b, acc=acc, c=c)


@pytest.mark.parametrize("kernel", ["mma", "wmma"])
def test_precision_gemm_runs_each_operand_type_on_the_kernel_that_takes_it(cuda, kernel):
    """float16 operands reach either kernel, bfloat16 ones mma.sync only (WMMA has no bfloat16 in
    TVM 0.27), float32 and mixed operand types neither; the search's note says the same."""
    program = gemm_program(TILES[kernel], cuda)
    expected = {(F16, F16, F32, F32): {kernel}, (F16, F16, F16, F16): {kernel}, (F16, F16, F32, BF16): {kernel},
                (BF16, BF16, F32, BF16): {kernel} - {"wmma"}, (BF16, BF16, F32, F32): {kernel} - {"wmma"},
                (F32, F32, F32, F32): set(), (F16, BF16, F32, F32): set(), (BF16, BF16, F16, F16): set()}
    sources = {}
    for dtypes, kernels in expected.items():
        result = build_one(program, precision(program, cuda, *dtypes), cuda)
        assert result.ok, result.error_msg
        sources[dtypes] = result.artifact.source
        assert using(result.artifact.source) == kernels, dtypes
    if kernel == "mma":
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in sources[BF16, BF16, F32, BF16]
        assert "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16" in sources[F16, F16, F16, F16]
        nvcc_compiles(sources[BF16, BF16, F32, BF16], cuda)
    nvcc_compiles(sources[F16, F16, F32, F32], cuda)
    note = program.tensor_core_note(cuda)
    taken = "both float16 or both bfloat16" if kernel == "mma" else "both float16"
    assert note.endswith(f"GEMM on {TILES[kernel].label()} where a and b are {taken}"), note
    only_bf16 = PrecisionProgram(program.base, program.schedule_config, (BF16,)).tensor_core_note(cuda)
    assert ("where a and b are both bfloat16" in only_bf16) == (kernel == "mma"), only_bf16


def test_exported_program_builds_the_measured_kernel(cuda, tmp_path):
    """S7 on an mma.sync tile: the exported source is the kernel the builder built for the
    search (same tile, same pass options), the manifest names the tile."""
    from tvm_ext.precision.codegen import export_program

    tile = pick_tile([(128, 128, 64)], cuda)
    program = gemm_program(tile, cuda)
    chosen = precision(program, cuda, BF16, BF16, F32, F16)
    measured = build_one(program, chosen, cuda)
    assert measured.ok, measured.error_msg
    export_program(program.lowered(chosen), program.schedule_config, cuda, str(tmp_path))
    exported = (tmp_path / "program.cu").read_text()
    assert exported == measured.artifact.source and using(exported) == {"mma"}
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["params"]["tensor_core"] == str(tile) and manifest["precision"]["a"] == BF16
    assert (tmp_path / "program.so").stat().st_size > 0


# ---- the GRU -------------------------------------------------------------------------------------
GRU_SHAPE = dict(batch=16, hidden=64, input=64, seq=4, bidirectional=True)  # x·W_ih: 64x384x64, h·W_hh: 16x192x64
HALF = dict(x_dtype=F16, w_ih_dtype=F16, h_dtype=F16, w_hh_dtype=F16)


def gru_tiles(kernel: str, target: TargetInfo) -> dict[str, Any]:
    """Tiles of ``kernel`` for ``GRU_SHAPE``'s input and hidden GEMMs: ``pick_tile``'s (mma.sync
    where it fits) or WMMA's pick."""
    t = GruTemplate(**GRU_SHAPE)
    shapes = {"in_tensor_core": [(t.seq * t.batch, 6 * t.hidden, t.input)],
              "hid_tensor_core": [(t.batch, 3 * t.hidden, t.hidden)]}
    if kernel == "mma":
        tiles = {name: pick_tile(s, target, batch=t.dirs) for name, s in shapes.items()}
    else:
        tiles = {name: WmmaGemmTile(pick_wmma_tile(s, target)) for name, s in shapes.items()}
    assert {tile.kernel for tile in tiles.values()} == {kernel}
    return tiles


@pytest.mark.parametrize("kernel", ["mma", "wmma"])
def test_gru_gemms_run_on_their_tiles(cuda, kernel):
    """Unfused steps: the input GEMM (gru_gemm_x0) and the hidden GEMM (gru_gemm_h, batched over
    directions, M = 16) run on their tiles where their operands are 16-bit types the kernel
    takes, nothing else does; the module compiles with nvcc."""
    tiles = gru_tiles(kernel, cuda)
    half = GruTemplate(**GRU_SHAPE, **HALF, **tiles)
    cfg = half.default_config(cuda)
    assert cfg.fuse_step == 0
    source = half.compile(cfg, cuda).source
    kinds = tensor_core_kernels(source)
    assert {name for name, used in kinds.items() if used} == {"gru_gemm_x0_kernel", "gru_gemm_h_kernel"}
    assert all(used in (set(), {kernel}) for used in kinds.values())
    nvcc_compiles(source, cuda)
    bf16 = GruTemplate(**GRU_SHAPE, **{k: BF16 for k in HALF}, **tiles)
    bf16_kinds = tensor_core_kernels(bf16.compile(cfg, cuda).source)
    assert bf16_kinds["gru_gemm_x0_kernel"] == bf16_kinds["gru_gemm_h_kernel"] == ({"mma"} - {"wmma"} if
                                                                                 kernel == "mma" else set())
    fused = half.compile(cfg.replace(fuse_step=1), cuda).source  # the step kernel does the hidden GEMM
    assert {name for name, used in tensor_core_kernels(fused).items() if used} == {"gru_gemm_x0_kernel"}


def test_gru_pass_options_come_from_the_tiles_it_uses(cuda):
    """cp.async and the mma.sync tile's options only where a GEMM runs on the tile."""
    tiles = gru_tiles("mma", cuda)
    full = GruTemplate(**GRU_SHAPE, **tiles)
    cfg = full.default_config(cuda)
    assert full.pass_config(cfg, cuda) == {}
    half = dataclasses.replace(full, **HALF)
    assert half.pass_config(cfg, cuda) == {"tirx.disable_cse_tir": True, "tirx.use_async_copy": True}
    assert [g.a_dtype for g in half.gemms_on_tensor_cores(cfg, cuda)] == [F16, F16]


def test_float32_gru_source_is_unchanged_by_tiles(cuda):
    """A float32 GRU given tiles builds exactly the source it builds without them (its GEMMs stay
    on the CUDA cores, no pass option changes), for the patent pipeline, the fused step kernel
    and the analytic pick (whose step kernel at batch 8 runs float32 as float16 parts on mma.sync
    itself, tiles or not)."""
    plain = GruTemplate(batch=8, hidden=64, input=32, seq=3, layers=2)
    tiled = dataclasses.replace(plain, in_tensor_core=parse_tile("mma"), hid_tensor_core=parse_tile("wmma"))
    assert tiled.params != plain.params  # the tiles are part of the workload
    base = plain.default_config(cuda)
    for cfg in (base, base.replace(fuse_step=1, step_loop=2), plain.analytic_pick(cuda)[0]):
        source = plain.compile(cfg, cuda).source
        assert tiled.compile(cfg, cuda).source == source
        kernels = tensor_core_kernels(source)
        assert set().union(*(kinds for name, kinds in kernels.items() if name != "gru_steps_kernel")) == set()
        assert kernels.get("gru_steps_kernel", set()) == ({"mma"} if cfg.step_tc else set())


# ---- the tile: text, pick, refusals ---------------------------------------------------------------
def test_parse_and_pick_round_trip(cuda):
    """``str(tile)`` is the text ``parse_tile`` reads back; ``pick_tile`` takes mma.sync where a
    whole-K tile fits (the probe's picks for the benchmark shapes), WMMA where only it divides,
    nothing where neither does."""
    picks = {(4096, 4096, 4096): "mma.sync 128x128x32", (8192, 3072, 1024): "mma.sync 128x128x32",
             (64, 3072, 1024): "mma.sync 16x64x64", (8, 1536, 512): "mma.sync 16x64x64", (48, 48, 48): "WMMA 16x16x16"}
    for shape, label in picks.items():
        tile = pick_tile([shape], cuda)
        assert tile.label().startswith(label), tile.label()
        assert parse_tile(str(tile)) == tile and str(parse_tile(str(tile))) == str(tile)
        for dtype in tile.operand_dtypes:
            assert tile.reason(*shape, dtype, dtype, F32, F16, cuda, epilogue=True) is None
    assert pick_tile([(100, 100, 100)], cuda) is None
    assert pick_tile([(8192, 3072, 1024), (8192, 3072, 2048)], cuda).label().startswith("mma.sync 128x128x32")
    assert pick_tile([(4096, 4096, 4096)], TargetInfo(kind="opencl", device_name="any")) is None
    turing = pick_tile([(4096, 4096, 4096)], offline_cuda("sm_75"))  # no mma.sync, no cp.async; 64 KiB shared
    assert turing.label() == "WMMA 64x64x64 w2x2 p1 smem" and parse_tile(str(turing)) == turing
    assert parse_tile("mma") == MmaGemmTile(MMA_TILES[0]) and parse_tile("wmma").kernel == "wmma"
    assert parse_tile(" none ") is None
    two = parse_tile("mma_stages=2,mma_swizzle=0")
    assert two.kernel == "mma" and two.config == MMA_TILES[0].replace(mma_stages=2, mma_swizzle=0)
    for tile in (two, TILES["wmma"]):
        assert parse_tile(str(tile)) == tile
    keys = {GemmTemplate(64, 64, 64, tensor_core=t).params["tensor_core"] for t in TILES.values()}
    assert keys == {str(t) for t in TILES.values()} and len(keys) == 2
    with pytest.raises(TvmExtError, match="tensor_core takes a tensor-core tile"):
        GemmTemplate(64, 64, 64, tensor_core=MMA_TILES[0])
    with pytest.raises(TvmExtError, match="hid_tensor_core takes a tensor-core tile"):
        GruTemplate(**GRU_SHAPE, hid_tensor_core=TILES["wmma"].config)


@pytest.mark.parametrize("text, message", [
    ("mma_stages=5", "mma_stages=5 is not allowed; allowed values: 1, 2, 3, 4"),
    ("mma_stages=2,tc_vec=8", "a tensor-core tile is of one kernel"),
    ("warps=2", "unknown tensor-core knob 'warps'; knobs: mma: mma_warps_m"),
    ("mma_stages", "is not knob=integer"),
])
def test_parse_tile_refuses_bad_text(text, message):
    with pytest.raises(TvmExtError, match=re.escape(message)):
        parse_tile(text)


def test_tiles_a_gemm_cannot_take_are_refused_with_a_reason(cuda):
    """The tile's reason names why; a GEMM given such a tile stays on the CUDA cores; the CLI
    refuses a tile given by hand that its shape cannot take (a silent fallback otherwise)."""
    from tvm_ext.cli.mp_cli import tile_option

    mma, wmma = TILES["mma"], TILES["wmma"]
    cases = [
        (mma, (64, 20, 64, F16, F16), "N=20 pads to 64: a whole warp column of the 64-wide block tile"),
        (mma, (64, 64, 40, F16, F16), "K=40 pads to 64: more than half of the last 32-deep k stage"),
        (mma, (64, 64, 64, F16, BF16), "mma.sync needs float16 or bfloat16 operands of one type"),
        (MmaGemmTile(mma.config.replace(mma_split_k=2)), (64, 64, 64, F16, F16), "split-K needs a scratch buffer"),
        (wmma, (64, 64, 64, BF16, BF16), "tensor cores need float16 operands"),
        (wmma, (40, 64, 64, F16, F16), "M=40 is not a multiple of the 64-wide block tile (no padding path)"),
    ]
    for tile, (m, n, k, a, b), message in cases:
        assert message in tile.reason(m, n, k, a, b, F32, F32, cuda), message
        gemm = GemmTemplate(m, n, k, a_dtype=a, b_dtype=b, tensor_core=tile)
        assert message in gemm.tensor_core_reason(cuda) and not gemm.uses_tensor_cores(cuda)
        result = build_one(gemm, gemm.default_config(cuda), cuda)
        assert result.ok and using(result.artifact.source) == set()
    assert mma.reason(40, 64, 64, F16, F16, F32, F32, cuda) is None  # M is padded
    assert mma.reason(64, 48, 80, F16, F16, F32, F32, cuda) is None  # and N and K, where a tile given by hand fits
    assert "compute capability >= 8.0" in mma.reason(64, 64, 64, F16, F16, F32, F32, offline_cuda("sm_75"))
    assert GemmTemplate(64, 64, 64).tensor_core_reason(cuda) == "no tensor-core tile"
    with pytest.raises(TvmExtError, match=re.escape(f"--tensor-core {mma}: the 64x20x64 GEMM cannot run on "
                                                    f"{mma.label()}: N=20 pads to 64")):
        tile_option(str(mma), [(64, 20, 64)], cuda, "--tensor-core", epilogue=False)
    assert tile_option(str(mma), [(64, 64, 64)], cuda, "--tensor-core", epilogue=False) == mma
    assert tile_option("auto", [(64, 3072, 1024)], cuda, "--tensor-core", epilogue=True) == \
        pick_tile([(64, 3072, 1024)], cuda)
    opencl = TargetInfo(kind="opencl", device_name="any")
    assert tile_option(str(mma), [(64, 48, 64)], opencl, "--tensor-core", epilogue=False) is None
    with pytest.raises(TvmExtError, match="unknown tensor-core knob"):
        tile_option("mma_foo=1", [(64, 64, 64)], opencl, "--tensor-core", epilogue=False)


def test_bias_and_batch_gemms_on_mma_tiles(cuda):
    """The GRU's GEMM forms on an mma.sync tile: a bias row and a batch axis (blockIdx.z), M
    padded (8 rows on a 16-row tile), the bias and the narrowing in the staged output store."""
    tile = pick_tile([(8, 192, 64)], cuda, batch=2)
    gemm = BiasGemmTemplate(8, 192, 64, a_dtype=F16, b_dtype=F16, c_dtype=F16, tensor_core=tile, batch=2)
    result = build_one(gemm, gemm.default_config(cuda), cuda)
    assert result.ok, result.error_msg
    (launch,) = result.artifact.launches
    c = tile.config
    t_m, t_n = c.mma_warps_m * c.mma_frags_m * 16, c.mma_warps_n * c.mma_frags_n * 16
    assert t_m == 16 and launch.grid == (192 // t_n, 1, 2)
    assert using(result.artifact.source) == {"mma"} and "bias" in result.artifact.source


def test_benchmark_default_tiles_are_mma_where_it_applies(monkeypatch):
    """``benchmarks/mixed_precision.py``'s default tiles are mma.sync, the ones ``pick_tile``
    chooses for its shapes, and run its float16 GEMMs."""
    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "mixed_precision.py"
    spec = importlib.util.spec_from_file_location("bench_mixed_precision", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_mixed_precision", bench)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts benchmarks/ on the path
    spec.loader.exec_module(bench)
    target = offline_cuda()
    (_, gemm, _), (_, gru, _) = bench.cases(target, bench.arguments().parse_args([]))
    assert gemm.tensor_core == pick_tile([(4096, 4096, 4096)], target)
    assert gru.in_tensor_core == pick_tile([(8192, 3072, 1024)], target)
    assert gru.hid_tensor_core == pick_tile([(64, 3072, 1024)], target)
    half = gru.with_precision({"x": F16, "w_ih": F16, "h": F16, "w_hh": F16})
    assert half.input_gemm(0).uses_tensor_cores(target) and half.hidden_gemm().uses_tensor_cores(target)
    assert gemm.with_precision({"a": BF16, "b": BF16}).uses_tensor_cores(target)


# a tile given by hand pads a ragged N and K: the GRU's input GEMM 128x120x24 (H40, input 24, 16 x 8
# rows) and a mixed-precision GEMM of that shape on the 128x128x32 mma.sync tile
RAGGED_GRU = dict(batch=16, hidden=40, input=24, seq=8)
RAGGED_GEMM = (128, 120, 24)


def _ragged_gru() -> GruTemplate:
    """The GRU of ``RAGGED_GRU`` in float16, both GEMMs given the 128x128x32 mma.sync tile."""
    tile = parse_tile("mma")
    return dataclasses.replace(GruTemplate(**RAGGED_GRU), in_tensor_core=tile, hid_tensor_core=tile).with_precision(
        {"x": F16, "w_ih": F16, "h": F16, "w_hh": F16, "gi": F16, "gh": F16})


def test_a_tile_given_by_hand_pads_a_ragged_n_and_k_where_the_automatic_pick_does_not(cuda):
    """The GRU's input GEMM (128x120x24) takes the hand-given 128x128x32 tile, padded (its hidden
    GEMM, 16 rows, is refused the 128-row tile and stays on the CUDA cores); ``pick_tile`` offers no
    tile there (it never pads); a mixed-precision GEMM of that shape runs on the tile too."""
    gru = _ragged_gru()
    source = gru.compile(gru.default_config(cuda).replace(fuse_step=0), cuda).source
    kinds = tensor_core_kernels(source)
    assert kinds["gru_gemm_x0_kernel"] == {"mma"} and kinds["gru_gemm_h_kernel"] == set()
    assert pick_tile([(128, 120, 24)], cuda) is None
    program = gemm_program(parse_tile("mma"), cuda, RAGGED_GEMM)
    built = build_one(program, precision(program, cuda, F16, F16, F32, F16), cuda)
    assert built.ok, built.error_msg
    assert using(built.artifact.source) == {"mma"}


# ---- on a GPU ---------------------------------------------------------------------------------------
def _measure(template: Any, config: Any, target: TargetInfo) -> Any:
    """Build and measure as the tuner does: outputs and scratch NaN-poisoned, checked against
    float64 of the unrounded inputs; returns the result (its ``rel_error``)."""
    from tvm_ext.measure.measure import measure
    from tvm_ext.measure.runner import MeasureSettings

    build = build_one(template, config, target)
    assert build.ok, build.error_msg
    result = measure(template, build.config, build.artifact, target, MeasureSettings(warmup=1, repeat=2,
                                                                                     min_repeat_secs=0.001))
    assert result.ok, f"{result.error_kind}: {result.error_msg}"
    return build, result


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, bound", [(F16, 5e-3), (BF16, 2e-2)])
@pytest.mark.parametrize("shape", [dict(batch=8, hidden=64, input=32, seq=5, layers=2, bidirectional=True),
                                   dict(batch=64, hidden=256, input=128, seq=4)])
def test_gpu_gru_with_16_bit_weights_on_mma_tiles(shape, dtype, bound):
    """The GRU (unfused steps: both gate GEMMs on mma.sync, the hidden one with M padded to the
    tile at batch 8 and batched over directions) against float64, outputs NaN-poisoned."""
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda", 0)
    t = GruTemplate(**shape)
    tiles = dict(in_tensor_core=pick_tile([(t.seq * t.batch, t.dirs * 3 * t.hidden, t.layer_input(layer))
                                           for layer in range(t.layers)], target),
                 hid_tensor_core=pick_tile([(t.batch, 3 * t.hidden, t.hidden)], target, batch=t.dirs))
    gru = dataclasses.replace(t, **tiles).with_precision({"x": dtype, "w_ih": dtype, "h": dtype, "w_hh": dtype,
                                                          "gi": dtype, "gh": dtype})
    build, result = _measure(gru, gru.default_config(target).replace(fuse_step=0), target)
    kinds = tensor_core_kernels(build.artifact.source)
    assert kinds["gru_gemm_x0_kernel"] == kinds["gru_gemm_h_kernel"] == {"mma"}
    assert result.metrics["rel_error"] < bound


@pytest.mark.gpu
def test_gpu_tiles_given_by_hand_pad_a_ragged_n_and_k():
    """The GRU whose input GEMM runs the hand-given tile padded (128x120x24), and the
    mixed-precision GEMM of that shape on it, against float64 on NaN-poisoned outputs."""
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda", 0)
    gru = _ragged_gru()
    build, result = _measure(gru, gru.default_config(target).replace(fuse_step=0), target)
    assert tensor_core_kernels(build.artifact.source)["gru_gemm_x0_kernel"] == {"mma"}
    assert result.metrics["rel_error"] < 5e-3
    program = gemm_program(parse_tile("mma"), target, RAGGED_GEMM)
    build, result = _measure(program, precision(program, target, F16, F16, F32, F16), target)
    assert using(build.artifact.source) == {"mma"} and result.metrics["rel_error"] < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(512, 384, 256), (100, 256, 128)])
def test_gpu_mixed_precision_gemm_on_mma_tiles(shape, tmp_path):
    """Precision configs of a GEMM on its mma.sync tile (M = 100 padded), measured against float64
    on NaN-poisoned outputs; the exported program, loaded back, gives the measured error."""
    from tvm_ext.precision.codegen import export_program, load_program
    from tvm_ext.precision.precision import np_dtype, relative_error
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda", 0)
    program = gemm_program(pick_tile([shape], target), target, shape)
    bounds = {(F16, F16, F32, F32): 2e-3, (F16, F16, F16, F16): 5e-3, (BF16, BF16, F32, BF16): 2e-2,
              (F16, F16, F32, F16): 2e-3}
    for dtypes, bound in bounds.items():
        chosen = precision(program, target, *dtypes)
        build, result = _measure(program, chosen, target)
        assert using(build.artifact.source) == {"mma"}
        assert result.metrics["rel_error"] < bound, dtypes
    folder = tmp_path / "program"
    lowered = program.lowered(chosen)
    export_program(lowered, program.schedule_config, target, str(folder))
    loaded = load_program(str(folder))
    inputs, refs = lowered.make_case(np.random.default_rng(0))  # the inputs the measurement checked
    executor = loaded.executor
    for spec, array in zip(loaded.inputs, inputs):
        executor.write(spec["name"], array)
    for spec in loaded.outputs:
        executor.write(spec["name"], np.full(spec["shape"], np.nan, np_dtype(spec["dtype"])))
    executor.run()
    executor.sync()
    outputs = [executor.read(spec["name"]) for spec in loaded.outputs]
    assert math.isclose(relative_error(outputs, refs), result.metrics["rel_error"], rel_tol=1e-6)
