"""Memory beyond ``tracewhy memory``: diagnose names the memory findings, check gates on the
peak, diff reports the peak and ledger change, the HTML report draws a memory section and the
Perfetto export holds the counters. Peaks are checked against the ``[memory]`` events' own
``Total Allocated`` / ``Total Reserved``, read straight from the files."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from builders import PID, TID, KinetoBuilder
from conftest import GENERATED, checked_report, cli_output, shared_trace
from test_html_report import PAYLOADS, Page, browser  # noqa: F401  (browser is a fixture)
from tracewhy.analyses.memory import analyze_memory
from tracewhy.cli import main
from tracewhy.findings import thresholds as th
from tracewhy.findings.memory import ledger_parts
from tracewhy.readers import read_trace
from tracewhy.renderers.perfetto import HOST_MEMORY_PID, memory_counter_name
from tracewhy.reports.check_metrics import parse_limit
from tracewhy.reports.diagnose import Report, diagnose
from tracewhy.units import fmt_bytes

ADAM = GENERATED / "cpu_adam_memory.pt.trace.json.gz"
ADAM_SIZES = GENERATED / "memory_timeline" / "cpu_adam_memory_timeline.json.gz"
V100 = "hta/v100_ddp2_rank1_memprofile.json.gz"
RESNET = "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz"
NO_MEMORY = GENERATED / "cpu_eager_schedule.pt.trace.json.gz"
MEMORY_CODES = {"memory-peak", "memory-fragmentation", "memory-growth", "allocator-churn", "memory-near-limit"}


def _path(name: Path | str) -> Path:
    return name if isinstance(name, Path) else shared_trace(name)


def _events(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return doc["traceEvents"] if isinstance(doc, dict) else doc  # type: ignore[no-any-return]


def _peaks(path: Path) -> dict[str, tuple[int, int]]:
    """Per device, the highest Total Allocated and Total Reserved of its [memory] events (PyTorch
    < 1.10 wrote only "Bytes": allocated is then their running sum, reserved 0)."""
    out: dict[str, tuple[int, int]] = {}
    running: dict[str, int] = {}
    for e in _events(path):
        if e.get("name") != "[memory]":
            continue
        a = e["args"]
        device = "cpu" if a["Device Type"] == 0 else f"cuda:{a['Device Id']}"
        running[device] = running.get(device, 0) + a["Bytes"]
        old = out.get(device, (0, 0))
        out[device] = (max(old[0], a.get("Total Allocated", running[device])),
                       max(old[1], a.get("Total Reserved", 0)))
    return out


def _gate_device(peaks: dict[str, tuple[int, int]]) -> str:
    """The device the memory findings and check judge: the GPU with the highest peak, else the host."""
    gpus = {d: p for d, p in peaks.items() if d != "cpu"} or peaks
    return max(gpus, key=lambda d: gpus[d][0])


def _json(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 0) -> dict[str, Any]:
    assert main([*argv, "--json"]) == code
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def v100() -> Report:
    return checked_report(shared_trace(V100))


# --- diagnose --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "codes"), [
    (ADAM, {"memory-peak"}),
    (V100, {"memory-peak", "memory-fragmentation"}),
], ids=["adam", "v100-ddp"])
def test_diagnose_names_the_memory_findings(name: Path | str, codes: set[str]) -> None:
    path = _path(name)
    out = json.loads(cli_output("diagnose", str(path), "--json"))
    found = {f["code"]: f for f in out["findings"] if f["code"] in MEMORY_CODES}
    assert set(found) == codes
    peaks = _peaks(path)
    device = _gate_device(peaks)
    evidence = found["memory-peak"]["evidence"]
    assert (evidence["device"], evidence["peak_allocated_bytes"]) == (device, peaks[device][0])
    assert sum(evidence["ledger"].values()) == peaks[device][0]
    if "memory-fragmentation" in codes:
        frag = found["memory-fragmentation"]["evidence"]
        assert frag["allocated_bytes"] == peaks[device][0] and frag["reserved_bytes"] <= peaks[device][1]


def test_diagnosis_memory_is_the_memory_commands(v100: Report) -> None:
    """The analysis diagnose caches (on its own host index and steps, and the step account's host
    contexts) gives what memory gives alone; the peak's phase and frame come from those contexts."""
    alone = analyze_memory(read_trace(shared_trace(V100)))
    assert v100.memory is not None
    assert [(d.device, d.peak_allocated_bytes, d.peak_step, d.peak_op, d.ledger, d.peak_phase, d.peak_frame)
            for d in v100.memory.devices] == \
        [(d.device, d.peak_allocated_bytes, d.peak_step, d.peak_op, d.ledger, d.peak_phase, d.peak_frame)
         for d in alone.devices]
    assert v100.memory.top_ops.equals(alone.top_ops)


def test_no_memory_events_no_memory_findings() -> None:
    report = checked_report(NO_MEMORY)
    assert report.memory is None
    assert not {f.code for f in report.findings} & MEMORY_CODES


def test_near_limit_names_the_ledger_at_the_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """11.9 GiB reserved of the V100's 32 GiB is 37%: with the limit lowered under it the finding
    fires, and says what filled the memory at the allocation peak."""
    monkeypatch.setattr(th, "MEMORY_NEAR_LIMIT", 0.30)
    report = diagnose(read_trace(shared_trace(V100)))
    (near,) = [f for f in report.findings if f.code == "memory-near-limit"]
    assert report.memory is not None
    gpu = next(d for d in report.memory.devices if d.device == "cuda:1")
    assert near.evidence["ledger"] == gpu.ledger and near.evidence["ledger_source"] == "inferred"
    (first, a), (second, b) = ledger_parts(gpu.ledger)[:2]
    assert f"mostly {first} ({fmt_bytes(a)}) and {second} ({fmt_bytes(b)})" in near.statement
    monkeypatch.setattr(th, "MEMORY_NEAR_LIMIT", 0.90)
    assert "memory-near-limit" not in {f.code for f in diagnose(read_trace(shared_trace(V100))).findings}


# --- check -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [ADAM, V100], ids=["adam", "v100-ddp"])
def test_check_peak_memory_around_the_real_peak(name: Path | str, capsys: pytest.CaptureFixture[str]) -> None:
    path = _path(name)
    peaks = _peaks(path)
    device = _gate_device(peaks)
    peak = peaks[device][0]
    ok = _json(["check", str(path), "--max-peak-memory", f"{peak}B"], capsys)
    assert ok["passed"] and ok["results"][0]["measured"] == peak
    assert device in ok["results"][0]["note"] and f"{peak:,} B" in ok["results"][0]["note"]
    bad = _json(["check", str(path), "--max-peak-memory", f"{peak - 1}B"], capsys, code=1)
    assert not bad["passed"] and bad["violations"][0].startswith("FAIL peak-memory:")
    assert main(["check", str(path), "--max-peak-memory", "40GiB"]) == 0
    assert "ok   peak-memory:" in capsys.readouterr().out


def test_check_peak_memory_without_memory_events(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(NO_MEMORY), "--max-peak-memory", "1GiB"]) == 1
    assert "not measured (no [memory] events: profile with profile_memory=True)" in capsys.readouterr().out


@pytest.mark.parametrize(("text", "value"), [
    ("40GiB", 40 * 1024**3), ("1.5 GiB", 1.5 * 1024**3), ("2GB", 2e9), ("512MiB", 512 * 1024**2),
    ("512mb", 512e6), ("100 B", 100), ("3kib", 3072),
])
def test_peak_memory_sizes(text: str, value: float) -> None:
    assert parse_limit("max-peak-memory", text).value == value


@pytest.mark.parametrize("text", ["40", "40 GiBs", "40XB", "-1GB"])
def test_peak_memory_sizes_refused(text: str) -> None:
    with pytest.raises(ValueError, match="max-peak-memory"):
        parse_limit("max-peak-memory", text)


# --- diff ------------------------------------------------------------------------------------------

def test_diff_reports_the_peak_and_ledger_change(capsys: pytest.CaptureFixture[str]) -> None:
    a, b = shared_trace(RESNET), ADAM
    out = _json(["diff", str(a), str(b)], capsys)
    pa, pb = _peaks(a), _peaks(b)
    by_device = {m["device"]: m for m in out["memory"]}
    assert set(by_device) == set(pa) | set(pb) == {"cpu", "cuda:0"}
    cpu = by_device["cpu"]
    assert (cpu["a_peak_allocated_bytes"], cpu["b_peak_allocated_bytes"]) == (pa["cpu"][0], pb["cpu"][0])
    assert cpu["peak_change_bytes"] == pb["cpu"][0] - pa["cpu"][0] < 0
    assert cpu["ledger_change"] == {k: cpu["b_ledger"].get(k, 0) - cpu["a_ledger"].get(k, 0)
                                    for k in {*cpu["a_ledger"], *cpu["b_ledger"]}}
    assert sum(cpu["b_ledger"].values()) == pb["cpu"][0]
    gpu = by_device["cuda:0"]  # only run A used a GPU
    assert gpu["a_peak_allocated_bytes"] == pa["cuda:0"][0] and gpu["b_peak_allocated_bytes"] is None
    assert gpu["peak_change_bytes"] is None and gpu["ledger_change"] == {}
    assert main(["diff", str(a), str(b), "--color", "never"]) == 0
    text = capsys.readouterr().out
    assert "memory at the allocation peak" in text and "peak allocated" in text


def test_diff_without_memory_events(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(["diff", str(NO_MEMORY), str(NO_MEMORY)], capsys)
    assert out["memory"] == []
    assert main(["diff", str(NO_MEMORY), str(NO_MEMORY)]) == 0
    assert "memory at the allocation peak" not in capsys.readouterr().out


# --- HTML report -----------------------------------------------------------------------------------

def _report(trace: Path, out: Path) -> Path:
    assert main(["report", "--no-cache", str(trace), "-o", str(out)]) == 0
    return out


def _page_data(page: Page) -> dict[str, Any]:
    data: dict[str, Any] = page.page.evaluate(
        "() => JSON.parse(document.getElementById('report-data').textContent)")
    return data


def test_report_memory_section(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    path = shared_trace(V100)
    page = Page(browser, _report(path, tmp_path / "v100.html"))
    assert page.errors == []
    assert "memory" in page.shown_sections()
    memory = _page_data(page)["memory"]
    (gpu,) = memory["devices"]  # the GPU only: the host's 8 B beside it are not drawn
    peaks = _peaks(path)
    assert gpu["device"] == "cuda:1" and gpu["peak_allocated_bytes"] == peaks["cuda:1"][0]
    assert max(gpu["series"]["allocated"]) == peaks["cuda:1"][0]  # thinned, but the peak is drawn
    assert max(gpu["series"]["reserved"]) == peaks["cuda:1"][1]
    assert gpu["peak_ts_ns"] in gpu["series"]["ts_ns"]
    assert [s["steady"] for s in memory["steps"]].count(True) == 5
    charts = page.page.evaluate("() => Array.from(document.querySelectorAll('#memory-charts canvas')).length")
    assert charts == 1
    pixels = page.painted_pixels()
    assert len(pixels) == 3 and all(n > 1000 for n in pixels)  # steps, utilization, memory
    rows = page.page.evaluate("() => Array.from(document.querySelectorAll('#memory-ledger tbody tr'))"
                              ".map(r => Array.from(r.children).map(c => c.textContent))")
    live = ledger_parts(gpu["ledger"])
    assert [(r[0], r[1]) for r in rows] == [("cuda:1", k) for k, _ in live]
    assert rows[0][2] == fmt_bytes(live[0][1])


def test_report_of_a_timeline_export_stacks_its_categories(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    page = Page(browser, _report(ADAM_SIZES, tmp_path / "timeline.html"))
    assert page.errors == []
    assert page.shown_sections() == {"memory"}
    data = _page_data(page)
    memory = data["memory"]
    times, sizes = json.loads(gzip.decompress(ADAM_SIZES.read_bytes()))
    assert memory["peak_total_bytes"] == max(sum(row) for row in sizes)
    assert len(memory["series"]["ts_ns"]) == len(times)  # small: drawn whole
    assert memory["categories"] and set(memory["categories"]) <= set(memory["ledger_at_peak"])
    (pixels,) = page.painted_pixels()
    assert pixels > 10_000  # filled areas, not lines


def _hostile_memory_trace(tmp_path: Path) -> Path:
    """Steps whose allocations happen inside ops named by the payloads: the peak's op is one."""
    b = KinetoBuilder()
    total, addr = 0, 1 << 20
    for i in range(4):
        t0 = i * 1000.0
        b.annotation(f"ProfilerStep#{i}", t0, 900)
        for j, payload in enumerate(PAYLOADS):
            b.op(payload, t0 + 12 + j * 100, 60)
            for ts, nbytes in ((t0 + 20 + j * 100, 4096 * (j + 1)), (t0 + 60 + j * 100, -4096 * (j + 1))):
                total += nbytes
                b.events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": PID,
                                 "tid": TID, "ts": ts, "args": {"Total Reserved": 0, "Total Allocated": total,
                                                                "Bytes": nbytes, "Device Id": -1, "Device Type": 0,
                                                                "Addr": addr + j}})
    return b.write(tmp_path / "hostile_memory.json")


def test_report_memory_strings_run_nothing(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    html = _report(_hostile_memory_trace(tmp_path), tmp_path / "hostile.html")
    text = html.read_text()
    for payload in PAYLOADS:
        assert payload not in text
    page = Page(browser, html)
    assert page.page.evaluate("() => typeof window.__pwned") == "undefined"
    assert page.errors == []
    assert "memory" in page.shown_sections()
    title = page.page.evaluate("() => document.querySelector('#memory-charts .note').textContent")
    assert title.endswith(f"during {PAYLOADS[-1]}")  # the op of the largest block, as text
    assert page.page.evaluate("() => document.querySelectorAll('img, svg').length") == 0


# --- Perfetto export -------------------------------------------------------------------------------

def _counters(path: Path) -> dict[tuple[str, int], list[int]]:
    doc = json.loads(path.read_bytes())
    out: dict[tuple[str, int], list[int]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "C" and e.get("cat") == "tracewhy" and e["name"].startswith("memory "):
            out.setdefault((e["name"], e["pid"]), []).append(e["args"]["bytes"])
    return out


@pytest.mark.parametrize(("name", "device", "pid"), [
    (V100, "cuda:1", 1),  # on the GPU's own process (Kineto writes the device index as its pid)
    (ADAM, "cpu", HOST_MEMORY_PID),
], ids=["v100-ddp", "adam"])
def test_export_has_memory_counters(name: Path | str, device: str, pid: int, tmp_path: Path) -> None:
    path = _path(name)
    out = tmp_path / "annotated.json"
    assert main(["export", "--no-cache", str(path), "-o", str(out)]) == 0
    counters = _counters(out)
    peak, reserved = _peaks(path)[device]
    allocated = counters[(memory_counter_name("allocated", device), pid)]
    assert max(allocated) == peak
    assert all(x != y for x, y in itertools.pairwise(allocated))  # a point per change
    assert max(counters[(memory_counter_name("reserved", device), pid)]) == reserved
    if pid == HOST_MEMORY_PID:
        doc = json.loads(out.read_bytes())
        assert {"ph": "M", "cat": "tracewhy", "name": "process_name", "pid": pid,
                "args": {"name": "tracewhy: host memory"}} in doc["traceEvents"]
