"""The matcher registry on TVM's own lowering of small Relax programs: each pattern matched
(and the replayed default schedule run on PoCL against float64 numpy), and the near misses
reported with their reason."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_ext.relax.pipeline import extract_tasks, legalize_and_fuse, load_model, match_tasks
from tvm_ext.relax.tasks import MATCHERS
from tvm_ext.target import offline_cuda
from tvm_ext.relax.tvm_export import commit, open_database

RNG = np.random.default_rng(7)


def _module(forward, shapes: dict[str, tuple[tuple[int, ...], str]], transform=None):
    from tvm.relax.frontend import nn

    class Model(nn.Module):
        pass

    Model.forward = forward
    spec = {name: nn.spec.Tensor(shape, dtype) for name, (shape, dtype) in shapes.items()}
    mod, _ = Model().export_tvm(spec={"forward": spec})
    return transform(mod) if transform else mod


def _matches(mod, target):
    tasks = extract_tasks(legalize_and_fuse(mod), target)
    return tasks, match_tasks(tasks, target)


def _run_default(mod, target, tmp_path, inputs):
    """Every matched task committed with its template's default config, the model compiled
    from that database and run."""
    tasks, matches = _matches(mod, target)
    db = open_database(str(tmp_path / "db"))
    for task, match in zip(tasks, matches):
        if match.matched:
            commit(db, task.dispatched[0], match, match.template.default_config(target), 1e-3, target)
    messages: list[str] = []
    model = load_model(mod, target, str(tmp_path / "db"), log=messages.append)
    return model(*inputs), messages


def _one(matches, matcher):
    found = [m for m in matches if m.matcher == matcher]
    assert len(found) == 1, [(m.name, m.matcher, m.reason) for m in matches]
    return found[0]


def test_registry_has_one_matcher_per_template():
    assert list(MATCHERS) == ["tf32", "gemm", "wgmma", "fp8", "tensor_core", "rows"]
    assert [n for n, m in MATCHERS.items() if m.substitute is not None] == ["tf32", "wgmma", "fp8"]


@pytest.mark.parametrize("b_shape, b_transposed", [((3, 16, 12), False), ((3, 12, 16), True)])
def test_batched_gemm_matches_and_runs(opencl, tmp_path, b_shape, b_transposed):
    from tvm import relax
    from tvm.relax.frontend import nn

    def forward(self, a, b):
        return nn.op.matmul(a, nn.op.permute_dims(b, [0, 2, 1]) if b_transposed else b)

    # the transposed form: TVM's FuseTransposeMatmul reads B[b, j, k] in the matmul itself
    transform = relax.transform.FuseTransposeMatmul() if b_transposed else None
    mod = _module(forward, {"a": ((3, 20, 16), "float32"), "b": (b_shape, "float32")}, transform)
    _, matches = _matches(mod, opencl)
    match = _one(matches, "gemm")
    assert match.template.params == {"m": 20, "n": 12, "k": 16, "batch": 3, **({"b_transposed": True} if b_transposed
                                                                             else {}),
                                     **{f"{p}_dtype": "float32" for p in ("a", "b", "acc", "c")}}
    a, b = RNG.standard_normal((3, 20, 16)).astype("float32"), RNG.standard_normal(b_shape).astype("float32")
    out, messages = _run_default(mod, opencl, tmp_path, [a, b])
    b64 = b.astype(np.float64)
    np.testing.assert_allclose(out, a @ (b64.transpose(0, 2, 1) if b_transposed else b64), rtol=1e-5, atol=1e-5)
    assert not any(match.name in m for m in messages)  # the tuned schedule, not dlight


def test_matmul_over_heads_and_shared_weight_match(opencl, tmp_path):
    """Attention's 4-D matmul (batch and heads: one grid axis) with its scaling epilogue, and a
    3-D activation times a 2-D weight (one B for the batch)."""
    from tvm.relax.frontend import nn

    def forward(self, q, k, w):
        scores = nn.op.matmul(q, nn.op.permute_dims(k, [0, 1, 3, 2])) / 4.0
        return nn.op.matmul(scores, w)

    mod = _module(forward, {"q": ((2, 3, 8, 16), "float32"), "k": ((2, 3, 8, 16), "float32"),
                            "w": ((8, 5), "float32")})
    _, matches = _matches(mod, opencl)
    gemms = {m.name: m for m in matches if m.matcher == "gemm"}
    heads = next(m for m in gemms.values() if not m.template.b_shared)
    shared = next(m for m in gemms.values() if m.template.b_shared)
    assert heads.site.epilogue and (heads.template.m, heads.template.n, heads.template.k) == (8, 8, 16)
    assert (shared.template.batch, shared.template.n, shared.template.k) == (6, 5, 8)
    q, k = RNG.standard_normal((2, 3, 8, 16)).astype("float32"), RNG.standard_normal((2, 3, 8, 16)).astype("float32")
    w = RNG.standard_normal((8, 5)).astype("float32")
    out, _ = _run_default(mod, opencl, tmp_path, [q, k, w])
    expected = (q.astype(np.float64) @ k.transpose(0, 1, 3, 2)) / 4.0 @ w
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_gemm_near_misses_name_their_reason(opencl):
    from tvm.relax.frontend import nn

    def forward(self, a, b):  # a batch of B matrices against one A: batch axes on B only
        return nn.op.matmul(a, b)

    mod = _module(forward, {"a": ((8, 16), "float32"), "b": ((3, 16, 4), "float32")})
    _, matches = _matches(mod, opencl)
    (matmul,) = [m for m in matches if "matmul" in m.name]
    assert not matmul.matched and "batch axes on B only" in matmul.reason


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_matmul_goes_to_the_tensor_cores_on_cuda_only(opencl, dtype):
    """float16/bfloat16 matmuls (accumulating in float32 after the model rewrite, a cast and a
    bias as epilogue) -> the mma.sync template on CUDA before Hopper (offline: its default config
    builds); on Hopper both go to wgmma, in their own dtype; on OpenCL the reason says why not."""
    from tvm.relax.frontend import nn

    def forward(self, a, b, bias):
        return nn.op.matmul(a, b) + bias

    mod = _module(forward, {"a": ((64, 128), dtype), "b": ((128, 256), dtype), "bias": ((256,), dtype)})
    _, on_hopper = _matches(mod, offline_cuda())
    (hopper,) = [m for m in on_hopper if "matmul" in m.name]
    assert hopper.matcher == "wgmma", hopper.reason
    assert hopper.template.dtype == dtype and hopper.template.params["c_dtype"] == dtype
    cuda = offline_cuda("sm_80")
    _, matches = _matches(mod, cuda)
    match = _one(matches, "tensor_core")
    t = match.template
    assert (t.name, t.m, t.n, t.k, t.a_dtype, t.acc_dtype, t.c_dtype) == ("gemm_mma", 64, 256, 128, dtype,
                                                                            "float32", dtype)
    assert len(match.site.epilogue) == 2 and not t.scratch()  # cast + bias; no split-K in a model
    _, on_opencl = _matches(mod, opencl)
    (miss,) = [m for m in on_opencl if "matmul" in m.name]
    assert not miss.matched and "needs a CUDA target, not opencl" in miss.reason


def test_cuda_gemm_tasks_search_the_staging_knobs_from_the_measured_tile(opencl):
    """A float32 matmul with a bias on CUDA before Hopper: the GEMM template with its staging
    knobs, whose ``known_good`` seed is the register-staged 64x128 tile, built on the task's own
    function (its epilogue included); on OpenCL neither; on Hopper the 3xTF32 program takes it."""
    from tvm_ext.measure.program import compile_schedule
    from tvm_ext.schedules.gemm.simt import REGISTER_STAGED_TILE

    def forward(self, a, b, bias):
        return nn_matmul(a, b) + bias

    mod = _module(forward, {"a": ((256, 512), "float32"), "b": ((512, 384), "float32"),
                            "bias": ((384,), "float32")})
    assert _one(_matches(mod, offline_cuda())[1], "tf32").substitutes
    cuda = offline_cuda("sm_80")
    tasks, matches = _matches(mod, cuda)
    match = _one(matches, "gemm")
    (seed,) = match.template.known_good(cuda)
    assert match.template.staging and {k: seed[k] for k in REGISTER_STAGED_TILE} == REGISTER_STAGED_TILE
    task = next(t for t, m in zip(tasks, matches) if m is match)
    program = compile_schedule(match.template.schedule(seed, cuda, task.dispatched[0], match.site), cuda)
    assert len(program.launches) == 1  # the bias joined the GEMM's store
    (on_opencl,) = [m for m in _matches(mod, opencl)[1] if m.matcher == "gemm"]
    assert not on_opencl.template.staging and on_opencl.template.known_good(opencl) == []


def nn_matmul(a, b):
    from tvm.relax.frontend import nn

    return nn.op.matmul(a, b)


def test_tensor_core_near_miss_transposed_b():
    from tvm import relax
    from tvm.relax.frontend import nn

    def forward(self, a, b):
        return nn.op.matmul(a, nn.op.permute_dims(b, [1, 0]))

    mod = _module(forward, {"a": ((64, 128), "float16"), "b": ((256, 128), "float16")},
                  relax.transform.FuseTransposeMatmul())
    _, matches = _matches(mod, offline_cuda())
    (miss,) = [m for m in matches if "matmul" in m.name]
    assert not miss.matched and "B is [n, k]" in miss.reason


ROW_OPS = {  # the Relax op and its float64 numpy
    "softmax": (lambda x, w, b: __import__("tvm").relax.frontend.nn.op.softmax(x, axis=-1),
                lambda x, w, b: np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(
                    -1, keepdims=True)),
    "layer_norm": (lambda x, w, b: __import__("tvm").relax.frontend.nn.op.layer_norm(x, [x.shape[-1]], w, b, 1e-5),
                   lambda x, w, b: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b),
    "rms_norm": (lambda x, w, b: __import__("tvm").relax.frontend.nn.op.rms_norm(x, w, [-1], 1e-5),
                 lambda x, w, b: x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-5) * w),
    "sum": (lambda x, w, b: __import__("tvm").relax.frontend.nn.op.sum(x, axis=-1),
            lambda x, w, b: x.sum(-1)),
    "max": (lambda x, w, b: __import__("tvm").relax.frontend.nn.op.max(x, axis=-1),
            lambda x, w, b: x.max(-1)),
}
FULL_ROWS = ("softmax", "layer_norm", "rms_norm")  # TVM fuses an elementwise epilogue into these


@pytest.mark.parametrize("op", list(ROW_OPS))
def test_row_operators_match_and_run(opencl, tmp_path, op):
    """Each row operator over the last axis of a 3-D input (two row axes); an epilogue that
    TVM fuses into it (+1 after a full-row op, the mean's division) runs in the same kernel."""
    relax_op, numpy_op = ROW_OPS[op]
    plus = 1.0 if op in FULL_ROWS else 0.0

    def forward(self, x, w, b):
        return relax_op(x, w, b) + 1.0 if plus else relax_op(x, w, b)

    mod = _module(forward, {"x": ((2, 6, 32), "float32"), "w": ((32,), "float32"), "b": ((32,), "float32")})
    _, matches = _matches(mod, opencl)
    match = _one(matches, "rows")
    assert (match.template.op, match.template.rows, match.template.n, match.template.last_rows) == (op, 12, 32, 6)
    x, w, b = (RNG.standard_normal(s).astype("float32") for s in ((2, 6, 32), (32,), (32,)))
    out, messages = _run_default(mod, opencl, tmp_path, [x, w, b])
    np.testing.assert_allclose(out, numpy_op(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)) + plus,
                               rtol=1e-5, atol=1e-5)
    assert not messages  # no kernel fell back to dlight


def test_mean_is_a_sum_with_its_division_in_the_kernel(opencl, tmp_path):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((12, 48), "float32"))
    with bb.function("forward", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.mean(x, axis=-1))
        bb.emit_func_output(out)
    _, matches = _matches(bb.get(), opencl)
    match = _one(matches, "rows")
    assert len(matches) == 1 and match.template.op == "sum"
    xs = RNG.standard_normal((12, 48)).astype("float32")
    out, messages = _run_default(bb.get(), opencl, tmp_path, [xs])
    np.testing.assert_allclose(out, xs.astype(np.float64).mean(-1), rtol=1e-5, atol=1e-6)
    assert not messages


def test_row_operator_with_prologue_and_epilogue_is_one_kernel(opencl, tmp_path):
    """A PrimFunc holding an elementwise prologue (x·x), the layer norm and an epilogue (+1)
    (FuseOps never fuses a producer into a reduction, a hand-written one does): one row task,
    its stages inlined into one kernel."""
    from tvm import relax, topi

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((12, 32), "float32"))
    w = relax.Var("w", relax.TensorType((32,), "float32"))
    with bb.function("forward", [x, w]):
        with bb.dataflow():
            y = bb.emit_te(lambda a, g: topi.add(topi.nn.rms_norm(topi.multiply(a, a), g, axis=[-1], epsilon=1e-5),
                                                 1.0), x, w, primfunc_name_hint="square_rms_norm_plus_one")
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    _, matches = _matches(mod, opencl)
    match = _one(matches, "rows")
    assert len(matches) == 1 and match.template.op == "rms_norm"
    xs, ws = RNG.standard_normal((12, 32)).astype("float32"), RNG.standard_normal(32).astype("float32")
    out, messages = _run_default(mod, opencl, tmp_path, [xs, ws])
    sq = xs.astype(np.float64) ** 2
    np.testing.assert_allclose(out, sq / np.sqrt((sq ** 2).mean(-1, keepdims=True) + 1e-5) * ws + 1.0, rtol=1e-5,
                               atol=1e-5)
    assert not messages


def test_row_near_misses_name_their_reason(opencl):
    from tvm.relax.frontend import nn

    def forward(self, x):
        return nn.op.sum(x, axis=1)  # the middle axis

    _, matches = _matches(_module(forward, {"x": ((4, 8, 16), "float32")}), opencl)
    (miss,) = matches
    assert not miss.matched and "not a row operator" in miss.reason and "last axis" in miss.reason


def test_dynamic_shape_falls_back_with_a_note(opencl):
    from tvm import tirx
    from tvm.relax.frontend import nn

    def forward(self, x):
        return nn.op.softmax(x, axis=-1)

    n = tirx.Var("n", "int64")
    _, matches = _matches(_module(forward, {"x": ((n, 16), "float32")}), opencl)
    (miss,) = matches
    assert not miss.matched and miss.reason.startswith("dynamic shape")


def test_elementwise_ops_after_a_reshape_join_the_matmul(opencl, tmp_path):
    """PyTorch's exported Linear flattens to 2-D and reshapes back before GELU and the residual
    add; ``relax_rewrites`` moves those ops before the reshape, so the GEMM's store does them."""
    from tvm.relax.frontend import nn

    def forward(self, x, w1, w2):
        h = nn.op.gelu(nn.op.reshape(nn.op.matmul(nn.op.reshape(x, (12, 8)), w1), (3, 4, 16)))
        return nn.op.reshape(nn.op.matmul(nn.op.reshape(h, (12, 16)), w2), (3, 4, 8)) + x

    mod = _module(forward, {"x": ((3, 4, 8), "float32"), "w1": ((8, 16), "float32"), "w2": ((16, 8), "float32")})
    tasks, matches = _matches(mod, opencl)
    gemms = [m for m in matches if m.matcher == "gemm"]
    assert len(gemms) == 2 and all(m.site.epilogue for m in gemms)
    assert {m.name for m in gemms} == {"fused_matmul_gelu", "fused_matmul1_add"}
    assert not any("gelu" in t.task_name or "add" in t.task_name for t, m in zip(tasks, matches) if not m.matched)
    x, w1, w2 = (RNG.standard_normal(s).astype("float32") for s in ((3, 4, 8), (8, 16), (16, 8)))
    out, _ = _run_default(mod, opencl, tmp_path, [x, w1, w2])
    from scipy.special import erf

    h = x.astype(np.float64).reshape(12, 8) @ w1
    h = 0.5 * h * (1 + erf(h / np.sqrt(2)))
    np.testing.assert_allclose(out, (h @ w2).reshape(3, 4, 8) + x, rtol=1e-5, atol=1e-5)


def test_a_broadcast_the_reshape_changes_stays_after_it(opencl):
    """Adding a (4, 1) column after reshaping (12, 8) to (3, 4, 8) is not the same op before the
    reshape: it stays where it is (its own kernel)."""
    from tvm.relax.frontend import nn

    def forward(self, x, w, column):
        return nn.op.reshape(nn.op.matmul(x, w), (3, 4, 8)) + column

    mod = _module(forward, {"x": ((12, 8), "float32"), "w": ((8, 8), "float32"), "column": ((4, 1), "float32")})
    _, matches = _matches(mod, opencl)
    gemm = _one(matches, "gemm")
    assert gemm.name == "matmul" and not gemm.site.epilogue


def test_low_precision_matmuls_accumulate_in_float32():
    from tvm.relax.frontend import nn

    from tvm_ext.relax.relax_rewrites import rewrite_model

    def forward(self, a, b):
        return nn.op.matmul(a, b)

    text = rewrite_model(_module(forward, {"a": ((4, 8), "float16"), "b": ((8, 4), "float16")}))["forward"].script()
    assert 'R.matmul(a, b, out_dtype="float32")' in text and 'R.astype' in text and '"float16")' in text
    kept = rewrite_model(_module(forward, {"a": ((4, 8), "float32"), "b": ((8, 4), "float32")}))["forward"].script()
    assert "R.astype" not in kept


def test_a_matmul_whose_store_is_a_slice_of_the_product_is_not_taken(opencl, tmp_path):
    """A slice fused after the matmul (its columns 0..4 of 8) stores another shape than the
    product: no template composes that store, so the function keeps TVM's default schedule,
    with the reason named, and the model still computes the slice."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 12), "float32"))
    w = relax.Var("w", relax.TensorType((12, 8), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            product = bb.emit(relax.op.matmul(x, w))
            out = bb.emit_output(relax.op.strided_slice(product, axes=[1], begin=[0], end=[5]))
        bb.emit_func_output(out)
    mod = bb.get()
    _, matches = _matches(mod, opencl)
    (fused,) = [m for m in matches if "matmul" in m.name]
    assert "strided_slice" in fused.name and not fused.matched
    assert "covers another shape than the product's" in fused.reason
    a, b = RNG.standard_normal((16, 12)).astype("float32"), RNG.standard_normal((12, 8)).astype("float32")
    out, _ = _run_default(mod, opencl, tmp_path, [a, b])
    np.testing.assert_allclose(out.numpy() if hasattr(out, "numpy") else out, (a @ b)[:, :5], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n, matcher", [(32, "tensor_core"), (64, "wgmma")])
def test_a_narrow_b_stored_k_by_n_goes_to_mma_sync_on_hopper(n, matcher):
    """On Hopper a float16 matmul whose B is stored (K, N) with fewer than 64 columns goes to
    mma.sync's 32-column tiles, the wgmma matcher naming why; from 64 columns wgmma takes it."""
    from tvm import relax

    from tvm_ext.relax.tasks import match_wgmma

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((256, 128), "float16"))
    w = relax.Var("w", relax.TensorType((128, n), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    hopper = offline_cuda("sm_90a")
    tasks = extract_tasks(legalize_and_fuse(bb.get(), hopper), hopper)
    (match,) = [m for m in match_tasks(tasks, hopper) if "matmul" in m.name]
    assert match.matcher == matcher and match.template.n == n
    if matcher == "tensor_core":
        (task,) = [t for t in tasks if t.task_name == match.name]
        assert "B (K, N) of 32 columns, under 64: mma.sync takes it" in match_wgmma(task.dispatched[0]["main"],
                                                                                      hopper).reason
