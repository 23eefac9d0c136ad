"""Measuring through TVM's RPC tracker: real trackers and tvm_ext workers on 127.0.0.1 (PoCL).

A tuning run lands on both workers and is as correct as a local run; a worker killed while
it measures gives its job to the other, and a run survives it with nothing lost or measured
twice; a kernel past the run timeout and a crashing kernel are records and the workers go on;
the tracker missing at start is one ``error:`` line, lost mid-run a clear message with the
records kept; Ctrl-C and the end of a ``--devices`` run leave no process behind; servers of
another device or kind under one key are refused.  Every process a test starts lives in a
process group of its own, and each test checks that none is left when it ends.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace

import numpy as np
import psutil
import pytest

from broken_gemm import BrokenGemm
from cluster_groups import assert_groups_end, quiet
from interrupt import sigint_default
from tvm_ext.measure.builder import build_one
from tvm_ext.remote.cluster import LocalCluster, free_port
from tvm_ext.core.errors import ErrorKind, TvmExtError
from tvm_ext.measure.measure import MeasureSettings
from tvm_ext.core.records import RecordStore
from tvm_ext.remote.rpc_runner import RpcRunner, same_device
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.target import offline_cuda
from tvm_ext.remote.wire import SECRET_ENV

CLI = [sys.executable, "-m", "tvm_ext.tune"]
SHAPE = ["gemm", "--shape", "24,16,20", "--workers", "1", "--no-progress"]
FAST = MeasureSettings(warmup=1, repeat=3, min_repeat_secs=0.002)
SLOW = MeasureSettings(warmup=1, repeat=1, min_repeat_secs=3.0)  # with ``slowed`` kernels: jobs of 3 s and more


def alive(processes) -> list[int]:
    out = []
    for proc in processes:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except psutil.Error:
            continue
    return out


def tune(args, records, timeout=600, **kwargs):
    return subprocess.run(CLI + SHAPE + args + ["--records", str(records)], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def records_of(path) -> list:
    return list(RecordStore(path, warn=quiet))


def secret_file(cluster: LocalCluster) -> str:
    return cluster.secret_file()


def tracker_args(cluster: LocalCluster) -> list[str]:
    return ["--tracker", cluster.tracker_text, "--key", cluster.key, "--secret-file", secret_file(cluster)]


def worker_jobs(process) -> int:
    with open(process.log_path, encoding="utf-8") as fh:
        return sum(": job " in line for line in fh)


def gemm_builds(opencl, count: int, seed: int = 1):
    template = GemmTemplate(24, 16, 20)
    space = template.space(opencl)
    configs = [template.default_config(opencl)] + [
        space.decode(r) for r in space.random_feasible_indices(np.random.default_rng(seed), count - 1)]
    return template, [build_one(template, c, opencl) for c in configs]


def slowed(build, iterations: int = 200_000):
    """The same kernel (same result) with a loop at its start that makes each run last
    milliseconds: a condition the inputs never meet (they lie in [-1, 1)) keeps it."""
    source = build.artifact.source
    head = source.index(") {\n") + len(") {\n")  # the definition (the declaration ends with ";")
    loop = "  for (int spin = 0; spin < %d; ++spin) { if (A_ptr[0] > 2.0f + spin) { C_ptr[0] = 0.0f; } }\n" % iterations
    return replace(build, artifact=replace(build.artifact, source=source[:head] + loop + source[head:]))


# ---- a tuning run over the tracker ------------------------------------------------------------------
def test_a_tuning_run_lands_on_both_workers_and_is_as_correct_as_a_local_run(cluster, tmp_path):
    search = ["--strategy", "random", "--generations", "1", "--population", "6", "--seed", "3"]
    remote = tune(search + tracker_args(cluster), tmp_path / "rpc.jsonl")
    assert remote.returncode == 0, remote.stderr
    local = tune(search, tmp_path / "local.jsonl")
    assert local.returncode == 0, local.stderr
    by_config = lambda recs: {json.dumps(r.config, sort_keys=True): r for r in recs}  # noqa: E731
    rpc_records = by_config(records_of(tmp_path / "rpc.jsonl"))
    local_records = by_config(records_of(tmp_path / "local.jsonl"))
    assert len(rpc_records) == len(records_of(tmp_path / "rpc.jsonl")) >= 6  # each config once
    assert rpc_records.keys() == local_records.keys()
    servers = Counter(r.metrics["server"] for r in rpc_records.values())
    assert len(servers) == 2, servers  # both workers measured
    assert all(worker_jobs(p) > 0 for p in cluster.processes if p.name.startswith("worker"))
    for config, rec in rpc_records.items():
        twin = local_records[config]
        assert rec.workload_key == twin.workload_key  # the workers' device is the one in the key
        assert rec.error_kind == twin.error_kind and rec.ok
        assert rec.metrics["rel_error"] == pytest.approx(twin.metrics["rel_error"], rel=1e-6, abs=1e-12)
    assert "rpc: 2 of 2 tvm_ext workers" in remote.stderr


def test_a_kernel_past_the_run_timeout_and_a_crashing_kernel_are_records_and_the_workers_go_on(cluster, opencl):
    template, (ok_build, other_build) = gemm_builds(opencl, 2)
    art = ok_build.artifact
    params = ", ".join(f"__global float* {a}" for a in art.launches[0].args)
    spin = f"__kernel void {art.launches[0].name}({params}) {{ for (;;) {{ C[0] += 1.0f; }} }}"
    hang = replace(ok_build, artifact=replace(art, source=spin))
    broken = BrokenGemm(24, 16, 20)
    trap = build_one(broken, broken.default_config(opencl).replace(mode="trap"), opencl)
    assert hang.artifact.source_hash != art.source_hash and trap.ok
    with RpcRunner(cluster.tracker, cluster.key, "opencl", FAST, timeout=3.0, log=quiet,
                   secret=cluster.secret.encode()).start() as runner:
        first = [f.result(timeout=300) for f in runner.submit(template, [hang, trap])]
        then = [f.result(timeout=300) for f in runner.submit(template, [ok_build, other_build])]
    assert first[0].error_kind == ErrorKind.RUN_TIMEOUT, first[0]
    assert first[1].error_kind in (ErrorKind.CRASH, ErrorKind.RUN_ERROR), first[1]
    assert all(r.ok for r in then), then  # the same workers measure on
    assert {r.metrics["server"] for r in first} <= {f"127.0.0.1:{p}" for p in ports_of(cluster)}


def test_each_workers_measuring_process_is_its_own_and_ready_before_a_driver_connects(make_cluster):
    """A worker's measuring process (a spawned child of the worker's own process, not of a
    session's) starts with the worker: a driver's first job does not wait for a fresh
    interpreter and the device, and a driver that connects starts no other."""
    import psutil

    cluster = make_cluster((0, 0))

    def measuring_processes() -> list:
        found = []
        for proc in cluster.processes[1:]:  # the workers (the tracker first)
            try:
                tree = psutil.Process(proc.popen.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            found += [(p.pid, p.ppid() == proc.popen.pid) for p in tree
                      if "multiprocessing.spawn" in " ".join(p.cmdline())]
        return found

    deadline = time.monotonic() + 60
    while len(measuring_processes()) < 2:  # one per worker, no driver yet
        assert time.monotonic() < deadline, "the workers' measuring processes did not start with the workers"
        time.sleep(0.2)
    before = measuring_processes()
    assert all(own for _, own in before), before
    with RpcRunner(cluster.tracker, cluster.key, "opencl", FAST, log=quiet, secret=cluster.secret.encode()).start():
        time.sleep(1.0)
        assert measuring_processes() == before


def wait_registered(tracker, key: str, server: subprocess.Popen, count: int = 1) -> None:
    from tvm_ext.remote.rpc_runner import TrackerClient

    deadline = time.monotonic() + 180
    client = TrackerClient(tracker)
    try:
        while len(client.servers(key)) < count:
            assert time.monotonic() < deadline and server.poll() is None, "the server did not register"
            time.sleep(0.2)
    finally:
        client.close()


def ports_of(cluster: LocalCluster) -> list[int]:
    from tvm_ext.remote.rpc_runner import TrackerClient

    client = TrackerClient(cluster.tracker)
    try:
        return [port for _, port in client.servers(cluster.key)]
    finally:
        client.close()


def test_a_worker_killed_while_it_measures_gives_its_job_to_another(make_cluster, opencl):
    """Worker A alone takes the first job; B joins; A is killed mid-job: the job is measured
    on B, once, and nothing else is lost."""
    cluster = make_cluster([0])
    a = cluster.processes[-1]
    template, builds = gemm_builds(opencl, 3, seed=2)
    builds = [slowed(b) for b in builds]
    said = []
    with RpcRunner(cluster.tracker, cluster.key, "opencl", SLOW, parallel=2, log=said.append,
                   secret=cluster.secret.encode()).start() as runner:
        (a_address,) = [f"127.0.0.1:{p}" for p in ports_of(cluster)]
        futures = runner.submit(template, builds)
        b = cluster.start_worker(0)
        time.sleep(1.5)  # A's measuring process (started at the hello) times for over 3 s: mid-job
        os.killpg(a.popen.pid, signal.SIGKILL)
        results = [f.result(timeout=300) for f in futures]
    assert all(r.ok for r in results), results
    servers = [r.metrics["server"] for r in results]
    assert a_address not in servers and len(set(servers)) == 1, servers
    assert any("lost during a measurement" in m for m in said), said
    assert worker_jobs(a) == 0 and worker_jobs(b) == 3  # measured once each, all on B


def test_a_tuning_run_survives_a_killed_worker_with_nothing_lost_or_measured_twice(make_cluster, tmp_path):
    cluster = make_cluster([0, 0])
    records = tmp_path / "r.jsonl"
    run = subprocess.Popen(CLI + SHAPE + ["--strategy", "random", "--generations", "3", "--population", "6",
                                          "--seed", "5", "--records", str(records)] + tracker_args(cluster),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while len(records_of(records)) < 4 and run.poll() is None:
            time.sleep(0.1)
        os.killpg(cluster.processes[1].popen.pid, signal.SIGKILL)  # worker 0 (processes[0] is the tracker)
        before = len(records_of(records))
        out, err = run.communicate(timeout=600)
    finally:
        run.kill()
    assert run.returncode == 0, err
    recs = records_of(records)
    configs = Counter(json.dumps(r.config, sort_keys=True) for r in recs)
    assert max(configs.values()) == 1  # nothing measured twice
    trials = int(next(l for l in out.splitlines() if l.startswith("trials this run:")).split(":")[1].split()[0])
    assert trials == len(recs) > before and all(r.ok for r in recs)  # nothing lost, no error record


# ---- the tracker -------------------------------------------------------------------------------------
def test_an_unreachable_tracker_is_one_error_line_and_exit_2_at_once(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    for argv in (CLI + SHAPE + ["--tracker", address, "--key", "k", "--records", str(tmp_path / "r.jsonl")],
                 [sys.executable, "-m", "tvm_ext.worker", "--tracker", address, "--key", "k"]):
        start = time.monotonic()
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert time.monotonic() - start < 30  # no waiting for a tracker to appear
        err = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(err) == 1, p.stderr
        assert err[0].startswith(f"error: cannot reach the RPC tracker {address}")


def test_the_tracker_lost_mid_run_stops_with_a_clear_message_and_keeps_the_records(make_cluster, tmp_path):
    cluster = make_cluster([0])
    records = tmp_path / "r.jsonl"
    run = subprocess.Popen(CLI + SHAPE + ["--strategy", "random", "--generations", "6", "--population", "4",
                                          "--seed", "7", "--records", str(records)] + tracker_args(cluster),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while len(records_of(records)) < 3 and run.poll() is None:
            time.sleep(0.1)
        os.killpg(cluster.processes[0].popen.pid, signal.SIGKILL)  # the tracker
        _, err = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: lost the RPC tracker {cluster.tracker_text}") and "rerun" in last, err
    recs = records_of(records)
    assert 3 <= len(recs) < 25 and all(r.ok for r in recs)
    assert max(Counter(json.dumps(r.config, sort_keys=True) for r in recs).values()) == 1


# ---- --devices: a local tracker and workers, gone at the end --------------------------------------------
def devices_run(tmp_path, generations: str, devices: str = "0,0"):
    return subprocess.Popen(CLI + SHAPE + ["--strategy", "random", "--generations", generations, "--population",
                                           "4", "--seed", "2", "--devices", devices, "--records",
                                           str(tmp_path / "r.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)


def children_once_measuring(run, records) -> list[psutil.Process]:
    while len(records_of(records)) < 2 and run.poll() is None:
        time.sleep(0.1)
    return psutil.Process(run.pid).children(recursive=True)


def test_a_devices_run_stops_its_tracker_and_workers_when_it_ends(tmp_path):
    run = devices_run(tmp_path, "2")
    try:
        children = children_once_measuring(run, tmp_path / "r.jsonl")
        out, err = run.communicate(timeout=600)
    finally:
        run.kill()
    assert run.returncode == 0, err
    assert "one opencl worker per device (0, 0" in err
    servers = {r.metrics["server"] for r in records_of(tmp_path / "r.jsonl")}
    assert len(servers) == 2
    time.sleep(0.5)
    assert not alive(children)


def test_ctrl_c_ends_every_process_of_a_devices_run(tmp_path):
    run = devices_run(tmp_path, "20", devices="0")  # a tracker, a worker and its measuring process
    try:
        children = children_once_measuring(run, tmp_path / "r.jsonl")
        names = " ".join(" ".join(c.cmdline()) for c in children)
        assert "tvm_ext.remote.cluster tracker" in names and names.count("tvm_ext.worker") == 1
        start = time.monotonic()
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 130 and time.monotonic() - start < 60, err
    assert "interrupted: records so far are kept" in err
    time.sleep(0.5)
    assert not alive(children)
    recs = records_of(tmp_path / "r.jsonl")
    assert len(recs) >= 2 and max(Counter(json.dumps(r.config, sort_keys=True) for r in recs).values()) == 1


def test_a_driver_killed_outright_takes_its_tracker_and_workers_with_it(tmp_path):
    """SIGKILL leaves the driver no chance to stop them: each ends itself (the kernel tells it)."""
    run = devices_run(tmp_path, "20", devices="0")
    try:
        children = children_once_measuring(run, tmp_path / "r.jsonl")
        cluster = [c for c in children if "tvm_ext.remote.cluster" in " ".join(c.cmdline())
                   or "tvm_ext.worker" in " ".join(c.cmdline())]
        assert len(cluster) == 2
        run.kill()
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    deadline = time.monotonic() + 30
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(children), [" ".join(c.cmdline()) for c in children if c.pid in alive(children)]
    logs = err.split("logs: ")[1].split(")")[0]
    assert logs.startswith(os.path.join(tempfile.gettempdir(), "tvm_ext_cluster_"))
    while os.path.exists(logs) and time.monotonic() < deadline:  # the tracker removes them as it ends
        time.sleep(0.2)
    assert not os.path.exists(logs), os.listdir(logs)


SIGNAL_HANDLERS_AFTER_OPENCL = """
import ctypes, signal
from tvm_ext.target import resolve_target
libc = ctypes.CDLL(None)
class Action(ctypes.Structure):
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]
def c_handler(signum):
    action = Action()
    libc.sigaction(signum, None, ctypes.byref(action))
    return action.handler
signal.signal(signal.SIGTERM, lambda *_: None)  # as a worker or the tracker does
before = {s: c_handler(s) for s in (signal.SIGINT, signal.SIGTERM)}
resolve_target("opencl")  # loads the OpenCL platforms (PoCL)
print(all(c_handler(s) == h for s, h in before.items()))
"""


def test_loading_opencl_leaves_the_processs_own_signal_handlers_in_place():
    """PoCL installs SIGINT and SIGTERM handlers as it loads; its SIGTERM one could end a
    worker without running the worker's, which left the worker's TVM server behind."""
    out = subprocess.run([sys.executable, "-c", SIGNAL_HANDLERS_AFTER_OPENCL], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "True", out.stdout + out.stderr


# ---- what a run refuses ---------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--runner", "rpc"], "--runner rpc needs --tracker HOST:PORT and --key KEY"),
    (["--tracker", "127.0.0.1:9190"], "--tracker needs --key KEY"),
    (["--key", "k"], "--key names servers at a tracker"),
    (["--tracker", "9190", "--key", "k"], "--tracker '9190' is not HOST:PORT"),
    (["--devices", "0", "--parallel", "0"], "--parallel must be >= 1"),
    (["--devices", "0,x"], "--devices '0,x' is not a comma-separated list of integers"),
    (["--devices", "0", "--tracker", "127.0.0.1:9190", "--key", "k"], "give either --devices or --tracker"),
    (["--runner", "local", "--tracker", "127.0.0.1:9190", "--key", "k"], "--tracker measures through --runner rpc"),
])
def test_bad_rpc_options_are_one_error_line(args, message, tmp_path):
    p = tune(args, tmp_path / "r.jsonl", timeout=120)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0], p.stderr


def test_the_servers_device_must_be_the_target(cluster, tmp_path):
    p = tune(["--target", "cuda"] + tracker_args(cluster), tmp_path / "r.jsonl", timeout=120)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1, p.stderr
    assert "measure on opencl" in err[0] and "pass --target opencl" in err[0]
    assert same_device(offline_cuda(), replace(offline_cuda(), device_id=3))
    assert not same_device(offline_cuda(), offline_cuda("sm_80"))


@pytest.fixture
def stock_server(cluster):
    """A stock TVM server (no tvm_ext functions) at the cluster's tracker, under ``key``."""
    servers = []

    def start(key: str, registered: int = 1) -> None:
        servers.append(subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", cluster.tracker_text, "--key", key,
             "--host", "127.0.0.1", "--port", str(free_port()), "--port-end", "65535", "--silent", "--no-fork"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        wait_registered(cluster.tracker, key, servers[-1], registered)

    yield start
    for server in servers:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert_groups_end({s.pid for s in servers})


def test_a_stock_server_is_told_apart_and_refused_where_it_cannot_measure(cluster, stock_server, tmp_path):
    stock_server("stock")
    base = ["--tracker", cluster.tracker_text, "--key", "stock"]
    opencl_run = tune(base, tmp_path / "r.jsonl", timeout=120)
    cuda_run = tune(base + ["--target", "cuda"], tmp_path / "r.jsonl", timeout=120)
    for run, message in ((opencl_run, "is a stock TVM server (no tvm_ext there, no OpenCL device)"),
                         (cuda_run, "has no CUDA GPU")):
        # progress notes ("rpc: every server ... is busy; waiting", when the machine is loaded) aside
        err = [line for line in run.stderr.strip().splitlines() if not line.startswith("rpc: ")]
        assert run.returncode == 2 and len(err) == 1 and err[0].startswith("error:") and message in err[0], run.stderr


def test_two_kinds_of_server_under_one_key_are_refused(cluster, stock_server, tmp_path):
    stock_server(cluster.key, registered=3)  # beside the two tvm_ext workers
    p = tune(tracker_args(cluster), tmp_path / "r.jsonl", timeout=180)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1, p.stderr
    assert "give each kind of server its own key" in err[0] or "is a stock TVM server" in err[0], err


def test_runner_protocol_errors_are_tvm_ext_errors():
    with pytest.raises(TvmExtError, match="cannot reach the RPC tracker"):
        RpcRunner(("127.0.0.1", free_port()), "k", "opencl", FAST).start()


# ---- the GPU machine: a stock TVM server and tvm_ext workers on CUDA ------------------------------------
@pytest.mark.gpu
def test_cuda_on_a_stock_server_and_on_workers(tmp_path):
    """A stock TVM server measures a CUDA GEMM (upload, load_module, time_evaluator, the check
    here) as correctly as a tvm_ext worker on the same GPU."""
    tracker = LocalCluster([0], "cuda", log=quiet).start()
    stock = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", tracker.tracker_text,
                              "--key", "stock", "--host", "127.0.0.1", "--port", str(free_port()),
                              "--port-end", "65535", "--silent", "--no-fork"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        search = ["gemm", "--shape", "512,512,512", "--target", "cuda", "--strategy", "random", "--generations",
                  "1", "--population", "6", "--seed", "1", "--no-progress"]
        wait_registered(tracker.tracker, "stock", stock)
        results = {}
        for key in ("stock", tracker.key):
            path = tmp_path / f"{key}.jsonl"
            secret = [] if key == "stock" else ["--secret-file", tracker.secret_file()]
            p = subprocess.run(CLI + search + ["--tracker", tracker.tracker_text, "--key", key, "--records",
                                               str(path)] + secret, capture_output=True, text=True, timeout=900)
            assert p.returncode == 0, p.stderr
            results[key] = {json.dumps(r.config, sort_keys=True): r for r in records_of(path)}
        assert results["stock"].keys() == results[tracker.key].keys()
        for config, rec in results["stock"].items():
            assert rec.ok == results[tracker.key][config].ok, (rec, results[tracker.key][config])
            if rec.ok:
                assert rec.metrics["rel_error"] < 1e-4
    finally:
        os.killpg(stock.pid, signal.SIGKILL)
        tracker.stop()


# ---- trust: nothing received is unpickled, the shared secret, the version ------------------------------
EVIL = os.path.join(os.path.dirname(__file__), "evil_worker.py")


def no_secret_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != SECRET_ENV}


@pytest.fixture(scope="module")
def servers(cluster):
    """Processes started beside the cluster (each in a group of its own), ended after the module."""
    started: dict[str, subprocess.Popen] = {}

    def start(name: str, argv: list[str], key: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        if name not in started:
            log = open(os.path.join(cluster.log_dir, f"{name}.log"), "wb")
            started[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                             env=env or no_secret_env())
            wait_registered(cluster.tracker, key, started[name])
        return started[name]

    yield start
    for process in started.values():
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert_groups_end({p.pid for p in started.values()})


def plain_worker(cluster, servers) -> str:
    """A tvm_ext worker without a secret (loopback) under the key "plain"."""
    servers("plain", [sys.executable, "-m", "tvm_ext.worker", "--tracker", cluster.tracker_text, "--key", "plain",
                      "--host", "127.0.0.1", "--port", str(free_port())], "plain")
    return "plain"


@pytest.mark.parametrize("mode", ["hello", "measure"])
def test_an_evil_server_under_the_key_runs_nothing_in_the_tuner(mode, cluster, servers, tmp_path):
    """A fake worker answers the hello (or, after a good hello, each measurement) with a pickle
    whose unpickling would create a file: the reply is rejected, the server dropped, no file."""
    marker = tmp_path / "pwned"
    key = f"evil-{mode}"
    servers(key, [sys.executable, EVIL, cluster.tracker_text, key, str(free_port()), str(marker), mode], key)
    p = tune(["--tracker", cluster.tracker_text, "--key", key], tmp_path / "r.jsonl", timeout=300,
             env=no_secret_env())
    assert not marker.exists()
    assert p.returncode == 2, p.stderr
    assert "worker reply rejected: not a tvm_ext message" in p.stderr and "is dropped" in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: worker reply rejected") and "no other server is left" in last, p.stderr
    assert "--no-fork" not in p.stderr


def evil_client(cluster, key: str, secret: bytes | None, payload: bytes) -> list[str]:
    """A client given a worker by the tracker sends ``payload`` to its hello and measure
    functions: what the worker answers to each (its refusals, read as data)."""
    from tvm import rpc

    from tvm_ext.remote.messages import HELLO_REPLY, MEASURE_REPLY
    from tvm_ext.remote.wire import decode

    session = rpc.connect_tracker(*cluster.tracker).request(key, session_timeout=60)
    answers = []
    for name, kind in (("tvm_ext.worker.measure", MEASURE_REPLY), ("tvm_ext.worker.hello", HELLO_REPLY),
                       ("tvm_ext.worker.measure", MEASURE_REPLY)):
        reply = bytes(session.get_function(name)(bytearray(payload)))
        answers.append(decode(kind, reply, secret).get("rejected", ""))
    del session
    return answers


def test_an_evil_client_runs_nothing_in_a_worker(cluster, servers, opencl, tmp_path):
    """A pickle sent to a real worker's measure and hello functions (one with the cluster's
    secret, one without a secret) is refused unread: no file appears, the refusal is the reply,
    and the worker measures on."""
    import pickle

    from test_wire import MakesAFile

    template, builds = gemm_builds(opencl, 2)
    for signed in (True, False):
        marker = tmp_path / f"pwned-{signed}"
        payload = pickle.dumps(MakesAFile(str(marker)))
        key = cluster.key if signed else plain_worker(cluster, servers)
        secret = cluster.secret.encode() if signed else None
        answers = evil_client(cluster, key, secret, payload)
        assert not marker.exists()
        assert all(a.startswith("not a tvm_ext message") for a in answers), (signed, answers)
        with RpcRunner(cluster.tracker, key, "opencl", FAST, log=quiet, secret=secret).start() as runner:
            results = [f.result(timeout=300) for f in runner.submit(template, builds)]
        assert all(r.ok for r in results), (signed, results)


def test_a_wrong_or_missing_secret_is_rejected_both_ways(cluster, servers, tmp_path):
    wrong = tmp_path / "wrong"
    wrong.write_text("not the cluster's secret")
    plain = plain_worker(cluster, servers)
    cases = [([], cluster.key, "signed but this side has no shared secret"),  # the workers sign, the tuner cannot
             (["--secret-file", str(wrong)], cluster.key, "bad signature"),
             (["--secret-file", secret_file(cluster)], plain, "the message is not signed")]
    for args, key, message in cases:
        p = tune(["--tracker", cluster.tracker_text, "--key", key] + args, tmp_path / "r.jsonl", timeout=300,
                 env=no_secret_env())
        last = p.stderr.strip().splitlines()[-1]
        assert p.returncode == 2 and last.startswith("error: worker reply rejected") and message in last, p.stderr
        assert "--no-fork" not in p.stderr
    refused = " ".join(line for p in cluster.processes if p.name.startswith("worker")
                       for line in open(p.log_path, encoding="utf-8") if "refused a hello" in line)
    assert "refused a hello: the message is not signed" in refused and "refused a hello: bad signature" in refused


def test_a_worker_beyond_loopback_needs_a_secret_or_insecure(tmp_path):
    tracker = f"127.0.0.1:{free_port()}"
    base = [sys.executable, "-m", "tvm_ext.worker", "--tracker", tracker, "--key", "k", "--host", "0.0.0.0"]
    key = tmp_path / "key"
    key.write_text("a secret")
    for extra, env, message in (([], no_secret_env(), "error: --host 0.0.0.0 listens beyond this host"),
                                (["--insecure"], no_secret_env(), "error: cannot reach the RPC tracker"),
                                (["--secret-file", str(key)], no_secret_env(), "error: cannot reach the RPC tracker"),
                                ([], {**no_secret_env(), SECRET_ENV: "x"}, "error: cannot reach the RPC tracker")):
        p = subprocess.run(base + extra, capture_output=True, text=True, timeout=120, env=env)
        err = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(err) == 1 and err[0].startswith(message), p.stderr


def test_a_worker_of_another_tvm_ext_version_is_one_error_naming_both(cluster, servers):
    from tvm_ext import __version__
    from tvm_ext.remote.messages import PROTOCOL

    code = ("import sys, tvm_ext; tvm_ext.__version__ = '0.0.0-other'; from tvm_ext.remote.worker import main; "
            "sys.exit(main(sys.argv[1:]))")
    servers("other", [sys.executable, "-c", code, "--tracker", cluster.tracker_text, "--key", "other", "--host",
                      "127.0.0.1", "--port", str(free_port())], "other")
    with pytest.raises(TvmExtError) as err:
        RpcRunner(cluster.tracker, "other", "opencl", FAST, log=quiet).start()
    assert (f"runs tvm_ext 0.0.0-other (protocol {PROTOCOL}), this tuner tvm_ext {__version__} (protocol {PROTOCOL})"
            in str(err.value))
