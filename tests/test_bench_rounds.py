"""The stable GEMM comparison's pure logic in ``benchmarks/common.py`` (no GPU, no torch): the
order the sides run in each round, the median of the per-round ratios and its summary, the
raw rounds file, nvidia-smi's output parsed (and a missing tool tolerated), shapes parsed."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def common():
    spec = importlib.util.spec_from_file_location("bench_common_rounds", os.path.join(ROOT, "benchmarks", "common.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_each_round_reverses_the_order_so_ours_runs_before_and_after_each_vendor(common):
    calls: list[str] = []
    seconds = {"ours": iter([2.0, 2.2, 1.8, 2.0, 2.1, 2.0]), "cuBLAS": iter([1.8, 2.0, 1.9, 1.6, 2.0, 1.8]),
               "cuBLASLt": iter([1.9, 2.1, 1.7, 1.8, 2.1, 1.9])}
    timers = {side: (lambda side=side: calls.append(side) or next(seconds[side])) for side in seconds}
    readings = iter(range(6))
    seen: list[int] = []
    rows = common.interleaved_rounds(timers, 6, lambda: common.GpuReading(1200.0 + next(readings), 690.0),
                                     on_round=lambda row: seen.append(row.index))
    forward, backward = ["ours", "cuBLAS", "cuBLASLt"], ["cuBLASLt", "cuBLAS", "ours"]
    assert calls == (forward + backward) * 3  # each side once a round, the order reversed every other round
    assert [r.order for r in rows] == [tuple(forward), tuple(backward)] * 3 and seen == list(range(6))
    assert [r.gpu.sm_clock_mhz for r in rows] == [1200.0 + i for i in range(6)]  # read after each round
    for side in forward:  # ours before the vendor in half the rounds, after it in the other half
        before = sum(r.order.index("ours") < r.order.index(side) for r in rows if side != "ours")
        assert side == "ours" or before == 3
    assert rows[1].seconds == {"ours": 2.2, "cuBLAS": 2.0, "cuBLASLt": 2.1}
    with pytest.raises(ValueError):
        common.interleaved_rounds(timers, 0, common.GpuReading)


def _rows(common, pairs, clocks=None, powers=None):
    clocks = clocks or [None] * len(pairs)
    powers = powers or [None] * len(pairs)
    return [common.RoundRow(i, ("ours", "cuBLAS"), {"ours": o, "cuBLAS": v}, common.GpuReading(c, p))
            for i, ((o, v), c, p) in enumerate(zip(pairs, clocks, powers))]


def test_the_median_is_of_the_per_round_ratios_not_a_ratio_of_medians_or_bests(common):
    # (ours s, cuBLAS s) per round; ratios 0.9, 0.8, 1.0, 0.5, 0.95 -> median 0.9
    pairs = [(0.200, 0.180), (0.230, 0.184), (0.190, 0.190), (0.400, 0.200), (0.200, 0.190)]
    rows = _rows(common, pairs, clocks=[1485.0, 1200.0, None, 1350.0, 1410.0], powers=[699.0, 700.5, 650.0, None, 688])
    s = common.ratio_summary(rows, "cuBLAS")
    assert s.median == pytest.approx(0.9)  # median of medians ratio would be 0.19/0.2 = 0.95
    assert (s.low, s.high) == (pytest.approx(0.5), pytest.approx(1.0))
    assert s.best_vs_best == pytest.approx(0.180 / 0.190)  # the vendor's best round against ours
    assert s.ours_median_s == pytest.approx(0.2) and s.vendor_median_s == pytest.approx(0.19)
    assert s.rounds == 5 and s.clock_mhz == (1200.0, 1485.0) and s.power_w == (650.0, 700.5)
    even = common.ratio_summary(_rows(common, [(1.0, 0.8), (1.0, 1.0), (1.0, 0.9), (1.0, 0.7)]), "cuBLAS")
    assert even.median == pytest.approx(0.85)  # two middle ratios averaged
    assert common.ratio_summary(_rows(common, pairs[:1]), "cuBLAS").clock_mhz is None  # never read
    with pytest.raises(ValueError):
        common.ratio_summary(rows, "cuBLASLt")
    cells = common.rounds_cells(s)
    header = common.rounds_header()
    assert len(cells) == len(header) and header[1].startswith("median ratio")  # the first ratio column
    assert [c for h, c in zip(header, cells) if "ratio" in h or "best" in h][0] == "0.900"
    assert cells[-2:] == ["1200–1485", "650–700"]


def test_the_raw_rounds_are_appended_as_json_lines(common, tmp_path):
    rows = _rows(common, [(0.2, 0.18), (0.25, 0.2)], clocks=[1485.0, None], powers=[699.5, None])
    path = tmp_path / "out" / "rounds.jsonl"
    common.write_rounds(str(path), "4096³", rows, dtype="float16")
    common.write_rounds(str(path), "8192³", rows[:1])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["shape"], r["round"]) for r in lines] == [("4096³", 0), ("4096³", 1), ("8192³", 0)]
    assert lines[0]["ratio"] == {"cuBLAS": pytest.approx(0.9)} and lines[0]["order"] == ["ours", "cuBLAS"]
    assert lines[1]["sm_clock_mhz"] is None and lines[0]["power_w"] == 699.5 and lines[0]["dtype"] == "float16"


def test_nvidia_smi_output_is_parsed_and_a_missing_or_failing_tool_reads_none(common):
    assert common.parse_gpu_reading("1485, 699.12\n") == common.GpuReading(1485.0, 699.12, "")
    na = common.parse_gpu_reading("1980, [N/A]\n")
    assert (na.sm_clock_mhz, na.power_w) == (1980.0, None) and "power" in na.note
    assert common.parse_gpu_reading("").sm_clock_mhz is None
    assert common.parse_gpu_reading("No devices were found").note.startswith("unexpected")

    asked = []

    def fake(args, **kwargs):
        asked.append(args)
        return subprocess.CompletedProcess(args, 0, "1395, 701.30\n", "")

    assert common.read_gpu("GPU-abc", run=fake) == common.GpuReading(1395.0, 701.3, "")
    assert asked == [["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                      "-i", "GPU-abc"]]

    def missing(args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "nvidia-smi")

    gone = common.read_gpu("0", run=missing)
    assert (gone.sm_clock_mhz, gone.power_w) == (None, None) and "FileNotFoundError" in gone.note
    failed = common.read_gpu("7", run=lambda a, **k: subprocess.CompletedProcess(a, 6, "", "No GPU at index 7\n"))
    assert failed.sm_clock_mhz is None and failed.note == "nvidia-smi exit 6: No GPU at index 7"
    hung = common.read_gpu("0", run=lambda a, **k: (_ for _ in ()).throw(subprocess.TimeoutExpired(a, 15)))
    assert hung.power_w is None and "TimeoutExpired" in hung.note
    # the real tool where this machine has none (or one): a reading either way, never an exception
    assert isinstance(common.read_gpu("0"), common.GpuReading)


def test_the_smi_device_is_torchs_uuid_else_the_first_visible_device(common):
    assert common.smi_device("3c2f1a-77", "2,3") == "GPU-3c2f1a-77"
    assert common.smi_device("GPU-3c2f1a-77", None) == "GPU-3c2f1a-77"
    assert common.smi_device(None, " 2,3") == "2"
    assert common.smi_device(None, None) == "0"


def test_shapes_are_names_or_mxnxk(common, capsys):
    named = {"4096": (4096, 4096, 4096), "gru_in": (8192, 3072, 1024)}
    got = common.parse_shapes("4096,1024x768x3072,8192,gru_in", named)
    assert got == [("4096", (4096, 4096, 4096)), ("1024x768x3072", (1024, 768, 3072)),
                   ("8192x8192x8192", (8192, 8192, 8192)), ("gru_in", (8192, 3072, 1024))]
    assert common.parse_shapes("1024x768", named) is None
    assert capsys.readouterr().err.startswith("error: bad shape '1024x768'")
    assert common.parse_shapes("0x5x5", named) is None


def test_gemm_benchmark_peers_are_label_knob_values_and_a_bad_one_is_one_error_line():
    """``gemm_tensor_core.py --peers``: configs in the same rounds as the pick, each the pick with
    knobs changed; a part without a label, a knob or an integer value is refused (exit 2)."""
    spec = importlib.util.spec_from_file_location("bench_gemm_tc", os.path.join(ROOT, "benchmarks",
                                                                                "gemm_tensor_core.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.parse_peers("nopdl:wgmma_pdl=0; mc:wgmma_ws=1,wgmma_multicast=1;") == {
        "nopdl": {"wgmma_pdl": 0}, "mc": {"wgmma_ws": 1, "wgmma_multicast": 1}}
    assert module.parse_peers("") == {}
    for bad in ("wgmma_pdl=0", "x:", "x:wgmma_pdl=on", ":wgmma_pdl=1"):
        with pytest.raises(ValueError, match="--peers takes"):
            module.parse_peers(bad)
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gemm_tensor_core.py"), "--peers",
                          "x:wgmma_pdl=on"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "error: --peers takes" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("probe, args, needle", [
    ("vendor_kernels.py", ["--shapes", "1024x768"], "error: --shapes takes MxNxK"),
    ("vendor_kernels.py", ["--ours", "--ours-peers", "x:"], "error: --ours-peers takes"),
    ("multicast_probe.py", ["--cases", "fp8_4096,nope"], "error: --cases takes names of"),
    ("gru_kernel_times.py", ["--cases", "64x2048"], "error: --cases takes BATCH:HIDDEN"),
    ("gru_kernel_times.py", ["--variants", "pick;x:"], "error: --variants takes"),
    ("wgmma_pick_probe.py", ["--shapes", "1024x768"], "error: bad shape '1024x768'"),
    ("wgmma_pick_probe.py", ["--rounds", "0"], "error: --rounds must be at least 1"),
])
def test_the_gemm_probes_refuse_bad_input_with_one_error_line(probe, args, needle):
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "probes", probe), *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [run.stderr.strip().splitlines()[0]]
    assert run.stderr.startswith(needle)


def test_the_pick_probe_turns_a_rule_off_for_its_peer_and_back_on():
    """``wgmma_pick_probe``'s peer is the pick with one rule answering False: at 1024x768x2048 the
    narrow whole-wave tile without ``narrow_whole_wave``, the pick again after; every rule it
    offers is a predicate of the template module."""
    from tvm_ext.schedules.gemm import wgmma_template
    from tvm_ext.schedules.gemm.wgmma import WgmmaTile
    from tvm_ext.target import offline_cuda

    spec = importlib.util.spec_from_file_location("wgmma_pick_probe", os.path.join(ROOT, "benchmarks", "probes",
                                                                                     "wgmma_pick_probe.py"))
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    target = offline_cuda()
    template = wgmma_template.WgmmaGemmTemplate(1024, 768, 2048)

    def tile():
        return WgmmaTile.of(template.default_config(target))

    assert (tile().bm, tile().bn, tile().specialized) == (64, 96, True)
    with probe.rule_off("narrow_whole_wave"):
        assert (tile().bm, tile().bn) != (64, 96)
    assert (tile().bm, tile().bn) == (64, 96)
    assert all(callable(getattr(wgmma_template, name)) for name in probe.RULES)
