"""Relax 8-bit float matmuls on Hopper's wgmma (``tasks.match_fp8``): a quantized ``Linear``
(``matmul(x, permute_dims(w))`` of e4m3 or e5m2 tensors, its per-tensor scales, a bias and the
cast after it) is rewritten to read the weight as stored (``relax_rewrites``'s
``fp8_weight_rows``), matched to the 8-bit wgmma template with that epilogue, and compiled with
the template's kernel in the function's place.

CI (no GPU): the rewrite (and the rewritten model built for the CPU against float64), the match
and its refusals, and the CUDA of the compiled model for an offline sm_90 target.  ``-m gpu``:
the compiled model against float64 numpy.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tvm_ext.core.template import Workload
from tvm_ext.relax.pipeline import build_model, compile_relax, extract_tasks, legalize_and_fuse, match_tasks
from tvm_ext.relax.tvm_export import OPERATORS_FILE

M, N, K = 128, 192, 256


def quantized_linear(dtype: str = "float8_e4m3fn", weight_transposed: bool = True, out_dtype: str = "float16",
                     lead: tuple[int, ...] = ()):
    """``astype((x · wᵀ) x sx x sw + bias, out_dtype)``, x (*lead, M, K) and w (N, K) 8-bit (or,
    without ``weight_transposed``, w given as (K, N) and multiplied as it is)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((*lead, M, K), dtype))
    w = relax.Var("w", relax.TensorType((N, K) if weight_transposed else (K, N), dtype))
    sx, sw = (relax.Var(name, relax.TensorType((), "float32")) for name in ("sx", "sw"))
    bias = relax.Var("bias", relax.TensorType((N,), "float32"))
    with bb.function("main", [x, w, sx, sw, bias]):
        with bb.dataflow():
            b = bb.emit(relax.op.permute_dims(w)) if weight_transposed else w
            y = bb.emit(relax.op.matmul(x, b, out_dtype="float32"))
            y = bb.emit(relax.op.multiply(relax.op.multiply(y, sx), sw))
            out = bb.emit_output(relax.op.astype(relax.op.add(y, bias), out_dtype))
        bb.emit_func_output(out)
    return bb.get()


def _matmul_task(mod, target):
    (task,) = [t for t in extract_tasks(legalize_and_fuse(mod), target) if "matmul" in t.task_name]
    return task


def test_the_transposed_weight_is_read_as_stored_with_the_scales_bias_and_cast_in_one_function():
    from tvm_ext.target import offline_cuda

    from tvm import tirx

    lowered = legalize_and_fuse(quantized_linear())
    funcs = {gv.name_hint: f for gv, f in lowered.functions_items() if isinstance(f, tirx.PrimFunc)}
    assert not [name for name in funcs if "transpose" in name]  # no kernel of its own, no [k, n] copy
    (name,) = funcs
    script = funcs[name].script()
    assert re.search(r"T\.reads\(x\[v_\w+, v_k\], w\[v_\w+, v_k\]\)", script), script  # w[n, k] as stored
    assert script.count("T_multiply") >= 2 and "T_add" in script and 'T.Cast("float16"' in script
    assert len(extract_tasks(lowered, offline_cuda())) == 1


def _inputs(lead: tuple[int, ...]) -> tuple[list[np.ndarray], np.ndarray]:
    """8-bit x and w, the scales and a bias; the float64 result of the quantized Linear."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    x = rng.standard_normal((*lead, M, K)).astype(ml_dtypes.float8_e4m3fn)
    w = rng.standard_normal((N, K)).astype(ml_dtypes.float8_e4m3fn)
    sx, sw = np.array(0.5, np.float32), np.array(0.25, np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    ref = x.astype(np.float64) @ w.astype(np.float64).T * 0.5 * 0.25 + bias  # bias along each row
    return [x, w, sx, sw, bias], ref


@pytest.mark.parametrize("lead", [(), (2,)])
def test_the_rewritten_linear_computes_the_models_result(lead):
    """The rewritten model built for the CPU (TVM's LLVM backend computes 8-bit floats) against
    float64: the weight read as stored is still the transposed weight the model multiplies by."""
    import tvm
    from tvm import relax

    inputs, ref = _inputs(lead)
    vm = relax.VirtualMachine(tvm.compile(legalize_and_fuse(quantized_linear(lead=lead)), target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy().astype(np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3  # the float16 output's rounding


@pytest.mark.parametrize("dtype,fmt,lead", [("float8_e4m3fn", "e4m3", ()), ("float8_e5m2", "e5m2", ()),
                                            ("float8_e4m3fn", "e4m3", (2,))])
def test_an_8bit_linear_matches_the_fp8_template_with_its_epilogue(dtype, fmt, lead):
    """Activations with a batch axis ((batch, tokens, features)) share the weight: the template's
    ``batch``."""
    from tvm_ext.target import offline_cuda

    cuda = offline_cuda()
    (match,) = match_tasks([_matmul_task(quantized_linear(dtype, lead=lead), cuda)], cuda)
    assert match.matcher == "fp8" and match.substitutes, match.reason
    t = match.template
    assert (t.name, t.m, t.n, t.k, t.fp8, t.out_dtype, t.batch) == ("gemm_fp8", M, N, K, fmt, "float16", lead)
    expr = match.site.epilogue.expr.script()
    assert str(match.site.epilogue.expr.ty) == "float32"
    assert "sx[()]" in expr and "sw[()]" in expr and "bias[" in expr, expr  # the model's scales and bias


def test_an_8bit_matmul_that_cannot_go_on_8bit_wgmma_says_why(opencl):
    from tvm_ext.relax.tasks import NoMatch, match_fp8
    from tvm_ext.target import offline_cuda

    cuda = offline_cuda()
    (kn,) = match_tasks([_matmul_task(quantized_linear(weight_transposed=False), cuda)], cuda)
    assert not kn.matched and "K-major only" in kn.reason, kn.reason
    func = _matmul_task(quantized_linear(), cuda).dispatched[0]["main"]
    assert "Hopper" in match_fp8(func, offline_cuda("sm_80")).reason
    assert isinstance(match_fp8(func, opencl), NoMatch)
    (f32,) = match_tasks([_matmul_task(quantized_linear(out_dtype="float32"), cuda)], cuda)
    assert not f32.matched and "float16 or bfloat16" in f32.reason


def _operators(match, target, directory) -> str:
    entries = {Workload.of(match.template, target).key: {"config": match.template.default_config(target).as_dict()}}
    directory.mkdir(exist_ok=True)
    (directory / OPERATORS_FILE).write_text(json.dumps({"version": 1, "operators": entries}))
    return str(directory)


@pytest.mark.parametrize("lead", [(), (2,)])
def test_the_compiled_model_runs_the_8bit_wgmma_kernel_with_the_scales_in_its_store(tmp_path, lead):
    from tvm_ext.target import offline_cuda

    cuda = offline_cuda()
    mod = quantized_linear(lead=lead)
    (match,) = match_tasks([_matmul_task(mod, cuda)], cuda)
    compiled = compile_relax(mod, cuda, _operators(match, cuda, tmp_path / "db"), log=None)
    func = compiled[match.name]
    assert str(func.attrs["target"].attrs["arch"]) == "sm_90a" and bool(func.attrs["tirx.is_scheduled"])
    ex = build_model(compiled, cuda)
    sources = [m.inspect_source() for m in ex.mod.imports[0].imports]
    (fp8,) = [s for s in sources if "wgmma.mma_async" in s]
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3", fp8)
    kernel = fp8[re.search(rf"__global__ void[^\n;]*{match.name}_kernel\([^\n;]*\{{", fp8).start():]
    body = kernel[:kernel.index("\n}\n")]
    assert "sx_ptr[0]" in body and "sw_ptr[0]" in body and "bias_ptr[" in body  # the model's epilogue, stored
    assert "scale_ab" not in body


@pytest.mark.gpu
@pytest.mark.parametrize("lead", [(), (2,)])
def test_an_8bit_linear_on_the_gpu_matches_float64(tmp_path, lead):
    """On the GPU machine: the quantized Linear compiled with the 8-bit wgmma kernel (default
    config) against float64 numpy of the same 8-bit values."""
    from tvm_ext.relax.pipeline import CompiledModel
    from tvm_ext.target import resolve_target

    cuda = resolve_target("cuda")
    mod = quantized_linear(lead=lead)
    (match,) = match_tasks([_matmul_task(mod, cuda)], cuda)
    assert match.matcher == "fp8", match.reason
    inputs, ref = _inputs(lead)
    model = CompiledModel(compile_relax(mod, cuda, _operators(match, cuda, tmp_path / "db"), log=None), cuda)
    sources = "".join(m.inspect_source() for m in model.executable.mod.imports[0].imports)
    assert "e4m3.e4m3" in sources  # the 8-bit wgmma kernel runs
    out = np.asarray(model(*inputs), dtype=np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3
