"""``memory``: the peak and ledger per device, the ops that allocate most,
a timeline export's ledger at its peak, and a snapshot's peak, live blocks and fragmentation;
as rich tables and as the ``--json`` payload."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final, Literal, TypedDict

from tracewhy.analyses.memory import CHURN_SCHEMA, TOP_OPS_SCHEMA, DeviceMemory, MemoryResult, OpMemCol, TimelineResult
from tracewhy.analyses.memory_growth import SITES_SCHEMA
from tracewhy.analyses.memory_snapshot import (
    LIVE_SCHEMA,
    OOMS_SCHEMA,
    LiveCol,
    OomCol,
    SnapshotDevice,
    SnapshotResult,
)
from tracewhy.findings.model import Finding
from tracewhy.renderers import View
from tracewhy.renderers.layout import FitTable, Layout, label, name, number, step
from tracewhy.units import fmt_bytes, fmt_ns, fmt_pct, printable

if TYPE_CHECKING:
    import polars as pl
    from rich.console import RenderableType

    from tracewhy.renderers.json_schema import rows
    from tracewhy.reports.memory import SnapshotMemoryReport, TimelineMemoryReport, TraceMemoryReport


class DeviceMemoryJson(TypedDict):
    """One device's memory from a profile_memory trace: the peak of the allocator's own totals,
    what was open then, the ledger at it and the churn per step."""

    device: str
    events: int
    peak_allocated_bytes: int
    #: Null where the events carry no Total Reserved (PyTorch < 1.10).
    peak_reserved_bytes: int | None
    reserved_at_peak_bytes: int | None
    #: Reserved but not allocated at the peak.
    slack_at_peak_bytes: int | None
    peak_ts_ns: int
    peak_step: str | None
    #: The outermost CPU op open at the peak.
    peak_op: str | None
    peak_innermost_op: str | None
    peak_annotation: str | None
    #: The step phase at the peak ("optimizer", "backward", "forward"), by the step account's rules; null outside.
    peak_phase: str | None
    #: The innermost frame of the user's code at the peak ("file:line function"); null without with_stack.
    peak_frame: str | None
    #: Innermost first; empty without with_stack.
    peak_python_stack: list[str]
    #: Bytes live at the peak per category.
    ledger: dict[str, int]
    #: Least-squares slope of allocated-at-end over the steady steps.
    growth_bytes_per_step: float | None
    #: Allocated at the end of every steady step above the step before's (a leak's signature).
    rises_every_step: bool
    growth_sites: Annotated[pl.DataFrame, rows(SITES_SCHEMA, "allocation sites whose live bytes rose in every "
                                                             "steady step, most per step first")]
    allocated_source: str
    steps: Annotated[pl.DataFrame, rows(CHURN_SCHEMA, "one row per step window, in time order")]


class MemoryPayload(TypedDict):
    """``memory`` on a profile_memory trace: per device the peak, its context and ledger, and the
    ops that allocate most."""

    input: Literal["trace"]
    #: "inferred": the ledger's categories come from where blocks were allocated.
    ledger_source: str
    note: str | None
    devices: list[DeviceMemoryJson]
    top_ops: Annotated[pl.DataFrame, rows(TOP_OPS_SCHEMA, "per device and outermost op, most bytes first")]
    findings: list[Finding]


class TimelinePayload(TypedDict):
    """``memory`` on a memory-timeline export: the profiler's own categories at the summed peak."""

    input: Literal["memory_timeline"]
    #: The export's layout (its JSON shape).
    layout: str
    events: int
    ledger_source: str
    peak_total_bytes: int
    peak_ts_ns: int | None
    ledger_at_peak: dict[str, int]


class SnapshotFrame(TypedDict):
    filename: str
    line: int
    name: str


class SnapshotDeviceJson(TypedDict):
    """One device of an allocator snapshot: the replayed peak over the recorded window, the live
    blocks at it, and the final state's fragmentation."""

    #: "cuda:N".
    device: str
    events: int
    #: Block sizes as the allocator rounds them: what torch.cuda.max_memory_allocated counts.
    peak_allocated_bytes: int
    #: The peak of the bytes callers asked for (the allocator's requested_bytes).
    peak_requested_bytes: int
    peak_reserved_bytes: int
    reserved_at_peak_bytes: int
    #: The trace entry after which allocated peaked; null: before the window.
    peak_seq: int | None
    peak_ts_ns: int | None
    peak_frames: list[SnapshotFrame]
    #: The step phase of the allocation that reached the peak, from its stack; null when it says none.
    peak_phase: str | None
    live_at_peak: Annotated[pl.DataFrame, rows(LIVE_SCHEMA, "live blocks at the peak by top user frame")]
    final_allocated_bytes: int
    final_requested_bytes: int
    final_reserved_bytes: int
    segments: int
    expandable_segments: int
    free_in_segments_bytes: int
    rounding_waste_bytes: int
    largest_free_block_bytes: int
    ooms: Annotated[pl.DataFrame, rows(OOMS_SCHEMA, "one row per recorded out-of-memory error")]


class SnapshotPayload(TypedDict):
    """``memory`` on a CUDA memory snapshot (read without running it)."""

    input: Literal["snapshot"]
    allocator_settings: dict[str, str | int | float | bool | None]
    devices: list[SnapshotDeviceJson]
    findings: list[Finding]


def memory_payload(r: MemoryResult, findings: list[Finding]) -> MemoryPayload:
    """JSON of a profiler trace's memory: ``devices[]`` (peak, its context, ledger, per-step
    churn) and ``top_ops``; ``ledger_source`` says the ledger is inferred."""
    return {"input": "trace", "ledger_source": r.ledger_source, "note": r.note,
            "devices": [_device_payload(d) for d in r.devices], "top_ops": r.top_ops, "findings": findings}


def _device_payload(d: DeviceMemory) -> DeviceMemoryJson:
    return {
        "device": d.device, "events": d.events, "peak_allocated_bytes": d.peak_allocated_bytes,
        "peak_reserved_bytes": d.peak_reserved_bytes, "reserved_at_peak_bytes": d.reserved_at_peak_bytes,
        "slack_at_peak_bytes": d.slack_at_peak_bytes, "peak_ts_ns": d.peak_ts_ns, "peak_step": d.peak_step,
        "peak_op": d.peak_op, "peak_innermost_op": d.peak_innermost_op, "peak_annotation": d.peak_annotation,
        "peak_phase": d.peak_phase, "peak_frame": d.peak_frame, "peak_python_stack": list(d.peak_python_stack),
        "ledger": d.ledger,
        "growth_bytes_per_step": d.growth_bytes_per_step, "rises_every_step": d.growth.rises_every_step,
        "growth_sites": d.growth.sites, "allocated_source": d.allocated_source, "steps": d.steps,
    }


def timeline_payload(r: TimelineResult, layout: str, events: int) -> TimelinePayload:
    """JSON of a memory-timeline export: the profiler's own categories at the summed peak."""
    return {"input": "memory_timeline", "layout": layout, "events": events, "ledger_source": r.ledger_source,
            "peak_total_bytes": r.peak_total_bytes, "peak_ts_ns": r.peak_ts_ns, "ledger_at_peak": r.ledger_at_peak}


def snapshot_payload(r: SnapshotResult, findings: list[Finding]) -> SnapshotPayload:
    """JSON of an allocator snapshot: per device the replayed peak, its frames, the live blocks
    at it by top user frame, the final fragmentation and OOMs; the allocator settings."""
    return {"input": "snapshot", "allocator_settings": r.allocator_settings,
            "devices": [_snapshot_device_payload(d) for d in r.devices], "findings": findings}


def _snapshot_device_payload(d: SnapshotDevice) -> SnapshotDeviceJson:
    return {
        "device": f"cuda:{d.device}", "events": d.events, "peak_allocated_bytes": d.peak_allocated_bytes,
        "peak_requested_bytes": d.peak_requested_bytes, "peak_reserved_bytes": d.peak_reserved_bytes,
        "reserved_at_peak_bytes": d.reserved_at_peak_bytes,
        "peak_seq": d.peak_seq, "peak_ts_ns": None if d.peak_time_us is None else d.peak_time_us * 1000,
        "peak_frames": [{"filename": f, "line": line, "name": n} for f, line, n in d.peak_frames],
        "peak_phase": d.peak_phase,
        "live_at_peak": d.live_at_peak, "final_allocated_bytes": d.final_allocated_bytes,
        "final_requested_bytes": d.final_requested_bytes, "final_reserved_bytes": d.final_reserved_bytes,
        "segments": d.segments,
        "expandable_segments": d.expandable_segments, "free_in_segments_bytes": d.free_in_segments_bytes,
        "rounding_waste_bytes": d.rounding_waste_bytes, "largest_free_block_bytes": d.largest_free_block_bytes,
        "ooms": d.ooms,
    }


#: ``memory``: the peak, where it was reached and the growth per step stay; the reserved memory
#: and the slack leave a narrow terminal first.
MEMORY_TABLE: Final = Layout(
    (label("device"), number("peak allocated"), number("reserved at peak"), number("slack"), step(), name("op"),
     number("growth/step")),
    drop=("slack", "reserved at peak"))
LEDGER_TABLE: Final = Layout((label("category"), number("bytes"), number("share")))
ALLOCATING_OPS_TABLE: Final = Layout(
    (label("device"), name("op"), number("allocations"), number("frees"), number("allocated"), number("net")),
    drop=("frees", "allocations"))
SNAPSHOT_TABLE: Final = Layout((label("measure"), number("bytes")))
LIVE_TABLE: Final = Layout((name("frame"), number("blocks"), number("bytes"), number("largest")),
                           drop=("largest", "blocks"))


def render_memory(r: MemoryResult, findings: list[Finding], top: int) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    if not r.devices:
        return Text(r.note or "no memory events")
    t = MEMORY_TABLE.table("memory per device (peak of Total Allocated)",
                           f"ledger: bytes live at the peak, {r.ledger_source} (tracewhy memory --json for every step)")
    for d in r.devices:
        t.add_row(d.device, fmt_bytes(d.peak_allocated_bytes), fmt_bytes(d.reserved_at_peak_bytes),
                  fmt_bytes(d.slack_at_peak_bytes), d.peak_step or "-", d.peak_op or "-",
                  "-" if d.growth_bytes_per_step is None else fmt_bytes(int(d.growth_bytes_per_step)))
    parts: list[RenderableType] = [t]
    for d in r.devices:
        parts.append(_ledger_table(f"{d.device} at the peak", d.ledger))
    ops = ALLOCATING_OPS_TABLE.table("ops that allocate most (outermost CPU op on the allocating thread)")
    for row in r.top_ops.head(top).iter_rows(named=True):
        ops.add_row(row[OpMemCol.DEVICE], row[OpMemCol.OP], str(row[OpMemCol.ALLOCATIONS]),
                    str(row[OpMemCol.FREES]), fmt_bytes(row[OpMemCol.BYTES_ALLOCATED]),
                    fmt_bytes(row[OpMemCol.NET_BYTES]))
    parts.append(ops)
    return Group(*parts, *_findings(findings))


def render_timeline(r: TimelineResult, layout: str) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    when = "-" if r.peak_ts_ns is None else fmt_ns(r.peak_ts_ns)
    head = Text(f"memory-timeline export ({layout}): peak {fmt_bytes(r.peak_total_bytes)} at ts {when}")
    return Group(head, _ledger_table("ledger at the peak", r.ledger_at_peak))


def render_snapshot(r: SnapshotResult, findings: list[Finding], top: int) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = []
    for d in r.devices:
        t = SNAPSHOT_TABLE.table(f"cuda:{d.device}: {d.events} trace entries, {d.segments} segments "
                                 f"({d.expandable_segments} expandable)")
        for measure, value in (("peak allocated (window)", d.peak_allocated_bytes),
                             ("peak requested (window)", d.peak_requested_bytes),
                             ("reserved at the peak", d.reserved_at_peak_bytes),
                             ("peak reserved (window)", d.peak_reserved_bytes),
                             ("allocated at the end", d.final_allocated_bytes),
                             ("reserved at the end", d.final_reserved_bytes),
                             ("free inside segments", d.free_in_segments_bytes),
                             ("largest free block", d.largest_free_block_bytes),
                             ("rounding waste", d.rounding_waste_bytes)):
            t.add_row(measure, fmt_bytes(value))
        parts.append(t)
        live = LIVE_TABLE.table("live at the peak, by top user frame")
        for row in d.live_at_peak.head(top).iter_rows(named=True):
            live.add_row(row[LiveCol.FRAME], str(row[LiveCol.BLOCKS]), fmt_bytes(row[LiveCol.BYTES]),
                         fmt_bytes(row[LiveCol.LARGEST]))
        parts.append(live)
        for row in d.ooms.iter_rows(named=True):
            parts.append(Text(f"OOM: asked for {fmt_bytes(row[OomCol.REQUESTED])} with "
                              f"{fmt_bytes(row[OomCol.DEVICE_FREE])} free on the device, "
                              f"at {printable(row[OomCol.FRAME])}"))
    settings = ", ".join(f"{k}={v}" for k, v in sorted(r.allocator_settings.items()))
    parts.append(Text(f"allocator settings: {printable(settings) or 'not recorded'}"))
    return Group(*parts, *_findings(findings))


def _ledger_table(title: str, ledger: dict[str, int]) -> FitTable:
    total = sum(ledger.values())
    t = LEDGER_TABLE.table(title)
    for category, nbytes in sorted(ledger.items(), key=lambda kv: (-kv[1], kv[0])):
        if nbytes:
            t.add_row(category, fmt_bytes(nbytes), fmt_pct(nbytes / total if total else None))
    return t


def _findings(findings: list[Finding]) -> list[RenderableType]:
    from rich.text import Text

    return [Text(f"[{f.code}] {printable(f.statement)} {printable(f.next_step)}") for f in findings]


def memory_output(r: TraceMemoryReport | SnapshotMemoryReport | TimelineMemoryReport, top: int
                  ) -> tuple[MemoryPayload | SnapshotPayload | TimelinePayload, View]:
    """The payload and the view of ``memory``, for whichever input it read."""
    if isinstance(r.result, SnapshotResult):
        snap, found = r.result, r.findings
        return snapshot_payload(snap, found), lambda: render_snapshot(snap, found, top)
    if isinstance(r.result, TimelineResult):
        tl, layout, events = r.result, r.layout, r.events
        return timeline_payload(tl, layout, events), lambda: render_timeline(tl, layout)
    result, findings = r.result, r.findings
    return memory_payload(result, findings), lambda: render_memory(result, findings, top)
