"""Cost models that rank candidates before they are measured, and choosing without measuring.

- ``features``: what a candidate looks like to a model (knobs, shape, hardware-model quantities);
- ``model``: the XGBoost model (normalized throughput, retraining, transfer, save/load);
- ``search``: the GA with a predictor stage (the mixed-precision search's S6 on the GA's operators);
- ``hardware`` and ``analytic``: the hardware model and the analytic GEMM tile selection;
- ``replay``: recorded sweeps replayed through the real Tuner (no hardware);
- ``compare``: every strategy on a replay (benchmarks and tests);
- ``ptxas``: registers and spills from ``nvcc --ptxas-options=-v`` (optional, cached).

Submodules are imported on use: ``import tvm_ext.cost_model`` loads neither TVM nor XGBoost.
"""
