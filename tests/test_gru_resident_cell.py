"""The resident-W cell step kernel (``step_cell`` 1): the cell-in-the-store wgmma tile as one
persistent launch a layer, W_hh's columns in shared memory for all T steps; its source, the pick
and the space's refusals on the CPU, and ``-m gpu`` runs against float64 and the cell form."""
from __future__ import annotations

import re

import numpy as np
import pytest
from cubin_checks import ptxas_report
from gru_checks import assert_reruns_match_float64
from test_gru import Shape, _inputs, _weights

from tvm_ext.schedules.gru import GRU, GruTemplate
from tvm_ext.target import offline_cuda

HALF = {name: "float16" for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}
BF16 = {name: "bfloat16" for name in HALF}
RESIDENT = {"fuse_step": 1, "step_loop": 2, "step_barrier": 2, "step_cell": 1, "step_cell_stages": 4,
            "step_cell_inflight": 1, "hid_wgmma": 0, "hid_cell": 0}


def _template(batch: int, hidden: int, bidirectional: bool = False, precision: dict | None = HALF,
              seq: int = 5, target_arch: str = "sm_90") -> GruTemplate:
    t = GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=seq, bidirectional=bidirectional)
    return (t.with_precision(precision) if precision else t).with_tensor_cores(offline_cuda(target_arch))


def _steps_kernel(source: str) -> str:
    """The definition of ``gru_steps_kernel`` in ``source`` (past its declaration)."""
    head = 'extern "C" __global__ void __launch_bounds__(128) gru_steps_kernel('
    body = source[source.index(head, source.index(head) + 1):]
    return body[:body.index("\n}\n")]


def test_w_is_loaded_once_and_h_streamed_every_step(tmp_path):
    """W_hh's columns go into shared memory before the step loop and are never read from global
    memory again; each step copies h's k tiles (cp.async), multiplies them on wgmma (m64n96),
    stores h' into the other state slot, loads the next step's input gates after those stores
    and meets the grid barrier; one launch a layer."""
    target = offline_cuda("sm_90")
    t = _template(192, 1024)
    cfg, why = t.analytic_pick(target)
    assert cfg.step_cell == 1 and why.startswith("resident-W cell step kernel") and "96 blocks" in why
    compiled = t.compile(cfg, target)
    assert [c.name for c in compiled.function_calls()].count("gru_steps") == 1  # one layer, one launch
    kernel = _steps_kernel(compiled.source)
    before, loop = kernel.split("for (int step = 0;", 1)
    w_reads = re.compile(r"\bw_ptr\[")
    assert w_reads.search(before) and not w_reads.search(loop)  # W resident for all steps
    assert before.count("cp_async_cg") == 6  # a k tile of W's 96 columns: 6 chunks a thread, in a k loop
    assert "hs_ptr[" in loop and "cp_async_cg" in loop and "mma_async_sync_aligned_m64n96k16" in loop
    cell = loop[loop.index("wait_group_sync_aligned_0"):]
    assert "gi_ptr[" not in cell.split("hs_ptr[")[0]  # the cell reads its gates from registers
    assert cell.index("hs_ptr[") < cell.index("gi_ptr[") < cell.index("__nv_atomic_fetch_add")  # next gates early
    report = ptxas_report(compiled.source, tmp_path, "gru", "sm_90a")  # wgmma: the arch-specific target
    steps = report[report.index("'gru_steps_kernel'"):].split("ptxas info    : Compiling")[0]
    assert "0 bytes spill stores" in steps


def test_row_tile_counts_replace_the_grid_barrier():
    """``step_flags`` 1: each block releases its count of steps into its word of hx once its h' is
    stored, and a step waits only for its row tile's 32 blocks (a lane each, acquire loads); the
    init zeroes the counts every layer; no grid-wide arrival count."""
    target = offline_cuda("sm_90")
    t = _template(192, 1024, seq=4)
    cfg = t.analytic_pick(target)[0].replace(step_flags=1, step_overlap=0)  # gi complete at launch
    assert t.space(target).infeasible_reason(cfg) is None
    compiled = t.compile(cfg, target)
    calls = {c.name: c.args for c in compiled.function_calls()}
    assert calls["gru_steps"][-2:] == ("bar", "hx") and calls["gru_init"][-2:] == ("bar", "hx")
    kernel = _steps_kernel(compiled.source)
    assert "__nv_atomic_store_n((&(hx_ptr[((int)blockIdx.x)]))" in kernel
    assert "if (((int)threadIdx.x) < 32)" in kernel and "__nv_atomic_load_n((&(hx_ptr[" in kernel
    assert "__nv_atomic_fetch_add" not in kernel
    init = compiled.source[compiled.source.rindex("gru_init_kernel("):]
    assert "words_ptr[" in init[:init.index("\n}\n")]  # the hx it is passed, its step counts zeroed
    assert "cluster" in t.space(target).infeasible_reason(cfg.replace(step_flags=2))


def test_input_gemm_counted_beside_the_resident_kernel():
    """``step_overlap`` on the resident-W kernel: the init zeroes ``gi_ready``, the GEMM (launched
    first, its tile rows in turn) counts into it, and the steps kernel, launched while it runs,
    waits for a step's tile rows (acquire loads: the total, then the block's first and last rows)
    before it loads that step's input gates, behind the cell and ahead of the grid barrier; past the
    poll limit it raises the timed-out flag in the barrier's own words.  The pick takes it where
    the GEMM's blocks fit the SMs the 96 step blocks leave: 64 tiles a block at T=128 (36 blocks)."""
    target = offline_cuda("sm_90")
    cfg, why = _template(192, 1024, seq=128).analytic_pick(target)
    assert cfg.step_overlap == 64 and "its 36 blocks" in why and "beside the step kernel's 96" in why
    t = _template(192, 1024, seq=8)
    cfg = t.analytic_pick(target)[0]
    assert cfg.step_overlap == 4 and t.counted_gemm_tile(cfg).tiles == 4
    assert t.step_variant(cfg).gi_ready == (128, 3 * 1024 // 256)
    compiled = t.compile(cfg, target)
    calls = {c.name: c.args for c in compiled.function_calls()}
    assert calls["gru_init"][-2:] == calls["gru_steps"][-2:] == ("bar", "gi_ready")
    assert calls["gru_gemm_x0"][-1] == "gi_ready"
    kernel = _steps_kernel(compiled.source)
    assert kernel.count("__nv_atomic_load_n((&(ready_ptr[") == 2 * 2 * 2  # step 0's and each next step's
    before, loop = kernel.split("for (int step = 0;", 1)
    assert before.index("ready_ptr[") < before.index("gi_ptr[")
    cell = loop[loop.index("wait_group_sync_aligned_0"):]
    assert (cell.index("hs_ptr[") < cell.index("ready_ptr[") < cell.index("gi_ptr[")
            < cell.index("__nv_atomic_fetch_add"))
    assert kernel.count("bar_ptr[1] = 1;") == 2  # the grid barrier's and the polls'
    uncounted = t.compile(cfg.replace(step_overlap=0), target)
    assert "ready_ptr" not in _steps_kernel(uncounted.source)


@pytest.mark.parametrize("batch, hidden, bidirectional, precision, resident", [
    (192, 1024, False, HALF, True),
    (160, 1024, False, HALF, True),  # a ragged last row tile
    (256, 1024, False, HALF, False), (128, 1024, True, HALF, False),  # 128-row cell tiles: as fast or faster
    (128, 1024, False, HALF, False),  # 64 blocks: under 70 % of a wave (measured slower)
    (192, 1024, False, BF16, True), (160, 1024, False, BF16, True),  # bfloat16 as float16
    (256, 1024, False, BF16, False),  # bfloat16 on 128-row cell tiles
    (128, 2048, False, HALF, False),  # W's columns do not fit beside the stages
    (96, 1024, False, HALF, True), (64, 1024, True, HALF, True),  # 64 blocks, the input GEMM counted beside
    (96, 1024, False, BF16, True),
    (64, 1024, False, HALF, False), (32, 1024, True, HALF, False),  # 32 blocks: the tensor-core step kernel
    # H768, counted, over the unfused steps; not where the tensor-core step kernel runs, nor at 128-row tiles
    (192, 768, False, HALF, True), (160, 768, False, HALF, True), (96, 768, True, HALF, True),
    (192, 768, False, BF16, True),
    (128, 768, False, HALF, False), (64, 768, True, HALF, False), (256, 768, False, HALF, False),
    (192, 512, False, HALF, False),  # below H768 the picks stay as they were
])
def test_pick_takes_the_resident_kernel_where_its_grid_makes_a_wave(batch, hidden, bidirectional, precision,
                                                                     resident):
    target = offline_cuda("sm_90")
    t = _template(batch, hidden, bidirectional, precision, seq=128)
    cfg, why = t.analytic_pick(target)
    assert (cfg.step_cell == 1) == resident, why
    if resident:
        assert cfg.step_overlap > 0 and "launched while the input GEMM runs" in why  # on the SMs its grid leaves
    assert t.space(target).infeasible_reason(cfg) is None


@pytest.mark.parametrize("batch, hidden, knobs, precision, arch, reason", [
    (128, 2048, {}, HALF, "sm_90", "need 425984 B of shared memory > 232448"),
    (512, 1024, {}, HALF, "sm_90", "256 blocks > 132 SMs"),
    (192, 1024, {}, None, "sm_90", "h and W_hh both float16 or both bfloat16"),
    (192, 1024, {}, HALF, "sm_80", "persistent kernel (step_loop 2) of a Hopper GPU"),
    (192, 1024, {"step_loop": 0}, HALF, "sm_90", "persistent kernel (step_loop 2) of a Hopper GPU"),
    (64, 96, {}, HALF, "sm_90", "hidden 96 is no multiple of its k tile"),
    (192, 1024, {"step_flags": 1, "in_wgmma": 1, "step_overlap": 4}, HALF, "sm_90",
     "resident-W cell step kernel's with its grid barrier"),
])
def test_space_refuses_what_the_kernel_cannot_run(batch, hidden, knobs, precision, arch, reason):
    target = offline_cuda(arch)
    t = _template(batch, hidden, precision=precision, target_arch=arch)
    cfg = t.default_config(target).replace(**{**RESIDENT, **knobs})
    assert reason in t.space(target).infeasible_reason(cfg)


def test_records_without_the_knobs_read_as_before():
    """Configs written before the kernel existed have no ``step_cell*`` knobs: they read as the
    steps they were (``step_cell`` 0), and its stages and in-flight groups as the pick's."""
    target = offline_cuda("sm_90")
    space = _template(192, 1024).space(target)
    before = {k.name: k.before for k in space.knobs if k.name.startswith("step_cell")}
    assert before == {"step_cell": 0, "step_cell_stages": 4, "step_cell_inflight": 1}


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
GPU_SHAPES = {
    # the pick: 96 blocks, K 16 k tiles
    "b192-h1024": Shape(seq=6, batch=192, input=128, hidden=1024),
    # a ragged last row tile (rows read one below the batch, not stored), two layers, both directions
    "b100-h512-2layer-bi": Shape(seq=5, batch=100, input=64, hidden=512, layers=2, bidirectional=True),
    # the same, each step waiting for its row tile's step counts instead of the grid barrier
    "b100-h512-2layer-bi-flags": Shape(seq=5, batch=100, input=64, hidden=512, layers=2, bidirectional=True),
    # three stages, no wgmma left in flight
    "b64-h256-s3i0": Shape(seq=7, batch=64, input=64, hidden=256),
    # the input GEMM counted beside the steps: its 36 blocks on the SMs the 96 step blocks leave
    "b192-h1024-counted": Shape(seq=8, batch=192, input=1024, hidden=1024),
    # the same from both ends of gi, a ragged last row tile, a later layer's GEMM of depth 1024
    "b96-h512-2layer-bi-counted": Shape(seq=8, batch=96, input=128, hidden=512, layers=2, bidirectional=True),
}
KNOBS = {"b192-h1024": {}, "b100-h512-2layer-bi": {}, "b100-h512-2layer-bi-flags": {"step_flags": 1},
         "b64-h256-s3i0": {"step_cell_stages": 3, "step_cell_inflight": 0},
         "b192-h1024-counted": {"in_wgmma": 1, "step_overlap": 4},
         "b96-h512-2layer-bi-counted": {"in_wgmma": 1, "step_overlap": 4}}
PRECISIONS = {"float16": (HALF, 5e-3), "bfloat16": (BF16, 3e-2)}


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(GPU_SHAPES))
@pytest.mark.parametrize("dtype", list(PRECISIONS))
def test_cuda_resident_kernel_matches_float64_and_the_cell_form(key, dtype):
    """Against float64 on reruns and a second input; and bit for bit against the cell in the
    hidden GEMM's store with K whole (``hid_cell`` 1), which adds the same sums in the same order."""
    s, (precision, bound) = GPU_SHAPES[key], PRECISIONS[dtype]

    def build(config: dict) -> GRU:
        return GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional,
                         batch=s.batch, seq=s.seq, config=config, precision=precision).load_numpy(_weights(s))

    gru = build({**RESIDENT, **KNOBS[key]})
    x, h0 = _inputs(s)
    assert_reruns_match_float64(gru, s, x, h0, bound, 1e-6)
    assert_reruns_match_float64(gru, s, x[::-1].copy(), -h0, bound, 1e-6, reruns=1)
    cell_form = build({"fuse_step": 0, "hid_wgmma": 1, "hid_cell": 1, **({"in_wgmma": 1} if "counted" in key else {})})
    for ours, theirs in zip(gru(x, h0), cell_form(x, h0)):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
