"""The two real model files end to end on PoCL: the small BERT encoder layer and the small GRU
sequence model tuned with a tiny budget, every task listed, the compiled models checked
against float64 numpy; the database reused by a second run and by ``load_model`` alone; the
GRU inside Relax; the model CLI's bad input."""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tvm_ext.relax.pipeline import TuneOptions, extract_tasks, legalize_and_fuse, load_model, tune_relax
from tvm_ext.core.records import RecordStore
from tvm_ext.relax.tvm_export import OPERATORS_FILE, ranked_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BERT = os.path.join(ROOT, "examples", "bert_layer.py")
GRU_MODEL = os.path.join(ROOT, "examples", "gru_model.py")
TINY = TuneOptions(generations=1, population=4, tourn_size=1, seed=0, workers=2)


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bert():
    return _load(BERT, "example_bert_layer")


@pytest.fixture(scope="module")
def gru_model():
    return _load(GRU_MODEL, "example_gru_model")


def _tune(module, opencl, work):
    records, database = str(work / "records.jsonl"), str(work / "database")
    messages: list[str] = []
    result = tune_relax(module.get_module(), opencl, records, database, TINY, log=messages.append)
    return {"result": result, "records": records, "database": database, "messages": messages}


@pytest.fixture(scope="module")
def bert_tuned(bert, opencl, tmp_path_factory):
    return _tune(bert, opencl, tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def gru_tuned(gru_model, opencl, tmp_path_factory):
    return _tune(gru_model, opencl, tmp_path_factory.mktemp("gru"))


def _relative_error(out, ref) -> float:
    return float(np.abs(np.asarray(out, np.float64) - ref).max() / np.abs(ref).max())


def test_bert_layer_every_task_listed_and_the_hot_ones_tuned(bert, bert_tuned, opencl):
    result = bert_tuned["result"]
    tasks = extract_tasks(legalize_and_fuse(bert.get_module()), opencl)
    assert sorted(t.name for t in result.tasks) == sorted(t.task_name for t in tasks)  # every task listed
    by_template = {}
    for t in result.tasks:
        by_template.setdefault(t.template, set()).add(t.name)
    # Q, K and V (one task of weight 3: the same PrimFunc), the two output projections with the
    # residual add joining the bias, the feed-forward GEMM with its GELU, the attention scores
    # (with their scaling) and context: the GEMM template, batched for attention
    gemms = by_template["gemm"]
    assert len(gemms) == 6 and any("gelu" in n for n in gemms) and sum("add_add" in n for n in gemms) == 2
    assert {t.weight for t in result.tasks if t.name == "fused_matmul_add"} == {3}
    batched = [t for t in result.tasks if t.template == "gemm" and dict(t.params).get("batch") == 8]
    assert len(batched) == 2 and any("divide" in t.name for t in batched)
    assert by_template["rows"] == {"softmax", "layer_norm"}
    assert all(t.exported and np.isfinite(t.best_secs) for t in result.tasks if t.template)
    untuned = [t for t in result.tasks if not t.template]  # head splits and merges: data movement only
    assert untuned and all("no reduction" in t.note for t in untuned)


def test_bert_layer_compiled_with_the_database_matches_numpy(bert, bert_tuned, opencl):
    messages: list[str] = []
    model = load_model(bert.get_module(), opencl, bert_tuned["database"], log=messages.append)
    inputs = bert.get_inputs()
    out = model(*inputs)
    assert out.shape == (2, 16, 64) and out.dtype == np.float32
    assert _relative_error(out, bert.reference(inputs)) < 1e-5
    tuned = {t.name for t in bert_tuned["result"].tasks if t.template}
    assert not any(name in m for m in messages for name in tuned)  # the tuned kernels ran, not dlight's


def test_gru_model_tunes_the_gru_as_one_task_and_runs_it_inside_relax(gru_model, gru_tuned, opencl):
    result = gru_tuned["result"]
    (gru,) = [t for t in result.tasks if t.template == "gru"]
    params = dict(gru.params)
    assert (params["batch"], params["hidden"], params["input"], params["seq"], params["layers"]) == (2, 32, 16, 6, 2)
    assert gru.exported and gru.trials > 0 and np.isfinite(gru.best_secs)
    assert any(t.template == "gemm" and "matmul" in t.name for t in result.tasks)  # the head
    # the database's GRU entry is the best record of its workload
    operators = json.load(open(os.path.join(gru_tuned["database"], OPERATORS_FILE)))["operators"]
    (entry,) = operators.values()
    from tvm_ext.relax.relax_gru import find_grus

    (call,) = find_grus(gru_model.get_module(), opencl)
    best = ranked_records(RecordStore(gru_tuned["records"]), call.template, opencl)[0]
    assert entry["config"] == dict(best.config) and entry["run_secs"] == best.cost

    model = load_model(gru_model.get_module(), opencl, gru_tuned["database"], log=None)
    steps = [s.func for s in model._exec.plan.steps]
    (gru_step,) = [s for s in steps if s.startswith("tvm_ext.gru.")]
    assert steps.index(gru_step) not in (0, len(steps) - 1)  # between the embedding and the head
    from tvm_ext.relax.relax_gru import program

    assert program(gru_step).config == best.config_obj()  # the tuned plan runs
    inputs = gru_model.get_inputs()
    out = model(*inputs)
    assert out.shape == (6, 2, 64)
    assert _relative_error(out, gru_model.reference(inputs)) < 1e-5


def _gru_state_dict(input_size: int, hidden: int, layers: int, dirs: int) -> dict[str, np.ndarray]:
    """Random weights under ``torch.nn.GRU.state_dict()``'s names and shapes."""
    rng, bound, out = np.random.default_rng(0), 1.0 / np.sqrt(hidden), {}
    for layer in range(layers):
        k = input_size if layer == 0 else dirs * hidden
        for sfx in ("", "_reverse")[:dirs]:
            for name, dims in (("weight_ih", (3 * hidden, k)), ("weight_hh", (3 * hidden, hidden)),
                               ("bias_ih", (3 * hidden,)), ("bias_hh", (3 * hidden,))):
                out[f"{name}_l{layer}{sfx}"] = rng.uniform(-bound, bound, dims).astype(np.float32)
    return out


def _bound_gru_module(state, layers: int, seq: int = 5, batch: int = 3):
    """A Relax module of one bidirectional ``gru_layer`` (input 8, hidden 16) on x (seq, batch, 8)
    and h0, its weights ``state`` (torch.nn.GRU's names) bound as constants."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend import nn

    from tvm_ext.relax.relax_gru import device_weights, gru_layer

    class Model(nn.Module):
        def __init__(self):
            self.gru = gru_layer(8, 16, layers, bidirectional=True)

        def forward(self, x, h0):
            return self.gru(x, h0)

    mod, params = Model().export_tvm(spec={"forward": {"x": nn.spec.Tensor((seq, batch, 8), "float32"),
                                                       "h0": nn.spec.Tensor((2 * layers, batch, 16), "float32")}})
    weights = device_weights(state, 8, 16, layers, bidirectional=True)
    return relax.transform.BindParams("forward", {n: tvm.runtime.tensor(weights[n.split(".")[-1]])
                                                  for n, _ in params})(mod)


@pytest.mark.parametrize("args, needle", [((8, 0), "hidden_size must be a positive integer, got 0"),
                                           ((0, 8), "input_size must be a positive integer, got 0"),
                                           ((8, 8, 0), "num_layers must be a positive integer, got 0")])
def test_gru_layer_refuses_sizes_that_are_not_positive(args, needle):
    from tvm_ext.core.errors import TvmExtError
    from tvm_ext.relax.relax_gru import gru_layer

    with pytest.raises(TvmExtError, match=f"gru_layer {needle}"):
        gru_layer(*args)


def test_relax_gru_runs_the_gru_layers_kernels(opencl):
    """A Relax module of one ``gru_layer`` lowered to a given config gives, bit for bit, what the
    tvm_ext ``GRU`` built with that config gives: the same kernels, the same plan."""
    from tvm_ext.relax.relax_gru import find_grus, lower_grus, program
    from tvm_ext.schedules.gru import GRU
    from tvm_ext.schedules.gru.compute import gru_reference

    state = _gru_state_dict(8, 16, layers=2, dirs=2)  # torch.nn.GRU's names and shapes
    layer = GRU.build(opencl, 8, 16, num_layers=2, bidirectional=True, batch=3, seq=5, config={"fuse_step": 1})
    layer.load_numpy(state)
    mod = _bound_gru_module(state, layers=2)
    (call,) = find_grus(mod, opencl)
    assert call.template.params == layer.template.params
    lowered = lower_grus(mod, opencl, lambda template: layer.config)
    model = load_model(lowered, opencl, None, log=None)
    (name,) = [s.func for s in model._exec.plan.steps if s.func.startswith("tvm_ext.gru.")]
    assert program(name).compiled.source == layer.compiled.source
    rng = np.random.default_rng(3)
    x, h0 = rng.standard_normal((5, 3, 8)).astype("float32"), rng.standard_normal((4, 3, 16)).astype("float32")
    out, h_n = model(x, h0)
    expected_out, expected_h = layer(x, h0)
    np.testing.assert_array_equal(out, expected_out)
    np.testing.assert_array_equal(h_n, expected_h)
    ref_out, _ = gru_reference(x, state, h0, 2, True)  # torch.nn.GRU's equations in float64
    assert _relative_error(out, ref_out) < 1e-5


def test_float32_gru_with_16_bit_storage_casts_around_its_program(opencl):
    """``storage``: a float32 model's GRU runs its program in bfloat16 storage (PoCL has no
    float16), its arguments cast in and its results cast back to float32: errors of the
    16-bit class against float64, the same program as the GRU built with that precision."""
    from tvm_ext.core.errors import TvmExtError
    from tvm_ext.relax.relax_gru import STORED_TENSORS, find_grus, lower_grus, program
    from tvm_ext.schedules.gru import GRU
    from tvm_ext.schedules.gru.compute import gru_reference

    state = _gru_state_dict(8, 16, layers=1, dirs=2)
    mod = _bound_gru_module(state, layers=1)
    (call,) = find_grus(mod, opencl, storage="bfloat16")
    assert {call.template.params[f"{name}_dtype"] for name in STORED_TENSORS} == {"bfloat16"}
    assert call.template.params["cell_math_dtype"] == "float32"
    layer = GRU.build(opencl, 8, 16, bidirectional=True, batch=3, seq=5, config={"fuse_step": 1},
                      precision={name: "bfloat16" for name in STORED_TENSORS})
    model = load_model(lower_grus(mod, opencl, lambda template: layer.config, storage="bfloat16"), opencl, None,
                       log=None)
    (name,) = [s.func for s in model._exec.plan.steps if s.func.startswith("tvm_ext.gru.")]
    assert program(name).compiled.source == layer.compiled.source
    rng = np.random.default_rng(4)
    x, h0 = rng.standard_normal((5, 3, 8)).astype("float32"), rng.standard_normal((2, 3, 16)).astype("float32")
    out, h_n = model(x, h0)
    assert out.dtype == np.float32 and h_n.dtype == np.float32
    ref_out, ref_h = gru_reference(x, state, h0, 1, True)
    assert 1e-5 < _relative_error(out, ref_out) < 2e-2 and _relative_error(h_n, ref_h) < 2e-2
    with pytest.raises(TvmExtError, match="storage 'int8' is not supported"):
        find_grus(mod, opencl, storage="int8")


def _two_grus_module(states, bind: bool = True, seq: int = 16, batch: int = 8, width: int = 64):
    """A Relax module of two one-layer ``gru_layer``s of one shape (input = hidden = ``width``),
    the second on the first's output, their weights ``states`` (torch.nn.GRU's names) bound as
    constants (``bind``) or left as parameters."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend import nn

    from tvm_ext.relax.relax_gru import device_weights, gru_layer

    class Model(nn.Module):
        def __init__(self):
            self.first = gru_layer(width, width)
            self.second = gru_layer(width, width)

        def forward(self, x):
            return self.second(self.first(x)[0])[0]

    mod, params = Model().export_tvm(spec={"forward": {"x": nn.spec.Tensor((seq, batch, width), "float32")}})
    if not bind:
        return mod
    weights = {site: device_weights(state, width, width) for site, state in zip(("first", "second"), states)}
    return relax.transform.BindParams("forward", {n: tvm.runtime.tensor(weights[n.split(".")[0]][n.split(".")[-1]])
                                                  for n, _ in params})(mod)


def _split_config(template, target):
    return template.analytic_pick(target)[0].replace(in_split=3)


def _gru_sites(lowered) -> list[str]:
    from tvm import relax

    names = []
    for _, func in lowered.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, lambda e: names.append(str(e.global_symbol))
                                            if isinstance(e, relax.ExternFunc) and "tvm_ext.gru." in
                                            str(e.global_symbol) else None)
    return names


def test_gru_sites_with_constant_weights_call_their_prepared_parts():
    """CUDA (built here, no GPU): where the GRU's plan splits W_ih into parts and a call site's
    W_ih are constants, the site calls a function of its own named by their values (the parts
    made on its first call); two sites of one shape with other weights call two, with the same
    weights one; weights left as parameters call the program itself, which splits every call."""
    from tvm_ext.relax.relax_gru import find_grus, lower_grus, program
    from tvm_ext.target import offline_cuda

    target = offline_cuda()
    a, b = _gru_state_dict(64, 64, 1, 1), {k: v * 0.5 for k, v in _gru_state_dict(64, 64, 1, 1).items()}
    config = lambda template: _split_config(template, target)  # noqa: E731
    (call, _) = find_grus(_two_grus_module([a, b]), target)
    assert call.template.space(target).infeasible_reason(config(call.template)) is None
    first, second = _gru_sites(lower_grus(_two_grus_module([a, b]), target, config))
    assert first != second and first.rsplit(".w", 1)[0] == second.rsplit(".w", 1)[0]
    assert program(first) is program(second) and program(first).compiled.prepare
    assert len(set(_gru_sites(lower_grus(_two_grus_module([a, a]), target, config)))) == 1
    plain = _gru_sites(lower_grus(_two_grus_module([a, b], bind=False), target, config))
    assert plain == [program(first).name] * 2


@pytest.mark.gpu
def test_cuda_gru_sites_with_constant_weights_split_them_once():
    """Two GRUs of one shape with other constant weights, W_ih on TF32 parts: float64's answer
    on three calls (the parts made on the first, each site's own: a site given the other's
    parts would be off by far more)."""
    from tvm_ext.relax.relax_gru import lower_grus
    from tvm_ext.schedules.gru.compute import gru_reference
    from tvm_ext.target import resolve_target

    cuda = resolve_target("cuda")
    a, b = _gru_state_dict(64, 64, 1, 1), {k: v * 0.5 for k, v in _gru_state_dict(64, 64, 1, 1).items()}
    lowered = lower_grus(_two_grus_module([a, b]), cuda, lambda template: _split_config(template, cuda))
    assert all(".w" in name for name in _gru_sites(lowered))
    model = load_model(lowered, cuda, None, log=None)
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = rng.standard_normal((16, 8, 64)).astype("float32")
        ref = gru_reference(gru_reference(x, a, None, 1, False)[0], b, None, 1, False)[0]
        assert _relative_error(model(x), ref) < 1e-5


def test_gru_placeholder_states_its_precision(opencl):
    """A float16 layer: x, weights, gi, state and output float16 (as ``tvm_ext.torch.GRU`` and cuDNN
    store a float16 GRU), gates accumulating and the cell computing in float32."""
    from tvm.relax.frontend import nn

    from tvm_ext.relax.relax_gru import STORED_TENSORS, find_grus, gru_layer

    class Model(nn.Module):
        def __init__(self):
            self.gru = gru_layer(8, 16, 1, dtype="float16")

        def forward(self, x):
            return self.gru(x)[0]

    mod, _ = Model().export_tvm(spec={"forward": {"x": nn.spec.Tensor((4, 2, 8), "float16")}})
    (call,) = find_grus(mod, opencl)
    p = call.template.precision
    assert {k: p[k] for k in STORED_TENSORS} == dict.fromkeys(STORED_TENSORS, "float16")
    assert {k: p[k] for k in ("in_acc", "hid_acc", "gh", "cell_math")} == dict.fromkeys(
        ("in_acc", "hid_acc", "gh", "cell_math"), "float32")
    assert (call.template.seq, call.template.batch) == (4, 2)


def test_second_run_on_the_database_measures_nothing_and_load_model_needs_only_the_database(
        gru_model, gru_tuned, opencl, tmp_path):
    database = gru_tuned["database"]
    files = {n: open(os.path.join(database, n)).read() for n in sorted(os.listdir(database))}
    again = tune_relax(gru_model.get_module(), opencl, str(tmp_path / "fresh.jsonl"), database, TINY, log=None)
    assert sum(t.trials for t in again.tasks) == 0
    assert all(t.reused for t in again.tasks if t.template)
    assert not os.path.getsize(tmp_path / "fresh.jsonl")  # nothing measured, nothing recorded
    assert {n: open(os.path.join(database, n)).read() for n in sorted(os.listdir(database))} == files
    # the records are gone: the database alone builds the tuned model
    moved = str(tmp_path / "records_elsewhere.jsonl")
    os.rename(gru_tuned["records"], moved)
    try:
        messages: list[str] = []
        model = load_model(gru_model.get_module(), opencl, database, log=messages.append)
        inputs = gru_model.get_inputs()
        assert _relative_error(model(*inputs), gru_model.reference(inputs)) < 1e-5
        assert not any("GRU" in m or "matmul" in m for m in messages)  # tuned GRU plan and head
    finally:
        os.rename(moved, gru_tuned["records"])


def test_cli_reuses_the_database_with_model_options(bert_tuned, tmp_path):
    """``tune model`` on the database of the same model: reused, run, checked (``--model-option``
    reaches get_module, get_inputs, reference and tolerance)."""
    cmd = [sys.executable, "-m", "tvm_ext.tune", "model", BERT, "--model-option", "size=small",
           "--model-option", "dtype=float32", "--records", str(tmp_path / "r.jsonl"),
           "--database", bert_tuned["database"], "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "tuned (database, reused)" in p.stdout and "(ok)" in p.stdout
    assert not os.path.getsize(tmp_path / "r.jsonl")


def test_cli_gru_storage_tunes_and_runs_the_16_bit_gru(tmp_path):
    """``--gru-storage bfloat16`` on a float32 model: the GRU is tuned and run with bfloat16
    storage (its workload says so), the output checked against the file's reference within
    the storage's bound; a second run reuses what the first exported under that key."""
    cmd = [sys.executable, "-m", "tvm_ext.tune", "model", GRU_MODEL, "--gru-storage", "bfloat16",
           "--generations", "1", "--population", "2", "--records", str(tmp_path / "r.jsonl"),
           "--database", str(tmp_path / "db"), "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "x_dtype=bfloat16" in p.stdout and "h_dtype=bfloat16" in p.stdout and "(ok)" in p.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "tuned (database, reused)" in again.stdout, again.stdout + again.stderr


BAD_MODELS = {
    "syntax.py": ("def get_module(:\n", "cannot import"),
    "raises.py": ("def get_module(**options):\n    raise RuntimeError('no weights here')\n",
                  "get_module() raised RuntimeError: no weights here"),
    "dynamic.py": ("""
def get_module(**options):
    from tvm import tirx
    from tvm.relax.frontend import nn

    class Model(nn.Module):
        def forward(self, x):
            return nn.op.softmax(x, axis=-1)

    n = tirx.Var("n", "int64")
    mod, _ = Model().export_tvm(spec={"forward": {"x": nn.spec.Tensor((n, 16), "float32")}})
    return mod
""", "dynamic shape"),
}


@pytest.mark.parametrize("name", list(BAD_MODELS))
def test_cli_bad_model_files_give_one_error_line(tmp_path, name):
    text, message = BAD_MODELS[name]
    path = tmp_path / name
    path.write_text(text)
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "model", str(path), "--records",
                        str(tmp_path / "r.jsonl"), "--database", str(tmp_path / "db"), "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], p.stderr
    assert "Traceback" not in p.stderr
    if name == "dynamic.py":  # the dynamic kernel fell back to dlight with a note; the OpenCL run is what fails
        assert "dynamic shape" in p.stdout and "softmax" in p.stdout


def test_cli_model_option_must_be_key_value(tmp_path):
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "model", BERT, "--model-option", "size",
                        "--records", str(tmp_path / "r.jsonl")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().startswith("error: --model-option must be KEY=VALUE")


def test_cli_without_names_the_matchers_it_takes(tmp_path):
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "model", BERT, "--without", "tf16",
                        "--records", str(tmp_path / "r.jsonl")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().startswith("error: argument --without: invalid choice: 'tf16'")
    from tvm_ext.relax.tasks import MATCHERS

    assert ", ".join(map(repr, MATCHERS)) in p.stderr and "Traceback" not in p.stderr  # every matcher, in order


@pytest.mark.gpu
@pytest.mark.parametrize("path", [BERT, GRU_MODEL])
def test_models_in_float16_on_cuda(path, tmp_path):
    """On the GPU machine: the float16 variants tuned (tensor cores for the matmuls, the GRU
    plan), compiled into the Relax VM and checked against float64 numpy."""
    from tvm_ext.target import resolve_target

    cuda = resolve_target("cuda")
    module = _load(path, "gpu_model")
    mod = module.get_module(dtype="float16")
    result = tune_relax(mod, cuda, str(tmp_path / "r.jsonl"), str(tmp_path / "db"), TINY)
    assert all(t.exported for t in result.tasks if t.template)
    model = load_model(mod, cuda, str(tmp_path / "db"))
    inputs = module.get_inputs(dtype="float16")
    assert _relative_error(model(*inputs), module.reference(inputs, dtype="float16")) < module.tolerance(
        dtype="float16")


def test_float16_models_compile_for_cuda_with_tensor_cores_offline(bert, gru_model, tmp_path):
    """No GPU here: the float16 BERT layer's matmuls replayed with the mma.sync template's
    default configs and the GRU pointed at its plan's packed function, both compiled by the
    Relax build for CUDA (source only)."""
    import tvm

    from tvm_ext.relax.pipeline import build_model, compile_relax, match_tasks
    from tvm_ext.relax.relax_gru import find_grus, program
    from tvm_ext.target import offline_cuda
    from tvm_ext.relax.tvm_export import commit, open_database

    cuda = offline_cuda()
    mod = bert.get_module(dtype="float16")
    tasks = extract_tasks(legalize_and_fuse(mod), cuda)
    db = open_database(str(tmp_path / "db"))
    mma, shapes = 0, []
    for task, match in zip(tasks, match_tasks(tasks, cuda)):
        if match.matched:
            commit(db, task.dispatched[0], match, match.template.default_config(cuda), 1e-3, cuda)
            if match.template.name == "gemm_mma":
                mma += 1
                shapes.append((match.template.m, match.template.n, match.template.k))
    # Q/K/V, the output projections, the feed-forward GEMM, and attention's two products (N = 16,
    # the head size, on 32-wide tiles padded)
    assert mma == 6 and sum(n == 16 for _, n, _ in shapes) == 2, shapes
    ex = build_model(compile_relax(mod, cuda, str(tmp_path / "db"), log=None), cuda)
    source = ex.mod.imports[0].imports[0].inspect_source()
    assert "mma.sync.aligned.m16n8k16" in source and "ldmatrix" in source

    gru_mod = gru_model.get_module(dtype="float16")
    (call,) = find_grus(gru_mod, cuda)
    scheduled = compile_relax(gru_mod, cuda, None, log=None)
    build_model(scheduled, cuda)
    (name,) = [n for n in scheduled["forward"].script().split('"') if n.startswith("tvm_ext.gru.")]
    assert program(name).template == call.template and tvm.get_global_func(name) is not None


def test_benchmark_joins_a_meta_schedule_seed_tuned_in_parts(monkeypatch):
    """``benchmarks/models.py --ms-database A+B``: the parts' records in one database, their
    tuning times added, and tasks whose every candidate failed counted (they get dlight's
    schedule).  On the databases the H100 runs kept under ``benchmarks/data``."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts benchmarks/ on the path
    # TVM's prim_func parser calls inspect.stack() for each of the hundreds of tensor intrinsics
    # load_meta_schedule imports; for the import machinery's frames inspect.getmodule scans every
    # loaded module, then answers None.  Giving it that answer at once takes the import from a
    # minute to seconds and changes nothing it returns.
    for frame_file in ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>", "<ast>"):
        monkeypatch.setitem(inspect.modulesbyfile, frame_file, frame_file)  # no module is named so: None
    spec = importlib.util.spec_from_file_location("bench_models", os.path.join(ROOT, "benchmarks", "models.py"))
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_models", bench)  # dataclasses look their module up
    spec.loader.exec_module(bench)
    data = os.path.join(ROOT, "benchmarks", "data")

    def part(name: str) -> tuple[str, float]:
        folder = os.path.join(data, name)
        with open(os.path.join(folder, "tuning.json")) as f:
            return folder, json.load(f)["wall_s"]

    (first, first_s), (second, second_s) = (part(f"ms_bert_float32_seed1_tasks{tasks}") for tasks in ("0-4", "4-8"))
    db, wall, trials = bench.load_meta_schedule([first, second])
    assert len(db.get_all_tuning_records()) == 32 and wall == pytest.approx(first_s + second_s)
    assert "in parts" in trials and "dlight" not in trials
    workloads = {r.workload.mod.script() for r in db.get_all_tuning_records()}
    assert len(workloads) == 8  # the BERT layer's eight tasks, four from each part
    whole, _, whole_trials = bench.load_meta_schedule([os.path.join(data, "ms_bert_float32_seed0")])
    assert len(whole.get_all_tuning_records()) == 32 and "in parts" not in whole_trials
    # float16: 23 of meta_schedule's 24 WMMA candidates failed to build in TVM 0.27
    _, _, f16_trials = bench.load_meta_schedule([os.path.join(data, "ms_bert_float16_seed0_tasks0-4"),
                                                 os.path.join(data, "ms_bert_float16_seed0_tasks4-8")])
    assert "5 task(s) with no candidate that ran" in f16_trials
