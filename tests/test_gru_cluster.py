"""The GRU's cluster step kernel (``step_flags`` 2): the generated CUDA (cluster launch,
distributed shared memory stores, a cluster barrier a step, no polling), nvcc here, the space's
refusals with their reasons, and ``-m gpu`` runs against float64 (odd sizes, both directions,
several layers, float16, repeated calls on NaN-poisoned outputs)."""
from __future__ import annotations

import re
import shutil

import pytest
from gru_checks import assert_reruns_match_float64, steps_kernel_ptxas
from test_gru import Shape, _inputs, _weights
from test_gru_flags import HALF, _kernel, _template

from tvm_ext.precision.precision import relative_error
from tvm_ext.schedules.gru import GRU, gru_reference
from tvm_ext.target import offline_cuda

CLUSTER = dict(fuse_step=1, step_loop=2, step_flags=2)


def _compiled(template, units, pull=0):
    target = offline_cuda("sm_90")
    cfg = template.default_config(target).replace(**CLUSTER, step_flag_units=units, step_cluster_pull=pull)
    assert template.space(target).is_feasible(cfg), template.space(target).infeasible_reason(cfg)
    return template.compile(cfg, target)


def test_generated_cuda_exchanges_h_through_the_clusters_shared_memory():
    """h' goes to every block of the cluster through ``st.async`` stores that count their bytes
    on the receiver's barrier of that slot, the lanes of a row sharing the peers (B1 H256, 8
    blocks of 32 units: lane l stores into block l; B8 H64, 8 blocks of 8 units: 4 lanes a row,
    2 peers each); a step waits on its slot's barrier (a bounded poll), one thread arms the next
    slot's for batch x hidden x 4 bytes, no cluster-wide barrier runs inside the step loop,
    nothing is polled or counted in global memory, and W_hh is read before the loop only."""
    for batch, hidden, stores in ((1, 256, 1), (8, 64, 2)):
        body = _kernel(_compiled(_template(batch, hidden), 8 if batch == 8 else 32).source)
        loop = body.index("for (int s = 0; s < 5; ++s)")
        assert body[loop:].count("tvm_builtin_ptx_st_async_shared__cluster_mbarrier__complete_tx__bytes_f32(") == stores
        assert body[:loop].count("tvm_builtin_ptx_mapa_u32_shared__cluster_u32(") == 2 * stores  # h and barriers
        assert f"(uint){batch * hidden * 4});" in body[loop:]  # the bytes a slot expects
    compiled = _compiled(_template(1, 256), 32)
    body = _kernel(compiled.source)
    loop, end = body.index("for (int s = 0; s < 5; ++s)"), body.rindex("tvm_builtin_ptx_barrier_cluster_arrive")
    assert body[:loop].count("tvm_builtin_ptx_mbarrier_init_init_shared__cta_b64(") == 2
    assert body[loop:end].count("tvm_builtin_ptx_mbarrier_try_wait_parity_no_hint") == 1
    assert body[loop:end].count("tvm_builtin_ptx_mbarrier_arrive_expect_tx") == 1
    assert "barrier_cluster" not in body[loop:end] and "__syncthreads" not in body[loop:end]
    assert "__nv_atomic" not in body and "atomicAdd" not in body
    assert re.search(r"\bw_ptr\[", body[:loop]) and not re.search(r"\bw_ptr\[", body[loop:])
    calls = [(c.func, c.args) for c in compiled.calls]
    assert ("gru_init", ("h0", 0, "hs", "bar")) in calls  # h0 into the state; the timed-out flag reset
    assert ("gru_steps", ("gi", "hs", "w_hh0", "b_hh0", 0, "out", "h_n", "bar")) in calls


def test_quads_gather_a_blocks_h_and_store_it_four_values_an_st_async():
    """``step_cluster_quads`` 1: the lanes holding a row's h' put it in the block's shared memory,
    and after a block barrier one thread a (peer, row, quad of the block's units) stores four
    values with one ``st.async.v4`` (B5 H200, 13 blocks of 16 units: the last quads past the
    hidden size are not sent, so a slot expects 5 rows x 50 quads x 16 bytes); no value is stored
    alone, and the config's other knobs are as without it."""
    target = offline_cuda("sm_90")
    template = _template(5, 200)
    cfg = template.default_config(target).replace(**CLUSTER, step_flag_units=16)
    plain, quads = (_kernel(template.compile(cfg.replace(step_cluster_quads=q), target).source) for q in (0, 1))
    loop = quads.index("for (int s = 0; s < 5; ++s)")
    assert quads[loop:].count("tvm_builtin_ptx_st_async_vec_shared__cluster_mbarrier__complete_tx__bytes_v4_f32(") == 1
    assert "complete_tx__bytes_f32(" not in quads
    assert f"(uint){5 * 50 * 16});" in quads[loop:] and f"(uint){5 * 200 * 4});" in plain
    assert quads[:loop].count("tvm_builtin_ptx_mapa_u32_shared__cluster_u32(") == 2  # one peer a thread
    assert "step_cluster_quads" in template.shown_knobs(cfg)
    flags = cfg.replace(step_flags=1)
    assert "step_cluster_quads" not in template.shown_knobs(flags)


def test_pull_keeps_h_in_its_writers_block_and_polls_remote_loads_of_it():
    """``step_cluster_pull`` 1: the lane of a row stores h' as one (value, step) word into its own
    block's slot with a relaxed cluster-scope store, nothing goes into a peer; a step pulls each
    word of h with a relaxed load from the owning block's shared memory (its rank the unit's
    block), polled until its tag is the step (the bounded poll raising the timed-out flag), then
    one block barrier; no mbarrier is set up or waited on (B5 H200, 13 blocks of 16 units: 1000
    words, two a thread of 512)."""
    template = _template(5, 200)
    target = offline_cuda("sm_90")
    cfg = template.default_config(target).replace(**CLUSTER, step_flag_units=16)
    push, pull = (_kernel(template.compile(cfg.replace(step_cluster_pull=p), target).source) for p in (0, 1))
    loop, end = pull.index("for (int s = 0; s < 5; ++s)"), pull.rindex("tvm_builtin_ptx_barrier_cluster_arrive")
    step = pull[loop:end]
    assert step.count("tvm_builtin_ptx_ld_relaxed_cluster_shared__cluster_b64(") == 2  # two words a thread
    assert step.count("tvm_builtin_ptx_mapa_u32_shared__cluster_u32(") == 2
    assert "& 15))]" in step and ">> 4)));" in step  # the unit's word in its block, that block's rank
    assert step.count("tvm_builtin_ptx_st_shared__cta_b32(") == 2  # the words' values into this block's h
    assert step.count("tvm_builtin_ptx_st_relaxed_cluster_shared__cta_b64(") == 1
    assert step.count("__syncthreads()") == 1 and ">> (uint64_t)32ULL)) == s)" in step and "2097152" in step
    assert "st_async" not in pull and "mbarrier" not in pull and "st_async" in push and "mbarrier" in push
    assert "step_cluster_pull" in template.shown_knobs(cfg.replace(step_cluster_pull=1))
    flags = cfg.replace(step_flags=1, step_flag_units=8)
    assert "step_cluster_pull" not in template.shown_knobs(flags)


def test_the_cluster_is_launched_with_the_blocks_of_a_direction():
    """The kernel's launch tags carry the cluster size (``clusterCtaIdx.x``: TVM's runtime then
    launches with ``cuLaunchKernelEx`` and the cluster dimension), one cluster per direction."""
    compiled = _compiled(_template(3, 33, bidirectional=True), 8)  # 5 blocks of 8 units a direction
    script = compiled.modules["gru_steps"].script()
    assert 'T.launch_thread("clusterCtaIdx.x", 5)' in script
    assert 'T.launch_thread("blockIdx.x", 5)' in script and 'T.launch_thread("blockIdx.y", 2)' in script


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("batch, hidden, units, bidirectional, pull", [
    (1, 256, 16, False, 0), (5, 200, 16, False, 0), (3, 33, 8, True, 0), (8, 64, 8, False, 0),
    (1, 256, 16, False, 1), (3, 33, 8, True, 1)])
def test_nvcc_compiles_the_kernel_for_sm_90_without_spills(tmp_path, batch, hidden, units, bidirectional, pull):
    compiled = _compiled(_template(batch, hidden, bidirectional=bidirectional), units, pull)
    assert " 0 bytes spill stores" in steps_kernel_ptxas(compiled.source, tmp_path)


@pytest.mark.parametrize("template, knobs, reason", [
    (_template(1, 1024), dict(step_flag_units=32), "cluster of 32 blocks > 16"),
    (_template(1, 512), dict(step_flag_units=16), "cluster of 32 blocks > 16"),
    (_template(33, 64), dict(step_flag_units=8), "batch 33 > 32"),
    (_template(16, 256), dict(step_flag_units=32), "registers a thread"),  # 1024 threads: 64 registers each
    (_template(2, 64), dict(step_flag_units=8, step_loop=1), "persistent kernel only"),
    (_template(2, 64), dict(step_flag_units=12), "allowed: (4, 8, 16, 32)"),
    (_template(2, 64), dict(step_flag_units=8, step_cluster_pull=1, step_cluster_quads=1), "pulls h"),
])
def test_space_refuses_with_the_reason(template, knobs, reason):
    target = offline_cuda("sm_90")
    cfg = template.default_config(target).replace(**{**CLUSTER, **knobs})
    why = template.space(target).infeasible_reason(cfg)
    assert why is not None and reason in why, why


def test_gpus_without_clusters_and_the_tensor_core_kernel_refuse_it():
    from tvm_ext.target import resolve_target

    t = _template(2, 64)
    ampere = offline_cuda("sm_80")
    cfg = t.default_config(ampere).replace(**CLUSTER, step_flag_units=8)
    assert "needs thread-block clusters (sm_90+), not sm_80" in t.space(ampere).infeasible_reason(cfg)
    opencl = resolve_target("opencl")
    assert "CUDA" in t.space(opencl).infeasible_reason(t.default_config(opencl).replace(**CLUSTER))
    half = t.with_precision(HALF)
    hopper = offline_cuda("sm_90")
    tc = half.default_config(hopper).replace(**CLUSTER, step_tc=1, step_j=16)
    assert "not in a cluster" in half.space(hopper).infeasible_reason(tc)


def test_other_step_knobs_do_not_change_it_and_are_not_shown():
    t = _template(1, 256)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**CLUSTER, step_flag_units=32)
    other = cfg.replace(step_j=64, step_b=4, step_ks=16, step_barrier=0)
    assert t.space(target).is_feasible(other)
    assert _kernel(t.compile(cfg, target).source) == _kernel(t.compile(other, target).source)
    shown = t.shown_knobs(cfg)
    assert "step_flags" in shown and "step_flag_units" in shown and "step_j" not in shown


GPU_CASES = {
    "b1-h256": (Shape(seq=9, batch=1, input=256, hidden=256), 32),
    "b1-h256-u16-t128": (Shape(seq=128, batch=1, input=256, hidden=256), 16),
    "b8-h256-u16": (Shape(seq=9, batch=8, input=256, hidden=256), 16),
    "b5-h200": (Shape(seq=9, batch=5, input=40, hidden=200), 16),
    "b3-h33-3layer-bi": (Shape(seq=7, batch=3, input=33, hidden=33, layers=3, bidirectional=True), 8),
    "b2-h100-bi-batch-first": (Shape(seq=6, batch=2, input=24, hidden=100, bidirectional=True, batch_first=True), 16),
    "b8-h64": (Shape(seq=5, batch=8, input=64, hidden=64), 8),
}


@pytest.mark.gpu
@pytest.mark.parametrize("quads, pull", [(0, 0), (1, 0), (0, 1)])
@pytest.mark.parametrize("key", list(GPU_CASES))
def test_cuda_cluster_step_matches_float64(key, quads, pull):
    """Against float64 on reruns with the same input (a value read before its block wrote it
    would move the error) and on a second input (nothing of the first call is read); h' stored
    a value or four values an ``st.async``, or pulled from its writer's block."""
    s, units = GPU_CASES[key]
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch,
                    seq=s.seq, batch_first=s.batch_first,
                    config={**CLUSTER, "step_flag_units": units, "step_cluster_quads": quads,
                            "step_cluster_pull": pull}).load_numpy(_weights(s))
    assert gru.config.step_flags == 2 and gru.config.step_cluster_quads == quads
    assert gru.config.step_cluster_pull == pull
    for seed in (1, 2):
        x, h0 = _inputs(s, seed)
        assert_reruns_match_float64(gru, s, x, h0, 1e-5, 1e-9)


@pytest.mark.gpu
def test_cuda_cluster_step_in_float16():
    s = Shape(seq=9, batch=2, input=128, hidden=128)
    gru = GRU.build("cuda", s.input, s.hidden, batch=s.batch, seq=s.seq, precision=HALF,
                    config={**CLUSTER, "step_flag_units": 16}).load_numpy(_weights(s))
    x, h0 = _inputs(s)
    ref = gru_reference(x, _weights(s), h0, 1, False)
    assert relative_error(list(gru(x, h0)), ref) < 5e-3
