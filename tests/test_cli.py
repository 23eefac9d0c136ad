"""The command line as a user runs it: a real subprocess, real records, one-line errors."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from interrupt import sigint_default

CLI = [sys.executable, "-m", "tvm_ext.tune"]


def run(args, env=None, timeout=300):
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_small_gemm_tuning_run(tmp_path):
    rec = tmp_path / "r.jsonl"
    p = run(["gemm", "--shape", "48,40,24", "--generations", "1", "--population", "6",
             "--records", str(rec), "--no-progress", "--seed", "3"])
    assert p.returncode == 0, p.stderr
    assert "best" in p.stdout and "GFLOP/s" in p.stdout and "speedup over the default config" in p.stdout
    lines = rec.read_text().splitlines()
    assert len(lines) >= 6
    assert f"trials this run: {len(lines)}" in p.stdout
    again = run(["gemm", "--shape", "48,40,24", "--generations", "1", "--population", "6",
                 "--records", str(rec), "--no-progress", "--seed", "3"])
    assert again.returncode == 0 and "trials this run: 0" in again.stdout
    assert len(rec.read_text().splitlines()) == len(lines)


def test_help_explains_every_knob():
    p = run(["gemm", "--help"])
    assert p.returncode == 0
    for knob in ("wg_x", "wg_y", "task_x", "task_y", "k_step", "use_shared", "pad", "unroll", "vec",
                 "double_buffer"):
        assert knob in p.stdout


@pytest.mark.parametrize("args, message", [
    (["conv", "--shape", "1"], "invalid choice"),
    (["gemm", "--shape", "12,a,4"], "malformed"),
    (["gemm", "--shape", "12,4"], "needs 3 numbers"),
    (["gemm", "--shape", "12,0,4"], "must be positive"),
    (["gemm", "--shape", "8,8,8", "--target", "vulkan"], "unknown target"),
    (["gemm", "--shape", "8,8,8", "--target", "cuda"], "no CUDA GPU"),
    (["gemm", "--shape", "8,8,8", "--records", "/proc/no/such/dir/r.jsonl"], "cannot write records"),
    (["gemm", "--shape", "8,8,8", "--population", "8", "--tourn-size", "4"], "tourn-size"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    p = run(args + ([] if "--records" in args else ["--records", str(tmp_path / "r.jsonl")]))
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], p.stderr
    assert "Traceback" not in p.stderr


def test_no_opencl_platform(tmp_path):
    p = run(["gemm", "--shape", "8,8,8", "--records", str(tmp_path / "r.jsonl")],
            env={"OCL_ICD_VENDORS": str(tmp_path / "no-vendors")})
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "error: no OpenCL platform found; install a driver or 'pip install pocl-binary-distribution'"]


def test_ctrl_c_keeps_records_and_prints_best_so_far(tmp_path):
    rec = tmp_path / "r.jsonl"
    proc = subprocess.Popen(CLI + ["gemm", "--shape", "96,96,96", "--generations", "30", "--population", "8",
                                   "--records", str(rec), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_default)
    deadline = time.time() + 600  # a loaded 2-core machine can take minutes to measure 3
    while time.time() < deadline:
        if rec.exists() and len(rec.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "best" in out and "interrupted" in err and "Traceback" not in err
    lines = rec.read_text().splitlines()
    assert len(lines) >= 3
    for line in lines:
        json.loads(line)  # every kept record is whole


def _group_options(parser, title):
    (group,) = [g for g in parser._action_groups if g.title == title]
    return [(a.option_strings, a.default) for a in group._group_actions]


def _declared(group):
    return [(list(o.flags), o.settings.get("default", False if o.settings.get("action") == "store_true" else None))
            for o in group.options]


def test_every_tuning_subcommand_takes_the_option_groups_declared_once():
    """Each operator's tune subcommand and ``model`` list the tuning, remote and cost-model groups
    exactly as ``cli_options`` declares them, and parse to their defaults; each mixed-precision
    subcommand its method 003 and run groups."""
    from tvm_ext.cli.cli_options import RUN_GROUP, TUNING_GROUPS, mixed_precision_group
    from tvm_ext.operators import precision_operators, tune_commands
    from tvm_ext.tune import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    commands = [(c.command, [c.command, *c.example]) for c in tune_commands()] + [("model", ["model", "m.py"])]
    assert len(commands) >= 7
    for name, argv in commands:
        args = vars(parser.parse_args(argv))
        for group in TUNING_GROUPS:
            assert _group_options(sub.choices[name], group.title) == _declared(group), (name, group.title)
            for flags, default in _declared(group):
                assert args[flags[0].lstrip("-").replace("-", "_")] == default, (name, flags)
    (mp,) = [a for a in sub.choices["mixed-precision"]._actions if a.dest == "operator"]
    assert mp.choices and set(mp.choices) == {op.name for op in precision_operators()}
    for name, p in mp.choices.items():
        for group in (mixed_precision_group(), RUN_GROUP):
            assert _group_options(p, group.title) == _declared(group), (name, group.title)
    assert _group_options(mp.choices["gemm"], "run")[5] == (["--build-timeout"], 300.0)
