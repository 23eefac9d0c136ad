"""A dlight rule for copies: injective functions of one input, such as attention's head split
(reshape to heads, then swap the sequence and head axes), its merge, and the split of k
transposed for q·kᵀ.  dlight's fallback gives them a thread an element.  Where the output's
innermost axis reads the input's innermost axis contiguously (whole rows move), a thread copies
16 bytes (one vector load and store), 256 threads a block.  Where it does not but another axis
does (the innermost axis is transposed, kᵀ), a block stages a tile in shared memory: read in
16-byte vectors along the input's contiguous axis, written along the output's (dlight's own
transpose rule takes two-axis functions only).  Anything else keeps the fallback."""
from __future__ import annotations

from typing import Any

VECTOR_BYTES = 16
THREADS = 256
TILE_IN, TILE_OUT = 32, 64  # a transposed copy's tile: along the input's and the output's contiguous axes
THREADS_X, THREADS_Y = 32, 8


def _contiguous_inner(index: Any, var: Any, extent: int, vec: int) -> bool:
    """Whether ``index``, with ``var`` split into vectors of ``vec`` (var = vec·o + lane), is
    the lane plus a multiple of ``vec``: stride 1 within a vector, vectors aligned (a head merge's
    ``c mod 64`` is, once the split is known to stay within a head)."""
    import tvm
    import tvm_ffi
    from tvm import tirx
    from tvm.sym.analyzer import Analyzer
    from tvm.sym.pattern import detect_linear_equation

    dtype = var.ty.dtype
    outer, lane = tirx.Var("o", dtype), tirx.Var("lane", dtype)
    analyzer = Analyzer()
    analyzer.bind(outer, tvm.ir.Range(0, extent // vec))
    analyzer.bind(lane, tvm.ir.Range(0, vec))

    def split_var(node: Any, mutator: Any) -> Any:
        return outer * vec + lane if node.same_as(var) else mutator.default_mutate(node)

    split = analyzer.simplify(tvm_ffi.structural_mutate(index, [(type(var), split_var)]))
    coeffs = detect_linear_equation(split, [lane])
    if len(coeffs) != 2 or not isinstance(coeffs[0], tirx.IntImm) or int(coeffs[0]) != 1:
        return False
    return analyzer.can_prove_equal(tirx.floormod(coeffs[1], vec), 0)


def _copy(sch: Any, block_rv: Any) -> tuple[Any, int] | None:
    """(the block's BufferStore, the vector width in elements) where the block copies one
    input's elements unchanged, else None."""
    import tvm
    from tvm import tirx

    block = sch.get(block_rv)
    if len(block.reads) != 1 or len(block.writes) != 1 or not block.iter_vars:
        return None
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tvm.ir.expr.TensorLoad):
        return None
    if store.value.source.dtype != store.buffer.dtype:
        return None
    vec = VECTOR_BYTES * 8 // tvm.DataType(store.buffer.dtype).bits
    return (store, vec) if vec >= 2 else None


def _extent(iter_var: Any) -> int | None:
    from tvm import tirx

    extent = iter_var.dom.extent
    return int(extent) if isinstance(extent, tirx.IntImm) else None


def _matches(store: Any, vec: int, iter_vars: Any) -> int | None:
    """The vector width (elements) when the copy ``store`` moves whole rows, else None."""
    inner = iter_vars[-1]
    extent = _extent(inner)
    if extent is None or extent % vec:
        return None
    if not (_contiguous_inner(store.indices[-1], inner.var, extent, vec)
            and _contiguous_inner(store.value.indices[-1], inner.var, extent, vec)):
        return None
    return vec


def _transposed(store: Any, vec: int, iter_vars: Any) -> tuple[int, int] | None:
    """(the block axis the input's innermost index runs along, the vector width) for a copy that
    writes rows along its last axis and reads them along another (kᵀ), in whole tiles; else None."""
    out_extent = _extent(iter_vars[-1])
    if out_extent is None or out_extent % TILE_OUT or not _contiguous_inner(
            store.indices[-1], iter_vars[-1].var, out_extent, 2):  # stride 1 (a split of 1 proves nothing)
        return None
    for axis, iv in enumerate(iter_vars[:-1]):
        extent = _extent(iv)
        if extent is not None and extent % TILE_IN == 0 and _contiguous_inner(
                store.value.indices[-1], iv.var, extent, vec):
            return axis, vec
    return None


def _schedule_rows(sch: Any, block: Any, vec: int) -> None:
    loops = sch.get_loops(block)
    outer, lanes = sch.split(loops[-1], [None, vec])
    bx, tx = sch.split(sch.fuse(*loops[:-1], outer), [None, THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(lanes)


def _schedule_tile(sch: Any, block: Any, axis: int, vec: int) -> None:
    """A block a TILE_OUT x TILE_IN tile: its input read into shared memory in vectors along
    ``axis`` (rows padded by a vector), then written along the output's last axis."""
    loops = sch.get_loops(block)
    xo, xi = sch.split(loops[axis], [None, TILE_IN])
    yo, yi = sch.split(loops[-1], [None, TILE_OUT])
    sch.reorder(*[loop for k, loop in enumerate(loops[:-1]) if k != axis], xo, yo, xi, yi)
    bx = sch.fuse(*[loop for k, loop in enumerate(loops[:-1]) if k != axis], xo, yo)
    sch.bind(bx, "blockIdx.x")
    tile = sch.cache_read(block, 0, "shared")
    sch.compute_at(tile, bx)
    yi_o, yi_i = sch.split(yi, [None, THREADS_X])
    xi_o, xi_i = sch.split(xi, [None, THREADS_Y])
    sch.reorder(xi_o, yi_o, xi_i, yi_i)
    sch.bind(xi_i, "threadIdx.y")
    sch.bind(yi_i, "threadIdx.x")
    _, ty, tx, lanes = sch.split(sch.fuse(*sch.get_loops(tile)[1:]), [None, THREADS_Y, THREADS_X, vec])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(lanes)
    sch.storage_align(tile, 0, axis=-2, factor=32, offset=vec)


def vectorized_copy_rule() -> Any:
    """The rule, a ``dlight`` GPU schedule rule (made on first use: dlight imports TVM)."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import try_inline
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

    class VectorizedCopy(GPUScheduleRule):
        """Rows copied 16 bytes a thread, transposed copies through a shared tile (``copy_rule.py``)."""

        def apply(self, func: Any, target: Any, _: bool) -> Any:
            if not self.is_target_available(target):
                return None
            sch = s_tir.Schedule(func)
            infos = normalize_prim_func(sch)
            if infos is None:
                return None
            infos = try_inline(sch, infos)
            if len(infos) != 1 or any(kind != "S" for kind in infos[0].dom_kind()):
                return None
            block = infos[0].block_rv
            copy = _copy(sch, block)
            if copy is None:
                return None
            iter_vars = sch.get(block).iter_vars
            vec = _matches(*copy, iter_vars)
            if vec is not None:
                _schedule_rows(sch, block, vec)
                return sch
            transposed = _transposed(*copy, iter_vars)
            if transposed is None:
                return None
            _schedule_tile(sch, block, *transposed)
            return sch

    return VectorizedCopy()
