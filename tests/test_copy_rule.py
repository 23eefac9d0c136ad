"""The copy dlight rule (``tvm_ext/relax/copy_rule.py``): attention's head split and merge
scheduled 16 bytes a thread, the split of k transposed through a shared tile, run on PoCL
against numpy; functions that are not copies, or not in whole vectors or tiles, left to the
fallback; the pipeline applies it."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_ext.relax.copy_rule import vectorized_copy_rule
from tvm_ext.relax.pipeline import load_model

B, S, HEADS, D = 2, 6, 3, 8


def _funcs(dtype: str = "float32") -> dict:
    from tvm import te, topi

    x = te.placeholder((B, S, HEADS * D), dtype, name="x")
    y = te.placeholder((B, HEADS, S, D), dtype, name="y")
    z = te.placeholder((B, S, HEADS * D), dtype, name="z")
    return {
        "split": (te.create_prim_func([x, topi.transpose(topi.reshape(x, (B, S, HEADS, D)), (0, 2, 1, 3))]),
                  lambda a: a.reshape(B, S, HEADS, D).transpose(0, 2, 1, 3)),
        "merge": (te.create_prim_func([y, topi.reshape(topi.transpose(y, (0, 2, 1, 3)), (B, S, HEADS * D))]),
                  lambda a: a.transpose(0, 2, 1, 3).reshape(B, S, HEADS * D)),
        "split_t": (te.create_prim_func([x, topi.transpose(topi.reshape(x, (B, S, HEADS, D)), (0, 2, 3, 1))]), None),
        "add": (te.create_prim_func([x, z, topi.add(x, z)]), None),
        "short_rows": (te.create_prim_func([x, topi.transpose(topi.reshape(x, (B, S, HEADS * D // 2, 2)),
                                                              (0, 2, 1, 3))]), None),
    }


def _schedule(func, target):
    import tvm
    from tvm.s_tir import dlight as dl

    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    with tvm.target.Target(target.tvm_target()):
        return dl.ApplyDefaultSchedule(vectorized_copy_rule())(mod)


def _scheduled(mod) -> bool:
    return bool(mod["main"].attrs.get("tirx.is_scheduled", False))


@pytest.mark.parametrize("name", ["split", "merge"])
def test_head_split_and_merge_copy_16_bytes_a_thread_on_pocl(opencl, name):
    """A model that only splits (or merges) heads, through ``load_model`` on PoCL: the copy
    is the rule's, one 16-byte load and store a thread (four float32), equal to numpy."""
    from tvm.relax.frontend import nn

    class Heads(nn.Module):
        def forward(self, x):
            if name == "split":
                return nn.op.permute_dims(nn.op.reshape(x, (B, S, HEADS, D)), [0, 2, 1, 3])
            return nn.op.reshape(nn.op.permute_dims(x, [0, 2, 1, 3]), (B, S, HEADS * D))

    shape = (B, S, HEADS * D) if name == "split" else (B, HEADS, S, D)
    mod, _ = Heads().export_tvm(spec={"forward": {"x": nn.spec.Tensor(shape, "float32")}})
    model = load_model(mod, opencl, None, log=None)
    (source,) = model._exec.sources().values()
    assert "vstore4(vload4(" in source
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(model(x), _funcs()[name][1](x))


def test_k_transposed_goes_through_a_shared_tile_on_pocl(opencl):
    """kᵀ (heads split, the innermost axis moved outward) at 64 positions x heads of 32: a tile
    staged in local memory, read four float32 a vector, equal to numpy."""
    from tvm.relax.frontend import nn

    b, s, heads, d = 1, 64, 2, 32

    class KT(nn.Module):
        def forward(self, x):
            return nn.op.permute_dims(nn.op.reshape(x, (b, s, heads, d)), [0, 2, 3, 1])

    mod, _ = KT().export_tvm(spec={"forward": {"x": nn.spec.Tensor((b, s, heads * d), "float32")}})
    model = load_model(mod, opencl, None, log=None)
    (source,) = model._exec.sources().values()
    assert "__local" in source and "vload4(" in source and "barrier(" in source
    x = np.random.default_rng(0).standard_normal((b, s, heads * d)).astype(np.float32)
    np.testing.assert_array_equal(model(x), x.reshape(b, s, heads, d).transpose(0, 2, 3, 1))


@pytest.mark.parametrize("name", ["split_t", "add", "short_rows"])
def test_other_functions_are_left_to_the_fallback(opencl, name):
    """kᵀ where the tile does not divide the axes (6 positions, heads of 8), an elementwise add
    of two inputs, and rows of two float32 (shorter than a 16-byte vector) do not match."""
    assert not _scheduled(_schedule(_funcs()[name][0], opencl))


def test_the_pipeline_applies_the_rule_before_the_fallback():
    from tvm.s_tir import dlight as dl

    from tvm_ext.relax.pipeline import default_rules

    names = [type(r).__name__ for r in default_rules()]
    assert names.index("VectorizedCopy") == names.index("Fallback") - 1
    assert isinstance(default_rules()[-2], dl.gpu.Fallback) and names[-1] == "OuterLoopsOnThreads"
