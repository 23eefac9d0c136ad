"""GRU inference (patent 004) as TVM kernels, with PyTorch's semantics and weight layout.

Everything about the GRU lives here: the float64 numpy reference of
``torch.nn.GRU``, the kernels (TE GEMMs and TIR cell kernels), their knobs, the
host plan that strings the kernels over time steps and layers, a ``Template``
whose "kernel" is the whole layer (so the GA tuner searches it), and the
user-facing ``GRU`` object (build once, run many times).

Pipeline per layer (patent 004), gate order r, z, n as in PyTorch:

- S1 ``gi = x·W_iᵀ + b_i`` for all T steps and both directions in one GEMM,
  shape (T·B, dirs·3H).
- S2 per step ``gh = h·W_hᵀ + b_h``, a GEMM batched over directions, (dirs, B, 3H).
- S3/S4 per step one cell kernel, grid (batch, dirs), block ``cell_block``
  threads: r, z, n, h' and the writes of h' (the backward direction walks time
  in reverse, so it reads and writes step T-1-s).

Beyond the patent (knob ``fuse_step``): S2 and S3 fused into one kernel per step,
each thread owning one hidden unit's three gate dot products for a few batch
rows, so a step costs one launch and ``gh`` never goes through global memory.

The per-step loop is host code that only enqueues compiled kernels: the step
index and layer are scalar kernel arguments, the hidden state ping-pongs
between two buffers, and nothing per element happens in Python.  On CUDA the
fused step kernel can also run every step from one call (knob ``step_loop``,
``tvm_ext.step_loop``): a loop in TVM's host function, or a persistent kernel
whose blocks meet at a grid barrier between steps (its state ping-pongs inside
one buffer, ``hs``, indexed by the step's parity).

Precision (method 003): every tensor, accumulator and the cell's math type is a
``PrecisionParam`` tied to the stage that owns it (``PRECISION_PARAMS``): stage
"input_gemm" (S1: ``x``, ``w_ih``, ``in_acc``, ``gi``), "hidden_gemm" (S2:
``w_hh``, ``hid_acc``, ``gh``) and "cell" (S3/S4: ``h``, ``cell_math``, ``out``).
Kernels widen what they load to their accumulator or math type and narrow what
they store to the tensor's type; all float32 (the default) is the program above,
unchanged.  Choices where a buffer has no parameter of its own: the biases take
their weights' type; h0, the state ping-pong buffers and h_n are ``h``; the
inner layers' output sequences (which feed layer ≥ 1's input GEMM) are written by
the same cell kernel as the final output, so they are ``out`` (layer ≥ 1's input
GEMM reads its A operand in ``out``'s type, a kernel of its own when that differs
from ``x``); in the fused step kernel gh never reaches memory, yet its gate sums
are still rounded to ``gh`` before the cell uses them, so a precision assignment
computes the same numbers whatever the fusion knob says.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from tvm_ext.errors import TvmExtError
from tvm_ext.precision import FLOAT_DTYPES, HIGH_PRECISION, DtypeFields, PrecisionParam, cast, itemsize
from tvm_ext.precision import np_dtype, relative_error
from tvm_ext.schedules.gemm import KNOBS as GEMM_KNOBS
from tvm_ext.schedules.gemm import GemmTemplate, MatmulSite
from tvm_ext import step_loop
from tvm_ext.space import Config, Knob, Space
from tvm_ext.step_loop import BARRIER_WORDS
from tvm_ext.cost_model.hardware import HardwareModel
from tvm_ext.target import TargetInfo
from tvm_ext.template import Template, TensorSpec

# ---- knobs -----------------------------------------------------------------------------
STEP_KNOBS = (
    Knob("cell_block", (32, 64, 128, 256, 512, 1024),
         "cell kernel threads per block (patent: 512), clamped to the device limit"),
    Knob("fuse_step", (0, 1),
         "1: hidden GEMM + cell in one kernel per step (one launch fewer per step)"),
    Knob("step_j", (8, 16, 32, 64, 128, 256), "fused step kernel: hidden units per block, one per thread "
                                             "(times step_ks threads)"),
    Knob("step_b", (1, 2, 4, 8, 16), "fused step kernel: batch rows per thread (reuse of W_h in registers)"),
    Knob("step_k", (8, 16, 32, 64), "fused step kernel: slice of h staged in shared memory"),
    Knob("step_ks", (1, 2, 4, 8), "fused step kernel: threads splitting each dot product over k "
                                  "(more warps in flight; partial sums meet in shared memory)"),
    Knob("step_loop", (0, 1, 2), "fused step kernel, CUDA: 0 one call per step from Python; 1 the step "
                                 "loop compiled into TVM's host code (one call per layer); 2 persistent: "
                                 "one launch per layer, a grid barrier between steps (grid <= SM count)"),
    Knob("step_w_onchip", (0, 1), "fused step kernel: 1 stages the block's W_hh slice (step_j units x 3 gates "
                                  "x hidden) in shared memory; the persistent kernel loads it once for all "
                                  "T steps, so W_hh stays on chip (else every step re-reads it from L2)"),
)
# A persistent step kernel's blocks must all be resident; the SM keeps 1 KiB of shared
# memory per resident block (sm_80+), and fitting several blocks per SM by capping
# registers (launch bounds) is refused below this many registers per thread (spills).
SHARED_RESERVED_PER_BLOCK = 1024
PERSISTENT_MIN_REGISTERS = 64
# The hidden GEMM is batched over directions, so it has its own schedule (below) that
# implements these of the GEMM template's knobs; the input GEMM is the template's own
# schedule and searches all of them.
BATCHED_GEMM_KNOBS = ("wg_x", "wg_y", "task_x", "task_y", "k_step", "use_shared", "pad", "unroll",
                      "vec", "double_buffer")
IN_GEMM_KNOBS = GEMM_KNOBS
HID_GEMM_KNOBS = tuple(k for k in GEMM_KNOBS if k.name in BATCHED_GEMM_KNOBS)
KNOBS = (STEP_KNOBS
         + tuple(Knob("in_" + k.name, k.choices, "input GEMM (S1): " + k.doc) for k in IN_GEMM_KNOBS)
         + tuple(Knob("hid_" + k.name, k.choices, "hidden GEMM (S2): " + k.doc) for k in HID_GEMM_KNOBS))


# ---- precision ---------------------------------------------------------------------------
F32 = HIGH_PRECISION
STAGES = ("input_gemm", "hidden_gemm", "cell")
PRECISION_PARAMS = (
    PrecisionParam("x", "input_gemm", "tensor",
                   "input sequence x (the inner layers' output sequences, which layer >= 1's input "
                   "GEMM reads, are stored in out's type)"),
    PrecisionParam("w_ih", "input_gemm", "tensor", "input weights W_ih and their biases b_ih"),
    PrecisionParam("in_acc", "input_gemm", "accumulator", "type S1 accumulates x·W_ihᵀ + b_ih in"),
    PrecisionParam("gi", "input_gemm", "tensor", "input-gate buffer gi (T·B, dirs·3H)"),
    PrecisionParam("w_hh", "hidden_gemm", "tensor", "hidden weights W_hh and their biases b_hh"),
    PrecisionParam("hid_acc", "hidden_gemm", "accumulator", "type S2 accumulates h·W_hhᵀ + b_hh in"),
    PrecisionParam("gh", "hidden_gemm", "tensor",
                   "hidden-gate buffer gh (dirs, B, 3H); in the fused step kernel the register "
                   "gate sums are rounded to it"),
    PrecisionParam("h", "cell", "tensor", "hidden state: h0, the ping-pong state buffers and h_n"),
    PrecisionParam("cell_math", "cell", "math", "type the cell computes sigmoid, tanh and the blend in"),
    PrecisionParam("out", "cell", "tensor", "output sequence (and the inner layers' output sequences)"),
)
# Kernel function (name prefix) -> the stages its time counts toward.  The fused step
# kernel is both the hidden GEMM and the cell, so its time counts toward both.
FUNCTION_STAGES = {"gru_init": ("cell",), "gru_gemm_x": ("input_gemm",), "gru_gemm_h": ("hidden_gemm",),
                   "gru_cell": ("cell",), "gru_step": ("hidden_gemm", "cell")}  # also gru_steps (all steps)


def function_stages(name: str) -> tuple[str, ...]:
    """The stages of a kernel function or of one of its device kernels ("gru_cell_kernel")."""
    for prefix, stages in FUNCTION_STAGES.items():
        if name.startswith(prefix):
            return stages
    raise TvmExtError(f"kernel {name!r} belongs to no GRU stage")


def gemm_config(config: Config, prefix: str, base: Config) -> Config:
    """The GEMM config held in a GRU config under ``prefix``; GEMM knobs the GRU does not
    search keep ``base``'s values (the GEMM template's default)."""
    values = config.as_dict()
    return base.replace(**{k: values[prefix + k] for k in base.as_dict() if prefix + k in values})


# ---- reference ---------------------------------------------------------------------------
def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # exact identity, no overflow warnings


def gru_reference(x: np.ndarray, weights: Mapping[str, np.ndarray], h0: np.ndarray | None = None,
                  num_layers: int = 1, bidirectional: bool = False,
                  batch_first: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``torch.nn.GRU`` forward: (output, h_n), PyTorch's equations and layouts."""
    x = np.asarray(x, np.float64)
    if batch_first:
        x = x.transpose(1, 0, 2)
    steps, batch, _ = x.shape
    dirs = 2 if bidirectional else 1
    hidden = np.asarray(weights["weight_hh_l0"]).shape[1]
    h_all = np.zeros((num_layers * dirs, batch, hidden)) if h0 is None else np.asarray(h0, np.float64)
    layer_in, h_n = x, []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            sfx = f"l{layer}" + ("_reverse" if d else "")
            w_ih = np.asarray(weights[f"weight_ih_{sfx}"], np.float64)
            w_hh = np.asarray(weights[f"weight_hh_{sfx}"], np.float64)
            b_ih = np.asarray(weights.get(f"bias_ih_{sfx}", np.zeros(3 * hidden)), np.float64)
            b_hh = np.asarray(weights.get(f"bias_hh_{sfx}", np.zeros(3 * hidden)), np.float64)
            gi = layer_in @ w_ih.T + b_ih  # (T, B, 3H): S1 for all steps
            h = h_all[layer * dirs + d]
            seq = np.empty((steps, batch, hidden))
            for t in (range(steps) if d == 0 else reversed(range(steps))):
                gh = h @ w_hh.T + b_hh
                r = _sigmoid(gi[t, :, :hidden] + gh[:, :hidden])
                z = _sigmoid(gi[t, :, hidden:2 * hidden] + gh[:, hidden:2 * hidden])
                n = np.tanh(gi[t, :, 2 * hidden:] + r * gh[:, 2 * hidden:])
                h = (1.0 - z) * n + z * h
                seq[t] = h
            outs.append(seq)
            h_n.append(h)
        layer_in = np.concatenate(outs, axis=2)
    out = layer_in.transpose(1, 0, 2) if batch_first else layer_in
    return out, np.stack(h_n)


# ---- kernels -----------------------------------------------------------------------------
def gemm_bias_func(batch: int, m: int, n: int, k: int, a_dtype: str = F32, b_dtype: str = F32,
                   acc_dtype: str = F32, c_dtype: str = F32) -> Any:
    """TE ``D = A·B + bias`` (``batch`` = 0: 2-D; else a leading batch axis, one B per batch).

    The bias is stored in B's type (a weight); A, B and the bias are widened to
    ``acc_dtype``, and D is narrowed to ``c_dtype`` as it is stored."""
    from tvm import te

    lead = (batch,) if batch else ()
    a = te.placeholder(lead + (m, k), a_dtype, name="A")
    b = te.placeholder(lead + (k, n), b_dtype, name="B")
    bias = te.placeholder(lead + (n,), b_dtype, name="bias")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute(lead + (m, n), lambda *i: te.sum(a[i[:-1] + (r,)].astype(acc_dtype)
                                                    * b[i[:-2] + (r, i[-1])].astype(acc_dtype), axis=r),
                   name="C")
    d = te.compute(lead + (m, n), lambda *i: (c[i] + bias[i[:-2] + (i[-1],)].astype(acc_dtype)).astype(c_dtype),
                   name="D")
    return te.create_prim_func([a, b, bias, d])


@dataclass(frozen=True)
class BiasGemmTemplate(GemmTemplate):
    """The GEMM template with a bias row, D = A·B + bias: the template's own schedule
    applies unchanged, and the bias is folded into the register tile's store.  The bias
    has B's dtype (it belongs to the weights); the narrowing to ``c_dtype`` is part of D."""

    name = "gemm_bias"

    def prim_func(self) -> Any:
        return gemm_bias_func(0, self.m, self.n, self.k, self.a_dtype, self.b_dtype, self.acc_dtype,
                              self.c_dtype)

    def own_site(self) -> MatmulSite:
        return MatmulSite()  # D (bias and narrowing) is inlined after the GEMM's schedule

    def inputs(self) -> list[TensorSpec]:
        return super().inputs() + [TensorSpec((self.n,), self.b_dtype)]

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a, b, bias = inputs
        return [a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64)]

    def schedule(self, config: Config, target: TargetInfo) -> Any:
        if self.uses_tensor_cores(target):
            return self._tensor_core_schedule(("D",))
        sch = super().schedule(config, target)
        sch.reverse_compute_inline(sch.get_sblock("D"))
        return sch


def schedule_batched_gemm(batch: int, m: int, n: int, k: int, c: Config, a_dtype: str = F32,
                          b_dtype: str = F32, acc_dtype: str = F32, c_dtype: str = F32,
                          tensor_core: Config | None = None, target: TargetInfo | None = None) -> Any:
    """The GEMM template's schedule (the ``BATCHED_GEMM_KNOBS``, same meaning) with a
    leading batch axis on blockIdx.z and the bias folded into the register tile's store
    (dtypes as in ``gemm_bias_func``); on tensor cores with the WMMA tile ``tensor_core``
    where it applies (float16 A and B on CUDA, see ``GemmTemplate.tensor_core``)."""
    from tvm import s_tir

    from tvm_ext.schedules.tensor_core import schedule_wmma, uses_tile

    if uses_tile(tensor_core, m, n, k, a_dtype, b_dtype, acc_dtype, target):
        func = gemm_bias_func(batch, m, n, k, a_dtype, b_dtype, acc_dtype, c_dtype)
        return schedule_wmma(s_tir.Schedule(func), "C", tensor_core, epilogue=("D",))

    bm, bn = c.wg_y * c.task_y, c.wg_x * c.task_x
    sch = s_tir.Schedule(gemm_bias_func(batch, m, n, k, a_dtype, b_dtype, acc_dtype, c_dtype))
    gemm = sch.get_sblock("C")
    pads = {"A": m % bm != 0 or k % c.k_step != 0, "B": k % c.k_step != 0 or n % bn != 0,
            "C": m % bm != 0 or n % bn != 0}
    if any(pads.values()):
        sch.pad_einsum(gemm, [1, bm, bn, c.k_step])
    z, i, j, kk = sch.get_loops(gemm)
    by, ty, ii = sch.split(i, [None, c.wg_y, c.task_y])
    # N interleaved as in the template: vec adjacent columns per chunk, wg_x·vec apart.
    bx, vx, tx, jj = sch.split(j, [None, c.task_x // c.vec, c.wg_x, c.vec])
    ko, ki = sch.split(kk, [None, c.k_step])
    sch.reorder(z, by, bx, vx, ty, tx, ko, ki, ii, jj)
    sch.bind(z, "blockIdx.z")
    sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(vx, "vthread.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")

    acc = sch.cache_write(gemm, 0, "local")
    sch.reverse_compute_at(acc, tx)
    if pads["C"]:
        sch.reverse_compute_inline(sch.get_sblock("C_pad"))
    sch.reverse_compute_inline(sch.get_sblock("D"))  # bias added as the tile is stored
    if c.vec > 1 and not pads["C"]:
        sch.vectorize(sch.get_loops(acc)[-1])

    if c.use_shared:
        for operand, name in ((0, "A"), (1, "B")):
            stage = sch.cache_read(gemm, operand, "shared")
            sch.compute_at(stage, ko)
            if pads[name]:
                sch.compute_inline(sch.get_sblock(f"{name}_pad"))
            if c.pad:  # row stride = row length + vec: rows start on different banks
                row = c.k_step if name == "A" else bn
                sch.storage_align(stage, 0, axis=1, factor=row, offset=c.vec % row)
            own = sch.get_loops(stage)[7:]  # below z, by, bx, vx, ty, tx, ko
            fused = own[0] if len(own) == 1 else sch.fuse(*own)
            _, fy, fx, fv = sch.split(fused, [None, c.wg_y, c.wg_x, c.vec])
            sch.bind(fy, "threadIdx.y")
            sch.bind(fx, "threadIdx.x")
            if c.vec > 1 and not pads[name]:
                sch.vectorize(fv)
        for operand in (0, 1):  # register fragments: the inner product reads registers
            frag = sch.cache_read(gemm, operand, "local")
            sch.compute_at(frag, ki)
            if operand == 1 and c.vec > 1:
                sch.vectorize(sch.get_loops(frag)[-1])
        if c.double_buffer:
            sch.annotate(ko, "software_pipeline_stage", [0, 0, 1])
            sch.annotate(ko, "software_pipeline_order", [0, 1, 2])
    else:
        for name in ("A", "B"):
            if pads[name]:
                sch.compute_inline(sch.get_sblock(f"{name}_pad"))
    if c.unroll:
        sch.annotate(z, "pragma_auto_unroll_max_step", c.unroll)
        sch.annotate(z, "pragma_unroll_explicit", 1)
    sch.decompose_reduction(gemm, ko)
    return sch


def _cell_math(T: Any, gi: Any, row: Any, col: Any, hidden: int, gh_r: Any, gh_z: Any, gh_n: Any,
               h: Any, math: str) -> Any:
    """PyTorch's cell in type ``math`` (every operand widened to it first): r, z from
    input+hidden gates; n = tanh(gi_n + r·gh_n); h' = (1-z)n + z·h."""
    import tvm

    def m(value: Any) -> Any:
        return value.astype(math)  # no cast when the type already is ``math``

    r = T.sigmoid(m(gi[row, col]) + m(gh_r))
    z = T.sigmoid(m(gi[row, col + hidden]) + m(gh_z))
    n = T.tanh(m(gi[row, col + 2 * hidden]) + r * m(gh_n))
    return (tvm.tirx.const(1.0, math) - z) * n + z * m(h)


def _stored_as(value: Any, dtype: str) -> Any:
    """``value`` rounded to ``dtype`` as storing it in a ``dtype`` buffer would, for a value
    that stays in registers.  bfloat16 is rounded with integer ops on the float32 bits
    (round to nearest even, as TVM's bfloat16 stores do), because TVM computes bfloat16 in
    float32 where the target has no bfloat16 arithmetic and would drop a plain cast there."""
    from tvm import tirx

    if dtype != "bfloat16":
        return value.astype(dtype)
    u32 = lambda v: tirx.const(v, "uint32")  # noqa: E731
    bits = tirx.reinterpret("uint32", value.astype("float32"))
    rounded = (bits + u32(0x7FFF) + ((bits >> u32(16)) & u32(1))) & u32(0xFFFF0000)
    return tirx.reinterpret("float32", rounded)


def _store_macro(steps: int, batch: int, hidden: int, dirs: int, h_dtype: str, out_dtype: str,
                 pingpong: bool = False) -> Any:
    """S4 of the cell and of the fused step kernel: h' (math type) into the next state and
    h_n as ``h_dtype``, and into out[t] (t = step, or T-1-step backward) as ``out_dtype``.
    ``pingpong``: the state is one (2, dirs, batch, hidden) buffer and step s writes slot
    (s+1) % 2 (the fused step kernel; see ``step_func``)."""
    from tvm.script import tirx as T

    @T.macro
    def store(h_new, step, layer, h_out, out, h_n):  # type: ignore[no-untyped-def]
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("store"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                row = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step) * batch + vb)
                h_out[vd, vb, vj] = h_new[vd, vb, vj].astype(h_dtype)
                out[row, vd * hidden + vj] = h_new[vd, vb, vj].astype(out_dtype)
                h_n[layer * dirs + vd, vb, vj] = h_new[vd, vb, vj].astype(h_dtype)

    @T.macro
    def store_pingpong(h_new, step, layer, hs, out, h_n):  # type: ignore[no-untyped-def]
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("store"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                row = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step) * batch + vb)
                hs[(step + 1) % 2, vd, vb, vj] = h_new[vd, vb, vj].astype(h_dtype)
                out[row, vd * hidden + vj] = h_new[vd, vb, vj].astype(out_dtype)
                h_n[layer * dirs + vd, vb, vj] = h_new[vd, vb, vj].astype(h_dtype)

    return store_pingpong if pingpong else store


def cell_func(steps: int, batch: int, hidden: int, dirs: int, layers: int, gi_dtype: str = F32,
              gh_dtype: str = F32, h_dtype: str = F32, math_dtype: str = F32, out_dtype: str = F32) -> Any:
    """S3+S4: h' from gi (step s; T-1-s backward), gh and h; writes h', out[t] and h_n[layer].

    The math is in ``math_dtype``; h', h_n are stored as ``h_dtype``, out[t] as ``out_dtype``."""
    from tvm.script import tirx as T

    G = 3 * hidden
    store = _store_macro(steps, batch, hidden, dirs, h_dtype, out_dtype)

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
                h_new[vd, vb, vj] = _cell_math(T, gi, row, vd * G + vj, hidden, gh[vd, vb, vj],
                                               gh[vd, vb, hidden + vj], gh[vd, vb, 2 * hidden + vj],
                                               h[vd, vb, vj], math_dtype)
        store(h_new, step, layer, h_out, out, h_n)

    return cell


def _step_cell_macro(steps: int, batch: int, hidden: int, dirs: int, acc_dtype: str, gh_dtype: str,
                     math_dtype: str) -> Any:
    """S3 of the fused step kernels: the gate sums ``acc`` plus b_h, rounded to ``gh_dtype``
    as if stored, and the cell on them into ``h_new`` (both step kernels share it)."""
    from tvm.script import tirx as T

    G = 3 * hidden

    @T.macro
    def cell(gi, h, acc, bias, h_new, step):  # type: ignore[no-untyped-def]
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("cell"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                row = T.meta_var(T.if_then_else(vd == 0, step, steps - 1 - step) * batch + vb)
                h_new[vd, vb, vj] = _cell_math(
                    T, gi, row, vd * G + vj, hidden,
                    _stored_as(acc[vd, vb, 0, vj] + bias[vd, vj].astype(acc_dtype), gh_dtype),
                    _stored_as(acc[vd, vb, 1, vj] + bias[vd, hidden + vj].astype(acc_dtype), gh_dtype),
                    _stored_as(acc[vd, vb, 2, vj] + bias[vd, 2 * hidden + vj].astype(acc_dtype), gh_dtype),
                    h[step % 2, vd, vb, vj], math_dtype)

    return cell


def step_func(steps: int, batch: int, hidden: int, dirs: int, layers: int, gi_dtype: str = F32,
              h_dtype: str = F32, w_dtype: str = F32, acc_dtype: str = F32, gh_dtype: str = F32,
              math_dtype: str = F32, out_dtype: str = F32, w_tile: int = 0) -> Any:
    """Fused S2+S3+S4: gh = h·W_hᵀ + b_h kept in registers, then the cell, in one kernel.

    The hidden GEMM's parameters and the cell's both apply: h, W_h and b_h (``w_dtype``)
    are widened to ``acc_dtype``, the gate sums rounded to ``gh_dtype`` (as if stored)
    and widened to ``math_dtype`` for the cell; stores as in ``cell_func``.

    The state ping-pongs inside one (2, dirs, batch, hidden) buffer: step s reads slot
    s % 2 and writes slot (s+1) % 2, so the kernel's only per-step argument is ``step`` and
    a loop over steps (``tvm_ext.step_loop``) needs no buffer swapping.  The plan passes that
    buffer twice, as ``h`` (read) and ``h_out`` (written): one parameter both read and
    written would make TVM see a write-after-read hazard it cannot schedule around.

    ``w_tile`` > 0 (it must divide ``hidden``): W_h is read through a copy ``w_tiles``
    laid out per tile of ``w_tile`` units, (dirs, hidden/w_tile, k, gate, unit), so a
    block's slice of all three gates is one compact region (in the (k, 3·hidden) layout
    the gates lie hidden apart) that the schedule stages in shared memory."""
    from tvm.script import tirx as T

    G = 3 * hidden
    store = _store_macro(steps, batch, hidden, dirs, h_dtype, out_dtype, pingpong=True)
    cell = _step_cell_macro(steps, batch, hidden, dirs, acc_dtype, gh_dtype, math_dtype)
    if w_tile:
        return _step_func_w_tiles(steps, batch, hidden, dirs, layers, gi_dtype, h_dtype, w_dtype, acc_dtype,
                                  math_dtype, out_dtype, w_tile, cell, store)

    @T.prim_func(s_tir=True)
    def step_kernel(gi: T.Buffer((steps * batch, dirs * G), gi_dtype),
                    h: T.Buffer((2, dirs, batch, hidden), h_dtype),
                    w: T.Buffer((dirs, hidden, G), w_dtype), bias: T.Buffer((dirs, G), w_dtype),
                    step: T.int32, layer: T.int32, h_out: T.Buffer((2, dirs, batch, hidden), h_dtype),
                    out: T.Buffer((steps * batch, dirs * hidden), out_dtype),
                    h_n: T.Buffer((layers * dirs, batch, hidden), h_dtype)):
        T.func_attr({"tirx.noalias": True})
        acc = T.sblock_alloc_buffer((dirs, batch, 3, hidden), acc_dtype)
        h_new = T.sblock_alloc_buffer((dirs, batch, hidden), math_dtype)
        for d, b, g, j, k in T.grid(dirs, batch, 3, hidden, hidden):
            with T.sblock("gh"):
                vd, vb, vg, vj, vk = T.axis.remap("SSSSR", [d, b, g, j, k])
                with T.init():  # zero, not the bias: a plain sum can be split over threads (rfactor)
                    acc[vd, vb, vg, vj] = T.cast(0, acc_dtype)
                acc[vd, vb, vg, vj] = acc[vd, vb, vg, vj] + (h[step % 2, vd, vb, vk].astype(acc_dtype)
                                                             * w[vd, vk, vg * hidden + vj].astype(acc_dtype))
        cell(gi, h, acc, bias, h_new, step)
        store(h_new, step, layer, h_out, out, h_n)

    return step_kernel


def _step_func_w_tiles(steps: int, batch: int, hidden: int, dirs: int, layers: int, gi_dtype: str,
                       h_dtype: str, w_dtype: str, acc_dtype: str, math_dtype: str, out_dtype: str, w_tile: int,
                       cell: Any, store: Any) -> Any:
    """``step_func`` with W_h read through per-tile copies (see its ``w_tile``)."""
    from tvm.script import tirx as T

    G, tiles = 3 * hidden, hidden // w_tile

    @T.prim_func(s_tir=True)
    def step_kernel(gi: T.Buffer((steps * batch, dirs * G), gi_dtype),
                    h: T.Buffer((2, dirs, batch, hidden), h_dtype),
                    w: T.Buffer((dirs, hidden, G), w_dtype), bias: T.Buffer((dirs, G), w_dtype),
                    step: T.int32, layer: T.int32, h_out: T.Buffer((2, dirs, batch, hidden), h_dtype),
                    out: T.Buffer((steps * batch, dirs * hidden), out_dtype),
                    h_n: T.Buffer((layers * dirs, batch, hidden), h_dtype)):
        T.func_attr({"tirx.noalias": True})
        w_tiles = T.sblock_alloc_buffer((dirs, tiles, hidden, 3, w_tile), w_dtype)
        acc = T.sblock_alloc_buffer((dirs, batch, 3, hidden), acc_dtype)
        h_new = T.sblock_alloc_buffer((dirs, batch, hidden), math_dtype)
        for d, t, k, g, u in T.grid(dirs, tiles, hidden, 3, w_tile):
            with T.sblock("w_stage"):
                vd, vt, vk, vg, vu = T.axis.remap("SSSSS", [d, t, k, g, u])
                w_tiles[vd, vt, vk, vg, vu] = w[vd, vk, vg * hidden + vt * w_tile + vu]
        for d, b, g, j, k in T.grid(dirs, batch, 3, hidden, hidden):
            with T.sblock("gh"):
                vd, vb, vg, vj, vk = T.axis.remap("SSSSR", [d, b, g, j, k])
                with T.init():
                    acc[vd, vb, vg, vj] = T.cast(0, acc_dtype)
                acc[vd, vb, vg, vj] = acc[vd, vb, vg, vj] + (
                    h[step % 2, vd, vb, vk].astype(acc_dtype)
                    * w_tiles[vd, vj // w_tile, vk, vg, vj % w_tile].astype(acc_dtype))
        cell(gi, h, acc, bias, h_new, step)
        store(h_new, step, layer, h_out, out, h_n)

    return step_kernel


def init_func(batch: int, hidden: int, dirs: int, layers: int, dtype: str = F32, pingpong: bool = False,
              barrier: bool = False) -> Any:
    """Copies layer ``layer``'s slice of h0 into the state buffer (one small launch per layer);
    both are of the state type ``dtype``.  ``pingpong``: the state is the fused step kernel's
    (2, dirs, batch, hidden) buffer, written at slot 0.  ``barrier``: also zeroes the persistent
    step kernel's barrier counter (and, at layer 0, its timed-out flag)."""
    from tvm.script import tirx as T

    from tvm_ext.step_loop import BARRIER_WORDS

    if not pingpong:
        @T.prim_func(s_tir=True)
        def init(h0: T.Buffer((layers * dirs, batch, hidden), dtype), layer: T.int32,
                 h: T.Buffer((dirs, batch, hidden), dtype)):
            T.func_attr({"tirx.noalias": True})
            for d, b, j in T.grid(dirs, batch, hidden):
                with T.sblock("init"):
                    vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                    h[vd, vb, vj] = h0[layer * dirs + vd, vb, vj]

        return init

    @T.prim_func(s_tir=True)
    def init_pingpong(h0: T.Buffer((layers * dirs, batch, hidden), dtype), layer: T.int32,
                      hs: T.Buffer((2, dirs, batch, hidden), dtype)):
        T.func_attr({"tirx.noalias": True})
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("init"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                hs[0, vd, vb, vj] = h0[layer * dirs + vd, vb, vj]

    @T.prim_func(s_tir=True)
    def init_barrier(h0: T.Buffer((layers * dirs, batch, hidden), dtype), layer: T.int32,
                     hs: T.Buffer((2, dirs, batch, hidden), dtype), bar: T.Buffer((BARRIER_WORDS,), "int32")):
        T.func_attr({"tirx.noalias": True})
        for d, b, j in T.grid(dirs, batch, hidden):
            with T.sblock("init"):
                vd, vb, vj = T.axis.remap("SSS", [d, b, j])
                T.reads(h0[layer * dirs + vd, vb, vj])
                T.writes(hs[0, vd, vb, vj], bar[0:BARRIER_WORDS])
                hs[0, vd, vb, vj] = h0[layer * dirs + vd, vb, vj]
                if vd == 0 and vb == 0 and vj == 0:
                    bar[0] = 0
                    if layer == 0:
                        bar[1] = 0

    return init_barrier if barrier else init_pingpong


def schedule_cell(func: Any, cell_block: int) -> Any:
    """Grid (batch, dirs), ``cell_block`` threads striding over the hidden units."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    store = sch.get_sblock("store")
    d, b, j = sch.get_loops(store)
    jo, ji = sch.split(j, [None, cell_block])
    sch.reorder(b, d, jo, ji)
    sch.bind(b, "blockIdx.x")
    sch.bind(d, "blockIdx.y")
    sch.bind(ji, "threadIdx.x")
    cell = sch.get_sblock("cell")
    sch.compute_at(cell, ji)
    sch.set_scope(cell, 0, "local")
    return sch


def schedule_step(func: Any, c: Config, kind: str = "cuda") -> Any:
    """Fused step: block = ``step_j`` hidden units × ``step_b`` batch rows of one direction;
    each thread keeps 3·step_b gate sums in registers, h is staged in shared memory, and
    with ``step_w_onchip`` the block's W_h slice too (dynamic shared memory on CUDA, where
    it exceeds the 48 KiB of a static array)."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    store = sch.get_sblock("store")
    d, b, j = sch.get_loops(store)
    bo, bi = sch.split(b, [None, c.step_b])
    jo, jt = sch.split(j, [None, c.step_j])
    sch.reorder(d, bo, jo, jt, bi)
    sch.bind(jo, "blockIdx.x")
    sch.bind(bo, "blockIdx.y")
    sch.bind(d, "blockIdx.z")
    sch.bind(jt, "threadIdx.x")
    cell = sch.get_sblock("cell")
    sch.compute_at(cell, bi)
    sch.set_scope(cell, 0, "local")
    gh = sch.get_sblock("gh")
    ks = c.step_ks
    main = gh
    if ks > 1:
        # Split-K: threadIdx.y = ks threads share each dot product, each summing its
        # k-slice (step_k/ks of every staged slice) in registers; the partial sums meet
        # in shared memory (rfactor) and every thread adds them up for the cell.  ks
        # times the warps per SM for the same W traffic (the kernel is latency-bound).
        k = sch.get_loops(gh)[-1]
        _, kt, _ = sch.split(k, [None, ks, c.step_k // ks])
        main = sch.rfactor(kt, 0)
    sch.compute_at(gh, jt, preserve_unit_loops=True)
    sch.set_scope(gh, 0, "local")
    if ks == 1:
        own = sch.get_loops(gh)[4:]  # below d, bo, jo, jt: batch rows, gates, unit j, k
        ko, ki = sch.split(own[-1], [None, c.step_k])
        sch.reorder(ko, ki, *own[:-1])
    else:
        sch.compute_at(main, jt, preserve_unit_loops=True)
        kt, *spatial, ko, ki = sch.get_loops(main)[4:]  # iter order: kt, d, rows, gates, j, ko, ki
        sch.reorder(kt, ko, ki, *spatial)
        sch.bind(kt, "threadIdx.y")
        sch.set_scope(main, 0, "shared")
        partial = sch.cache_write(main, 0, "local")
        sch.reverse_compute_at(partial, kt, preserve_unit_loops=True)
    if c.step_w_onchip:  # the block's W slice: all of k, 3 gates, step_j units
        w_stage = sch.get_sblock("w_stage")
        sch.compute_at(w_stage, jo, preserve_unit_loops=True)
        sch.set_scope(w_stage, 0, "shared.dyn" if kind == "cuda" else "shared")
        fused = sch.fuse(*sch.get_loops(w_stage)[3:])  # below d, bo, jo: k, gate, unit
        if ks > 1:
            _, fy, fx = sch.split(fused, [None, ks, c.step_j])
            sch.bind(fy, "threadIdx.y")
        else:
            _, fx = sch.split(fused, [None, c.step_j])
        sch.bind(fx, "threadIdx.x")
    staged = sch.cache_read(main, "h", "shared", consumer_blocks=[main])
    sch.compute_at(staged, ko, preserve_unit_loops=True)
    below = 5 if ks == 1 else 6  # d, bo, jo, jt, (kt,) ko
    fused = sch.fuse(*sch.get_loops(staged)[below:])  # the staged rows × k-slice
    _, fx = sch.split(fused, [None, c.step_j])
    sch.bind(fx, "threadIdx.x")
    sch.annotate(ko, "pragma_auto_unroll_max_step", 256)
    sch.annotate(ko, "pragma_unroll_explicit", 1)
    sch.decompose_reduction(main, ko)
    return sch


def schedule_init(func: Any, threads: int) -> Any:
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    blk = sch.get_sblock("init")
    fused = sch.fuse(*sch.get_loops(blk))
    bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return sch


# ---- the layer as a template: buffers, host plan, build -----------------------------------
@dataclass(frozen=True)
class Call:
    """One host call of the plan: a kernel function and its arguments in parameter order."""

    func: str
    args: tuple[str | int, ...]  # plan buffer names, or scalar ints (step, layer)


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


@dataclass(frozen=True)
class GruTemplate(DtypeFields, Template):
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
    # WMMA tiles for the input and (unfused) hidden GEMMs: tensor cores where their operands
    # are float16 on CUDA (see ``GemmTemplate.tensor_core``)
    in_tensor_core: Config | None = None
    hid_tensor_core: Config | None = None

    name = "gru"
    PRECISION_PARAMS = PRECISION_PARAMS

    def __post_init__(self) -> None:
        for field_name in ("batch", "hidden", "input", "seq", "layers"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise TvmExtError(f"GRU {field_name} must be a positive integer, got {value!r}")
        for param, dtype in self.precision.items():
            if dtype not in FLOAT_DTYPES:
                raise TvmExtError(f"GRU {param} dtype {dtype!r} is not supported; allowed: {', '.join(FLOAT_DTYPES)}")

    @property
    def params(self) -> dict[str, Any]:
        params = {"batch": self.batch, "hidden": self.hidden, "input": self.input, "seq": self.seq,
                  "layers": self.layers, "bidirectional": bool(self.bidirectional),
                  **{f"{p}_dtype": d for p, d in self.precision.items()}}
        for name in ("in_tensor_core", "hid_tensor_core"):
            if getattr(self, name) is not None:
                params[name] = str(getattr(self, name))
        return params

    @property
    def dirs(self) -> int:
        return 2 if self.bidirectional else 1

    def pass_config(self, config: Config, target: TargetInfo) -> dict[str, Any]:
        """The WMMA tiles' options (cp.async): they only act on copies a tile marked async,
        so one module-wide context serves every kernel."""
        from tvm_ext.schedules import tensor_core

        if target.kind != "cuda":
            return {}
        options: dict[str, Any] = {}
        for tile in (self.in_tensor_core, self.hid_tensor_core):
            if tile is not None:
                options.update(tensor_core.pass_config(tile))
        return options

    def layer_input(self, layer: int) -> int:
        return self.input if layer == 0 else self.dirs * self.hidden

    # ---- buffers -------------------------------------------------------------------------
    def _input_specs(self) -> dict[str, TensorSpec]:
        t, b, h, d = self.seq, self.batch, self.hidden, self.dirs
        wi, wh = self.w_ih_dtype, self.w_hh_dtype
        specs = {"x": TensorSpec((t * b, self.input), self.x_dtype),
                 "h0": TensorSpec((self.layers * d, b, h), self.h_dtype)}
        for layer in range(self.layers):
            specs[f"w_ih{layer}"] = TensorSpec((self.layer_input(layer), d * 3 * h), wi)
            specs[f"b_ih{layer}"] = TensorSpec((d * 3 * h,), wi)
            specs[f"w_hh{layer}"] = TensorSpec((d, h, 3 * h), wh)
            specs[f"b_hh{layer}"] = TensorSpec((d, 3 * h), wh)
        return specs

    def _output_specs(self) -> dict[str, TensorSpec]:
        t, b, h, d = self.seq, self.batch, self.hidden, self.dirs
        return {"out": TensorSpec((t * b, d * h), self.out_dtype),
                "h_n": TensorSpec((self.layers * d, b, h), self.h_dtype)}

    def _scratch_specs(self) -> dict[str, TensorSpec]:
        t, b, h, d = self.seq, self.batch, self.hidden, self.dirs
        specs = {"gi": TensorSpec((t * b, d * 3 * h), self.gi_dtype),
                 "gh": TensorSpec((d, b, 3 * h), self.gh_dtype),
                 "p0": TensorSpec((d, b, h), self.h_dtype), "p1": TensorSpec((d, b, h), self.h_dtype),
                 "hs": TensorSpec((2, d, b, h), self.h_dtype),  # the fused step kernel's ping-pong
                 "bar": TensorSpec((BARRIER_WORDS,), "int32")}  # the persistent kernel's grid barrier
        for i in range(min(2, self.layers - 1)):  # outputs of inner layers, alternating
            specs[f"y{i}"] = TensorSpec((t * b, d * h), self.out_dtype)
        return specs

    def buffers(self) -> dict[str, TensorSpec]:
        """Every buffer of the plan by name: inputs, outputs, then scratch."""
        return {**self._input_specs(), **self._output_specs(), **self._scratch_specs()}

    def inputs(self) -> list[TensorSpec]:
        return list(self._input_specs().values())

    def outputs(self) -> list[TensorSpec]:
        return list(self._output_specs().values())

    def scratch(self) -> list[TensorSpec]:
        return list(self._scratch_specs().values())

    def make_inputs(self, rng: np.random.Generator) -> list[np.ndarray]:
        """x and h0 in [-1, 1]; weights in PyTorch's init range ±1/sqrt(H).  The values are
        float32 numbers (whatever the precision), held in the declared dtypes; ``make_case``
        draws them from the full-precision template, so its reference is unrounded."""
        scale = 1.0 / math.sqrt(self.hidden)
        arrays = []
        for name, spec in self._input_specs().items():
            bound = 1.0 if name in ("x", "h0") else scale
            values = rng.uniform(-bound, bound, size=spec.shape).astype(np.float32)
            arrays.append(values if spec.dtype == F32 else cast(values, spec.dtype))
        return arrays

    # ---- layouts: PyTorch <-> device ------------------------------------------------------
    def device_weights(self, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """PyTorch ``state_dict`` arrays (already validated) -> device-layout buffers, in
        the dtypes of ``w_ih`` / ``w_hh``."""
        out = {}
        for layer in range(self.layers):
            sfx = [f"l{layer}" + ("_reverse" if d else "") for d in range(self.dirs)]
            out[f"w_ih{layer}"] = np.concatenate([weights[f"weight_ih_{s}"].T for s in sfx], axis=1)
            out[f"b_ih{layer}"] = np.concatenate([weights[f"bias_ih_{s}"] for s in sfx])
            out[f"w_hh{layer}"] = np.stack([weights[f"weight_hh_{s}"].T for s in sfx])
            out[f"b_hh{layer}"] = np.stack([weights[f"bias_hh_{s}"] for s in sfx])
        specs = self._input_specs()
        return {k: cast(v, specs[k].dtype) for k, v in out.items()}  # rounded to the weights' dtypes

    def torch_weights(self, device: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Device-layout buffers -> PyTorch ``state_dict`` arrays (for the reference)."""
        g = 3 * self.hidden
        out = {}
        for layer in range(self.layers):
            for d in range(self.dirs):
                s = f"l{layer}" + ("_reverse" if d else "")
                out[f"weight_ih_{s}"] = device[f"w_ih{layer}"][:, d * g:(d + 1) * g].T
                out[f"bias_ih_{s}"] = device[f"b_ih{layer}"][d * g:(d + 1) * g]
                out[f"weight_hh_{s}"] = device[f"w_hh{layer}"][d].T
                out[f"bias_hh_{s}"] = device[f"b_hh{layer}"][d]
        return out

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        named = dict(zip(self._input_specs(), inputs))
        x = named["x"].reshape(self.seq, self.batch, self.input)
        out, h_n = gru_reference(x, self.torch_weights(named), named["h0"], self.layers, self.bidirectional)
        return [out.reshape(self.seq * self.batch, -1), h_n]

    def flops(self) -> float:
        g = 3 * self.hidden * self.dirs
        per_step = sum(2 * self.batch * g * (self.layer_input(l) + self.hidden) for l in range(self.layers))
        return float(self.seq * per_step)

    # ---- knobs -----------------------------------------------------------------------------
    def input_gemm(self, layer: int) -> BiasGemmTemplate:
        """S1 of ``layer`` as a GEMM template: A is x (layer 0) or the previous layer's output
        sequence (``out``'s dtype), B is W_ih, D is gi."""
        return BiasGemmTemplate(self.seq * self.batch, self.dirs * 3 * self.hidden, self.layer_input(layer),
                                a_dtype=self.x_dtype if layer == 0 else self.out_dtype, b_dtype=self.w_ih_dtype,
                                acc_dtype=self.in_acc_dtype, c_dtype=self.gi_dtype,
                                tensor_core=self.in_tensor_core)

    def hidden_gemm(self) -> GemmTemplate:
        """S2 of one direction as a GEMM template: A is h, B is W_hh, C is gh."""
        return GemmTemplate(self.batch, 3 * self.hidden, self.hidden, a_dtype=self.h_dtype,
                            b_dtype=self.w_hh_dtype, acc_dtype=self.hid_acc_dtype, c_dtype=self.gh_dtype)

    def layers_share_input_gemm(self) -> bool:
        """Whether layers ≥ 1 run layer 0's input GEMM kernel (same K and A dtype)."""
        return self.layer_input(1) == self.input and self.out_dtype == self.x_dtype

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

        def gemm_reason(c: Config) -> str | None:
            for prefix, label, space in spaces:
                if prefix == "hid_" and c.fuse_step:
                    continue  # the fused step kernel does its own hidden GEMM
                reason = space.infeasible_reason(gemm_config(c, prefix, bases[prefix]))
                if reason:
                    return f"{label}: {reason}"
            return None

        def step_reason(c: Config) -> str | None:
            if c.fuse_step and c.step_j > target.max_threads_per_block:
                return f"step kernel: {c.step_j} threads > device limit {target.max_threads_per_block}"
            if not c.fuse_step:
                return None
            if c.step_j * c.step_ks > target.max_threads_per_block:
                return f"step kernel: {c.step_j}x{c.step_ks} threads > device limit {target.max_threads_per_block}"
            if c.step_k % c.step_ks:
                return "step kernel: step_ks must divide step_k"
            if c.step_ks > 1 and self.hidden % c.step_k:
                return "step kernel: split-K (step_ks > 1) needs hidden to be a multiple of step_k"
            if c.step_w_onchip and self.hidden % c.step_j:
                return "step kernel: step_w_onchip needs hidden to be a multiple of step_j"
            if c.step_loop and target.kind != "cuda":
                return "step kernel: step_loop 1 and 2 are CUDA only (OpenCL runs one launch per step)"
            static = self.step_shared_bytes(c.replace(step_w_onchip=0))
            if static > target.max_shared_memory_per_block:
                return "step kernel: staged h slice and partial sums exceed shared memory"
            # the W slice is dynamic shared memory on CUDA (up to the opt-in limit per block)
            limit = HardwareModel.from_target(target).shared_per_block_optin
            if self.step_shared_bytes(c) > limit:
                return (f"step kernel: h slice, partial sums and W_hh slice need {self.step_shared_bytes(c)} B "
                        f"of shared memory > {limit}")
            if c.step_loop == 2:
                return self.persistent_residency(c, target)[1]
            return None

        return Space(KNOBS, (gemm_reason, step_reason))

    def step_shared_bytes(self, c: Config) -> int:
        """Shared memory of one fused-step block: the staged h slice, split-K partial sums
        and (``step_w_onchip``) the W slice."""
        partials = 0 if c.step_ks == 1 else c.step_ks * c.step_b * 3 * c.step_j * itemsize(self.hid_acc_dtype)
        w_slice = c.step_w_onchip * self.hidden * 3 * c.step_j * itemsize(self.w_hh_dtype)
        return itemsize(self.h_dtype) * c.step_b * c.step_k + partials + w_slice

    def persistent_residency(self, c: Config, target: TargetInfo) -> tuple[int, str | None]:
        """Blocks per SM the persistent step kernel needs resident (its grid spread over the
        SMs), or why they cannot all be: a grid barrier waits for every block, so a block
        that is not resident would never arrive.  Threads, resident-block and shared-memory
        limits come from the hardware model; registers are made to fit by compiling with
        ``__launch_bounds__(threads, per_sm)``, refused when that leaves too few."""
        hw = HardwareModel.from_target(target)
        blocks = -(-self.hidden // c.step_j) * -(-self.batch // c.step_b) * self.dirs
        threads = c.step_j * c.step_ks
        per_sm = -(-blocks // hw.sm_count)
        shared = self.step_shared_bytes(c) + SHARED_RESERVED_PER_BLOCK
        fits = min(hw.max_blocks_per_sm, hw.max_threads_per_sm // threads, hw.shared_per_sm // shared)
        if per_sm > fits:
            return per_sm, (f"step kernel: persistent (step_loop 2) needs every block resident, {blocks} "
                            f"blocks > {hw.sm_count} SMs x {fits} resident per SM")
        if hw.registers_per_sm and hw.registers_per_sm // (per_sm * threads) < PERSISTENT_MIN_REGISTERS:
            return per_sm, (f"step kernel: persistent (step_loop 2) with {per_sm} blocks of {threads} threads "
                            f"per SM leaves < {PERSISTENT_MIN_REGISTERS} registers per thread")
        return per_sm, None

    def shown_knobs(self, config: Config) -> tuple[str, ...]:
        """Unfused (``fuse_step=0``): no ``step_*`` knob matters; fused: neither the cell
        kernel's block nor the hidden GEMM's tile (the step kernel does both)."""
        if config.fuse_step:
            unused = ("cell_block", "hid_")
        else:
            unused = ("step_",)
        return tuple(name for name, _ in config.items if not name.startswith(unused))

    def default_config(self, target: TargetInfo) -> Config:
        """The patent's pipeline (no step fusion, 512-thread cell blocks) with sensible GEMM tiles."""
        values: dict[str, Any] = {"cell_block": 512, "fuse_step": 0, "step_j": 64, "step_b": 1, "step_k": 32,
                                  "step_ks": 1, "step_loop": 0, "step_w_onchip": 0}
        for prefix, template in self.gemm_templates().items():
            values.update({prefix + k: v for k, v in default_gemm_config(template, target).items})
        names = set(self.space(target).names)
        return self.space(target).make(**{k: v for k, v in values.items() if k in names})

    # ---- kernels and plan ------------------------------------------------------------------
    def kernels(self, config: Config, target: TargetInfo) -> dict[str, Any]:
        """Scheduled ``s_tir.Schedule`` of each kernel function the plan calls, by name."""
        t, b, h, d, layers = self.seq, self.batch, self.hidden, self.dirs, self.layers
        g = 3 * h
        gemms = self.gemm_configs(config, target)
        p = self.precision
        fused, persistent = bool(config.fuse_step), config.step_loop == 2
        init = init_func(b, h, d, layers, p["h"], pingpong=fused, barrier=fused and persistent)
        funcs = {
            "gru_init": schedule_init(init, min(256, target.max_threads_per_block)),
            "gru_gemm_x0": self.input_gemm(0).schedule(gemms["in_"], target),
        }
        if layers > 1 and not self.layers_share_input_gemm():
            funcs["gru_gemm_x1"] = self.input_gemm(1).schedule(gemms["in_"], target)
        if config.fuse_step:
            funcs["gru_step"] = schedule_step(
                step_func(t, b, h, d, layers, gi_dtype=p["gi"], h_dtype=p["h"], w_dtype=p["w_hh"],
                          acc_dtype=p["hid_acc"], gh_dtype=p["gh"], math_dtype=p["cell_math"],
                          out_dtype=p["out"], w_tile=config.step_j if config.step_w_onchip else 0),
                config, target.kind)
        else:
            funcs["gru_gemm_h"] = schedule_batched_gemm(d, b, g, h, gemms["hid_"], a_dtype=p["h"],
                                                        b_dtype=p["w_hh"], acc_dtype=p["hid_acc"],
                                                        c_dtype=p["gh"], tensor_core=self.hid_tensor_core,
                                                        target=target)
            block = min(config.cell_block, target.max_threads_per_block)
            funcs["gru_cell"] = schedule_cell(
                cell_func(t, b, h, d, layers, gi_dtype=p["gi"], gh_dtype=p["gh"], h_dtype=p["h"],
                          math_dtype=p["cell_math"], out_dtype=p["out"]), block)
        return funcs

    def plan(self, config: Config) -> tuple[Call, ...]:
        """Every call of one forward pass, in order: per layer init, S1, then T steps."""
        calls = []
        for layer in range(self.layers):
            x = "x" if layer == 0 else f"y{(layer - 1) % 2}"
            out = "out" if layer == self.layers - 1 else f"y{layer % 2}"
            gemm_x = "gru_gemm_x0" if layer == 0 or self.layers_share_input_gemm() else "gru_gemm_x1"
            if not config.fuse_step:
                calls.append(Call("gru_init", ("h0", layer, "p0")))
            elif config.step_loop == 2:
                calls.append(Call("gru_init", ("h0", layer, "hs", "bar")))
            else:
                calls.append(Call("gru_init", ("h0", layer, "hs")))
            calls.append(Call(gemm_x, (x, f"w_ih{layer}", f"b_ih{layer}", "gi")))
            weights = ("gi", "hs", f"w_hh{layer}", f"b_hh{layer}")
            if config.fuse_step and config.step_loop:  # all T steps in one call
                barrier = ("bar",) if config.step_loop == 2 else ()
                calls.append(Call("gru_steps", (*weights, layer, out, "h_n", *barrier)))
                continue
            for s in range(self.seq):
                h_in, h_out = f"p{s % 2}", f"p{(s + 1) % 2}"
                if config.fuse_step:
                    calls.append(Call("gru_step", (*weights, s, layer, "hs", out, "h_n")))
                else:
                    calls.append(Call("gru_gemm_h", (h_in, f"w_hh{layer}", f"b_hh{layer}", "gh")))
                    calls.append(Call("gru_cell", ("gi", "gh", h_in, s, layer, h_out, out, "h_n")))
        return tuple(calls)

    def compile(self, config: Config, target: TargetInfo) -> "CompiledGru":
        """Schedule and compile every kernel function into one module (one source)."""
        import tvm

        from tvm_ext.builder import extract_launches, plain_json

        scheds = self.kernels(config, target)
        funcs = {name: sch.mod["main"].with_attr("global_symbol", name) for name, sch in scheds.items()}
        modules = {name: sch.mod for name, sch in scheds.items()}
        trace = {name: plain_json(sch.trace.as_json()) for name, sch in scheds.items()}
        if config.fuse_step and config.step_loop:
            mode = step_loop.HOST if config.step_loop == 1 else step_loop.PERSISTENT
            step = scheds["gru_step"]
            per_sm = self.persistent_residency(config, target)[0] if mode == step_loop.PERSISTENT else 1
            # W_hh's tile is filled from the weights only: the persistent kernel loads it once
            hoist = ("w_tiles_shared.dyn",) if config.step_w_onchip and mode == step_loop.PERSISTENT else ()
            funcs["gru_steps"] = step_loop.loop_steps(step_loop.lower_to_loops(step.mod, target), self.seq,
                                                      mode, state=("h", "h_out"), name="gru_steps",
                                                      min_blocks_per_sm=per_sm, hoist=hoist)
            modules["gru_steps"] = tvm.IRModule({"main": funcs["gru_steps"]})
            trace["gru_steps"] = trace.pop("gru_step")
            for table in (funcs, modules):
                del table["gru_step"]
        with tvm.transform.PassContext(config=self.pass_config(config, target)):
            executable = tvm.compile(tvm.IRModule(funcs), target=tvm.target.Target(target.tvm_target()))
            launches = {name: extract_launches(tvm.IRModule({"main": func}), target)
                        for name, func in funcs.items()}
        plan = self.plan(config)
        self._check_plan(plan, funcs)
        return CompiledGru(executable, executable.mod.imports[0].inspect_source(), launches, plan, trace, modules)

    def _check_plan(self, plan: Sequence[Call], funcs: Mapping[str, Any]) -> None:
        """Every buffer a call passes has the shape and dtype its kernel declares (TVM's
        runtime checks them on CUDA; OpenCL would silently misread)."""
        specs = self.buffers()
        for call in plan:
            params = funcs[call.func].params
            if len(params) != len(call.args):
                raise RuntimeError(f"{call.func} takes {len(params)} arguments, the plan passes {len(call.args)}")
            for param, arg in zip(params, call.args):
                if not isinstance(arg, str):
                    continue
                if tuple(int(x) for x in param.shape) != specs[arg].shape:
                    raise RuntimeError(f"{call.func}: buffer {arg} {specs[arg].shape} passed as {param.name} "
                                       f"{tuple(int(x) for x in param.shape)}")
                if str(param.dtype) != specs[arg].dtype:
                    raise RuntimeError(f"{call.func}: buffer {arg} ({specs[arg].dtype}) passed as {param.name} "
                                       f"({param.dtype})")

    def build_artifact(self, config: Config, target: TargetInfo, out_dir: str) -> tuple[Any, Any]:
        """The builder hook: the whole forward pass as one artifact (see ``CompiledGru``)."""
        compiled = self.compile(config, target)
        library = ""
        if target.kind == "cuda":
            library = compiled.export(out_dir)
        return compiled.artifact(target.kind, tuple(self.buffers()), library), compiled.trace

    def schedule(self, config: Config, target: TargetInfo) -> Any:
        raise TvmExtError("a GRU is several kernels and a host loop: use build_artifact or GRU.build")

    def measure_artifact(self, artifact: Any, target: TargetInfo, settings: Any) -> Any:
        """The runner hook: check the whole forward pass against the reference, then time it
        with the executors ``GRU`` uses (host clock around back-to-back passes).

        Inputs come from ``make_case``: float32 values rounded to this template's dtypes,
        the reference computed in float64 from the unrounded values, so ``rel_error``
        includes the rounding of inputs and weights.  Metrics: ``rel_error`` (also on a
        wrong answer) and ``stage_secs``, seconds per forward pass of each stage's kernels
        (see ``OpenclExecutor.stage_secs`` / ``CudaExecutor.stage_secs``)."""
        from tvm_ext.runner import RunResult, time_loop

        inputs, refs = self.make_case(np.random.default_rng(settings.seed))
        if artifact.kind == "opencl":
            executor: Any = OpenclExecutor(artifact.source, artifact.launches, self.buffers(), target.device_id)
        else:
            executor = CudaExecutor.load(artifact, self.buffers(), target.device_id)
        for name, array in zip(self._input_specs(), inputs):
            executor.write(name, array)
        for name, spec in {**self._output_specs(), **self._scratch_specs()}.items():  # unwritten -> wrong answer
            junk = np.nan if spec.dtype in FLOAT_DTYPES else 12345  # (the barrier counter must be reset)
            executor.write(name, np.full(spec.shape, junk, np_dtype(spec.dtype)))
        executor.run()
        outputs = [executor.read(name) for name in self._output_specs()]
        metrics: dict[str, Any] = {"rel_error": relative_error(outputs, refs)}
        if _barrier_timed_out(any("bar" in launch.args for launch in artifact.launches), executor):
            return RunResult((), "runtime_error", BARRIER_TIMEOUT, metrics=metrics)
        wrong = self.check(outputs, refs)
        if wrong:
            return RunResult((), "wrong_answer", wrong, metrics=metrics)
        costs = tuple(time_loop(lambda i: executor.run(), executor.sync, settings))
        metrics["stage_secs"] = executor.stage_secs()
        return RunResult(costs, metrics=metrics)


@dataclass(frozen=True)
class CompiledGru:
    """One compiled module holding every kernel of the plan, and the plan itself."""

    executable: Any  # tvm.runtime.Executable
    source: str  # OpenCL C or CUDA source of all kernels
    launches: dict[str, Any]  # function -> (its device kernel launches, its parameter names)
    calls: tuple[Call, ...]
    trace: Any  # function -> schedule trace (plain JSON)
    modules: dict[str, Any]  # function -> its scheduled IRModule (TVMScript of generated programs)

    def kernel_launches(self) -> tuple[Any, ...]:
        """The plan as device kernel launches, arguments bound to plan buffers and scalars."""
        from tvm_ext.builder import KernelLaunch

        out = []
        for call in self.calls:
            kernels, params = self.launches[call.func]
            bound = dict(zip(params, call.args))
            for k in kernels:
                args = tuple(bound[a] if isinstance(a, str) else a for a in k.args)
                out.append(KernelLaunch(k.name, args, k.grid, k.block))
        return tuple(out)

    def function_calls(self) -> tuple[Any, ...]:
        """The plan for TVM's runtime (CUDA): one entry per call, named by function; grid and
        block are the function's first kernel's (for reading only)."""
        from tvm_ext.builder import KernelLaunch

        return tuple(KernelLaunch(c.func, c.args, self.launches[c.func][0][0].grid,
                                  self.launches[c.func][0][0].block) for c in self.calls)

    def artifact(self, kind: str, params: tuple[str, ...], library: str = "") -> Any:
        """OpenCL: a flat launch list the core runner can run; CUDA: function calls + library."""
        from tvm_ext.builder import Artifact

        launches = self.kernel_launches() if kind == "opencl" else self.function_calls()
        return Artifact(kind, self.source, launches, params, library)

    def export(self, out_dir: str) -> str:
        import hashlib

        digest = hashlib.sha256(self.source.encode()).hexdigest()[:16]
        os.makedirs(out_dir, exist_ok=True)
        library = os.path.join(out_dir, f"gru-{digest}.so")
        if not os.path.exists(library):
            tmp = f"{library}.{os.getpid()}.tmp.so"
            self.executable.export_library(tmp)
            os.replace(tmp, library)
        return library


BARRIER_TIMEOUT = ("persistent GRU step kernel: a grid barrier timed out (not every block was resident "
                   "on the GPU); use step_loop 0 or 1")


def _barrier_timed_out(persistent: bool, executor: Any) -> bool:
    """Whether a persistent step kernel raised its barrier's timed-out flag (its results are
    then wrong: blocks went on without their neighbours' state)."""
    return persistent and bool(executor.read("bar")[1])


# ---- executors: buffers allocated once, the whole plan enqueued per run -----------------------
_CL_CONTEXTS: dict[int, Any] = {}
_CL_PROFILING_QUEUES: dict[int, Any] = {}
STAGE_REPEAT = 3  # timed passes per stage measurement (after one warm-up pass)


def _cl_context(device_id: int) -> tuple[Any, Any]:
    import pyopencl as cl

    from tvm_ext.target import opencl_device

    if device_id not in _CL_CONTEXTS:
        ctx = cl.Context([opencl_device(device_id)])
        _CL_CONTEXTS[device_id] = (ctx, cl.CommandQueue(ctx))
    return _CL_CONTEXTS[device_id]


def _cl_profiling_queue(device_id: int) -> Any:
    """A second queue on the same context with profiling events, for per-stage timing only
    (the plain queue stays free of profiling overhead)."""
    import pyopencl as cl

    if device_id not in _CL_PROFILING_QUEUES:
        ctx, _ = _cl_context(device_id)
        _CL_PROFILING_QUEUES[device_id] = cl.CommandQueue(
            ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    return _CL_PROFILING_QUEUES[device_id]


def _stage_totals(named_secs: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Seconds per stage from (kernel or function name, seconds) pairs of one pass."""
    totals = dict.fromkeys(STAGES, 0.0)
    for name, secs in named_secs:
        for stage in function_stages(name):
            totals[stage] += secs
    return totals


class OpenclExecutor:
    """Runs a plan's kernel launches with pyopencl: one kernel object per launch with its
    arguments set once, so a run is only ``enqueue_nd_range_kernel`` calls."""

    def __init__(self, source: str, launches: Sequence[Any], specs: Mapping[str, TensorSpec], device_id: int):
        import pyopencl as cl

        self.device_id = device_id
        self.ctx, self.queue = _cl_context(device_id)
        self.specs = dict(specs)
        program = cl.Program(self.ctx, source).build()
        self.bufs = {name: cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, size=_nbytes(spec))
                     for name, spec in self.specs.items()}
        self.kernels = []
        self.names = [launch.name for launch in launches]
        for launch in launches:
            kernel = cl.Kernel(program, launch.name)
            kernel.set_args(*[self.bufs[a] if isinstance(a, str) else np.int32(a) for a in launch.args])
            self.kernels.append((kernel, launch.global_size, launch.block))

    def write(self, name: str, array: np.ndarray) -> None:
        import pyopencl as cl

        cl.enqueue_copy(self.queue, self.bufs[name], _contiguous(array, self.specs[name]))

    def run(self) -> None:
        import pyopencl as cl

        for kernel, global_size, block in self.kernels:
            cl.enqueue_nd_range_kernel(self.queue, kernel, global_size, block)

    def read(self, name: str) -> np.ndarray:
        import pyopencl as cl

        spec = self.specs[name]
        out = np.empty(spec.shape, np_dtype(spec.dtype))
        cl.enqueue_copy(self.queue, out, self.bufs[name])
        return out

    def sync(self) -> None:
        self.queue.finish()

    def stage_secs(self, repeat: int = STAGE_REPEAT) -> dict[str, float]:
        """Device seconds per forward pass of each stage (``STAGES``): the whole plan enqueued
        on a profiling queue, each launch's event time added to its function's stages (the
        fused step kernel to both "hidden_gemm" and "cell", the init kernel to "cell");
        the median over ``repeat`` passes after one warm-up pass."""
        import pyopencl as cl

        self.sync()
        queue = _cl_profiling_queue(self.device_id)
        passes = []
        for _ in range(repeat + 1):
            events = [cl.enqueue_nd_range_kernel(queue, kernel, global_size, block)
                      for kernel, global_size, block in self.kernels]
            queue.finish()
            passes.append(_stage_totals([(name, (e.profile.end - e.profile.start) * 1e-9)
                                         for name, e in zip(self.names, events)]))
        return {stage: statistics.median(p[stage] for p in passes[1:]) for stage in STAGES}


class CudaExecutor:
    """Runs a plan through TVM's runtime module: one packed-function call per kernel launch."""

    def __init__(self, module: Any, calls: Sequence[Any], specs: Mapping[str, TensorSpec], device_id: int):
        import tvm

        self.dev = tvm.cuda(device_id)
        self.specs = dict(specs)
        self.tensors = {name: tvm.runtime.empty(spec.shape, spec.dtype, self.dev)
                        for name, spec in self.specs.items()}
        funcs = {name: module[name] for name in {c.name for c in calls}}
        self.names = [c.name for c in calls]
        self.calls = [(funcs[c.name], [self.tensors[a] if isinstance(a, str) else int(a) for a in c.args])
                      for c in calls]

    @classmethod
    def load(cls, artifact: Any, specs: Mapping[str, TensorSpec], device_id: int) -> "CudaExecutor":
        import tvm

        return cls(tvm.runtime.load_module(artifact.library), artifact.launches, specs, device_id)

    def write(self, name: str, array: np.ndarray) -> None:
        self.tensors[name].copyfrom(_contiguous(array, self.specs[name]))

    def run(self) -> None:
        for func, args in self.calls:
            func(*args)

    def read(self, name: str) -> np.ndarray:
        return self.tensors[name].numpy()

    def sync(self) -> None:
        self.dev.sync()

    def stage_secs(self, repeat: int = STAGE_REPEAT) -> dict[str, float]:
        """Seconds per forward pass of each stage (``STAGES``): all of the plan's calls of one
        stage's functions run back to back (the others left out), synchronised, host clock
        (the fused step kernel counts toward both "hidden_gemm" and "cell", the init kernel
        toward "cell"); the median over ``repeat`` passes after one warm-up pass.  For ranking
        stages: run on their own, kernels may time a little differently than interleaved."""
        out = {}
        for stage in STAGES:
            calls = [call for name, call in zip(self.names, self.calls) if stage in function_stages(name)]
            times = []
            for _ in range(repeat + 1):
                self.sync()
                start = time.perf_counter()
                for func, args in calls:
                    func(*args)
                self.sync()
                times.append(time.perf_counter() - start)
            out[stage] = statistics.median(times[1:])
        return out


def _nbytes(spec: TensorSpec) -> int:
    return int(np.prod(spec.shape)) * itemsize(spec.dtype)


def _contiguous(array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """``array`` in the buffer's layout and dtype (rounded to it: float32 -> bfloat16, ...)."""
    array = np.asarray(array)
    if array.dtype != np_dtype(spec.dtype):
        array = array.astype(np_dtype(spec.dtype))
    return np.ascontiguousarray(array.reshape(spec.shape))


def _numpy(value: Any) -> np.ndarray:
    """A numpy array of a numpy array, a list or a torch tensor on any device (torch's
    bfloat16 and other types numpy lacks come out as float32)."""
    if hasattr(value, "detach"):
        tensor = value.detach().cpu()
        try:
            return tensor.numpy()
        except TypeError:
            return tensor.float().numpy()
    return np.asarray(value)


# ---- the user-facing layer -------------------------------------------------------------------
class GRU:
    """``torch.nn.GRU`` inference compiled for one (batch, seq) shape: build once, run many times.

    >>> gru = GRU.build("opencl", input_size=16, hidden_size=32, batch=4, seq=10)
    >>> gru.load_state_dict(torch_gru.state_dict())
    >>> output, h_n = gru(x)            # numpy in, numpy out, PyTorch's shapes

    Mixed precision: ``GRU.build(..., precision={"w_ih": "bfloat16", "w_hh": "bfloat16"})``
    (names and stages in ``PRECISION_PARAMS``).  The interface stays float32: weights are
    given as usual (float32 numpy arrays or a torch ``state_dict``) and rounded to their
    dtypes as they are loaded, x and h0 are rounded to ``x`` and ``h``, and the outputs come
    back as float32 arrays (widened from bfloat16/float16, rounded from float64).
    """

    def __init__(self, template: GruTemplate, config: Config, target: TargetInfo, batch_first: bool,
                 compiled: CompiledGru):
        self.template = template
        self.config = config
        self.target = target
        self.batch_first = batch_first
        self.compiled = compiled
        self._persistent = any("bar" in c.args for c in compiled.calls)  # its barrier flag is read per call
        specs = template.buffers()
        if target.kind == "opencl":
            self.executor: Any = OpenclExecutor(compiled.source, compiled.kernel_launches(), specs,
                                                target.device_id)
        else:
            self.executor = CudaExecutor(compiled.executable.mod, compiled.function_calls(), specs,
                                         target.device_id)
        self._loaded = False

    @classmethod
    def build(cls, target: TargetInfo | str, input_size: int, hidden_size: int, num_layers: int = 1,
              bidirectional: bool = False, batch_first: bool = False, batch: int = 1, seq: int = 1,
              config: Config | Mapping[str, Any] | None = None, device_id: int = 0,
              precision: Mapping[str, str] | None = None) -> "GRU":
        """Compile every kernel for this shape. ``config``: a full GRU config, or a few knob
        values that override the default (e.g. ``{"fuse_step": 1}``).  ``precision``: dtypes
        of some of ``PRECISION_PARAMS`` (e.g. ``{"gi": "bfloat16"}``), the rest float32."""
        from tvm_ext.target import resolve_target

        info = resolve_target(target, device_id) if isinstance(target, str) else target
        template = GruTemplate(batch=batch, hidden=hidden_size, input=input_size, seq=seq,
                               layers=num_layers, bidirectional=bool(bidirectional))
        template = template.with_precision(dict(precision or {}))
        space = template.space(info)
        if config is None:
            cfg = template.default_config(info)
        elif isinstance(config, Config):
            cfg = config
            space.encode(cfg)
        else:
            unknown = set(config) - set(space.names)
            if unknown:
                raise TvmExtError(f"unknown GRU knobs {sorted(unknown)}; knobs: {', '.join(space.names)}")
            cfg = template.default_config(info).replace(**config)
            space.encode(cfg)
        reason = space.infeasible_reason(cfg)
        if reason:
            raise TvmExtError(f"GRU config not feasible on {info.kind}: {reason}")
        return cls(template, cfg, info, bool(batch_first), template.compile(cfg, info))

    @property
    def precision(self) -> dict[str, str]:
        """The dtype of each precision parameter (``PRECISION_PARAMS``)."""
        return self.template.precision

    # ---- weights --------------------------------------------------------------------------
    def expected_weight_shapes(self) -> dict[str, tuple[int, ...]]:
        t, g = self.template, 3 * self.template.hidden
        shapes = {}
        for layer in range(t.layers):
            for sfx in ("", "_reverse")[: t.dirs]:
                shapes[f"weight_ih_l{layer}{sfx}"] = (g, t.layer_input(layer))
                shapes[f"weight_hh_l{layer}{sfx}"] = (g, t.hidden)
                shapes[f"bias_ih_l{layer}{sfx}"] = (g,)
                shapes[f"bias_hh_l{layer}{sfx}"] = (g,)
        return shapes

    def load_numpy(self, weights: Mapping[str, Any]) -> "GRU":
        """Load PyTorch-named weights (``weight_ih_l0``, ``bias_hh_l1_reverse``, ...); biases may
        be left out altogether (``nn.GRU(bias=False)``).  Any float type is accepted; they are
        rounded once, to the dtypes of ``w_ih`` / ``w_hh``."""
        expected = self.expected_weight_shapes()
        unknown = sorted(set(weights) - set(expected))
        if unknown:
            raise TvmExtError(f"unexpected GRU weight {unknown[0]!r}; expected keys: {', '.join(expected)}")
        has_bias = any(k.startswith("bias") for k in weights)
        arrays = {}
        for name, shape in expected.items():
            if name not in weights:
                if name.startswith("bias") and not has_bias:
                    arrays[name] = np.zeros(shape, np.float32)
                    continue
                raise TvmExtError(f"missing GRU weight {name!r} of shape {shape}")
            array = _numpy(weights[name])
            if array.dtype.kind not in "f" and array.dtype != np_dtype("bfloat16"):
                array = array.astype(np.float64)  # integers, bools: exact in float64
            if array.shape != shape:
                raise TvmExtError(f"GRU weight {name!r} has shape {array.shape}, expected {shape}")
            arrays[name] = array
        for name, array in self.template.device_weights(arrays).items():
            self.executor.write(name, array)
        self._loaded = True
        return self

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> "GRU":
        """Load ``torch.nn.GRU.state_dict()`` (tensors on any device)."""
        return self.load_numpy({k: _numpy(v) for k, v in state_dict.items()})

    # ---- forward ----------------------------------------------------------------------------
    def __call__(self, x: Any, h0: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """(output, h_n) as ``torch.nn.GRU`` returns them, as float32 numpy arrays whatever the
        precision; x and h0 (any float type, e.g. float32) are rounded to ``x`` and ``h``."""
        t = self.template
        if not self._loaded:
            raise TvmExtError("GRU weights are not loaded: call load_numpy or load_state_dict first")
        x = _numpy(x)
        want = (t.batch, t.seq, t.input) if self.batch_first else (t.seq, t.batch, t.input)
        if x.shape != want:
            layout = "(batch, seq, input)" if self.batch_first else "(seq, batch, input)"
            raise TvmExtError(f"GRU input has shape {x.shape}, expected {want} {layout}")
        if self.batch_first:
            x = x.transpose(1, 0, 2)
        state_shape = (t.layers * t.dirs, t.batch, t.hidden)
        if h0 is None:
            h0 = np.zeros(state_shape, np.float32)
        else:
            h0 = _numpy(h0)
            if h0.shape != state_shape:
                raise TvmExtError(f"GRU h0 has shape {h0.shape}, expected {state_shape} (layers·directions, batch, hidden)")
        ex = self.executor
        ex.write("x", x)
        ex.write("h0", h0)
        ex.run()
        if _barrier_timed_out(self._persistent, ex):
            raise TvmExtError(BARRIER_TIMEOUT)
        out = ex.read("out").reshape(t.seq, t.batch, t.dirs * t.hidden).astype(np.float32, copy=False)
        h_n = ex.read("h_n").astype(np.float32, copy=False)
        ex.sync()
        if self.batch_first:
            out = np.ascontiguousarray(out.transpose(1, 0, 2))
        return out, h_n

    def time(self, x: Any, h0: Any = None, repeat: int = 20) -> float:
        """Median seconds of one forward pass (inputs already on the device, after a warm-up)."""
        self(x, h0)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            self.executor.run()
            self.executor.sync()
            times.append(time.perf_counter() - start)
        return statistics.median(times)
