"""A dlight rule for the copies that move whole rows: injective functions of one input whose
innermost output axis reads the input's innermost axis contiguously, such as attention's head
split (reshape to heads, then swap the sequence and head axes) and merge.  dlight's fallback
gives them a thread an element; this rule gives a thread 16 bytes (one vector load and store),
256 threads a block.  A copy that transposes the innermost axis (kᵀ) does not match and keeps
the fallback."""
from __future__ import annotations

from typing import Any

VECTOR_BYTES = 16
THREADS = 256


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


def _matches(sch: Any, block_rv: Any) -> int | None:
    """The vector width (elements) when the block copies whole rows, else None."""
    import tvm
    from tvm import tirx

    block = sch.get(block_rv)
    if len(block.reads) != 1 or len(block.writes) != 1 or not block.iter_vars:
        return None
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tvm.ir.expr.TensorLoad):
        return None
    dtype = store.buffer.dtype
    if store.value.source.dtype != dtype:
        return None
    vec = VECTOR_BYTES * 8 // tvm.DataType(dtype).bits
    inner = block.iter_vars[-1]
    extent = inner.dom.extent
    if not isinstance(extent, tirx.IntImm) or int(extent) % vec or vec < 2:
        return None
    if not (_contiguous_inner(store.indices[-1], inner.var, int(extent), vec)
            and _contiguous_inner(store.value.indices[-1], inner.var, int(extent), vec)):
        return None
    return vec


def vectorized_copy_rule() -> Any:
    """The rule, a ``dlight`` GPU schedule rule (made on first use: dlight imports TVM)."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import try_inline
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

    class VectorizedCopy(GPUScheduleRule):
        """Rows copied 16 bytes a thread (``copy_rule.py``)."""

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
            vec = _matches(sch, block)
            if vec is None:
                return None
            loops = sch.get_loops(block)
            outer, lanes = sch.split(loops[-1], [None, vec])
            bx, tx = sch.split(sch.fuse(*loops[:-1], outer), [None, THREADS])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            sch.vectorize(lanes)
            return sch

    return VectorizedCopy()
