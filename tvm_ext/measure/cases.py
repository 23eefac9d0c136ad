"""A job's check data as one *case*: the inputs (``None`` when the measuring side draws them
from the seed), the float64 references and the output check.

Every job of a workload carries the same case, and it is large (a 2048² GEMM's reference is
32 MB), so it travels once per process and workload: to a ``tvm_ext.worker`` session (the
RPC runner) and into each measuring process (``IsolatedMeasurer``), named by ``case_key``,
a digest of its content, and jobs go without it (``split_case``, ``join_case``).
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from .checks import ElementwiseCheck, NormwiseCheck
from .program import UniformInputs

__all__ = ["CASES_KEPT", "case_key", "case_key_of", "join_case", "keep_latest", "kept", "split_case"]

CASES_KEPT = 4  # cases a worker session or a measuring process keeps (least recently used dropped)


def keep_latest(store: OrderedDict[Any, Any], key: Any, value: Any, limit: int = CASES_KEPT) -> None:
    """``store[key] = value`` as the most recent entry, the oldest dropped past ``limit``: how a
    session, a measuring process and its parent keep cases (or their keys), and every other
    bounded cache of the package (``kept``)."""
    store[key] = value
    store.move_to_end(key)
    while len(store) > limit:
        store.popitem(last=False)


def kept(store: OrderedDict[Any, Any], key: Any, make: Callable[[], Any], limit: int) -> Any:
    """``store[key]``, made by ``make()`` where absent, kept as the most recent entry
    (``keep_latest``): a module's device tensors per value, a bucketed model's compiled sizes."""
    value = store.get(key)
    if value is None:
        value = make()
    keep_latest(store, key, value, limit)
    return value


def split_case(job: Any) -> tuple[Any, tuple[Any, ...]]:
    """``job`` (a ``MeasureJob``) without its check's data, and that data: (inputs, or None
    when the measuring side draws them from the seed; references; the check)."""
    arrays = None if isinstance(job.inputs, UniformInputs) else tuple(job.inputs)
    light = replace(job, inputs=job.inputs if arrays is None else (), references=(), check=None)
    return light, (arrays, tuple(job.references), job.check)


def join_case(job: Any, case: tuple[Any, ...]) -> Any:
    arrays, references, check = case
    return replace(job, inputs=job.inputs if arrays is None else arrays, references=references, check=check)


def check_fields(check: Any) -> tuple[dict[str, Any], list[np.ndarray]]:
    """A check's scalar fields and its arrays: the checks that travel (normwise, elementwise);
    ``TypeError`` for any other."""
    if isinstance(check, NormwiseCheck):
        return {"type": "normwise", "tolerance": check.tolerance}, []
    if isinstance(check, ElementwiseCheck):
        return {"type": "elementwise", "what": check.what}, [np.asarray(check.bounds)]
    raise TypeError(f"a {type(check).__name__} check does not travel (normwise and elementwise do)")


def case_key(case: tuple[Any, ...]) -> str:
    """A digest of a case: its arrays' dtypes, shapes and bytes, and its check."""
    arrays, references, check = case
    scalars, check_arrays = check_fields(check)
    digest = hashlib.blake2b(digest_size=16)
    listed = [np.asarray(a) for a in (*(arrays or ()), *references)] + (check_arrays or [np.zeros(0)])
    for array in listed:
        digest.update(f"{array.dtype.name}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    digest.update(json.dumps(scalars, sort_keys=True).encode())
    return digest.hexdigest()


_KEYS_KEPT = 8  # cases whose digest is kept (a 2048² GEMM's takes tens of ms to hash)
_keys: OrderedDict[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = OrderedDict()
_keys_lock = threading.Lock()


def case_key_of(case: tuple[Any, ...]) -> str | None:
    """``case_key`` of ``case``, hashed once per case (every job of a workload carries the same
    cached arrays, ``measure.reference_case``, and an equal check; the entry holds the arrays,
    so an id here is never another object's); ``None`` for a check that does not travel."""
    arrays, references, check = case
    try:  # a check equal by value (a tolerance) is the same check; one holding arrays goes by identity
        same_check: Any = (type(check), hash(check), check)
    except TypeError:
        same_check = id(check)
    ids = (*(id(a) for a in (*(arrays or ()), *references)), same_check)
    with _keys_lock:
        known = _keys.get(ids)
    if known is not None:
        return known[0]
    try:
        key = case_key(case)
    except TypeError:
        return None
    with _keys_lock:
        _keys[ids] = (key, case)
        while len(_keys) > _KEYS_KEPT:
            _keys.popitem(last=False)
    return key
