"""``report``: what the HTML report (and ``report --json``) shows, for each input it takes: a
trace (the overview, ``reports/overview.py``), a directory of rank traces (the ranks compared),
an Nsight Compute report (its kernels' roofline verdicts) or a memory-timeline export."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Union

from tracewhy.findings.context import DiagnoseOptions
from tracewhy.readers.registry import InputKind, detect, read_kernel_metrics, read_memory_timeline
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource
from tracewhy.reports.overview import Overview, overview

if TYPE_CHECKING:  # (each loaded only for its own input)
    from tracewhy.analyses.memory import TimelineResult
    from tracewhy.findings.roofline import NcuRooflineResult
    from tracewhy.reports.ranks import RanksReport


@dataclass(frozen=True)
class ReportOptions:
    step_marker: str | None = None
    warmup: int | None = None


@dataclass(frozen=True)
class RankTracesReport:
    """A directory of rank traces (``source``), the ranks compared."""

    ranks: RanksReport
    source: str


@dataclass(frozen=True)
class MemoryTimelineReport:
    """A memory-timeline export (``source``, of ``layout``), analysed."""

    result: TimelineResult
    source: str
    layout: str


#: What a report is made of, by input.
ReportContents = Union[Overview, RankTracesReport, "NcuRooflineResult", MemoryTimelineReport]


def report_contents(source: TraceSource, options: ReportOptions | None = None,
                    loader: Loader = PLAIN) -> ReportContents:
    """What the report of ``source`` shows; a path is told by its content (a directory: rank traces)."""
    options = options or ReportOptions()
    if isinstance(source, (str, PurePath)):
        path = Path(source)
        if path.is_dir():  # one trace per rank (the ranks modules are imported for this case only)
            from tracewhy.reports.ranks import RanksReportOptions, ranks_report, trace_files

            files = trace_files([str(source)])
            ranks = ranks_report(files, RanksReportOptions(step_marker=options.step_marker, warmup=options.warmup),
                                 loader=loader)
            return RankTracesReport(ranks, str(source))
        fmt = detect(path, (InputKind.KERNEL_METRICS, InputKind.MEMORY_TIMELINE))
        if fmt is not None and fmt.kind is InputKind.KERNEL_METRICS:
            from tracewhy.findings.roofline import roofline

            report = read_kernel_metrics(path, fmt)
            loader.warn(path, report.warnings)
            return roofline(report)
        if fmt is not None:
            from tracewhy.analyses.memory import analyze_timeline

            tl = read_memory_timeline(path, fmt)
            return MemoryTimelineReport(analyze_timeline(tl), str(source), tl.layout.value)
    return overview(loader.trace(source), DiagnoseOptions(step_marker=options.step_marker, warmup=options.warmup))
