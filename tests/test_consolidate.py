"""diagnose is one consistent text: no reference to a finding that is not
printed, one finding per cause, a summary before the findings it sums up, and severity by the
share of the step a fix would recover. Checked on real traces of every kind here."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from pathlib import Path

import pytest

from conftest import shared_trace
from tracewhy.cli import main
from tracewhy.findings.codes import Code
from tracewhy.findings.consolidate import SEVERITY_FLOOR

ROOT = Path(__file__).resolve().parents[1]
#: Every finding code the rules can emit, read from the source (a new rule is covered too).
CODES = set(re.findall(r'code="([a-z0-9-]+)"', "".join(
    p.read_text(encoding="utf-8") for p in (ROOT / "src" / "tracewhy" / "findings").glob("*.py"))))
TRACES = [
    "nsys/pipit_saxpy_mpi_cuda_a100_2022.2.sqlite.gz",
    "nsys/nsysai_mfu_2gpu_after.sqlite.gz",
    "nsys/nsysai_h100_2gpu_1s.sqlite.gz",
    "nsys/nvfuser_xent_h200_2025.1.sqlite.gz",
    "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz",
    "hta/v100_rank0_displayTimeUnit_ns_fractional_us.json.gz",
    "tracelens/mi300x_resnet_actckpt_ddp8_rank0.json.gz",
]


def _diagnose(trace: str, capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    assert main(["diagnose", str(shared_trace(trace)), "--json", "--no-cache"]) == 0
    findings: list[dict[str, object]] = json.loads(capsys.readouterr().out)["findings"]
    return findings


@pytest.mark.parametrize("trace", TRACES)
def test_one_consistent_text(trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    findings = _diagnose(trace, capsys)
    printed = [str(f["code"]) for f in findings]
    assert len(printed) == len(set(printed))
    for f in findings:
        text = f"{f['statement']} {f['next_step']}"
        mentioned = {c for c in CODES if re.search(rf"(?<![a-z-]){re.escape(c)}(?![a-z-])", text)} - {f["code"]}
        assert mentioned <= set(printed), (f["code"], mentioned - set(printed))
    # One finding per cause: nsys's rule is folded into tracewhy's finding of the same cause.
    for nsys_code, own in (("nsys-async-memcpy-pageable", "pageable-memcpy"),
                           ("nsys-gpu-low-utilization", "gpu-low-utilization"),
                           ("nsys-sync-memcpy", "synchronous-memcpy")):
        assert not (nsys_code in printed and own in printed), (nsys_code, own)
    # The summary of GPU idle comes before every idle class it sums up.
    if "gpu-low-utilization" in printed:
        first_class = min((i for i, c in enumerate(printed) if c.startswith("gpu-idle-")), default=len(printed))
        assert printed.index("gpu-low-utilization") < first_class


def test_folded_rule_keeps_its_evidence(capsys: pytest.CaptureFixture[str]) -> None:
    findings = {f["code"]: f for f in _diagnose("kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz",
                                                 capsys)}
    pageable = findings["pageable-memcpy"]
    assert "cuda_memcpy_async" in pageable["evidence"]["nsys_rules"]  # type: ignore[index]
    assert "nsys rule cuda_memcpy_async flags the same cause" in str(pageable["statement"])


def test_severity_follows_the_recoverable_share(capsys: pytest.CaptureFixture[str]) -> None:
    """pipit's gpu-idle-untraced was [low] with 98.8 ms of a 192 ms step recoverable."""
    findings = _diagnose("nsys/pipit_saxpy_mpi_cuda_a100_2022.2.sqlite.gz", capsys)
    window = next(f for f in findings if f["code"] == "gpu-low-utilization")["evidence"]["window_ns"]  # type: ignore[index]
    order = ("high", "medium", "low")
    for f in findings:
        rec = int(f["recoverable_ns_per_step"])  # type: ignore[call-overload]
        if f["severity"] in ("trust", "info") or rec <= 0:
            continue
        # A predicted finding's recoverable time is a share of the step its prediction measured.
        share = rec / f["evidence"].get("measured_step_ns", window)  # type: ignore[union-attr]
        expected = "high" if share >= 0.20 else "medium" if share >= 0.05 else "low"
        floor = SEVERITY_FLOOR.get(Code(f["code"]))
        if floor is not None and order.index(expected) > order.index(floor.value):
            expected = floor.value
        assert f["severity"] == expected, (f["code"], share)
    assert next(f for f in findings if f["code"] == "gpu-idle-untraced")["severity"] == "high"


def test_blocking_sync_severity_from_the_raw_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The 1 s window of the nsys-ai H100 capture: each of its two processes spent over 40% of it
    in cudaStreamSynchronize (summed here straight from the SQLite), and the finding says so. But
    the host waits there for pinned copies that take 95% of the window: without the waits the
    copies still run one after another, so the step predicted without them is barely shorter, the
    finding's severity follows that prediction, and the copies lead the diagnosis."""
    db = tmp_path / "h100.sqlite"
    db.write_bytes(gzip.decompress(shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz").read_bytes()))
    with sqlite3.connect(db) as conn:
        per_thread = conn.execute(
            "SELECT r.globalTid, sum(r.end - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
            "JOIN StringIds s ON s.id = r.nameId WHERE s.value LIKE 'cuda%Synchronize%' GROUP BY r.globalTid"
        ).fetchall()
    window_ns = 1_000_000_000  # the derived file's window (its META_DATA_EXPORT says so)
    assert max(b for _, b in per_thread) / window_ns >= 0.20
    findings = _diagnose("nsys/nsysai_h100_2gpu_1s.sqlite.gz", capsys)
    f = next(f for f in findings if f["code"] == "nsys-sync-api")
    assert float(f["evidence"]["share_of_trace"]) >= 0.20  # type: ignore[index]
    measured, predicted = int(f["evidence"]["measured_step_ns"]), int(f["predicted_step_ns"])  # type: ignore[index,call-overload]
    assert f["recoverable_ns_per_step"] == measured - predicted
    assert (measured - predicted) / measured < 0.05 and f["severity"] == "low"
    assert next(f for f in findings if f["severity"] != "trust")["code"] == "copy-bound"
