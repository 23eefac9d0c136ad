"""What the tuner and a ``tvm_ext.worker`` say to each other, as ``tvm_ext.remote.wire`` messages.

The dataclasses of a measurement (``MeasureJob``, ``RunResult``, ``TargetInfo``...) become
dicts here field by field and come back through a strict reader: every field present, of its
annotated type, nothing else; a numpy array only where one belongs.  Whatever a reader
refuses is a ``WireError``, so a damaged or forged message is a rejection, never a crash and
never code run.

A session: the tuner's ``hello`` carries a fresh nonce, which the worker's reply echoes with
its session id and ``WorkerInfo``; each ``measure`` request names that session and a
sequence number larger than the last, which its reply echoes.  With a shared secret every
message is signed (``tvm_ext.remote.wire``), so a message replayed into another session or out of
order, or of another kind, is refused.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import numpy as np

from ..measure.cases import case_key, check_fields, join_case, split_case  # noqa: F401  (re-exported)
from ..measure.checks import ElementwiseCheck, NormwiseCheck
from ..core.errors import ErrorKind
from ..measure.measure import MeasureJob, MeasureSettings, RunResult
from ..measure.program import Artifact, FailureFlag, KernelLaunch, RunPlan, TensorSpec, UniformInputs
from ..target import TargetInfo
from .wire import WireError, decode, encode

PROTOCOL = 3  # bumped when a request or reply changes shape: driver and worker must agree
HELLO, HELLO_REPLY, MEASURE, MEASURE_REPLY = "hello", "hello-reply", "measure", "measure-reply"


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker says about itself when a driver connects."""

    protocol: int
    version: str
    target: TargetInfo
    hostname: str
    device: str  # as the worker was started: "cuda 1", "opencl 0"


@dataclass(frozen=True)
class MeasureRequest:
    """One job for a worker.  The check's inputs, references and check (large: a 2048² GEMM's
    reference is 32 MB) travel once per session and workload: ``case`` holds them the first
    time, ``job`` travels without them, and ``case_key`` names them."""

    job: MeasureJob | None  # None: only the case, sent ahead of the workload's jobs
    case_key: str
    case: tuple[Any, ...] | None
    timeout: float


@dataclass(frozen=True)
class MeasureReply:
    result: RunResult | None  # None: the session does not have ``case_key``; send the case
    seconds: float = 0.0  # the worker's time for the job


# ---- dataclasses as dicts, and back through a strict reader ----------------------------------------
_CLASSES = {cls.__name__: cls for cls in (TargetInfo, MeasureSettings, TensorSpec, FailureFlag, UniformInputs,
                                          KernelLaunch, Artifact, RunPlan)}


def to_plain(obj: Any) -> Any:
    """A dataclass of ``_CLASSES`` (and what it holds) as dicts, lists and scalars."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def _fail(what: str, value: Any) -> WireError:
    return WireError(f"{what}: {type(value).__name__} {str(value)[:60]!r} is not what belongs there")


def _typed(annotation: str, value: Any, what: str) -> Any:
    """``value`` read as ``annotation`` (a field's annotation as written), or ``WireError``."""
    if annotation.endswith(" | None"):
        return None if value is None else _typed(annotation[:-7], value, what)
    if annotation.startswith("tuple[") and annotation.endswith(", ...]"):
        if not isinstance(value, list):
            raise _fail(what, value)
        return tuple(_typed(annotation[6:-6], v, what) for v in value)
    if annotation == "tuple[int, int, int]":
        if not isinstance(value, list) or len(value) != 3:
            raise _fail(what, value)
        return tuple(_typed("int", v, what) for v in value)
    ok = {"str": lambda v: isinstance(v, str), "bytes": lambda v: isinstance(v, bytes),
          "bool": lambda v: isinstance(v, bool), "int": lambda v: type(v) is int,
          "float": lambda v: type(v) in (int, float), "Any": lambda v: type(v) in (str, int, float)}
    if annotation in ok:
        if not ok[annotation](value):
            raise _fail(what, value)
        return float(value) if annotation == "float" else value
    if annotation in _CLASSES:
        return from_plain(_CLASSES[annotation], value)
    raise WireError(f"{what}: no reader for {annotation}")


def from_plain(cls: type, value: Any) -> Any:
    """A ``cls`` (of ``_CLASSES``) from its dict: every field, of its type, and no other key."""
    names = [f.name for f in fields(cls)]
    if not isinstance(value, dict) or set(value) != set(names):
        keys = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise WireError(f"a {cls.__name__} needs the fields {names}, got {str(keys)[:120]}")
    args = {f.name: _typed(str(f.type), value[f.name], f"{cls.__name__}.{f.name}") for f in fields(cls)}
    try:
        return cls(**args)
    except (TypeError, ValueError) as exc:
        raise WireError(f"a {cls.__name__}: {exc}") from None


def _field(header: Any, name: str, annotation: str) -> Any:
    if not isinstance(header, dict) or name not in header:
        raise WireError(f"the message has no {name!r}")
    return _typed(annotation, header[name], name)


def _arrays(value: Any, what: str) -> tuple[np.ndarray, ...]:
    if not isinstance(value, list) or not all(isinstance(a, np.ndarray) for a in value):
        raise _fail(what, value)
    return tuple(value)


def job_to_plain(job: MeasureJob) -> dict[str, Any]:
    """A job without its case (``split_case``'s light job); the program's source travels as a
    buffer of UTF-8 (the header stays small, and quick to check)."""
    artifact = {**to_plain(job.artifact), "source": job.artifact.source.encode()}
    return {"artifact": artifact, "buffers": [[n, to_plain(s)] for n, s in job.buffers],
            "n_inputs": job.n_inputs, "n_outputs": job.n_outputs,
            "inputs": to_plain(job.inputs) if isinstance(job.inputs, UniformInputs) else None,
            "plan": to_plain(job.plan), "settings": to_plain(job.settings), "rotation_sets": job.rotation_sets,
            "device_id": job.device_id}


def job_from_plain(value: Any) -> MeasureJob:
    keys = {"artifact", "buffers", "n_inputs", "n_outputs", "inputs", "plan", "settings", "rotation_sets",
            "device_id"}
    if not isinstance(value, dict) or set(value) != keys:
        raise _fail("job", value)
    buffers = value["buffers"]
    if not isinstance(buffers, list) or not all(isinstance(b, list) and len(b) == 2 for b in buffers):
        raise _fail("job.buffers", buffers)
    specs = tuple((_typed("str", n, "buffer name"), from_plain(TensorSpec, s)) for n, s in buffers)
    inputs = _field(value, "inputs", "UniformInputs | None")
    artifact = value["artifact"]
    if not isinstance(artifact, dict) or not isinstance(artifact.get("source"), bytes):
        raise _fail("job.artifact", artifact)
    try:
        source = artifact["source"].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("job.artifact.source is not UTF-8") from None
    return MeasureJob(from_plain(Artifact, {**artifact, "source": source}), specs, _field(value, "n_inputs", "int"),
                      _field(value, "n_outputs", "int"), () if inputs is None else inputs, (), None,  # type: ignore[arg-type]
                      _field(value, "plan", "RunPlan"), _field(value, "settings", "MeasureSettings"),
                      _field(value, "rotation_sets", "int"), _field(value, "device_id", "int"))


def case_to_plain(case: tuple[Any, ...]) -> dict[str, Any]:
    arrays, references, check = case
    try:
        scalars, check_arrays = check_fields(check)
    except TypeError as exc:
        raise WireError(str(exc)) from None
    plain_check = {**scalars, **({"bounds": check_arrays[0]} if check_arrays else {})}
    return {"arrays": None if arrays is None else [np.asarray(a) for a in arrays],
            "references": [np.asarray(r) for r in references], "check": plain_check}


def case_from_plain(value: Any) -> tuple[Any, ...]:
    if not isinstance(value, dict) or set(value) != {"arrays", "references", "check"}:
        raise _fail("case", value)
    arrays, check = value["arrays"], value["check"]
    if isinstance(check, dict) and check.get("type") == "normwise" and set(check) == {"type", "tolerance"}:
        made: Any = NormwiseCheck(_field(check, "tolerance", "float"))
    elif isinstance(check, dict) and check.get("type") == "elementwise" and set(check) == {"type", "bounds", "what"}:
        made = ElementwiseCheck(_arrays([check["bounds"]], "check.bounds")[0], _field(check, "what", "str"))
    else:
        raise _fail("case.check", check)
    return (None if arrays is None else _arrays(arrays, "case.arrays"),
            _arrays(value["references"], "case.references"), made)


def result_to_plain(result: RunResult) -> dict[str, Any]:
    return {"costs": list(result.costs), "error_kind": str(result.error_kind), "error_msg": result.error_msg,
            "metrics": result.metrics}


def result_from_plain(value: Any) -> RunResult:
    metrics = value.get("metrics") if isinstance(value, dict) else None
    if not isinstance(metrics, dict) or any(isinstance(v, (np.ndarray, bytes)) for v in metrics.values()):
        raise _fail("result.metrics", metrics)
    kind = _field(value, "error_kind", "str")
    if kind not in {k.value for k in ErrorKind}:
        raise WireError(f"result.error_kind {kind[:40]!r} is not a kind of failure")
    return RunResult(_field(value, "costs", "tuple[float, ...]"), ErrorKind(kind), _field(value, "error_msg", "str"),
                     metrics)


# ---- the session, the tuner's side ----------------------------------------------------------------
def _refused(header: dict[str, Any]) -> None:
    if "rejected" in header:
        raise WireError(f"the worker refused the request: {str(header['rejected'])[:300]}")


def hello_request(version: str, secret: bytes | None) -> tuple[bytes, str]:
    """A hello message and its nonce (the reply must echo it)."""
    nonce = secrets.token_hex(16)
    return encode(HELLO, {"protocol": PROTOCOL, "version": version, "nonce": nonce}, secret), nonce


def read_hello_reply(data: Any, nonce: str, secret: bytes | None) -> tuple[WorkerInfo, str]:
    """The worker's ``WorkerInfo`` and session id, from its reply to the hello of ``nonce``."""
    header = decode(HELLO_REPLY, data, secret)
    _refused(header)
    if _field(header, "nonce", "str") != nonce:
        raise WireError("the hello reply answers another hello (replayed?)")
    info = header.get("info")
    if not isinstance(info, dict) or set(info) != {"protocol", "version", "target", "hostname", "device"}:
        raise _fail("hello.info", info)
    worker = WorkerInfo(_field(info, "protocol", "int"), _field(info, "version", "str"),
                        from_plain(TargetInfo, info["target"]), _field(info, "hostname", "str"),
                        _field(info, "device", "str"))
    return worker, _field(header, "session", "str")


def measure_request(request: MeasureRequest, session: str, seq: int, secret: bytes | None) -> bytes:
    return encode(MEASURE, {"session": session, "seq": seq,
                            "job": None if request.job is None else job_to_plain(request.job),
                            "case_key": request.case_key,
                            "case": None if request.case is None else case_to_plain(request.case),
                            "timeout": request.timeout}, secret)


def read_measure_reply(data: Any, session: str, seq: int, secret: bytes | None) -> MeasureReply:
    header = decode(MEASURE_REPLY, data, secret)
    _refused(header)
    if _field(header, "session", "str") != session or _field(header, "seq", "int") != seq:
        raise WireError("the reply answers another request (replayed?)")
    result = header.get("result")
    return MeasureReply(None if result is None else result_from_plain(result), _field(header, "seconds", "float"))


# ---- the session, the worker's side ----------------------------------------------------------------
class WorkerSessionState:
    """A worker session's id and the last sequence number it accepted."""

    def __init__(self) -> None:
        self.session = secrets.token_hex(16)
        self.seq = 0


def hello_reply(data: Any, info: WorkerInfo, state: WorkerSessionState, secret: bytes | None) -> tuple[bytes, str]:
    """The reply to a hello message (this worker's info, or why the hello is refused) and
    that refusal ("" when none)."""
    try:
        header = decode(HELLO, data, secret)
        nonce = _field(header, "nonce", "str")[:64]
    except WireError as exc:
        return encode(HELLO_REPLY, {"nonce": "", "rejected": str(exc)}, secret), str(exc)
    return encode(HELLO_REPLY, {"nonce": nonce, "session": state.session, "info": to_plain(info)}, secret), ""


def read_measure_request(data: Any, state: WorkerSessionState, secret: bytes | None) -> tuple[MeasureRequest, int]:
    """A measure request of this session, in order, and its sequence number; ``WireError`` else."""
    header = decode(MEASURE, data, secret)
    seq = _field(header, "seq", "int")
    if _field(header, "session", "str") != state.session:
        raise WireError("the request belongs to another session (no hello here, or replayed)")
    if seq <= state.seq:
        raise WireError(f"request {seq} after {state.seq} (replayed)")
    state.seq = seq
    case, job = header.get("case"), header.get("job")
    if job is None and case is None:
        raise WireError("a request without a job must carry a case")
    request = MeasureRequest(None if job is None else job_from_plain(job), _field(header, "case_key", "str"),
                             None if case is None else case_from_plain(case), _field(header, "timeout", "float"))
    return request, seq


def measure_reply(reply: MeasureReply | None, state: WorkerSessionState, seq: int, secret: bytes | None,
                  rejected: str = "") -> bytes:
    header: dict[str, Any] = {"session": state.session, "seq": seq, "seconds": 0.0 if reply is None else reply.seconds}
    if rejected:
        header["rejected"] = rejected
    else:
        header["result"] = None if reply is None or reply.result is None else result_to_plain(reply.result)
    return encode(MEASURE_REPLY, header, secret)
