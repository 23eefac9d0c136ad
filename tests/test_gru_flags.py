"""The GRU's flag-exchange persistent step kernel (``step_flags``): generated CUDA and nvcc
here, the space's refusals with their reasons, the pick, and ``-m gpu`` runs against float64
(odd sizes, both directions, several layers, repeated calls)."""
from __future__ import annotations

import re
import shutil

import pytest
from gru_checks import assert_reruns_match_float64, steps_kernel_ptxas
from test_gru import Shape, _inputs, _weights

from tvm_ext.precision.precision import relative_error
from tvm_ext.schedules.gru import GRU, GruTemplate, gru_reference
from tvm_ext.target import offline_cuda

FLAGS = dict(fuse_step=1, step_loop=2, step_flags=1)
HALF = {name: "float16" for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}


def _template(batch: int, hidden: int, seq: int = 5, layers: int = 1, bidirectional: bool = False) -> GruTemplate:
    return GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=seq, layers=layers, bidirectional=bidirectional)


def _kernel(source: str, name: str = "gru_steps") -> str:
    body = source[re.search(name + r"_kernel\([^)]*\) \{", source).end():]
    return body[:body.index("\n}\n")]


def test_generated_cuda_polls_tagged_words_and_has_no_grid_barrier():
    """Every h word is polled with a relaxed 64-bit load and written with one relaxed 64-bit
    store; no counter is added to (no barrier), W_hh is read before the step loop only."""
    t = _template(2, 64)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**FLAGS, step_flag_units=4)
    compiled = t.compile(cfg, target)
    body = _kernel(compiled.source)
    loop = body.index("for (int s = 0; s < 5; ++s)")
    assert "atomicAdd" not in body and "__nv_atomic_fetch_add" not in body
    words = 2 * 64 // (4 * 32)  # all of h (batch x hidden) over the block's 128 threads
    assert body[loop:].count("__nv_atomic_load_n((&(hx_ptr[") == words
    assert body[loop:].count("__nv_atomic_store_n((&(hx_ptr[") == 1
    assert "w_ptr[" in body[:loop] and "w_ptr[" not in body[loop:]
    assert body[loop:].count("__shfl_xor_sync") == 5 * 3 * 2  # 5 rounds x 3 gates x 2 rows
    calls = [(c.func, c.args[-1]) for c in compiled.calls]
    assert ("gru_init", "hx") in calls and ("gru_steps", "hx") in calls


def test_the_cell_computes_z_and_h_once_a_step_and_every_store_reads_them():
    """The update gate z and h' go into registers once a step; the exchange word, the output and
    h_n read h' from there (each wrote its own copy of the cell's expression before)."""
    t = _template(1, 256, seq=128)
    target = offline_cuda("sm_90")
    cfg = t.analytic_pick(target)[0]
    assert cfg.step_flags == 1
    loop = _kernel(t.compile(cfg, target).source)
    loop = loop[loop.index("for (int s = 0; s < 128"):]
    assert loop.count("zh_ptr[0] = ") == loop.count("zh_ptr[1] = ") == 1
    assert re.search(r"v__\d+ = zh_ptr\[1\];\s*__nv_atomic_store_n", loop)  # the word's bits
    assert re.search(r"out_ptr\[[^\n]*\] = zh_ptr\[1\];", loop) and re.search(r"h_n_ptr\[[^\n]*\] = zh_ptr\[1\];", loop)


def test_the_zero_fill_of_h_is_behind_a_barrier_before_the_first_poll():
    """h's rows in shared memory are padded to a multiple of 32 (200 -> 224 here): the zero fill
    (thread t, word t) and the first step's poll (thread t, word of h t) write the same words from
    different threads, so a block barrier stands between them (there was none)."""
    t = GruTemplate(batch=5, hidden=200, input=40, seq=9)
    target = offline_cuda("sm_90")
    body = _kernel(t.compile(t.default_config(target).replace(**FLAGS, step_flag_units=16), target).source)
    fill = body.rindex("] = 0x0p+0f", 0, body.index("for (int s = 0; s < 9"))
    assert "__syncthreads();" in body[fill:body.index("for (int s = 0; s < 9")]


def test_more_words_than_a_poll_holds_are_polled_in_rounds():
    """B16 H512 with 4 units: 64 words a thread, polled as 2 rounds of ``POLL_WORDS`` (32),
    each with its own wait, so the words in registers stay within the budget."""
    from tvm_ext.schedules.gru.flag_step import POLL_WORDS

    t = _template(16, 512)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**FLAGS, step_flag_units=4)
    shape = t.step_variant(cfg).shape
    assert (shape.words_per_thread, shape.poll_words, shape.poll_rounds) == (64, POLL_WORDS, 2)
    assert t.space(target).is_feasible(cfg), t.space(target).infeasible_reason(cfg)
    body = _kernel(t.compile(cfg, target).source)
    loop = body[body.index("for (int s = 0; s < 5; ++s)"):]
    assert loop.count("__nv_atomic_load_n((&(hx_ptr[") == 64
    assert loop.count("while (") == 2
    assert "uint64_t got_ptr[32];" in body  # one round's words in registers, not 64


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_compiles_the_kernel_for_sm_90(tmp_path):
    """The source the GPU compiles with NVRTC is valid for sm_90 (3 rows, hidden 33, two
    directions) and keeps its registers (no spills)."""
    t = _template(3, 33, bidirectional=True)
    target = offline_cuda("sm_90")
    compiled = t.compile(t.default_config(target).replace(**FLAGS, step_flag_units=8), target)
    assert " 0 bytes spill stores" in steps_kernel_ptxas(compiled.source, tmp_path)


def test_fused_input_projects_x_in_the_step_kernel_and_no_input_gemm_runs():
    """``step_flag_input`` 1: the plan is init and steps per layer (no input GEMM), the steps
    kernel takes the layer's input, W_ih and b_ih in place of gi; W_ih is read before the step
    loop only, x in it; the x sums take their own butterfly (5 rounds x 3 gates x 2 rows more)
    after the cell; the input GEMM's knobs no longer show."""
    t = _template(2, 64, layers=2)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**FLAGS, step_flag_units=4, step_flag_input=1)
    assert t.space(target).is_feasible(cfg), t.space(target).infeasible_reason(cfg)
    compiled = t.compile(cfg, target)
    assert [c.func for c in compiled.calls] == ["gru_init", "gru_steps"] * 2
    steps = [c.args for c in compiled.calls if c.func == "gru_steps"]
    assert [a[:3] for a in steps] == [("x", "w_ih0", "b_ih0"), ("y0", "w_ih1", "b_ih1")]
    assert "gru_gemm" not in compiled.source
    body = _kernel(compiled.source)
    loop = body.index("for (int s = 0; s < 5; ++s)")
    assert "w_ih_ptr[" in body[:loop] and "w_ih_ptr[" not in body[loop:]
    assert "x_in_ptr[" in body[loop:]
    assert body[loop:].count("__shfl_xor_sync") == 2 * 5 * 3 * 2
    shown = t.shown_knobs(cfg)
    assert "step_flag_input" in shown and not any(k.startswith("in_") for k in shown)
    assert any(k.startswith("in_") for k in t.shown_knobs(cfg.replace(step_flag_input=0)))


@pytest.mark.parametrize("template, knobs, reason", [
    (_template(33, 64), dict(step_flag_units=4), "batch 33 > 32"),
    (_template(32, 1024), dict(step_flag_units=4), "registers per thread"),
    (_template(1, 1024, bidirectional=True), dict(step_flag_units=4), "needs every block resident, 512 blocks"),
    (_template(32, 96), dict(step_flag_units=32), "3 blocks > 132 SMs x 0 resident"),  # 1024 x ~150 registers
    (_template(32, 512), dict(step_flag_units=4), "65536 B > 49152 B of static shared memory"),
    (_template(8, 512), dict(step_flag_units=8, step_loop=1), "persistent kernel only"),
    (_template(8, 512), dict(step_flag_units=8, step_tc=1), "both float16 or both bfloat16"),  # on tensor cores
    # the input projected in the kernel (step_flag_input)
    (_template(8, 512), dict(step_flag_units=8, step_flag_input=1, step_tc=1), "flag-exchange step kernel's"),
    (_template(1, 256), dict(step_flag_units=4, step_flag_input=1, in_split=1), "no input GEMM to split"),
    (_template(1, 64, layers=2, bidirectional=True), dict(step_flag_units=4, step_flag_input=1),
     "each layer's input must be 64 deep"),
    (_template(4, 512), dict(step_flag_units=4, step_flag_input=1), "W_ih share 3 x 16 and x 4 x 16"),
    (GruTemplate(batch=2, hidden=64, input=64, seq=5, variable_lengths=True),
     dict(step_flag_units=4, step_flag_input=1), "variable lengths"),
])
def test_space_refuses_with_the_reason(template, knobs, reason):
    target = offline_cuda("sm_90")
    cfg = template.default_config(target).replace(**{**FLAGS, **knobs})
    assert reason in template.space(target).infeasible_reason(cfg)


def test_opencl_refuses_it():
    from tvm_ext.target import resolve_target

    target = resolve_target("opencl")
    t = _template(2, 64)
    cfg = t.default_config(target).replace(**FLAGS, step_flag_units=4)
    assert "CUDA" in t.space(target).infeasible_reason(cfg)


def test_other_step_knobs_do_not_refuse_a_flag_config_and_are_not_shown():
    t = _template(8, 512)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**FLAGS, step_flag_units=4, step_j=256, step_b=16, step_bt=16, step_ks=16)
    assert t.space(target).is_feasible(cfg), t.space(target).infeasible_reason(cfg)
    assert not t.space(target).is_feasible(cfg.replace(step_flags=0))
    shown = t.shown_knobs(cfg)
    assert "step_flag_units" in shown and "step_j" not in shown and "step_ks" not in shown
    assert "step_flag_units" not in t.shown_knobs(cfg.replace(step_flags=0))


@pytest.mark.parametrize("shape, units", [((1, 256, False), 4), ((3, 512, False), 4), ((3, 512, True), 8),
                                          ((5, 200, False), 4), ((3, 33, True), 4), ((7, 256, False), 4)])
def test_analytic_pick_takes_it_for_small_batches(shape, units):
    from tvm_ext.schedules.gru.pick import FUSED_INPUT_BATCH

    """Below batch 8 with float32 state, below batch 4 from H512 (and up to batch 16 where the
    tensor-core kernel of float32 parts does not fit); with 16-bit state batch 1, the tensor-core
    kernel above: the fewest units per block whose grid fits one block per SM (132 on the H100: 4
    units at H512 is 128 blocks, bidirectional 256, so 8)."""
    batch, hidden, bidirectional = shape
    target = offline_cuda("sm_90")
    t = _template(batch, hidden, bidirectional=bidirectional)
    cfg, why = t.analytic_pick(target)
    assert (cfg.step_flags, cfg.step_flag_units) == (1, units), why
    assert why.startswith("flag-exchange persistent step kernel")
    fits = t.space(target).is_feasible(cfg.replace(step_flag_input=1, in_split=0, in_wgmma=0))
    fused = batch <= FUSED_INPUT_BATCH and fits  # the input projected in the kernel (B1-B4 measured faster)
    assert fits or (hidden, bidirectional) == (512, False)  # B3 H512: W_ih's share and x, too many registers
    assert cfg.step_flag_input == fused and ("no input GEMM" in why) == fused
    # from batch 8, and batch 4 at H512 or more: float32 parts on the tensor cores
    for wider in (_template(8, 512), _template(32, 64), _template(4, 512), _template(7, 1024)):
        assert (wider.analytic_pick(target)[0].step_tc, wider.analytic_pick(target)[0].step_flags) == (2, 1)
    half = t.with_precision(HALF).analytic_pick(target)[0]
    # 16-bit state: this kernel at batch 1 (B1 H256 measured), the tensor-core one with tagged words from batch 2
    # (B2, B4 H512 measured)
    assert (half.step_flags, half.step_tc) == ((1, 0) if batch <= 1 else (1, 1))
    assert [_template(b, 512).with_precision(HALF).analytic_pick(target)[0].step_tc for b in (2, 4)] == [1, 1]


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
GPU_CASES = {
    "b1-h256": (Shape(seq=9, batch=1, input=256, hidden=256), 4),
    "b8-h512-bi": (Shape(seq=7, batch=8, input=512, hidden=512, bidirectional=True), 8),
    "b5-h200-u16": (Shape(seq=9, batch=5, input=40, hidden=200), 16),
    "b3-h33-3layer-bi": (Shape(seq=7, batch=3, input=33, hidden=33, layers=3, bidirectional=True), 4),
    "b32-h96": (Shape(seq=6, batch=32, input=96, hidden=96), 8),
    "b16-h512-poll-rounds": (Shape(seq=7, batch=16, input=256, hidden=512), 4),
}


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(GPU_CASES))
def test_cuda_flag_step_matches_float64(key):
    """Against float64 on reruns with the same input (a stale or torn word would move the
    error) and on a second input (a tag left from the first call would be read as this one's)."""
    s, units = GPU_CASES[key]
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch,
                    seq=s.seq, config={**FLAGS, "step_flag_units": units}).load_numpy(_weights(s))
    assert gru.config.step_flags == 1
    x, h0 = _inputs(s)
    assert_reruns_match_float64(gru, s, x, h0, 1e-5, 1e-9)
    assert_reruns_match_float64(gru, s, x[::-1].copy(), -h0, 1e-5, 1e-9, reruns=1)


FUSED_CASES = {  # the input projected in the step kernel: both directions, layers, an odd size, float16
    "b1-h256": (Shape(seq=9, batch=1, input=256, hidden=256), 4, None),
    "b5-h200-bi": (Shape(seq=9, batch=5, input=200, hidden=200, bidirectional=True), 8, None),
    "b3-h33-3layer-bi": (Shape(seq=7, batch=3, input=66, hidden=33, layers=3, bidirectional=True), 4, None),
    "b2-h96-input40": (Shape(seq=6, batch=2, input=40, hidden=96), 4, None),
    "b1-h256-float16": (Shape(seq=9, batch=1, input=256, hidden=256), 4, HALF),
}


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(FUSED_CASES))
def test_cuda_fused_input_flag_step_matches_float64(key):
    """``step_flag_input`` 1 against float64 on reruns and a second input, as the kernel with
    the input GEMM before it is checked (float16: its storage's error)."""
    s, units, precision = FUSED_CASES[key]
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch,
                    seq=s.seq, config={**FLAGS, "step_flag_units": units, "step_flag_input": 1},
                    precision=precision).load_numpy(_weights(s))
    assert gru.config.step_flag_input == 1
    x, h0 = _inputs(s)
    bound = 1e-5 if precision is None else 5e-3
    assert_reruns_match_float64(gru, s, x, h0, bound, 1e-9 if precision is None else 1e-6)
    assert_reruns_match_float64(gru, s, x[::-1].copy(), -h0, bound, 1e-6, reruns=1)


@pytest.mark.gpu
def test_cuda_flag_step_in_float16():
    s = Shape(seq=9, batch=8, input=512, hidden=512)
    gru = GRU.build("cuda", s.input, s.hidden, batch=s.batch, seq=s.seq, config={**FLAGS, "step_flag_units": 4},
                    precision=HALF).load_numpy(_weights(s))
    x, h0 = _inputs(s)
    assert relative_error(list(gru(x, h0)), gru_reference(x, _weights(s), h0, 1, False)) < 5e-3


@pytest.mark.gpu
def test_cuda_build_without_a_config_runs_it():
    s = Shape(seq=9, batch=5, input=40, hidden=200, bidirectional=True)
    gru = GRU.build("cuda", s.input, s.hidden, bidirectional=True, batch=s.batch, seq=s.seq).load_numpy(_weights(s))
    assert gru.config.step_flags == 1
    x, h0 = _inputs(s)
    assert relative_error(list(gru(x, h0)), gru_reference(x, _weights(s), h0, 1, True)) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [{**FLAGS, "step_flag_units": 4},
                                   {**FLAGS, "step_tc": 1, "step_j": 16, "step_tc_rows": 16, "step_tc_kw": 2}])
def test_cuda_stage_times_of_a_flag_step_kernel_are_parts_of_the_pass(knobs):
    """Each stage is timed with its calls alone: the step kernel's stages include the init that
    resets its tags (without it the kernel polled stale tags until its spin limit, ~0.4 s)."""
    from tvm_ext.measure.builder import build_one
    from tvm_ext.measure.measure import MeasureSettings, measure
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda", 0)
    t = GruTemplate(batch=8, hidden=256, input=256, seq=16)
    if knobs.get("step_tc"):
        t = t.with_precision(HALF)
    cfg = t.default_config(target).replace(**knobs)
    build = build_one(t, cfg, target)
    assert build.ok, build.error_msg
    result = measure(t, cfg, build.artifact, target, MeasureSettings(warmup=1, repeat=3))
    assert result.ok, result.error_msg
    stages = result.metrics["stage_secs"]
    assert stages["hidden_gemm"] < 2 * result.cost and stages["cell"] < 2 * result.cost, (stages, result.cost)
