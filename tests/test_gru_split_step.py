"""The float32 GRU's split tensor-core step kernel (``step_tc`` 2): generated CUDA and nvcc here,
the space's refusals with their reasons, and ``-m gpu`` runs against float64 at shapes whose
batch and hidden size its tiles and chunks do not divide."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from gru_checks import assert_reruns_match_float64, steps_kernel_ptxas
from test_gru import Shape, _inputs, _weights

from tvm_ext.schedules.gru import GRU, GruTemplate
from tvm_ext.schedules.gru.split_step import SPLIT_CHUNK_K, SplitStepShape
from tvm_ext.target import offline_cuda

SPLIT = dict(fuse_step=1, step_loop=2, step_barrier=2, step_tc=2, step_flags=0, step_tc_kw=1)


def _template(batch: int, hidden: int, seq: int = 5, layers: int = 1, bidirectional: bool = False) -> GruTemplate:
    return GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=seq, layers=layers, bidirectional=bidirectional)


def _kernel(source: str, name: str = "gru_steps") -> str:
    body = source[re.search(name + r"_kernel\([^)]*\) \{", source).end():]
    return body[:body.index("\n}\n")]


def test_generated_cuda_splits_w_once_and_h_every_chunk_with_three_products():
    """W_hh is read (and split) before the step loop only; each step reads the float32 state
    from L2 (``__ldcg``: another block wrote it), and per 64-deep chunk of k: two ldmatrix of h
    (high, low) and two of each W tile pair a k slice, three mma.sync per n8 tile (hi·hi, hi·lo,
    lo·hi), the grid barrier once a step."""
    t = _template(8, 128)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**SPLIT, step_j=16, step_tc_rows=16, step_tc_nw=2)
    assert t.space(target).is_feasible(cfg)
    kernel = _kernel(t.compile(cfg, target).source)
    loop = kernel.index("for (int s = 0; s < 5; ++s)")
    assert "w_ptr" in kernel[:loop] and "w_ptr" not in kernel[loop:]
    step = kernel[loop:]
    chunk = step[step.index("for (int c0 = 0; c0 < 2; ++c0)"):]
    slices, n_tiles = SPLIT_CHUNK_K // 16, 3  # 8 units a warp x 3 gates
    assert chunk.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16") == 2 * slices
    assert chunk.count("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") == 2 * slices  # the pair, hi and lo
    assert chunk.count("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16") == 2 * slices  # the odd third tile
    assert chunk.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 3 * n_tiles * slices
    loads = step.count("__ldcg((&(hs_ptr[")  # every read of the state is an L2 load
    assert loads and step.count("hs_ptr[") - loads == len(re.findall(r"\bhs_ptr\[[^;]*\] = ", step))
    assert step.count("__nv_atomic_fetch_add") == 1  # the acquire/release grid barrier


def test_the_low_parts_are_the_rest_of_the_high_ones_and_w_is_scaled():
    """The ring holds h's float16 high part and the float16 rounding of what is left, and W_hh
    is split times 256 with the sums multiplied back by 1/256 before b_hh."""
    t = _template(4, 64)
    target = offline_cuda("sm_90")
    kernel = _kernel(t.compile(t.default_config(target).replace(**SPLIT, step_j=16, step_tc_rows=16,
                                                               step_tc_nw=1), target).source)
    assert re.search(r"\(\(half\)\(h_reg_ptr\[0\] - \(\(float\)\(\(half\)h_reg_ptr\[0\]\)\)\)\)", kernel)
    assert "* 0x1p+8f" in kernel and "* 0x1p-8f" in kernel


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_compiles_the_kernel_for_sm_90_without_spills(tmp_path):
    t = _template(5, 200, bidirectional=True)
    target = offline_cuda("sm_90")
    compiled = t.compile(t.default_config(target).replace(**SPLIT, step_j=16, step_tc_rows=16, step_tc_nw=2),
                         target)
    assert " 0 bytes spill stores" in steps_kernel_ptxas(compiled.source, tmp_path)


def test_shape_sizes():
    """B64 H1024, 16 units x 32 rows: 128 blocks of 4 warps; W_hh's two parts (1024 x 48 each)
    and two ring chunks of 32 rows x (64 + 64 + 8) fit the H100's 227 KB."""
    s = SplitStepShape(batch=64, hidden=1024, dirs=1, units=16, rows=32, n_warps=2)
    assert (s.blocks, s.threads, s.chunks, s.n_tiles, s.loads) == (128, 128, 16, 3, 16)
    assert s.shared_bytes() == (2 * 1024 * 48 + 2 * 32 * 136) * 2
    assert SplitStepShape(5, 200, 2, 16, 16, 2).k_extent == 256  # whole chunks, zero rows past H


@pytest.mark.parametrize("precision, knobs, reason", [
    (None, dict(step_j=16, step_tc_rows=16, step_tc_nw=1, step_tc_kw=8), "8 k warps (step_tc_kw) do not split"),
    (None, dict(step_j=16, step_tc_rows=16, step_tc_nw=1, step_loop=1), "persistent kernel only"),
    (None, dict(step_j=4, step_tc_rows=16, step_tc_nw=1), "step_j 4 units per block"),
    (None, dict(step_j=16, step_tc_rows=16, step_tc_nw=4), "not 8 units or more a warp"),
    ("float16", dict(step_j=16, step_tc_rows=16, step_tc_nw=1), "needs float32 h, W_hh"),
])
def test_space_refuses_with_the_reason(precision, knobs, reason):
    t = _template(8, 64)
    if precision:
        t = t.with_precision({name: precision for name in ("x", "w_ih", "gi", "w_hh", "h", "out")})
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**{**SPLIT, **knobs})
    assert reason in t.space(target).infeasible_reason(cfg)


def test_space_refuses_w_parts_beyond_shared_memory_and_a_grid_that_cannot_be_resident():
    target = offline_cuda("sm_90")
    t = _template(64, 1024)
    wide = t.default_config(target).replace(**SPLIT, step_j=32, step_tc_rows=32, step_tc_nw=2)
    assert "of shared memory" in t.space(target).infeasible_reason(wide)  # 2 x 1024 x 96 halves
    many = t.default_config(target).replace(**SPLIT, step_j=16, step_tc_rows=16, step_tc_nw=2)
    assert "256 blocks > 132 SMs x 1 resident" in t.space(target).infeasible_reason(many)
    fits = t.default_config(target).replace(**SPLIT, step_j=16, step_tc_rows=32, step_tc_nw=2)
    assert t.space(target).is_feasible(fits)


@pytest.mark.parametrize("batch, hidden, k_warps, refused", [
    (192, 256, 4, "384 blocks > 132 SMs x 2 resident"),  # three 256-thread blocks an SM at 80-119 registers a lane
    (96, 384, 4, "144 blocks > 132 SMs x 1 resident"),  # two 512-thread blocks an SM
    (192, 256, 2, None), (96, 384, 2, None),  # the same grids of 128- and 256-thread blocks fit
])
def test_a_grid_whose_lanes_registers_do_not_fit_is_refused(batch, hidden, k_warps, refused):
    """The split kernel's launch bounds name only its threads, so its lanes take 80-119
    registers: counted at ``SPLIT_LANE_REGISTERS``, a grid of more blocks an SM than those fit
    is refused (float32 bidirectional B192 H256 and B96 H384 were picked so, and their grid
    barrier timed out on the GPU)."""
    target = offline_cuda("sm_90")
    t = _template(batch, hidden, bidirectional=True).with_tensor_cores(target)
    pick = t.analytic_pick(target)[0]
    assert pick.step_tc == 2 and pick.step_tc_kw == 2  # the pick: two k warps
    reason = t.space(target).infeasible_reason(pick.replace(step_tc_kw=k_warps))
    assert (reason is None) if refused is None else refused in reason


@pytest.mark.parametrize("batch, hidden, bidirectional, bounds", [
    (192, 256, True, "__launch_bounds__(128, 3)"),  # 384 blocks: three an SM
    (96, 384, True, "__launch_bounds__(256, 2)"),
    (64, 1024, False, "__launch_bounds__(512)"),  # 128 blocks: one an SM, the threads only
])
def test_the_kernel_is_compiled_for_the_blocks_each_sm_must_hold(batch, hidden, bidirectional, bounds):
    """Its launch bounds name the blocks an SM its grid needs resident, so nvcc keeps a lane's
    registers to their share whatever it would take (the picks' 80-131)."""
    target = offline_cuda("sm_90")
    t = _template(batch, hidden, bidirectional=bidirectional).with_tensor_cores(target)
    pick = t.analytic_pick(target)[0]
    assert pick.step_tc == 2
    assert bounds + " gru_steps_kernel(" in t.compile(pick, target).source


def test_the_16_bit_kernels_knobs_do_not_change_it():
    """``step_tc_acc`` and ``step_tc_frag`` are the 16-bit kernel's: the split kernel's source
    is the same at every value, and they are not shown."""
    t = _template(8, 64)
    target = offline_cuda("sm_90")
    base = t.default_config(target).replace(**SPLIT, step_j=16, step_tc_rows=16, step_tc_nw=2)
    other = base.replace(step_tc_acc=4, step_tc_frag=1, step_flag_units=32, step_b=2)
    assert t.compile(base, target).source == t.compile(other, target).source
    prefixes, names = t.step_variant(base).unshown()
    assert {"step_tc_acc", "step_tc_frag", "step_flag_units", "step_b"} <= set(names)


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
GPU_CASES = {  # K past the hidden size, rows past the batch, both directions, layers, 2 chunks
    "b5-h200-bi": (Shape(seq=9, batch=5, input=40, hidden=200, bidirectional=True), dict(step_j=16, step_tc_rows=16,
                                                                                          step_tc_nw=2)),
    "b33-h96-rows32": (Shape(seq=6, batch=33, input=96, hidden=96), dict(step_j=32, step_tc_rows=32, step_tc_nw=4)),
    "b3-h33-3layer-bi": (Shape(seq=7, batch=3, input=33, hidden=33, layers=3, bidirectional=True),
                         dict(step_j=16, step_tc_rows=16, step_tc_nw=1)),
    "b64-h1024-rows32": (Shape(seq=12, batch=64, input=256, hidden=1024), dict(step_j=16, step_tc_rows=32,
                                                                               step_tc_nw=2)),
    "b64-h1024-rows64": (Shape(seq=12, batch=64, input=256, hidden=1024), dict(step_j=16, step_tc_rows=64,
                                                                               step_tc_nw=2)),
    # 6 chunks 4 ahead (the last round's guard), 16 chunks 2 ahead
    "b5-h330-ahead4": (Shape(seq=5, batch=5, input=40, hidden=330), dict(step_j=16, step_tc_rows=16, step_tc_nw=2,
                                                                         step_tc_ahead=4)),
    "b64-h1024-rows32-ahead2": (Shape(seq=12, batch=64, input=256, hidden=1024),
                                dict(step_j=16, step_tc_rows=32, step_tc_nw=2, step_tc_ahead=2)),
    # k warps meeting in shared memory
    "b64-h1024-rows32-kw2": (Shape(seq=12, batch=64, input=256, hidden=1024),
                             dict(step_j=16, step_tc_rows=32, step_tc_nw=2, step_tc_kw=2, step_tc_ahead=2)),
    "b5-h200-bi-kw4": (Shape(seq=9, batch=5, input=40, hidden=200, bidirectional=True),
                       dict(step_j=16, step_tc_rows=16, step_tc_nw=2, step_tc_kw=4)),
    "b3-h33-3layer-bi-kw2": (Shape(seq=7, batch=3, input=33, hidden=33, layers=3, bidirectional=True),
                             dict(step_j=16, step_tc_rows=16, step_tc_nw=1, step_tc_kw=2)),
    # 8 units a block: one n8 tile a gate, three (an odd count) a warp
    "b20-h200-units8": (Shape(seq=9, batch=20, input=40, hidden=200), dict(step_j=8, step_tc_rows=16, step_tc_nw=1,
                                                                          step_tc_kw=2)),
    # three blocks an SM (384 of 128 threads): the pick since its 256-thread blocks were not all resident
    "b192-h256-bi-kw2": (Shape(seq=8, batch=192, input=256, hidden=256, bidirectional=True),
                         dict(step_j=16, step_tc_rows=16, step_tc_nw=2, step_tc_kw=2)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(GPU_CASES))
def test_cuda_split_step_matches_float64_at_float32_accuracy(key):
    """Against float64 on reruns (a race between blocks or chunks would move the error) and on
    a second input; the error is float32's class (the dropped lo·lo product is 2^-22 of a
    product), which a 16-bit product (~1e-3) or a lost low part (~1e-4) would not meet."""
    s, knobs = GPU_CASES[key]
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch,
                    seq=s.seq, config={**SPLIT, **knobs}).load_numpy(_weights(s))
    assert gru.config.step_tc == 2
    x, h0 = _inputs(s)
    assert_reruns_match_float64(gru, s, x, h0, 2e-6, 1e-9)
    assert_reruns_match_float64(gru, s, x[::-1].copy(), -h0, 2e-6, 1e-9, reruns=1)


@pytest.mark.gpu
def test_cuda_split_step_refuses_w_hh_and_h0_its_float16_parts_cannot_hold():
    """W_hh's parts are stored times 256: |W_hh| of 300 would overflow float16 and is refused
    with the knob named, as is an h0 past float16's range; a GRU without the kernel takes both."""
    from tvm_ext.core.errors import TvmExtError

    s, knobs = GPU_CASES["b5-h200-bi"]
    weights = {**_weights(s), "weight_hh_l0": _weights(s)["weight_hh_l0"] * np.float32(1e4)}
    gru = GRU.build("cuda", s.input, s.hidden, bidirectional=True, batch=s.batch, seq=s.seq,
                    config={**SPLIT, **knobs})
    with pytest.raises(TvmExtError, match=r"weight_hh_l0 has \|value\| .* build without step_tc 2"):
        gru.load_numpy(weights)
    x, h0 = _inputs(s)
    with pytest.raises(TvmExtError, match="GRU h0 has .* build without step_tc 2"):
        gru.load_numpy(_weights(s))(x, h0 * np.float32(1e5))


@pytest.mark.parametrize("k_warps", [2, 4])
def test_k_warps_split_each_chunks_slices_and_meet_once_a_step(k_warps):
    """``step_tc_kw`` 2 or 4: each warp multiplies 4 / k_warps of a chunk's 4 k slices, the later
    k warps store their sums (cross products folded in) to shared memory once a step and the
    first adds them before the cell; only the first k warp loads gi and h for the cell and stores h'."""
    t = _template(8, 128)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**{**SPLIT, "step_tc_kw": k_warps}, step_j=16, step_tc_rows=16,
                                           step_tc_nw=2)
    assert t.space(target).is_feasible(cfg)
    step = _kernel(t.compile(cfg, target).source)
    step = step[step.index("for (int s = 0; s < 5; ++s)"):]
    chunk = step[step.index("for (int c0 = 0; c0 < 2; ++c0)"):]
    slices = SPLIT_CHUNK_K // 16 // k_warps
    assert chunk.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 3 * 3 * slices
    shape = t.step_variant(cfg).shape
    assert shape.threads == 32 * 2 * k_warps and shape.partial_floats == (k_warps - 1) * 2 * 12 * 32
    assert shape.shared_bytes() == (2 * 128 * 48 + 2 * 16 * 136) * 2 + shape.partial_floats * 4


@pytest.mark.parametrize("ahead", [1, 2, 4])
def test_chunks_ahead_are_loaded_before_the_first_split_and_each_after_its_sync(ahead):
    """``step_tc_ahead``: a step starts with the loads of its first ``ahead`` chunks (of 3 here:
    never more than there are), and each later chunk's loads follow a chunk's split and sync,
    into the register set that chunk left."""
    t = _template(16, 192)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**SPLIT, step_j=16, step_tc_rows=16, step_tc_nw=2, step_tc_ahead=ahead)
    step = _kernel(t.compile(cfg, target).source)
    step = step[step.index("for (int s = 0; s < 5; ++s)"):]
    loads = t.step_variant(cfg).shape.loads  # 16 rows x 64 k over 64 threads
    first = step[:step.index("= ((half)h_reg_ptr[")]  # up to the first split
    h_loads = first.count("__ldcg((&(hs_ptr[")
    assert h_loads == min(ahead, 3) * loads + 4  # + the cell's 4 values of h a lane
    assert f"h_reg_ptr[{min(ahead, 3) * loads - 1}] = __ldcg" in first
    assert f"h_reg_ptr[{min(ahead, 3) * loads}] = __ldcg" not in first
