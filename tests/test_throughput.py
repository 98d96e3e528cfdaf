"""Throughput in the user's unit: ``--items-per-step N --unit U`` on ``steps``,
``diagnose``, ``diff``, ``check`` and ``pipeline`` turns steady step (chunk) times into items per
second. The oracle reads the step durations (or the stage marks) straight from the raw files and
takes the same quantiles with ``statistics``; never tracewhy's own tables.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

import pytest

from conftest import GENERATED, ROOT, shared_trace
from tracewhy.cli import main

DEMO = ROOT / "examples" / "demo_cpu_training.pt.trace.json.gz"
GPU_TRACE = "hta/tracediff_control_a100_rank3of8.json.gz"
BASE = GENERATED / "cpu_slow_step_base.pt.trace.json.gz"
PLANTED = GENERATED / "cpu_slow_step_planted.pt.trace.json.gz"
LOGS = GENERATED / "pipeline"


def _raw_steps(path: Path) -> list[int]:
    """ProfilerStep#N durations from the JSON (us -> ns), in time order."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    marked = sorted((e["ts"], e["dur"]) for e in events
                    if e.get("ph") == "X" and re.fullmatch(r"ProfilerStep#\d+", str(e.get("name"))))
    return [round(dur * 1000) for _, dur in marked]


def _rates(durations: list[int], items: float) -> dict[str, float]:
    """Items per second at each statistic of the durations, the statistic taken to the nearest
    nanosecond as every time tracewhy reports is."""
    q = statistics.quantiles(durations, n=10, method="inclusive")
    return {"p50_per_s": items * 1e9 / round(statistics.median(durations)), "p90_per_s": items * 1e9 / round(q[8]),
            "mean_per_s": items * 1e9 / round(statistics.fmean(durations))}


def _json(capsys: pytest.CaptureFixture[str], argv: list[str], code: int = 0) -> dict[str, object]:
    assert main([*argv, "--json"]) == code
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


def test_steps_on_the_demo_trace(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, ["steps", str(DEMO), "--warmup", "1", "--items-per-step", "32", "--unit", "images"])
    t = doc["throughput"]
    assert isinstance(t, dict)
    want = _rates(_raw_steps(DEMO)[1:], 32)
    assert {k: t[k] for k in want} == pytest.approx(want, rel=1e-12)
    assert (t["unit"], t["rate_unit"], t["per"], t["count"]) == ("images", "images/s", "step", 15)
    assert main(["steps", str(DEMO), "--warmup", "1", "--items-per-step", "32", "--unit", "images"]) == 0
    # 32 images over the median steady step of 10.522781 ms, over the p90 of 12.0322824 ms.
    assert "throughput 3,041 images/s at the median step (2,660 images/s at the p90 step" in capsys.readouterr().out


def test_diagnose_on_a_gpu_trace(capsys: pytest.CaptureFixture[str]) -> None:
    path = shared_trace(GPU_TRACE)
    doc = _json(capsys, ["diagnose", str(path), "--warmup", "1", "--items-per-step", "4096", "--unit", "tokens"])
    t = doc["throughput"]
    assert isinstance(t, dict)
    want = _rates(_raw_steps(path)[1:], 4096)
    assert {k: t[k] for k in want} == pytest.approx(want, rel=1e-12)
    assert t["rate_unit"] == "tokens/s" and t["count"] == 5


def test_without_the_option_nothing_changes(capsys: pytest.CaptureFixture[str]) -> None:
    assert "throughput" not in _json(capsys, ["steps", str(DEMO)])


def test_diff_says_the_change_beside_its_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, ["diff", str(BASE), str(PLANTED), "--items-per-step", "8", "--unit", "frames"])
    t = doc["throughput"]
    assert isinstance(t, dict)
    a_steps, b_steps = doc["a_step_durations_ns"], doc["b_step_durations_ns"]
    assert isinstance(a_steps, list) and isinstance(b_steps, list)
    raw_a, raw_b = _raw_steps(BASE), _raw_steps(PLANTED)
    assert a_steps == raw_a[len(raw_a) - len(a_steps):] and b_steps == raw_b[len(raw_b) - len(b_steps):]
    a, b = _rates(a_steps, 8)["p50_per_s"], _rates(b_steps, 8)["p50_per_s"]
    assert t["a"]["p50_per_s"] == pytest.approx(a, rel=1e-12)
    assert t["relative_change"] == pytest.approx(b / a - 1, rel=1e-12)
    assert t["statement"] == f"throughput {a:,.0f} -> {b:,.0f} FPS ({100 * (b / a - 1):+.0f}%) at the median step"
    assert main(["diff", str(BASE), str(PLANTED), "--items-per-step", "8", "--unit", "frames"]) == 0
    lines = capsys.readouterr().out.splitlines()
    verdict = next(i for i, line in enumerate(lines) if line.startswith("B is slower"))
    assert lines[verdict + 1] == t["statement"]


def test_check_gates_on_the_median_rate(capsys: pytest.CaptureFixture[str]) -> None:
    rate = _rates(_raw_steps(DEMO)[1:], 32)["p50_per_s"]  # 3041.0 images/s
    base = ["check", str(DEMO), "--warmup", "1", "--items-per-step", "32", "--unit", "images"]
    assert main([*base, "--min-throughput", f"{rate - 1:.0f}/s"]) == 0
    assert capsys.readouterr().out.startswith("ok   throughput: 3,041/s >= min 3,040/s (3,041 images/s at the median")
    assert main([*base, "--min-throughput", f"{rate + 1:.0f} images/s"]) == 1
    assert capsys.readouterr().out.startswith("FAIL throughput: 3,041/s < min 3,042/s")
    doc = _json(capsys, [*base, "--min-throughput", "3042"], code=1)
    assert doc["results"][0]["measured"] == pytest.approx(rate, rel=1e-12)  # type: ignore[index]


@pytest.mark.parametrize("argv", [
    ["check", str(DEMO), "--min-throughput", "20/s"],  # no items per step
    ["check", str(DEMO), "--items-per-step", "8", "--min-throughput", "fast"],
    ["steps", str(DEMO), "--unit", "frames"],
    ["steps", str(DEMO), "--items-per-step", "0"],
    ["steps", str(DEMO), "--items-per-step", "8", "--unit", "bananas"],
])
def test_bad_options_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.strip()


def _periods(directory: Path, warmup: int) -> list[int]:
    """tEmit_k - tEmit_{k-1} for the steady chunks, from the raw rank-0 marks."""
    emit: dict[int, int] = {}
    for line in (directory / "tracewhy-instrument.rank0.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["type"] == "mark" and rec["name"] == "tEmit":
            emit.setdefault(rec["chunk"], rec["t_ns"])
    chunks = sorted(emit)[warmup:]
    return [emit[k] - emit[k - 1] for k in chunks]


def test_pipeline_per_chunk(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, ["pipeline", str(LOGS / "d2"), "--items-per-step", "16", "--unit", "frames"])
    t = doc["throughput"]
    assert isinstance(t, dict) and t["per"] == "chunk" and t["rate_unit"] == "FPS"
    want = _rates(_periods(LOGS / "d2", 2), 16)
    assert {k: t[k] for k in want} == pytest.approx(want, rel=1e-12)
    doc = _json(capsys, ["pipeline", str(LOGS / "d1"), "--vs", str(LOGS / "d2"), "--items-per-step", "16",
                         "--unit", "frames"], code=1)
    t = doc["throughput"]
    assert isinstance(t, dict)
    a, b = (_rates(_periods(LOGS / d, 2), 16)["p50_per_s"] for d in ("d1", "d2"))
    assert t["relative_change"] == pytest.approx(b / a - 1, rel=1e-12) and b > 1.5 * a  # D=2 overlaps
    assert t["statement"] == f"throughput {a:,.0f} -> {b:,.0f} FPS ({100 * (b / a - 1):+.0f}%) at the median chunk"
