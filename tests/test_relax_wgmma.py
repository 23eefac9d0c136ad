"""Relax float16 matmuls on Hopper's warpgroup MMA (``tvm_ext.relax.relax_wgmma``): the wgmma matcher
takes a task's matmul with its fused epilogue, ``tune_relax`` exports its tuned config to the
operators file, and ``compile_relax`` puts the wgmma kernel, the epilogue composed into its store,
in the function's place.

CI (no GPU): the BERT-base layer's float16 projections and attention's batched products match,
their epilogues compose (bias, GELU, residual, the scores' scaling) into float32 expressions, and
the Relax build for an offline sm_90 target emits wgmma kernels named after the tasks with those
epilogues, only where the operators file has a config; targets without wgmma keep the mma.sync
template.  ``-m gpu``: the layer compiled with the substituted kernels against float64 numpy.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re

import numpy as np
import pytest

from tvm_ext.relax.pipeline import build_model, compile_relax, extract_tasks, legalize_and_fuse, match_tasks
from tvm_ext.core.template import Workload
from tvm_ext.relax.tvm_export import OPERATORS_FILE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# lowered for Hopper: the 768-column projections read their Linear's weight (N, K) as stored
# (``narrow_weight_rows``: their pick is the warp-specialized narrow tile), the others (K, N)
PROJECTIONS = {  # BERT-base (batch 8, sequence 128) float16: task -> (M, N, K), its epilogue's parameters
    "fused_matmul_weight_rows_cast_add": ((1024, 768, 768), 1),  # Q, K, V: bias
    "fused_matmul_weight_rows_cast_add_add1": ((1024, 768, 768), 2),  # attention output: bias, residual
    "fused_matmul2_cast3_add2_gelu": ((1024, 3072, 768), 1),  # feed-forward in: bias, GELU
    "fused_matmul_weight_rows1_cast_add_add1": ((1024, 768, 3072), 2),  # feed-forward out: bias, residual
}
ATTENTION = {  # (batch, heads) products, B the keys transposed / the values, stored (K, N): (M, N, K)
    "fused_matmul_cast1_divide": (128, 128, 64),  # scores Q·Kᵀ / sqrt(64)
    "fused_matmul1_cast2": (128, 64, 128),  # context P·V
}


@pytest.fixture(scope="module")
def bert():
    spec = importlib.util.spec_from_file_location("wgmma_bert_layer", os.path.join(ROOT, "examples", "bert_layer.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def base(bert):
    return bert.get_module(size="base", dtype="float16")


def _operators(matches, target, directory, **knobs) -> str:
    """An operators file holding each wgmma task's default config (what ``tune_relax`` exports
    after tuning), ``knobs`` set in it; the folder."""
    entries = {Workload.of(m.template, target).key: {"config": {**m.template.default_config(target).as_dict(), **knobs}}
               for m in matches if m.substitutes}
    directory.mkdir(exist_ok=True)
    (directory / OPERATORS_FILE).write_text(json.dumps({"version": 1, "operators": entries}))
    return str(directory)


def test_the_projections_and_attentions_batched_products_match_wgmma(base):
    from tvm_ext.target import offline_cuda

    cuda = offline_cuda()
    matches = {m.name: m for m in match_tasks(extract_tasks(legalize_and_fuse(base, cuda), cuda), cuda)}
    for name, ((m, n, k), extras) in PROJECTIONS.items():
        match = matches[name]
        assert match.matcher == "wgmma" and match.substitutes, (name, match.reason)
        t = match.template
        as_stored = "weight_rows" in name  # the weight (N, K) read K-major; else folded to (K, N), read N-major
        assert (t.m, t.n, t.k, t.b_layout) == (m, n, k, "NK" if as_stored else "KN")
        assert t.default_config(cuda).wgmma_ws == int(as_stored)
        expr = match.site.epilogue.expr
        assert str(expr.ty) == "float32"  # float16 additions run in float32, one rounding at the store
        assert expr.script().count("param_") + expr.script().count("lv") >= extras
    assert "T.erf" in matches["fused_matmul2_cast3_add2_gelu"].site.epilogue.expr.script()
    for name, (m, n, k) in ATTENTION.items():
        match = matches[name]
        assert match.matcher == "wgmma" and match.substitutes, (name, match.reason)
        t = match.template
        assert (t.m, t.n, t.k, t.b_layout, t.batch, t.b_shared) == (m, n, k, "KN", (8, 12), False)
        assert len(match.site.epilogue.lead) == 2
    scores = matches["fused_matmul_cast1_divide"].site.epilogue
    assert scores.expr.script() == 'T.Cast("float32", acc) / T.float32(8.0)'  # the scaling, in float32


def test_targets_without_wgmma_keep_the_mma_sync_template(base):
    from tvm_ext.relax.tasks import match_wgmma
    from tvm_ext.target import offline_cuda

    ampere = offline_cuda("sm_80")
    lowered = legalize_and_fuse(base, ampere)  # every weight as the model wrote it, (K, N)
    matches = match_tasks(extract_tasks(lowered, ampere), ampere)
    projections = [m for m in matches if not getattr(m.template, "batch", None) and "matmul" in m.name]
    assert sorted((m.template.m, m.template.n, m.template.k) for m in projections) == \
        sorted(shape for shape, _ in PROJECTIONS.values())
    assert all(m.matcher == "tensor_core" for m in projections)
    refused = match_wgmma(lowered["fused_matmul_cast_add"], ampere)
    assert "Hopper" in refused.reason


def test_compiled_model_runs_wgmma_kernels_with_the_epilogues_where_the_database_has_a_config(base, tmp_path):
    from tvm_ext.target import offline_cuda

    cuda = offline_cuda()
    matches = match_tasks(extract_tasks(legalize_and_fuse(base, cuda), cuda), cuda)
    untuned = compile_relax(base, cuda, None, log=None)
    assert all(untuned[name].attrs.get("target") is None for name in PROJECTIONS)  # no config, no kernel
    compiled = compile_relax(base, cuda, _operators(matches, cuda, tmp_path / "db"), log=None)
    for name in {**PROJECTIONS, **ATTENTION}:
        func = compiled[name]
        assert str(func.attrs["target"].attrs["arch"]) == "sm_90a" and bool(func.attrs["tirx.is_scheduled"])
        assert len(func.params) == len(legalize_and_fuse(base, cuda)[name].params)  # same call, same arguments
    ex = build_model(compiled, cuda)
    sources = [m.inspect_source() for m in ex.mod.imports[0].imports]
    (wgmma,) = [s for s in sources if "wgmma.mma_async" in s]  # the sm_90a module
    for name in {**PROJECTIONS, **ATTENTION}:
        assert f"{name}_kernel" in wgmma
    definition = re.search(r"__global__ void[^\n;]*fused_matmul2_cast3_add2_gelu_kernel\([^\n;]*\{", wgmma)
    gelu = wgmma[definition.start():]
    assert "erff(" in gelu[:gelu.index("\n}\n")]  # GELU in the store of its GEMM


def _layer_norm_kernel(compiled) -> str:
    """A function of the compiled layer TVM's default schedules run (not ours): a layer norm."""
    return next(gv.name_hint for gv, _ in compiled.functions_items() if "layer_norm" in gv.name_hint)


def test_a_models_wgmma_kernels_launch_early_behind_the_kernel_ahead_and_no_other_kernel(base, tmp_path):
    """``build_model(..., launch_early=True)`` builds the compiled layer through the pipeline
    ``launch_early.pipeline_for`` picks: where the configs launch early (the picks' ``wgmma_pdl``),
    every wgmma kernel carries the launch tag and the layer's other kernels do not (they do not
    wait for the kernel ahead); with ``wgmma_pdl`` 0, TVM's default pipeline and no tag."""
    import tvm
    from test_wgmma_pdl import launch_params

    from tvm_ext.lowering.launch_early import LAUNCH_TAG, PIPELINE, is_marked, pipeline_for
    from tvm_ext.target import offline_cuda

    cuda = offline_cuda()
    matches = match_tasks(extract_tasks(legalize_and_fuse(base, cuda), cuda), cuda)
    wgmma = {**PROJECTIONS, **ATTENTION}
    assert all(m.template.default_config(cuda).wgmma_pdl == 1 for m in matches if m.name in wgmma)
    for pdl in (1, 0):
        operators = _operators(matches, cuda, tmp_path / f"db{pdl}", wgmma_pdl=pdl)
        compiled = compile_relax(base, cuda, operators, log=None)
        assert all(is_marked(compiled[name]) == bool(pdl) for name in wgmma)
        assert pipeline_for(compiled) == (PIPELINE if pdl else "default")
        names = [*wgmma, _layer_norm_kernel(compiled)]
        lowered = launch_params(tvm.IRModule({n: compiled[n].with_attr("global_symbol", n) for n in names}))
        tagged = {kernel.removesuffix("_kernel") for kernel, tags in lowered.items() if LAUNCH_TAG in tags}
        assert tagged == (set(wgmma) if pdl else set()), (pdl, tagged)


@pytest.fixture(scope="module")
def base32(bert):
    return bert.get_module(size="base", dtype="float32")


def test_float32_matmuls_match_3xtf32_and_batched_ones_keep_the_gemm_template(base32):
    """The float32 layer on Hopper: its four projection tasks take the 3xTF32 program (their bias,
    GELU and residual composed into its store); attention's batched products, which it has no
    batch axis for, and every float32 matmul off Hopper keep the GEMM template."""
    from tvm_ext.target import offline_cuda

    cuda = offline_cuda()
    matches = match_tasks(extract_tasks(legalize_and_fuse(base32), cuda), cuda)
    tf32 = [m for m in matches if m.matcher == "tf32"]
    assert sorted((m.template.m, m.template.n, m.template.k) for m in tf32) == \
        sorted(shape for shape, _ in PROJECTIONS.values())
    assert all(m.substitutes and m.template.b_layout == "KN" for m in tf32)
    assert sum("T.erf" in m.site.epilogue.expr.script() for m in tf32) == 1  # GELU in the FFN-up store
    batched = [m for m in matches if m.matcher == "gemm"]
    assert len(batched) == 2 and all(m.template.batch == 96 for m in batched)
    ampere = offline_cuda("sm_80")
    assert not any(m.matcher == "tf32" for m in match_tasks(extract_tasks(legalize_and_fuse(base32), ampere),
                                                             ampere))


def test_without_tf32_the_float32_projections_stay_on_the_gemm_template_and_in_the_compiled_model(base32, tmp_path):
    """A user who turns the ``tf32`` matcher off gets the CUDA-core GEMM template for every
    float32 matmul, and an operators file's 3xTF32 configs are not put in the model's place."""
    from tvm_ext.core.errors import TvmExtError
    from tvm_ext.relax.pipeline import substitute_kernels
    from tvm_ext.target import offline_cuda
    from tvm_ext.relax.tvm_export import read_operators

    cuda = offline_cuda()
    fused = legalize_and_fuse(base32)
    tasks = extract_tasks(fused, cuda)
    matches = match_tasks(tasks, cuda)
    without = match_tasks(tasks, cuda, without=("tf32",))
    assert {m.name for m in matches if m.matcher == "tf32"} == \
        {m.name for m in without if m.matcher == "gemm" and not m.template.batch}
    assert len([m for m in without if m.matcher == "gemm"]) == 6 and not any(m.matcher == "tf32" for m in without)
    operators = read_operators(_operators(matches, cuda, tmp_path / "db"))
    assert len(operators) == 3  # the 3xTF32 configs of the projections' three shapes

    def substituted(**kw) -> set[str]:
        mod = substitute_kernels(legalize_and_fuse(base32), cuda, operators, **kw)
        return {gv.name_hint for gv, f in mod.functions_items() if "tirx.is_scheduled" in (f.attrs or {})}

    assert substituted() == {m.name for m in matches if m.matcher == "tf32"}
    assert substituted(without=("tf32",)) == set()
    with pytest.raises(TvmExtError, match="unknown template matcher tf16: choose from tf32, gemm"):
        match_tasks(tasks, cuda, without=("tf16",))


def test_compiled_float32_model_splits_and_multiplies_on_tf32_in_each_projection(base32, tmp_path):
    from tvm_ext.target import offline_cuda

    cuda = offline_cuda()
    matches = match_tasks(extract_tasks(legalize_and_fuse(base32), cuda), cuda)
    slices = {m.name: m.template.default_config(cuda).wgmma_split_k for m in matches if m.matcher == "tf32"}
    assert sorted(slices.values()) == [1, 4, 4, 4]  # BERT's 768-column outputs split K: few tiles
    compiled = compile_relax(base32, cuda, _operators(matches, cuda, tmp_path / "db"), log=None)
    ex = build_model(compiled, cuda)
    (module,) = [m.inspect_source() for m in ex.mod.imports[0].imports if "wgmma.mma_async" in m.inspect_source()]
    for name, split in slices.items():  # each function: the split of A, the split of B (transposing tiles),
        # the TF32 GEMM, and with K split, the slices' sums added and the epilogue applied
        kernels = set(re.findall(rf"__global__ void[^\n;]*?({name}_kernel(?:_\d+)?)\(", module))
        assert len(kernels) == (3 if split == 1 else 4), (name, kernels)
    assert "tf32.tf32" in module  # the TF32 wgmma (one helper a width, shared by the functions)


def _layer_errors(bert, mod, dtype, marker, matches, cuda, tmp_path) -> tuple[float, float]:
    """The layer's error against float64 numpy compiled with the substituted kernels (their
    ``marker`` in its CUDA) and without them (TVM's own schedules)."""
    from tvm_ext.relax.pipeline import CompiledModel

    inputs = bert.get_inputs(size="base", dtype=dtype)
    ref = bert.reference(inputs, size="base", dtype=dtype)

    def error(database) -> float:
        model = CompiledModel(compile_relax(mod, cuda, database, log=None), cuda)
        sources = "".join(m.inspect_source() for m in model.executable.mod.imports[0].imports)
        assert (marker in sources) == (database is not None)
        out = np.asarray(model(*inputs), dtype=np.float64)
        return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))

    return error(_operators(matches, cuda, tmp_path / "db")), error(None)


@pytest.mark.gpu
def test_bert_base_float16_with_wgmma_kernels_matches_float64(bert, base, tmp_path):
    """On the GPU machine: the layer compiled with its projections on wgmma (default configs)
    against float64 numpy, and against the same layer without them."""
    from tvm_ext.target import resolve_target

    cuda = resolve_target("cuda")
    matches = match_tasks(extract_tasks(legalize_and_fuse(base, cuda), cuda), cuda)
    assert sum(m.substitutes for m in matches) == len(PROJECTIONS) + len(ATTENTION)
    ours, tvm_own = _layer_errors(bert, base, "float16", "wgmma.mma_async", matches, cuda, tmp_path)
    assert ours < bert.tolerance(size="base", dtype="float16")
    assert ours < 2 * tvm_own + 1e-4  # no worse than TVM's own schedules of the same layer


@pytest.mark.gpu
def test_bert_base_float32_with_3xtf32_programs_matches_float64(bert, base32, tmp_path):
    """On the GPU machine: the float32 layer with its projections on 3xTF32 against float64
    numpy, as accurate as the layer on TVM's own float32 schedules."""
    from tvm_ext.target import resolve_target

    cuda = resolve_target("cuda")
    matches = match_tasks(extract_tasks(legalize_and_fuse(base32), cuda), cuda)
    assert sum(m.matcher == "tf32" for m in matches) == len(PROJECTIONS)
    ours, tvm_own = _layer_errors(bert, base32, "float32", "tf32.tf32", matches, cuda, tmp_path)
    assert ours < bert.tolerance(size="base", dtype="float32")
    assert ours < 2 * tvm_own + 1e-6
