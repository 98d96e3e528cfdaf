"""``gaps``: the terminal and JSON shapes of the gap list.

Every time in these outputs is measured from one origin, the trace start (the first event's
start): the gap list, its JSON and the HTML report agree on where a gap lies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Final, TypedDict

import polars as pl

from tracewhy.analyses.gaps import CLASS_COLUMNS, CLASSES, GAP_STEPS_SCHEMA, GAPS_SCHEMA, GapCol, GapsResult
from tracewhy.renderers import View
from tracewhy.renderers.layout import Layout, label, name, number, step
from tracewhy.units import fmt_ns

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tracewhy.renderers.json_schema import rows
    from tracewhy.renderers.several import ComparisonJson, GroupingJson
    from tracewhy.reports.gaps import GapsReport
    from tracewhy.reports.several import SeveralReport


#: What every start time in tables and JSON is measured from (``time_origin`` in JSON).
TIME_ORIGIN: Final = "trace start (the first event's start)"
#: The gap list every view shows: the gaps, each with its start from the trace start.
GAP_ROWS_SCHEMA: Final = pl.Schema({**GAPS_SCHEMA, "start_from_origin_ns": pl.Int64()})


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


def gaps_output(r: GapsReport, gap_class: str | None, top: int) -> tuple[Mapping[str, Any], View]:
    """The payload and view of ``gaps`` on one trace."""
    return (gaps_payload(r.result, r.origin_ns, gap_class),
            lambda: render_gaps(gap_rows(r.result, r.origin_ns, gap_class), r.result.per_step, top))


class GapsInput(GapsPayload):
    """One trace's gaps (as ``gaps TRACE --json`` gives them), with its path and rank."""

    path: str
    #: The rank the trace's distributedInfo names; null where it names none.
    rank: int | None


class GapsSeveralPayload(TypedDict):
    """``gaps`` of several traces: each one's gaps, how they were read (as ranks of one job or
    one after another), and the runs of one program compared with the first."""

    grouping: GroupingJson
    #: In rank order when read as ranks, else as given.
    inputs: list[GapsInput]
    #: Null when read as ranks.
    comparison: ComparisonJson | None


def gaps_several_output(r: SeveralReport[GapsReport], gap_class: str | None,
                        top: int) -> tuple[Mapping[str, Any], View]:
    """``gaps`` of several traces: each one's tables under its heading (``renderers/several.py``)."""
    from tracewhy.renderers.several import several_output

    return several_output(r, lambda g: gaps_output(g, gap_class, top))
