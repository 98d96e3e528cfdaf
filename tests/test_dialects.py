"""Dialects and fields: torch's Python exporter, and epoch-based float times."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl

import tracewhy
from builders import KinetoBuilder
from conftest import GENERATED, shared_trace
from tracewhy.analyses.info import info
from tracewhy.model import Col, Kind
from tracewhy.reports.diagnose import diagnose

PYTHON_EXPORT = GENERATED / "cpu_python_export_memory.pt.trace.json.gz"


def _raw_events(path: Path) -> list[dict[str, Any]]:
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
    assert row["bytes"] == first["args"]["Bytes"]
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


# (b) cuda_sync records name what was waited on: "wait_on_stream" and
# "wait_on_cuda_event_record_corr_id" (-1 when nothing, as on "Context Sync").

MULTISTREAM = "hta/a100_cuda_event_sync_multistream.json.gz"
ALEXNET = "hta/a100_alexnet_simple_add_cp_input.json.gz"


def test_sync_wait_targets_are_read() -> None:
    path = shared_trace(MULTISTREAM)
    raw = [e for e in _raw_events(path) if e.get("cat") == "cuda_sync"]
    expected = sorted((int(e["ts"]) * 1000, e["args"]["wait_on_stream"], e["args"]["wait_on_cuda_event_record_corr_id"])
                      for e in raw if e["args"].get("wait_on_stream", -1) >= 0)
    assert len(expected) == 3  # two Event Syncs and one Stream Wait Event; the Context Sync names none
    trace = tracewhy.load(path)
    trace.check()
    got = trace.sync_attrs.join(trace.slices.select(Col.ID, Col.TS), on=Col.ID).sort(Col.TS)
    assert got.select(Col.TS, "wait_stream", "wait_record_correlation").rows() == expected


def _cross_stream_loop() -> KinetoBuilder:
    """Kernel A on stream 7 ends at 100 us; the host records event E on stream 7 only at 290 us
    (after a CPU op), but already made stream 20 wait on E (at 5 us) and queued kernel B there
    (at 10 us). B can start only once E is recorded: the device idles from 100 to 300 us while
    the host is busy in aten::slow."""
    b = KinetoBuilder()
    b.op("aten::mm", 0.0, 4.0)
    b.launch("kernel_a", 1.0, 2.0, 20.0, 80.0, stream=7)
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "pid": 100, "tid": 100,
                     "ts": 5.0, "dur": 1.0, "args": {"correlation": 9001}})
    b.events.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 20,
                     "ts": 5.0, "dur": 1.0, "args": {"cuda_sync_kind": "Stream Wait Event", "wait_on_stream": 7,
                                                     "wait_on_cuda_event_record_corr_id": 9002, "stream": 20,
                                                     "correlation": 9001, "device": 0}})
    b.launch("kernel_b", 10.0, 2.0, 300.0, 50.0, stream=20)
    b.op("aten::slow", 20.0, 268.0)
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaEventRecord", "pid": 100, "tid": 100,
                     "ts": 290.0, "dur": 1.0, "args": {"correlation": 9002}})
    return b


def test_cross_stream_wait_is_a_dependency_gap(tmp_path: Path) -> None:
    from tracewhy.analyses.gaps import gaps
    from tracewhy.analyses.steps import steps

    trace = tracewhy.load(_cross_stream_loop().write(tmp_path / "wait.json"))
    trace.check()
    g = gaps(trace, steps(trace)).gaps
    assert g.select("start_ns", "dur_ns", "gap_class", "next_activity", "wait_stream", "dependency_ns",
                    "host_ns").rows() == [(100_000, 200_000, "dependency", "kernel_b", 7, 200_000, 0)]


def test_same_gap_without_the_wait_is_host_time(tmp_path: Path) -> None:
    from tracewhy.analyses.gaps import gaps
    from tracewhy.analyses.steps import steps

    b = _cross_stream_loop()
    b.events = [e for e in b.events if e["cat"] != "cuda_sync"]
    trace = tracewhy.load(b.write(tmp_path / "nowait.json"))
    g = gaps(trace, steps(trace)).gaps
    assert g.select("gap_class", "wait_stream").rows() == [("host", None)]


def test_real_cross_stream_waits_point_at_work_that_ended_first() -> None:
    """Each gap blamed on a wait: the awaited work (the last activity launched on the awaited
    stream before the wait was enqueued) ended before the waiting work started,
    as CUDA guarantees; checked from the raw file, not from the reader's tables."""
    from tracewhy.analyses.gaps import gaps
    from tracewhy.analyses.steps import steps

    path = shared_trace(ALEXNET)
    raw = _raw_events(path)
    runtime = {e["args"]["correlation"]: e for e in raw
               if e.get("cat") == "cuda_runtime" and isinstance(e.get("args"), dict)}
    device = [e for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    waits = [e for e in raw if e.get("cat") == "cuda_sync" and e.get("name") == "Stream Wait Event"]
    trace = tracewhy.load(path)
    g = gaps(trace, steps(trace)).gaps.filter(pl.col("wait_stream").is_not_null())
    assert g.height >= 2
    checked = 0
    for start_ns, dur_ns, wait_stream in g.select("start_ns", "dur_ns", "wait_stream").rows():
        end_ns = start_ns + dur_ns
        nxt = min((e for e in device if int(Decimal(str(e["ts"])) * 1000) >= end_ns),
                  key=lambda e: Decimal(str(e["ts"])))
        stream = nxt["args"]["stream"]
        on_it = [w for w in waits if w["args"]["stream"] == stream
                 and w["args"]["wait_on_stream"] == wait_stream
                 and Decimal(str(w["ts"])) <= Decimal(str(runtime[nxt["args"]["correlation"]]["ts"]))]
        assert on_it, (start_ns, wait_stream)
        # The event waited on was recorded before the wait was enqueued (this 2023 trace has no
        # record correlation): the awaited work was launched on that stream before the wait.
        waited_at = Decimal(str(on_it[-1]["ts"]))
        awaited = [e for e in device if e["args"]["stream"] == wait_stream
                   and Decimal(str(runtime[e["args"]["correlation"]]["ts"])) < waited_at]
        if not awaited:  # an event recorded on a stream that had run nothing: no work to wait for
            continue
        last = max(awaited, key=lambda e: Decimal(str(runtime[e["args"]["correlation"]]["ts"])))
        assert Decimal(str(last["ts"])) + Decimal(str(last["dur"])) <= Decimal(str(nxt["ts"]))
        checked += 1
    assert checked >= 2
