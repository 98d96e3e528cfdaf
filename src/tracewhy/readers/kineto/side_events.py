"""The side tables a batch of Kineto events gives beside its slices: flow arrows (the links
between a launch and its GPU work, or between forward and backward ops) and the allocator's
``[memory]`` instants, each as one frame in the model's schema."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.model.schema import FLOWS_SCHEMA, MEMORY_SCHEMA, FlowCol
from tracewhy.readers.kineto.columns import float_array, int_array, us_to_ns
from tracewhy.readers.kineto.events import Event, MemoryArgs


def _enum_values(column: str) -> pl.Series:
    """The values of a flows column's Enum, in code order, as a column of that Enum."""
    dtype = FLOWS_SCHEMA[column]
    assert isinstance(dtype, pl.Enum)
    return pl.Series(dtype.categories.to_list(), dtype=dtype)


#: A flow's kind and phase columns are gathered from these by code (``FLOW_KIND_CODE``,
#: ``FLOW_PHASE_CODE``): a list of a few distinct strings made into a column and then cast to
#: the Enum cost a third of the flows' columns (82k flows: 80 against 113 ms for the frame).
_FLOW_KINDS, _FLOW_PHASES = _enum_values(FlowCol.KIND), _enum_values(FlowCol.PHASE)
FLOW_KIND_CODE: dict[str, int] = {kind: code for code, kind in enumerate(_FLOW_KINDS.to_list())}
FLOW_PHASE_CODE: dict[str, int] = {phase: code for code, phase in enumerate(_FLOW_PHASES.to_list())}


def flow_frame(evs: list[Event], ts_us: npt.NDArray[np.float64], kind_codes: npt.NDArray[np.uint8]) -> pl.DataFrame:
    """One row per flow event (each of a phase ``FLOW_PHASE_CODE`` has): its id, the link kind its
    category names (``kind_codes``, by ``FLOW_KIND_CODE``), phase, time and thread."""
    phases = np.fromiter(map(FLOW_PHASE_CODE.__getitem__, [e.ph for e in evs]), dtype=np.uint8, count=len(evs))
    return pl.DataFrame([
        pl.Series(FlowCol.FLOW_ID, int_array([e.id for e in evs])),
        _FLOW_KINDS.gather(kind_codes).alias(FlowCol.KIND),
        _FLOW_PHASES.gather(phases).alias(FlowCol.PHASE),
        pl.Series(FlowCol.TS, us_to_ns(ts_us)),
        pl.Series(FlowCol.PID, int_array([e.pid for e in evs])),
        pl.Series(FlowCol.TID, int_array([e.tid for e in evs])),
    ])


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
