"""The float32 input GEMM as float16 parts on the tensor cores (``in_split``, ``split.py``).

- The split kernels, built by TVM for the CPU (LLVM) and run: the parts they store are the
  numpy parts, and three products of them are float32-accurate where one float16 product
  is not.
- The scaled bias epilogue the split GEMM ends with, built and run on PoCL.
- The plan and its CUDA (generated and compiled here, no GPU): split, split, GEMM of depth
  3K on mma.sync per layer, one pair of part buffers per depth; the refusals; the pick.
- ``-m gpu``: whole GRUs with the split against float64, odd shapes and layers included.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from test_gru import Shape, _inputs, _weights
from test_gru_shapes import _check

from tvm_ext.core.errors import TvmExtError
from tvm_ext.schedules.gemm.simt import BiasGemmTemplate
from tvm_ext.precision.precision import relative_error
from tvm_ext.schedules.gru import GRU, GruTemplate, gru_reference
from tvm_ext.schedules.gru.split import (FLOAT16_MAX, SPLIT_WEIGHT_SCALE, split_depth, split_parts, split_product,
                                         split_range_reason, split_rows_func, split_weight_func,
                                         split_weight_n_major_func)
from tvm_ext.target import offline_cuda


def _run_on_cpu(func, array: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray:
    import tvm

    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    dev = tvm.cpu()
    out = tvm.runtime.empty(out_shape, "float16", dev)
    lib["main"](tvm.runtime.tensor(array, dev), out)
    return out.numpy()


def test_split_kernels_store_the_numpy_parts():
    """Each part zero-padded to a depth of 32 (12 -> 32: the tensor-core k stages divide it)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, (5, 12)).astype(np.float32)
    x[0, :3] = (1e-6, -2.5e-7, 0.0)  # low parts below float16's normal range
    hi, lo = split_parts(x)
    assert split_depth(12) == 32 and split_depth(64) == 64
    pad = lambda part: np.pad(part, [(0, 0), (0, 20)])  # noqa: E731
    expected = np.concatenate([pad(hi), pad(hi), pad(lo)], axis=1)
    assert np.array_equal(_run_on_cpu(split_rows_func(5, 12), x, (5, 96)), expected)
    w = rng.uniform(-0.05, 0.05, (12, 7)).astype(np.float32)
    w_hi, w_lo = (np.pad(p, [(0, 20), (0, 0)]) for p in split_parts(w, SPLIT_WEIGHT_SCALE))
    assert np.array_equal(_run_on_cpu(split_weight_func(12, 7), w, (96, 7)), np.concatenate([w_hi, w_lo, w_hi]))
    # the parts hold 22 bits: hi + lo is x within 2^-22 of it (2^-25 absolute where lo is subnormal)
    rebuilt = hi.astype(np.float64) + lo.astype(np.float64)
    assert np.all(np.abs(rebuilt - x) <= np.maximum(np.abs(x) * 2.0 ** -22, 2.0 ** -25))


def test_tf32_split_kernels_store_the_parts_padded_on_opencl(opencl):
    """in_split 3: x's rows as [lo | hi | hi] and W_ih's columns (N-major) as [hi | lo | hi] TF32
    parts (``gemm_3xtf32``'s order), each zero-padded to a depth of 64 (40 -> 64), unscaled and
    at float32's range (1e30 and 3e-30 split as exactly as 1), built and run on PoCL."""
    from opencl_calls import run_calls

    from tvm_ext.schedules.gemm.gemm_3xtf32 import tf32_parts
    from tvm_ext.schedules.gru.kernels import schedule_elementwise

    m, k, n = 6, 40, 72  # N not a multiple of 32: the transposed tiles guard their columns
    rng = np.random.default_rng(3)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0, :3] = (1e30, -3e-30, 70000.0)  # beyond float16's range both ways
    w = (rng.standard_normal((k, n)) * 1e-3).astype(np.float32)
    funcs = {"split_x": schedule_elementwise(split_rows_func(m, k, tf32=True), "split", 64).mod["main"],
             "split_w": split_weight_n_major_func(k, n, tf32=True)}
    out = run_calls(opencl, funcs, [("split_x", ("x", "xs")), ("split_w", ("w", "ws"))], {"x": x, "w": w},
                    {"xs": (m, 192), "ws": (n, 192)})
    pad = lambda part: np.pad(part, [(0, 0), (0, 24)])  # noqa: E731
    x_hi, x_lo = tf32_parts(x)
    w_hi, w_lo = tf32_parts(w.T.copy())
    assert np.array_equal(out["xs"], np.concatenate([pad(x_lo), pad(x_hi), pad(x_hi)], axis=1))
    assert np.array_equal(out["ws"], np.concatenate([pad(w_hi), pad(w_lo), pad(w_hi)], axis=1))
    rebuilt = x_hi.astype(np.float64) + x_lo.astype(np.float64)
    assert np.all(np.abs(rebuilt - x) <= np.abs(x) * 2.0 ** -22)


def test_two_tf32_parts_split_kernels_store_each_part_once_on_opencl(opencl):
    """in_tf32_parts 2: x's rows as [lo | hi] and W_ih's columns (N-major) as [hi | lo], each
    zero-padded to a depth of 64 (40 -> 64), both splits built and run on PoCL; x's unpadded depth
    (64) by ``gemm_3xtf32``'s four-columns-a-thread split in the same order."""
    from opencl_calls import run_calls

    from tvm_ext.schedules.gemm.gemm_3xtf32 import split_a_func, tf32_parts
    from tvm_ext.schedules.gru.kernels import schedule_elementwise
    from tvm_ext.schedules.gru.split import tf32_orders

    m, k, n = 6, 40, 72
    rng = np.random.default_rng(4)
    x, x64 = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((m, 64)).astype(np.float32)
    w = (rng.standard_normal((k, n)) * 1e-3).astype(np.float32)
    funcs = {"split_x": schedule_elementwise(split_rows_func(m, k, tf32=True, parts=2), "split", 64).mod["main"],
             "split_w": split_weight_n_major_func(k, n, tf32=True, parts=2),
             "split_x64": split_a_func(m, 64, tf32_orders(2)[0])}
    out = run_calls(opencl, funcs, [("split_x", ("x", "xs")), ("split_w", ("w", "ws")), ("split_x64", ("x64", "xs64"))],
                    {"x": x, "w": w, "x64": x64}, {"xs": (m, 128), "ws": (n, 128), "xs64": (m, 128)})
    pad = lambda part: np.pad(part, [(0, 0), (0, 24)])  # noqa: E731
    x_hi, x_lo = tf32_parts(x)
    w_hi, w_lo = tf32_parts(w.T.copy())
    assert np.array_equal(out["xs"], np.concatenate([pad(x_lo), pad(x_hi)], axis=1))
    assert np.array_equal(out["ws"], np.concatenate([pad(w_hi), pad(w_lo)], axis=1))
    assert np.array_equal(out["xs64"], np.concatenate(tf32_parts(x64)[::-1], axis=1))


def _tf32_split_program(opencl, m: int, k: int, n: int):
    """W_ih's TF32 split (``split_w``: w (k, n) -> ws) then x's (``split_x``: x (m, k) -> xs)
    compiled for PoCL, and the buffers' specs in the program's order."""
    from tvm_ext.measure.program import TensorSpec, compile_calls_program
    from tvm_ext.schedules.gru.kernels import schedule_elementwise

    funcs = {"split_w": split_weight_n_major_func(k, n, tf32=True),
             "split_x": schedule_elementwise(split_rows_func(m, k, tf32=True), "split", 64).mod["main"]}
    specs = {"w": TensorSpec((k, n), "float32"), "x": TensorSpec((m, k), "float32"),
             "ws": TensorSpec((n, 3 * k), "float32"), "xs": TensorSpec((m, 3 * k), "float32")}
    program = compile_calls_program(funcs, [("split_w", ("w", "ws")), ("split_x", ("x", "xs"))], opencl,
                                    tuple(specs), {})
    return program, specs


def _w_parts(w: np.ndarray) -> np.ndarray:
    """W_ih's columns N-major as [hi | lo | hi] TF32 parts (what ``split_w`` stores)."""
    from tvm_ext.schedules.gemm.gemm_3xtf32 import tf32_parts

    hi, lo = tf32_parts(w.T.copy())
    return np.concatenate([hi, lo, hi], axis=1)


def test_executor_prepares_w_ih_parts_once_and_runs_the_rest_each_pass_on_opencl(opencl):
    """The executor's ``prepared`` steps (a GRU's W_ih split, ``plan.prepare_calls``) run by
    ``prepare`` only: a pass (``run``) splits x and leaves W_ih's parts as the last ``prepare``
    made them, though W_ih changed since; ``prepare`` makes the new ones. PoCL, the TF32 split
    kernels."""
    from tvm_ext.measure.executors import OpenclExecutor

    m, k, n = 4, 32, 40
    program, specs = _tf32_split_program(opencl, m, k, n)
    ex = OpenclExecutor.of(program.source, program.launches, specs, opencl.device_id, prepared=1)
    rng = np.random.default_rng(5)
    w1, w2, x = (rng.standard_normal(shape).astype(np.float32) for shape in ((k, n), (k, n), (m, k)))
    for name in ("ws", "xs"):
        ex.write(name, np.full(specs[name].shape, np.nan, np.float32))
    ex.write("w", w1)
    ex.write("x", x)
    ex.prepare()
    ex.run()
    ex.sync()
    assert np.array_equal(ex.read("ws"), _w_parts(w1)) and not np.isnan(ex.read("xs")).any()
    ex.write("w", w2)
    ex.run()
    ex.sync()
    assert np.array_equal(ex.read("ws"), _w_parts(w1))  # a pass does not split the weights
    ex.prepare()
    ex.sync()
    assert np.array_equal(ex.read("ws"), _w_parts(w2))


def test_runner_prepares_each_input_set_before_the_check_on_opencl(opencl):
    """The runner's job with ``RunPlan.prepare_steps`` 1 (W_ih's TF32 split first): after it
    writes the inputs and NaN-poisons the outputs it runs the prepared step once, so the
    parts it checks are the weights' (a runner that skipped it would check NaN), and its
    stages are the pass's. PoCL, the split kernels."""
    from tvm_ext.measure.checks import NormwiseCheck
    from tvm_ext.measure.measure import MeasureJob, MeasureSettings, run_job
    from tvm_ext.measure.program import RunPlan
    from tvm_ext.schedules.gemm.gemm_3xtf32 import tf32_parts

    m, k, n = 4, 32, 40
    program, specs = _tf32_split_program(opencl, m, k, n)
    rng = np.random.default_rng(7)
    w, x = rng.standard_normal((k, n)).astype(np.float32), rng.standard_normal((m, k)).astype(np.float32)
    x_hi, x_lo = tf32_parts(x)
    refs = (_w_parts(w).astype(np.float64), np.concatenate([x_lo, x_hi, x_hi], axis=1).astype(np.float64))
    plan = RunPlan(timer="host", rotate_inputs=False, stages=(("input_gemm",),), prepare_steps=1)
    job = MeasureJob(program.artifact(), tuple(specs.items()), 2, 2, (w, x), refs, NormwiseCheck(0.0), plan,
                     MeasureSettings(warmup=0, repeat=1, min_repeat_secs=0.0), device_id=opencl.device_id)
    result = run_job(job)
    assert result.ok, result.error_msg
    assert result.metrics["rel_error"] == 0.0 and set(result.metrics["stage_secs"]) == {"input_gemm"}


def test_three_products_of_the_parts_are_float32_accurate():
    """GRU-like operands (x in [-1, 1], W_ih at PyTorch's init for hidden 1024): the split
    product's error is float32's order; a single float16 product's is 1000x that."""
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (64, 1024)).astype(np.float32)
    b = rng.uniform(-1 / 32, 1 / 32, (1024, 96)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    err = lambda got: np.linalg.norm(got - exact) / np.linalg.norm(exact)  # noqa: E731
    assert err(split_product(a, b)) < 1e-6
    assert err(a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)) > 1e-4
    assert err(split_product(a, b, scale=1.0)) > err(split_product(a, b))  # W's low parts subnormal unscaled


def test_scaled_bias_epilogue_on_opencl(opencl):
    """D = A·B·scale + bias with a float32 bias whatever B's type: built and run on PoCL, checked
    against float64 (a kernel that skipped the scale would be 4x off)."""
    from tvm_ext.measure.builder import build_one
    from tvm_ext.measure.measure import MeasureSettings, measure

    gemm = BiasGemmTemplate(24, 40, 36, out_scale=0.25, bias_dtype="float32")
    assert gemm.params["out_scale"] == 0.25 and gemm.inputs()[2].dtype == "float32"
    cfg = gemm.default_config(opencl)
    build = build_one(gemm, cfg, opencl)
    assert build.ok, build.error_msg
    result = measure(gemm, cfg, build.artifact, opencl, MeasureSettings(warmup=0, repeat=1, min_repeat_secs=0.0))
    assert result.ok, result.error_msg
    assert result.metrics["rel_error"] < 1e-6


def test_split_plan_and_its_cuda():
    """Two bidirectional layers whose input sizes differ: W_ih's parts split once, as the weights
    are loaded (the plan's ``prepare``, into a part buffer per layer), then per pass and layer
    x's parts and the GEMM of depth 3K on mma.sync, W_ih's scale undone in its epilogue; the
    part buffers in the plan's buffers only with the knob on."""
    from tvm_ext.schedules.gru.plan import run_plan

    target = offline_cuda()
    t = GruTemplate(batch=8, hidden=64, input=48, seq=16, layers=2, bidirectional=True).with_tensor_cores(target)
    assert t.in_split_tensor_core is not None
    cfg = t.analytic_pick(target)[0].replace(in_split=1)
    assert t.space(target).infeasible_reason(cfg) is None
    compiled = t.compile(cfg, target)  # nvcc builds it (and the plan's buffers are checked)
    assert [(c.func, c.args) for c in compiled.prepare] == [("gru_split_w0", ("w_ih0", "ws0")),
                                                            ("gru_split_w1", ("w_ih1", "ws1"))]
    calls = [(c.func, c.args) for c in compiled.calls if c.func.startswith(("gru_split", "gru_gemm_x"))]
    assert calls == [("gru_split_x0", ("x", "xs0")), ("gru_gemm_x0", ("xs0", "ws0", "b_ih0", "gi")),
                     ("gru_split_x1", ("y0", "xs1")), ("gru_gemm_x1", ("xs1", "ws1", "b_ih1", "gi"))]
    # the executors' order: the prepared steps first, then the pass; the runner prepares those two
    assert [c.name for c in compiled.function_calls()][:3] == ["gru_split_w0", "gru_split_w1", "gru_init"]
    assert compiled.prepared_steps("cuda") == 2
    plan = run_plan(t.build_program(cfg, target).artifact())
    assert plan.prepare_steps == 2 and len(plan.stages) == len(compiled.calls)
    specs = t.for_config(cfg).buffers()
    # input 48 padded to 64 a part
    assert specs["xs0"].shape == (128, 192) and specs["ws0"].shape == (192, 384) and specs["xs0"].dtype == "float16"
    assert specs["xs1"].shape == (128, 384) and specs["ws1"].shape == (384, 384)
    assert "xs0" not in t.for_config(cfg.replace(in_split=0)).buffers() and "xs0" not in t.buffers()
    body = re.search(r"gru_gemm_x0_kernel\([^)]*\) \{", compiled.source).end()
    gemm = compiled.source[body:compiled.source.index("\n}\n", body)]
    assert ("mma.sync" in gemm or "wmma::mma_sync" in gemm) and "0x1p-8f" in gemm  # x 1/256 before the bias
    assert re.search(r"gru_split_w0_kernel\(float\* __restrict__ \w+, half\* __restrict__", compiled.source)


def test_split_on_wgmma_plan_and_its_cuda():
    """in_split 2: W_ih's parts N-major for the wgmma GEMM, which adds the float32 bias after
    undoing the scale and stores float32 gi; the module is built for sm_90a."""
    target = offline_cuda()
    t = GruTemplate(batch=8, hidden=64, input=48, seq=16, layers=2, bidirectional=True).with_tensor_cores(target)
    assert t.in_split_wgmma is not None and t.params["in_split_wgmma"] == t.in_split_wgmma.name
    cfg = t.analytic_pick(target)[0].replace(in_split=2)
    compiled = t.compile(cfg, target)
    specs = t.for_config(cfg).buffers()
    assert specs["ws0"].shape == (384, 192) and specs["ws1"].shape == (384, 384)  # (N, 3 x padded K)
    assert specs["xs0"].shape == (128, 192)
    body = re.search(r"gru_gemm_x0_kernel\([^)]*\) \{", compiled.source).end()
    gemm = compiled.source[body:compiled.source.index("\n}\n", body)]
    assert "wgmma_f16_ss_mma_async" in gemm and "0x1p-8f" in gemm and "bias" in gemm
    assert re.search(r"gru_gemm_x0_kernel\(half\* __restrict__ A_ptr, half\* __restrict__ Bt_ptr, "
                     r"float\* __restrict__ C_ptr, float\* __restrict__ bias_ptr\)", compiled.source)
    ampere = offline_cuda("sm_80")
    old = GruTemplate(batch=8, hidden=64, input=48, seq=16).with_tensor_cores(ampere)
    assert old.in_split_wgmma is None
    assert "needs a Hopper GPU (sm_90)" in old.space(ampere).infeasible_reason(cfg.replace(in_split=2))
    odd = GruTemplate(batch=5, hidden=64, input=48, seq=9).with_tensor_cores(target)  # 45 rows: no tile
    assert odd.in_split_wgmma is None and odd.in_split_tensor_core is not None


def test_split_refusals(opencl):
    """Where the split cannot run, the knob is refused with why: no float16 on the device (PoCL),
    lowered operand types (it emulates float32), no tensor-core tile on CUDA (sm_61)."""
    t = GruTemplate(batch=4, hidden=32, input=16, seq=8)
    on = lambda tmpl, target: tmpl.default_config(target).replace(in_split=1)  # noqa: E731
    if "float16" not in opencl.float_dtypes:
        reason = t.space(opencl).infeasible_reason(on(t, opencl))
        assert "no float16" in reason
        with pytest.raises(TvmExtError, match="no float16"):
            GRU.build(opencl, 16, 32, batch=4, seq=8, config={"in_split": 1})
    pascal = offline_cuda("sm_61")
    old = t.with_tensor_cores(pascal)
    assert old.in_split_tensor_core is None
    assert "tensor-core tile" in old.space(pascal).infeasible_reason(on(old, pascal))
    target = offline_cuda()
    low = t.with_precision({"x": "float16", "w_ih": "float16"}).with_tensor_cores(target)
    assert low.in_split_tensor_core is None
    assert "w_ih, x must be float32" in low.space(target).infeasible_reason(on(low, target))
    two = dataclasses.replace(t, layers=2).with_precision({"out": "bfloat16"}).with_tensor_cores(target)
    assert "out must be float32" in two.space(target).infeasible_reason(on(two, target))


def test_split_into_tf32_parts_plan_and_its_cuda():
    """in_split 3: float32 part buffers (x's rows, W_ih's columns N-major), the TF32 wgmma GEMM of
    depth 3 x padded K adding the float32 bias with no scale to undo, sums promoted; refused off
    Hopper and with a 16-bit gi, with the reason."""
    target = offline_cuda()
    t = GruTemplate(batch=8, hidden=64, input=48, seq=16, layers=2, bidirectional=True).with_tensor_cores(target)
    assert t.in_split_tf32 is not None and t.params["in_split_tf32"] == t.in_split_tf32.name
    assert t.in_split_tf32.operand == "tf32"
    cfg = t.analytic_pick(target)[0].replace(in_split=3)
    compiled = t.compile(cfg, target)
    specs = t.for_config(cfg).buffers()
    assert [(specs[n].shape, specs[n].dtype) for n in ("xs0", "ws0", "xs1", "ws1")] == [
        ((128, 192), "float32"), ((384, 192), "float32"), ((128, 384), "float32"), ((384, 384), "float32")]
    body = re.search(r"gru_gemm_x0_kernel\([^)]*\) \{", compiled.source).end()
    gemm = compiled.source[body:compiled.source.index("\n}\n", body)]
    assert "wgmma_tf32_ss_mma_async" in gemm and "0x1p-8f" not in gemm and "total" in gemm  # promoted sums
    assert re.search(r"gru_gemm_x0_kernel\(float\* __restrict__ A_ptr, float\* __restrict__ Bt_ptr, "
                     r"float\* __restrict__ C_ptr, float\* __restrict__ bias_ptr\)", compiled.source)
    assert re.search(r"gru_split_w0_kernel\(float\* __restrict__ B_ptr, float\* __restrict__ parts_ptr\)",
                     compiled.source)
    # x of depth 48 padded to 64: the scheduled split, an output element a thread; layer 1's x (depth
    # 128, no padding): gemm_3xtf32's split, four columns a thread in 16-byte loads and stores
    bodies = {i: _kernel_body(compiled.source, f"gru_split_x{i}_kernel") for i in (0, 1)}
    assert "float4" not in bodies[0] and bodies[1].count("*(float4*)(parts_ptr") == 3
    assert not t.split_rows_written(cfg, 0) and t.split_rows_written(cfg, 1)
    ampere = offline_cuda("sm_80")
    old = GruTemplate(batch=8, hidden=64, input=48, seq=16).with_tensor_cores(ampere)
    assert "(in_split 3) needs a Hopper GPU" in old.space(ampere).infeasible_reason(cfg.replace(in_split=3))
    half_gi = GruTemplate(batch=8, hidden=64, input=48, seq=16, gi_dtype="float16").with_tensor_cores(target)
    assert half_gi.in_split_tf32 is None and half_gi.in_split_wgmma is not None
    assert "float32 gi" in half_gi.space(target).infeasible_reason(cfg.replace(in_split=3))


def test_tf32_parts_stored_once_and_read_in_turn_by_the_tma():
    """in_tf32_parts 2: x's and W_ih's TF32 parts stored once each ([x_lo | x_hi], [W_hi | W_lo]),
    two thirds of the buffers and the splits' stores; the GEMM loads its k tiles by the TMA, each
    tile's three products taking (A part, B part) in turn; refused off the split of TF32 parts and
    for a counted GEMM not loaded by the TMA, with the reason; three parts are what the knob's
    absence means."""
    target = offline_cuda()
    t = GruTemplate(batch=8, hidden=64, input=48, seq=16, layers=2, bidirectional=True).with_tensor_cores(target)
    three = t.analytic_pick(target)[0].replace(in_split=3, in_tf32_parts=3)
    two = three.replace(in_tf32_parts=2)
    assert t.space(target).infeasible_reason(two) is None
    specs = t.for_config(two).buffers()
    assert [specs[n].shape for n in ("xs0", "ws0", "xs1", "ws1")] == [(128, 128), (384, 128), (128, 256), (384, 256)]
    sources = {parts: t.compile(cfg, target).source for parts, cfg in ((2, two), (3, three))}
    gemms = {parts: _kernel_body(src, "gru_gemm_x0_kernel") for parts, src in sources.items()}
    assert "bulk_tensor_2d" in gemms[2] and "cp_async_cg" not in gemms[2] and "cp_async_cg" in gemms[3]
    assert "wgmma_tf32_ss_mma_async" in gemms[2]
    # layer 1's x (depth 128): gemm_3xtf32's split, a 16-byte store a part; W_ih's a store a part a row
    assert _kernel_body(sources[2], "gru_split_x1_kernel").count("*(float4*)(parts_ptr") == 2
    for parts, src in sources.items():
        assert _kernel_body(src, "gru_split_w0_kernel").count("parts_ptr[") == 4 * parts  # 4 rows a thread
    refused = t.space(target).infeasible_reason(two.replace(in_split=2))
    assert "in_tf32_parts change the input GEMM of TF32 parts (in_split 3)" in refused
    counted = GruTemplate(batch=16, hidden=512, input=512, seq=128).with_tensor_cores(target)
    pick = counted.analytic_pick(target)[0]
    assert pick.step_overlap and pick.in_split == 3 and pick.in_tf32_parts == 3  # counted: three parts kept
    assert "step_overlap_tma 1" in counted.space(target).infeasible_reason(pick.replace(in_tf32_parts=2))
    assert counted.space(target).infeasible_reason(pick.replace(in_tf32_parts=2, step_overlap_tma=1)) is None
    space = t.space(target)
    assert space.make(**space.completed({k: v for k, v in three.items if k != "in_tf32_parts"})) == three


@pytest.mark.parametrize("shape,parts", [((64, 1024), 2), ((64, 2048), 2), ((16, 512), 3), ((256, 1024), 2)])
def test_pick_reads_two_tf32_parts_where_its_gemm_is_not_counted(shape, parts):
    """The pick stores x's and W_ih's TF32 parts once each where its input GEMM runs ahead of the
    steps, and keeps three where a step kernel counts the GEMM's stored rows."""
    batch, hidden = shape
    target = offline_cuda()
    t = GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=128).with_tensor_cores(target)
    cfg, why = t.analytic_pick(target)
    assert cfg.in_split == 3 and cfg.in_tf32_parts == parts
    assert ("TF32 parts stored once each and read in turn by the TMA" in why) == (parts == 2)


def _kernel_body(source: str, name: str) -> str:
    start = re.search(rf"{name}\([^)]*\) \{{", source).end()
    return source[start:source.index("\n}\n", start)]


def test_split_range():
    assert split_range_reason("x", np.array([1.0, -65000.0])) is None
    assert "65504" in split_range_reason("x", np.array([1.0, -70000.0]))
    assert split_range_reason("w", np.array([200.0]), SPLIT_WEIGHT_SCALE) is None
    assert "255.875" in split_range_reason("w", np.array([-300.0]), SPLIT_WEIGHT_SCALE)
    assert split_range_reason("w", np.array([np.nan]), SPLIT_WEIGHT_SCALE)  # NaN is refused, not split
    assert FLOAT16_MAX == float(np.finfo(np.float16).max)


@pytest.mark.parametrize("shape,split", [((64, 1024), 3), ((8, 512), 3), ((1, 256), 0), ((5, 200), 0)])
def test_pick_splits_large_input_gemms(shape, split):
    """The pick splits layer 0's input GEMM from 1 GFLOP on (H100: B8 H512 0.044 ms against
    0.071, B1 H256 no gain), on CUDA only: into TF32 parts on wgmma on Hopper (float32's range),
    else into float16 parts on an mma.sync tile."""
    from tvm_ext.schedules.gru.pick import SPLIT_MIN_FLOPS

    batch, hidden = shape
    t = GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=128)
    target = offline_cuda()
    cfg, why = t.with_tensor_cores(target).analytic_pick(target)
    assert cfg.in_split == split and (t.input_gemm(0).flops() >= SPLIT_MIN_FLOPS) == bool(split)
    assert ("TF32 parts" in why) == (split == 3) and ("wgmma" in why) == (split == 3)
    ampere = offline_cuda("sm_80")
    assert t.with_tensor_cores(ampere).analytic_pick(ampere)[0].in_split == min(split, 1)
    gpu_like = dataclasses.replace(target, kind="opencl", arch="")  # a GPU without float16 tensor cores
    assert t.with_tensor_cores(gpu_like).analytic_pick(gpu_like)[0].in_split == 0


def test_pick_keeps_float32_on_the_cuda_cores_where_only_a_padded_tile_fits():
    """H1000's split GEMM (3000 gates, depth 3 x 1000) fits no tile whole: the GEMM template
    would pad it, but the GRU takes no padded tile (float16 parts on one measured 8x less
    accurate than the float32 GEMM at B32-B64 H1000), so its float32 GEMM stays unsplit."""
    from tvm_ext.schedules.gemm.mma import pick_mma_tile
    from tvm_ext.schedules.gru.split import PARTS, split_depth

    target = offline_cuda()
    t = GruTemplate(batch=64, hidden=1000, input=1000, seq=128).with_tensor_cores(target)
    assert t.in_split_tensor_core is None and t.in_split_tf32 is None
    assert t.analytic_pick(target)[0].in_split == 0
    gemm = (128 * 64, 3000, PARTS * split_depth(1000))
    assert pick_mma_tile(*gemm, "float16", "float32", "float16", target, split_k=False) is not None


def test_cli_tunes_the_gru_with_the_tiles_gru_build_uses(tmp_path):
    """``tune gru`` on CUDA tunes the template with its target's tiles (``for_target``), so its
    pick splits the input GEMM as ``GRU.build``'s does (offline: H100 limits, no GPU needed)."""
    import json
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "gru", "--batch", "64", "--hidden", "1024", "--input",
                        "1024", "--seq", "128", "--target", "cuda", "--strategy", "analytic", "--no-measure", "--json",
                        "--records", str(tmp_path / "r.jsonl")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    pick = json.loads(p.stdout)
    if "no CUDA GPU" in p.stderr:  # the H100's limits (on a GPU machine: that GPU's, whichever it is)
        assert pick["config"]["in_split"] == 3 and "in_split_tf32=wgmma tf32 128x192x32" in pick["description"]
    template = GruTemplate(batch=64, hidden=1024, input=1024, seq=128)
    assert template.for_target(offline_cuda()) == template.with_tensor_cores(offline_cuda())


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
# shapes whose gate count (dirs x 3H) a tensor-core tile divides; input sizes that pad
SPLIT_SHAPES = {"b16-h256": Shape(seq=12, batch=16, input=256, hidden=256),
                "input40-h256": Shape(seq=9, batch=5, input=40, hidden=256),
                "input33-h128-2layer-bi": Shape(seq=7, batch=3, input=33, hidden=128, layers=2, bidirectional=True),
                "input200-h512": Shape(seq=13, batch=5, input=200, hidden=512),
                "b8-t8-input40-h256": Shape(seq=8, batch=8, input=40, hidden=256)}


@pytest.mark.gpu
@pytest.mark.parametrize("split,parts", [(1, 3), (2, 3), (3, 3), (3, 2)],
                         ids=["mma", "wgmma", "wgmma-tf32", "wgmma-tf32-two-parts"])
@pytest.mark.parametrize("key", list(SPLIT_SHAPES))
def test_cuda_split_input_gemm_matches_the_reference(key, split, parts):
    """The pick with the input GEMM split (every layer's, odd K and N included) on an mma.sync
    tile and on wgmma, float16 or TF32 parts (where a wgmma tile divides the rows), the TF32 ones
    stored three or two deep (``in_tf32_parts``): float64's answer on reruns."""
    s = SPLIT_SHAPES[key]
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch,
                    seq=s.seq)
    if split >= 2 and (gru.template.in_split_wgmma, gru.template.in_split_tf32)[split - 2] is None:
        assert (s.seq * s.batch) % 64  # no wgmma tile for these rows
        return
    knobs = dict(in_split=split, in_tf32_parts=parts)
    if parts == 2 and gru.config.step_overlap:
        knobs["step_overlap_tma"] = 1  # two parts are read by the TMA
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch,
                    seq=s.seq, config=gru.config.replace(**knobs)).load_numpy(_weights(s))
    assert "gru_split_x0" in {c.func for c in gru.compiled.calls}
    _check(gru, s, runs=2)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [Shape(seq=32, batch=16, input=512, hidden=512),
                                   Shape(seq=16, batch=8, input=80, hidden=128, layers=3, bidirectional=True)],
                         ids=["b16-h512-counted", "input80-h128-3layer-bi"])
def test_cuda_two_tf32_parts_match_the_reference(shape):
    """The input GEMM of TF32 parts stored once each and read in turn (``in_tf32_parts`` 2): a
    GEMM counted by the step kernel (its tile loaded by the TMA), and three bidirectional layers
    whose input GEMMs differ in depth (80 padded to 96, then 256): float64's answer on reruns."""
    s = shape
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch,
                    seq=s.seq)
    knobs = dict(in_split=3, in_tf32_parts=2, **({"step_overlap_tma": 1} if gru.config.step_overlap else {}))
    assert bool(gru.config.step_overlap) == (s.batch == 16)
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch,
                    seq=s.seq, config=gru.config.replace(**knobs)).load_numpy(_weights(s))
    assert gru.template.stored_parts(gru.config) == 2
    _check(gru, s, runs=2)


@pytest.mark.gpu
@pytest.mark.parametrize("split,parts", [(1, 3), (3, 3), (3, 2)], ids=["mma", "wgmma-tf32", "wgmma-tf32-two-parts"])
def test_cuda_split_weights_prepared_once_measured_by_the_runner(split, parts):
    """Two layers, the input GEMM split: W_ih's parts made as the weights are loaded, the pass
    without them; new weights give their own answer; the tuner's runner prepares them from each
    input set's weights before checking against float64 (a pass on unprepared, NaN-poisoned
    parts would fail) and times the pass alone."""
    from tvm_ext.measure.builder import build_one
    from tvm_ext.measure.measure import MeasureSettings, measure

    s = Shape(seq=16, batch=8, input=40, hidden=256, layers=2)
    common = dict(num_layers=s.layers, batch=s.batch, seq=s.seq)
    pick = GRU.build("cuda", s.input, s.hidden, **common).config
    knobs = dict(in_split=split, in_tf32_parts=parts, **({"step_overlap_tma": 1} if pick.step_overlap else {}))
    gru = GRU.build("cuda", s.input, s.hidden, config=pick.replace(**knobs), **common)
    assert gru.executor.prepared == 2 and not any(n.startswith("gru_split_w") for n in gru.executor.names[2:])
    for seed in (1, 2):
        weights = _weights(s, seed)
        gru.load_numpy(weights)
        x, h0 = _inputs(s, seed)
        ref = gru_reference(x, weights, h0, s.layers, s.bidirectional)
        assert relative_error(list(gru(x, h0)), ref) < 1e-5
    template, cfg = gru.template, gru.config
    build = build_one(template, cfg, gru.target)
    assert build.ok, build.error_msg
    result = measure(template, cfg, build.artifact, gru.target, MeasureSettings(warmup=1, repeat=2))
    assert result.ok, result.error_msg
    assert result.metrics["rel_error"] < 1e-5


@pytest.mark.gpu
def test_cuda_split_refuses_values_it_cannot_hold():
    s = SPLIT_SHAPES["b16-h256"]
    gru = GRU.build("cuda", s.input, s.hidden, batch=s.batch, seq=s.seq, config={"in_split": 1})
    weights = _weights(s)
    with pytest.raises(TvmExtError, match="weight_ih_l0 has"):
        gru.load_numpy({**weights, "weight_ih_l0": weights["weight_ih_l0"] * 1e4})
    gru.load_numpy(weights)
    x, h0 = _inputs(s)
    with pytest.raises(TvmExtError, match="GRU input x has"):
        gru(x * 1e5, h0)


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [1e5, 1e-6])
def test_cuda_tf32_split_holds_what_float16_parts_cannot(scale):
    """x times ``scale`` and W_ih divided by it (the same products): float16 parts refuse the
    weights (and x at 1e5), TF32 parts (in_split 3) give float64's answer to float32's order."""
    from tvm_ext.schedules.gru import gru_reference

    s = SPLIT_SHAPES["b16-h256"]
    weights = _weights(s)
    weights = {**weights, "weight_ih_l0": weights["weight_ih_l0"] / np.float32(scale)}
    x, h0 = _inputs(s)
    x = x * np.float32(scale)
    half = GRU.build("cuda", s.input, s.hidden, batch=s.batch, seq=s.seq, config={"in_split": 2})
    with pytest.raises(TvmExtError, match=r"beyond what its float16 parts hold \([^)]*\); build without in_split"):
        half.load_numpy(weights)(x, h0)  # W_ih's scaled parts at 1e-6, x's at 1e5
    gru = GRU.build("cuda", s.input, s.hidden, batch=s.batch, seq=s.seq, config={"in_split": 3}).load_numpy(weights)
    assert gru.config.in_split == 3
    ref_out, ref_h = gru_reference(x, weights, h0, s.layers, s.bidirectional)
    for _ in range(2):
        out, h_n = gru(x, h0)
        for got, ref in ((out, ref_out), (h_n, ref_h)):
            assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
