"""Programmatic dependent launch (Hopper): a kernel launched with it may start before the
kernel ahead of it on the stream has finished, once every block of that kernel has run
``griddepcontrol.launch_dependents`` (``wgmma_steps.row_signals``).  What it then reads of
that kernel's output it must wait for itself (the GRU's step kernel polls the input GEMM's
counts of stored rows: ``tensor_core_step.wait_gi_macro``).

TVM's CUDA runtime launches a kernel so where the kernel's launch parameters carry the tag
``LAUNCH_TAG``, which TVM's own passes do not set: ``mark_launch_early`` marks a PrimFunc, and
the TIR pipeline ``PIPELINE`` (TVM's default, then ``tag_marked_kernels``) adds the tag to the
device kernels a marked function launches.  Build with ``tvm.compile(..., tir_pipeline=PIPELINE)``.
"""
from __future__ import annotations

from typing import Any

MARK = "tvm_ext.launch_early"
LAUNCH_TAG = "tirx.use_programtic_dependent_launch"  # TVM 0.27's spelling
LAUNCH_PARAMS = "tirx.kernel_launch_params"
DYNAMIC_SHARED_TAG = "tirx.use_dyn_shared_memory"  # must stay the last tag
PIPELINE = "tvm_ext_launch_early"


def mark_launch_early(func: Any) -> Any:
    """``func`` (a PrimFunc) with its device kernels to be launched early (``PIPELINE``)."""
    return func.with_attr(MARK, True)


def is_marked(func: Any) -> bool:
    """Whether ``func`` (a PrimFunc) is marked to launch its kernels early."""
    attrs = func.attrs or {}
    return MARK in attrs and bool(attrs[MARK])


def _marked_symbols(mod: Any) -> set[str]:
    """The names of the marked host functions (their kernels are named after them)."""
    return {str((func.attrs or {}).get("global_symbol", "")).removeprefix("__tvm_ffi_")
            for func in mod.functions.values() if is_marked(func)}


def pipeline_for(mod: Any) -> str:
    """The TIR pipeline to build ``mod`` with: ``PIPELINE`` (registered) where a function of it is
    marked, else TVM's default."""
    return register_pipeline() if _marked_symbols(mod) else "default"


def _launched_by(kernel_symbol: str, hosts: set[str]) -> bool:
    """Whether a device kernel belongs to one of ``hosts`` (TVM names them ``<host>_kernel``,
    ``<host>_kernel_1``, ...)."""
    return any(kernel_symbol == f"{h}_kernel" or kernel_symbol.startswith(f"{h}_kernel_") for h in hosts)


def tag_marked_kernels(mod: Any) -> Any:
    """``mod`` after host/device splitting, each device kernel of a marked function carrying
    ``LAUNCH_TAG`` in its launch parameters (before the dynamic shared memory tag)."""
    import tvm

    hosts = _marked_symbols(mod)
    if not hosts:
        return mod
    updates = {}
    for gvar, func in mod.functions.items():
        attrs = func.attrs or {}
        if LAUNCH_PARAMS not in attrs or not _launched_by(str(attrs.get("global_symbol", "")), hosts):
            continue
        tags = [str(t) for t in attrs[LAUNCH_PARAMS]]
        if LAUNCH_TAG in tags:
            continue
        at = len(tags) - 1 if tags and tags[-1] == DYNAMIC_SHARED_TAG else len(tags)
        updates[gvar] = func.with_attr(LAUNCH_PARAMS, [*tags[:at], LAUNCH_TAG, *tags[at:]])
    if not updates:
        return mod
    mod = tvm.IRModule(mod.functions, attrs=mod.attrs)
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod


def _pipeline_factory() -> tuple[Any, Any, Any]:
    import tvm
    from tvm.tirx import compilation_pipeline as pipelines

    lower, finalize_host, finalize_device = pipelines.get_tir_pipeline("default")

    @tvm.transform.module_pass(opt_level=0, name="tvm_ext.TagLaunchEarly")
    def tag(mod: Any, _ctx: Any) -> Any:
        return tag_marked_kernels(mod)

    return tvm.transform.Sequential([lower, tag]), finalize_host, finalize_device


def register_pipeline() -> str:
    """Register ``PIPELINE`` with TVM (once) and return its name."""
    from tvm.tirx import compilation_pipeline as pipelines

    if PIPELINE not in pipelines.PIPELINE_MAP:
        pipelines.register_tir_pipeline(PIPELINE, _pipeline_factory)
    return PIPELINE
