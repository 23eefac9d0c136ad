"""One timing protocol for our kernels and the vendor baselines they are compared with.

Why one protocol: a vendor call (cuDNN's GRU enqueues hundreds of kernels, torch.sum two)
timed one call at a time on an idle GPU measures its host dispatch, which our one-launch
kernels do not pay, so the ratio flatters us.  Every benchmark therefore times the vendor
three ways in the same process and compares with the best of them:

- ``per_call``: a clock mark, one call, a mark, on an idle device (what a lone call costs);
- ``back_to_back``: marks around N calls issued without waiting, divided by N (the host
  enqueues ahead of the device, so dispatch overlaps the previous call's work);
- replayed from a CUDA graph (torch-specific, ``benchmarks/common.py``): marks around one
  replay of N captured calls, divided by N (no host dispatch at all).

Our kernels are timed ``back_to_back`` on the same rotation of input sets and with the
same clock.  Inputs that fit in the last-level cache are rotated through enough sets
(``rotation_count``) that consecutive calls read from memory, not from a warm L2.

This module knows no framework: a ``Clock`` is either host time around a device sync
(``HostClock``; PoCL in the tests) or device events (CUDA events in the benchmarks).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

PER_CALL = "per call"
BACK_TO_BACK = "back-to-back"
GRAPH = "CUDA graph"
METHODS = (PER_CALL, BACK_TO_BACK, GRAPH)

Launch = Callable[[int], Any]
"""``launch(i)`` issues one call on input set ``i`` (it need not wait for the device)."""


class Clock(Protocol):
    """Marks on the device's queue and the seconds between two of them."""

    def idle(self) -> None:
        """Wait until the device has finished everything queued."""

    def mark(self) -> Any:
        """A point in the queue (a recorded event; for a host clock: the time after a sync)."""

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds between two marks, waiting for ``end`` to be reached."""


@dataclass(frozen=True)
class HostClock:
    """Host time around a full device sync: for devices without usable events (PoCL)."""

    sync: Callable[[], None]

    def idle(self) -> None:
        self.sync()

    def mark(self) -> float:
        self.sync()
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        return end - start


@dataclass(frozen=True)
class TimingSettings:
    warmup: int = 3  # calls before any sample (compilation, caches, clocks up)
    repeat: int = 15  # samples; the result is their median
    min_secs: float = 0.02  # a back-to-back sample (or a graph replay) lasts at least this long
    max_calls: int = 1 << 14  # calls in one back-to-back sample at most


@dataclass(frozen=True)
class Timing:
    """Seconds per call by one method: the median of ``samples`` (each already per call)."""

    method: str
    seconds: float
    samples: tuple[float, ...]
    calls: int  # calls per sample
    sets: int  # input sets the calls cycled through


def rotation_count(set_bytes: float, l2_bytes: float, max_sets: int = 64) -> int:
    """Input sets to cycle through so that the sets together are at least twice the L2:
    consecutive calls then read their inputs from memory.  1 without an L2 figure."""
    if l2_bytes <= 0 or set_bytes <= 0:
        return 1
    return int(max(1, min(max_sets, math.ceil(2 * l2_bytes / set_bytes))))


class Rotation:
    """The next input set of a rotation, continuing across warm-up and samples, so every
    set is used equally often (counts differ by at most one)."""

    def __init__(self, sets: int):
        if sets < 1:
            raise ValueError(f"a rotation needs at least one input set, got {sets}")
        self.sets = sets
        self.calls = 0

    def __call__(self) -> int:
        index = self.calls % self.sets
        self.calls += 1
        return index


def per_call(launch: Launch, sets: int, clock: Clock, settings: TimingSettings = TimingSettings(),
             rotation: Rotation | None = None) -> Timing:
    """Each sample: wait for an idle device, mark, one call, mark."""
    rotation = rotation or Rotation(sets)
    for _ in range(settings.warmup):
        launch(rotation())
    samples = []
    for _ in range(settings.repeat):
        clock.idle()
        start = clock.mark()
        launch(rotation())
        end = clock.mark()
        samples.append(clock.seconds(start, end))
    return Timing(PER_CALL, statistics.median(samples), tuple(samples), 1, sets)


def _loop_seconds(launch: Launch, calls: int, clock: Clock, rotation: Rotation) -> float:
    clock.idle()
    start = clock.mark()
    for _ in range(calls):
        launch(rotation())
    return clock.seconds(start, clock.mark())


def calls_per_sample(seconds_per_call: float, sets: int, settings: TimingSettings) -> int:
    """Calls that make a sample last ``min_secs``: a multiple of ``sets`` (each set equally
    often), at least one round of the rotation, at most ``max_calls`` (rounded to sets)."""
    cap = max(1, settings.max_calls // sets) * sets
    want = math.ceil(settings.min_secs / max(seconds_per_call, 1e-9))
    return min(cap, max(sets, math.ceil(want / sets) * sets))


def back_to_back(launch: Launch, sets: int, clock: Clock, settings: TimingSettings = TimingSettings(),
                 rotation: Rotation | None = None) -> Timing:
    """Each sample: marks around N calls on the rotated sets, issued without waiting; / N.

    N is calibrated first (grown from one round of the rotation until a sample lasts
    ``min_secs``), so the clock's resolution and the final sync are small against it."""
    rotation = rotation or Rotation(sets)
    for _ in range(settings.warmup):
        launch(rotation())
    cap = max(1, settings.max_calls // sets) * sets
    calls = sets
    secs = _loop_seconds(launch, calls, clock, rotation)
    while secs < settings.min_secs and calls < cap:
        # aim a quarter past the target (the estimate is noisy), and at least double
        estimate = calls_per_sample(secs / calls / 1.25, sets, settings)
        calls = min(cap, max(estimate, 2 * calls))
        secs = _loop_seconds(launch, calls, clock, rotation)
    samples = [_loop_seconds(launch, calls, clock, rotation) / calls for _ in range(settings.repeat)]
    return Timing(BACK_TO_BACK, statistics.median(samples), tuple(samples), calls, sets)


@dataclass(frozen=True)
class VendorTimes:
    """The vendor's call timed three ways in one process; ratios use ``best``.

    ``graph`` is None where no CUDA graph could be captured or its output differed from
    the eager output; ``graph_note`` then says why."""

    per_call: Timing
    back_to_back: Timing
    graph: Timing | None = None
    graph_note: str = ""

    @property
    def timings(self) -> tuple[Timing, ...]:
        return tuple(t for t in (self.per_call, self.back_to_back, self.graph) if t is not None)

    @property
    def best(self) -> Timing:
        return min(self.timings, key=lambda t: t.seconds)

    def speedup(self, ours_seconds: float) -> float:
        """How many times faster ours is than the vendor at its best (> 1: ours faster)."""
        return self.best.seconds / ours_seconds if ours_seconds > 0 else math.nan
