"""Operator templates, one package a family (``gemm``, ``reduce``, ``gru``): each template with its
compute, knobs, schedule and reference."""
from tvm_ext.core.source_pin import pin_package_sources

pin_package_sources(__file__)  # TVMScript re-reads its modules' files at every build: keep the text imported
