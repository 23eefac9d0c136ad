"""A ``tvm_ext.worker``'s measuring process, started and warmed once when the worker starts and
shared by its sessions.

TVM's server forks a session process per tuner that connects; a measuring process of each
session's own spent the run's first seconds starting (a fresh interpreter importing TVM, then
loading the device: 2-4 s on a GPU host) while the tuner waited.  The worker's main process
owns it instead (``MeasuringService``), warm before any tuner connects and kept between runs,
with the cases it holds; a session reaches it through ``ServiceClient`` over a local socket.

The socket is a Unix one in a directory only this user can enter, and each connection is
authenticated with a random key that only the worker's own processes have (it reaches the
session processes as an argument of TVM's server start, a local process start): what crosses
it is pickled, as between any of the worker's processes and their pools, and never comes from
the network (the tuner's messages are read by ``tvm_ext.remote.messages``).
"""
from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from ..measure.cases import join_case, keep_latest
from ..measure.measure import MeasureJob, RunResult
from ..measure.runner import CASE_MISSING, IsolatedMeasurer

__all__ = ["MeasuringService", "ServiceClient"]


class MeasuringService:
    """The measuring process of one device (an ``IsolatedMeasurer``, warmed now) and the local
    socket its clients measure through, one job at a time."""

    def __init__(self, kind: str, device_id: int, label: str, timeout: float = 60.0):
        self.measurer = IsolatedMeasurer(timeout)
        self._lock = threading.Lock()  # one job at a time, whichever session sends it
        self._cases: OrderedDict[str, tuple[Any, ...]] = OrderedDict()  # the latest, by key
        start = time.perf_counter()
        self.measurer.warm(kind, device_id).add_done_callback(lambda _: print(
            f"{time.strftime('%H:%M:%S')} {label}: measuring process ready ({time.perf_counter() - start:.2f} s)",
            file=sys.stderr, flush=True))
        self._dir = tempfile.mkdtemp(prefix="tvm_ext_worker_")  # mode 0700: this user only
        self.address = os.path.join(self._dir, "measure")
        self.authkey = secrets.token_bytes(32)
        self._listener = Listener(self.address, family="AF_UNIX", authkey=self.authkey)
        self._closed = False
        threading.Thread(target=self._accept, name="tvm_ext-measuring-service", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except Exception:  # closed, or a client that failed the key
                if self._closed:
                    return
                continue
            threading.Thread(target=self._serve, args=(conn,), name="tvm_ext-measuring-client", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        """One client's requests in order: ("run", job, key, timeout) -> its ``RunResult``
        (``CASE_MISSING`` where the case of ``key`` is not held); ("hold", key, case) -> None;
        anything that fails -> ("error", why)."""
        with conn:
            while True:
                try:
                    request = conn.recv()
                except (EOFError, OSError):
                    return
                try:
                    reply: Any = ("ok", self._handle(request))
                except Exception as exc:  # the client's job fails, the service goes on
                    reply = ("error", f"{type(exc).__name__}: {exc}"[:300])
                try:
                    conn.send(reply)
                except OSError:  # the session ended meanwhile
                    return

    def _handle(self, request: tuple[Any, ...]) -> Any:
        op, *args = request
        with self._lock:
            if op == "run":  # a job without its case, held here (``tvm_ext.measure.cases``)
                job, key, timeout = args
                if key not in self._cases:
                    return CASE_MISSING
                self._cases.move_to_end(key)
                job = join_case(job, self._cases[key])
                self.measurer.timeout = timeout
                return self.measurer.run(job, key)
            if op == "hold":
                key, case = args
                keep_latest(self._cases, key, case)
                self.measurer.hold(key, case)
                return None
        raise ValueError(f"unknown request {op!r}")

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        finally:
            self.measurer.close()
            shutil.rmtree(self._dir, ignore_errors=True)


class ServiceClient:
    """A session's handle on the worker's ``MeasuringService``: cases go there once (``hold``),
    jobs without them (``run``)."""

    def __init__(self, address: str, authkey: bytes, timeout: float = 60.0):
        self.timeout = timeout
        self._address, self._authkey = address, authkey
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    def _call(self, *request: Any) -> Any:
        with self._lock:
            if self._conn is None:
                self._conn = Client(self._address, family="AF_UNIX", authkey=self._authkey)
            self._conn.send(request)
            status, value = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"the worker's measuring service: {value}")
        return value

    def run(self, job: MeasureJob, case_key: str) -> RunResult | None:
        """Measure ``job`` (without its case) with the held case ``case_key``; None where the
        service does not hold it (never sent, or dropped for newer ones): send it again."""
        result = self._call("run", job, case_key, self.timeout)
        return None if isinstance(result, str) and result == CASE_MISSING else result

    def hold(self, case_key: str, case: tuple[Any, ...]) -> None:
        self._call("hold", case_key, case)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
