"""Knobs renamed or added since records were written (``records.RENAMED_KNOBS``, ``Knob.before``):
records and exported configs naming the warpgroup MMA's knobs by their earlier names (``wg_*``)
read back under today's (``wgmma_*``), and records without a knob added since read back at its
earlier value; each builds the kernel it measured."""
from __future__ import annotations

import gzip
import json
import os

import pytest

from tvm_ext.operators import operator_named
from tvm_ext.core.records import RecordStore
from tvm_ext.target import offline_cuda
from tvm_ext.core.template import Workload
from tvm_ext.tune import main

TARGET = offline_cuda("sm_90")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100_RECORDS = os.path.join(ROOT, "benchmarks", "data")
EARLIER_OPERATORS_FILE = os.path.join(ROOT, "tests", "data", "wgmma_operators_earlier_knob_names.json")


def _first_line(name, template):
    """The first correct record of ``template`` in an H100 records file written under the earlier names."""
    with gzip.open(os.path.join(H100_RECORDS, name), "rt", encoding="utf-8") as fh:
        for line in fh:
            data = json.loads(line)
            if data["workload"]["template"] == template and not data["error_kind"] and "wg_bm" in data["config"]:
                return line, data
    raise AssertionError(f"no {template} record in {name}")


def _renamed(config):
    """``config`` as today's names spell it: these templates' ``wg_`` knobs are all the warpgroup MMA's."""
    return {("wgmma_" + k[3:] if k.startswith("wg_") else k): v for k, v in config.items()}


@pytest.mark.parametrize("name, template", [("models_bert_float16_wgmma_records_h100.jsonl.gz", "gemm_wgmma"),
                                            ("models_bert_float32_3xtf32_records_h100.jsonl.gz", "gemm_3xtf32"),
                                            ("gemm_tc_4096_wgmma_h100.jsonl.gz", "gemm_tc_any")])
def test_an_h100_record_under_the_earlier_names_reads_back_under_todays(name, template, tmp_path):
    line, data = _first_line(name, template)
    path = tmp_path / "old.jsonl"
    path.write_text(line)
    (record,) = list(RecordStore(str(path)))
    assert record.config == _renamed(data["config"]) and not any(k.startswith("wg_") for k in record.config)
    if isinstance(data.get("trace"), dict):
        assert record.trace["config"] == record.config
    space = operator_named(template).rebuild(data["workload"]["params"]).space(TARGET)
    assert set(record.config) <= set(space.names)


def test_an_h100_wgmma_record_under_the_earlier_names_exports_the_kernel_it_measured(tmp_path, capsys):
    line, data = _first_line("models_bert_float16_wgmma_records_h100.jsonl.gz", "gemm_wgmma")
    path = tmp_path / "old.jsonl"
    path.write_text(line)
    assert main(["export", str(path), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    template = operator_named("gemm_wgmma").rebuild(data["workload"]["params"])
    space = template.space(TARGET)
    config = space.make(**space.completed(_renamed(data["config"])))
    assert manifest["schedule"] == config.as_dict()
    assert (tmp_path / "out" / "program.cu").read_text() == template.build_program(config, TARGET).source


def test_an_operators_file_under_the_earlier_names_gives_its_tuned_config(tmp_path):
    """An operators file ``export_operator`` wrote before the rename: its config reaches
    ``compile_relax``'s lookup under today's names (filed under today's workload key, as a file
    written by this version of the template would be)."""
    from tvm_ext.relax.pipeline import operator_config
    from tvm_ext.schedules.gemm.wgmma_template import WgmmaGemmTemplate
    from tvm_ext.relax.tvm_export import OPERATORS_FILE, read_operators

    earlier = json.loads(open(EARLIER_OPERATORS_FILE, encoding="utf-8").read())
    ((_, entry),) = earlier["operators"].items()
    assert "wg_bm" in entry["config"]
    template = WgmmaGemmTemplate(256, 256, 256, b_layout="KN")
    assert entry["workload"] == template.describe()
    (tmp_path / OPERATORS_FILE).write_text(json.dumps(
        {**earlier, "operators": {Workload.of(template, TARGET).key: entry}}))
    config = operator_config(read_operators(str(tmp_path)), template, TARGET)
    written = template.space(TARGET).completed(_renamed(entry["config"]))  # knobs added since at their value
    assert config is not None and config.as_dict() == written  # the file's, not today's pick


def test_an_fp8_record_from_before_overlapped_promotions_exports_the_kernel_it_measured(tmp_path, capsys):
    """A record written before ``fp8_promote_overlap`` existed (a measured record of today's with
    the knob taken out): it reads back at the knob's earlier value and exports the kernel it
    measured, the promoted kernel without overlap."""
    with gzip.open(os.path.join(H100_RECORDS, "gemm_fp8_tuned_p1_records_2026-11-30_h200.jsonl.gz"), "rt",
                   encoding="utf-8") as fh:
        data = next(d for d in map(json.loads, fh)
                    if not d["error_kind"] and d["config"].get("fp8_promote_overlap") == 0)
    del data["config"]["fp8_promote_overlap"]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(data) + "\n")
    assert main(["export", str(path), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    template = operator_named("gemm_fp8").rebuild(data["workload"]["params"])
    config = template.space(TARGET).make(**data["config"], fp8_promote_overlap=0, wgmma_ws=0, wgmma_multicast=0,
                                         wgmma_pdl=0, wgmma_wg_cols=1, wgmma_c_turns=0, wgmma_wg_k=1)  # added since
    assert manifest["schedule"] == config.as_dict()
    assert (tmp_path / "out" / "program.cu").read_text() == template.build_program(config, TARGET).source
