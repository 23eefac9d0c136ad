"""``python -m tvm_ext.worker``: a TVM RPC server that measures tvm_ext's jobs on one device.

    python -m tvm_ext.worker --tracker HOST:PORT --key KEY [--device N] [--target opencl|cuda]
                             [--host H] [--port P] [--custom-addr ADDR]

It is TVM's own RPC server (``tvm.rpc.Server``), registered at the tracker under ``KEY``, with
tvm_ext's functions added to the server process (``server_init_callback``):

- ``tvm_ext.worker.hello(protocol)``: a pickled ``WorkerInfo``: this worker's device as a
  ``TargetInfo`` (the driver's workload keys name it), its protocol and tvm_ext version;
- ``tvm_ext.worker.measure(request)``: a pickled ``MeasureRequest`` in, a pickled
  ``MeasureReply`` out: ``run_job`` on this worker's device in an ``IsolatedMeasurer``, the
  local runner's isolation (a kernel past the run timeout or one that kills its process is an
  error result, and the next job gets a fresh process).

TVM's server serves one session at a time, each in a process forked from the server process;
a driver keeps its session for the whole run, so the measuring process, its device context and
the check's inputs (sent once per workload: ``MeasureRequest.case``) live as long.  The
device is chosen before anything touches it: ``CUDA_VISIBLE_DEVICES`` for CUDA (device N of
those visible), the OpenCL device index for OpenCL.

The process tree (this process, TVM's server process, a session process, the measuring
process) ends together: SIGTERM or SIGINT here ends every process under this one.
"""
from __future__ import annotations

import argparse
import functools
import os
import pickle
import signal
import socket
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Sequence

from .errors import TvmExtError
from .lifetime import end_descendants, end_with_parent
from .measure import MeasureJob, RunResult
from .target import TARGET_KINDS, TargetInfo

PROTOCOL = 1  # bumped when a request or reply changes shape: driver and worker must agree
HELLO = "tvm_ext.worker.hello"
MEASURE = "tvm_ext.worker.measure"
DEFAULT_PORT = 9091
PORT_RANGE = 100  # ports tried from --port on (TVM's server binds the first free one)
_CASES_KEPT = 4  # workloads whose check inputs and references a session keeps


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
    reference is 32 MB) travel once per session and workload: ``case`` holds them (pickled)
    the first time, ``job`` travels without them, and ``case_key`` names them."""

    job: MeasureJob
    case_key: str
    case: bytes | None
    timeout: float


@dataclass(frozen=True)
class MeasureReply:
    result: RunResult | None  # None: the session does not have ``case_key``; send the case
    seconds: float = 0.0  # the worker's time for the job


def split_case(job: MeasureJob) -> tuple[MeasureJob, tuple[Any, ...]]:
    """``job`` without its check's data, and that data: (inputs, or None when the worker
    draws them from the seed; references; the check)."""
    arrays = None if hasattr(job.inputs, "draw") else job.inputs
    light = replace(job, inputs=job.inputs if arrays is None else (), references=(), check=None)  # type: ignore[arg-type]
    return light, (arrays, job.references, job.check)


def join_case(job: MeasureJob, case: tuple[Any, ...]) -> MeasureJob:
    arrays, references, check = case
    return replace(job, inputs=job.inputs if arrays is None else arrays, references=references, check=check)


# ---- the server side (a session process) -------------------------------------------------------
class _Session:
    """What one RPC session (one driver's run) keeps: its measuring process and cases."""

    def __init__(self, device_id: int, label: str):
        from .runner import IsolatedMeasurer

        self.device_id = device_id
        self.label = label
        self.measurer = IsolatedMeasurer()
        self.cases: OrderedDict[str, tuple[Any, ...]] = OrderedDict()
        self.jobs = 0
        import multiprocessing.util

        # the session process ends through multiprocessing's exit path, which runs these
        multiprocessing.util.Finalize(self, self.measurer.close, exitpriority=10)

    def measure(self, request: MeasureRequest) -> MeasureReply:
        start = time.perf_counter()
        if request.case is not None:
            self.cases[request.case_key] = pickle.loads(request.case)
            while len(self.cases) > _CASES_KEPT:
                self.cases.popitem(last=False)
        case = self.cases.get(request.case_key)
        if case is None:
            return MeasureReply(None)
        self.cases.move_to_end(request.case_key)
        job = replace(join_case(request.job, case), device_id=self.device_id)
        self.measurer.timeout = request.timeout
        result = self.measurer.run(job)
        self.jobs += 1
        secs = time.perf_counter() - start
        status = f"{result.cost * 1e3:.4f} ms" if result.ok else f"{result.error_kind}: {result.error_msg[:80]}"
        print(f"{time.strftime('%H:%M:%S')} {self.label}: job {self.jobs} {job.artifact.source_hash} {status} "
              f"({secs:.2f} s)", file=sys.stderr, flush=True)
        return MeasureReply(result, secs)


_SESSION: _Session | None = None


def _serve_init(info: bytes, device_id: int, label: str) -> None:
    """Runs in TVM's server process before it serves: tvm_ext's functions, for every session."""
    import tvm_ffi

    def hello(protocol: int) -> bytes:
        return info

    def measure(request: bytes) -> bytes:
        global _SESSION
        if _SESSION is None:  # first job of this session process (forked per session)
            _SESSION = _Session(device_id, label)
        return pickle.dumps(_SESSION.measure(pickle.loads(bytes(request))), protocol=pickle.HIGHEST_PROTOCOL)

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
    from .cli_checks import Parser

    p = Parser(prog="python -m tvm_ext.worker",
               description="Serve tvm_ext's measurements on one device to drivers through a TVM RPC tracker "
                           "(python -m tvm_ext.tune ... --runner rpc --tracker HOST:PORT --key KEY).")
    p.add_argument("--tracker", required=True, metavar="HOST:PORT", help="the TVM RPC tracker to register with")
    p.add_argument("--key", required=True, help="the key drivers ask the tracker for (one key per kind of device)")
    p.add_argument("--device", type=int, default=0,
                   help="device index (CUDA: of the visible GPUs, via CUDA_VISIBLE_DEVICES; OpenCL: tvm_ext's "
                        "device index, GPUs first; default 0)")
    p.add_argument("--target", default="opencl", help="opencl (default) or cuda")
    p.add_argument("--host", default="0.0.0.0", help="address the server listens on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"first port tried; the next free one of {PORT_RANGE} is used (default {DEFAULT_PORT})")
    p.add_argument("--custom-addr", default=None,
                   help="the address the tracker gives drivers for this server (default: as the tracker sees it)")
    return p


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
    tracker = parse_address(args.tracker)
    why = reachable(tracker)
    if why is not None:
        raise TvmExtError(f"cannot reach the RPC tracker {args.tracker}: {why}")
    if target_kind == "cuda":
        select_cuda_device(args.device)
    device_id = 0 if target_kind == "cuda" else args.device
    from . import __version__
    from .target import resolve_target

    target = resolve_target(target_kind, device_id)
    label = f"{target_kind} {args.device} ({target.device_name})"
    info = WorkerInfo(PROTOCOL, __version__, target, socket.gethostname(), f"{target_kind} {args.device}")
    from tvm import rpc

    server = rpc.Server(args.host, args.port, min(args.port + PORT_RANGE, 65536), tracker_addr=tracker,
                        key=args.key, custom_addr=args.custom_addr, silent=True,
                        server_init_callback=functools.partial(_serve_init, pickle.dumps(info), device_id, label))
    print(f"tvm_ext worker: {label} serving key {args.key!r} on {args.host}:{server.port}, tracker {args.tracker}",
          file=sys.stderr, flush=True)
    while server.proc.is_alive():
        time.sleep(0.5)
    print("tvm_ext worker: the RPC server process ended", file=sys.stderr)
    return 1


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


if __name__ == "__main__":
    # run as the module's own name, so what is pickled (WorkerInfo, the server's init function)
    # names tvm_ext.worker, which the driver and TVM's server process import
    from tvm_ext.worker import main as _main

    sys.exit(_main())
