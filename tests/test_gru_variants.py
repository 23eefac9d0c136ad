"""The step kernel a GRU config selects (``StepVariant``), chosen in one place: each family for
its knobs, the knobs it decodes, its reason as the space reports it, and its calls as the plan
makes them.  No kernel is compiled here."""
from __future__ import annotations

import dataclasses

import pytest

from tvm_ext.schedules.gru import GruTemplate
from tvm_ext.schedules.gru.cell_step import CellStep
from tvm_ext.schedules.gru.flag_step import FlagStep
from tvm_ext.schedules.gru.fused_step import FusedStep, PersistentStep
from tvm_ext.schedules.gru.tensor_core_step import TensorCoreStep
from tvm_ext.target import offline_cuda

HALF = {name: "float16" for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}
FAMILIES = [
    ({}, CellStep),
    (dict(fuse_step=1), FusedStep),
    (dict(fuse_step=1, step_loop=1), FusedStep),
    (dict(fuse_step=1, step_loop=2), PersistentStep),
    (dict(fuse_step=1, step_loop=2, step_flags=1), FlagStep),
    (dict(fuse_step=1, step_loop=2, step_tc=1, step_j=16), TensorCoreStep),
    (dict(fuse_step=1, step_loop=2, step_tc=1, step_flags=1, step_j=16), TensorCoreStep),
    (dict(step_tc=1, step_flags=1, step_loop=2), CellStep),  # unfused: the step knobs do not apply
]


def _template() -> tuple[GruTemplate, object]:
    target = offline_cuda()
    return GruTemplate(batch=4, hidden=128, input=32, seq=3).with_precision(HALF).with_tensor_cores(target), target


@pytest.mark.parametrize("knobs, family", FAMILIES, ids=lambda v: v.__name__ if isinstance(v, type) else None)
def test_each_config_selects_its_family_once_decoded(knobs, family):
    """The family follows fuse_step, step_tc, step_flags and step_loop; the variant is frozen and
    its reason is the space's; its calls are the plan's step calls, after the input GEMM."""
    t, target = _template()
    cfg = t.default_config(target).replace(**knobs)
    step = t.step_variant(cfg)
    assert type(step) is family and step == t.step_variant(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.sizes = None
    assert step.reason(target) == t.space(target).infeasible_reason(cfg)
    if step.reason(target) is None:
        plan = [(c.func, c.args) for c in t.plan(cfg)]
        assert plan[0] == ("gru_init", step.state_args(0))
        assert plan[2:] == step.step_calls(0, "out")


def test_variants_decode_their_own_knobs():
    """Each variant reads its knobs into fields of its own; a knob another family owns changes
    neither its fields nor what summaries show for it."""
    t, target = _template()
    base = t.default_config(target).replace(fuse_step=1, step_loop=2)
    fused = t.step_variant(base.replace(step_j=32, step_ks=4, step_k=64, step_w_onchip=2))
    assert (fused.j, fused.ks, fused.k, fused.w_onchip, fused.units, fused.threads) == (32, 4, 64, 2, 32, 128)
    assert t.step_variant(base.replace(step_tc_rows=32)) == t.step_variant(base)  # a tensor-core knob
    flags = base.replace(step_flags=1, step_flag_units=16)
    assert t.step_variant(flags).units == 16 and t.step_variant(flags).shape.blocks == 128 // 16
    assert "step_ks" not in t.shown_knobs(flags) and "step_flag_units" in t.shown_knobs(flags)
    tc = base.replace(step_tc=1, step_j=32, step_tc_rows=16, step_tc_nw=4)
    assert (t.step_variant(tc).units, t.step_variant(tc).n_warps) == (32, 4)
    assert "step_tc_nw" in t.shown_knobs(tc) and "step_w_onchip" not in t.shown_knobs(tc)
    assert t.step_variant(tc.replace(step_flags=1)).barrier_words() == ("bar", "hx")
    assert "step_barrier" not in t.shown_knobs(tc.replace(step_flags=1)) and "step_barrier" in t.shown_knobs(tc)


def test_reasons_come_from_the_selected_family():
    """Each family's refusal names that family's kernel."""
    t, target = _template()
    base = t.default_config(target).replace(fuse_step=1)
    assert "step_ks must divide step_k" in t.space(target).infeasible_reason(base.replace(step_k=8, step_ks=16))
    assert "tensor-core step kernel (step_tc 1) is CUDA's persistent kernel only" in t.space(
        target).infeasible_reason(base.replace(step_tc=1, step_j=16))
    assert "flag-exchange step kernel (step_flags 1) is CUDA's persistent kernel only" in t.space(
        target).infeasible_reason(base.replace(step_flags=1))
    small = dataclasses.replace(target, compute_units=1)
    wide = base.replace(step_loop=2, step_j=2)  # 64 unit tiles x 4 row tiles: 256 blocks
    assert t.step_variant(wide).blocks == 256
    assert "needs every block resident, 256 blocks > 1 SMs" in t.space(small).infeasible_reason(wide)
    assert t.space(target).infeasible_reason(wide) is None  # 132 SMs hold them
    assert t.space(target).infeasible_reason(base.replace(step_tc=1, step_flags=1)) is not None
