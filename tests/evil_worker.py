"""A fake tvm_ext worker for the tests: registered under a key at a tracker, it answers with
pickles whose unpickling would create a file.

    python evil_worker.py TRACKER_HOST:PORT KEY PORT MARKER MODE

MODE ``hello``: the hello reply is the pickle; ``measure``: the hello is a good one (no
secret: what an attacker who does not know one can send) and every measure reply is the pickle.
"""
from __future__ import annotations

import functools
import sys
import time


class MakesAFile:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def init(marker: str, mode: str) -> None:
    import pickle

    import tvm_ffi

    from tvm_ext import __version__
    from tvm_ext.remote.messages import PROTOCOL, WorkerInfo, WorkerSessionState, hello_reply
    from tvm_ext.target import resolve_target

    payload = pickle.dumps(MakesAFile(marker))
    info = WorkerInfo(PROTOCOL, __version__, resolve_target("opencl", 0), "evil", "opencl 0")

    def hello(message: bytes) -> bytes:
        return payload if mode == "hello" else hello_reply(message, info, WorkerSessionState(), None)[0]

    def measure(message: bytes) -> bytes:
        return payload

    tvm_ffi.register_global_func("tvm_ext.worker.hello", hello, override=True)
    tvm_ffi.register_global_func("tvm_ext.worker.measure", measure, override=True)


def main() -> None:
    from tvm import rpc

    tracker, key, port, marker, mode = sys.argv[1:6]
    host, tracker_port = tracker.rsplit(":", 1)
    server = rpc.Server("127.0.0.1", int(port), int(port) + 100, tracker_addr=(host, int(tracker_port)), key=key,
                        silent=True, server_init_callback=functools.partial(init, marker, mode))
    while server.proc.is_alive():
        time.sleep(0.5)


if __name__ == "__main__":
    main()
