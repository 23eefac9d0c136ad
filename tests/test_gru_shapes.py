"""GRU configs at any hidden size and the persistent kernel's grid barriers.

- Split-K and the on-chip W_hh slice on hidden sizes their tiles do not divide (the
  reduction is padded to a multiple of ``step_k``): real OpenCL runs on PoCL against the
  float64 reference (and ``torch.nn.GRU`` where torch is installed).
- The analytic pick ``GRU.build`` uses without a config.
- The grid barrier kinds (``step_barrier``): generated CUDA and, where nvcc is installed,
  the PTX of the spin loop.
- ``-m gpu``: all of it on the GPU against float64, and a grid that cannot be resident
  gives the barrier's error, not a hang.
"""
from __future__ import annotations

import dataclasses
import re
import shutil
import time

import pytest
from test_gru import Shape, _close, _inputs, _weights

from tvm_ext.core.errors import TvmExtError
from tvm_ext.schedules.gru import BARRIER_TIMEOUT, GRU, GruTemplate, gru_reference
from tvm_ext.schedules.gru.fused_step import step_k_extent
from tvm_ext.lowering.step_loop import BARRIERS
from tvm_ext.target import offline_cuda

ODD = {
    "h33-3layer-bi": Shape(seq=7, batch=3, input=33, hidden=33, layers=3, bidirectional=True),
    "h200": Shape(seq=5, batch=5, input=40, hidden=200),
    "h1000": Shape(seq=3, batch=3, input=16, hidden=1000),
}
# config families whose tiles do not divide these hidden sizes
FAMILIES = {
    "split-k": dict(fuse_step=1, step_j=32, step_b=2, step_k=64, step_ks=8),
    "split-k-w-onchip": dict(fuse_step=1, step_j=8, step_b=4, step_k=16, step_ks=4, step_w_onchip=1),
    # W_hh in registers, gi and b_h loaded before the dot products
    "w-registers-prefetch": dict(fuse_step=1, step_j=16, step_b=2, step_k=32, step_ks=16, step_w_onchip=2,
                                 step_prefetch=1),
    # threads along the batch rows sharing the W slice in shared memory, the h slice double-buffered
    "row-threads-pipeline": dict(fuse_step=1, step_j=8, step_b=2, step_bt=2, step_k=16, step_ks=4,
                                 step_w_onchip=1, step_pipeline=1, step_prefetch=1),
    # two hidden units per thread (each h value serves 6 gate sums) over the W slice in shared memory
    "units-per-thread": dict(fuse_step=1, step_j=4, step_u=2, step_b=2, step_bt=2, step_k=16, step_ks=4,
                             step_w_onchip=1, step_pipeline=1),
    # the h slice in 4 buffers: fills of the next 3 slices overlap the math of this one
    "deep-pipeline": dict(fuse_step=1, step_j=16, step_b=2, step_k=16, step_ks=4, step_pipeline=3, step_prefetch=1),
}


def _build(target, s: Shape, config) -> GRU:
    return GRU.build(target, s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional,
                     batch=s.batch, seq=s.seq, config=config).load_numpy(_weights(s))


def _check(gru: GRU, s: Shape, runs: int = 1) -> None:
    x, h0 = _inputs(s)
    ref_out, ref_h = gru_reference(x, _weights(s), h0, s.layers, s.bidirectional)
    for _ in range(runs):
        out, h_n = gru(x, h0)
        _close(out, ref_out)
        _close(h_n, ref_h)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("key", list(ODD))
def test_odd_hidden_sizes_match_the_reference(opencl, key, family):
    """The k split and the W slice are padded (zeros in h, clamped W rows), so configs the
    tuned shapes use are feasible at hidden 33, 200 and 1000 and give the reference."""
    s, knobs = ODD[key], FAMILIES[family]
    assert s.hidden % knobs["step_k"] and step_k_extent(s.hidden, knobs["step_k"], knobs["step_ks"]) > s.hidden
    gru = _build(opencl, s, knobs)
    assert gru.config.step_ks == knobs["step_ks"]  # split-K as asked, not a fallback
    _check(gru, s)


def test_odd_hidden_sizes_match_torch(opencl):
    torch = pytest.importorskip("torch")
    s = ODD["h33-3layer-bi"]
    torch.manual_seed(0)
    net = torch.nn.GRU(s.input, s.hidden, num_layers=s.layers, bidirectional=True)
    gru = _build(opencl, s, FAMILIES["split-k"]).load_state_dict(net.state_dict())
    x, h0 = _inputs(s)
    with torch.no_grad():
        ref_out, ref_h = net(torch.from_numpy(x), torch.from_numpy(h0))
    out, h_n = gru(x, h0)
    _close(out, ref_out.numpy())
    _close(h_n, ref_h.numpy())


def test_padded_split_is_only_where_needed():
    """A split that divides hidden is not padded (its kernel is what it always was); the
    shared-memory need of a padded W slice counts the padded k extent."""
    assert step_k_extent(512, 64, 8) == 512 and step_k_extent(200, 64, 1) == 200  # no split-K: guards
    assert step_k_extent(200, 64, 8) == 256 and step_k_extent(33, 16, 4) == 48
    t = GruTemplate(batch=2, hidden=200, input=8, seq=3)
    target = offline_cuda()
    cfg = t.default_config(target).replace(fuse_step=1, step_j=16, step_b=2, step_k=64, step_ks=8, step_w_onchip=1)
    assert t.step_variant(cfg).shared_bytes() == 4 * (2 * 64 + 8 * 2 * 3 * 16 + 256 * 3 * 16)
    source = t.compile(cfg.replace(step_w_onchip=0), target).source
    assert "h_pad_shared" in source  # the zero-padded state slice is what is staged
    plain = t.compile(cfg.replace(step_k=8, step_w_onchip=0), target).source  # 200 % 8 == 0
    assert "h_pad" not in plain


@pytest.mark.parametrize("shape", [(1, 256, False), (8, 512, True), (4, 1000, False), (16, 256, False),
                                   (64, 1024, False), (16, 512, True), (16, 200, False), (16, 33, True),
                                   (12, 1000, False), (32, 512, False), (128, 1024, False)])
def test_analytic_pick_follows_the_measured_rules(shape, monkeypatch):
    """On a GPU, from batch 8 the tensor-core kernel exchanging tagged float32 words (step_tc 2
    with flags: 8 units a block where that grid has a block an SM at most, else 16; 16 rows, 8 k
    warps; two values a word for 8-unit blocks of full rows up to H512) wherever it fits; where it
    does not, up to batch 16 the pick is the flag-exchange persistent kernel with a grid of
    at most one block per SM wherever one fits; from batch 32 the split tensor-core kernel (16
    units on 2 warps, the fewest rows whose grid is resident); elsewhere, and where that kernel
    is not at hand, the fused split-K step kernel as a persistent kernel with
    the acquire barrier and gi prefetched: at most 256 threads per SM at small batch, all rows
    per block with W_hh's slice on chip at batch >= 32 (32 rows and the fewest units whose grid
    fits one block per SM, else all rows), W_hh in registers where the k extent is padded."""
    from tvm_ext.schedules.gru import pick
    from tvm_ext.schedules.gru.flag_step import FLAG_UNITS
    from tvm_ext.schedules.gru.pick import (FLAG_BATCH, LARGE_GEMM_TILE, MANY_ROWS_UNITS, SPLIT_FLAGS_BATCH,
                                            SPLIT_FLAGS_K_WARPS, SPLIT_FLAGS_UNITS, THREADS_PER_SM)

    batch, hidden, bidirectional = shape
    t = GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=128, bidirectional=bidirectional)
    target = offline_cuda()
    cfg, why = t.analytic_pick(target)
    assert t.space(target).is_feasible(cfg), t.space(target).infeasible_reason(cfg)
    assert cfg.fuse_step == 1 and cfg.step_loop == 2 and "persistent" in why
    space, base = t.space(target), t.default_config(target)
    tagged = [u for u in SPLIT_FLAGS_UNITS if space.is_feasible(base.replace(
        fuse_step=1, step_loop=2, step_tc=2, step_flags=1, step_j=u, step_tc_rows=16, step_tc_kw=SPLIT_FLAGS_K_WARPS,
        step_tc_nw=1, step_tc_acc=1)) and (u > 8 or -(-hidden // u) * -(-batch // 16) * (1 + bidirectional) <= 132)]
    stacked_batch, stacked_hidden = pick.SPLIT_FLAGS_STACKED  # below batch 8: h's low parts in the padding rows
    if (batch >= SPLIT_FLAGS_BATCH or batch >= stacked_batch and hidden >= stacked_hidden) and tagged:
        assert (cfg.step_tc, cfg.step_flags, cfg.step_j, cfg.step_tc_rows, cfg.step_tc_kw) == (2, 1, tagged[0], 16, 8)
        assert "tagged float32 words" in why
        pairs = tagged[0] == 8 and batch >= 16 and hidden <= pick.SPLIT_PAIRS_MAX_HIDDEN  # two a word
        assert cfg.step_split_words == (2 if pairs else 1) and ("a tag bit" in why) == pairs
        assert cfg.step_tc_stack == (batch <= 8) and ("stacked" in why) == (batch <= 8)
        monkeypatch.setattr(pick, "SPLIT_FLAGS_BATCH", 1 << 30)  # the rules below, where it is not
        monkeypatch.setattr(pick, "SPLIT_FLAGS_STACKED", (1 << 30, 0))
        cfg, why = t.analytic_pick(target)
    splits = [(rows, kw) for rows in (16, 32, 64) for kw in (4, 2, 1) if space.is_feasible(base.replace(
        fuse_step=1, step_loop=2, step_barrier=2, step_tc=2, step_j=16, step_tc_rows=rows, step_tc_nw=2,
        step_tc_kw=kw))]
    if batch >= 32 and splits:  # measured faster from B32 on, the more k warps the faster
        knobs = (cfg.step_tc, cfg.step_j, cfg.step_tc_rows, cfg.step_tc_kw, cfg.step_tc_nw, cfg.step_tc_ahead)
        assert knobs == (2, 16, *splits[0], 2, 2)
        assert "split tensor-core" in why
        monkeypatch.setattr(pick, "SPLIT_STEP_BATCH", 1 << 30)  # the CUDA-core kernel's rules, where it is not
        cfg, why = t.analytic_pick(target)
    assert cfg.step_tc == 0
    flag_grids = [t.step_variant(f).shape.blocks for f in (base.replace(fuse_step=1, step_loop=2, step_flags=1,
                                                                      step_flag_units=u) for u in FLAG_UNITS)
                  if space.is_feasible(f)]
    if batch <= FLAG_BATCH and min(flag_grids, default=133) <= 132:
        assert cfg.step_flags == 1 and t.step_variant(cfg).shape.blocks <= 132 and "no grid barrier" in why
        return
    assert cfg.step_flags == 0 and cfg.step_ks > 1
    assert cfg.step_barrier == 2 and cfg.step_prefetch == 1
    assert step_k_extent(hidden, cfg.step_k, cfg.step_ks) * 4 <= hidden * 5  # padding within 25 %
    per_sm, reason = t.step_variant(cfg).residency(target)
    assert reason is None
    padded = step_k_extent(hidden, cfg.step_k, cfg.step_ks) > hidden
    if batch >= 32:
        assert cfg.step_w_onchip == 1 and cfg.step_pipeline == 1
        assert cfg.in_split == 0 and all(cfg.as_dict()["in_" + k] == v for k, v in LARGE_GEMM_TILE.items())
        units, rows = t.step_variant(cfg).units, t.step_variant(cfg).rows
        fewer = [u for u in MANY_ROWS_UNITS if u < units]
        if rows == 32:  # the fewest units whose grid fits the 132 SMs
            assert t.step_variant(cfg).blocks <= 132 and t.step_variant(cfg).threads == 256
            assert all(t.step_variant(cfg.replace(step_j=min(u, 8), step_u=max(1, u // 8))).blocks > 132 for u in fewer)
            measured_best = {(64, 1024): (16, 8, 2), (32, 512): (4, 4, 1)}  # (units, step_j, step_u)
            if (batch, hidden) in measured_best:
                assert (units, cfg.step_j, cfg.step_u) == measured_best[batch, hidden]
        else:  # no 32-row grid fits: all rows a block
            assert rows >= batch and units == 8 and batch > 64
    else:
        assert per_sm * cfg.step_j * cfg.step_ks <= THREADS_PER_SM
        assert cfg.step_w_onchip == (2 if padded and hidden < 1000 else 0)  # 1000: 384 registers, too many
    wide = GruTemplate(batch=512, hidden=1024, input=16, seq=5, bidirectional=True)  # nothing resident
    cfg, why = wide.analytic_pick(target)
    assert cfg.fuse_step == 1 and cfg.step_loop == 0 and cfg.step_b == 8 and "per step" in why


def test_build_without_a_config_uses_the_pick(opencl):
    """``GRU.build`` without a config: the pick (CPU devices: the patent pipeline, faster on
    PoCL); on a GPU-like OpenCL device the fused split-K kernel, run here on PoCL."""
    s = ODD["h200"]
    cpu = GRU.build(opencl, s.input, s.hidden, batch=s.batch, seq=s.seq)
    assert cpu.config == GruTemplate(s.batch, s.hidden, s.input, s.seq).default_config(opencl)
    gpu_like = dataclasses.replace(opencl, is_cpu=False)
    gru = _build(gpu_like, s, None)
    assert gru.config.fuse_step == 1 and gru.config.step_ks == 8 and gru.config.step_loop == 0
    assert gru.config == gru.template.analytic_pick(gpu_like)[0]
    _check(gru, s)


def _persistent(template: GruTemplate, barrier: int):
    target = offline_cuda()
    cfg = template.default_config(target).replace(fuse_step=1, step_j=32, step_b=1, step_k=64, step_ks=8,
                                                  step_loop=2, step_barrier=barrier)
    return template.compile(cfg, target)


@pytest.mark.parametrize("barrier", range(len(BARRIERS)))
def test_barrier_kinds_in_generated_cuda(barrier):
    """Each kind polls with its own access inside the spin loop (atomics, a volatile load, an
    acquire load: never a plain load the compiler could hoist); the acquire kind arrives with
    a release add and has no trailing fence."""
    source = _persistent(GruTemplate(batch=8, hidden=512, input=16, seq=3), barrier).source
    spin = source[source.index("while (1) {"):]
    spin = spin[:spin.index("}")]
    poll = {"atomic": "atomicAdd((&(bar_ptr[0])), 0)", "volatile": "*(volatile int*)((&(bar_ptr[0])))",
            "acquire": "__nv_atomic_load_n((&(bar_ptr[0])), 2, 3)"}[BARRIERS[barrier]]
    assert poll in spin
    kernel = source[re.search(r"gru_steps_kernel\([^)]*\) \{", source).end():]
    fences = kernel.count("__threadfence()")
    assert fences == (0 if BARRIERS[barrier] == "acquire" else 2)
    assert ("__nv_atomic_fetch_add((&(bar_ptr[0])), 1, 3, 3)" in kernel) == (BARRIERS[barrier] == "acquire")


def _spin_loop_polls(ptx: str, instruction: str) -> bool:
    """Whether ``instruction`` is inside a loop of the PTX: a later branch jumps back to a
    label defined before it."""
    lines = ptx.splitlines()
    at = next(i for i, line in enumerate(lines) if instruction in line)
    labels = {line.strip().rstrip(":"): i for i, line in enumerate(lines) if re.match(r"^\$L__\w+:", line.strip())}
    for line in lines[at:]:
        jump = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", line)
        if jump and labels.get(jump.group(1), len(lines)) < at:
            return True
    return False


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("barrier", range(len(BARRIERS)))
def test_barrier_poll_stays_in_the_spin_loop(barrier):
    """nvcc's PTX: the poll is re-executed every iteration (a hoisted load would leave the
    loop spinning on a register)."""
    import tvm
    from tvm.support import nvcc

    compiled = _persistent(GruTemplate(batch=8, hidden=512, input=16, seq=3), barrier)
    with tvm.target.Target(offline_cuda().tvm_target()):
        ptx = nvcc.compile_cuda(compiled.source, target_format="ptx", compiler="nvcc")
    text = bytes(ptx).decode() if isinstance(ptx, (bytes, bytearray)) else str(ptx)
    text = text[text.index(".entry gru_steps_kernel"):]
    instruction = {"atomic": "atom.global.add", "volatile": "ld.volatile.global",
                   "acquire": "ld.acquire.gpu"}[BARRIERS[barrier]]
    arrive = "atom.add.release.gpu" if BARRIERS[barrier] == "acquire" else "atom.global.add"
    assert arrive in text
    polls = [line for line in text.splitlines() if instruction in line]
    assert polls and _spin_loop_polls(text, polls[-1].strip())


def _kernel_source(template: GruTemplate, **knobs: int) -> tuple[str, object]:
    target = offline_cuda()
    compiled = template.compile(template.default_config(target).replace(fuse_step=1, **knobs), target)
    source = compiled.source
    body = source[re.search(r"gru_steps_kernel\([^)]*\) \{", source).end():]
    return body[:body.index("\n}\n")], compiled


def test_w_registers_and_prefetch_in_generated_cuda():
    """W_hh in registers and b_h are loaded once before the step loop; the next step's gi is
    loaded after this step's work, before the barrier; the per-step form loads them per call."""
    t = GruTemplate(batch=1, hidden=256, input=16, seq=5)
    knobs = dict(step_j=32, step_b=1, step_k=64, step_ks=8, step_w_onchip=2, step_prefetch=1, step_barrier=2)
    kernel, _ = _kernel_source(t, step_loop=2, **knobs)
    loop = kernel.index("for (int s = 0; s < 5; ++s)")
    assert kernel.index("w_regs_local_ptr[95] = ") < loop  # 3 gates x 256/8 k: one thread's share
    assert kernel.index("bias_pre_local_ptr[2] = ") < loop and kernel.index("gi_pre_local_ptr[2] = ") < loop
    ahead = kernel.index("if (s < 4) {", loop)
    assert kernel.index("gi_pre_local_ptr[0] = ", ahead) < kernel.index("__nv_atomic_fetch_add", ahead)
    assert "w_regs_local_ptr[" not in kernel[loop:].split("=")[0]  # never refilled in the loop
    assert kernel[loop:].count("w_regs_local_ptr[0] =") == 0


def test_row_threads_and_pipeline_in_generated_cuda():
    """Row threads (threadIdx.z) share a W slice in dynamic shared memory, and the pipelined h
    slice is filled with cp.async (all shared memory dynamic: one launch-time size)."""
    t = GruTemplate(batch=64, hidden=1024, input=16, seq=3)
    knobs = dict(step_j=8, step_b=8, step_bt=8, step_k=64, step_ks=4, step_w_onchip=1, step_pipeline=1,
                 step_prefetch=1, step_loop=2, step_barrier=2)
    kernel, compiled = _kernel_source(t, **knobs)
    assert "threadIdx.z" in kernel and "cp_async" in kernel
    assert "extern __shared__" in kernel and "__shared__ alignas" not in kernel  # no static arrays
    (launch,), _ = compiled.launches["gru_steps"]
    assert launch.block == (8, 4, 8)
    cfg = t.default_config(offline_cuda()).replace(fuse_step=1, **knobs)
    shared = t.step_variant(cfg).shared_bytes()
    assert launch.dyn_shared_bytes == shared == 4 * (1024 * 3 * 8 + 2 * 64 * 64 + 4 * 64 * 3 * 8)
    assert "wait_group_2" not in kernel


def test_units_per_thread_and_deep_pipeline_in_generated_cuda():
    """``step_u`` units per thread: the same 8-unit W slice with half the threads along the
    units (a grid of the same 128 blocks); ``step_pipeline`` 3: four h-slice buffers and
    cp.async waits that leave up to 3 fills in flight."""
    t = GruTemplate(batch=64, hidden=1024, input=16, seq=3)
    knobs = dict(step_j=4, step_u=2, step_b=8, step_bt=8, step_k=64, step_ks=8, step_w_onchip=1, step_pipeline=3,
                 step_prefetch=1, step_loop=2, step_barrier=2)
    kernel, compiled = _kernel_source(t, **knobs)
    (launch,), _ = compiled.launches["gru_steps"]
    assert launch.block == (4, 8, 8) and launch.grid[0] == 128
    cfg = t.default_config(offline_cuda()).replace(fuse_step=1, **knobs)
    assert t.step_variant(cfg).blocks == 128
    shared = t.step_variant(cfg).shared_bytes()
    assert launch.dyn_shared_bytes == shared == 4 * (1024 * 3 * 8 + 4 * 64 * 64 + 8 * 64 * 3 * 8)
    assert "wait_group_3" in kernel and "wait_group_4" not in kernel
    assert "gi_pre_local_ptr[47] = " in kernel  # 3 gates x 2 units x 8 rows prefetched per thread


def test_new_step_knobs_are_refused_with_their_reasons():
    t = GruTemplate(batch=8, hidden=512, input=16, seq=3)
    target = offline_cuda()
    space = t.space(target)
    base = t.default_config(target).replace(fuse_step=1, step_j=32, step_b=1, step_k=64, step_ks=8, step_loop=2)
    assert space.is_feasible(base.replace(step_w_onchip=2))  # 192 registers of W per thread, 1 block per SM
    assert "needs split-K" in space.infeasible_reason(base.replace(step_w_onchip=2, step_ks=1, step_k=32))
    assert "W_hh in registers needs 384" in space.infeasible_reason(base.replace(step_w_onchip=2, step_ks=4))
    two_per_sm = GruTemplate(batch=8, hidden=512, input=16, seq=3, bidirectional=True)  # 256 blocks
    assert "> 128" in two_per_sm.space(target).infeasible_reason(base.replace(step_w_onchip=2))
    assert "rows per block for batch 8 (half of them idle)" in space.infeasible_reason(
        base.replace(step_b=4, step_bt=4))
    wide = GruTemplate(batch=64, hidden=1024, input=16, seq=3)  # static: 2 x 64 x 64 h + partials > 48 KiB
    pipelined = base.replace(step_j=8, step_b=8, step_bt=8, step_ks=4, step_pipeline=1, step_loop=0)
    assert "exceed shared memory" in wide.space(target).infeasible_reason(pipelined)
    assert wide.space(target).is_feasible(pipelined.replace(step_w_onchip=1))  # all dynamic with the W slice


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("barrier", range(len(BARRIERS)))
@pytest.mark.parametrize("key", ["h33-3layer-bi", "h200", "h1000"])
def test_cuda_odd_hidden_persistent_barriers(key, barrier):
    """Padded split-K in the persistent kernel with each barrier kind: the reference answer
    on reruns (a race would move the error), the barrier never timed out."""
    s = ODD[key]
    _check(_build("cuda", s, {**FAMILIES["split-k"], "step_loop": 2, "step_barrier": barrier}), s, runs=3)


@pytest.mark.gpu
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "split-k"])
@pytest.mark.parametrize("key", list(ODD))
def test_cuda_odd_hidden_persistent_families(key, family):
    """W on chip (shared memory, registers), gi/b_h prefetched a step ahead, row threads and
    the pipelined h slice in the persistent kernel: the reference answer on reruns."""
    s = ODD[key]
    _check(_build("cuda", s, {**FAMILIES[family], "step_loop": 2, "step_barrier": 2}), s, runs=3)


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(ODD))
def test_cuda_build_without_a_config(key):
    s = ODD[key]
    gru = _build("cuda", s, None)
    assert gru.config == gru.template.analytic_pick(gru.target)[0] and gru.config.fuse_step == 1
    _check(gru, s, runs=2)


@pytest.mark.gpu
def test_cuda_grid_that_cannot_be_resident_is_an_error_not_a_hang(tmp_path):
    """A target claiming 4096 SMs lets a grid of 1120 blocks of 256 threads through the
    residency check; the H100 holds at most 8 such blocks on each of its SMs, so blocks wait
    at a barrier for blocks that never start: the barrier times out, the layer raises its
    error and the runner records it (within seconds: the spin limit bounds every wait)."""
    from tvm_ext.measure.builder import build_one
    from tvm_ext.core.errors import ErrorKind
    from tvm_ext.measure.measure import MeasureSettings, measure
    from tvm_ext.target import resolve_target

    real = resolve_target("cuda")
    fake = dataclasses.replace(real, compute_units=4096)
    s = Shape(seq=2, batch=35, input=16, hidden=1024)  # 32 x 35 = 1120 blocks > 132 x 8
    knobs = dict(fuse_step=1, step_j=32, step_b=1, step_k=64, step_ks=8, step_loop=2, step_barrier=2)
    gru = _build(fake, s, knobs)
    start = time.perf_counter()
    with pytest.raises(TvmExtError, match="grid barrier timed out"):
        gru(*_inputs(s))
    assert time.perf_counter() - start < 120
    t = gru.template
    build = build_one(t, gru.config, fake)
    assert build.ok, build.error_msg
    result = measure(t, build.config, build.artifact, fake, MeasureSettings(warmup=1, repeat=1, min_repeat_secs=0.0))
    assert result.error_kind == ErrorKind.RUN_ERROR and result.error_msg == BARRIER_TIMEOUT


def test_probe_script_configs_are_feasible(monkeypatch):
    """``benchmarks/probes/gru_probe.py`` (how the GRU figures in RESULTS.md were measured) imports
    without a GPU and every config it times is feasible on the H100's limits."""
    import importlib.util
    import pathlib
    import sys

    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "probes" / "gru_probe.py"
    spec = importlib.util.spec_from_file_location("bench_gru_probe", path)
    probe = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_gru_probe", probe)
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec.loader.exec_module(probe)
    target = offline_cuda()
    for case in probe.CASES:
        t = GruTemplate(batch=case.batch, hidden=case.hidden, input=case.hidden, seq=case.seq, layers=case.layers,
                        bidirectional=case.bidirectional)
        assert any(isinstance(e, tuple) and e[0] == probe.PICK for e in case.configs)
        for entry in case.configs:
            if isinstance(entry, tuple):
                cfg = t.analytic_pick(target)[0].replace(**entry[1])
            else:
                cfg = t.default_config(target).replace(**entry)
            assert t.space(target).is_feasible(cfg), (case.label, entry, t.space(target).infeasible_reason(cfg))
