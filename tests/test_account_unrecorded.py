"""A launch that waits far beyond launch latency while its device records no GPU work is not
launch overhead: on TraceLens' vLLM decode step (MI300X, one hipGraphLaunch) the first
hipMemcpyAsync waits 7.8 ms for a GPU that recorded nothing before its copy. The account gives
that wait its own part, the diagnosis says what the trace shows instead of host advice, and
the step's GPU time leads with its kernel families, checked against the raw file's kernels."""

from __future__ import annotations

import csv
import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

import tracewhy
from builders import KinetoBuilder
from conftest import shared_trace
from tracewhy.analyses.account import AccountCol, step_account
from tracewhy.analyses.account_names import PartName
from tracewhy.analyses.account_unrecorded import LAUNCH_DELAY_UNRECORDED_MIN_NS
from tracewhy.readers import read_trace
from tracewhy.reports.diagnose import diagnose

DECODE = "tracelens/mi300x_vllm_decode_fullgraph_replay.json.gz"


def _raw(relative: str) -> list[dict[str, Any]]:
    with gzip.open(shared_trace(relative)) as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return events


def _first_launch_delay_ns(events: list[dict[str, Any]]) -> tuple[int, float]:
    """The first GPU activity's start less its launch call's start (by correlation), and that
    activity's start: read from the JSON, in µs as Kineto writes them."""
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    first = min(gpu, key=lambda e: e["ts"])
    corr = first["args"]["correlation"]
    call = next(e for e in events if e.get("cat") == "cuda_runtime" and e.get("args", {}).get("correlation") == corr)
    return round((first["ts"] - call["ts"]) * 1000), first["ts"]


def test_the_decode_steps_first_copy_waits_on_unrecorded_gpu_work() -> None:
    events = _raw(DECODE)
    delay_ns, _ = _first_launch_delay_ns(events)
    assert delay_ns > LAUNCH_DELAY_UNRECORDED_MIN_NS
    account = step_account(read_trace(shared_trace(DECODE)))
    parts = dict(account.parts.select(AccountCol.PART, AccountCol.NS_PER_STEP).iter_rows())
    assert parts.get(PartName.LAUNCH, 0) < 100_000  # the 7.8 ms is no longer launch overhead
    assert abs(parts[PartName.UNRECORDED_GPU] - delay_ns) <= 1_000
    kind = account.parts.filter(account.parts[AccountCol.PART] == PartName.UNRECORDED_GPU)[AccountCol.KIND].item()
    assert kind == "idle"
    lead = account.largest_avoidable()
    assert lead is None or lead[AccountCol.PART] != PartName.UNRECORDED_GPU
    assert account.unrecorded is not None and abs(account.unrecorded.waited_ns - delay_ns) <= 1_000
    assert account.note is not None and "queued before the capture" in account.note


def test_the_decode_diagnosis_says_what_the_trace_shows_not_host_advice() -> None:
    events = _raw(DECODE)
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")]
    gpu_ns = sum(e["dur"] for e in kernels)
    gemm = sum(e["dur"] for e in kernels if e["cat"] == "kernel" and re.search(r"matmul|^Cijk_|gemm", e["name"]))
    attention = sum(e["dur"] for e in kernels
                    if e["cat"] == "kernel" and re.search(r"attention|reshape_and_cache", e["name"]))
    report = diagnose(tracewhy.load(shared_trace(DECODE)))
    codes = [f.code for f in report.findings]
    assert "unexplained-part" not in codes
    assert not any("non_blocking" in f.next_step or "Memcpy" in f.next_step for f in report.findings)
    before = next(f for f in report.findings if f.code == "gpu-work-before-trace")
    assert before.severity.value == "trust" and "clocks are offset" in before.statement
    assert "running work queued before the capture" in before.statement
    from tracewhy.findings.where_step_goes import essential_summary

    assert report.account is not None
    said = essential_summary(report.account)
    assert said is not None
    shares = {m[0]: float(m[1]) for m in re.findall(r"kernels: (\w+) ([\d.]+)%", said)}
    assert list(shares)[:2] == ["gemm", "attention"]
    assert shares["gemm"] == pytest.approx(100 * gemm / gpu_ns, abs=0.2)
    assert shares["attention"] == pytest.approx(100 * attention / gpu_ns, abs=0.2)


def test_the_unrecorded_wait_is_not_called_a_dependency() -> None:
    """The gap classifier calls the first copy's 7.8 ms wait dependency idle (work queued, GPU idle);
    the idle findings give it as GPU work before the trace instead, so no gpu-idle-dependency sends
    the user to cross-stream waits the run never had, and the utilization line's breakdown names
    it (the first copy's delay, from the raw JSON)."""
    delay_ns, _ = _first_launch_delay_ns(_raw(DECODE))
    report = diagnose(tracewhy.load(shared_trace(DECODE)))
    assert report.basis.class_ns["dependency"] >= delay_ns - 20_000  # what the classifier says
    assert "gpu-idle-dependency" not in [f.code for f in report.findings]
    low = next(f for f in report.findings if f.code == "gpu-low-utilization")
    assert "GPU work before the trace" in low.statement and "dependency" not in low.statement
    assert abs(low.evidence["idle_by_class_ns"]["before_trace"] - delay_ns) <= 20_000


def test_a_long_launch_delay_with_gpu_work_recorded_stays_launch_time() -> None:
    """BERT's launch-bound trace: every launch edge on its path is either short or overlaps the
    device's recorded work, so none goes to the unrecorded part and launch overhead stays."""
    account = step_account(read_trace(shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz")))
    names = set(account.parts.get_column(AccountCol.PART).to_list())
    assert PartName.LAUNCH in names and PartName.UNRECORDED_GPU not in names and account.unrecorded is None


def _essential_work(relative: str) -> Any:
    report = diagnose(tracewhy.load(shared_trace(relative)))
    return next(f for f in report.findings if f.code == "essential-work")


def test_the_essential_work_line_gives_the_gemms_fraction_of_their_roof() -> None:
    """Qwen1.5-0.5B on an H100: the GEMMs' time at their roof over their GPU time, computed here
    from TraceLens' own GEMM table (its FLOPs, bytes moved and kernel time per shape) against the
    H100 SXM datasheet's dense BF16 989.4 TFLOP/s and 3.35 TB/s: 61.9%."""
    with open(shared_trace("tracelens/reference_csvs/h100_qwen/GEMM.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    at_roof = sum(int(r["name_count"]) * max(float(r["GFLOPS_first"]) * 1e9 / 989.4e12,
                                             float(r["Data Moved (MB)_first"]) * 2**20 / 3.35e12) for r in rows)
    gemm_s = sum(float(r["Kernel Time (µs)_sum"]) for r in rows) * 1e-6
    f = _essential_work("tracelens/h100_qwen1.5-0.5b_bs16_seq2048.json.gz")
    assert f.evidence["roof_fraction_by_category"]["gemm"] == pytest.approx(at_roof / gemm_s, abs=0.005)
    assert f"GEMMs {100 * at_roof / gemm_s:.1f}%" in f.statement and "memory bandwidth" in f.statement
    assert f.evidence["roof_reason"] is None and 0 < f.evidence["roof_fraction"] < 1


def test_the_decode_steps_efficiency_is_not_computed_and_says_why() -> None:
    f = _essential_work(DECODE)
    assert f.evidence["roof_fraction"] is None
    assert "replayed from a CUDA/HIP graph" in f.statement and "rocprof-compute" in f.next_step
    families = [x["family"] for x in f.evidence["families"]]
    assert families[:2] == ["gemm", "attention"]


def _launch_waits(tmp_path: Path, earlier_gpu_work: bool) -> Any:
    """One window (0-2700 µs): a launch at 100 µs whose kernel starts at 2100 (2 ms later) and
    runs 500 µs, and a synchronize that waits for it; with ``earlier_gpu_work`` the device first
    ran a kernel at 20-60 µs, so the 2 ms wait comes after recorded work: the trace holds both
    ends of it."""
    b = KinetoBuilder()
    b.annotation("serve", 0, 2700)
    if earlier_gpu_work:
        b.launch("sm80_gemm_kernel", 10, 5, gpu_ts=20, gpu_dur=40)
    b.launch("sm80_gemm_kernel", 100, 5, gpu_ts=2100, gpu_dur=500)
    b.op("cudaDeviceSynchronize", 110, 2495, cat="cuda_runtime")
    return step_account(read_trace(b.write(tmp_path / "t.json")))


def test_a_launch_issued_long_before_the_devices_first_work_is_unrecorded_gpu_work(tmp_path: Path) -> None:
    r = _launch_waits(tmp_path, earlier_gpu_work=False)
    parts = dict(r.parts.select(AccountCol.PART, AccountCol.NS_PER_STEP).iter_rows())
    assert parts[PartName.UNRECORDED_GPU] == 2_000_000 and PartName.LAUNCH not in parts
    assert r.unrecorded is not None and r.unrecorded.first_gpu_ns - r.unrecorded.launch_ns == 2_000_000
    assert r.largest_avoidable() is None or r.largest_avoidable()[AccountCol.PART] != PartName.UNRECORDED_GPU


def test_the_same_wait_after_recorded_gpu_work_stays_launch_overhead(tmp_path: Path) -> None:
    r = _launch_waits(tmp_path, earlier_gpu_work=True)
    parts = dict(r.parts.select(AccountCol.PART, AccountCol.NS_PER_STEP).iter_rows())
    assert PartName.UNRECORDED_GPU not in parts and parts[PartName.LAUNCH] >= 2_000_000 and r.unrecorded is None
