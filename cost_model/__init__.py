"""Cost models that rank candidates before they are measured, and choosing without measuring.

- ``features``: what a candidate looks like to a model (knobs, shape, hardware-model quantities);
- ``model``: the XGBoost model (normalized throughput, retraining, transfer, save/load);
- ``search``: the GA with a predictor stage (method 003's S6 on method 000's operators);
- ``hardware`` and ``analytic``: method 002's hardware model and GEMM tile selection;
- ``replay``: recorded sweeps replayed through the real Tuner (no hardware);
- ``compare``: every strategy on a replay (benchmarks and tests);
- ``ptxas``: registers and spills from ``nvcc --ptxas-options=-v`` (optional, cached).

Submodules are imported on use: ``import tvm_ext.cost_model`` loads neither TVM nor XGBoost.
"""
