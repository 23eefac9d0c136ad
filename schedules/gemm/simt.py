"""GEMM C = A·B as a TVM tensor expression with method 000's knobs.

Knobs: work-group size ``wg_x`` × ``wg_y`` (threads along N × M),
per-thread work ``task_x`` × ``task_y`` (outputs along N × M), plus what the text
says speed depends on: shared (local) memory staging, bank-conflict padding and
unrolling to constant indexing; and the k-step and vector width of loads/stores.

Any M, N, K ≥ 1 works: when a dimension is not a multiple of its tile the
iteration space is padded (``pad_einsum``) and the padding is folded into guarded
loads and stores, so no out-of-bounds access and no extra kernels.

Precision (the parameters the mixed-precision search varies): A, B and C each have a storage dtype and the
dot products accumulate in ``acc_dtype``; operands are widened as they are multiplied
and the result is narrowed as it is stored.  Everything defaults to float32.

Variants with the same knobs and the same schedule: a leading batch axis (``batch`` > 0:
one A, B and C per batch entry, on blockIdx.z; ``b_shared``: one B for every entry, as a
weight applied to a batch of matrices), B stored transposed (``b_transposed``: B[N, K], as
attention's Q·Kᵀ and fused weight transposes give it), and a bias row added as the tile is
stored (``BiasGemmTemplate``, the GRU's gate GEMMs).
"""
from __future__ import annotations

from dataclasses import InitVar, dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from tvm_ext.core.errors import TvmExtError, check_sizes
from tvm_ext.precision.precision import (FLOAT_DTYPES, HIGH_PRECISION, DtypeFields, PrecisionParam, TensorCoreGemm,
                                         itemsize)
from tvm_ext.core.space import Config, Knob, Space
from tvm_ext.target import TargetInfo
from tvm_ext.core.template import Template, TensorSpec

KNOBS = (
    Knob("wg_x", (1, 2, 4, 8, 16, 32), "work-group (thread block) width: threads along N"),
    Knob("wg_y", (1, 2, 4, 8, 16, 32), "work-group height: threads along M"),
    Knob("task_x", (1, 2, 4, 8), "outputs per thread along N"),
    Knob("task_y", (1, 2, 4, 8), "outputs per thread along M"),
    Knob("k_step", (4, 8, 16, 32), "K slice staged per iteration of the outer k loop"),
    Knob("use_shared", (0, 1), "stage A and B tiles in shared (OpenCL local) memory"),
    Knob("pad", (0, 1), "pad shared-memory rows to avoid bank conflicts (storage_align)"),
    Knob("unroll", (0, 16, 64, 512), "max unrolled steps: loops become constant indexing"),
    Knob("vec", (1, 2, 4), "vector width of shared-memory fills and output stores"),
    Knob("double_buffer", (0, 1), "prefetch the next K slice into a second shared buffer"),
    Knob("a_transposed", (0, 1), "keep the A tile K-major in shared memory: vector fragment loads of A"),
)

# Searched only when the template asks for them (``GemmTemplate.staging``); a config without
# them, or with every one at its first value, builds exactly the kernel of ``KNOBS`` alone.
STAGING_KNOBS = (
    Knob("prefetch", (0, 1, 2, 3), "next K slice: 0 as double_buffer says; 1 register-staged (global -> "
                                   "registers before the math, registers -> shared after it); 2 cp.async "
                                   "(CUDA sm_80+); 3 register-staged into the second of two shared buffers "
                                   "(the stores need not wait for the math)"),
    Knob("warp_x", (0, 4, 8, 16), "warp tiling: 0 threads numbered row by row over the block; w: each warp "
                                  "a (32/w) x w patch of threads"),
    Knob("load_vec", (0, 4), "global -> shared copy width: 0 = vec; 4 = 16-byte loads whatever vec is"),
)
STAGING_DEFAULTS = {k.name: k.choices[0] for k in STAGING_KNOBS}
# The leader of the SGEMM staging probe (``benchmarks/probes/sgemm_probe.py``): a GA seed
REGISTER_STAGED_TILE = dict(wg_x=16, wg_y=8, task_x=8, task_y=8, k_step=16, use_shared=1, pad=1, unroll=16, vec=4,
                            double_buffer=1, a_transposed=1, prefetch=1)

FEASIBILITY_RULES = ("tvm", "patent")  # "patent": the published work-size rule too (a CLI choice)

PRECISION_PARAMS = (
    PrecisionParam("a", "gemm", "tensor", "storage type of A"),
    PrecisionParam("b", "gemm", "tensor", "storage type of B"),
    PrecisionParam("acc", "gemm", "accumulator", "type the dot products accumulate in"),
    PrecisionParam("c", "gemm", "tensor", "storage type of C"),
)


def even_padded_size(m: int, n: int) -> int:
    """P of the published work-size rule: the smallest even number ≥ M and ≥ N."""
    p = max(m, n)
    return p + (p % 2)


def staging_value(config: Config, name: str) -> int:
    """A ``STAGING_KNOBS`` value of ``config``, its first choice when the config has no such
    knob (the template without ``staging``, older records, the GRU's GEMM configs)."""
    return config.as_dict().get(name, STAGING_DEFAULTS[name])


def staging_reason(c: Config, target: TargetInfo) -> str | None:
    """Why the ``STAGING_KNOBS`` of ``c`` cannot build (one line), or None."""
    threads = c.wg_x * c.wg_y
    if c.prefetch and not (c.use_shared and c.double_buffer):
        return f"prefetch={c.prefetch} stages the next K slice into the second shared buffer: it needs " \
               "use_shared=1 and double_buffer=1"
    if c.prefetch == 2:
        arch = (target.arch or "").rstrip("a")
        if target.kind != "cuda" or (arch.startswith("sm_") and arch[3:].isdigit() and int(arch[3:]) < 80):
            return f"cp.async (prefetch=2) needs a CUDA sm_80+ target, not {target.kind} {target.arch or ''}".strip()
        if c.a_transposed:
            return "cp.async (prefetch=2) copies rows as they are: it needs a_transposed=0"
        # TVM 0.27's InjectPTXAsyncCopy fails on these copies (vector lanes of load and store differ)
        if c.warp_x or (c.vec > 1 and c.task_x == c.vec):
            return "cp.async (prefetch=2) does not lower with warp_x > 0 or task_x == vec > 1 in TVM 0.27"
    if c.warp_x:
        if threads % 32 or c.wg_x % c.warp_x or c.wg_y % (32 // c.warp_x):
            return (f"warp_x={c.warp_x}: the {c.wg_y}x{c.wg_x} thread block does not split into "
                    f"{32 // c.warp_x}x{c.warp_x} warps")
    if c.load_vec:
        bm, bn = c.wg_y * c.task_y, c.wg_x * c.task_x
        if not c.use_shared:
            return "load_vec sets the width of the shared-memory fills: it needs use_shared=1"
        if c.pad and c.vec % c.load_vec:
            return f"load_vec={c.load_vec} copies need shared rows padded by a multiple of it (vec={c.vec})"
        chunk = threads * c.load_vec
        if (bm * c.k_step) % chunk or (bn * c.k_step) % chunk or c.k_step % c.load_vec or bn % c.load_vec:
            return f"tile fills do not split evenly over the threads with load_vec={c.load_vec}"
    return None


class TensorCoreTile(Protocol):
    """A tensor-core kernel and its tile for the matmul block of a PrimFunc: ``mma.MmaGemmTile``
    (mma.sync + ldmatrix, float16 or bfloat16 operands) or ``wmma.WmmaGemmTile`` (WMMA, float16);
    ``tvm_ext.schedules.gemm.tensor_core.parse_tile`` / ``pick_tile`` make them.  A GEMM template
    holding one (``GemmTemplate.tensor_core``) runs on it wherever ``reason`` has nothing
    against its shape, dtypes and target, and on the CUDA cores elsewhere."""

    kernel: str  # "mma" or "wmma"
    operand_dtypes: tuple[str, ...]  # the types A and B may both have on it
    config: Config  # the kernel's own knobs

    def label(self) -> str:
        """The tile in a few words (kernel, block tile, pipeline)."""

    def reason(self, m: int, n: int, k: int, a_dtype: str, b_dtype: str, acc_dtype: str, c_dtype: str,
               target: TargetInfo, *, epilogue: bool = False) -> str | None:
        """Why this tile cannot run the matmul (``epilogue``: blocks after it join its store)."""

    def schedule(self, sch: Any, block_name: str, *, epilogue: Sequence[str] = (), a_read: int = 0,
                 b_read: int = 1) -> Any:
        """Schedule matmul block ``block_name`` of ``sch`` (and its ``epilogue`` blocks) on the tile."""

    def pass_config(self) -> dict[str, Any]:
        """PassContext options ``tvm.compile`` needs for the tile's kernel."""


def check_tile(tile: Any, field: str) -> None:
    """A tensor-core field holds a tile (which says its kernel), not a bare knob config."""
    if isinstance(tile, Config):
        raise TvmExtError(f"{field} takes a tensor-core tile (tensor_core.parse_tile / pick_tile, or "
                          f"MmaGemmTile(config) / WmmaGemmTile(config)), not a bare config: {tile}")


@dataclass(frozen=True)
class MatmulSite:
    """Where the GEMM sits in a PrimFunc: its block, which reads are A[i, k] and B[k, j],
    and the elementwise blocks after it (bias, activation) that the write-back stage
    absorbs.  The default is the template's own compute."""

    block: str = "C"
    a: int = 0
    b: int = 1
    epilogue: tuple[str, ...] = ()


def collapse_epilogue(sch: Any, site: MatmulSite) -> MatmulSite:
    """Inline a foreign matmul's elementwise epilogue into its last block, so one block joins
    the write-back: TVM's GELU reads the pre-activation twice, and a chain whose blocks
    share an intermediate does not reverse-inline into the store."""
    for name in site.epilogue[:-1]:
        sch.compute_inline(sch.get_sblock(name))
    return MatmulSite(site.block, site.a, site.b, site.epilogue[-1:])


@dataclass(frozen=True)
class GemmTemplate(DtypeFields, Template):
    """C[M, N] = A[M, K] · B[K, N].

    ``feasibility="tvm"`` (default) admits every config whose tile fits the target's
    thread and shared-memory limits.  ``feasibility="patent"`` additionally applies
    the published work-size rule: wg_x·wg_y·task_x·task_y must divide P·P with P the smallest
    even number ≥ M and ≥ N.
    """

    m: int
    n: int
    k: int
    feasibility: str = "tvm"
    a_dtype: str = HIGH_PRECISION
    b_dtype: str = HIGH_PRECISION
    acc_dtype: str = HIGH_PRECISION
    c_dtype: str = HIGH_PRECISION
    dtype: InitVar[str | None] = None  # shorthand: all four (older records name only this)
    # A tensor-core tile (``TensorCoreTile``: mma.sync or WMMA): where it can run this GEMM
    # (operand types it takes, a CUDA target, a shape it fits) the GEMM runs on tensor cores
    # with it and the CUDA-core config is not used (the mixed-precision search's low types then
    # buy the tensor cores' speed).
    tensor_core: TensorCoreTile | None = None
    batch: int = 0  # > 0: a leading batch axis of this many independent GEMMs (blockIdx.z)
    # Also search ``STAGING_KNOBS`` (register-staged prefetch, warp tiling, load width).
    staging: bool = False
    b_transposed: bool = False  # B is stored [N, K] (read B[j, k]): its shared tile keeps that layout
    b_shared: bool = False  # with ``batch``: one B [K, N] for every batch entry

    name = "gemm"
    PRECISION_PARAMS = PRECISION_PARAMS

    def __post_init__(self, dtype: str | None = None) -> None:
        if dtype is not None:
            for param in ("a_dtype", "b_dtype", "acc_dtype", "c_dtype"):
                object.__setattr__(self, param, dtype)
        check_sizes("GEMM", M=self.m, N=self.n, K=self.k)
        if not isinstance(self.batch, (int, np.integer)) or self.batch < 0:
            raise TvmExtError(f"GEMM batch must be a non-negative integer, got {self.batch!r}")
        if self.b_shared and not self.batch:
            raise TvmExtError("b_shared (one B for every batch entry) needs a batch axis")
        check_tile(self.tensor_core, "tensor_core")
        for param, dtype in self.precision.items():
            if dtype not in FLOAT_DTYPES:
                raise TvmExtError(f"GEMM {param} dtype {dtype!r} is not supported; allowed: {', '.join(FLOAT_DTYPES)}")
        if self.feasibility not in FEASIBILITY_RULES:
            raise TvmExtError(
                f"unknown feasibility rule {self.feasibility!r}; allowed: {', '.join(FEASIBILITY_RULES)}"
            )

    @classmethod
    def from_shape(cls, shape: tuple[int, ...], **options: Any) -> "GemmTemplate":
        if len(shape) != 3:
            raise TvmExtError(f"GEMM shape is M,N,K (3 numbers), got {len(shape)}")
        return cls(*shape, **options)

    @property
    def params(self) -> dict[str, Any]:
        params = {"m": self.m, "n": self.n, "k": self.k, **{f"{p}_dtype": d for p, d in self.precision.items()}}
        if self.tensor_core is not None:
            params["tensor_core"] = str(self.tensor_core)
        if self.batch:
            params["batch"] = self.batch
        if self.staging:
            params["staging"] = True
        if self.b_transposed:
            params["b_transposed"] = True
        if self.b_shared:
            params["b_shared"] = True
        return params

    @property
    def lead(self) -> tuple[int, ...]:
        """The batch axis as a shape prefix: () or (batch,)."""
        return (self.batch,) if self.batch else ()

    @property
    def b_shape(self) -> tuple[int, ...]:
        """B's shape: [batch,] K, N, or N, K transposed; no batch axis when shared."""
        rows = (self.n, self.k) if self.b_transposed else (self.k, self.n)
        return rows if self.b_shared else self.lead + rows

    def tensor_core_reason(self, target: TargetInfo) -> str | None:
        """Why the GEMM does not run on its tensor-core tile (None: it does)."""
        if self.tensor_core is None:
            return "no tensor-core tile"
        if self.b_transposed or self.b_shared:
            return "the tensor-core tiles read B as [K, N], one per batch entry"
        return self.tensor_core.reason(self.m, self.n, self.k, self.a_dtype, self.b_dtype, self.acc_dtype,
                                       self.c_dtype, target, epilogue=bool(self.tensor_core_epilogue()))

    def tensor_core_gemms(self) -> tuple[TensorCoreGemm, ...]:
        return (TensorCoreGemm("GEMM", ("a", "b"), self.full_precision()),) if self.tensor_core is not None else ()

    def uses_tensor_cores(self, target: TargetInfo) -> bool:
        """Whether ``schedule`` takes the tensor-core path (see ``tensor_core``)."""
        return self.tensor_core is not None and self.tensor_core_reason(target) is None

    def pass_config(self, config: Config, target: TargetInfo) -> dict[str, Any]:
        """The tensor-core tile's options (e.g. cp.async) when it is used."""
        if self.uses_tensor_cores(target):
            return self.tensor_core.pass_config()  # type: ignore[union-attr]
        return {"tirx.use_async_copy": True} if staging_value(config, "prefetch") == 2 else {}

    def tensor_core_epilogue(self) -> tuple[str, ...]:
        """The blocks after the GEMM that the tensor-core tile's output store absorbs."""
        return self.own_site().epilogue

    def _tensor_core_schedule(self) -> Any:
        from tvm import s_tir

        return self.tensor_core.schedule(s_tir.Schedule(self.prim_func()), "C",  # type: ignore[union-attr]
                                         epilogue=self.tensor_core_epilogue())

    # ---- tensors and reference -------------------------------------------------
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec(self.lead + (self.m, self.k), self.a_dtype), TensorSpec(self.b_shape, self.b_dtype)]

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec(self.lead + (self.m, self.n), self.c_dtype)]

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a, b = inputs
        b = b.astype(np.float64)
        return [a.astype(np.float64) @ (np.swapaxes(b, -1, -2) if self.b_transposed else b)]

    def flops(self) -> float:
        return 2.0 * max(self.batch, 1) * self.m * self.n * self.k

    # ---- knob space -------------------------------------------------------------
    def space(self, target: TargetInfo) -> Space:
        constraints = [lambda c: self._hardware_reason(c, target)]
        unhonoured = self.precision_reason(target.kind)
        if unhonoured:  # e.g. a bfloat16 accumulator on OpenCL: no config has it
            constraints.insert(0, lambda c: unhonoured)
        if self.feasibility == "patent":
            constraints.append(self._padded_square_reason)
        if self.staging:
            constraints.append(lambda c: staging_reason(c, target))
        return Space(KNOBS + STAGING_KNOBS if self.staging else KNOBS, tuple(constraints))

    def _padded_square_reason(self, c: Config) -> str | None:
        p = even_padded_size(self.m, self.n)
        work = c.wg_x * c.wg_y * c.task_x * c.task_y
        if (p * p) % work:
            return f"patent rule: wg_x*wg_y*task_x*task_y={work} does not divide P*P={p * p}"
        return None

    def shared_bytes(self, c: Config) -> int:
        if not c.use_shared:
            return 0
        bm, bn = c.wg_y * c.task_y, c.wg_x * c.task_x
        pad = c.vec if c.pad else 0
        # register-staged prefetch 1 stores the next slice after the math: one shared buffer
        stages = 2 if c.double_buffer and staging_value(c, "prefetch") != 1 else 1
        # rows are padded by ``pad``: A [bm, k] or K-major [k, bm]; B [k, bn] or transposed [bn, k]
        a_tile = c.k_step * (bm + pad) if c.a_transposed else bm * (c.k_step + pad)
        b_tile = bn * (c.k_step + pad) if self.b_transposed else c.k_step * (bn + pad)
        return stages * (itemsize(self.a_dtype) * a_tile + itemsize(self.b_dtype) * b_tile)

    def _hardware_reason(self, c: Config, target: TargetInfo) -> str | None:
        threads = c.wg_x * c.wg_y
        if threads > target.max_threads_per_block:
            return f"{threads} threads per block > device limit {target.max_threads_per_block}"
        if c.task_x * c.task_y > 64:
            return "more than 64 accumulators per thread"
        if c.task_x % c.vec:
            return "vec must divide task_x (vectorized stores)"
        if self.shared_bytes(c) > target.max_shared_memory_per_block:
            return f"needs {self.shared_bytes(c)} B shared memory > {target.max_shared_memory_per_block}"
        if (c.pad or c.double_buffer or c.a_transposed) and not c.use_shared:
            return "padding, double buffering and a transposed A tile need shared memory"
        if c.a_transposed and c.task_y % c.vec:
            return "vec must divide task_y with a transposed A tile"
        if c.use_shared:
            bm, bn = c.wg_y * c.task_y, c.wg_x * c.task_x
            chunk = threads * c.vec
            if (bm * c.k_step) % chunk or (bn * c.k_step) % chunk or c.k_step % c.vec:
                return "tile fills do not split evenly over the threads and vector width"
        return None

    def default_config(self, target: TargetInfo) -> Config:
        """A textbook 16×16-thread, 4×4-per-thread tile with shared memory.

        Degrades gracefully on devices with small work-groups (PoCL allows 4096,
        some GPUs 256).
        """
        space = self.space(target)
        extra = STAGING_DEFAULTS if self.staging else {}
        for wg in (16, 8, 4, 2, 1):
            cfg = space.make(wg_x=wg, wg_y=wg, task_x=4, task_y=4, k_step=8, use_shared=1,
                             pad=0, unroll=64, vec=1, double_buffer=0, a_transposed=0, **extra)
            if space.is_feasible(cfg):
                return cfg
        return space.make(wg_x=1, wg_y=1, task_x=1, task_y=1, k_step=4, use_shared=0, pad=0,
                          unroll=0, vec=1, double_buffer=0, a_transposed=0, **extra)

    def known_good(self, target: TargetInfo) -> list[Config]:
        """With the staging knobs on CUDA: the register-staged 64x128 tile (8x8 a thread, k 16),
        the SGEMM probe's best at 4096^3 and at BERT-base's 1024x3072x768 (docs/results/gemm.md)
        -- where it is feasible."""
        if not self.staging or target.kind != "cuda":
            return []
        space = self.space(target)
        config = space.make(**{**STAGING_DEFAULTS, **REGISTER_STAGED_TILE})
        return [config] if space.is_feasible(config) else []

    # ---- compute and schedule ----------------------------------------------------
    def prim_func(self) -> Any:
        from tvm import te

        if self.batch or self.b_transposed:
            return gemm_bias_func(self.batch, self.m, self.n, self.k, self.a_dtype, self.b_dtype, self.acc_dtype,
                                  self.c_dtype, bias=False, b_transposed=self.b_transposed, b_shared=self.b_shared)
        acc = self.acc_dtype
        a = te.placeholder((self.m, self.k), self.a_dtype, name="A")
        b = te.placeholder((self.k, self.n), self.b_dtype, name="B")
        r = te.reduce_axis((0, self.k), name="k")
        c = te.compute((self.m, self.n), lambda i, j: te.sum(a[i, r].astype(acc) * b[r, j].astype(acc), axis=r),
                       name="C")
        if self.c_dtype == acc:
            return te.create_prim_func([a, b, c])
        out = te.compute((self.m, self.n), lambda i, j: c[i, j].astype(self.c_dtype), name="C_out")
        return te.create_prim_func([a, b, out])

    def own_site(self) -> MatmulSite:
        """Where the GEMM sits in ``prim_func``: the narrowing store is an epilogue."""
        return MatmulSite(epilogue=() if self.c_dtype == self.acc_dtype else ("C_out",))

    def schedule(self, config: Config, target: TargetInfo, func: Any = None,
                 site: "MatmulSite | None" = None) -> Any:
        """The schedule of ``config``; with ``func`` and ``site``, of the GEMM inside a
        foreign PrimFunc (e.g. a Relax task, found by ``tvm_ext.relax.tasks``) instead of our
        own compute, so tuned configs can be replayed on what TVM's lowering produced."""
        from tvm import s_tir

        if func is None and self.uses_tensor_cores(target):
            return self._tensor_core_schedule()
        c = config
        site = site or (self.own_site() if func is None else MatmulSite())
        bm, bn = c.wg_y * c.task_y, c.wg_x * c.task_x
        sch = s_tir.Schedule(self.prim_func() if func is None else func)
        if func is not None:
            site = collapse_epilogue(sch, site)
        gemm = sch.get_sblock(site.block)
        blk = sch.get(gemm)
        buf = {"A": blk.reads[site.a].source.name, "B": blk.reads[site.b].source.name,
               "C": blk.writes[0].source.name}
        operand = {"A": site.a, "B": site.b}
        pad_m, pad_n, pad_k = self.m % bm != 0, self.n % bn != 0, self.k % c.k_step != 0
        # pad_einsum makes a padded copy only of the operands whose dims need it.
        pads = {"A": pad_m or pad_k, "B": pad_k or pad_n, "C": pad_m or pad_n}
        padded = any(pads.values())
        if padded:  # a foreign matmul may have several batch axes: no padding along them
            sch.pad_einsum(gemm, [1] * (len(blk.iter_vars) - 3) + [bm, bn, c.k_step])
        *lead, i, j, k = sch.get_loops(gemm)  # lead: the batch axis, if any
        if len(lead) > 1:  # several batch axes (e.g. batch and heads): one grid axis
            lead = [sch.fuse(*lead)]
        # N is interleaved: each thread owns task_x/vec chunks of vec adjacent columns,
        # wg_x*vec apart, so a warp's shared and global accesses are contiguous
        # (no bank conflicts, coalesced vector stores).  The chunk loop is a virtual
        # thread so the thread's accumulators stay one compact register tile.  With a
        # K-major A tile, M is interleaved the same way.
        row_chunk = c.vec if c.a_transposed else c.task_y
        by, vy, ty, ii = sch.split(i, [None, c.task_y // row_chunk, c.wg_y, row_chunk])
        bx, vx, tx, jj = sch.split(j, [None, c.task_x // c.vec, c.wg_x, c.vec])
        ko, ki = sch.split(k, [None, c.k_step])
        sch.reorder(*lead, by, bx, vy, vx, ty, tx, ko, ki, ii, jj)
        for axis in lead:
            sch.bind(axis, "blockIdx.z")
        sch.bind(by, "blockIdx.y")
        sch.bind(bx, "blockIdx.x")
        sch.bind(vy, "vthread.y")
        sch.bind(vx, "vthread.x")
        warp_x = staging_value(c, "warp_x")
        threads_y, threads_x = c.wg_y, c.wg_x
        if warp_x:  # threadIdx.x = lane of a (32/w) x w patch, threadIdx.y = the patch
            wy, ly = sch.split(ty, [None, 32 // warp_x])
            wx, lx = sch.split(tx, [None, warp_x])
            sch.reorder(wy, wx, ly, lx)
            ty, tx = sch.fuse(wy, wx), sch.fuse(ly, lx)
            threads_y, threads_x = c.wg_x * c.wg_y // 32, 32
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")

        acc = sch.cache_write(gemm, 0, "local")
        sch.reverse_compute_at(acc, tx)
        if pads["C"]:
            sch.reverse_compute_inline(sch.get_sblock(f"{buf['C']}_pad"))
        for name in site.epilogue:  # elementwise consumers join the register tile's store
            sch.reverse_compute_inline(sch.get_sblock(name))
        if c.vec > 1 and not pads["C"]:
            sch.vectorize(sch.get_loops(acc)[-1])

        prefetch = staging_value(c, "prefetch")
        if c.use_shared:
            for name in ("A", "B"):
                stage = sch.cache_read(gemm, operand[name], "shared")
                sch.compute_at(stage, ko)
                if pads[name]:
                    sch.compute_inline(sch.get_sblock(f"{buf[name]}_pad"))
                transposed = name == "A" and c.a_transposed
                if transposed:
                    sch.transform_layout(stage, ("write", 0),  # batch axes (if any) stay first
                                         lambda *idx: (*idx[:-2], idx[-1], idx[-2]))
                if c.pad:  # row stride = row length + vec: rows start on different banks
                    # rows along k: A as stored, and a transposed B (its tile is [bn, k_step])
                    k_rows = (name == "A" and not transposed) or (name == "B" and self.b_transposed)
                    row = c.k_step if k_rows else (bm if transposed else bn)
                    rank = len(sch.get(stage).writes[0].source.shape)  # batch axes (if any) first
                    sch.storage_align(stage, 0, axis=rank - 2, factor=row, offset=c.vec % row)
                own = sch.get_loops(stage)[len(lead) + 7:]  # below (batch,) by, bx, vy, vx, ty, tx, ko
                fused = own[0] if len(own) == 1 else sch.fuse(*own)
                fill_vec = staging_value(c, "load_vec") or c.vec
                _, fy, fx, fv = sch.split(fused, [None, threads_y, threads_x, fill_vec])
                sch.bind(fy, "threadIdx.y")
                sch.bind(fx, "threadIdx.x")
                if fill_vec > 1 and not pads[name]:
                    sch.vectorize(fv)
                if prefetch in (1, 3):  # global -> registers -> shared
                    sch.annotate(stage, "tirx.manifest_shared_memory_local_stage", 1)
                if prefetch == 3:  # two versions of the tile: slice k+1's stores
                    sch.annotate(stage, "double_buffer_scope", 0)  # go to the buffer slice k does not read
            # Register tiles of A and B per k so the inner product reads registers.
            for name in ("A", "B"):
                frag = sch.cache_read(gemm, operand[name], "local")
                sch.compute_at(frag, ki)
                if c.vec > 1 and ((name == "B" and not self.b_transposed) or (name == "A" and c.a_transposed)):
                    sch.vectorize(sch.get_loops(frag)[-1])
            if prefetch in (1, 3):  # children: A global->regs, A regs->shared, B the same, the k loop:
                # the loads of slice k+1 are issued before the math of slice k, the stores after it
                sch.annotate(ko, "software_pipeline_stage", [0, 0, 0, 0, 1])
                sch.annotate(ko, "software_pipeline_order", [0, 3, 1, 4, 2])
            elif c.double_buffer:  # fills of slice k+1 overlap the math of slice k
                sch.annotate(ko, "software_pipeline_stage", [0, 0, 1])
                sch.annotate(ko, "software_pipeline_order", [0, 1, 2])
                if prefetch == 2:  # as cp.async copies (the pass option is in ``pass_config``)
                    sch.annotate(ko, "software_pipeline_async_stages", [0])
        else:
            for name in ("A", "B"):
                if pads[name]:
                    sch.compute_inline(sch.get_sblock(f"{buf[name]}_pad"))

        if c.unroll:
            outer = lead[0] if lead else by
            sch.annotate(outer, "pragma_auto_unroll_max_step", c.unroll)
            sch.annotate(outer, "pragma_unroll_explicit", 1)
        sch.decompose_reduction(gemm, ko)
        return sch


# ---- with a bias row (and a batch axis): the GRU's gate GEMMs ------------------------------
def gemm_bias_func(batch: int, m: int, n: int, k: int, a_dtype: str = HIGH_PRECISION,
                   b_dtype: str = HIGH_PRECISION, acc_dtype: str = HIGH_PRECISION,
                   c_dtype: str = HIGH_PRECISION, bias: bool = True, b_transposed: bool = False,
                   b_shared: bool = False, scale: float = 1.0, bias_dtype: str | None = None) -> Any:
    """TE ``D = A·B·scale + bias`` (``batch`` = 0: 2-D; else a leading batch axis, one B per
    batch unless ``b_shared``; ``b_transposed``: B stored [N, K]).

    The bias is stored in B's type (a weight) unless ``bias_dtype`` says otherwise; A, B and
    the bias are widened to ``acc_dtype``, and D is narrowed to ``c_dtype`` as it is stored.
    ``scale`` (1: no multiply) undoes operands stored scaled, e.g. split into float16 parts.
    ``bias=False``: ``C = A·B`` with the narrowing block "C_out" as ``GemmTemplate.prim_func``
    has it."""
    import tvm
    from tvm import te

    lead = (batch,) if batch else ()
    b_lead = () if b_shared else lead
    a = te.placeholder(lead + (m, k), a_dtype, name="A")
    b = te.placeholder(b_lead + ((n, k) if b_transposed else (k, n)), b_dtype, name="B")
    r = te.reduce_axis((0, k), name="k")

    def b_at(i: tuple[Any, ...]) -> Any:
        rows = (i[-1], r) if b_transposed else (r, i[-1])
        return b[(i[:-2] if b_lead else ()) + rows]

    c = te.compute(lead + (m, n), lambda *i: te.sum(a[i[:-1] + (r,)].astype(acc_dtype) * b_at(i).astype(acc_dtype),
                                                    axis=r),
                   name="C")
    if not bias:
        if c_dtype == acc_dtype:
            return te.create_prim_func([a, b, c])
        out = te.compute(lead + (m, n), lambda *i: c[i].astype(c_dtype), name="C_out")
        return te.create_prim_func([a, b, out])
    bias_row = te.placeholder(lead + (n,), bias_dtype or b_dtype, name="bias")

    def scaled(value: Any) -> Any:
        return value if scale == 1.0 else value * tvm.tirx.const(scale, acc_dtype)

    d = te.compute(lead + (m, n),
                   lambda *i: (scaled(c[i]) + bias_row[i[:-2] + (i[-1],)].astype(acc_dtype)).astype(c_dtype), name="D")
    return te.create_prim_func([a, b, bias_row, d])


@dataclass(frozen=True)
class BiasGemmTemplate(GemmTemplate):
    """The GEMM template with a bias row, D = A·B + bias: the template's own schedule
    applies unchanged (with ``batch``, one bias row per batch entry), and the bias is folded
    into the register tile's store.  The bias has B's dtype (it belongs to the weights) unless
    ``bias_dtype`` names another; the narrowing to ``c_dtype`` is part of D.  ``out_scale``
    multiplies A·B before the bias (operands stored scaled, as the GRU's split input GEMM)."""

    out_scale: float = 1.0
    bias_dtype: str | None = None

    name = "gemm_bias"

    @property
    def params(self) -> dict[str, Any]:
        params = super().params
        if self.out_scale != 1.0:
            params["out_scale"] = self.out_scale
        if self.bias_dtype is not None:
            params["bias_dtype"] = self.bias_dtype
        return params

    def prim_func(self) -> Any:
        return gemm_bias_func(self.batch, self.m, self.n, self.k, self.a_dtype, self.b_dtype, self.acc_dtype,
                              self.c_dtype, scale=self.out_scale, bias_dtype=self.bias_dtype)

    def own_site(self) -> MatmulSite:
        return MatmulSite()  # D (bias and narrowing) is inlined after the GEMM's schedule

    def tensor_core_epilogue(self) -> tuple[str, ...]:
        return ("D",)  # bias and narrowing join the tile's output store

    def inputs(self) -> list[TensorSpec]:
        return super().inputs() + [TensorSpec(self.lead + (self.n,), self.bias_dtype or self.b_dtype)]

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a, b, bias = inputs
        product = (a.astype(np.float64) @ b.astype(np.float64)) * self.out_scale
        return [product + bias.astype(np.float64)[..., None, :]]

    def schedule(self, config: Config, target: TargetInfo, func: Any = None, site: Any = None) -> Any:
        if func is not None:
            raise TvmExtError("the bias GEMM schedules its own compute only")
        if self.uses_tensor_cores(target):
            return self._tensor_core_schedule()
        sch = super().schedule(config, target)
        sch.reverse_compute_inline(sch.get_sblock("D"))
        return sch
