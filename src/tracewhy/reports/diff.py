"""``diff``: run B against baseline A. Both runs diagnosed (at once when small), their steady
step times, ops, blocks and kernels compared, and the difference judged
(``findings/compare.py``); with ``--items-per-step``, both runs' throughput."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

from tracewhy import diff_helper, read_helpers
from tracewhy.analyses.diff import DiffOptions, DiffSide, diff, diff_sides, side
from tracewhy.analyses.throughput import Throughput, ThroughputOptions, from_durations
from tracewhy.findings import thresholds as th
from tracewhy.findings.compare import Comparison, judge
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.model.trace import Trace
from tracewhy.reports import at_once
from tracewhy.reports.diagnose import Report, diagnose_in, rule_findings
from tracewhy.reports.diff_elsewhere import Elsewhere, Job
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
    said first. Where the command line started its helper (``tracewhy.diff_helper``: both runs
    small files), B is read and diagnosed in that process while A is here
    (``reports/diff_elsewhere``)."""
    options = options or DiffReportOptions()
    diff_options = DiffOptions(step_marker=options.step_marker, warmup=options.warmup,
                               confidence=th.DIFF_CONFIDENCE)
    paths = [str(s) for s in (a, b) if isinstance(s, (str, PurePath))]
    # (B's warnings come back as lines, for ``warn``: a loader that wants each Trace reads both.)
    helper = diff_helper.take(paths if len(paths) == 2 and loader.seen is None else [])
    if helper is not None:
        elsewhere = Elsewhere(helper, Job(str(b), loader.cache, _diagnose_options(diff_options)))
        try:
            c = _compare_elsewhere(loader.trace(a), str(b), loader, elsewhere, diff_options)
        finally:
            read_helpers.end(helper)
    else:
        trace_a, trace_b = loader.traces([a, b])
        c = compare(trace_a, trace_b, diff_options)
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
    return _judged(a, b, options, *_diagnose_both(a, b, _diagnose_options(options)))


def _diagnose_options(options: DiffOptions) -> DiagnoseOptions:
    # (A diff shows the findings that appear or disappear, not the fixes replayed together.)
    return DiagnoseOptions(step_marker=options.step_marker, warmup=options.warmup, fixes_together=False)


def _judged(a: Trace, b: Trace, options: DiffOptions, report_a: Report, report_b: Report) -> Comparison:
    return _judged_sides(_side(a, report_a), _side(b, report_b), options, report_a, report_b)


def _side(t: Trace, report: Report) -> DiffSide:
    return side(t, report.steps, report.memory)


def _judged_sides(a: DiffSide, b: DiffSide, options: DiffOptions, report_a: Report, report_b: Report) -> Comparison:
    return judge(diff_sides(a, b, options, compiled=(report_a.compile, report_b.compile)),
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
    if _same_codes(*unpriced):
        return unpriced
    report_a, report_b = at_once.run([lambda: diagnose_in(ctx_a, found_a), lambda: diagnose_in(ctx_b, found_b)],
                                     together=together, name="tracewhy-diagnose")
    return report_a, report_b


def _same_codes(a: Report, b: Report) -> bool:
    """Whether both runs have the same finding codes: a diff then shows no finding, and no fix is
    replayed."""
    return {f.code for f in a.findings} == {f.code for f in b.findings}


def _compare_elsewhere(a: Trace, b: str, loader: Loader, elsewhere: Elsewhere, options: DiffOptions) -> Comparison:
    """``compare`` with B read and diagnosed, and its side of the diff made, by the helper while
    A's are here; B's warnings said after A's, as when read in turn. Where the helper fails, B is
    done here (a bad B then fails as it always did, once A is diagnosed)."""
    diagnose_options = _diagnose_options(options)
    ctx_a = Context(a, diagnose_options)
    found_a = rule_findings(ctx_a)
    unpriced_a = diagnose_in(ctx_a, found_a, replay=False)
    side_a = _side(a, unpriced_a)
    warnings = elsewhere.warnings()
    if warnings is None:
        return compare(a, loader.trace(b), options)
    loader.warn(b, warnings)
    got = elsewhere.unpriced()
    if got is None:
        return compare(a, loader.read(b, None), options)
    side_b, unpriced_b = got
    if _same_codes(unpriced_a, unpriced_b):
        return _judged_sides(side_a, side_b, options, unpriced_a, unpriced_b)
    elsewhere.ask_priced()
    report_a = diagnose_in(ctx_a, found_a)
    report_b = elsewhere.priced()
    if report_b is None:
        return compare(a, loader.read(b, None), options)
    return _judged_sides(side_a, side_b, options, report_a, report_b)
