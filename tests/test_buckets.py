"""A symbolic dimension tuned at buckets and dispatched at run time (``tvm_ext.relax.buckets``):
real tuning on PoCL at two bucket sizes, the buckets file on disk, calls at the buckets, between
and past them against float64 numpy, each size's functions scheduled from the right place."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tvm_ext.core.errors import TvmExtError
from tvm_ext.relax.buckets import BUCKETS_FILE, BucketedModel, Buckets, read_buckets, symbolic_vars, tune_buckets
from tvm_ext.relax.pipeline import TuneOptions, tune_relax

TINY = TuneOptions(generations=1, population=4, tourn_size=1, seed=0, workers=2)
IN, OUT = 16, 32


def _weights(inputs=IN, outputs=OUT, dtype="float32"):
    rng = np.random.default_rng(7)
    return rng.standard_normal((outputs, inputs)).astype(dtype) / 4, rng.standard_normal(outputs).astype(dtype)


def _symbolic_mlp(inputs=IN, outputs=OUT, dtype="float32"):
    """Linear(16 -> 32) (or ``inputs -> outputs``) + GELU on x (n, 16), n symbolic, its weights
    bound as constants."""
    import tvm
    from tvm import relax, tirx
    from tvm.relax.frontend import nn

    class Model(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(inputs, outputs, dtype=dtype)

        def forward(self, x):
            return nn.op.gelu(self.fc(x))

    n = tirx.Var("n", "int64")
    mod, params = Model().export_tvm(spec={"forward": {"x": nn.spec.Tensor((n, inputs), dtype)}})
    w, b = _weights(inputs, outputs, dtype)
    values = {"fc.weight": w, "fc.bias": b}
    return relax.transform.BindParams("forward", {name: tvm.runtime.tensor(values[name]) for name, _ in params})(mod)


def _reference(x):
    from math import erf

    w, b = _weights()
    y = x.astype(np.float64) @ w.T.astype(np.float64) + b
    return 0.5 * y * (1 + np.vectorize(erf)(y / np.sqrt(2)))


def test_buckets_parse_and_order():
    assert Buckets.parse("n=128,1,16") == Buckets("n", (1, 16, 128))
    assert Buckets("n", (1, 16, 128)).nearest(10) == (16, 1, 128)
    assert Buckets("n", (1, 16, 128)).nearest(16) == (16, 128, 1)
    assert Buckets("n", (1, 16, 128)).nearest(500) == (128, 16, 1)
    assert Buckets("n", (128, 512, 2048)).nearest(700) == (512, 2048, 128)  # by ratio: 1.4 below, 2.9 above
    assert Buckets("n", (128, 512, 2048)).nearest(1500) == (2048, 512, 128)
    for bad, needle in (("16,128", "expected NAME=SIZE"), ("n=a,2", "integers"), ("n=0,4", "at least 1"),
                        ("n=", "at least one size")):
        with pytest.raises(TvmExtError, match=needle):
            Buckets.parse(bad)


@pytest.fixture(scope="module")
def tuned(opencl, tmp_path_factory):
    work = tmp_path_factory.mktemp("buckets")
    records, database = str(work / "records.jsonl"), str(work / "database")
    mod = _symbolic_mlp()
    results = tune_buckets(mod, opencl, records, database, Buckets("n", (4, 16)),
                           lambda static: tune_relax(static, opencl, records, database, TINY, log=None))
    return {"mod": mod, "database": database, "results": results}


def test_a_bucket_config_is_refitted_where_its_raster_does_not_divide_the_size():
    """A wgmma config tuned at 512 rows (128-row tiles, raster groups of 4) borrowed at 700 rows:
    6 tile rows (the ragged one counted), which 4 does not divide; the template refits the group
    to 2 rather than refuse the config, and keeps a config the size takes as it is."""
    from tvm_ext.relax.buckets import accepted
    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate
    from tvm_ext.target import offline_cuda

    target = offline_cuda()
    tuned_at_512 = {"wgmma_bm": 128, "wgmma_bn": 64, "wgmma_inflight": 1, "wgmma_raster": 4, "wgmma_smem_epilogue": 1,
                    "wgmma_split_cluster": 0, "wgmma_split_k": 1, "wgmma_stages": 6, "wgmma_tiles": 2}
    at_700 = WgmmaGemmTemplate(700, 3072, 768)
    assert accepted(at_700.space(target), tuned_at_512) is None
    # written before the TMA knob: the values it had
    written = {**tuned_at_512, "wgmma_tma": 0, "wgmma_ws": 0, "wgmma_multicast": 0, "wgmma_pdl": 0,
               "wgmma_wg_cols": 1, "wgmma_c_turns": 0, "wgmma_wg_k": 1}
    assert accepted(at_700.space(target), tuned_at_512, at_700.fitted).as_dict() == {**written, "wgmma_raster": 2}
    at_1500 = WgmmaGemmTemplate(1500, 3072, 768)  # 12 tile rows: 4 divides them
    assert accepted(at_1500.space(target), tuned_at_512, at_1500.fitted).as_dict() == written
    at_900 = WgmmaGemmTemplate(900, 3072, 768)  # 8 tile rows (7 and a ragged one): groups of 8 kept
    assert accepted(at_900.space(target), {**tuned_at_512, "wgmma_raster": 8}, at_900.fitted).as_dict() == \
        {**written, "wgmma_raster": 8}


def test_a_bucket_row_config_is_refitted_to_the_rows_and_length_of_the_size(opencl):
    """A softmax config tuned at sequence 32 (8 rows a block, rows staged) borrowed at 20: 8 rows
    do not divide 20 and 32 threads x 4 elements do not split a row of 20; the template refits to
    4 rows a block with the same threads a row, unstaged, rather than refuse it (dlight), and keeps
    a config the size takes as it is."""
    from tvm_ext.relax.buckets import accepted
    from tvm_ext.schedules.reduce.rows import RowTemplate

    tuned_at_32 = {"block_size": 256, "rows_per_block": 8, "x": 1, "cache": 1}
    at_20 = RowTemplate("softmax", rows=4 * 20, n=20, last_rows=20)
    space = at_20.space(opencl)
    assert accepted(space, tuned_at_32) is None
    assert accepted(space, tuned_at_32, at_20.fitted).as_dict() == {"block_size": 128, "rows_per_block": 4, "x": 1,
                                                                     "cache": 0}
    at_64 = RowTemplate("softmax", rows=4 * 64, n=64, last_rows=64)
    assert accepted(at_64.space(opencl), tuned_at_32, at_64.fitted).as_dict() == tuned_at_32
    short = RowTemplate("softmax", rows=4 * 3, n=3, last_rows=3)  # 3 rows of 3: one row a block, fewer threads
    fitted = accepted(short.space(opencl), {"block_size": 1024, "rows_per_block": 8, "x": 4, "cache": 0}, short.fitted)
    assert fitted is not None and fitted.rows_per_block == 1 and fitted.x == 1


def _borrowed(config, sizes, target):
    """What schedules the float16 MLP's matmul (768 -> 3072) at each of ``sizes`` with ``config``
    its bucket 128's (``borrow_schedules``' note)."""
    from tvm_ext.relax.buckets import borrow_schedules, call_sites, specialize
    from tvm_ext.relax.pipeline import apply_tuned

    how = {}
    for size in sizes:
        static = apply_tuned(specialize(_symbolic_mlp(768, 3072, "float16"), "n", size), target, None, None)
        name = call_sites(static)[0]
        how[size] = borrow_schedules(static, target, {name: [(128, config)]})[1][name]
    return how


def test_a_borrowed_wgmma_config_gets_a_pipeline_its_blocks_share_the_sms_with():
    """64x64 tiles tuned at 128 rows with 8 stages (one block an SM) borrowed at 200 rows: 192
    tiles on 132 SMs, so the template makes the pipeline 6 deep (two blocks an SM) and the
    schedule says so; at 48 rows (48 tiles) the config stays as tuned.  Where no depth lets the
    blocks share the SMs (700 rows: 528 tiles) the size's own pick takes over where its blocks
    can (64x128 tiles, 4 stages), and the config stays where neither can (4096 rows) or the
    tiles are two a block."""
    from tvm_ext.schedules.gemm.wgmma import WgmmaTile
    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate
    from tvm_ext.target import offline_cuda

    target = offline_cuda()
    tuned_at_128 = {"wgmma_bm": 64, "wgmma_bn": 64, "wgmma_inflight": 1, "wgmma_raster": 0, "wgmma_smem_epilogue": 1,
                    "wgmma_split_cluster": 0, "wgmma_split_k": 1, "wgmma_stages": 8, "wgmma_tiles": 1}
    how = _borrowed(tuned_at_128, (200, 48), target)
    assert how == {200: "bucket 128 (wgmma_stages 6 here)", 48: "bucket 128"}
    at_700 = WgmmaGemmTemplate(700, 3072, 768)  # 528 tiles: four blocks an SM fit at no depth
    config = at_700.space(target).make(**tuned_at_128, wgmma_tma=0, wgmma_ws=0, wgmma_multicast=0, wgmma_pdl=0,
                                       wgmma_wg_cols=1, wgmma_c_turns=0, wgmma_wg_k=1)
    assert at_700.resized(config, target) == at_700.default_config(target)
    assert WgmmaTile.of(at_700.default_config(target)) == WgmmaTile(64, 128, 4, 1, True, 0, tma=True, pdl=True)
    at_4096 = WgmmaGemmTemplate(4096, 3072, 768)
    at_4096_config = at_4096.space(target).make(**tuned_at_128, wgmma_tma=0, wgmma_ws=0, wgmma_multicast=0,
                                                wgmma_pdl=0, wgmma_wg_cols=1, wgmma_c_turns=0, wgmma_wg_k=1)
    assert at_4096.resized(at_4096_config, target) == at_4096_config
    two_a_block = config.replace(wgmma_tiles=2)
    assert WgmmaGemmTemplate(200, 3072, 768).resized(two_a_block, target) == two_a_block


def test_a_size_no_bucket_config_fits_takes_its_own_pick_rather_than_dlight():
    """A config with K split, tuned at 128 rows, borrowed at 200: the split kernel does not guard a
    ragged M, so the size refuses it, and the function takes its template's pick at 200 rows (no
    measurement) rather than falling back to dlight (on the H200 a whole BERT at 100 tokens ran at
    0.43 of a model tuned for that size with three of its matmuls on dlight this way)."""
    from tvm_ext.target import offline_cuda

    target = offline_cuda()
    split_at_128 = {"wgmma_bm": 64, "wgmma_bn": 64, "wgmma_inflight": 1, "wgmma_raster": 0, "wgmma_smem_epilogue": 0,
                    "wgmma_split_cluster": 0, "wgmma_split_k": 2, "wgmma_stages": 4, "wgmma_tiles": 1, "wgmma_tma": 0,
                    "wgmma_ws": 0, "wgmma_multicast": 0, "wgmma_pdl": 0, "wgmma_wg_cols": 1, "wgmma_c_turns": 0,
                    "wgmma_wg_k": 1}
    assert _borrowed(split_at_128, (200, 128), target) == {200: "pick", 128: "bucket 128"}


def test_each_bucket_is_tuned_and_its_configs_written(tuned):
    assert len(tuned["results"]) == 2
    for result in tuned["results"]:  # the matmul with its bias and GELU, tuned at each size
        assert any(t.template == "gemm" and t.exported for t in result.tasks)
    with open(os.path.join(tuned["database"], BUCKETS_FILE), encoding="utf-8") as fh:
        data = json.load(fh)
    assert data["var"] == "n" and data["sizes"] == [4, 16]
    assert set(data["calls"]) == {"0"} and set(data["calls"]["0"]) == {"4", "16"}  # the one call, both sizes
    assert "matmul" in data["calls"]["0"]["16"]["function"]
    buckets, calls, grus = read_buckets(tuned["database"])
    assert grus == {} and data["grus"] == {}  # no GRU layer
    assert buckets == Buckets("n", (4, 16)) and calls[0][16] == data["calls"]["0"]["16"]["config"]


def test_calls_dispatch_on_the_size(tuned, opencl):
    model = BucketedModel(tuned["mod"], opencl, tuned["database"])
    name = "fused_matmul_add_gelu"
    rng = np.random.default_rng(0)
    for size, how in ((4, "database"), (16, "database"), (10, "bucket 16"), (3, "bucket 4"), (24, "bucket 16")):
        x = rng.standard_normal((size, IN)).astype("float32")
        out = model(x)
        assert out.shape == (size, OUT)
        np.testing.assert_allclose(out, _reference(x), rtol=1e-4, atol=1e-4)
        assert model.schedules[size][name] == how, (size, model.schedules[size])
    assert model.model(10) is model.model(10)  # compiled once per size


def test_bad_buckets_and_inputs(tuned, opencl):
    assert symbolic_vars(tuned["mod"]) == {"n": [(0, 0)]}
    with pytest.raises(TvmExtError, match="model's symbolic dimensions are n"):
        tune_buckets(tuned["mod"], opencl, "r.jsonl", "db", Buckets("tokens", (4,)), lambda m: None)
    with pytest.raises(TvmExtError, match="has no tvm_ext_buckets.json"):
        BucketedModel(tuned["mod"], opencl, os.path.dirname(tuned["database"]))
    model = BucketedModel(tuned["mod"], opencl, tuned["database"])
    with pytest.raises(TvmExtError, match="at least 1"):
        model(np.zeros((0, IN), "float32"))


def _tune_example(tmp_path, example: str, seq: int, sizes: str):
    """``tune model examples/EXAMPLE`` with a symbolic sequence length, its inputs ``seq`` long,
    tuned at ``--buckets seq=SIZES`` (a tiny search, seeded): the command and its finished run."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", example)
    cmd = [sys.executable, "-m", "tvm_ext.tune", "model", path, "--model-option", "symbolic=1", "--model-option",
           f"seq={seq}", "--buckets", f"seq={sizes}", "--generations", "1", "--population", "2", "--seed", "0",
           "--records", str(tmp_path / "r.jsonl"), "--database", str(tmp_path / "db"), "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return cmd, p


def test_cli_tunes_bert_at_buckets_and_runs_between_them(tmp_path):
    """The BERT layer with a symbolic sequence length, ``--buckets seq=8,16``, run at 12: every
    matched function takes bucket 16's config for its call, though some functions are named
    differently at 16 (there the two attention matmuls are one function) than at 12."""
    cmd, p = _tune_example(tmp_path, "bert_layer.py", 12, "8,16")
    assert "seq = 8 " in p.stdout and "seq = 16 " in p.stdout and "(ok)" in p.stdout
    (line,) = [line for line in p.stdout.splitlines() if line.startswith("seq = 12:")]
    how = dict(part.split(" ", 1) for part in line[len("seq = 12: "):].split(", "))  # function -> where from
    gemms = {name: h for name, h in how.items() if "matmul" in name}
    assert len(gemms) >= 5 and set(gemms.values()) == {"bucket 16"}, line
    bad = subprocess.run(cmd[:4] + ["--buckets", "tokens=4"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "Traceback" not in bad.stderr


def test_cli_gru_model_with_a_symbolic_step_count(tmp_path, opencl):
    """The GRU model with T symbolic, ``--buckets seq=4,8``, run at 7: its GRU layer on bucket 8's
    tuned plan config (the GRU is not a call_tir: its configs are kept by layer order) and its
    head GEMM on bucket 8's config, checked against float64."""
    cmd, p = _tune_example(tmp_path, "gru_model.py", 7, "4,8")
    gru = cmd[4]
    assert "seq = 7: fused_matmul_add bucket 8, gru gru bucket 8" in p.stdout and "(ok)" in p.stdout
    with open(tmp_path / "db" / BUCKETS_FILE, encoding="utf-8") as fh:
        grus = json.load(fh)["grus"]
    assert set(grus["0"]) == {"4", "8"}
    # in this process: the plan compiled at 7 steps is bucket 8's config
    import importlib.util

    from tvm_ext.relax.relax_gru import _PROGRAMS

    spec = importlib.util.spec_from_file_location("gru_model_example", gru)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = BucketedModel(example.get_module(symbolic="1", seq="7"), opencl, str(tmp_path / "db"))
    (tokens,) = example.get_inputs(seq="7")
    before = set(_PROGRAMS)  # plans other tests of this process compiled (a 7-step GRU among them)
    out = model(tokens)
    assert np.abs(out - example.reference([tokens])).max() < 1e-4
    (program,) = [p for key, p in _PROGRAMS.items() if key not in before and p.template.seq == 7]
    assert program.config.as_dict() == grus["0"]["8"]["config"]
    assert model.schedules[7]["gru gru"] == "bucket 8"
    (tokens,) = example.get_inputs(seq="8")  # a bucket: the database's own config
    assert np.abs(model(tokens) - example.reference([tokens])).max() < 1e-4
    assert model.schedules[8] == {"fused_matmul_add": "database", "gru gru": "database"}


def _dynamic_onnx(path) -> np.ndarray:
    """An ONNX model ``relu(x · w)`` whose input x is (batch, 16), ``batch`` a named symbolic
    dimension (as exporters mark dynamic axes); returns w."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(5).standard_normal((IN, OUT)).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", OUT])], [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return w


def test_onnx_dynamic_axis_sized_by_option_or_tuned_at_buckets(tmp_path, opencl):
    """An ONNX file's named dynamic axis: ``--model-option batch=N`` sizes it (bound in the module
    and in the inputs); with ``--buckets batch=...`` it stays symbolic and only the inputs take the
    size; unsized, one error line says how to give one."""
    from tvm_ext.cli.model_cli import OnnxModel

    path = tmp_path / "dyn.onnx"
    w = _dynamic_onnx(path)
    user = OnnxModel(str(path))
    assert symbolic_vars(user.get_module()) == {"batch": [(0, 0)]}
    assert symbolic_vars(user.get_module(batch="5")) == {} and user.get_inputs(batch="5")[0].shape == (5, IN)
    with pytest.raises(TvmExtError, match="symbolic dimensions \\(batch\\)"):
        user.get_module(tokens="5")
    with pytest.raises(TvmExtError, match="symbolic dimension batch; give it a size: --model-option batch=N"):
        user.get_inputs()
    base = [sys.executable, "-m", "tvm_ext.tune", "model", str(path), "--generations", "1", "--population", "2",
            "--records", str(tmp_path / "r.jsonl"), "--database", str(tmp_path / "db"), "--no-progress"]
    unsized = subprocess.run(base, capture_output=True, text=True, timeout=600)
    assert unsized.returncode == 2 and "Traceback" not in unsized.stderr
    (error,) = [line for line in unsized.stderr.splitlines() if line.startswith("error:")]
    assert "--buckets" in error or "--model-option batch=N" in error  # OpenCL needs static shapes first
    p = subprocess.run(base + ["--buckets", "batch=4,8", "--model-option", "batch=6"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "batch = 6: " in p.stdout and "bucket 8" in p.stdout
    model = BucketedModel(user.get_module(), opencl, str(tmp_path / "db"))
    (x,) = user.get_inputs(batch="6")
    np.testing.assert_allclose(model(x), np.maximum(x.astype(np.float64) @ w, 0), rtol=1e-4, atol=1e-4)


def _causal_onnx(path) -> np.ndarray:
    """An ONNX model of a causal mask as exporters write transformers' (positions by ``Range`` to
    the sequence length read with ``Shape``, broadcast by ``Expand`` to (seq, seq)): ``cumsum(x) · w``
    as ``(mask · x + x) · w`` on x (seq, 16), ``seq`` a named symbolic dimension; returns w."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(6).standard_normal((IN, OUT)).astype("float32")
    consts = [numpy_helper.from_array(np.array(v, "int64"), n) for n, v in
              (("zero", 0), ("one", 1), ("ax0", [0]), ("ax1", [1]))] + [numpy_helper.from_array(w, "w")]
    node = helper.make_node
    graph = helper.make_graph([
        node("Shape", ["x"], ["shape"]), node("Gather", ["shape", "zero"], ["n"], axis=0),
        node("Range", ["zero", "n", "one"], ["pos"]),
        node("Unsqueeze", ["pos", "ax0"], ["row"]), node("Unsqueeze", ["pos", "ax1"], ["col"]),
        node("Unsqueeze", ["n", "ax0"], ["n1"]), node("Concat", ["n1", "n1"], ["square"], axis=0),
        node("Expand", ["row", "square"], ["rows"]), node("Expand", ["col", "square"], ["cols"]),
        node("Less", ["rows", "cols"], ["below"]), node("Cast", ["below"], ["mask"], to=TensorProto.FLOAT),
        node("MatMul", ["mask", "x"], ["before"]), node("Add", ["before", "x"], ["sums"]),
        node("MatMul", ["sums", "w"], ["y"])], "causal",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", OUT])], consts)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return w


def test_onnx_causal_mask_of_a_symbolic_length_is_tuned_at_buckets(tmp_path, opencl):
    """A mask made from the symbolic sequence length (``Range`` to it, ``Expand`` to (seq, seq)),
    as torch's exporter writes transformers' masks with a dynamic axis, imports with every shape
    in ``seq`` (TVM's ``Expand`` stopped on such shapes, its ``Range`` gave a fresh size no shape
    relates to ``seq``), so the mask's GEMM is tuned at each bucket and runs between them."""
    from tvm_ext.cli.model_cli import OnnxModel

    path = tmp_path / "causal.onnx"
    w = _causal_onnx(path)
    user = OnnxModel(str(path))
    assert set(symbolic_vars(user.get_module())) == {"seq"}
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "model", str(path), "--generations", "1",
                        "--population", "2", "--records", str(tmp_path / "r.jsonl"), "--database",
                        str(tmp_path / "db"), "--no-progress", "--buckets", "seq=8,16", "--model-option", "seq=12"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "gemm m=16 n=16 k=16" in p.stdout and "gemm m=8 n=16 k=8" in p.stdout  # the mask's GEMM at each
    assert "seq = 12: " in p.stdout and "max |error| vs reference" in p.stdout and "(ok)" in p.stdout
    again = subprocess.run(p.args[:-2], capture_output=True, text=True, timeout=600)  # no size: the largest bucket
    assert again.returncode == 0 and "running at seq = 16, the largest bucket" in again.stdout, again.stderr
    assert "(ok)" in again.stdout and "tuning gemm" not in again.stdout
    model = BucketedModel(user.get_module(), opencl, str(tmp_path / "db"))
    for seq in (5, 12, 16):
        (x,) = user.get_inputs(seq=str(seq))
        np.testing.assert_allclose(model(x), np.cumsum(x.astype(np.float64), axis=0) @ w, rtol=1e-4, atol=1e-4)
        assert "bucket" in " ".join(model.schedules[seq].values()) or seq == 16


def _dynamic_pt2(path):
    """A torch.export program ``GELU(x · Wᵀ + b)`` on x (n, 16), n a ``torch.export.Dim`` from 2
    to 64, saved to ``path``; returns the module (for its reference)."""
    torch = pytest.importorskip("torch")

    class Up(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(IN, OUT)

        def forward(self, x):
            return torch.nn.functional.gelu(self.fc(x))

    torch.manual_seed(0)
    module = Up().eval()
    tokens = torch.export.Dim("tokens", min=2, max=64)
    program = torch.export.export(module, (torch.randn(10, IN),), dynamic_shapes={"x": {0: tokens}})
    torch.export.save(program, str(path))
    return module


def test_pt2_symbolic_size_sized_by_option_or_tuned_at_buckets(tmp_path, opencl):
    """A ``torch.export`` program with a dynamic token count: its dimension under torch's name
    (``s77``), with the range it was exported for; ``--model-option`` sizes it within that range;
    ``--buckets`` tunes it kept symbolic (sizes outside the range refused) and the bucketed model
    matches torch at a size between the buckets; unsized, one error line says how to give one."""
    import torch

    from tvm_ext.cli.model_cli import ExportedProgramModel

    path = tmp_path / "dyn.pt2"
    module = _dynamic_pt2(path)
    user = ExportedProgramModel(str(path))
    ((name, bounds),) = user.symbolic_dims.items()
    assert bounds == (2, 64)
    assert symbolic_vars(user.get_module()) == {name: [(0, 0)]}
    assert symbolic_vars(user.get_module(**{name: "5"})) == {} and user.get_inputs(**{name: "5"})[0].shape == (5, IN)
    with pytest.raises(TvmExtError, match="a size from 2 to 64"):
        user.get_inputs(**{name: "65"})
    with pytest.raises(TvmExtError, match=f"give it a size: --model-option {name}=N"):
        user.get_inputs()
    with pytest.raises(TvmExtError, match=f"symbolic dimensions \\({name} \\(2..64\\)\\)"):
        user.get_module(tokens="5")
    base = [sys.executable, "-m", "tvm_ext.tune", "model", str(path), "--generations", "1", "--population", "2",
            "--records", str(tmp_path / "r.jsonl"), "--database", str(tmp_path / "db"), "--no-progress"]
    outside = subprocess.run(base + ["--buckets", f"{name}=4,128", "--model-option", f"{name}=6"],
                             capture_output=True, text=True, timeout=600)
    assert outside.returncode == 2 and "Traceback" not in outside.stderr
    assert [line for line in outside.stderr.splitlines() if line.startswith("error:")] == \
        [f"error: --buckets {name}=128: a size from 2 to 64"]
    p = subprocess.run(base + ["--buckets", f"{name}=4,8", "--model-option", f"{name}=6"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"{name} = 6: " in p.stdout and "bucket 8" in p.stdout
    model = BucketedModel(user.get_module(), opencl, str(tmp_path / "db"))
    (x,) = user.get_inputs(**{name: "6"})
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).double().numpy()
    (out,) = model(x)  # the program's outputs, a tuple of one
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
