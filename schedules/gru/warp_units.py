"""What the small-batch persistent step kernels share (``flag_step.py``, ``cluster_step.py``): a
warp per hidden unit, its 32 lanes splitting k (lane l takes k = l, l+32, ...), each lane's share of
W_hh (3 gates) in registers for all T steps, partial dot products over a row of h in shared memory,
a butterfly of shuffles that leaves every lane with every sum, and the cell of one row per lane.
The kernels differ in how h goes between blocks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm_ext.precision.precision import itemsize
from tvm_ext.schedules.gemm.warp_tile import WARP
from tvm_ext.target import TargetInfo

from .step_common import cell_gates, stored_as


UNITS = (4, 8, 16, 32)  # hidden units per block, a warp each
MAX_ROWS = WARP  # a lane per row runs the cell


@dataclass(frozen=True)
class WarpUnitShape:
    """``units`` hidden units a block, a warp each, for one GRU shape."""

    batch: int
    hidden: int
    dirs: int
    units: int
    w_dtype: str
    gate_count: int = 3  # a unit's gates (the LSTM's 4)

    @property
    def k_per_lane(self) -> int:
        return -(-self.hidden // WARP)

    @property
    def threads(self) -> int:
        return WARP * self.units

    def w_registers(self) -> int:
        """32-bit registers of a lane's W_hh share (``gates`` x ``k_per_lane``)."""
        return self.gate_count * self.k_per_lane * max(1, itemsize(self.w_dtype) // 4)

    def tile_reason(self, kernel: str) -> str | None:
        """Why ``kernel`` (its name in messages) cannot take these units and rows."""
        if self.units not in UNITS:
            return f"{kernel}: {self.units} units per block; allowed: {UNITS}"
        if self.batch > MAX_ROWS:
            return f"{kernel}: batch {self.batch} > {MAX_ROWS} (one lane per row runs the cell)"
        return None

    def block_reason(self, kernel: str, target: TargetInfo, shared_bytes: int, what: str) -> str | None:
        """Why a block of ``kernel`` does not fit ``target``: its threads, or ``what`` (h as it
        is held) in ``shared_bytes`` of static shared memory."""
        if self.threads > target.max_threads_per_block:
            return f"{kernel}: {self.threads} threads > device limit {target.max_threads_per_block}"
        if shared_bytes > target.max_shared_memory_per_block:
            return (f"{kernel}: {what} in shared memory needs {shared_bytes} B > "
                    f"{target.max_shared_memory_per_block} B of static shared memory a block")
        return None


@dataclass(frozen=True)
class WarpUnitMath:
    """The TIR macros of the shared math for one kernel's sizes and types.  ``cell_lanes``:
    the lanes that run a cell, lane l the row l % batch (``batch``: lane b runs row b)."""

    steps: int
    batch: int
    hidden: int
    dirs: int
    k_per_lane: int
    h_dtype: str
    w_dtype: str
    gi_dtype: str
    acc_dtype: str
    gh_dtype: str
    math_dtype: str
    cell_lanes: int
    gate_count: int = 3  # a unit's gates (the LSTM's 4)

    @property
    def row_padded(self) -> int:
        """A row of h in shared memory: ``k_per_lane`` x 32 words, zero past the hidden size."""
        return self.k_per_lane * WARP

    def row_of(self, tx: Any) -> Any:
        """The batch row whose cell lane ``tx`` runs."""
        return tx if self.cell_lanes == self.batch else tx % self.batch

    def gates(self, sums: Any, b_h: Any, gi_reg: Any) -> tuple[Any, Any]:
        """z and n of a lane's (row, unit), gh as the hidden GEMM would store it.  A kernel keeps
        z and then h' (``cell_blend``) in registers, so that no store recomputes them (nvcc did
        not merge such copies in the tensor-core kernel, ``step_common.cell_gates``)."""
        from tvm.script import tirx as T

        gh = [stored_as(sums[g] + b_h[g].astype(self.acc_dtype), self.gh_dtype) for g in range(3)]
        return cell_gates(T, gi_reg[0], gi_reg[1], gi_reg[2], *gh, self.math_dtype, state=self.h_dtype)

    def macros(self) -> tuple[Any, Any, Any, Any]:
        """(load_w, load_gi, gate_sums, select_row): the lane's W_hh share once; its row's gi of
        a step into registers; every lane's gates x batch sums over the rows of h in shared memory
        from word ``base`` on (``gate_sums(acc, w_r, h_s, base, tx)``); each gate's sum of the
        lane's own row into ``sums``."""
        from tvm.script import tirx as T

        steps, batch, hidden, dirs, KP, HP = (self.steps, self.batch, self.hidden, self.dirs, self.k_per_lane,
                                              self.row_padded)
        G, gi_dtype, w_dtype, acc_dtype, cell_lanes = self.gate_count * hidden, self.gi_dtype, self.w_dtype, \
            self.acc_dtype, self.cell_lanes
        gates = self.gate_count
        row_of = self.row_of

        @T.macro
        def load_w(w, w_r, bz, j, tx):  # type: ignore[no-untyped-def]
            # w_r[g * KP + i] = W[k = tx + 32 i, g * H + j]
            for g in T.unroll(gates):
                for i in T.unroll(KP):
                    k = T.meta_var(tx + i * WARP)
                    w_r[g * KP + i] = T.if_then_else(k < hidden and j < hidden,
                                                     w[bz, T.min(k, hidden - 1), g * hidden + T.min(j, hidden - 1)],
                                                     T.cast(0, w_dtype))

        @T.macro
        def load_gi(gi, gi_reg, step, bz, j, tx):  # type: ignore[no-untyped-def]
            t_row = T.meta_var(T.if_then_else(bz == 0, step, steps - 1 - step))
            for g in T.unroll(gates):
                gi_reg[g] = T.if_then_else(tx < cell_lanes and j < hidden,
                                           gi[T.min(t_row * batch + row_of(tx), steps * batch - 1),
                                              T.min(bz * G + g * hidden + j, dirs * G - 1)],
                                           T.cast(0, gi_dtype))

        @T.macro
        def dot_products(acc, w_r, h_s, at, b, i):  # type: ignore[no-untyped-def]
            for g in T.unroll(gates):
                acc[g * batch + b] = acc[g * batch + b] + T.cast(w_r[g * KP + i], acc_dtype) * T.cast(
                    h_s[at], acc_dtype)

        butterfly = self._butterfly_macro()

        @T.macro
        def gate_sums(acc, w_r, h_s, base, tx):  # type: ignore[no-untyped-def]
            for b in T.unroll(batch):
                for g in T.unroll(gates):
                    acc[g * batch + b] = T.cast(0, acc_dtype)
                for i in T.unroll(KP):
                    dot_products(acc, w_r, h_s, base + b * HP + tx + i * WARP, b, i)
            butterfly(acc)

        return load_w, load_gi, gate_sums, self._select_row_macro()

    def _select_row_macro(self) -> Any:
        """``select_row(sums, acc, tx)``: each gate's sum of the lane's own row, from every lane's
        3 x batch sums."""
        from tvm.script import tirx as T

        batch, row_of, gates = self.batch, self.row_of, self.gate_count

        @T.macro
        def select_row(sums, acc, tx):  # type: ignore[no-untyped-def]
            for g in T.unroll(gates):  # every lane runs one cell: its row's sums selected
                sums[g] = acc[g * batch]
                for b in T.unroll(1, batch):
                    sums[g] = T.if_then_else(row_of(tx) == b, acc[g * batch + b], sums[g])

        return select_row

    def _butterfly_macro(self) -> Any:
        """``butterfly(acc)``: the 3 x batch partial sums of every lane added over the warp."""
        from tvm import tirx
        from tvm.script import tirx as T

        batch, acc_dtype, full, gates = self.batch, self.acc_dtype, tirx.const(0xFFFFFFFF, "uint32"), self.gate_count

        @T.macro
        def butterfly(acc):  # type: ignore[no-untyped-def]
            for r in T.unroll(5):  # xor 16, 8, 4, 2, 1: every lane ends with every sum
                for v in T.unroll(gates * batch):
                    acc[v] = acc[v] + T.call_extern(acc_dtype, "__shfl_xor_sync", full, acc[v],
                                                    T.shift_right(16, r), WARP)

        return butterfly

    def input_macros(self, k_in: int, x_dtype: str, w_ih_dtype: str) -> tuple[Any, Any, Any]:
        """(load_w_ih, load_x, input_gates): a kernel that runs the input GEMM itself.  The lane's
        share of W_ih (k = lane, lane + 32, ... of its unit's three gate columns) and of b_ih once
        (``load_w_ih(w_ih, b_ih, wi_r, b_i, bz, j, tx)``); every row's x of a step at the lane's k
        into registers (``load_x(x_in, x_r, step, bz, tx)``); from them each gate's x·W_ihᵀ + b_ih
        of the lane's row into ``gi_reg`` in the gi type (``input_gates(acc, x_r, wi_r, b_i,
        gi_reg, sums, tx)``: every lane takes part, its shuffles are the warp's)."""
        from tvm.script import tirx as T

        steps, batch, hidden, gi_dtype, acc_dtype = self.steps, self.batch, self.hidden, self.gi_dtype, self.acc_dtype
        gates = self.gate_count
        G, KI = gates * hidden, -(-k_in // WARP)
        butterfly, select_row = self._butterfly_macro(), self._select_row_macro()

        @T.macro
        def load_w_ih(w_ih, b_ih, wi_r, b_i, bz, j, tx):  # type: ignore[no-untyped-def]
            for g in T.unroll(gates):
                col = T.meta_var(bz * G + g * hidden + T.min(j, hidden - 1))
                b_i[g] = T.if_then_else(j < hidden, T.cast(b_ih[col], "float32"), T.float32(0))
                for i in T.unroll(KI):
                    k = T.meta_var(tx + i * WARP)
                    wi_r[g * KI + i] = T.if_then_else(k < k_in and j < hidden, w_ih[T.min(k, k_in - 1), col],
                                                      T.cast(0, w_ih_dtype))

        @T.macro
        def load_x(x_in, x_r, step, bz, tx):  # type: ignore[no-untyped-def]
            t_row = T.meta_var(T.if_then_else(bz == 0, step, steps - 1 - step))
            for b in T.unroll(batch):
                for i in T.unroll(KI):
                    k = T.meta_var(tx + i * WARP)
                    x_r[b * KI + i] = T.if_then_else(k < k_in, x_in[t_row * batch + b, T.min(k, k_in - 1)],
                                                     T.cast(0, x_dtype))

        @T.macro
        def input_gates(acc, x_r, wi_r, b_i, gi_reg, sums, tx):  # type: ignore[no-untyped-def]
            for b in T.unroll(batch):
                for g in T.unroll(gates):
                    acc[g * batch + b] = T.cast(0, acc_dtype)
                    for i in T.unroll(KI):
                        acc[g * batch + b] = acc[g * batch + b] + T.cast(wi_r[g * KI + i], acc_dtype) * T.cast(
                            x_r[b * KI + i], acc_dtype)
            butterfly(acc)
            select_row(sums, acc, tx)
            for g in T.unroll(gates):
                gi_reg[g] = T.cast(T.cast(sums[g], "float32") + b_i[g], gi_dtype)

        return load_w_ih, load_x, input_gates
