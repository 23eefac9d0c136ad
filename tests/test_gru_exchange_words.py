"""How the tensor-core GRU step kernel's blocks exchange h (``step_flags`` 1): the word
layouts (two values beside a 32-bit step tag, or ``step_tc_words`` 3: three of an n8 tile
beside a 16-bit one), the words' bits built by real TVM builds on the CPU, the generated
CUDA of the triple words, the space's refusals, and ``-m gpu`` runs against float64."""
from __future__ import annotations

import re

import numpy as np
import pytest
from gru_checks import assert_reruns_match_float64
from test_gru import Shape, _inputs, _weights
from test_gru_tensor_core import B3_H33_3LAYERS_BI, B5_H200_BI, B8_H512, B40_H256, B64_H1024, BF16, HALF, TC, \
    _kernel, _template

from tvm_ext.schedules.gru import GRU
from tvm_ext.schedules.gru.tensor_core_layout import (MMA_N, TcKernelLayout, TcStepShape, exchange_row_words,
                                                      triple_first_unit, triple_word)
from tvm_ext.target import offline_cuda

TRIPLES = dict(step_flags=1, step_tc_words=3)


@pytest.mark.parametrize("hidden", [8, 33, 200, 1024])
def test_each_unit_lies_in_one_triple_word_which_decodes_to_it(hidden):
    """Unit u of a row goes to word q = (u mod 8) // 3 of its n8 tile, at value (u mod 8) mod 3
    (the producer's ``triple_word``); the consumer's ``triple_first_unit`` gives it back; no two
    units share a value, and the row's words are ``exchange_row_words``."""
    row_words = exchange_row_words(hidden, 3)
    assert row_words == -(-hidden // 8) * 3 and exchange_row_words(hidden, 2) == -(-hidden // 2)
    places = set()
    for row in (0, 3):
        for unit in range(hidden):
            q, value = unit % MMA_N // 3, unit % MMA_N % 3
            w = triple_word(row_words, row, unit, q)
            assert row * row_words <= w < (row + 1) * row_words
            assert triple_first_unit(w - row * row_words) + value == unit
            places.add((w, value))
    assert len(places) == 2 * hidden


@pytest.mark.parametrize("hidden, knobs", [(1024, dict(units=32, rows=16, k_warps=1, n_warps=4)),
                                           (512, dict(units=16, rows=16, k_warps=4)),
                                           (200, dict(units=32, rows=16, k_warps=2, n_warps=2)),
                                           (33, dict(units=32, rows=16, k_warps=1, n_warps=4))])
def test_a_warps_poll_range_is_exactly_its_k_range_in_triple_words(hidden, knobs):
    """A warp polls ``copy_words`` words a row from word k0 / 8 · 3 (k0 its copy's first k): they
    hold exactly the units k0 .. k0 + copy_k - 1, each once, fewer words than pairs need (a
    quarter fewer where copy_k is whole tiles of 8)."""
    shape = TcStepShape(batch=8, hidden=hidden, dirs=1, operand="float16", word_values=3, **knobs)
    layout = TcKernelLayout.of(5, 1, shape, gi_dtype="float16", gh_dtype="float16", math_dtype="float32",
                               out_dtype="float16", flags=True)
    pairs = TcKernelLayout.of(5, 1, TcStepShape(batch=8, hidden=hidden, dirs=1, operand="float16", **knobs),
                              gi_dtype="float16", gh_dtype="float16", math_dtype="float32", out_dtype="float16",
                              flags=True)
    assert layout.copy_words * 4 == pairs.copy_words * 3
    for k0 in range(0, shape.k_extent, layout.copy_k):
        units = [k0 + triple_first_unit(w) + v for w in range(layout.copy_words) for v in range(3)
                 if w % 3 * 3 + v < MMA_N]
        assert sorted(units) == list(range(k0, k0 + layout.copy_k))


def test_word_bits_from_a_real_build():
    """``pack_triple``'s word q holds values q .. q + 2 of the four it is given (the lane's pair
    and the next lane's), the last word of a tile one value and a zero, the tag in the high 16
    bits; ``word_tag`` reads it back; a pair word keeps its 32-bit tag (built for the CPU by
    TVM's LLVM backend and run)."""
    import tvm
    from tvm.script import tirx as T

    from tvm_ext.schedules.gru.step_common import pack_pair, pack_triple, word_tag

    @T.prim_func
    def words(values: T.Buffer((1,), "uint64"), out: T.Buffer((8,), "uint64")):
        for q in range(3):
            out[q] = pack_triple(T, values[0], q, 40000)
            out[3 + q] = T.Cast("uint64", word_tag(T, out[q], 3))
        out[6] = pack_pair(T, T.reinterpret("float16", T.uint16(0x3C00)), T.reinterpret("float16", T.uint16(0xC000)),
                           "float16", 70000)
        out[7] = T.Cast("uint64", word_tag(T, out[6]))

    lib = tvm.compile(tvm.IRModule({"main": words}), target="llvm")
    out = tvm.runtime.tensor(np.zeros(8, np.uint64), tvm.cpu())
    lib["main"](tvm.runtime.tensor(np.array([0x4444_3333_2222_1111], np.uint64), tvm.cpu()), out)
    got = [int(v) for v in out.numpy()]
    assert got[:3] == [0x9C40_3333_2222_1111, 0x9C40_4444_3333_2222, 0x9C40_0000_4444_3333]
    assert got[3:6] == [40000] * 3
    assert got[6] == (70000 << 32) | 0xC000_3C00 and got[7] == 70000


def _open_blocks(code: str, at: int) -> list[str]:
    """The lines opening the blocks (``{``) still open at offset ``at`` of ``code``."""
    stack: list[str] = []
    for line in code[:at].splitlines():
        stack.extend([line.strip()] * line.count("{"))
        del stack[len(stack) - line.count("}"):]
    return stack


def test_triple_words_in_the_generated_cuda():
    """B8 H64 over 2 k warps with triple words: a lane polls 16 rows x 32 k / 8 x 3 / 32 = 6
    words, of which the 3 in rows past the batch of 8 are not read (pairs: 8 and 4), and
    checks the 16-bit tag; every lane shuffles its pair to the quad's previous lane, once for
    each of its 2 unit tiles and 2 row halves, under no condition but the first k warp's (all 32
    lanes reach it), and lanes 0-2 of each quad store a word of the first row half (rows 8-15
    are past the batch); the init writes three values a word."""
    t = _template(8, 64)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**TC, step_j=16, step_tc_rows=16, step_tc_kw=2, **TRIPLES)
    assert t.space(target).is_feasible(cfg), t.space(target).infeasible_reason(cfg)
    source = t.compile(cfg, target).source
    kernel = _kernel(source)
    step = kernel[kernel.index("for (int s = 0; s < 5; ++s)"):]
    assert step.count("__nv_atomic_load_n((&(hx_ptr[") == 3
    assert step.count(">> (uint64_t)48ULL)) != s)") == 3
    shuffles = [m.start() for m in re.finditer("__shfl_down_sync", step)]
    assert len(shuffles) == 4
    for at in shuffles:
        assert _open_blocks(step, at) == ["for (int s = 0; s < 5; ++s) {", "if (((int)threadIdx.y) == 0) {"]
    assert step.count("__nv_atomic_store_n((&(hx_ptr[") == 2 and "(((int)threadIdx.x) & 3) < 3" in step
    init = _kernel(source, "gru_init")
    assert "% 3) == 0" in init and "<< (uint64_t)32ULL" in init
    assert t.compile(cfg.replace(step_tc_words=2), target).source != source


@pytest.mark.parametrize("shape_knobs, reason", [
    (((8, 512, 5), dict(step_j=16, step_tc_kw=4, step_flags=0, step_tc_words=3)), "needs step_flags 1"),
    (((8, 4, 5), dict(step_j=16, step_tc_kw=1, step_flags=1, step_tc_words=3)), "hidden 4 >= 8 needed"),
    (((8, 64, 70000), dict(step_j=16, step_tc_kw=2, step_flags=1, step_tc_words=3)), "seq 70000 < 65536"),
])
def test_space_refuses_triple_words_with_the_reason(shape_knobs, reason):
    (batch, hidden, seq), knobs = shape_knobs
    t = _template(batch, hidden, seq=seq)
    target = offline_cuda("sm_90")
    cfg = t.default_config(target).replace(**{**TC, **knobs})
    assert reason in t.space(target).infeasible_reason(cfg)
    assert t.space(target).is_feasible(cfg.replace(step_tc_words=2, step_flags=1))


# ---- on the GPU (``pytest -m gpu``) ---------------------------------------------------------
GPU_CASES = {
    "b8-h512-kw4-wreg": (B8_H512, dict(step_j=16, step_tc_rows=16, step_tc_kw=4, step_tc_wreg=1, step_tc_acc=2)),
    "b64-h1024-nw4-wreg2": (B64_H1024, dict(step_j=32, step_tc_rows=16, step_tc_kw=1, step_tc_nw=4, step_tc_wreg=2)),
    "b40-h256-kw4": (B40_H256, dict(step_j=32, step_tc_rows=64, step_tc_kw=4)),
    "b5-h200-bi-nw2-kw2": (B5_H200_BI, dict(step_j=32, step_tc_rows=16, step_tc_kw=2, step_tc_nw=2)),
    "b3-h33-3layer-bi-nw4": (B3_H33_3LAYERS_BI, dict(step_j=32, step_tc_rows=16, step_tc_kw=1, step_tc_nw=4)),
    "b7-h72-kw2": (Shape(seq=6, batch=7, input=24, hidden=72), dict(step_j=16, step_tc_rows=16, step_tc_kw=2)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("precision, bound", [(HALF, 5e-3), (BF16, 3e-2)], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("key", list(GPU_CASES))
def test_cuda_triple_words_match_float64(key, precision, bound):
    """Triple words against float64 on reruns and on a second input (a 16-bit tag left from the
    first call would be read as this one's), at odd batch and hidden sizes (H33: a last tile of
    one unit; H72: nine tiles over 16-unit blocks), both directions, several layers."""
    s, knobs = GPU_CASES[key]
    gru = GRU.build("cuda", s.input, s.hidden, num_layers=s.layers, bidirectional=s.bidirectional, batch=s.batch,
                    seq=s.seq, config={**TC, **knobs, **TRIPLES}, precision=precision).load_numpy(_weights(s))
    assert gru.config.step_tc_words == 3
    x, h0 = _inputs(s)
    assert_reruns_match_float64(gru, s, x, h0, bound, 1e-6)
    assert_reruns_match_float64(gru, s, x[::-1].copy(), -h0, bound, 1e-6, reruns=1)
