"""tvm_ext: search-based tuning of GPU kernels on Apache TVM (CUDA and OpenCL)."""
__version__ = "0.1.0"
