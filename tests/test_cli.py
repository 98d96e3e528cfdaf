"""The command line: JSON contracts scripts rely on, determinism, and every command on real input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import GENERATED, ROOT, shared_trace
from tracewhy.cli import main

DEMO = ROOT / "examples" / "demo_cpu_training.pt.trace.json.gz"


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main([*argv, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_kernels_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, "kernels", str(shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz")))
    assert doc["command"] == "kernels" and doc["json_schema"] == 1
    assert doc["total_count"] == 2700 and isinstance(doc["total_time_ns"], int)
    kernels = doc["kernels"]
    assert isinstance(kernels, list) and sum(k["count"] for k in kernels) == 2700


def test_steps_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, "steps", str(DEMO))
    items = doc["steps"]
    assert isinstance(items, list) and items and all("name" in s and "dur_ns" in s for s in items)


def test_diagnose_json_has_findings_with_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    path = shared_trace("kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz")
    doc = _json(capsys, "diagnose", str(path))
    findings = doc["findings"]
    assert isinstance(findings, list) and findings
    for f in findings:
        assert set(f) >= {"code", "severity", "statement", "evidence", "recoverable_ns_per_step", "next_step"}


def test_json_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(GENERATED / "cpu_item_sync.pt.trace.json.gz")
    first = (main(["diagnose", path, "--json"]), capsys.readouterr().out)
    second = (main(["diagnose", path, "--json"]), capsys.readouterr().out)
    assert first == second


@pytest.mark.parametrize("command", ["info", "ops", "kernels", "steps", "gaps", "diagnose"])
def test_every_command_on_a_gpu_trace_and_a_cpu_trace(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    for path in (shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz"), DEMO):
        assert main([command, str(path)]) == 0
        assert capsys.readouterr().out.strip()


def test_gaps_class_filter(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(shared_trace("kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz"))
    doc = _json(capsys, "gaps", path, "--class", "input")
    gaps = doc["gaps"]
    assert isinstance(gaps, list) and gaps and {g["gap_class"] for g in gaps} == {"input"}


def test_console_script_and_module_entry_points() -> None:
    for argv in (["tracewhy", "--version"], [sys.executable, "-m", "tracewhy", "--version"]):
        out = subprocess.run(argv, capture_output=True, text=True, check=True)
        assert out.stdout.startswith("tracewhy ")


def test_usage_error_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kernels"]) == 2
    assert main(["steps", str(DEMO), "--warmup", "-1"]) == 2
