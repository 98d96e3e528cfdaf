"""``memory``: what a run's memory did, from whichever input holds it, told by content: a CUDA
caching-allocator snapshot (its segments and blocks, read without running the pickle), a
memory-timeline export (the profiler's categories over time) or a profile_memory trace (peak,
the ledger at it, top allocating ops, churn and growth per step); with the memory findings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath

from tracewhy.analyses.memory import MemoryOptions, MemoryResult, TimelineResult, analyze_memory, analyze_timeline
from tracewhy.analyses.memory_snapshot import SnapshotResult, analyze_snapshot
from tracewhy.findings.memory import memory_findings, snapshot_findings
from tracewhy.findings.model import Finding
from tracewhy.readers.registry import InputKind, detect, read_memory_snapshot, read_memory_timeline
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource
from tracewhy.rows import Rows


@dataclass(frozen=True)
class MemoryReportOptions:
    step_marker: str | None = None
    warmup: int | None = None


@dataclass(frozen=True)
class TraceMemoryReport(Rows, rows="result.devices", key="device"):
    """A profile_memory trace's memory, and the findings on it."""

    result: MemoryResult
    findings: list[Finding]


@dataclass(frozen=True)
class SnapshotMemoryReport(Rows, rows="result.devices"):
    """An allocator snapshot's memory, and the findings on it."""

    result: SnapshotResult
    findings: list[Finding]


@dataclass(frozen=True)
class TimelineMemoryReport(Rows, rows="result.table"):
    """A memory-timeline export: its ``layout`` and number of ``events``, analysed."""

    result: TimelineResult
    layout: str
    events: int


def memory_report(source: TraceSource, options: MemoryReportOptions | None = None, loader: Loader = PLAIN
                  ) -> TraceMemoryReport | SnapshotMemoryReport | TimelineMemoryReport:
    options = options or MemoryReportOptions()
    if isinstance(source, (str, PurePath)):
        path = Path(source)
        fmt = detect(path, (InputKind.MEMORY_SNAPSHOT, InputKind.MEMORY_TIMELINE))
        if fmt is not None and fmt.kind is InputKind.MEMORY_SNAPSHOT:
            snap = analyze_snapshot(read_memory_snapshot(path, fmt))
            return SnapshotMemoryReport(snap, snapshot_findings(snap))
        if fmt is not None:
            tl = read_memory_timeline(path, fmt)
            loader.warn(tl.path, tl.warnings)
            return TimelineMemoryReport(analyze_timeline(tl), tl.layout.value, tl.events)
    result = analyze_memory(loader.trace(source), MemoryOptions(marker=options.step_marker, warmup=options.warmup))
    return TraceMemoryReport(result, memory_findings(result))
