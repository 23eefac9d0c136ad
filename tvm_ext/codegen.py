"""load_program at its earlier import path (the module is ``tvm_ext.precision.codegen``)."""
from .precision.codegen import load_program  # noqa: F401
