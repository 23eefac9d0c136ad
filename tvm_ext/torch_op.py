"""``tvm_ext::gru``: the torch custom op a ``tvm_ext.torch.GRU`` runs as under ``torch.compile``.

Why: dynamo cannot trace the module's forward (TVM's packed functions, DLPack, the host-side
caches of compiled GRUs and recorded graphs); a fake tensor reaching them fails the compile
outright.  As a custom op with a fake implementation the GRU is one opaque node of the user's
graph: ``fullgraph=True`` holds and inductor compiles what is around it.  The op names its
module by a number (a module is no op argument) and runs the module's eager forward: the same
kernels, checks and choice against ``nn.GRU``.

Under ``mode="reduce-overhead"`` (and max-autotune's CUDA graphs) torch records the op inside
its own CUDA graph: the recording captures the module's kernels, so a replay runs the whole
model, GRU included, with no host work of ours.  What the module keeps across calls (compiled
GRUs, its own recorded graphs, zero states, torch's twin and the time against it) is made on a
shape's first call, which torch runs before it records; that call runs on a thread of its own
(``outside_graph_pools``), since torch's pools take every allocation of the recording thread and
refuse memory left alive in them.  The module's error flags are then read by ``module.check()``
(no host code of ours runs in a replay).  A ``PackedSequence`` is the op ``tvm_ext::gru_packed``,
which torch's graphs stop at (``cudagraph_unsafe``): its padding depends on the batch sizes'
values, which a replayed graph would fix.  Under ``torch.export`` the module records
``aten::gru`` instead (``as_torch_call``): a program portable to other processes.  A
``tvm_ext.torch.LSTM`` is the ops ``tvm_ext::lstm`` and ``tvm_ext::lstm_packed`` the same way (its
(h, c) joined into one state tensor around them), and records ``aten::lstm``.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, Callable, Optional

import torch
from torch.nn.utils.rnn import PackedSequence

from tvm_ext.core.errors import TvmExtError

_MODULES: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_KEYS = itertools.count()


def register(module: Any) -> int:
    """The number the op names ``module`` by (held weakly: the op does not keep it alive)."""
    key = next(_KEYS)
    _MODULES[key] = module
    return key


def _module(key: int) -> Any:
    module = _MODULES.get(key)
    if module is None:
        raise TvmExtError(f"tvm_ext's op: the tvm_ext.torch module it was compiled for (number {key}) no longer exists")
    return module


# the packed op stops torch's CUDA graphs (their partition records around it): its padding index
# is made from the batch sizes' values (a CPU tensor), which a replayed graph would fix
_PACKED_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


def _define(name: str) -> tuple[Any, Any]:
    """The ops ``tvm_ext::{name}`` and ``tvm_ext::{name}_packed`` (a module's ``NAME`` lower-cased):
    (output, state) of the module's eager forward, the state joined as its calls join it (a GRU's
    h_n; an LSTM's h_n then c_n in one tensor, ``tvm_ext.torch.LSTM.joined_state``)."""

    @torch.library.custom_op(f"tvm_ext::{name}", mutates_args=())
    def op(module: int, input: torch.Tensor, hx: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(output, h_n) of the module's eager forward on a tensor input.  Outputs are fresh
        contiguous tensors, as a custom op's must be (a ``batch_first`` output is copied)."""
        out, h_n = _module(module).op_forward(input, hx)
        return out.contiguous(), h_n.contiguous()

    @op.register_fake
    def _op_fake(module: int, input: torch.Tensor, hx: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The outputs' shapes, after the module's checks of the input and hx (its error messages)."""
        m = _module(module)
        seq, batch = m.checked_sizes(input, hx, False)
        width = m.dirs * m.hidden_size
        out = input.new_empty((batch, seq, width) if m.batch_first else (seq, batch, width))
        return out, input.new_empty((m.STATES * m.num_layers * m.dirs, batch, m.hidden_size))

    @torch.library.custom_op(f"tvm_ext::{name}_packed", mutates_args=(), tags=_PACKED_TAGS)
    def packed(module: int, data: torch.Tensor, hx: Optional[torch.Tensor], batch_sizes: torch.Tensor,
               sorted_indices: Optional[torch.Tensor], unsorted_indices: Optional[torch.Tensor]
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(output data, h_n) of the module's eager forward on a ``PackedSequence`` passed as its
        four parts."""
        sequence = PackedSequence(data, batch_sizes, sorted_indices, unsorted_indices)
        out, h_n = _module(module).eager_forward(sequence, hx)
        return out.data.contiguous(), h_n.contiguous()

    @packed.register_fake
    def _packed_fake(module: int, data: torch.Tensor, hx: Optional[torch.Tensor], batch_sizes: torch.Tensor,
                     sorted_indices: Optional[torch.Tensor], unsorted_indices: Optional[torch.Tensor]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        m = _module(module)
        _, batch = m.checked_sizes(data, hx, True)
        if hx is None:  # the batch is the packed batch sizes' first: known only when the op runs
            batch = torch.library.get_ctx().new_dynamic_size()
        return data.new_empty((data.shape[0], m.dirs * m.hidden_size)), \
            data.new_empty((m.STATES * m.num_layers * m.dirs, batch, m.hidden_size))

    return op, packed


gru, gru_packed = _define("gru")
lstm, lstm_packed = _define("lstm")
_OPS = {"GRU": (gru, gru_packed), "LSTM": (lstm, lstm_packed)}


def outside_graph_pools(forward: Callable[..., tuple[Any, Any]], input: Any, hx: Any) -> tuple[Any, Any]:
    """``forward(input, hx)`` on a thread of its own and a stream ordered after the caller's,
    its outputs copied on the caller's stream.  Why: torch's CUDA graph trees give the thread
    they warm up or record on their graph pool for every allocation and refuse a graph whose
    pool holds memory no output accounts for; what a module makes on its first call (its
    recorded graph's static tensors, zero states) lives across calls, so it is allocated off
    that thread.  Grad mode and torch's dispatch modes are the thread's own: the forward runs
    on real tensors without grad, as the op's implementation does."""
    caller = torch.cuda.current_stream(input.device)
    side = torch.cuda.Stream(input.device)
    side.wait_stream(caller)
    results: list[Any] = []

    def run() -> None:
        try:
            with torch.cuda.device(input.device), torch.cuda.stream(side), torch.no_grad():
                results.append(forward(input, hx))
        except BaseException as error:  # noqa: BLE001 - raised again on the caller's thread
            results.append(error)

    worker = threading.Thread(target=run, name="tvm_ext-gru-first-call")
    worker.start()
    worker.join()
    if isinstance(results[0], BaseException):
        raise results[0]
    caller.wait_stream(side)
    copies = []
    for tensor in results[0]:
        copies.append(tensor.clone())
        tensor.record_stream(caller)  # not reused before the copy on the caller's stream has run
    return copies[0], copies[1]


def exporting() -> bool:
    """Whether ``torch.export`` traces the forward (and not ``torch.compile``): torch's flag, read
    as it is (dynamo reads a module global's value).  Why not ``torch.compiler.is_exporting()``:
    dynamo before torch 2.13 folds that call to True under ``torch.compile`` too (pytorch
    #176347), where the module would then record ``aten::gru`` and run torch's GRU."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    return torch.compiler.is_exporting() if flag is None else bool(flag)


def as_torch_call(module: Any, input: Any, hx: Any) -> tuple[Any, Any]:
    """``module``'s forward as ``nn.GRU`` (``nn.LSTM``) computes it (``aten::gru`` / ``aten::lstm``
    on its parameters, in torch's order; hx as the user passes it): what ``torch.export`` records
    for it, so that the program is the one an ``nn.GRU`` (``nn.LSTM``) model exports (its op a
    number would name means nothing outside this process), which ``tune model FILE.pt2`` imports
    as tvm_ext's kernels."""
    weights = list(module.parameters())  # registered in torch's flat order: layer, direction, ih, hh
    packed = isinstance(input, PackedSequence)
    data = input.data if packed else input
    batch = int(input.batch_sizes[0]) if packed else data.shape[0 if module.batch_first else 1]
    lstm_call = module.STATES == 2
    states = (hx,) if not lstm_call else (hx if hx is not None else (None, None))
    if any(state is None for state in states):
        states = tuple(data.new_zeros((module.num_layers * module.dirs, batch, module.hidden_size))
                       for _ in range(module.STATES))
    elif packed and input.sorted_indices is not None:
        states = tuple(state.index_select(1, input.sorted_indices) for state in states)
    vf = torch._VF.lstm if lstm_call else torch._VF.gru
    state_arg = states if lstm_call else states[0]
    if not packed:
        out, *finals = vf(data, state_arg, weights, module.bias, module.num_layers, 0.0, False, module.bidirectional,
                          module.batch_first)
        return out, (tuple(finals) if lstm_call else finals[0])
    out, *finals = vf(data, input.batch_sizes, state_arg, weights, module.bias, module.num_layers, 0.0, False,
                      module.bidirectional)
    if input.unsorted_indices is not None:
        finals = [final.index_select(1, input.unsorted_indices) for final in finals]
    return (PackedSequence(out, input.batch_sizes, input.sorted_indices, input.unsorted_indices),
            tuple(finals) if lstm_call else finals[0])



def call(module: Any, input: Any, hx: Any) -> tuple[Any, Any]:
    """``module``'s forward as its op (named by ``module._op_key``; hx as the user passes it: an
    LSTM's joined into one tensor around the op), a ``PackedSequence`` rebuilt around the packed
    op's output."""
    op, packed_op = _OPS[module.NAME]
    key = module._op_key
    joined = module.joined_state(hx)
    if isinstance(input, PackedSequence):
        data, h_n = packed_op(key, input.data, joined, input.batch_sizes, input.sorted_indices, input.unsorted_indices)
        out = PackedSequence(data, input.batch_sizes, input.sorted_indices, input.unsorted_indices)
    else:
        out, h_n = op(key, input, joined)
    return out, module.split_state(h_n)
