"""The row template (softmax, layer norm, RMS norm, sum, mean, max over the last axis) on PoCL:
each op under configs that exercise every knob, through the tuner's own build-and-check path."""
from __future__ import annotations

import pytest
from build_check import run_config

from tvm_ext.operators import get_template_class
from tvm_ext.schedules.reduce.rows import OPS, RowTemplate

CONFIGS = [  # threads per row = block_size / rows_per_block
    dict(block_size=32, rows_per_block=1, x=1, cache=0),
    dict(block_size=64, rows_per_block=2, x=2, cache=1),  # 32 threads x 2 elements, rows in shared memory
    dict(block_size=128, rows_per_block=4, x=4, cache=1),  # 4-wide vector loads of the staged rows
    dict(block_size=256, rows_per_block=2, x=4, cache=0),  # 128 threads x 4 > n: guarded lanes
]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("knobs", CONFIGS, ids=lambda k: "-".join(f"{v}" for v in k.values()))
def test_every_op_and_knob_matches_numpy(opencl, op, knobs):
    template = RowTemplate(op, rows=12, n=256)
    build = run_config(template, template.space(opencl).make(**knobs), opencl)
    (launch,) = build.artifact.launches  # every stage in one kernel
    assert launch.block == (knobs["block_size"] // knobs["rows_per_block"], knobs["rows_per_block"], 1)
    assert ("__local float X_shared" in build.artifact.source) == bool(knobs["cache"])  # rows staged once


@pytest.mark.parametrize("op", ["softmax", "layer_norm", "mean"])
def test_rows_not_a_multiple_of_anything(opencl, op):
    """13 rows of 100: the last block has a row too many, the row's last pass is partial."""
    template = RowTemplate(op, rows=13, n=100)
    run_config(template, template.default_config(opencl), opencl)
    run_config(template, template.space(opencl).make(block_size=64, rows_per_block=2, x=2, cache=0), opencl)


def test_infeasible_configs_say_why(opencl):
    template = RowTemplate("softmax", rows=12, n=100, last_rows=6)
    space = template.space(opencl)
    reason = lambda **k: space.infeasible_reason(space.make(**k))  # noqa: E731
    assert "split evenly" in reason(block_size=32, rows_per_block=1, x=1, cache=1)
    assert "do not divide the last row axis (6)" in reason(block_size=128, rows_per_block=4, x=1, cache=0)
    assert "fewer than 32 per row" in reason(block_size=32, rows_per_block=2, x=1, cache=0)
    assert "most threads would idle" in reason(block_size=1024, rows_per_block=1, x=1, cache=0)
    half = RowTemplate("softmax", rows=12, n=128, dtype="float16")
    if "float16" not in opencl.float_dtypes:  # PoCL has no cl_khr_fp16
        assert all(not half.space(opencl).is_feasible(c) for c in list(half.space(opencl))[:8])


def test_registered_for_records_and_default_is_feasible(opencl):
    assert get_template_class("rows") is RowTemplate
    for op in OPS:
        template = RowTemplate(op, rows=1024, n=768, last_rows=128)
        config = template.default_config(opencl)
        assert template.space(opencl).is_feasible(config) and 128 % config.rows_per_block == 0
