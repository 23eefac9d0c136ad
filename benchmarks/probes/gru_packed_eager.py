"""Where an eager ``tvm_ext.torch.GRU`` call on a ``PackedSequence`` spends its time: the call's
host time and wall clock, the host time of each stage of it replayed by hand (the pad index, the
pad, the lengths, the replay, the unpack), and torch.profiler's per-op table over 20 calls;
with ``--rounds N``: the call against the same call the way it was made before the pad went
straight into the graph's static input (padded, then copied in; the lengths copied every call),
in N interleaved rounds.  float16 B64 H1024 T128, lengths uniform in [64, 128] (the packed
benchmark case).
Usage: python benchmarks/probes/gru_packed_eager.py [--dtype float16] [--rounds 0]"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import host_and_wall_us  # noqa: E402

from tvm_ext import torch as tvm_torch  # noqa: E402
from tvm_ext.torch import GRU, PackedInput  # noqa: E402


def pad_then_copy(self: PackedInput, static: torch.Tensor) -> None:
    """The pad as it was: a padded tensor of its own, then copied into the static input."""
    static.copy_(self.padded())


def compare(gru: GRU, packed: object, rounds: int) -> None:
    """Host and wall of the call now and as it was, in interleaved rounds (medians of 50 each)."""
    records = list(gru._call_graphs.values())
    now = tvm_torch.PackedInput.pad_into

    def forget_lengths() -> None:  # as before: the lengths copied at every call
        for record in records:
            record.lengths_from[0] = None

    times: dict[str, list[tuple[float, float]]] = {"now": [], "before": []}
    for _ in range(rounds):
        for way in times:
            tvm_torch.PackedInput.pad_into = now if way == "now" else pad_then_copy
            times[way].append(host_and_wall_us(lambda: gru(packed), 50,
                                               forget_lengths if way == "before" else None))
    tvm_torch.PackedInput.pad_into = now
    for way, t in times.items():
        print(f"{way}: host {statistics.median(h for h, _ in t):.1f} us, "
              f"wall {statistics.median(w for _, w in t):.1f} us ({rounds} rounds)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="float16")
    p.add_argument("--rounds", type=int, default=0)
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    batch, hidden, seq = 64, 1024, 128
    net = torch.nn.GRU(hidden, hidden).cuda().to(dtype).eval()
    gru = GRU.from_module(net, fallback="off")
    lengths = torch.tensor(sorted(np.random.default_rng(0).integers(64, 129, batch).tolist(), reverse=True))
    x = torch.randn(seq, batch, hidden, device="cuda", dtype=dtype)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths)
    with torch.no_grad():
        for _ in range(3):
            gru(packed)
        host, wall = host_and_wall_us(lambda: gru(packed))
        print(f"call: host {host:.1f} us, wall {wall:.1f} us")
        layout = gru._packed_layout(packed.batch_sizes, packed.data.device)
        padded = layout.pad(packed.data)
        key = next(iter(gru._call_graphs))
        record = gru._call_graphs[key]
        stages = {
            "packed layout (cached by batch_sizes)": lambda: gru._packed_layout(packed.batch_sizes,
                                                                                     packed.data.device),
            "pad (index_select)": lambda: layout.pad(packed.data),
            "copy into the static input": lambda: record.x.copy_(padded),
            "pad into the static input (out=)": lambda: PackedInput(packed.data, layout).pad_into(record.x),
            "graph replay": lambda: record.graph.replay(),
            "out to dtype (no copy)": lambda: record.out.to(dtype),
            "h_n copy": lambda: record.h_n.to(dtype, copy=True),
            "unpack (index_select)": lambda: layout.unpack(record.out),
            "PackedSequence()": lambda: torch.nn.utils.rnn.PackedSequence(padded, packed.batch_sizes,
                                                                          packed.sorted_indices,
                                                                          packed.unsorted_indices),
            "is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
            "check input (_check_tensor)": lambda: gru._check_tensor("input", packed.data),
        }
        for name, fn in stages.items():
            print(f"  {name}: host {host_and_wall_us(fn)[0]:.1f} us")
        if args.rounds:
            compare(gru, packed, args.rounds)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                gru(packed)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
