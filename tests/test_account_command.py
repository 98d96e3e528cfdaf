"""``tracewhy account``: where the step goes, alone. Its parts add up to the step as the raw
file's own step markers space them, its first lines are those ``diagnose`` opens with, and bad
input gets one line and a non-zero exit."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import pytest

from conftest import GENERATED, shared_trace
from tracewhy.cli import main

A100_DDP = "hta/a100_ddp2_rank0_nccl2.17.json.gz"


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main([*argv, "--json", "--no-cache"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_parts_add_up_to_the_raw_steps(capsys: pytest.CaptureFixture[str]) -> None:
    """The DDP trace's ProfilerStep#N spans (read here from the raw JSON) are ~222 ms apart; the
    parts of each analysed step add up to its window, and the mean to ``mean_step_ns``."""
    path = shared_trace(A100_DDP)
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    starts = sorted(float(e["ts"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
                    and e.get("ph") == "X")
    spacing_us = [b - a for a, b in itertools.pairwise(starts)]
    d = _json(["account", str(path)], capsys)
    assert d["source"] == "steps" and d["steps_analysed"] == 3
    parts = d["parts"]
    assert isinstance(parts, list)
    assert sum(int(p["ns_per_step"]) for p in parts) == pytest.approx(d["mean_step_ns"], abs=len(parts))
    per_step: dict[int, int] = {}
    for row in d["per_step"]:  # type: ignore[attr-defined]
        per_step[row["step"]] = per_step.get(row["step"], 0) + row["ns"]
    windows = {w["step"]: w["window_ns"] for w in d["windows"]}  # type: ignore[attr-defined]
    assert per_step == windows
    assert min(spacing_us) * 1e3 * 0.99 <= d["mean_step_ns"] <= max(spacing_us) * 1e3 * 1.01  # type: ignore[operator]


def test_the_lines_are_diagnoses_opening(capsys: pytest.CaptureFixture[str]) -> None:
    path = GENERATED / "cpu_dataloader_slow.pt.trace.json.gz"
    lines = _json(["account", str(path)], capsys)["lines"]
    assert lines == _json(["diagnose", str(path)], capsys)["account"]
    assert isinstance(lines, list) and lines[0]["part"] == "data loading" and not lines[0]["essential"]
    assert sum(a["share"] for a in lines if a["kind"] != "rest") >= 0.8


def test_the_terminal_view_names_the_parts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["account", str(GENERATED / "cpu_slow_step_planted.pt.trace.json.gz"), "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "Where the step goes" in out and "host: planted_slowdown" in out and "avoidable" in out


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{"traceEvents": [')
    code = main(["account", str(bad), "--no-cache"])
    err = capsys.readouterr().err.strip()
    assert code not in (0, 70) and len(err.splitlines()) == 1 and "broken.json" in err
