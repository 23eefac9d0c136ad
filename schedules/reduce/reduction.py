"""Reductions (sum, max, min, mean, sum of squares) with the x / z / w / z' vector split
(method 001).

The split gives each of a block's 1024 threads ``num = n / 1024`` elements, split
into ``y`` vectors of ``x`` elements; a pass loads ``z`` vectors (``x·z`` fills the
64-lane vector register file), ``w`` passes cover the thread's share, the last pass
loads only ``z'``.  The reduction order is: inside each vector and across the ``z``
vectors of a pass, across the ``w`` passes, inside each warp, across the warps.
``vector_split_plan`` computes that plan; ``ReductionTemplate`` turns it into a TVM kernel
and makes its parameters knobs (block size, x, register capacity, number of blocks,
small-n threshold), with that plan as the default config.

Kernel shape (one thread block per reduced row, or ``blocks`` of them):

* element ``k`` of a row is ``((((p·z + j)·blocks + g)·xc + c)·B + t)·vw + l``:
  thread ``t`` of block ``g`` owns, in pass ``p``, vectors ``j < z`` of ``x = xc·vw``
  lanes, each loaded as ``xc`` chunks of ``vw`` contiguous lanes (16-byte loads) that
  lie ``B·vw`` apart, so every load instruction of a warp is contiguous (coalesced);
* a pass copies its ``z·x`` elements into a per-thread register tile (vector loads),
  then folds them into the thread's accumulator, vector by vector;
* the thread accumulators meet in TVM's cross-thread allreduce: warp shuffles, then
  across warps through shared memory (on OpenCL a local-memory tree, warp = 1 lane);
* ``blocks > 1`` adds a second kernel that reduces the per-block partials, which live
  in an explicit scratch parameter (``Template.scratch``): the runners only pass
  buffers they allocate, they cannot see intermediates allocated inside the kernel;
* reductions shorter than ``small_n`` take one simple kernel: a strided loop per
  thread, no register tile, then the same allreduce;
* ``combine=1`` (beyond the published plan) merges the two kernels into one launch: the last
  block of a row to finish (``merge_partials``) adds the partials up;
* ``rows_per_block > 1`` (beyond the published plan) gives each of a block's rows its own group
  of threads (threadIdx.y), so many short rows need fewer, fuller blocks.

Elements past ``n`` (``n`` not a multiple of the block's reach, or the last pass
holding ``z' < z`` vectors) read as the reduction's identity, so any ``n ≥ 1`` works.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tvm_ext.measure.checks import ElementwiseCheck
from tvm_ext.core.errors import TvmExtError
from tvm_ext.core.space import Config, Knob, Space
from tvm_ext.lowering.step_loop import launch_chain, rewrap
from tvm_ext.target import TargetInfo
from tvm_ext.core.template import Template, TensorSpec

OPS = ("sum", "max", "min", "mean", "sumsq")
DTYPES = ("float32", "float16")
BLOCK_SIZES = (128, 256, 512, 1024)
VECTOR_LENGTHS = (1, 2, 4, 8, 16, 32, 64)
CAPACITIES = (16, 32, 64, 128)
BLOCK_COUNTS = tuple(1 << i for i in range(13))  # 1 .. 4096
SMALL_N = (0, 1024, 8192, 65536)
ROWS_PER_BLOCK = (1, 2, 4, 8, 16, 32)
COMBINES = (0, 1)
MIN_ROW_THREADS = 32  # threads per row when a block holds several rows: a warp at least

PLAN_BLOCK_SIZE = 1024  # threads per block in the published plan
REGISTER_CAPACITY = 64  # vector register capacity per thread, in 4-byte lanes
DEFAULT_SMALL_N = 1024  # below this the plan's num = n / 1024 is < 1 element per thread
MAX_SCRATCH = 1 << 24  # partial-result slots (64 MiB of float32) the runner may be asked for
INT32_LIMIT = (1 << 31) - 1  # kernels index with int32

KNOBS = (
    Knob("block_size", BLOCK_SIZES, "threads per block (the published plan: 1024; capped by the device)"),
    Knob("x", VECTOR_LENGTHS,
         "vector length: elements per vector of a thread (the published plan: power of two <= 64)"),
    Knob("capacity", CAPACITIES,
         "per-thread vector register capacity in elements: z = capacity/x vectors per pass (the published plan: 64)"),
    Knob("blocks", BLOCK_COUNTS,
         "blocks per reduced row: 1 = one kernel (the published plan); >1 = partials, then a second kernel"),
    Knob("small_n", SMALL_N, "reductions shorter than this run the simple single kernel"),
    Knob("rows_per_block", ROWS_PER_BLOCK,
         "rows one block reduces at once (threadIdx.y), block_size/rows_per_block threads each: "
         "a warp per row when that is 32 (shuffles only); needs blocks = 1"),
    Knob("combine", COMBINES,
         "how a row's per-block partials meet (blocks > 1): 0 = a second kernel; 1 = in the same "
         "launch: the last block to finish (a memory fence, then an atomic counter) adds them up "
         "and resets the counter for the next launch"),
)


# ---- the x / y / z / w / z' vector split plan ------------------------------------------

@dataclass(frozen=True)
class VectorSplitPlan:
    """How one thread's ``num`` elements are cut into vectors and passes (S4).

    ``x``: vector length; ``y``: vectors per thread; ``z``: vectors per pass;
    ``w``: passes; ``z_last``: vectors in the last pass.  ``x·y ≥ num``: the
    ``x·y − num`` lanes past the data read as the reduction's identity.
    """

    num: int
    x: int
    y: int
    z: int
    w: int
    z_last: int

    @property
    def padded(self) -> int:
        """Elements one thread steps over, padding included (``x·y``)."""
        return self.x * self.y


def _is_power_of_two(value: int) -> bool:
    return isinstance(value, (int, np.integer)) and value >= 1 and value & (value - 1) == 0


def _pow2_floor(value: int) -> int:
    return 1 << (max(1, int(value)).bit_length() - 1)


def _pow2_ceil(value: int) -> int:
    return 1 << max(0, int(value) - 1).bit_length()


def decompose(num: int, x: int, vector_capacity: int = REGISTER_CAPACITY) -> VectorSplitPlan:
    """S41–S42 of the split for a given vector length ``x``.

    y is the smallest integer with x·y ≥ num.  If x·y ≤ capacity all vectors fit in
    one pass (z = y, w = 1, z' = z); otherwise a pass holds z = capacity/x vectors,
    w = ceil(y/z) passes, and the last pass z' = y − (w−1)·z.
    """
    if not isinstance(num, (int, np.integer)) or num < 1:
        raise TvmExtError(f"elements per thread must be a positive integer, got {num!r}")
    if not _is_power_of_two(vector_capacity):
        raise TvmExtError(f"vector capacity must be a power of two, got {vector_capacity!r}")
    if not _is_power_of_two(x) or x > vector_capacity:
        raise TvmExtError(f"vector length x must be a power of two <= {vector_capacity}, got {x!r}")
    num, x = int(num), int(x)
    y = -(-num // x)
    if x * y <= vector_capacity:
        z, w = y, 1
        z_last = z
    else:
        z = vector_capacity // x
        w = -(-y // z)
        z_last = y - (w - 1) * z
    return VectorSplitPlan(num=num, x=x, y=y, z=z, w=w, z_last=z_last)


def vector_split_plan(n: int, block_size: int = PLAN_BLOCK_SIZE,
                vector_capacity: int = REGISTER_CAPACITY) -> VectorSplitPlan:
    """The vector split plan for a reduction of ``n`` elements by one block.

    Decisions where the text is silent:

    * ``num = ceil(n / block_size)``: when ``n`` is not a multiple of the block size
      the last threads' final vectors are padded with the reduction identity (the
      text writes ``num = n / 1024`` and assumes it divides).
    * ``n < block_size`` gives ``num = 1`` (x = y = z = w = z' = 1): fewer elements
      than threads; the template sends such short reductions to its simple kernel.
    * ``n < 1`` (an empty reduction) is an error: no identity-only result is defined
      for max/min/mean.
    * ``x`` is the largest power of two ≤ min(vector_capacity, num): the longest vector
      that the registers hold and that the data fill, so no pass loads padding unless
      num itself is not a power of two.
    """
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise TvmExtError(f"empty reduction: need at least one element, got n={n!r}")
    if not isinstance(block_size, (int, np.integer)) or block_size < 1:
        raise TvmExtError(f"block size must be a positive integer, got {block_size!r}")
    num = -(-int(n) // int(block_size))
    if not _is_power_of_two(vector_capacity):
        raise TvmExtError(f"vector capacity must be a power of two, got {vector_capacity!r}")
    x = _pow2_floor(min(int(vector_capacity), num))
    return decompose(num, x, vector_capacity)


# ---- NaN-propagating max / min reducers ------------------------------------------------------
# IEEE max/min (CUDA fmaxf, OpenCL max) drop NaN; numpy propagates it.  TVM's schedule
# only lowers reductions whose combiner it recognises, so the two select-based
# combiners are registered once per process (the references are kept alive: the C++
# registry outlives the interpreter and must not own the last reference).

def _nan_max(a: Any, b: Any) -> Any:
    from tvm import tirx

    return tirx.Select(tirx.Or(a > b, tirx.isnan(a)), a, b)


def _nan_min(a: Any, b: Any) -> Any:
    from tvm import tirx

    return tirx.Select(tirx.Or(a < b, tirx.isnan(a)), a, b)


_REDUCER_REFS: list[Any] = []


def _register_reducers() -> None:
    if _REDUCER_REFS:
        return
    import tvm_ffi
    from tvm import tirx

    def combiner(fn: Any) -> Any:
        def get(x: Any, y: Any) -> Any:
            try:
                return [fn(x[0], y[0])]
            except Exception:  # never raise into C++: a non-matching pattern is enough
                return [x[0]]
        return get

    def identity(value: float) -> Any:
        def get(values: Any) -> Any:
            try:
                dtype = str(values[0].ty)
                if not dtype.startswith("float"):
                    return [values[0]]
                return [tirx.const(value, dtype)]
            except Exception:
                return [values[0]]
        return get

    register = tvm_ffi.get_global_func("s_tir.schedule.RegisterReducer")
    for fn, ident in ((_nan_max, -math.inf), (_nan_min, math.inf)):
        refs = [tvm_ffi.convert(combiner(fn)), tvm_ffi.convert(identity(ident))]
        register(1, *refs)
        _REDUCER_REFS.extend(refs)


# ---- the kernel shape a config stands for ---------------------------------------------------

@dataclass(frozen=True)
class Geometry:
    """What ``schedule`` builds for one config and one row length ``n``.

    ``simple``: the short-reduction kernel (no register tile, x = z = 1).  ``vw``: lanes
    per vector load (16 bytes at most); ``xc = x / vw`` loads per vector.
    """

    simple: bool
    threads: int  # threads per reduced row (a block holds rows_per_block such groups)
    blocks: int
    plan: VectorSplitPlan
    vw: int
    rows_per_block: int = 1
    combine: int = 0

    @property
    def xc(self) -> int:
        return self.plan.x // self.vw

    @property
    def reach(self) -> int:
        """Elements the index space covers, padding included: w·z·x per thread."""
        p = self.plan
        return p.w * p.z * p.x * self.threads * self.blocks


@dataclass(frozen=True)
class ReductionTemplate(Template):
    """Reduce a (n,) tensor to (1,), or each row of a (rows, cols) tensor to (rows,).

    ``op``: sum, max, min, mean or sumsq (sum of squares).  Input float32, or float16
    read and accumulated in float32; the output is always float32.  NaN propagates as
    in numpy; an empty reduction is an error.
    """

    shape: tuple[int, ...]
    op: str = "sum"
    dtype: str = "float32"

    name = "reduce"

    def __post_init__(self) -> None:
        shape = tuple(self.shape) if isinstance(self.shape, (tuple, list)) else (self.shape,)
        if len(shape) not in (1, 2) or not all(isinstance(d, (int, np.integer)) for d in shape):
            raise TvmExtError(f"reduction shape must be N or ROWS,COLS (integers), got {self.shape!r}")
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        if self.shape[-1] < 1:
            raise TvmExtError(f"empty reduction: shape {self.shape} has no elements to reduce")
        if min(self.shape) < 1:
            raise TvmExtError(f"reduction shape {self.shape} has an empty dimension")
        if self.op not in OPS:
            raise TvmExtError(f"unknown reduction op {self.op!r}; allowed: {', '.join(OPS)}")
        if self.dtype not in DTYPES:
            raise TvmExtError(f"reduction dtype {self.dtype!r} is not supported; allowed: {', '.join(DTYPES)}")
        if self.rows * self.n > INT32_LIMIT // 2:  # headroom for the padded index space
            raise TvmExtError(f"reduction of {self.rows * self.n} elements is too large (int32 indexing)")

    @classmethod
    def from_shape(cls, shape: tuple[int, ...], **options: Any) -> "ReductionTemplate":
        return cls(tuple(shape), **options)

    @property
    def n(self) -> int:
        """Length of each reduction (the reduced axis)."""
        return self.shape[-1]

    @property
    def rows(self) -> int:
        return self.shape[0] if len(self.shape) == 2 else 1

    @property
    def params(self) -> dict[str, Any]:
        return {"shape": self.shape, "op": self.op, "dtype": self.dtype}

    # ---- tensors and reference -------------------------------------------------
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec(self.shape, self.dtype)]

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec((self.rows,), "float32")]

    @property
    def max_blocks(self) -> int:
        """Most blocks per row any feasible config uses: every thread gets an element."""
        limit = min(BLOCK_COUNTS[-1], self.n // BLOCK_SIZES[0], MAX_SCRATCH // self.rows)
        return _pow2_floor(limit) if limit >= 2 else 1

    def scratch(self) -> list[TensorSpec]:
        """Per-block partials of the two-stage kernels, sized for the largest ``blocks``.

        The same buffer serves every config (the runner allocates it from the template
        alone); a config with fewer blocks uses the first columns.
        """
        if self.max_blocks < 2:
            return []
        return [TensorSpec((self.rows, self.max_blocks), "float32"),
                TensorSpec((self.rows,), "int32", fill=0)]  # combine=1: blocks done per row

    # Inputs: mostly positive data, uniform in [-0.5, 1.5).  Mixed signs exercise max/min and
    # cancellation, while the sum stays near n/2 (not near 0): a dropped or doubled block then
    # moves the result far outside the rounding bound of ``check``, which zero-mean data would hide.
    input_range = (-0.5, 1.5)

    def _mapped(self, data: np.ndarray) -> np.ndarray:
        a = np.asarray(data, dtype=np.float64).reshape(self.rows, self.n)
        return a * a if self.op == "sumsq" else a

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """float64 result; it carries ``bound`` (per-row absolute error allowed)."""
        a = self._mapped(inputs[0])
        with np.errstate(invalid="ignore", over="ignore"):
            if self.op == "max":
                ref = a.max(axis=1)
            elif self.op == "min":
                ref = a.min(axis=1)
            else:
                ref = a.sum(axis=1)
                if self.op == "mean":
                    ref = ref / self.n
            out = np.asarray(ref, dtype=np.float64).view(_Reference)
            out.bound = self.error_bound(np.abs(a).sum(axis=1), np.abs(ref))
        return [out]

    def chain_length(self) -> int:
        """Upper bound on the additions any element goes through, for every config.

        A thread adds at most ceil(n/128) elements in sequence (a block has >= 128
        threads, or at least as many as elements in the simple kernel); the allreduce
        adds log2(1024) = 10 levels, the second stage at most 4096/128 + 10, the mean
        one division: 64 covers all of that.
        """
        return -(-self.n // BLOCK_SIZES[0]) + 64

    def error_bound(self, abs_sum: np.ndarray, abs_ref: np.ndarray) -> np.ndarray:
        """Allowed |result − exact| per row.

        max/min: 0 (a comparison never rounds).  sum-like: float32 summation in any
        order along chains of at most h additions errs by at most h·u·Σ|a_i|
        (u = 2^-24); that worst case needs every rounding error to point the same way.
        Rounding errors behave like independent zero-mean variables, so with
        overwhelming probability the error stays below λ·sqrt(h)·u·Σ|a_i|
        (Higham & Mary, SIAM J. Sci. Comput. 2019); λ = 8 makes a false alarm
        astronomically unlikely.  Squares (sumsq) add one rounding each, the
        float32 output one more (u·|result|), and OpenCL C prints float constants
        with 7 digits (the mean's 1/n): a few u·|result|.
        """
        if self.op in ("max", "min"):
            return np.zeros_like(abs_sum)
        u = 2.0 ** -24
        h = self.chain_length()
        bound = 8.0 * math.sqrt(h) * u * abs_sum + (4 if self.op == "sumsq" else 0) * u * abs_sum
        if self.op == "mean":
            bound = bound / self.n
        return bound + 4 * u * abs_ref

    def output_check(self, refs: list[np.ndarray]) -> ElementwiseCheck:
        """NaN exactly where numpy has NaN, infinities equal, finite values within the bound
        the reference carries (``reference``), else within float32 rounding of the result."""
        bound = getattr(refs[0], "bound", None)
        if bound is None:  # a plain array: allow float32 rounding of the result only
            bound = 4 * 2.0 ** -24 * np.abs(np.asarray(refs[0], dtype=np.float64))
        return ElementwiseCheck(np.asarray(bound, dtype=np.float64))

    # ---- knob space -------------------------------------------------------------
    def space(self, target: TargetInfo) -> Space:
        sizes = tuple(b for b in BLOCK_SIZES if b <= target.max_threads_per_block)
        if not sizes:
            raise TvmExtError(
                f"device allows {target.max_threads_per_block} threads per block; "
                f"reductions need at least {BLOCK_SIZES[0]}"
            )
        knobs = tuple(Knob(k.name, sizes, k.doc) if k.name == "block_size" else k for k in KNOBS)
        return Space(knobs, (self._infeasible_reason,))

    def _infeasible_reason(self, c: Config) -> str | None:
        if c.x > c.capacity:
            return f"vector length x={c.x} exceeds the register capacity {c.capacity}"
        if c.combine and c.blocks == 1:
            return "combine=1 merges per-block partials: it needs blocks > 1"
        if c.rows_per_block > 1:
            if c.blocks > 1:
                return "several rows per block need whole rows per block: blocks must be 1"
            if c.rows_per_block > self.rows:
                return f"{c.rows_per_block} rows per block but the tensor has {self.rows}"
            if c.block_size // c.rows_per_block < MIN_ROW_THREADS:
                return (f"{c.block_size} threads over {c.rows_per_block} rows leave fewer than "
                        f"{MIN_ROW_THREADS} per row")
        if c.blocks > 1:
            if self.n < c.small_n:
                return "the simple kernel (n < small_n) is a single kernel: blocks must be 1"
            if c.blocks > self.max_blocks or c.blocks * c.block_size > self.n:
                return f"{c.blocks} blocks of {c.block_size} threads leave threads without elements"
        if self.geometry(c).reach * self.rows > INT32_LIMIT:
            return "index space exceeds int32"
        return None

    def default_config(self, target: TargetInfo) -> Config:
        """The vector split plan: 1024 threads (or the device's most), one block, x from
        ``vector_split_plan``, 64-lane registers; reductions shorter than 1024 take the
        simple kernel (the published plan's preset threshold)."""
        space = self.space(target)
        block = max(space.knob("block_size").choices)
        plan = vector_split_plan(self.n, block, REGISTER_CAPACITY)
        return space.make(block_size=block, x=plan.x, capacity=REGISTER_CAPACITY, blocks=1,
                          small_n=DEFAULT_SMALL_N, rows_per_block=1, combine=0)

    def filled_config(self, target: TargetInfo, threads_per_unit: int = 2048, combine: int = 0) -> Config:
        """The vector split plan spread over enough blocks to fill the device.

        The published plan runs one block; a GPU needs about ``threads_per_unit`` resident
        threads on each of its compute units (2048 per SM on H100) to hide memory
        latency.  Blocks per row = the power of two closest above what fills the
        device, as far as the space allows; x is re-planned for the smaller share;
        ``combine``: how the partials meet (1: in the same launch).
        An analytic GA seed next to the default, not a replacement for it.
        """
        default = self.default_config(target)
        space = self.space(target)
        want = -(-target.compute_units * threads_per_unit // (default.block_size * self.rows))
        blocks = min(_pow2_ceil(max(1, want)), self.max_blocks)
        while blocks > 1:
            share = -(-self.n // blocks)
            cfg = default.replace(blocks=blocks, x=vector_split_plan(share, default.block_size, REGISTER_CAPACITY).x,
                                  combine=combine)
            if space.is_feasible(cfg):
                return cfg
            blocks //= 2
        return default

    def row_group_config(self, target: TargetInfo, threads_per_row: int = 32, block_size: int = 256) -> Config:
        """Many rows: ``threads_per_row`` threads (a warp: shuffles only) reduce each row,
        ``block_size / threads_per_row`` rows per block, x from the vector split plan for one
        row's share.  An analytic GA seed; the default config where the shape has too few
        rows or the device too few threads."""
        default = self.default_config(target)
        rows_per_block = max(1, block_size // threads_per_row)
        x = vector_split_plan(self.n, threads_per_row, REGISTER_CAPACITY).x
        try:
            cfg = default.replace(block_size=block_size, rows_per_block=rows_per_block, x=x)
            self.space(target).encode(cfg)
        except TvmExtError:
            return default
        return cfg if self.space(target).is_feasible(cfg) else default

    def geometry(self, c: Config) -> Geometry:
        """The kernel a config stands for (``simple`` below the small-n threshold)."""
        per_row = max(1, c.block_size // c.rows_per_block)
        if self.n < c.small_n:
            threads = min(per_row, _pow2_ceil(self.n))
            num = -(-self.n // threads)  # a plain loop: one element per step, num steps
            return Geometry(True, threads, 1, VectorSplitPlan(num, 1, num, 1, num, 1), 1, c.rows_per_block)
        plan = decompose(-(-self.n // (c.blocks * per_row)), c.x, c.capacity)
        vw = min(c.x, 16 // np.dtype(self.dtype).itemsize)
        return Geometry(False, per_row, c.blocks, plan, vw, c.rows_per_block, c.combine if c.blocks > 1 else 0)

    # ---- compute and schedule ----------------------------------------------------
    def _storage_dtype(self, target: TargetInfo) -> str:
        """float16 arrives as its bit pattern on OpenCL: neither PoCL nor NVIDIA's OpenCL
        offers cl_khr_fp16, and the runner passes raw bytes, so the kernel widens the
        16-bit pattern to float32 with integer operations."""
        if self.dtype == "float16" and target.kind == "opencl":
            return "uint16"
        return self.dtype

    def _identity_raw(self, storage: str) -> Any:
        from tvm import tirx

        if storage == "uint16":  # bit patterns of -inf, +inf, 0.0 in float16
            return tirx.const({"max": 0xFC00, "min": 0x7C00}.get(self.op, 0), "uint16")
        value = {"max": -math.inf, "min": math.inf}.get(self.op, 0.0)
        return tirx.const(value, storage)

    def _widen(self, raw: Any, storage: str) -> Any:
        """Storage value -> float32 (then squared for sumsq): exact for every input."""
        if storage == "uint16":
            val = _half_bits_to_float(raw)
        elif storage == "float32":
            val = raw
        else:
            val = raw.astype("float32")
        return val * val if self.op == "sumsq" else val

    def _reducer(self) -> Any:
        from tvm import te, tirx

        if self.op == "max":
            return te.comm_reducer(_nan_max, lambda t: tirx.const(-math.inf, t), name="nan_max")
        if self.op == "min":
            return te.comm_reducer(_nan_min, lambda t: tirx.const(math.inf, t), name="nan_min")
        return te.sum

    def prim_func(self, config: Config, target: TargetInfo) -> Any:
        """TE compute for one geometry; the partials (if any) view the scratch parameter."""
        from tvm import te, tirx

        _register_reducers()
        geo = self.geometry(config)
        rows, n, G, B = self.rows, self.n, geo.blocks, geo.threads
        plan, vw, xc = geo.plan, geo.vw, geo.xc
        z, w = plan.z, plan.w
        storage = self._storage_dtype(target)
        a = te.placeholder(self.shape, storage, name="A")
        guarded = geo.reach != n
        identity = self._identity_raw(storage)
        reducer = self._reducer()

        def index(g: Any, t: Any, p: Any, j: Any, c: Any, l: Any) -> Any:
            return ((((p * z + j) * G + g) * xc + c) * B + t) * vw + l

        def load(r: Any, k: Any) -> Any:
            value = a[r, k] if len(self.shape) == 2 else a[k]
            return tirx.if_then_else(k < n, value, identity) if guarded else value

        axes = [te.reduce_axis((0, B), "t"), te.reduce_axis((0, w), "p"), te.reduce_axis((0, z), "j"),
                te.reduce_axis((0, xc), "c"), te.reduce_axis((0, vw), "l")]
        t, p, j, c, l = axes
        if geo.simple:
            def partial(r: Any, g: Any) -> Any:
                return reducer(self._widen(load(r, index(g, t, p, j, c, l)), storage), axis=axes)
        else:
            # The register tile of one pass: z vectors of x lanes, loaded before use.
            tile = te.compute((rows, G, B, w, z, xc, vw),
                              lambda r, g, t_, p_, j_, c_, l_: load(r, index(g, t_, p_, j_, c_, l_)),
                              name="tile")

            def partial(r: Any, g: Any) -> Any:
                return reducer(self._widen(tile[r, g, t, p, j, c, l], storage), axis=axes)

        if G == 1:
            total = te.compute((rows,), lambda r: partial(r, 0), name="total")
            part = None
        else:
            part = te.compute((rows, G), partial, name="partial")
            g2 = te.reduce_axis((0, G), "g2")
            total = te.compute((rows,), lambda r: reducer(part[r, g2], axis=g2), name="total")
        out = total
        if self.op == "mean":
            out = te.compute((rows,), lambda r: total[r] / tirx.const(float(n), "float32"), name="mean")
        func = te.create_prim_func([a, out] + ([part] if part is not None else []))
        return _with_scratch(func, self.scratch(), part is not None)

    def schedule(self, config: Config, target: TargetInfo) -> Any:
        """The scheduled kernel(s); with ``combine=1`` a ``MergedSchedule`` whose module is
        the two kernels merged into one launch (``merge_partials``)."""
        from tvm import s_tir

        geo = self.geometry(config)
        sch = s_tir.Schedule(self.prim_func(config, target))
        first = sch.get_sblock("total" if geo.blocks == 1 else "partial")
        loops = sch.get_loops(first)
        row = None
        if geo.blocks == 1:
            bx, tx, p, j, c, l = loops
            if geo.rows_per_block > 1:  # several rows per block: one thread group (y) per row
                bx, row = sch.split(bx, [None, geo.rows_per_block])
                sch.bind(row, "threadIdx.y")
        else:
            r, g, tx, p, j, c, l = loops
            bx = sch.fuse(r, g)
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")  # the allreduce: warp shuffles, then across warps
        if not geo.simple:
            # S51: load the pass's z vectors into registers, reduce inside each vector and
            # across the z vectors; S52: the pass results accumulate across the w passes.
            tile = sch.get_sblock("tile")
            sch.compute_at(tile, p, preserve_unit_loops=True)
            sch.set_scope(tile, 0, "local")
            tloops = sch.get_loops(tile)
            if geo.vw > 1:
                sch.vectorize(tloops[-1])
            sch.unroll(tloops[-2])
            sch.unroll(tloops[-3])
            for loop in (j, c, l):
                sch.unroll(loop)
        last = sch.get_sblock("total")
        if geo.blocks > 1:  # second kernel: one block per row reduces the partials
            r, g2 = sch.get_loops(last)
            # merged into the first kernel's blocks, it runs on all their threads
            threads = geo.threads if geo.combine else min(geo.threads, geo.blocks)
            _, gt = sch.split(g2, [None, threads])
            sch.bind(r, "blockIdx.x")
            sch.bind(gt, "threadIdx.x")
            bx = r
        if self.op == "mean":  # divide by n in the same kernel, after the allreduce
            sch.set_scope(last, 0, "local")
            sch.reverse_compute_at(sch.get_sblock("mean"), row if row is not None else bx)
        if geo.combine:
            return MergedSchedule(merge_partials(sch.mod, target, self.rows, geo.blocks), sch.trace)
        return sch


@dataclass(frozen=True)
class MergedSchedule:
    """What ``schedule`` returns for ``combine=1``: the one-launch module the builder compiles,
    and the trace of the two-kernel schedule it was merged from (replaying the trace gives
    the two kernels; ``merge_partials``, a function of the config, makes them one)."""

    mod: Any
    trace: Any


# ---- one launch: the last block to finish combines the partials -------------------------------
_FENCE, _SECOND = 0x5EED1, 0x5EED2  # placeholders in the combine step, replaced when merging
CLK_GLOBAL_MEM_FENCE = 2  # OpenCL C's flag value (a macro the generated source cannot name)


def _combine_step(rows: int, last: int, atomic: str) -> Any:
    """After a block has written its partial: every thread fences its writes, one thread
    takes a ticket from the row's counter (an atomic add); the block holding the last ticket
    fences again (so it sees every other block's partial), runs the second stage (``_SECOND``)
    and resets the counter to 0 for the next launch."""
    from tvm.script import tirx as T

    @T.prim_func(private=True)
    def combine(counter: T.Buffer((rows,), "int32"), row: T.int32, thread: T.int32):
        ticket = T.alloc_shared((1,), "int32")
        mine = T.alloc_local((1,), "int32")
        T.evaluate(_FENCE)
        T.tvm_storage_sync("shared")
        if thread == 0:
            ticket[0] = T.call_extern("int32", atomic, T.address_of(counter[row]), 1)
        T.tvm_storage_sync("shared")
        mine[0] = ticket[0]  # (TVM's sync planner allows shared loads in statements only)
        if mine[0] == last:
            T.evaluate(_FENCE)
            T.evaluate(_SECOND)
            if thread == 0:
                counter[row] = 0

    return combine


def merge_partials(mod: Any, target: TargetInfo, rows: int, blocks: int) -> Any:
    """The two-kernel reduction (partials, then one block per row adding them up) as one
    kernel: every block computes its partial, then the last block of each row to finish
    runs the second kernel's code for that row (threadfence reduction, as in CUB's
    single-pass reductions).  The row's counter is the ``counter`` parameter (zero before
    the first launch; the last block resets it).  CUDA: ``__threadfence`` and ``atomicAdd``;
    OpenCL: ``mem_fence(CLK_GLOBAL_MEM_FENCE)`` and ``atomic_add``."""
    import tvm
    from tvm import tirx

    from tvm_ext.lowering.step_loop import lower_to_loops

    func = lower_to_loops(mod, target)
    kernels = list(func.body.seq) if isinstance(func.body, tirx.SeqStmt) else [func.body]
    if len(kernels) != 2 or not all(launch_chain(k)[0] for k in kernels):
        raise ValueError(f"expected two kernels to merge, found {len(kernels)} statements")
    (chain1, first), (chain2, second) = launch_chain(kernels[0]), launch_chain(kernels[1])
    tags1 = {a.node.thread_tag: a for a in chain1}
    tags2 = {a.node.thread_tag: a for a in chain2}
    if set(tags1) != {"blockIdx.x", "threadIdx.x"} or set(tags2) != set(tags1):
        raise ValueError(f"kernels bound to {sorted(tags1)} and {sorted(tags2)}: expected blockIdx.x, threadIdx.x")
    if int(tags1["threadIdx.x"].value) != int(tags2["threadIdx.x"].value):
        raise ValueError("the two kernels must run the same threads per block")
    block, thread = tags1["blockIdx.x"].node.var, tags1["threadIdx.x"].node.var
    row = tirx.floordiv(block, blocks)
    outer = [tags2["blockIdx.x"].node.var, tags2["threadIdx.x"].node.var]
    second = tirx.PrimFunc(outer, second).specialize({outer[0]: row, outer[1]: thread}).body
    if target.kind == "cuda":
        fence, atomic = tirx.call_extern("void", "__threadfence"), "atomicAdd"
    else:
        fence, atomic = tirx.call_extern("void", "mem_fence", CLK_GLOBAL_MEM_FENCE), "atomic_add"
    # the step's counter buffer takes the place of the (so far unused) counter parameter
    if func.params[-1].name != "counter":
        raise ValueError(f"the last parameter is {func.params[-1].name!r}, not the counter")
    step = _combine_step(rows, blocks - 1, atomic)
    step = step.specialize({step.params[1]: row, step.params[2]: thread})
    counter = step.params[0]

    def fill(stmt: Any) -> Any:  # the step holds only sequences, ifs and statements
        if isinstance(stmt, tirx.SeqStmt):
            return tirx.SeqStmt([fill(s) for s in stmt.seq])
        if isinstance(stmt, tirx.IfThenElse):
            return tirx.IfThenElse(stmt.condition, fill(stmt.then_case),
                                   fill(stmt.else_case) if stmt.else_case is not None else None)
        if isinstance(stmt, tirx.Evaluate) and isinstance(stmt.value, tirx.IntImm):
            return {_FENCE: tirx.Evaluate(fence), _SECOND: second}.get(stmt.value.value, stmt)
        return stmt

    allocs = [stmt for stmt in step.body.seq if isinstance(stmt, tirx.AllocBuffer)]
    rest = [fill(stmt) for stmt in step.body.seq if not isinstance(stmt, tirx.AllocBuffer)]
    body = tirx.SeqStmt([*allocs, first, *rest])  # allocations first in the kernel
    merged = tirx.PrimFunc(list(func.params[:-1]) + [counter], rewrap(chain1, body), func.ret_type, func.attrs)
    return tvm.IRModule({"main": merged})


class _Reference(np.ndarray):
    """A float64 reference that carries ``bound``: the error ``check`` allows per row.

    ``check`` only sees outputs and references, and the bound depends on Σ|a_i|.
    """

    bound: np.ndarray


def _half_bits_to_float(raw: Any) -> Any:
    """float16 bit pattern (uint16) -> float32 with integer operations only.

    Exact for normals, subnormals, ±0, ±inf and NaN.  No float constants: OpenCL C
    code generation prints them with 7 digits.
    """
    from tvm import tirx

    u32 = lambda v: tirx.const(v, "uint32")  # noqa: E731
    bits = raw.astype("uint32")
    sign = (bits & u32(0x8000)) << u32(16)
    magnitude = bits & u32(0x7FFF)
    exponent = magnitude >> u32(10)
    mantissa = bits & u32(0x3FF)
    normal = (magnitude << u32(13)) + u32(112 << 23)  # rebias the exponent 15 -> 127
    special = (magnitude << u32(13)) | u32(0x7F800000)  # inf / NaN keep their payload
    # subnormal m·2^-24: convert m exactly, then lower the float's exponent by 24
    sub = tirx.reinterpret("uint32", mantissa.astype("float32")) - u32(24 << 23)
    sub = tirx.Select(mantissa == u32(0), u32(0), sub)
    pattern = tirx.Select(exponent == u32(31), special, tirx.Select(exponent == u32(0), sub, normal))
    return tirx.reinterpret("float32", pattern | sign)


def _with_scratch(func: Any, scratch: list[TensorSpec], used: bool) -> Any:
    """Make the function's last parameters the template's scratch buffers: the partials,
    then the per-row counter of the one-launch combine.

    The partials are computed into a (rows, blocks) buffer; the runner allocates
    (rows, max_blocks) for every config.  The partials become a view of the first
    ``blocks`` columns of that parameter (a root-block match_buffer), and a config
    without partials still takes the parameters, unused.
    """
    if not scratch:
        return func
    from tvm import ir, s_tir, tirx

    spec, counter_spec = scratch
    big = tirx.decl_buffer(spec.shape, spec.dtype, name="scratch")
    counter = tirx.decl_buffer(counter_spec.shape, counter_spec.dtype, name="counter")
    params = list(func.params)
    realize = func.body
    root = realize.block
    match = list(root.match_buffers)
    if used:
        part = params.pop()
        region = tirx.BufferRegion(big, [ir.Range.from_min_extent(0, d) for d in part.shape])
        match.append(s_tir.MatchBufferRegion(part, region))
    block = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, root.body, root.init,
                         root.alloc_buffers, match, root.annotations)
    body = s_tir.SBlockRealize(realize.iter_values, realize.predicate, block)
    return tirx.PrimFunc(params + [big, counter], body, attrs=func.attrs)
