"""A precision is only offered where the target really computes in it.

TVM's OpenCL code stores bfloat16 tensors as 16-bit words but does bfloat16
arithmetic in float32 (the accumulator of a "bfloat16" GEMM is a ``float`` array), so
on OpenCL a bfloat16 accumulator or math type is infeasible, with that reason, and
is never measured, recorded or exported as if it were bfloat16.  On CUDA it is real.
"""
from __future__ import annotations

import math
import re

import pytest

from tvm_ext.measure.builder import LocalBuilder, compile_module
from tvm_ext.precision.codegen import export_program
from tvm_ext.core.errors import TvmExtError
from tvm_ext.precision.mixed_precision import PrecisionProgram
from tvm_ext.core.records import RecordStore
from tvm_ext.measure.runner import LocalRunner, MeasureSettings
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.schedules.gru import GruTemplate
from tvm_ext.target import offline_cuda
from tvm_ext.core.tuner import Tuner

FAST = MeasureSettings(warmup=1, repeat=3, min_repeat_secs=0.002)
REASON = "OpenCL has no bfloat16 arithmetic"


def _accumulator_decl(template, target) -> str:
    """The declaration of the GEMM's register accumulator in the generated source."""
    sch = template.schedule(template.default_config(target), target)
    _, source, _, _ = compile_module(sch.mod, target)
    return re.search(r"^\s*(?:alignas\(\d+\) )?(\w+) C(?:_pad)?_local_ptr\[", source, re.M).group(1)


def test_tvm_computes_opencl_bfloat16_in_float32_but_cuda_in_bfloat16(opencl):
    """Why the rule exists (if TVM ever emulates bfloat16 on OpenCL, this fails and the rule can go)."""
    gemm = GemmTemplate(32, 32, 32).with_precision({"acc": "bfloat16"})
    assert _accumulator_decl(gemm, opencl) == "float"
    assert _accumulator_decl(gemm, offline_cuda()) == "nv_bfloat16"


def test_bfloat16_accumulator_is_infeasible_on_opencl_only(opencl):
    gemm = GemmTemplate(32, 32, 32)
    program = PrecisionProgram(gemm, gemm.default_config(opencl), ("bfloat16",))
    space = program.space(opencl)
    acc = space.make(a="float32", b="float32", acc="bfloat16", c="float32")
    storage = space.make(a="bfloat16", b="bfloat16", acc="float32", c="bfloat16")
    assert REASON in space.infeasible_reason(acc) and "acc=bfloat16" in space.infeasible_reason(acc)
    assert space.infeasible_reason(storage) is None  # bfloat16 storage is real on OpenCL
    lowered = gemm.with_precision({"acc": "bfloat16"})
    assert REASON in lowered.space(opencl).infeasible_reason(lowered.default_config(opencl))
    cuda = offline_cuda()
    assert lowered.space(cuda).infeasible_reason(lowered.default_config(cuda)) is None


def test_gru_bfloat16_math_and_accumulators_are_infeasible_on_opencl(opencl):
    gru = GruTemplate(batch=2, hidden=8, input=4, seq=3)
    program = PrecisionProgram(gru, gru.default_config(opencl), ("bfloat16",))
    space = program.space(opencl)
    base = {p.name: "float32" for p in program.precision_params()}
    for name in ("cell_math", "in_acc", "hid_acc"):
        reason = space.infeasible_reason(space.make(**{**base, name: "bfloat16"}))
        assert reason and REASON in reason and name in reason
    assert space.infeasible_reason(space.make(**{**base, "w_ih": "bfloat16", "gi": "bfloat16"})) is None


def test_a_bfloat16_accumulator_is_never_measured_on_opencl(opencl, tmp_path):
    gemm = GemmTemplate(32, 32, 32)
    program = PrecisionProgram(gemm, gemm.default_config(opencl), ("bfloat16",))
    path = tmp_path / "r.jsonl"
    tuner = Tuner(program, opencl, LocalBuilder(workers=1, timeout=120), LocalRunner(opencl, FAST),
                  RecordStore(path))
    acc = tuner.space.make(a="bfloat16", b="bfloat16", acc="bfloat16", c="float32")
    storage = tuner.space.make(a="bfloat16", b="bfloat16", acc="float32", c="float32")
    try:
        costs = tuner.evaluate([acc, storage])
    finally:
        tuner.builder.close()
        tuner.runner.close()
    assert math.isinf(costs[0]) and math.isfinite(costs[1])
    assert [r.config["acc"] for r in RecordStore(path)] == ["float32"]


def test_export_refuses_a_precision_the_target_cannot_honour(opencl, tmp_path):
    gemm = GemmTemplate(16, 16, 16).with_precision({"acc": "bfloat16"})
    with pytest.raises(TvmExtError, match=REASON):
        export_program(gemm, GemmTemplate(16, 16, 16).default_config(opencl), opencl, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
