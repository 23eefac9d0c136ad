"""Variable-length batches (``GRU.build(variable_lengths=True)``, ``lengths=``): each row stops at
its own length as a ``PackedSequence`` does, against the float64 reference on PoCL at odd sizes
(unfused and fused step kernels, several layers, both directions, float16), the reference
itself against a per-row run, the refusals, and ``-m gpu`` on every step-kernel family."""
from __future__ import annotations

import numpy as np
import pytest
from test_gru import Shape, _inputs, _weights

from tvm_ext.core.errors import TvmExtError
from tvm_ext.precision.precision import relative_error
from tvm_ext.schedules.gru import GRU, GruTemplate, gru_reference
from tvm_ext.schedules.gru.lengths import checked_lengths

HALF = {name: "float16" for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}


def _lengths(batch: int, seq: int, seed: int = 3) -> np.ndarray:
    lengths = np.random.default_rng(seed).integers(1, seq + 1, batch)
    lengths[0], lengths[-1] = seq, 1  # the longest and the shortest a row can be
    return lengths.astype(np.int32)


def test_reference_runs_each_row_alone():
    """Row b of the batched reference with lengths equals the reference run on row b's first
    lengths[b] steps alone (zeros after them), both directions, two layers."""
    shape = Shape(seq=6, batch=3, input=5, hidden=4, layers=2, bidirectional=True)
    w, (x, h0) = _weights(shape), _inputs(shape)
    lengths = np.array([6, 2, 4])
    out, h_n = gru_reference(x, w, h0, 2, True, lengths=lengths)
    for b, n in enumerate(lengths):
        row_out, row_h = gru_reference(x[:n, b:b + 1], w, h0[:, b:b + 1], 2, True)
        np.testing.assert_allclose(out[:n, b], row_out[:, 0], rtol=1e-12, atol=1e-12)
        assert not out[n:, b].any()
        np.testing.assert_allclose(h_n[:, b], row_h[:, 0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fuse", [0, 1], ids=["unfused", "fused"])
@pytest.mark.parametrize("shape", [Shape(seq=9, batch=5, input=17, hidden=33, layers=2, bidirectional=True),
                                   Shape(seq=7, batch=3, input=16, hidden=24),
                                   Shape(seq=5, batch=4, input=6, hidden=10, bidirectional=True, batch_first=True)],
                         ids=["2-layers-bi", "uni", "bi-batch-first"])
def test_lengths_match_float64_on_pocl(opencl, shape, fuse):
    gru = GRU.build(opencl, shape.input, shape.hidden, num_layers=shape.layers, bidirectional=shape.bidirectional,
                    batch_first=shape.batch_first, batch=shape.batch, seq=shape.seq, config={"fuse_step": fuse},
                    variable_lengths=True).load_numpy(_weights(shape))
    x, h0 = _inputs(shape)
    lengths = _lengths(shape.batch, shape.seq)
    out, h_n = gru(x, h0, lengths=lengths)
    ref_out, ref_h = gru_reference(x, _weights(shape), h0, shape.layers, shape.bidirectional, shape.batch_first,
                                   lengths=lengths)
    assert relative_error(out, ref_out) < 1e-5 and relative_error(h_n, ref_h) < 1e-5
    time_axis = 1 if shape.batch_first else 0
    for b, n in enumerate(lengths):  # exactly zero past each row's length
        past = out[b, n:] if shape.batch_first else out[n:, b]
        assert not past.any(), (b, n)
    # no lengths: every row runs to T, as the fixed-length GRU does
    full_out, _ = gru(x, h0)
    ref_full, _ = gru_reference(x, _weights(shape), h0, shape.layers, shape.bidirectional, shape.batch_first)
    assert relative_error(full_out, ref_full) < 1e-5
    assert full_out.shape[time_axis] == shape.seq


def _padding_is_never_read(target, precision, hidden=12):
    """NaN in x past each row's length (padding, whatever its values) leaves the result as with
    zeros there: the hold overwrites every gate's input sum at those steps, so no input there
    reaches the state."""
    shape = Shape(seq=7, batch=4, input=9, hidden=hidden, layers=2, bidirectional=True)
    dtypes = {name: precision for name in HALF} if precision else None
    gru = GRU.build(target, 9, hidden, num_layers=2, bidirectional=True, batch=4, seq=7, precision=dtypes,
                    variable_lengths=True).load_numpy(_weights(shape))
    x, h0 = _inputs(shape)
    lengths = np.array([7, 2, 5, 1], np.int32)
    padded = x.copy()
    for b, n in enumerate(lengths):
        x[n:, b] = 0.0
        padded[n:, b] = np.nan
    out, h_n = gru(padded, h0, lengths=lengths)
    ref_out, ref_h = gru_reference(x, _weights(shape), h0, 2, True, lengths=lengths)
    bound = 2e-2 if precision else 1e-5
    assert relative_error(out, ref_out) < bound and relative_error(h_n, ref_h) < bound


@pytest.mark.parametrize("precision", [None, "bfloat16"], ids=["float32", "bfloat16"])
def test_padding_past_the_lengths_is_never_read(opencl, precision):
    _padding_is_never_read(opencl, precision)


@pytest.mark.gpu
@pytest.mark.parametrize("precision,hidden", [(None, 12), ("float16", 24), ("float16", 20), ("bfloat16", 36)])
def test_padding_past_the_lengths_is_never_read_on_cuda(precision, hidden):
    """The same on CUDA, where the hold writes 16, 8 or 4 bytes a thread (hidden sizes that take
    them or not)."""
    from tvm_ext.target import resolve_target

    _padding_is_never_read(resolve_target("cuda", 0), precision, hidden)


def test_bfloat16_lengths_on_pocl(opencl):
    """16-bit gi holds the hold value exactly (PoCL has no float16: bfloat16 is stored as ushort)."""
    shape = Shape(seq=8, batch=3, input=12, hidden=20, bidirectional=True)
    bf16 = {name: "bfloat16" for name in HALF}
    gru = GRU.build(opencl, 12, 20, bidirectional=True, batch=3, seq=8, precision=bf16,
                    variable_lengths=True).load_numpy(_weights(shape))
    x, h0 = _inputs(shape)
    lengths = np.array([8, 3, 5])
    out, h_n = gru(x, h0, lengths=lengths)
    ref_out, ref_h = gru_reference(x, _weights(shape), h0, 1, True, lengths=lengths)
    assert relative_error(out, ref_out) < 2e-2 and relative_error(h_n, ref_h) < 2e-2
    assert not out[3:, 1].any() and not out[5:, 2].any()


def test_plan_holds_each_layer_and_zeroes_the_output_once():
    """gru_hold after every layer's input GEMM and before its steps; gru_zero_out last; a
    fixed-length template's plan and key are unchanged (no lengths buffer, no new key)."""
    from tvm_ext.schedules.gru.plan import plan_calls
    from tvm_ext.target import offline_cuda

    fixed = GruTemplate(batch=2, hidden=8, input=8, seq=3, layers=3)
    varying = GruTemplate(batch=2, hidden=8, input=8, seq=3, layers=3, variable_lengths=True)
    cfg = fixed.default_config(offline_cuda("sm_90"))
    calls = [c.func for c in plan_calls(varying, cfg)]
    assert calls.count("gru_hold") == 3 and calls[-1] == "gru_zero_out" and calls.count("gru_zero_out") == 1
    for i, name in enumerate(calls):
        if name == "gru_hold":
            assert calls[i - 1].startswith("gru_gemm_x") and calls[i + 1].startswith(("gru_step", "gru_gemm_h"))
    assert "gru_hold" not in [c.func for c in plan_calls(fixed, cfg)]
    assert "lengths" not in fixed.input_specs() and "variable_lengths" not in fixed.params
    assert varying.input_specs()["lengths"].dtype == "int32" and varying.params["variable_lengths"] is True


@pytest.mark.parametrize("lengths,enforce,needle", [
    ([3, 0, 2], False, "lengths[1] = 0 is outside 1..4"),
    ([5, 1, 2], False, "lengths[0] = 5 is outside 1..4"),
    ([4, 2], False, "shape (2,), expected (3,)"),
    ([2, 3, 1], True, "not sorted in decreasing order (lengths[1] = 3 > lengths[0] = 2)"),
    ([2.5, 1, 1], False, "must be integers"),
])
def test_bad_lengths_are_refused_with_the_value(lengths, enforce, needle):
    with pytest.raises(TvmExtError) as err:
        checked_lengths(np.array(lengths), 3, 4, enforce_sorted=enforce)
    assert needle in str(err.value)
    checked_lengths(np.array([2, 3, 1]), 3, 4)  # any order without enforce_sorted


def test_lengths_without_variable_lengths_are_refused(opencl):
    shape = Shape(seq=3, batch=2, input=4, hidden=4)
    gru = GRU.build(opencl, 4, 4, batch=2, seq=3).load_numpy(_weights(shape))
    with pytest.raises(TvmExtError, match="variable_lengths=True"):
        gru(_inputs(shape)[0], lengths=[3, 2])


# ---- GPU: every step-kernel family with lengths ---------------------------------------------
GPU_FAMILIES = {
    "unfused": dict(fuse_step=0),
    "host-loop": dict(fuse_step=1, step_loop=1),
    "persistent": dict(fuse_step=1, step_loop=2),
    "flags": dict(fuse_step=1, step_loop=2, step_flags=1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("family", list(GPU_FAMILIES) + ["pick", "tensor-core-fp16"])
def test_lengths_every_family_on_cuda(family):
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda", 0)
    shape = Shape(seq=19, batch=6, input=40, hidden=72, layers=2, bidirectional=True)
    precision = HALF if family == "tensor-core-fp16" else None
    config = {"fuse_step": 1, "step_loop": 2, "step_tc": 1, "step_j": 16} if family == "tensor-core-fp16" else \
        GPU_FAMILIES.get(family)
    gru = GRU.build(target, shape.input, shape.hidden, num_layers=2, bidirectional=True, batch=shape.batch,
                    seq=shape.seq, config=config, precision=precision, variable_lengths=True)
    gru.load_numpy(_weights(shape))
    x, h0 = _inputs(shape)
    bound = 1e-2 if precision else 1e-5
    for seed in (3, 4):  # reruns with other lengths: nothing left over from the previous call
        lengths = _lengths(shape.batch, shape.seq, seed)
        poison = np.full((shape.seq * shape.batch, 2 * shape.hidden), np.nan, np.float32)
        gru.executor.write("out", poison if precision is None else poison.astype(np.float16))
        out, h_n = gru(x, h0, lengths=lengths)
        ref_out, ref_h = gru_reference(x, _weights(shape), h0, 2, True, lengths=lengths)
        assert relative_error(out, ref_out) < bound and relative_error(h_n, ref_h) < bound, family

