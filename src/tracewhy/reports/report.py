"""``report``: what the HTML report (and ``report --json``) shows, for each input it takes: a
trace (the overview, ``reports/overview.py``), the traces of several ranks of one job (a
directory of them, or the files: the ranks compared), several other traces (each one's overview,
and the runs of the first's program compared with it), an Nsight Compute report (its kernels'
roofline verdicts) or a memory-timeline export."""

from __future__ import annotations

import os
from collections.abc import Sequence
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
    from tracewhy.model.trace import Trace
    from tracewhy.reports.ranks import RanksReport
    from tracewhy.reports.several import SeveralReport


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
class RunsReport:
    """Several traces that are not the ranks of one job: each one's overview, and each run of
    the first's program compared with the first (``reports/several.py``)."""

    several: SeveralReport[Overview]


@dataclass(frozen=True)
class MemoryTimelineReport:
    """A memory-timeline export (``source``, of ``layout``), analysed."""

    result: TimelineResult
    source: str
    layout: str


#: What a report is made of, by input.
ReportContents = Union[Overview, RankTracesReport, RunsReport, "NcuRooflineResult", MemoryTimelineReport]


def report_contents(source: TraceSource, options: ReportOptions | None = None,
                    loader: Loader = PLAIN) -> ReportContents:
    """What the report of ``source`` shows; a path is told by its content (a directory: rank traces)."""
    options = options or ReportOptions()
    if isinstance(source, (str, PurePath)):
        path = Path(source)
        if path.is_dir():  # the traces in it: a job's ranks, or other runs
            return report_several([source], options, loader)
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
    return overview(loader.trace(source), DiagnoseOptions(step_marker=options.step_marker, warmup=options.warmup,
                                                          fixes_together=False))


def report_several(sources: Sequence[TraceSource], options: ReportOptions | None = None,
                   loader: Loader = PLAIN) -> ReportContents:
    """What the report of several traces shows (a directory: the traces in it): the ranks of one
    job compared, else each trace's overview and the runs of the first's program compared with
    it; one trace left (a directory holding one): its overview."""
    from tracewhy.reports.several import PerTrace, SeveralOptions, SeveralReport, read_several  # (several only)

    options = options or ReportOptions()
    diagnose_options = DiagnoseOptions(step_marker=options.step_marker, warmup=options.warmup, fixes_together=False)
    several = read_several(sources, SeveralOptions(options.step_marker, options.warmup),
                           lambda t: None if _may_be_a_rank(t) else overview(t, diagnose_options), loader,
                           compare_ranks_too=True)
    if several.ranks is not None:
        return RankTracesReport(several.ranks, _ranks_source(sources))
    # A trace that named its rank was read for the grouping only: read it again for its overview.
    inputs = tuple(PerTrace(i.path, i.identity, i.step_stats,
                               overview(loader.trace(i.path), diagnose_options) if i.result is None else i.result)
                   for i in several.inputs)
    if several.grouping is None:
        return inputs[0].result
    return RunsReport(SeveralReport(inputs, several.grouping, several.skipped, comparisons=several.comparisons))


def _may_be_a_rank(trace: Trace) -> bool:
    """Whether the trace names its rank in a job of several: it may be read as a rank, whose
    report is the ranks compared, not its own overview."""
    return trace.meta.rank is not None and (trace.meta.world_size or 0) > 1


def _ranks_source(sources: Sequence[TraceSource]) -> str:
    """What a report of ranks is of: the directory given, else the folder the files share, else
    the files."""
    paths = [str(s) if isinstance(s, (str, PurePath)) else s.meta.path for s in sources]
    if len(paths) == 1:
        return paths[0]
    common = os.path.commonpath([os.path.dirname(p) or "." for p in paths]) if all(paths) else ""
    return common or ", ".join(paths)
