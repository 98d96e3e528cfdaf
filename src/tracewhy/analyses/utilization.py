"""GPU busy and idle time per device: the union of kernels, copies and memsets over all streams,
as a share of the trace's span (``trace_span``, the span ``info`` reports too)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.intervals import union
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, Kind
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]
DEFAULT_BINS = 200
#: The series holds at most this many rows: past 25 devices each gets fewer bins (at least
#: ``MIN_BINS``). 2,000 devices of one kernel each (1.6 MB of JSON) made 400,000 rows, a 52 MB
#: HTML report and a minute of binning; a node has at most a few dozen GPUs.
MAX_SERIES_ROWS = 5_000
MIN_BINS = 2


@dataclass(frozen=True)
class DeviceBusy:
    """Merged busy intervals of one device, sorted and disjoint."""

    device: int
    starts: I64
    ends: I64

    def busy_in(self, lo: int, hi: int) -> int:
        """Busy nanoseconds inside [lo, hi)."""
        if hi <= lo or self.starts.size == 0:
            return 0
        s = np.clip(self.starts, lo, hi)
        e = np.clip(self.ends, lo, hi)
        return int((e - s).sum())

    def busy_before(self, times: I64) -> I64:
        """Busy nanoseconds before each of ``times``: the intervals that start at or before it, all
        whole but the last (sorted and disjoint, the others end before it starts), and the last up
        to it. ``busy_before(z) - busy_before(a)`` is ``busy_in(a, z)``: many bins in one pass."""
        if self.starts.size == 0:
            return np.zeros(len(times), dtype=np.int64)
        whole = np.concatenate([[0], np.cumsum(self.ends - self.starts)])
        k = np.searchsorted(self.starts, times, side="right")
        last = np.maximum(k - 1, 0)
        before: I64 = np.where(k > 0, whole[last] + np.minimum(self.ends[last], times) - self.starts[last], 0)
        return before


#: ``UtilizationResult.devices``: one row per device; span_ns is the trace's (``trace_span``).
UTILIZATION_DEVICES_SCHEMA: Final = pl.Schema({Col.DEVICE: pl.Int32(), "busy_ns": pl.Int64(), "span_ns": pl.Int64(),
                                               "active_share": pl.Float64()})
#: ``UtilizationResult.series``: the busy share of each bin of time, per device (for plots), and
#: the share of it that kernels, copies and memsets each run (they may overlap one another).
UTILIZATION_SERIES_SCHEMA: Final = pl.Schema({Col.DEVICE: pl.Int32(), "start_ns": pl.Int64(), "end_ns": pl.Int64(),
                                              "busy_share": pl.Float64(), "kernels_share": pl.Float64(),
                                              "copies_share": pl.Float64(), "memsets_share": pl.Float64()})


@dataclass(frozen=True)
class UtilizationResult:
    """``devices`` (UTILIZATION_DEVICES_SCHEMA): one row per device with busy_ns, span_ns (the
    trace's span, ``trace_span``) and active_share; ``series`` (UTILIZATION_SERIES_SCHEMA):
    binned busy share over that span per device (for plots)."""

    busy: dict[int, DeviceBusy]
    devices: pl.DataFrame
    series: pl.DataFrame


def trace_span(trace: Trace) -> tuple[int, int] | None:
    """The trace's first start and last end over every slice (None: no slices): the span ``info``
    reports and utilization is a share of. Host work before the first kernel, or after the last,
    is time the GPU was idle too: a device's own first-to-last span called a lone 20 ns kernel
    in a 130 ns trace 100% busy."""
    s = trace.slices
    if s.height == 0:
        return None
    lo, hi = s.select(pl.col(Col.TS).min().alias("lo"), (pl.col(Col.TS) + pl.col(Col.DUR)).max().alias("hi")).row(0)
    return int(lo), int(hi)


def device_busy(trace: Trace, kinds: tuple[Kind, ...] = GPU_ACTIVITY_KINDS) -> dict[int, DeviceBusy]:
    """Busy intervals per device over the given kinds (default: kernels, copies and memsets)."""
    gpu = trace.of_kind(*kinds).select(Col.DEVICE, Col.TS, Col.DUR)
    out: dict[int, DeviceBusy] = {}
    for (device,), part in gpu.group_by(Col.DEVICE, maintain_order=False):
        ts = part.get_column(Col.TS).to_numpy()
        s, e = union(ts, ts + part.get_column(Col.DUR).to_numpy())
        out[int(device)] = DeviceBusy(int(device), s, e)
    return dict(sorted(out.items()))


def utilization(trace: Trace, bins: int = DEFAULT_BINS) -> UtilizationResult:
    busy = device_busy(trace)
    by_part = [device_busy(trace, kinds) for kinds in BUSY_PARTS.values()]
    rows = []
    series = []
    bounds = trace_span(trace)
    bins = min(bins, max(MIN_BINS, MAX_SERIES_ROWS // max(len(busy), 1)))
    for device, b in busy.items():
        if b.starts.size == 0 or bounds is None:
            continue
        lo, hi = bounds
        span = max(hi - lo, 1)
        total = int((b.ends - b.starts).sum())
        rows.append((device, total, hi - lo, total / span))
        edges = np.linspace(lo, hi, bins + 1).astype(np.int64)
        # Each series' busy time in every bin from its running total at the edges (one clip of
        # every interval per bin and series was most of a report's utilization time).
        per_bin = [np.diff(x.busy_before(edges)).tolist() if x is not None else None
                   for x in (b, *(p.get(device) for p in by_part))]
        for k in range(bins):
            a, z = int(edges[k]), int(edges[k + 1])
            span_ab = max(z - a, 1)
            series.append((device, a, z, *(busy[k] / span_ab if busy is not None else 0.0 for busy in per_bin)))
    devices = pl.DataFrame(rows, schema=UTILIZATION_DEVICES_SCHEMA, orient="row")
    table = pl.DataFrame(series, schema=UTILIZATION_SERIES_SCHEMA, orient="row")
    return UtilizationResult(busy=busy, devices=devices, series=table)


#: What a device's busy time is made of, each measured apart: kernels, copies (memcpy) and memsets.
BUSY_PARTS: Final = {"kernels": (Kind.KERNEL,), "copies": (Kind.MEMCPY,), "memsets": (Kind.MEMSET,)}


def busy_split(trace: Trace, device: int, windows: Sequence[tuple[int, int]]) -> dict[str, int]:
    """The mean time per window that ``device`` runs kernels, copies and memsets (BUSY_PARTS),
    each the union of its own activities: they may run at once, so together they can exceed the
    device's busy time. Windows are (start_ns, end_ns)."""
    out: dict[str, int] = {}
    for part, kinds in BUSY_PARTS.items():
        busy = device_busy(trace, kinds).get(device)
        total = sum(busy.busy_in(lo, hi) for lo, hi in windows) if busy is not None else 0
        out[part] = round(total / max(len(windows), 1))
    return out
