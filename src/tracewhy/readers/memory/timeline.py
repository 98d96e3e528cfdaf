"""PyTorch's memory-timeline exports (``prof.export_memory_timeline(path)``), plain or gzip, as
one table of live bytes per category over time.

Two layouts, told apart by content (torch 2.x, ``torch/profiler/_memory_profiler.py``):

- ``.json`` / ``.json.gz``: ``[times, sizes]``; ``times`` in microseconds, ``sizes[k]`` the
  bytes live after every event at ``times[k]``, one column per category after a leading column
  that is always 0 (the writer indexes categories from 1).
- ``.raw.json.gz``: a list of ``[ts_ns, action, bytes, category]`` rows, one per event, bytes
  signed (a free is negative), ``ts_ns`` -1 for memory that existed before profiling.

In both, the category columns come in ``_CATEGORY_TO_COLORS`` order (PARAMETER,
OPTIMIZER_STATE, INPUT, TEMPORARY, ACTIVATION, GRADIENT, AUTOGRAD_DETAIL, unknown), not in the
order of the ``Category`` enum.

Refused (one line naming the file): a value outside int64, nesting deeper than the decoder
takes, times that pass int64 once converted to ns, running totals or sums that pass int64.
Negative live bytes, which no export can hold, are shown as they are with a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.errors import TraceError
from tracewhy.model.memory_timeline import (
    EXPORT_CATEGORIES,
    TIMELINE_SCHEMA,
    MemoryTimeline,
    TimelineCol,
    TimelineLayout,
)
from tracewhy.readers.limits import (
    Int64,
    Int64Overflow,
    checked_cumsum,
    checked_multiply,
    checked_sum,
    decode_json_bounded,
)
from tracewhy.readers.source import os_error, read_bytes

_SIZES = msgspec.json.Decoder(tuple[list[Int64], list[list[Int64]]])
_RAW = msgspec.json.Decoder(list[tuple[Int64, Int64, Int64, Int64]])
_ANY: msgspec.json.Decoder[list[Any]] = msgspec.json.Decoder(list[Any])
#: Columns of a ``sizes`` row: the unused leading 0, then one per category.
_SIZES_WIDTH = len(EXPORT_CATEGORIES) + 1


def read_memory_timeline(path: str | Path) -> MemoryTimeline:
    """Read either layout; a TraceError names what is wrong with a file that is neither."""
    p = Path(path)
    try:
        buf = read_bytes(p)
    except OSError as e:
        raise os_error(p, e) from None
    try:
        top = decode_json_bounded(_ANY, buf, p)
    except msgspec.DecodeError as e:
        raise TraceError(p, f"not valid JSON ({e})") from None
    try:
        if len(top) == 2 and top and isinstance(top[1], list) and (not top[1] or isinstance(top[1][0], list)):
            return _read_sizes(p, buf)
        return _read_raw(p, buf)
    except Int64Overflow as e:
        raise TraceError(p, f"memory timeline: {e} (no real export comes near)") from None


def _read_sizes(path: Path, buf: bytes | bytearray) -> MemoryTimeline:
    try:
        times, sizes = _SIZES.decode(buf)
    except msgspec.DecodeError as e:
        raise TraceError(path, f"not a memory-timeline [times, sizes] export ({_reason(e)})") from None
    if len(times) != len(sizes):
        raise TraceError(path, f"memory timeline has {len(times)} times but {len(sizes)} size rows")
    if any(len(row) != _SIZES_WIDTH for row in sizes):
        raise TraceError(path, f"memory timeline size rows must have {_SIZES_WIDTH} columns (0, then one per category)")
    ts = checked_multiply(np.asarray(times, dtype=np.int64), 1000)  # the writer converted ns to us
    values = np.asarray(sizes, dtype=np.int64).reshape(len(sizes), _SIZES_WIDTH)[:, 1:]
    return MemoryTimeline(str(path), TimelineLayout.SIZES, _table(ts, values), len(times), _negative(path, values))


def _read_raw(path: Path, buf: bytes | bytearray) -> MemoryTimeline:
    try:
        rows = _RAW.decode(buf)
    except msgspec.DecodeError as e:
        raise TraceError(path, f"not a memory-timeline export: expected [times, sizes] or "
                               f"[ts, action, bytes, category] rows ({_reason(e)})") from None
    n = len(rows)
    a = np.asarray(rows, dtype=np.int64).reshape(n, 4)
    ts, nbytes, category = a[:, 0], a[:, 2], a[:, 3]
    if n and (category.min() < 0 or category.max() >= len(EXPORT_CATEGORIES)):
        raise TraceError(path, f"memory timeline category outside 0..{len(EXPORT_CATEGORIES) - 1}")
    deltas = np.zeros((n, len(EXPORT_CATEGORIES)), dtype=np.int64)
    deltas[np.arange(n), category] = nbytes
    live = checked_cumsum(deltas, axis=0)
    # Pre-existing memory (ts -1) is placed at the first real time, as torch's own plot does;
    # then only the state after the last event of each instant is kept, as the sizes layout does.
    real = ts[ts >= 0]
    ts = np.where(ts < 0, real.min() if real.size else 0, ts)
    last = np.r_[ts[1:] != ts[:-1], True] if n else np.zeros(0, dtype=bool)
    return MemoryTimeline(str(path), TimelineLayout.RAW, _table(ts[last], live[last]), n, _negative(path, live))


def _table(ts: npt.NDArray[np.int64], values: npt.NDArray[np.int64]) -> pl.DataFrame:
    columns: dict[str, Any] = {TimelineCol.TS: ts}
    for i, name in enumerate(TimelineCol.CATEGORIES):
        columns[name] = values[:, i]
    columns[TimelineCol.TOTAL] = checked_sum(values, axis=1) if values.size else np.zeros(0, dtype=np.int64)
    return pl.DataFrame(columns, schema=TIMELINE_SCHEMA)


def _negative(path: Path, live: npt.NDArray[np.int64]) -> tuple[str, ...]:
    """One warning when some category's live bytes are negative (more freed than allocated)."""
    count = int((live < 0).sum())
    if not count:
        return ()
    return (f"{path}: {count} live-byte values are negative (lowest {int(live.min())}): an export cannot hold "
            "negative live memory; they are shown as they are",)


def _reason(e: msgspec.DecodeError) -> str:
    text = str(e)
    if "Expected `int` <=" in text or "Expected `int` >=" in text:
        return f"a value outside the 64-bit integers at {text.rpartition(' - at ')[2]}"
    return text
