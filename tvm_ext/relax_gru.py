"""gru_layer at its earlier import path (the module is ``tvm_ext.relax.relax_gru``)."""
from .relax.relax_gru import gru_layer  # noqa: F401
