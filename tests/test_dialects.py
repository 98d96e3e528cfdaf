"""Dialects and fields (issue 14 item 11): torch's Python exporter, and epoch-based float times."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import polars as pl

import tracewhy
from builders import KinetoBuilder
from conftest import GENERATED, shared_trace
from tracewhy.analyses.info import info
from tracewhy.findings.diagnose import diagnose
from tracewhy.model import Col, Kind

PYTHON_EXPORT = GENERATED / "cpu_python_export_memory.pt.trace.json.gz"


def _raw_events(path: Path) -> list[dict[str, object]]:
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    return [e for e in doc["traceEvents"] if isinstance(e, dict)]


# (a) export_chrome_trace(..., use_python_export=True) writes [memory] instants as "X" slices
# with "finished": false (torch 2.13, torch/profiler/_chrome_trace_export.py).


def test_python_export_memory_events_are_instants() -> None:
    events = _raw_events(PYTHON_EXPORT)
    memory = [e for e in events if e.get("name") == "[memory]"]
    assert memory and all(e["ph"] == "X" for e in memory)  # the dialect is still what torch writes
    trace = tracewhy.load(PYTHON_EXPORT)
    trace.check()
    assert trace.memory.height == len(memory)
    assert trace.meta.unfinished_events == 0
    assert trace.meta.missing_events == ()
    assert trace.of_kind(Kind.OTHER).height == 0
    # Each memory row keeps the instant's time and its bytes.
    first = min(memory, key=lambda e: Decimal(str(e["ts"])))
    row = trace.memory.row(0, named=True)
    assert row["ts_ns"] == int(Decimal(str(first["ts"])) * 1000)
    assert row["bytes"] == first["args"]["Bytes"]  # type: ignore[index]
    codes = {f.code for f in diagnose(trace).findings}
    assert "incomplete-trace" not in codes
    assert info(trace).memory_events == len(memory)


def test_cpu_instant_event_slice_inline(tmp_path: Path) -> None:
    b = KinetoBuilder()
    b.op("aten::empty", 10.0, 5.0)
    b.events.append({"ph": "X", "cat": "cpu_instant_event", "name": "[memory]", "pid": 100, "tid": 100,
                     "ts": 12.5, "dur": 93868.932, "args": {"Bytes": 256, "Device Type": 0, "Device Id": -1,
                                                            "Total Allocated": 256, "finished": False}})
    trace = tracewhy.load(b.write(tmp_path / "py.json"))
    assert trace.memory.get_column("ts_ns").to_list() == [12_500]
    assert trace.memory.get_column("bytes").to_list() == [256]
    assert trace.slices.height == 1
    assert trace.meta.warnings == ()


# (c) Epoch-based float microseconds (~1.7e15) keep only 0.25 us in a float64.

V100 = "hta/v100_rank0_displayTimeUnit_ns_fractional_us.json.gz"


def test_epoch_fractional_times_are_quantised_and_said_so() -> None:
    path = shared_trace(V100)
    kernels = [e for e in _raw_events(path) if e.get("ph") == "X" and e.get("cat") == "kernel"]
    exact = sorted(int(Decimal(str(e["ts"])) * 1000) for e in kernels)
    trace = tracewhy.load(path)
    got = sorted(trace.of_kind(Kind.KERNEL).get_column(Col.TS).to_list())
    # Precision is lost: the file's nanoseconds are not all kept, but none is off by more
    # than half a step, and the step is said.
    assert got != exact
    diff = [abs(a - b) for a, b in zip(got, exact, strict=True)]
    assert max(diff) <= 125
    assert trace.meta.ts_step_ns == 250
    assert any("quantised to 250 ns" in w for w in info(trace).warnings)
    finding = next(f for f in diagnose(trace).findings if f.code == "quantised-times")
    assert finding.evidence["step_ns"] == 250


def test_relative_and_integer_times_are_exact(tmp_path: Path) -> None:
    # Integer epoch microseconds are exact in a float64; fractions on small (relative) times too.
    b = KinetoBuilder()
    b.op("aten::mm", 1712867402348628.0, 3.5)
    b.op("aten::add", 95786113648.115, 2.0)
    trace = tracewhy.load(b.write(tmp_path / "exact.json"))
    assert sorted(trace.slices.get_column(Col.TS).to_list()) == [95786113648115, 1712867402348628000]
    assert trace.meta.ts_step_ns == 0
    assert not any("quantised" in w for w in info(trace).warnings)
    a100 = tracewhy.load(shared_trace("hta/a100_cuda_event_sync_small.json.gz"))  # int epoch us
    assert a100.meta.ts_step_ns == 0
    assert a100.slices.filter(pl.col(Col.TS) % 1000 != 0).height == 0
