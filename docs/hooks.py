"""MkDocs hook: the command-line reference is generated from the argparse parser at build
time (``<!-- cli-reference -->`` in a page is replaced by every subcommand's ``--help``), so
the docs cannot drift from the code."""
from __future__ import annotations

import argparse
from typing import Any

MARKER = "<!-- cli-reference -->"


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


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown
