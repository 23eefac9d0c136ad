"""``export``: the best recorded kernel of a workload, written as a loadable program.

The template is rebuilt from the record's workload and scheduled with the best
record's config for the recorded target, then written by ``tvm_ext.precision.codegen``:
device source (``program.cl`` / ``program.cu``), TVMScript (``kernels/*.py``), the
compiled library (``program.so``) and ``manifest.json``, which
``tvm_ext.precision.codegen.load_program`` runs (on OpenCL through pyopencl).  The kernel is
regenerated, so its source is compared with the one measured.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any

from ..core.errors import TvmExtError
from ..target import TargetInfo, offline_cuda, resolve_target
from .summary import WorkloadRecords


def export_target(wr: WorkloadRecords, device: int) -> tuple[TargetInfo, str]:
    """The recorded target, from the device when it is here (its limits), else from the
    record (code generation needs no device); and a note when they differ."""
    recorded = wr.target
    try:
        here = resolve_target(recorded.kind, device)
    except TvmExtError:
        here = None
    if here is not None and here.device_name == recorded.device_name:
        return here, ""
    if recorded.kind == "cuda":
        target = dataclasses.replace(offline_cuda(recorded.arch or "sm_90"), device_name=recorded.device_name)
    else:
        target = dataclasses.replace(recorded, device_id=device)
    note = (f"note: {recorded.device_name} is not device {device} here; the kernel is generated for its "
            f"recorded target with default limits")
    return target, note


def export_refusal(template: Any) -> TvmExtError | None:
    """The error of an operator whose registry entry says it cannot be exported, naming it and
    why; None otherwise (an unknown template fails later, as a record it cannot rebuild)."""
    op = _operator(template)
    return None if op is None else op.unsupported_error("export")


def _operator(template: Any) -> Any:
    """The registry entry of a record's template name, or None."""
    from ..operators import OPERATORS

    return OPERATORS.get(template) if isinstance(template, str) else None


def export_best(wr: WorkloadRecords, out_dir: str, device: int = 0) -> tuple[str, list[str]]:
    """Write the best record's kernel to ``out_dir``; returns the manifest path and notes."""
    from ..precision.codegen import export_program

    best = wr.best
    if best is None:
        raise TvmExtError(f"{wr.description}: no correct record to export")
    refusal = export_refusal(wr.workload.get("template"))
    if refusal is not None:
        raise refusal
    if wr.template is None:
        raise TvmExtError(f"{wr.description}: its template cannot be rebuilt from the record "
                          f"(template {wr.workload.get('template')!r})")
    from ..cli.cli_checks import check_index_range

    check_index_range(wr.template)  # a record's absurd shape (m=n=1e12) is bad input, said at once
    target, note = export_target(wr, device)
    notes = [note] if note else []
    template = wr.template
    extra: dict[str, Any] = {"time_s": best.cost, "costs_s": list(best.costs), "workload_key": wr.key,
                             "record_timestamp": best.timestamp}
    try:
        space = template.space(target)
        config = space.make(**space.completed(best.config))  # knobs added since: their earlier values
        manifest = export_program(template, config, target, out_dir, extra=extra)
    except TvmExtError:
        raise
    except OSError as exc:  # a full disk, a read-only folder
        raise TvmExtError(f"cannot write {exc.filename or out_dir}: {exc.strerror or exc}") from None
    except Exception as exc:  # the workload and config come from a file: what they break is bad input
        first = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
        raise TvmExtError(f"{wr.description}: its best record cannot be rebuilt ({first})") from None
    with open(os.path.join(out_dir, "program.cu" if target.kind == "cuda" else "program.cl"), "rb") as fh:
        source_hash = hashlib.sha256(fh.read()).hexdigest()[:16]
    if best.source_hash and source_hash != best.source_hash:
        notes.append("note: the kernel generated now differs from the one measured "
                     "(the template, TVM or the target's limits changed since)")
    return manifest, notes
