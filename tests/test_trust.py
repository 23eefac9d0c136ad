"""Hostile and damaged input to the records, the files and the command line.

Records: a line that makes the parser raise anything (deep nesting), costs that are not
positive seconds and configs outside the template's space are skipped with the reason,
never the best, never fatal.  Files: ``report`` keeps every file inside ``--out`` and
escapes the page; a records path that is not a regular file, or a full disk, is one
``error:`` line.  Claims: a forged ``until`` cannot stall a tuner.  CLI: a model file that
is not Python, shapes beyond memory, devices that do not exist: one ``error:`` line before
anything runs; SIGTERM stops a run as Ctrl-C does, and a second stop keeps the summary.
Generated programs: a manifest names no library outside its folder and no absurd tensor.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tvm_ext.core.errors import TvmExtError
from tvm_ext.core.records import Record, RecordStore
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.core.space import Config
from tvm_ext.target import TargetInfo
from tvm_ext.core.template import Workload

CLI = [sys.executable, "-m", "tvm_ext.tune"]
SMALL = ["gemm", "--shape", "24,16,20", "--workers", "1", "--seed", "1", "--no-progress"]
FAKE = TargetInfo(kind="opencl", device_name="fake/device")


def run(args, timeout=600, **kwargs):
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout, **kwargs)


def one_error_line(p, message: str) -> None:
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], p.stderr
    assert "Traceback" not in p.stderr


def gemm_record(template: GemmTemplate, target: TargetInfo = FAKE, cost: float = 1e-4, key: str | None = None,
                **config) -> dict:
    """A record of ``template`` (its default config changed by ``config``) as the file holds it."""
    workload = Workload.of(template, target)
    values = {**template.default_config(target).as_dict(), **config}
    rec = Record(workload.key, workload.as_json(), dict(sorted(values.items())), (cost, cost), strategy="ga",
                 run="r", elapsed=1.0)
    data = json.loads(rec.to_json())
    if key is not None:
        data["workload_key"] = key
    return data


def write_lines(path: Path, *items) -> Path:
    path.write_bytes(b"".join((i if isinstance(i, bytes) else json.dumps(i).encode()) + b"\n" for i in items))
    return path


# ---- records: every line is data until proven a record --------------------------------------------

def test_any_exception_of_a_line_is_that_lines_problem(tmp_path):
    good = gemm_record(GemmTemplate(24, 16, 20))
    deep = b'{"workload_key":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    nested = json.dumps({**good, "metrics": json.loads('{"a":' * 40 + "1" + "}" * 40)}).encode()
    path = write_lines(tmp_path / "r.jsonl", good, deep, nested, {**good, "costs": [0, 0, 0]},
                       {**good, "costs": [float("nan")]}, {**good, "workload": {**good["workload"], "params": [1]}},
                       b'{"workload_key":"\\ud800","workload":{},"config":{},"costs":[]}')
    warnings: list[str] = []
    store = RecordStore(path, warn=warnings.append)
    assert [r.config == good["config"] for r in store] == [True]
    assert [r.workload_key for r in store.feed().new()] == [good["workload_key"]]
    assert len(warnings) == 1 and "skipped 6 unreadable lines" in warnings[0], warnings
    assert "nested" in warnings[0] and "costs must be" in warnings[0]


def test_show_never_takes_a_config_outside_the_space_as_the_best(tmp_path):
    template = GemmTemplate(24, 16, 20)
    good = gemm_record(template, cost=1e-4)
    forged = [gemm_record(template, cost=1e-9, wg_x=7777), {**gemm_record(template, cost=1e-9), "config": {
        **good["config"], "evil": 1}}, {**gemm_record(template, cost=1e-9), "config": {
            k: v for k, v in good["config"].items() if k != "vec"}}]
    path = write_lines(tmp_path / "r.jsonl", good, *forged)
    p = run(["show", str(path), "--json", "--top", "5"])
    assert p.returncode == 0, p.stderr
    (workload,) = json.loads(p.stdout)
    assert workload["trials"] == 1 and [t["cost_secs"] for t in workload["top"]] == [1e-4]
    (warning,) = [l for l in p.stderr.splitlines() if l.startswith("warning:")]
    assert "skipped 3 unreadable lines" in warning and "wg_x=7777 is not a choice" in warning
    assert "unknown knob 'evil'" in warning and "knob vec missing" in warning


def test_tuner_resumes_past_zero_costs_and_configs_outside_its_space(tmp_path, opencl):
    """Records of the tuner's own workload: zero costs (a ZeroDivisionError in the speedup) and
    a config outside the space at an absurd speed are skipped, the run ends normally."""
    template = GemmTemplate.from_shape((24, 16, 20))
    default = gemm_record(template, opencl, cost=1e-3)
    path = write_lines(tmp_path / "r.jsonl", {**default, "costs": [0.0, 0.0, 0.0]},
                       gemm_record(template, opencl, cost=1e-12, wg_x=7777))
    p = run(SMALL + ["--generations", "1", "--population", "2", "--trials", "3", "--records", str(path)])
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and "7777" not in p.stdout
    (warning,) = [l for l in p.stderr.splitlines() if l.startswith("warning:")]
    assert "skipped 2 unreadable lines" in warning and "wg_x=7777" in warning
    assert "0 records resumed" in p.stderr


def test_export_of_an_absurd_shape_is_one_error_line(tmp_path):
    record = gemm_record(GemmTemplate(24, 16, 20))
    record["workload"]["params"].update(m=10**12, n=10**12)
    path = write_lines(tmp_path / "r.jsonl", record)
    one_error_line(run(["export", str(path), "--out", str(tmp_path / "k")]), "int32 indices")


# ---- files -----------------------------------------------------------------------------------------

HOSTILE_KEYS = ["../../escaped", "../outside/x", "a/b/c", "<img src=x onerror=alert(1)>", "/abs/path",
                "<script>alert(1)</script>"]


def test_report_keeps_files_inside_out_and_escapes_the_page(tmp_path):
    work = tmp_path / "deep" / "work"
    work.mkdir(parents=True)
    template = GemmTemplate(24, 16, 20)
    records = [gemm_record(template, key=k) for k in HOSTILE_KEYS]
    records[0]["strategy"] = "<img src=y onerror=alert(2)>"
    path = write_lines(work / "r.jsonl", *records)
    before = {p for p in tmp_path.rglob("*")}
    out = work / "out"
    p = run(["report", str(path), "--out", str(out)])
    assert p.returncode == 0, p.stderr
    assert {p for p in tmp_path.rglob("*")} - before == {out, *out.iterdir()}
    names = sorted(f.name for f in out.iterdir())
    assert len(names) == 2 * len(HOSTILE_KEYS) + 1 and "index.html" in names
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+\.(png|html)", n) for n in names), names
    page = (out / "index.html").read_text()
    assert "<script" not in page.lower()
    assert all(re.fullmatch(r'<img src="[A-Za-z0-9_-]+\.png" alt="[^"<>]*">', tag)
               for tag in re.findall(r"<img[^>]*>", page))
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


@pytest.mark.parametrize("kind", ["fifo", "folder"])
@pytest.mark.parametrize("command", ["show", "report", "export", "tune"])
def test_a_records_path_that_is_not_a_file_is_one_error_line(tmp_path, kind, command):
    path = tmp_path / "r.jsonl"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    args = {"show": ["show", str(path)], "report": ["report", str(path), "--out", str(tmp_path / "o")],
            "export": ["export", str(path), "--out", str(tmp_path / "o")],
            "tune": ["gemm", "--shape", "8,8,8", "--records", str(path)]}[command]
    p = run(args, timeout=120)  # a FIFO used to block the open forever
    one_error_line(p, f"{path}: the records file is a {'FIFO' if kind == 'fifo' else 'folder'}")


@pytest.fixture
def full_disk(tmp_path):
    """A folder on a 256 KiB tmpfs filled to the last byte (root only)."""
    mount = tmp_path / "small"
    mount.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {exc}")
    try:
        with open(mount / "filler", "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError:
                pass
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_one_error_line_and_leaves_no_temporary_file(full_disk):
    path = full_disk / "r.jsonl"
    p = run(SMALL + ["--generations", "1", "--population", "2", "--records", str(path)])
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    (error,) = [l for l in p.stderr.splitlines() if l.startswith("error:")]  # after the run's header
    assert str(path) in error and error.endswith("No space left on device"), p.stderr
    assert sorted(f.name for f in full_disk.iterdir()) == ["filler", "r.jsonl"]


def test_appending_to_a_full_disk_names_the_file(full_disk):
    path = full_disk / "r.jsonl"
    store = RecordStore(path, warn=lambda _m: None)
    with pytest.raises(TvmExtError, match=f"cannot write records file {path}: No space left on device"):
        store.append(Record("wk", {}, {"i": 1}, (1e-3,), error_msg="x" * 8192))
    with pytest.raises(TvmExtError, match="cannot write claims file"):
        next(store.claim_batches("wk", [Config.of({"i": i}) for i in range(2000)], lambda: ()))
    assert sorted(f.name for f in full_disk.iterdir()) == ["filler", "r.jsonl"]


# ---- claims ----------------------------------------------------------------------------------------

def _claim(store: RecordStore, config: Config, until: float, host: str = "elsewhere", pid: int = 1) -> dict:
    return {"workload_key": "wk", "config": json.dumps(sorted(config.as_dict().items()), separators=(",", ":")),
            "host": host, "pid": pid, "until": until}


@pytest.mark.parametrize("forged", ["far future", "pid 0 here", "nan"])
def test_a_forged_claim_cannot_stall_a_tuner(tmp_path, forged):
    warnings: list[str] = []
    store = RecordStore(tmp_path / "r.jsonl", warn=warnings.append)
    store.poll_secs = 0.01
    config = Config.of({"i": 1})
    claim = {"far future": _claim(store, config, time.time() + 10 * 365 * 86400),
             "pid 0 here": _claim(store, config, time.time() + 60, host=store._host, pid=0),
             "nan": {**_claim(store, config, 0.0), "until": float("nan")}}[forged]
    Path(store.claims_path).write_text(json.dumps([claim]))
    start = time.monotonic()

    def known() -> tuple:
        assert time.monotonic() - start < 5, "stalled by the forged claim"
        return ()

    assert list(store.claim_batches("wk", [config], known)) == [[config]]
    if forged != "pid 0 here":
        assert len(warnings) == 1 and "ignoring a claim" in warnings[0], warnings


def test_a_claim_of_another_host_is_honoured_within_its_lease(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl", warn=lambda _m: None)
    store.poll_secs, store.claim_secs = 0.05, 0.5
    config = Config.of({"i": 1})
    Path(store.claims_path).write_text(json.dumps([_claim(store, config, time.time() + 0.4)]))
    start = time.monotonic()
    assert list(store.claim_batches("wk", [config], lambda: ())) == [[config]]
    assert 0.3 < time.monotonic() - start < 5  # waited for the lease, then measured it here


# ---- the command line ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, content", [("x.py", b"just some text\n"), ("x.py", bytes(range(256)) * 4)])
def test_a_model_file_that_is_not_python_is_one_error_line(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    one_error_line(run(["model", str(path), "--records", str(tmp_path / "r.jsonl")]), f"cannot import {path}")


@pytest.mark.parametrize("name", ["weights.txt", "model.bin", "model"])
def test_a_file_not_named_as_a_model_is_refused_and_never_run(tmp_path, name):
    """Only FILE.py is run as code: Python in a file of another name (a text or weights file
    passed by mistake) is refused with one line, and what it would do does not happen."""
    marker = tmp_path / "ran"
    path = tmp_path / name
    path.write_text(f"open({str(marker)!r}, 'w').write('x')\ndef get_module():\n    return None\n")
    one_error_line(run(["model", str(path), "--records", str(tmp_path / "r.jsonl")]),
                   f"{path}: a model file is Python (.py), ONNX (.onnx) or a torch.export program (.pt2)")
    assert not marker.exists()


@pytest.mark.parametrize("name, message", [("bad.onnx", "bad.onnx is not a valid ONNX model"),
                                           ("bad.pt2", "bad.pt2 is not a torch.export program (.pt2)")])
def test_an_import_that_does_not_parse_is_its_own_one_line(tmp_path, name, message):
    """An ONNX or .pt2 file that does not parse: the import's reason, naming the file, is the
    error line as it is (not wrapped as something a model file's code raised)."""
    path = tmp_path / name
    path.write_bytes(b"\x00\x01 not a model")
    p = run(["model", str(path), "--records", str(tmp_path / "r.jsonl")])
    one_error_line(p, message)
    assert "get_module" not in p.stderr and not (tmp_path / "r.jsonl").exists()


def test_buffers_beyond_host_memory_are_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    from tvm_ext.cli import cli_checks
    from tvm_ext.tune import main

    monkeypatch.setattr(cli_checks, "host_memory_bytes", lambda: 2**30)
    monkeypatch.setattr("tvm_ext.core.records.RecordStore.__init__", lambda *a, **k: pytest.fail("the run started"))
    records = tmp_path / "r.jsonl"
    assert main(["gemm", "--shape", "100000000,1,1", "--records", str(records)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: gemm m=100000000 n=1 k=1: its buffers need") and \
        "host memory" in err[0], err
    assert not records.exists()


def test_buffers_beyond_device_memory_are_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    """The device's memory is known only once the target is (a CUDA GPU's; here one pretends)."""
    from tvm_ext.cli import cli_checks
    from tvm_ext.tune import main

    monkeypatch.setattr(cli_checks, "device_memory_bytes", lambda target: 4096)
    monkeypatch.setattr("tvm_ext.core.tuner.Tuner.__init__", lambda *a, **k: pytest.fail("the run started"))
    assert main(["gemm", "--shape", "64,64,64", "--records", str(tmp_path / "r.jsonl"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "its buffers need 48.0 KiB of device memory, more than the 4.0 KiB" in err[0], err


@pytest.mark.parametrize("devices", ["0,{missing}", "99"])
def test_devices_that_do_not_exist_are_one_error_line(tmp_path, devices):
    from tvm_ext.target import opencl_devices

    devices = devices.format(missing=len(opencl_devices()))  # one past the devices this machine has
    p = run(["gemm", "--shape", "8,8,8", "--records", str(tmp_path / "r.jsonl"), "--runner-option",
             f"devices={devices}", "--trials", "1", "--population", "2", "--generations", "1", "--no-progress"])
    one_error_line(p, f"no OpenCL device {devices.split(',')[-1]}")
    assert not (tmp_path / "r.jsonl").exists() or not (tmp_path / "r.jsonl").read_text()


STOPS = [(signal.SIGTERM,), (signal.SIGTERM, signal.SIGTERM), (signal.SIGTERM, signal.SIGINT)]


def test_sigterm_stops_like_ctrl_c_and_a_second_stop_keeps_the_summary(tmp_path):
    """One run per sequence of stops (SIGTERM; SIGTERM twice; SIGTERM then Ctrl-C), side by
    side: each stopped once it has records ends with 130, the summary and whole records."""
    runs = []
    try:
        for index, signals in enumerate(STOPS):
            rec = tmp_path / f"r{index}.jsonl"
            runs.append((signals, rec, subprocess.Popen(
                CLI + ["gemm", "--shape", "96,96,96", "--generations", "30", "--population", "8", "--workers", "1",
                       "--records", str(rec), "--no-progress"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
        deadline = time.time() + 600
        for signals, rec, proc in runs:
            while time.time() < deadline and not (rec.exists() and len(rec.read_text().splitlines()) >= 2):
                time.sleep(0.2)
            for signum in signals:
                proc.send_signal(signum)
                time.sleep(0.05)
        for signals, rec, proc in runs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 130, (signals, err)
            assert "best" in out and "trials this run" in out and "interrupted" in err and "Traceback" not in err
            for line in rec.read_text().splitlines():
                json.loads(line)  # every kept record is whole
    finally:
        for _, _, proc in runs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


_MANIFEST = {"format": "tvm_ext.measure.program/1", "library": "program.so", "source": "program.cu",
             "entry": "main", "launches": [{"name": "main_kernel", "args": ["A", "C"], "grid": [1, 1, 1],
                                            "block": [32, 1, 1]}],
             "target": {"kind": "cuda"},
             "tensors": [{"name": "A", "role": "input", "shape": [4, 4], "dtype": "float16"},
                         {"name": "C", "role": "output", "shape": [4, 4], "dtype": "float32"}]}


@pytest.mark.parametrize("damage, message", [
    ({"library": "../program.so"}, "library '../program.so' is not a file name of its folder"),
    ({"library": "/tmp/evil.so"}, "library '/tmp/evil.so' is not a file name"),
    ({"source": ".."}, "source '..' is not a file name"),
    ({"library": 7}, "library '7' is not a file name"),
    ({"tensors": "A"}, "tensors are not a list"),
    ({"tensors": [{"name": "A", "role": "input", "shape": [-1], "dtype": "float32"}]}, "is not one"),
    ({"tensors": [{"name": "A", "role": "weights", "shape": [2], "dtype": "float32"}]}, "is not one"),
    ({"tensors": [{"name": "A", "role": "input", "shape": [2**40, 2**30], "dtype": "float32"}]}, "more than the"),
    ({"tensors": [{"name": "A", "role": "input", "shape": [2], "dtype": "float8_e9"}]}, "has dtype 'float8_e9'"),
    ({"tensors": [{"name": "A", "role": "input", "shape": [2], "dtype": "int3"}]}, "has dtype 'int3'"),
    ({"launches": [{"name": "main_kernel"}]}, "launches are not launches"),
    ({"launches": ["main_kernel"]}, "launches are not launches"),
])
def test_a_damaged_program_manifest_is_one_error_and_loads_nothing(tmp_path, damage, message):
    """``load_program`` reads a folder a user hands it: the manifest's library and source are
    files of that folder, and its tensors and launches are checked before anything is loaded."""
    from tvm_ext.precision.codegen import load_program

    (tmp_path / "manifest.json").write_text(json.dumps(_MANIFEST))
    assert load_program(str(tmp_path)).inputs[0]["name"] == "A"  # the undamaged one reads
    (tmp_path / "manifest.json").write_text(json.dumps({**_MANIFEST, **damage}))
    with pytest.raises(TvmExtError) as raised:
        load_program(str(tmp_path))
    assert message in str(raised.value) and str(tmp_path) in str(raised.value)

