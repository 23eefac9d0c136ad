"""load_model and tune_relax at their earlier import path (the module is ``tvm_ext.relax.pipeline``)."""
from .relax.pipeline import load_model, tune_relax  # noqa: F401
