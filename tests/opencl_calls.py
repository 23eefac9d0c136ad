"""Running written kernels (PrimFuncs called in order, no template) on PoCL, for tests."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np


def run_calls(opencl: Any, funcs: Mapping[str, Any], calls: Sequence[tuple[str, tuple[str, ...]]],
              inputs: Mapping[str, np.ndarray], outputs: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """``funcs`` compiled into one OpenCL program and called as ``calls`` say on the float32
    buffers ``inputs`` (written) and ``outputs`` (their shapes; NaN-poisoned first, so a part
    no kernel writes shows), which are read back."""
    from tvm_ext.measure.executors import OpenclExecutor
    from tvm_ext.measure.program import TensorSpec, compile_calls_program

    program = compile_calls_program(funcs, calls, opencl, (*inputs, *outputs), {})
    specs = {**{name: TensorSpec(array.shape, "float32") for name, array in inputs.items()},
             **{name: TensorSpec(shape, "float32") for name, shape in outputs.items()}}
    run = OpenclExecutor.of(program.source, program.launches, specs, opencl.device_id)
    for name, array in inputs.items():
        run.write(name, array)
    for name, shape in outputs.items():
        run.write(name, np.full(shape, np.nan, np.float32))
    run.run()
    run.sync()
    return {name: run.read(name) for name in outputs}
