"""Float constants of OpenCL kernels written exactly: a fix around TVM 0.27's OpenCL codegen.

TVM's C code generator prints a float constant with ``std::scientific`` at its default
precision, seven significant digits, where float32 needs nine to round-trip (its CUDA
generator writes hex floats and is exact).  The lowest float32, a max reduction's identity and
the fill value of ``masked_fill(mask, torch.finfo(dtype).min)``, comes out as
``-3.402823e+38f``, above the lowest: a softmax over a row every key of which is masked with
the lowest took that as its max, every ``exp`` underflowed to 0 and the row was 0 / 0 = NaN
(torch gives a uniform row), which the next layer spread over the whole sequence.

``install_exact_opencl_constants`` wraps TVM's OpenCL build function (``target.build.opencl``,
looked up by name at every build of an OpenCL device module) so that each float32 or float64
constant whose printed form would not read back is written as ``as_float`` / ``as_double`` of
its bits (a negative float64 as the negation of its magnitude's: TVM holds no unsigned 64-bit
constant past the signed range).  Idempotent; kernels whose constants print exactly are built
from the same source as before.
"""
from __future__ import annotations

from typing import Any

import numpy as np

_BUILD = "target.build.opencl"
_INSTALLED: list[Any] = []  # the original build function, once wrapped


def prints_exactly(value: float, dtype: str = "float32") -> bool:
    """Whether TVM's OpenCL text of a constant (``%e``: seven significant digits) reads back as
    the same value of ``dtype``.  Infinities and NaN are written by name."""
    if not np.isfinite(value):
        return True
    return bool(np.dtype(dtype).type(float(f"{value:e}")) == np.dtype(dtype).type(value))


_REINTERPRET = {"float32": ("as_float", np.uint32), "float64": ("as_double", np.uint64)}


def _from_bits(value: float, dtype: str) -> Any:
    """``value`` as OpenCL C's reinterpretation of its bits, which the compiler folds."""
    import tvm

    name, bits_type = _REINTERPRET[dtype]
    if dtype == "float64" and np.signbit(value):
        return -_from_bits(-value, dtype)
    bits = int(np.array(value, dtype).view(bits_type))
    return tvm.tirx.call_pure_extern(dtype, name, tvm.tirx.const(bits, bits_type.__name__))


def exact_float_constants(func: Any) -> Any:
    """``func`` (a device PrimFunc) with every float32 and float64 constant that would not print
    exactly written from its bits (``_from_bits``)."""
    import tvm
    import tvm_ffi

    def exact(node: Any) -> Any:
        dtype = str(node.ty.dtype)
        if dtype not in _REINTERPRET or prints_exactly(node.value, dtype):
            return node
        return _from_bits(node.value, dtype)

    return tvm_ffi.structural_map(func, (tvm.tirx.FloatImm, exact))


def install_exact_opencl_constants() -> None:
    """Wrap ``target.build.opencl`` so every OpenCL device module is built with exact float
    constants (``exact_float_constants``)."""
    if _INSTALLED:
        return
    import tvm
    import tvm_ffi

    original = tvm.get_global_func(_BUILD)

    def build(mod: Any, target: Any) -> Any:
        functions = {gv: exact_float_constants(f) if isinstance(f, tvm.tirx.PrimFunc) else f
                     for gv, f in mod.functions.items()}
        return original(tvm.IRModule(functions, attrs=mod.attrs), target)

    tvm_ffi.register_global_func(_BUILD, build, override=True)
    _INSTALLED.append(original)
