"""Reductions (issue 2/6): patent 001's plan, every op on the real OpenCL device, the CLI.

Kernels run on PoCL (CPU OpenCL) through the project's own builder and runner: each
result is checked against a float64 numpy reference by ``ReductionTemplate.check``,
whose strictness is itself tested below.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from build_check import run_config

from tvm_ext.measure.builder import build_one
from tvm_ext.core.errors import TvmExtError
from tvm_ext.measure.measure import measure
from tvm_ext.operators import get_template_class
from tvm_ext.schedules.reduce.reduction import (OPS, VectorSplitPlan, ReductionTemplate, decompose,
                                                vector_split_plan)
from tvm_ext.core.search import GeneticSearch
from tvm_ext.target import offline_cuda

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- patent 001: the plan ------------------------------------------------------------------

@pytest.mark.parametrize("n, expected", [
    # num = 100 -> x = 64, y = 2; x·y = 128 > 64 -> z = 64/64 = 1, w = 2, z' = 2 - 1 = 1
    (1024 * 100, VectorSplitPlan(num=100, x=64, y=2, z=1, w=2, z_last=1)),
    # num = 48 -> x = 32, y = 2; x·y = 64 <= 64 -> z = y = 2, w = 1, z' = z
    (1024 * 48, VectorSplitPlan(num=48, x=32, y=2, z=2, w=1, z_last=2)),
    # num = 3 -> x = 2, y = 2 (x·y = 4 >= 3, one padded lane) -> z = 2, w = 1
    (1024 * 3, VectorSplitPlan(num=3, x=2, y=2, z=2, w=1, z_last=2)),
    # num = 1000 -> x = 64, y = 16 -> z = 1, w = 16, z' = 1
    (1024 * 1000, VectorSplitPlan(num=1000, x=64, y=16, z=1, w=16, z_last=1)),
    # n not a multiple of 1024: num = ceil(n/1024)
    (1025, VectorSplitPlan(num=2, x=2, y=1, z=1, w=1, z_last=1)),
    (1_000_003, VectorSplitPlan(num=977, x=64, y=16, z=1, w=16, z_last=1)),
    # fewer elements than threads: num = 1, a single one-lane vector
    (1, VectorSplitPlan(num=1, x=1, y=1, z=1, w=1, z_last=1)),
    (1023, VectorSplitPlan(num=1, x=1, y=1, z=1, w=1, z_last=1)),
])
def test_patent_plan_hand_worked(n, expected):
    assert vector_split_plan(n) == expected


def test_patent_plan_with_a_given_vector_length_has_a_short_last_pass():
    # num = 100, x = 8: y = 13 (104 >= 100); 104 > 64 -> z = 8, w = ceil(13/8) = 2, z' = 13 - 8 = 5
    assert decompose(100, 8) == VectorSplitPlan(num=100, x=8, y=13, z=8, w=2, z_last=5)
    # num = 1000, x = 16: y = 63; z = 4, w = 16, z' = 63 - 60 = 3
    assert decompose(1000, 16) == VectorSplitPlan(num=1000, x=16, y=63, z=4, w=16, z_last=3)
    # a smaller register file: capacity 16 -> x <= 16, z = 16/x
    assert vector_split_plan(1024 * 100, vector_capacity=16) == VectorSplitPlan(100, 16, 7, 1, 7, 1)
    assert vector_split_plan(4096 * 10, block_size=4096) == VectorSplitPlan(10, 8, 2, 2, 1, 2)


def test_patent_plan_invariants_over_many_sizes():
    for num in list(range(1, 300)) + [977, 4096, 262_144, 1_000_001]:
        for x in (1, 2, 4, 8, 16, 32, 64):
            p = decompose(num, x)
            assert p.x * p.y >= num > p.x * (p.y - 1)
            assert (p.w - 1) * p.z + p.z_last == p.y and 1 <= p.z_last <= p.z
            assert p.z * p.x <= 64 or p.w == 1
            if p.x * p.y <= 64:
                assert (p.z, p.w, p.z_last) == (p.y, 1, p.y)
        chosen = vector_split_plan(num * 1024).x
        assert chosen == min(64, 1 << (num.bit_length() - 1))  # largest power of two <= min(64, num)


@pytest.mark.parametrize("call, message", [
    (lambda: vector_split_plan(0), "empty reduction"),
    (lambda: vector_split_plan(-3), "empty reduction"),
    (lambda: vector_split_plan(10, block_size=0), "block size"),
    (lambda: vector_split_plan(10, vector_capacity=48), "power of two"),
    (lambda: decompose(10, 3), "power of two"),
    (lambda: decompose(10, 128), "power of two <= 64"),
    (lambda: decompose(0, 1), "positive"),
])
def test_patent_plan_rejects_bad_input(call, message):
    with pytest.raises(TvmExtError, match=message):
        call()


# ---- the template ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(0,), (5, 0), (0, 5)])
def test_empty_reduction_is_rejected(shape):
    with pytest.raises(TvmExtError, match="empty"):
        ReductionTemplate(shape)


@pytest.mark.parametrize("kwargs, message", [
    ({"shape": (8,), "op": "prod"}, "unknown reduction op"),
    ({"shape": (8,), "dtype": "float64"}, "not supported"),
    ({"shape": (2, 3, 4)}, "N or ROWS,COLS"),
])
def test_bad_template_parameters(kwargs, message):
    with pytest.raises(TvmExtError, match=message):
        ReductionTemplate(**kwargs)


def test_registered_and_default_is_the_patent_plan(opencl):
    assert get_template_class("reduce") is ReductionTemplate
    for n in (1025, 65537, 1_000_003, 1 << 20):
        tmpl = ReductionTemplate((n,))
        cfg = tmpl.default_config(opencl)
        plan = vector_split_plan(n, 1024, 64)
        assert (cfg.block_size, cfg.x, cfg.capacity, cfg.blocks) == (1024, plan.x, 64, 1)
        assert tmpl.geometry(cfg).plan == plan
        # the GA's first individual is the patent plan
        space = tmpl.space(opencl)
        ga = GeneticSearch(space, np.random.default_rng(0), size_pop=6, generations=1,
                           seeds=[space.encode(cfg)])
        assert space.decode(ga.propose()[0]) == cfg
    # short reductions take the simple kernel by default
    short = ReductionTemplate((1023,))
    assert short.geometry(short.default_config(opencl)).simple


def test_block_sizes_follow_the_device_limit(opencl):
    narrow = dataclasses.replace(opencl, max_threads_per_block=256)
    tmpl = ReductionTemplate((1 << 20,))
    assert tmpl.space(narrow).knob("block_size").choices == (128, 256)
    cfg = tmpl.default_config(narrow)
    assert cfg.block_size == 256 and cfg.x == vector_split_plan(1 << 20, 256).x
    with pytest.raises(TvmExtError, match="threads per block"):
        tmpl.space(dataclasses.replace(opencl, max_threads_per_block=64))


def test_infeasible_configs(opencl):
    tmpl = ReductionTemplate((10_000,))
    space = tmpl.space(opencl)
    base = tmpl.default_config(opencl)
    assert "capacity" in space.infeasible_reason(base.replace(x=64, capacity=32))
    assert "without elements" in space.infeasible_reason(base.replace(blocks=128))
    assert "simple kernel" in space.infeasible_reason(base.replace(blocks=2, small_n=65536))
    assert space.is_feasible(base.replace(blocks=8, block_size=1024))
    assert tmpl.scratch()[0].shape == (1, 64)  # 10_000 // 128 -> 64 blocks at most
    assert ReductionTemplate((100,)).scratch() == []  # no two-stage config is feasible


def test_check_is_as_strict_as_float32_allows():
    rng = np.random.default_rng(1)
    n = 1_000_003
    tmpl = ReductionTemplate((n,), "sum")
    data = tmpl.make_inputs(rng)
    (ref,) = tmpl.reference(data)
    exact = ref.astype(np.float32)
    assert tmpl.check([exact], [ref]) is None
    assert tmpl.check([np.float32(data[0].astype(np.float64).sum(dtype=np.float32)).reshape(1)], [ref]) is None
    one_thread = float(np.abs(data[0][:977]).sum())  # what a lost thread would drop
    assert tmpl.check([(ref - one_thread).astype(np.float32)], [ref]) is not None
    assert "NaN" in tmpl.check([np.array([np.nan], np.float32)], [ref])
    # max/min: exact, one ulp off is wrong
    mx = ReductionTemplate((n,), "max")
    (mref,) = mx.reference(data)
    assert mx.check([mref.astype(np.float32)], [mref]) is None
    assert mx.check([np.nextafter(mref.astype(np.float32), np.float32(0))], [mref]) is not None
    # mean: the bound scales with 1/n
    mean = ReductionTemplate((n,), "mean")
    (aref,) = mean.reference(data)
    assert mean.check([aref.astype(np.float32)], [aref]) is None
    assert mean.check([(aref * (1 - 1e-4)).astype(np.float32)], [aref]) is not None


# ---- every op on the OpenCL device ------------------------------------------------------------

SHAPES = [(1,), (2,), (31,), (1023,), (1024,), (1025,), (65537,), (1_000_003,), (3, 1_000_003), (4097, 7)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_op_matches_numpy_default_config(opencl, shape, op, tmp_path):
    tmpl = ReductionTemplate(shape, op)
    run_config(tmpl, tmpl.default_config(opencl), opencl)


# Other corners of the space: two-stage (scratch partials), the last pass holding
# z' < z vectors, padding on the patent path for tiny n, the simple kernel for long n.
VARIANTS = [
    ((1_000_003,), "sum", dict(blocks=64, block_size=256, x=4, capacity=64)),
    ((1_000_003,), "max", dict(x=8, capacity=64)),  # num 977 -> y 123, z 8, w 16, z' 3
    ((65537,), "mean", dict(blocks=512, block_size=128, x=1, capacity=16)),
    ((3, 1_000_003), "min", dict(blocks=16, block_size=512, x=16, capacity=128)),
    ((31,), "sumsq", dict(small_n=0, block_size=128, x=4)),  # patent path, mostly padding
    ((4097, 7), "max", dict(small_n=0, x=2)),
    ((65537,), "sum", dict(small_n=65536, block_size=128)),  # 65537 >= 65536: still the patent path
    ((1025,), "mean", dict(small_n=8192, block_size=256)),  # simple kernel, 5 steps per thread
    ((1 << 16,), "min", dict(blocks=4, block_size=1024, x=16, capacity=16)),  # exact fit, float4 loads
]


@pytest.mark.parametrize("shape, op, knobs", VARIANTS)
def test_other_configs_match_numpy(opencl, shape, op, knobs, tmp_path):
    tmpl = ReductionTemplate(shape, op)
    run_config(tmpl, tmpl.default_config(opencl).replace(**knobs), opencl)


def test_exact_fit_uses_vector_loads(opencl, tmp_path):
    tmpl = ReductionTemplate((1 << 16,), "sum")
    cfg = tmpl.default_config(opencl).replace(blocks=4, x=16, capacity=16)
    build = run_config(tmpl, cfg, opencl)
    assert "vload4" in build.artifact.source
    assert len(build.artifact.launches) == 2 and build.artifact.launches[0].grid[0] == 4
    assert build.artifact.params[-2:] == ("scratch", "counter")


# ---- NaN, infinities, float16 ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WithSpecials(ReductionTemplate):
    """The same kernel, fed data with special values at given flat positions."""

    specials: tuple = ()

    def make_inputs(self, rng):
        (data,) = super().make_inputs(rng)
        flat = data.reshape(-1)
        for index, value in self.specials:
            flat[index] = value
        return [data]


TWO_STAGE = dict(blocks=64, block_size=256, x=4)
SPECIALS = [  # (shape, knobs, specials, ops)
    ((65537,), {}, ((65536, np.nan),), OPS),  # the very last element
    ((4097, 7), {}, ((7 * 3 + 2, np.nan), (7 * 9, np.inf), (7 * 9 + 1, -np.inf), (7 * 11, np.inf)), OPS),
    ((1_000_003,), TWO_STAGE, ((5, np.nan), (777_777, 1.0)), ("sum", "max", "min")),
    ((3, 200_003), dict(blocks=8), ((200_003 + 12345, np.nan), (2 * 200_003 + 17, -np.inf)),
     ("sumsq", "max", "min")),
]


@pytest.mark.parametrize("shape, knobs, specials, op",
                         [(s, k, sp, op) for s, k, sp, ops in SPECIALS for op in ops])
def test_nan_and_inf_propagate_like_numpy(opencl, shape, knobs, specials, op, tmp_path):
    tmpl = WithSpecials(shape, op, specials=specials)
    (ref,) = tmpl.reference(tmpl.make_inputs(np.random.default_rng(0)))
    assert np.isnan(ref).any()  # the case is meaningful: numpy gives NaN somewhere
    run_config(tmpl, tmpl.default_config(opencl).replace(**knobs), opencl)


FLOAT16 = [((65537,), {}, OPS), ((4097, 7), {}, ("sum", "max")),
           ((200_003,), dict(blocks=32, block_size=256, x=8), ("mean", "min"))]


@pytest.mark.parametrize("shape, knobs, op", [(s, k, op) for s, k, ops in FLOAT16 for op in ops])
def test_float16_input_accumulates_in_float32(opencl, shape, knobs, op, tmp_path):
    tmpl = ReductionTemplate(shape, op, "float16")
    assert tmpl.outputs()[0].dtype == "float32"
    run_config(tmpl, tmpl.default_config(opencl).replace(**knobs), opencl)


@dataclasses.dataclass(frozen=True)
class EveryHalf(ReductionTemplate):
    """Row i holds the float16 with bit pattern i: a one-element max is the widened value."""

    def make_inputs(self, rng):
        return [np.arange(65536, dtype=np.uint16).view(np.float16).reshape(65536, 1)]


def test_every_float16_bit_pattern_widens_exactly(opencl, tmp_path):
    # ±0, subnormals, normals, ±inf and NaN payloads: max of one element is exact
    tmpl = EveryHalf((65536, 1), "max", "float16")
    run_config(tmpl, tmpl.default_config(opencl), opencl)


# ---- one launch: the last block to finish combines the partials ------------------------------
# Each runs through the tuner's runner: outputs poisoned with NaN, the result checked
# against float64.  G > B: the last block loops over the partials; G < B: some threads idle.

ONE_LAUNCH = [
    ((1 << 20,), "sum", dict(blocks=256, block_size=1024, x=4)),  # the benchmark's 2^20 shape
    ((1 << 20,), "sum", dict(blocks=2048, block_size=128, x=4)),  # 2048 partials, 128 threads
    ((1_000_003,), "mean", dict(blocks=64, block_size=256, x=4)),
    ((3, 200_003), "sumsq", dict(blocks=8, block_size=512)),
    ((5, 65537), "max", dict(blocks=16, block_size=128, x=2)),
]


@pytest.mark.parametrize("shape, op, knobs", ONE_LAUNCH)
def test_one_launch_combine_matches_float64(opencl, shape, op, knobs, tmp_path):
    tmpl = ReductionTemplate(shape, op)
    build = run_config(tmpl, tmpl.default_config(opencl).replace(combine=1, **knobs), opencl)
    assert len(build.artifact.launches) == 1  # partials and their sum in one kernel
    assert "atomic_add" in build.artifact.source and "mem_fence" in build.artifact.source


def test_one_launch_propagates_nan_from_any_block(opencl, tmp_path):
    tmpl = WithSpecials((1_000_003,), "max", specials=((5, np.nan), (777_777, 1.0)))
    run_config(tmpl, tmpl.default_config(opencl).replace(combine=1, **TWO_STAGE), opencl)


def test_one_launch_resets_its_counter_for_the_next_launch(opencl, tmp_path):
    """Three launches on the same buffers, the output poisoned before each: every launch
    writes the right sums, and each row's counter is back at 0 afterwards."""
    from tvm_ext.measure.executors import OpenclExecutor

    tmpl = ReductionTemplate((3, 200_003), "sum")
    build = run_config(tmpl, tmpl.default_config(opencl).replace(blocks=16, combine=1), opencl)
    specs = dict(zip(build.artifact.params, tmpl.inputs() + tmpl.outputs() + tmpl.scratch()))
    executor = OpenclExecutor.of(build.artifact.source, build.artifact.launches, specs, opencl.device_id)
    inputs, refs = tmpl.make_case(np.random.default_rng(4))
    arrays = dict(zip(build.artifact.params, inputs + [np.full(3, np.nan, np.float32)] +
                      [np.full(spec.shape, np.nan, np.float32) if spec.fill is None else
                       np.full(spec.shape, spec.fill, np.int32) for spec in tmpl.scratch()]))
    assert arrays["counter"].dtype == np.int32 and not arrays["counter"].any()
    for name, array in arrays.items():
        executor.write(name, array)
    for launch in range(3):
        executor.write("total", np.full(3, np.nan, np.float32))
        executor.run()
        out, counter = executor.read("total"), executor.read("counter")
        executor.sync()
        assert tmpl.check([out], refs) is None, f"launch {launch}: {tmpl.check([out], refs)}"
        assert counter.tolist() == [0, 0, 0], f"launch {launch} left the counters at {counter}"


def test_one_launch_needs_partials_and_is_in_the_cuda_source(tmp_path):
    cuda = offline_cuda("sm_90")
    tmpl = ReductionTemplate((1 << 20,), "sum")
    space = tmpl.space(cuda)
    assert "needs blocks > 1" in space.infeasible_reason(tmpl.default_config(cuda).replace(combine=1))
    cfg = tmpl.filled_config(cuda, combine=1)
    assert cfg.combine == 1 and cfg.blocks > 1 and space.is_feasible(cfg)
    build = build_one(tmpl, cfg, cuda)
    assert build.ok, build.error_msg
    source = build.artifact.source
    assert len(build.artifact.launches) == 1 and source.count("__global__ void") == 2  # declaration + body
    fence, ticket = source.index("__threadfence()"), source.index("atomicAdd(")
    assert fence < ticket < source.index("__threadfence()", ticket)  # fence, ticket, fence
    assert "counter_ptr[0] = 0" in source  # the last block resets the counter


# ---- several rows per block: a thread group (threadIdx.y) per row ------------------------------

ROW_GROUPS = [
    ((4096, 512), "sum", dict(rows_per_block=8, block_size=256, x=4)),  # a warp per row, float4 loads
    ((1000, 300), "mean", dict(rows_per_block=4, block_size=256, x=2)),  # rows not a multiple of 4
    ((4097, 7), "max", dict(rows_per_block=32, block_size=1024)),  # short rows: 8 threads each
    ((33, 5000), "sumsq", dict(rows_per_block=2, block_size=128, x=8, capacity=32)),
]


@pytest.mark.parametrize("shape, op, knobs", ROW_GROUPS)
def test_rows_per_block_matches_float64(opencl, shape, op, knobs, tmp_path):
    tmpl = ReductionTemplate(shape, op)
    cfg = tmpl.default_config(opencl).replace(**knobs)
    build = run_config(tmpl, cfg, opencl)
    (launch,) = build.artifact.launches
    assert launch.block[1] == knobs["rows_per_block"] and launch.grid[0] == -(-shape[0] // knobs["rows_per_block"])


def test_rows_per_block_feasibility_and_cuda_source(opencl, tmp_path):
    tmpl = ReductionTemplate((4096, 4096), "sum")
    space = tmpl.space(opencl)
    base = tmpl.default_config(opencl)
    assert "blocks must be 1" in space.infeasible_reason(base.replace(rows_per_block=2, blocks=2))
    assert "fewer than 32" in space.infeasible_reason(base.replace(rows_per_block=16, block_size=256))
    assert "has 1" in ReductionTemplate((5000,)).space(opencl).infeasible_reason(
        ReductionTemplate((5000,)).default_config(opencl).replace(rows_per_block=2))
    cuda = offline_cuda("sm_90")
    cfg = tmpl.row_group_config(cuda)
    assert (cfg.rows_per_block, cfg.block_size, tmpl.geometry(cfg).threads) == (8, 256, 32)
    build = build_one(tmpl, cfg, cuda)
    assert build.ok, build.error_msg
    assert "threadIdx.y" in build.artifact.source and "__shfl_down_sync" in build.artifact.source
    assert "__syncthreads" not in build.artifact.source  # a warp per row: shuffles only
    assert build.artifact.launches[0].block == (32, 8, 1)


@pytest.mark.gpu
def test_one_launch_and_row_groups_on_the_gpu(tmp_path):
    """On the GPU: the one-launch sum against float64 over 200 back-to-back launches on the
    same buffers (the output poisoned before them; the counter must come back to 0 each
    time), and the row-group kernel of the row sum."""
    import tvm

    from tvm_ext.measure.executors import load_library
    from tvm_ext.measure.measure import MeasureSettings
    from tvm_ext.target import resolve_target

    cuda = resolve_target("cuda", 0)
    settings = MeasureSettings(warmup=1, repeat=3, min_repeat_secs=0.01)
    for tmpl, cfg in ((ReductionTemplate((1 << 20,)), None), (ReductionTemplate((3, 200_003), "mean"), None),
                      (ReductionTemplate((4096, 4096)), "rows")):
        cfg = tmpl.row_group_config(cuda) if cfg == "rows" else tmpl.filled_config(cuda, combine=1)
        build = build_one(tmpl, cfg, cuda)
        assert build.ok, build.error_msg
        result = measure(tmpl, build.config, build.artifact, cuda, settings)
        assert result.ok, f"{tmpl.describe()} {cfg}: {result.error_kind} {result.error_msg}"
        if not cfg.combine:
            continue
        dev = tvm.cuda(0)
        func = load_library(build.artifact.library)["main"]
        inputs, refs = tmpl.make_case(np.random.default_rng(9))
        outs = [np.full(s.shape, np.nan if s.fill is None else s.fill, s.dtype)
                for s in tmpl.outputs() + tmpl.scratch()]
        args = [tvm.runtime.tensor(a, dev) for a in inputs + outs]
        for _ in range(200):
            func(*args)
        dev.sync()
        assert tmpl.check([args[1].numpy()], refs) is None
        assert not args[-1].numpy().any()  # every row's counter reset


# ---- CUDA source without a GPU, the CLI, the benchmark script -------------------------------------

def test_cuda_source_for_sampled_configs(tmp_path):
    cuda = offline_cuda("sm_90")
    rng = np.random.default_rng(0)
    for shape, op, dtype in [((1 << 28,), "sum", "float32"), ((1 << 20,), "max", "float16"),
                             ((4096, 4096), "mean", "float32"), ((4097, 7), "sumsq", "float16")]:
        tmpl = ReductionTemplate(shape, op, dtype)
        space = tmpl.space(cuda)
        configs = [tmpl.default_config(cuda)] + [space.decode(r) for r in space.random_feasible_indices(rng, 6)]
        for cfg in configs:
            build = build_one(tmpl, cfg, cuda)
            assert build.ok, f"{tmpl.describe()} {cfg}: {build.error_msg}"
            assert "__global__" in build.artifact.source
            if tmpl.geometry(cfg).threads >= 64:
                assert "__shfl_down_sync" in build.artifact.source  # warp step of the allreduce


def test_benchmark_script_imports_and_generates_cuda(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_reduction", os.path.join(ROOT, "benchmarks", "reduction.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cuda = offline_cuda("sm_90")
    for workload in bench.WORKLOADS:
        tmpl = bench.template_of(workload)
        seeds = bench.seed_configs(tmpl, cuda)
        assert any(cfg.combine for _, cfg in seeds) == (tmpl.rows == 1)  # one launch where it applies
        assert any(cfg.rows_per_block > 1 for _, cfg in seeds) == (tmpl.rows > 1)
        for name, cfg in seeds:
            build = build_one(tmpl, cfg, cuda)
            assert build.ok, f"{workload} {name} {cfg}: {build.error_msg}"


CLI = [sys.executable, "-m", "tvm_ext.tune"]


def test_cli_tuning_run_writes_records(tmp_path):
    rec = tmp_path / "r.jsonl"
    p = subprocess.run(CLI + ["reduce", "--op", "sum", "--shape", "3,5000", "--generations", "1",
                              "--population", "5", "--trials", "6", "--records", str(rec), "--no-progress",
                              "--seed", "1", "--workers", "1"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "GB/s" in p.stdout and "best" in p.stdout
    lines = [json.loads(line) for line in rec.read_text().splitlines()]
    assert len(lines) >= 3
    assert lines[0]["workload"]["template"] == "reduce"
    assert lines[0]["workload"]["params"] == {"shape": [3, 5000], "op": "sum", "dtype": "float32"}
    plan = vector_split_plan(5000)
    assert lines[0]["config"] == {"block_size": 1024, "x": plan.x, "capacity": 64, "blocks": 1, "small_n": 1024,
                                  "rows_per_block": 1, "combine": 0}
    assert any(line["error_kind"] == "" for line in lines)


def test_cli_help_lists_the_knobs_and_bad_shapes_are_one_line_errors(tmp_path):
    p = subprocess.run(CLI + ["reduce", "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0
    for knob in ("block_size", "x ", "capacity", "blocks", "small_n", "rows_per_block", "combine"):
        assert knob in p.stdout
    for shape, message in (("0", "must be positive"), ("4,0", "must be positive"), ("2,3,4", "needs 2 numbers"),
                           ("a", "malformed")):
        p = subprocess.run(CLI + ["reduce", "--shape", shape, "--records", str(tmp_path / "r.jsonl")],
                           capture_output=True, text=True, timeout=120)
        err = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(err) == 1 and message in err[0], p.stderr
