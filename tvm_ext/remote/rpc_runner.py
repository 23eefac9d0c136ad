"""The RPC runner: measurements on the servers a TVM RPC tracker knows under one key.

    python -m tvm_ext.tune gemm ... --runner rpc --tracker HOST:PORT --key KEY [--parallel N]

TVM's tracker hands out its free servers; this runner does no scheduling of its own.  It keeps
N slots (``--parallel``, default one per server of the key): each slot asks the tracker for a
server, and slots take a batch's jobs from one queue, so a batch runs on every server at once
and each result resolves its future as it arrives.  Builds stay in the local process pool.

Two kinds of server answer under a key:

- a ``tvm_ext.worker`` (``python -m tvm_ext.worker``): it has tvm_ext's functions.  A slot
  keeps its session for the run; a job travels as data (``MeasureJob`` as a ``tvm_ext.remote.wire``
  message: JSON and raw buffers, signed with the shared secret when there is one) and runs on
  the worker's device with the local runner's check, timing and isolation.  The device it
  reports (``WorkerInfo.target``) is the run's target, so its name is in the workload key.
  Its replies are read as data, never unpickled: a reply that does not read (not signed with
  the secret, damaged, forged) is "worker reply rejected: <why>" and that server is dropped;
  a worker of another tvm_ext version is one error naming both versions.
- a stock TVM server (``python -m tvm.exec.rpc_server``, no tvm_ext there): CUDA programs of
  one function (GEMM, reductions) are uploaded, loaded (``load_module``) and run through the
  remote module, as meta_schedule's RPC runner does: the check's inputs are written from
  here, the outputs read back and checked here, and the time is TVM's ``time_evaluator`` on
  the server's GPU (one input set: inputs that fit in L2 are timed warm).  One session per
  job, whose timeout (the server ends it) is the run timeout.

Faults: a server lost mid-job (killed, its host gone) gives its job to another server, and
after ``ATTEMPTS`` lost servers the job is a ``crash`` record; a kernel past the run timeout is
a ``run_timeout`` record.  The tracker unreachable at start, no server under the key, servers
of different devices or kinds under one key, or a ``--target`` other than the servers' device
are one ``TvmExtError`` before anything is built; the tracker lost mid-run (found before the
next batch) or no server left stops the search with ``RunnerLost`` (the records written so
far are kept: a rerun resumes).
"""
from __future__ import annotations

import contextlib
import queue
import select
import socket
import struct
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol, Sequence

from ..measure.builder import BuildResult
from ..measure.cases import case_key_of
from ..core.errors import ErrorKind, RunnerLost, TvmExtError
from ..measure.measure import MeasureJob, MeasureSettings, RunResult, keyed_case, make_job, run_job
from .messages import hello_request, measure_request, read_hello_reply, read_measure_reply
from ..measure.pools import settle
from ..measure.program import MAIN
from ..measure.runner import job_error, resolved
from ..target import TargetInfo, cuda_target_of
from ..core.template import Template
from .wire import SECRET_ENV, WireError
from .worker import HELLO, MEASURE, PROTOCOL, MeasureReply, MeasureRequest, WorkerInfo, split_case

Log = Callable[[str], None]
ATTEMPTS = 2  # servers a job is sent to before a lost server makes it a crash record
CONNECT_TIMEOUT = 5.0  # seconds to reach the tracker (a dead address fails fast)
CHECK_SECS = 5.0  # while waiting for a server, how often to look whether any is left


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


OPEN_FAILURES_LIMIT = 5  # sessions one server may fail to open in a row before the run stops with why

class ServerLost(Exception):
    """The connection to a server broke while it had a job (the job was not measured there)."""


class ReplyRejected(Exception):
    """A worker's reply did not read as a message of ours (unsigned, damaged, forged): nothing
    of it was used, and the server is dropped."""


# ---- the tracker ----------------------------------------------------------------------------------
class TrackerClient:
    """One connection to a TVM RPC tracker, in its protocol (``tvm.rpc.base``), with timeouts:
    an unreachable tracker fails in seconds, and a wait for a free server can be abandoned."""

    def __init__(self, address: tuple[str, int], timeout: float = CONNECT_TIMEOUT):
        from tvm.rpc import base

        self.address = address
        self.timeout = timeout
        self._base = base
        self._sock = socket.create_connection(address, timeout=timeout)
        try:
            self._sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            magic = struct.unpack("<i", base.recvall(self._sock, 4))[0]
        except (OSError, RuntimeError) as exc:
            self.close()
            raise OSError(f"no TVM RPC tracker answered ({exc})") from None
        if magic != base.RPC_TRACKER_MAGIC:
            self.close()
            raise OSError("the program listening there is not a TVM RPC tracker")

    def _call(self, message: list[Any]) -> Any:
        if self._sock is None:
            raise OSError("the tracker connection is closed")
        try:
            self._base.sendjson(self._sock, message)
            return self._base.recvjson(self._sock)
        except RuntimeError as exc:  # recvall's "connection reset" is a RuntimeError there
            raise OSError(str(exc)) from None

    def summary(self) -> dict[str, Any]:
        reply = self._call([self._base.TrackerCode.SUMMARY])
        if reply[0] != self._base.TrackerCode.SUCCESS:
            raise OSError(f"the tracker answered {reply!r} to a summary request")
        return reply[1]

    def servers(self, key: str) -> list[tuple[str, int]]:
        """The servers registered under ``key`` (free or busy)."""
        return [tuple(s["addr"]) for s in self.summary()["server_info"] if s.get("key") == f"server:{key}"]

    def ping(self) -> None:
        if self._call([self._base.TrackerCode.PING]) != self._base.TrackerCode.SUCCESS:
            raise OSError("the tracker did not answer a ping")

    def request(self, key: str, stopped: Callable[[], bool], on_wait: Callable[[], None] | None = None,
                priority: int = 1) -> tuple[str, int, str] | None:
        """The next free server of ``key`` (address and match key), waiting as long as the
        tracker has none; ``None`` once ``stopped()``.  ``on_wait`` is called every
        ``CHECK_SECS`` of waiting (it may raise to give up)."""
        if self._sock is None:
            raise OSError("the tracker connection is closed")
        self._base.sendjson(self._sock, [self._base.TrackerCode.REQUEST, key, "", priority])
        waited = 0.0
        while not stopped():
            readable, _, _ = select.select([self._sock], [], [], 0.25)
            if readable:
                try:
                    reply = self._base.recvjson(self._sock)
                except RuntimeError as exc:
                    raise OSError(str(exc)) from None
                if reply[0] != self._base.TrackerCode.SUCCESS:
                    raise OSError(f"the tracker answered {reply!r} to a request")
                url, port, matchkey = reply[1]
                return str(url), int(port), str(matchkey)
            waited += 0.25
            if on_wait is not None and waited >= CHECK_SECS:
                waited = 0.0
                on_wait()
        return None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def connect_tracker(address: tuple[str, int]) -> TrackerClient:
    """A tracker connection, or one ``TvmExtError`` saying why there is none."""
    try:
        return TrackerClient(address)
    except OSError as exc:
        host, port = address
        why = exc.strerror or str(exc) or type(exc).__name__
        raise TvmExtError(f"cannot reach the RPC tracker {host}:{port}: {why} (start one: python -m "
                          f"tvm.exec.rpc_tracker --host {host} --port {port}; its workers with the shared secret: "
                          f"{SECRET_ENV} or --secret-file)") from None


# ---- sessions with servers ------------------------------------------------------------------------
class ServerSession(Protocol):
    address: str  # host:port of the server
    kind: str  # "tvm_ext" (a tvm_ext worker) or "stock" (a stock TVM server)
    target: TargetInfo
    single_use: bool  # one job per session (the session's timeout is the job's)

    def measure(self, job: MeasureJob, timeout: float) -> RunResult:
        """The job's result (failures as data); ``ServerLost`` when the server went away."""

    def close(self) -> None: ...


def _tvm_error_line(exc: BaseException) -> str:
    lines = [l.strip() for l in str(exc).strip().splitlines() if l.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def check_worker(info: WorkerInfo, address: str) -> None:
    """The worker runs this tuner's tvm_ext (version and protocol), or one error naming both."""
    from .. import __version__

    if info.protocol != PROTOCOL or info.version != __version__:
        raise TvmExtError(f"the tvm_ext worker at {address} runs tvm_ext {info.version} (protocol {info.protocol}), "
                          f"this tuner tvm_ext {__version__} (protocol {PROTOCOL}): install the same tvm_ext on both")


class WorkerSession:
    """A session with a ``tvm_ext.worker``: jobs as data, measured on the worker's device."""

    kind = "tvm_ext"
    single_use = False

    def __init__(self, session: Any, address: str, hello: Any, secret: bytes | None = None):
        from .. import __version__

        self.address = address
        self._session = session
        self._secret = secret
        message, nonce = hello_request(__version__, secret)
        reply = bytes(hello(bytearray(message)))
        try:
            info, self._id = read_hello_reply(reply, nonce, secret)
        except WireError as exc:
            raise ReplyRejected(f"worker reply rejected: {exc}") from None
        check_worker(info, address)
        self.info = info
        self.target = info.target
        self._hello = hello
        self._measure = session.get_function(MEASURE)
        self._seq = 0
        self._cases: set[str] = set()  # case keys this session has been sent
        self._lock = threading.Lock()  # the slot's jobs and a case sent ahead take turns

    def send_case(self, key: str, case: tuple[Any, ...], timeout: float) -> None:
        """Send case ``key`` ahead of its jobs (the worker passes it on to its measuring
        process); a failure is left to the next job to meet."""
        with self._lock:
            if key in self._cases or self._measure is None:
                return
            try:
                self._call(MeasureRequest(None, key, case, timeout))
                self._cases.add(key)
            except (ServerLost, ReplyRejected):
                pass

    def measure(self, job: MeasureJob, timeout: float) -> RunResult:
        with self._lock:
            return self._measure_job(job, timeout)

    def _measure_job(self, job: MeasureJob, timeout: float) -> RunResult:
        light, case = split_case(job)
        key = case_key_of(case)
        if key is None:
            return RunResult((), ErrorKind.RUN_ERROR, f"a {type(case[2]).__name__} check cannot go to a worker")
        for _ in range(2):
            send = None if key in self._cases else case
            reply = self._call(MeasureRequest(light, key, send, timeout))
            self._cases.add(key)
            if reply.result is not None:  # the worker's own seconds beside the round trip's (the slot's)
                return replace(reply.result, metrics={**reply.result.metrics, "worker_secs": round(reply.seconds, 4)})
            self._cases.discard(key)  # the worker dropped it: send it again
        return RunResult((), ErrorKind.RUN_ERROR, f"the worker at {self.address} did not keep the check's data")

    def _call(self, request: MeasureRequest) -> MeasureReply:
        self._seq += 1
        payload = bytearray(measure_request(request, self._id, self._seq, self._secret))
        try:
            reply = bytes(self._measure(payload))
        except Exception as exc:
            if not self._alive():
                raise ServerLost(_tvm_error_line(exc)) from None
            # the worker answered but its function failed: data, not a lost server
            return MeasureReply(RunResult((), ErrorKind.RUN_ERROR, f"worker {self.address}: {_tvm_error_line(exc)}"))
        try:
            return read_measure_reply(reply, self._id, self._seq, self._secret)
        except WireError as exc:
            raise ReplyRejected(f"worker reply rejected: {exc}") from None

    def _alive(self) -> bool:
        try:
            self._hello(bytearray(hello_request("", self._secret)[0]))
            return True
        except Exception:
            return False

    def close(self) -> None:
        # the session ends when the last object referring to it is gone
        self._session = self._measure = self._hello = None


class StockSession:
    """A session with a stock TVM server: a CUDA program of one function is uploaded, loaded
    and run there; the check's inputs go from here, its outputs come back and are checked
    here, and ``time_evaluator`` times it on the server's GPU."""

    kind = "stock"
    single_use = True

    def __init__(self, session: Any, address: str, target_kind: str):
        self.address = address
        self._session = session
        if target_kind != "cuda":
            has_opencl = _remote_exists(session.cl(0))
            raise TvmExtError(
                f"the server at {address} is a stock TVM server (no tvm_ext there"
                f"{', an OpenCL device' if has_opencl else ', no OpenCL device'}): tvm_ext measures OpenCL through "
                "its own worker; run python -m tvm_ext.worker --target opencl on that host (it needs Python and "
                "pyopencl), or measure CUDA (--target cuda) on stock servers")
        dev = session.cuda(0)
        if not _remote_exists(dev):
            raise TvmExtError(f"the stock TVM server at {address} has no CUDA GPU (--target cuda)")
        try:
            l2 = int(dev.l2_cache_size_bytes)
        except Exception:  # an older runtime without the attribute
            l2 = 0
        self.target = cuda_target_of(dev, 0, l2)

    def measure(self, job: MeasureJob, timeout: float) -> RunResult:
        art = job.artifact
        plan = job.plan
        if not (art.kind == "cuda" and art.library and len(art.calls) == 1 and art.calls[0].name == MAIN
                and plan.timer == "device" and not plan.stages and plan.failure_flag is None):
            return RunResult((), ErrorKind.RUN_ERROR,
                             "a stock TVM server runs CUDA programs of one function timed on the device; "
                             "this program needs a tvm_ext worker (python -m tvm_ext.worker)")
        from ..measure.executors import CudaExecutor

        try:
            name = f"tvm_ext_{art.source_hash}.so"
            self._session.upload(bytearray(art.library), name)
            module = self._session.load_module(name)
            executor = CudaExecutor(module, art.calls, dict(job.buffers), 0, dev=self._session.cuda(0),
                                    prepared=plan.prepare_steps)
        except Exception as exc:
            return self._failed(exc)
        result = run_job(replace(job, rotation_sets=1), executor)
        if result.error_kind == ErrorKind.RUN_ERROR:
            return self._failed(RuntimeError(result.error_msg), result)
        return result

    def _failed(self, exc: BaseException, result: RunResult | None = None) -> RunResult:
        """A failure on the server: the session's timeout (the server ended the session: the
        run timeout), the server gone (``ServerLost``), or the program's own error."""
        text = str(exc)
        if "RPCSessionTimeoutError" in text or "session has expired" in text:
            return RunResult((), ErrorKind.RUN_TIMEOUT, f"the stock server ended the session: {_tvm_error_line(exc)}")
        if not _remote_exists(self._session.cuda(0)):
            raise ServerLost(_tvm_error_line(exc))
        return result or RunResult((), ErrorKind.RUN_ERROR, _tvm_error_line(exc))

    def close(self) -> None:
        self._session = None


def _remote_exists(dev: Any) -> bool:
    try:
        return bool(dev.exist)
    except Exception:
        return False


def open_session(url: str, port: int, matchkey: str, target_kind: str, session_timeout: float = 0,
                 secret: bytes | None = None) -> ServerSession:
    """A session with the server the tracker gave; which kind answered decides the path."""
    from tvm import rpc

    session = rpc.connect(url, port, matchkey, session_timeout=session_timeout)
    address = f"{url}:{port}"
    try:
        hello = session.get_function(HELLO)
    except AttributeError:  # no tvm_ext function there: a stock TVM server
        return StockSession(session, address, target_kind)
    return WorkerSession(session, address, hello, secret)


def same_device(a: TargetInfo, b: TargetInfo) -> bool:
    """Two servers measure the same device (their index on their host aside)."""
    return replace(a, device_id=0) == replace(b, device_id=0)


# ---- the runner -----------------------------------------------------------------------------------
@dataclass(eq=False)
class _Item:
    job: MeasureJob
    future: "Future[RunResult]"
    attempts: int = 0


class RpcRunner:
    """Measures on the servers of ``key`` at the tracker ``tracker``, ``parallel`` jobs at once
    (default: one per server registered at start).  ``start`` connects and asks the servers
    for their device (``target``); ``close`` ends the sessions (and ``cluster``, if given)."""

    def __init__(self, tracker: tuple[str, int], key: str, target_kind: str, settings: MeasureSettings,
                 timeout: float = 60.0, parallel: int | None = None, log: Log | None = None,
                 server_wait: float = 10.0, lost_grace: float = 30.0, cluster: Any = None,
                 secret: bytes | None = None):
        self.tracker = tracker
        self.key = key
        self.target_kind = target_kind
        self.settings = settings
        self.timeout = timeout
        self.parallel = parallel
        self.log = log or _stderr
        self.server_wait = server_wait  # seconds a start waits for a first server to register
        self.lost_grace = lost_grace  # seconds with no server of the key before the run stops
        self.cluster = cluster  # a LocalCluster this runner stops when it closes
        self.secret = secret  # signs every message to and from tvm_ext workers (None: unsigned)
        self._rejected: dict[str, str] = {}  # server address -> why its reply was rejected
        self._target: TargetInfo | None = None
        self._kind = ""
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._pending: set[_Item] = set()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._open_failures: dict[str, int] = {}  # server address -> sessions it failed to open in a row
        self._lost: RunnerLost | None = None
        self._threads: list[threading.Thread] = []
        self._held = 0  # slots holding a session
        self._sessions: set[ServerSession] = set()  # the sessions the slots hold
        self._none_since: float | None = None
        self._control: TrackerClient | None = None
        self._busy: dict[str, float] = {}  # server address -> seconds its slots spent measuring

    @property
    def busy_secs(self) -> dict[str, float]:
        """Seconds each server (by address) spent on this runner's jobs so far, a job's
        time on a server lost mid-job included: the devices' busy time as the runner knows it."""
        with self._lock:
            return dict(self._busy)

    @property
    def target(self) -> TargetInfo:
        if self._target is None:
            raise RuntimeError("RpcRunner.start() first")
        return self._target

    @property
    def where(self) -> str:
        return f"key {self.key!r} at the RPC tracker {self.tracker[0]}:{self.tracker[1]}"

    # ---- start ------------------------------------------------------------------------------------
    def start(self) -> "RpcRunner":
        """Connect; wait (``server_wait``) for servers of the key; open a session with each
        (up to ``parallel``) and check they are one kind of server on one device."""
        self._control = connect_tracker(self.tracker)
        servers = self._registered(self.server_wait)
        if not servers:
            raise TvmExtError(f"no server is registered under {self.where}; start one there: python -m "
                              f"tvm_ext.worker --tracker {self.tracker[0]}:{self.tracker[1]} --key {self.key} (beyond "
                              f"loopback: --host ADDR with the tuner's secret, {SECRET_ENV} or --secret-file)")
        slots = self.parallel or len(servers)
        self.in_flight = slots  # jobs measured at once
        sessions: list[ServerSession] = []
        try:
            first = self._open_at_start(None)
            if first is None:
                raise TvmExtError(f"no server of {self.where} became free")
            sessions.append(first)
            deadline = time.monotonic() + self.server_wait
            while len(sessions) < min(slots, len(servers)):
                session = self._open_at_start(deadline)
                if session is None:
                    break  # the others are busy (another run): they join when free
                sessions.append(session)
        except BaseException:
            for session in sessions:
                session.close()
            raise
        devices = sorted({s.address for s in sessions})
        self.log(f"rpc: {len(sessions)} of {len(servers)} {self._kind_text()} under {self.where}: "
                 f"{self.target.kind}:{self.target.device_name} ({', '.join(devices)}); {slots} in flight")
        for index in range(slots):
            held = sessions[index] if index < len(sessions) and not sessions[index].single_use else None
            if index < len(sessions) and held is None:
                sessions[index].close()
            thread = threading.Thread(target=self._slot, args=(held,), name=f"rpc-slot-{index}", daemon=True)
            self._threads.append(thread)
            if held is not None:
                self._hold(held)
            thread.start()
        return self

    def _kind_text(self) -> str:
        return "tvm_ext workers" if self._kind == "tvm_ext" else "stock TVM servers"

    def _registered(self, wait: float) -> list[tuple[str, int]]:
        deadline = time.monotonic() + wait
        while True:
            try:
                servers = self._control.servers(self.key)  # type: ignore[union-attr]
            except OSError as exc:
                raise TvmExtError(f"the RPC tracker {self.tracker[0]}:{self.tracker[1]} failed: {exc}") from None
            if servers or time.monotonic() >= deadline:
                return servers
            time.sleep(0.25)

    def _open_at_start(self, deadline: float | None) -> ServerSession | None:
        """A session for the start: until ``deadline``, or (None) as long as it takes, saying
        so after a few seconds (every server busy with another run)."""
        stop = threading.Event()
        if deadline is not None:
            timer = threading.Timer(max(0.0, deadline - time.monotonic()), stop.set)
        else:
            timer = threading.Timer(CHECK_SECS, self.log, (f"rpc: every server of {self.where} is busy; waiting "
                                                           "for one (Ctrl-C to stop)",))
        timer.daemon = True
        timer.start()
        try:
            return self._open(stop)
        except RunnerLost as exc:
            raise TvmExtError(str(exc)) from None
        finally:
            timer.cancel()

    def _open(self, stop: threading.Event) -> ServerSession | None:
        """A session with the next free server (checked against the run's device), waiting
        as long as none is free; ``None`` once ``stop`` (or closing) is set."""
        while not (stop.is_set() or self._closing.is_set()):
            try:
                client = TrackerClient(self.tracker)
            except OSError as exc:
                raise RunnerLost(self._tracker_lost(exc)) from None
            try:
                got = client.request(self.key, lambda: stop.is_set() or self._closing.is_set(),
                                     self._check_servers_left)
            except OSError as exc:
                raise RunnerLost(self._tracker_lost(exc)) from None
            finally:
                client.close()
            if got is None:
                return None
            url, port, matchkey = got
            address = f"{url}:{port}"
            if address in self._rejected:  # not connected to again: another server, or none
                self._reject(address, self._rejected[address])
                time.sleep(0.5)
                continue
            timeout = self.timeout if self._kind == "stock" else 0
            try:
                session = open_session(url, port, matchkey, self.target_kind, timeout, self.secret)
            except TvmExtError as exc:
                raise RunnerLost(str(exc)) from None
            except ReplyRejected as exc:
                self._reject(address, str(exc))
                continue
            except Exception as exc:  # the server went away between the tracker and us
                failures = self._open_failures[address] = self._open_failures.get(address, 0) + 1
                if failures >= OPEN_FAILURES_LIMIT:  # a server that registers but cannot serve
                    raise RunnerLost(
                        f"the server at {address} failed to open a session {failures} times in a row (last: "
                        f"{_tvm_error_line(exc)}); a stock TVM server measuring CUDA must run with --no-fork "
                        "(a forked session cannot initialise CUDA): stop it or fix it, then rerun to resume") from None
                self.log(f"rpc: could not open a session with {address} ({_tvm_error_line(exc)}); asking again")
                time.sleep(0.5)
                continue
            self._open_failures.pop(address, None)
            self._accept(session)
            return session
        return None

    def _reject(self, address: str, why: str) -> None:
        """Drop the server at ``address`` for the run (its reply was rejected); with no other
        server left under the key, nothing more can be measured (``RunnerLost``)."""
        if address not in self._rejected:
            self._rejected[address] = why
            self.log(f"rpc: {why}; the server at {address} is dropped")
        try:
            with contextlib.closing(TrackerClient(self.tracker)) as client:
                servers = client.servers(self.key)
        except OSError as exc:
            raise RunnerLost(self._tracker_lost(exc)) from None
        if all(f"{host}:{port}" in self._rejected for host, port in servers):
            raise RunnerLost(f"{why} (the server at {address}); no other server is left under {self.where}: "
                             f"give the workers the tuner's shared secret ({SECRET_ENV} or --secret-file) and the "
                             "same tvm_ext, or take the server off the key")

    def _accept(self, session: ServerSession) -> None:
        """Check a new session against the run: one kind of server, one device, ``--target``."""
        if self._target is None:
            if session.target.kind != self.target_kind:
                session.close()
                raise RunnerLost(f"the servers of {self.where} measure on {session.target.kind} "
                                 f"({session.target.device_name}), not {self.target_kind}: pass --target "
                                 f"{session.target.kind}")
            self._target, self._kind = session.target, session.kind
            return
        if session.kind != self._kind:
            session.close()
            raise RunnerLost(f"{session.address} under {self.where} is a {session.kind} server, the others "
                             f"{self._kind}: give each kind of server its own key")
        if not same_device(session.target, self._target):
            session.close()
            raise RunnerLost(f"{session.address} under {self.where} has a {session.target.device_name} "
                             f"({session.target.kind} {session.target.arch}), the others a "
                             f"{self._target.device_name} ({self._target.kind} {self._target.arch}): give each "
                             "kind of device its own key")

    def _tracker_lost(self, exc: BaseException) -> str:
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return (f"lost the RPC tracker {self.tracker[0]}:{self.tracker[1]} ({why}); the records measured so far "
                "are kept: restart the tracker and its servers, then rerun the same command to resume")

    def _check_servers_left(self) -> None:
        """Called while a slot waits for a server: with none left under the key and no slot
        holding one for ``lost_grace`` seconds, nothing more can be measured."""
        with self._lock:
            if self._held > 0 or not self._pending:
                self._none_since = None
                return
        try:
            with contextlib.closing(TrackerClient(self.tracker)) as client:
                servers = client.servers(self.key)
        except OSError as exc:
            raise RunnerLost(self._tracker_lost(exc)) from None
        if servers:
            self._none_since = None
            return
        now = time.monotonic()
        if self._none_since is None:
            self._none_since = now
            self.log(f"rpc: no server left under {self.where}; waiting {self.lost_grace:g} s for one")
        elif now - self._none_since >= self.lost_grace:
            raise RunnerLost(f"no server left under {self.where} for {self.lost_grace:g} s; the records measured "
                             "so far are kept: start servers, then rerun the same command to resume")

    # ---- the slots --------------------------------------------------------------------------------
    def _slot(self, session: ServerSession | None) -> None:
        try:
            while not self._closing.is_set():
                if session is None and self._kind != "stock":
                    session = self._open(threading.Event())  # hold a server, then take jobs
                    if session is None:
                        return
                    self._hold(session)
                item = self._queue.get()
                if item is None:
                    return
                if session is None:  # stock servers: a session per job, with the run timeout
                    session = self._open(threading.Event())
                    if session is None:
                        self._queue.put(item)
                        return
                    self._hold(session)
                address, started = session.address, time.perf_counter()
                try:
                    result = session.measure(item.job, self.timeout)
                except ServerLost as exc:
                    self._drop(session)
                    session = None
                    self._lost_server(item, exc)
                    continue
                except ReplyRejected as exc:  # nothing of the reply used: the job goes to another server
                    self._drop(session)
                    session = None
                    self._queue.put(item)
                    self._reject(address, str(exc))
                    continue
                finally:
                    self._busy_for(address, started)
                metrics = {**result.metrics, "server": session.address,
                           "round_trip_secs": round(time.perf_counter() - started, 4)}
                self._resolve(item, replace(result, metrics=metrics))
                if session.single_use:
                    self._drop(session)
                    session = None
        except RunnerLost as exc:
            self._fail(exc)
        except Exception as exc:  # a bug here must not leave the tuner waiting forever
            self._fail(RunnerLost(f"the RPC runner failed: {type(exc).__name__}: {exc}"))
        finally:
            if session is not None:
                self._drop(session)

    def _busy_for(self, address: str, started: float) -> None:
        with self._lock:
            self._busy[address] = self._busy.get(address, 0.0) + time.perf_counter() - started

    def _hold(self, session: ServerSession) -> None:
        with self._lock:
            self._held += 1
            self._sessions.add(session)

    def _drop(self, session: ServerSession) -> None:
        session.close()
        with self._lock:
            self._held -= 1
            self._sessions.discard(session)

    def _lost_server(self, item: _Item, exc: ServerLost) -> None:
        item.attempts += 1
        if self._closing.is_set():
            return
        if item.attempts >= ATTEMPTS:
            self._resolve(item, RunResult((), ErrorKind.CRASH, f"lost {item.attempts} servers while measuring it "
                                                               f"(last: {exc})"[:300]))
            return
        self.log(f"rpc: a server was lost during a measurement ({exc}); its job goes to another server")
        self._queue.put(item)

    def _resolve(self, item: _Item, result: RunResult) -> None:
        with self._lock:
            self._pending.discard(item)
            settle(item.future, result)

    def _fail(self, exc: RunnerLost) -> None:
        """Nothing more can be measured: every waiting future raises ``exc``."""
        with self._lock:
            if self._lost is None:
                self._lost = exc
            pending, self._pending = self._pending, set()
            for item in pending:
                settle(item.future, None, exc)

    # ---- the Runner protocol ----------------------------------------------------------------------
    def prepare(self, template: Template, config: Any) -> None:
        """The workload's check data (``config``'s, the default's), made and sent to every worker
        session held, on threads while the first candidates build: the first job of each then
        travels without it, and its measuring process holds it already."""
        def send_all() -> None:
            keyed = keyed_case(template, config, self.settings)
            with self._lock:
                sessions = [s for s in self._sessions if isinstance(s, WorkerSession)]
            for session in sessions if keyed is not None else ():
                threading.Thread(target=session.send_case, args=(*keyed, self.timeout), daemon=True,
                                 name="rpc-case-ahead").start()

        threading.Thread(target=send_all, daemon=True, name="rpc-prepare").start()

    def submit(self, template: Template, builds: Sequence[BuildResult]) -> list["Future[RunResult]"]:
        if self._lost is not None:
            raise self._lost
        self._ping()
        futures: list[Future[RunResult]] = []
        for build in builds:
            try:
                if build.artifact is None:
                    raise ValueError(f"{build.config} was not built: nothing to measure")
                job = make_job(template, build.config, build.artifact, self.target, self.settings, 0)
            except Exception as exc:
                futures.append(resolved(job_error(exc)))
                continue
            item = _Item(job, Future())
            with self._lock:
                self._pending.add(item)
            self._queue.put(item)
            futures.append(item.future)
        return futures

    def _ping(self) -> None:
        """The tracker is still there (found before a batch, not by a slot much later)."""
        try:
            if self._control is None:
                self._control = TrackerClient(self.tracker)
            self._control.ping()
        except OSError:
            if self._control is not None:
                self._control.close()
            self._control = None
            try:  # once more, on a fresh connection
                self._control = TrackerClient(self.tracker)
                self._control.ping()
            except OSError as exc:
                self._control = None
                self._fail(RunnerLost(self._tracker_lost(exc)))
                raise self._lost from None  # type: ignore[misc]

    def close(self) -> None:
        self._closing.set()
        for _ in self._threads:
            self._queue.put(None)
        if self.cluster is not None:  # its servers go first: slots in a call return at once
            self.cluster.stop()
        for thread in self._threads:
            thread.join(timeout=5.0)
        self._fail(RunnerLost("the RPC runner was closed"))
        if self._control is not None:
            self._control.close()
            self._control = None

    def __enter__(self) -> "RpcRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

