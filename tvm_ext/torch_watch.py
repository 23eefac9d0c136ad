"""The error flags of ``tvm_ext.torch.GRU``'s and ``LSTM``'s CUDA calls, read without a sync: a
persistent step kernel's timed-out barrier, and inputs past what their float16 parts or storage
hold."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from tvm_ext.core.errors import TvmExtError


class BarrierWatch:
    """A call's error flags, written to pinned host memory by the call on its stream (a CUDA
    graph captures the writes too) and read at the next call: the persistent step kernels'
    timed-out flag (``bar[1]``), and whether an input the config splits into float16 parts
    (``GRU.split_inputs``: x, h0), or an input of a wider module the engine stores in float16
    (``narrowed``: each such input's largest |value|, ``StoredLimits``), held a value past that,
    tested on the device before the plan.  The numpy path checks both synchronously, which would cost the eager call
    a sync; here the call whose flag is set has run, and the next one raises.

    The device writes the flags straight into the pinned words (``device_view``: one small
    kernel after the plan) rather than into device memory copied out after it: a copy to the
    host is a copy-engine node that held a call up by several microseconds, more than the whole
    input GEMM of a small GRU.  Where torch cannot view the pinned words as a CUDA tensor, the
    flags stay on the device and are copied out after the call."""

    def __init__(self, engine: Any, narrowed: "StoredLimits | None" = None):
        self.message = engine.barrier_timeout
        self.what = type(engine).__name__  # GRU, LSTM: in messages
        self.split = engine.split_inputs()  # input -> the knob that splits it
        self.narrow(narrowed)
        self.active = engine.persistent or bool(self.limits)
        if self.active:
            self.bar = torch.from_dlpack(engine.executor.sets[0]["bar"]) if engine.persistent else None
            self.device = device = torch.device("cuda", engine.target.device_id)
            self.host = torch.zeros(1 + len(RANGE_CHECKED), dtype=torch.int32, pin_memory=True)
            self.words = self.host.numpy()  # the same pinned words, read in one call (not per element)
            self.mapped = device_view(self.host, device)  # the device's writes land in ``host``
            self.flags = self.mapped if self.mapped is not None else \
                torch.zeros(1 + len(RANGE_CHECKED), dtype=torch.int32, device=device)
            self.done: Any = None

    def narrow(self, narrowed: "StoredLimits | None") -> None:
        """Each checked input's limit: ``FLOAT16_MAX`` where split (what a float16 part holds),
        ``narrowed``'s where stored in float16 (set again when the weights change)."""
        from tvm_ext.schedules.gru.split import FLOAT16_MAX

        self.narrowed = narrowed
        self.limits = {name: FLOAT16_MAX for name in self.split}
        if narrowed is not None:
            self.limits.update(narrowed.limits)

    def check_ranges(self, tensors: Mapping[str, Any], zero_h0: bool) -> None:
        """On the device, before the plan: each checked input's flag set where its largest
        |value| is not below its limit (NaN included, as ``split_range_reason`` has it); h0 not
        where it is the module's zeros (``zero_h0``)."""
        for i, name in enumerate(RANGE_CHECKED, 1):
            if name in self.limits and tensors[name].numel() and not (name in STATE_INPUTS and zero_h0):
                largest = torch.linalg.vector_norm(tensors[name].flatten(), ord=math.inf)  # max |v|, NaN kept; no temp
                torch.logical_not(largest.view(1) < self.limits[name], out=self.flags[i:i + 1])

    def enqueue(self) -> None:
        """After a call, on torch's current stream: the timed-out flag into the flags (a kernel,
        where they are the pinned words: a same-type ``copy_`` would be a copy-engine node), and
        where they are on the device their copy out and the event that says when it landed."""
        if self.active:
            if self.bar is not None:
                torch.bitwise_or(self.bar[1:2], 0, out=self.flags[0:1])
            if self.mapped is None:
                self.host.copy_(self.flags, non_blocking=True)
            self.mark()

    def mark(self) -> None:
        """After a call (or a replay of a recorded one): the event of its flags' copy out, where
        they are copied (not inside a capture, where events cannot be queried).  The pinned
        words need none: the device's writes land in them, read as they are."""
        if self.active and self.mapped is None and not torch.cuda.is_current_stream_capturing():
            if self.done is None:
                self.done = torch.cuda.Event()
            self.done.record(torch.cuda.current_stream(self.device))

    def check(self, wait: bool = False) -> None:
        """Raise for a flag the calls before this one set (those that have finished: a call's
        flags are written at its start and end and hold the last finished call's); ``wait``:
        after the device has run every call."""
        if not self.active or torch.cuda.is_current_stream_capturing():
            return  # inside a capture: reported after it
        if self.mapped is None:
            if self.done is None:
                return  # nothing recorded yet
            if wait:
                self.done.synchronize()
            if not self.done.query():
                return
        elif wait:
            torch.cuda.synchronize(self.device)
        if not self.words.any():
            return
        flags = self.words.tolist()
        self.words[:] = 0
        if flags[0]:
            raise TvmExtError(self.message)
        name = RANGE_CHECKED[flags.index(1, 1) - 1]
        what = f"{self.what} {RANGE_NAMES[self.what].get(name, name)}"
        if name in self.split:
            raise TvmExtError(f"{what} held a value whose |value| is {self.limits[name]:g} or more (or NaN), beyond "
                              f"what its float16 parts hold (a call ran on it: its outputs are not valid); build "
                              f"without {self.split[name]}")
        raise TvmExtError(f"{what} held a value whose |value| is {self.limits[name]:.6g} or more (or NaN): this "
                          f"{self.narrowed.module_dtype} {self.what} stores it in float16 (TF32's class, served "
                          f"where torch.backends.cudnn.allow_tf32 lets torch's {self.what} use TF32, or precision "
                          f"float16), and {self.narrowed.overflows} would overflow (a call ran on it: its outputs "
                          f"are not valid); set torch.backends.cudnn.allow_tf32 = False (float32's range) or scale "
                          f"the input")


def device_view(host: Any, device: Any) -> Any:
    """``host`` (pinned, contiguous int32) as a CUDA tensor on ``device`` at the same address,
    or None where torch does not make one.  Pinned memory is mapped into every device's address
    space at its host address (unified addressing, every 64-bit CUDA platform), so a kernel's
    stores through the view land in ``host``; the view is made through the CUDA array
    interface, which records the pointer and nothing else (``host`` must outlive the view)."""
    class Words:
        __cuda_array_interface__ = {"shape": tuple(host.shape), "typestr": "<i4", "data": (host.data_ptr(), False),
                                    "strides": None, "version": 2}

    try:
        view = torch.as_tensor(Words(), device=device)
    except (RuntimeError, TypeError, ValueError):
        return None
    return view if view.data_ptr() == host.data_ptr() and view.dtype == torch.int32 else None


@dataclass(frozen=True)
class StoredLimits:
    """The inputs of a module wider than float16 that its engine stores in float16, each with the
    largest |value| it takes, and what would overflow past them (in the error's words)."""

    limits: Mapping[str, float]  # of ``RANGE_CHECKED``'s names
    module_dtype: str  # the module's (float32, bfloat16)
    overflows: str


# the plan inputs a config may split into float16 parts or store in float16, in the flags' order
RANGE_CHECKED = ("x", "h0", "c0")
STATE_INPUTS = ("h0", "c0")  # the module's zeros where the call has no hx: not checked
RANGE_NAMES = {"GRU": {"x": "input", "h0": "hx"}, "LSTM": {"x": "input", "h0": "h_0", "c0": "c_0"}}
