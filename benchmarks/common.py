"""Shared helpers of the GPU benchmark scripts: baseline timing and the printed table."""
from __future__ import annotations

import datetime
import statistics
from typing import Any, Callable, Sequence


def time_torch(fn: Callable[[], Any], warmup: int = 5, repeat: int = 30) -> float:
    """Median seconds of ``fn`` with CUDA events (the baselines: cuBLAS, cuDNN, torch)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def device_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:
        return "unknown device"


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    out = [f"### {title} ({datetime.date.today().isoformat()}, {device_name()})", "", line(cells[0]),
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)
