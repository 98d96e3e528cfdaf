"""Traces without ProfilerStep markers still get conclusions: a repeated
top-level block that tiles the run is taken as the step, and without one the loop's iterations
(one DataLoader fetch to the next) are. Expected figures come from the raw JSON of generated traces."""

from __future__ import annotations

import gzip
import itertools
import json
import statistics
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


def test_input_share_per_iteration_without_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """cpu_dataloader_slow with its ProfilerStep markers removed: a DataLoader-bound loop whose
    iterations run from one fetch to the next. Its input share is per steady iteration."""
    doc = json.loads(gzip.decompress((GENERATED / "cpu_dataloader_slow.pt.trace.json.gz").read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    path = tmp_path / "loader_no_steps.json"
    path.write_text(json.dumps(doc))
    fetches = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X" and "DataLoader" in str(e.get("name"))
                      and "__next__" in str(e.get("name"))), key=lambda e: e["ts"])
    periods_us = [b["ts"] - a["ts"] for a, b in itertools.pairwise(fetches)]
    assert main(["diagnose", str(path), "--json", "--no-cache"]) == 0
    found = {f["code"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    f = found["input-bound"]
    steady = f["evidence"]["steady_steps"]
    # schedule(wait=1, warmup=1): no iteration is the run's first; the first may still be a slow outlier.
    assert steady in (len(periods_us), len(periods_us) - 1)
    steady_us = periods_us[-steady:]
    assert f["evidence"]["mean_window_ns"] == pytest.approx(statistics.mean(steady_us) * 1000, rel=1e-3)
    # Each iteration opens with its fetch: the fetches' time over the iterations' is the input share.
    share = sum(e["dur"] for e in fetches[-steady - 1:-1]) / sum(steady_us)
    assert share > 0.5 and f["severity"] == "high"
    assert f["evidence"]["mean_dataloader_ns_per_step"] / f["evidence"]["mean_window_ns"] >= share - 0.02
    assert "per step" in f["statement"] or "steady steps" in f["statement"]
