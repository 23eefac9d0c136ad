"""The documentation cannot drift from the code: the site builds with ``mkdocs build
--strict`` (broken links and references fail it; the CLI reference is generated from the
parser), and the commands the README starts with run on PoCL as written."""
from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_site_builds_strictly_with_the_generated_cli_reference(tmp_path):
    pytest.importorskip("mkdocs")
    site = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert p.returncode == 0, p.stdout + p.stderr
    cli = (site / "cli" / "index.html").read_text()
    from tvm_ext.tune import build_parser

    for action in build_parser()._actions:  # every subcommand has its section
        for name in getattr(action, "choices", None) or ():
            if isinstance(name, str) and hasattr(action, "_name_parser_map"):
                assert f"<code>{name}</code>" in cli, name
    assert "GRU" in (site / "api" / "index.html").read_text()
    from tvm_ext.operators import OPERATORS

    operators = (site / "operators" / "index.html").read_text()  # the registry's knob tables
    for name in OPERATORS:
        assert f"<code>{name}</code>" in operators, name
    assert "<code>step_flags</code>" in operators and "<code>wgmma_split_k</code>" in operators
    # the results page's headline table is benchmarks/RESULTS.md's, every row of it (written once)
    lines = (ROOT / "benchmarks" / "RESULTS.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| operator |"))
    rows = len(list(itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2:])))
    results = (site / "results" / "index.html").read_text()
    assert rows > 50 and results.count("<tr>") == rows + 1  # and its header
    assert "<!-- results-table -->" not in (site / "results" / "index.html").read_text()


def readme_commands() -> list[str]:
    """The README's first bash block: install first, tests last."""
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_commands_run_as_written(tmp_path):
    commands = readme_commands()
    assert commands[0].startswith("pip install") and "pytest" in commands[-1]
    for command in commands[1:-1]:  # installing is CI's first step, the tests are this run
        argv = shlex.split(command.split("#")[0])
        assert argv[:3] == ["python", "-m", "tvm_ext.tune"], command
        p = subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"{command}\n{p.stdout}\n{p.stderr}"
        assert "Traceback" not in p.stderr
    assert (tmp_path / "tvm_ext_report" / "index.html").exists()


def test_getting_started_shows_the_commands_the_readme_runs():
    """The getting-started page's commands are the README's, which the test above runs."""
    page = re.search(r"```bash\n(.*?)```", (ROOT / "docs" / "getting-started.md").read_text(), re.S).group(1)
    assert [line for line in page.splitlines() if line.strip()] == readme_commands()
