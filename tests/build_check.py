"""One config built and run once on the device, checked against float64: the tuner's own path,
for template tests that walk the knobs."""
from __future__ import annotations

from tvm_ext.measure.builder import BuildResult, build_one
from tvm_ext.measure.measure import MeasureSettings, measure

ONCE = MeasureSettings(warmup=0, repeat=1, min_repeat_secs=0.0)


def run_config(template, config, target, settings: MeasureSettings = ONCE) -> BuildResult:
    space = template.space(target)
    assert space.is_feasible(config), space.infeasible_reason(config)
    build = build_one(template, config, target)
    assert build.ok, f"{config}: {build.error_msg}"
    result = measure(template, build.config, build.artifact, target, settings)
    assert result.ok, f"{template.describe()} {config}: {result.error_kind} {result.error_msg}"
    return build
