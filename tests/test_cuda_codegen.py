"""CUDA code generation without a GPU: sources for feasible configs, and nvcc accepts them."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from tvm_ext.measure.builder import build_one
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.target import offline_cuda


@pytest.fixture(scope="module")
def cuda():
    return offline_cuda("sm_90")


@pytest.mark.parametrize("shape", [(256, 256, 256), (127, 513, 65)])
def test_cuda_source_for_sampled_feasible_configs(cuda, shape, tmp_path):
    tmpl = GemmTemplate(*shape)
    space = tmpl.space(cuda)
    rng = np.random.default_rng(0)
    configs = [tmpl.default_config(cuda)] + [space.decode(r) for r in space.random_feasible_indices(rng, 24)]
    for cfg in configs:
        build = build_one(tmpl, cfg, cuda)
        assert build.ok, f"{cfg}: {build.error_msg}"
        assert "__global__" in build.artifact.source
        assert build.artifact.launches[0].block[0] * build.artifact.launches[0].block[1] == cfg.wg_x * cfg.wg_y


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_compiles_a_sample_to_ptx(cuda, tmp_path):
    from tvm.support import nvcc
    import tvm

    tmpl = GemmTemplate(256, 256, 256)
    space = tmpl.space(cuda)
    cfg = space.make(wg_x=16, wg_y=16, task_x=8, task_y=8, k_step=8, use_shared=1, pad=1, unroll=512,
                     vec=4, double_buffer=1, a_transposed=1)
    build = build_one(tmpl, cfg, cuda)
    assert build.ok, build.error_msg
    with tvm.target.Target(cuda.tvm_target()):
        ptx = nvcc.compile_cuda(build.artifact.source, target_format="ptx", compiler="nvcc")
    text = ptx.decode() if isinstance(ptx, bytes) else str(ptx)
    assert ".entry" in text and "ld.shared.v4.f32" in text  # vectorized shared loads survived
