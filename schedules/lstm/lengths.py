"""Variable-length batches on the LSTM's fused step kernels: each batch row stops at its own
length, as ``torch.nn.LSTM`` runs a ``PackedSequence`` (outputs past a length zero, h_n and
c_n the row's state after its last step, the backward direction starting at the row's last
step from h0 and c0).

How: the GRU's hold (``schedules.gru.lengths``) with the LSTM's gates.  After a layer's input
GEMM, ``lstm_hold`` sets gi wherever t >= length to ``LSTM_HELD``: i's sum -HOLD and f's +HOLD,
so i = 0 and f = 1 exactly and c' = f·c + i·g = c; o's -HOLD, so o = 0 and h' = o·tanh(c) = 0;
g's 0 (finite whatever the padding was).  c therefore stops at the row's last step, and the
outputs past a length come out zero from the step kernel itself.  h does not stop (it is 0 past
the length), so two things are put back:

- the forward h_n: ``lstm_last_h`` copies each row's output at its last step into h_n;
- the backward direction's h0: its held steps come first and leave h at 0 (c at c0), so its
  first real step (t = length - 1) would miss W_hh·h0.  ``lstm_h0_products`` computes
  h0·W_hhᵀ for the backward direction and ``lstm_inject`` adds it into that step's gi row
  (rows of length T have no held step and are left alone).

Every step kernel family runs unchanged; the unfused steps keep their own hold (``cell_step``).
"""
from __future__ import annotations

from typing import Any

from tvm_ext.schedules.gru.lengths import HOLD, LENGTHS_DTYPE

from .compute import GATES

# i, f, g, o: i = 0 and f = 1 keep c; o = 0 makes h and the output 0
LSTM_HELD = (-HOLD, HOLD, 0.0, -HOLD)
H0_ROWS = 8  # batch rows of h0 a thread of ``lstm_h0_products`` multiplies by each W_hh value it loads


def last_h_func(steps: int, batch: int, hidden: int, dirs: int, layers: int, dtype: str) -> Any:
    """h_n of layer ``layer``'s forward direction: each row's output at its last step
    (``lengths[b] - 1``) from the layer's output ``y`` (forward half first)."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def last_h(lengths: T.Buffer((batch,), LENGTHS_DTYPE), y: T.Buffer((steps * batch, dirs * hidden), dtype),
               layer: T.int32, h_n: T.Buffer((layers * dirs, batch, hidden), dtype)):
        T.func_attr({"tirx.noalias": True})
        for b, j in T.grid(batch, hidden):
            with T.sblock("last_h"):
                vb, vj = T.axis.remap("SS", [b, j])
                h_n[layer * dirs, vb, vj] = y[(lengths[vb] - 1) * batch + vb, vj]

    return last_h


def h0_products_func(batch: int, hidden: int, layers: int, dtype: str) -> Any:
    """gh[1] = h0·W_hhᵀ of layer ``layer``'s backward direction in float32 (no bias: the step
    kernel adds b_hh), into the unfused steps' hidden products buffer."""
    from tvm.script import tirx as T

    G = GATES * hidden

    @T.prim_func(s_tir=True)
    def h0_products(h0: T.Buffer((layers * 2, batch, hidden), dtype), w_hh: T.Buffer((2, hidden, G), dtype),
                    layer: T.int32, gh: T.Buffer((2, batch, G), "float32")):
        T.func_attr({"tirx.noalias": True})
        for b, c, k in T.grid(batch, G, hidden):
            with T.sblock("h0_products"):
                vb, vc, vk = T.axis.remap("SSR", [b, c, k])
                with T.init():
                    gh[1, vb, vc] = T.float32(0)
                gh[1, vb, vc] = gh[1, vb, vc] + (T.Cast("float32", h0[layer * 2 + 1, vb, vk])
                                                 * T.Cast("float32", w_hh[1, vk, vc]))

    return h0_products


def inject_func(steps: int, batch: int, hidden: int) -> Any:
    """gi's backward gates at each row's first real step (t = lengths[b] - 1) plus gh[1] (the
    backward h0's products), for rows shorter than ``steps``."""
    from tvm.script import tirx as T

    G = GATES * hidden

    @T.prim_func(s_tir=True)
    def inject(lengths: T.Buffer((batch,), LENGTHS_DTYPE), gh: T.Buffer((2, batch, G), "float32"),
               gi: T.Buffer((steps * batch, 2 * G), "float32")):
        T.func_attr({"tirx.noalias": True})
        for b, c in T.grid(batch, G):
            with T.sblock("inject"):
                vb, vc = T.axis.remap("SS", [b, c])
                # gi's own element read back: said as written only, so the block stays a spatial one
                T.reads(lengths[vb], gh[1, vb, vc])
                T.writes(gi[0:steps * batch, G + vc])
                if lengths[vb] < steps:
                    gi[(lengths[vb] - 1) * batch + vb, G + vc] = gi[(lengths[vb] - 1) * batch + vb, G + vc] + \
                        gh[1, vb, vc]

    return inject


def schedule_h0_products(func: Any, batch: int, threads: int) -> Any:
    """A thread per gate column and ``H0_ROWS`` batch rows (each W_hh value loaded once for
    them, the columns coalesced), the sums in registers."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    block = sch.get_sblock("h0_products")
    b, c, k = sch.get_loops(block)
    rows = min(H0_ROWS, batch)
    bo, bi = sch.split(b, [None, rows])
    sch.reorder(bo, c, k, bi)
    bx, tx = sch.split(sch.fuse(bo, c), [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, tx)
    sch.decompose_reduction(block, k)
    sch.unroll(bi)
    return sch
