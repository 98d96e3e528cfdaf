"""CUDA caching-allocator snapshots as tables: the segments and blocks at the end, the recorded
trace entries, and the stacks they refer to (``readers/memory`` reads the pickles into these)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl

#: A stack frame: (filename, line, function name), innermost first as the allocator records them.
Frame = tuple[str, int, str]
Scalar = str | int | float | bool | None


class SegCol:
    """Columns of ``MemorySnapshot.segments``: one row per cudaMalloc'd segment at the end."""

    DEVICE: Final = "device"
    ADDRESS: Final = "address"
    TOTAL_SIZE: Final = "total_size"
    ALLOCATED_SIZE: Final = "allocated_size"
    STREAM: Final = "stream"
    SEGMENT_TYPE: Final = "segment_type"  # "small" or "large"
    EXPANDABLE: Final = "is_expandable"


class SnapshotBlockCol:
    """Columns of ``MemorySnapshot.blocks``: one row per block of a segment at the end."""

    DEVICE: Final = "device"
    SEGMENT: Final = "segment_address"
    ADDRESS: Final = "address"
    SIZE: Final = "size"
    REQUESTED: Final = "requested_size"
    STATE: Final = "state"  # active_allocated, active_awaiting_free, inactive
    STACK: Final = "stack"  # index into MemorySnapshot.stacks, -1 without frames


class EventCol:
    """Columns of ``MemorySnapshot.events``: the recorded trace entries, per device in order."""

    DEVICE: Final = "device"
    SEQ: Final = "seq"  # position in its device's trace
    ACTION: Final = "action"  # alloc, free_requested, free_completed, segment_alloc, segment_free,
    #                           segment_map, segment_unmap, oom, snapshot
    ADDR: Final = "addr"
    SIZE: Final = "size"
    STREAM: Final = "stream"
    TIME_US: Final = "time_us"  # null where torch did not record it (before 2.2)
    DEVICE_FREE: Final = "device_free"  # oom only: what CUDA still reported free
    STACK: Final = "stack"


SEGMENTS_SCHEMA: Final = pl.Schema({
    SegCol.DEVICE: pl.Int64(), SegCol.ADDRESS: pl.Int64(), SegCol.TOTAL_SIZE: pl.Int64(),
    SegCol.ALLOCATED_SIZE: pl.Int64(), SegCol.STREAM: pl.Int64(), SegCol.SEGMENT_TYPE: pl.String(),
    SegCol.EXPANDABLE: pl.Boolean(),
})
BLOCKS_SCHEMA: Final = pl.Schema({
    SnapshotBlockCol.DEVICE: pl.Int64(), SnapshotBlockCol.SEGMENT: pl.Int64(), SnapshotBlockCol.ADDRESS: pl.Int64(),
    SnapshotBlockCol.SIZE: pl.Int64(), SnapshotBlockCol.REQUESTED: pl.Int64(), SnapshotBlockCol.STATE: pl.String(),
    SnapshotBlockCol.STACK: pl.Int64(),
})
EVENTS_SCHEMA: Final = pl.Schema({
    EventCol.DEVICE: pl.Int64(), EventCol.SEQ: pl.Int64(), EventCol.ACTION: pl.String(), EventCol.ADDR: pl.Int64(),
    EventCol.SIZE: pl.Int64(), EventCol.STREAM: pl.Int64(), EventCol.TIME_US: pl.Int64(),
    EventCol.DEVICE_FREE: pl.Int64(), EventCol.STACK: pl.Int64(),
})


@dataclass(frozen=True)
class MemorySnapshot:
    """A snapshot's final state (``segments``, ``blocks``), its recorded history (``events``),
    the stacks those rows refer to, and the allocator's settings as the file gives them."""

    path: str
    segments: pl.DataFrame
    blocks: pl.DataFrame
    events: pl.DataFrame
    stacks: tuple[tuple[Frame, ...], ...]
    allocator_settings: dict[str, Scalar]
