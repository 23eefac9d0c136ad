"""Lowering every warp-scope buffer of a kernel: a fix around TVM 0.27's ``LowerWarpMemory``.

Warp buffers hold per-lane fragments (``schedules/gemm/mma.py`` keeps its ldmatrix / mma.sync
operands and accumulators in them); ``LowerWarpMemory`` turns each into a per-thread local
array.  In TVM 0.27 the pass rewrites only the first warp buffer of a statement sequence:
it hands the sequence after that buffer to the access rewriter and stops, so every later
warp buffer stays a 32-lane array in each thread (local memory).  ``install_warp_memory_fix``
runs the pass until no warp buffer is left, as part of the default pipeline's device
finalization.
"""
from __future__ import annotations

from typing import Any


def _lower_all_warp_memory() -> Any:
    """``LowerWarpMemory`` until no warp-scope buffer is left.  TVM 0.27's pass rewrites only
    the first warp buffer of a statement sequence (it hands the siblings after it to the
    access rewriter and stops), so a kernel with A, B and C fragments kept the later ones as
    32-lane arrays in every thread; each further run lowers the next one."""
    import tvm
    import tvm_ffi
    from tvm.tirx.stmt import AllocBuffer

    def has_warp_buffer(mod: Any) -> bool:
        found = []

        def visit(node: Any) -> None:
            if node.buffer.scope() == "warp":
                found.append(node)

        for func in mod.functions.values():
            if hasattr(func, "body"):
                tvm_ffi.structural_walk(func.body, [(AllocBuffer, visit)])
        return bool(found)

    @tvm.transform.module_pass(opt_level=0, name="tvm_ext.LowerAllWarpMemory")
    def lower(mod: Any, _ctx: Any) -> Any:
        for _ in range(64):
            if not has_warp_buffer(mod):
                break
            mod = tvm.tirx.transform.LowerWarpMemory()(mod)
        return mod

    return lower


def install_warp_memory_fix() -> None:
    """Wrap the default ("s_tir") TIR pipeline so its device finalization lowers every warp
    buffer (see ``_lower_all_warp_memory``).  Idempotent; a no-op for kernels without warp
    buffers, so other templates compiled in the same process are unaffected."""
    import tvm
    from tvm.tirx import compilation_pipeline

    factory = compilation_pipeline.PIPELINE_MAP["s_tir"]
    if getattr(factory, "lowers_all_warp_memory", False):
        return

    def wrapped(**kwargs: Any) -> Any:
        pipeline, finalize_host, finalize_device = factory(**kwargs)
        return pipeline, finalize_host, lambda: tvm.ir.transform.Sequential(
            [_lower_all_warp_memory(), finalize_device()])

    wrapped.lowers_all_warp_memory = True  # type: ignore[attr-defined]
    compilation_pipeline.PIPELINE_MAP["s_tir"] = wrapped
