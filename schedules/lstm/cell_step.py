"""The LSTM's unfused step (``fuse_step`` 0): per step the hidden GEMM ``gh = h·W_hᵀ + b_h`` (the
GEMM template batched over directions, knobs ``hid_*``; a 16-bit LSTM's on an mma.sync tile on
CUDA) and the cell kernel (knob ``cell_block``), h and c each ping-ponging between two buffers
(``p0``/``p1``, ``k0``/``k1``).  Where the batch is large the hidden products are a GEMM the
tensor cores run faster than the fused step kernel's CUDA cores (the GRU's rule, ``pick``).

The cell kernel: grid (batch, dirs), ``cell_block`` threads striding over the units; c' (block
"cell"), then h' from it (block "cell_h"), then the stores of h', c', out[t], h_n and c_n (the
backward direction reads and writes step T-1-s).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm_ext.core.space import Config
from tvm_ext.schedules.gru.cell_step import schedule_cell
from tvm_ext.schedules.gru.knobs import gemm_config
from tvm_ext.schedules.gru.step_common import lstm_c, lstm_h
from tvm_ext.schedules.gru.step_variant import StepSizes, StepVariant
from tvm_ext.target import TargetInfo


def lstm_cell_func(steps: int, batch: int, hidden: int, dirs: int, layers: int, gi_dtype: str, gh_dtype: str,
                   h_dtype: str, math_dtype: str, out_dtype: str, kind: str = "cuda", lengths: bool = False) -> Any:
    """The cell of step ``step`` of ``layer``: c' and h' from gi (step s; T-1-s backward), gh and c;
    writes h' (``h_out``, out[t], h_n) and c' (``c_out``, c_n), the math in ``math_dtype``.
    ``lengths``: the kernel also takes h and each row's length; a row at a time t >= its length
    keeps h and c and writes zeros to out (a ``PackedSequence``'s semantics: the forward state
    stops at the row's last step, the backward one starts there)."""
    from tvm.script import tirx as T

    G = 4 * hidden

    @T.macro
    def gates(gi, gh, c, step, c_new, h_new):  # type: ignore[no-untyped-def]
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("cell"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                row = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step) * batch + vb)
                col = T.meta_var(vd * G + vj)
                c_new[vd, vb, vj] = lstm_c(T, gi[row, col], gi[row, col + hidden], gi[row, col + 2 * hidden],
                                           gh[vd, vb, vj], gh[vd, vb, hidden + vj], gh[vd, vb, 2 * hidden + vj],
                                           c[vd, vb, vj], math_dtype, kind, h_dtype)
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("cell_h"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                row = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step) * batch + vb)
                h_new[vd, vb, vj] = lstm_h(T, gi[row, vd * G + 3 * hidden + vj], gh[vd, vb, 3 * hidden + vj],
                                           c_new[vd, vb, vj], math_dtype, kind, h_dtype)

    if lengths:  # (a second signature: a prim_func's parameters cannot be optional)
        @T.prim_func(s_tir=True)
        def cell_lengths(gi: T.Buffer((steps * batch, dirs * G), gi_dtype), gh: T.Buffer((dirs, batch, G), gh_dtype),
                         c: T.Buffer((dirs, batch, hidden), h_dtype), h: T.Buffer((dirs, batch, hidden), h_dtype),
                         row_lengths: T.Buffer((batch,), "int32"), step: T.int32, layer: T.int32,
                         h_out: T.Buffer((dirs, batch, hidden), h_dtype),
                         c_out: T.Buffer((dirs, batch, hidden), h_dtype),
                         out: T.Buffer((steps * batch, dirs * hidden), out_dtype),
                         h_n: T.Buffer((layers * dirs, batch, hidden), h_dtype),
                         c_n: T.Buffer((layers * dirs, batch, hidden), h_dtype)):
            T.func_attr({"tirx.noalias": True})
            c_new = T.sblock_alloc_buffer((dirs, batch, hidden), math_dtype)
            h_new = T.sblock_alloc_buffer((dirs, batch, hidden), math_dtype)
            gates(gi, gh, c, step, c_new, h_new)
            for d, b, j in T.grid(dirs, batch, hidden):
                with T.sblock("store"):
                    vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                    t = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step))
                    live = T.meta_var(t < row_lengths[vb])  # else the row keeps h and c and writes zeros
                    h_next = T.meta_var(T.if_then_else(live, h_new[vd, vb, vj].astype(h_dtype), h[vd, vb, vj]))
                    c_next = T.meta_var(T.if_then_else(live, c_new[vd, vb, vj].astype(h_dtype), c[vd, vb, vj]))
                    h_out[vd, vb, vj] = h_next
                    c_out[vd, vb, vj] = c_next
                    out[t * batch + vb, vd * hidden + vj] = T.if_then_else(
                        live, h_new[vd, vb, vj].astype(out_dtype), T.cast(0, out_dtype))
                    h_n[layer * dirs + vd, vb, vj] = h_next
                    c_n[layer * dirs + vd, vb, vj] = c_next

        return cell_lengths

    @T.prim_func(s_tir=True)
    def cell(gi: T.Buffer((steps * batch, dirs * G), gi_dtype), gh: T.Buffer((dirs, batch, G), gh_dtype),
             c: T.Buffer((dirs, batch, hidden), h_dtype), step: T.int32, layer: T.int32,
             h_out: T.Buffer((dirs, batch, hidden), h_dtype), c_out: T.Buffer((dirs, batch, hidden), h_dtype),
             out: T.Buffer((steps * batch, dirs * hidden), out_dtype),
             h_n: T.Buffer((layers * dirs, batch, hidden), h_dtype),
             c_n: T.Buffer((layers * dirs, batch, hidden), h_dtype)):
        T.func_attr({"tirx.noalias": True})
        c_new = T.sblock_alloc_buffer((dirs, batch, hidden), math_dtype)
        h_new = T.sblock_alloc_buffer((dirs, batch, hidden), math_dtype)
        gates(gi, gh, c, step, c_new, h_new)
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("store"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                row = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step) * batch + vb)
                h_out[vd, vb, vj] = h_new[vd, vb, vj].astype(h_dtype)
                c_out[vd, vb, vj] = c_new[vd, vb, vj].astype(h_dtype)
                out[row, vd * hidden + vj] = h_new[vd, vb, vj].astype(out_dtype)
                h_n[layer * dirs + vd, vb, vj] = h_new[vd, vb, vj].astype(h_dtype)
                c_n[layer * dirs + vd, vb, vj] = c_new[vd, vb, vj].astype(h_dtype)

    return cell


@dataclass(frozen=True)
class LstmCellStep(StepVariant):
    """Per step the hidden GEMM (``hid_*`` knobs) then the LSTM's cell kernel (``cell_block`` threads)."""

    block: int  # cell_block
    hidden_gemm: Any  # the hidden GEMM's template (a ``BiasGemmTemplate`` batched over directions)
    gemm_knobs: Config  # the hid_* knobs
    lengths: bool = False  # each row stops at its own length (the plan's input ``lengths``)

    unshown_prefixes = ("step_",)
    runs_hidden_gemm = True

    @classmethod
    def of(cls, sizes: StepSizes, c: Config, hidden_gemm: Any, lengths: bool = False) -> "LstmCellStep":
        return cls(sizes, block=c.cell_block, hidden_gemm=hidden_gemm,
                   gemm_knobs=Config(tuple((k, v) for k, v in c.items if k.startswith("hid_"))), lengths=lengths)

    def reason(self, target: TargetInfo) -> str | None:
        return None  # the hidden GEMM's tile is checked with the input GEMM's (``LstmTemplate.space``)

    def scheduled_kernels(self, target: TargetInfo) -> dict[str, Any]:
        s = self.sizes
        cell = lstm_cell_func(s.seq, s.batch, s.hidden, s.dirs, s.layers, s.gi_dtype, s.gh_dtype, s.h_dtype,
                              s.math_dtype, s.out_dtype, target.kind, self.lengths)
        gemm = gemm_config(self.gemm_knobs, "hid_", self.hidden_gemm.default_config(target))
        return {"lstm_gemm_h": self.hidden_gemm.schedule(gemm, target),
                "lstm_cell": schedule_cell(cell, min(self.block, target.max_threads_per_block))}

    def state_args(self, layer: int) -> tuple[str | int, ...]:
        return ("h0", "c0", layer, "p0", "k0")

    def step_calls(self, layer: int, out: str) -> list[tuple[str, tuple[str | int, ...]]]:
        calls = []
        for s in range(self.sizes.seq):
            now, then = s % 2, (s + 1) % 2
            calls.append(("lstm_gemm_h", (f"p{now}", f"w_hh{layer}", f"b_hh{layer}", "gh")))
            held = (f"p{now}", "lengths") if self.lengths else ()  # a row past its length keeps h and c
            calls.append(("lstm_cell", ("gi", "gh", f"k{now}", *held, s, layer, f"p{then}", f"k{then}", out, "h_n",
                                        "c_n")))
        return calls
