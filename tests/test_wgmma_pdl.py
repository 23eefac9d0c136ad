"""Programmatic dependent launch of the wgmma GEMM (``wgmma_pdl``): every kernel of the function
lets the next kernel on the stream launch at its start, is itself launched early (the launch
tag ``launch_early`` adds), and waits for the kernel ahead of it (``griddepcontrol.wait``) after
its barriers' init, before its first global access.

CI (no GPU): where the wait and the trigger sit in the CUDA TVM generates for each kernel kind,
the launch tag on every kernel of a marked function and on none of an unmarked one, the
refusals.  ``-m gpu``: each kind against float64 on NaN-poisoned outputs, and a chain of calls
each reading the C the call before it wrote (a wait missing or misplaced reads a stale C).
"""
from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
from test_wgmma_tma import _source

from tvm_ext.core.errors import TvmExtError
from tvm_ext.schedules.gemm.wgmma import WgmmaTile, wgmma_gemm
from tvm_ext.target import offline_cuda

WS = dict(tma=True, specialized=True, smem_epilogue=False)
KINDS = {  # (tile, m, n, k, wgmma_gemm's keywords); the first global access the wait must precede
    "one unit, cp.async": (WgmmaTile(128, 64, 6, 1, pdl=True), 512, 512, 512, {}, "cp_async_cg"),
    "several units, tma": (WgmmaTile(128, 128, 6, 1, raster=2, tiles=4, tma=True, pdl=True), 1024, 1024, 512, {},
                           "cp_async_bulk_tensor"),
    "warp-specialized": (WgmmaTile(128, 128, 6, 1, pdl=True, **WS), 512, 512, 512, {}, "cp_async_bulk_tensor"),
    "split k, two kernels": (WgmmaTile(128, 64, 4, 1, False, split=2, pdl=True), 512, 512, 1024, {}, "cp_async_cg"),
}
WAIT, TRIGGER = "griddepcontrol_wait", "griddepcontrol_launch_dependents"


def _kernels(source: str) -> list[str]:
    """The bodies of the kernels defined in ``source`` (after their declarations)."""
    bodies, at = [], 0
    while (at := source.find('extern "C" __global__', at)) >= 0:
        end = source.find('extern "C" __global__', at + 1)
        body = source[at:end if end > 0 else len(source)]
        if "{" in body.split(")")[-1] or body.rstrip().endswith("}"):
            bodies.append(body)
        at += 1
    return [b for b in bodies if "{" in b]


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kernel_triggers_at_its_start_and_waits_before_its_first_global_access(kind):
    tile, m, n, k, kw, first_load = KINDS[kind]
    bodies = _kernels(_source(tile, m, n, k, **kw))
    assert len(bodies) == (2 if tile.split > 1 else 1)
    gemm = bodies[0]
    assert gemm.count(f"{WAIT}()") == 1 and gemm.count(f"{TRIGGER}()") == 1
    assert gemm.index(f"{TRIGGER}()") < gemm.index("mbarrier_init") if "mbarrier_init" in gemm else True
    assert gemm.index(f"{WAIT}()") < gemm.index(first_load + "(") if first_load + "(" in gemm else \
        gemm.index(f"{WAIT}()") < gemm.index(first_load)
    if "mbarrier_init" in gemm:  # the barriers' init overlaps the kernel ahead
        assert gemm.index("mbarrier_init") < gemm.index(f"{WAIT}()")
    if tile.split > 1:  # the slices' sum reads P only after the slices' kernel has finished
        add = bodies[1]
        assert add.count(f"{WAIT}()") == 1 and add.count(f"{TRIGGER}()") == 1
        assert add.index(f"{WAIT}()") < add.index("P_ptr +")


def test_without_the_knob_no_kernel_waits_or_triggers():
    tile, m, n, k, kw, _ = KINDS["warp-specialized"]
    source = _source(dataclasses.replace(tile, pdl=False), m, n, k, **kw)
    assert WAIT not in source and TRIGGER not in source


def launch_params(mod) -> dict[str, list[str]]:
    """The launch parameters TVM gives each device kernel of ``mod`` (PrimFuncs with their global
    symbols) lowered for sm_90a through the pipeline ``launch_early.pipeline_for`` picks."""
    import tvm
    from tvm.tirx import compilation_pipeline

    from tvm_ext.hardware import sm_90a
    from tvm_ext.lowering.launch_early import pipeline_for

    target = tvm.target.Target(sm_90a(offline_cuda("sm_90")).tvm_target()).with_host(tvm.target.Target("llvm"))
    mod = tvm.tirx.transform.BindTarget(target)(mod)
    lower = compilation_pipeline.get_tir_pipeline(pipeline_for(mod))[0]
    split = importlib.import_module("tvm.tirx.build").split_host_device_mods  # (tvm.tirx.build: the function)
    _, devices = split(lower(mod))
    return {str(f.attrs["global_symbol"]): [str(t) for t in f.attrs["tirx.kernel_launch_params"]]
            for d in devices.values() for f in d.functions.values()}


def _launch_params(func) -> dict[str, list[str]]:
    import tvm

    return launch_params(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))


def test_every_kernel_of_a_pdl_gemm_is_launched_early_and_none_without():
    from tvm_ext.lowering.launch_early import LAUNCH_TAG

    tile, m, n, k, kw, _ = KINDS["split k, two kernels"]
    early = _launch_params(wgmma_gemm(tile, m, n, k, **kw))
    plain = _launch_params(wgmma_gemm(dataclasses.replace(tile, pdl=False), m, n, k, **kw))
    assert len(early) == 2 and all(LAUNCH_TAG in tags for tags in early.values())
    assert len(plain) == 2 and not any(LAUNCH_TAG in tags for tags in plain.values())


def test_refused_where_kernels_ahead_in_the_function_do_not_wait():
    from tvm_ext.schedules.gemm.gemm_3xtf32 import Gemm3xTf32Template

    tile = WgmmaTile(128, 128, 4, 1, False, pdl=True)
    with pytest.raises(TvmExtError, match="wgmma_pdl"):
        wgmma_gemm(tile, 512, 512, 512, bias_dtype="float16", signal=True)
    template = Gemm3xTf32Template(512, 512, 512)
    target = offline_cuda("sm_90")
    config = template.default_config(target).replace(wgmma_pdl=1)
    assert "not launched early" in template.space(target).infeasible_reason(config)


def test_the_knob_names_the_tile():
    tile = WgmmaTile(128, 128, 6, 1, pdl=True, **WS)
    assert tile.name.endswith(" ws pdl") and tile.knobs()["wgmma_pdl"] == 1 and WgmmaTile.of(_config(tile)) == tile


def _config(tile: WgmmaTile):
    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate

    return WgmmaGemmTemplate(512, 512, 512).space(offline_cuda()).make(**tile.knobs())


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
def _built(tile: WgmmaTile, m: int, n: int, k: int, kw: dict):
    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    template = WgmmaGemmTemplate(m, n, k)
    config = template.space(target).make(**tile.knobs())
    return template.build_program(config, target).executable.mod


@pytest.mark.gpu
@pytest.mark.parametrize("kind", list(KINDS))
def test_cuda_pdl_kernels_match_float64_in_a_chain_of_calls(kind):
    """C_1 = A·Btᵀ, then C_{i+1} = C_i·Btᵀ launched straight behind it, five times (square
    GEMMs, Bt scaled to keep C in range): each call reads the C the call ahead wrote, so a
    kernel that read before the one ahead had finished would read NaN (C is poisoned before
    each call) or a stale C."""
    import tvm

    tile, m, n, k, kw, _ = KINDS[kind]
    size = max(m, n, k)
    ex = _built(tile, size, size, size, kw)
    rng = np.random.default_rng(0)
    dev = tvm.cuda(0)
    a = rng.standard_normal((size, size)).astype(np.float16)
    bt = (rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float16)
    cs = [tvm.runtime.tensor(a, dev)] + [tvm.runtime.tensor(np.full((size, size), np.nan, np.float16), dev)
                                        for _ in range(5)]
    b_dev = tvm.runtime.tensor(bt, dev)
    for i in range(5):
        ex["main"](cs[i], b_dev, cs[i + 1])
    ref = a.astype(np.float64)
    for i in range(5):
        ref = ref @ bt.astype(np.float64).T
        out = cs[i + 1].numpy().astype(np.float64)
        assert np.isfinite(out).all(), i
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert err < 5e-3 * (i + 1), (i, err)
        ref = out  # the next call multiplies what this one stored (float16)
