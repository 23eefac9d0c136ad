"""Reading an operator's command-line text: shapes, batch axes, and the knob list of a
subcommand's help.  Kept apart from ``cli_args`` (which needs the session) so the operator
registry can use them without importing the tuning machinery."""
from __future__ import annotations

from typing import Sequence

from ..core.errors import TvmExtError
from ..core.space import Knob


def parse_batch(text: str) -> tuple[int, ...]:
    """Batch axes as ``B1,B2,...`` (empty: none), each at least 1."""
    if not text.strip():
        return ()
    return parse_shape(text, tuple(f"B{i}" for i in range(len(text.replace("x", ",").split(",")))))


def parse_shape(text: str, names: Sequence[str]) -> tuple[int, ...]:
    parts = [p.strip() for p in text.replace("x", ",").split(",")]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise TvmExtError(f"shape {text!r} is malformed; expected {','.join(names)} as integers") from None
    if len(values) != len(names):
        raise TvmExtError(f"shape {text!r} needs {len(names)} numbers: {','.join(names)}")
    bad = [f"{n}={v}" for n, v in zip(names, values) if v < 1]
    if bad:
        raise TvmExtError(f"shape dimensions must be positive: {', '.join(bad)}")
    return values


def knob_help(knobs: Sequence[Knob]) -> str:
    width = max(len(k.name) for k in knobs)
    lines = ["template knobs (searched by the tuner):"]
    for k in knobs:
        choices = ", ".join(map(str, k.choices))
        lines.append(f"  {k.name:<{width}}  {k.doc} [{choices}]")
    return "\n".join(lines)
