"""``report``: the JSON report, everything the HTML report shows, as data (``report --json``
prints it in the envelope, and ``renderers.html`` inlines that document into the page). Times on
the page run from the trace start. A report of rank traces, of an Nsight Compute report or of a
memory-timeline export has a payload of its own (``renderers/report_inputs.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypedDict

import polars as pl

from tracewhy.analyses.blocks import BLOCKS_SCHEMA
from tracewhy.analyses.gaps import GapCol
from tracewhy.analyses.kernels import KERNELS_BY_FAMILY_SCHEMA, KERNELS_BY_NAME_SCHEMA
from tracewhy.analyses.ops import OPS_SCHEMA
from tracewhy.analyses.overlap import (
    OVERLAP_COLLECTIVES_SCHEMA,
    OVERLAP_DEVICES_SCHEMA,
    OVERLAP_STEADY_SCHEMA,
    OverlapCol,
)
from tracewhy.analyses.steps import STEPS_SCHEMA, StepCol, StepStats
from tracewhy.analyses.utilization import UTILIZATION_DEVICES_SCHEMA, UTILIZATION_SERIES_SCHEMA
from tracewhy.findings.model import Finding
from tracewhy.model.schema import Col, MemEventCol
from tracewhy.model.trace import Capture
from tracewhy.renderers.account import ReportAccount, account_report_payload
from tracewhy.renderers.compile import CompileSummary, compile_summary
from tracewhy.renderers.critical_path import CriticalPathReport, critical_path_report_payload
from tracewhy.renderers.diagnose import ReplayedJson, basis_statistic, replayed_json
from tracewhy.renderers.gaps import GAP_ROWS_SCHEMA, TIME_ORIGIN, gap_rows
from tracewhy.renderers.mfu import MfuJson, mfu_json

if TYPE_CHECKING:  # types only: a report of one trace needs neither the ranks nor the ncu modules
    from tracewhy.renderers.json_schema import rows, rows_of_either
    from tracewhy.renderers.report_inputs import (
        NcuReportPayload,
        RanksReportPayload,
        RunsReportPayload,
        TimelineReportPayload,
    )
    from tracewhy.reports.overview import Overview
    from tracewhy.reports.report import ReportContents

#: Rows of the operator and kernel tables (largest first); the JSON of `report --json` is the same.
TABLE_ROWS: Final = 300
TOP_GAPS: Final = 50  # the gaps table; diagnose --json lists as many
#: Gaps drawn on the utilization chart (largest first): beyond this, bins already show the idle.
TIMELINE_GAPS: Final = 20_000
ROOFLINE_POINTS: Final = 500
#: Points per memory series (per device, or of a timeline export): each kept point is the highest
#: of its stretch of events, so the peak is always drawn; a 1 GB trace has millions of events.
MEMORY_POINTS: Final = 4000


def _of(schema: pl.Schema, *columns: str, **more: pl.DataType) -> pl.Schema:
    """The part of a declared table's schema a report section selects (and the columns it adds)."""
    return pl.Schema({**{c: schema[c] for c in columns}, **more})


class ReportSource(TypedDict):
    """What the report is of."""

    path: str
    format: str
    rank: int | None
    world_size: int | None
    #: Device names.
    devices: list[str]
    warnings: list[str]


class ReportTrace(ReportSource):
    """A trace: with its capture options, versions and time span."""

    capture: Capture
    versions: dict[str, str]
    span_ns: int


class ReportSteps(TypedDict):
    marker: str
    warmup: int
    stats: StepStats | None
    note: str | None
    rows: Annotated[pl.DataFrame, rows(_of(STEPS_SCHEMA, StepCol.NAME, StepCol.DUR, StepCol.STEADY, StepCol.GPU_BUSY,
                                           StepCol.KERNEL_COUNT), "one row per step")]


class ReportUtilization(TypedDict):
    t0_ns: int | None
    series: Annotated[pl.DataFrame, rows(UTILIZATION_SERIES_SCHEMA, "busy share per bin of time, per device")]
    devices: Annotated[pl.DataFrame, rows(UTILIZATION_DEVICES_SCHEMA, "one row per device")]


class ReportGaps(TypedDict):
    timeline: Annotated[pl.DataFrame, rows(_of(GAP_ROWS_SCHEMA, GapCol.DEVICE, GapCol.START, GapCol.DUR,
                                               GapCol.GAP_CLASS), f"the {TIMELINE_GAPS} largest gaps, to draw")]
    top: Annotated[pl.DataFrame, rows({**GAP_ROWS_SCHEMA, "start_ms": pl.Float64()}, f"the {TOP_GAPS} largest gaps")]


class ReportOverlap(TypedDict):
    """Compute, communication, copies and idle per device."""

    #: True: ``rows`` are means per steady step; false: totals per device over the trace (it has
    #: no steps), with the span as ``window_ns``.
    per_step: bool
    rows: Annotated[pl.DataFrame, rows_of_either(
        (OVERLAP_STEADY_SCHEMA,
         {OverlapCol.WINDOW if c == OverlapCol.SPAN else c: d for c, d in OVERLAP_DEVICES_SCHEMA.items()}),
        "per device")]
    collectives: Annotated[pl.DataFrame, rows(OVERLAP_COLLECTIVES_SCHEMA, "per device and collective")]


class ReportRoofline(TypedDict):
    """Points of a roofline plot, and the roofs."""

    points: Annotated[pl.DataFrame, rows({Col.NAME: pl.String(), "input_dims": pl.String(), "ai": pl.Float64(),
                                          "flop_per_s": pl.Float64(), "gpu_ns": pl.Int64(), "bound": pl.String()},
                                         "one point per op (and shapes) or kernel")]
    peak_flop_per_s: float | None
    peak_bytes_per_s: float | None
    note: str


class MemorySeries(TypedDict):
    """Allocated and reserved after each kept event (at most MEMORY_POINTS, maxima kept)."""

    ts_ns: list[int]
    allocated: list[int]
    reserved: list[int | None]


class ReportMemoryDevice(TypedDict):
    device: str
    peak_allocated_bytes: int
    reserved_at_peak_bytes: int | None
    peak_reserved_bytes: int | None
    peak_ts_ns: int
    peak_step: str | None
    peak_op: str | None
    ledger: dict[str, int]
    allocated_source: str
    series: MemorySeries


class ReportMemory(TypedDict):
    """Allocated and reserved over time per device, the peak and its ledger, and the steps to shade."""

    source: Literal["trace"]
    ledger_source: str
    t0_ns: int | None
    devices: list[ReportMemoryDevice]
    steps: Annotated[pl.DataFrame, rows({StepCol.NAME: pl.String(), "start_ns": pl.Int64(), "end_ns": pl.Int64(),
                                         StepCol.STEADY: pl.Boolean()}, "one row per step")]


class ReportPayload(TypedDict):
    """``report`` of a trace: everything the HTML report shows, as data."""

    trace: ReportTrace
    findings: list[Finding]
    #: The steps the findings' predictions replayed; null when nothing was replayed.
    replayed: ReplayedJson | None
    #: What a finding's recoverable time is measured over.
    recoverable_unit: str
    basis_statistic: str
    time_origin: str
    time_origin_ns: int | None
    steps: ReportSteps
    utilization: ReportUtilization
    gaps: ReportGaps
    ops: Annotated[pl.DataFrame, rows(OPS_SCHEMA, f"the {TABLE_ROWS} operators with most GPU time")]
    kernels: Annotated[pl.DataFrame, rows(KERNELS_BY_NAME_SCHEMA, f"the {TABLE_ROWS} kernels with most time")]
    kernel_families: Annotated[pl.DataFrame, rows(KERNELS_BY_FAMILY_SCHEMA, "kernel time per family")]
    overlap: ReportOverlap | None
    blocks: Annotated[pl.DataFrame, rows(BLOCKS_SCHEMA, "annotated blocks")] | None
    roofline: ReportRoofline | None
    memory: ReportMemory | None
    compile: CompileSummary | None
    critical_path: CriticalPathReport | None
    #: Where the step goes (the step account); None when the trace has nothing to account for.
    account: ReportAccount | None
    #: Each step's and region's model FLOPs utilization; None without matrix math in the trace.
    mfu: MfuJson | None
    #: Set for multi-rank input only.
    ranks: None


def report_payload(contents: ReportContents) -> (ReportPayload | RanksReportPayload | RunsReportPayload
                                                  | NcuReportPayload | TimelineReportPayload):
    """The JSON report of what ``report`` computed, whichever input it was."""
    from tracewhy.reports.overview import Overview
    from tracewhy.reports.report import MemoryTimelineReport, RankTracesReport, RunsReport

    if isinstance(contents, Overview):
        return overview_payload(contents)
    from tracewhy.renderers import report_inputs

    if isinstance(contents, RunsReport):
        return report_inputs.runs_report_payload(contents)
    if isinstance(contents, RankTracesReport):
        return report_inputs.ranks_report_payload(contents.ranks.result, contents.ranks.findings, contents.source)
    if isinstance(contents, MemoryTimelineReport):
        return report_inputs.memory_timeline_report_payload(contents.result, contents.source, contents.layout)
    return report_inputs.ncu_report_payload(contents)


def findings_count(payload: Mapping[str, Any]) -> int:
    """The findings a report shows (of every trace, in a report of several)."""
    if "inputs" in payload:
        return sum(len(i["findings"]) for i in payload["inputs"])
    return len(payload["findings"])


def overview_payload(ov: Overview) -> ReportPayload:
    """Everything the page shows, as plain data (the JSON report). Times on the page run from the
    trace start (``time_origin_ns``), as in ``gaps``; ``basis_statistic`` says which statistic the
    findings' per-step figures are."""
    from tracewhy.reports.diagnose import recoverable_unit  # (loaded already: ``ov`` comes from it)

    info, report = ov.info, ov.report
    t0 = info.first_ts_ns
    gaps = gap_rows(report.gaps, t0)
    payload: ReportPayload = {
        "trace": {
            "path": info.path, "format": info.format, "rank": info.rank, "world_size": info.world_size,
            "devices": [str(d["name"]) for d in info.devices], "capture": info.capture,
            "versions": info.versions, "span_ns": info.span_ns, "warnings": list(info.warnings),
        },
        "findings": report.findings,
        "replayed": replayed_json(report),
        # What a finding's recoverable time is measured over (a trace without steps: all of it).
        "recoverable_unit": recoverable_unit(report),
        "basis_statistic": basis_statistic(report),
        "time_origin": TIME_ORIGIN,
        "time_origin_ns": t0,
        "steps": {
            "marker": report.steps.marker, "warmup": report.steps.warmup, "stats": report.steps.stats,
            "note": report.steps.note,
            "rows": report.steps.table.select(StepCol.NAME, StepCol.DUR, StepCol.STEADY, StepCol.GPU_BUSY,
                                              StepCol.KERNEL_COUNT),
        },
        "utilization": {"t0_ns": t0, "series": ov.utilization.series, "devices": ov.utilization.devices},
        "gaps": {
            "timeline": gaps.head(TIMELINE_GAPS).select(GapCol.DEVICE, GapCol.START, GapCol.DUR, GapCol.GAP_CLASS),
            "top": gaps.head(TOP_GAPS).with_columns((pl.col("start_from_origin_ns") / 1e6).alias("start_ms")),
        },
        "ops": ov.ops.table.head(TABLE_ROWS),
        "kernels": ov.kernels.by_name.head(TABLE_ROWS),
        "kernel_families": ov.kernels.by_family,
        "overlap": _overlap(ov),
        "blocks": ov.blocks.table if ov.blocks is not None else None,
        "roofline": _roofline(ov),
        "memory": _memory(ov),
        "compile": _compile(ov),
        "critical_path": critical_path_report_payload(ov.critical_path, TABLE_ROWS)
        if ov.critical_path is not None else None,
        "account": _account(ov),
        "mfu": mfu_json(ov.mfu) if ov.mfu is not None else None,
        "ranks": None,  # filled for multi-rank input
    }
    return payload


def _account(ov: Overview) -> ReportAccount | None:
    from tracewhy.findings.where_step_goes import account_lines

    a = ov.report.account
    return account_report_payload(a, account_lines(a)) if a is not None and a.parts.height else None


def thinned(table: pl.DataFrame, by: str, points: int = MEMORY_POINTS) -> pl.DataFrame:
    """At most about ``points`` rows of a time-ordered table: of each run of consecutive rows,
    the one where ``by`` is highest (the first of equals), so maxima survive the thinning."""
    if table.height <= points:
        return table
    size = -(-table.height // points)
    return (table.with_row_index("_row").with_columns((pl.col("_row") // size).alias("_bin"))
            .filter(pl.col(by) == pl.col(by).max().over("_bin")).unique("_bin", keep="first", maintain_order=True)
            .drop("_row", "_bin"))


def _memory(ov: Overview) -> ReportMemory | None:
    """Allocated and reserved over time per device with the peak and the ledger at it, and the
    steps to shade; None without ``[memory]`` events. GPUs only when the trace has any, as the
    memory findings judge them (the host's allocations beside a GPU are the launch's scraps)."""
    r = ov.report.memory
    if r is None or not r.devices:
        return None
    steps_table = ov.report.steps.table
    devices: list[ReportMemoryDevice] = []
    for d in [d for d in r.devices if d.device != "cpu"] or r.devices:
        series = thinned(d.timeline.with_columns(pl.col(MemEventCol.TOTAL_RESERVED).fill_null(strategy="forward")),
                         MemEventCol.TOTAL_ALLOCATED)
        devices.append({
            "device": d.device, "peak_allocated_bytes": d.peak_allocated_bytes,
            "reserved_at_peak_bytes": d.reserved_at_peak_bytes, "peak_reserved_bytes": d.peak_reserved_bytes,
            "peak_ts_ns": d.peak_ts_ns, "peak_step": d.peak_step, "peak_op": d.peak_op, "ledger": d.ledger,
            "allocated_source": d.allocated_source,
            "series": {"ts_ns": series.get_column(MemEventCol.TS).to_list(),
                       "allocated": series.get_column(MemEventCol.TOTAL_ALLOCATED).to_list(),
                       "reserved": series.get_column(MemEventCol.TOTAL_RESERVED).to_list()},
        })
    return {
        "source": "trace", "ledger_source": r.ledger_source, "t0_ns": ov.info.first_ts_ns, "devices": devices,
        "steps": steps_table.select(StepCol.NAME, pl.col(StepCol.TS).alias("start_ns"),
                           (pl.col(StepCol.TS) + pl.col(StepCol.DUR)).alias("end_ns"), StepCol.STEADY),
    }


def _compile(ov: Overview) -> CompileSummary | None:
    """torch.compile per step, where the breaks are and the recompiles (the ``compile --json``
    payload; its findings are the report's); None without compile markers."""
    r = ov.report.compile
    return None if r is None else compile_summary(r)


def _overlap(ov: Overview) -> ReportOverlap | None:
    o = ov.overlap
    if o is None or o.devices.height == 0:
        return None
    if o.steady.height:
        return {"per_step": True, "rows": o.steady, "collectives": o.collectives}
    return {"per_step": False, "rows": o.devices.rename({OverlapCol.SPAN: OverlapCol.WINDOW}),
            "collectives": o.collectives}


def _roofline(ov: Overview) -> ReportRoofline | None:
    r = ov.op_roofline
    if r is None:
        return None
    pts = r.ops.filter((pl.col("arithmetic_intensity") > 0) & (pl.col("flop_per_s") > 0)).sort(
        "gpu_ns", descending=True).head(ROOFLINE_POINTS)
    if pts.height == 0:
        return None
    top = pts.row(0, named=True)
    return {
        "points": pts.select(Col.NAME, "input_dims", pl.col("arithmetic_intensity").alias("ai"), "flop_per_s",
                             "gpu_ns", "bound"),
        "peak_flop_per_s": top["peak_flop_per_s"], "peak_bytes_per_s": top["peak_bytes_per_s"],
        "note": f"Per operator and input shapes, from recorded shapes; roof of {r.device_name or 'the device'} "
                f"at the precision of the op with most GPU time. " + " ".join(r.notes[:1]),
    }
