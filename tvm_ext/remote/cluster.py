"""One host, several devices: a local RPC tracker and one ``tvm_ext.worker`` per device.

``--devices 0,1`` (``python -m tvm_ext.tune ... --devices 0,1``) starts them on 127.0.0.1 at
free ports, under a random key, with a random shared secret that signs every message (handed
to the workers through their environment, ``TVM_EXT_SECRET``, never their command line: any
local user can list the tracker's keys and read command lines), waits until every worker has
registered, measures through the RPC runner and stops them when the run ends or is
interrupted.  Each process is started in a session of its own (its own process group), so
Ctrl-C reaches only the driver, and ``stop`` ends every group (TVM's server and tracker leave
child processes behind when only their parent is ended).  A driver killed outright (SIGKILL)
cannot stop them: they are told by the kernel instead (``PR_SET_PDEATHSIG``, set by each from
``PARENT_ENV``) and end their own process trees.

``python -m tvm_ext.remote.cluster tracker --host H --port P`` is the tracker process of a cluster:
TVM's tracker, ended with everything under it.
"""
from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..core.errors import TvmExtError
from ..measure.lifetime import PARENT_ENV, end_descendants, end_with_parent, parent_gone
from .wire import SECRET_ENV

START_TIMEOUT = 180.0  # seconds for the tracker and every worker to come up (imports TVM twice)
Log = Callable[[str], None]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class ClusterProcess:
    name: str
    popen: subprocess.Popen
    log_path: str

    def tail(self, lines: int = 6) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                text = [l.rstrip() for l in fh.read().splitlines() if l.strip()]
        except OSError:
            return ""
        return " | ".join(text[-lines:])


class LocalCluster:
    """A tracker and a worker per device on this host (``start``), ended by ``stop``."""

    def __init__(self, devices: Sequence[int], target_kind: str, log: Log | None = None, host: str = "127.0.0.1",
                 start_timeout: float = START_TIMEOUT, secret: str | None = None):
        self.devices = tuple(devices)
        self.target_kind = target_kind
        self.log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self.host = host
        self.start_timeout = start_timeout
        self.key = f"tvm_ext-local-{secrets.token_hex(8)}"
        self.secret = secret or secrets.token_hex(32)  # the workers' and the runner's shared secret
        self.tracker: tuple[str, int] = (host, 0)
        self.processes: list[ClusterProcess] = []
        self.log_dir = ""

    @property
    def tracker_text(self) -> str:
        return f"{self.tracker[0]}:{self.tracker[1]}"

    def secret_file(self) -> str:
        """The shared secret in a file only its owner reads, in the cluster's log folder (gone
        with the cluster): for a runner given ``secret_file`` rather than the secret itself."""
        path = os.path.join(self.log_dir, "secret")
        if not os.path.exists(path):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
                fh.write(self.secret)
        return path

    def _spawn(self, name: str, argv: list[str], secret: str | None = None) -> ClusterProcess:
        path = os.path.join(self.log_dir, name.replace(" ", "_") + ".log")
        env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
        env.update({PARENT_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1", **({SECRET_ENV: secret} if secret else {})})
        with open(path, "wb") as out:
            popen = subprocess.Popen([sys.executable, *argv], stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        process = ClusterProcess(name, popen, path)
        self.processes.append(process)
        return process

    def start(self) -> "LocalCluster":
        """Start the tracker and the workers and wait until every worker is registered; any
        that cannot start is one ``TvmExtError`` naming it and the end of its log (and
        everything started is stopped)."""
        try:
            self._start()
        except BaseException:
            self.stop(keep_logs=True)
            raise
        return self

    def _start(self) -> None:
        from .rpc_runner import TrackerClient

        self.log_dir = tempfile.mkdtemp(prefix="tvm_ext_cluster_")
        if len(set(self.devices)) < len(self.devices):
            self.log(f"note: --devices {','.join(map(str, self.devices))} starts several workers on one device: "
                     "their timings disturb each other")
        port = free_port(self.host)
        self.tracker = (self.host, port)
        tracker = self._spawn("tracker", ["-m", "tvm_ext.remote.cluster", "tracker", "--host", self.host,
                                          "--port", str(port), "--log-dir", self.log_dir])
        deadline = time.monotonic() + self.start_timeout
        client = None
        while client is None:
            self._check_alive(deadline, [tracker], "the local RPC tracker")
            try:
                client = TrackerClient(self.tracker, timeout=2.0)
            except OSError:
                time.sleep(0.2)
        workers = [self.start_worker(device) for device in self.devices]
        try:
            while len(client.servers(self.key)) < len(workers):
                self._check_alive(deadline, workers + [tracker], "the workers")
                time.sleep(0.25)
        finally:
            client.close()
        self.log(f"rpc: local tracker {self.tracker_text}, one {self.target_kind} worker per device "
                 f"({', '.join(map(str, self.devices))}; logs: {self.log_dir})")

    def start_worker(self, device: int) -> ClusterProcess:
        """One more worker on ``device`` under the cluster's key (it registers when it is up)."""
        name = f"worker {len([p for p in self.processes if p.name.startswith('worker')])}"
        return self._spawn(name, ["-m", "tvm_ext.worker", "--tracker", self.tracker_text, "--key", self.key,
                                  "--device", str(device), "--target", self.target_kind, "--host", self.host,
                                  "--port", str(free_port(self.host))], secret=self.secret)

    def _check_alive(self, deadline: float, processes: Sequence[ClusterProcess], what: str) -> None:
        for process in processes:
            code = process.popen.poll()
            if code is not None:
                raise TvmExtError(f"{process.name} of the local cluster exited with code {code}: {process.tail()}"
                                  f" (log: {process.log_path})")
        if time.monotonic() > deadline:
            tails = "; ".join(f"{p.name}: {p.tail(2)}" for p in processes)
            raise TvmExtError(f"{what} did not come up within {self.start_timeout:g} s ({tails})")

    def stop(self, keep_logs: bool = False) -> None:
        """End every process group (SIGTERM, then SIGKILL after a few seconds); the logs go
        too unless ``keep_logs`` (a start that failed names them)."""
        if self.log_dir and os.path.isdir(self.log_dir):  # the tracker then leaves the logs to us
            open(os.path.join(self.log_dir, STOPPING_MARK), "w").close()
        for process in self.processes:
            _signal_group(process.popen, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for process in self.processes:
            try:
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for process in self.processes:  # the group: what the leader left behind goes too
            _signal_group(process.popen, signal.SIGKILL)
            try:
                process.popen.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass
        self.processes.clear()
        if self.log_dir and not keep_logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _signal_group(popen: subprocess.Popen, signum: int) -> None:
    """``signum`` to the process group ``popen`` leads (its own session)."""
    try:
        os.killpg(popen.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


# ---- the tracker process -------------------------------------------------------------------------
def _serve_tracker(host: str, port: int) -> int:
    from tvm.rpc.tracker import Tracker

    tracker = Tracker(host, port=port, port_end=port + 1, silent=True)
    print(f"tvm_ext cluster: RPC tracker on {host}:{tracker.port}", file=sys.stderr, flush=True)
    while tracker.proc.is_alive():
        time.sleep(0.5)
    return 1


STOPPING_MARK = "driver-stopping"  # written by a driver ending its cluster itself


def _stop(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ending already: a second signal must not cut it short
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tvm_ext.remote.cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    tracker = sub.add_parser("tracker", help="a TVM RPC tracker, ended with everything under it")
    tracker.add_argument("--host", default="127.0.0.1")
    tracker.add_argument("--port", type=int, required=True)
    tracker.add_argument("--log-dir", default="", help="the cluster's logs: removed if the driver died first")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    end_with_parent()
    try:
        return _serve_tracker(args.host, args.port)
    except KeyboardInterrupt:
        return 130
    finally:
        end_descendants()
        orphaned = args.log_dir and not os.path.exists(os.path.join(args.log_dir, STOPPING_MARK))
        if orphaned and parent_gone():  # nobody is left to read or remove them
            shutil.rmtree(args.log_dir, ignore_errors=True)


if __name__ == "__main__":
    from tvm_ext.measure.lifetime import keep_torch_out

    keep_torch_out()  # TVM's FFI would import it: seconds of the tracker's start, unused here
    sys.exit(main())
