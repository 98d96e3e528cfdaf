"""Idle in gaps shorter than --min-gap: counted as its own part, so the
classes add up to the idle time, and a finding when it is a material share of the step."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import numpy as np
import polars as pl

import tracewhy
from builders import KinetoBuilder
from conftest import shared_trace
from tracewhy.analyses.gaps import CLASSES, DEFAULT_MIN_GAP_NS, gaps
from tracewhy.analyses.steps import steps
from tracewhy.reports.diagnose import diagnose

QWEN = "tracelens/h100_qwen1.5-0.5b_bs16_seq2048.json.gz"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def test_classes_and_short_add_up_to_idle_on_the_h100_qwen_trace() -> None:
    """51% of the step's idle time lay in gaps under 2 µs, which no class counted. Recomputed
    here from the raw events: the union of device 0's activity, its holes inside the step
    window, those under the minimum gap."""
    path = shared_trace(QWEN)
    trace = tracewhy.load(path)
    steps_result = steps(trace)
    g = gaps(trace, steps_result)
    row = g.per_step.filter(pl.col("device") == 0).row(0, named=True)
    # Each class's ns per gap is truncated to whole ns: at most 1 ns per class and gap.
    classified = sum(row[f"{c}_ns"] for c in CLASSES)
    assert 0 <= row["idle_ns"] - classified - row["short_ns"] <= len(CLASSES) * g.gaps.height
    assert row["short_ns"] / row["idle_ns"] > 0.5

    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    spans = sorted((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)) for e in events
                   if e.get("ph") == "X" and e.get("cat") in GPU_CATS and e["args"].get("device") == 0)
    merged: list[list[int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    step = steps_result.table.row(0, named=True)
    lo, hi = step["ts_ns"], step["window_end_ns"]
    holes = np.array([(max(a[1], lo), min(b[0], hi)) for a, b in itertools.pairwise(merged)
                      if a[1] < hi and b[0] > lo])
    widths = holes[:, 1] - holes[:, 0]
    short = widths[(widths > 0) & (widths < DEFAULT_MIN_GAP_NS)]
    # The reader converts µs to ns without float rounding error; allow 1 ns per gap for ours.
    assert abs(int(short.sum()) - row["short_ns"]) <= short.size
    assert row["short_gaps"] == short.size


def test_many_tiny_gaps_are_a_finding(tmp_path: Path) -> None:
    """Three steps of 50 kernels of 10 µs, each 1.5 µs after the last: 49 gaps of 1.5 µs per
    step, 73.5 µs of a 600 µs step, none of them classified."""
    b = KinetoBuilder()
    for s in range(3):
        t0 = 1000 + s * 600
        b.annotation(f"ProfilerStep#{s}", t0, 600)
        for i in range(50):
            b.launch("tiny", t0 + i * 11.5 - 1, 1, t0 + i * 11.5, 10)
    trace = tracewhy.load(b.write(tmp_path / "tiny.json"))
    report = diagnose(trace)
    f = next(f for f in report.findings if f.code == "gpu-idle-short")
    assert f.evidence["short_gaps"] == 49 and f.evidence["short_idle_ns"] == 49 * 1500
    assert "49 gaps shorter than 2.0 µs" in f.statement
    assert abs(report.basis.short_ns + sum(report.basis.class_ns.values()) - report.basis.idle_ns) < 10
