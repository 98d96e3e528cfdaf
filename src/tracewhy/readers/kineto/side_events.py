"""The side tables a batch of Kineto events gives beside its slices: flow arrows (the links
between a launch and its GPU work, or between forward and backward ops) and the allocator's
``[memory]`` instants, each as one frame in the model's schema."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.model.schema import FLOWS_SCHEMA, MEMORY_SCHEMA
from tracewhy.readers.kineto.columns import float_array, int_array, us_to_ns
from tracewhy.readers.kineto.events import Event, MemoryArgs


def flow_frame(evs: list[Event], ts_us: npt.NDArray[np.float64], kinds: list[str]) -> pl.DataFrame:
    """One row per flow event: its id, the link kind its category names, phase, time and thread."""
    return pl.DataFrame({
        "flow_id": int_array([e.id for e in evs]),
        "kind": kinds,
        "phase": [e.ph for e in evs],
        "ts_ns": us_to_ns(ts_us),
        "pid": int_array([e.pid for e in evs]),
        "tid": int_array([e.tid for e in evs]),
    }).cast(dict(FLOWS_SCHEMA))  # type: ignore[arg-type]


def memory_frame(mem: list[Event], args: list[MemoryArgs]) -> pl.DataFrame:
    """One row per ``[memory]`` instant with usable args: where, how many bytes, and the totals."""
    return pl.DataFrame({
        "ts_ns": us_to_ns(float_array([e.ts for e in mem])),
        "pid": int_array([e.pid for e in mem]),
        "tid": int_array([e.tid for e in mem]),
        "device_type": [a.device_type for a in args],
        "device_id": [a.device_id for a in args],
        "bytes": [a.mem_bytes for a in args],
        "total_allocated": [a.total_allocated for a in args],
        "total_reserved": [a.total_reserved for a in args],
        "addr": [a.addr for a in args],
    }, schema=MEMORY_SCHEMA)
