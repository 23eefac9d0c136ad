"""The unfused step (``fuse_step`` 0): per step the hidden GEMM ``gh = h·W_hᵀ + b_h`` (S2,
the GEMM template batched over directions, knobs ``hid_*``; with ``hid_wgmma`` a wgmma kernel
written as loops) and the cell kernel (S3+S4, knob ``cell_block``), the state ping-ponging
between two buffers; with ``hid_cell`` the cell runs in the wgmma kernel's store instead
(``cell_epilogue.py``), one kernel a step; a float32 GRU's there on TF32 parts of h and W_hh (the
parts of W_hh made once as the weights are loaded, h's by the cell for the next step).

The cell kernel, gate order r, z, n as in PyTorch: grid (batch, dirs), block ``cell_block``
threads: r, z, n, h' and the writes of h' (the backward direction walks time in reverse, so it
reads and writes step T-1-s).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm_ext.core.space import Config
from tvm_ext.schedules.gemm.wgmma import WgmmaTile
from tvm_ext.target import TargetInfo

from .cell_epilogue import cell_tile, hidden_gemm, split_hidden_weight_func, split_state_func, tf32_parts
from .compute import F32
from .knobs import gemm_config
from .step_common import cell_math, store_macro
from .step_variant import StepSizes, StepVariant


def cell_func(steps: int, batch: int, hidden: int, dirs: int, layers: int, gi_dtype: str = F32,
              gh_dtype: str = F32, h_dtype: str = F32, math_dtype: str = F32, out_dtype: str = F32,
              kind: str = "cuda") -> Any:
    """S3+S4: h' from gi (step s; T-1-s backward), gh and h; writes h', out[t] and h_n[layer].

    The math is in ``math_dtype``; h', h_n are stored as ``h_dtype``, out[t] as ``out_dtype``."""
    from tvm.script import tirx as T

    G = 3 * hidden
    store = store_macro(steps, batch, hidden, dirs, h_dtype, out_dtype)

    @T.prim_func(s_tir=True)
    def cell(gi: T.Buffer((steps * batch, dirs * G), gi_dtype), gh: T.Buffer((dirs, batch, G), gh_dtype),
             h: T.Buffer((dirs, batch, hidden), h_dtype), step: T.int32, layer: T.int32,
             h_out: T.Buffer((dirs, batch, hidden), h_dtype),
             out: T.Buffer((steps * batch, dirs * hidden), out_dtype),
             h_n: T.Buffer((layers * dirs, batch, hidden), h_dtype)):
        T.func_attr({"tirx.noalias": True})
        h_new = T.sblock_alloc_buffer((dirs, batch, hidden), math_dtype)
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("cell"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                row = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step) * batch + vb)
                col = T.meta_var(vd * G + vj)
                h_new[vd, vb, vj] = cell_math(T, gi[row, col], gi[row, col + hidden], gi[row, col + 2 * hidden],
                                               gh[vd, vb, vj], gh[vd, vb, hidden + vj], gh[vd, vb, 2 * hidden + vj],
                                               h[vd, vb, vj], math_dtype, kind, h_dtype)
        store(h_new, step, layer, h_out, out, h_n)

    return cell


def schedule_cell(func: Any, cell_block: int) -> Any:
    """Grid (batch, dirs), ``cell_block`` threads striding over the hidden units (also the LSTM's
    cell kernel, ``schedules.lstm.cell_step``: c' and h' each in registers)."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    store = sch.get_sblock("store")
    d, b, j = sch.get_loops(store)
    jo, ji = sch.split(j, [None, cell_block])
    sch.reorder(b, d, jo, ji)
    sch.bind(b, "blockIdx.x")
    sch.bind(d, "blockIdx.y")
    sch.bind(ji, "threadIdx.x")
    for name in ("cell_h", "cell"):  # (the LSTM's h' from c' first: a block goes under its consumers' loop)
        if name == "cell" or any(sch.get(b).name_hint == name for b in sch.get_producers(store)):
            block = sch.get_sblock(name)
            sch.compute_at(block, ji)
            sch.set_scope(block, 0, "local")
    return sch




@dataclass(frozen=True)
class CellStep(StepVariant):
    """Per step the hidden GEMM (``hid_*`` knobs; on ``wgmma`` where ``hid_wgmma`` is 1) then the
    cell kernel (``cell_block`` threads)."""

    block: int  # cell_block
    hidden_gemm: Any  # the hidden GEMM's template (a ``BiasGemmTemplate``)
    gemm_knobs: Config  # the hid_* knobs
    wgmma: WgmmaTile | None = None  # the hidden GEMM's wgmma tile where hid_wgmma is 1 (else a schedule)
    cell_in_gemm: bool = False  # hid_cell: the cell in that GEMM's store, one kernel a step (``cell_epilogue``)
    transposed: bool = False  # hid_cell_bt: a 16-bit W_hh read from its copy transposed in tile order

    unshown_prefixes = ("step_",)
    runs_hidden_gemm = True

    @classmethod
    def of(cls, sizes: StepSizes, c: Config, hidden_gemm: Any, hidden_wgmma: WgmmaTile | None = None) -> "CellStep":
        return cls(sizes, block=c.cell_block, hidden_gemm=hidden_gemm,
                   gemm_knobs=Config(tuple((k, v) for k, v in c.items if k.startswith("hid_"))),
                   wgmma=(cell_tile(hidden_wgmma, sizes.hidden, c.hid_cell, bool(c.hid_cell_share), c.hid_cell_units)
                          if c.hid_cell
                          else hidden_wgmma)
                   if c.hid_wgmma and hidden_wgmma is not None else None,
                   cell_in_gemm=bool(c.hid_cell), transposed=bool(c.hid_cell_bt))

    @property
    def parts(self) -> bool:
        """Whether the hidden GEMM runs on TF32 parts of h and W_hh (a float32 GRU's)."""
        return self.wgmma is not None and tf32_parts(self.wgmma)

    def reason(self, target: TargetInfo) -> str | None:
        return None  # the hidden GEMM's tile is checked with the other GEMMs (wgmma's: ``hidden_wgmma_reason``)

    def scheduled_kernels(self, target: TargetInfo) -> dict[str, Any]:
        s = self.sizes
        cell = cell_func(s.seq, s.batch, s.hidden, s.dirs, s.layers, gi_dtype=s.gi_dtype, gh_dtype=s.gh_dtype,
                         h_dtype=s.h_dtype, math_dtype=s.math_dtype, out_dtype=s.out_dtype, kind=target.kind)
        kernels = {}
        if self.wgmma is None:  # else written as loops (``lowered_kernels``)
            gemm = gemm_config(self.gemm_knobs, "hid_", self.hidden_gemm.default_config(target))
            kernels["gru_gemm_h"] = self.hidden_gemm.schedule(gemm, target)
        if not self.cell_in_gemm:
            kernels["gru_cell"] = schedule_cell(cell, min(self.block, target.max_threads_per_block))
        return kernels

    def lowered_kernels(self) -> dict[str, Any]:
        """The hidden GEMM on wgmma (``hid_wgmma``; ``cell_epilogue.hidden_gemm``), with the cell in
        its store where ``hid_cell``."""
        if self.wgmma is None:
            return {}
        name = "gru_gemm_cell" if self.cell_in_gemm else "gru_gemm_h"
        s = self.sizes
        kernels = {name: hidden_gemm(self.wgmma, s, self.cell_in_gemm, self.transposed)}
        if self.parts:  # W_hh's parts (as the weights are loaded), h0's (each layer's first step)
            kernels["gru_split_wh"] = split_hidden_weight_func(s.hidden, s.dirs, units=self.wgmma.bn // 3)
            kernels["gru_split_h"] = split_state_func(s.dirs, s.batch, s.hidden)
        elif self.transposed:  # W_hh transposed in tile order, as the weights are loaded
            kernels["gru_split_wh"] = split_hidden_weight_func(s.hidden, s.dirs, s.w_dtype, self.wgmma.bn // 3)
        return kernels

    def prepare_calls(self, layer: int) -> list[tuple[str, tuple[str | int, ...]]]:
        """W_hh's TF32 parts (float32 on TF32 parts) or its transposed copy (``transposed``), rows in
        tile order, into ``wh<layer>``."""
        return [("gru_split_wh", (f"w_hh{layer}", f"wh{layer}"))] if self.parts or self.transposed else []

    def state_args(self, layer: int) -> tuple[str | int, ...]:
        return ("h0", layer, "p0")

    def step_calls(self, layer: int, out: str) -> list[tuple[str, tuple[str | int, ...]]]:
        calls = [("gru_split_h", ("p0", "q0"))] if self.parts else []
        for s in range(self.sizes.seq):
            h_in, h_out = f"p{s % 2}", f"p{(s + 1) % 2}"
            if self.parts:  # A: h's TF32 parts, written beside h' by the cell
                calls.append(("gru_gemm_cell", (f"q{s % 2}", f"wh{layer}", f"b_hh{layer}", "gi", h_in, s, layer, h_out,
                                                 out, "h_n", f"q{(s + 1) % 2}")))
                continue
            if self.cell_in_gemm:
                weight = f"wh{layer}" if self.transposed else f"w_hh{layer}"
                calls.append(("gru_gemm_cell", (h_in, weight, f"b_hh{layer}", "gi", h_in, s, layer, h_out, out, "h_n")))
                continue
            calls.append(("gru_gemm_h", (h_in, f"w_hh{layer}", f"b_hh{layer}", "gh")))
            calls.append(("gru_cell", ("gi", "gh", h_in, s, layer, h_out, out, "h_n")))
        return calls
