"""Traces without ProfilerStep markers still get conclusions: a repeated
top-level block that tiles the run is taken as the step, and without one the input share is
reported over the trace. Expected figures come from the raw JSON of generated traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

import tracewhy
from conftest import GENERATED
from tracewhy.analyses.steps import steps
from tracewhy.cli import main


def _events(path: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return events


def test_repeated_top_level_block_is_the_step() -> None:
    """cpu_eager_noschedule: no schedule and no prof.step(); each iteration is a
    record_function('train_step') block holding forward, backward and optimizer."""
    path = GENERATED / "cpu_eager_noschedule.pt.trace.json.gz"
    blocks = sorted(e["ts"] for e in _events(path) if e.get("name") == "train_step" and e.get("ph") == "X")
    r = steps(tracewhy.load(path))
    assert r.marker == "train_step" and r.table.height == len(blocks) == 6
    assert r.note is not None and "top-level block 'train_step', repeated 6 times" in r.note
    # Inner blocks (forward, backward, optimizer) repeat as often but sit inside train_step.
    assert "'forward'" not in r.note.split(";")[0]


def test_input_share_over_the_trace_without_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """cpu_dataloader_slow with its ProfilerStep markers removed: a DataLoader-bound loop with
    nothing to divide by. Its input share is the fetches' time over the training thread's span."""
    doc = json.loads(gzip.decompress((GENERATED / "cpu_dataloader_slow.pt.trace.json.gz").read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    path = tmp_path / "loader_no_steps.json"
    path.write_text(json.dumps(doc))
    fetches = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "DataLoader" in str(e.get("name"))
               and "__next__" in str(e.get("name"))]
    tid = fetches[0]["tid"]
    host = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("tid") == tid
            and e.get("cat") in ("cpu_op", "user_annotation", "python_function")]
    span_us = max(e["ts"] + e["dur"] for e in host) - min(e["ts"] for e in host)
    loader_us = sum(e["dur"] for e in fetches)  # one per batch, none nested in another
    assert main(["diagnose", str(path), "--json", "--no-cache"]) == 0
    found = {f["code"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    f = found["input-bound"]
    assert f["evidence"]["dataloader_ns"] == pytest.approx(loader_us * 1000, abs=len(fetches) * 2)
    assert f["evidence"]["span_ns"] == pytest.approx(span_us * 1000, abs=2)
    assert loader_us / span_us > 0.5 and f["severity"] == "high"
    assert "Over the trace (no step markers)" in f["statement"]
