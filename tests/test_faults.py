"""Damaged and shared records files, killed writers, and bad command-line input.

Records: every damaged line is skipped with one counting warning (never a
traceback), a new record starts on its own line after a torn one, a writer killed
with SIGKILL mid-write loses no record it finished, and tuners sharing a file
(real processes) measure each config once.  CLI: every bad input gives one
``error:`` line and exit code 2 before any work starts.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import psutil
import pytest

from tvm_ext.core.records import Record, RecordStore

CLI = [sys.executable, "-m", "tvm_ext.tune"]
SMALL = ["gemm", "--shape", "24,16,20", "--generations", "1", "--population", "6", "--seed", "1",
         "--workers", "1", "--no-progress"]


def run(args, timeout=600, **kwargs):
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout, **kwargs)


def record(i: int, workload: dict | None = None, **fields) -> Record:
    return Record("wk", workload or {"template": "t"}, {"i": i}, (1e-3,), **fields)


def readable(path) -> list[Record]:
    return list(RecordStore(path, warn=lambda _m: None))


def skipped(path) -> int:
    store = RecordStore(path, warn=lambda _m: None)
    list(store)
    return store.skipped_lines


def measured_configs(path) -> Counter:
    return Counter((r.workload_key, json.dumps(r.config, sort_keys=True)) for r in readable(path))


def trials_of(stdout: str) -> int:
    line = next(l for l in stdout.splitlines() if l.startswith("trials this run:"))
    return int(line.split(":")[1].split()[0])


# ---- damaged lines ------------------------------------------------------------------------------

BAD_LINES = {
    "null": b"null",
    "list": b"[1,2]",
    "number": b"42",
    "string": b'"x"',
    "invalid utf-8": record(6).to_json().encode().replace(b'"error_msg":""', b'"error_msg":"\xff"'),
    "costs of the wrong type": json.dumps({**json.loads(record(7).to_json()), "costs": ["fast"]}).encode(),
    "config value a list": json.dumps({**json.loads(record(8).to_json()), "config": {"i": [1]}}).encode(),
    "workload_key a number": json.dumps({**json.loads(record(9).to_json()), "workload_key": 3}).encode(),
    "missing fields": b'{"workload_key":"wk"}',
}


@pytest.mark.parametrize("name", list(BAD_LINES))
def test_damaged_line_is_skipped_with_one_counting_warning(tmp_path, name):
    path = tmp_path / "r.jsonl"
    path.write_bytes(record(1).to_json().encode() + b"\n" + BAD_LINES[name] + b"\n"
                     + record(2).to_json().encode() + b"\n")
    warnings: list[str] = []
    store = RecordStore(path, warn=warnings.append)
    assert [r.config["i"] for r in store] == [1, 2]
    assert [r.config["i"] for r in store.feed().new()] == [1, 2]
    assert store.best("wk") is not None
    assert len(warnings) == 1 and "skipped 1 unreadable line " in warnings[0], warnings  # once, however often read


def test_torn_last_line_never_swallows_the_next_record(tmp_path):
    path = tmp_path / "r.jsonl"
    whole = record(1).to_json().encode() + b"\n"
    path.write_bytes(whole + record(2).to_json().encode()[:40])  # a writer killed mid-line
    store = RecordStore(path, warn=lambda _m: None)
    store.append(record(3))
    lines = path.read_bytes().split(b"\n")
    assert lines[1] == record(2).to_json().encode()[:40]  # the fragment keeps its own line
    assert [r.config["i"] for r in readable(path)] == [1, 3]
    assert skipped(path) == 1


@pytest.fixture(scope="module")
def small_records(tmp_path_factory) -> bytes:
    """The records file of one ``SMALL`` run: each test damages a copy of its own."""
    path = tmp_path_factory.mktemp("small") / "r.jsonl"
    first = run(SMALL + ["--records", str(path)])
    assert first.returncode == 0, first.stderr
    return path.read_bytes()


def test_tuner_runs_through_damaged_records(tmp_path, small_records):
    """The CLI resumes from a file with every kind of damaged line: nothing re-measured,
    one warning line that counts them, no traceback."""
    path = tmp_path / "r.jsonl"
    lines = small_records.splitlines()
    damaged = lines[:2] + list(BAD_LINES.values()) + lines[2:]
    path.write_bytes(b"\n".join(damaged) + b"\n")
    again = run(SMALL + ["--records", str(path)])
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr
    assert trials_of(again.stdout) == 0
    warnings = [l for l in again.stderr.splitlines() if l.startswith("warning:")]
    assert len(warnings) == 1 and f"skipped {len(BAD_LINES)} unreadable lines" in warnings[0], again.stderr


def test_torn_record_is_measured_again_once(tmp_path, small_records):
    """A kill mid-write loses the record being written: the next run measures that config
    again (its record on its own line) and the run after measures nothing."""
    path = tmp_path / "r.jsonl"
    data = small_records
    before = data.count(b"\n")
    path.write_bytes(data[: data.rstrip(b"\n").rfind(b"\n") + 1 + 60])  # tear the last record
    second = run(SMALL + ["--records", str(path)])
    assert second.returncode == 0, second.stderr
    assert trials_of(second.stdout) == 1
    assert len(readable(path)) == before
    assert max(measured_configs(path).values()) == 1
    third = run(SMALL + ["--records", str(path)])
    assert third.returncode == 0 and trials_of(third.stdout) == 0


# ---- killed writers -----------------------------------------------------------------------------

WRITER = """
import sys
from tvm_ext.core.records import Record, RecordStore
store = RecordStore(sys.argv[1])
for i in range(10**6):
    store.append(Record("wk", {"template": "t"}, {"i": i}, (1e-3,), trace="x" * (8 << 20)))
    print(i, flush=True)
"""


def test_kill_9_mid_write_loses_no_finished_record(tmp_path):
    """SIGKILL while a record is half written (the file visibly ends mid-line): every
    record whose append returned is readable, the fragment is skipped, and the next
    record starts on its own line."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    path = tmp_path / "r.jsonl"
    for _attempt in range(5):
        path.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True)
        finished: list[int] = []
        def read(proc=proc, finished=finished) -> None:
            finished.extend(int(line) for line in proc.stdout)

        reader = threading.Thread(target=read)
        reader.start()
        deadline, torn = time.time() + 120, False
        while time.time() < deadline and proc.poll() is None:
            if len(finished) >= 2 and path.stat().st_size:
                with open(path, "rb") as fh:
                    fh.seek(-1, os.SEEK_END)
                    if fh.read(1) != b"\n":
                        proc.send_signal(signal.SIGKILL)
                        torn = True
                        break
        proc.wait(timeout=60)
        reader.join(timeout=60)
        if torn and not path.read_bytes().endswith(b"\n"):
            break
    else:
        pytest.fail("never caught the writer mid-write")
    assert proc.returncode == -signal.SIGKILL
    got = [r.config["i"] for r in readable(path)]
    assert got[: len(finished)] == finished  # nothing the writer finished is lost
    store = RecordStore(path, warn=lambda _m: None)
    store.append(record(10**6))
    after = readable(path)
    assert [r.config["i"] for r in after] == got + [10**6]
    assert skipped(path) == 1  # the fragment, alone on its line


def test_kill_9_tuner_resumes_without_measuring_twice(tmp_path):
    path = tmp_path / "r.jsonl"
    args = ["gemm", "--shape", "24,16,20", "--generations", "2", "--population", "6", "--seed", "2",
            "--workers", "1", "--no-progress", "--records", str(path)]
    proc = subprocess.Popen(CLI + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= 3:
            break
        time.sleep(0.05)
    pools = psutil.Process(proc.pid).children(recursive=True)  # its build and measuring processes
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    _, left = psutil.wait_procs(pools, timeout=10)  # each ends itself once its driver is gone
    assert not left, [" ".join(p.cmdline()) for p in left if p.is_running()]
    kept = len(readable(path))
    assert kept >= 3
    rerun = run(args)  # the dead tuner's claims must not hold it up
    assert rerun.returncode == 0, rerun.stderr
    assert f"resumed: {kept}," in rerun.stdout  # no record of the killed run lost
    counts = measured_configs(path)
    assert max(counts.values()) == 1  # nothing measured twice
    assert sum(counts.values()) == kept + trials_of(rerun.stdout)
    assert not os.path.exists(f"{path}.claims")


SLOW_MEASURING = """
import sys
from dataclasses import replace
from tvm_ext.measure.builder import build_one
from tvm_ext.measure.measure import MeasureSettings, make_job
from tvm_ext.measure.runner import IsolatedMeasurer
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.target import resolve_target
if __name__ == "__main__":
    target, template = resolve_target("opencl"), GemmTemplate(24, 16, 20)
    build = build_one(template, template.default_config(target), target)
    source = build.artifact.source  # each run spins first (a condition the inputs never meet)
    head = source.index(") {\\n") + len(") {\\n")
    spin = "for (int s = 0; s < 5000000; ++s) { if (A_ptr[0] > 2.0f + s) { C_ptr[0] = 0.0f; } }\\n"
    artifact = replace(build.artifact, source=source[:head] + spin + source[head:])
    slow = MeasureSettings(warmup=1, repeat=10)  # runs of 0.4 s: about 9 s in all
    print("measuring", flush=True)
    print(IsolatedMeasurer(timeout=300).run(make_job(template, build.config, artifact, target, slow)), flush=True)
"""


def _measuring_processes(pid: int, within: float) -> list:
    """The process's descendants once a spawned pool process is among them (polled: on a
    busy 2-core machine the pool can take seconds to start), or all of them at ``within``."""
    deadline = time.monotonic() + within
    while True:
        pools = psutil.Process(pid).children(recursive=True)
        if any("multiprocessing.spawn" in " ".join(p.cmdline()) for p in pools) or time.monotonic() > deadline:
            time.sleep(1.0)  # well inside the measurement, past the pool's start
            return psutil.Process(pid).children(recursive=True)
        time.sleep(0.2)


def test_a_driver_killed_mid_measurement_leaves_no_process_behind(tmp_path):
    """SIGKILL gives the driver no chance to stop its pools: a measuring process in the
    middle of a long measurement ends itself within seconds, not when its work is done."""
    script = tmp_path / "slow.py"
    script.write_text(SLOW_MEASURING)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        first = proc.stdout.readline()
        assert first == "measuring\n", first + proc.stdout.read()
        pools = _measuring_processes(proc.pid, within=30.0)  # then inside its 9 s of work
        assert any("multiprocessing.spawn" in " ".join(p.cmdline()) for p in pools)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)  # not communicate(): the measuring process holds the same pipe
        proc.stdout.close()
    _, left = psutil.wait_procs(pools, timeout=3)
    assert not left, [" ".join(p.cmdline()) for p in left if p.is_running()]


# ---- shared files -------------------------------------------------------------------------------

SHARER = """
import sys, time
from tvm_ext.core.records import Record, RecordStore
from tvm_ext.core.space import Config
path, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = RecordStore(path)
feed = store.feed()
known = {}
def catch_up():
    for rec in feed.new():
        known[rec.config_obj()] = rec
    return known
catch_up()
configs = [Config.of({"i": i}) for i in range(n)]
if name == "b":  # starts where "a" does (as tuners do from the same seeds), then goes the other way
    configs = configs[:12] + configs[::-1]
measured = 0
for start in range(0, n, 6):  # the tuner's loop: a batch, minus what is known, claimed, measured
    batch = [c for c in configs[start:start + 6] if c not in known]
    for mine in store.claim_batches("wk", batch, catch_up):
        for c in mine:
            time.sleep(0.02)  # the measurement
            rec = Record("wk", {}, c.as_dict(), (1e-3,), strategy=name)
            store.append(rec)
            known[c] = rec
            measured += 1
assert all(c in known for c in configs)
print(measured)
"""


def test_two_writers_sharing_a_file_measure_each_config_once(tmp_path):
    script = tmp_path / "sharer.py"
    script.write_text(SHARER)
    path = tmp_path / "r.jsonl"
    n = 60
    procs = [subprocess.Popen([sys.executable, str(script), str(path), name, str(n)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    measured = [int(o[0]) for o in outs]
    counts = measured_configs(path)
    assert len(counts) == n and max(counts.values()) == 1  # every config, once
    assert sum(measured) == n  # no record lost
    assert min(measured) > 0  # both did share the work
    assert not os.path.exists(f"{path}.claims")


def test_two_tuners_sharing_a_file_measure_each_config_once(tmp_path):
    """Two real tuning processes, same seed (so they propose the same configs), one file."""
    path = tmp_path / "r.jsonl"
    args = SMALL + ["--records", str(path)]
    procs = [subprocess.Popen(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    counts = measured_configs(path)
    assert max(counts.values()) == 1
    assert sum(trials_of(o[0]) for o in outs) == sum(counts.values()) == len(path.read_bytes().splitlines())


# ---- bad command-line input ---------------------------------------------------------------------

def _assert_one_error_line(p, message):
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("args, message", [
    (["--population", "1"], "--population must be >= 2"),
    (["--workers", "-2"], "--workers must be >= 1"),
    (["--build-timeout", "0"], "--build-timeout must be a positive"),
    (["--run-timeout", "-1"], "--run-timeout must be a positive"),
    (["--no-measure"], "--no-measure needs --strategy analytic"),
    (["--seed", "-1"], "--seed must be >= 0"),
])
def test_bad_tuning_option(tmp_path, args, message):
    records = tmp_path / "r.jsonl"
    p = run(["gemm", "--shape", "8,8,8", "--records", str(records)] + args)
    _assert_one_error_line(p, message)
    assert not records.exists()  # refused before anything started


def test_gemm_shape_beyond_int32_indexing_is_refused_up_front(tmp_path):
    start = time.time()
    p = run(["gemm", "--shape", "100000,100000,100000", "--records", str(tmp_path / "r.jsonl")])
    _assert_one_error_line(p, "int32")
    assert time.time() - start < 60 and not (tmp_path / "r.jsonl").exists()


def test_population_4_uses_a_fitting_tournament(tmp_path):
    p = run(["gemm", "--shape", "16,16,16", "--population", "4", "--generations", "1", "--trials", "2",
             "--workers", "1", "--no-progress", "--records", str(tmp_path / "r.jsonl")])
    assert p.returncode == 0, p.stderr
    assert trials_of(p.stdout) == 2


@pytest.mark.parametrize("body, message", [
    ("def get_module():\n    raise ValueError('no weights here')\n", "get_module() raised ValueError: no weights here"),
    ("def get_module():\n    return None\n", "get_module() returned NoneType, expected a Relax IRModule"),
])
def test_model_whose_get_module_fails(tmp_path, body, message):
    model = tmp_path / "model.py"
    model.write_text(body)
    p = run(["model", str(model), "--records", str(tmp_path / "r.jsonl"), "--database", str(tmp_path / "db")])
    _assert_one_error_line(p, message)


def test_mixed_precision_out_under_a_file_is_refused_before_the_search(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    records = tmp_path / "r.jsonl"
    p = run(["mixed-precision", "gemm", "--shape", "16,16,16", "--records", str(records),
             "--out", str(blocker / "program")])
    _assert_one_error_line(p, "is a file, not a folder")
    assert not records.exists()


@pytest.mark.parametrize("args, message", [
    (["--workers", "0"], "--workers must be >= 1"),
    (["--run-timeout", "0"], "--run-timeout must be a positive"),
    (["--seed", "-3"], "--seed must be >= 0"),
])
def test_bad_mixed_precision_option(tmp_path, args, message):
    p = run(["mixed-precision", "gemm", "--shape", "16,16,16", "--records", str(tmp_path / "r.jsonl"),
             "--out", str(tmp_path / "out")] + args)
    _assert_one_error_line(p, message)


@pytest.mark.parametrize("args, message", [
    (["show", "{missing}"], "no records file"),
    (["show", "{records}", "--top", "0"], "--top must be >= 1"),
    (["show", "{records}", "--workload", "conv"], "no workload matches 'conv'"),
    (["export", "{records}", "--workload", "reduce"], "no workload matches 'reduce'"),
    (["report", "{records}", "--out", "{file}/report"], "is a file, not a folder"),
])
def test_bad_results_input(tmp_path, args, message):
    from tvm_ext.schedules.gemm.simt import GemmTemplate
    from tvm_ext.target import TargetInfo

    records = tmp_path / "r.jsonl"
    config = GemmTemplate(8, 8, 8).default_config(TargetInfo(kind="opencl")).as_dict()  # a point of its space
    records.write_text(Record("wk", {"template": "gemm", "params": {"m": 8, "n": 8, "k": 8},
                                     "target": {"kind": "opencl", "device": "x", "arch": ""}},
                              config, (1e-3,)).to_json() + "\n")
    (tmp_path / "f").write_text("")
    fill = {"missing": str(tmp_path / "none.jsonl"), "records": str(records), "file": str(tmp_path / "f")}
    p = run([a.format(**fill) for a in args])
    _assert_one_error_line(p, message)
