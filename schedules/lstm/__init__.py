"""LSTM inference as TVM kernels, with PyTorch's semantics and weight layout.

The LSTM runs on the GRU's pipeline (method 004) with the LSTM's cell: per layer one input
GEMM for all T steps and both directions (``gi = x·W_iᵀ + b_i``, the GEMM template with a bias
row), then the GRU package's fused step kernel on four gates (``schedules.gru.fused_step``,
``cell="lstm"``): each step's hidden products and the cell in one kernel, a launch per step, the
steps looped in TVM's host code, or one persistent launch a layer behind a grid barrier.  The
state keeps c after h in each slot of the step kernel's ping-pong buffer; only the thread that
owns a unit reads its c back.

- ``compute``: the float64 numpy reference of ``torch.nn.LSTM``;
- ``template``: ``LstmTemplate``, the layer stack as one tunable unit;
- ``kernels``: the init (h0 and c0 into the state) and the copy of the last c into c_n;
- ``plan``: the host plan and its compilation into one module;
- ``pick``: a config without measuring;
- ``layer``: the user-facing ``LSTM`` object (build once, run many times).
"""
from .compute import lstm_reference
from .layer import LSTM
from .template import LstmTemplate

__all__ = ["LSTM", "LstmTemplate", "lstm_reference"]
