"""Messages between the tuner and its workers as plain data: a JSON header and raw byte buffers.

Nothing that crosses the network is unpickled: a message is

    MAGIC (4) | signed (1) | HMAC-SHA256 (32) | header length (u32) | buffers (u32)
    | each buffer's length (u64) | the header (UTF-8 JSON) | the buffers

and the header refers to its buffers by index: ``{"__buffer__": i}`` (bytes: a CUDA library)
and ``{"__array__": i, "dtype": ..., "shape": [...]}`` (a numpy array, rebuilt with
``numpy.frombuffer`` after the dtype is checked against ``ARRAY_DTYPES`` and shape times
itemsize against the buffer's length).  ``decode`` checks, in this order, the total size and
the magic, then the signature (when this side has a secret: an HMAC over the message kind and
everything after the signature, so a message is good for one kind only), and only then parses
the framing and the header, within ``Limits``.  Anything wrong is one ``WireError``.

The shared secret (``load_secret``) comes from a key file or ``TVM_EXT_SECRET``.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import TvmExtError

MAGIC = b"TXW1"
SECRET_ENV = "TVM_EXT_SECRET"
_PREFIX = struct.Struct("<4sB32s")  # magic, signed, mac
_COUNTS = struct.Struct("<II")  # header length, buffers
_LENGTH = struct.Struct("<Q")
BUFFER_KEY = "__buffer__"
ARRAY_KEY = "__array__"
ARRAY_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e5m2")
MAX_NDIM = 32
_TOKENS = re.compile(rb'\\.|["\[\]{}]', re.DOTALL)  # an escape pair, a quote or a bracket


class WireError(ValueError):
    """A message that is not one of ours, is damaged, too large or not signed as it must be:
    rejected before anything in it is used."""


@dataclass(frozen=True)
class Limits:
    """What a decoder accepts at most (a GEMM of 4096³'s float64 reference is 128 MiB)."""

    total_bytes: int = 2 << 30
    buffers: int = 64
    header_bytes: int = 16 << 20
    depth: int = 16  # JSON nesting
    string_chars: int = 8 << 20  # a program's source is one string


LIMITS = Limits()


def load_secret(path: str | None = None) -> bytes | None:
    """The shared secret: the contents of ``path`` (surrounding whitespace stripped), else
    ``TVM_EXT_SECRET``, else ``None`` (no secret: messages are not signed)."""
    if path:
        try:
            with open(path, "rb") as fh:
                secret = fh.read(1 << 16).strip()
        except OSError as exc:
            raise TvmExtError(f"cannot read the secret file {path}: {exc.strerror or exc}") from None
        if not secret:
            raise TvmExtError(f"the secret file {path} is empty")
        return secret
    text = os.environ.get(SECRET_ENV, "").strip()
    return text.encode() if text else None


def _mac(secret: bytes, kind: str, body: memoryview | bytes) -> bytes:
    mac = hmac.new(secret, kind.encode() + b"\0", hashlib.sha256)
    mac.update(body)
    return mac.digest()


# ---- encoding ------------------------------------------------------------------------------------
def _plain(value: Any, buffers: list[memoryview | bytes], depth: int, limits: Limits) -> Any:
    """``value`` as JSON data, its bytes and arrays moved to ``buffers``."""
    if depth > limits.depth:
        raise WireError(f"nested deeper than {limits.depth}")
    if isinstance(value, np.ndarray):
        if value.dtype.name not in ARRAY_DTYPES:
            raise WireError(f"arrays of {value.dtype} do not travel")
        array = np.asarray(value, order="C")  # ascontiguousarray would make a 0-d array 1-d
        buffers.append(memoryview(array.reshape(-1).view(np.uint8)))
        return {ARRAY_KEY: len(buffers) - 1, "dtype": value.dtype.name, "shape": list(array.shape)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        buffers.append(value if isinstance(value, bytes) else bytes(value))
        return {BUFFER_KEY: len(buffers) - 1}
    if isinstance(value, dict):
        return {str(k): _plain(v, buffers, depth + 1, limits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, buffers, depth + 1, limits) for v in value]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise WireError(f"a {type(value).__name__} does not travel")


def encode(kind: str, header: dict[str, Any], secret: bytes | None, limits: Limits = LIMITS) -> bytes:
    """``header`` (JSON data, bytes and numpy arrays) as one message of ``kind``, signed with
    ``secret`` when there is one."""
    buffers: list[memoryview | bytes] = []
    plain = _plain({**header, "kind": kind}, buffers, 1, limits)
    text = json.dumps(plain, separators=(",", ":")).encode()
    lengths = [len(b) if isinstance(b, bytes) else b.nbytes for b in buffers]
    if len(buffers) > limits.buffers or len(text) > limits.header_bytes:
        raise WireError(f"a {kind} message of {len(buffers)} buffers and a {len(text)}-byte header is too large")
    body = b"".join([_COUNTS.pack(len(text), len(buffers)), *(_LENGTH.pack(n) for n in lengths), text, *buffers])
    if _PREFIX.size + len(body) > limits.total_bytes:
        raise WireError(f"a {kind} message of {_PREFIX.size + len(body)} bytes is over {limits.total_bytes}")
    mac = _mac(secret, kind, body) if secret else bytes(32)
    return _PREFIX.pack(MAGIC, 1 if secret else 0, mac) + body


# ---- decoding ------------------------------------------------------------------------------------
def _check_depth(text: bytes, limit: int) -> None:
    """JSON nesting of ``text`` at most ``limit``, found before parsing (the parser recurses)."""
    depth, in_string = 0, False
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token == b'"':
            in_string = not in_string
        elif in_string or len(token) == 2:
            continue
        elif token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                raise WireError(f"the header is nested deeper than {limit}")
        else:
            depth -= 1


def _array(ref: dict[str, Any], buffers: list[memoryview]) -> np.ndarray:
    dtype, shape = ref.get("dtype"), ref.get("shape")
    if set(ref) != {ARRAY_KEY, "dtype", "shape"} or dtype not in ARRAY_DTYPES:
        raise WireError(f"an array reference {str(ref)[:80]} is not one (dtypes: {', '.join(ARRAY_DTYPES)})")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(
            type(d) is int and d >= 0 for d in shape):
        raise WireError(f"an array's shape {str(shape)[:80]} is not one")
    from ..precision.precision import np_dtype

    np_type = np_dtype(dtype)
    buffer = _buffer(ref[ARRAY_KEY], buffers)
    if math.prod(shape) * np_type.itemsize != buffer.nbytes:
        raise WireError(f"an array of {dtype} {shape} does not fill its {buffer.nbytes} bytes")
    return np.frombuffer(buffer, dtype=np_type).reshape(shape).copy()


def _buffer(index: Any, buffers: list[memoryview]) -> memoryview:
    if type(index) is not int or not 0 <= index < len(buffers):
        raise WireError(f"a reference to buffer {str(index)[:20]} of {len(buffers)}")
    return buffers[index]


def _resolve(value: Any, buffers: list[memoryview], limits: Limits) -> Any:
    """The parsed header with its references replaced by bytes and arrays, every string checked."""
    if isinstance(value, str):
        if len(value) > limits.string_chars:
            raise WireError(f"a string of {len(value)} characters is over {limits.string_chars}")
        return value
    if isinstance(value, list):
        return [_resolve(v, buffers, limits) for v in value]
    if isinstance(value, dict):
        if ARRAY_KEY in value:
            return _array(value, buffers)
        if BUFFER_KEY in value:
            if len(value) != 1:
                raise WireError("a buffer reference with other keys")
            return bytes(_buffer(value[BUFFER_KEY], buffers))
        return {_resolve(k, buffers, limits): _resolve(v, buffers, limits) for k, v in value.items()}
    return value


def decode(kind: str, data: Any, secret: bytes | None, limits: Limits = LIMITS) -> dict[str, Any]:
    """The header of a message of ``kind`` (its references resolved); ``WireError`` for anything
    else: another kind, a bad or missing signature, damaged framing, a limit passed."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"a {type(data).__name__} where a message was expected")
    view = memoryview(data).cast("B")
    if view.nbytes > limits.total_bytes:
        raise WireError(f"a message of {view.nbytes} bytes is over {limits.total_bytes}")
    if view.nbytes < _PREFIX.size + _COUNTS.size or bytes(view[:4]) != MAGIC:
        raise WireError("not a tvm_ext message (a pickle from an older tvm_ext, or something else)")
    _, signed, mac = _PREFIX.unpack_from(view)
    body = view[_PREFIX.size:]
    if secret:
        if signed != 1:
            raise WireError("the message is not signed: the other side has no shared secret (give it the same "
                            f"secret: --secret-file or {SECRET_ENV})")
        if not hmac.compare_digest(mac, _mac(secret, kind, body)):
            raise WireError(f"bad signature on a {kind} message: the shared secrets differ, or it was altered")
    elif signed != 0:
        raise WireError(f"the message is signed but this side has no shared secret (--secret-file or {SECRET_ENV})")
    header_len, count = _COUNTS.unpack_from(body)
    if count > limits.buffers:
        raise WireError(f"{count} buffers, over {limits.buffers}")
    if header_len > limits.header_bytes:
        raise WireError(f"a header of {header_len} bytes is over {limits.header_bytes}")
    start = _COUNTS.size + count * _LENGTH.size
    if body.nbytes < start + header_len:
        raise WireError("the message is truncated")
    lengths = [_LENGTH.unpack_from(body, _COUNTS.size + i * _LENGTH.size)[0] for i in range(count)]
    if start + header_len + sum(lengths) != body.nbytes:
        raise WireError(f"the buffers' lengths do not add up to the message's {view.nbytes} bytes")
    text = bytes(body[start:start + header_len])
    _check_depth(text, limits.depth)
    try:
        header = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise WireError(f"the header is not JSON: {str(exc)[:100]}") from None
    if not isinstance(header, dict) or header.get("kind") != kind:
        got = header.get("kind") if isinstance(header, dict) else type(header).__name__
        raise WireError(f"a {str(got)[:40]!r} message where {kind!r} was expected")
    buffers, offset = [], start + header_len
    for length in lengths:
        buffers.append(body[offset:offset + length])
        offset += length
    return _resolve(header, buffers, limits)
