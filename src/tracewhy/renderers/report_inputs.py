"""``report`` of an input that is not one trace: the traces of several ranks of one job (a
rank-by-metric heatmap and the rank findings), several other traces (each one's report and the
runs compared with the first), an Nsight Compute report (the roofline of its kernels and their
verdicts) or a memory-timeline export (its categories stacked over time). The HTML page is the
same (several traces: one page with a part per trace); ``renderers/report.py`` holds the
payload of a trace's report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypedDict

import polars as pl

from tracewhy.findings.model import Finding
from tracewhy.model.memory_timeline import TimelineCol
from tracewhy.model.schema import Col
from tracewhy.renderers.report import ROOFLINE_POINTS, ReportPayload, ReportSource, overview_payload, thinned

if TYPE_CHECKING:  # types only: each is loaded by the report of its own input
    from tracewhy.analyses.memory import TimelineResult
    from tracewhy.analyses.rank_compare import RanksResult
    from tracewhy.findings.roofline import KERNEL_VERDICTS_SCHEMA, NcuRooflineResult
    from tracewhy.renderers.json_schema import rows
    from tracewhy.renderers.several import ComparisonJson, GroupingJson
    from tracewhy.reports.report import RunsReport


class ReportKernelRoofline(TypedDict):
    """An ncu report's roofline points (per kernel), and the roofs."""

    points: Annotated[pl.DataFrame, rows({Col.NAME: pl.String(), "ai": pl.Float64(), "flop_per_s": pl.Float64(),
                                          "gpu_ns": pl.Int64(), "bound": pl.String()}, "one point per kernel")]
    peak_flop_per_s: float | None
    peak_bytes_per_s: float | None
    note: str


class TimelineMemory(TypedDict):
    """A memory-timeline export's categories over time, the peak of their sum and the ledger at it."""

    source: Literal["memory_timeline"]
    ledger_source: str
    t0_ns: int
    peak_total_bytes: int
    peak_ts_ns: int | None
    ledger_at_peak: dict[str, int]
    #: The categories that hold any bytes.
    categories: list[str]
    #: ``ts_ns`` and one list per category, in bytes.
    series: dict[str, list[int]]


class TimelineReportPayload(TypedDict):
    """``report`` of a memory-timeline export."""

    trace: ReportSource
    findings: list[Finding]
    memory: TimelineMemory


class RankMetric(TypedDict):
    key: str
    label: str


class RankRow(TypedDict):
    rank: int
    #: One per metric, in ``metrics`` order.
    values: list[float | None]


class RanksHeatmap(TypedDict):
    metrics: list[RankMetric]
    rows: list[RankRow]
    straggler: int | None


class RanksReportPayload(TypedDict):
    """``report`` of a directory of rank traces: their findings and a rank-by-metric heatmap."""

    trace: ReportSource
    findings: list[Finding]
    recoverable_unit: str
    ranks: RanksHeatmap


class NcuReportPayload(TypedDict):
    """``report`` of an Nsight Compute report: the roofline of its kernels and their verdicts."""

    trace: ReportSource
    findings: list[Finding]
    roofline: ReportKernelRoofline | None
    verdicts: Annotated[pl.DataFrame, rows({c: KERNEL_VERDICTS_SCHEMA[c] for c in NCU_VERDICT_COLUMNS},
                                           "per kernel name, most time first")]


#: The columns of an ncu report's verdicts table.
NCU_VERDICT_COLUMNS: Final = (Col.NAME, "launches", "total_ns", "bound", "reason", "roof_fraction",
                              "achieved_occupancy_pct", "occupancy_limiter", "top_stalls")


def memory_timeline_report_payload(r: TimelineResult, path: str, layout: str) -> TimelineReportPayload:
    """The report of a memory-timeline export: its categories stacked over time, the peak of
    their sum and the ledger at it, in the profiler's own categories."""
    t = thinned(r.table, TimelineCol.TOTAL)
    categories = [c for c in TimelineCol.CATEGORIES if t.height and t.get_column(c).max()]
    return {
        "trace": {"path": path, "format": f"memory timeline ({layout})", "rank": None, "world_size": None,
                  "devices": [], "warnings": []},
        "findings": [],
        "memory": {
            "source": "memory_timeline", "ledger_source": r.ledger_source,
            "t0_ns": int(t.get_column(TimelineCol.TS).min()) if t.height else 0,  # type: ignore[arg-type]
            "peak_total_bytes": r.peak_total_bytes, "peak_ts_ns": r.peak_ts_ns, "ledger_at_peak": r.ledger_at_peak,
            "categories": categories,
            "series": {"ts_ns": t.get_column(TimelineCol.TS).to_list(),
                       **{c: t.get_column(c).to_list() for c in categories}},
        },
    }


#: The heatmap's columns for ``ranks`` input: (column of RanksResult.ranks, label).
RANK_METRICS: Final = (
    ("step_p50_ns", "step p50"), ("compute_ns_per_step", "compute / step"), ("comm_ns_per_step", "comm / step"),
    ("comm_exposed_ns_per_step", "exposed comm / step"), ("idle_ns_per_step", "GPU idle / step"),
    ("input_ns_per_step", "input / step"), ("wait_ns_per_step", "waits in collectives / step"),
    ("late_ns_per_step", "others waited for it / step"),
)


def ranks_report_payload(r: RanksResult, findings: list[Finding], source: str) -> RanksReportPayload:
    """The report of several rank traces: their findings and a rank-by-metric heatmap."""
    cols = [c for c, _ in RANK_METRICS if c in r.ranks.columns]
    heat: list[RankRow] = [{"rank": row["rank"], "values": [row[c] for c in cols]}
                           for row in r.ranks.sort("rank").iter_rows(named=True)]
    return {
        "trace": {"path": source, "format": "ranks", "rank": None, "world_size": None, "devices": [],
                  "warnings": list(r.notes)},
        "findings": findings,
        "recoverable_unit": "per step",
        "ranks": {"metrics": [{"key": c, "label": label} for c, label in RANK_METRICS if c in cols], "rows": heat,
                  "straggler": r.straggler},
    }


def ncu_report_payload(r: NcuRooflineResult) -> NcuReportPayload:
    """The report of an Nsight Compute report: the roofline of its kernels and their verdicts."""
    k = r.kernels
    pts = k.filter((pl.col("arithmetic_intensity") > 0) & (pl.col("flop_per_s") > 0)).head(ROOFLINE_POINTS)
    top_precision = pts.row(0, named=True)["precision"] if pts.height else None
    peaks = r.ceilings.flop_per_s
    peak = peaks.get(top_precision) if top_precision in peaks else max(peaks.values(), default=None)
    return {
        "trace": {"path": r.path, "format": f"ncu ({r.format})", "rank": None, "world_size": None,
                  "devices": [r.device_name] if r.device_name else [], "warnings": list(r.notes)},
        "findings": [],
        "roofline": {
            "points": pts.select(Col.NAME, pl.col("arithmetic_intensity").alias("ai"), "flop_per_s",
                                 pl.col("total_ns").alias("gpu_ns"), "bound"),
            "peak_flop_per_s": peak, "peak_bytes_per_s": r.ceilings.dram_bytes_per_s,
            "note": f"Per kernel from Nsight Compute ({r.ceilings.source} roofs"
                    + (f", {top_precision}" if top_precision else "") + ").",
        } if pts.height else None,
        "verdicts": k.select(NCU_VERDICT_COLUMNS),
    }


class ReportInput(ReportPayload):
    """One trace's report (as ``report TRACE --json`` gives it), with its path and rank."""

    path: str
    #: The rank the trace's distributedInfo names; null where it names none.
    rank: int | None


class RunsReportPayload(TypedDict):
    """``report`` of several traces that are not the ranks of one job: each one's report, how
    they were read, and the runs of one program compared with the first."""

    grouping: GroupingJson
    inputs: list[ReportInput]
    comparison: ComparisonJson | None


def runs_report_payload(r: RunsReport) -> RunsReportPayload:
    """The JSON report of several traces: each one's report, and the comparison."""
    from tracewhy.renderers.several import comparison_payload, grouping_payload, input_entries

    entries: Any = input_entries(r.several, lambda ov: (overview_payload(ov), lambda: ""))
    return {"grouping": grouping_payload(r.several), "inputs": entries, "comparison": comparison_payload(r.several)}
