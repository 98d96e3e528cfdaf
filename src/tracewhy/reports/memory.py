"""``memory``: what a run's memory did, from whichever input holds it, told by content: a CUDA
caching-allocator snapshot (its segments and blocks, read without running the pickle), a
memory-timeline export (the profiler's categories over time) or a profile_memory trace (peak,
the ledger at it, top allocating ops, churn and growth per step); with the memory findings. And
the same inputs compared: several ranks' (``memory_ranks_report``) and run A against run B
(``memory_growth_report``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

from tracewhy.analyses.memory import MemoryOptions, MemoryResult, TimelineResult, analyze_memory, analyze_timeline
from tracewhy.analyses.memory_compare import (
    MemoryCapture,
    MemoryGrowth,
    MemoryRanks,
    RankCapture,
    compare_rank_memory,
    compare_runs,
    snapshot_capture,
    trace_capture,
)
from tracewhy.analyses.memory_snapshot import SnapshotResult, analyze_snapshot
from tracewhy.analyses.ranks import rank_from_name
from tracewhy.errors import TraceError, UsageError
from tracewhy.findings.memory import memory_findings, memory_growth_findings, memory_ranks_findings, snapshot_findings
from tracewhy.findings.model import Finding
from tracewhy.readers.registry import InputKind, detect, read_memory_snapshot, read_memory_timeline, suffixes
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


@dataclass(frozen=True)
class MemoryRanksReport(Rows, rows="result.ranks", key="rank"):
    """``memory`` on several ranks' traces or snapshots: each rank's peak, the imbalance, the sites
    that differ, and the findings on them."""

    result: MemoryRanks
    findings: list[Finding]


@dataclass(frozen=True)
class MemoryGrowthReport(Rows, rows="result.sites"):
    """``memory A --vs B``: what grew from A to B, and the findings on it."""

    result: MemoryGrowth
    findings: list[Finding]


@dataclass(frozen=True)
class _Read:
    capture: MemoryCapture
    rank: int | None  # the file's own: distributedInfo's rank, or the snapshot's device
    rank_from: str


def _read_capture(path: Path, options: MemoryReportOptions, loader: Loader) -> _Read:
    """One input reduced to its capture, with the rank its own metadata names."""
    fmt = detect(path, (InputKind.MEMORY_SNAPSHOT, InputKind.MEMORY_TIMELINE))
    if fmt is not None and fmt.kind is InputKind.MEMORY_SNAPSHOT:
        snap = analyze_snapshot(read_memory_snapshot(path, fmt))
        capture = snapshot_capture(snap, str(path))
        if capture is None:
            raise TraceError(path, "the snapshot holds no device's memory")
        return _Read(capture, int(capture.device.split(":")[1]), "snapshot device")
    if fmt is not None:
        raise TraceError(path, "a memory-timeline export cannot be compared: give profile_memory traces or "
                               "allocator snapshots")
    trace = loader.trace(path)
    result = analyze_memory(trace, MemoryOptions(marker=options.step_marker, warmup=options.warmup))
    trace_cap = trace_capture(result, str(path))
    if trace_cap is None:
        raise TraceError(path, "no [memory] events: profile with profile_memory=True")
    return _Read(trace_cap, trace.meta.rank, "distributedInfo")


def memory_files(paths: Sequence[str]) -> list[Path]:
    """The files named, with directories expanded to the traces and snapshots directly in them."""
    endings = suffixes(InputKind.TIMELINE) + suffixes(InputKind.MEMORY_SNAPSHOT)
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(endings))
            if not found:
                raise TraceError(p, f"no traces or snapshots ({', '.join(endings)}) in this directory")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise TraceError(p, "no such file or directory")
    return out


def memory_ranks_report(paths: Sequence[str], options: MemoryReportOptions | None = None,
                        loader: Loader = PLAIN) -> MemoryRanksReport:
    """Each rank's memory from its own file (``paths``: files or directories of them). A rank is the
    file's distributedInfo rank (a trace) or device (a snapshot, where the files' devices differ),
    else the 'rankN' in its file name."""
    options = options or MemoryReportOptions()
    files = memory_files(paths)
    if len(files) < 2:
        raise UsageError("memory across ranks needs two rank files or more (or a directory of them)")
    read = [_read_capture(f, options, loader) for f in files]
    kinds = {r.capture.kind for r in read}
    if len(kinds) > 1:
        raise UsageError(f"the rank files mix {' and '.join(sorted(kinds))}s: give one kind")
    # A trace's distributedInfo rank is the job's global rank; a snapshot's device is a rank only
    # where the files' devices differ (each node numbers its own GPUs from 0).
    devices = [r.rank for r in read if r.capture.kind == "snapshot"]
    distinct_devices = len(set(devices)) == len(devices)
    ranks: list[RankCapture] = []
    for f, r in zip(files, read, strict=True):
        if r.rank is not None and (r.capture.kind == "trace" or distinct_devices):
            ranks.append(RankCapture(r.rank, r.rank_from, r.capture))
            continue
        named = rank_from_name(f.name)
        if named is None:
            raise TraceError(f, "cannot tell which rank this is: no distributedInfo rank (or distinct snapshot device) "
                                "and no 'rankN' in the file name")
        ranks.append(RankCapture(named, "file name", r.capture))
    seen: dict[int, str] = {}
    for rc in ranks:
        if rc.rank in seen:
            raise TraceError(rc.capture.source, f"rank {rc.rank} again (also in {seen[rc.rank]}): "
                                                "give one file per rank")
        seen[rc.rank] = rc.capture.source
    result = compare_rank_memory(sorted(ranks, key=lambda rc: rc.rank))
    return MemoryRanksReport(result, memory_ranks_findings(result))


def memory_growth_report(a: str | PurePath, b: str | PurePath, options: MemoryReportOptions | None = None,
                         loader: Loader = PLAIN) -> MemoryGrowthReport:
    """What grew from run A to run B of one program: two traces, or two snapshots."""
    options = options or MemoryReportOptions()
    ra, rb = (_read_capture(Path(p), options, loader) for p in (a, b))
    if ra.capture.kind != rb.capture.kind:
        raise UsageError(f"--vs compares like with like: A is a {ra.capture.kind}, B a {rb.capture.kind} "
                         f"({Path(b).name})")
    result = compare_runs(ra.capture, rb.capture)
    return MemoryGrowthReport(result, memory_growth_findings(result))
