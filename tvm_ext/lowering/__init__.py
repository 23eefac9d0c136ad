"""TIR lowering the schedules share: the step loop of recurrent and multi-pass kernels
(``step_loop``) and the fix around TVM's warp-memory pass (``warp_memory``)."""
