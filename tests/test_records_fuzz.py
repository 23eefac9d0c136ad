"""A records file of 1200 damaged, absurd and hostile lines around a few good records.

``show``, ``show --json``, ``report`` and ``export`` run on it as a user runs them (real
processes) and must: exit with 0 or 2, never print a traceback, still find every good
record, write nothing outside their output folder, and leave no markup of the data
unescaped in the report's page.  The lines are generated from a fixed seed: truncated
JSON, deep nesting, huge numbers, NaN and infinities, zero and negative costs, wrong
types in every field, unknown knobs and values outside the space, path traversal and
HTML in every string, invalid UTF-8 and lone surrogates.
"""
from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tvm_ext.core.records import Record
from tvm_ext.schedules.gemm.simt import KNOBS, GemmTemplate
from tvm_ext.target import TargetInfo
from tvm_ext.core.template import Workload

CLI = [sys.executable, "-m", "tvm_ext.tune"]
LINES = 1200
ESCAPE = "tvm_ext_fuzz_escaped"  # a file of this name anywhere means a path left its folder
HOSTILE_STRINGS = [
    "../../" + ESCAPE, "../" * 12 + "tmp/" + ESCAPE, "<img src=x onerror=alert(1)>", "<script>alert(1)</script>",
    "/tmp/" + ESCAPE, "\"><img src=y onerror=alert(2)>", "a/b/c", "..", ".", "",
    "$\\frac{1}{", "$x^{$", "\x1b[2J\x07", "\u202eevil", "\x00nul", "A" * 5000, "%s%n{}", "\\", "\ud83d\ude00",
]
HOSTILE_KEYS = HOSTILE_STRINGS[:4]  # the workload keys a surviving hostile record may have (few: plots take time)
JUNK = [None, 1, -1, 0, 1.5, "s", [], {}, True, False, [1, "a"], {"a": 1}, 2**70, -1e308]
NUMBERS_RAW = ["1e400", "-1e400", "1" + "0" * 5000, "1e-400", "NaN", "Infinity", "-Infinity", "-0.0", "0",
               "123456789012345678901234567890", "-1", "1e308"]


def _good_records() -> tuple[list[dict], str]:
    template = GemmTemplate(24, 16, 20)
    target = TargetInfo(kind="opencl", device_name="fuzz/device")
    workload = Workload.of(template, target)
    default = template.default_config(target).as_dict()
    wg_x = next(k for k in KNOBS if k.name == "wg_x").choices
    records = []
    for i, cost in enumerate((3e-4, 1e-4, 2e-4)):
        config = {**default, "wg_x": wg_x[i % len(wg_x)]} if i else default
        rec = Record(workload.key, workload.as_json(), dict(sorted(config.items())), (cost, cost * 1.01, cost),
                     strategy="ga", run="good", elapsed=float(i + 1), source_hash="")
        records.append(json.loads(rec.to_json()))
    return records, workload.key


def _set(data: dict, path: tuple[str, ...], value) -> dict:
    """A deep copy of ``data`` with ``path`` set to ``value``."""
    data = json.loads(json.dumps(data))
    node = data
    for name in path[:-1]:
        if not isinstance(node.get(name), dict):
            node[name] = {}
        node = node[name]
    node[path[-1]] = value
    return data


def _field_paths(record: dict) -> list[tuple[str, ...]]:
    paths = [(k,) for k in record]
    paths += [("workload", k) for k in record["workload"]] + [("workload", "params", k)
                                                             for k in record["workload"]["params"]]
    paths += [("workload", "target", k) for k in record["workload"]["target"]]
    paths += [("config", k) for k in record["config"]] + [("metrics", "timer")]
    return paths


def _raw(data: dict, path: tuple[str, ...], raw: str) -> bytes:
    """``data`` as a line with the JSON text ``raw`` (not a Python value: 1e400, NaN) at ``path``."""
    marker = "__RAW_MARKER__"
    return json.dumps(_set(data, path, marker)).replace(json.dumps(marker), raw).encode("utf-8", "surrogatepass")


def generate(rng: random.Random, good: list[dict], key: str) -> list[bytes]:
    base = good[0]
    paths = _field_paths(base)
    line = json.dumps(base).encode()

    def hostile_key(data: dict) -> dict:
        data = json.loads(json.dumps(data))
        data["workload_key"] = rng.choice(HOSTILE_KEYS)
        return data

    makers = [
        lambda: line[: rng.randrange(1, len(line))],  # torn
        lambda: _raw(base, rng.choice(paths), "[" * rng.choice((33, 200, 5000, 100_000))
                     + "]" * rng.choice((33, 200, 5000, 100_000))),
        lambda: _raw(base, rng.choice(paths), "{\"a\":" * 40 + "1" + "}" * 40),
        lambda: _raw(base, rng.choice([("costs",), ("timestamp",), ("elapsed",), ("build_secs",),
                                       ("config", "wg_x"), ("workload", "params", "m")]), rng.choice(NUMBERS_RAW)),
        lambda: _raw(base, ("costs",), f"[{rng.choice(NUMBERS_RAW)},{rng.choice(NUMBERS_RAW)}]"),
        lambda: json.dumps(_set(base, ("costs",), [rng.choice((0, -1e-4, 0.0, -0.0, 1e-4))
                                                  for _ in range(3)])).encode(),
        lambda: json.dumps(_set(base, rng.choice(paths), rng.choice(JUNK))).encode(),
        lambda: json.dumps(_set(hostile_key(base), rng.choice(paths[1:]), rng.choice(JUNK))).encode(),
        lambda: json.dumps(_set(base, ("config", rng.choice(("evil", "wg_x", "vec", "<b>"))),
                                rng.choice((7777, -1, "x", 3.5, 10**30)))).encode(),
        lambda: json.dumps(_set(hostile_key(base), rng.choice(paths[1:]), rng.choice(HOSTILE_STRINGS)),
                           ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass"),
        lambda: json.dumps(_set(base, rng.choice([("strategy",), ("run",), ("error_msg",), ("source_hash",),
                                                  ("metrics", "timer")]), rng.choice(HOSTILE_STRINGS))).encode(
            "utf-8", "surrogatepass"),
        lambda: json.dumps(_set(hostile_key(base), ("workload", "template"), rng.choice(HOSTILE_STRINGS))).encode(
            "utf-8", "surrogatepass"),
        lambda: json.dumps({**hostile_key(base), "workload": {"template": rng.choice(HOSTILE_STRINGS)},
                            "config": {rng.choice(HOSTILE_STRINGS): rng.choice(HOSTILE_STRINGS)},
                            "strategy": rng.choice(HOSTILE_STRINGS)}).encode("utf-8", "surrogatepass"),
        lambda: _set_bytes(line, rng),  # invalid UTF-8
        lambda: _raw(base, rng.choice([("strategy",), ("workload_key",), ("config", "wg_x")]), '"\\ud800x"'),
        lambda: bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 200))).replace(b"\n", b" "),
        lambda: json.dumps(_set(base, ("workload", "params", "m"), 10**12)).encode(),  # the good key, other workload
        lambda: json.dumps(rng.choice(JUNK)).encode(),
    ]
    return [rng.choice(makers)() for _ in range(LINES)]


def _set_bytes(line: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(line))
    return line[:at] + bytes(rng.choice((b"\xff", b"\xfe\xfe", b"\xc3", b"\xed\xa0\x80"))) + line[at:]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root``: a file's size and time of change, a folder's existence."""
    return {str(p.relative_to(root)): (0, 0) if p.is_dir() else (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*")}


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    work = root / "a" / "b" / "c"
    work.mkdir(parents=True)
    good, key = _good_records()
    # the good records first: a key's first record names its workload
    lines = [json.dumps(rec).encode() for rec in good] + generate(random.Random(43), good, key)
    path = work / "r.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return {"root": root, "work": work, "path": path, "good": good, "key": key, "lines": len(lines)}


def _run(fuzzed, args: list[str], out: str | None = None) -> subprocess.CompletedProcess:
    before = _tree(fuzzed["root"])
    p = subprocess.run(CLI + args, capture_output=True, text=True, timeout=300, cwd=fuzzed["work"])
    assert p.returncode in (0, 2), p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    after = _tree(fuzzed["root"])
    changed = {name for name in set(before) | set(after) if before.get(name) != after.get(name)}
    allowed = str((fuzzed["work"] / out).relative_to(fuzzed["root"])) if out else None
    assert all(allowed and (c == allowed or c.startswith(allowed + "/")) for c in changed), sorted(changed)
    assert not list(Path("/tmp").glob(ESCAPE + "*"))  # where ../../../.. leads
    return p


def test_the_file_has_at_least_1000_hostile_lines(fuzzed):
    assert fuzzed["lines"] - len(fuzzed["good"]) >= 1000


def test_show(fuzzed):
    p = _run(fuzzed, ["show", "r.jsonl", "--top", "50"])
    assert p.returncode == 0 and f"[workload {fuzzed['key']}]" in p.stdout
    assert "\x1b" not in p.stdout and "\x07" not in p.stdout  # no terminal control from the data
    warnings = [l for l in p.stderr.splitlines() if l.startswith("warning:")]
    assert len(warnings) == 1 and "unreadable lines" in warnings[0]


def test_show_json_finds_every_good_record(fuzzed):
    p = _run(fuzzed, ["show", "r.jsonl", "--json", "--top", "1000"])
    assert p.returncode == 0
    (mine,) = [w for w in json.loads(p.stdout) if w["workload_key"] == fuzzed["key"]]
    top = [(t["costs"], t["config"]) for t in mine["top"]]
    for rec in fuzzed["good"]:
        assert (rec["costs"], rec["config"]) in top


def test_report_writes_inside_out_and_escapes_the_page(fuzzed):
    p = _run(fuzzed, ["report", "r.jsonl", "--out", "report"], out="report")
    assert p.returncode == 0
    out = fuzzed["work"] / "report"
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+\.(png|html)", f.name) for f in out.iterdir())
    page = (out / "index.html").read_text()
    assert "<script" not in page.lower()
    tags = re.findall(r"<img[^>]*>", page, re.I)
    assert tags and all(re.fullmatch(r'<img src="[A-Za-z0-9_-]+\.png" alt="[^"<>]*">', t) for t in tags), tags


@pytest.mark.parametrize("which", ["good", "hostile"])
def test_export(fuzzed, which):
    workload = fuzzed["key"] if which == "good" else HOSTILE_KEYS[0]
    p = _run(fuzzed, ["export", "r.jsonl", "--workload", workload, "--out", "kernel"], out="kernel")
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert (p.returncode == 0 and not errors) or (p.returncode == 2 and len(errors) == 1), p.stderr[-2000:]
