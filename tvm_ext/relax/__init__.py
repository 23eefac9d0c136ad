"""Whole models through TVM's Relax: matching Relax tasks to our templates (``tasks``), the
rewrites and lowerings they need (``relax_rewrites``, ``relax_gru``, ``relax_wgmma``), running on
OpenCL (``relax_opencl``), importing models (``onnx_import``, ``torch_import``), exporting tuned
schedules as a meta_schedule database (``tvm_export``) and the tune-export-compile-run ``pipeline``."""
