"""MkDocs hook: the command-line reference (``<!-- cli-reference -->``: every subcommand's
``--help``) and the operators' knob tables (``<!-- operator-tables -->``: the registry and each
template's space) are generated at build time, so the docs cannot drift from the code; the
results page's headline table (``<!-- results-table -->``) is ``benchmarks/RESULTS.md``'s, so
each figure is written once."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

MARKER = "<!-- cli-reference -->"
OPERATORS_MARKER = "<!-- operator-tables -->"
RESULTS_MARKER = "<!-- results-table -->"
RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "RESULTS.md"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:  # argparse keeps subparsers here; there is no public accessor
        if isinstance(action, argparse._SubParsersAction):
            found += sorted(action.choices.items())
    return found


def cli_reference() -> str:
    from tvm_ext.tune import build_parser

    parser = build_parser()
    parts = ["```text", parser.format_help().rstrip(), "```"]
    for name, sub in _subcommands(parser):
        parts += [f"## `{name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _example(op: Any, target: Any) -> Any:
    """A small instance of ``op``, as its tune subcommand makes one (or its example params)."""
    from tvm_ext.tune import build_parser

    if op.tune is None:
        return op.rebuild(op.example)
    args = build_parser().parse_args([op.tune.command, *op.tune_selector, *op.tune.example, "--target", "cuda"])
    return args.make_template(args).for_target(target)


def operator_tables() -> str:
    """Per registry entry: how it is tuned, what produces it, what it does not support, and its
    knobs (name, choices, what each does) from the space of a small instance on sm_90."""
    from tvm_ext.operators import OPERATORS
    from tvm_ext.target import offline_cuda

    target = offline_cuda("sm_90")
    parts = []
    for name, op in OPERATORS.items():
        template = _example(op, target)
        parts += [f"## `{name}`", "", f"Template `{type(template).__name__}`."]
        if op.tune is not None:
            parts.append(f"Tuned by `python -m tvm_ext.tune {' '.join((op.tune.command, *op.tune_selector))}` "
                         f"(e.g. `{' '.join(op.tune.example)}`).")
        if op.matchers:
            parts.append(f"Relax matchers: {', '.join(f'`{m}`' for m in op.matchers)}.")
        if op.precision is not None:
            parts.append(f"Mixed precision: `python -m tvm_ext.tune mixed-precision {name}`.")
        for capability, why in op.unsupported.items():
            parts.append(f"No `{capability}`: {why}.")
        parts += ["", "| knob | choices | what it does |", "|---|---|---|"]
        for knob in template.space(target).knobs:
            parts.append(f"| `{knob.name}` | {_cell(', '.join(str(c) for c in knob.choices))} | {_cell(knob.doc)} |")
        parts.append("")
    return "\n".join(parts)


def results_table(text: str) -> str:
    """The first table of ``benchmarks/RESULTS.md`` (``text``): its header row and every row up
    to the first line that is not one (the headline figures; the page table after it links into
    ``docs/`` by paths that hold only from ``benchmarks/``)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| operator |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    if OPERATORS_MARKER in markdown:
        markdown = markdown.replace(OPERATORS_MARKER, operator_tables())
    if RESULTS_MARKER in markdown:
        markdown = markdown.replace(RESULTS_MARKER, results_table(RESULTS.read_text()))
    return markdown
