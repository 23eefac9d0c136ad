"""The SGEMM template's staging knobs (``GemmTemplate(staging=True)``): register-staged prefetch,
cp.async prefetch, warp tiling and 16-byte fills.  Without ``staging`` (or with every staging
knob at its first value) the kernel is today's, byte for byte; the new knobs run correctly on
the real OpenCL device (PoCL) against float64, generate the intended CUDA code, and refuse
what they cannot build with a reason."""
from __future__ import annotations

import dataclasses
import re

import pytest

from tvm_ext.measure.builder import build_one, compile_module
from tvm_ext.measure.measure import MeasureSettings, measure
from tvm_ext.schedules.gemm.simt import KNOBS, STAGING_DEFAULTS, GemmTemplate, staging_reason
from tvm_ext.target import offline_cuda

FAST = MeasureSettings(warmup=1, repeat=3, min_repeat_secs=0.002)
BASE = dict(wg_x=8, wg_y=8, task_x=4, task_y=4, k_step=8, use_shared=1, pad=1, unroll=64, vec=4,
            double_buffer=1, a_transposed=1)
STAGED = {
    "register_prefetch": dict(prefetch=1),
    "register_prefetch_a_rows": dict(prefetch=1, a_transposed=0),
    "register_prefetch_two_buffers": dict(prefetch=3),
    "two_buffers_a_rows_warps": dict(prefetch=3, a_transposed=0, warp_x=8),
    "warp_4x8": dict(warp_x=8),
    "warp_8x4": dict(warp_x=4),
    "prefetch_and_warps": dict(prefetch=1, warp_x=8),
    "wide_fills_vec2": dict(vec=2, load_vec=4, pad=0),
    "everything": dict(prefetch=1, warp_x=4, vec=2, load_vec=4, pad=0),
}


def _config(template: GemmTemplate, target, **changes):
    return template.space(target).make(**{**BASE, **STAGING_DEFAULTS, **changes})


@pytest.mark.parametrize("shape", [(128, 96, 64), (70, 90, 33)])
@pytest.mark.parametrize("name", list(STAGED))
def test_staging_knobs_run_correctly_on_opencl(opencl, tmp_path, shape, name):
    """Real PoCL runs of each staging variant, checked against the float64 reference on
    NaN-poisoned outputs (shapes that divide the tile, and ones that need padding)."""
    template = GemmTemplate(*shape, staging=True)
    config = _config(template, opencl, **STAGED[name])
    assert template.space(opencl).is_feasible(config), template.space(opencl).infeasible_reason(config)
    build = build_one(template, config, opencl)
    assert build.ok, build.error_msg
    result = measure(template, build.config, build.artifact, opencl, FAST)
    assert result.ok, f"{name} {shape}: {result.error_kind} {result.error_msg}"
    assert result.metrics["rel_error"] < 1e-5


def test_without_staging_the_kernel_is_unchanged(opencl):
    """The staging knobs at their first values build the same source as the template without
    them, and the template without them keeps its old knob set and workload."""
    cuda = offline_cuda("sm_90")
    plain, staged = GemmTemplate(256, 256, 128), GemmTemplate(256, 256, 128, staging=True)
    assert plain.space(cuda).names == tuple(k.name for k in KNOBS)
    assert "staging" not in plain.params and staged.params["staging"] is True
    for target in (cuda, opencl):
        base = plain.space(target).make(**BASE)
        sources = [compile_module(t.schedule(c, target).mod, target, t.pass_config(c, target))[1]
                   for t, c in ((plain, base), (staged, _config(staged, target)))]
        assert sources[0] == sources[1]


@pytest.fixture(scope="module")
def cuda():
    import tvm

    if tvm.get_global_func("target.build.cuda", allow_missing=True) is None:
        pytest.skip("this TVM has no CUDA code generator")
    return offline_cuda("sm_90")


def _cuda_source(cuda, **changes) -> tuple[str, object]:
    template = GemmTemplate(512, 512, 256, staging=True)
    config = _config(template, cuda, **changes)
    ex, source, launches, _ = compile_module(template.schedule(config, cuda).mod, cuda,
                                             template.pass_config(config, cuda))
    return source, launches[0]


def test_register_prefetch_loads_before_the_math_and_stores_after(cuda):
    """prefetch=1: in the k loop the next slice's global loads come first, then the math on
    shared memory, then the stores of the loaded registers into shared memory."""
    source, _ = _cuda_source(cuda, prefetch=1)
    body = source[source.index("for (int k_0 = 0;"):]
    first_load = body.index("*(float4*)(A_ptr")
    math = body.index("for (int k_1 = 0;")
    store = body.index("A_shared_ptr[", math + 1)
    assert first_load < math < store
    assert "cp.async" not in source


def _shared_floats(source: str) -> dict[str, int]:
    """Each shared array's size in floats (TVM may declare one as float4)."""
    return {m.group(2): int(m.group(3)) * (4 if m.group(1) else 1)
            for m in re.finditer(r"__shared__ alignas\(\d+\) float(4?) (\w+)\[(\d+)\]", source)}


def test_register_prefetch_into_two_buffers(cuda):
    """prefetch=3: the same order as prefetch=1 (loads, math, stores) but each shared tile
    has two versions: slice k+1 is stored into the one slice k's math does not read, so the
    shared tiles are twice prefetch=1's and the template counts them."""
    one, _ = _cuda_source(cuda, prefetch=1)
    two, _ = _cuda_source(cuda, prefetch=3)
    sizes_one, sizes_two = _shared_floats(one), _shared_floats(two)
    assert set(sizes_one) == set(sizes_two) == {"A_shared_ptr", "B_shared_ptr"}
    assert all(sizes_two[name] == 2 * sizes_one[name] for name in sizes_one)
    body = two[two.index("for (int k_0 = 0;"):]
    math = body.index("for (int k_1 = 0;")
    assert body.index("*(float4*)(A_ptr") < math < body.index("A_shared_ptr[", math + 1)
    assert "((k_0 + 1) & 1)" in body[math:]  # the stores go to the other version


@pytest.mark.parametrize("b_transposed", [False, True])
@pytest.mark.parametrize("changes", [dict(), dict(prefetch=1), dict(prefetch=3), dict(prefetch=3, a_transposed=0),
                                     dict(prefetch=3, pad=0), dict(double_buffer=0), dict(k_step=16, prefetch=3)])
def test_shared_bytes_are_the_declared_tiles(cuda, b_transposed, changes):
    """What the template counts against the device's shared memory is what the kernel
    declares: one or two versions, K-major or row-major A, B as stored, padded or not."""
    template = GemmTemplate(512, 512, 256, staging=True, b_transposed=b_transposed)
    config = _config(template, cuda, **changes)
    source = compile_module(template.schedule(config, cuda).mod, cuda, template.pass_config(config, cuda))[1]
    assert template.shared_bytes(config) == 4 * sum(_shared_floats(source).values())


def test_cp_async_prefetch_and_warp_tiling_codegen(cuda):
    source, _ = _cuda_source(cuda, prefetch=2, a_transposed=0, task_x=8)
    assert "cp.async" in source
    _, launch = _cuda_source(cuda, warp_x=8)
    assert launch.block == (32, 2, 1)  # 64 threads: two warps of 4x8 threads
    _, plain_launch = _cuda_source(cuda)
    assert plain_launch.block == (8, 8, 1)


@pytest.mark.parametrize("changes,expected", [
    (dict(prefetch=1, double_buffer=0), "needs use_shared=1 and double_buffer=1"),
    (dict(prefetch=3, use_shared=0, pad=0, a_transposed=0), "needs use_shared=1 and double_buffer=1"),
    (dict(warp_x=16), "does not split into 2x16 warps"),
    (dict(prefetch=2), "it needs a_transposed=0"),
    (dict(prefetch=2, a_transposed=0), "does not lower with warp_x > 0 or task_x == vec"),
    (dict(load_vec=4, vec=2), "padded by a multiple of it"),
    (dict(load_vec=4, vec=2, pad=0, k_step=4, wg_x=16, wg_y=16), "do not split evenly"),
])
def test_staging_reasons(cuda, changes, expected):
    config = _config(GemmTemplate(512, 512, 256, staging=True), cuda, **changes)
    assert expected in staging_reason(config, cuda)


def test_cp_async_prefetch_needs_cuda_sm80(opencl, cuda):
    config = _config(GemmTemplate(64, 64, 64, staging=True), cuda, prefetch=2, a_transposed=0, task_x=8)
    assert staging_reason(config, cuda) is None
    assert "needs a CUDA sm_80+ target, not opencl" in staging_reason(config, opencl)
    assert "not cuda sm_75" in staging_reason(config, dataclasses.replace(cuda, arch="sm_75"))
