"""Tensor-core (WMMA) schedules: CUDA code generated offline for every supported problem
form (GEMM, narrowing and bias epilogues, fp16 accumulation, a batch axis), the reasons
configs are refused, and (``-m gpu``) results against a float64 reference."""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
from typing import Any

import numpy as np
import pytest

from tvm_ext.measure.builder import compile_schedule
from tvm_ext.schedules.gemm.tensor_core import (TC_SPACE, MatmulProblem, WmmaGemmTile, WmmaTile, compile_wmma,
                                                tensor_core_reason)
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.target import TargetInfo, offline_cuda

F16, F32 = "float16", "float32"
BASE = dict(tc_warps_m=2, tc_warps_n=2, tc_frags_m=2, tc_frags_n=2, tc_k_frags=2, tc_vec=8, tc_pipeline=0,
            tc_out_smem=0)
LARGE = dict(tc_warps_m=2, tc_warps_n=4, tc_frags_m=4, tc_frags_n=2, tc_k_frags=2, tc_vec=8, tc_pipeline=1,
             tc_out_smem=1)  # 128x128x32 block tile, 8 warps: the 4096^3 kind of config


VARIANTS = {
    "gemm_f32": MatmulProblem("gemm", 256, 512, 128),
    "gemm_f16_out": MatmulProblem("gemm", 256, 512, 128, c=F16),
    "gemm_f16_acc": MatmulProblem("gemm", 256, 512, 128, acc=F16, c=F16),
    "bias": MatmulProblem("bias", 256, 512, 128),
    "bias_batch2": MatmulProblem("bias", 64, 256, 128, batch=2),
}


@pytest.fixture(scope="module")
def cuda() -> Any:
    import tvm

    if tvm.get_global_func("target.build.cuda", allow_missing=True) is None:
        pytest.skip("this TVM has no CUDA code generator")
    return offline_cuda("sm_90")


def _config(**changes: int) -> Any:
    return TC_SPACE.make(**{**BASE, **changes})


def _source(problem: MatmulProblem, config: Any, target: Any) -> str:
    assert problem.reason(config, target) is None
    return compile_wmma(problem.schedule(config), config, target).mod.imports[0].inspect_source()


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("changes", [{}, {"tc_pipeline": 1, "tc_out_smem": 1}, {"tc_pipeline": 2},
                                     {"tc_pipeline": 3, "tc_out_smem": 1}],
                         ids=["single", "double_buffer", "cp_async", "cp_async_3_stages"])
def test_variants_generate_wmma_code(cuda, name, changes):
    problem = VARIANTS[name]
    config = _config(**changes)
    src = _source(problem, config, cuda)
    acc_type = "float" if problem.acc == F32 else "half"
    assert "wmma::mma_sync" in src
    assert f"wmma::accumulator, 16, 16, 16, {acc_type}>" in src
    assert "__launch_bounds__(128)" in src  # 2x2 warps
    assert src.count('extern "C" __global__') == 2  # one kernel (declaration + definition)
    assert ("blockIdx.z" in src) == bool(problem.batch)
    assert ("cp.async" in src) == (config.tc_pipeline >= 2)
    staged = problem.form == "bias" or problem.c != problem.acc or config.tc_out_smem
    # An epilogue reads the fragments staged in shared memory; no intermediate C in global.
    assert (f"store_matrix_sync((&((({acc_type}*)buf_dyn_shmem_ptr)" in src) == bool(staged)
    assert "C_ptr" not in src or not (problem.form == "bias" or problem.c != problem.acc)


@pytest.mark.parametrize("shape,batch", [((4096, 4096, 4096), 0), ((8192, 3072, 1024), 0),
                                         ((64, 3072, 1024), 2), ((2048, 2048, 2048), 0),
                                         ((64, 64, 64), 0)])
def test_benchmark_shapes_build(cuda, shape, batch):
    """The probe's shapes: a large tile where it fits, a one-warp tile at 64^3."""
    problem = MatmulProblem("bias" if batch or shape[0] == 8192 else "gemm", *shape, batch=batch)
    config = TC_SPACE.make(**LARGE) if shape[0] >= 2048 else _config(tc_warps_m=1, tc_warps_n=2,
                                                                      tc_frags_m=4, tc_frags_n=2)
    if shape == (64, 64, 64):
        config = _config(tc_warps_m=1, tc_warps_n=1, tc_frags_m=4, tc_frags_n=4, tc_k_frags=4)
    src = _source(problem, config, cuda)
    assert "wmma::mma_sync" in src and "wmma::load_matrix_sync" in src


def test_launch_geometry_through_the_project_builder(cuda, tmp_path):
    """The project's builder (launch extraction, library export) takes the schedule as is."""
    problem = VARIANTS["bias_batch2"]
    config = _config()
    artifact = compile_schedule(problem.schedule(config), cuda).artifact()
    (launch,) = artifact.launches
    tile = WmmaTile.of(config)
    assert launch.block == (32, tile.warps, 1)
    assert launch.grid == (problem.n // tile.block_n, problem.m // tile.block_m, problem.batch)
    assert artifact.params == ("A", "B", "bias", "D")


@pytest.mark.parametrize("pipeline", [1, 2, 3])
def test_tuner_builds_emit_cp_async(cuda, tmp_path, pipeline):
    """The tuner's builder compiles a tensor-core GemmTemplate under the tile's pass options:
    tc_pipeline >= 2 gives cp.async copies there too, not only through ``compile_wmma``."""
    from tvm_ext.measure.builder import build_one
    from tvm_ext.schedules.gemm.simt import GemmTemplate

    half = {"a_dtype": "float16", "b_dtype": "float16"}
    template = GemmTemplate(128, 128, 64, tensor_core=WmmaGemmTile(_config(tc_pipeline=pipeline)), **half)
    assert template.pass_config(template.default_config(cuda), cuda) == (
        {"tirx.use_async_copy": True} if pipeline >= 2 else {})
    result = build_one(template, template.default_config(cuda), cuda)
    assert result.ok, result.error_msg
    assert "wmma::mma_sync" in result.artifact.source
    assert ("cp.async" in result.artifact.source) == (pipeline >= 2)


def test_pick_wmma_tile_fits_the_shapes_without_measuring(cuda):
    """WMMA's pick (``--tensor-core auto`` where no mma.sync tile fits): the largest probe-led
    tile that divides every shape and keeps half the SMs busy; smaller tiles for small or odd
    shapes; None where no tile divides."""
    from tvm_ext.schedules.gemm.tensor_core import pick_wmma_tile

    def size(shapes):
        tile = pick_wmma_tile(shapes, cuda)
        if tile is None:
            return None
        for m, n, k in shapes:
            assert tensor_core_reason(m, n, k, "float16", "float16", "float32", cuda, tile) is None
        t = WmmaTile.of(tile)
        assert t.async_copy  # sm_90: cp.async
        return t.block_m, t.block_n, t.block_k

    assert size([(4096, 4096, 4096)]) == (128, 256, 32)
    assert size([(1024, 1024, 1024)]) == (64, 64, 64)  # 128x128 gives 64 blocks: under half of 132 SMs
    assert size([(8192, 3072, 1024), (64, 3072, 1024)]) == (64, 32, 64)  # M = 64: 64x64 gives 48 blocks
    assert size([(48, 48, 48)]) == (16, 16, 16)
    assert size([(100, 100, 100)]) is None


def test_parse_tile_names_the_allowed_values():
    from tvm_ext.core.errors import TvmExtError
    from tvm_ext.schedules.gemm.tensor_core import parse_tile

    assert parse_tile("none") is None
    tile = parse_tile("tc_pipeline=1")
    assert tile.kernel == "wmma" and WmmaTile.of(tile.config).pipeline == 1
    for text, message in (("tc_vec=3", "allowed values: 1, 2, 4, 8"), ("tc_foo=1", "knobs: tc_warps_m"),
                          ("tc_vec", "is not knob=integer")):
        with pytest.raises(TvmExtError, match=message):
            parse_tile(text)


def test_trace_replays_exactly(cuda):
    """Records keep ``sch.trace`` as JSON; replaying it rebuilds the same module (the WMMA
    intrinsics it names are registered by ``schedule_wmma`` in this process)."""
    import json

    import tvm_ffi
    from tvm import s_tir

    from tvm_ext.measure.builder import plain_json

    problem = VARIANTS["bias_batch2"]
    sch = problem.schedule(_config(tc_pipeline=2, tc_out_smem=1))
    fresh = s_tir.Schedule(problem.func_and_epilogue()[0])
    s_tir.schedule.Trace.apply_json_to_schedule(json.loads(json.dumps(plain_json(sch.trace.as_json()))), fresh)
    assert tvm_ffi.structural_equal(fresh.mod, sch.mod)


def test_shared_memory_above_48k_builds(cuda):
    """Dynamic shared memory: a double-buffered 128x256x64 tile (> 48 KiB) still compiles."""
    config = TC_SPACE.make(tc_warps_m=2, tc_warps_n=4, tc_frags_m=4, tc_frags_n=4, tc_k_frags=4, tc_vec=8,
                           tc_pipeline=1, tc_out_smem=1)
    problem = MatmulProblem("gemm", 512, 512, 256)
    assert WmmaTile.of(config).smem_bytes(F32, True) > 48 * 1024
    assert "wmma::mma_sync" in _source(problem, config, cuda)


def test_sampled_feasible_configs_build(cuda):
    """Random feasible configs of every knob value build (the space a tuner would search)."""
    problem = VARIANTS["bias"]
    space = dataclasses.replace(TC_SPACE, constraints=(lambda c: problem.reason(c, cuda),))
    rng = np.random.default_rng(0)
    picks = [space.decode(row) for row in space.random_feasible_indices(rng, 12)]
    assert len(picks) == 12
    for config in picks:
        assert "wmma::mma_sync" in _source(problem, config, cuda), str(config)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_compiles_without_spills(cuda, tmp_path):
    """ptxas accepts the generated source and keeps the accumulators in registers."""
    src = _source(MatmulProblem("bias", 4096, 4096, 4096), TC_SPACE.make(**{**LARGE, "tc_pipeline": 2}), cuda)
    (tmp_path / "k.cu").write_text(src)
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"),
                           str(tmp_path / "k.cu")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "0 bytes spill stores" in proc.stderr


@pytest.mark.parametrize("args,changes,expected", [
    ((F32, F16, F32), {}, "need float16 operands"),
    ((F16, F16, "float64"), {}, "accumulate in float32 or float16"),
    ((F16, F16, "bfloat16"), {}, "accumulate in float32 or float16"),
])
def test_dtype_reasons(cuda, args, changes, expected):
    assert expected in tensor_core_reason(256, 256, 256, *args, cuda, _config(**changes))


def test_target_and_shape_reasons(cuda):
    config = _config()  # 64x64x32 tile, 128 threads
    assert tensor_core_reason(256, 256, 256, F16, F16, F32, cuda, config) is None
    opencl = dataclasses.replace(cuda, kind="opencl", arch="")
    assert "need a CUDA target" in tensor_core_reason(256, 256, 256, F16, F16, F32, opencl, config)
    pascal = offline_cuda("sm_61")
    assert "compute capability >= 7.0" in tensor_core_reason(256, 256, 256, F16, F16, F32, pascal, config)
    turing = offline_cuda("sm_75")
    assert "cp.async" in tensor_core_reason(256, 256, 256, F16, F16, F32, turing, _config(tc_pipeline=2))
    assert tensor_core_reason(256, 256, 256, F16, F16, F32, turing, config) is None
    assert "M=100 is not a multiple of the 64-wide" in tensor_core_reason(100, 256, 256, F16, F16, F32,
                                                                          cuda, config)
    assert "K=48 is not a multiple of the 32-wide" in tensor_core_reason(256, 256, 48, F16, F16, F32,
                                                                         cuda, config)
    small = dataclasses.replace(cuda, max_threads_per_block=64)
    assert "128 threads per block > device limit 64" in tensor_core_reason(256, 256, 256, F16, F16, F32,
                                                                           small, config)
    huge = TC_SPACE.make(tc_warps_m=4, tc_warps_n=4, tc_frags_m=4, tc_frags_n=4, tc_k_frags=4, tc_vec=8,
                         tc_pipeline=1, tc_out_smem=1)  # 256x256 fp32 output tile: 260 KiB
    assert "shared memory >" in tensor_core_reason(1024, 1024, 1024, F16, F16, F32, cuda, huge)
    uneven = _config(tc_warps_m=1, tc_warps_n=4, tc_frags_m=1, tc_k_frags=1)  # 16x16 A tile, 128 threads x 8
    assert "does not split evenly" in tensor_core_reason(256, 256, 256, F16, F16, F32, cuda, uneven)


def test_feasible_space_is_not_empty_for_the_probe_shapes(cuda):
    for m, n, k in ((4096, 4096, 4096), (8192, 3072, 1024), (64, 3072, 1024), (64, 64, 64)):
        feasible = [c for c in TC_SPACE if tensor_core_reason(m, n, k, F16, F16, F32, cuda, c) is None]
        assert feasible, (m, n, k)


# ---- on a GPU --------------------------------------------------------------------------------
GPU_CASES = {f"{name}-{label}": (problem, changes) for name, problem in VARIANTS.items()
             for label, changes in (("single", {}), ("cp_async", {"tc_pipeline": 2, "tc_out_smem": 1}),
                                    ("3_stages", {"tc_pipeline": 3}))}
GPU_CASES["gemm_f32-large"] = (VARIANTS["gemm_f32"], {**LARGE, "tc_pipeline": 2})
GPU_CASES["bias-large"] = (VARIANTS["bias"], LARGE)
GPU_CASES["64cubed-one_warp"] = (MatmulProblem("gemm", 64, 64, 64),
                                 {"tc_warps_m": 1, "tc_warps_n": 1, "tc_frags_m": 4, "tc_frags_n": 4,
                                  "tc_k_frags": 4})


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_matches_float64_reference(case):
    """On a GPU machine (``pytest -m gpu``): outputs within fp16-input tolerance of float64."""
    import tvm

    from tvm_ext.target import resolve_target

    target = resolve_target("cuda", 0)
    problem, changes = GPU_CASES[case]
    config = _config(**changes)
    assert problem.reason(config, target) is None
    ex = compile_wmma(problem.schedule(config), config, target)
    dev = tvm.cuda(0)
    inputs = problem.inputs(np.random.default_rng(0))
    out = tvm.runtime.empty(problem.out_shape(), problem.c, dev)
    ex.mod["main"](*[tvm.runtime.tensor(x, dev) for x in inputs], out)
    ref = problem.reference(inputs)
    err = np.max(np.abs(out.numpy().astype(np.float64) - ref)) / np.max(np.abs(ref))
    assert err < problem.tolerance(), f"{case} {config}: max rel err {err:.2e}"


# ---- the tunable tensor-core GEMM (python -m tvm_ext.tune gemm-tc) ----------------------------
def test_tensor_core_gemm_template_space_default_and_build(cuda, tmp_path):
    """The WMMA tile is the search space: feasible exactly where ``tensor_core_reason`` has
    nothing against it; the default is ``pick_wmma_tile``'s; a built config is a WMMA kernel with
    cp.async, compiled by the tuner's builder; the record's workload rebuilds the template."""
    from tvm_ext.measure.builder import build_one
    from tvm_ext.schedules.gemm.tensor_core import TensorCoreGemmTemplate, pick_wmma_tile
    from tvm_ext.operators import get_template_class
    from tvm_ext.core.template import Workload

    template = TensorCoreGemmTemplate(256, 512, 128, c_dtype="float16")
    space = template.space(cuda)
    feasible = [c for c in space if space.is_feasible(c)]
    assert 0 < len(feasible) < space.size
    assert all(tensor_core_reason(256, 512, 128, "float16", "float16", "float32", cuda, c) is None for c in feasible)
    default = template.default_config(cuda)
    assert default == pick_wmma_tile([(256, 512, 128)], cuda) and space.is_feasible(default)
    inputs, refs = template.make_case(np.random.default_rng(0))  # what the runner checks against
    assert [a.dtype for a in inputs] == [np.float16, np.float16] and refs[0].shape == (256, 512)
    result = build_one(template, default, cuda)
    assert result.ok, result.error_msg
    assert "wmma::mma_sync" in result.artifact.source and "cp.async" in result.artifact.source
    workload = Workload.of(template, cuda).as_json()
    assert get_template_class(workload["template"])(**workload["params"]) == template
    assert Workload.of(template, cuda).key != Workload.of(GemmTemplate(256, 512, 128), cuda).key


def test_tensor_core_gemm_refuses_what_it_cannot_run(cuda):
    from tvm_ext.core.errors import TvmExtError
    from tvm_ext.schedules.gemm.tensor_core import TensorCoreGemmTemplate

    with pytest.raises(TvmExtError, match="operands must be float16"):
        TensorCoreGemmTemplate(64, 64, 64, a_dtype="float32")
    with pytest.raises(TvmExtError, match="M=100 is not a multiple"):
        TensorCoreGemmTemplate(100, 64, 64).default_config(cuda)
    with pytest.raises(TvmExtError, match="need a CUDA target, not opencl"):
        TensorCoreGemmTemplate(64, 64, 64).default_config(TargetInfo(kind="opencl", device_name="any"))


@pytest.mark.parametrize("args, code, expect", [
    (["--shape", "4096,4096,4096", "--target", "cuda", "--strategy", "analytic", "--no-measure"], 0,
     "config: tc_warps_m=2 tc_warps_n=4 tc_frags_m=4 tc_frags_n=4 tc_k_frags=2 tc_vec=8 tc_pipeline=2"),
    (["--shape", "64,64,64"], 2,
     "error: no tensor-core tile fits GEMM 64x64x64: tensor cores (WMMA) need a CUDA target"),
    (["--shape", "100,64,64", "--target", "cuda", "--strategy", "analytic", "--no-measure"], 2,
     "error: no tensor-core tile fits GEMM 100x64x64: M=100 is not a multiple"),
])
def test_gemm_tc_cli(args, code, expect, tmp_path):
    import sys

    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "gemm-tc", "--kernel", "wmma", *args, "--records",
                        str(tmp_path / "r.jsonl"), "--no-progress"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert p.returncode == code, p.stderr
    assert expect in (p.stdout if code == 0 else p.stderr)
    assert "Traceback" not in p.stderr


@pytest.mark.gpu
def test_gemm_tc_tunes_on_the_gpu(tmp_path):
    """End to end on a GPU: the GA over WMMA tiles measures correct kernels and keeps the best."""
    import sys

    from tvm_ext.core.records import RecordStore

    records = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "gemm-tc", "--kernel", "wmma", "--shape", "512,512,256",
                        "--target", "cuda", "--generations", "2", "--population", "6", "--records", str(records),
                        "--no-progress"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    recs = list(RecordStore(str(records)))
    assert sum(r.ok for r in recs) >= 6
    assert all(r.error_kind != "wrong_answer" for r in recs)
