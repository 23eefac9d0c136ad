"""``python -m tvm_ext.worker``: a TVM RPC server that measures tvm_ext's jobs on one device.

    python -m tvm_ext.worker --tracker HOST:PORT --key KEY [--device N] [--target opencl|cuda]
                             [--host H] [--port P] [--custom-addr ADDR] [--secret-file PATH] [--insecure]

It is TVM's own RPC server (``tvm.rpc.Server``), registered at the tracker under ``KEY``, with
tvm_ext's functions added to the server process (``server_init_callback``):

- ``tvm_ext.worker.hello(message)``: a hello in, this worker's ``WorkerInfo`` out (its device
  as a ``TargetInfo``: the driver's workload keys name it; its protocol and tvm_ext version)
  with the session's id;
- ``tvm_ext.worker.measure(message)``: a ``MeasureRequest`` in, a ``MeasureReply`` out:
  ``run_job`` on this worker's device in an ``IsolatedMeasurer``, the local runner's isolation
  (a kernel past the run timeout or one that kills its process is an error result, and the
  next job gets a fresh process).  That measuring process belongs to this process
  (``measuring_service``): started and warmed when the worker starts, kept between runs, and
  reached by the session processes over a local socket.

Both travel as ``tvm_ext.remote.wire`` messages (JSON and raw buffers, read by ``tvm_ext.remote.messages``:
nothing received is unpickled), signed with the shared secret (``--secret-file`` or
``TVM_EXT_SECRET``) when there is one; a message that is not signed as it must be, or does
not read, is refused and the refusal is the reply.  The worker listens on 127.0.0.1 unless
``--host`` says otherwise, and a worker listening beyond loopback needs the secret (or
``--insecure``).  The secret guards tvm_ext's functions, not TVM's own: its RPC server uploads
and runs libraries for any client, by design, so a worker belongs on a trusted network.

TVM's server serves one session at a time, each in a process forked from the server process;
a driver keeps its session for the whole run, and the check's inputs (sent once per workload:
``MeasureRequest.case``) live as long, in the session and in the measuring process.  The
device is chosen before anything touches it: ``CUDA_VISIBLE_DEVICES`` for CUDA (device N of
those visible), the OpenCL device index for OpenCL.

The process tree (this process, its measuring process, TVM's server process, a session
process) ends together: SIGTERM or SIGINT here ends every process under this one, and the server
and session processes end themselves, and what is under them, once their parent is gone (this
process killed outright leaves no server serving, registered at the tracker).  A worker whose
server cannot serve any more (its process died, or a session process died, which ends TVM's
listening thread while the process lives on, dropped from the tracker) exits with code 1 and one
``error:`` line, so a supervisor restarts it.
"""
from __future__ import annotations

import argparse
import functools
import ipaddress
import os
import signal
import socket
import sys
import time
from dataclasses import replace
from typing import Any, Sequence

from ..core.errors import TvmExtError
from ..measure.lifetime import end_descendants, end_tree_with_parent, end_with_parent
from .messages import (PROTOCOL, MeasureReply, MeasureRequest, WorkerInfo, WorkerSessionState, hello_reply,
                       join_case, measure_reply, read_measure_request, split_case)
from ..target import TARGET_KINDS
from .wire import SECRET_ENV, WireError, load_secret

__all__ = ["PROTOCOL", "HELLO", "MEASURE", "MeasureReply", "MeasureRequest", "WorkerInfo", "join_case", "main",
           "split_case"]
HELLO = "tvm_ext.worker.hello"
MEASURE = "tvm_ext.worker.measure"
DEFAULT_PORT = 9091
PORT_RANGE = 100  # ports tried from --port on (TVM's server binds the first free one)
LISTENER_LOST = 3  # the server process's exit code once TVM's listening thread has ended


# ---- the server side (a session process) -------------------------------------------------------
class _Session:
    """What one RPC session (one driver's run) keeps: its handle on the worker's measuring
    process (``measuring_service``), which holds the cases it is sent."""

    def __init__(self, device_id: int, label: str, service: tuple[str, bytes]):
        from .measuring_service import ServiceClient

        self.device_id = device_id
        self.label = label
        self.measurer = ServiceClient(*service)
        self.jobs = 0
        import multiprocessing.util

        # the session process ends through multiprocessing's exit path, which runs these
        multiprocessing.util.Finalize(self, self.measurer.close, exitpriority=10)

    def measure(self, request: MeasureRequest) -> MeasureReply:
        start = time.perf_counter()
        if request.case is not None:  # with a job or ahead of one: on to the measuring process
            self.measurer.hold(request.case_key, request.case)
        if request.job is None:
            return MeasureReply(None, time.perf_counter() - start)
        job = replace(request.job, device_id=self.device_id)
        self.measurer.timeout = request.timeout
        result = self.measurer.run(job, request.case_key)
        if result is None:  # the case is not held (dropped for newer ones): the driver sends it again
            return MeasureReply(None, time.perf_counter() - start)
        self.jobs += 1
        secs = time.perf_counter() - start
        status = f"{result.cost * 1e3:.4f} ms" if result.ok else f"{result.error_kind}: {result.error_msg[:80]}"
        print(f"{time.strftime('%H:%M:%S')} {self.label}: job {self.jobs} {job.artifact.source_hash} {status} "
              f"({secs:.2f} s)", file=sys.stderr, flush=True)
        return MeasureReply(result, secs)


_SESSION: _Session | None = None
_STATE: WorkerSessionState | None = None


def _session(device_id: int, label: str, service: tuple[str, bytes]) -> _Session:
    """This session process's ``_Session``, made at its first accepted hello."""
    global _SESSION
    if _SESSION is None:
        _SESSION = _Session(device_id, label, service)
    return _SESSION


def _session_state() -> WorkerSessionState:
    """This session process's id and sequence (made in the process forked for the session,
    which from then on ends with the server process)."""
    global _STATE
    if _STATE is None:
        end_tree_with_parent()
        _STATE = WorkerSessionState()
    return _STATE


def _exit_when_listener_ends() -> None:
    """In TVM's server process: exit ``LISTENER_LOST`` once its listening thread has ended.
    TVM's server raises in that thread when a session process dies, and then serves no one and
    is dropped by the tracker while its process lives on; exiting lets the worker see it.  The
    thread's traceback is not printed: the worker says what happened in one line."""
    import threading

    from tvm.rpc.server import PopenRPCServerState

    default_hook = threading.excepthook

    def hook(args: Any) -> None:
        state = PopenRPCServerState.current
        if state is None or args.thread is not getattr(state, "thread", None):
            default_hook(args)

    def watch() -> None:
        while getattr(PopenRPCServerState.current, "thread", None) is None:
            time.sleep(0.05)
        PopenRPCServerState.current.thread.join()
        end_descendants(timeout=1.0, rounds=2)
        os._exit(LISTENER_LOST)

    threading.excepthook = hook
    threading.Thread(target=watch, name="tvm_ext-watch-listener", daemon=True).start()


def _serve_init(info: WorkerInfo, device_id: int, label: str, secret: bytes | None, worker_pid: int,
                service: tuple[str, bytes]) -> None:
    """Runs in TVM's server process before it serves: tvm_ext's functions, for every session;
    the process ends with the worker (``worker_pid``) and exits once it can serve no more.

    TVM starts that process itself and hands it this callback (with its arguments) pickled,
    through a pipe to its own child process: a local process start, not network input.  What
    the functions receive from the network is read by ``tvm_ext.remote.messages`` only."""
    import tvm_ffi

    end_tree_with_parent(worker_pid)
    _exit_when_listener_ends()

    def hello(message: bytes) -> bytes:
        reply, refused = hello_reply(message, info, _session_state(), secret)
        if refused:
            print(f"{time.strftime('%H:%M:%S')} {label}: refused a hello: {refused}", file=sys.stderr, flush=True)
        else:
            _session(device_id, label, service)
        return reply

    def measure(message: bytes) -> bytes:
        state = _session_state()
        try:
            request, seq = read_measure_request(message, state, secret)
        except WireError as exc:
            print(f"{time.strftime('%H:%M:%S')} {label}: refused a request: {exc}", file=sys.stderr, flush=True)
            return measure_reply(None, state, 0, secret, rejected=str(exc))
        return measure_reply(_session(device_id, label, service).measure(request), state, seq, secret)

    tvm_ffi.register_global_func(HELLO, hello, override=True)
    tvm_ffi.register_global_func(MEASURE, measure, override=True)


# ---- the command -----------------------------------------------------------------------------
def parse_address(text: str, what: str = "--tracker") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TvmExtError(f"{what} {text!r} is not HOST:PORT")
    return host, int(port)


def reachable(address: tuple[str, int], timeout: float = 5.0) -> str | None:
    """``None`` when something accepts connections at ``address``, else why not."""
    try:
        with socket.create_connection(address, timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__


def select_cuda_device(device: int) -> None:
    """Make CUDA device ``device`` (of those visible) the only one this process tree sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if device >= len(ids):
            raise TvmExtError(f"--device {device}: CUDA_VISIBLE_DEVICES={visible} makes {len(ids)} visible")
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[device]
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device)


def build_parser() -> argparse.ArgumentParser:
    from ..cli.cli_checks import Parser

    p = Parser(prog="python -m tvm_ext.worker",
               description="Serve tvm_ext's measurements on one device to drivers through a TVM RPC tracker "
                           "(python -m tvm_ext.tune ... --runner rpc --tracker HOST:PORT --key KEY).")
    p.add_argument("--tracker", required=True, metavar="HOST:PORT", help="the TVM RPC tracker to register with")
    p.add_argument("--key", required=True, help="the key drivers ask the tracker for (one key per kind of device)")
    p.add_argument("--device", type=int, default=0,
                   help="device index (CUDA: of the visible GPUs, via CUDA_VISIBLE_DEVICES; OpenCL: tvm_ext's "
                        "device index, GPUs first; default 0)")
    p.add_argument("--target", default="opencl", help="opencl (default) or cuda")
    p.add_argument("--host", default="127.0.0.1",
                   help="address the server listens on (default 127.0.0.1; beyond this host it needs the shared "
                        "secret, or --insecure)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"first port tried; the next free one of {PORT_RANGE} is used (default {DEFAULT_PORT})")
    p.add_argument("--custom-addr", default=None,
                   help="the address the tracker gives drivers for this server (default: as the tracker sees it)")
    p.add_argument("--secret-file", default=None, metavar="PATH",
                   help=f"the shared secret that signs every message (default: ${SECRET_ENV}, else none); the "
                        "tuner needs the same one")
    p.add_argument("--insecure", action="store_true",
                   help="listen beyond loopback without a secret (on a trusted network only: tvm_ext's functions "
                        "then answer anyone who reaches the port, as TVM's own always do)")
    return p


def is_loopback(host: str) -> bool:
    """``host`` is an address of this host only (a name other than localhost is not assumed so)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(args: argparse.Namespace) -> int:
    target_kind = args.target.lower()
    if target_kind not in TARGET_KINDS:
        raise TvmExtError(f"unknown target {args.target!r}; allowed: {', '.join(TARGET_KINDS)}")
    if args.device < 0:
        raise TvmExtError(f"--device must be >= 0, got {args.device}")
    if not 0 < args.port < 65536:
        raise TvmExtError(f"--port must be a port number, got {args.port}")
    if not args.key.strip():
        raise TvmExtError("--key must not be empty")
    secret = load_secret(args.secret_file)
    if secret is None and not is_loopback(args.host) and not args.insecure:
        raise TvmExtError(f"--host {args.host} listens beyond this host: give a shared secret (--secret-file PATH or "
                          f"{SECRET_ENV}, the tuner the same) or pass --insecure on a trusted network")
    tracker = parse_address(args.tracker)
    why = reachable(tracker)
    if why is not None:
        raise TvmExtError(f"cannot reach the RPC tracker {args.tracker}: {why}")
    if target_kind == "cuda":
        select_cuda_device(args.device)
    device_id = 0 if target_kind == "cuda" else args.device
    from .. import __version__
    from ..target import resolve_target

    target = resolve_target(target_kind, device_id)
    label = f"{target_kind} {args.device} ({target.device_name})"
    info = WorkerInfo(PROTOCOL, __version__, target, socket.gethostname(), f"{target_kind} {args.device}")
    from tvm import rpc

    from .measuring_service import MeasuringService

    service = MeasuringService(target_kind, device_id, label)  # warm before a tuner connects
    try:
        server = rpc.Server(args.host, args.port, min(args.port + PORT_RANGE, 65536), tracker_addr=tracker,
                            key=args.key, custom_addr=args.custom_addr, silent=True,
                            server_init_callback=functools.partial(_serve_init, info, device_id, label, secret,
                                                                  os.getpid(), (service.address, service.authkey)))
        signed = "signed messages" if secret else "no secret: messages unsigned"
        print(f"tvm_ext worker: {label} serving key {args.key!r} on {args.host}:{server.port}, tracker "
              f"{args.tracker} ({signed})", file=sys.stderr, flush=True)
        while server.proc.is_alive():
            time.sleep(0.5)
        code = getattr(getattr(server.proc, "_proc", None), "returncode", None)
        print(f"error: {server_ended(code)}; the worker exits so that a supervisor can "
              "restart it", file=sys.stderr, flush=True)
        return 1
    finally:
        service.close()


def server_ended(code: int | None) -> str:
    """Why the worker's TVM server process ended, from its exit code."""
    if code == LISTENER_LOST:
        return "a session process of the TVM RPC server died, and the server serves no more"
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the TVM RPC server process was killed ({name})"
    return f"the TVM RPC server process ended (exit code {code})"


def _stop(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ending already: a second signal must not cut it short
    raise SystemExit(0 if signum == signal.SIGTERM else 130)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    end_with_parent()  # a worker of a local cluster ends with the driver that started it
    try:
        return serve(args)
    except TvmExtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        end_descendants()

