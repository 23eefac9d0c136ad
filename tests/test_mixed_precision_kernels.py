"""The mixed-precision search (method 003) on Hopper's written kernels: a GEMM's A and B stored as
e4m3 or e5m2 with per-tensor scales on the 8-bit wgmma kernel, and 16-bit pairs with float32 sums
on the wgmma GEMM.  Without a GPU: the space, the reasons, the quantization and its error, which
program each assignment lowers to, the kernels' source (offline sm_90a) and the generated
programs' inputs; ``gpu``: the searches and the programs against float64."""
from __future__ import annotations

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from tvm_ext.core.errors import TvmExtError
from tvm_ext.precision.codegen import export_program, load_program
from tvm_ext.precision.mixed_precision import PrecisionProgram
from tvm_ext.precision.precision import np_dtype, relative_error, scaled_cast
from tvm_ext.schedules.gemm.gemm_programs import EightBitGemmProgram, WgmmaGemmProgram
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.target import offline_cuda

E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"
SHAPE = (128, 192, 256)


def _program(target, shape=SHAPE, dtypes=(), kernels=(EightBitGemmProgram,)):
    gemm = GemmTemplate(*shape)
    return PrecisionProgram(gemm, gemm.default_config(target), dtypes, kernels=kernels)


def test_a_and_b_may_be_8bit_on_hopper_and_nowhere_else(opencl):
    hopper = offline_cuda("sm_90")
    choices = {k.name: k.choices for k in _program(hopper).space(hopper).knobs}
    assert choices["a"] == choices["b"] == ("float32", "float16", "bfloat16", E4M3, E5M2)
    assert choices["acc"] == choices["c"] == ("float32", "float16", "bfloat16")  # never an 8-bit sum or C
    ampere = offline_cuda("sm_80")
    for program, target in ((_program(ampere), ampere), (_program(opencl), opencl),
                            (_program(hopper, kernels=()), hopper)):
        assert all(E4M3 not in k.choices for k in program.space(target).knobs)
    with pytest.raises(TvmExtError, match="wgmma needs a Hopper GPU"):
        _program(ampere, dtypes=(E4M3,)).space(ampere)
    with pytest.raises(TvmExtError, match="gemm has no program storing it"):
        _program(hopper, dtypes=(E4M3,), kernels=()).space(hopper)
    assert _program(hopper, dtypes=(E5M2, "float16")).space(hopper).knob("a").choices == ("float32", E5M2, "float16")


@pytest.mark.parametrize("config, reason", [
    (dict(a=E4M3, b=E4M3, acc="float32", c="float16"), None),
    (dict(a=E5M2, b=E5M2, acc="float32", c="bfloat16"), None),
    (dict(a=E4M3, b="float16", acc="float32", c="float16"), "A and B of one 8-bit type"),
    (dict(a=E4M3, b=E5M2, acc="float32", c="float16"), "A and B of one 8-bit type"),
    (dict(a=E4M3, b=E4M3, acc="float16", c="float16"), "accumulates in float32"),
    (dict(a=E4M3, b=E4M3, acc="float32", c="float32"), "stores C as float16 or bfloat16"),
])
def test_an_8bit_config_is_feasible_where_the_8bit_kernel_takes_it(config, reason):
    hopper = offline_cuda("sm_90")
    space = _program(hopper).space(hopper)
    got = space.infeasible_reason(space.make(**config))
    assert got is None if reason is None else reason in got


def test_a_shape_the_8bit_kernel_cannot_tile_is_refused_with_its_reason():
    hopper = offline_cuda("sm_90")
    space = _program(hopper, shape=(96, 96, 100)).space(hopper)
    assert "no wgmma tile fits 96x96x100" in space.infeasible_reason(space.make(a=E4M3, b=E4M3, acc="float32",
                                                                                c="float16"))


@pytest.mark.parametrize("dtype, top", [(E4M3, 448.0), (E5M2, 57344.0)])
def test_the_8bit_program_scales_each_operand_and_is_judged_on_the_unquantized_inputs(dtype, top):
    hopper = offline_cuda("sm_90")
    program = _program(hopper)
    config = program.space(hopper).make(a=dtype, b=dtype, acc="float32", c="float16")
    operator = program.measured_operator(config)
    assert isinstance(operator, EightBitGemmProgram)
    (qa, qbt, scales), refs = operator.make_case(np.random.default_rng(0))
    a, b = program.base.make_inputs(np.random.default_rng(0))  # the same draw, unquantized
    assert qa.dtype == qbt.dtype == np_dtype(dtype) and qbt.shape == (SHAPE[1], SHAPE[2])
    assert scales.dtype == np.float32 and scales[0] == np.float32(np.abs(a).max() / top)
    assert scales[1] == np.float32(np.abs(b).max() / top)
    assert np.abs(qa.astype(np.float64)).max() == top  # the largest value maps to the format's largest
    mantissa = {E4M3: 3, E5M2: 2}[dtype]
    for q, x, s in ((qa, a, scales[0]), (qbt, b.T, scales[1])):
        normal = np.abs(x) > s * float(ml_dtypes.finfo(np_dtype(dtype)).smallest_normal)
        assert np.all(np.abs(q.astype(np.float64) * s - x)[normal] <= 2.0 ** -(mantissa + 1) * np.abs(x)[normal] * 1.01)
    assert np.allclose(refs[0], a.astype(np.float64) @ b.astype(np.float64))  # float64 of the float inputs
    error = relative_error(operator.reference([qa, qbt, scales]), refs)
    assert {E4M3: 5e-3, E5M2: 1e-2}[dtype] < error < {E4M3: 0.06, E5M2: 0.12}[dtype] < operator.tolerance


def test_the_8bit_program_lowers_back_to_the_float_gemm():
    hopper = offline_cuda("sm_90")
    program = _program(hopper)
    low = program.lowered(program.space(hopper).make(a=E4M3, b=E4M3, acc="float32", c="bfloat16"))
    assert low.precision == {"a": E4M3, "b": E4M3, "acc": "float32", "c": "bfloat16"}
    back = low.with_precision({"a": "float16", "b": "float16"})
    assert back == GemmTemplate(*SHAPE, a_dtype="float16", b_dtype="float16", c_dtype="bfloat16")
    assert low.with_precision({"a": E5M2, "b": E5M2}).operands == (E5M2, E5M2)
    assert low.full_precision() == GemmTemplate(*SHAPE)


def test_the_8bit_program_builds_the_8bit_wgmma_kernel_with_its_scales():
    hopper = offline_cuda("sm_90")
    program = _program(hopper)
    config = program.space(hopper).make(a=E5M2, b=E5M2, acc="float32", c="float16")
    built = program.build_program(config, hopper)
    assert built.params == ("A", "Bt", "scale_ab", "C")
    assert "k32.f32.e5m2.e5m2" in built.source and "scale_ab" in built.source


def test_an_exported_8bit_program_takes_the_float_inputs_and_scales_them(tmp_path):
    hopper = offline_cuda("sm_90")
    program = _program(hopper)
    low = program.lowered(program.space(hopper).make(a=E4M3, b=E4M3, acc="float32", c="float16"))
    manifest = json.loads(open(export_program(low, program.schedule_config, hopper, str(tmp_path))).read())
    assert [(t["name"], t["dtype"]) for t in manifest["tensors"]] == [
        ("A", E4M3), ("Bt", E4M3), ("scale_ab", "float32"), ("C", "float16")]
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(SHAPE[::2]).astype(np.float32), rng.standard_normal(SHAPE[:0:-1]).astype(np.float32)
    qa, qbt, scales = load_program(str(tmp_path))._prepare([a, b])
    assert np.array_equal(qa.view(np.uint8), scaled_cast(a, E4M3)[0].view(np.uint8))
    assert np.array_equal(qbt.view(np.uint8), scaled_cast(b.T, E4M3)[0].view(np.uint8))
    assert list(scales) == [np.float32(scaled_cast(a, E4M3)[1]), np.float32(scaled_cast(b.T, E4M3)[1])]
    assert len(load_program(str(tmp_path))._prepare([qa, qbt, scales])) == 3  # its own tensors, as they are
    for bad in (np.inf, np.nan):  # no scale fits: one error, not a program of zeros
        with pytest.raises(TvmExtError, match="needs finite values for its scale"):
            load_program(str(tmp_path))._prepare([np.where(a > 1, bad, a), b])
    with pytest.raises(TvmExtError, match="input b must have shape"):
        load_program(str(tmp_path))._prepare([a, b.T])
    for damage in ([9, 1], [2, 2], [1, 0], ["2", 0]):  # a damaged manifest: one error, never an IndexError
        manifest["float_inputs"][1]["scale"] = damage
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(TvmExtError, match="names no tensor of the program"):
            load_program(str(tmp_path))._prepare([a, b])


def test_the_predictor_reads_8bit_operands_as_the_narrowest():
    from tvm_ext.cost_model.precision import PrecisionPredictor

    hopper = offline_cuda("sm_90")
    program = _program(hopper)
    space = program.space(hopper)
    configs = [space.make(a=d, b=d, acc="float32", c="float16") for d in ("float32", "float16", E4M3, E5M2)]
    featurizer = PrecisionPredictor(program, hopper, 1e-2).speed.featurizer
    x, names = featurizer(configs), featurizer.names
    mantissa = x[:, names.index("min_mantissa")]
    assert list(mantissa) == [10.0, 10.0, 3.0, 2.0]  # C is float16 in all four
    assert list(x[:, names.index("mean_storage_bits")]) == [28.0, 20.0, 16.0, 16.0]  # acc float32 in all four


def test_cli_8bit_types_where_no_8bit_gemm_runs_are_one_error_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "tvm_ext.tune", "mixed-precision", "gemm", "--shape", "8,8,8",
                        "--dtypes", "float8_e4m3fn", "--records", str(tmp_path / "r.jsonl")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error: float8_e4m3fn: wgmma is a CUDA (Hopper, sm_90) instruction")
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.gpu
def test_the_search_measures_8bit_programs_and_the_chosen_one_reproduces_its_error(tmp_path):
    """On the GPU: a search allowed e4m3 and float16 at a bound e4m3 meets; the 8-bit program
    ran, checked against float64 at e4m3's error, and is chosen; the exported program, given
    float inputs, reproduces that error."""
    from tvm_ext.core.records import RecordStore
    from tvm_ext.core.tuner import Tuner
    from tvm_ext.measure.builder import LocalBuilder
    from tvm_ext.measure.runner import LocalRunner, MeasureSettings
    from tvm_ext.precision.mixed_precision import MixedPrecisionSearch, MixedPrecisionSettings, error_of
    from tvm_ext.target import resolve_target

    cuda = resolve_target("cuda")
    program = _program(cuda, shape=(1024, 1024, 1024), dtypes=(E4M3, "float16"))
    tuner = Tuner(program, cuda, LocalBuilder(workers=2, timeout=300), LocalRunner(cuda, MeasureSettings()),
                  RecordStore(str(tmp_path / "r.jsonl")))
    # 17 configs are feasible (16 float ones, one 8-bit): the search sees most of them
    settings = MixedPrecisionSettings(error_bound=0.06, max_measurements=24, population=6, generated=64, measured=8)
    try:
        result = MixedPrecisionSearch(tuner, settings).run()
    finally:
        tuner.builder.close()
        tuner.runner.close()
    runnable = dict(a=E4M3, b=E4M3, acc="float32", c="float16")  # the one 8-bit config the 8-bit kernel takes
    eight = [r for r in RecordStore(str(tmp_path / "r.jsonl")) if r.config == runnable]
    assert eight and all(r.ok and 5e-3 < error_of(r) < 0.06 for r in eight), [r.error_msg for r in eight]
    assert result.best.config == runnable  # on wgmma, against float types on the CUDA cores: the fastest
    chosen = program.lowered(tuner.space.make(**result.best.config))
    out = tmp_path / "prog"
    export_program(chosen, program.schedule_config, cuda, str(out))
    a, b = program.base.make_inputs(np.random.default_rng(0))
    (c,) = load_program(str(out)).run(a, b)
    assert relative_error([c], [a.astype(np.float64) @ b.astype(np.float64)]) < 0.06


def test_a_child_that_draws_an_8bit_operand_is_completed_to_the_8bit_program():
    """S5 gives each gene its own draw; the 8-bit program needs four at once (one 8-bit type
    for A and B, float32 sums, a 16-bit C), so children are completed to it, or a search would
    almost never reach it (on the GPU, two searches of 24 measurements did not)."""
    from types import SimpleNamespace

    from tvm_ext.precision.mixed_precision import MixedPrecisionSearch, MixedPrecisionSettings

    hopper = offline_cuda("sm_90")
    program = _program(hopper)
    space = program.space(hopper)
    drawn = space.make(a="bfloat16", b=E5M2, acc="float16", c="float32")
    assert program.completed(drawn, space).as_dict() == dict(a=E5M2, b=E5M2, acc="float32", c="float16")
    floats = space.make(a="float16", b="float32", acc="float16", c="bfloat16")
    assert program.completed(floats, space) is floats
    only_bf16 = _program(hopper, dtypes=(E4M3, "bfloat16"))
    bf16_space = only_bf16.space(hopper)
    assert only_bf16.completed(bf16_space.make(a=E4M3, b="float32", acc="float32", c="float32"),
                               bf16_space)["c"] == "bfloat16"
    tuner = SimpleNamespace(template=program, space=space, target=hopper)  # what generation reads of a tuner
    search = MixedPrecisionSearch(tuner, MixedPrecisionSettings(generated=64, seed=0))
    start = program.default_config(hopper)
    children = search._generate([start], [start], np.ones(4, dtype=bool))
    eight_bit = [c for c in children if c["a"] in (E4M3, E5M2) or c["b"] in (E4M3, E5M2)]
    assert eight_bit and all(space.is_feasible(c) for c in eight_bit)


def test_the_8bit_programs_inputs_reach_the_measuring_side_as_made_not_redrawn():
    """A worker redraws a float program's inputs from the seed and rounds them; the 8-bit
    program's are scaled and transposed, so they travel (on the GPU the redrawn ones gave
    error 1)."""
    from tvm_ext.measure.checks import NormwiseCheck
    from tvm_ext.measure.measure import MeasureSettings, job_case
    from tvm_ext.remote.messages import case_from_plain, case_to_plain
    from tvm_ext.remote.wire import decode, encode

    hopper = offline_cuda("sm_90")
    program = _program(hopper)
    space = program.space(hopper)
    settings = MeasureSettings()
    assert job_case(program, space.make(a="float16", b="float16", acc="float32", c="float16"), settings)[0] is None
    drawn, refs, _ = job_case(program, space.make(a=E4M3, b=E4M3, acc="float32", c="float16"), settings)
    made, made_refs = program.measured_operator(space.make(a=E4M3, b=E4M3, acc="float32",
                                                           c="float16")).make_case(np.random.default_rng(settings.seed))
    assert [x.dtype for x in drawn] == [np_dtype(E4M3), np_dtype(E4M3), np.float32]
    assert all(np.array_equal(x.view(np.uint8), y.view(np.uint8)) for x, y in zip(drawn, made))
    assert np.array_equal(refs[0], made_refs[0])
    header = decode("case", encode("case", case_to_plain((drawn, refs, NormwiseCheck(0.3))), None), None)
    got = case_from_plain({k: v for k, v in header.items() if k != "kind"})[0]
    assert all(np.array_equal(x.view(np.uint8), y.view(np.uint8)) and x.dtype == y.dtype for x, y in zip(got, drawn))


# ---- 16-bit pairs with float32 sums on the wgmma kernel -----------------------------------------------
BOTH = (EightBitGemmProgram, WgmmaGemmProgram)


@pytest.mark.parametrize("config, lowered_to", [
    (dict(a="float16", b="float16", acc="float32", c="float32"), WgmmaGemmProgram),
    (dict(a="bfloat16", b="bfloat16", acc="float32", c="float16"), WgmmaGemmProgram),
    (dict(a="float16", b="float16", acc="float16", c="float16"), GemmTemplate),  # float16 sums: the tile's
    (dict(a="bfloat16", b="float16", acc="float32", c="float32"), GemmTemplate),
    (dict(a=E4M3, b=E4M3, acc="float32", c="float16"), EightBitGemmProgram),
])
def test_each_assignment_runs_on_the_first_kernel_program_that_takes_it(config, lowered_to):
    hopper = offline_cuda("sm_90")
    program = _program(hopper, kernels=BOTH)
    space = program.space(hopper)
    lowered = program.lowered(space.make(**config))
    assert type(lowered) is lowered_to and lowered.precision == config
    assert space.infeasible_reason(space.make(**config)) is None


def test_the_wgmma_program_builds_the_16bit_wgmma_kernel_reading_b_as_stored():
    hopper = offline_cuda("sm_90")
    program = _program(hopper, kernels=BOTH)
    config = program.space(hopper).make(a="float16", b="float16", acc="float32", c="float32")
    built = program.build_program(config, hopper)
    assert len(built.params) == 3 and "k16.f32.f16.f16" in built.source
    assert "float* __restrict__ C" in built.source  # C stored as float32, straight from the sums
    operator = program.measured_operator(config)
    assert [s.shape for s in operator.inputs()] == [(SHAPE[0], SHAPE[2]), (SHAPE[2], SHAPE[1])]  # B as [K, N]
    assert operator.case_drawn_from_seed  # rounded float inputs: a worker draws them itself


def test_the_cli_gives_the_wgmma_program_on_hopper_with_the_automatic_tile_only():
    from argparse import Namespace

    from tvm_ext.cli.operator_cli import gemm_kernel_programs

    hopper, ampere = offline_cuda("sm_90"), offline_cuda("sm_80")
    assert gemm_kernel_programs(Namespace(tensor_core="auto"), hopper) == BOTH
    assert gemm_kernel_programs(Namespace(tensor_core="mma"), hopper) == (EightBitGemmProgram,)
    assert gemm_kernel_programs(Namespace(tensor_core="none"), hopper) == (EightBitGemmProgram,)
    assert gemm_kernel_programs(Namespace(tensor_core="auto"), ampere) == (EightBitGemmProgram,)
    note = _program(hopper, kernels=BOTH).tensor_core_note(hopper)
    assert WgmmaGemmProgram.NOTE in note and EightBitGemmProgram.NOTE in note


def test_an_exported_wgmma_program_takes_its_float_inputs(tmp_path):
    hopper = offline_cuda("sm_90")
    program = _program(hopper, kernels=BOTH)
    low = program.lowered(program.space(hopper).make(a="bfloat16", b="bfloat16", acc="float32", c="float32"))
    manifest = json.loads(open(export_program(low, program.schedule_config, hopper, str(tmp_path))).read())
    assert manifest["operator"] == "gemm_wgmma_program" and "float_inputs" not in manifest
    assert [t["dtype"] for t in manifest["tensors"]] == ["bfloat16", "bfloat16", "float32"]
    a = np.random.default_rng(0).standard_normal(SHAPE[::2]).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(SHAPE[:0:-1]).astype(np.float32)
    prepared = load_program(str(tmp_path))._prepare([a, b])
    assert prepared[0].dtype == np_dtype("bfloat16") and prepared[1].shape == (SHAPE[2], SHAPE[1])


@pytest.mark.gpu
def test_the_wgmma_program_runs_a_16bit_search_on_the_gpu(tmp_path):
    """On the GPU: float16 A and B with float32 sums run on the wgmma program, checked against
    float64 within float16's rounding, and no slower than the same types on mma.sync's tile."""
    from tvm_ext.core.records import RecordStore
    from tvm_ext.core.tuner import Tuner
    from tvm_ext.measure.builder import LocalBuilder
    from tvm_ext.measure.runner import LocalRunner, MeasureSettings
    from tvm_ext.precision.mixed_precision import error_of
    from tvm_ext.schedules.gemm.tensor_core import pick_tile
    from tvm_ext.target import resolve_target

    cuda = resolve_target("cuda")
    shape = (2048, 2048, 2048)
    gemm = GemmTemplate(*shape, tensor_core=pick_tile([shape], cuda))
    results = {}
    for kernels in ((WgmmaGemmProgram,), ()):
        program = PrecisionProgram(gemm, gemm.default_config(cuda), ("float16",), kernels=kernels)
        tuner = Tuner(program, cuda, LocalBuilder(workers=1, timeout=300), LocalRunner(cuda, MeasureSettings()),
                      RecordStore(str(tmp_path / f"r{len(kernels)}.jsonl")))
        config = tuner.space.make(a="float16", b="float16", acc="float32", c="float32")
        try:
            tuner.evaluate([config])
        finally:
            tuner.builder.close()
            tuner.runner.close()
        results[kernels] = tuner.record_of(config)
        assert results[kernels].ok and error_of(results[kernels]) < 1e-3, results[kernels].error_msg
    assert results[(WgmmaGemmProgram,)].cost <= results[()].cost
