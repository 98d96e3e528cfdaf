"""``overlap``: compute, communication (hidden and exposed), copies and idle per GPU and step,
collective bandwidth against the link, and the findings on exposed and slow communication."""

from __future__ import annotations

from dataclasses import dataclass

from tracewhy.analyses.overlap import OverlapOptions, OverlapResult, overlap
from tracewhy.findings.collective_bandwidth import slow_bus_findings
from tracewhy.findings.model import Finding
from tracewhy.findings.overlap import exposed_comm_findings
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource


@dataclass(frozen=True)
class OverlapReportOptions:
    step_marker: str | None = None
    warmup: int | None = None


@dataclass(frozen=True)
class OverlapReport:
    result: OverlapResult
    findings: list[Finding]


def overlap_report(trace: TraceSource, options: OverlapReportOptions | None = None,
                   loader: Loader = PLAIN) -> OverlapReport:
    options = options or OverlapReportOptions()
    r = overlap(loader.trace(trace), OverlapOptions(step_marker=options.step_marker, warmup=options.warmup))
    steps = r.steady_steps if r.steady.height else 0
    return OverlapReport(r, exposed_comm_findings(r) + slow_bus_findings(r.bandwidth, steps))
