"""Issue 4/6: the XGBoost predictor stage, method 002's analytic tile, the replay runner.

Strategies run through the real Tuner on recorded sweeps (H100 CUDA and PoCL OpenCL
measurements shipped in benchmarks/data), the CLI runs real kernels on PoCL, and ptxas
is the installed nvcc.  Small sub-sweeps keep every strategy's full-budget run short.
"""
from __future__ import annotations

import glob
import gzip
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tvm_ext.cost_model.analytic import AnalyticRules, analytic_seeds, select_tile
from tvm_ext.cost_model.compare import STRATEGIES, SearchSettings, replay_run
from tvm_ext.cost_model.features import Featurizer
from tvm_ext.cost_model.hardware import HardwareModel
from tvm_ext.cost_model.model import XGBCostModel, model_path, normalized_throughput, spearman
from tvm_ext.cost_model.ptxas import PtxasCache, parse_ptxas
from tvm_ext.cost_model.replay import (MemoryRecordStore, NearestRecorded, ReplayBuilder, ReplayRunner,
                                       ReplayTemplate, Sweep)
from tvm_ext.cost_model.search import ModelGuidedSearch
from tvm_ext.core.records import Record
from tvm_ext.schedules.gemm.simt import GemmTemplate
from tvm_ext.core.space import Knob, Space
from tvm_ext.target import TargetInfo, offline_cuda
from tvm_ext.core.template import Workload
from tvm_ext.core.tuner import Tuner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "benchmarks", "data")
SWEEPS = sorted(glob.glob(os.path.join(DATA, "sweep_gemm_*.jsonl.gz")))
CUDA_SWEEP = os.path.join(DATA, "sweep_gemm_cuda_2048x2048x2048.jsonl.gz")
CUDA_4096_RECORDS = os.path.join(DATA, "gemm_cuda_4096_h100_ga.jsonl.gz")


def sub_sweep(path: str, out_dir, count: int, seed: int = 7) -> Sweep:
    """A replayable sweep of ``count`` recorded configs (always including the best)."""
    full = Sweep.load(path)
    rng = np.random.default_rng(seed)
    best = full.entries.index(full.best)
    keep = sorted(set(rng.choice(len(full.entries), size=count - 1, replace=False).tolist()) | {best})
    name = os.path.join(str(out_dir), os.path.basename(path).replace(".jsonl.gz", f".sub{count}.jsonl.gz"))
    with gzip.open(name, "wt") as fh:
        fh.write(json.dumps({**full.header, "measured": len(keep)}) + "\n")
        for i in keep:
            e = full.entries[i]
            fh.write(json.dumps({"config": e.config.as_dict(), "cost": e.cost if math.isfinite(e.cost) else None,
                                 "error_kind": e.error_kind}) + "\n")
    return Sweep.load(name)


@pytest.fixture(scope="module", params=SWEEPS, ids=lambda p: os.path.basename(p).split(".")[0])
def small_sweep(request, tmp_path_factory):
    return sub_sweep(request.param, tmp_path_factory.mktemp("sweeps"), 96)


# ---- replay ---------------------------------------------------------------------------------

def test_replay_answers_recorded_costs_and_rejects_unrecorded(small_sweep):
    template, target = ReplayTemplate(small_sweep.template(), small_sweep), small_sweep.target()
    tuner = Tuner(template, target, ReplayBuilder(small_sweep), ReplayRunner(small_sweep), MemoryRecordStore())
    entries = small_sweep.entries[:5]
    costs = tuner.evaluate([e.config for e in entries])
    np.testing.assert_array_equal(costs, [e.cost for e in entries])
    assert tuner.trials == 5
    # replayed records name their timer, so a rerun on them resumes (``Record.timed_before_timers``)
    assert all(not r.timed_before_timers for r in map(tuner.record_of, (e.config for e in entries)) if r.ok)
    assert any(tuner.record_of(e.config).ok for e in entries)
    outside = next(c for c in (template.default_config(target),
                               *[tuner.space.decode(r)
                                 for r in tuner.space.random_indices(np.random.default_rng(0), 50)])
                   if c not in small_sweep.costs)
    assert math.isinf(tuner.evaluate([outside])[0]) and tuner.trials == 5  # infeasible: no trial
    assert Workload.of(template, target).as_json()["template_hash"] == small_sweep.header["workload"]["template_hash"]


def test_nearest_recorded_moves_offspring_onto_new_recorded_configs(small_sweep):
    space = ReplayTemplate(small_sweep.template(), small_sweep).space(small_sweep.target())
    rng = np.random.default_rng(1)
    repair = NearestRecorded(space)
    seen = set()
    for _ in range(3):
        rows = repair(space.random_indices(rng, 16), rng)
        flats = set(space.flat(rows).tolist())
        assert space.feasible_mask(rows).all() and len(flats) == 16 and not flats & seen
        seen |= flats
    # an exact recorded row stays where it is when it is free
    row = space.encode(small_sweep.entries[0].config)[None]
    np.testing.assert_array_equal(space.nearest_recorded(row, rng, set()), row)


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "analytic"])
def test_every_strategy_finds_the_recorded_best_given_the_whole_budget(small_sweep, strategy):
    run = replay_run(small_sweep, strategy, seed=3, settings=SearchSettings(population=8, ng=32, nm=8))
    assert run.best_fraction == 1.0
    assert len(run.costs) <= len(small_sweep.entries)  # nothing measured twice
    assert run.trials_to(1.0) is not None


def test_analytic_needs_no_trial_and_picks_a_recorded_config(small_sweep):
    run = replay_run(small_sweep, "analytic", seed=0)
    assert run.trials_to(0.0) == 0 and 0.0 < run.best_fraction <= 1.0
    assert len(run.costs) == 1 and math.isfinite(run.costs[0])


def test_ga_with_xgb_beats_plain_ga_on_the_h100_sweep():
    """A short version of benchmarks/search_efficiency.py: median of 3 seeds, whole sweep."""
    sweep = Sweep.load(CUDA_SWEEP)
    xgb = [replay_run(sweep, "ga+xgb", seed, stop_at=0.95).trials_to(0.95) for seed in (1000, 1001, 1002)]
    ga = [replay_run(sweep, "ga", seed, stop_at=0.95).trials_to(0.95) for seed in (1000, 1001, 1002)]
    assert None not in xgb and None not in ga
    assert np.median(xgb) <= 0.05 * len(sweep.entries)
    assert np.median(xgb) < np.median(ga)


# ---- the model ------------------------------------------------------------------------------

def _train(sweep: Sweep, n: int, seed: int, transfer=()) -> tuple[XGBCostModel, list, list]:
    template, target = ReplayTemplate(sweep.template(), sweep), sweep.target()
    order = np.random.default_rng(seed).permutation(len(sweep.entries))
    train = [sweep.entries[i] for i in order[:n]]
    test = [sweep.entries[i] for i in order[n:]]
    model = XGBCostModel(template, target, seed=seed)
    if transfer:
        model.add_records(transfer, Workload.of(template, target).key)
    model.observe([e.config for e in train], [e.cost for e in train])
    model.fit()
    return model, train, test


def test_normalized_throughput_and_spearman():
    np.testing.assert_allclose(normalized_throughput(np.array([2.0, 1.0, math.inf, 4.0])), [0.5, 1.0, 0.0, 0.25])
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_features_are_finite_and_named(small_sweep):
    template, target = ReplayTemplate(small_sweep.template(), small_sweep), small_sweep.target()
    feats = Featurizer(template, target)
    x = feats([e.config for e in small_sweep.entries])
    assert x.shape == (len(small_sweep.entries), len(feats.names))
    ptx = [feats.names.index("ptxas_regs"), feats.names.index("ptxas_spill_bytes")]
    assert np.isnan(x[:, ptx]).all()  # no ptxas cache: unknown, not invented
    assert np.isfinite(np.delete(x, ptx, axis=1)).all()
    assert {"threads", "occupancy", "waves", "intensity_total", "shared_bytes", "log2_m"} <= set(feats.names)


def test_model_save_load_round_trip(tmp_path):
    sweep = sub_sweep(CUDA_SWEEP, tmp_path, 200)
    model, _, test = _train(sweep, 64, seed=0)
    path = model_path(tmp_path / "records.jsonl")
    assert path.endswith("records.xgb.json")
    model.save(path)
    loaded = XGBCostModel.load(path, model.template, model.target)
    configs = [e.config for e in test]
    np.testing.assert_array_equal(model.predict(configs), loaded.predict(configs))
    other = GemmTemplate(64, 64, 64)
    with pytest.raises(Exception, match="cannot load"):
        XGBCostModel.load(tmp_path / "missing.xgb.json", other, model.target)


def test_model_ranks_held_out_configs():
    model, _, test = _train(Sweep.load(CUDA_SWEEP), 128, seed=0)
    pred = model.predict([e.config for e in test])
    assert spearman(pred, [1 / e.cost for e in test]) > 0.7


def test_transfer_warm_start_is_no_worse_than_cold_on_a_held_out_shape():
    """Real H100 records of GEMM 4096³ warm-start the model of the held-out 2048³ sweep."""
    sweep = Sweep.load(CUDA_SWEEP)
    with gzip.open(CUDA_4096_RECORDS, "rt") as fh:
        transfer = [Record.from_json(line) for line in fh]
    assert {r.workload["params"]["m"] for r in transfer} == {4096}
    zero_shot, _, test = _train(sweep, 0, seed=0, transfer=transfer)
    assert zero_shot.ready and zero_shot.trained_on == 0  # ranks before any 2048³ measurement
    cold_rho, warm_rho = [], []
    for seed in range(4):
        for rho, extra in ((cold_rho, ()), (warm_rho, transfer)):
            model, _, test = _train(sweep, 16, seed, extra)
            rho.append(spearman(model.predict([e.config for e in test]), [1 / e.cost for e in test]))
    assert np.median(warm_rho) >= np.median(cold_rho)
    cold = [replay_run(sweep, "ga+xgb", s, stop_at=0.95).trials_to(0.95) for s in (1000, 1001)]
    warm = [replay_run(sweep, "ga+xgb", s, stop_at=0.95, transfer=transfer).trials_to(0.95) for s in (1000, 1001)]
    assert None not in warm and np.median(warm) <= np.median(cold)


# ---- the predictor stage -------------------------------------------------------------------

def test_predictor_stage_falls_back_to_plain_ga_then_ranks(small_sweep):
    template, target = ReplayTemplate(small_sweep.template(), small_sweep), small_sweep.target()
    tuner = Tuner(template, target, ReplayBuilder(small_sweep), ReplayRunner(small_sweep), MemoryRecordStore(),
                  trials=40)
    model = XGBCostModel(template, target, seed=0)
    lines = []
    search = ModelGuidedSearch(tuner.space, np.random.default_rng(0), model, size_pop=6, ng=24, nm=5,
                               explore=0.2, generations=5, repair=NearestRecorded(tuner.space), log=lines.append)
    first = search.propose()
    assert len(first) == 6 and not model.ready  # generation 0: the plain GA's population
    search.observe(first, tuner.evaluate([tuner.space.decode(r) for r in first]))
    assert not model.ready and "plain GA" in lines[-1]  # 6 < 8 records: still no model
    for _ in range(3):
        batch = search.propose()
        assert len(batch) == 5
        search.observe(batch, tuner.evaluate([tuner.space.decode(r) for r in batch]))
    assert model.ready and "ρ=" in lines[-1] and len(search.rank_correlations) >= 1


def test_predictor_measures_the_top_nm_plus_an_exploration_share():
    space = Space(tuple(Knob(f"g{i}", tuple(range(6))) for i in range(4)))

    class Oracle:  # a perfect "model" of the cost below: the top picks must be the fastest
        ready = True

        def predict(self, configs):
            return np.array([-sum(c.as_dict().values()) for c in configs], dtype=float)

        def observe(self, configs, costs):
            pass

        def fit(self):
            pass

    search = ModelGuidedSearch(space, np.random.default_rng(0), Oracle(), size_pop=8, ng=40, nm=10, explore=0.2,
                               generations=3)
    pop = search.propose()
    search.observe(pop, pop.sum(axis=1) + 1.0)
    pool = search._breed(40)
    chosen = search._select(pool, 10)
    sums = np.sort(pool.sum(axis=1))
    picked = np.sort(chosen.sum(axis=1))
    assert len(chosen) == 10
    np.testing.assert_array_equal(picked[:8], sums[:8])  # 8 = nm·(1 − 0.2) best by the model


# ---- method 002 ----------------------------------------------------------------------------

SYNTHETIC = TargetInfo(kind="cuda", device_name="synthetic", arch="sm_86", max_threads_per_block=512,
                       max_shared_memory_per_block=16 * 1024, warp_size=32, compute_units=20)


def test_hardware_model_reads_target_and_arch():
    hw = HardwareModel.from_target(SYNTHETIC)
    assert (hw.sm_count, hw.max_threads_per_block, hw.max_threads_per_sm, hw.shared_per_block) == (20, 512, 1536, 16384)
    assert hw.registers_per_sm == 65536 and hw.mma_min_m == 16
    # 256 threads × 128 registers = half the register file: 2 blocks, 512 of 1536 threads resident
    assert hw.blocks_per_sm(np.array([256]), np.array([128]), np.array([0]))[0] == 2
    cpu = HardwareModel.from_target(TargetInfo(kind="opencl", is_cpu=True, compute_units=4, max_threads_per_block=4096))
    assert cpu.registers_per_sm == 0 and cpu.sm_count == 4


@pytest.mark.parametrize("shape", [(1024, 1024, 1024), (512, 256, 128), (127, 513, 65)])
def test_analytic_pick_respects_hardware_limits_and_the_filters(shape):
    gemm = GemmTemplate(*shape)
    rules = AnalyticRules()
    result = select_tile(gemm, SYNTHETIC, rules=rules)
    pick, hw = result.pick, result.hardware
    cfg = pick.config
    assert gemm.space(SYNTHETIC).is_feasible(cfg)
    assert cfg.wg_x * cfg.wg_y <= SYNTHETIC.max_threads_per_block
    assert gemm.shared_bytes(cfg) <= SYNTHETIC.max_shared_memory_per_block
    assert [name[:2] for name, _ in result.steps] == ["1.", "2a", "2b", "3.", "4.", "5."]
    counts = [n for _, n in result.steps]
    assert counts == sorted(counts, reverse=True) and counts[-1] >= 1  # each step narrows, never to nothing
    # step 2a: 16 <= threads per direction <= 512/16 = 32
    assert 16 <= pick.threads_m <= 32 and 16 <= pick.threads_n <= 32
    # step 2b: register-limited residency above the threshold
    assert pick.resident_threads_by_registers >= rules.min_resident_share * hw.max_threads_per_sm
    survivors = [c for c in result.ranked if 16 <= c.threads_m <= 32 and 16 <= c.threads_n <= 32
                 and c.resident_threads_by_registers >= rules.min_resident_share * hw.max_threads_per_sm]
    full = [c for c in survivors if c.blocks >= hw.sm_count]
    if "none pass" not in result.steps[3][0]:
        assert pick.blocks >= hw.sm_count  # step 3: every SM gets a block
    else:
        full = survivors
    assert pick.intensity == pytest.approx(max(c.intensity for c in full))  # step 4


def test_analytic_keeps_its_input_when_a_filter_would_empty_it():
    result = select_tile(GemmTemplate(8, 8, 8), SYNTHETIC)  # one block at most: step 3 cannot hold
    assert any(name.startswith("3.") and "none pass" in name for name, _ in result.steps)
    assert result.pick.blocks >= 1


def test_analytic_seeds_are_distinct_tiles_and_only_for_gemm(opencl):
    gemm = GemmTemplate(256, 256, 256)
    seeds = analytic_seeds(gemm, SYNTHETIC, count=3)
    assert len(seeds) == 3 and seeds[0] == select_tile(gemm, SYNTHETIC).config
    tiles = {(c.wg_x * c.task_x, c.wg_y * c.task_y, c.wg_x, c.wg_y) for c in seeds}
    assert len(tiles) == 3

    class NotGemm(GemmTemplate):
        name = "other"

    assert analytic_seeds(NotGemm(8, 8, 8), opencl) == []


# ---- ptxas features --------------------------------------------------------------------------

def test_parse_ptxas_output():
    text = ("ptxas info    : Function properties for main_kernel\n"
            "    0 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads\n"
            "ptxas info    : Used 96 registers, used 1 barriers, 16384 bytes smem\n")
    info = parse_ptxas(text)
    assert info.registers == 96 and info.spill_bytes == 40
    assert parse_ptxas("nothing here") is None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_ptxas_features_from_nvcc(tmp_path):
    target = offline_cuda()
    gemm = GemmTemplate(256, 256, 256)
    cfg = gemm.space(target).make(wg_x=16, wg_y=16, task_x=4, task_y=4, k_step=8, use_shared=1, pad=0,
                                  unroll=64, vec=4, double_buffer=0, a_transposed=1)
    cache = PtxasCache(tmp_path / "p.json")
    assert cache.fill(gemm, [cfg], target, workers=1) == 1  # TVM source + nvcc in a worker process
    info = PtxasCache(tmp_path / "p.json").lookup(gemm, cfg, target)  # saved, read back
    assert info is not None and 16 <= info.registers <= 255 and info.spill_bytes >= 0
    assert cache.fill(gemm, [cfg], target, workers=1) == 0  # cached: nothing recompiled
    feats = Featurizer(gemm, target, PtxasCache(tmp_path / "p.json"))
    row = feats([cfg])[0]
    assert row[feats.names.index("ptxas_regs")] == info.registers


# ---- the CLI on PoCL --------------------------------------------------------------------------

CLI = [sys.executable, "-m", "tvm_ext.tune"]


def test_cli_ga_with_xgb_writes_records_and_the_model(tmp_path):
    rec = tmp_path / "r.jsonl"
    args = ["gemm", "--shape", "40,32,24", "--generations", "2", "--population", "8", "--nm", "4",
            "--records", str(rec), "--no-progress", "--seed", "1", "--cost-model", "xgb", "--workers", "1"]
    p = subprocess.run(CLI + args, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    lines = rec.read_text().splitlines()
    assert len(lines) >= 9 and all(json.loads(line)["workload"]["template"] == "gemm" for line in lines)
    assert "generation 1:" in p.stderr and "predictor" in p.stderr
    model = tmp_path / "r.xgb.json"
    assert model.exists() and "ρ=" in p.stderr
    args[args.index("--generations") + 1] = "1"
    again = subprocess.run(CLI + args, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"loaded {model}" in again.stderr


def test_cli_analytic_prints_and_measures_once(tmp_path):
    rec = tmp_path / "r.jsonl"
    p = subprocess.run(CLI + ["gemm", "--shape", "64,64,64", "--strategy", "analytic", "--records", str(rec)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "config: wg_x=" in p.stdout and "measured:" in p.stdout and "GFLOP/s" in p.stdout
    assert "5. fewest kernel launches" in p.stdout
    assert len(rec.read_text().splitlines()) == 1
    dry = subprocess.run(CLI + ["gemm", "--shape", "2048,2048,2048", "--strategy", "analytic", "--target", "cuda",
                                "--no-measure", "--records", str(tmp_path / "none.jsonl")],
                         capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0 and "config: wg_x=16 wg_y=16" in dry.stdout and "measured" not in dry.stdout


def test_cli_rejects_a_cost_model_without_the_ga(tmp_path):
    p = subprocess.run(CLI + ["gemm", "--shape", "8,8,8", "--strategy", "random", "--cost-model", "xgb",
                              "--records", str(tmp_path / "r.jsonl")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().startswith("error: --cost-model needs --strategy ga")


def test_records_older_than_a_knob_still_teach_the_model():
    """wgmma records written before ``wgmma_tma`` (their configs lack it) are another shape's
    measurements of kernels that loaded by cp.async: the model takes them as transfer data with
    the knob at that value, rather than dropping every one for a missing knob."""
    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate
    from tvm_ext.target import offline_cuda

    target = offline_cuda()
    template, other = WgmmaGemmTemplate(1024, 1024, 1024), WgmmaGemmTemplate(2048, 1024, 1024)
    space = other.space(target)
    workload = Workload.of(other, target)
    rng = np.random.default_rng(0)
    configs = [c for c in (space.decode(i) for i in space.random_feasible_indices(rng, 40)) if not c.wgmma_tma][:12]
    old = [Record(workload.key, workload.as_json(), {k: v for k, v in c.as_dict().items() if k != "wgmma_tma"},
                  (float(rng.uniform(1e-4, 1e-3)),)) for c in configs]
    model = XGBCostModel(template, target)
    assert len(configs) >= 2 and model.add_records(old, Workload.of(template, target).key) == len(configs)
