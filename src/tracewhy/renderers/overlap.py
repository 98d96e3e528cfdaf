"""``overlap``: compute, communication (hidden and exposed), copies and idle per GPU and step, the
collectives by exposed time and the streams at once, as terminal tables and as JSON."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, Final, TypedDict

import polars as pl

from tracewhy.analyses.collective_bandwidth import BANDWIDTH_SCHEMA
from tracewhy.analyses.overlap import (
    OVERLAP_COLLECTIVES_SCHEMA,
    OVERLAP_CONCURRENCY_SCHEMA,
    OVERLAP_DEVICES_SCHEMA,
    OVERLAP_STEADY_SCHEMA,
    OVERLAP_STEPS_SCHEMA,
    OVERLAP_STREAMS_SCHEMA,
    OverlapCol,
    OverlapResult,
)
from tracewhy.findings.model import Finding
from tracewhy.renderers.findings import render_findings
from tracewhy.renderers.layout import Layout, label, name, number, step
from tracewhy.units import fmt_bytes, fmt_ns, fmt_pct

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tracewhy.renderers.json_schema import rows


class OverlapPayload(TypedDict):
    """``overlap``: compute, communication (hidden and exposed), copies and idle per GPU and step."""

    step_marker: str
    steady_steps: int
    note: str | None
    devices: Annotated[pl.DataFrame, rows(OVERLAP_DEVICES_SCHEMA, "per device, over its whole span")]
    steady: Annotated[pl.DataFrame, rows(OVERLAP_STEADY_SCHEMA, "per device, the mean per steady step")]
    steps: Annotated[pl.DataFrame, rows(OVERLAP_STEPS_SCHEMA, "per device and step")]
    collectives: Annotated[pl.DataFrame, rows(OVERLAP_COLLECTIVES_SCHEMA, "per device and collective, most exposed "
                                                                          "first, totals over collectives_over")]
    streams: Annotated[pl.DataFrame, rows(OVERLAP_STREAMS_SCHEMA, "per device and stream")]
    #: What the collectives' totals cover: "N steady steps" or "the whole trace".
    collectives_over: str
    concurrency: Annotated[pl.DataFrame, rows(OVERLAP_CONCURRENCY_SCHEMA, "time with N streams active, per device")]
    bandwidth: Annotated[pl.DataFrame, rows(BANDWIDTH_SCHEMA, "collective calls with a message size per device, op, "
                                                              "process group and size, totals over collectives_over")]
    findings: list[Finding]


def overlap_payload(r: OverlapResult, findings: list[Finding]) -> OverlapPayload:
    """The JSON of ``overlap``. ``steady`` rows are means per steady step; ``collectives`` rows are
    totals over ``collectives_over`` but for ``exposed_ns_per_step``."""
    return {
        "step_marker": r.step_marker, "steady_steps": r.steady_steps, "note": r.note, "devices": r.devices,
        "steady": r.steady, "steps": r.steps, "collectives": r.collectives, "streams": r.streams,
        "collectives_over": f"{r.steady_steps} steady steps" if r.steady.height else "the whole trace",
        "concurrency": r.concurrency, "bandwidth": r.bandwidth, "findings": findings,
    }


#: ``overlap``: compute, exposed communication and idle (the parts that add up to the step)
#: stay; the stream count, the hidden share and the raw comm time leave first.
OVERLAP_TABLE: Final = Layout(
    (number("GPU"), number("window"), number("compute"), number("comm"), number("hidden"), number("exposed comm"),
     number("exposed copies"), number("idle"), number("streams (max at once)")),
    drop=("streams (max at once)", "hidden", "comm", "window", "exposed copies"))
COLLECTIVES_TABLE: Final = Layout(
    (number("GPU"), name("collective"), number("total calls"), number("total time"), number("total hidden"),
     number("total exposed"), number("exposed per step")),
    drop=("total hidden", "total calls", "total time"))
BANDWIDTH_TABLE: Final = Layout(
    (number("GPU"), name("op"), label("group"), number("ranks"), number("message"), number("calls"), number("time"),
     number("bus GB/s"), label("link"), number("of link peak")),
    drop=("ranks", "calls", "group", "link", "time"))
OVERLAP_STEPS_TABLE: Final = Layout(
    (number("GPU"), step(), number("window"), number("compute"), number("comm"), number("exposed comm"),
     number("idle"), label("steady", "right")),
    drop=("comm", "window"))


def render_overlap(r: OverlapResult, findings: list[Finding], top: int) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = []
    per_step = r.steady.height > 0
    t = OVERLAP_TABLE.table(("steady steps: mean per step" if per_step else "whole trace (no steps)")
                            + " — compute + exposed comm + exposed copies + idle = window")
    for d, src, window in _device_rows(r, per_step):
        comm = src[OverlapCol.COMM]
        t.add_row(
            str(d[OverlapCol.DEVICE]), fmt_ns(window), _with_share(src[OverlapCol.COMPUTE], window), fmt_ns(comm),
            fmt_pct(src[OverlapCol.COMM_HIDDEN] / comm if comm else None),
            _with_share(src[OverlapCol.COMM_EXPOSED], window), _with_share(src[OverlapCol.COPY_EXPOSED], window),
            _with_share(src[OverlapCol.IDLE], window),
            f"{d[OverlapCol.STREAMS]} ({d[OverlapCol.MAX_STREAMS_ACTIVE]})",
        )
    parts.append(t)
    parts.extend(Text(line, style="dim") for line in _busy_lines(r, per_step))
    if r.collectives.height:
        over = f"the {r.steady_steps} steady steps" if per_step else "the trace (no steps)"
        c = COLLECTIVES_TABLE.table(f"collectives over {over}, most exposed first")
        for row in r.collectives.head(top).iter_rows(named=True):
            c.add_row(str(row[OverlapCol.DEVICE]), row[OverlapCol.COLLECTIVE],
                      str(row[OverlapCol.COUNT]), fmt_ns(row[OverlapCol.TIME]), fmt_ns(row[OverlapCol.HIDDEN]),
                      fmt_ns(row[OverlapCol.EXPOSED]), fmt_ns(row[OverlapCol.EXPOSED_PER_STEP]))
        parts.append(c)
    if r.bandwidth.height:
        parts.append(_bandwidth_table(r, per_step, top))
    if r.steps.height:
        s = OVERLAP_STEPS_TABLE.table(f"per step ({r.step_marker})")
        for row in r.steps.head(top).iter_rows(named=True):
            s.add_row(str(row[OverlapCol.DEVICE]), row[OverlapCol.STEP], fmt_ns(row[OverlapCol.WINDOW]),
                      fmt_ns(row[OverlapCol.COMPUTE]), fmt_ns(row[OverlapCol.COMM]),
                      fmt_ns(row[OverlapCol.COMM_EXPOSED]), fmt_ns(row[OverlapCol.IDLE]),
                      "yes" if row[OverlapCol.STEADY] else "warm-up")
        parts.append(s)
    if r.note:
        parts.append(Text(f"note: {r.note}", style="yellow"))
    if findings:
        parts.append(render_findings(findings))
    return Group(*parts)


def _device_rows(r: OverlapResult, per_step: bool) -> Iterator[tuple[dict[str, Any], dict[str, Any], int]]:
    """Per device: its row, the row its figures come from (its steady mean per step, or with no
    steps the device's whole-trace row) and that row's window; a device without steady steps
    is left out when the others have them."""
    for d in r.devices.iter_rows(named=True):
        src = d
        if per_step:
            rows = r.steady.filter(pl.col(OverlapCol.DEVICE) == d[OverlapCol.DEVICE])
            if rows.height == 0:
                continue
            src = rows.row(0, named=True)
        yield d, src, src[OverlapCol.WINDOW] if per_step else d[OverlapCol.SPAN]


def _with_share(ns: float, window: float) -> str:
    return f"{fmt_ns(ns)} ({fmt_pct(ns / window if window else None)})"


def _busy_lines(r: OverlapResult, per_step: bool) -> list[str]:
    """Per device, busy split into compute kernels, communication and copies (memcpy and memset):
    a GPU 99% busy with copies is not busy with compute. They may overlap one another."""
    out = []
    for d, src, window in _device_rows(r, per_step):
        if not window:
            continue
        share = {c: fmt_pct(src[c] / window) for c in (OverlapCol.BUSY, OverlapCol.COMPUTE, OverlapCol.COMM,
                                                       OverlapCol.COPY)}
        out.append(f"GPU {d[OverlapCol.DEVICE]} busy {share[OverlapCol.BUSY]}: compute kernels "
                   f"{share[OverlapCol.COMPUTE]}, communication {share[OverlapCol.COMM]}, copies and memsets "
                   f"{share[OverlapCol.COPY]} (they may overlap one another).")
    return out


def _bandwidth_table(r: OverlapResult, per_step: bool, top: int) -> RenderableType:
    """Bus bandwidth per message size (NCCL's formula), against the GPU-to-GPU link's peak."""
    over = f"the {r.steady_steps} steady steps" if per_step else "the trace (no steps)"
    b = BANDWIDTH_TABLE.table(f"collective bandwidth over {over} (bus bandwidth as nccl-tests reports it; link peak "
                              "one direction)")
    for row in r.bandwidth.head(top).iter_rows(named=True):
        bus = row["busbw_bytes_per_s"]
        b.add_row(str(row["device"]), row["op"] or "-", row["process_group"] or "-", str(row["group_size"] or "-"),
                  fmt_bytes(row["msg_bytes"]), str(row["calls"]), fmt_ns(row["time_ns"]),
                  "-" if bus is None else f"{bus / 1e9:.1f}",
                  "-" if row["link"] is None else f"{row['link']} {row['link_bytes_per_s'] / 1e9:.0f} GB/s",
                  fmt_pct(row["link_share"]))
    return b
