"""Measurement throughput through TVM's RPC tracker: one worker vs two vs four on one host.

Run on a host with two or four GPUs through the device tool (``nvidia-h200-x2``,
``nvidia-h100-x4``), about 5 minutes:
    source .tvm-device/boot.sh && python benchmarks/rpc_scaling.py --out $OUT --devices 0,1,2,3

A local tracker and a ``tvm_ext.worker`` per GPU (pinned through ``CUDA_VISIBLE_DEVICES``)
start (``tvm_ext.remote.cluster.LocalCluster``: a worker that cannot start stops the script with its
log's last lines, never a hang); then the same fp32 GEMM tuning job (2048³, the GA, seed 0, a
fixed trial count) runs on them once per count of jobs in flight (1, 2, 4, ... up to one per
device: ``--devices 0,1,2,3`` runs with 1, 2 and 4), each into its own records file.  Printed
last, per run: configs measured per minute (targets: two workers at least 1.9x one, four 3.6x),
the GPU busy fraction (the seconds the workers spent on jobs, as the RPC runner counts them,
over the wall times the jobs in flight), the build pool's busy fraction (the share of the wall
with a build in progress) and the best config each found, the same in every run or not.
Builds overlap measurement as in any tuning run (``--no-overlap``: each generation built
whole, then measured).  ``--stock`` (default on) then also measures a few configs on a stock
TVM server (``python -m tvm.exec.rpc_server``, no tvm_ext) and checks they are as correct as
on a worker.

Measurement, not building, is the bottleneck here, by construction and by measurement:
- builds stay in this process's build pool with one process per core (32 on the GPU host),
  warmed up before the timed runs (spawning the pool is in neither run's time);
- one fp32 GEMM build takes one to two seconds (NVRTC, then linking the library), so a
  generation of ``--population`` 64 builds in two rounds of the pool, a few seconds; its 64
  measurements take about a second each on a worker (the check's inputs drawn for three
  rotated input sets, the float64 check, then ``--repeat`` 10 timed repeats of at least
  ``--min-repeat-secs`` 0.05 s: steadier costs than the defaults' 5 x 0.02 s), so even two
  workers spend several times the build time measuring;
- the builder is timed (``TimedBuilder``): the table gives each run's build share of the
  wall and its configs per minute of the rest of the wall (measuring and the tuner's own
  work), whose ratio is the runner's scaling alone; the script warns when builds take over
  a quarter of a run.
Raw records, the worker logs and ``summary.json`` go to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Sequence

import numpy as np

from tvm_ext.measure.builder import LocalBuilder
from tvm_ext.remote.cluster import LocalCluster, free_port
from tvm_ext.core.errors import TvmExtError
from tvm_ext.measure.measure import MeasureSettings
from tvm_ext.core.records import RecordStore
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.core.session import Session, SessionOptions


class TimedBuilder:
    """The shared build pool, with the wall time it had a build in progress added up (``secs``):
    the tuner hands each build to the runner as it ends (``submit``)."""

    def __init__(self, builder: LocalBuilder):
        self.builder = builder
        self.workers = builder.workers  # the tuner sends chunks of one round of the pool
        self.secs = 0.0
        self._lock = threading.Lock()
        self._building = 0
        self._since = 0.0

    def _started(self, count: int) -> None:
        with self._lock:
            if self._building == 0:
                self._since = time.perf_counter()
            self._building += count

    def _ended(self, _: Any = None) -> None:
        with self._lock:
            self._building -= 1
            if self._building == 0:
                self.secs += time.perf_counter() - self._since

    def submit(self, template: Any, configs: Sequence[Any], target: Any) -> list[Future]:
        self._started(len(configs))
        futures = self.builder.submit(template, configs, target)
        for future in futures:
            future.add_done_callback(self._ended)
        return futures

    def build(self, template: Any, configs: Sequence[Any], target: Any) -> list:
        return [future.result() for future in self.submit(template, configs, target)]

    def close(self) -> None:  # the pool outlives each session
        pass


def tune_once(label: str, cluster: LocalCluster, parallel: int, builder: TimedBuilder, args: argparse.Namespace
              ) -> dict:
    template = GemmTemplate(*args.shape)
    records = os.path.join(args.out, f"{label}.jsonl")
    if os.path.exists(records):
        os.remove(records)  # each run measures from scratch
    options = SessionOptions(
        target=args.target, strategy="ga", generations=args.generations, population=args.population,
        trials=args.trials, workers=args.workers, seed=args.seed, records=records, run_timeout=120,
        overlap=args.overlap,
        measure=MeasureSettings(repeat=args.repeat, min_repeat_secs=args.min_repeat_secs),
        runner="rpc", runner_options=(("tracker", cluster.tracker_text), ("key", cluster.key),
                                      ("parallel", str(parallel)), ("secret_file", cluster.secret_file())))
    builder.secs = 0.0
    start = time.perf_counter()

    seen: dict[str, Any] = {}

    def progress(rec: Any, tuner: Any) -> None:
        seen["tuner"] = tuner
        if tuner.trials % 16 == 0:
            print(f"  [{label}] {tuner.trials} trials, {time.perf_counter() - start:.1f} s", flush=True)

    with Session(options, builder=builder, log=print) as session:
        target = session.target
        print(f"[{label}] tuning {template.describe()} on {target.kind}:{target.device_name}, "
              f"{parallel} job{'s' * (parallel > 1)} in flight", flush=True)
        result = session.tune(template, on_record=progress)
        busy = session.runner.busy_secs  # type: ignore[attr-defined]
    recs = list(RecordStore(records))
    servers = sorted({r.metrics.get("server", "?") for r in recs})
    job_secs = {what: float(np.median([r.metrics[what] for r in recs if what in r.metrics] or [np.nan]))
                for what in ("round_trip_secs", "worker_secs", "measure_secs")}
    best = result.best
    return {
        "label": label, "parallel": parallel, "trials": result.trials, "errors": result.errors,
        "wall_secs": result.wall_secs, "build_secs": builder.secs,
        "configs_per_min": 60.0 * result.trials / result.wall_secs if result.wall_secs > 0 else 0.0,
        "configs_per_measuring_min": 60.0 * result.trials / max(1e-9, result.wall_secs - builder.secs),
        "gpu_busy": sum(busy.values()) / max(1e-9, result.wall_secs * parallel),
        "busy_secs_by_server": busy,
        "build_busy": builder.secs / max(1e-9, result.wall_secs),
        "best_tflops": template.flops() / best.cost / 1e12 if best else 0.0,
        "best_ms": best.cost * 1e3 if best else float("nan"),
        "best_config": best.config if best else None, "servers": servers,
        "device": target.device_name, "records": records, "median_job_secs": job_secs,
        "built_ahead": getattr(seen.get("tuner"), "built_ahead", 0),
        "first_result_secs": min((r.elapsed for r in recs), default=float("nan")),
    }


def warm_up(builder: TimedBuilder, target_kind: str, args: argparse.Namespace, cluster: LocalCluster) -> None:
    """Spawn the build pool and compile once per process before anything is timed."""

    from tvm_ext.remote.rpc_runner import RpcRunner

    with RpcRunner(cluster.tracker, cluster.key, target_kind, MeasureSettings(), parallel=1, log=print,
                   secret=cluster.secret.encode()) as runner:
        target = runner.start().target  # the workers' device, as the runs will build for it
    template = GemmTemplate(*args.shape)
    space = template.space(target)
    rows = space.random_feasible_indices(np.random.default_rng(12345), builder.builder.workers)
    builder.build(template, [space.decode(r) for r in rows], target)


def stock_check(cluster: LocalCluster, args: argparse.Namespace) -> dict:
    """A few configs of a smaller GEMM on a stock TVM server (GPU 1) and on a worker: the
    same configs, equally correct."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(args.devices[-1])}
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", cluster.tracker_text,
                               "--key", "stock", "--host", "127.0.0.1", "--port", str(port), "--port-end",
                               str(port + 1), "--silent", "--no-fork"], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from tvm_ext.remote.rpc_runner import TrackerClient

        client = TrackerClient(cluster.tracker)
        deadline = time.monotonic() + 120
        while not client.servers("stock"):
            if server.poll() is not None or time.monotonic() > deadline:
                raise TvmExtError("the stock TVM server did not register")
            time.sleep(0.25)
        client.close()
        out = {}
        for key in ("stock", cluster.key):
            records = os.path.join(args.out, f"stock_check_{'stock' if key == 'stock' else 'worker'}.jsonl")
            if os.path.exists(records):
                os.remove(records)
            options = SessionOptions(target=args.target, strategy="random", generations=1, population=6, seed=1,
                                     records=records, workers=args.workers, runner="rpc", runner_options=(
                                         ("tracker", cluster.tracker_text), ("key", key), ("parallel", "1")))
            with Session(options, log=print) as session:
                session.tune(GemmTemplate(512, 512, 512))
            out[key] = {json.dumps(r.config, sort_keys=True): r for r in RecordStore(records)}
        stock, worker = out["stock"], out[cluster.key]
        same = stock.keys() == worker.keys() and all(stock[c].ok == worker[c].ok for c in stock)
        errors = [stock[c].metrics.get("rel_error", float("nan")) for c in stock if stock[c].ok]
        return {"configs": len(stock), "ok": sum(r.ok for r in stock.values()), "same_as_worker": same,
                "max_rel_error": max(errors) if errors else None}
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def in_flight_counts(devices: int) -> list[int]:
    """The runs' jobs in flight: 1, 2, 4, ... below ``devices``, then ``devices`` itself."""
    counts = [1]
    while counts[-1] * 2 < devices:
        counts.append(counts[-1] * 2)
    return counts + [devices] if devices > 1 else counts


def table(runs: list[dict], flops_unit: str = "TFLOP/s") -> str:
    one = runs[0]["configs_per_min"] or float("nan")
    lines = ["| run | jobs in flight | trials | wall (s) | configs / min | vs one worker | GPU busy | build pool "
             "busy | configs / min without builds | a job's s: round trip / worker / measuring | best | best config |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        cfg = " ".join(f"{k}={v}" for k, v in (r["best_config"] or {}).items())
        lines.append(f"| {r['label']} | {r['parallel']} | {r['trials']} ({r['errors']} errors) | "
                     f"{r['wall_secs']:.1f} | {r['configs_per_min']:.1f} | {r['configs_per_min'] / one:.2f}x | "
                     f"{r['gpu_busy']:.0%} | {r['build_busy']:.0%} | {r['configs_per_measuring_min']:.1f} | "
                     f"{' / '.join(f'{v:.3f}' for v in r['median_job_secs'].values())} | "
                     f"{r['best_tflops']:.2f} {flops_unit} ({r['best_ms']:.3f} ms) | {cfg} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out")
    p.add_argument("--target", default="cuda")
    p.add_argument("--devices", default="0,1",
                   help="one worker per device (default 0,1); runs with 1, 2, 4, ... and then all of them in flight")
    p.add_argument("--shape", default="2048,2048,2048")
    p.add_argument("--population", type=int, default=64)
    p.add_argument("--generations", type=int, default=3)
    p.add_argument("--trials", type=int, default=128, help="trials of each run (default 128)")
    p.add_argument("--repeat", type=int, default=10, help="timed repeats per config (default 10)")
    p.add_argument("--min-repeat-secs", type=float, default=0.05, help="each repeat lasts at least (default 0.05)")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="build processes (default: every core)")
    p.add_argument("--in-flight", default="",
                   help="jobs in flight of the runs, comma-separated (default 1, 2, 4, ... up to one per device)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                   help="build the next chunk of a generation while the workers measure (default on)")
    p.add_argument("--stock", action=argparse.BooleanOptionalAction, default=True,
                   help="also check a stock TVM server on the last device (CUDA only; default on)")
    p.add_argument("--max-secs", type=float, default=540.0, help="give up (loudly) after this long")
    args = p.parse_args(argv)
    try:
        args.shape = tuple(int(x) for x in args.shape.split(","))
        args.devices = [int(d) for d in args.devices.split(",")]
        args.in_flight = ([int(n) for n in args.in_flight.split(",")] if args.in_flight
                          else in_flight_counts(len(args.devices)))
    except ValueError:
        p.error("--shape and --devices are comma-separated integers")
    if len(args.shape) != 3 or min(args.shape) < 1 or min(args.devices) < 0:
        p.error("--shape is M,N,K (three positive integers); --devices are indices >= 0")
    if not 1 <= min(args.in_flight) <= max(args.in_flight) <= len(args.devices):
        p.error("--in-flight counts lie between 1 and the number of --devices")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    def too_long(signum: int, frame: Any) -> None:
        raise TimeoutError(f"rpc_scaling ran past --max-secs {args.max_secs:g}")

    signal.signal(signal.SIGALRM, too_long)
    signal.alarm(int(args.max_secs))
    cluster = LocalCluster(args.devices, args.target, log=print)
    builder = TimedBuilder(LocalBuilder(workers=args.workers, timeout=300))
    runs: list[dict] = []
    stock: dict | None = None
    try:
        cluster.start()
        warm_up(builder, args.target, args, cluster)
        for parallel in args.in_flight:
            runs.append(tune_once(f"{parallel}_worker{'s' * (parallel > 1)}", cluster, parallel, builder, args))
        if args.stock and args.target == "cuda":
            try:  # the scaling runs are measured: a failing stock server must not lose their table
                stock = stock_check(cluster, args)
            except (TvmExtError, TimeoutError) as exc:
                stock = {"error": str(exc)}
    except (TvmExtError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.alarm(0)
        if cluster.log_dir and os.path.isdir(cluster.log_dir):
            shutil.copytree(cluster.log_dir, os.path.join(args.out, "worker_logs"), dirs_exist_ok=True)
        cluster.stop()
        builder.builder.close()
        with open(os.path.join(args.out, "summary.json"), "w") as fh:
            same = bool(runs) and all(r["best_config"] == runs[0]["best_config"] for r in runs)
            json.dump({"args": {k: v for k, v in vars(args).items()}, "runs": runs, "stock": stock,
                       "same_best_config": same}, fh, indent=1, default=str)
    if not runs:
        return 2
    print()
    if stock is not None and "error" in stock:
        print(f"stock TVM server check failed: {stock['error']}")
    elif stock is not None:
        print(f"stock TVM server (512^3 GEMM, {stock['configs']} configs): {stock['ok']} correct, same outcome as on a "
              f"worker: {stock['same_as_worker']}, max rel. error {stock['max_rel_error']}")
    build_heavy = [r["label"] for r in runs if r["build_secs"] > 0.25 * r["wall_secs"]]
    if build_heavy and not args.overlap:
        print(f"warning: builds took over a quarter of the wall in {', '.join(build_heavy)}: the ratio is not a "
              "measurement-throughput figure")
    one = runs[0]
    targets = {2: 1.9, 4: 3.6}
    for r in runs[1:]:
        target = f" (target >= {targets[r['parallel']]}x)" if r["parallel"] in targets else ""
        print(f"{r['parallel']} workers / one: {r['configs_per_min'] / one['configs_per_min']:.2f}x configs per "
              f"minute{target}, {r['configs_per_measuring_min'] / one['configs_per_measuring_min']:.2f}x without the "
              f"builds; best {r['best_tflops']:.2f} vs {one['best_tflops']:.2f} TFLOP/s")
    same = all(r["best_config"] == one["best_config"] for r in runs)
    print(f"same best config in every run: {'yes' if same else 'NO'}; {one['device']}, "
          f"{'x'.join(map(str, args.shape))} fp32 GEMM, GA seed {args.seed}, {args.trials} trials, population "
          f"{args.population}, {args.repeat} x {args.min_repeat_secs:g} s repeats, {args.workers} build processes, "
          f"builds {'overlapped with' if args.overlap else 'before'} measurement")
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
