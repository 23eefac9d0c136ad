"""The GRU's tensor-core persistent step kernel (``step_tc``): generated CUDA and nvcc here,
the space's refusals with their reasons, and ``-m gpu`` runs against float64 at shapes whose
batch and hidden size its tiles do not divide."""
from __future__ import annotations

import re
import shutil

import pytest
from gru_checks import assert_reruns_match_float64
from test_gru import Shape, _inputs, _weights

from tvm_ext.precision.precision import relative_error
from tvm_ext.schedules.gru import GRU, GruTemplate, gru_reference
from tvm_ext.schedules.gru.tensor_core_step import TcStepShape, w_chunk
from tvm_ext.target import offline_cuda

HALF = {name: "float16" for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}
BF16 = {name: "bfloat16" for name in HALF}
TC = dict(fuse_step=1, step_loop=2, step_barrier=2, step_tc=1)


def _template(batch: int, hidden: int, seq: int = 5, layers: int = 1, bidirectional: bool = False,
              precision: dict | None = None) -> GruTemplate:
    return GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=seq, layers=layers,
                       bidirectional=bidirectional).with_precision(HALF if precision is None else precision)


def _kernel(source: str, name: str = "gru_steps") -> str:
    body = source[re.search(name + r"_kernel\([^)]*\) \{", source).end():]
    return body[:body.index("\n}\n")]


def _one_k_warp(pick):
    """B64 H1024's block as picked before k was split over two warps: 32 units on 4 unit warps,
    one k warp, the fragments of its first 16 k slices held (96 registers, from shared memory)."""
    return pick.replace(step_tc_kw=1, step_tc_wreg=2, step_tc_wregs=96)


def _loads_and_multiplies(code: str, trans: bool = False) -> str:
    """The order of ``code``'s ldmatrix loads (L; with ``trans``, T for an ``x4.trans`` one) and
    mma.sync (M)."""
    marks = re.finditer(r"(ldmatrix\.sync\.aligned\.m8n8\.x4\.trans)|(ldmatrix\.sync\.aligned\.m8n8\.x\d)|"
                        r"mma\.sync\.aligned", code)
    return "".join("T" if trans and m.group(1) else "L" if m.group(1) or m.group(2) else "M" for m in marks)


def test_generated_cuda_loads_w_once_and_runs_mma_per_step():
    """W_hh's slice is copied to shared memory before the step loop and never again; each step
    loads h (ldmatrix), transposes W tiles (ldmatrix .trans) and multiplies with mma.sync:
    H 64 over 2 k warps is 2 k slices a warp, x 6 n8 tiles (16 units x 3 gates)."""
    t = _template(8, 64)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**TC, step_j=16, step_tc_rows=16, step_tc_kw=2)
    assert t.space(target).is_feasible(cfg)
    kernel = _kernel(t.compile(cfg, target).source)
    loop = kernel.index("for (int s = 0; s < 5; ++s)")
    assert "w_ptr" in kernel[:loop] and "w_ptr" not in kernel[loop:]
    step = kernel[loop:]
    assert step.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16") == 2
    assert step.count("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") == 2 * 3
    assert step.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 2 * 6
    assert "__nv_atomic_fetch_add" in step  # the acquire/release grid barrier, every step


def test_warps_splitting_the_units_share_the_blocks_h_and_multiply_all_k():
    """``step_tc_nw`` 4 at B64 H1024, 32 units a block: 4 warps of 8 units each (128 threads);
    each polls a quarter of the block's 16 rows x 1024 k of h (16 x 256 / 2 words, 64 a
    lane, two a load), the block meets once before the products, and a warp's 3 n8 tiles (its units'
    three gates) take a pair and a lone tile a k slice (64 of them, all k: no partial sums)."""
    target = offline_cuda("sm_90")
    t = _template(64, 1024, seq=128).with_tensor_cores(target)
    cfg = _one_k_warp(t.analytic_pick(target)[0]).replace(step_tc_wreg=0)  # W read from shared memory every step
    assert (cfg.step_j, cfg.step_tc_rows, cfg.step_tc_kw, cfg.step_tc_nw, cfg.step_tc_poll) == (32, 16, 1, 4, 16)
    source = t.compile(cfg, target).source
    assert "__launch_bounds__(128) gru_steps_kernel" in source
    kernel = _kernel(source)
    step = kernel[kernel.index("for (int s = 0; s < 128"):]
    assert step.count("tvm_builtin_ptx_ld_vec_relaxed_gpu_v2_u64(got_ptr") == 32 and step.count("while (1)") == 1
    assert "__nv_atomic_load_n((&(hx_ptr[" not in step
    assert step.count("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") == 64
    assert step.count("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16") == 64
    assert step.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 64 * 3
    assert step.count("__syncthreads()") == 2  # after the poll, and before the next step's h
    assert "part" not in kernel


@pytest.mark.parametrize("sets", [1, 2, 4])
def test_k_slices_take_turns_in_the_accumulator_sets(sets):
    """``step_tc_acc``: a warp's 64 k slices at B64 H1024 go round-robin into that many sets of
    its 3 n8 tiles' accumulators (64 / sets mma.sync each), folded into the first set before
    the cell; one set is the kernel as it was (no fold)."""
    target = offline_cuda("sm_90")
    t = _template(64, 1024, seq=128).with_tensor_cores(target)
    cfg = _one_k_warp(t.analytic_pick(target)[0]).replace(step_tc_acc=sets)
    assert t.space(target).is_feasible(cfg)
    kernel = _kernel(t.compile(cfg, target).source)
    step = kernel[kernel.index("for (int s = 0; s < 128"):]
    outputs = re.findall(r'"=f"\(\(\(float \*\)\(acc_ptr \+ (\d+)\)\)\[0\]\)', step)
    counts = {int(k): outputs.count(k) for k in set(outputs)}
    assert counts == {4 * tile: 64 // sets for tile in range(3 * sets)}
    folds = re.findall(r"acc_ptr\[(\d+)\] = \(acc_ptr\[\1\] \+ acc_ptr\[(\d+)\]\);", step)
    assert sorted((int(a), int(b)) for a, b in folds) == sorted(
        (i, j * 12 + i) for i in range(12) for j in range(1, sets))


@pytest.mark.parametrize("ahead", [0, 1])
def test_fragments_loaded_a_k_slice_ahead(ahead):
    """``step_tc_frag`` 1: in each h chunk the first two k slices' fragments are loaded, then every
    slice's three mma.sync follow the next slice's loads (0: A and a pair of B tiles, their two
    multiplies, the third tile and its multiply), so a slice's ldmatrix latency runs behind the
    previous slice's multiplies."""
    target = offline_cuda("sm_90")
    t = _template(64, 1024, seq=128).with_tensor_cores(target)
    cfg = _one_k_warp(t.analytic_pick(target)[0]).replace(step_tc_frag=ahead, step_tc_wreg=0)
    kernel = _kernel(t.compile(cfg, target).source)
    step = kernel[kernel.index("for (int s = 0; s < 128"):]
    order = _loads_and_multiplies(step)
    chunk = "LLL" + "LLLMMM" * 15 + "MMM" if ahead else "LLMMLM" * 16  # 16 k slices a chunk
    assert order == chunk * 4


def test_w_fragments_held_in_registers():
    """``step_tc_wreg`` 1 at float16 B8 H512 with 16 units on 4 k warps (8 k slices and 6 n8
    tiles a warp): the warp's 24 pairs of W fragments are loaded once before the step loop, and
    each k slice of a step is one ldmatrix of h and its six mma.sync (0: one load of h and three
    of W pairs, the multiplies between them, every slice of every step); the pick's 8 units (3
    n8 tiles) hold a pair and the last tile of each slice, three mma.sync a slice."""
    target = offline_cuda("sm_90")
    t = _template(8, 512, seq=128).with_tensor_cores(target)
    pick = t.analytic_pick(target)[0]
    assert (pick.step_j, pick.step_tc_kw, pick.step_tc_nw, pick.step_tc_wreg) == (8, 4, 1, 1)
    orders, w_loads = {}, {}
    for held in (0, 1):
        kernel = _kernel(t.compile(pick.replace(step_j=16, step_tc_wreg=held), target).source)
        top = kernel.index("for (int s = 0; s < 128")
        orders[held] = _loads_and_multiplies(kernel[top:], trans=True)
        w_loads[held] = kernel[:top].count(".trans")
    assert orders == {0: "LTMMTMMTMM" * 8, 1: "LMMMMMM" * 8}
    assert w_loads[1] - w_loads[0] == 24
    kernel = _kernel(t.compile(pick, target).source)
    top = kernel.index("for (int s = 0; s < 128")
    assert _loads_and_multiplies(kernel[top:]) == "LMMM" * 8 and kernel[:top].count(".trans") == 8 * 2


def test_w_fragments_of_the_first_k_slices_held_where_all_do_not_fit():
    """``step_tc_wreg`` 2 at float16 B64 H1024 on one k warp (32 units on 4 unit warps: 3 n8 tiles and 64
    k slices a warp, 384 registers for all): the first 16 k slices' fragments (96 registers) are
    loaded once before the step loop, and in every step those slices take one ldmatrix of h and
    three mma.sync, the other 48 their pair and last tile from shared memory as before."""
    target = offline_cuda("sm_90")
    t = _template(64, 1024, seq=128).with_tensor_cores(target)
    pick = _one_k_warp(t.analytic_pick(target)[0])
    assert (pick.step_j, pick.step_tc_kw, pick.step_tc_nw, pick.step_tc_wreg) == (32, 1, 4, 2)
    kernel = _kernel(t.compile(pick, target).source)
    top = kernel.index("for (int s = 0; s < 128")
    assert _loads_and_multiplies(kernel[top:]) == "LMMM" * 16 + "LLMMLM" * 48
    assert kernel[:top].count(".trans") == 16 * 2  # a pair and the last tile of each held slice


def test_w_fragments_loaded_from_global_memory_leave_their_rows_out_of_shared_memory():
    """``step_tc_wreg`` 3 at float16 B64 H1024's pick (32 units on 4 unit warps and 2 k warps: 3 n8
    tiles and 32 k slices a warp, 160 registers for W): the fragments of each k warp's first 26
    slices come from ``w`` in global memory before the step loop (no ldmatrix there), and only the
    other 6 slices of each k warp have rows in shared memory (2 x 6 x 16 of 1024), read every step
    as the pair and last tile of before; the k warps' partial sums then fit beside them."""
    target = offline_cuda("sm_90")
    t = _template(64, 1024, seq=128).with_tensor_cores(target)
    pick = t.analytic_pick(target)[0]
    assert (pick.step_j, pick.step_tc_kw, pick.step_tc_nw, pick.step_tc_wreg, pick.step_tc_wregs) == (32, 2, 4, 3, 160)
    shape = t.step_variant(pick).shape
    assert (shape.held_slices, shape.w_rows, shape.threads) == (26, 2 * 6 * 16, 256)
    assert shape.shared_bytes() == (192 * 96 + 16 * 1032) * 2 + 4 * 3 * 4 * 32 * 4
    assert not t.space(target).is_feasible(pick.replace(step_tc_wreg=2))  # all rows: 235776 B
    kernel = _kernel(t.compile(pick, target).source)
    top = kernel.index("for (int s = 0; s < 128")
    assert "ldmatrix" not in kernel[:top] and "w_ptr" in kernel[:top] and "w_ptr" not in kernel[top:]
    assert _loads_and_multiplies(kernel[top:]) == "LMMM" * 26 + "LLMMLM" * 6
    # the shared rows of the slices read every step: k warp 1's first such slice right after k warp 0's
    assert [shape.w_k(r) for r in (0, 95, 96, 191)] == [416, 511, 928, 1023]
    assert all(shape.w_row(shape.w_k(r), shape.w_k(r) // 512) == r for r in range(192))


@pytest.mark.parametrize("batch, hidden, held, why", [
    (8, 512, 1, "its fragments held"), (64, 512, 1, "its fragments held"), (5, 200, 1, "its fragments held"),
    (32, 1024, 2, "the fragments of 8 of a warp's 16 k slices held"),
    (64, 1024, 3, "the fragments of 26 of a warp's 32 k slices loaded into registers from global memory")])
def test_the_pick_holds_w_in_registers_where_a_lanes_share_fits(batch, hidden, held, why):
    """8 or 16 units on 4 k warps up to H512 (96 registers a lane or fewer): W's fragments held,
    two accumulator sets; at H1024 (192 or 384 a lane) those of the warp's first k slices that
    fit in 96, one set."""
    target = offline_cuda("sm_90")
    t = _template(batch, hidden, seq=16).with_tensor_cores(target)
    pick, reason = t.analytic_pick(target)
    assert pick.step_tc == 1 and (pick.step_tc_wreg, pick.step_tc_acc) == (held, 2 if held == 1 else 1)
    assert t.space(target).is_feasible(pick)
    assert why in reason


@pytest.mark.parametrize("batch, split, stored", [(8, False, 6), (9, False, 12), (8, True, 12)])
def test_k_warps_pass_on_no_partial_sums_of_padding_rows(batch, split, stored):
    """8 units on 4 k warps: a later k warp's lane stores its partial sums (3 n8 tiles x 4
    elements) for the first to add; at batch 8 or less rows 8-15 of every block are padding
    and with 16-bit state only elements 0 and 1 (rows 0-7) go; with float32 parts all do."""
    target = offline_cuda("sm_90")
    t = GruTemplate(batch=batch, hidden=64, input=64, seq=5)
    t = t if split else t.with_precision(HALF)
    cfg = t.default_config(target).replace(**{**TC, "step_tc": 2 if split else 1}, step_flags=1, step_j=8,
                                           step_tc_rows=16, step_tc_kw=4, step_tc_nw=1)
    assert t.space(target).is_feasible(cfg), t.space(target).infeasible_reason(cfg)
    step = _kernel(t.compile(cfg, target).source)
    sums = re.findall(r"\(\(float\*\)buf_dyn_shmem_ptr\)\[[^]]*\] = acc_ptr\[(\d+)\];", step)
    assert len(sums) == stored and (stored == 12 or {int(i) % 4 for i in sums} == {0, 1})


def test_cell_computes_z_and_h_once_per_element():
    """The cell's update gate and h' go into registers once per (row, unit) element and every
    store reads them: nvcc merged none of the copies the stores (h's word, the output, h_n)
    each carried, nor the blend's two of z (36 exp a lane a step at the pick, now 8: r and z
    of its 4 elements; one tanh each)."""
    target = offline_cuda("sm_90")
    t = _template(64, 1024, seq=128).with_tensor_cores(target)
    step = _kernel(t.compile(t.analytic_pick(target)[0], target).source)
    step = step[step.index("for (int s = 0; s < 128"):]
    assert (step.count("expf("), step.count("tanhf(")) == (2 * 4, 4)
    assert step.count("h_val_ptr[1] = ") == step.count("h_val_ptr[0] = ") == 4


def test_bfloat16_operands_use_the_bf16_mma():
    t = _template(3, 40, precision=BF16)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**TC, step_j=16, step_tc_rows=16, step_tc_kw=1)
    kernel = _kernel(t.compile(cfg, target).source)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in kernel


def test_bfloat16_gate_gemms_get_mma_tiles():
    """bfloat16 x and W_ih (and h, W_hh) take mma.sync tiles like float16: the input GEMM of a
    bfloat16 GRU ran on the CUDA cores before (B64 H1024: 2.16 ms against 0.80 in float16)."""
    target = offline_cuda("sm_90")
    t = _template(64, 1024, precision=BF16).with_tensor_cores(target)
    assert t.in_tensor_core is not None and t.hid_tensor_core is not None
    assert t.input_gemm(0).uses_tensor_cores(target)
    source = t.compile(t.analytic_pick(target)[0], target).source
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in _kernel(source, "gru_gemm_x0")
    mixed = _template(64, 1024, precision={**HALF, "x": "bfloat16"}).with_tensor_cores(target)
    assert mixed.in_tensor_core is None and mixed.hid_tensor_core is not None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_compiles_the_kernel_for_sm_90(tmp_path):
    """The source nvcc gets (the GPU compiles it with NVRTC) is valid for sm_90 at an odd
    batch, hidden size and both directions, 4 k warps and 32 units."""
    import tvm
    from tvm.support import nvcc

    t = _template(5, 200, bidirectional=True, layers=2)
    target = offline_cuda("sm_90")
    for flags in (0, 1):  # with the grid barrier, and with h as tagged words
        cfg = t.default_config(target).replace(**TC, step_j=32, step_tc_rows=16, step_tc_kw=4, step_flags=flags)
        assert t.space(target).is_feasible(cfg), t.space(target).infeasible_reason(cfg)
        with tvm.target.Target(target.tvm_target()):
            ptx = nvcc.compile_cuda(t.compile(cfg, target).source, target_format="ptx", compiler="nvcc")
        text = ptx.decode() if isinstance(ptx, bytes) else str(ptx)
        assert "mma.sync.aligned.m16n8k16" in text and "ldmatrix.sync.aligned" in text


def test_with_flags_h_goes_as_tagged_word_pairs_and_there_is_no_grid_barrier():
    """``step_flags`` on the tensor-core kernel: no counter is added to; each lane polls its
    share of the warp's 16 rows x k range as 64-bit words of two units (H 64, 2 k warps: 16 x
    32 / 2 words a warp, 8 a lane, of which the 4 in rows past the batch of 8 are not read),
    and writes h' as one tagged store per pair of units (2 unit tiles; of the 2 row halves,
    rows 8-15 are past the batch); the init writes the paired words."""
    t = _template(8, 64)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**TC, step_j=16, step_tc_rows=16, step_tc_kw=2, step_flags=1)
    assert t.space(target).is_feasible(cfg), t.space(target).infeasible_reason(cfg)
    compiled = t.compile(cfg, target)
    kernel = _kernel(compiled.source)
    step = kernel[kernel.index("for (int s = 0; s < 5; ++s)"):]
    assert "atomicAdd" not in step and "__nv_atomic_fetch_add" not in step
    assert step.count("__nv_atomic_load_n((&(hx_ptr[") == 4
    assert step.count("__nv_atomic_store_n((&(hx_ptr[") == 2
    assert step.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 2 * 6
    calls = [(c.func, c.args[-1]) for c in compiled.calls]
    assert ("gru_init", "hx") in calls and ("gru_steps", "hx") in calls
    init = _kernel(compiled.source, "gru_init")
    assert "<< (uint64_t)16" in init.replace("((uint64_t)16)", "(uint64_t)16")  # two 16-bit halves a word
    shown = t.shown_knobs(cfg)
    assert "step_tc_kw" in shown and "step_flags" in shown
    assert "step_barrier" not in shown and "step_flag_units" not in shown
    # the barrier form's source has no exchange words
    assert "hx_ptr" not in _kernel(t.compile(cfg.replace(step_flags=0), target).source)


def test_the_step_kernels_h_chunks_are_cp_async_copies_whatever_the_input_gemm():
    """The tensor-core step kernel's h chunks go as cp.async groups with its input GEMM on
    wgmma too (they were synchronous copies unless a GEMM tile's options asked for cp.async)."""
    target = offline_cuda("sm_90")
    t = _template(64, 1024, seq=128).with_tensor_cores(target)
    pick = t.analytic_pick(target)[0]
    assert pick.in_wgmma == 1 and pick.step_flags == 1
    step = _kernel(t.compile(pick.replace(step_flags=0), target).source)
    # a warp copies its eighth of 16 rows x 1024 k (4 warps splitting the units, 2 the k), 16 bytes a lane
    assert step[step.index("for (int s = 0; s < 128"):].count("cp_async_legacy") == 16 * 1024 // 8 // 8 // 32


def test_tagged_words_are_polled_64_a_lane_at_once():
    """B64 H1024 over 2 k warps: a lane's 16 x 512 / 2 / 32 = 128 words in two rounds of 64
    (32 at once measured 0.750 ms a pass against 0.724 on the H100), a word a load or two."""
    target = offline_cuda("sm_90")
    t = _template(64, 1024, seq=128).with_tensor_cores(target)
    cfg = t.analytic_pick(target)[0].replace(step_j=16, step_tc_rows=32, step_tc_kw=2, step_tc_nw=1)
    for poll, loads in ((8, "__nv_atomic_load_n((&(hx_ptr["), (16, "tvm_builtin_ptx_ld_vec_relaxed_gpu_v2_u64(got")):
        step = _kernel(t.compile(cfg.replace(step_tc_poll=poll), target).source)
        step = step[step.index("for (int s = 0; s < 128"):]
        assert step.count(loads) == 128 * 8 // poll and step.count("while (1)") == 2


def test_shape_sizes():
    """k is padded to whole 16-deep slices per k warp (and per unit warp's share of its h);
    W's shared rows are unpadded (swizzled), h's have an odd number of 16-byte chunks
    (conflict-free ldmatrix)."""
    shape = TcStepShape(batch=5, hidden=200, dirs=2, units=16, rows=16, k_warps=4, operand="float16")
    assert shape.k_extent == 256 and shape.warps == 4 and shape.threads == 128
    assert shape.blocks == 13 * 1 * 2
    assert shape.w_stride == 48 and shape.n_tiles == 6
    assert shape.h_stride == 264 and (shape.h_stride * 2 // 16) % 2 == 1
    assert shape.shared_bytes() == (256 * 48 + 16 * 264) * 2 + 3 * 6 * 4 * 32 * 4
    split = TcStepShape(batch=64, hidden=1024, dirs=1, units=32, rows=16, k_warps=1, operand="float16", n_warps=4)
    assert split.warps == 4 and split.n_tiles == 3 and split.blocks == 32 * 4
    assert split.shared_bytes() == (1024 * 96 + 16 * 1032) * 2  # no partial sums: fits the H100's 232448 B
    assert TcStepShape(5, 200, 1, 32, 16, 2, "float16", n_warps=4).k_extent == 256  # 16 x 2 x 4


@pytest.mark.parametrize("chunks", [3, 6, 12, 24])
def test_w_chunks_of_eight_consecutive_k_rows_lie_on_distinct_banks(chunks):
    """What ``ldmatrix.trans`` reads in one phase: the same logical chunk of 8 consecutive k
    rows; swizzled, their 16-byte chunks start on 8 distinct 16-byte bank groups, and stay in
    their row."""
    for k0 in range(0, 64, 8):
        for chunk in range(chunks):
            stored = [w_chunk(k, chunk, chunks) for k in range(k0, k0 + 8)]
            assert all(0 <= c < chunks for c in stored)
            assert len({(k * chunks + c) % 8 for k, c in zip(range(k0, k0 + 8), stored)}) == 8


@pytest.mark.parametrize("precision, knobs, reason", [
    ({}, dict(step_j=16), "needs h and W_hh both float16 or both bfloat16"),
    (HALF, dict(step_j=4), "step_j 4 units per block; allowed: (8, 16, 32)"),
    (HALF, dict(step_j=16, step_tc_rows=64), "64 rows per block for batch 8"),
    (HALF, dict(step_j=16, step_loop=1), "persistent kernel only (step_loop 2)"),
    (HALF, dict(step_j=16, step_tc_kw=4, step_tc_wreg=1, step_tc_frag=1), "loads no W fragments a slice ahead"),
    (HALF, dict(step_j=32, step_tc_kw=2, step_tc_wreg=1), "needs 384 registers a lane > 96"),
    (HALF, dict(step_j=16, step_tc_kw=4, step_tc_wreg=2), "all of W's fragments fit in registers (96 a lane)"),
    (HALF, dict(step_j=32, step_tc_kw=2, step_tc_wreg=1, step_tc_wregs=160), "needs 384 registers a lane > 160"),
    (HALF, dict(step_j=16, step_tc_wregs=128), "no W fragments in registers (step_tc_wreg 0) takes no register"),
    ({}, dict(step_j=16, step_tc_kw=8, step_tc_wreg=3, step_flags=1, step_tc=2), "from global memory (step_tc_wreg 3)"),
])
def test_space_refuses_with_the_reason(precision, knobs, reason):
    t = _template(8, 512, precision=precision)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**{**TC, **knobs})
    assert reason in t.space(target).infeasible_reason(cfg)


def test_space_refuses_a_slice_beyond_shared_memory_and_a_grid_that_cannot_be_resident():
    target = offline_cuda("sm_90")
    wide = _template(16, 4096)  # 4096 k x (96 + 8) columns of W: 852 KB
    cfg = wide.default_config(target).replace(**TC, step_j=32, step_tc_rows=16)
    assert "B of shared memory >" in wide.space(target).infeasible_reason(cfg)
    many = _template(64, 1024)  # 64 unit tiles x 4 row tiles: 256 blocks of ~100 KB
    cfg = many.default_config(target).replace(**TC, step_j=16, step_tc_rows=16, step_tc_kw=2)
    assert "needs every block resident, 256 blocks" in many.space(target).infeasible_reason(cfg)
    assert many.space(target).is_feasible(cfg.replace(step_tc_rows=32))


def test_a_resident_grid_counts_the_registers_a_lane_may_take():
    """The step kernel names only its threads in its launch bounds, so a lane may take 255
    registers: bidirectional float16 B96 H512 on 16-unit blocks of 4 k warps (384 blocks of 128
    threads, three an SM) compiles to 213 a lane, so only two are resident, and the grid would
    time out; it is refused, and the pick takes 32-unit blocks (192 blocks, two an SM)."""
    target = offline_cuda("sm_90")
    t = _template(96, 512, bidirectional=True)
    cfg = t.default_config(target).replace(**TC, step_j=16, step_tc_rows=16, step_tc_kw=4, step_tc_wreg=1,
                                           step_tc_acc=2, step_flags=1)
    assert "needs every block resident, 384 blocks > 132 SMs x 2" in t.space(target).infeasible_reason(cfg)
    pick = t.analytic_pick(target)[0]
    assert (pick.step_j, pick.step_tc_rows, pick.step_tc_kw, pick.step_tc_nw) == (32, 16, 1, 4)
    assert t.step_variant(pick).shape.blocks == 192
    # a block of 512 threads is capped at 128 registers a lane by its launch bounds: one an SM fits
    wide = _template(40, 256)
    cfg = wide.default_config(target).replace(**TC, step_j=32, step_tc_rows=64, step_tc_kw=4, step_flags=1)
    assert wide.step_variant(cfg).shape.threads == 512 and wide.space(target).is_feasible(cfg)


def test_the_cuda_core_kernels_knobs_do_not_refuse_a_tensor_core_config():
    t = _template(8, 512)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**TC, step_j=16, step_b=16, step_bt=16, step_k=8, step_ks=16)
    assert t.space(target).is_feasible(cfg), t.space(target).infeasible_reason(cfg)
    assert not t.space(target).is_feasible(cfg.replace(step_tc=0))


def test_shown_knobs_are_the_kernels_own():
    t = _template(8, 512)
    cfg = t.default_config(offline_cuda("sm_90")).replace(**TC, step_j=16)
    shown = t.shown_knobs(cfg)
    assert "step_tc_kw" in shown and "step_ks" not in shown and "step_w_onchip" not in shown
    assert "step_tc_kw" not in t.shown_knobs(cfg.replace(step_tc=0))


@pytest.mark.parametrize("shape, block", [((16, 256, False), (8, 16, 4, 1)), ((16, 512, True), (8, 16, 4, 1)),
                                          ((64, 1024, False), (32, 16, 2, 4)), ((12, 200, False), (8, 16, 4, 1)),
                                          ((5, 512, False), (8, 16, 4, 1)), ((8, 512, True), (8, 16, 4, 1)),
                                          ((16, 1088, False), (16, 16, 4, 1)), ((64, 512, False), (16, 16, 4, 1)),
                                          ((96, 768, False), (16, 64, 2, 1)), ((8, 1024, False), (8, 16, 8, 1))])
def test_analytic_pick_takes_the_tensor_core_kernel_for_16_bit_state(shape, block):
    """float16 h and W_hh above batch 4 (up to it: the CUDA-core flag-exchange kernel): the pick
    is the tensor-core kernel exchanging h as tagged words, blocks (units, rows, k warps, unit
    warps) of 8 units and 16 rows on 4 k warps where that grid has a block an SM at most (B16
    H512 bidirectional: 128 blocks; H1088: 136, more than the 132 SMs; B64 H512: 256, resident
    two an SM but not taken), else 16 units where that grid is resident, else 32 units on 4 unit
    warps and 2 k warps (B64 H1024: 16 x 16 blocks would be 256, more than the SMs hold), else 16 units of
    more rows (B96 H768: 288, 144 and 144 blocks before 96 of 64 rows); 8-unit blocks split k
    over 8 warps from H1024 (B8 H1024)."""
    batch, hidden, bidirectional = shape
    target = offline_cuda("sm_90")
    t = _template(batch, hidden, bidirectional=bidirectional)
    cfg, why = t.analytic_pick(target)
    assert (cfg.step_tc, cfg.step_flags) == (1, 1)
    assert (cfg.step_j, cfg.step_tc_rows, cfg.step_tc_kw, cfg.step_tc_nw) == block
    assert "tagged words" in why
    assert t.space(target).is_feasible(cfg) and why.startswith("tensor-core persistent step kernel")
    assert t.analytic_pick(offline_cuda("sm_75"))[0].step_tc == 0  # no ldmatrix/mma.sync bf16 path there
    full = GruTemplate(batch=batch, hidden=hidden, input=hidden, seq=5, bidirectional=bidirectional)
    # float32: the CUDA-core kernels, or from batch 8 (batch 4 at H512 or more, stacked) the split tensor-core
    # kernels, never this one's 16-bit form
    split = (batch >= 8 or batch >= 4 and hidden >= 512) and hidden != 1088
    assert full.analytic_pick(target)[0].step_tc == (2 if split else 0)


@pytest.mark.parametrize("shape, block", [((8, 2048, False), (16, 16, 8, 1)), ((1, 2048, False), (16, 16, 8, 1)),
                                          ((32, 1536, False), (32, 16, 2, 4)), ((32, 2048, False), (32, 16, 4, 4)),
                                          ((8, 2048, True), (32, 16, 4, 4)), ((64, 1024, True), (16, 64, 2, 1)),
                                          ((32, 1760, False), (16, 32, 4, 1))])
def test_pick_streams_w_where_no_blocks_slice_fits_shared_memory(shape, block):
    """16-bit past H1024 (and at 64-row blocks), where no block's W_hh slice fits shared memory
    beside its h rows: the first resident block of the pick's order with the fragments of as
    many k slices as 160 registers a lane hold loaded from global memory (``step_tc_wreg`` 3),
    on the k warps that make 8 (k warp, unit warp, 16-row tile) triples, or the fewest more that
    fit (32 units on 4 unit warps at H2048: 2 k warps do not fit), a block of 256 threads or fewer
    before one of 512 (B32 H1760: 16 units and 32 rows, where 32 units on 4 k warps spill); the
    CUDA-core kernels picked before were 3-7x slower (docs/results/gru.md)."""
    batch, hidden, bidirectional = shape
    target = offline_cuda("sm_90")
    t = _template(batch, hidden, bidirectional=bidirectional)
    cfg, why = t.analytic_pick(target)
    assert (cfg.step_tc, cfg.step_flags, cfg.step_tc_wreg, cfg.step_tc_wregs) == (1, 1, 3, 160)
    assert (cfg.step_j, cfg.step_tc_rows, cfg.step_tc_kw, cfg.step_tc_nw) == block
    assert "loaded into registers from global memory" in why and t.space(target).infeasible_reason(cfg) is None
    whole = cfg.replace(step_tc_wreg=0, step_tc_wregs=96)  # the slice all in shared memory
    assert "shared memory" in t.space(target).infeasible_reason(whole)


@pytest.mark.parametrize("hidden", [1536, 2048])
def test_pick_runs_the_unfused_steps_on_the_tensor_cores_where_no_step_grid_is_resident(hidden):
    """16-bit B64 past H1024: no tensor-core step kernel's grid is resident even streaming W;
    per step the hidden GEMM on the tensor cores (wgmma: ``test_gru_hidden_wgmma.py``) and the
    cell kernel (the CUDA-core fused kernel launched once a step was 4.5x slower:
    docs/results/gru.md).  float32 state runs those steps too, on TF32 parts with the cell in the
    hidden GEMM's store, K in halves (``test_gru_tf32_cell.py``)."""
    target = offline_cuda("sm_90")
    t = _template(64, hidden).with_tensor_cores(target)
    cfg, why = t.analytic_pick(target)
    assert cfg.fuse_step == 0 and why.startswith("the unfused pipeline: per step the hidden GEMM on the tensor "
                                                 "cores (wgmma")
    assert t.space(target).infeasible_reason(cfg) is None
    full = GruTemplate(batch=64, hidden=hidden, input=hidden, seq=5).with_tensor_cores(target)
    full_cfg, full_why = full.analytic_pick(target)
    assert (full_cfg.fuse_step, full_cfg.hid_cell) == (0, 2) and "h and W_hh as TF32 parts" in full_why


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
# the shapes of the GPU cases: odd batch and hidden sizes, both directions, several layers
B8_H512 = Shape(seq=9, batch=8, input=512, hidden=512)
B64_H1024 = Shape(seq=5, batch=64, input=1024, hidden=1024)
B40_H256 = Shape(seq=6, batch=40, input=256, hidden=256)
B5_H200_BI = Shape(seq=7, batch=5, input=40, hidden=200, bidirectional=True)
B3_H33_3LAYERS_BI = Shape(seq=7, batch=3, input=33, hidden=33, layers=3, bidirectional=True)
B9_H2000 = Shape(seq=5, batch=9, input=300, hidden=2000)
B40_H1024_BI = Shape(seq=4, batch=40, input=64, hidden=1024, bidirectional=True)

GPU_CASES = {
    "b8-h512": (B8_H512, dict(step_j=16, step_tc_rows=16, step_tc_kw=2)),
    "b64-h1024": (B64_H1024, dict(step_j=16, step_tc_rows=32, step_tc_kw=2)),
    "b40-h256-kw4": (B40_H256, dict(step_j=32, step_tc_rows=64, step_tc_kw=4)),
    "b5-h200-bi": (B5_H200_BI, dict(step_j=16, step_tc_rows=16, step_tc_kw=4)),
    "b3-h33-3layer-bi": (B3_H33_3LAYERS_BI, dict(step_j=32, step_tc_rows=16, step_tc_kw=1)),
    "b64-h1024-nw4": (B64_H1024, dict(step_j=32, step_tc_rows=16, step_tc_kw=1, step_tc_nw=4)),
    "b5-h200-bi-nw2-kw2": (B5_H200_BI, dict(step_j=32, step_tc_rows=16, step_tc_kw=2, step_tc_nw=2)),
    "b3-h33-3layer-bi-nw4": (B3_H33_3LAYERS_BI, dict(step_j=32, step_tc_rows=16, step_tc_kw=1, step_tc_nw=4)),
    "b64-h1024-nw4-acc4": (B64_H1024, dict(step_j=32, step_tc_rows=16, step_tc_kw=1, step_tc_nw=4, step_tc_acc=4)),
    "b5-h200-bi-nw2-kw2-acc2": (B5_H200_BI,
                                dict(step_j=32, step_tc_rows=16, step_tc_kw=2, step_tc_nw=2, step_tc_acc=2)),
    "b3-h33-3layer-bi-acc4": (B3_H33_3LAYERS_BI,
                              dict(step_j=32, step_tc_rows=16, step_tc_kw=1, step_tc_nw=4, step_tc_acc=4)),
    "b64-h1024-nw4-frag": (B64_H1024, dict(step_j=32, step_tc_rows=16, step_tc_kw=1, step_tc_nw=4, step_tc_frag=1)),
    "b5-h200-bi-kw4-frag-acc2": (B5_H200_BI,
                                 dict(step_j=16, step_tc_rows=16, step_tc_kw=4, step_tc_frag=1, step_tc_acc=2)),
    "b3-h33-3layer-bi-nw2-kw2-frag": (B3_H33_3LAYERS_BI,
                                      dict(step_j=32, step_tc_rows=16, step_tc_kw=2, step_tc_nw=2, step_tc_frag=1)),
    "b8-h512-kw4-wreg": (B8_H512, dict(step_j=16, step_tc_rows=16, step_tc_kw=4, step_tc_wreg=1)),
    "b5-h200-bi-nw2-kw2-acc2-wreg": (B5_H200_BI, dict(step_j=32, step_tc_rows=16, step_tc_kw=2, step_tc_nw=2,
                                                      step_tc_acc=2, step_tc_wreg=1)),
    "b3-h33-3layer-bi-nw4-wreg": (B3_H33_3LAYERS_BI,
                                  dict(step_j=32, step_tc_rows=16, step_tc_kw=1, step_tc_nw=4, step_tc_wreg=1)),
    "b64-h1024-kw2-wreg2": (B64_H1024, dict(step_j=16, step_tc_rows=32, step_tc_kw=2, step_tc_wreg=2)),
    "b5-h200-bi-wreg2": (B5_H200_BI, dict(step_j=32, step_tc_rows=16, step_tc_kw=1, step_tc_wreg=2)),
    "b8-h512-u8-kw4-wreg": (B8_H512, dict(step_j=8, step_tc_rows=16, step_tc_kw=4, step_tc_wreg=1, step_tc_acc=2)),
    "b5-h200-bi-u8-kw2": (B5_H200_BI, dict(step_j=8, step_tc_rows=16, step_tc_kw=2)),
    "b3-h33-3layer-bi-u8": (B3_H33_3LAYERS_BI, dict(step_j=8, step_tc_rows=16, step_tc_kw=1, step_tc_wreg=1)),
    "b40-h256-u8-rows64-kw2": (B40_H256, dict(step_j=8, step_tc_rows=64, step_tc_kw=2)),
    # W's fragments from global memory (step_tc_wreg 3): the B64 H1024 pick (26 of 32 slices held), an odd
    # hidden size with part of each of two k warps' slices held (4 of 7), and all held (no W rows shared)
    "b64-h1024-nw4-kw2-wreg3": (B64_H1024, dict(step_j=32, step_tc_rows=16, step_tc_kw=2, step_tc_nw=4,
                                                 step_tc_wreg=3, step_tc_wregs=160)),
    "b5-h200-bi-kw2-wreg3": (B5_H200_BI, dict(step_j=32, step_tc_rows=16, step_tc_kw=2, step_tc_wreg=3)),
    "b5-h200-bi-wreg3": (B5_H200_BI, dict(step_j=32, step_tc_rows=16, step_tc_kw=1, step_tc_wreg=3,
                                          step_tc_wregs=128)),
    "b3-h33-3layer-bi-nw4-kw2-wreg3": (B3_H33_3LAYERS_BI, dict(step_j=32, step_tc_rows=16, step_tc_kw=2,
                                                               step_tc_nw=4, step_tc_wreg=3, step_tc_wregs=160)),
    # the streamed picks past H1024: 13 of 16 slices held on 8 k warps, 64-row blocks on 2 k warps
    "b9-h2000-kw8-wreg3": (B9_H2000, dict(step_j=16, step_tc_rows=16, step_tc_kw=8, step_tc_wreg=3,
                                          step_tc_wregs=160)),
    "b40-h1024-bi-rows64-kw2-wreg3": (B40_H1024_BI, dict(step_j=16, step_tc_rows=64, step_tc_kw=2, step_tc_wreg=3,
                                                         step_tc_wregs=160)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("flags", [0, 1], ids=["barrier", "flags"])
@pytest.mark.parametrize("precision, bound", [(HALF, 5e-3), (BF16, 3e-2)], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("key", list(GPU_CASES))
def test_cuda_tensor_core_step_matches_float64(key, precision, bound, flags):
    """Against float64 on reruns (a race between blocks would move the error) and on a second
    input (with flags, a tag left from the first call would be read as this one's); the error
    is the 16-bit storage's, not a wrong tile (a wrong fragment layout is O(1))."""
    s, knobs = GPU_CASES[key]
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch,
                    seq=s.seq, config={**TC, **knobs, "step_flags": flags},
                    precision=precision).load_numpy(_weights(s))
    assert gru.config.step_tc == 1 and gru.config.step_flags == flags
    x, h0 = _inputs(s)
    assert_reruns_match_float64(gru, s, x, h0, bound, 1e-6)  # every rerun the same answer
    assert_reruns_match_float64(gru, s, x[::-1].copy(), -h0, bound, 1e-6, reruns=1)


@pytest.mark.gpu
@pytest.mark.parametrize("batch, hidden, fused", [(8, 2048, True), (64, 1536, False)])
def test_cuda_picks_past_h1024_match_float64(batch, hidden, fused):
    """The picks past H1024 as built without a config: W_hh streamed (B8 H2048) and the unfused
    steps with the tensor-core hidden GEMM (B64 H1536), against float64."""
    s = Shape(seq=4, batch=batch, input=96, hidden=hidden)
    gru = GRU.build("cuda", s.input, s.hidden, batch=s.batch, seq=s.seq, precision=HALF).load_numpy(_weights(s))
    assert gru.config.fuse_step == int(fused) and (not fused or gru.config.step_tc_wreg == 3)
    x, h0 = _inputs(s)
    assert relative_error(list(gru(x, h0)), gru_reference(x, _weights(s), h0, 1, False)) < 5e-3


@pytest.mark.gpu
def test_cuda_build_without_a_config_runs_the_tensor_core_kernel():
    s = Shape(seq=9, batch=12, input=40, hidden=200, bidirectional=True)
    gru = GRU.build("cuda", s.input, s.hidden, bidirectional=True, batch=s.batch, seq=s.seq,
                    precision=HALF).load_numpy(_weights(s))
    assert gru.config.step_tc == 1
    x, h0 = _inputs(s)
    assert relative_error(list(gru(x, h0)), gru_reference(x, _weights(s), h0, 1, True)) < 5e-3
