"""The Python API: each function gives what the command of the same name prints, with plain-string
names in every table, kinds accepted as strings, short reprs and a pandas bridge that says what to install."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import tracewhy as tw
from api_support import as_cli
from conftest import ROOT, shared_trace
from tracewhy.cli import main
from tracewhy.errors import TraceError, UsageError
from tracewhy.model.schema import Kind
from tracewhy.model.trace import PartialTraceError, Trace

DEMO = ROOT / "examples" / "demo_cpu_training.pt.trace.json.gz"
NCCL = "hta/a100_ddp2_rank0_nccl2.17.json.gz"  # 8 A100s, NCCL kernels, ProfilerStep markers


@pytest.fixture(scope="module")
def gpu_trace() -> Trace:
    return tw.load(shared_trace(NCCL))


@pytest.fixture(scope="module")
def demo() -> Trace:
    return tw.load(DEMO)


def _cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


# --- the same numbers as the command ---------------------------------------------------------------


def test_steps_are_the_steps_command(gpu_trace: Trace, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _cli_json(capsys, "steps", str(shared_trace(NCCL)))
    r = tw.steps(gpu_trace)
    assert as_cli(r.table) == [dict(sorted(s.items())) for s in doc["steps"]]
    assert r.stats is not None and r.stats.p50_ns == doc["stats"]["p50_ns"]


def test_gaps_need_no_steps_and_are_the_gaps_command(gpu_trace: Trace, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _cli_json(capsys, "gaps", str(shared_trace(NCCL)))
    r = tw.gaps(gpu_trace)  # steps computed as the command computes them
    assert r.gaps.height == len(doc["gaps"]) > 0
    assert sorted(r.gaps.get_column("dur_ns").to_list()) == sorted(g["dur_ns"] for g in doc["gaps"])
    assert r.per_step.height == len(doc["per_step"])


def test_diagnose_ranks_the_findings_the_command_prints(demo: Trace, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _cli_json(capsys, "diagnose", str(DEMO))
    d = tw.diagnose(demo)
    assert [f.code for f in d.findings] == [f["code"] for f in doc["findings"]]
    assert [f.statement for f in d.findings] == [f["statement"] for f in doc["findings"]]


def test_kernels_ops_nvtx_and_info_are_their_commands(gpu_trace: Trace, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(shared_trace(NCCL))
    k = tw.kernels(gpu_trace)
    assert k.total_time_ns == _cli_json(capsys, "kernels", path)["total_time_ns"]
    o = tw.ops(gpu_trace)
    assert o.table.get_column("name").to_list() == [op["name"] for op in _cli_json(capsys, "ops", path)["ops"]]
    n = tw.nvtx(gpu_trace)
    assert n.total_ns == _cli_json(capsys, "nvtx", path)["total_ns"]
    assert tw.info(gpu_trace).span_ns == _cli_json(capsys, "info", path)["info"]["span_ns"]


def test_a_path_reads_the_trace(demo: Trace) -> None:
    assert tw.steps(DEMO).stats == tw.steps(demo).stats


def test_check_takes_the_command_thresholds_as_keywords(demo: Trace) -> None:
    p50 = tw.steps(demo).stats
    assert p50 is not None
    passing = tw.check(demo, max_step_p50=f"{p50.p50_ns / 1e6 + 1:.3f}ms")
    failing = tw.check(demo, max_step_p50=f"{p50.p50_ns / 1e6 - 1:.3f}ms")
    assert passing.passed and not failing.passed
    assert main(["check", str(DEMO), "--max-step-p50", failing.results[0].limit.text]) == 1


def test_check_refuses_an_unknown_threshold_or_none(demo: Trace) -> None:
    with pytest.raises(UsageError, match="unknown check 'max-gpu-idel'"):
        tw.check(demo, max_gpu_idel="20%")
    with pytest.raises(UsageError, match="nothing to check"):
        tw.check(demo)


def test_diff_of_a_run_with_itself_is_within_noise(demo: Trace) -> None:
    c = tw.diff(demo, demo)
    assert c.verdict == "within noise" and c.comparable


# --- names as plain strings ------------------------------------------------------------------------


def _tables(value: object) -> list[pl.DataFrame]:
    if isinstance(value, pl.DataFrame):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in _tables(getattr(value, f.name))]
    return []


def test_every_table_handed_out_has_string_names(gpu_trace: Trace) -> None:
    results = [tw.diagnose(gpu_trace), tw.steps(gpu_trace), tw.gaps(gpu_trace), tw.kernels(gpu_trace),
               tw.ops(gpu_trace), tw.overlap(gpu_trace), tw.blocks(gpu_trace), tw.nvtx(gpu_trace),
               tw.diff(gpu_trace, gpu_trace), tw.slices(gpu_trace, "kernel")]
    tables = [t for r in results for t in _tables(r)]
    assert len(tables) > 15
    for table in tables:
        kept = {c: d for c, d in table.schema.items() if isinstance(d, (pl.Categorical, pl.Enum))}
        assert not kept, kept
    # The model itself keeps them compact.
    assert isinstance(gpu_trace.slices.schema["name"], pl.Categorical)


def test_names_take_string_expressions(gpu_trace: Trace) -> None:
    by_name = tw.kernels(gpu_trace).by_name
    nccl = by_name.filter(pl.col("name").str.contains("nccl"))
    assert 0 < nccl.height < by_name.height
    assert tw.slices(gpu_trace, "kernel").filter(pl.col("name").str.contains("nccl")).height == nccl["count"].sum()


# --- kinds as strings ------------------------------------------------------------------------------


def test_kinds_as_strings(gpu_trace: Trace) -> None:
    assert gpu_trace.of_kind("kernel").equals(gpu_trace.of_kind(Kind.KERNEL))
    mixed = gpu_trace.of_kind(Kind.KERNEL, "memcpy")
    assert mixed.height == gpu_trace.of_kind("kernel").height + gpu_trace.of_kind("memcpy").height == 2700 + 960


def test_an_unknown_kind_names_the_valid_ones(gpu_trace: Trace) -> None:
    with pytest.raises(ValueError, match=r"unknown slice kind 'kernal'; valid kinds: cpu_op, .*kernel, memcpy"):
        gpu_trace.of_kind("kernal")
    with pytest.raises(ValueError, match="valid kinds"):
        tw.slices(gpu_trace, "kernal")


def test_require_takes_strings_on_a_partial_trace(gpu_trace: Trace) -> None:
    partial = dataclasses.replace(gpu_trace, meta=dataclasses.replace(gpu_trace.meta, kinds_read=("kernel",)))
    partial.require("kernel")
    with pytest.raises(PartialTraceError, match="needs memcpy"):
        partial.require("memcpy")
    with pytest.raises(ValueError, match="valid kinds"):
        partial.require("kernal")


# --- reprs -----------------------------------------------------------------------------------------


def test_trace_repr_is_a_few_lines(gpu_trace: Trace) -> None:
    text = repr(gpu_trace)
    assert text.splitlines() == [
        "Trace a100_ddp2_rank0_nccl2.17.json.gz (kineto, complete): 26,932 slices over 684.373 ms",
        "  slices by kind: cpu_op 14,346, runtime 8,740, kernel 2,700, memcpy 960, memset 114, annotation 42, "
        "gpu_annotation 30",
        "  devices: 8 × NVIDIA A100-PG509-200",
    ]


def test_trace_repr_says_partial(gpu_trace: Trace) -> None:
    partial = dataclasses.replace(gpu_trace, meta=dataclasses.replace(gpu_trace.meta, kinds_read=("kernel",)))
    lines = repr(partial).splitlines()
    assert "(kineto, partial)" in lines[0] and lines[-1] == "  partial read: only kernel slices"


def test_diagnosis_repr_lists_the_findings(demo: Trace) -> None:
    d = tw.diagnose(demo)
    lines = repr(d).splitlines()
    assert lines[0] == f"tracewhy diagnosis of {DEMO.name}: {len(d.findings)} findings:"
    assert [line.split()[1].rstrip(":") for line in lines[1:]] == [f"{f.code}" for f in d.findings]


def test_diagnosis_repr_shows_control_characters_as_escapes(demo: Trace) -> None:
    d = tw.diagnose(demo)
    first = dataclasses.replace(d.findings[0], statement="op \x1b[2Jname\nwaits")
    lines = repr(dataclasses.replace(d, findings=[first])).splitlines()
    assert len(lines) == 2 and lines[1].endswith("op \\x1b[2Jname\\nwaits")


def test_diagnosis_html_escapes_every_trace_string(demo: Trace) -> None:
    hostile = '<img src=x onerror="alert(1)">&'
    d = tw.diagnose(demo)
    first = dataclasses.replace(d.findings[0], statement=f"op {hostile} waits", recoverable_ns_per_step=2_500_000)
    shown = dataclasses.replace(d, path=f"runs/{hostile}.json", findings=[first])._repr_html_()
    assert "<img" not in shown and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;" in shown
    assert shown.count("<tr>") == 2 and "<td style=\"text-align:right\">2.500</td>" in shown
    assert "recoverable ms per step" in shown


# --- pandas ----------------------------------------------------------------------------------------


def test_to_pandas(demo: Trace) -> None:
    table = tw.ops(demo).table
    frame = tw.to_pandas(table)
    assert list(frame.columns) == table.columns and frame["name"].tolist() == table["name"].to_list()


@pytest.mark.parametrize("missing", ["pandas", "pyarrow"])
def test_to_pandas_without_the_extra_says_what_to_install(missing: str, demo: Trace,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # what an absent module looks like to import
    with pytest.raises(ImportError, match=rf"{missing} is missing: pip install 'tracewhy\[pandas\]'"):
        tw.to_pandas(tw.ops(demo).table)


# --- the package -----------------------------------------------------------------------------------


def test_import_tracewhy_leaves_the_analyses_for_first_use() -> None:
    code = ("import sys, tracewhy; print('tracewhy.api' in sys.modules); tracewhy.diagnose; "
            "print('tracewhy.api' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]


def test_the_package_names_the_api() -> None:
    from tracewhy import api

    for name in ("diagnose", "steps", "gaps", "kernels", "ops", "overlap", "blocks", "nvtx", "info", "check",
                 "diff", "slices", "to_pandas"):
        assert getattr(tw, name) is getattr(api, name) and name in dir(tw)
    with pytest.raises(AttributeError, match="no attribute 'diagnoze'"):
        tw.diagnoze  # noqa: B018


def test_a_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"no_such\.json"):
        tw.steps(tmp_path / "no_such.json")
