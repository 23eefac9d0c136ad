"""float32 constants of OpenCL kernels written exactly: a fix around TVM 0.27's OpenCL codegen.

TVM's C code generator prints a float constant with ``std::scientific`` at its default
precision, seven significant digits, where float32 needs nine to round-trip (its CUDA
generator writes hex floats and is exact).  The lowest float32, a max reduction's identity and
the fill value of ``masked_fill(mask, torch.finfo(dtype).min)``, comes out as
``-3.402823e+38f``, above the lowest: a softmax over a row every key of which is masked with
the lowest took that as its max, every ``exp`` underflowed to 0 and the row was 0 / 0 = NaN
(torch gives a uniform row), which the next layer spread over the whole sequence.

``install_exact_opencl_constants`` wraps TVM's OpenCL build function (``target.build.opencl``,
looked up by name at every build of an OpenCL device module) so that each float32 constant
whose printed form would not round-trip is written as ``as_float(bits)``.  Idempotent; kernels
whose constants print exactly are built from the same source as before.
"""
from __future__ import annotations

from typing import Any

import numpy as np

_BUILD = "target.build.opencl"
_INSTALLED: list[Any] = []  # the original build function, once wrapped


def prints_exactly(value: float) -> bool:
    """Whether TVM's OpenCL text of a float32 constant (``%e``: seven significant digits) reads
    back as the same float32.  Infinities and NaN are written by name."""
    if not np.isfinite(value):
        return True
    return bool(np.float32(float(f"{value:e}")) == np.float32(value))


def exact_float32_constants(func: Any) -> Any:
    """``func`` (a device PrimFunc) with every float32 constant that would not print exactly
    replaced by ``as_float`` of its bits (OpenCL C's reinterpretation, folded by the compiler)."""
    import tvm
    import tvm_ffi

    def exact(node: Any) -> Any:
        if str(node.ty.dtype) != "float32" or prints_exactly(node.value):
            return node
        bits = int(np.array(node.value, np.float32).view(np.uint32))
        return tvm.tirx.call_pure_extern("float32", "as_float", tvm.tirx.const(bits, "uint32"))

    return tvm_ffi.structural_map(func, (tvm.tirx.FloatImm, exact))


def install_exact_opencl_constants() -> None:
    """Wrap ``target.build.opencl`` so every OpenCL device module is built with exact float32
    constants (``exact_float32_constants``)."""
    if _INSTALLED:
        return
    import tvm
    import tvm_ffi

    original = tvm.get_global_func(_BUILD)

    def build(mod: Any, target: Any) -> Any:
        functions = {gv: exact_float32_constants(f) if isinstance(f, tvm.tirx.PrimFunc) else f
                     for gv, f in mod.functions.items()}
        return original(tvm.IRModule(functions, attrs=mod.attrs), target)

    tvm_ffi.register_global_func(_BUILD, build, override=True)
    _INSTALLED.append(original)
