"""Tuner <-> worker messages as data (``tvm_ext.remote.wire``, ``tvm_ext.remote.messages``), without a network.

A job, its case and its result make the round trip field for field; a pickle is refused
before anything reads it (a file its unpickling would create never appears); the shared
secret is checked first, in both directions, and binds a message to its kind, its session
and its place in the session; hundreds of random, truncated, oversized and deeply nested
messages raise nothing but ``WireError``; a worker of another version is one error naming
both versions.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tvm_ext import __version__
from tvm_ext.measure.builder import build_one
from tvm_ext.measure.checks import ElementwiseCheck, NormwiseCheck
from tvm_ext.core.errors import ErrorKind, TvmExtError
from tvm_ext.measure.measure import MeasureSettings, RunResult, make_job
from tvm_ext.remote.messages import (MEASURE, MEASURE_REPLY, PROTOCOL, MeasureReply, MeasureRequest, WorkerInfo,
                                     WorkerSessionState, case_from_plain, case_key, case_to_plain, hello_reply,
                                     hello_request, measure_reply, measure_request, read_hello_reply,
                                     read_measure_reply, read_measure_request, split_case)
from tvm_ext.remote.rpc_runner import check_worker
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.target import offline_cuda
from tvm_ext.remote.wire import MAGIC, SECRET_ENV, Limits, WireError, decode, encode, load_secret

SECRET = b"s3cret-of-this-test"


class MakesAFile:
    """Unpickling this creates ``path``: the test of whether anything unpickled it."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def job(opencl):
    template = GemmTemplate(24, 16, 20)
    build = build_one(template, template.default_config(opencl), opencl)
    assert build.ok
    return make_job(template, build.config, build.artifact, opencl, MeasureSettings(seed=3))


def test_a_job_and_its_result_make_the_round_trip(job):
    light, case = split_case(job)
    state = WorkerSessionState()
    message = measure_request(MeasureRequest(light, case_key(case), case, 12.5), state.session, 1, SECRET)
    request, seq = read_measure_request(message, state, SECRET)
    assert seq == 1 and request.timeout == 12.5 and request.case_key == case_key(case)
    got = request.job
    for name in ("artifact", "buffers", "n_inputs", "n_outputs", "inputs", "plan", "settings", "rotation_sets",
                 "device_id"):
        assert getattr(got, name) == getattr(light, name), name
    arrays, refs, check = request.case
    assert (arrays is None) == (case[0] is None) and check == case[2]
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(refs, case[1]))
    result = RunResult((1e-5, 2e-5), metrics={"rel_error": float("inf"), "timer": "opencl events",
                                               "stage_secs": {"a": 1.0}})
    reply = read_measure_reply(measure_reply(MeasureReply(result, 0.5), state, seq, SECRET), state.session, 1, SECRET)
    assert reply.result == result and reply.seconds == 0.5
    failed = RunResult((), ErrorKind.WRONG_ANSWER, "output 0: NaN")
    again = read_measure_reply(measure_reply(MeasureReply(failed), state, 2, None), state.session, 2, None)
    assert again.result == failed


def test_a_cuda_program_travels_as_bytes_and_calls(job):
    from tvm_ext.remote.messages import job_from_plain, job_to_plain
    from tvm_ext.measure.program import FailureFlag, KernelLaunch, RunPlan

    light, _ = split_case(job)
    library = bytes(range(256)) * 40
    calls = (KernelLaunch("main", ("A", "B", 3, "loop:i"), (2, 1, 1), (128, 1, 1), 1024, (2, 1, 1)),)
    plan = RunPlan("host", False, FailureFlag("flag", 2, "barrier timed out"), (("a",), ("a", "b")))
    cuda = replace(light, artifact=replace(light.artifact, kind="cuda", library=library, calls=calls), plan=plan)
    header = decode("job", encode("job", job_to_plain(cuda), SECRET), SECRET)
    got = job_from_plain({k: v for k, v in header.items() if k != "kind"})
    assert got.artifact == cuda.artifact and got.artifact.library == library and got.plan == plan


def test_cases_of_every_check_and_dtype_make_the_round_trip():
    import ml_dtypes

    arrays = (np.arange(6, dtype=np.float16).reshape(2, 3), np.ones(4, dtype=ml_dtypes.bfloat16),
              np.array([1, -2], dtype=np.int64), np.zeros((0, 3), np.float32), np.array(0.5, np.float32),
              np.linspace(-2, 2, 6).astype(ml_dtypes.float8_e4m3fn), np.ones((2, 2), ml_dtypes.float8_e5m2))
    for check in (NormwiseCheck(1e-3), ElementwiseCheck(np.linspace(0, 1, 5), "bfloat16")):
        case = (arrays, (np.random.default_rng(0).random((3, 5)),), check)
        header = decode("case", encode("case", case_to_plain(case), None), None)
        got = case_from_plain({k: v for k, v in header.items() if k != "kind"})
        assert all(np.array_equal(a, b) and a.dtype == b.dtype and a.shape == b.shape for a, b in zip(got[0], arrays))
        assert np.array_equal(got[1][0], case[1][0])
        if isinstance(check, ElementwiseCheck):
            assert np.array_equal(got[2].bounds, check.bounds) and got[2].what == check.what
        else:
            assert got[2] == check
        assert case_key(got) == case_key(case)


def test_the_worker_info_and_the_hello(opencl):
    info = WorkerInfo(PROTOCOL, __version__, opencl, "host", "opencl 0")
    state = WorkerSessionState()
    message, nonce = hello_request(__version__, SECRET)
    got, session = read_hello_reply(hello_reply(message, info, state, SECRET)[0], nonce, SECRET)
    assert got == info and session == state.session
    other, _ = hello_request(__version__, SECRET)  # a reply to another hello is not this one's
    with pytest.raises(WireError, match="another hello"):
        read_hello_reply(hello_reply(other, info, state, SECRET)[0], nonce, SECRET)


# ---- pickles are refused unread ---------------------------------------------------------------------------
def test_a_pickle_is_refused_and_never_unpickled(tmp_path, opencl):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(MakesAFile(str(marker)))
    state = WorkerSessionState()
    for secret in (None, SECRET):
        for read in (lambda d, s=secret: decode(MEASURE, d, s), lambda d, s=secret: read_measure_request(d, state, s),
                     lambda d, s=secret: read_measure_reply(d, state.session, 1, s),
                     lambda d, s=secret: read_hello_reply(d, "n", s)):
            with pytest.raises(WireError, match="not a tvm_ext message"):
                read(payload)
    # a pickle inside a well-formed message is bytes, never more: a buffer where a dict belongs
    message = encode(MEASURE, {"session": state.session, "seq": 1, "job": payload, "case_key": "k", "case": None,
                               "timeout": 1.0}, None)
    with pytest.raises(WireError):
        read_measure_request(message, state, None)
    info = WorkerInfo(PROTOCOL, __version__, opencl, "h", "opencl 0")
    refused, why = hello_reply(payload, info, state, None)
    assert why.startswith("not a tvm_ext message")
    with pytest.raises(WireError, match="the worker refused the request: not a tvm_ext message"):
        read_hello_reply(refused, "n", None)
    assert not marker.exists()


def test_no_module_of_tvm_ext_unpickles_anything():
    root = Path(__file__).resolve().parents[1] / "tvm_ext"
    found = [f"{path.name}:{n}" for path in root.rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\b(c?pickle|cloudpickle|marshal|dill)\.loads?\b|Unpickler", line)]
    assert not found, found


# ---- the shared secret --------------------------------------------------------------------------------------
def test_a_wrong_or_missing_secret_is_refused_both_ways():
    header = {"x": 1}
    with pytest.raises(WireError, match="bad signature"):
        decode(MEASURE, encode(MEASURE, header, b"another secret"), SECRET)
    with pytest.raises(WireError, match="not signed"):
        decode(MEASURE, encode(MEASURE, header, None), SECRET)
    with pytest.raises(WireError, match="signed but this side has no shared secret"):
        decode(MEASURE, encode(MEASURE, header, SECRET), None)
    with pytest.raises(WireError, match="bad signature"):  # the signature binds the kind
        decode(MEASURE_REPLY, encode(MEASURE, header, SECRET), SECRET)
    good = bytearray(encode(MEASURE, header, SECRET))
    good[-2] ^= 1  # one bit of the header
    with pytest.raises(WireError, match="bad signature"):
        decode(MEASURE, bytes(good), SECRET)
    flipped = bytearray(encode(MEASURE, header, SECRET))
    flipped[4] = 0  # says unsigned, but this side has a secret
    with pytest.raises(WireError, match="not signed"):
        decode(MEASURE, bytes(flipped), SECRET)


def test_a_request_replayed_out_of_order_or_into_another_session_is_refused(job):
    light, case = split_case(job)
    state, other = WorkerSessionState(), WorkerSessionState()
    first = measure_request(MeasureRequest(light, "k", None, 1.0), state.session, 1, SECRET)
    read_measure_request(first, state, SECRET)
    with pytest.raises(WireError, match="replayed"):
        read_measure_request(first, state, SECRET)
    with pytest.raises(WireError, match="another session"):
        read_measure_request(first, other, SECRET)
    reply = measure_reply(MeasureReply(None), state, 1, SECRET)
    with pytest.raises(WireError, match="another request"):
        read_measure_reply(reply, state.session, 2, SECRET)


def test_the_secret_comes_from_a_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert load_secret(None) is None
    monkeypatch.setenv(SECRET_ENV, " abc \n")
    assert load_secret(None) == b"abc"
    path = tmp_path / "key"
    path.write_text("from-file\n")
    assert load_secret(str(path)) == b"from-file"
    path.write_text("  \n")
    with pytest.raises(TvmExtError, match="is empty"):
        load_secret(str(path))
    with pytest.raises(TvmExtError, match="cannot read the secret file"):
        load_secret(str(tmp_path / "missing"))


def test_a_worker_of_another_version_is_one_error_naming_both():
    info = WorkerInfo(PROTOCOL, "9.9.9", offline_cuda(), "h", "cuda 0")
    with pytest.raises(TvmExtError) as err:
        check_worker(info, "10.0.0.1:9091")
    assert f"runs tvm_ext 9.9.9 (protocol {PROTOCOL}), this tuner tvm_ext {__version__}" in str(err.value)
    with pytest.raises(TvmExtError, match="protocol 1"):
        check_worker(replace(info, protocol=1, version=__version__), "h:1")
    check_worker(replace(info, version=__version__), "h:1")


# ---- limits and fuzz ----------------------------------------------------------------------------------------
def test_arrays_are_checked_before_they_are_built():
    def message(ref: dict, data: bytes) -> bytes:
        text = json.dumps({"kind": "k", "a": ref}).encode()
        return (MAGIC + bytes(33) + struct.pack("<II", len(text), 1) + struct.pack("<Q", len(data)) + text + data)

    decode("k", message({"__array__": 0, "dtype": "float32", "shape": [2]}, bytes(8)), None)
    for ref, why in (({"__array__": 0, "dtype": "object", "shape": [1]}, "dtypes"),
                     ({"__array__": 0, "dtype": "float32", "shape": [3]}, "does not fill"),
                     ({"__array__": 0, "dtype": "float32", "shape": [-1, -2]}, "shape"),
                     ({"__array__": 1, "dtype": "float32", "shape": [2]}, "buffer 1"),
                     ({"__array__": 0, "dtype": "float32", "shape": [2], "x": 1}, "not one")):
        with pytest.raises(WireError, match=why):
            decode("k", message(ref, bytes(8)), None)


def test_limits_are_kept():
    small = Limits(total_bytes=4096, buffers=2, header_bytes=1024, depth=4, string_chars=100)
    with pytest.raises(WireError, match="over 4096"):
        decode("k", encode("k", {"b": bytes(5000)}, None), None, small)
    with pytest.raises(WireError, match="3 buffers"):
        decode("k", encode("k", {"b": [b"1", b"2", b"3"]}, None), None, small)
    with pytest.raises(WireError, match="nested deeper"):
        decode("k", encode("k", {"a": [[[[1]]]]}, None), None, small)
    with pytest.raises(WireError, match="string of 200"):
        decode("k", encode("k", {"a": "x" * 200}, None), None, small)
    decode("k", encode("k", {"a": "[[[[[" * 10, "b": "\\\"{{{{"}, None), None, small)  # brackets in strings


def fuzzed(rng: np.random.Generator, good: list[bytes]) -> bytes:
    """A damaged, random, truncated, oversized or deeply nested message."""
    kind = int(rng.integers(8))
    base = bytearray(good[int(rng.integers(len(good)))])
    if kind == 0:
        return bytes(rng.integers(0, 256, int(rng.integers(0, 300)), dtype=np.uint8))
    if kind == 1:
        return bytes(base[: int(rng.integers(0, len(base)))])
    if kind == 2:
        for _ in range(int(rng.integers(1, 8))):
            base[int(rng.integers(len(base)))] = int(rng.integers(256))
        return bytes(base)
    if kind == 3:  # a header of deep nesting, unsigned
        depth = int(rng.integers(10, 100_000))
        text = b'{"kind":"measure","a":' + b"[" * depth + b"]" * depth + b"}"
        return MAGIC + bytes(33) + struct.pack("<II", len(text), 0) + text
    if kind == 4:  # lengths that lie
        text = b'{"kind":"measure"}'
        lengths = [int(x) for x in rng.integers(0, 1 << 62, 3, dtype=np.int64)]
        return (MAGIC + bytes(33) + struct.pack("<II", len(text), 3) + b"".join(struct.pack("<Q", n) for n in lengths)
                + text + bytes(int(rng.integers(0, 50))))
    if kind == 5:  # a random JSON header of another shape
        values = [None, 1, -1.5, "x", [], {}, [1, "a"], {"__buffer__": 7}, {"__array__": 0}, True]
        header = {"kind": "measure", **{str(k): values[int(rng.integers(len(values)))]
                                        for k in ("session", "seq", "job", "case", "case_key", "timeout")}}
        text = json.dumps(header).encode()
        if rng.random() < 0.2:  # a number of 5000 digits
            text = b'{"kind":"measure","seq":' + b"9" * 5000 + b"}"
        return MAGIC + bytes(33) + struct.pack("<II", len(text), 0) + text
    if kind == 6:  # a counts field claiming a huge header or many buffers
        return MAGIC + bytes(33) + struct.pack("<II", int(rng.integers(0, 1 << 32)), int(rng.integers(0, 1 << 32)))
    return pickle.dumps({"x": list(range(int(rng.integers(50))))})


def test_the_decoders_raise_only_their_own_error_on_hundreds_of_bad_messages(job):
    light, case = split_case(job)
    state = WorkerSessionState()
    good = [measure_request(MeasureRequest(light, "k", case, 1.0), state.session, 5, None),
            encode(MEASURE, {"session": state.session, "seq": 9}, None),
            encode(MEASURE, {"a": [np.arange(4.0), b"xyz"], "s": "\"[{"}, None)]
    rng = np.random.default_rng(43)
    small = Limits(total_bytes=1 << 20, header_bytes=1 << 19)
    kinds = set()
    for _ in range(600):
        data = fuzzed(rng, good)
        for read in (lambda d: decode(MEASURE, d, None, small), lambda d: read_measure_request(d, state, None),
                     lambda d: read_hello_reply(d, "n", None), lambda d: decode(MEASURE, d, SECRET)):
            try:
                read(data)
            except WireError as exc:
                kinds.add(str(exc)[:20])
            state.seq = 0
    assert len(kinds) > 5  # the fuzz reached more than one check
    assert not os.path.exists("pwned")
