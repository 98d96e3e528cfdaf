"""Terminal tables and JSON payloads for ``overlap``, ``blocks`` and ``ranks``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final, TypedDict

import polars as pl

from tracewhy.analyses.blocks import BLOCKS_SCHEMA, BlockCol, BlocksResult
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
from tracewhy.analyses.rank_compare import (
    DOING_SCHEMA,
    LATENESS_SCHEMA,
    MATCHED_SCHEMA,
    MISMATCHES_SCHEMA,
    RANKS_SCHEMA,
    RanksResult,
)
from tracewhy.findings.model import Finding, Severity
from tracewhy.renderers.layout import Layout, label, name, number, step, text
from tracewhy.units import fmt_ns, fmt_pct, indented, printable

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tracewhy.renderers.json_schema import rows


def render_findings(findings: list[Finding]) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = []
    for f in findings:
        style = "bold red" if f.severity is Severity.HIGH else "yellow" if f.severity is Severity.TRUST else "bold"
        parts.append(Text(f"[{f.severity.value}] {f.code}: {printable(f.statement)}", style=style))
        parts.append(indented(Text(f"next: {printable(f.next_step)}", style="dim"), 4))
    return Group(*parts)


# --- overlap ----------------------------------------------------------------------------------


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
    findings: list[Finding]


def overlap_payload(r: OverlapResult, findings: list[Finding]) -> OverlapPayload:
    """The JSON of ``overlap``. ``steady`` rows are means per steady step; ``collectives`` rows are
    totals over ``collectives_over`` but for ``exposed_ns_per_step``."""
    return {
        "step_marker": r.step_marker, "steady_steps": r.steady_steps, "note": r.note, "devices": r.devices,
        "steady": r.steady, "steps": r.steps, "collectives": r.collectives, "streams": r.streams,
        "collectives_over": f"{r.steady_steps} steady steps" if r.steady.height else "the whole trace",
        "concurrency": r.concurrency, "findings": findings,
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
    for d in r.devices.iter_rows(named=True):
        src = d
        if per_step:
            rows = r.steady.filter(pl.col(OverlapCol.DEVICE) == d[OverlapCol.DEVICE])
            if rows.height == 0:
                continue
            src = rows.row(0, named=True)
        window = src[OverlapCol.WINDOW] if per_step else d[OverlapCol.SPAN]
        comm = src[OverlapCol.COMM]
        t.add_row(
            str(d[OverlapCol.DEVICE]), fmt_ns(window), _with_share(src[OverlapCol.COMPUTE], window), fmt_ns(comm),
            fmt_pct(src[OverlapCol.COMM_HIDDEN] / comm if comm else None),
            _with_share(src[OverlapCol.COMM_EXPOSED], window), _with_share(src[OverlapCol.COPY_EXPOSED], window),
            _with_share(src[OverlapCol.IDLE], window),
            f"{d[OverlapCol.STREAMS]} ({d[OverlapCol.MAX_STREAMS_ACTIVE]})",
        )
    parts.append(t)
    if r.collectives.height:
        over = f"the {r.steady_steps} steady steps" if per_step else "the trace (no steps)"
        c = COLLECTIVES_TABLE.table(f"collectives over {over}, most exposed first")
        for row in r.collectives.head(top).iter_rows(named=True):
            c.add_row(str(row[OverlapCol.DEVICE]), row[OverlapCol.COLLECTIVE],
                      str(row[OverlapCol.COUNT]), fmt_ns(row[OverlapCol.TIME]), fmt_ns(row[OverlapCol.HIDDEN]),
                      fmt_ns(row[OverlapCol.EXPOSED]), fmt_ns(row[OverlapCol.EXPOSED_PER_STEP]))
        parts.append(c)
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


def _with_share(ns: float, window: float) -> str:
    return f"{fmt_ns(ns)} ({fmt_pct(ns / window if window else None)})"


# --- blocks -----------------------------------------------------------------------------------


class BlocksPayload(TypedDict):
    """``blocks`` on a trace: GPU time per steady step of each annotated block."""

    step_marker: str
    #: Steady steps the per-step figures are over.
    steps: int
    gpu_time_ns_per_step: float
    #: Share of blocks with GPU work that a synchronize ended; null without such blocks.
    synced_share: float | None
    #: The synchronize calls that ended a block (each once), over the steady steps (or the whole capture).
    ending_syncs: int
    note: str | None
    blocks: Annotated[pl.DataFrame, rows(BLOCKS_SCHEMA, "one row per block name, most GPU time first")]
    findings: list[Finding]


def blocks_payload(r: BlocksResult, findings: list[Finding]) -> BlocksPayload:
    return {
        "step_marker": r.step_marker, "steps": r.steps, "gpu_time_ns_per_step": r.gpu_time_ns_per_step,
        "synced_share": r.synced_share, "ending_syncs": r.ending_syncs, "note": r.note, "blocks": r.table,
        "findings": findings,
    }


#: ``blocks``: a block's GPU time and share stay; the spread over threads and the span leave first.
BLOCKS_TABLE: Final = Layout(
    (name("block"), number("level"), number("calls"), number("CPU"), number("GPU time"), number("share"),
     number("GPU span"), number("other threads"), label("synced", "right")),
    drop=("other threads", "GPU span", "level", "calls", "synced", "CPU"))


def render_blocks(r: BlocksResult, findings: list[Finding], top: int) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    unit = "per capture" if r.per_capture else "per step"
    t = BLOCKS_TABLE.table(f"annotated blocks, GPU time {unit} ({r.steps} steady steps, "
                           f"{fmt_ns(r.gpu_time_ns_per_step)} GPU time {unit})")
    for row in r.table.head(top).iter_rows(named=True):
        gpu = row[BlockCol.GPU_INSTANCES]
        synced = f"{row[BlockCol.SYNCED_INSTANCES]}/{gpu}" if gpu else "-"
        t.add_row(row[BlockCol.NAME], str(row[BlockCol.LEVEL]), str(row[BlockCol.INSTANCES]),
                  fmt_ns(row[BlockCol.CPU_PER_STEP]), fmt_ns(row[BlockCol.GPU_TIME_PER_STEP]),
                  fmt_pct(row[BlockCol.GPU_SHARE]), fmt_ns(row[BlockCol.GPU_SPAN_PER_STEP]),
                  fmt_ns(row[BlockCol.OTHER_THREADS_GPU_PER_STEP]), synced)
    parts: list[RenderableType] = [t]
    if r.note:
        parts.append(Text(f"note: {r.note}", style="yellow"))
    if findings:
        parts.append(render_findings(findings))
    return Group(*parts)


# --- ranks ------------------------------------------------------------------------------------


class RanksPayload(TypedDict):
    """``ranks``: per rank step time, compute, exposed communication, idle and input; the straggler
    and what it was doing while the others waited; collectives the ranks did not issue alike."""

    #: Where the per-rank work ran (this process, a pool of N workers, a Dask scheduler).
    executor: str
    #: The rank the others waited for longest; null when none did.
    straggler: int | None
    straggler_last_share: float | None
    straggler_wait_share: float | None
    straggler_doing: Annotated[pl.DataFrame, rows(DOING_SCHEMA, "what the straggler's step thread was doing while "
                                                                "the others waited")]
    straggler_doing_window_ns_per_step: float
    #: Steps matched across ranks (0: compared per capture).
    steps_compared: int
    notes: list[str]
    ranks: Annotated[pl.DataFrame, rows(RANKS_SCHEMA, "one row per rank")]
    matched: Annotated[pl.DataFrame, rows(MATCHED_SCHEMA, "one row per collective call matched across ranks")]
    lateness: Annotated[pl.DataFrame, rows(LATENESS_SCHEMA, "per rank and step: what it waited, and what the "
                                                            "others waited for it")]
    mismatches: Annotated[pl.DataFrame, rows(MISMATCHES_SCHEMA, "collectives the ranks did not issue alike")]
    findings: list[Finding]


def ranks_payload(r: RanksResult, findings: list[Finding], executor: str) -> RanksPayload:
    return {
        "executor": executor, "straggler": r.straggler, "straggler_last_share": r.straggler_last_share,
        "straggler_wait_share": r.straggler_wait_share, "straggler_doing": r.doing,
        "straggler_doing_window_ns_per_step": r.doing_window_ns_per_step, "steps_compared": r.steps_compared,
        "notes": list(r.notes), "ranks": r.ranks, "matched": r.matched,
        "lateness": r.lateness, "mismatches": r.mismatches, "findings": findings,
    }


#: ``ranks``: the step time, the exposed communication and who waited for whom stay; the call
#: count and the spread leave first.
RANKS_TABLE: Final = Layout(
    (label("rank", "right"), number("step p50"), number("step p90"), number("compute"), number("exposed comm"),
     number("idle"), number("input"), number("calls"), number("waited"), number("last at"),
     number("others waited for it")),
    drop=("calls", "last at", "input", "step p90", "idle", "compute"))
DOING_TABLE: Final = Layout((label("kind"), name("innermost open"), number("time"), number("share")))
MISMATCHES_TABLE: Final = Layout((label("step"), label("group"), name("op"), label("kind"), text("detail")))


def render_ranks(r: RanksResult, findings: list[Finding], top: int) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    per = (f"per steady step ({r.steps_compared} steps matched)" if r.steps_compared
           else "per capture (no common steps)")
    t = RANKS_TABLE.table(f"{r.ranks.height} ranks; {per}")
    for row in r.ranks.iter_rows(named=True):
        rank = f"{row['rank']} (incomplete)" if row["incomplete"] else str(row["rank"])
        t.add_row(
            rank, fmt_ns(row["step_p50_ns"]), fmt_ns(row["step_p90_ns"]),
            fmt_ns(row["compute_ns_per_step"]), fmt_ns(row["comm_exposed_ns_per_step"]),
            fmt_ns(row["idle_ns_per_step"]),
            fmt_ns(row["input_ns_per_step"]), str(row["calls"]), fmt_ns(row["wait_ns_per_step"]),
            str(row["last_count"]), fmt_ns(row["late_ns_per_step"]),
        )
    parts: list[RenderableType] = [t]
    if r.straggler is not None and r.straggler_wait_share is not None:
        parts.append(Text(f"straggler (the others waited longest for it): rank {r.straggler}, "
                          f"{fmt_pct(r.straggler_wait_share)} of all waiting; last at "
                          f"{fmt_pct(r.straggler_last_share)} of matched collectives"))
    if r.doing.height:
        d = DOING_TABLE.table(f"what rank {r.straggler}'s step thread was doing while the others waited "
                              f"({fmt_ns(r.doing_window_ns_per_step)} per step)")
        for (kind,), g in r.doing.group_by("kind", maintain_order=True):
            for row in g.head(3).iter_rows(named=True):
                d.add_row(str(kind), row["name"], fmt_ns(row["ns_per_step"]), fmt_pct(row["share"]))
        parts.append(d)
    if r.mismatches.height:
        m = MISMATCHES_TABLE.table("collectives the ranks did not issue alike")
        for row in r.mismatches.head(top).iter_rows(named=True):
            m.add_row(str(row["step"]), row["process_group"] or "-", row["op"] or "-", row["kind"], row["detail"])
        parts.append(m)
    for note in r.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    if findings:
        parts.append(render_findings(findings))
    return Group(*parts)
