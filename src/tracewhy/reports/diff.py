"""``diff``: run B against baseline A. Both runs diagnosed (at once when small), their steady
step times, ops, blocks and kernels compared, and the difference judged
(``findings/compare.py``); with ``--items-per-step``, both runs' throughput."""

from __future__ import annotations

from dataclasses import dataclass

from tracewhy.analyses.diff import DiffOptions, diff
from tracewhy.analyses.throughput import Throughput, ThroughputOptions, from_durations
from tracewhy.findings import thresholds as th
from tracewhy.findings.compare import Comparison, judge
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.model.trace import Trace
from tracewhy.reports import at_once
from tracewhy.reports.diagnose import Report, diagnose_in, rule_findings
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource


@dataclass(frozen=True)
class DiffReportOptions:
    step_marker: str | None = None
    warmup: int | None = None
    #: Items per step, to say both runs' step times as throughput.
    rate: ThroughputOptions | None = None


@dataclass(frozen=True)
class DiffReport:
    """The comparison, and (with ``rate``) each run's throughput, None for a run without steady
    steps."""

    comparison: Comparison
    rate: ThroughputOptions | None = None
    throughput_a: Throughput | None = None
    throughput_b: Throughput | None = None


def diff_report(a: TraceSource, b: TraceSource, options: DiffReportOptions | None = None,
                loader: Loader = PLAIN) -> DiffReport:
    """B against baseline A; both read by ``loader.traces`` (at once when small), A's warnings
    said first."""
    options = options or DiffReportOptions()
    trace_a, trace_b = loader.traces([a, b])
    c = compare(trace_a, trace_b, DiffOptions(step_marker=options.step_marker, warmup=options.warmup,
                                              confidence=th.DIFF_CONFIDENCE))
    rate = options.rate
    if rate is None:
        return DiffReport(c)
    return DiffReport(c, rate, from_durations(c.diff.a_step_durations_ns, rate),
                      from_durations(c.diff.b_step_durations_ns, rate))


def compare(a: Trace, b: Trace, options: DiffOptions | None = None, *, with_findings: bool = True) -> Comparison:
    """Compare run B against run A (the baseline); ``with_findings`` also diagnoses both."""
    options = options or DiffOptions(confidence=th.DIFF_CONFIDENCE)
    if not with_findings:
        return judge(diff(a, b, options))
    # (A diff shows the findings that appear or disappear, not the fixes replayed together.)
    report_a, report_b = _diagnose_both(a, b, DiagnoseOptions(step_marker=options.step_marker,
                                                              warmup=options.warmup, fixes_together=False))
    return judge(diff(a, b, options, memory=(report_a.memory, report_b.memory),
                      compiled=(report_a.compile, report_b.compile), step_results=(report_a.steps, report_b.steps)),
                 report_a.findings, report_b.findings, accounts=(report_a.account, report_b.account))


def _diagnose_both(a: Trace, b: Trace, options: DiagnoseOptions) -> tuple[Report, Report]:
    """Both runs' diagnoses, at once when the runs are small (``reports/at_once.py``): each
    reads only its own trace and keeps its results in its own context. A diff shows only the
    findings whose code one run has and the other lacks, so where both runs have the same codes
    no fix is replayed (``explain``'s predictions are most of a diagnosis after its rules)."""
    together = at_once.small(a, b)
    ctx_a, ctx_b = Context(a, options), Context(b, options)
    found_a, found_b = at_once.run([lambda: rule_findings(ctx_a), lambda: rule_findings(ctx_b)],
                                   together=together, name="tracewhy-diagnose")
    unpriced = diagnose_in(ctx_a, found_a, replay=False), diagnose_in(ctx_b, found_b, replay=False)
    if {f.code for f in unpriced[0].findings} == {f.code for f in unpriced[1].findings}:
        return unpriced
    report_a, report_b = at_once.run([lambda: diagnose_in(ctx_a, found_a), lambda: diagnose_in(ctx_b, found_b)],
                                     together=together, name="tracewhy-diagnose")
    return report_a, report_b
