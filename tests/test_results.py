"""Reading results: ``tune --json``, the progress bar, ``show``, ``report`` and ``export`` on a
records file written by real tuning runs (two strategies, and a workload whose every build
failed), and the tuning page's Python example run as a script."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tvm_ext.core.records import RecordStore
from tvm_ext.schedules.gemm.simt import KNOBS as GEMM_KNOBS
from tvm_ext.schedules.gru import GruTemplate

CLI = [sys.executable, "-m", "tvm_ext.tune"]
GEMM = ["gemm", "--shape", "24,16,20", "--workers", "1", "--seed", "1"]
SPACE_ORDER = [k.name for k in GEMM_KNOBS]
TUNING_DOC = Path(__file__).resolve().parent.parent / "docs" / "tuning.md"  # the Python example


def run(args, timeout=600, **kwargs):
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One records file: a GA run (--json, with the progress bar), a random-search run, a
    rerun that reads everything back, and a workload whose builds all time out."""
    root = tmp_path_factory.mktemp("results")
    records = str(root / "r.jsonl")
    ga = run(GEMM + ["--generations", "1", "--population", "6", "--records", records, "--json"])
    assert ga.returncode == 0, ga.stderr
    rnd = run(GEMM + ["--strategy", "random", "--generations", "1", "--population", "4", "--seed", "7",
                      "--no-progress", "--records", records])
    assert rnd.returncode == 0, rnd.stderr
    again = run(GEMM + ["--generations", "1", "--population", "6", "--no-progress", "--records", records])
    assert again.returncode == 0, again.stderr
    failing = run(["gemm", "--shape", "8,8,8", "--population", "2", "--generations", "1", "--trials", "2",
                   "--build-timeout", "0.001", "--no-progress", "--records", records])
    assert failing.returncode == 1, failing.stderr  # no candidate: every build timed out
    return {"root": root, "records": records, "ga": ga, "random": rnd, "again": again}


def _knob_names(config_text: str) -> list[str]:
    return [item.split("=")[0] for item in config_text.split()]


def test_tune_json_is_the_final_result(tuned):
    result = json.loads(tuned["ga"].stdout)
    assert result["description"] == "gemm m=24 n=16 k=20"
    assert list(result["best"]["config"]) == SPACE_ORDER
    assert result["best"]["speed"]["unit"] == "GFLOP/s" and result["best"]["cost_secs"] > 0
    ga_records = [r for r in RecordStore(tuned["records"])
                  if r.strategy == "ga" and r.workload_key == result["workload_key"]]
    assert result["trials"] == len(ga_records) > 0 and result["interrupted"] is False
    assert result["speedup_over_default"] >= 1.0


def test_progress_bar_keeps_its_total_ends_full_and_the_header_has_its_own_line(tuned):
    """The bar's total is the planned trials from the first draw to the last; configs not
    measured (measured before, infeasible, twins) are counted at the end and said."""
    err = tuned["ga"].stderr
    first = err.splitlines()[0]
    assert first.startswith("tuning gemm m=24 n=16 k=20 on opencl:") and "%|" not in first
    states = re.findall(r"(\d+)/(\d+) \[", err)
    assert len({total for _, total in states}) == 1  # never changes
    done, total = states[-1]
    trials = json.loads(tuned["ga"].stdout)["trials"]
    assert done == total and int(total) >= trials
    assert (int(total) > trials) == (f"{int(total) - trials} not measured" in err)


def test_records_read_back_print_knobs_in_the_space_order(tuned):
    out = tuned["again"].stdout
    assert "trials this run: 0" in out
    best = next(l for l in out.splitlines() if l.strip().startswith("best"))
    assert _knob_names(best.split("GFLOP/s")[1]) == SPACE_ORDER


def test_show_summarizes_each_workload(tuned):
    p = run(["show", tuned["records"], "--top", "3"])
    assert p.returncode == 0, p.stderr
    assert "2 workloads" in p.stdout
    assert "strategies: ga (" in p.stdout and "random (" in p.stdout
    assert "errors: build_timeout 2" in p.stdout and "no correct record" in p.stdout
    best = next(l for l in p.stdout.splitlines() if l.strip().startswith("best"))
    assert _knob_names(best.split("GFLOP/s")[1]) == SPACE_ORDER
    assert len([l for l in p.stdout.splitlines() if l.strip().startswith(("best", "#2", "#3"))]) == 3


def test_show_json(tuned):
    p = run(["show", tuned["records"], "--json", "--top", "2", "--workload", "gemm m=24"])
    assert p.returncode == 0, p.stderr
    (workload,) = json.loads(p.stdout)
    records = [r for r in RecordStore(tuned["records"]) if r.workload_key == workload["workload_key"]]
    assert workload["trials"] == len(records)
    assert set(workload["strategies"]) == {"ga", "random"}
    assert sum(workload["strategies"].values()) == len(records)
    costs = [t["cost_secs"] for t in workload["top"]]
    assert len(costs) == 2 and costs == sorted(costs) and costs[0] == min(r.cost for r in records)
    assert workload["tuning_secs"] > 0
    by_key = run(["show", tuned["records"], "--json", "--workload", workload["workload_key"][:8]])
    assert [w["workload_key"] for w in json.loads(by_key.stdout)] == [workload["workload_key"]]


def test_report_writes_valid_pngs_and_a_page(tuned):
    from matplotlib.image import imread

    from tvm_ext.results.plots import convergence
    from tvm_ext.results.summary import load_workloads, select

    out = tuned["root"] / "report"
    p = run(["report", tuned["records"], "--out", str(out)])
    assert p.returncode == 0, p.stderr
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == 4  # convergence and knobs, per workload
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        height, width, _ = imread(png).shape
        assert height > 200 and width > 300
    page = (out / "index.html").read_text()
    assert all(f'src="{png.name}"' in page for png in pngs)
    (wr,) = select(load_workloads(tuned["records"]), "gemm m=24")
    series = {s.strategy: s for s in convergence(wr)}
    assert set(series) == {"ga", "random"}
    for s in series.values():  # best so far never drops, and wall time moves forward
        assert np.all(np.diff(s.best[~np.isnan(s.best)]) >= 0) and np.all(np.diff(s.wall_secs) >= 0)
    best = max(np.nanmax(s.best) for s in series.values())
    assert best == pytest.approx(wr.template.flops() / wr.best.cost / 1e9)


def test_export_runs_on_pocl_and_matches_numpy(tuned):
    import tvm

    from tvm_ext.precision.codegen import load_program

    out = tuned["root"] / "kernel"
    p = run(["export", tuned["records"], "--workload", "gemm m=24", "--out", str(out)])
    assert p.returncode == 0, p.stderr
    assert "differs" not in p.stderr  # the kernel rebuilt is the one measured
    manifest = json.loads((out / "manifest.json").read_text())
    (shown,) = json.loads(run(["show", tuned["records"], "--json", "--workload", "gemm m=24"]).stdout)
    assert manifest["schedule"] == shown["top"][0]["config"]
    assert "__kernel" in (out / "program.cl").read_text()
    assert (out / "program.so").read_bytes()[:4] == b"\x7fELF"
    tvm.script.from_source((out / "kernels" / "main.py").read_text())  # the TVMScript parses back
    rng = np.random.default_rng(3)
    a, b = rng.uniform(-1, 1, (24, 20)), rng.uniform(-1, 1, (20, 16))
    (c,) = load_program(str(out)).run(a, b)
    ref = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64)
    assert np.linalg.norm(c - ref) / np.linalg.norm(ref) < 1e-5


def test_export_of_several_workloads_takes_the_most_recent_and_says_so(tuned):
    """Without --workload: the workload with a correct record tuned last, and the others listed
    one a line; a
    --workload that matches several is an error listing them one a line."""
    from tvm_ext.results.summary import load_workloads

    workloads = load_workloads(tuned["records"])
    newest = max((w for w in workloads if w.best is not None), key=lambda w: max(r.timestamp for r in w.records))
    p = run(["export", tuned["records"], "--out", str(tuned["root"] / "x")])
    assert p.returncode == 0, p.stderr
    assert f"exporting the most recently tuned, {newest.description}" in p.stderr
    assert all(f"\n  {w.key}  {w.description}" in p.stderr for w in workloads)
    p = run(["export", tuned["records"], "--workload", "gemm", "--out", str(tuned["root"] / "y")])
    assert p.returncode == 2 and p.stderr.startswith("error: 2 workloads match --workload 'gemm'; name one of:\n")
    assert "Traceback" not in p.stderr


def test_gru_summary_hides_knobs_of_kernels_the_config_does_not_use(opencl):
    from tvm_ext.results.summary import config_text

    gru = GruTemplate(batch=2, hidden=8, input=4, seq=3)
    unfused = gru.default_config(opencl)
    recorded = dict(sorted(unfused.as_dict().items()))  # as a record stores it
    names = _knob_names(config_text(gru, opencl, recorded))
    assert not any(n.startswith("step_") for n in names) and "cell_block" in names
    assert names == [n for n in gru.space(opencl).names if n in names]  # the space's order
    fused = _knob_names(config_text(gru, opencl, {**recorded, "fuse_step": 1}))
    assert "step_j" in fused and not any(n.startswith("hid_") or n == "cell_block" for n in fused)


def test_docs_python_example_runs_as_a_script(tmp_path):
    """Saved as a file and run (builds spawn processes that import it again), it prints a
    one-line summary of the best record."""
    block = re.search(r"From Python:\n\n```python\n(.*?)```", TUNING_DOC.read_text(), re.S).group(1)
    (tmp_path / "example.py").write_text(block)
    p = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr
    line = p.stdout.strip()
    assert "\n" not in line and len(line) < 300 and re.match(r"\d+\.\d+ ms  wg_x=", line), p.stdout


def test_a_workload_without_a_template_is_named_readably():
    """A mixed-precision program's schedule (a list of pairs) reads as name=value pairs."""
    from tvm_ext.results.summary import WorkloadRecords

    w = WorkloadRecords("k", {"template": "mixed_precision",
                              "params": {"operator": "gemm", "m": 8, "schedule": [["a_transposed", 0], ["wg_x", 4]]}},
                        ())
    assert w.description == "mixed-precision operator=gemm m=8 schedule=(a_transposed=0, wg_x=4)"
