"""Terminal and JSON shapes of a diagnosis and of the gap list.

Every time in these outputs is measured from one origin, the trace start (the first event's
start): the gap list, its JSON and the HTML report agree on where a gap lies."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final, TypedDict

import polars as pl

from tracewhy.analyses.gaps import CLASS_COLUMNS, CLASSES, GAP_STEPS_SCHEMA, GAPS_SCHEMA, GapCol, GapsResult
from tracewhy.findings.model import Severity
from tracewhy.renderers.layout import Layout, label, name, number, step
from tracewhy.units import fmt_ns, fmt_pct, indented, printable

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tracewhy.analyses.steps import STEPS_SCHEMA, StepStats
    from tracewhy.findings.diagnose import Report
    from tracewhy.findings.model import Finding
    from tracewhy.renderers.json_schema import rows
    from tracewhy.renderers.throughput import ThroughputJson


_STYLE = {Severity.TRUST: "bold yellow", Severity.HIGH: "bold red", Severity.MEDIUM: "red",
          Severity.LOW: "cyan", Severity.INFO: "dim"}


#: What every start time in tables and JSON is measured from (``time_origin`` in JSON).
TIME_ORIGIN: Final = "trace start (the first event's start)"
#: Gaps in ``diagnose --json`` (largest first); ``gaps --json`` has all of them.
TOP_GAPS: Final = 50


#: The gap list every view shows: the gaps, each with its start from the trace start.
GAP_ROWS_SCHEMA: Final = pl.Schema({**GAPS_SCHEMA, "start_from_origin_ns": pl.Int64()})


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


def diagnose_payload(report: Report) -> DiagnosePayload:
    """The JSON of a diagnosis. ``basis`` figures are means over the steady steps
    (``basis.statistic`` says so) or cover the whole trace; step figures are named by statistic."""
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


class GapsPayload(TypedDict):
    """``gaps``: every GPU idle gap, largest first, with its class and what the host was doing."""

    #: Gaps shorter than this are counted per step as short, not listed.
    min_gap_ns: int
    #: What ``start_from_origin_ns`` is measured from.
    time_origin: str
    time_origin_ns: int | None
    gaps: Annotated[pl.DataFrame, rows(GAP_ROWS_SCHEMA, "the gaps, largest first")]
    per_step: Annotated[pl.DataFrame, rows(GAP_STEPS_SCHEMA, "idle per step and device, by class")]


def gaps_payload(r: GapsResult, origin_ns: int | None, gap_class: str | None = None) -> GapsPayload:
    """The JSON of ``gaps``: every gap (of ``gap_class``), largest first, its start both on the
    trace's clock (``start_ns``) and from ``origin_ns``, the trace start (``start_from_origin_ns``)."""
    return {
        "min_gap_ns": r.min_gap_ns,
        "time_origin": TIME_ORIGIN,
        "time_origin_ns": origin_ns,
        "gaps": gap_rows(r, origin_ns, gap_class),
        "per_step": r.per_step,
    }


def gap_rows(r: GapsResult, origin_ns: int | None, gap_class: str | None = None) -> pl.DataFrame:
    """The gaps largest first, with ``start_from_origin_ns``: the one table every view lists."""
    table = r.gaps.sort(GapCol.DUR, descending=True)
    if gap_class:
        table = table.filter(pl.col(GapCol.GAP_CLASS) == gap_class)
    return table.with_columns((pl.col(GapCol.START) - (origin_ns or 0)).alias("start_from_origin_ns")) \
        .select(*GAP_ROWS_SCHEMA)


def basis_statistic(report: Report) -> str:
    """Which statistic the basis figures (and the findings built on them) are."""
    b = report.basis
    if b.per_steps:
        return f"mean of {b.steps} steady steps"
    return "whole trace" if b.device is not None else "none (no GPU activity)"


def recoverable_unit(report: Report) -> str:
    """What findings' recoverable time is measured over: per step when the trace has steady
    steps (GPU or CPU-only), else over the whole trace."""
    return "per step" if report.basis.per_steps or report.steps.stats is not None else "over the trace"


def render_diagnose(report: Report, top: int | None = None) -> RenderableType:
    """The ranked findings; ``top``: show the first ``top`` (trust findings count too) and say
    how many are left out (``--json`` always has them all)."""
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = []
    b = report.basis
    st = report.steps.stats
    head = Text(f"{printable(report.path)}\n", style="bold")
    if st is not None:
        head.append(f"{st.count} steady steps: duration p50 {fmt_ns(st.p50_ns)}, p90 {fmt_ns(st.p90_ns)}, "
                    f"mean {fmt_ns(st.mean_ns)}. ")
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


#: ``gaps``: where, when and how long the GPU was idle and why stay; the kernel that ended the gap
#: leaves a narrow terminal first.
GAPS_TABLE: Final = Layout(
    (number("device"), number("start"), number("idle"), label("class"), name("host was in"), name("next on GPU")),
    drop=("next on GPU",))
#: ``gaps``: idle per step by class; classes with no idle in the rows shown leave first, then the
#: window, the gaps too short to classify and the classes from the last; the device last.
IDLE_PER_STEP_TABLE: Final = Layout(
    (step(), number("device"), number("window"), number("idle"), *(number(c) for c in CLASSES), number("short")),
    drop=("window", "short", *reversed(CLASSES), "device"))


def render_gaps(table: pl.DataFrame, per_step: pl.DataFrame, top: int) -> RenderableType:
    """``table``: ``gap_rows``; starts are shown from the trace start, as in JSON and HTML."""
    from rich.console import Group

    t = GAPS_TABLE.table(f"{table.height} GPU idle gaps, largest first; start from the {TIME_ORIGIN}")
    for r in table.head(top).iter_rows(named=True):
        host = " > ".join(x for x in (r[GapCol.HOST_ANNOTATION], r[GapCol.HOST_OP], r[GapCol.HOST_INNERMOST]) if x)
        t.add_row(str(r[GapCol.DEVICE]), fmt_ns(r["start_from_origin_ns"]), fmt_ns(r[GapCol.DUR]),
                  r[GapCol.GAP_CLASS], host or "-", r[GapCol.NEXT_ACTIVITY] or "-")
    parts: list[RenderableType] = [t]
    if per_step.height:
        s = IDLE_PER_STEP_TABLE.table("idle per step, by class (short: gaps under --min-gap, not classified one "
                                      "by one; the classes and short add up to idle)")
        for r in per_step.iter_rows(named=True):
            s.add_row(r[GapCol.NAME], str(r[GapCol.DEVICE]), fmt_ns(r[GapCol.WINDOW]), fmt_ns(r[GapCol.IDLE]),
                      *[fmt_ns(r[c]) if r[c] else "" for c in (*CLASS_COLUMNS, GapCol.SHORT)])
        parts.append(s)
    return Group(*parts)
