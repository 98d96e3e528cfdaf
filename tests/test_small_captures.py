"""Small or odd captures: a fragment of a real capture, the tiny real traces in ../shared/traces
and every trace there. Severity says how much of the step a fix gives back, so a finding with no
time to give back is neither medium nor high, no recoverable time exceeds the time it was
measured over, and a capture too small to show what the job repeats gets no finding above low.
Utilization is a share of the span ``info`` reports, computed here from the raw events."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from builders import KinetoBuilder
from conftest import GENERATED, cli_output, shared_trace
from test_account_real import _path, _traces
from tracewhy.analyses.info import info
from tracewhy.analyses.utilization import utilization
from tracewhy.errors import TraceError
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import STRUCTURAL, Code
from tracewhy.findings.consolidate import CaptureSize, consolidate
from tracewhy.findings.model import Finding, Severity
from tracewhy.readers import read_trace

SERIOUS = ("high", "medium")
TINY = "hta/legacy_2022_inference_rank1_tiny.json.gz"


def _diagnose(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(cli_output("diagnose", str(path), "--json"))
    return doc


def _raw(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
    return doc


def _fragment(source: Path, events: int, dest: Path) -> tuple[Path, list[dict[str, Any]]]:
    """The capture cut to its metadata and its first ``events`` complete events, as a profiler
    stopped early (or a user's cut) leaves it; returns the path and the events kept."""
    doc = _raw(source)
    meta = [e for e in doc["traceEvents"] if e.get("ph") == "M"]
    kept = [e for e in doc["traceEvents"] if e.get("ph") == "X"][:events]
    dest.write_text(json.dumps({**doc, "traceEvents": meta + kept}))
    return dest, kept


def _raw_span_ns(events: list[dict[str, Any]]) -> int:
    """First start to last end of the complete events, in ns (Kineto writes microseconds),
    without Kineto's own "PyTorch Profiler (0)" event (category Trace): the profiler's session,
    which opens long before the first activity, is no activity of the job."""
    done = [e for e in events if e.get("ph") == "X" and e.get("cat") != "Trace"]
    starts = [e["ts"] for e in done]
    ends = [e["ts"] + e.get("dur", 0) for e in done]
    return round((max(ends) - min(starts)) * 1000)


@pytest.mark.parametrize("name", ["cpu_dataloader_slow", "cpu_compile", "cpu_lines_sleep", "ddp_gloo_rank0"])
def test_a_seven_event_fragment_gets_no_serious_finding(name: str, tmp_path: Path) -> None:
    """Seven events of a real CPU capture: one step marker and the first ops in it. Whatever
    the step's parts, seven events cannot show what the job repeats: nothing above low, each
    capped finding says why, and no recoverable time exceeds the fragment's own span."""
    path, kept = _fragment(GENERATED / f"{name}.pt.trace.json.gz", 7, tmp_path / f"{name}_first7.json")
    assert len(kept) == 7
    d = _diagnose(path)
    span = _raw_span_ns(kept)
    timed = [f for f in d["findings"] if f["severity"] != "trust"]
    assert timed, d["findings"]  # the rules still speak; they are only not called serious
    for f in timed:
        assert f["severity"] not in SERIOUS, (f["code"], f["severity"], f["recoverable_ns_per_step"])
        assert 0 <= f["recoverable_ns_per_step"] <= span
    capped = [f for f in timed if "severity_capped" in f["evidence"]]
    assert capped and all(f"{th.MIN_EVENTS_FOR_SEVERITY}" in f["evidence"]["severity_capped"] for f in capped)


def test_the_tiny_legacy_trace_is_low_and_its_utilization_is_over_the_info_span() -> None:
    """HTA's 12-event inference fragment: 4 kernels and 8 launches. Its utilization is a share of
    the span info reports (first event to last end, 1.641 ms in the raw file), not of the first
    to last kernel; and 12 events support no finding above low."""
    path = shared_trace(TINY)
    raw_span = _raw_span_ns(_raw(path)["traceEvents"])
    trace = read_trace(path)
    assert info(trace).span_ns == raw_span == 1_641_000
    devices = utilization(trace).devices
    assert devices.get_column("span_ns").to_list() == [raw_span]
    d = _diagnose(path)
    low = next(f for f in d["findings"] if f["code"] == "gpu-low-utilization")
    assert low["evidence"]["window_ns"] == raw_span
    assert "of 1.641 ms" in low["statement"]
    assert not [f["code"] for f in d["findings"] if f["severity"] in SERIOUS]


def test_a_summary_without_time_of_its_own_is_not_serious() -> None:
    """HTA's 5-step DDP capture on 16 ranks (67k events): gpu-low-utilization sums up the idle
    findings below it and gives back no time itself; its parts carry the severity."""
    d = _diagnose(shared_trace("hta/a100_16rank_rank0_alltoall.json.gz"))
    summary = next(f for f in d["findings"] if f["code"] == "gpu-low-utilization")
    assert summary["recoverable_ns_per_step"] == 0 and summary["severity"] == "info"
    assert any(f["severity"] in SERIOUS and f["recoverable_ns_per_step"] > 0 for f in d["findings"])


def test_one_step_supports_at_most_medium() -> None:
    """TraceLens' H100 BERT capture holds one ProfilerStep (2,059 events): a cost seen once is
    worth fixing, but one sample cannot say it recurs in every step, so nothing is high."""
    path = shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz")
    steps = [e for e in _raw(path)["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") == "user_annotation"]  # (the host's marker; Kineto copies it to the GPU timeline)
    assert len(steps) == 1
    d = _diagnose(path)
    assert d["step_stats"]["count"] == 1
    assert not [f["code"] for f in d["findings"] if f["severity"] == "high"]
    medium = [f for f in d["findings"] if f["severity"] == "medium"]
    assert medium and all("one step" in f["evidence"].get("severity_capped", "one step") for f in medium)


def test_a_lone_short_kernel_is_busy_for_its_share_of_the_span(tmp_path: Path) -> None:
    """A 0.13 µs capture: the host launches for 0.08 µs, the kernel runs 0.02 µs at its end.
    Busy 20 of 130 ns, as info's span says, not "100% of 20 ns"."""
    b = KinetoBuilder().op("aten::add", 0.0, 0.13).launch("add_kernel", 0.01, 0.08, gpu_ts=0.11, gpu_dur=0.02)
    trace = read_trace(b.write(tmp_path / "lone.json"))
    assert info(trace).span_ns == 130
    row = utilization(trace).devices.row(0, named=True)
    assert (row["busy_ns"], row["span_ns"]) == (20, 130)
    assert row["active_share"] == pytest.approx(20 / 130)


def _finding(code: Code, severity: Severity, recoverable_ns: int, parts: tuple[Code, ...] = ()) -> Finding:
    return Finding(code, severity, "statement", "next", recoverable_ns, parts=parts)


def test_severity_needs_time_and_a_capture_that_supports_it() -> None:
    window = 1_000_000
    big = CaptureSize(events=5_000, steps=5)
    # 30% of the step from a well-sampled capture: high, untouched.
    [f] = consolidate([_finding(Code.GPU_IDLE_HOST, Severity.LOW, 300_000)], window, big)
    assert f.severity is Severity.HIGH and "severity_capped" not in f.evidence
    # No time: a rule's own high is low; a summary of other findings is info.
    [f] = consolidate([_finding(Code.TENSOR_CORES_UNUSED, Severity.MEDIUM, 0)], window, big)
    assert f.severity is Severity.LOW and f.evidence["severity_uncapped"] == "medium"
    [f] = consolidate([_finding(Code.GPU_LOW_UTILIZATION, Severity.HIGH, 0, parts=(Code.GPU_IDLE_HOST,))],
                      window, big)
    assert f.severity is Severity.INFO
    # A structural finding (a frame torch.compile left eager) keeps its rule's severity without a time...
    [f] = consolidate([_finding(Code.COMPILE_NO_EFFECT, Severity.HIGH, 0)], window, big)
    assert f.severity is Severity.HIGH and Code.COMPILE_NO_EFFECT in STRUCTURAL
    # ...but not in a fragment.
    [f] = consolidate([_finding(Code.COMPILE_NO_EFFECT, Severity.HIGH, 0)], window, CaptureSize(events=7, steps=1))
    assert f.severity is Severity.LOW
    # Under MIN_EVENTS_FOR_SEVERITY events: low, and the statement says why.
    [f] = consolidate([_finding(Code.GPU_IDLE_HOST, Severity.LOW, 300_000)], window,
                      CaptureSize(events=th.MIN_EVENTS_FOR_SEVERITY - 1, steps=5))
    assert f.severity is Severity.LOW and f.evidence["severity_uncapped"] == "high"
    assert f"fewer than {th.MIN_EVENTS_FOR_SEVERITY}" in f.statement
    # One step: high becomes medium; without step markers (steps None) the share decides.
    [f] = consolidate([_finding(Code.GPU_IDLE_HOST, Severity.LOW, 300_000)], window, CaptureSize(5_000, 1))
    assert f.severity is Severity.MEDIUM
    [f] = consolidate([_finding(Code.GPU_IDLE_HOST, Severity.LOW, 300_000)], window, CaptureSize(5_000, None))
    assert f.severity is Severity.HIGH
    # A rule's estimate above the window is cut to it, its own figure kept.
    [f] = consolidate([_finding(Code.GPU_IDLE_HOST, Severity.LOW, 3 * window)], window, big)
    assert f.recoverable_ns_per_step == window and f.evidence["recoverable_measured_ns"] == 3 * window


@pytest.mark.slow
@pytest.mark.parametrize("relative", _traces())
def test_no_serious_finding_without_time_and_no_time_above_the_window(relative: str) -> None:
    try:
        trace = read_trace(_path(relative))
    except TraceError as e:
        pytest.skip(f"not a profiler trace: {e}")
    span = info(trace).span_ns
    d = _diagnose(_path(relative))
    stats = d["step_stats"]
    for f in d["findings"]:
        recoverable = f["recoverable_ns_per_step"]
        if f["severity"] in SERIOUS and f["code"] not in STRUCTURAL:
            assert recoverable > 0, (f["code"], f["severity"])
        assert 0 <= recoverable <= span, (f["code"], recoverable, span)
        if stats is not None and f["predicted_step_ns"] is not None:
            assert recoverable <= f["predicted_step_ns"] + recoverable <= max(stats["max_ns"], span)
