"""The LSTM layer stack as one tunable template: its knobs, buffers, search space and default
config, and the kernel functions a config schedules.

Pipeline per layer: S1 ``gi = x·W_iᵀ + b_i`` for all T steps and both directions in one GEMM,
shape (T·B, dirs·4H) (``input_gemm``: the GEMM template with a bias row); then per step either
the fused step kernel on four gates (``fuse_step`` 1: ``schedules.gru.fused_step`` with the
LSTM's cell, every step's ``h·W_hᵀ + b_h`` and the cell in one kernel) or the hidden GEMM and
the cell kernel (``fuse_step`` 0: ``cell_step``; on an mma.sync tile for a 16-bit LSTM on CUDA).
Storage is one type (``dtype``: x, the weights, h, c and the outputs); the products, gi and the
cell are float32.  On Hopper S1 may run on wgmma: 16-bit as stored (``in_wgmma``), float32 as
three TF32 products of x's and W_ih's high and low parts (``in_split`` 3: the GRU's
``SplitInputGemm``), W_ih split once as the weights are loaded (``plan.prepare_calls``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from tvm_ext.core.errors import TvmExtError, check_sizes
from tvm_ext.core.space import Config, Knob, Space
from tvm_ext.core.template import NamedBuffers, Template, TensorSpec
from tvm_ext.lowering.step_loop import BARRIER_WORDS
from tvm_ext.measure.program import Artifact, CompiledProgram, RunPlan
from tvm_ext.precision.precision import cast, sanity_tolerance
from tvm_ext.schedules.gemm.gemm_3xtf32 import pick_tf32_tile
from tvm_ext.schedules.gemm.simt import BiasGemmTemplate, TensorCoreTile, check_tile
from tvm_ext.schedules.gemm.wgmma import WgmmaTile, wgmma_gemm
from tvm_ext.schedules.gemm.wgmma_template import pick_wgmma_tile
from tvm_ext.schedules.gru.compute import device_layout, torch_layout
from tvm_ext.schedules.gru.flag_step import FlagStep
from tvm_ext.schedules.gru.fused_step import FusedStep, PersistentStep
from tvm_ext.schedules.gru.input_gemm import SplitInputGemm, SplitInputParts, split_input_gemm, tf32_parts_reason
from tvm_ext.schedules.gru.kernels import schedule_elementwise
from tvm_ext.schedules.gru.knobs import HID_GEMM_KNOBS, IN_GEMM_KNOBS, INPUT_TF32_PARTS_KNOB, STEP_KNOBS, gemm_config
from tvm_ext.schedules.gru.lengths import LENGTHS_DTYPE, hold_func, row_vector
from tvm_ext.schedules.gru.split import PARTS, split_depth, split_rows_func
from tvm_ext.schedules.gru.split_step import TensorCoreSplitStep
from tvm_ext.schedules.gru.step_common import LSTM_CELL
from tvm_ext.schedules.gru.step_variant import StepSizes
from tvm_ext.schedules.gru.tensor_core_step import TensorCoreStep
from tvm_ext.schedules.gru.template import default_gemm_config
from tvm_ext.target import TargetInfo

from . import plan as host_plan
from .cell_step import LstmCellStep
from .compute import GATES, lstm_reference
from .kernels import final_c_func, init_func, init_states_func
from .lengths import LSTM_HELD, h0_products_func, inject_func, last_h_func, schedule_h0_products

F32 = "float32"
STORAGE_DTYPES = ("float32", "float16", "bfloat16")
# The fused step kernel's knobs (the GRU's, on four gates), then the input GEMM's (prefixed in_)
STEP_KNOB_NAMES = ("cell_block", "fuse_step", "step_j", "step_b", "step_u", "step_bt", "step_k", "step_pipeline",
                   "step_ks", "step_loop", "step_prefetch", "step_barrier", "step_w_onchip")
# The tensor-core step kernels' knobs the LSTM takes, with the value of configs recorded before them where
# the GRU's knob has none
TC_KNOB_NAMES = ("step_tc_rows", "step_tc_kw", "step_tc_nw", "step_tc_acc", "step_tc_frag", "step_tc_wreg",
                 "step_tc_wregs", "step_tc_poll", "step_tc_warp_h", "step_tc_stack", "step_split_words",
                 "step_tc_ahead")
TC_KNOB_BEFORE = {"step_tc_rows": 16, "step_tc_kw": 1, "step_tc_nw": 1}


def _four_gates(knob: Knob) -> Knob:
    """The GRU's step knob with its help counting the LSTM's four gates."""
    return Knob(knob.name, knob.choices, knob.doc.replace("3 gates", "4 gates").replace("3 x step_u", "4 x step_u")
                .replace("three gates", "four gates"))


# the flag-exchange step kernel (``schedules/gru/flag_step.py`` on four gates); ``before``: the
# value of a config recorded before these knobs existed
FLAG_KNOBS = (
    Knob("step_flags", (0, 1), "persistent step kernel, CUDA: 1 the flag-exchange kernel of small batches (batch "
                               "<= 32): no grid barrier, h goes between blocks as (value, step) words polled until "
                               "every tag says the step; a cell lane keeps its c in a register", before=0),
    Knob("step_flag_units", (4, 8, 16, 32), "flag-exchange step kernel: hidden units per block (a warp each, its "
                                            "lanes splitting k, W_hh's share of 4 gates in registers)", before=4),
    Knob("step_flag_input", (0, 1), "flag-exchange step kernel: 1 computes each step's x·W_ihᵀ + b_ih itself (W_ih's "
                                    "share in registers), so no input GEMM runs before it", before=0),
)
# the tensor-core step kernel (``schedules/gru/tensor_core_step.py`` on four gates, 16-bit h and W_hh,
# h exchanged as tagged words); ``before`` as above
TC_KNOBS = (Knob("step_tc", (0, 1, 2), "persistent step kernel, CUDA: 1 (float16 or bfloat16) runs the gate dot "
                                       "products on the tensor cores (mma.sync), W_hh's slice of step_j units (8, "
                                       "16 or 32) of 4 gates on chip for all T steps, h exchanged as tagged words "
                                       "(step_flags 1); 2 (float32) as three products of h's and W_hh's float16 high "
                                       "and low parts, float32-accurate: with step_flags 1 one float32 value a word "
                                       "(or two: step_split_words), with step_flags 0 h read in chunks behind the "
                                       "grid barrier (``split_step.py``); a cell lane keeps its c in registers",
                before=0),) + tuple(
    replace(_four_gates(k), before=TC_KNOB_BEFORE.get(k.name, k.before))
    for k in STEP_KNOBS if k.name in TC_KNOB_NAMES)
# the input GEMM on Hopper's wgmma: float32 as TF32 parts (the GRU's in_split 3 and in_tf32_parts), 16-bit as
# stored (the GRU's in_wgmma); ``before`` as above
WGMMA_INPUT_KNOBS = (Knob("in_split", (0, 3), "input GEMM with float32 x and W_ih: 3 runs it on Hopper's warpgroup "
                                              "MMA as three TF32 products of their high and low parts (3xTF32: "
                                              "float32-accurate, float32's range), W_ih split once as the weights are "
                                              "loaded, x each call", before=0),
                     INPUT_TF32_PARTS_KNOB,
                     Knob("in_wgmma", (0, 1), "input GEMM with float16 or bfloat16 x and W_ih: 1 runs it on Hopper's "
                                              "warpgroup MMA (``wgmma.py``), W_ih read N-major as stored (the float32 "
                                              "GEMM's counterpart is in_split 3)", before=0))
KNOBS = (tuple(_four_gates(k) for k in STEP_KNOBS if k.name in STEP_KNOB_NAMES) + FLAG_KNOBS + TC_KNOBS
         + tuple(Knob("in_" + k.name, k.choices, "input GEMM (S1): " + k.doc) for k in IN_GEMM_KNOBS)
         + tuple(Knob("hid_" + k.name, k.choices, "hidden GEMM (fuse_step 0): " + k.doc) for k in HID_GEMM_KNOBS)
         + WGMMA_INPUT_KNOBS)


@dataclass(frozen=True)
class LstmTemplate(SplitInputParts, NamedBuffers, Template):
    """A stack of LSTM layers at one shape, as one tunable unit: its "kernel" is the whole
    forward pass.  Buffers in device layout: x (T·B, I); w_ih{l} (K_l, dirs·4H), w_hh{l}
    (dirs, H, 4H), gates in PyTorch's order i, f, g, o."""

    batch: int
    hidden: int
    input: int
    seq: int
    layers: int = 1
    bidirectional: bool = False
    dtype: str = F32
    in_tensor_core: TensorCoreTile | None = None  # the input GEMM's tile (16-bit on CUDA: ``with_tensor_cores``)
    hid_tensor_core: TensorCoreTile | None = None  # the unfused steps' hidden GEMM's, likewise
    variable_lengths: bool = False  # each batch row stops at its own length (input ``lengths``: ``lengths.py``)
    in_split_tf32: WgmmaTile | None = None  # the float32 input GEMM's tile on TF32 parts (``in_split`` 3)
    in_wgmma_tile: WgmmaTile | None = None  # the 16-bit input GEMM's tile on wgmma (``in_wgmma``)
    split_buffers: int = 0  # the in_split of the config whose buffers these are (``for_config``)
    split_parts: int = PARTS  # and the TF32 parts each operand's rows hold (``stored_parts``)

    name = "lstm"

    def __post_init__(self) -> None:
        check_sizes("LSTM", batch=self.batch, hidden=self.hidden, input=self.input, seq=self.seq,
                    layers=self.layers)
        if self.dtype not in STORAGE_DTYPES:
            raise TvmExtError(f"LSTM dtype {self.dtype!r} is not supported; allowed: {', '.join(STORAGE_DTYPES)}")
        check_tile(self.in_tensor_core, "in_tensor_core")
        check_tile(self.hid_tensor_core, "hid_tensor_core")

    @property
    def params(self) -> dict[str, Any]:
        params = {"batch": self.batch, "hidden": self.hidden, "input": self.input, "seq": self.seq,
                  "layers": self.layers, "bidirectional": bool(self.bidirectional), "dtype": self.dtype}
        for name in ("in_tensor_core", "hid_tensor_core"):
            if getattr(self, name) is not None:
                params[name] = str(getattr(self, name))
        if self.in_split_tf32 is not None:
            params["in_split_tf32"] = self.in_split_tf32.name
        if self.in_wgmma_tile is not None:
            params["in_wgmma"] = self.in_wgmma_tile.name
        if self.variable_lengths:  # only when set, as the GRU's
            params["variable_lengths"] = True
        return params

    @property
    def dirs(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def x_dtype(self) -> str:  # the stored types, named as the GRU template names them
        return self.dtype

    @property
    def h_dtype(self) -> str:
        return self.dtype

    @property
    def out_dtype(self) -> str:
        return self.dtype

    @property
    def tolerance(self) -> float:  # type: ignore[override]
        return sanity_tolerance({"x": self.dtype})

    def layer_input(self, layer: int) -> int:
        return self.input if layer == 0 else self.dirs * self.hidden

    # ---- buffers -------------------------------------------------------------------------
    def input_specs(self) -> dict[str, TensorSpec]:
        t, b, h, d, dt = self.seq, self.batch, self.hidden, self.dirs, self.dtype
        states = TensorSpec((self.layers * d, b, h), dt)
        specs = {"x": TensorSpec((t * b, self.input), dt), "h0": states, "c0": states}
        for layer in range(self.layers):
            specs[f"w_ih{layer}"] = TensorSpec((self.layer_input(layer), d * GATES * h), dt)
            specs[f"b_ih{layer}"] = TensorSpec((d * GATES * h,), dt)
            specs[f"w_hh{layer}"] = TensorSpec((d, h, GATES * h), dt)
            specs[f"b_hh{layer}"] = TensorSpec((d, GATES * h), dt)
        if self.variable_lengths:
            specs["lengths"] = TensorSpec((b,), LENGTHS_DTYPE)
        return specs

    def output_specs(self) -> dict[str, TensorSpec]:
        t, b, h, d = self.seq, self.batch, self.hidden, self.dirs
        states = TensorSpec((self.layers * d, b, h), self.dtype)
        return {"out": TensorSpec((t * b, d * h), self.dtype), "h_n": states, "c_n": states}

    def scratch_specs(self) -> dict[str, TensorSpec]:
        t, b, h, d = self.seq, self.batch, self.hidden, self.dirs
        state = TensorSpec((d, b, h), self.dtype)
        specs = {"gi": TensorSpec((t * b, d * GATES * h), F32),
                 "hs": TensorSpec((2, d, b, 2 * h), self.dtype),  # the fused step kernel's ping-pong: h, then c
                 "bar": TensorSpec((BARRIER_WORDS,), "int32"),  # the persistent kernel's grid barrier
                 "hx": TensorSpec((2 * d * b * h,), "uint64"),  # the flag-exchange kernel's h words, two slots
                 "gh": TensorSpec((d, b, GATES * h), F32),  # the unfused steps' hidden products
                 "p0": state, "p1": state, "k0": state, "k1": state}  # and their h and c, ping-ponging
        for i in range(min(2, self.layers - 1)):  # outputs of inner layers, alternating
            specs[f"y{i}"] = TensorSpec((t * b, d * h), self.dtype)
        specs.update(self.part_specs(d * GATES * h))  # the input GEMM's operands as TF32 parts
        return specs

    def for_config(self, config: Config) -> "LstmTemplate":
        """The template whose buffers ``config``'s plan uses: with ``in_split`` 3 the TF32 parts
        of x and W_ih besides."""
        return replace(self, split_buffers=int(config.in_split), split_parts=self.stored_parts(config))

    def measured_operator(self, config: Config) -> "LstmTemplate":
        return self.for_config(config)

    def make_inputs(self, rng: np.random.Generator) -> list[np.ndarray]:
        """x, h0 and c0 in [-1, 1]; weights in PyTorch's init range ±1/sqrt(H), held in ``dtype``;
        lengths uniform in [1, T], the longest row T."""
        scale = 1.0 / math.sqrt(self.hidden)
        arrays = []
        for name, spec in self.input_specs().items():
            if name == "lengths":
                arrays.append(rng.integers(1, self.seq + 1, size=spec.shape).astype(np.int32))
                arrays[-1][0] = self.seq
                continue
            bound = 1.0 if name in ("x", "h0", "c0") else scale
            values = rng.uniform(-bound, bound, size=spec.shape).astype(np.float32)
            arrays.append(values if spec.dtype == F32 else cast(values, spec.dtype))
        return arrays

    # ---- layouts: PyTorch <-> device ------------------------------------------------------
    def device_weights(self, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """PyTorch ``state_dict`` arrays -> device-layout buffers in ``dtype``."""
        return {k: cast(np.asarray(v, np.float64), self.dtype)
                for k, v in device_layout(weights, self.layers, self.dirs).items()}

    def torch_weights(self, device: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Device-layout buffers -> PyTorch ``state_dict`` arrays (for the reference)."""
        return torch_layout(device, self.layers, self.dirs, GATES * self.hidden)

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        named = dict(zip(self.input_specs(), inputs))
        x = named["x"].astype(np.float64).reshape(self.seq, self.batch, self.input)
        weights = {k: v.astype(np.float64) for k, v in self.torch_weights(named).items()}
        out, h_n, c_n = lstm_reference(x, weights, named["h0"].astype(np.float64),
                                       named["c0"].astype(np.float64), self.layers, self.bidirectional,
                                       lengths=named.get("lengths"))
        return [out.reshape(self.seq * self.batch, -1), h_n, c_n]

    def flops(self) -> float:
        g = GATES * self.hidden * self.dirs
        per_step = sum(2 * self.batch * g * (self.layer_input(l) + self.hidden) for l in range(self.layers))
        return float(self.seq * per_step)

    # ---- the input GEMM and the step kernel ------------------------------------------------
    def input_gemm(self, layer: int) -> BiasGemmTemplate:
        """S1 of ``layer``: A is x (layer 0) or the layer below's output, B is W_ih, D is gi (float32)."""
        return BiasGemmTemplate(self.seq * self.batch, self.dirs * GATES * self.hidden, self.layer_input(layer),
                                a_dtype=self.dtype, b_dtype=self.dtype, acc_dtype=F32, c_dtype=F32,
                                tensor_core=self.in_tensor_core)

    def hidden_gemm(self) -> BiasGemmTemplate:
        """The unfused steps' ``gh = h·W_hᵀ + b_h``, batched over directions: (dirs, B, 4H), float32."""
        return BiasGemmTemplate(self.batch, GATES * self.hidden, self.hidden, a_dtype=self.dtype, b_dtype=self.dtype,
                                acc_dtype=F32, c_dtype=F32, tensor_core=self.hid_tensor_core, batch=self.dirs)

    def input_gemm_kinds(self) -> tuple[int, ...]:
        """The input GEMM functions: 0, and 1 for layers >= 1 where their depth differs."""
        return (0,) if self.layers == 1 or self.layer_input(1) == self.input else (0, 1)

    def input_gemm_kind(self, layer: int) -> int:
        return 0 if layer == 0 or len(self.input_gemm_kinds()) == 1 else 1

    def with_tensor_cores(self, target: TargetInfo) -> "LstmTemplate":
        """With mma.sync tiles for a 16-bit LSTM's input and hidden GEMMs on CUDA (``pick_tile``),
        none elsewhere; one ``TvmExtError`` where the device has no ``dtype`` arithmetic (an
        OpenCL device without ``cl_khr_fp16``)."""
        from tvm_ext.schedules.gemm.tensor_core_tile import pick_tile

        if self.dtype not in target.float_dtypes:
            raise TvmExtError(f"LSTM dtype {self.dtype}: this {target.kind} device has no {self.dtype} arithmetic "
                              f"(it has {', '.join(target.float_dtypes)})")
        shapes = [(self.seq * self.batch, self.dirs * GATES * self.hidden, self.layer_input(layer))
                  for layer in range(self.layers)]
        if target.kind != "cuda" or self.dtype == F32:
            split = [(m, n, PARTS * split_depth(k)) for m, n, k in shapes]
            tf32 = pick_tf32_tile(split, target) if target.kind == "cuda" else None
            return replace(self, in_tensor_core=None, hid_tensor_core=None, in_split_tf32=tf32, in_wgmma_tile=None)
        return replace(self, in_tensor_core=pick_tile(shapes, target), in_split_tf32=None,
                       hid_tensor_core=pick_tile([(self.batch, GATES * self.hidden, self.hidden)], target),
                       in_wgmma_tile=pick_wgmma_tile(shapes, target, F32, b_layout="KN", operand=self.dtype,
                                                     ragged_n=True))

    def for_target(self, target: TargetInfo) -> "LstmTemplate":
        return self.with_tensor_cores(target)

    def step_sizes(self) -> StepSizes:
        return StepSizes(self.seq, self.batch, self.hidden, self.dirs, self.layers, gi_dtype=F32, h_dtype=self.dtype,
                         w_dtype=self.dtype, acc_dtype=F32, gh_dtype=F32, math_dtype=F32, out_dtype=self.dtype,
                         input=self.input, x_dtype=self.dtype, w_ih_dtype=self.dtype, cell=LSTM_CELL)

    def step_variant(self, config: Config) -> FusedStep | FlagStep | TensorCoreStep | TensorCoreSplitStep | \
            LstmCellStep:
        """The steps ``config`` runs: the hidden GEMM and the cell kernel (``fuse_step`` 0), or the
        fused step kernel, a launch per step or looped on the host (``step_loop`` 0, 1), or
        persistent behind a grid barrier (2), or the flag-exchange kernel (``step_flags`` 1), or
        the tensor-core kernel (``step_tc`` 1, or 2 on float32 parts: with ``step_flags`` 1
        exchanging words, else behind the grid barrier)."""
        if not config.fuse_step:
            return LstmCellStep.of(self.step_sizes(), config, self.hidden_gemm(), self.variable_lengths)
        if config.step_tc == 2 and not config.step_flags:
            return TensorCoreSplitStep.of(self.step_sizes(), config)
        if config.step_tc:
            return TensorCoreStep.of(self.step_sizes(), config)
        if config.step_flags:
            return FlagStep.of(self.step_sizes(), config)
        family = PersistentStep if config.step_loop == 2 else FusedStep
        return family.of(self.step_sizes(), config)

    # ---- the search space ------------------------------------------------------------------
    def space(self, target: TargetInfo) -> Space:
        gemms = [(f"input GEMM of layer {layer}", "in_", self.input_gemm(layer)) for layer in self.input_gemm_kinds()]
        gemms.append(("hidden GEMM", "hid_", self.hidden_gemm()))
        spaces = [(label, prefix, g.space(target), g.default_config(target)) for label, prefix, g in gemms]

        def gemm_reason(c: Config) -> str | None:
            reason = ((c.in_split or c.in_tf32_parts != PARTS) and self.tf32_input_reason(c)
                      or c.in_wgmma and self.wgmma_input_reason(c))
            if reason:
                return reason
            for label, prefix, space, base in spaces:
                if prefix == "hid_" and c.fuse_step or prefix == "in_" and self.input_on_wgmma(c):
                    continue  # the fused step kernel makes its own products; wgmma runs the input GEMM
                reason = space.infeasible_reason(gemm_config(c, prefix, base))
                if reason:
                    return f"{label}: {reason}"
            return None

        def step_reason(c: Config) -> str | None:
            step = self.step_variant(c)
            if c.step_flag_input and (why := self.fused_input_reason(step)):
                return why
            return step.reason(target)

        return Space(KNOBS, (gemm_reason, step_reason))

    def tf32_input_reason(self, c: Config) -> str | None:
        """Why ``c``'s input GEMM cannot run on TF32 parts (``in_split`` 3) or read them from two
        stored parts (``in_tf32_parts`` 2: the TMA's k steps over [x_lo | x_hi] and [W_hi | W_lo])."""
        if c.in_split != 3:
            return "in_tf32_parts changes the input GEMM of TF32 parts (in_split 3)"
        if self.in_split_tf32 is None:
            return (f"input GEMM on TF32 parts (in_split 3) needs float32 x and W_ih, a Hopper GPU (sm_90) and a "
                    f"TF32 wgmma tile dividing the (T·B, dirs·4H, 3·input) GEMMs, {self.seq * self.batch} rows "
                    f"(LSTM.build picks one)")
        if c.step_flag_input:
            return "step_flag_input 1 runs x·W_ihᵀ in the step kernel: there is no input GEMM to split (in_split 3)"
        return tf32_parts_reason(self.tf32_input_tile(c), [self.input_depth(k, c) for k in self.input_gemm_kinds()],
                                 c.in_tf32_parts)

    def wgmma_input_reason(self, c: Config) -> str | None:
        """Why ``c``'s 16-bit input GEMM cannot run on wgmma as stored (``in_wgmma`` 1)."""
        if c.in_split:
            return ("in_wgmma 1 runs the 16-bit input GEMM on wgmma; the float32 one runs there as TF32 parts with "
                    "in_split 3 (in_wgmma 0)")
        if self.in_wgmma_tile is None:
            return ("input GEMM on wgmma (in_wgmma 1) needs float16 or bfloat16 x and W_ih, a Hopper GPU (sm_90) and "
                    f"a wgmma tile for the (T·B, dirs·4H, input) GEMMs, {self.seq * self.batch} rows: the input a "
                    "multiple of 8 (LSTM.build picks one)")
        if c.step_flag_input:
            return "step_flag_input 1 runs x·W_ihᵀ in the step kernel: there is no input GEMM to run on wgmma"
        return None

    def input_on_wgmma(self, config: Config) -> bool:
        """Whether ``config``'s input GEMM is a wgmma kernel (``lowered_kernels``), not a schedule."""
        return bool(config.in_split or config.in_wgmma)

    def tf32_input_tile(self, config: Config) -> WgmmaTile | None:
        """The input GEMM's tile on TF32 parts, loaded by the TMA where it reads two stored parts."""
        if self.in_split_tf32 is None:
            return None
        return replace(self.in_split_tf32, tma=True) if self.stored_parts(config) == 2 else self.in_split_tf32

    def wgmma_input_gemms(self, config: Config) -> dict[str, Any]:
        """Each input GEMM kind on wgmma: with ``in_wgmma`` 16-bit as stored (W_ih (K, N) read
        N-major); with ``in_split`` 3 over TF32 parts with W_ih's split (and x's, where
        ``split_rows_written``: the GRU's ``split_input_gemm``); else none."""
        funcs: dict[str, Any] = {}
        m, n = self.seq * self.batch, self.dirs * GATES * self.hidden
        for kind in self.input_gemm_kinds() if config.in_wgmma else ():
            funcs[f"lstm_gemm_x{kind}"] = wgmma_gemm(self.in_wgmma_tile, m, n, self.layer_input(kind), c_dtype=F32,
                                                     bias_dtype=self.dtype, b_layout="KN")
        for kind in self.input_gemm_kinds() if config.in_split else ():
            funcs.update(split_input_gemm(SplitInputGemm(
                "lstm", kind, self.tf32_input_tile(config), m, n, self.layer_input(kind),
                self.input_depth(kind, config), F32, self.dtype, True, self.stored_parts(config),
                rows_written=self.split_rows_written(config, kind))))
        return funcs

    def fused_input_reason(self, step: Any) -> str | None:
        """Why ``step`` cannot run the input GEMM itself (``step_flag_input`` 1): only the
        flag-exchange kernel does, and one kernel serves every layer, so every layer's input
        must be as deep as the first's."""
        if not step.fuses_input:
            return "step_flag_input 1 is the flag-exchange step kernel's (step_flags 1, step_loop 2)"
        if self.variable_lengths:
            return "step_flag_input 1: variable lengths hold each row's gates in gi, which that kernel does not write"
        if self.layers > 1 and self.layer_input(1) != self.input:
            return (f"step_flag_input 1: one step kernel serves every layer, so each layer's input must be "
                    f"{self.input} deep (layer 1 reads {self.layer_input(1)})")
        return None

    def default_config(self, target: TargetInfo) -> Config:
        """The fused step kernel a launch per step, 32 units (fewer for a small H) a block, k
        slices of 16, the GEMMs' default tiles."""
        units = min(32, 1 << max(1, (self.hidden - 1).bit_length()))
        values: dict[str, Any] = {"cell_block": 256, "fuse_step": 1, "step_j": units,
                                  "step_b": 1, "step_u": 1, "step_bt": 1, "step_k": 16, "step_pipeline": 0,
                                  "step_ks": 1, "step_loop": 0, "step_prefetch": 0, "step_barrier": 0,
                                  "step_w_onchip": 0,
                                  **{k.name: k.before for k in FLAG_KNOBS + TC_KNOBS + WGMMA_INPUT_KNOBS}}
        for prefix, gemm in (("in_", self.input_gemm(0)), ("hid_", self.hidden_gemm())):
            values.update({prefix + k: v for k, v in default_gemm_config(gemm, target).items})
        names = set(self.space(target).names)
        return self.space(target).make(**{k: v for k, v in values.items() if k in names})

    def analytic_pick(self, target: TargetInfo) -> tuple[Config, str]:
        """A config without measuring, and why (``pick.py``)."""
        from .pick import analytic_pick

        return analytic_pick(self, target)

    def shown_knobs(self, config: Config) -> tuple[str, ...]:
        """The knobs of the steps ``config`` runs: fused, the step kernel's; unfused, the hidden
        GEMM's and the cell kernel's (the input GEMM's either way: on wgmma its knobs, not the
        tile's; ``in_tf32_parts`` with TF32 parts only)."""
        unused = ("hid_", "cell_block") if config.fuse_step else ("step_",)
        wgmma = {k.name for k in WGMMA_INPUT_KNOBS}
        return tuple(name for name, _ in config.items if not name.startswith(unused)
                     and (name in wgmma if self.input_on_wgmma(config) and name.startswith("in_") else True)
                     and (name != "in_tf32_parts" or config.in_split))

    # ---- kernels and plan ------------------------------------------------------------------
    def kernels(self, config: Config, target: TargetInfo) -> dict[str, Any]:
        """Scheduled ``s_tir.Schedule`` of each kernel function the plan calls, by name."""
        threads = min(256, target.max_threads_per_block)
        step = self.step_variant(config)
        if isinstance(step, LstmCellStep):
            init = init_states_func(self.batch, self.hidden, self.dirs, self.layers, self.dtype)
            funcs = {"lstm_init": schedule_elementwise(init, "init", threads)}
        else:
            layout = step.init_layout()  # what the step kernel reads: barrier and exchange words (as the GRU's)
            init = init_func(self.batch, self.hidden, self.dirs, self.layers, self.dtype,
                             **{k: layout.get(k, False) for k in ("barrier", "flags", "paired", "float_pairs")})
            final_c = final_c_func(self.seq, self.batch, self.hidden, self.dirs, self.layers, self.dtype)
            funcs = {"lstm_init": schedule_elementwise(init, "init", threads),
                     "lstm_final_c": schedule_elementwise(final_c, "final_c", threads)}
            if self.variable_lengths:
                funcs.update(self._length_kernels(target, threads))
        base = default_gemm_config(self.input_gemm(0), target)
        for kind in self.input_gemm_kinds():
            if not self.input_on_wgmma(config):  # else ``lowered_kernels``
                funcs[f"lstm_gemm_x{kind}"] = self.input_gemm(kind).schedule(gemm_config(config, "in_", base), target)
            elif config.in_split and not self.split_rows_written(config, kind):  # x's parts zero-padded to split_depth
                rows = split_rows_func(self.seq * self.batch, self.layer_input(kind), tf32=True,
                                       parts=self.stored_parts(config))
                funcs[f"lstm_split_x{kind}"] = schedule_elementwise(rows, "split", threads)
        funcs.update(step.scheduled_kernels(target))
        return funcs

    def _length_kernels(self, target: TargetInfo, threads: int) -> dict[str, Any]:
        """The fused steps' kernels of variable lengths (``lengths.py``): the hold of gi past each
        row's length, the forward h_n's copy from the output and, with both directions, the
        backward h0's products added at each row's first step."""
        t, b, h, d = self.seq, self.batch, self.hidden, self.dirs
        hold = hold_func(t, b, h, d, F32, row_vector(h, F32, target.kind), LSTM_HELD)
        funcs = {"lstm_hold": schedule_elementwise(hold, "hold", threads, vectorized=True),
                 "lstm_last_h": schedule_elementwise(last_h_func(t, b, h, d, self.layers, self.dtype), "last_h",
                                                     threads)}
        if self.bidirectional:
            funcs["lstm_h0_products"] = schedule_h0_products(h0_products_func(b, h, self.layers, self.dtype), b,
                                                             threads)
            funcs["lstm_inject"] = schedule_elementwise(inject_func(t, b, h), "inject", threads)
        return funcs

    def lowered_kernels(self, config: Config) -> dict[str, Any]:
        """Kernel functions written as lowered loops (PrimFuncs by name): the input GEMM on wgmma
        (``in_wgmma``, ``in_split`` 3) and the step kernels written so (``StepVariant.lowered_kernels``)."""
        return {**self.wgmma_input_gemms(config), **self.step_variant(config).lowered_kernels()}

    def pass_config(self, config: Config, target: TargetInfo) -> dict[str, Any]:
        """cp.async for the pipelined h slice, and the input GEMM tile's options (CUDA)."""
        if target.kind != "cuda":
            return {}
        options: dict[str, Any] = {"tirx.use_async_copy": True} if self.step_variant(config).async_copy() else {}
        gemms = (([] if self.input_on_wgmma(config) else [self.input_gemm(0)])
                 + ([] if config.fuse_step else [self.hidden_gemm()]))
        for gemm in gemms:
            if gemm.uses_tensor_cores(target):
                options.update(gemm.tensor_core.pass_config())
        return options

    def plan(self, config: Config) -> tuple[Any, ...]:
        return host_plan.plan_calls(self, config)

    def compile(self, config: Config, target: TargetInfo) -> Any:
        """Schedule and compile every kernel function into one module (``plan.compile_lstm``)."""
        return host_plan.compile_lstm(self, config, target)

    def build_program(self, config: Config, target: TargetInfo) -> CompiledProgram:
        return self.compile(config, target).program(target.kind, tuple(self.buffers()))

    def schedule(self, config: Config, target: TargetInfo) -> Any:
        raise TvmExtError("an LSTM is several kernels and a host loop: use build_program or LSTM.build")

    def run_plan(self, config: Config, artifact: Artifact) -> RunPlan:
        return host_plan.run_plan(artifact)
