"""What a trace is: format, versions, devices, ranks, capture options, counts and span."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict, cast

import polars as pl

from tracewhy.analyses.steps import StepsOptions, StepsResult, steps
from tracewhy.analyses.utilization import trace_span
from tracewhy.model.schema import Col, DeviceCol
from tracewhy.model.trace import Capture, Trace
from tracewhy.rows import Rows


class InfoDevice(TypedDict):
    """A device the trace describes (DeviceCol's columns of that name); null where the file does not say."""

    device: int
    name: str | None
    total_global_mem_bytes: int | None
    compute_major: int | None
    compute_minor: int | None
    num_sms: int | None


@dataclass(frozen=True)
class InfoResult(Rows, rows="devices"):
    path: str
    format: str
    schema_version: int | None
    versions: dict[str, str]
    devices: list[InfoDevice]
    rank: int | None
    world_size: int | None
    backend: str | None
    capture: Capture
    slices_by_kind: dict[str, int]
    memory_events: int
    flow_events: int
    step_count: int
    step_marker: str
    first_ts_ns: int | None
    last_end_ns: int | None
    span_ns: int
    display_time_unit: str | None
    base_time_ns: int | None
    warnings: tuple[str, ...] = field(default_factory=tuple)
    #: The accelerator backend of the device work (TraceMeta.accelerator): "CUDA", "XPU", "MTIA"...
    accelerator: str | None = None


def quantised_times(step_ns: int) -> str:
    return (f"start times are epoch-based microseconds with fractions, which a float64 holds only to "
            f"{step_ns} ns: they are quantised to {step_ns} ns steps (durations are exact)")


def info(trace: Trace, step_marker: str | None = None, steps_result: StepsResult | None = None) -> InfoResult:
    """What the trace is; ``steps_result``: its steps under ``step_marker`` and the default warm-up,
    when the caller has them already (the report's diagnosis does)."""
    trace.require_whole()
    m = trace.meta
    s = trace.slices
    by_kind = (
        s.group_by(Col.KIND).len().with_columns(pl.col(Col.KIND).cast(pl.String)).sort(Col.KIND)
    )
    first, last = trace_span(trace) or (None, None)
    if steps_result is None:
        steps_result = steps(trace, StepsOptions(marker=step_marker))
    backend = m.distributed.get("backend")
    return InfoResult(
        path=m.path,
        format=m.format,
        schema_version=m.schema_version,
        versions=dict(m.versions),
        devices=cast(list[InfoDevice], trace.devices.select(DeviceCol.DEVICE, DeviceCol.NAME, DeviceCol.TOTAL_MEM,
                                                            DeviceCol.CC_MAJOR,
                                                            DeviceCol.CC_MINOR, DeviceCol.NUM_SMS).to_dicts()),
        rank=m.rank,
        world_size=m.world_size,
        backend=backend if isinstance(backend, str) else None,
        capture=m.capture,
        slices_by_kind={k: int(v) for k, v in by_kind.iter_rows()},
        memory_events=trace.memory.height,
        flow_events=trace.flows.height,
        step_count=steps_result.table.height,
        step_marker=steps_result.marker,
        first_ts_ns=first,
        last_end_ns=last,
        span_ns=(last - first) if first is not None and last is not None else 0,
        display_time_unit=m.display_time_unit,
        base_time_ns=m.base_time_ns,
        warnings=m.warnings + ((quantised_times(m.ts_step_ns),) if m.ts_step_ns else ()),
        accelerator=m.accelerator,
    )

