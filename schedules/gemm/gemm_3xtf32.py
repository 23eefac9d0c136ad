"""float32 GEMM C = A·B at float32 accuracy on Hopper's TF32 tensor cores (3xTF32).

Each operand is split into two TF32 numbers (float32 words whose low 13 mantissa bits are
zero): ``hi`` = the value rounded to TF32, ``lo`` = the rest rounded to TF32, so ``v = hi + lo``
to 22 of float32's 24 bits, at float32's exponent range (the float16 split of the GRU's
``in_split`` overflows above 65504 and loses the low parts of small numbers).  Then

    A·B ≈ A_lo·B_hi + A_hi·B_lo + A_hi·B_hi

(the dropped ``A_lo·B_lo`` is 2^-22 of a product) is one TF32 GEMM of depth 3K with a float32
accumulator: ``[A_lo | A_hi | A_hi]`` (M, 3K) times ``[B_hi | B_lo | B_hi]`` stored (N, 3K),
K-major as TF32 wgmma reads both operands, the small products first.  With ``tf_parts`` 2 the
parts are stored once each, ``[A_lo | A_hi]`` and ``[B_hi | B_lo]`` (4 x the operands' bytes
instead of 6), and each k tile's three products read them in turn (``TF32_K_PARTS``, the
TMA's coordinates; ``KernelLayout.k_coordinate``): A_hi's tile is loaded twice in a row, the
second time from L2.  Three kernels a call: the
split of A (row by row, 16 bytes a thread), the split of B (32 x 32 tiles transposed through
shared memory), and the wgmma GEMM of ``schedules.wgmma`` with TF32 operands (its knobs; C is
stored straight from the accumulators).  Three parts: the splits write them to two scratch
buffers (6 x the operands' bytes), a small share of the call at large sizes; two parts: to
buffers of the one function's own, and the program takes no scratch (``measured_operator``).

The idea is CUTLASS's 3xTF32; cuBLAS's float32 GEMM runs on the CUDA cores, at a third of what
the TF32 tensor cores do in three passes.  Values within half a TF32 step of float32's largest
are truncated rather than rounded to infinity in the split; NaN and infinity are kept.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tvm_ext.core.errors import TvmExtError, check_sizes
from tvm_ext.measure.program import CompiledProgram, compile_calls_program
from tvm_ext.core.space import Config, Knob, Space
from tvm_ext.target import TargetInfo
from tvm_ext.core.template import Template, TensorSpec

from .wgmma import (KNOBS as WGMMA_KNOBS, Prepare, WgmmaTile, b_layout_reason, b_shape, epilogue_reason,
                    k_parts_reason, pdl_reason, promote_reason, shared_limit, sm_90a, target_reason, wgmma_gemm,
                    wgmma_reason)
from .wgmma_template import pick_wgmma_tile

PARTS = 3  # A: lo, hi, hi; B: hi, lo, hi
# two stored parts each, read in turn: the k steps' (A part, B part), the small products first
A_TWO_PARTS, B_TWO_PARTS = ("lo", "hi"), ("hi", "lo")
TF32_K_PARTS = ((0, 0), (1, 1), (1, 0))
TF32_DROPPED_BITS = 13  # float32's mantissa bits a TF32 number has not
EXPONENT_BITS = 0x7F800000  # float32's exponent field: all ones is infinity or NaN
SPLIT_THREADS = 256
KNOBS = WGMMA_KNOBS + (
    Knob("tf_promote", (0, 1, 2, 4, 8, 16),
         "k steps (of 32) between promotions: the tensor cores' float32 sums added into a second set of registers "
         "with round-to-nearest adds (0: never; the error then grows with K, about 1e-5 at K = 4096)"),
    Knob("tf_promote_overlap", (0, 1),
         "1: windows of promotion alternate between two sets of accumulators, a window's adds running behind the "
         "next window's first wgmma (bn <= 128, wgmma_inflight 1; the same sums)", before=0),
    Knob("tf_parts", (3, 2),
         "TF32 parts stored per operand: 3 the three products' operands side by side; 2 each part once, "
         "each k tile's three products reading them in turn (TMA loads; two thirds of the split's writes)",
         before=3),
)
# default tiles (bm, bn, stages, inflight), largest first: two sets of accumulators must fit a
# thread's registers, so bn <= 192 when promoting.  64 columns only where no wider tile divides:
# an m64n64k8 TF32 wgmma is too small to keep the tensor cores fed (twice as many 64x64 tiles were
# slower than 64x128 ones at BERT's 1024x768 outputs; docs/results/gemm.md)
TF32_TILES = ((128, 192, 4, 1), (128, 128, 6, 1), (64, 128, 6, 1))
NARROW_TF32_TILES = ((128, 64, 6, 1), (64, 64, 8, 1))
DEFAULT_PROMOTE = 4


def round_tf32(value: Any) -> Any:
    """TIR: float32 ``value`` rounded to the nearest TF32 (ties away from zero), as float32; a
    finite value that would round past float32's largest (|v| > (2 - 2^-11)·2^127) is truncated
    instead (the split stays finite), infinity and NaN are kept (a NaN whose payload carried
    into the exponent would come out as zero)."""
    from tvm import tirx
    from tvm.script import tirx as T

    half = 1 << (TF32_DROPPED_BITS - 1)
    mask = T.uint32((0xFFFFFFFF >> TF32_DROPPED_BITS) << TF32_DROPPED_BITS)
    bits = T.reinterpret("uint32", value)
    rounded = (bits + T.uint32(half)) & mask
    exponent = T.uint32(EXPONENT_BITS)
    kept = (bits & exponent) == exponent  # infinity and NaN as they are (a NaN's payload must not carry)
    overflow = (rounded & exponent) == exponent
    return T.reinterpret("float32", tirx.Select(kept, bits, tirx.Select(overflow, bits & mask, rounded)))


def tf32_part(value: Any, which: str) -> Any:
    """TIR: the TF32 part ``which`` ("hi": the value rounded; "lo": the rest rounded) of ``value``."""
    return round_tf32(value) if which == "hi" else round_tf32(value - round_tf32(value))


A_ORDER, B_ORDER = ("lo", "hi", "hi"), ("hi", "lo", "hi")  # the parts along a row of A, of Bᵀ


def split_rows_macro(rows: int, k: int, order: tuple[str, ...]) -> Any:
    """TIR macro ``split(X, parts)``: X (rows, k) float32 -> parts (rows, len(order)·k), the
    parts ``order`` (two or three) along each row, four columns a thread (16-byte loads and
    stores): A's split, or that of a B stored transposed (N, K)."""
    from tvm.script import tirx as T

    quads = rows * k // 4
    blocks = -(-quads // SPLIT_THREADS)
    third = len(order) == 3

    @T.macro
    def split(X: Any, parts: Any) -> None:
        with T.launch_thread("blockIdx.x", blocks) as bid:
            with T.launch_thread("threadIdx.x", SPLIT_THREADS) as tx:
                if bid * SPLIT_THREADS + tx < quads:
                    row = T.meta_var((bid * SPLIT_THREADS + tx) // (k // 4))
                    col = T.meta_var((bid * SPLIT_THREADS + tx) % (k // 4) * 4)
                    for v in T.vectorized(4):
                        parts[row, col + v] = tf32_part(X[row, col + v], order[0])
                    for v in T.vectorized(4):
                        parts[row, k + col + v] = tf32_part(X[row, col + v], order[1])
                    if third:
                        for v in T.vectorized(4):
                            parts[row, 2 * k + col + v] = tf32_part(X[row, col + v], order[2])

    return split


def split_columns_macro(k: int, n: int, order: tuple[str, ...] = B_ORDER) -> Any:
    """TIR macro ``split(B, parts)``: B (k, n) float32 -> parts (n, len(order)·k), ``order``
    (``[B_hi | B_lo | B_hi]``, or two parts) along each row of Bᵀ: 32 x 32 tiles transposed
    through shared memory (rows padded: conflict-free columns), so reads and writes are both
    coalesced."""
    from tvm.script import tirx as T

    tiles_n = n // 32
    third = len(order) == 3

    @T.macro
    def split(B: Any, parts: Any) -> None:
        with T.launch_thread("blockIdx.x", tiles_n * (k // 32)) as bid:
            with T.launch_thread("threadIdx.x", 32) as tx:
                with T.launch_thread("threadIdx.y", 8) as ty:
                    tile = T.alloc_buffer((32 * 33,), "float32", scope="shared")
                    for i in T.unroll(4):
                        tile[(ty + 8 * i) * 33 + tx] = B[bid // tiles_n * 32 + ty + 8 * i, bid % tiles_n * 32 + tx]
                    T.tvm_storage_sync("shared")
                    for i in T.unroll(4):
                        col = T.meta_var(bid % tiles_n * 32 + ty + 8 * i)
                        depth = T.meta_var(bid // tiles_n * 32 + tx)
                        parts[col, depth] = tf32_part(tile[tx * 33 + ty + 8 * i], order[0])
                        parts[col, k + depth] = tf32_part(tile[tx * 33 + ty + 8 * i], order[1])
                        if third:
                            parts[col, 2 * k + depth] = tf32_part(tile[tx * 33 + ty + 8 * i], order[2])

    return split


def split_b_macro(k: int, n: int, b_layout: str, order: tuple[str, ...] = B_ORDER) -> Any:
    """TIR macro ``split(B, parts)`` for B stored as ``b_layout`` says: (K, N) through transposed
    tiles (``split_columns_macro``), (N, K) row by row as A is (``split_rows_macro``)."""
    return split_columns_macro(k, n, order) if b_layout == "KN" else split_rows_macro(n, k, order)


def split_a_func(m: int, k: int, order: tuple[str, ...] = A_ORDER) -> Any:
    """TIR: A (m, k) float32 -> parts (m, 3k) ``[A_lo | A_hi | A_hi]``, or those of ``order``
    (``split_rows_macro``)."""
    from tvm.script import tirx as T

    split = split_rows_macro(m, k, order)
    depth = len(order) * k

    @T.prim_func
    def split_a(A: T.Buffer((m, k), "float32"), parts: T.Buffer((m, depth), "float32")):
        T.func_attr({"tirx.noalias": True})
        split(A, parts)

    return split_a


def split_b_func(k: int, n: int, b_layout: str = "KN", order: tuple[str, ...] = B_ORDER) -> Any:
    """TIR: B (k, n) float32, or Bᵀ (n, k) with ``b_layout`` "NK", -> parts (n, 3k)
    ``[B_hi | B_lo | B_hi]``, or those of ``order``, along each row of Bᵀ."""
    from tvm.script import tirx as T

    split = split_b_macro(k, n, b_layout, order)
    b_in_shape = b_shape(n, k, b_layout)
    depth = len(order) * k

    @T.prim_func
    def split_b(B: T.Buffer(b_in_shape, "float32"), parts: T.Buffer((n, depth), "float32")):
        T.func_attr({"tirx.noalias": True})
        split(B, parts)

    return split_b


def tf32_parts(value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy: (hi, lo) TF32 parts of float32 ``value`` as float32 (what the split kernels store)."""
    def rounded(x: np.ndarray) -> np.ndarray:
        bits = np.asarray(x, np.float32).view(np.uint32)
        half, mask = np.uint32(1 << (TF32_DROPPED_BITS - 1)), np.uint32((0xFFFFFFFF >> 13) << 13)
        up, exponent = (bits + half) & mask, np.uint32(EXPONENT_BITS)
        kept, overflow = (bits & exponent) == exponent, (up & exponent) == exponent
        return np.where(kept, bits, np.where(overflow, bits & mask, up)).view(np.float32)

    hi = rounded(value)
    with np.errstate(invalid="ignore"):  # an infinity's low part is inf - inf (NaN), not a warning
        return hi, rounded(np.asarray(value, np.float32) - hi)


def split_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy float64 of the three products the GEMM sums for ``a @ b`` (for tests)."""
    a_hi, a_lo = (p.astype(np.float64) for p in tf32_parts(a))
    b_hi, b_lo = (p.astype(np.float64) for p in tf32_parts(b))
    return a_lo @ b_hi + a_hi @ b_lo + a_hi @ b_hi


def pick_tf32_tile(shapes: Any, target: TargetInfo, split_k: bool = False) -> WgmmaTile | None:
    """A TF32 tile dividing every (M, N, 3K) of ``shapes``: ``pick_wgmma_tile`` among ``TF32_TILES``
    (the first giving 90 % of the SMs a C tile, else the one giving most), else among
    ``NARROW_TF32_TILES``; None off Hopper or where none divides."""
    def pick(candidates: tuple[tuple[int, int, int, int], ...]) -> WgmmaTile | None:
        tiles = [WgmmaTile(bm, bn, stages, inflight, False, 0, operand="tf32")
                 for bm, bn, stages, inflight in candidates]
        return pick_wgmma_tile(shapes, target, "float32", candidates=tiles, split_k=split_k)

    return pick(TF32_TILES) or pick(NARROW_TF32_TILES)


def promote_steps(tile: WgmmaTile, depth: int) -> int:
    """``DEFAULT_PROMOTE`` k steps between promotions, or the largest of 2 and 1 dividing the k
    steps each slice of ``tile`` runs at ``depth`` (3K)."""
    return next(p for p in (DEFAULT_PROMOTE, 2, 1) if depth // tile.bk // tile.split % p == 0)


@dataclass(frozen=True)
class Gemm3xTf32Template(Template):
    """C[M, N] = A[M, K] · B[K, N] (or A · Bt[N, K]ᵀ, ``b_layout`` "NK"), float32 in and out, as
    three TF32 products on Hopper's warpgroup MMA; the knobs are the wgmma GEMM's
    (``schedules.wgmma.KNOBS``) at depth 3K."""

    m: int
    n: int
    k: int
    b_layout: str = "KN"  # "NK": B stored transposed (N, K), a Linear weight, split row by row
    # the parts in the program's own buffers (two stored parts, ``kernel_func``): no scratch; set
    # by ``measured_operator`` for such a config, never part of the workload
    own_parts: bool = False

    name = "gemm_3xtf32"
    default_is_pick = True  # default_config picks a tile without measuring
    tolerance = 1e-5  # float32-accurate: about 1e-6 at K = 4096, as cuBLAS's float32 GEMM

    def __post_init__(self) -> None:
        check_sizes("GEMM", M=self.m, N=self.n, K=self.k)
        reason = b_layout_reason(self.b_layout)
        if reason:
            raise TvmExtError(reason)

    @classmethod
    def from_shape(cls, shape: tuple[int, ...], b_layout: str = "KN") -> "Gemm3xTf32Template":
        if len(shape) != 3:
            raise TvmExtError(f"GEMM shape is M,N,K (3 numbers), got {len(shape)}")
        return cls(*shape, b_layout=b_layout)

    @property
    def params(self) -> dict[str, Any]:
        layout = {"b_layout": self.b_layout} if self.b_layout != "KN" else {}
        return {"m": self.m, "n": self.n, "k": self.k, "a_dtype": "float32", "b_dtype": "float32",
                "acc_dtype": "float32", "c_dtype": "float32", **layout}

    @property
    def depth(self) -> int:
        """K of the TF32 GEMM: the three parts' depths."""
        return PARTS * self.k

    def tile_reason(self, config: Config, target: TargetInfo) -> str | None:
        """Why ``config`` cannot run this GEMM on ``target`` (one line), or None."""
        # (the split of B transposes 32 x 32 tiles: the tile's N % 64 and 3K % 32 give N, K % 32)
        tile = WgmmaTile.of(config, "tf32")
        return (pdl_reason(tile, unwaited=True) or target_reason(target)
                or wgmma_reason(tile, self.m, self.n, self.depth, shared_limit(target))
                or epilogue_reason(tile, "float32")  # C float32: never staged
                or promote_reason(tile, self.depth, config.tf_promote, bool(config.tf_promote_overlap))
                or k_parts_reason(tile, self.depth, "NK", self.k_parts(config)))

    @staticmethod
    def k_parts(config: Config) -> tuple[tuple[int, int], ...]:
        """``wgmma_gemm``'s ``k_parts`` for ``config``: none where the three products' operands are
        stored side by side."""
        return TF32_K_PARTS if config.tf_parts == 2 else ()

    @staticmethod
    def orders(config: Config) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The parts A's and Bᵀ's rows hold, in order."""
        return (A_TWO_PARTS, B_TWO_PARTS) if config.tf_parts == 2 else (A_ORDER, B_ORDER)

    def space(self, target: TargetInfo) -> Space:
        return Space(KNOBS, (lambda c: self.tile_reason(c, target),))

    def default_config(self, target: TargetInfo) -> Config:
        """``pick_tf32_tile`` for this shape, promoting every ``promote_steps``, loaded by the TMA
        from two stored parts where the tile can (7-15 % faster than three parts through
        ``cp.async`` at 4096³ and BERT-base's shapes, docs/results/gemm.md), else three; an error
        saying why where the target has no wgmma or no tile divides the shape."""
        reason = target_reason(target)
        if reason:
            raise TvmExtError(reason)
        tile = pick_tf32_tile([(self.m, self.n, self.depth)], target, split_k=True)
        if tile is not None:
            space = self.space(target)
            knobs = {**tile.knobs(), "tf_promote": promote_steps(tile, self.depth), "tf_promote_overlap": 0}
            two = space.make(**{**knobs, "wgmma_tma": 1}, tf_parts=2)
            return two if space.is_feasible(two) else space.make(**knobs, tf_parts=3)
        raise TvmExtError(f"no TF32 wgmma tile fits {self.m}x{self.n}x{self.k}: M and N must be multiples of 64 "
                          f"and K of 32 (no guards)")

    def schedule(self, config: Config, target: TargetInfo) -> Any:
        raise TvmExtError("the 3xTF32 GEMM is three written kernels, not a schedule: use build_program")

    def build_program(self, config: Config, target: TargetInfo) -> CompiledProgram:
        """The two splits and the TF32 GEMM in one module for sm_90a, called in that order."""
        reason = self.space(target).infeasible_reason(config)
        if reason:
            raise TvmExtError(reason)
        params: tuple[str, ...] = ("A", "B", "C", "a_parts", "b_parts")
        if self.k_parts(config):  # the parts' buffers the function's own: no scratch (``measured_operator``)
            funcs, calls, params = {"main": self.kernel_func(config)}, [("main", ("A", "B", "C"))], ("A", "B", "C")
        else:
            funcs = {"split_a": split_a_func(self.m, self.k), "split_b": split_b_func(self.k, self.n, self.b_layout),
                     "gemm": self.tf32_gemm(config)}
            calls = [("split_a", ("A", "a_parts")), ("split_b", ("B", "b_parts")),
                     ("gemm", ("a_parts", "b_parts", "C"))]
        return compile_calls_program(funcs, calls, sm_90a(target), params,
                                     {"lowered": "gemm_3xtf32", "config": dict(config.items)})

    def measured_operator(self, config: Config) -> "Gemm3xTf32Template":
        """This GEMM with the buffers ``config``'s program takes: no scratch where the parts are the
        program's own (two stored parts), the three-part scratch otherwise."""
        return replace(self, own_parts=bool(self.k_parts(config)))

    def kernel_func(self, config: Config, c_dtype: str = "float32", epilogue: Any = None) -> Any:
        """One PrimFunc ``main(A, B, C)``: the two splits into buffers of its own, then the TF32
        GEMM, ``epilogue`` (``wgmma_gemm``'s) in its store; three kernels in one function, what a
        Relax model's float32 matmul is replaced by (``tvm_ext.relax.relax_wgmma``)."""
        from tvm.script import tirx as T

        a_order, b_order = self.orders(config)
        split_a = split_rows_macro(self.m, self.k, a_order)
        split_b = split_b_macro(self.k, self.n, self.b_layout, b_order)

        @T.macro
        def fill(A_in: Any, B_in: Any, a_parts: Any, b_parts: Any) -> None:
            split_a(A_in, a_parts)
            split_b(B_in, b_parts)

        inputs = Prepare((self.m, self.k), b_shape(self.n, self.k, self.b_layout), "float32", fill)
        return self.tf32_gemm(config, c_dtype, epilogue=epilogue, prepare=inputs)

    def tf32_gemm(self, config: Config, c_dtype: str = "float32", **options: Any) -> Any:
        """The TF32 wgmma GEMM of ``config`` at depth 3K (``wgmma_gemm``'s other ``options``)."""
        return wgmma_gemm(WgmmaTile.of(config, "tf32"), self.m, self.n, self.depth, c_dtype=c_dtype,
                          promote=config.tf_promote, overlap=bool(config.tf_promote_overlap),
                          k_parts=self.k_parts(config), **options)

    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec((self.m, self.k), "float32"), TensorSpec(b_shape(self.n, self.k, self.b_layout), "float32")]

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec((self.m, self.n), "float32")]

    def scratch(self) -> list[TensorSpec]:
        """The three parts of A and of Bᵀ, three-part programs' (none where ``own_parts``)."""
        if self.own_parts:
            return []
        return [TensorSpec((self.m, self.depth), "float32"), TensorSpec((self.n, self.depth), "float32")]

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a, b = (x.astype(np.float64) for x in inputs)
        return [a @ (b if self.b_layout == "KN" else b.T)]

    def flops(self) -> float:
        """The float32 GEMM's operations (what cuBLAS's figure counts), not the three passes'."""
        return 2.0 * self.m * self.n * self.k
