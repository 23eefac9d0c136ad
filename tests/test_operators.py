"""The operator registry (``tvm_ext.operators.OPERATORS``): every entry can be tuned from the
CLI, written to a records file and rebuilt from it, shown and exported, or says in
``unsupported`` what it cannot do; and one new entry is all the CLI needs to offer an operator.

CUDA code is generated for the offline sm_90 target (Hopper's wgmma and 3xTF32 need it); nothing
runs on a GPU."""
from __future__ import annotations

import dataclasses
import json

import pytest

from tvm_ext.operators import (CAPABILITIES, OPERATORS, Operator, PrecisionCommand, TuneCommand, template_names,
                               template_of)
from tvm_ext.core.records import Record, RecordStore
from tvm_ext.target import offline_cuda
from tvm_ext.core.template import Template, Workload
from tvm_ext.tune import build_parser, main

TARGET = offline_cuda("sm_90")


def _example(op: Operator) -> Template:
    """A small instance of ``op``: made by its tune subcommand from the example arguments, or
    rebuilt from the entry's example params."""
    if op.tune is None:
        return op.rebuild(op.example)
    args = build_parser().parse_args([op.tune.command, *op.tune_selector, *op.tune.example, "--target", "cuda"])
    return args.make_template(args).for_target(TARGET)


def _write_record(template: Template, path: str) -> Record:
    """A correct record of ``template``'s default config, as a tuner appends it."""
    workload = Workload.of(template, TARGET)
    record = Record(workload_key=workload.key, workload=workload.as_json(),
                    config=template.default_config(TARGET).as_dict(), costs=(1e-4, 1.1e-4, 0.9e-4),
                    metrics={"timer": "cuda graph"}, strategy="ga", run="test")
    RecordStore(path).append(record)
    return record


def test_every_entry_is_complete():
    assert template_names() == tuple(sorted(OPERATORS))
    for name, op in OPERATORS.items():
        assert op.name == name
        assert set(op.unsupported) <= set(CAPABILITIES)
        assert all(reason.strip() for reason in op.unsupported.values()), name
        assert op.template_class().name == name  # the name records carry
        assert (op.tune is None) == ("tune" in op.unsupported), name


def test_every_template_in_schedules_is_registered():
    """A template class in ``tvm_ext.schedules`` without an entry would be one records cannot
    rebuild (``show`` without speeds, ``export`` refused, the cost model skipping it)."""
    import importlib
    import inspect
    import pkgutil

    import tvm_ext.schedules as schedules

    found = set()
    for info in pkgutil.walk_packages(schedules.__path__, schedules.__name__ + "."):
        module = importlib.import_module(info.name)
        found |= {cls.name for _, cls in inspect.getmembers(module, inspect.isclass)
                  if issubclass(cls, Template) and not inspect.isabstract(cls) and cls.__module__ == module.__name__}
    assert found and found <= set(OPERATORS), sorted(found - set(OPERATORS))


@pytest.mark.parametrize("name", list(OPERATORS))
def test_the_cli_makes_each_template_or_the_entry_says_why_not(name):
    op = OPERATORS[name]
    commands = {c.dest: c for c in build_parser()._subparsers._group_actions}["command"].choices
    if op.tune is None:
        assert "tune" in op.unsupported
        return
    assert op.tune.command in commands
    assert _example(op).name == name


def test_relax_matchers_belong_to_one_operator_each():
    from tvm_ext.relax.tasks import MATCHERS

    claimed = [m for op in OPERATORS.values() for m in op.matchers]
    assert sorted(claimed) == sorted(MATCHERS)  # every matcher names its operator, once


def test_mixed_precision_subcommands_come_from_the_registry():
    parser = build_parser()
    for op in OPERATORS.values():
        if op.precision is None:
            continue
        args = parser.parse_args(["mixed-precision", op.name, *op.precision.example])
        assert args.make_operator(args).name == op.name
        assert set(op.precision_params) and all(isinstance(p, str) for p in op.precision_params)


@pytest.mark.parametrize("name", list(OPERATORS))
def test_each_template_round_trips_through_a_records_file_show_and_export(name, tmp_path, capsys):
    op = OPERATORS[name]
    template = _example(op)
    path = str(tmp_path / "records.jsonl")
    written = _write_record(template, path)

    (read,) = list(RecordStore(path))  # read back from disk: JSON lists for tuples
    rebuilt = template_of(read.workload)
    assert rebuilt == template
    space = rebuilt.space(TARGET)
    assert space.outside_reason(read.config_obj()) is None
    assert space.make(**read.config).as_dict() == written.config

    assert main(["show", path]) == 0
    out = capsys.readouterr().out
    assert template.describe() in out and "1 workload" in out
    assert ("GFLOP/s" if template.flops() else "GB/s") in out  # the speed, from the rebuilt template

    out_dir = tmp_path / "kernel"
    code = main(["export", path, "--out", str(out_dir)])
    captured = capsys.readouterr()
    if "export" in op.unsupported:
        assert code == 2
        assert captured.err.strip().splitlines() == [f"error: export does not support {name}: "
                                                     f"{op.unsupported['export']}"]
        return
    assert code == 0, captured.err
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["operator"] == name and manifest["schedule"] == written.config
    assert (out_dir / "program.cu").read_text().strip()
    assert (out_dir / "program.so").read_bytes()[:4] == b"\x7fELF"


@pytest.mark.parametrize("precision", [{}, {"x": "float16", "w_ih": "float16"}])
def test_records_of_a_gru_on_hopper_rebuild_its_tensor_core_and_wgmma_tiles(precision, tmp_path):
    """The tiles ``for_target`` picks are recorded as text (tensor-core knobs, wgmma tile names)."""
    from tvm_ext.schedules.gru import GruTemplate

    template = GruTemplate(16, 256, 256, 64).with_precision(precision).for_target(TARGET)
    tiles = {k for k in ("in_tensor_core", "in_split_tensor_core", "in_split_wgmma", "in_split_tf32", "in_wgmma")
             if k in template.params}
    assert tiles & {"in_split_wgmma", "in_wgmma"}
    path = str(tmp_path / "gru.jsonl")
    _write_record(template, path)
    (read,) = list(RecordStore(path))
    assert template_of(read.workload) == template


def test_a_wgmma_record_from_before_the_split_knobs_exports_the_kernel_it_measured(tmp_path, capsys):
    """Knobs added since a record was written (``Knob.before``) take the value that builds the
    kernel it measured."""
    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate

    template = WgmmaGemmTemplate(256, 256, 256, b_layout="KN")
    space = template.space(TARGET)
    added = {knob.name: knob.before for knob in space.knobs if knob.before is not None}
    assert added == {"wgmma_tiles": 1, "wgmma_split_k": 1, "wgmma_split_cluster": 0, "wgmma_tma": 0, "wgmma_ws": 0,
                     "wgmma_multicast": 0, "wgmma_pdl": 0, "wgmma_wg_cols": 1, "wgmma_c_turns": 0, "wgmma_wg_k": 1}
    config = space.make(**{**template.default_config(TARGET).as_dict(), **added})
    assert space.infeasible_reason(config) is None
    workload = dataclasses.replace(Workload.of(template, TARGET), template_hash="0" * 16)  # an earlier version's
    old = {k: v for k, v in config.as_dict().items() if k not in added}
    path = str(tmp_path / "old.jsonl")
    RecordStore(path).append(Record(workload.key, workload.as_json(), old, (1e-4,), metrics={"timer": "cuda graph"}))
    assert main(["export", path, "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["schedule"] == config.as_dict()
    assert (tmp_path / "out" / "program.cu").read_text() == template.build_program(config, TARGET).source


def test_a_gru_record_from_before_the_accumulator_sets_exports_its_kernel(tmp_path, capsys):
    """A tensor-core GRU record without ``step_tc_acc``, ``step_tc_frag``, ``step_tc_wreg`` and
    ``step_tc_poll`` (written before them) exports with one accumulator set, no fragments ahead,
    W in shared memory and 8-byte polls, the kernel it measured."""
    from tvm_ext.schedules.gru import GruTemplate

    half = {name: "float16" for name in ("x", "w_ih", "gi", "w_hh", "h", "out")}
    template = GruTemplate(batch=8, hidden=64, input=64, seq=4).with_precision(half).with_tensor_cores(TARGET)
    pick = template.analytic_pick(TARGET)[0]
    assert pick.step_tc == 1 and pick.step_tc_acc == 1 and pick.step_tc_frag == 0 and pick.step_tc_wreg == 0
    assert pick.step_tc_poll == 16
    config = pick.replace(step_tc_poll=8)  # the kernel a record from before the knob measured
    workload = dataclasses.replace(Workload.of(template, TARGET), template_hash="0" * 16)  # an earlier version's
    old = {k: v for k, v in config.as_dict().items()
           if k not in ("step_tc_acc", "step_tc_frag", "step_tc_wreg", "step_tc_poll")}
    path = str(tmp_path / "old.jsonl")
    RecordStore(path).append(Record(workload.key, workload.as_json(), old, (1e-4,), metrics={"timer": "host"}))
    assert main(["export", path, "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["schedule"] == config.as_dict()


def test_a_record_naming_other_dtypes_is_not_a_wgmma_gemm():
    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate

    params = Workload.of(WgmmaGemmTemplate(128, 128, 128, batch=(2, 3)), TARGET).as_json()["params"]
    assert template_of({"template": "gemm_wgmma", "params": params}) is not None
    assert template_of({"template": "gemm_wgmma", "params": {**params, "c_dtype": "float32"}}) is None


# ---- one entry is all it takes ------------------------------------------------------------------------------
def _toy_template_class():
    """A new operator's template, standing in: a reduction under another name."""
    from tvm_ext.schedules.reduce.reduction import ReductionTemplate

    @dataclasses.dataclass(frozen=True)
    class ToyTemplate(ReductionTemplate):
        name = "toy"

    return ToyTemplate


TOY_CLASS = _toy_template_class()


def _toy_template(args):
    return TOY_CLASS((int(args.size),))


TOY = Operator(
    "toy", lambda: TOY_CLASS,
    tune=TuneCommand("toy", help="a toy operator", description="A reduction under another name.",
                     knobs=lambda: TOY_CLASS((8,)).space(TARGET).knobs,
                     add_arguments=lambda p: p.add_argument("--size", required=True),
                     make_template=_toy_template, example=("--size", "1024")),
    precision=PrecisionCommand(help="a toy precision search", add_arguments=lambda p: p.add_argument("--size"),
                               make_operator=_toy_template, tensor_cores=lambda base, args, target: base,
                               example=("--size", "1024")),
    unsupported={"export": "a toy is never exported"})


def test_a_new_entry_appears_in_the_cli_parser():
    registry = {**OPERATORS, "toy": TOY}
    parser = build_parser(registry)
    args = parser.parse_args(["toy", "--size", "1024", "--trials", "3"])
    assert args.make_template(args) == TOY_CLASS((1024,)) and args.trials == 3  # the shared tuning options too
    mp = parser.parse_args(["mixed-precision", "toy", "--size", "64"])
    assert mp.make_operator(mp) == TOY_CLASS((64,))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["toy", "--size", "1024"])  # the registry itself is untouched


def test_a_new_entry_is_rebuilt_from_records_and_its_unsupported_export_is_one_error_line(
        monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(OPERATORS, "toy", TOY)
    template = TOY_CLASS((1024,))
    path = str(tmp_path / "toy.jsonl")
    _write_record(template, path)
    (read,) = list(RecordStore(path))
    assert template_of(read.workload) == template
    assert main(["show", path]) == 0 and "GB/s" in capsys.readouterr().out
    assert main(["export", path, "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.splitlines() == ["error: export does not support toy: a toy is never exported"]
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_an_entry_must_say_why_it_lacks_a_capability():
    with pytest.raises(ValueError, match="unknown capabilities"):
        dataclasses.replace(TOY, unsupported={"fly": "no wings"})
    with pytest.raises(ValueError, match="tune subcommand"):
        dataclasses.replace(TOY, tune=None)


def test_the_registry_imports_a_schedule_only_when_its_template_is_asked_for():
    """Importing the registry (what the CLI's start does) loads no schedule module; asking an
    entry for its class loads that one's."""
    import subprocess
    import sys

    code = ("import sys, tvm_ext.operators as o\n"
            "loaded = lambda: sorted(m for m in sys.modules if m.startswith('tvm_ext.schedules.'))\n"
            "before = loaded()\n"
            "cls = o.get_template_class('reduce')\n"
            "print(before, cls.__name__, 'tvm_ext.schedules.reduce.reduction' in loaded(),\n"
            "      'tvm_ext.schedules.gru' in loaded())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "ReductionTemplate", "True", "False"]
