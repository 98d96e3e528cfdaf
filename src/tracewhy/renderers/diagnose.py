"""``diagnose``: the terminal and JSON shapes of a diagnosis (the ranked findings and the
measurements they rest on)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Final, TypedDict

import polars as pl

from tracewhy.analyses.account_names import PartName
from tracewhy.analyses.gaps import GAP_STEPS_SCHEMA, GAPS_SCHEMA
from tracewhy.findings.codes import Code
from tracewhy.findings.model import Severity
from tracewhy.renderers import View
from tracewhy.renderers.account import AccountLineJson, account_line_json
from tracewhy.renderers.throughput import with_throughput
from tracewhy.units import fmt_ns, fmt_pct, indented, printable

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tracewhy.analyses.account_classes import PARTS_BY_CLASS_SCHEMA
    from tracewhy.analyses.steps import STEPS_SCHEMA, StepStats
    from tracewhy.findings.model import Finding
    from tracewhy.findings.where_step_goes import AccountLine
    from tracewhy.renderers.json_schema import rows
    from tracewhy.renderers.ranks import RanksPayload
    from tracewhy.renderers.several import ComparisonJson, GroupingJson
    from tracewhy.renderers.step_classes import InferenceJson
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


class FixesTogetherJson(TypedDict):
    """The fixes of the findings that save most, replayed at once."""

    #: The findings whose fixes these are.
    codes: list[str]
    #: What each fix does to the step.
    fixes: list[str]
    measured_step_ns: int
    predicted_step_ns: int
    #: The largest avoidable part of the predicted step; null when none is left.
    next_bottleneck: str | None


class ReplayedJson(TypedDict):
    """What every finding's "step X -> Y" starts from: the analysed steps the fixes were
    replayed on (on a dependency graph of over 100 k edges, a few spread over the run) and
    their mean."""

    steps: int
    #: The step account's analysed steps (the whole trace: 1).
    of_steps: int
    mean_step_ns: int


class DiagnosePayload(TypedDict):
    """``diagnose``: the ranked findings, each with evidence and the next step, and the
    measurements they rest on."""

    trace: str
    #: No high or medium finding.
    healthy: bool
    #: Ranked: trust findings first, then by recoverable time.
    findings: list[Finding]
    basis: BasisJson
    #: Where the step goes: the step account's largest parts (enough to cover 80% of the step,
    #: at most 8 lines, the rest summed); empty when the trace has nothing to account for.
    account: list[AccountLineJson]
    #: The top three fixes predicted together; null when fewer than two findings predict one.
    fixes_together: FixesTogetherJson | None
    #: The steps the predictions replayed; null when nothing was replayed.
    replayed: ReplayedJson | None
    #: What a finding's recoverable time is measured over: "per step" or "over the trace".
    recoverable_unit: str
    steps: Annotated[pl.DataFrame, rows(STEPS_SCHEMA, "one row per step, in time order")]
    step_stats: StepStats | None
    per_step_idle: Annotated[pl.DataFrame, rows(GAP_STEPS_SCHEMA, "idle per step and device, by class")]
    top_gaps: Annotated[pl.DataFrame, rows(GAPS_SCHEMA, f"the {TOP_GAPS} largest GPU idle gaps")]


class DiagnoseThroughputPayload(DiagnosePayload, total=False):
    """``diagnose --items-per-step N``: the same, with the throughput at the steady step times; on
    an inference trace (steps classed prefill, decode or mixed), the steps by class and the step
    account's parts per class."""

    throughput: ThroughputJson | None
    inference: InferenceJson
    parts_by_class: Annotated[pl.DataFrame, rows(PARTS_BY_CLASS_SCHEMA, "per class, its parts, largest first")]


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
    from tracewhy.renderers.step_classes import with_classes

    report = r.report
    payload, view = with_throughput(diagnose_payload(report), lambda: render_diagnose(report, top), r.rate,
                                    r.throughput)
    return with_classes(payload, view, r.classes, r.decode, r.parts_by_class)


def diagnose_payload(report: Report) -> DiagnosePayload:
    """The JSON of a diagnosis. ``basis`` figures are means over the steady steps
    (``basis.statistic`` says so) or cover the whole trace; step figures are named by statistic."""
    from tracewhy.reports.diagnose import recoverable_unit  # (loaded already: ``report`` comes from it)

    b = report.basis
    t = report.together
    return {
        "trace": report.path,
        "healthy": report.healthy,
        "findings": report.findings,
        "basis": {"device": b.device, "steps": b.steps, "per_steps": b.per_steps, "window_ns": b.window_ns,
                  "busy_ns": b.busy_ns, "idle_ns": b.idle_ns, "class_ns": b.class_ns, "short_ns": b.short_ns,
                  "short_gaps": b.short_gaps, "statistic": basis_statistic(report)},
        "account": [account_line_json(a) for a in _account_lines(report)],
        "fixes_together": None if t is None else {
            "codes": list(t.codes), "fixes": list(t.fixes), "measured_step_ns": t.measured_step_ns,
            "predicted_step_ns": t.predicted_step_ns, "next_bottleneck": t.next_bottleneck},
        "replayed": replayed_json(report),
        "recoverable_unit": recoverable_unit(report),
        "steps": report.steps.table,
        "step_stats": report.steps.stats,
        "per_step_idle": report.gaps.per_step,
        "top_gaps": report.gaps.gaps.sort("dur_ns", descending=True).head(TOP_GAPS),
    }


def replayed_json(report: Report) -> ReplayedJson | None:
    """The steps the findings' predictions replayed, of the account's analysed ones."""
    if report.replayed is None or report.account is None or report.replayed[0] <= 0:
        return None
    return {"steps": report.replayed[0], "of_steps": report.account.steps_analysed,
            "mean_step_ns": report.replayed[1]}


def _account_lines(report: Report) -> list[AccountLine]:
    from tracewhy.findings.where_step_goes import account_lines

    return account_lines(report.account) if report.account is not None else []


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


    parts: list[RenderableType] = []
    b = report.basis
    stats = report.steps.stats
    head = Text(f"{printable(report.path)}\n", style="bold")
    if stats is not None:
        head.append(f"{stats.count} steady steps: duration p50 {fmt_ns(stats.p50_ns)}, p90 {fmt_ns(stats.p90_ns)}, "
                    f"mean {fmt_ns(stats.mean_ns)}")
        one_time = report.account.one_time if report.account is not None else ()
        # The account leaves such a step out; these statistics keep it, and say so.
        head.append(f" ({', '.join(s.name for s in one_time)} included: a one-time compile, which the account "
                    "below leaves out). " if one_time else ". ")
    if b.device is not None:
        head.append(f"GPU {b.device} active {fmt_pct(b.active_share)} ({basis_statistic(report)}).")
    parts.append(head)
    shown = report.findings if top is None else report.findings[:top]
    trust = next((i for i, f in enumerate(shown) if f.severity is not Severity.TRUST), len(shown))
    for i, f in enumerate(shown[:trust], 1):
        parts.extend(_finding(report, i, f))
    parts.extend(_where_step_goes(report))
    if not report.findings or report.healthy:
        parts.append(Text(_healthy_line(report), style="green"))
    for i, f in enumerate(shown[trust:], trust + 1):
        parts.extend(_finding(report, i, f))
    if len(shown) < len(report.findings):
        left = report.findings[len(shown):]
        codes = ", ".join(str(f.code) for f in left)
        parts.append(Text(f"... {len(left)} more ({codes}): --top {len(report.findings)} or --json shows them",
                          style="dim"))
    return Group(*parts)


def _finding(report: Report, i: int, f: Finding) -> list[RenderableType]:
    """A finding's label (with the step predicted with its fix, or its recoverable time), its
    statement and its next step."""
    from rich.text import Text

    from tracewhy.reports.diagnose import recoverable_unit  # (loaded already: ``report`` comes from it)

    label = Text(f"{i}. [{f.severity.value}] {f.code}", style=_STYLE[f.severity])
    if f.recoverable_ns_per_step:
        label.append(f"  ~{fmt_ns(f.recoverable_ns_per_step)} {recoverable_unit(report)} recoverable", style="bold")
    out: list[RenderableType] = [label, indented(Text(printable(f.statement)), 3)]
    if f.code == Code.BLOCK_ATTRIBUTION and f.evidence.get("blocks"):
        from rich.padding import Padding

        from tracewhy.renderers.blocks import attribution_table

        out.append(Padding(attribution_table(f), (0, 0, 0, 3)))
    if f.part is not None:
        predicted = ""
        if f.predicted_step_ns is not None and f.recoverable_ns_per_step:
            unit = "step" if recoverable_unit(report) == "per step" else "window"
            predicted = (f"; {unit} {fmt_ns(f.predicted_step_ns + f.recoverable_ns_per_step)} -> "
                         f"{fmt_ns(f.predicted_step_ns)} with the fix")
        after = f"; next bottleneck: {printable(f.next_bottleneck)}" if f.next_bottleneck else ""
        out.append(indented(Text(f"explains: {printable(f.part)}{predicted}{after}", style="bold"), 3))
    out.append(indented(Text(f"next: {printable(f.next_step)}", style="dim"), 3))
    return out


def _where_step_goes(report: Report) -> list[RenderableType]:
    """The step account's largest parts with their share and evidence, and the top fixes together."""
    from rich.text import Text

    account = report.account
    lines = _account_lines(report)
    if account is None or not lines:
        return []
    over = (f"mean of {account.steps_analysed} analysed steps, {fmt_ns(account.mean_step_ns)} each"
            if account.source != "whole_trace" else f"the whole trace, {fmt_ns(account.mean_step_ns)}")
    replayed = report.replayed
    if replayed is not None and account.source != "whole_trace" and 0 < replayed[0] < account.steps_analysed:
        # The fixes' "step X -> Y" below start from these steps' mean, not the account's.
        over += f"; fixes replayed on {replayed[0]} of them, {fmt_ns(replayed[1])} mean"
    if account.one_time:
        over += "; left out as one-time compiles: " + ", ".join(
            f"{printable(s.name)} ({fmt_ns(s.window_ns)})" for s in account.one_time)
    out: list[RenderableType] = [Text(f"Where the step goes ({over}):", style="bold")]
    width = max(len(printable(a.part)) for a in lines)
    fixes = _fixing(report)
    for a in lines:
        what = "" if a.kind == "rest" else ("essential" if a.essential else "avoidable"
                                                if a.part != PartName.UNRECORDED_GPU else "unrecorded")
        fix = fixes.get(a.part) if a.essential else None
        row = Text(f"{fmt_pct(a.share):>6}  {fmt_ns(a.ns_per_step):>11}  {printable(a.part):<{width}}  {what:<9}",
                   style="" if (a.essential and fix is None) or a.kind == "rest" else "bold")
        if fix is not None:  # essential work done a wasteful way: the finding says how much less
            row.append(f"  see {fix[0]}. {fix[1]}: step {fmt_ns(fix[2])} shorter", style="bold")
        if a.evidence:
            row.append(f"  {printable(a.evidence)}", style="dim")
        out.append(indented(row, 3))
    t = report.together
    if t is not None:
        after = f"; next bottleneck: {printable(t.next_bottleneck)}" if t.next_bottleneck else ""
        out.append(indented(Text(f"The top {len(t.codes)} fixes together ({', '.join(t.codes)}): "
                                 f"{fmt_ns(t.measured_step_ns)} -> {fmt_ns(t.predicted_step_ns)}{after}.",
                                 style="bold"), 3))
    return out


def _fixing(report: Report) -> dict[str, tuple[int, str, int]]:
    """Per part of the account, the first finding (its number as printed, its code, the time
    its fix saves per step) that explains it and recovers time: shown beside an essential part,
    whose work is needed but done a costly way (a per-parameter optimizer, a grown tensor)."""
    out: dict[str, tuple[int, str, int]] = {}
    for i, f in enumerate(report.findings, 1):
        if f.part is not None and f.recoverable_ns_per_step > 0 and f.severity is not Severity.INFO:
            out.setdefault(f.part, (i, str(f.code), f.recoverable_ns_per_step))
    return out


def _healthy_line(report: Report) -> str:
    """'Nothing here costs ...', with the account's evidence that the step is essential work."""
    from tracewhy.findings.where_step_goes import essential_summary

    said = essential_summary(report.account) if report.account is not None else None
    if said is None:
        return "Nothing here costs a meaningful share of the step: no high or medium findings."
    return f"Nothing here costs a meaningful share of the step: {said}; no high or medium findings."
