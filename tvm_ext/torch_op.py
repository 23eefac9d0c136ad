"""``tvm_ext::gru``: the torch custom op a ``tvm_ext.torch.GRU`` runs as under ``torch.compile``.

Why: dynamo cannot trace the module's forward (TVM's packed functions, DLPack, the host-side
caches of compiled GRUs and recorded graphs); a fake tensor reaching them fails the compile
outright.  As a custom op with a fake implementation the GRU is one opaque node of the user's
graph: ``fullgraph=True`` holds and inductor compiles what is around it.  Under
``mode="reduce-overhead"`` torch records CUDA graphs of the parts around the op (its graph
partition) and the op replays the module's own recorded graph between them: one launch.  The op
names its module by a number (a module is no op argument) and runs the module's eager forward:
the same kernels, checks and choice against ``nn.GRU``.  Under ``torch.export`` the module
records ``aten::gru`` instead (``as_nn_gru``): a program portable to other processes.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Optional

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
        raise TvmExtError(f"tvm_ext::gru: the tvm_ext.torch.GRU it was compiled for (number {key}) no longer exists")
    return module


# cudagraph-unsafe: torch's CUDA graphs (``mode="reduce-overhead"``) are recorded around the op,
# not through it: the module keeps device memory across calls (its compiled GRU's recorded graph,
# zero states, torch's twin), which torch's graph pools refuse when made while they record
_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


@torch.library.custom_op("tvm_ext::gru", mutates_args=(), tags=_TAGS)
def gru(module: int, input: torch.Tensor, hx: Optional[torch.Tensor], batch_sizes: Optional[torch.Tensor],
        sorted_indices: Optional[torch.Tensor], unsorted_indices: Optional[torch.Tensor]
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, h_n) of the module's eager forward; a ``PackedSequence`` passed as its four parts
    (``batch_sizes`` None: a tensor input), its output as its data.  Outputs are fresh
    contiguous tensors, as a custom op's must be (a ``batch_first`` output is copied)."""
    packed = batch_sizes is not None
    x = PackedSequence(input, batch_sizes, sorted_indices, unsorted_indices) if packed else input
    out, h_n = _module(module).eager_forward(x, hx)
    return (out.data if packed else out).contiguous(), h_n.contiguous()


@gru.register_fake
def _gru_fake(module: int, input: torch.Tensor, hx: Optional[torch.Tensor], batch_sizes: Optional[torch.Tensor],
              sorted_indices: Optional[torch.Tensor], unsorted_indices: Optional[torch.Tensor]
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs' shapes, after the module's checks of the input and hx (its error messages)."""
    m = _module(module)
    packed = batch_sizes is not None
    seq, batch = m.checked_sizes(input, hx, packed)
    width = m.dirs * m.hidden_size
    if packed:
        out = input.new_empty((input.shape[0], width))
        if hx is None:  # the batch is the packed batch sizes' first: known only when the op runs
            batch = torch.library.get_ctx().new_dynamic_size()
    else:
        out = input.new_empty((batch, seq, width) if m.batch_first else (seq, batch, width))
    return out, input.new_empty((m.num_layers * m.dirs, batch, m.hidden_size))


def as_nn_gru(module: Any, input: Any, hx: Any) -> tuple[Any, Any]:
    """``module``'s forward as ``nn.GRU`` computes it (``aten::gru`` on its parameters, in
    nn.GRU's order): what ``torch.export`` records for it, so that the program is the one an
    ``nn.GRU`` model exports (its op a number would name means nothing outside this process),
    which ``tune model FILE.pt2`` imports as tvm_ext's GRU."""
    weights = list(module.parameters())  # registered in nn.GRU's flat order: layer, direction, ih, hh
    packed = isinstance(input, PackedSequence)
    data = input.data if packed else input
    batch = int(input.batch_sizes[0]) if packed else data.shape[0 if module.batch_first else 1]
    if hx is None:
        hx = data.new_zeros((module.num_layers * module.dirs, batch, module.hidden_size))
    elif packed and input.sorted_indices is not None:
        hx = hx.index_select(1, input.sorted_indices)
    if not packed:
        return torch._VF.gru(data, hx, weights, module.bias, module.num_layers, 0.0, False, module.bidirectional,
                             module.batch_first)
    out, h_n = torch._VF.gru(data, input.batch_sizes, hx, weights, module.bias, module.num_layers, 0.0, False,
                             module.bidirectional)
    if input.unsorted_indices is not None:
        h_n = h_n.index_select(1, input.unsorted_indices)
    return PackedSequence(out, input.batch_sizes, input.sorted_indices, input.unsorted_indices), h_n


def call(key: int, input: Any, hx: Any) -> tuple[Any, Any]:
    """The forward of the module numbered ``key`` as the op, a ``PackedSequence`` rebuilt around
    the op's output."""
    if isinstance(input, PackedSequence):
        data, h_n = gru(key, input.data, hx, input.batch_sizes, input.sorted_indices, input.unsorted_indices)
        return PackedSequence(data, input.batch_sizes, input.sorted_indices, input.unsorted_indices), h_n
    return gru(key, input, hx, None, None, None)
