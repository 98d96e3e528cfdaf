"""``blocks``: GPU time per step of each annotated block of a trace, or the block timers of an
instrument log, as terminal tables and as JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final, Literal, TypedDict

import polars as pl

from tracewhy.analyses.blocks import BLOCKS_SCHEMA, BlockCol, BlocksResult
from tracewhy.analyses.log_blocks import CAPTURE, GPU, LOG_BLOCKS_TABLE_SCHEMA, LogBlocksCol, LogBlocksResult
from tracewhy.findings.model import Finding
from tracewhy.renderers import View
from tracewhy.renderers.findings import render_findings
from tracewhy.renderers.layout import Layout, label, name, number
from tracewhy.units import fmt_ns, fmt_pct

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tracewhy.renderers.json_schema import rows
    from tracewhy.reports.blocks import BlocksReport, LogBlocksReport


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


# --- an instrument log ---------------------------------------------------------------------------


class LogBlocksPayload(TypedDict):
    """``blocks`` on instrument logs: per rank and block, its time per step (or chunk) over the
    steady window, p50/p90/p99 and its share of the rank's top-level blocks."""

    source: Literal["instrument-log"]
    #: What a value is per: "chunk", "step" or "capture".
    unit: str
    #: What a value is of: "gpu" or "host" time.
    basis: str
    #: Units left out per rank as warm-up.
    warmup: int
    #: Steady units per rank (the rank as a string key).
    steady_units: dict[str, int]
    share_of: str
    #: Written in attribution mode (a synchronize after each block).
    sync: bool
    synced_instances: int
    instances: int
    blocks: Annotated[pl.DataFrame, rows(LOG_BLOCKS_TABLE_SCHEMA, "per rank and block name, most time first")]
    findings: list[Finding]


def log_blocks_payload(r: LogBlocksResult, findings: list[Finding]) -> LogBlocksPayload:
    """``blocks[]``: per rank and name ``total_ns``, ``share``, ``p50_ns`` (p90, p99), ``sync_mode``
    and the rest of LogBlocksCol; ``unit`` (chunk, step or capture) and ``basis`` (gpu or host)
    say what a value is per and of."""
    return {
        "source": "instrument-log", "unit": r.unit, "basis": r.basis, "warmup": r.warmup,
        "steady_units": {str(k): v for k, v in sorted(r.steady_units.items())},
        "share_of": "the top-level blocks' total on the same rank",
        "sync": r.sync, "synced_instances": r.synced_instances, "instances": r.instances,
        "blocks": r.table, "findings": findings,
    }


#: ``blocks`` on an instrument log: a block's time per unit and its share stay; the tail
#: percentiles and the GPU total leave first. The per-unit column is named by the unit.
PER_UNIT: Final = "per unit"
LOG_BLOCKS_TABLE: Final = Layout(
    (number("rank"), name("block"), number("level"), number("calls"), number(PER_UNIT), number("share"),
     number("p50"), number("p90"), number("p99"), number("GPU total"), label("sync", "right")),
    drop=("p99", "p90", "GPU total", "level", "calls", "sync"))


def render_log_blocks(r: LogBlocksResult, findings: list[Finding], top: int) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    basis = "GPU time" if r.basis == GPU else "host time"
    window = "the whole log" if r.unit == CAPTURE else \
        f"steady {r.unit}s after {r.warmup} warm-up per rank: " + \
        ", ".join(f"rank {k} {n}" for k, n in sorted(r.steady_units.items()))
    t = LOG_BLOCKS_TABLE.table(f"block timers, {basis} per {r.unit} ({window})",
                               rename={PER_UNIT: f"per {r.unit}"})
    for row in r.table.head(top).iter_rows(named=True):
        t.add_row(str(row[LogBlocksCol.RANK]), row[LogBlocksCol.NAME], str(row[LogBlocksCol.LEVEL]),
                  str(row[LogBlocksCol.INSTANCES]), fmt_ns(row[LogBlocksCol.PER_UNIT]),
                  fmt_pct(row[LogBlocksCol.SHARE]), fmt_ns(row[LogBlocksCol.P50]), fmt_ns(row[LogBlocksCol.P90]),
                  fmt_ns(row[LogBlocksCol.P99]), fmt_ns(row[LogBlocksCol.GPU_TOTAL]), row[LogBlocksCol.SYNC_MODE])
    parts: list[RenderableType] = [t, Text("share: of the top-level blocks' time on the same rank; p50/p90/p99: "
                                           f"of a block's time per {r.unit}, over the {r.unit}s it ran in",
                                           style="dim")]
    if not r.table.height:
        parts.append(Text("no block records (after the warm-up and --names): nothing to attribute", style="yellow"))
    if findings:
        parts.append(render_findings(findings))
    return Group(*parts)


def blocks_output(r: BlocksReport | LogBlocksReport, top: int) -> tuple[BlocksPayload | LogBlocksPayload, View]:
    """The payload and the view of ``blocks``, of a trace's blocks or of an instrument log's."""
    found = r.findings
    if isinstance(r.result, LogBlocksResult):
        log = r.result
        return log_blocks_payload(log, found), lambda: render_log_blocks(log, found, top)
    trace = r.result
    return blocks_payload(trace, found), lambda: render_blocks(trace, found, top)


#: The block-attribution finding's table: its top blocks, GPU time per step and share.
ATTRIBUTION_TABLE: Final = Layout((name("block"), number("GPU time"), number("share")), look="simple")


def attribution_table(f: Finding) -> RenderableType:
    """The top blocks of a ``block-attribution`` finding (its evidence), one row each."""
    per_step = f.evidence.get("unit") == "per step"
    t = ATTRIBUTION_TABLE.table(rename={"GPU time": "GPU time/step" if per_step else "GPU time (trace)"})
    for b in f.evidence["blocks"]:
        t.add_row(str(b["name"]), fmt_ns(round(b[BlockCol.GPU_TIME_PER_STEP])), fmt_pct(b[BlockCol.GPU_SHARE]))
    return t
