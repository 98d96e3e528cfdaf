"""One quantity, one number in every view: the terminal, ``--json``, the HTML report's data,
``check`` and ``diagnose`` state the same step statistics, gap starts, synchronize counts and
collective exposure for the same trace, each labelled with what it is."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, shared_trace
from tracewhy.cli import main
from tracewhy.renderers.jsonout import envelope
from tracewhy.units import fmt_ns

DEMO = ROOT / "examples" / "demo_cpu_training.pt.trace.json.gz"
#: Three steady steps, eight cudaEventSynchronize in each and one cudaDeviceSynchronize outside
#: them (HTA's DDP trace), NCCL all-reduce partly under compute.
DDP = "hta/a100_ddp2_rank0_nccl2.17.json.gz"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out = _run(capsys, *argv, "--json")
    assert code in (0, 1), out
    doc: dict[str, Any] = json.loads(out)
    return doc


def _finding(doc: dict[str, Any], code: str) -> dict[str, Any]:
    found: dict[str, Any] = next(f for f in doc["findings"] if f["code"] == code)
    return found


def _html_data(capsys: pytest.CaptureFixture[str], trace: Path, out: Path) -> dict[str, Any]:
    assert main(["report", str(trace), "-o", str(out)]) == 0
    capsys.readouterr()
    block = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', out.read_text(), re.S)
    assert block is not None
    data: dict[str, Any] = json.loads(block.group(1))  # the \u003c escapes are JSON escapes
    return data


def test_html_embeds_the_report_json_envelope(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The page's data is the document ``report --json`` prints, envelope and all."""
    doc = _json(capsys, "report", str(DEMO))
    assert _html_data(capsys, DEMO, tmp_path / "r.html") == doc
    assert (doc["command"], doc["tool"], doc["json_schema"]) == ("report", "tracewhy", 1)
    assert doc["warnings"] == []


def test_every_json_output_has_one_envelope(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (("diagnose", str(DEMO)), ("steps", str(DEMO)), ("ops", str(DEMO)), ("info", str(DEMO)),
                 ("nvtx", str(DEMO)), ("report", str(DEMO)), ("check", str(DEMO), "--max-step-p50", "1s")):
        doc = _json(capsys, *argv)
        assert {k: doc[k] for k in ("tool", "json_schema", "command")} == {
            "tool": "tracewhy", "json_schema": 1, "command": argv[0]}, argv
        assert isinstance(doc["warnings"], list) and isinstance(doc["tool_version"], str), argv


def test_step_statistics_agree_and_say_which(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's headline p50 and the input-bound finding's window are different statistics:
    each view names its statistic, and every view gives the same value for each."""
    steps = _json(capsys, "steps", str(DEMO))["stats"]
    diagnose = _json(capsys, "diagnose", str(DEMO))
    report = _json(capsys, "report", str(DEMO))
    check = _json(capsys, "check", str(DEMO), "--max-step-p50", "1s", "--max-step-p90", "1s")
    assert diagnose["step_stats"] == steps == report["steps"]["stats"]
    measured = {r["metric"]: r["measured"] for r in check["results"]}
    assert measured == {"step-p50": steps["p50_ns"], "step-p90": steps["p90_ns"]}

    _, text = _run(capsys, "diagnose", str(DEMO))
    headline = text.splitlines()[1]
    assert headline.startswith(f"{steps['count']} steady steps: duration p50 {fmt_ns(steps['p50_ns'])}, "
                               f"p90 {fmt_ns(steps['p90_ns'])}, mean {fmt_ns(steps['mean_ns'])}")

    # The finding's denominator is the mean window (start to next start), said so in text and JSON.
    finding = _finding(diagnose, "input-bound")
    ev = finding["evidence"]
    assert set(ev) >= {"mean_window_ns", "mean_dataloader_ns_per_step", "steady_steps"}
    assert ev["steady_steps"] == steps["count"]
    assert (f"{fmt_ns(ev['mean_dataloader_ns_per_step'])} of its {fmt_ns(ev['mean_window_ns'])} window "
            in finding["statement"])
    assert f"means over {steps['count']} steady steps" in finding["statement"]
    assert finding == _finding(report, "input-bound")


def test_gap_starts_share_one_origin(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Every view gives gap starts from the trace start: none before it, the same offset for the
    same gap in ``gaps`` (table and JSON) and the HTML report."""
    path = shared_trace(DDP)
    gaps = _json(capsys, "gaps", str(path))
    first_ts = _json(capsys, "info", str(path))["info"]["first_ts_ns"]
    html = _html_data(capsys, path, tmp_path / "r.html")
    assert gaps["time_origin_ns"] == html["time_origin_ns"] == html["utilization"]["t0_ns"] == first_ts
    assert gaps["time_origin"] == html["time_origin"] and "trace start" in gaps["time_origin"]
    by_start = {g["start_ns"]: g["start_from_origin_ns"] for g in gaps["gaps"]}
    assert all(g["start_from_origin_ns"] == g["start_ns"] - first_ts >= 0 for g in gaps["gaps"])
    top = html["gaps"]["top"]
    assert top and all(g["start_ms"] * 1e6 == pytest.approx(by_start[g["start_ns"]], abs=1) for g in top)

    _, text = _run(capsys, "gaps", str(path), "--top", "1")
    assert "start from the trace start" in text
    largest = gaps["gaps"][0]
    row = next(line for line in text.splitlines() if fmt_ns(largest["dur_ns"]) in line)
    assert fmt_ns(largest["start_from_origin_ns"]) in row


def _raw_names(path: Path) -> list[str]:
    with gzip.open(path, "rt") as f:
        return [str(e.get("name")) for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def test_sync_counts_agree_and_say_which_calls(capsys: pytest.CaptureFixture[str]) -> None:
    """``check --max-syncs-per-step`` and diagnose's nsys-sync-api give the same per-step count of
    blocking calls (cudaEventSynchronize included), and diagnose also gives nsys's own count of
    device and stream synchronize, which the raw file confirms."""
    path = shared_trace(DDP)
    check = _json(capsys, "check", str(path), "--max-syncs-per-step", "100")["results"][0]
    diagnose = _json(capsys, "diagnose", str(path))
    finding = _finding(diagnose, "nsys-sync-api")
    ev = finding["evidence"]
    assert check["measured"] == ev["blocking_calls_per_step"] == 8
    assert check["note"].startswith(ev["blocking_calls_statistic"]) and "cudaEventSynchronize 8" in check["note"]
    assert "event" in ev["blocking_calls_counted"]
    names = _raw_names(path)
    nsys_count = sum(n in ("cudaDeviceSynchronize", "cudaStreamSynchronize") for n in names)
    assert ev["count"] == nsys_count == 1
    assert names.count("cudaEventSynchronize") >= 8 * 3  # three steady steps' worth, at least
    assert finding["statement"].startswith("8 blocking calls per step (mean of 3 steady steps: "
                                           "cudaEventSynchronize 8; as check --max-syncs-per-step counts).")
    assert f"device and stream synchronize only) finds {nsys_count}," in finding["statement"]


def test_collectives_per_step_column_is_per_step(capsys: pytest.CaptureFixture[str]) -> None:
    """The collectives' exposed time per step is their total over the steady steps divided by
    their number, the totals are labelled as totals, and per step they add up to the steady
    step's exposed communication."""
    path = shared_trace(DDP)
    doc = _json(capsys, "overlap", str(path))
    n = doc["steady_steps"]
    assert n == 3 and doc["collectives_over"] == "3 steady steps"
    for c in doc["collectives"]:
        assert c["exposed_ns_per_step"] == pytest.approx(c["exposed_ns"] / n)
    steady = doc["steady"][0]
    per_step = sum(c["exposed_ns_per_step"] for c in doc["collectives"] if c["device"] == steady["device"])
    assert per_step == pytest.approx(steady["comm_exposed_ns"], rel=0.01)
    _, text = _run(capsys, "overlap", str(path))
    assert "collectives over the 3 steady steps" in text and "total exposed" in text and "exposed per step" in text


def test_a_payload_cannot_overwrite_the_envelope() -> None:
    with pytest.raises(ValueError, match="warnings"):
        envelope("steps", {"warnings": ["mine"]}, [])


def _raw_runtime_calls(path: Path, tmp_path: Path, name: str) -> int:
    """How many CUDA runtime calls of ``name`` (any version suffix) the export holds, by SQL."""
    db = tmp_path / "export.sqlite"
    with gzip.open(path, "rb") as src:
        db.write_bytes(src.read())
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        return int(con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
                               "ON r.nameId = s.id WHERE s.value LIKE ?", (name + "%",)).fetchone()[0])


def test_a_trace_without_steps_counts_blocking_calls_over_the_trace(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    """nsys-ai's H100 export has no step markers: its blocking calls are counted over the whole
    trace, and the statement and the advice say so rather than "per step" (the raw file's
    cudaStreamSynchronize calls); the blocks it tables read in the units of every other time."""
    path = shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz")
    diagnose = _json(capsys, "diagnose", str(path))
    finding = _finding(diagnose, "nsys-sync-api")
    n = _raw_runtime_calls(path, tmp_path, "cudaStreamSynchronize")
    assert finding["evidence"]["blocking_calls_per_step"] == n == 8
    assert finding["statement"].startswith(f"{n} blocking calls over the trace (no step markers; "
                                           f"cudaStreamSynchronize {n}; ")
    assert "per step" not in finding["statement"] and "per step" not in finding["next_step"]
    blocks = _finding(diagnose, "block-attribution")
    top = blocks["evidence"]["blocks"][0]
    assert f"leads with {fmt_ns(top['gpu_time_ns_per_step'])} (" in blocks["statement"]
    assert "e+" not in blocks["statement"]
