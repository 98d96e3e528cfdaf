"""Traces we make ourselves with torch 2.13 on CPU (scripts/gen_traces) load, and their
numbers match what this test computes independently from the raw JSON."""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import tracewhy
from conftest import GENERATED, ROOT
from tracewhy.analyses.ops import ops
from tracewhy.analyses.steps import StepsOptions, steps
from tracewhy.model import Col

FILES = sorted(p.name for p in GENERATED.glob("*.json.gz"))
DEMO = ROOT / "examples" / "demo_cpu_training.pt.trace.json.gz"
STEP = re.compile(r"^ProfilerStep#\d+$")


def _events(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    return [e for e in doc["traceEvents"] if isinstance(e, dict)]


def _ns(v: Any) -> int:
    return int((Decimal(v) * 1000).to_integral_value())


def _independent_self_times(events: list[dict[str, Any]]) -> dict[str, int]:
    """CPU self time per op name by brute force: for each op, subtract every cpu_op on the same
    thread that lies inside it and has no other op between them (a direct child)."""
    ops_by_thread: dict[tuple[Any, Any], list[tuple[int, int, str]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            ops_by_thread[(e["pid"], e["tid"])].append((_ns(e["ts"]), _ns(e["dur"]), e["name"]))
    totals: dict[str, int] = defaultdict(int)
    for items in ops_by_thread.values():
        items.sort(key=lambda x: (x[0], -x[1]))
        for i, (ts, dur, name) in enumerate(items):
            inside = [(t, d) for (t, d, _) in items[i + 1 :] if t >= ts and t + d <= ts + dur and t < ts + dur]
            direct = [c for c in inside if not any(o != c and o[0] <= c[0] and o[0] + o[1] >= c[0] + c[1]
                                                    and (o[0], o[1]) != (c[0], c[1]) for o in inside)]
            totals[name] += max(dur - sum(d for _, d in direct), 0)
    return totals


@pytest.mark.parametrize("name", FILES)
def test_generated_trace_loads_and_matches_raw(name: str) -> None:
    path = GENERATED / name
    events = _events(path)
    trace = tracewhy.load(path)
    trace.check()
    raw_ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    steps_raw = {e["name"] for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
                 and STEP.match(e["name"])}
    # Without ProfilerStep markers the noschedule loop's steps are its train_step blocks (inferred
    # from the trace's structure, tests/test_no_step_markers.py); without those either, the
    # iterations between DataLoader fetches (tests/test_loop_iterations.py).
    inferred = [e for e in events if e.get("ph") == "X" and e.get("name") == "train_step"] if not steps_raw else []
    fetches = [e for e in events if e.get("ph") == "X" and "DataLoader" in str(e.get("name"))
               and str(e.get("name")).endswith("__next__")] if not (steps_raw or inferred) else []
    assert steps(trace).table.height == (len(steps_raw) or len(inferred) or max(len(fetches) - 1, 0))
    table = ops(trace).table
    assert int(table.get_column("calls").sum()) == len(raw_ops)
    assert int(table.get_column("cpu_total_ns").sum()) == sum(_ns(e["dur"]) for e in raw_ops)
    assert int(table.get_column("gpu_total_ns").sum()) == 0  # a CPU build launches nothing on a GPU
    if trace.meta.distributed:
        assert trace.meta.world_size == 2


def test_self_time_matches_brute_force() -> None:
    path = GENERATED / "cpu_eager_schedule.pt.trace.json.gz"
    expected = _independent_self_times(_events(path))
    got = {r["name"]: r["cpu_self_ns"] for r in ops(tracewhy.load(path)).table.iter_rows(named=True)}
    assert got == expected


def test_train_step_marker_without_profiler_steps() -> None:
    trace = tracewhy.load(GENERATED / "cpu_eager_noschedule.pt.trace.json.gz")
    assert steps(trace).marker == "train_step"  # inferred: the repeated top-level block
    custom = steps(trace, StepsOptions(marker="train_step"))
    # Six iterations (MANIFEST); the first, with no schedule, is the run's first iteration and
    # took 5x the others: warm-up by the outlier rule.
    assert custom.table.height == 6 and custom.warmup == 1
    assert custom.stats is not None and custom.stats.count == 5


def test_planted_slowdown_is_visible_in_step_times() -> None:
    # The planted run sleeps 5 ms inside each step: its steady p50 must exceed the base by
    # at least 4 ms (sleep granularity and machine load allow some slack, never less).
    base = steps(tracewhy.load(GENERATED / "cpu_slow_step_base.pt.trace.json.gz")).stats
    planted = steps(tracewhy.load(GENERATED / "cpu_slow_step_planted.pt.trace.json.gz")).stats
    assert base is not None and planted is not None
    assert planted.p50_ns - base.p50_ns > 4_000_000


def test_heavy_capture_flags_from_header() -> None:
    c = tracewhy.load(GENERATED / "cpu_with_stack_memory.pt.trace.json.gz").meta.capture
    assert c.source == "header"
    assert (c.record_shapes, c.profile_memory, c.with_stack, c.with_flops, c.with_modules) == (True,) * 5


def test_demo_trace_is_a_real_training_trace() -> None:
    trace = tracewhy.load(DEMO)
    trace.check()
    steps_result = steps(trace)
    assert steps_result.table.height >= 10 and steps_result.stats is not None
    names = set(trace.slices.get_column(Col.NAME).cast(pl.String).unique().to_list())
    assert any(n.startswith("enumerate(DataLoader)") for n in names)
