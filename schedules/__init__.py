"""Operator templates, one package a family (``gemm``, ``reduce``, ``gru``): each template with its
compute, knobs, schedule and reference."""
