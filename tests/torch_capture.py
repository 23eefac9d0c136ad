"""A torch recurrent module captured in a user's CUDA graph, as the GRU and LSTM module tests do
it: one call on a side stream first (compiled and loaded outside the capture), the capture, then
replays on new inputs with the outputs poisoned before each."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch


def captured(module: Any, static_x: Any) -> tuple[Any, Any]:
    """(graph, outputs): ``module(static_x)`` recorded in a CUDA graph after one call outside it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        module(static_x)  # compiled and loaded outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = module(static_x)
    return graph, outputs


def replay_checked(graph: Any, static_x: Any, outputs: Sequence[Any], check: Callable[[], None],
                   seeds: Sequence[int] = (3, 4)) -> None:
    """Replays ``graph`` on new inputs drawn into ``static_x`` (one generator seed each), every
    tensor of ``outputs`` filled with NaN before, then ``check()`` (a replay that writes nothing
    leaves NaN behind)."""
    for seed in seeds:
        static_x.copy_(torch.randn(static_x.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        for tensor in outputs:
            tensor.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check()
