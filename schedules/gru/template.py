"""The GRU layer stack as one tunable template: its knobs, buffers, search space and
default config, and the kernel functions a config schedules.

Its "kernel" is the whole forward pass (every launch of every step of every layer), so
the GA tuner searches it like any operator.  Pipeline per layer (as published):

- S1 ``gi = x·W_iᵀ + b_i`` for all T steps and both directions in one GEMM,
  shape (T·B, dirs·3H) (``input_gemm``: the GEMM template with a bias row).
- S2 per step ``gh = h·W_hᵀ + b_h``, the GEMM template batched over directions,
  (dirs, B, 3H) (``hidden_gemm``).
- S3/S4 per step one cell kernel, or S2-S4 fused into one step kernel: the config's
  ``StepVariant`` (``step_variant.py``), chosen once by ``step_variant``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from tvm_ext.core.errors import TvmExtError, check_sizes
from tvm_ext.measure.program import RunPlan
from tvm_ext.precision.precision import FLOAT_DTYPES, DtypeFields, TensorCoreGemm, cast
from tvm_ext.measure.program import Artifact, CompiledProgram
from tvm_ext.schedules.gemm.simt import BiasGemmTemplate, GemmTemplate, TensorCoreTile, check_tile
from tvm_ext.schedules.gemm.gemm_3xtf32 import pick_tf32_tile
from tvm_ext.schedules.gemm.wgmma import WgmmaTile, in_row_order, row_order_divides, signal_reason, wgmma_reason
from tvm_ext.schedules.gemm.wgmma import target_reason as wgmma_target_reason
from tvm_ext.schedules.gemm.wgmma_layout import stored_row_count
from tvm_ext.schedules.gemm.wgmma_template import pick_wgmma_tile
from tvm_ext.core.space import Config, Space
from tvm_ext.lowering.step_loop import BARRIER_WORDS
from tvm_ext.target import TargetInfo
from tvm_ext.core.template import NamedBuffers, Template, TensorSpec

from . import plan as host_plan
from .cell_epilogue import CELL_TILE_COLUMNS, CELL_TILE_STAGES, CELL_TILE_UNITS, cell_tile_reason
from .cell_step import CellStep
from .compute import F32, PRECISION_PARAMS, device_layout, gru_reference, torch_layout
from .input_gemm import SplitInputParts, tf32_parts_reason, wgmma_input_gemms
from .kernels import init_func, schedule_elementwise, schedule_init
from .knobs import KNOBS, gemm_config
from .lengths import LENGTHS_DTYPE, hold_func, row_vector, zero_out_func
from .split import PARTS, SPLIT_WEIGHT_SCALE, split_depth, split_rows_func, split_weight_func
from .step_variant import StepSizes, StepVariant
from .variants import select_step_variant


def _pow2_at_least(value: int, cap: int) -> int:
    p = 1
    while p < value and p < cap:
        p *= 2
    return p


def default_gemm_config(template: GemmTemplate, target: TargetInfo) -> Config:
    """The GEMM template's default, or for few rows (the per-step GEMM at small batch) a
    flat tile of 32 threads along N so most threads do not compute padding."""
    base = template.default_config(target)
    if template.m >= 32:
        return base
    flat = base.replace(wg_x=32, wg_y=_pow2_at_least(template.m, 16), task_x=4, task_y=1, k_step=32,
                        use_shared=1, pad=0, vec=1, double_buffer=0)
    return flat if template.space(target).is_feasible(flat) else base


def step_gemm_tile(tile: WgmmaTile | None, batch: int, hidden: int) -> WgmmaTile | None:
    """The unfused steps' hidden GEMM tile (``hid_wgmma``): the tile picked for its (batch, 3H, H)
    shape, launched early behind the step before's cell kernel (``wgmma_pdl``) and, where it
    loads by TMA, with a producer warpgroup (``wgmma_ws``); where 128 divides the batch, 128 rows
    a tile, one tile a block (W_hh's columns read once for 128 rows).  The fastest of the
    variants measured at 16-bit B64 H1536 / H2048, B128 H2048 and B256 H1024 (docs/results/gru.md)."""
    if tile is None:
        return None
    tile = replace(tile, pdl=True, specialized=tile.tma)
    tall = replace(tile, bm=128, stages=6, tiles=1, raster=0)
    if batch % 128 == 0 and wgmma_reason(tall, batch, 3 * hidden, hidden, b_layout="KN") is None:
        return tall
    return tile


@dataclass(frozen=True)
class GruTemplate(SplitInputParts, NamedBuffers, DtypeFields, Template):
    """A stack of GRU layers at one shape, as one tunable unit: its "kernel" is the whole
    forward pass (every launch of every step of every layer).

    Buffers are in device layout: x (T·B, I); weights transposed so the gate GEMMs read
    B operands row-major: w_ih{l} (K_l, dirs·3H), w_hh{l} (dirs, H, 3H).

    Precision: one ``<name>_dtype`` field per entry of ``PRECISION_PARAMS`` (all
    float32 by default); set them with ``with_precision``.
    """

    batch: int
    hidden: int
    input: int
    seq: int
    layers: int = 1
    bidirectional: bool = False
    x_dtype: str = F32
    w_ih_dtype: str = F32
    in_acc_dtype: str = F32
    gi_dtype: str = F32
    w_hh_dtype: str = F32
    hid_acc_dtype: str = F32
    gh_dtype: str = F32
    h_dtype: str = F32
    cell_math_dtype: str = F32
    out_dtype: str = F32
    # Tensor-core tiles (mma.sync or WMMA, ``tvm_ext.schedules.gemm.tensor_core.parse_tile`` /
    # ``pick_tile``) for the input and (unfused) hidden GEMMs: tensor cores where the tile takes
    # their operand types (mma.sync: both float16 or both bfloat16; WMMA: float16) and shape
    # on CUDA (see ``GemmTemplate.tensor_core``)
    in_tensor_core: TensorCoreTile | None = None
    hid_tensor_core: TensorCoreTile | None = None
    # The tile of the split input GEMM (``in_split``: float32 x and W_ih as float16 parts), and
    # whether the buffers include the split operands (``for_config``: a config with in_split)
    in_split_tensor_core: TensorCoreTile | None = None
    in_split_wgmma: WgmmaTile | None = None  # the same GEMM on Hopper's wgmma (in_split 2)
    in_split_tf32: WgmmaTile | None = None  # the GEMM of TF32 parts on Hopper's wgmma (in_split 3)
    in_wgmma_tile: WgmmaTile | None = None  # the 16-bit input GEMM on wgmma (in_wgmma)
    hid_wgmma_tile: WgmmaTile | None = None  # the unfused steps' 16-bit hidden GEMM on wgmma (hid_wgmma)
    hid_tf32_tile: WgmmaTile | None = None  # the same, float32 on TF32 parts (``tf32_hidden_tile``)
    split_buffers: int = 0  # the in_split of the config whose buffers these are
    split_parts: int = PARTS  # and the parts each operand's rows hold (``stored_parts``)
    ready_buffer: int = 0  # counts of gi's stored tile rows the config's plan passes (``step_overlap``)
    # each batch row stops at its own length (input ``lengths``; ``lengths.py``)
    variable_lengths: bool = False
    hidden_parts: bool = False  # the config's plan passes h's and W_hh's TF32 parts (a float32 ``hid_cell``)
    hidden_transposed: bool = False  # ... and a 16-bit W_hh transposed in tile order (``hid_cell_bt``)

    name = "gru"
    PRECISION_PARAMS = PRECISION_PARAMS

    def __post_init__(self) -> None:
        check_sizes("GRU", batch=self.batch, hidden=self.hidden, input=self.input, seq=self.seq, layers=self.layers)
        for param, dtype in self.precision.items():
            if dtype not in FLOAT_DTYPES:
                raise TvmExtError(f"GRU {param} dtype {dtype!r} is not supported; allowed: {', '.join(FLOAT_DTYPES)}")
        for name in ("in_tensor_core", "hid_tensor_core", "in_split_tensor_core"):
            check_tile(getattr(self, name), name)

    @property
    def params(self) -> dict[str, Any]:
        params = {"batch": self.batch, "hidden": self.hidden, "input": self.input, "seq": self.seq,
                  "layers": self.layers, "bidirectional": bool(self.bidirectional),
                  **{f"{p}_dtype": d for p, d in self.precision.items()}}
        for name in ("in_tensor_core", "hid_tensor_core", "in_split_tensor_core"):
            if getattr(self, name) is not None:
                params[name] = str(getattr(self, name))
        if self.in_split_wgmma is not None:
            params["in_split_wgmma"] = self.in_split_wgmma.name
        if self.in_split_tf32 is not None:
            params["in_split_tf32"] = self.in_split_tf32.name
        if self.in_wgmma_tile is not None:
            params["in_wgmma"] = self.in_wgmma_tile.name
        if self.hid_wgmma_tile is not None:
            params["hid_wgmma"] = self.hid_wgmma_tile.name
        if self.hid_tf32_tile is not None:
            params["hid_tf32"] = self.hid_tf32_tile.name
        if self.variable_lengths:  # only when set: keys of fixed-length records stay as they were
            params["variable_lengths"] = True
        return params

    @property
    def dirs(self) -> int:
        return 2 if self.bidirectional else 1

    def pass_config(self, config: Config, target: TargetInfo) -> dict[str, Any]:
        """The options of the tensor-core tiles the GEMMs run on and of the step kernels' h
        copies in cp.async groups (the pipelined slice, the tensor-core kernel's chunks: set
        here, whatever tile the GEMMs run on): one module-wide context serves every kernel
        (cp.async only acts on copies a schedule marked async; the mma.sync tile's
        ``disable_cse_tir`` leaves the other kernels' arithmetic as it is, nvcc eliminates
        common terms anyway)."""
        if target.kind != "cuda":
            return {}
        staged = self.step_variant(config).async_copy()  # h copied in cp.async groups
        options: dict[str, Any] = {"tirx.use_async_copy": True} if staged else {}
        for gemm in self.gemms_on_tensor_cores(config, target):
            options.update(gemm.tensor_core.pass_config())
        return options

    def gemms_on_tensor_cores(self, config: Config, target: TargetInfo) -> list[GemmTemplate]:
        """The gate GEMMs ``config`` runs on their tensor-core tiles (layer 1's input GEMM
        too where its A differs; the hidden GEMM only unfused)."""
        gemms = [self.input_gemm(layer, bool(config.in_split)) for layer in range(min(self.layers, 2))
                 if not self.input_on_wgmma(config)]  # wgmma: a PrimFunc of its own (``lowered_kernels``)
        if self.step_variant(config).runs_hidden_gemm:
            gemms.append(self.hidden_gemm())
        return [g for g in gemms if g.uses_tensor_cores(target)]

    def layer_input(self, layer: int) -> int:
        return self.input if layer == 0 else self.dirs * self.hidden

    @property
    def gi_shape(self) -> tuple[int, int]:
        """(rows, columns) of gi, the input GEMMs' output: T·B rows, the three gates of every
        direction's units."""
        return self.seq * self.batch, self.dirs * 3 * self.hidden

    # ---- buffers -------------------------------------------------------------------------
    def input_specs(self) -> dict[str, TensorSpec]:
        t, b, h, d = self.seq, self.batch, self.hidden, self.dirs
        wi, wh = self.w_ih_dtype, self.w_hh_dtype
        specs = {"x": TensorSpec((t * b, self.input), self.x_dtype),
                 "h0": TensorSpec((self.layers * d, b, h), self.h_dtype)}
        for layer in range(self.layers):
            specs[f"w_ih{layer}"] = TensorSpec((self.layer_input(layer), d * 3 * h), wi)
            specs[f"b_ih{layer}"] = TensorSpec((d * 3 * h,), wi)
            specs[f"w_hh{layer}"] = TensorSpec((d, h, 3 * h), wh)
            specs[f"b_hh{layer}"] = TensorSpec((d, 3 * h), wh)
        if self.variable_lengths:
            specs["lengths"] = TensorSpec((b,), LENGTHS_DTYPE)
        return specs

    def output_specs(self) -> dict[str, TensorSpec]:
        t, b, h, d = self.seq, self.batch, self.hidden, self.dirs
        return {"out": TensorSpec((t * b, d * h), self.out_dtype),
                "h_n": TensorSpec((self.layers * d, b, h), self.h_dtype)}

    def scratch_specs(self) -> dict[str, TensorSpec]:
        t, b, h, d = self.seq, self.batch, self.hidden, self.dirs
        specs = {"gi": TensorSpec((t * b, d * 3 * h), self.gi_dtype),
                 "gh": TensorSpec((d, b, 3 * h), self.gh_dtype),
                 "p0": TensorSpec((d, b, h), self.h_dtype), "p1": TensorSpec((d, b, h), self.h_dtype),
                 "hs": TensorSpec((2, d, b, h), self.h_dtype),  # the fused step kernel's ping-pong
                 "bar": TensorSpec((BARRIER_WORDS,), "int32"),  # the persistent kernel's grid barrier
                 "hx": TensorSpec((2 * d * b * h,), "uint64")}  # the flag-exchange kernel's (h, step) words
        if self.ready_buffer:  # counts of gi's tile rows stored by an input GEMM still running
            specs["gi_ready"] = TensorSpec((self.ready_buffer,), "int32")
        if self.hidden_parts:  # TF32 parts of h (the steps' A, ping-ponging) and of each layer's W_hh
            specs.update({f"q{i}": TensorSpec((d, b, 2 * h), F32) for i in range(2)})
            specs.update({f"wh{layer}": TensorSpec((d, 3 * h, 2 * h), F32) for layer in range(self.layers)})
        if self.hidden_transposed:  # each layer's W_hh transposed, rows in the cell tiles' order
            w_hh = self.precision["w_hh"]
            specs.update({f"wh{layer}": TensorSpec((d, 3 * h, h), w_hh) for layer in range(self.layers)})
        for i in range(min(2, self.layers - 1)):  # outputs of inner layers, alternating
            specs[f"y{i}"] = TensorSpec((t * b, d * h), self.out_dtype)
        specs.update(self.part_specs(d * 3 * h))  # the input GEMM's operands split into parts
        return specs

    def for_config(self, config: Config) -> "GruTemplate":
        """This template with the buffers ``config``'s plan uses (the split operands with
        ``in_split``): what allocates, passes and checks the buffers of its program."""
        step = self.step_variant(config)
        return replace(self, split_buffers=int(config.in_split), split_parts=self.stored_parts(config),
                       ready_buffer=step.ready_words,
                       hidden_parts=isinstance(step, CellStep) and step.parts,
                       hidden_transposed=isinstance(step, CellStep) and step.transposed)

    def measured_operator(self, config: Config) -> "GruTemplate":
        return self.for_config(config)

    def make_inputs(self, rng: np.random.Generator) -> list[np.ndarray]:
        """x and h0 in [-1, 1]; weights in PyTorch's init range ±1/sqrt(H).  The values are
        float32 numbers (whatever the precision), held in the declared dtypes; ``make_case``
        draws them from the full-precision template, so its reference is unrounded."""
        scale = 1.0 / math.sqrt(self.hidden)
        arrays = []
        for name, spec in self.input_specs().items():
            if name == "lengths":  # uniform in [1, T], the longest row T
                arrays.append(np.maximum(rng.integers(1, self.seq + 1, size=spec.shape), 1).astype(np.int32))
                arrays[-1][0] = self.seq
                continue
            bound = 1.0 if name in ("x", "h0") else scale
            values = rng.uniform(-bound, bound, size=spec.shape).astype(np.float32)
            arrays.append(values if spec.dtype == F32 else cast(values, spec.dtype))
        return arrays

    # ---- layouts: PyTorch <-> device ------------------------------------------------------
    def device_weights(self, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """PyTorch ``state_dict`` arrays (already validated) -> device-layout buffers, in
        the dtypes of ``w_ih`` / ``w_hh``."""
        specs = self.input_specs()
        return {k: cast(v, specs[k].dtype)  # rounded to the weights' dtypes
                for k, v in device_layout(weights, self.layers, self.dirs).items()}

    def torch_weights(self, device: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Device-layout buffers -> PyTorch ``state_dict`` arrays (for the reference)."""
        return torch_layout(device, self.layers, self.dirs, 3 * self.hidden)

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        named = dict(zip(self.input_specs(), inputs))
        x = named["x"].reshape(self.seq, self.batch, self.input)
        out, h_n = gru_reference(x, self.torch_weights(named), named["h0"], self.layers, self.bidirectional,
                                 lengths=named.get("lengths"))
        return [out.reshape(self.seq * self.batch, -1), h_n]

    def flops(self) -> float:
        g = 3 * self.hidden * self.dirs
        per_step = sum(2 * self.batch * g * (self.layer_input(l) + self.hidden) for l in range(self.layers))
        return float(self.seq * per_step)

    # ---- knobs -----------------------------------------------------------------------------
    def input_gemm(self, layer: int, split: bool = False) -> BiasGemmTemplate:
        """S1 of ``layer`` as a GEMM template: A is x (layer 0) or the previous layer's output
        sequence (``out``'s dtype), B is W_ih, D is gi.  ``split``: the float16 GEMM of depth
        3K on the operands' parts (``split.py``), W_ih's scale undone before the float32 bias."""
        if split:
            return BiasGemmTemplate(self.seq * self.batch, self.dirs * 3 * self.hidden,
                                    PARTS * split_depth(self.layer_input(layer)), a_dtype="float16",
                                    b_dtype="float16",
                                    acc_dtype=self.in_acc_dtype, c_dtype=self.gi_dtype,
                                    tensor_core=self.in_split_tensor_core, out_scale=1.0 / SPLIT_WEIGHT_SCALE,
                                    bias_dtype=self.w_ih_dtype)
        return BiasGemmTemplate(self.seq * self.batch, self.dirs * 3 * self.hidden, self.layer_input(layer),
                                a_dtype=self.x_dtype if layer == 0 else self.out_dtype, b_dtype=self.w_ih_dtype,
                                acc_dtype=self.in_acc_dtype, c_dtype=self.gi_dtype,
                                tensor_core=self.in_tensor_core)

    def hidden_gemm(self) -> BiasGemmTemplate:
        """S2 as a GEMM template batched over directions: A is h, B is W_hh (one per
        direction), the bias b_hh, D is gh."""
        return BiasGemmTemplate(self.batch, 3 * self.hidden, self.hidden, a_dtype=self.h_dtype,
                                b_dtype=self.w_hh_dtype, acc_dtype=self.hid_acc_dtype, c_dtype=self.gh_dtype,
                                tensor_core=self.hid_tensor_core, batch=self.dirs)

    def with_tensor_cores(self, target: TargetInfo) -> "GruTemplate":
        """This template with tensor-core tiles (``pick_tile``: mma.sync where one fits the
        shapes) for the input GEMMs and the unfused hidden GEMM where their operands are both
        float16 or both bfloat16 on CUDA (a bfloat16 GEMM on a WMMA tile stays on the CUDA
        cores), and with none elsewhere: what ``GRU.build`` and the Relax GRU run."""
        from tvm_ext.schedules.gemm.tensor_core_tile import pick_tile

        if target.kind != "cuda":
            return replace(self, in_tensor_core=None, hid_tensor_core=None, in_split_tensor_core=None,
                           in_split_wgmma=None, in_split_tf32=None, in_wgmma_tile=None, hid_wgmma_tile=None,
                           hid_tf32_tile=None)
        inputs = [(self.seq * self.batch, self.dirs * 3 * self.hidden, self.layer_input(layer))
                  for layer in range(self.layers)]
        hidden = [(self.batch, 3 * self.hidden, self.hidden)]
        def sixteen_bit(*names: str) -> bool:  # the same 16-bit type: mma.sync takes both
            return len({self.precision[n] for n in names}) == 1 and self.precision[names[0]] in ("float16", "bfloat16")

        split = [(m, n, PARTS * split_depth(k)) for m, n, k in inputs]
        fits = self.split_reason() is None
        return replace(self, in_tensor_core=pick_tile(inputs, target) if sixteen_bit("x", "w_ih") else None,
                       hid_tensor_core=pick_tile(hidden, target) if sixteen_bit("h", "w_hh") else None,
                       in_split_tensor_core=pick_tile(split, target) if fits else None,
                       in_split_wgmma=pick_wgmma_tile(split, target, self.gi_dtype) if fits else None,
                       in_split_tf32=pick_tf32_tile(split, target) if fits and self.gi_dtype == F32 else None,
                       in_wgmma_tile=pick_wgmma_tile(inputs, target, self.gi_dtype, b_layout="KN",
                                                     operand=self.precision["x"], ragged_n=True)
                       if self.wgmma_reason() is None else None,
                       hid_wgmma_tile=step_gemm_tile(pick_wgmma_tile(
                           hidden, target, self.gh_dtype, b_layout="KN", matrices=self.dirs,
                           operand=self.precision["h"], ragged_m=True), self.batch, self.hidden)
                       if sixteen_bit("h", "w_hh") else None, hid_tf32_tile=self.tf32_hidden_tile(target))

    def tf32_hidden_tile(self, target: TargetInfo) -> WgmmaTile | None:
        """The float32 hidden GEMM's tile on TF32 parts (``hid_wgmma`` with ``hid_cell``,
        ``cell_epilogue``; the cell forms make its real tiles from its operand), where h, W_hh, gh,
        its sums and the cell are float32 and ``target`` has wgmma (Hopper)."""
        recurrent = ("h", "w_hh", "gh", "hid_acc", "cell_math")
        if wgmma_target_reason(target) or any(self.precision[n] != F32 for n in recurrent):
            return None
        return WgmmaTile(64, CELL_TILE_COLUMNS, CELL_TILE_STAGES, 1, False, operand="tf32", tma=True)

    def for_target(self, target: TargetInfo) -> "GruTemplate":
        """With the tiles ``GRU.build`` runs on this target (``with_tensor_cores``): a tuned config
        may then split the input GEMM, and its records' workload is the one ``GRU.build`` uses."""
        return self.with_tensor_cores(target)

    def split_reason(self) -> str | None:
        """Why the input GEMM cannot run split into float16 parts (``in_split``), whatever the target."""
        lowered = self._input_gemm_params_not(F32, "in_acc")
        if lowered:
            return (f"input GEMM split (in_split 1) emulates float32 x·W_ihᵀ; {', '.join(lowered)} "
                    f"must be float32")
        return None

    def wgmma_reason(self) -> str | None:
        """Why the (unsplit) input GEMM cannot run on wgmma (``in_wgmma``), whatever the target:
        its operands must be float16, or all bfloat16."""
        operand = self.precision["x"] if self.precision["x"] in ("float16", "bfloat16") else "float16"
        other = self._input_gemm_params_not(operand)
        if other:
            return (f"input GEMM on wgmma (in_wgmma 1) takes float16 or bfloat16 operands, all one type; "
                    f"{', '.join(other)} must be {operand}")
        return None

    def _input_gemm_params_not(self, dtype: str, *extra: str) -> list[str]:
        """The input GEMM's precision parameters not of ``dtype``, sorted: x, W_ih, the layer below's
        output (layer ≥ 1's A, with several layers) and ``extra``."""
        names = ("x", "w_ih", *extra, *(("out",) if self.layers > 1 else ()))
        return sorted(name for name in names if self.precision[name] != dtype)

    def input_on_wgmma(self, config: Config) -> bool:
        """Whether ``config``'s input GEMM is a wgmma kernel (``lowered_kernels``), not a schedule."""
        return config.in_split >= 2 or bool(config.in_wgmma)

    def layers_share_input_gemm(self) -> bool:
        """Whether layers ≥ 1 run layer 0's input GEMM kernel (same K and A dtype)."""
        return self.layer_input(1) == self.input and self.out_dtype == self.x_dtype

    def tensor_core_gemms(self) -> tuple[TensorCoreGemm, ...]:
        full = self.full_precision()
        gemms = [TensorCoreGemm("input GEMM", ("x", "w_ih"), full.input_gemm(0))] if self.in_tensor_core else []
        if self.hid_tensor_core is not None:
            gemms.append(TensorCoreGemm("hidden GEMM (unfused steps)", ("h", "w_hh"), full.hidden_gemm()))
        return tuple(gemms)

    def gemm_templates(self) -> dict[str, GemmTemplate]:
        """The gate GEMMs as GEMM templates, by knob prefix (the hidden one per direction)."""
        return {"in_": self.input_gemm(0), "hid_": self.hidden_gemm()}

    def gemm_configs(self, config: Config, target: TargetInfo) -> dict[str, Config]:
        return {p: gemm_config(config, p, t.default_config(target)) for p, t in self.gemm_templates().items()}

    def space(self, target: TargetInfo) -> Space:
        templates = self.gemm_templates()
        checks = [("in_", "input GEMM", templates["in_"]), ("hid_", "hidden GEMM", templates["hid_"])]
        if self.layers > 1 and self.out_dtype != self.x_dtype:  # layer ≥ 1 stages A in out's dtype
            checks.insert(1, ("in_", "input GEMM of layer 1", self.input_gemm(1)))
        spaces = [(prefix, label, t.space(target)) for prefix, label, t in checks]
        bases = {p: t.default_config(target) for p, t in templates.items()}

        split_spaces = [("input GEMM split", self.input_gemm(layer, True).space(target))
                        for layer in range(min(self.layers, 2))] if self.split_reason() is None else []

        def gemm_reason(c: Config) -> str | None:
            step = self.step_variant(c)
            if c.step_flag_input:
                reason = self.fused_input_reason(c, step)
                if reason:
                    return reason
            if c.in_split:
                reason = self.split_reason() or self.split_target_reason(target, c.in_split)
                if reason:
                    return reason
            if c.in_tf32_promote or c.in_tf32_parts != PARTS:
                reason = self.tf32_input_reason(c)
                if reason:
                    return reason
            if c.in_wgmma:
                reason = self.wgmma_config_reason(c)
                if reason:
                    return reason
            if c.hid_cell_share and not c.hid_cell:
                return "hid_cell_share 1 pairs the tiles of the cell in the hidden GEMM's store (hid_cell 1 or 4)"
            if (c.hid_cell_bt or c.hid_cell_units != CELL_TILE_UNITS) and not c.hid_cell:
                return ("hid_cell_bt 1 (W_hh transposed) and hid_cell_units 24 (narrower tiles) are for the "
                        "cell in the hidden GEMM's store (hid_cell 1-6)")
            if c.hid_wgmma or c.hid_cell:
                reason = self.hidden_wgmma_reason(step, c.hid_cell)
                if reason:
                    return reason
            if c.step_overlap:
                reason = self.overlap_reason(c, step)
                if reason:
                    return reason
            elif c.step_overlap_bn or c.step_overlap_tma or c.step_overlap_stages:
                return ("step_overlap_bn, step_overlap_tma and step_overlap_stages change the tile of an input GEMM "
                        "counted for the steps: step_overlap > 0")
            hidden_gemm = step.runs_hidden_gemm  # else the step kernel does its own
            for prefix, label, space in spaces:
                if prefix == "hid_" and (not hidden_gemm or c.hid_wgmma):
                    continue  # wgmma: its tile was checked when picked
                if prefix == "in_" and step.fuses_input:
                    continue  # no input GEMM runs
                if prefix == "in_" and (c.in_split or c.in_wgmma):
                    continue  # the split GEMM's spaces below; wgmma: its tile was checked when picked
                reason = space.infeasible_reason(gemm_config(c, prefix, bases[prefix]))
                if reason:
                    return f"{label}: {reason}"
            for label, space in split_spaces if c.in_split == 1 else ():
                reason = space.infeasible_reason(gemm_config(c, "in_", bases["in_"]))
                if reason:
                    return f"{label}: {reason}"
            return None

        def step_reason(c: Config) -> str | None:
            return self.step_variant(c).reason(target)

        return Space(KNOBS, (gemm_reason, step_reason))

    def fused_input_reason(self, c: Config, step: StepVariant) -> str | None:
        """Why ``c``'s step kernel cannot run the input GEMM itself (``step_flag_input`` 1)."""
        if not step.fuses_input:
            return "step_flag_input 1 is the flag-exchange step kernel's (step_flags 1, step_tc 0, step_loop 2)"
        if c.in_split or c.in_wgmma:
            return ("step_flag_input 1 runs x·W_ihᵀ in the step kernel: no input GEMM to split (in_split) or put on "
                    "wgmma")
        if self.variable_lengths:
            return "step_flag_input 1: variable lengths hold each row's gates in gi, which that kernel does not write"
        if self.layers > 1 and not self.layers_share_input_gemm():
            return (f"step_flag_input 1: one step kernel serves every layer, so each layer's input must be "
                    f"{self.input} deep and {self.x_dtype} (layer 1 reads {self.layer_input(1)} of {self.out_dtype})")
        return None

    def split_target_reason(self, target: TargetInfo, split: int = 1) -> str | None:
        """Why ``target`` cannot run the split input GEMM: on CUDA it exists for the tensor
        cores; OpenCL runs its arithmetic on the CUDA cores (no faster than float32) where the
        device has float16 (cl_khr_fp16); ``split`` 2 needs a wgmma tile."""
        if split == 2 and self.in_split_wgmma is None:
            return ("input GEMM split on wgmma (in_split 2) needs a Hopper GPU (sm_90) and a wgmma tile dividing "
                    f"the (T·B, 3H, 3·input) GEMM, {self.seq * self.batch} rows (GRU.build picks one)")
        if split == 3:
            if self.in_split_tf32 is None:
                return ("input GEMM split into TF32 parts (in_split 3) needs a Hopper GPU (sm_90), float32 gi and a "
                        f"TF32 wgmma tile dividing the (T·B, 3H, 3·input) GEMM, {self.seq * self.batch} rows "
                        "(GRU.build picks one)")
            return None
        if "float16" not in target.float_dtypes:
            return f"input GEMM split (in_split 1) stores float16 parts; this {target.kind} device has no float16"
        if target.kind == "cuda" and not (self.in_split_tensor_core is not None
                                          and self.input_gemm(0, True).uses_tensor_cores(target)):
            return ("input GEMM split (in_split 1) on CUDA needs a float16 tensor-core tile for the "
                    "(T·B, 3H, 3·input) GEMM (sm_70 or newer; GRU.build picks one)")
        return None

    def tf32_input_reason(self, c: Config) -> str | None:
        """Why ``c``'s input GEMM of TF32 parts cannot promote its sums every ``in_tf32_promote`` k
        steps in two alternating accumulator sets, or read its operands from two stored parts
        (``in_tf32_parts`` 2: TMA loads, so a counted tile's with step_overlap_tma 1)."""
        if c.in_split != 3:
            return "in_tf32_promote and in_tf32_parts change the input GEMM of TF32 parts (in_split 3)"
        if c.in_tf32_parts != PARTS and c.step_overlap and not c.step_overlap_tma:
            return "in_tf32_parts 2 reads the parts in turn through the TMA: the counted GEMM needs step_overlap_tma 1"
        return tf32_parts_reason(self.tf32_input_tile(c), [self.input_depth(i, c) for i in self.input_gemm_kinds()],
                                 c.in_tf32_parts, c.in_tf32_promote)

    def tf32_input_tile(self, config: Config) -> WgmmaTile | None:
        """The tile of the input GEMM of TF32 parts (in_split 3): the counted one, or the picked
        one, loaded by the TMA where it reads two stored parts."""
        tile = self.counted_gemm_tile(config)
        if tile is None and self.in_split_tf32 is not None:
            tile = replace(self.in_split_tf32, tma=True) if self.stored_parts(config) == 2 else self.in_split_tf32
        return tile

    def wgmma_config_reason(self, c: Config) -> str | None:
        """Why ``c``'s input GEMM cannot run on wgmma (``in_wgmma`` 1) with this template's tiles."""
        if c.in_split:
            return ("in_wgmma 1 runs the 16-bit input GEMM on wgmma; the float32 one split into parts runs there "
                    "with in_split 2 or 3 (in_wgmma 0)")
        if self.wgmma_reason():
            return self.wgmma_reason()
        if self.in_wgmma_tile is None:
            return ("input GEMM on wgmma (in_wgmma 1) needs a Hopper GPU (sm_90) and a wgmma tile for the "
                    f"({self.seq * self.batch}, {self.dirs * 3 * self.hidden}, input) GEMMs: the input a multiple "
                    "of 8 and dirs·3H even, a multiple of 8 where no tile divides it (GRU.build picks one)")
        return None

    def hidden_wgmma_reason(self, step: StepVariant, cell: int = 0) -> str | None:
        """Why a config of ``step`` cannot run the hidden GEMM on wgmma (``hid_wgmma`` 1) with this
        template's tile, or (``cell``: a ``hid_cell`` form) the cell in its store."""
        if cell and (not isinstance(step, CellStep) or step.wgmma is None):
            return f"hid_cell {cell} runs the cell in the store of the hidden GEMM on wgmma (fuse_step 0, hid_wgmma 1)"
        if cell and step.wgmma.multicast and step.wgmma.split > 1:
            return (f"hid_cell_share 1 pairs the tiles of a cell form with K whole (hid_cell 1 or 4), not hid_cell "
                    f"{cell}'s halves of K")
        if cell and step.transposed and step.parts:
            return "hid_cell_bt 1 transposes a 16-bit W_hh; float32's TF32 parts are stored transposed already"
        if cell:
            return cell_tile_reason(step.wgmma, self.batch, self.hidden, step.transposed)
        if not step.runs_hidden_gemm:
            return "hid_wgmma 1 runs the unfused steps' hidden GEMM on wgmma (fuse_step 0)"
        if self.hid_wgmma_tile is None and self.hid_tf32_tile is not None:
            return ("the float32 hidden GEMM on wgmma (hid_wgmma 1, TF32 parts) runs with the cell in its store "
                    "(hid_cell 1-6)")
        if self.hid_wgmma_tile is None:
            return ("hidden GEMM on wgmma (hid_wgmma 1) needs a Hopper GPU (sm_90), float16 or bfloat16 h and W_hh "
                    f"(or float32 ones with the cell in its store) and a wgmma tile for the ({self.batch}, 3H, H) "
                    "GEMMs: K and 3H multiples of 64 (GRU.build picks one)")
        return None

    def step_sizes(self) -> StepSizes:
        """What the step kernels need of this GRU: sizes and the recurrent part's types."""
        p = self.precision
        return StepSizes(self.seq, self.batch, self.hidden, self.dirs, self.layers, gi_dtype=p["gi"], h_dtype=p["h"],
                         w_dtype=p["w_hh"], acc_dtype=p["hid_acc"], gh_dtype=p["gh"], math_dtype=p["cell_math"],
                         out_dtype=p["out"], input=self.input, x_dtype=p["x"], w_ih_dtype=p["w_ih"])

    def step_variant(self, config: Config) -> StepVariant:
        """The step kernel ``config`` selects, its knobs decoded (``variants.py``): what the
        space, the kernels, the host plan and the pick ask about the steps."""
        step = select_step_variant(self.step_sizes(), config, self.hidden_gemm(),
                                   self.hid_wgmma_tile or self.hid_tf32_tile)
        tile = self.counted_gemm_tile(config)
        if tile is not None and step.counts_gi:  # gi counted by the GEMM
            count = stored_row_count(self.gi_shape[1], tile.bn, tile.split, tile.cluster)
            return replace(step, gi_ready=(tile.bm, count))
        return step

    def counted_gemm_tile(self, config: Config) -> WgmmaTile | None:
        """With ``step_overlap``: the wgmma tile of the input GEMM that counts its stored rows of
        gi for the step kernel launched while it runs (None: no such GEMM)."""
        if not config.step_overlap:
            return None
        tile = {2: self.in_split_wgmma, 3: self.in_split_tf32}.get(config.in_split,
                                                                   self.in_wgmma_tile if config.in_wgmma else None)
        if tile is None:
            return None
        if config.step_overlap_bn:  # narrower columns: the first tile rows stored sooner
            tile = replace(tile, bn=config.step_overlap_bn)
        if config.step_overlap_tma:
            tile = replace(tile, tma=True)
        if config.step_overlap_stages:
            tile = replace(tile, stages=config.step_overlap_stages)
        return in_row_order(tile, *self.gi_shape, self.counted_depth(config), config.step_overlap,
                            "NK" if config.in_split else "KN", ends=2 if self.bidirectional else 1)

    def counted_depth(self, config: Config) -> int:
        """Layer 0's input GEMM depth (its float16 or TF32 parts' with ``in_split``)."""
        return self.input_depth(0, config)

    def overlap_reason(self, c: Config, step: StepVariant) -> str | None:
        """Why ``c``'s step kernel cannot start while its input GEMM runs (``step_overlap`` N)."""
        if not step.counts_gi:
            return ("step_overlap is the tensor-core step kernel's with exchange words (step_tc 1 or 2, step_flags 1) "
                    "or the resident-W cell step kernel's with its grid barrier (step_cell 1, step_flags 0)")
        tile = self.counted_gemm_tile(c)
        if tile is None:
            return "step_overlap needs the input GEMM on wgmma (in_wgmma 1, or in_split 2 or 3): it counts its rows"
        own = self.counted_gemm_tile(c.replace(step_overlap_bn=0, step_overlap_tma=0, step_overlap_stages=0))
        if c.step_overlap_bn and c.step_overlap_bn >= own.bn:
            return f"step_overlap_bn {c.step_overlap_bn} must narrow the input GEMM's tile of {own.bn} columns"
        if c.step_overlap_tma and own.tma:
            return "step_overlap_tma: the input GEMM's own tile loads with TMA already"
        if c.step_overlap_stages and c.step_overlap_stages <= own.stages:
            return (f"step_overlap_stages {c.step_overlap_stages} must deepen the input GEMM's pipeline of "
                    f"{own.stages} stages")
        if self.variable_lengths:
            return "step_overlap: variable lengths hold gi's rows in a kernel between the GEMM and the steps"
        m, n = self.gi_shape
        rows, columns = -(-m // tile.bm), -(-n // tile.bn)
        if not row_order_divides(rows, columns, tile.tiles):
            return (f"step_overlap {c.step_overlap}: the counting GEMM's {tile.tiles} tiles a block must divide its "
                    f"{rows} tile rows of {tile.bm} or all its {rows * columns} tiles")
        layout = "NK" if c.in_split else "KN"
        reason = signal_reason(tile, plain_bias=True) or next(  # one tile counts every layer's GEMM
            (r for r in (wgmma_reason(tile, m, n, self.input_depth(i, c), b_layout=layout)
                         for i in self.input_gemm_kinds()) if r), None)
        if reason:
            return f"step_overlap {c.step_overlap}: {reason}"
        if step.ready_words > self.dirs * self.batch * self.hidden:
            return (f"step_overlap: the init zeroes {step.ready_words} counts of gi's tile rows with its "
                    f"{self.dirs * self.batch * self.hidden} threads")
        return None

    def shown_knobs(self, config: Config) -> tuple[str, ...]:
        """The knobs of the step kernel ``config`` selects: unfused no ``step_*`` knob matters;
        fused neither the cell kernel's block nor the hidden GEMM's tile, nor the knobs of the
        other fused kernels."""
        prefixes, names = self.step_variant(config).unshown()
        return tuple(name for name, _ in config.items if not name.startswith(prefixes) and name not in names)

    def default_config(self, target: TargetInfo) -> Config:
        """The published pipeline (no step fusion, 512-thread cell blocks) with sensible GEMM tiles."""
        values: dict[str, Any] = {"cell_block": 512, "fuse_step": 0, "step_j": 64, "step_b": 1, "step_u": 1,
                                  "step_bt": 1, "step_k": 32, "step_pipeline": 0, "step_ks": 1, "step_loop": 0,
                                  "step_prefetch": 0, "step_barrier": 0, "step_w_onchip": 0, "step_tc": 0,
                                  "step_tc_rows": 16, "step_tc_kw": 1, "step_tc_nw": 1, "step_tc_acc": 1,
                                  "step_tc_frag": 0, "step_tc_wreg": 0, "step_tc_wregs": 96, "step_tc_poll": 8,
                                  "step_tc_warp_h": 0, "step_tc_stack": 0, "step_split_words": 1, "step_tc_ahead": 1,
                                  "step_overlap": 0, "step_overlap_bn": 0, "step_overlap_tma": 0,
                                  "step_overlap_stages": 0,
                                  "step_flags": 0, "step_flag_units": 8, "step_flag_input": 0, "step_cluster_quads": 0,
                                  "step_cluster_pull": 0,
                                  "in_split": 0, "in_wgmma": 0, "in_tf32_promote": 0, "in_tf32_parts": 3,
                                  "hid_wgmma": 0, "hid_cell": 0, "hid_cell_share": 0, "hid_cell_bt": 0,
                                  "hid_cell_units": CELL_TILE_UNITS, "step_cell": 0, "step_cell_stages": 4,
                                  "step_cell_inflight": 1}
        for prefix, template in self.gemm_templates().items():
            values.update({prefix + k: v for k, v in default_gemm_config(template, target).items})
        names = set(self.space(target).names)
        return self.space(target).make(**{k: v for k, v in values.items() if k in names})

    def analytic_pick(self, target: TargetInfo) -> tuple[Config, str]:
        """A config for this shape without measuring (``GRU.build`` without a config, and
        ``tune gru --strategy analytic``), and why (the rules: ``pick.py``)."""
        from .pick import analytic_pick

        return analytic_pick(self, target)

    # ---- kernels and plan ------------------------------------------------------------------
    def kernels(self, config: Config, target: TargetInfo) -> dict[str, Any]:
        """Scheduled ``s_tir.Schedule`` of each kernel function the plan calls, by name."""
        t, b, h, d, layers = self.seq, self.batch, self.hidden, self.dirs, self.layers
        in_gemm = self.gemm_configs(config, target)["in_"]
        p = self.precision
        step = self.step_variant(config)
        init = init_func(b, h, d, layers, p["h"], **step.init_layout())
        split = bool(config.in_split)
        funcs = {"gru_init": schedule_init(init, min(256, target.max_threads_per_block))}
        for i in () if step.fuses_input else self.input_gemm_kinds():
            if not self.input_on_wgmma(config):  # wgmma: ``lowered_kernels``
                funcs[f"gru_gemm_x{i}"] = self.input_gemm(i, split).schedule(in_gemm, target)
            if split:
                threads, k = min(256, target.max_threads_per_block), self.layer_input(i)
                if not self.split_rows_written(config, i):
                    rows = split_rows_func(t * b, k, tf32=config.in_split == 3, parts=self.stored_parts(config))
                    funcs[f"gru_split_x{i}"] = schedule_elementwise(rows, "split", threads)
                if config.in_split == 1:  # wgmma's N-major parts: ``lowered_kernels``
                    funcs[f"gru_split_w{i}"] = schedule_elementwise(split_weight_func(k, d * 3 * h), "split", threads)
        funcs.update(step.scheduled_kernels(target))  # none for the kernels written as loops (``lowered_kernels``)
        if self.variable_lengths:
            threads = min(256, target.max_threads_per_block)
            hold = hold_func(t, b, h, d, p["gi"], row_vector(h, p["gi"], target.kind))
            zero = zero_out_func(t, b, d * h, p["out"], row_vector(h, p["out"], target.kind))
            funcs["gru_hold"] = schedule_elementwise(hold, "hold", threads, vectorized=True)
            funcs["gru_zero_out"] = schedule_elementwise(zero, "zero_out", threads, vectorized=True)
        return funcs

    def lowered_kernels(self, config: Config) -> dict[str, Any]:
        """Kernel functions written as lowered loops rather than scheduled (PrimFuncs by name):
        the tensor-core persistent step kernel (``step_tc``), the flag-exchange one
        (``step_flags``) and the input GEMM on wgmma (``in_split`` 2, ``in_wgmma``)."""
        return {**wgmma_input_gemms(self, config), **self.step_variant(config).lowered_kernels()}

    def input_gemm_kinds(self) -> tuple[int, ...]:
        """The input GEMM functions: 0, and 1 for layers >= 1 where their depth or A type differ."""
        return (0,) if self.layers == 1 or self.layers_share_input_gemm() else (0, 1)

    def input_gemm_kind(self, layer: int) -> int:
        """The input GEMM function ``layer`` runs (``input_gemm_kinds``)."""
        return 0 if layer == 0 or self.layers_share_input_gemm() else 1

    # ---- host plan, build and measurement (``plan.py``) -----------------------------------------
    def plan(self, config: Config) -> tuple[host_plan.Call, ...]:
        """Every call of one forward pass, in order: per layer init, S1, then T steps."""
        return host_plan.plan_calls(self, config)

    def compile(self, config: Config, target: TargetInfo) -> host_plan.CompiledGru:
        """Schedule and compile every kernel function into one module (one source)."""
        return host_plan.compile_gru(self, config, target)

    def build_program(self, config: Config, target: TargetInfo) -> CompiledProgram:
        """Every kernel function and the host plan of one forward pass (``plan.build_program``)."""
        return host_plan.build_program(self, config, target)

    def schedule(self, config: Config, target: TargetInfo) -> Any:
        raise TvmExtError("a GRU is several kernels and a host loop: use build_program or GRU.build")

    def run_plan(self, config: Config, artifact: Artifact) -> RunPlan:
        """The whole pass timed by the host clock, stage times, the barrier flag (``plan.run_plan``)."""
        return host_plan.run_plan(artifact)
