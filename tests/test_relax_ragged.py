"""A 16-bit ``Linear`` whose even N no wgmma tile divides (a vocabulary, 1000 classes) on Hopper:
``relax_rewrites``'s ``ragged_weight_rows`` makes the matmul read its weight (N, K) as stored
(``narrow_weight_rows`` likewise where that layout's pick is the warp-specialized narrow tile),
so the wgmma matcher takes it with B read K-major and the last tile column guarded; where the
target has no wgmma, the rows are too few for a 64-row tile, N is odd or a multiple of 64, the
model is left as it was (mma.sync, B stored (K, N)).

CI (no GPU): the rewrite and where it is not made, the match, the CUDA of the compiled model for
an offline sm_90 target.  ``-m gpu``: the compiled model against float64 numpy.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tvm_ext.core.template import Workload
from tvm_ext.relax.pipeline import build_model, compile_relax, extract_tasks, legalize_and_fuse, match_tasks
from tvm_ext.relax.tvm_export import OPERATORS_FILE
from tvm_ext.target import offline_cuda

K = 128


def linear(n: int, rows: int, dtype: str = "float16", k: int = K):
    """``x · wᵀ + bias``, x (rows, k), w (n, k) as a ``Linear`` stores it, all ``dtype``."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, k), dtype))
    w = relax.Var("w", relax.TensorType((n, k), dtype))
    bias = relax.Var("bias", relax.TensorType((n,), dtype))
    with bb.function("main", [x, w, bias]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.op.permute_dims(w)))
            out = bb.emit_output(relax.op.add(y, bias))
        bb.emit_func_output(out)
    return bb.get()


def _matches(mod, target):
    lowered = legalize_and_fuse(mod, target)
    return lowered, match_tasks(extract_tasks(lowered, target or offline_cuda()), target or offline_cuda())


@pytest.mark.parametrize("n, rows, kept", [
    (1000, 256, False), (30522, 96, False),  # ragged N, rows enough: read as stored
    (1000, 8, True), (29, 256, True), (1024, 256, True),  # a 64-row tile mostly empty, an odd N, N divided
    (10, 256, True),  # 10 classes: a 64-column tile mostly empty (mma.sync's 32-wide tiles take it)
])
def test_the_weight_is_read_as_stored_where_wgmma_takes_the_ragged_n(n, rows, kept):
    lowered, matches = _matches(linear(n, rows), offline_cuda())
    matmul = [m for m in matches if "matmul" in m.name]
    assert len(matmul) == 1
    (match,) = matmul
    script = lowered[match.name].script()
    as_stored = bool(re.search(r"w\[v_\w+, v_k\]", script))
    assert as_stored == (not kept), script
    if not kept:
        assert match.matcher == "wgmma" and match.template.b_layout == "NK" and match.template.n == n, match.reason
    assert "T_add" in script or not as_stored  # the bias joins the matmul's function


@pytest.mark.parametrize("n, rows, k, dtype, kept", [
    (768, 1024, 768, "float16", False), (768, 768, 768, "bfloat16", False),  # BERT-base's projections
    (3072, 1024, 768, "float16", True),  # its FFN up: a wider tile takes (K, N)
    (768, 1024, 3072, "float16", False),  # its FFN down: the narrow tile at 48 k steps, K whole
    (768, 128, 768, "float16", True),  # a few rows: the narrow tile is not the pick
])
def test_the_weight_is_read_as_stored_where_the_narrow_pick_is_warp_specialized(n, rows, k, dtype, kept):
    """``narrow_weight_rows``: where the wgmma pick with Bt stored (N, K) is the warp-specialized
    narrow tile, the matmul reads the ``Linear``'s weight as stored and gets that kernel; elsewhere
    B stays (K, N) as the model wrote it."""
    lowered, matches = _matches(linear(n, rows, dtype, k), offline_cuda())
    (match,) = [m for m in matches if "matmul" in m.name]
    assert match.matcher == "wgmma", match.reason
    assert match.template.b_layout == ("KN" if kept else "NK")
    assert bool(match.template.default_config(offline_cuda()).as_dict()["wgmma_ws"]) == (not kept)


@pytest.mark.parametrize("target", [offline_cuda("sm_80"), None])
@pytest.mark.parametrize("n, rows, k", [(1000, 256, K), (768, 1024, 768)])
def test_without_wgmma_the_model_is_left_as_it_was(target, n, rows, k):
    lowered, _ = _matches(linear(n, rows, k=k), target)
    assert not [gv for gv, _ in lowered.functions_items() if "weight_rows" in gv.name_hint]


def linear_constant(weight, rows: int):
    """``x · weight + bias`` with ``weight`` a constant ``[k, n]``, as TVM imports an ONNX ``MatMul``
    on a ``Linear``'s initializer (the exporter folds the transpose into it)."""
    from tvm import relax

    k, n = weight.shape
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, k), "float16"))
    bias = relax.Var("bias", relax.TensorType((n,), "float16"))
    with bb.function("main", [x, bias]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(weight, "float16")))
            out = bb.emit_output(relax.op.add(y, bias))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("n, rows, k, kept", [(768, 1024, 768, False), (1000, 256, K, False), (3072, 1024, 768, True)])
def test_a_constant_weight_is_transposed_once_and_read_as_stored_where_a_rule_takes_it(n, rows, k, kept):
    """A constant ``[k, n]`` weight under the narrow or the ragged rule is transposed at the
    rewrite and read as stored (the match: Bt (N, K)); the rewritten model computes what the
    model did (built for the CPU and run against float64 numpy)."""
    import tvm
    from tvm import relax

    from tvm_ext.relax.relax_rewrites import rewrite_model

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float16)
    mod = linear_constant(weight, rows)
    _, matches = _matches(mod, offline_cuda())
    (match,) = [m for m in matches if "matmul" in m.name]
    assert match.template.b_layout == ("KN" if kept else "NK"), match.reason
    if kept:
        return
    rewritten = rewrite_model(mod, offline_cuda())
    assert "matmul_weight_rows" in rewritten.script()
    vm = relax.VirtualMachine(tvm.compile(rewritten, target="llvm"), tvm.cpu())
    x, bias = rng.standard_normal((rows, k)).astype(np.float16), rng.standard_normal(n).astype(np.float16)
    out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(bias)).numpy().astype(np.float64)
    ref = x.astype(np.float64) @ weight.astype(np.float64) + bias
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3


def linear_transposed_constant(weight, rows: int):
    """``x · weightᵀ`` with ``weight`` a constant ``[n, k]`` as a ``Linear`` stores it (a ``.pt2``
    import's head), float16."""
    from tvm import relax

    n, k = weight.shape
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, k), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.op.permute_dims(relax.const(weight, "float16"))))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("n, transposed, padded", [
    (29, True, True), (29, False, True), (10, True, True),  # rows of 58 and 20 bytes: padded to 32 columns
    (24, True, False), (40, False, False),  # whole 16-byte rows; wider than a 32-column tile
])
def test_a_narrow_constant_weight_of_ragged_rows_is_padded_to_32_columns(n, transposed, padded):
    """``narrow_padded_columns``: a 16-bit matmul by a constant weight narrower than 32 columns
    whose rows are no whole 16 bytes (a speech model's 29 classes) multiplies by the weight padded
    with zero columns to 32, whose rows a GEMM reads 16 bytes at a time, and takes the first n
    columns (a gather, not fused into the GEMM's store): the GEMM matched is N = 32 on mma.sync,
    and the model computes what it did (built for the CPU,
    against float64 numpy); whole rows and wider weights are left as they were."""
    import tvm
    from tvm import relax

    from tvm_ext.relax.relax_rewrites import rewrite_model

    rows, k = 256, K
    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float16)
    mod = linear_transposed_constant(weight, rows) if transposed else linear_constant(weight.T.copy(), rows)
    _, matches = _matches(mod, offline_cuda())
    (match,) = [m for m in matches if "matmul" in m.name]
    assert match.template.n == (32 if padded else n), match.reason
    assert match.matcher == "tensor_core" or not padded  # B (K, N) of 32 columns: mma.sync's tiles
    rewritten = rewrite_model(mod, offline_cuda())
    assert ("R.take" in rewritten.script()) == padded
    args = [tvm.runtime.tensor(rng.standard_normal((rows, k)).astype(np.float16))]
    if not transposed:
        args.append(tvm.runtime.tensor(np.zeros(n, np.float16)))
    vm = relax.VirtualMachine(tvm.compile(rewritten, target="llvm"), tvm.cpu())
    out = vm["main"](*args).numpy().astype(np.float64)
    ref = args[0].numpy().astype(np.float64) @ weight.T.astype(np.float64)
    assert out.shape == (rows, n) and np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3


def _operators(match, target, directory) -> str:
    entries = {Workload.of(match.template, target).key: {"config": match.template.default_config(target).as_dict()}}
    directory.mkdir(exist_ok=True)
    (directory / OPERATORS_FILE).write_text(json.dumps({"version": 1, "operators": entries}))
    return str(directory)


def test_the_compiled_model_runs_the_guarded_wgmma_kernel_with_its_bias(tmp_path):
    cuda = offline_cuda()
    mod = linear(1000, 256)
    _, matches = _matches(mod, cuda)
    (match,) = [m for m in matches if m.matcher == "wgmma"]
    compiled = compile_relax(mod, cuda, _operators(match, cuda, tmp_path / "db"), log=None)
    ex = build_model(compiled, cuda)
    (wgmma,) = [s for s in (m.inspect_source() for m in ex.mod.imports[0].imports) if "wgmma.mma_async" in s]
    kernel = wgmma[re.search(rf"__global__ void[^\n;]*{match.name}_kernel\([^\n;]*\{{", wgmma).start():]
    body = kernel[:kernel.index("\n}\n")]
    assert "% 1000)" in body and "bias_ptr[" in body  # Bt's rows below N
    # C staged (1000 is a multiple of 8): its 16-byte chunks stored below N only (8 x 125)
    assert re.search(r"if \(.*< 125\) \{\n\s*\*\(uint4\*\)\(C_ptr", body), body[-600:]


@pytest.mark.gpu
@pytest.mark.parametrize("n, rows", [(1000, 256), (30522, 200)])
def test_a_ragged_linear_on_the_gpu_matches_float64(tmp_path, n, rows):
    """On the GPU machine: the Linear compiled with the wgmma kernel (default config, Bt read as
    stored) against float64 numpy of the same float16 values."""
    from tvm_ext.relax.pipeline import CompiledModel
    from tvm_ext.target import resolve_target

    cuda = resolve_target("cuda")
    mod = linear(n, rows)
    _, matches = _matches(mod, cuda)
    (match,) = [m for m in matches if m.matcher == "wgmma"]
    model = CompiledModel(compile_relax(mod, cuda, _operators(match, cuda, tmp_path / "db"), log=None), cuda)
    rng = np.random.default_rng(0)
    x, w, bias = (rng.standard_normal(s).astype(np.float16) for s in ((rows, K), (n, K), (n,)))
    ref = x.astype(np.float64) @ w.astype(np.float64).T + bias
    for _ in range(2):
        out = np.asarray(model(x, w, bias), dtype=np.float64)
        assert np.isfinite(out).all()
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3
