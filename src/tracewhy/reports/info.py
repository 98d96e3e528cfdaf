"""``info``: what a trace is: format, versions, devices, rank, capture options, event counts,
steps and span."""

from __future__ import annotations

from dataclasses import dataclass

from tracewhy.analyses.info import InfoResult, info
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource


@dataclass(frozen=True)
class InfoReportOptions:
    #: Count the steps this annotation marks (default: ProfilerStep, or the marker found).
    step_marker: str | None = None


def info_report(trace: TraceSource, options: InfoReportOptions | None = None, loader: Loader = PLAIN) -> InfoResult:
    return info(loader.trace(trace), step_marker=(options or InfoReportOptions()).step_marker)
