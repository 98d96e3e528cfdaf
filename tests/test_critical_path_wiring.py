"""The critical path in the annotated Perfetto trace and in the HTML report.

``export`` adds one "critical path" track: a slice per stretch of the path, named by the slice
the time was spent in, whose durations add up to the path's total in each step. ``report``
shows per step the path's composition as a bar, the kernel families on it and what shortening
each item would save, for at most ``CRITICAL_PATH_STEPS`` steps (steady ones first), with the
same numbers ``critical-path`` gives for those steps.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import itertools
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from builders import KinetoBuilder
from conftest import GENERATED, shared_trace
from test_html_report import PAYLOADS, Page, browser  # noqa: F401  (the Chromium fixture)
from tracewhy.cli import main
from tracewhy.renderers.perfetto import CRITICAL_PATH_PID
from tracewhy.reports.overview import CRITICAL_PATH_STEPS

#: Five ProfilerSteps, two of them warm-up in the report: more steps than the report analyses.
TRACE = "hta/v100_ddp2_rank1_memprofile.json.gz"


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(argv) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("export") / "annotated.json"
    assert main(["export", "--no-cache", str(shared_trace(TRACE)), "-o", str(out)]) == 0
    events: list[dict[str, Any]] = json.loads(out.read_text(), parse_float=Decimal)["traceEvents"]
    return events


@pytest.fixture(scope="module")
def report_doc() -> dict[str, Any]:
    return _stdout_json(["report", "--no-cache", str(shared_trace(TRACE)), "--json"])


@pytest.fixture(scope="module")
def full_path() -> dict[str, Any]:
    return _stdout_json(["critical-path", "--no-cache", str(shared_trace(TRACE)), "--json"])


def _stdout_json(argv: list[str]) -> dict[str, Any]:
    """A command's JSON output, for module-scoped fixtures (capsys is per test)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    doc: dict[str, Any] = json.loads(buf.getvalue())
    return doc


def _ns(us: Decimal) -> int:
    return int(us * 1000)


def _track(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("pid") == CRITICAL_PATH_PID and e["ph"] == "X"]


def test_export_track_sums_to_the_path_total_of_each_step(exported: list[dict[str, Any]],
                                                          report_doc: dict[str, Any]) -> None:
    names = {e["args"]["name"] for e in exported if e.get("pid") == CRITICAL_PATH_PID and e["ph"] == "M"}
    assert names == {"tracewhy critical path", "critical path"}
    per_step: dict[int, int] = defaultdict(int)
    for e in _track(exported):
        per_step[e["args"]["step"]] += _ns(e["dur"])
    steps = report_doc["critical_path"]["steps"]
    assert dict(per_step) == {s["step"]: s["total_ns"] for s in steps}
    assert len(steps) == CRITICAL_PATH_STEPS


def test_export_slices_are_contiguous_and_named_by_the_slice_they_lie_in(exported: list[dict[str, Any]]) -> None:
    track = _track(exported)
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in track:
        by_step[e["args"]["step"]].append(e)
    for step in by_step.values():  # the path has no holes: each stretch starts where the last ended
        assert all(_ns(a["ts"] + a["dur"]) == _ns(b["ts"]) for a, b in itertools.pairwise(step))
    # A host op's stretch lies inside an event of the original file with its name.
    with gzip.open(shared_trace(TRACE)) as f:
        raw = [e for e in json.load(f, parse_float=Decimal)["traceEvents"] if e.get("ph") == "X"]
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in raw:
        spans[e["name"]].append((_ns(Decimal(e["ts"])), _ns(Decimal(e["ts"]) + Decimal(e["dur"]))))
    host = [e for e in track if e["args"]["category"] == "host_ops" and e["args"]["id"] is not None]
    assert len(host) > 1000
    for e in host:
        start, end = _ns(e["ts"]), _ns(e["ts"] + e["dur"])
        assert any(lo <= start and end <= hi for lo, hi in spans[e["name"]]), e
    unnamed = [e for e in track if e["args"]["id"] is None]
    assert unnamed and all(e["name"] == e["args"]["category"] for e in unnamed)


def test_report_takes_the_first_steady_steps_with_the_numbers_of_critical_path(
        report_doc: dict[str, Any], full_path: dict[str, Any]) -> None:
    c = report_doc["critical_path"]
    steady = [i for i, row in enumerate(report_doc["steps"]["rows"]) if row["steady"]]
    assert [s["step"] for s in c["steps"]] == steady[:CRITICAL_PATH_STEPS]
    assert c["steps_total"] == len(report_doc["steps"]["rows"]) == 5
    assert c["scope"].startswith(f"The path of {CRITICAL_PATH_STEPS} of the 5 steps")
    full = {s["window_start_ns"]: s for s in full_path["steps"]}
    for s in c["steps"]:
        whole = full[s["window_start_ns"]]
        assert (s["total_ns"], s["composition"]) == (whole["total_ns"], whole["composition"])
        assert sum(v for k, v in s["composition"].items() if k in c["categories"]) == s["total_ns"]
    assert c["items"][0]["on_path_ns"] >= c["items"][-1]["on_path_ns"]


def test_no_steps_no_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = KinetoBuilder().op("aten::mm", 0, 50).launch("gemm", 10, 5, 20, 30).write(tmp_path / "t.json")
    assert _json(["report", "--no-cache", str(trace), "--json"], capsys)["critical_path"] is None
    out = tmp_path / "a.json"
    assert main(["export", "--no-cache", str(trace), "-o", str(out)]) == 0
    assert _track(json.loads(out.read_text())["traceEvents"]) == []


def test_report_page_shows_each_steps_path(browser: Any, tmp_path: Path,  # noqa: F811
                                           report_doc: dict[str, Any]) -> None:
    out = tmp_path / "report.html"
    assert main(["report", "--no-cache", str(shared_trace(TRACE)), "-o", str(out)]) == 0
    page = Page(browser, out)
    assert page.errors == []
    assert "critical-path" in page.shown_sections()
    bars: list[dict[str, Any]] = page.page.evaluate("""() => Array.from(
        document.querySelectorAll('#critical-path-bars .cp-row')).map(r => ({
            step: Number(r.dataset.step), text: r.textContent,
            ns: Array.from(r.querySelectorAll('[data-ns]')).reduce((a, d) => a + Number(d.dataset.ns), 0)}))""")
    steps = report_doc["critical_path"]["steps"]
    assert [(b["step"], b["ns"]) for b in bars] == [(s["step"], s["total_ns"]) for s in steps]
    assert all(f"{s['window_ns'] / 1e6:.3f} ms window" in b["text"] for b, s in zip(bars, steps, strict=True))
    note = page.page.text_content("#critical-path-note") or ""
    assert report_doc["critical_path"]["scope"] in note
    items = page.page.locator("#critical-path-tables table").last.locator("tbody tr")
    assert items.count() == len(report_doc["critical_path"]["items"])


def test_trace_strings_on_the_path_stay_text(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    b = KinetoBuilder()
    for i in range(3):
        t0 = i * 1000.0
        b.annotation(f"ProfilerStep#{i}", t0, 900)
        for j, payload in enumerate(PAYLOADS):
            b.op(payload, t0 + 10 + j * 150, 120)
    out = tmp_path / "hostile.html"
    assert main(["report", "--no-cache", str(b.write(tmp_path / "hostile.json")), "-o", str(out)]) == 0
    page = Page(browser, out)
    assert page.page.evaluate("() => typeof window.__pwned") == "undefined"
    assert page.errors == []
    shown = page.page.inner_text("#critical-path-tables")
    for payload in PAYLOADS[:4]:
        assert payload in shown


def test_a_process_whose_only_host_thread_runs_backward_has_a_path(capsys: pytest.CaptureFixture[str]) -> None:
    # The generated CPU traces run autograd nodes on their one thread: no other thread's starts
    # can end its idle stretches (this raised IndexError before the report computed the path).
    doc = _json(["critical-path", "--no-cache", str(GENERATED / "cpu_slow_step_base.pt.trace.json.gz"), "--json"],
                capsys)
    assert doc["steps"] and all(s["determined"] and s["total_ns"] == s["window_ns"] for s in doc["steps"])


def test_a_trace_without_slices_has_no_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Found by fuzzing: no instants at all once no slice survives the read (an IndexError before).
    b = KinetoBuilder()
    b.events.append({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "main"}})
    assert _json(["critical-path", "--no-cache", str(b.write(tmp_path / "t.json")), "--json"], capsys)["steps"] == []
