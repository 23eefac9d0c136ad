"""Operator templates, one package a family (``gemm``, ``reduce``, ``gru``): each template with its
compute, knobs, schedule and reference."""
from tvm_ext.core import script_macro
from tvm_ext.core.source_pin import pin_package_sources

pin_package_sources(__file__)  # TVMScript re-reads its modules' files at every build: keep the text imported
script_macro.install()  # its macros find their parser without reading every frame's source line
