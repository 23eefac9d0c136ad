"""load_onnx at its earlier import path (the module is ``tvm_ext.relax.onnx_import``)."""
from .relax.onnx_import import load_onnx  # noqa: F401
