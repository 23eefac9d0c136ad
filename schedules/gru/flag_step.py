"""The persistent GRU step kernel for small batches that needs no grid barrier (knob
``step_flags``): every block writes its h' of step s as 8-byte words (the value's float32
bits, the step s+1 as a tag) with one relaxed 64-bit store each, and the next step reads
the words themselves until every tag says s+1.

Why: at a batch of a few rows a step is a few hundred nanoseconds of math, and a grid
barrier (fence, arrive on a counter, poll it, then load h) costs two L2 round trips more
than the data needs; polling the data, whose tag comes in the same single-copy-atomic
word, costs one (the hand-written CUDA C of ``benchmarks/probes/gru_flag_probe.py`` measured both;
figures in ``docs/results/gru.md``).

A block owns ``units`` hidden units of one direction, all batch rows; a warp per unit, its
32 lanes splitting k (lane l takes k = l, l+32, ...), each lane's share of W_hh (3 gates)
in registers for all T steps.  Per step the block polls all of h (batch x hidden words,
slot s % 2 of ``hx``; up to ``POLL_WORDS`` a thread at once, in rounds past that) into
shared memory, each lane forms its partial dot products for every row, a butterfly of
shuffles sums them, and lane b (b < batch) runs the cell of row b: its gi was loaded into
registers a step ahead.  Two slots suffice: a block writes slot (s+1) % 2 only after
reading every block's h_s, which each block wrote after reading h_{s-1} from that slot.
Tags are never stale: ``gru_init`` writes slot 0 (h0, tag 0) and zeroes slot 1 before each
layer.  A lane that has polled ``SPIN_LIMIT`` times in all stops waiting and raises the
barrier flag (``bar[1]``), so a grid that is not resident gives an error record, never a
hang.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm_ext.cost_model.hardware import HardwareModel
from tvm_ext.precision.precision import itemsize
from tvm_ext.schedules.gemm.warp_tile import WARP
from tvm_ext.core.space import Config
from tvm_ext.lowering.step_loop import BARRIER_WORDS, NV_ATOMIC_RELAXED, NV_SCOPE_DEVICE, SPIN_LIMIT
from tvm_ext.target import TargetInfo

from .step_common import (CELL_GATES, GRU_CELL, LSTM_CELL, MAX_REGISTERS, OTHER_REGISTERS, cell_blend, float_word,
                          lstm_c, lstm_h, state_width, stored_as, word_float, word_tag)
from .step_variant import (CLUSTER_STEP_KNOBS, SIMT_STEP_KNOBS, TC_STEP_KNOBS, StepSizes, StepVariant,
                           fused_threads_reason, input_buffer, residency)
from .warp_units import UNITS, WarpUnitMath, WarpUnitShape

FLAG_UNITS = UNITS  # hidden units per block, a warp each
KERNEL = "flag-exchange step kernel"  # its name in messages
POLL_WORDS = 32  # h words a thread polls at once (64 registers); more are polled in rounds of this many


@dataclass(frozen=True)
class FlagStepShape(WarpUnitShape):
    """The sizes a flag-exchange step config implies for one GRU shape; ``input`` > 0: the
    depth of the input it projects itself (``step_flag_input``), W_ih's share of ``w_ih_dtype``."""

    input: int = 0
    w_ih_dtype: str = "float32"

    @property
    def k_input_per_lane(self) -> int:
        return -(-self.input // WARP)

    def input_registers(self) -> int:
        """32-bit registers of the input projection: W_ih's share, every row's x and their sums."""
        if not self.input:
            return 0
        return self.gate_count * self.k_input_per_lane * max(1, itemsize(self.w_ih_dtype) // 4) + \
            self.batch * self.k_input_per_lane + self.gate_count * self.batch + 6

    def input_registers_why(self) -> str:
        return (f", W_ih share {self.gate_count} x {self.k_input_per_lane} and x {self.batch} x {self.k_input_per_lane}"
                if self.input else "")

    @property
    def blocks(self) -> int:
        return -(-self.hidden // self.units) * self.dirs

    @property
    def words_per_thread(self) -> int:
        """h words each thread polls per step (all of h, spread over the block)."""
        return -(-self.batch * self.hidden // self.threads)

    @property
    def poll_words(self) -> int:
        """h words a thread polls at once: all of its words, or rounds of ``POLL_WORDS``."""
        return min(self.words_per_thread, POLL_WORDS)

    @property
    def poll_rounds(self) -> int:
        return -(-self.words_per_thread // self.poll_words)

    def registers(self) -> int:
        """32-bit registers a thread needs: its W share, the words it polls at once (64-bit),
        the accumulators (gates x rows) and the rest."""
        return (self.w_registers() + 2 * self.poll_words + self.gate_count * self.batch + OTHER_REGISTERS
                + self.input_registers())

    def shared_bytes(self) -> int:
        return self.batch * self.k_per_lane * WARP * 4


FusedInput = tuple[int, str, str]  # (input depth, its dtype, W_ih's dtype): the kernel runs x·W_ihᵀ + b_ih


def flag_step_func(steps: int, batch: int, hidden: int, dirs: int, layers: int, *, units: int, h_dtype: str,
                   w_dtype: str, gi_dtype: str, acc_dtype: str, gh_dtype: str, math_dtype: str, out_dtype: str,
                   fused_input: FusedInput | None = None, name: str = "gru_steps", cell: str = GRU_CELL) -> Any:
    """The persistent flag-exchange step kernel of one layer as a lowered PrimFunc:
    (gi, hs, w, bias, layer, out, h_n, bar, hx), the persistent step kernels' signature
    plus ``hx``, the (2, dirs, batch, hidden) uint64 words of h ``gru_init`` prepared; with
    ``fused_input`` (x_in, w_ih, b_ih, hs, ...): each step's gi computed in the kernel from the
    layer's input, W_ih and b_ih, with no input GEMM before it.  ``cell`` ``"lstm"``: the LSTM's
    four gates and cell, each cell lane keeping its (row, unit)'s c in a register for all T
    steps (no exchange: only that lane reads it), c0 read from and c_n's source written to the
    c half of the (2, dirs, batch, 2·hidden) state ``hs`` (``schedules/lstm/kernels.py``)."""
    from tvm.script import tirx as T

    k_in, x_dtype, w_ih_dtype = fused_input or (0, "float32", "float32")
    gates = CELL_GATES[cell]
    shape = FlagStepShape(batch, hidden, dirs, units, w_dtype, gates, input=k_in, w_ih_dtype=w_ih_dtype)
    G = gates * hidden
    math = WarpUnitMath(steps, batch, hidden, dirs, shape.k_per_lane, h_dtype, w_dtype, gi_dtype, acc_dtype,
                        gh_dtype, math_dtype, cell_lanes=batch, gate_count=gates)
    body = _body_macro(steps, shape, math, out_dtype, x_dtype, cell)
    hs_shape, w_shape, b_shape = (2, dirs, batch, state_width(cell, hidden)), (dirs, hidden, G), (dirs, G)
    out_shape, h_n_shape = (steps * batch, dirs * hidden), (layers * dirs, batch, hidden)
    hx_words = 2 * dirs * batch * hidden

    if fused_input is None:
        @T.prim_func(private=True)
        def kernel(gi: T.Buffer((steps * batch, dirs * G), gi_dtype), hs: T.Buffer(hs_shape, h_dtype),
                   w: T.Buffer(w_shape, w_dtype), bias: T.Buffer(b_shape, w_dtype), layer: T.int32,
                   out: T.Buffer(out_shape, out_dtype), h_n: T.Buffer(h_n_shape, h_dtype),
                   bar: T.Buffer((BARRIER_WORDS,), "int32"), hx: T.Buffer((hx_words,), "uint64")):
            T.func_attr({"tirx.noalias": True})
            body(gi, None, None, None, hs, w, bias, layer, out, h_n, bar, hx)

        return kernel.with_attr("global_symbol", name)

    @T.prim_func(private=True)
    def fused(x_in: T.Buffer((steps * batch, k_in), x_dtype), w_ih: T.Buffer((k_in, dirs * G), w_ih_dtype),
              b_ih: T.Buffer((dirs * G,), w_ih_dtype), hs: T.Buffer(hs_shape, h_dtype), w: T.Buffer(w_shape, w_dtype),
              bias: T.Buffer(b_shape, w_dtype), layer: T.int32, out: T.Buffer(out_shape, out_dtype),
              h_n: T.Buffer(h_n_shape, h_dtype), bar: T.Buffer((BARRIER_WORDS,), "int32"),
              hx: T.Buffer((hx_words,), "uint64")):
        T.func_attr({"tirx.noalias": True})
        body(None, x_in, w_ih, b_ih, hs, w, bias, layer, out, h_n, bar, hx)

    return fused.with_attr("global_symbol", name)


def _body_macro(steps: int, shape: FlagStepShape, math: WarpUnitMath, out_dtype: str, x_dtype: str,
                cell: str = GRU_CELL) -> Any:
    """The kernel's body: W_hh's share once, then per step the poll, the gate sums and the
    cell; gi of the next step loaded (or, where ``shape.input`` > 0, computed from x of
    ``x_dtype`` and W_ih's share while the other blocks' h is still on its way)."""
    from tvm.script import tirx as T

    batch, hidden, dirs, units = shape.batch, shape.hidden, shape.dirs, shape.units
    KP = shape.k_per_lane
    HP = KP * WARP  # a row of h in shared memory, zero past the hidden size
    threads, chunk = shape.threads, shape.poll_words
    grid_x = -(-hidden // units)
    n_words = batch * hidden
    h_dtype, w_dtype, gi_dtype, acc_dtype, math_dtype = (math.h_dtype, math.w_dtype, math.gi_dtype, math.acc_dtype,
                                                         math.math_dtype)
    load_w, load_gi, gate_sums, select_row = math.macros()
    projects_input, KI, w_ih_dtype = shape.input > 0, shape.k_input_per_lane, shape.w_ih_dtype  # x's k a lane takes
    load_w_ih, load_x, input_gates = math.input_macros(max(shape.input, 1), x_dtype, w_ih_dtype)
    gates, lstm = math.gate_count, cell == LSTM_CELL
    cell_math = _lstm_cell_macro(math, hidden) if lstm else _gru_cell_macro(math, HP)

    def value_of(word: Any) -> Any:
        return word_float(T, word)

    def packed(value: Any, tag: Any) -> Any:
        return float_word(T, value, tag)

    @T.macro
    def body(gi, x_in, w_ih, b_ih, hs, w, bias, layer, out, h_n, bar, hx):  # type: ignore[no-untyped-def]
        bx = T.launch_thread("blockIdx.x", grid_x)
        bz = T.launch_thread("blockIdx.y", dirs)
        tx = T.launch_thread("threadIdx.x", WARP)
        ty = T.launch_thread("threadIdx.y", units)
        h_s = T.alloc_buffer((batch * HP,), "float32", scope="shared")
        w_r = T.alloc_buffer((gates * KP,), w_dtype, scope="local")
        acc = T.alloc_buffer((gates * batch,), acc_dtype, scope="local")
        sums = T.alloc_buffer((gates,), acc_dtype, scope="local")
        got = T.alloc_buffer((chunk,), "uint64", scope="local")
        gi_reg = T.alloc_buffer((gates,), gi_dtype, scope="local")
        x_r = T.alloc_buffer((max(batch * KI, 1),), x_dtype, scope="local")  # fused input: x at the lane's k
        wi_r = T.alloc_buffer((max(gates * KI, 1),), w_ih_dtype, scope="local")  # and its share of W_ih
        b_i = T.alloc_buffer((gates,), "float32", scope="local")
        acc_x = T.alloc_buffer((gates * batch,), acc_dtype, scope="local")
        sums_x = T.alloc_buffer((gates,), acc_dtype, scope="local")
        b_h = T.alloc_buffer((gates,), "float32", scope="local")
        # the GRU cell's z, then h'; the LSTM's c (kept for all steps), then h': each computed once
        zh = T.alloc_buffer((3 if lstm else 2,), math_dtype, scope="local")
        poll = T.alloc_buffer((2,), "int32", scope="local")  # [polls so far, all tags seen]
        tid = T.meta_var(ty * WARP + tx)
        j = T.meta_var(bx * units + ty)
        load_w(w, w_r, bz, j, tx)  # the lane's W_hh share, once for all steps
        for it in T.unroll(-(-batch * HP // threads)):  # k past the hidden size stays zero
            if it * threads + tid < batch * HP:
                h_s[it * threads + tid] = T.float32(0)
        T.tvm_storage_sync("shared")  # where a row is padded, another thread's first poll writes these words
        for g in T.unroll(gates):
            b_h[g] = T.if_then_else(j < hidden, T.cast(bias[bz, g * hidden + T.min(j, hidden - 1)], "float32"),
                                    T.float32(0))
        if not projects_input:
            load_gi(gi, gi_reg, 0, bz, j, tx)
        else:  # W_ih's share once; gi of step 0 from x, and x of step 1 on its way
            load_w_ih(w_ih, b_ih, wi_r, b_i, bz, j, tx)
            load_x(x_in, x_r, 0, bz, tx)
            input_gates(acc_x, x_r, wi_r, b_i, gi_reg, sums_x, tx)
            if steps > 1:
                load_x(x_in, x_r, 1, bz, tx)
        if lstm and tx < batch and j < hidden:  # the lane's c0, kept in a register from here on
            zh[0] = T.cast(hs[0, bz, tx, hidden + j], math_dtype)
        poll[0] = 0
        for s in T.serial(steps):
            # every block's h_s, the words polled (``chunk`` at once) until each tag says s
            base = T.meta_var(((s % 2) * dirs + bz) * n_words)
            for c in T.unroll(shape.poll_rounds):
                poll[1] = 0
                while poll[1] == 0:
                    poll[1] = 1
                    for i in T.unroll(chunk):
                        if (c * chunk + i) * threads + tid < n_words:
                            got[i] = T.call_extern("uint64", "__nv_atomic_load_n",
                                                   T.address_of(hx[base + (c * chunk + i) * threads + tid]),
                                                   NV_ATOMIC_RELAXED, NV_SCOPE_DEVICE)
                    for i in T.unroll(chunk):
                        if (c * chunk + i) * threads + tid < n_words and word_tag(T, got[i]) != s:
                            poll[1] = 0
                    poll[0] = poll[0] + 1
                    if poll[0] >= SPIN_LIMIT:
                        poll[1] = 1
                for i in T.unroll(chunk):
                    f = T.meta_var((c * chunk + i) * threads + tid)
                    if f < n_words:
                        h_s[f // hidden * HP + f % hidden] = value_of(got[i])
            T.tvm_storage_sync("shared")
            gate_sums(acc, w_r, h_s, 0, tx)
            select_row(sums, acc, tx)  # lane b's row b
            if tx < batch and j < hidden:
                t_row = T.meta_var(T.if_then_else(bz == 0, s, steps - 1 - s))
                cell_math(zh, sums, b_h, gi_reg, h_s, tx, j)
                h_new = T.meta_var(zh[1])
                T.evaluate(T.call_extern("void", "__nv_atomic_store_n",
                                         T.address_of(hx[(((s + 1) % 2) * dirs + bz) * n_words + tx * hidden + j]),
                                         packed(stored_as(h_new, h_dtype), s + 1), NV_ATOMIC_RELAXED, NV_SCOPE_DEVICE))
                out[t_row * batch + tx, bz * hidden + j] = T.cast(h_new, out_dtype)
                if s == steps - 1:
                    h_n[layer * dirs + bz, tx, j] = T.cast(h_new, h_dtype)
                    if lstm:  # the last c where c_n's copy reads it (slot T mod 2)
                        hs[steps % 2, bz, tx, hidden + j] = T.cast(zh[0], h_dtype)
                if not projects_input and s + 1 < steps:
                    load_gi(gi, gi_reg, s + 1, bz, j, tx)
            if projects_input and s + 1 < steps:  # gi of s + 1 while h' travels; x of s + 2 loaded
                input_gates(acc_x, x_r, wi_r, b_i, gi_reg, sums_x, tx)
                if s + 2 < steps:
                    load_x(x_in, x_r, s + 2, bz, tx)
            T.tvm_storage_sync("shared")  # the next step's h overwrites h_s
        if poll[0] >= SPIN_LIMIT:
            bar[1] = 1


    return body


def _gru_cell_macro(math: WarpUnitMath, row_padded: int) -> Any:
    """``cell(zh, sums, b_h, gi_reg, h_s, tx, j)``: the GRU's cell of lane ``tx``'s row: z into
    ``zh[0]``, h' into ``zh[1]`` (h from the polled row in shared memory)."""
    from tvm.script import tirx as T

    @T.macro
    def cell(zh, sums, b_h, gi_reg, h_s, tx, j):  # type: ignore[no-untyped-def]
        z_n = T.meta_var(math.gates(sums, b_h, gi_reg))
        zh[0] = z_n[0]
        zh[1] = cell_blend(zh[0], z_n[1], h_s[tx * row_padded + j], math.math_dtype)

    return cell


def _lstm_cell_macro(math: WarpUnitMath, hidden: int) -> Any:
    """``cell(zh, ...)``: the LSTM's cell of lane ``tx``'s row on its four gate sums: c' from the
    c in ``zh[0]`` into ``zh[2]``, h' from it into ``zh[1]``, then c' rounded to the state's type
    (as a stored c would be) into ``zh[0]`` for the next step (``step_common.lstm_c``, ``lstm_h``; the fused kernel's
    cell)."""
    from tvm.script import tirx as T

    acc_dtype, gh_dtype, math_dtype, h_dtype = math.acc_dtype, math.gh_dtype, math.math_dtype, math.h_dtype

    @T.macro
    def cell(zh, sums, b_h, gi_reg, h_s, tx, j):  # type: ignore[no-untyped-def]
        gh = T.meta_var([stored_as(sums[g] + b_h[g].astype(acc_dtype), gh_dtype) for g in range(4)])
        zh[2] = lstm_c(T, gi_reg[0], gi_reg[1], gi_reg[2], gh[0], gh[1], gh[2], zh[0], math_dtype, state=h_dtype)
        zh[1] = lstm_h(T, gi_reg[3], gh[3], zh[2], math_dtype, state=h_dtype)
        zh[0] = stored_as(zh[2], h_dtype).astype(math_dtype)

    return cell


@dataclass(frozen=True)
class FlagStep(StepVariant):
    """The flag-exchange persistent step kernel (``step_flags`` 1, ``step_tc`` 0):
    ``step_flag_units`` units a block, a warp each, h exchanged as tagged words."""

    units: int
    loop: int
    step_j: int  # not this kernel's, but checked against the block limit as for every fused kernel
    pipeline: int  # not this kernel's, but it sets cp.async copies for the module as for the fused kernel
    fused_input: bool = False  # step_flag_input: x·W_ihᵀ + b_ih in the kernel, no input GEMM

    @property
    def fuses_input(self) -> bool:  # type: ignore[override]
        return self.fused_input

    unshown_names = SIMT_STEP_KNOBS + TC_STEP_KNOBS + CLUSTER_STEP_KNOBS + ("step_j", "step_barrier", "step_tc")

    @classmethod
    def of(cls, sizes: StepSizes, c: Config) -> "FlagStep":
        return cls(sizes, units=c.step_flag_units, loop=c.step_loop, step_j=c.step_j, pipeline=c.step_pipeline,
                   fused_input=bool(c.step_flag_input))

    @property
    def shape(self) -> FlagStepShape:
        s = self.sizes
        return FlagStepShape(s.batch, s.hidden, s.dirs, self.units, s.w_dtype, s.gates,
                             input=s.input if self.fused_input else 0, w_ih_dtype=s.w_ih_dtype)

    def unshown(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        # with the input GEMM in the kernel its tile's knobs (in_) do not apply
        return self.unshown_prefixes + (("in_",) if self.fused_input else ()), self.unshown_names

    def weights(self, layer: int) -> tuple[str, ...]:
        if not self.fused_input:
            return super().weights(layer)
        return (input_buffer(layer), f"w_ih{layer}", f"b_ih{layer}", "hs", f"w_hh{layer}", f"b_hh{layer}")

    def reason(self, target: TargetInfo) -> str | None:
        """Why it cannot run here: CUDA's persistent kernel only, its tile, and a grid that must
        be resident (a block that never runs would never write its h)."""
        return (fused_threads_reason(self.step_j, target) or self._persistent_reason(target)
                or self._tile_reason() or self._device_reason(target))

    def _persistent_reason(self, target: TargetInfo) -> str | None:
        if target.kind != "cuda" or self.loop != 2:
            return "flag-exchange step kernel (step_flags 1) is CUDA's persistent kernel only (step_loop 2, step_tc 0)"
        return None

    def _tile_reason(self) -> str | None:
        """Why this shape cannot run on the kernel, before residency."""
        shape = self.shape
        if why := shape.tile_reason(KERNEL):
            return why
        if shape.registers() > MAX_REGISTERS:
            return (f"flag-exchange step kernel: needs about {shape.registers()} registers per thread (W share "
                    f"{shape.gate_count} x {shape.k_per_lane}, {shape.poll_words} h words polled at once, "
                    f"{shape.gate_count * shape.batch} sums"
                    f"{shape.input_registers_why()}) > {MAX_REGISTERS}")
        return None

    def _device_reason(self, target: TargetInfo) -> str | None:
        shape = self.shape
        if why := shape.block_reason(KERNEL, target, shape.shared_bytes(), "h"):
            return why
        hw = HardwareModel.from_target(target)
        per_sm, fits = residency(hw, shape.blocks, shape.threads, shape.shared_bytes())
        if hw.registers_per_sm:
            fits = min(fits, hw.registers_per_sm // (shape.threads * shape.registers()))
        if per_sm > fits:
            return (f"flag-exchange step kernel: persistent grid needs every block resident, {shape.blocks} blocks "
                    f"> {hw.sm_count} SMs x {fits} resident per SM")
        return None

    def init_layout(self) -> dict[str, bool]:
        return {"pingpong": True, "barrier": True, "flags": True}

    def async_copy(self) -> bool:
        return bool(self.pipeline)

    def barrier_words(self) -> tuple[str, ...]:
        return ("bar", "hx")

    def lowered_kernels(self) -> dict[str, Any]:
        s = self.sizes
        return {f"{s.cell}_steps": flag_step_func(
            s.seq, s.batch, s.hidden, s.dirs, s.layers, units=self.units, h_dtype=s.h_dtype, w_dtype=s.w_dtype,
            gi_dtype=s.gi_dtype, acc_dtype=s.acc_dtype, gh_dtype=s.gh_dtype, math_dtype=s.math_dtype,
            out_dtype=s.out_dtype, fused_input=(s.input, s.x_dtype, s.w_ih_dtype) if self.fused_input else None,
            name=f"{s.cell}_steps", cell=s.cell)}
