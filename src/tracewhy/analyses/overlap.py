"""Is the overlap real: per device, time in compute, communication, copies and memsets; how much
communication runs under compute (hidden) and how much alone (exposed); the same per step;
and how many streams run at once.

Every GPU activity falls in one category (``overlap_activities``): compute, communication,
copy or memset. Within a window the device timeline splits into four disjoint parts that add up
to the window:

    compute (union of compute kernels)
    + exposed communication (communication with no compute running)
    + exposed copies (copies and memsets with neither compute nor communication running)
    + idle (nothing running)

Hidden communication is communication with compute running at the same time. Step windows
are the loop's period on the host clock, as ``steps`` defines it: from a step's start to the
next step's start in the same process, the last one to the later of its end and the end of
the GPU work it launched. GPU and host share one clock within a trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.collective_bandwidth import BANDWIDTH_SCHEMA, bandwidth_by_size
from tracewhy.analyses.collectives import CollectivesResult, collectives
from tracewhy.analyses.intervals import union
from tracewhy.analyses.overlap_activities import (
    CATEGORIES,
    COMMUNICATION,
    COMPUTE,
    COPY,
    MEMSET,
    ActivityCol,
    activities,
)
from tracewhy.analyses.stats import nearest_ns
from tracewhy.analyses.steps import StepCol, StepsOptions, StepsResult, WindowCol, steady_span, step_windows, steps
from tracewhy.model.schema import Col
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows

I64 = npt.NDArray[np.int64]


class OverlapCol:
    """Columns of the OverlapResult tables (see OverlapResult for which table has which)."""

    DEVICE: Final = Col.DEVICE
    STREAM: Final = Col.STREAM
    STREAMS: Final = "streams"
    SPAN_START: Final = "span_start_ns"
    SPAN: Final = "span_ns"
    # The timeline parts (PARTS), ns.
    BUSY: Final = "busy_ns"
    COMPUTE: Final = "compute_ns"
    COMM: Final = "comm_ns"
    COMM_HIDDEN: Final = "comm_hidden_ns"
    COMM_EXPOSED: Final = "comm_exposed_ns"
    COPY: Final = "copy_ns"
    COPY_EXPOSED: Final = "copy_exposed_ns"
    IDLE: Final = "idle_ns"
    COMM_HIDDEN_SHARE: Final = "comm_hidden_share"
    MAX_STREAMS_ACTIVE: Final = "max_streams_active"
    MULTI_STREAM: Final = "multi_stream_ns"
    STEP: Final = WindowCol.STEP
    NUMBER: Final = WindowCol.NUMBER
    STEADY: Final = WindowCol.STEADY
    WINDOW_START: Final = WindowCol.WINDOW_START
    WINDOW: Final = WindowCol.WINDOW
    STEPS: Final = "steps"
    COLLECTIVE: Final = "collective"
    COUNT: Final = "count"
    TIME: Final = "time_ns"
    HIDDEN: Final = "hidden_ns"
    EXPOSED: Final = "exposed_ns"
    EXPOSED_PER_STEP: Final = "exposed_ns_per_step"
    ACTIVITIES: Final = "activities"
    STREAMS_ACTIVE: Final = "streams_active"
    #: Union time per category in the streams table: f"{category}_ns".
    COMPUTE_UNION: Final = COMPUTE
    COMMUNICATION_UNION: Final = "communication_ns"
    COPY_UNION: Final = COPY
    MEMSET_UNION: Final = "memset_ns"


#: Timeline columns shared by the device, step and steady tables (ns).
PARTS: Final = (
    OverlapCol.BUSY, OverlapCol.COMPUTE, OverlapCol.COMM, OverlapCol.COMM_HIDDEN, OverlapCol.COMM_EXPOSED,
    OverlapCol.COPY, OverlapCol.COPY_EXPOSED, OverlapCol.IDLE,
)
#: The streams table's union-time column of each category.
CATEGORY_COLUMNS: Final = {COMPUTE: OverlapCol.COMPUTE_UNION, COMMUNICATION: OverlapCol.COMMUNICATION_UNION,
                           COPY: OverlapCol.COPY_UNION, MEMSET: OverlapCol.MEMSET_UNION}


@dataclass(frozen=True)
class OverlapOptions:
    step_marker: str | None = None  # None: ProfilerStep#N (or the nsys default, see steps)
    warmup: int | None = None  # None: as steps decides


@dataclass(frozen=True)
class OverlapResult(Rows, rows="devices"):
    """Overlap measurements, one row per device (per step, per stream) in device order.

    ``devices``: device, streams, span_start_ns, span_ns (first activity start to last end),
    then PARTS over the span, comm_hidden_share (hidden / communication, null without any),
    max_streams_active, multi_stream_ns (time with two or more streams busy).
    ``steps``: device, step (name), number, steady, window_start_ns, window_ns, then PARTS in
    the step's window. ``steady``: device, steps, then the mean of window_ns and PARTS over
    the device's steady steps (per step), each to the nearest nanosecond. ``collectives``:
    device, collective (label from collectives.py), count, time_ns, hidden_ns, exposed_ns,
    exposed_ns_per_step, in the analysis window (the steady steps, or the whole span without
    steps), most exposed first.
    ``streams``: device, stream, kernels, busy_ns and union time per category.
    ``concurrency``: device, streams_active, time_ns within the span. ``bandwidth``: the calls
    with a message size whose device start is in that window, per device, op, process group and
    size (``collective_bandwidth.bandwidth_by_size``).
    ``copy`` in PARTS counts memcpy and memset together; ``streams`` keeps them apart.
    """

    devices: pl.DataFrame
    steps: pl.DataFrame
    steady: pl.DataFrame
    collectives: pl.DataFrame
    streams: pl.DataFrame
    concurrency: pl.DataFrame
    step_marker: str
    steady_steps: int
    note: str | None
    bandwidth: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=BANDWIDTH_SCHEMA))


def overlap(
    trace: Trace,
    options: OverlapOptions = OverlapOptions(),
    steps_result: StepsResult | None = None,
    collectives_result: CollectivesResult | None = None,
) -> OverlapResult:
    """Overlap per device and per step. Pass ``steps_result`` / ``collectives_result`` when
    already computed (a diagnosis computes each once)."""
    trace.require_whole()
    steps_result = steps_result or steps(trace, StepsOptions(marker=options.step_marker, warmup=options.warmup))
    coll = collectives_result or collectives(trace)
    acts = activities(trace, coll)
    windows = step_windows(trace, steps_result)
    device_rows, step_rows, steady_rows, coll_rows, stream_rows, conc_rows = [], [], [], [], [], []
    calls_in_window = []
    for device in sorted(acts.get_column(Col.DEVICE).unique().to_list()):
        a = acts.filter(pl.col(Col.DEVICE) == device)
        tl = _Timeline(a)
        device_rows.append({OverlapCol.DEVICE: device, OverlapCol.STREAMS: a.get_column(Col.STREAM).n_unique(),
                            OverlapCol.SPAN_START: tl.lo, OverlapCol.SPAN: tl.hi - tl.lo,
                            **tl.parts_one(tl.lo, tl.hi), **_concurrency_summary(a)})
        w = _windows_for(windows, a)
        parts = tl.parts(w.get_column(WindowCol.WINDOW_START).to_numpy(), w.get_column(WindowCol.WINDOW_END).to_numpy())
        step_rows.append(w.drop(WindowCol.WINDOW_END, WindowCol.PID, WindowCol.STEP_ID, WindowCol.DUR).with_columns(
            pl.lit(device, dtype=pl.Int32).alias(OverlapCol.DEVICE),
            *[pl.Series(k, v, dtype=pl.Int64) for k, v in parts.items()],
        ))
        span = steady_span(w)
        n_steady = int(w.get_column(WindowCol.STEADY).sum())
        if span is not None:
            lo, hi = span
            steady = w.get_column(WindowCol.STEADY).to_numpy()
            steady_rows.append({OverlapCol.DEVICE: device, OverlapCol.STEPS: n_steady,
                                **{k: nearest_ns(float(np.mean(v[steady])))
                                   for k, v in {OverlapCol.WINDOW: w.get_column(WindowCol.WINDOW).to_numpy(),
                                                **parts}.items()}})
        else:
            lo, hi = tl.lo, tl.hi
        coll_rows.append(_collective_exposure(a, tl, lo, hi, max(n_steady, 1), device))
        calls_in_window.append(coll.table.filter((pl.col(Col.DEVICE) == device)
                                                 & pl.col("start_ns").is_between(lo, hi, closed="left")))
        stream_rows.append(_streams(a, device))
        conc_rows.append(_concurrency(a, device))
    n_steady = int(steps_result.table.get_column(StepCol.STEADY).sum()) if steps_result.table.height else 0
    note = steps_result.note
    if acts.height == 0:
        note = "no GPU activity in this trace: nothing to overlap"
    return OverlapResult(
        devices=_frame(device_rows, OVERLAP_DEVICES_SCHEMA),
        steps=(pl.concat(step_rows).select(*OVERLAP_STEPS_SCHEMA) if step_rows
               else pl.DataFrame(schema=OVERLAP_STEPS_SCHEMA)),
        steady=_frame(steady_rows, OVERLAP_STEADY_SCHEMA),
        collectives=(pl.concat(coll_rows) if coll_rows else pl.DataFrame(schema=OVERLAP_COLLECTIVES_SCHEMA)).sort(
            [OverlapCol.DEVICE, OverlapCol.EXPOSED, OverlapCol.COLLECTIVE], descending=[False, True, False]
        ),
        streams=pl.concat(stream_rows) if stream_rows else pl.DataFrame(schema=OVERLAP_STREAMS_SCHEMA),
        concurrency=pl.concat(conc_rows) if conc_rows else pl.DataFrame(schema=OVERLAP_CONCURRENCY_SCHEMA),
        step_marker=steps_result.marker,
        steady_steps=n_steady,
        note=note,
        bandwidth=bandwidth_by_size(pl.concat(calls_in_window) if calls_in_window else coll.table.clear()),
    )


# --- unions of activity -----------------------------------------------------------------------


class _Timeline:
    """Unions of one device's activity per category (and combined), queried over windows."""

    def __init__(self, a: pl.DataFrame) -> None:
        ts = a.get_column(Col.TS).to_numpy()
        end = a.get_column(ActivityCol.END).to_numpy()
        cat = a.get_column(ActivityCol.CATEGORY).to_numpy()
        self.lo = int(ts.min()) if ts.size else 0
        self.hi = int(end.max()) if end.size else 0

        def u(mask: npt.NDArray[np.bool_]) -> tuple[I64, I64]:
            return union(ts[mask], end[mask])

        self.compute = u(cat == COMPUTE)
        self.comm = u(cat == COMMUNICATION)
        self.copy = u((cat == COPY) | (cat == MEMSET))
        self.compute_comm = u((cat == COMPUTE) | (cat == COMMUNICATION))
        self.all = u(np.ones(ts.shape[0], dtype=bool))

    def parts(self, lo: I64, hi: I64) -> dict[str, I64]:
        """PARTS for each window [lo, hi)."""
        compute = _length_in(self.compute, lo, hi)
        comm = _length_in(self.comm, lo, hi)
        cc = _length_in(self.compute_comm, lo, hi)
        busy = _length_in(self.all, lo, hi)
        return {
            OverlapCol.BUSY: busy,
            OverlapCol.COMPUTE: compute,
            OverlapCol.COMM: comm,
            OverlapCol.COMM_HIDDEN: compute + comm - cc,
            OverlapCol.COMM_EXPOSED: cc - compute,
            OverlapCol.COPY: _length_in(self.copy, lo, hi),
            OverlapCol.COPY_EXPOSED: busy - cc,
            OverlapCol.IDLE: np.maximum(hi - lo, 0) - busy,
        }

    def parts_one(self, lo: int, hi: int) -> dict[str, object]:
        p = {k: int(v[0]) for k, v in self.parts(np.array([lo]), np.array([hi])).items()}
        share = p[OverlapCol.COMM_HIDDEN] / p[OverlapCol.COMM] if p[OverlapCol.COMM] else None
        return {**p, OverlapCol.COMM_HIDDEN_SHARE: share}


def _covered_before(u: tuple[I64, I64], t: I64) -> I64:
    """Length of the disjoint sorted intervals ``u`` lying before each instant in ``t``."""
    s, e = u
    if s.size == 0:
        return np.zeros(t.shape[0], dtype=np.int64)
    cum = np.concatenate(([0], np.cumsum(e - s)))
    i = np.searchsorted(s, t, side="right")  # intervals starting at or before t
    last_end = e[np.maximum(i - 1, 0)]
    beyond = np.where(i > 0, np.maximum(last_end - t, 0), 0)  # part of the last one after t
    return (cum[i] - beyond).astype(np.int64)


def _length_in(u: tuple[I64, I64], lo: I64, hi: I64) -> I64:
    out: I64 = np.maximum(_covered_before(u, hi) - _covered_before(u, lo), 0)
    return out


# --- steps ------------------------------------------------------------------------------------


def _windows_for(windows: pl.DataFrame, a: pl.DataFrame) -> pl.DataFrame:
    """The step windows of the process whose steps launched this device's work: with several
    processes in one trace, the one whose windows hold most of the device's activity."""
    pids = windows.get_column(Col.PID).unique().to_list()
    if len(pids) <= 1:
        return windows
    starts = a.get_column(Col.TS).to_numpy()

    def held(pid: int) -> int:
        w = windows.filter(pl.col(Col.PID) == pid)
        lo = w.get_column(WindowCol.WINDOW_START).to_numpy()
        hi = w.get_column(WindowCol.WINDOW_END).to_numpy()
        i = np.searchsorted(lo, starts, side="right") - 1
        return int(((i >= 0) & (starts < hi[np.maximum(i, 0)])).sum())

    best = max(sorted(p for p in pids if p is not None), key=held)
    return windows.filter(pl.col(Col.PID) == best)


# --- collectives, streams, concurrency --------------------------------------------------------


def _collective_exposure(a: pl.DataFrame, tl: _Timeline, lo: int, hi: int, n_steps: int, device: int) -> pl.DataFrame:
    c = a.filter(pl.col(ActivityCol.CATEGORY) == COMMUNICATION)
    s = np.clip(c.get_column(Col.TS).to_numpy(), lo, hi)
    e = np.clip(c.get_column(ActivityCol.END).to_numpy(), lo, hi)
    hidden = _length_in(tl.compute, s, e)
    per = pl.DataFrame({OverlapCol.COLLECTIVE: c.get_column(ActivityCol.COLLECTIVE), OverlapCol.TIME: e - s,
                        OverlapCol.HIDDEN: hidden, "_inside": e > s})
    return (
        per.filter(pl.col("_inside"))
        .group_by(OverlapCol.COLLECTIVE)
        .agg(pl.len().cast(pl.Int64).alias(OverlapCol.COUNT), pl.col(OverlapCol.TIME).sum(),
             pl.col(OverlapCol.HIDDEN).sum())
        .with_columns(
            pl.lit(device, dtype=pl.Int32).alias(OverlapCol.DEVICE),
            (pl.col(OverlapCol.TIME) - pl.col(OverlapCol.HIDDEN)).alias(OverlapCol.EXPOSED),
        )
        .with_columns((pl.col(OverlapCol.EXPOSED) / n_steps).alias(OverlapCol.EXPOSED_PER_STEP))
        .select(*OVERLAP_COLLECTIVES_SCHEMA)
        .cast(OVERLAP_COLLECTIVES_SCHEMA)
    )


def _streams(a: pl.DataFrame, device: int) -> pl.DataFrame:
    rows = []
    for stream in sorted(a.get_column(Col.STREAM).unique().to_list()):
        sa = a.filter(pl.col(Col.STREAM) == stream)
        ts, end = sa.get_column(Col.TS).to_numpy(), sa.get_column(ActivityCol.END).to_numpy()
        cat = sa.get_column(ActivityCol.CATEGORY)
        row: dict[str, object] = {OverlapCol.DEVICE: device, OverlapCol.STREAM: stream,
                                  OverlapCol.ACTIVITIES: sa.height, OverlapCol.BUSY: _union_len(ts, end)}
        for name in CATEGORIES:
            m = (cat == name).to_numpy()
            row[CATEGORY_COLUMNS[name]] = _union_len(ts[m], end[m])
        rows.append(row)
    return _frame(rows, OVERLAP_STREAMS_SCHEMA)


def _union_len(ts: I64, end: I64) -> int:
    s, e = union(ts, end)
    return int((e - s).sum())


def _stream_levels(a: pl.DataFrame) -> tuple[I64, I64]:
    """Change points of the number of busy streams: (times, level from that time on)."""
    starts, ends = [], []
    for stream in a.get_column(Col.STREAM).unique().to_list():
        sa = a.filter(pl.col(Col.STREAM) == stream)
        s, e = union(sa.get_column(Col.TS).to_numpy(), sa.get_column(ActivityCol.END).to_numpy())
        busy = e > s  # zero-length activities (dur 0 in 2021 traces) busy no stream
        starts.append(s[busy])
        ends.append(e[busy])
    if not starts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    t = np.concatenate([*starts, *ends])
    delta = np.concatenate([np.ones(sum(x.size for x in starts), dtype=np.int64),
                            -np.ones(sum(x.size for x in ends), dtype=np.int64)])
    order = np.lexsort((delta, t))  # an end before a start at the same instant: [s, e) intervals
    return t[order], np.cumsum(delta[order])


def _concurrency_summary(a: pl.DataFrame) -> dict[str, object]:
    t, level = _stream_levels(a)
    if t.size == 0:
        return {OverlapCol.MAX_STREAMS_ACTIVE: 0, OverlapCol.MULTI_STREAM: 0}
    dur = np.diff(t)
    return {OverlapCol.MAX_STREAMS_ACTIVE: int(level.max()), OverlapCol.MULTI_STREAM: int(dur[level[:-1] >= 2].sum())}


def _concurrency(a: pl.DataFrame, device: int) -> pl.DataFrame:
    t, level = _stream_levels(a)
    if t.size == 0:
        return pl.DataFrame(schema=OVERLAP_CONCURRENCY_SCHEMA)
    dur = np.diff(t)
    lv = level[:-1]
    counts = np.bincount(lv, weights=dur, minlength=int(level.max()) + 1).astype(np.int64)
    return pl.DataFrame({OverlapCol.DEVICE: [device] * counts.size, OverlapCol.STREAMS_ACTIVE: np.arange(counts.size),
                         OverlapCol.TIME: counts}, schema=OVERLAP_CONCURRENCY_SCHEMA)


# --- schemas ----------------------------------------------------------------------------------

_PARTS_SCHEMA: Final = {k: pl.Int64() for k in PARTS}
OVERLAP_DEVICES_SCHEMA: Final = pl.Schema({
    OverlapCol.DEVICE: pl.Int32(), OverlapCol.STREAMS: pl.Int64(), OverlapCol.SPAN_START: pl.Int64(),
    OverlapCol.SPAN: pl.Int64(), **_PARTS_SCHEMA, OverlapCol.COMM_HIDDEN_SHARE: pl.Float64(),
    OverlapCol.MAX_STREAMS_ACTIVE: pl.Int64(), OverlapCol.MULTI_STREAM: pl.Int64(),
})
OVERLAP_STEPS_SCHEMA: Final = pl.Schema({
    OverlapCol.DEVICE: pl.Int32(), OverlapCol.STEP: pl.String(), OverlapCol.NUMBER: pl.Int64(),
    OverlapCol.STEADY: pl.Boolean(), OverlapCol.WINDOW_START: pl.Int64(), OverlapCol.WINDOW: pl.Int64(),
    **_PARTS_SCHEMA,
})
#: Means per steady step, each rounded to the nearest nanosecond (so the parts may miss the window
#: by a nanosecond or two).
OVERLAP_STEADY_SCHEMA: Final = pl.Schema({OverlapCol.DEVICE: pl.Int32(), OverlapCol.STEPS: pl.Int64(),
                                          OverlapCol.WINDOW: pl.Int64(), **_PARTS_SCHEMA})
OVERLAP_COLLECTIVES_SCHEMA: Final = pl.Schema({
    OverlapCol.DEVICE: pl.Int32(), OverlapCol.COLLECTIVE: pl.String(), OverlapCol.COUNT: pl.Int64(),
    OverlapCol.TIME: pl.Int64(), OverlapCol.HIDDEN: pl.Int64(), OverlapCol.EXPOSED: pl.Int64(),
    OverlapCol.EXPOSED_PER_STEP: pl.Float64(),
})
OVERLAP_STREAMS_SCHEMA: Final = pl.Schema({
    OverlapCol.DEVICE: pl.Int32(), OverlapCol.STREAM: pl.Int64(), OverlapCol.ACTIVITIES: pl.Int64(),
    OverlapCol.BUSY: pl.Int64(), **{CATEGORY_COLUMNS[c]: pl.Int64() for c in CATEGORIES},
})
OVERLAP_CONCURRENCY_SCHEMA: Final = pl.Schema({OverlapCol.DEVICE: pl.Int32(), OverlapCol.STREAMS_ACTIVE: pl.Int64(),
                                               OverlapCol.TIME: pl.Int64()})


def _frame(rows: list[dict[str, object]], schema: pl.Schema) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
