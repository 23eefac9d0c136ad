"""The Hopper warpgroup-MMA probe (``benchmarks/wgmma_probe.py``): a GEMM kernel written in
TVMScript with TVM's PTX dialect, built by ``tvm.compile`` for sm_90a.

CI (no GPU): TVM builds it and emits the wgmma, fence and cp.async instructions; tiles that
cannot work are refused with their reason.  ``-m gpu``: the kernel against float64 on
NaN-poisoned outputs at a shape of several blocks and k tiles, for each epilogue and wait depth.
"""
from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

PROBE = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "wgmma_probe.py")


@pytest.fixture
def probe(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_wgmma_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_wgmma_probe", module)  # dataclasses look their module up
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts benchmarks/ on the path
    spec.loader.exec_module(module)
    return module


def _compile(probe, cfg, m: int, n: int, k: int):
    import tvm

    with tvm.target.Target(probe.TARGET):
        return tvm.compile(tvm.IRModule({"main": probe.wgmma_gemm(cfg, m, n, k)}), target=probe.TARGET)


def test_tvm_builds_the_warpgroup_mma_kernel(probe):
    cfg = probe.WgmmaConfig(bm=128, bn=128, stages=3, inflight=0)
    source = _compile(probe, cfg, 256, 256, 256).mod.imports[0].inspect_source()
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in source
    assert "wgmma.commit_group" in source and "wgmma.wait_group" in source
    assert "fence.proxy.async.shared::cta" in source and "cp.async" in source
    wide = _compile(probe, probe.WgmmaConfig(), 256, 512, 128).mod.imports[0].inspect_source()
    assert "m64n256k16" in wide  # the 128x256 tile: two warpgroups, each m64n256


@pytest.mark.parametrize("changes, reason", [
    (dict(bk=32), "needs bk = 64"),
    (dict(bn=264), "bn in 8..256"),
    (dict(stages=2, inflight=1), "at least 3 stages"),
    (dict(stages=5), "227 KiB at most"),
])
def test_tiles_that_cannot_work_are_refused_with_their_reason(probe, changes, reason):
    cfg = probe.WgmmaConfig(**changes)
    with pytest.raises(ValueError, match=reason):
        probe.check_config(cfg, 4096, 4096, 4096)


def test_shapes_the_tile_does_not_divide_are_refused(probe):
    with pytest.raises(ValueError, match="must divide the tile"):
        probe.check_config(probe.WgmmaConfig(), 4096, 4000, 4096)


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("changes", [dict(), dict(smem_epilogue=False), dict(inflight=0),
                                     dict(bm=256, bn=128, raster=2), dict(bn=128, stages=6)])
def test_cuda_wgmma_kernel_matches_float64(probe, changes):
    import tvm

    m, n, k = 512, 512, 640  # 2-4 x 2-4 blocks, 10 k tiles: every stage is reused
    cfg = probe.WgmmaConfig(**changes)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float16)
    bt = rng.standard_normal((n, k)).astype(np.float16)
    ref = a.astype(np.float64) @ bt.astype(np.float64).T
    dev = tvm.cuda(0)
    c = tvm.runtime.tensor(np.full((m, n), np.nan, np.float16), dev)  # poisoned: unwritten tiles fail
    _compile(probe, cfg, m, n, k).mod["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(bt, dev), c)
    out = c.numpy().astype(np.float64)
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-3  # float16 output rounding: about 2e-4
