"""A wgmma GEMM whose M, N or K no tile divides (a token count, a classifier's 1000 classes or a
vocabulary of 30522; DeepSpeech2's GRU input of 1760): the guarded last tile row and column in
the generated kernel, the last k step the TMA reads past K as zeros, what refuses them, the
pick's preference for tiles that divide, and (``-m gpu``) C against float64 with nothing stored
past M or N."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
from test_wgmma import CLI, _c_against_float64, _config

from tvm_ext.schedules.gemm.wgmma import WgmmaTile
from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate
from tvm_ext.target import offline_cuda


def test_a_ragged_m_is_guarded_and_an_m_the_tile_divides_builds_as_before():
    """M = 700 (a token count): the last tile row's A loads past row 699 read rows below it (mod M)
    and C's stores stop at row 700; the pick takes the tile wasting least where two
    give as many blocks, and never more than half a tile row; an M the tile divides has no
    guard (the kernel as it was: the sources of every such config are hashed unchanged); a raster
    group must divide the tile rows, the ragged one counted."""
    from tvm_ext.schedules.gemm.wgmma import wgmma_gemm
    from tvm_ext.schedules.gemm.wgmma_template import pick_wgmma_tile

    target = offline_cuda()
    t = WgmmaGemmTemplate(700, 768, 768)
    tile = WgmmaTile.of(t.default_config(target))
    assert (tile.bm, tile.split) == (64, 1) and t.space(target).is_feasible(t.default_config(target))
    for staged in (True, False):  # the shared-memory epilogue's copy, and the direct store, guarded
        ragged = wgmma_gemm(WgmmaTile(128, 128, 4, 1, staged, 2), 700, 768, 768, bias_dtype="float16").script()
        assert "% 700" in ragged and "< 700" in ragged  # rows past M read rows below it, stores guarded
        whole = wgmma_gemm(WgmmaTile(128, 128, 4, 1, staged, 2), 1024, 768, 768, bias_dtype="float16").script()
        assert "% 1024" not in whole and "< 1024" not in whole
    assert pick_wgmma_tile([(64, 3072, 1024)], target, "float16", ragged_m=True).bm == 64  # 128 rows: half wasted
    assert pick_wgmma_tile([(700, 768, 768)], target, "float16") is None  # callers that don't ask: exact tiles


def _gru_against_float64(hidden, dtype, bound, seed, batch=32, seq=32):
    """A 16-bit GRU (input = hidden) built without a config: its input GEMM on wgmma (at batch
    32, T32 past ``WGMMA_MIN_FLOPS``), outputs against float64 on a rerun."""
    from tvm_ext.precision.precision import relative_error
    from tvm_ext.schedules.gru import GRU, gru_reference

    rng = np.random.default_rng(seed)
    k = 1 / np.sqrt(hidden)
    w = {name: rng.uniform(-k, k, shape).astype(np.float32) for name, shape in (
        ("weight_ih_l0", (3 * hidden, hidden)), ("weight_hh_l0", (3 * hidden, hidden)),
        ("bias_ih_l0", (3 * hidden,)), ("bias_hh_l0", (3 * hidden,)))}
    precision = {name: dtype for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}
    gru = GRU.build("cuda", hidden, hidden, batch=batch, seq=seq, precision=precision).load_numpy(w)
    assert gru.config.in_wgmma == 1
    x = rng.standard_normal((seq, batch, hidden)).astype(np.float32)
    h0 = rng.standard_normal((1, batch, hidden)).astype(np.float32)
    for _ in range(2):
        assert relative_error(list(gru(x, h0)), gru_reference(x, w, h0, 1, False)) < bound


def test_a_ragged_n_is_guarded_where_bt_is_stored_n_k_and_c_directly():
    """N = 1000 (a classifier's classes): the last tile column's Bt rows past 999 read rows below
    it (mod N) and C's stores stop at column 1000, a bias read below N too; refused with B stored
    (K, N), the shared-memory epilogue, a split K or an odd N; the pick takes a tile that divides
    N wherever one does (callers that do not ask for a ragged N get none), a direct store where
    none does."""
    from tvm_ext.schedules.gemm.wgmma import wgmma_gemm, wgmma_reason
    from tvm_ext.schedules.gemm.wgmma_template import pick_wgmma_tile

    target = offline_cuda()
    tile = WgmmaTile(128, 128, 4, 1, False, 2)
    ragged = wgmma_gemm(tile, 1024, 1000, 768, bias_dtype="float16").script()
    assert "% 1000" in ragged and "< 1000" in ragged
    whole = wgmma_gemm(tile, 1024, 1024, 768, bias_dtype="float16").script()
    assert "% 1024" not in whole and "< 1024" not in whole
    assert wgmma_reason(tile, 1024, 1000, 768) is None
    staged = WgmmaTile(128, 128, 4, 1, True, 0)
    assert wgmma_reason(staged, 1024, 1000, 768) is None  # 1000 columns: 16-byte rows, C staged
    for refused, n, layout in ((tile, 1000, "KN"), (staged, 30522, "NK"),
                               (WgmmaTile(128, 128, 4, 1, False, 0, split=2), 1000, "NK"), (tile, 999, "NK")):
        assert "is no multiple of bn" in wgmma_reason(refused, 1024, n, 768, b_layout=layout), (refused, n, layout)
    staged_source = wgmma_gemm(staged, 1024, 1000, 768, bias_dtype="float16").script()
    assert "< 1000" in staged_source and "% 1000" in staged_source
    for n, smem in ((1000, True), (30522, False)):
        t = WgmmaGemmTemplate(8192, n, 1024)
        picked = WgmmaTile.of(t.default_config(target))
        assert picked.smem_epilogue == smem and picked.split == 1, n
        assert t.space(target).is_feasible(t.default_config(target))
    assert pick_wgmma_tile([(8192, 1000, 1024)], target, "float16") is None  # callers that don't ask
    assert pick_wgmma_tile([(8192, 1024, 1024)], target, "float16", ragged_n=True) == \
        pick_wgmma_tile([(8192, 1024, 1024)], target, "float16")  # N divided: as before


def test_a_ragged_k_is_loaded_by_the_tma_its_last_k_step_read_past_k():
    """K = 1760 (DeepSpeech2's GRU, 27.5 k steps of 64): a 16-bit tile whose stages the TMA loads
    runs it unsplit, its kernel that of K = 1792 with only the tensor maps' K (and the row
    strides) changed, the last step's columns past K read as zeros; refused loaded by cp.async,
    split, on 8-bit operands, or where the rows are no multiple of 16 bytes.  The pick takes a
    TMA tile for it; for the GRU's input GEMM (B stored (K, N), 3H = 5280 that no default tile
    divides) a 160-column tile, so the GRU's 16-bit input GEMM runs on wgmma at H1760; at H1000
    (3H = 3000, which no tile divides) B (K, N)'s last tile column past N, loaded by the TMA."""
    from tvm_ext.schedules.gemm.wgmma import wgmma_gemm, wgmma_reason
    from tvm_ext.schedules.gemm.wgmma_template import pick_wgmma_tile
    from tvm_ext.schedules.gru import GruTemplate

    target = offline_cuda()
    tma = WgmmaTile(128, 160, 4, 1, True, 0, tma=True)
    ragged = wgmma_gemm(tma, 4096, 5280, 1760, b_layout="KN").script()
    whole = wgmma_gemm(tma, 4096, 5280, 1792, b_layout="KN").script()
    assert ragged.replace("1760", "1792").replace("3520", "3584") == whole
    assert wgmma_reason(tma, 4096, 5280, 1760, b_layout="KN") is None
    assert wgmma_reason(WgmmaTile(128, 128, 4, 1, True, 0, tma=True, operand="bfloat16"), 1024, 1024, 1000) is None
    for refused, k, needle in ((WgmmaTile(128, 160, 4, 1, True, 0), 1760, "must divide the tile's k step 64"),
                               (WgmmaTile(128, 128, 4, 1, False, 0, tma=True, split=2), 1760, "must divide"),
                               (WgmmaTile(128, 128, 4, 1, False, 0, tma=True, operand="e4m3"), 1760, "must divide"),
                               (WgmmaTile(128, 128, 4, 1, False, 0, tma=True), 1004, "must be a multiple of 8")):
        assert needle in wgmma_reason(refused, 4096, 4096, k), (refused, k)
    for shape, layout in (((4096, 5280, 1760), "KN"), ((1024, 1024, 1000), "NK")):
        picked = pick_wgmma_tile([shape], target, "float16", layout)
        assert picked is not None and picked.tma and shape[1] % picked.bn == 0, shape
    assert pick_wgmma_tile([(4096, 4096, 1000)], target, "e4m3") is None  # 8-bit: K must divide
    # B (K, N) with N no tile divides: its last tile column guarded where the TMA loads it (zeros past N)
    assert wgmma_reason(WgmmaTile(128, 256, 4, 1, True, 0, tma=True), 4096, 3000, 1000, b_layout="KN") is None
    assert "no multiple of bn" in wgmma_reason(WgmmaTile(128, 256, 4, 1, True, 0), 4096, 3000, 1024, b_layout="KN")
    assert "no multiple of bn" in wgmma_reason(WgmmaTile(128, 256, 4, 1, False, 0, tma=True), 4096, 3004, 1024,
                                               b_layout="KN")  # N no multiple of 8: the TMA's rows
    kn = pick_wgmma_tile([(4096, 3000, 1000)], target, "float16", "KN", ragged_n=True)
    assert kn is not None and kn.tma and 3000 % kn.bn
    assert pick_wgmma_tile([(4096, 3000, 1000)], target, "float16", "KN") is None  # callers that don't ask
    gru = GruTemplate(batch=32, hidden=1760, input=1760, seq=128).with_precision(
        {name: "float16" for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}).with_tensor_cores(target)
    assert gru.in_wgmma_tile is not None and gru.in_wgmma_tile.tma
    cfg, why = gru.analytic_pick(target)
    assert cfg.in_wgmma == 1 and "input GEMM: float16 on wgmma" in why, why
    h1000 = GruTemplate(batch=32, hidden=1000, input=1000, seq=128).with_precision(
        {name: "float16" for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}).with_tensor_cores(target)
    assert h1000.in_wgmma_tile is not None and h1000.in_wgmma_tile.tma and 3000 % h1000.in_wgmma_tile.bn


@pytest.mark.parametrize("args, expect", [
    (["gemm-wgmma", "--shape", "1024,30522,768", "--b-layout", "nk"], "wgmma_smem_epilogue=0"),  # 30522: direct
    (["gemm-wgmma", "--shape", "8192,1000,1024", "--b-layout", "nk"], "wgmma_smem_epilogue=1"),  # 1000: staged
    (["gemm-fp8", "--shape", "4096,4096,4096"], "fp8_promote=1"),
    (["gemm-3xtf32", "--shape", "4096,4096,4096"], "tf_promote="),
])
def test_cli_shows_the_wgmma_templates_picks_without_measuring(args, expect, tmp_path):
    """``--strategy analytic --no-measure`` on the wgmma GEMMs prints the tile their default picks
    (an error before: the analytic tile selection is the CUDA-core GEMM's), offline."""
    p = subprocess.run(CLI + args + ["--target", "cuda", "--strategy", "analytic", "--no-measure", "--records",
                                     str(tmp_path / "r.jsonl"), "--no-progress"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    (config,) = [line for line in p.stdout.splitlines() if line.startswith("config: ")]
    assert expect in config and "tile picked without measuring" in p.stdout, p.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("shape, knobs", [
    ((1024, 1000, 768), dict(wgmma_bm=128, wgmma_bn=128, wgmma_stages=4, wgmma_smem_epilogue=0)),
    ((700, 1000, 512), dict(wgmma_bm=128, wgmma_bn=256, wgmma_stages=4, wgmma_smem_epilogue=0, wgmma_tiles=2,
                            wgmma_raster=2)),
    ((512, 1000, 1024), dict(wgmma_bm=128, wgmma_bn=192, wgmma_stages=4, wgmma_smem_epilogue=0, wgmma_tma=1)),
    ((1024, 30522, 768), dict(wgmma_bm=128, wgmma_bn=256, wgmma_stages=4, wgmma_smem_epilogue=0, wgmma_tma=1,
                              wgmma_ws=1, wgmma_tiles=4)),
    ((256, 58, 256), dict(wgmma_bm=64, wgmma_bn=64, wgmma_stages=3, wgmma_smem_epilogue=0, wgmma_inflight=0)),
    ((1024, 1000, 768), dict(wgmma_bm=128, wgmma_bn=256, wgmma_stages=4, wgmma_smem_epilogue=1, wgmma_tiles=2)),
    ((700, 1000, 1024), dict(wgmma_bm=128, wgmma_bn=192, wgmma_stages=4, wgmma_smem_epilogue=1, wgmma_tma=1,
                             wgmma_tiles=2, wgmma_raster=2)),
])
def test_cuda_ragged_n_matches_float64_and_writes_nothing_past_n(shape, knobs):
    """C against float64 where N is no multiple of bn (cp.async loads reading Bt's rows below N,
    TMA loads zero-filling past N, the warp-specialized kernel, several tiles a block, a ragged M
    too, C stored directly and, where N is a multiple of 8, staged in shared memory); C is a view
    of a NaN-poisoned buffer a tile row longer: an unguarded store past the last row's N writes
    there."""
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    t = WgmmaGemmTemplate(*shape)
    _c_against_float64(t, t.build_program(_config(t, target, **knobs), target))


@pytest.mark.gpu
@pytest.mark.parametrize("shape, batch, b_layout, knobs", [
    ((700, 768, 768), (), "NK", dict(wgmma_bm=128, wgmma_bn=128, wgmma_stages=4, wgmma_raster=2)),
    ((700, 768, 768), (), "KN", dict(wgmma_bm=64, wgmma_bn=64, wgmma_stages=6, wgmma_tiles=3)),
    ((700, 768, 768), (), "NK", dict(wgmma_bm=128, wgmma_bn=128, wgmma_stages=4, wgmma_smem_epilogue=0)),
    ((1500, 3072, 768), (), "NK", dict(wgmma_bm=128, wgmma_bn=256, wgmma_stages=4, wgmma_smem_epilogue=0,
                                       wgmma_tiles=2, wgmma_raster=4)),
    ((100, 128, 64), (3, 4), "KN", dict(wgmma_bm=64, wgmma_bn=64, wgmma_stages=2, wgmma_inflight=0)),
    ((200, 256, 128), (5,), "NK", dict(wgmma_bm=128, wgmma_bn=128, wgmma_stages=3, wgmma_tiles=2)),
    ((700, 768, 768), (), "KN", dict(wgmma_bm=64, wgmma_bn=96, wgmma_stages=8)),  # 32-wide N atoms, cp.async
    ((200, 192, 256), (3,), "KN", dict(wgmma_bm=128, wgmma_bn=96, wgmma_stages=4, wgmma_tiles=2)),
])
def test_cuda_ragged_m_matches_float64_and_writes_nothing_past_m(shape, batch, b_layout, knobs):
    """C's rows below M against float64, through the direct and the shared-memory store, one and
    several tiles a block, whole and partial raster groups, a batch (rows past a matrix's M are
    the next matrix's); C is a view of a NaN-poisoned buffer a tile row longer, whose rows past
    the view must stay NaN (an unguarded store writes them)."""
    import tvm

    from tvm_ext.target import resolve_target

    m, n, k = shape
    target = resolve_target("cuda")
    t = WgmmaGemmTemplate(m, n, k, b_layout=b_layout, batch=batch)
    program = t.build_program(_config(t, target, **knobs), target)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(t.inputs()[0].shape).astype(np.float16)
    bt = rng.standard_normal(t.inputs()[1].shape).astype(np.float16)
    ref = t.reference([a, bt])[0]
    dev = tvm.cuda(0)
    spare = int(np.prod(batch, dtype=np.int64)) * 256 * n  # a tile row past every matrix
    poisoned = tvm.runtime.tensor(np.full(int(np.prod(ref.shape)) + spare, np.nan, np.float16), dev)
    c = poisoned._create_view(ref.shape)
    program.executable.mod["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(bt, dev), c)
    out = c.numpy().astype(np.float64)
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-3
    assert np.isnan(poisoned.numpy()[int(np.prod(ref.shape)):]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("shape, b_layout, knobs", [
    ((4096, 5280, 1760), "KN", dict(wgmma_bm=128, wgmma_bn=160, wgmma_stages=4, wgmma_tma=1, wgmma_tiles=8,
                                    wgmma_raster=8)),
    ((1000, 768, 1000), "NK", dict(wgmma_bm=64, wgmma_bn=96, wgmma_stages=8, wgmma_tma=1, wgmma_ws=1)),
    ((512, 1000, 72), "NK", dict(wgmma_bm=128, wgmma_bn=128, wgmma_stages=2, wgmma_inflight=0, wgmma_tma=1,
                                 wgmma_smem_epilogue=0)),
])
def test_cuda_ragged_k_matches_float64(shape, b_layout, knobs):
    """C against float64 where K is no multiple of 64 (the TMA reading the last k step's columns
    past K as zeros): the GRU input GEMM's shape at H1760 on its 160-column tile, a
    warp-specialized tile, and K = 72 with a ragged N too.  Past a row's K in memory lie the next
    row's values (past the last row, whatever follows): read instead of zeros, they would put C
    far off; C is NaN-poisoned before each run."""
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    t = WgmmaGemmTemplate(*shape, b_layout=b_layout)
    _c_against_float64(t, t.build_program(_config(t, target, **knobs), target))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_gru_at_h1760_runs_its_input_gemm_on_wgmma_and_matches_float64(dtype):
    """DeepSpeech2's H1760 GRU (input 1760: K ragged, 3H = 5280) built without a config: its
    input GEMM on the TMA-loaded wgmma tile, against float64."""
    _gru_against_float64(1760, dtype, 5e-3 if dtype == "float16" else 3e-2, seed=0)


@pytest.mark.gpu
def test_cuda_ragged_n_with_b_stored_k_n_matches_float64():
    """B stored (K, N) with N = 3000 and K = 1000 (a GRU's input GEMM at H1000): the TMA reads
    B's columns past N and A's past K as zeros, C's stores stop at N; C a view of a NaN-poisoned
    buffer a tile row longer, whose tail must stay NaN."""
    from tvm_ext.target import resolve_target

    target = resolve_target("cuda")
    t = WgmmaGemmTemplate(1024, 3000, 1000, b_layout="KN")
    cfg = t.default_config(target)
    assert cfg.as_dict()["wgmma_tma"] == 1 and 3000 % cfg.as_dict()["wgmma_bn"]
    _c_against_float64(t, t.build_program(cfg, target))


@pytest.mark.gpu
def test_cuda_gru_at_h1000_matches_float64():
    """A GRU at H1000 (input 1000, 3H = 3000: K and N ragged on the wgmma input GEMM) built without
    a config, against float64 on reruns (T32: its input GEMM of 6.1 GFLOP runs on wgmma)."""
    _gru_against_float64(1000, "float16", 5e-3, seed=1)
