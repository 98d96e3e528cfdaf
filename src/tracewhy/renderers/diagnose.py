"""``diagnose``: the terminal and JSON shapes of a diagnosis (the ranked findings and the
measurements they rest on)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Final, TypedDict

import polars as pl

from tracewhy.analyses.gaps import GAP_STEPS_SCHEMA, GAPS_SCHEMA
from tracewhy.findings.model import Severity
from tracewhy.renderers import View
from tracewhy.renderers.throughput import with_throughput
from tracewhy.units import fmt_ns, fmt_pct, indented, printable

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tracewhy.analyses.steps import STEPS_SCHEMA, StepStats
    from tracewhy.findings.model import Finding
    from tracewhy.renderers.json_schema import rows
    from tracewhy.renderers.ranks import RanksPayload
    from tracewhy.renderers.several import ComparisonJson, GroupingJson
    from tracewhy.renderers.throughput import ThroughputJson
    from tracewhy.reports.diagnose import DiagnoseReport, Report
    from tracewhy.reports.several import SeveralReport


_STYLE = {Severity.TRUST: "bold yellow", Severity.HIGH: "bold red", Severity.MEDIUM: "red",
          Severity.LOW: "cyan", Severity.INFO: "dim"}


#: Gaps in ``diagnose --json`` (largest first); ``gaps --json`` has all of them.
TOP_GAPS: Final = 50


class BasisJson(TypedDict):
    """What the findings' time figures are normalized by: idle per class per step on the primary
    device (the one with most busy time), means over the steady steps or the whole trace's totals."""

    #: The primary device; null without GPU activity.
    device: int | None
    #: Steady steps averaged over (1 for a trace without step markers).
    steps: int
    #: False: the whole trace is one window.
    per_steps: bool
    window_ns: int
    busy_ns: int
    idle_ns: int
    #: Idle per gap class.
    class_ns: dict[str, int]
    #: Idle in gaps shorter than the minimum gap, and their number (a mean per step).
    short_ns: int
    short_gaps: float
    #: Which statistic the figures are ("mean of N steady steps", "whole trace").
    statistic: str


class DiagnosePayload(TypedDict):
    """``diagnose``: the ranked findings, each with evidence and the next step, and the
    measurements they rest on."""

    trace: str
    #: No high or medium finding.
    healthy: bool
    #: Ranked: trust findings first, then by recoverable time.
    findings: list[Finding]
    basis: BasisJson
    #: What a finding's recoverable time is measured over: "per step" or "over the trace".
    recoverable_unit: str
    steps: Annotated[pl.DataFrame, rows(STEPS_SCHEMA, "one row per step, in time order")]
    step_stats: StepStats | None
    per_step_idle: Annotated[pl.DataFrame, rows(GAP_STEPS_SCHEMA, "idle per step and device, by class")]
    top_gaps: Annotated[pl.DataFrame, rows(GAPS_SCHEMA, f"the {TOP_GAPS} largest GPU idle gaps")]


class DiagnoseThroughputPayload(DiagnosePayload, total=False):
    """``diagnose --items-per-step N``: the same, with the throughput at the steady step times."""

    throughput: ThroughputJson | None


class DiagnoseInput(DiagnoseThroughputPayload):
    """One trace's diagnosis (as ``diagnose TRACE --json`` gives it), with its path and rank."""

    path: str
    #: The rank the trace's distributedInfo names; null where it names none.
    rank: int | None


class DiagnoseSeveralPayload(TypedDict):
    """``diagnose`` of several traces: each one's diagnosis, how they were read, and the ranks
    compared (the ranks of one job) or the runs of one program compared with the first."""

    grouping: GroupingJson
    #: In rank order when read as ranks, else as given.
    inputs: list[DiagnoseInput]
    #: Read as ranks: the ranks compared, as ``ranks --json`` gives them; else null.
    ranks: RanksPayload | None
    #: Read as ranks: the rank that sets the pace (shown in full), and why it; else null.
    pace_rank: int | None
    pace_reason: str | None
    comparison: ComparisonJson | None


def diagnose_several_output(r: SeveralReport[DiagnoseReport], top: int | None) -> tuple[Mapping[str, Any], View]:
    """``diagnose`` of several traces. Read as ranks: the cross-rank findings, the diagnosis of
    the rank that sets the pace in full, one line per other rank; else each diagnosis under its
    heading, then the runs compared with the first (``renderers/several.py``)."""
    from tracewhy.renderers.several import several_output

    payload, view = several_output(r, lambda d: diagnose_output(d, top))
    if r.grouping is None:
        return payload, view
    if not r.as_ranks or r.ranks is None:
        return {**payload, "ranks": None, "pace_rank": None, "pace_reason": None}, view
    from tracewhy.renderers.ranks import ranks_payload

    ranks = r.ranks
    return ({**payload, "ranks": ranks_payload(ranks.result, ranks.findings, ranks.executor),
             "pace_rank": r.pace_rank, "pace_reason": r.pace_reason}, lambda: _render_ranks(r, top))


def _render_ranks(r: SeveralReport[DiagnoseReport], top: int | None) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    from tracewhy.renderers.findings import render_findings
    from tracewhy.renderers.several import heading, render_grouping

    assert r.ranks is not None
    files = " ".join(printable(i.path) for i in r.by_rank())
    parts: list[RenderableType] = [render_grouping(r)]
    if r.ranks.findings:
        parts.append(render_findings(r.ranks.findings))
    else:
        parts.append(Text("No cross-rank finding: no rank kept the others waiting for a material share of the "
                          "step, compute is balanced and the ranks issued the same collectives.", style="green"))
    parts.append(Text(f"per-rank table: tracewhy ranks {files}", style="dim"))
    pace = next(i for i in r.inputs if i.identity.rank == r.pace_rank)
    parts.append(heading(pace, r, 0).append(f"  sets the pace ({r.pace_reason})", style="bold"))
    parts.append(diagnose_output(pace.result, top)[1]())
    others = [i for i in r.by_rank() if i is not pace]
    parts.append(Text("\nthe other ranks (tracewhy diagnose FILE shows one in full):", style="bold"))
    for i in others:
        parts.append(indented(Text(f"rank {i.identity.rank}: {printable(i.path)}: {rank_line(i.result.report)}"), 2))
    return Group(*parts)


def rank_line(report: Report) -> str:
    """One rank's diagnosis in a line: its median step, its first high or medium finding (the
    largest recoverable time), how many more, and the caveats (trust findings) by code."""
    from tracewhy.reports.diagnose import recoverable_unit  # (loaded already: ``report`` comes from it)

    stats = report.steps.stats
    parts = [f"step p50 {fmt_ns(stats.p50_ns)}" if stats is not None else "no steady steps"]
    serious = [f for f in report.findings if f.severity in (Severity.HIGH, Severity.MEDIUM)]
    if serious:
        f = serious[0]
        recover = (f" ~{fmt_ns(f.recoverable_ns_per_step)} {recoverable_unit(report)} recoverable"
                   if f.recoverable_ns_per_step else "")
        more = f", {len(serious) - 1} more" if len(serious) > 1 else ""
        parts.append(f"[{f.severity.value}] {f.code}{recover}{more}")
    else:
        parts.append("no high or medium finding")
    caveats = [str(f.code) for f in report.findings if f.severity is Severity.TRUST]
    if caveats:
        parts.append(f"caveats: {', '.join(caveats)}")
    return "; ".join(parts)


def diagnose_output(r: DiagnoseReport, top: int | None) -> tuple[Mapping[str, Any], View]:
    """The payload and the view of ``diagnose``, with the throughput line when it was asked for."""
    report = r.report
    return with_throughput(diagnose_payload(report), lambda: render_diagnose(report, top), r.rate, r.throughput)


def diagnose_payload(report: Report) -> DiagnosePayload:
    """The JSON of a diagnosis. ``basis`` figures are means over the steady steps
    (``basis.statistic`` says so) or cover the whole trace; step figures are named by statistic."""
    from tracewhy.reports.diagnose import recoverable_unit  # (loaded already: ``report`` comes from it)

    b = report.basis
    return {
        "trace": report.path,
        "healthy": report.healthy,
        "findings": report.findings,
        "basis": {"device": b.device, "steps": b.steps, "per_steps": b.per_steps, "window_ns": b.window_ns,
                  "busy_ns": b.busy_ns, "idle_ns": b.idle_ns, "class_ns": b.class_ns, "short_ns": b.short_ns,
                  "short_gaps": b.short_gaps, "statistic": basis_statistic(report)},
        "recoverable_unit": recoverable_unit(report),
        "steps": report.steps.table,
        "step_stats": report.steps.stats,
        "per_step_idle": report.gaps.per_step,
        "top_gaps": report.gaps.gaps.sort("dur_ns", descending=True).head(TOP_GAPS),
    }


def basis_statistic(report: Report) -> str:
    """Which statistic the basis figures (and the findings built on them) are."""
    b = report.basis
    if b.per_steps:
        return f"mean of {b.steps} steady steps"
    return "whole trace" if b.device is not None else "none (no GPU activity)"


def render_diagnose(report: Report, top: int | None = None) -> RenderableType:
    """The ranked findings; ``top``: show the first ``top`` (trust findings count too) and say
    how many are left out (``--json`` always has them all)."""
    from rich.console import Group
    from rich.text import Text

    from tracewhy.reports.diagnose import recoverable_unit  # (loaded already: ``report`` comes from it)

    parts: list[RenderableType] = []
    b = report.basis
    stats = report.steps.stats
    head = Text(f"{printable(report.path)}\n", style="bold")
    if stats is not None:
        head.append(f"{stats.count} steady steps: duration p50 {fmt_ns(stats.p50_ns)}, p90 {fmt_ns(stats.p90_ns)}, "
                    f"mean {fmt_ns(stats.mean_ns)}. ")
    if b.device is not None:
        head.append(f"GPU {b.device} active {fmt_pct(b.active_share)} ({basis_statistic(report)}).")
    parts.append(head)
    if not report.findings or report.healthy:
        parts.append(Text("Nothing here costs a meaningful share of the step: no high or medium findings.",
                          style="green"))
    shown = report.findings if top is None else report.findings[:top]
    for i, f in enumerate(shown, 1):
        label = Text(f"{i}. [{f.severity.value}] {f.code}", style=_STYLE[f.severity])
        if f.recoverable_ns_per_step:
            label.append(f"  ~{fmt_ns(f.recoverable_ns_per_step)} {recoverable_unit(report)} recoverable",
                         style="bold")
        parts.append(label)
        parts.append(indented(Text(printable(f.statement)), 3))
        parts.append(indented(Text(f"next: {printable(f.next_step)}", style="dim"), 3))
    if len(shown) < len(report.findings):
        left = report.findings[len(shown):]
        codes = ", ".join(str(f.code) for f in left)
        parts.append(Text(f"... {len(left)} more ({codes}): --top {len(report.findings)} or --json shows them",
                          style="dim"))
    return Group(*parts)
