"""GRU inference (method 004) as TVM kernels, with PyTorch's semantics and weight layout.

Everything about the GRU lives in this package, one role per module:

- ``compute``: the float64 numpy reference of ``torch.nn.GRU``, the precision parameters
  (what the mixed-precision search varies) and the stage of each kernel function;
- ``template``: ``GruTemplate``, the layer stack as one tunable unit (buffers, search space,
  default config, the kernel functions a config schedules); ``knobs``: its knobs;
- ``step_variant``: ``StepVariant``, the step kernel a config selects (``variants`` chooses it
  once), each family in its own module with its knobs' decoding, its feasibility reason, its
  kernels and its host calls: ``cell_step`` (the unfused hidden GEMM + cell kernel),
  ``fused_step`` (the fused step kernel, per step, host-looped or persistent), ``flag_step``
  (the flag-exchange kernel), ``tensor_core_step`` (the tensor-core kernel); ``step_common``:
  the TIR they share (the cell's math, the state store, the exchange words);
- ``kernels``: the init and elementwise kernels every config runs (the gate GEMMs are
  ``tvm_ext.schedules.gemm.simt``'s template, with a bias row and a batch axis);
- ``split``: the float32 input GEMM on float16 tensor cores (operands split into high and low
  float16 parts, one GEMM of depth 3K; knob ``in_split``);
- ``plan``: the host plan (the calls of one forward pass), compiling it into one module,
  and what the builder and the runner ask of it (the program, how it is timed);
- ``layer``: the user-facing ``GRU`` object (build once, run many times).

Pipeline per layer (as published), gate order r, z, n as in PyTorch: S1 ``gi = x·W_iᵀ + b_i``
for all T steps and both directions in one GEMM; per step S2 ``gh = h·W_hᵀ + b_h`` (a GEMM
batched over directions) and S3/S4 the cell (or S2-S4 fused into one step kernel).
"""
from .compute import F32, FUNCTION_STAGES, PRECISION_PARAMS, STAGES, function_stages, gru_reference
from .cell_step import cell_func, schedule_cell
from .fused_step import schedule_step, step_func
from .kernels import init_func, schedule_init
from .layer import GRU
from .plan import BARRIER_TIMEOUT, Call, CompiledGru
from .knobs import BATCHED_GEMM_KNOBS, HID_GEMM_KNOBS, IN_GEMM_KNOBS, KNOBS, STEP_KNOBS, gemm_config
from .step_variant import PERSISTENT_MIN_REGISTERS, SHARED_RESERVED_PER_BLOCK, StepVariant
from .template import GruTemplate, default_gemm_config
from tvm_ext.measure.executors import STAGE_REPEAT, CudaExecutor, OpenclExecutor
from tvm_ext.schedules.gemm.simt import BiasGemmTemplate, gemm_bias_func

__all__ = ["BARRIER_TIMEOUT", "BATCHED_GEMM_KNOBS", "F32", "FUNCTION_STAGES", "GRU", "HID_GEMM_KNOBS",
           "IN_GEMM_KNOBS", "KNOBS", "PERSISTENT_MIN_REGISTERS", "PRECISION_PARAMS", "SHARED_RESERVED_PER_BLOCK",
           "STAGES", "STAGE_REPEAT", "STEP_KNOBS", "BiasGemmTemplate", "Call", "CompiledGru", "CudaExecutor",
           "GruTemplate", "OpenclExecutor", "StepVariant", "cell_func", "default_gemm_config", "function_stages",
           "gemm_bias_func", "gemm_config", "gru_reference", "init_func", "schedule_cell", "schedule_init",
           "schedule_step", "step_func"]
