"""Row operators: softmax, layer norm, RMS norm and sum / mean / max over the last axis, each
row reduced by one group of threads with the reduction template's row plan.

A row operator is one or two reductions over each row (softmax: max, then the sum of the
exponentials; layer norm: the sum, then the sum of squared deviations; RMS norm and the plain
reductions: one) and elementwise stages before, between and after them.  The schedule keeps
one kernel for all of it:

- every elementwise stage is fused: stages before and between the reductions are inlined
  into their consumers, stages after the last full-row stage join its store;
- a row is reduced by ``block_size / rows_per_block`` threads (threadIdx.x), a block holds
  ``rows_per_block`` rows (threadIdx.y), as the reduction template's ``rows_per_block`` plan
  (``reduction.py``): TVM's cross-thread allreduce combines the threads' partial results;
- element ``k`` of a row is ``(o·B + t)·x + l``: thread ``t`` owns ``x`` contiguous elements
  (one vector load) every ``B·x``, so each load instruction of a warp is contiguous, as
  the reduction template's x-lane vectors are;
- ``cache=1`` stages the block's rows in shared memory once (each thread its ``n / B``
  elements, vector loads): the input is read from global memory once and every pass (max,
  sum, the normalized store) reads shared memory.

The template's own compute is TVM's (``topi``), as Relax's ``LegalizeOps`` produces it, so a
config tuned on it replays on a model's fused PrimFunc (``tvm_ext.relax.tasks``) unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tvm_ext.core.errors import TvmExtError, check_sizes
from tvm_ext.precision.precision import itemsize
from tvm_ext.schedules.reduce.reduction import MIN_ROW_THREADS, ROWS_PER_BLOCK, vector_split_plan
from tvm_ext.core.space import Config, Knob, Space
from tvm_ext.target import TargetInfo
from tvm_ext.core.template import Template, TensorSpec

OPS = ("softmax", "layer_norm", "rms_norm", "sum", "mean", "max")
FULL_ROW_OPS = ("softmax", "layer_norm", "rms_norm")  # the output has the input's shape
DTYPES = ("float32", "float16")
EPS = 1e-5
VECTOR_BYTES = 16  # the widest load

KNOBS = (
    Knob("block_size", (32, 64, 128, 256, 512, 1024), "threads per block (capped by the device)"),
    Knob("rows_per_block", ROWS_PER_BLOCK,
         "rows one block handles at once (threadIdx.y), block_size/rows_per_block threads each"),
    Knob("x", (1, 2, 4, 8), "contiguous elements a thread loads at a time (a vector; 16 bytes at most)"),
    Knob("cache", (0, 1), "1: the block's rows are staged in shared memory once and every pass reads "
                          "them there; 0: every pass reads global memory"),
)


@dataclass(frozen=True)
class RowSite:
    """A row operator inside a PrimFunc: the row count and length its reductions run over
    (the default is the template's own compute)."""

    rows: int = 0
    n: int = 0


@dataclass(frozen=True)
class RowTemplate(Template):
    """``op`` over the last axis of a (rows, n) tensor: softmax, layer norm (weight and bias),
    RMS norm (weight), sum, mean or max; ``dtype`` is the input's, the output's and the
    arithmetic's (as TVM's compute of the op has it)."""

    op: str
    rows: int
    n: int
    dtype: str = "float32"
    # the length of the last row axis of the PrimFunc scheduled (several row axes, e.g. batch,
    # heads and sequence): a block's rows are consecutive along it, so rows_per_block divides it
    last_rows: int = 0

    name = "rows"

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise TvmExtError(f"unknown row op {self.op!r}; allowed: {', '.join(OPS)}")
        check_sizes("row op", rows=self.rows, n=self.n)
        if self.dtype not in DTYPES:
            raise TvmExtError(f"row op dtype {self.dtype!r} is not supported; allowed: {', '.join(DTYPES)}")

    @property
    def params(self) -> dict[str, Any]:
        params = {"op": self.op, "rows": self.rows, "n": self.n, "dtype": self.dtype}
        if self.last_rows:
            params["last_rows"] = self.last_rows
        return params

    # ---- tensors and reference -------------------------------------------------
    def inputs(self) -> list[TensorSpec]:
        x = TensorSpec((self.rows, self.n), self.dtype)
        if self.op == "layer_norm":
            return [x, TensorSpec((self.n,), self.dtype), TensorSpec((self.n,), self.dtype)]
        if self.op == "rms_norm":
            return [x, TensorSpec((self.n,), self.dtype)]
        return [x]

    def outputs(self) -> list[TensorSpec]:
        shape = (self.rows, self.n) if self.op in FULL_ROW_OPS else (self.rows,)
        return [TensorSpec(shape, self.dtype)]

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0].astype(np.float64)
        if self.op == "softmax":
            e = np.exp(x - x.max(-1, keepdims=True))
            return [e / e.sum(-1, keepdims=True)]
        if self.op == "layer_norm":
            gamma, beta = (a.astype(np.float64) for a in inputs[1:])
            centered = x - x.mean(-1, keepdims=True)
            return [centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + EPS) * gamma + beta]
        if self.op == "rms_norm":
            return [x / np.sqrt((x ** 2).mean(-1, keepdims=True) + EPS) * inputs[1].astype(np.float64)]
        if self.op == "max":
            return [x.max(-1)]
        return [x.sum(-1) / (self.n if self.op == "mean" else 1)]

    @property
    def tolerance(self) -> float:  # type: ignore[override]
        return 1e-4 if self.dtype == "float32" else 5e-3

    def bytes_moved(self) -> float:
        return float(sum(int(np.prod(s.shape)) * itemsize(s.dtype) for s in self.inputs() + self.outputs()))

    # ---- knob space -------------------------------------------------------------
    def space(self, target: TargetInfo) -> Space:
        sizes = tuple(b for b in KNOBS[0].choices if b <= target.max_threads_per_block)
        knobs = (Knob(KNOBS[0].name, sizes, KNOBS[0].doc),) + KNOBS[1:]
        return Space(knobs, (lambda c: self.reason(c, target),))

    def threads_per_row(self, c: Config) -> int:
        return c.block_size // c.rows_per_block

    def reason(self, c: Config, target: TargetInfo) -> str | None:
        if self.dtype not in target.float_dtypes:
            return f"{self.dtype} arithmetic is not available on this {target.kind} device"
        threads = self.threads_per_row(c)
        if c.rows_per_block > 1 and threads < MIN_ROW_THREADS:
            return f"{c.block_size} threads over {c.rows_per_block} rows leave fewer than {MIN_ROW_THREADS} per row"
        if c.rows_per_block > self.rows:
            return f"{c.rows_per_block} rows per block but the tensor has {self.rows}"
        if self.last_rows and self.last_rows % c.rows_per_block:
            return f"{c.rows_per_block} rows per block do not divide the last row axis ({self.last_rows})"
        if c.x * itemsize(self.dtype) > VECTOR_BYTES:
            return f"x={c.x} {self.dtype} elements exceed a {VECTOR_BYTES}-byte load"
        if threads * c.x > 2 * max(self.n, MIN_ROW_THREADS):
            return f"{threads} threads x {c.x} elements per row of {self.n}: most threads would idle"
        if c.cache:
            if self.n % (threads * c.x):
                return f"cache=1 needs the row ({self.n}) to split evenly into {threads} threads x {c.x} elements"
            staged = c.rows_per_block * self.n * itemsize(self.dtype)
            if staged > target.max_shared_memory_per_block:
                return f"cache=1 stages {staged} B of rows in shared memory > {target.max_shared_memory_per_block}"
        return None

    def fitted(self, config: Config) -> Config:
        """``config`` (a bucket's: another row count or length) refitted where this shape refuses
        it: the most rows a block (up to its own) that divide this shape's last row axis, with the
        same threads a row; a vector short enough and threads few enough for this row length; rows
        staged in shared memory only where they split evenly."""
        rows = self.last_rows or self.rows
        per_block = max(r for r in ROWS_PER_BLOCK if r <= min(config.rows_per_block, self.rows) and rows % r == 0)
        threads, x = self.threads_per_row(config), config.x
        while threads * x > 2 * max(self.n, MIN_ROW_THREADS) and x > 1:
            x //= 2
        while threads * x > 2 * max(self.n, MIN_ROW_THREADS) and threads > MIN_ROW_THREADS:
            threads //= 2
        cache = config.cache if self.n % (threads * x) == 0 else 0
        return config.replace(block_size=threads * per_block, rows_per_block=per_block, x=x, cache=cache)

    def default_config(self, target: TargetInfo) -> Config:
        """A row per 2-4 elements' worth of threads (the vector split plan for the row: its x),
        several short rows per 256-thread block, rows staged in shared memory when they split
        evenly."""
        space = self.space(target)
        threads = 1 << max(5, min(10, (max(1, self.n // 4)).bit_length() - 1))
        threads = min(threads, max(space.knob("block_size").choices))
        rows = max(1, min(256 // threads, self.rows))
        rows = max(r for r in ROWS_PER_BLOCK if r <= rows and (self.last_rows or self.rows) % r == 0)
        x = min(vector_split_plan(self.n, threads).x, VECTOR_BYTES // itemsize(self.dtype), 8)
        candidates = [dict(cache=1, x=x), dict(cache=1, x=1), dict(cache=0, x=x), dict(cache=0, x=1)]
        for extra in candidates:
            cfg = space.make(block_size=threads * rows, rows_per_block=rows, **extra)
            if space.is_feasible(cfg):
                return cfg
        for cfg in space:
            if space.is_feasible(cfg):
                return cfg
        raise TvmExtError(f"no row schedule fits {self.describe()} on this device")

    # ---- compute and schedule ----------------------------------------------------
    def prim_func(self) -> Any:
        """TVM's compute of the op (``topi``, as Relax legalizes it)."""
        from tvm import te, topi

        x = te.placeholder((self.rows, self.n), self.dtype, name="X")
        if self.op == "softmax":
            return te.create_prim_func([x, topi.nn.softmax(x, axis=-1)])
        if self.op == "layer_norm":
            gamma = te.placeholder((self.n,), self.dtype, name="gamma")
            beta = te.placeholder((self.n,), self.dtype, name="beta")
            return te.create_prim_func([x, gamma, beta, topi.nn.layer_norm(x, gamma, beta, axis=[-1], epsilon=EPS)])
        if self.op == "rms_norm":
            weight = te.placeholder((self.n,), self.dtype, name="weight")
            return te.create_prim_func([x, weight, topi.nn.rms_norm(x, weight, axis=[-1], epsilon=EPS)])
        if self.op == "max":
            return te.create_prim_func([x, topi.max(x, axis=-1)])
        total = topi.sum(x, axis=-1)
        if self.op == "mean":
            total = topi.divide(total, te.const(float(self.n), self.dtype))
        return te.create_prim_func([x, total])

    def schedule(self, config: Config, target: TargetInfo, func: Any = None, site: RowSite | None = None) -> Any:
        """The schedule of ``config`` on the own compute, or on a foreign PrimFunc with the
        same structure (``func``, e.g. a Relax task found by ``tvm_ext.relax.tasks``)."""
        from tvm import s_tir

        sch = s_tir.Schedule(self.prim_func() if func is None else func)
        schedule_rows(sch, config, self.n)
        return sch


def _is_reduction(block: Any) -> bool:
    from tvm.tirx import IterVar

    return any(iv.iter_type == IterVar.CommReduce for iv in block.iter_vars)


def _children(sch: Any) -> list[Any]:
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def fuse_stages(sch: Any) -> tuple[list[Any], Any | None]:
    """Inline every elementwise stage but the output's (before and between the reductions
    into their consumers, after it into its store): the reductions in order and the output
    block remain (None when the last reduction writes the output).  An error names a stage
    that cannot be fused."""
    blocks = _children(sch)
    for block in blocks[:-1]:
        if not _is_reduction(sch.get(block)):
            sch.compute_inline(block)
    blocks = _children(sch)
    # stages after the last full-row stage (a cast, a broadcast) join its store
    while len(blocks) >= 2 and not _is_reduction(sch.get(blocks[-2])) and not _is_reduction(sch.get(blocks[-1])):
        sch.reverse_compute_inline(blocks[-1])
        blocks = _children(sch)
    output = None if _is_reduction(sch.get(blocks[-1])) else blocks[-1]
    reductions = blocks if output is None else blocks[:-1]
    if not reductions or not all(_is_reduction(sch.get(b)) for b in reductions):
        names = ", ".join(sch.get(b).name_hint for b in blocks)
        raise TvmExtError(f"stages {names}: expected reductions followed by one output stage")
    return reductions, output


def _split_row(sch: Any, k: Any, threads: int, x: int) -> tuple[Any, Any]:
    """Element k = (o·threads + t)·x + lane: the thread loop (bound to threadIdx.x) outermost."""
    o, t, lane = sch.split(k, [None, threads, x])
    sch.reorder(t, o, lane)
    sch.bind(t, "threadIdx.x")
    return t, lane


def schedule_rows(sch: Any, c: Config, n: int) -> None:
    """Schedule a row operator (see the module docstring) on ``sch`` in place."""
    reductions, output = fuse_stages(sch)
    threads = c.block_size // c.rows_per_block
    last = output if output is not None else reductions[-1]
    rank = len(sch.get(reductions[0]).iter_vars) - 1  # row axes
    loops = sch.get_loops(last)
    full_row = output is not None and len(sch.get(output).iter_vars) > rank
    # a block's rows are consecutive along the last row axis (so that the rows a block stages
    # are one slice of every row axis), the other row axes go to the grid
    *outer, last_row = loops[:rank]
    block_rows, ty = sch.split(last_row, [None, c.rows_per_block])
    bx = sch.fuse(*outer, block_rows) if outer else block_rows
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    if output is None:  # the last reduction writes the output: its k loop under the row
        _split_row(sch, sch.get_loops(last)[-1], threads, c.x)
    elif full_row:
        _, lane = _split_row(sch, sch.get_loops(last)[-1], threads, c.x)
        if n % (threads * c.x) == 0 and c.x > 1:
            sch.vectorize(lane)
    inner = reductions if output is not None else reductions[:-1]
    for block in reversed(inner):
        sch.compute_at(block, ty)
        sch.set_scope(block, 0, "local")  # the allreduce leaves the row's result in every thread
        _split_row(sch, sch.get_loops(block)[-1], threads, c.x)
    if c.cache:
        _cache_rows(sch, reductions, output, threads, c.x, bx, c.rows_per_block)


def _cache_rows(sch: Any, reductions: list[Any], output: Any | None, threads: int, x: int, bx: Any,
                rows_per_block: int) -> None:
    """Each row input staged in shared memory once, by vector loads (the same element
    mapping as the passes, so each thread reads back what it loaded), and read from there by
    every pass.  (A per-thread register tile cannot serve several passes in TVM: a
    cross-thread reduction must be the last block under its thread loop.)"""
    from tvm import tirx

    first = sch.get(reductions[0])
    n = int(first.iter_vars[-1].dom.extent)
    consumers = reductions + ([output] if output is not None else [])
    names = [r.source.name for r in first.reads]
    for name in dict.fromkeys(r.source.name for r in first.reads
                              if int(r.source.shape[-1]) == n and len(r.source.shape) >= len(first.iter_vars)):
        readers = [b for b in consumers if name in [r.source.name for r in sch.get(b).reads]]
        cache = sch.cache_read(reductions[0], names.index(name), "shared", consumer_blocks=readers)
        sch.compute_at(cache, bx)  # the block's rows: one row per threadIdx.y
        *rows, k = sch.get_loops(cache)[1:]
        extents = [sch.get(loop).extent for loop in rows]
        if not all(isinstance(e, tirx.IntImm) for e in extents) or math.prod(int(e) for e in extents) != rows_per_block:
            raise TvmExtError(f"the block's {rows_per_block} rows are not one slice of the row axes {extents}")
        if rows:  # (a single row has no row loop left)
            sch.bind(rows[0] if len(rows) == 1 else sch.fuse(*rows), "threadIdx.y")
        _, lane = _split_row(sch, k, threads, x)
        if x > 1:
            sch.vectorize(lane)
