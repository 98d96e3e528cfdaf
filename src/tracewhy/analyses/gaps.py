"""Where the GPU sat idle, and what the host was doing at that moment.

Every idle interval of each device (between the union of its kernels, copies and memsets) is
found, then explained from the thread that launched the work ending the gap:

- if that work was launched after the gap began, the GPU was waiting on the host: the time
  from the gap's start to that launch is classified by what was on the host's stack
  (sampled at evenly spaced instants), and the rest is launch latency;
- if it was launched before the gap began, the GPU was waiting on something else (a
  dependency on another stream, an event, launch queueing);
- a gap that opens as a blocking synchronize returns is the synchronize's doing: the host
  stalled until the device drained, so the device then had nothing queued;
- a queued activity whose stream was told to wait on another stream's event first (a cuda_sync
  "Stream Wait Event" between it and the stream's previous work: a dependency edge the trace
  records) waited on that stream: all its queueing is dependency, and ``wait_stream`` names it.

The last two, dependencies the trace records, are read in ``gap_dependencies``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.gap_dependencies import stream_waits, sync_returns_in, waited_streams
from tracewhy.analyses.host_activity import Flag, HostIndex, build_host_index
from tracewhy.analyses.intervals import gaps as interval_gaps
from tracewhy.analyses.steps import StepCol, StepsResult, WindowCol
from tracewhy.analyses.utilization import DeviceBusy, device_busy
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, LAUNCH_KINDS, Col, Kind
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows

I64 = npt.NDArray[np.int64]

#: Gaps shorter than this are not reported (launch-level gaps of a few µs still count).
DEFAULT_MIN_GAP_NS = 2_000
#: Instants sampled per gap to split its time between classes.
SAMPLES_PER_GAP = 8
#: A gap whose work was already queued is launch latency up to this length; longer is a dependency.
QUEUED_LATENCY_NS = 20_000
#: Host time inside the op that launches the next kernel counts as dispatch overhead (launch)
#: in gaps up to this length; in longer gaps it is host compute.
DISPATCH_GAP_MAX_NS = 100_000


class GapClass(str, Enum):
    INPUT = "input"  # DataLoader __next__ on the host
    SYNC = "sync"  # the host blocked in a synchronize (or one drained the device)
    LAUNCH = "launch"  # kernel-launch / dispatch overhead
    HOST = "host"  # Python or CPU ops with no launch in flight
    ALLOCATOR = "allocator"  # cudaMalloc / cudaFree
    COMM = "comm"  # waiting in a collective
    GRAPH = "graph"  # CUDA-graph replay launch
    DEPENDENCY = "dependency"  # work was queued but waited (stream/event dependency)
    OTHER = "other"  # the host was in no traced activity (untraced Python, sleep, other process)


CLASSES = tuple(c.value for c in GapClass)


@dataclass(frozen=True)
class GapsOptions:
    min_gap_ns: int = DEFAULT_MIN_GAP_NS


class GapCol:
    """Columns of the GapsResult tables."""

    # gaps: one row per idle interval
    DEVICE: Final = Col.DEVICE
    START: Final = "start_ns"
    DUR: Final = Col.DUR
    GAP_CLASS: Final = "gap_class"  # the class with most of the gap's time
    STEP: Final = "step"  # index of the step whose window holds the gap's start; null outside the steps
    HOST_PID: Final = "host_pid"  # the thread that launched the work ending the gap
    HOST_TID: Final = "host_tid"
    HOST_INNERMOST: Final = "host_innermost"  # host activity names at the gap's middle sample
    HOST_OP: Final = "host_op"
    HOST_ANNOTATION: Final = "host_annotation"
    HOST_PYTHON: Final = "host_python"
    NEXT_ACTIVITY: Final = "next_activity"
    NEXT_LAUNCHED_BEFORE_GAP: Final = "next_launched_before_gap"
    #: The stream whose event the next activity's stream waited on, if the trace records such a wait.
    WAIT_STREAM: Final = "wait_stream"
    # per_step: per step and device
    NAME: Final = StepCol.NAME
    STEADY: Final = StepCol.STEADY
    WINDOW: Final = WindowCol.WINDOW
    BUSY: Final = "busy_ns"  # kernels, copies, memsets
    IDLE: Final = "idle_ns"
    KERNEL_BUSY: Final = "kernel_busy_ns"  # kernels only: the TensorBoard plugin's "GPU utilization" numerator
    # short (and per_step): idle in gaps under ``min_gap_ns``
    SHORT_GAPS: Final = "short_gaps"
    SHORT: Final = "short_ns"


def class_col(c: GapClass | str) -> str:
    """The column of a class's idle time (ns), in the gaps and per_step tables: ``input_ns``..."""
    return f"{GapClass(c).value}_ns"


CLASS_COLUMNS: Final = tuple(class_col(c) for c in CLASSES)

GAPS_SCHEMA: Final = pl.Schema({
    GapCol.DEVICE: pl.Int32(), GapCol.START: pl.Int64(), GapCol.DUR: pl.Int64(), GapCol.GAP_CLASS: pl.String(),
    GapCol.HOST_PID: pl.Int64(), GapCol.HOST_TID: pl.Int64(), GapCol.HOST_INNERMOST: pl.String(),
    GapCol.HOST_OP: pl.String(), GapCol.HOST_ANNOTATION: pl.String(), GapCol.HOST_PYTHON: pl.String(),
    GapCol.NEXT_ACTIVITY: pl.String(), GapCol.NEXT_LAUNCHED_BEFORE_GAP: pl.Boolean(), GapCol.WAIT_STREAM: pl.Int64(),
    **{c: pl.Int64() for c in CLASS_COLUMNS}, GapCol.STEP: pl.Int64(),
})
GAP_STEPS_SCHEMA: Final = pl.Schema({
    GapCol.STEP: pl.Int64(), GapCol.NAME: pl.String(), GapCol.DEVICE: pl.Int32(), GapCol.STEADY: pl.Boolean(),
    GapCol.WINDOW: pl.Int64(), GapCol.BUSY: pl.Int64(), GapCol.IDLE: pl.Int64(), GapCol.KERNEL_BUSY: pl.Int64(),
    **{c: pl.Int64() for c in CLASS_COLUMNS}, GapCol.SHORT_GAPS: pl.Int64(), GapCol.SHORT: pl.Int64(),
})
GAP_SHORT_SCHEMA: Final = pl.Schema({GapCol.DEVICE: pl.Int32(), GapCol.STEP: pl.Int64(), GapCol.SHORT_GAPS: pl.Int64(),
                                     GapCol.SHORT: pl.Int64()})


@dataclass(frozen=True)
class GapsResult(Rows, rows="gaps", ranked_by="dur_ns"):
    """``gaps`` (GAPS_SCHEMA): one row per idle interval, with the host activity at its middle
    and its time per class (CLASS_COLUMNS). ``per_step`` (GAP_STEPS_SCHEMA): per step and device,
    window, busy and idle time, kernel busy time, idle per class, and short_ns / short_gaps: the
    classes plus short_ns add up to idle_ns. See GapCol."""

    gaps: pl.DataFrame
    per_step: pl.DataFrame
    min_gap_ns: int
    devices: tuple[int, ...]
    busy: dict[int, DeviceBusy] = field(repr=False)
    #: Idle intervals shorter than ``min_gap_ns``, not explained one by one: per device and step
    #: (null outside the steps), their count (short_gaps) and time (short_ns). Many of them is
    #: the signature of kernels too short to keep the GPU fed, or each waiting on the last.
    short: pl.DataFrame = field(default_factory=pl.DataFrame)


def gaps(trace: Trace, steps: StepsResult, options: GapsOptions = GapsOptions(),
         host: HostIndex | None = None) -> GapsResult:
    trace.require_whole()
    busy = device_busy(trace)
    host = host if host is not None else build_host_index(trace)
    st = steps.table
    s = trace.slices
    gpu = trace.of_kind(*GPU_ACTIVITY_KINDS).select(Col.ID, Col.DEVICE, Col.STREAM, Col.TS, Col.LAUNCH, Col.OP,
                                                    Col.NAME)
    waits = stream_waits(trace)
    launch_tid = _main_launch_thread(trace)
    frames = []
    short_frames = []
    for device, b in busy.items():
        if b.starts.size == 0:
            continue
        lo, hi = int(b.starts[0]), int(b.ends[-1])
        if st.height:
            first, last = st.select(pl.col(StepCol.TS).min(), pl.col(StepCol.WINDOW_END).max()).row(0)
            lo, hi = min(lo, int(first)), max(hi, int(last))
        gs, ge = interval_gaps(b.starts, b.ends, lo, hi)
        if st.height:  # a gap across a step boundary is two gaps, one per step
            bounds = [st.get_column(StepCol.TS).to_numpy(), st.get_column(StepCol.WINDOW_END).to_numpy()]
            cuts = np.unique(np.concatenate(bounds))
            gs, ge = _split_at(gs, ge, cuts)
        keep = (ge - gs) >= options.min_gap_ns
        short_frames.append(pl.DataFrame({GapCol.DEVICE: np.full(int((~keep).sum()), device, dtype=np.int32),
                                          GapCol.START: gs[~keep], GapCol.DUR: (ge - gs)[~keep]}))
        gs, ge = gs[keep], ge[keep]
        # Stable: activities starting at the same instant stay in id order, so the one that
        # ends a gap (and the host thread blamed) is the same on every run.
        dev = gpu.filter(pl.col(Col.DEVICE) == device).sort(Col.TS, maintain_order=True)
        frames.append(_explain(device, gs, ge, dev, s, host, launch_tid,
                               waits.filter(pl.col(Col.DEVICE) == device)))
    table = pl.concat(frames) if frames else _empty_gaps()
    table = _assign_steps(table, st)
    short = _assign_steps(pl.concat(short_frames) if short_frames else pl.DataFrame(
        schema={GapCol.DEVICE: pl.Int32, GapCol.START: pl.Int64, GapCol.DUR: pl.Int64}), st)
    short = short.group_by(GapCol.DEVICE, GapCol.STEP).agg(
        pl.len().cast(pl.Int64).alias(GapCol.SHORT_GAPS), pl.col(GapCol.DUR).sum().cast(pl.Int64).alias(GapCol.SHORT))
    per_step = _per_step(table, st, busy, device_busy(trace, (Kind.KERNEL,)), short)
    return GapsResult(gaps=table, per_step=per_step, min_gap_ns=options.min_gap_ns,
                      devices=tuple(busy), busy=busy, short=short.sort(GapCol.DEVICE, GapCol.STEP, nulls_last=True))


def _main_launch_thread(trace: Trace) -> tuple[int, int] | None:
    """The thread with the most launch calls, else the most ops and annotations."""
    for kinds in (LAUNCH_KINDS, (Kind.CPU_OP, Kind.ANNOTATION)):
        # Ties in count go to the lowest (pid, tid): the same thread on every run.
        # (Two columns, then the rows: of_kind would copy every column of 1.9 M calls.)
        busiest = trace.slices.lazy().select(Col.KIND, Col.PID, Col.TID).filter(
            pl.col(Col.KIND).is_in([k.value for k in kinds])
        ).group_by(Col.PID, Col.TID).len().sort(["len", Col.PID, Col.TID], descending=[True, False, False]).collect()
        if busiest.height:
            return int(busiest[0, Col.PID]), int(busiest[0, Col.TID])
    return None


def _explain(device: int, gs: I64, ge: I64, dev: pl.DataFrame, s: pl.DataFrame, host: HostIndex,
             fallback: tuple[int, int] | None, waits: pl.DataFrame) -> pl.DataFrame:
    n = gs.size
    # The activity that ends each gap: the first one starting at or after the gap's end.
    d_ts = dev.get_column(Col.TS).to_numpy()
    nxt = np.searchsorted(d_ts, ge, side="left")
    has_next = nxt < d_ts.size
    nxt_c = np.minimum(nxt, max(d_ts.size - 1, 0))
    # (Every column is gathered at the gaps' rows before anything else: a whole column of the
    # slices is millions of rows.)
    launch_id = _gather(dev, Col.LAUNCH, nxt_c) if d_ts.size else np.full(n, -1)
    launch_id = np.where(has_next, launch_id, -1)
    next_op = _gather(dev, Col.OP, nxt_c) if d_ts.size else np.full(n, -1)
    linked = launch_id >= 0
    l_safe = np.maximum(launch_id, 0)
    launch_ts = np.where(linked, _gather(s, Col.TS, l_safe), -1)
    launch_end = np.where(linked, launch_ts + _gather(s, Col.DUR, l_safe), -1)
    pid = np.where(linked, _gather(s, Col.PID, l_safe), fallback[0] if fallback else -1)
    tid = np.where(linked, _gather(s, Col.TID, l_safe), fallback[1] if fallback else -1)
    queued = linked & (launch_ts <= gs)
    host_end = np.where(linked & ~queued, np.minimum(np.maximum(launch_ts, gs), ge), ge)

    # Sample the host-wait part of each gap.
    k = SAMPLES_PER_GAP
    frac = (np.arange(k) + 0.5) / k
    span = host_end - gs
    times = (gs[:, None] + (span[:, None] * frac[None, :]).astype(np.int64)).ravel()
    pos = np.full(times.size, -1, dtype=np.int64)
    thread_keys = np.repeat(np.stack([pid, tid], axis=1), k, axis=0)
    for p, t in np.unique(np.stack([pid, tid], axis=1), axis=0).tolist():
        sel = np.flatnonzero((thread_keys[:, 0] == p) & (thread_keys[:, 1] == t))
        pos[sel] = host.innermost(p, t, times[sel])
    next_op_rep = np.repeat(next_op, k)
    short = np.repeat((ge - gs) <= DISPATCH_GAP_MAX_NS, k)
    cls = _classify_samples(pos, host, next_op_rep, short)
    cls = cls.reshape(n, k)
    weights = span / k
    per_class = {c: (cls == i).sum(axis=1) * weights for i, c in enumerate(CLASSES)}
    # After the launch began: the host was inside the launch call, then the work sat queued.
    # Queueing up to QUEUED_LATENCY_NS is ordinary launch latency; longer, the work waited on
    # something (another stream, an event, a busy copy engine).
    in_call = np.where(linked & ~queued, np.clip(launch_end, host_end, ge) - host_end, 0)
    waiting = (ge - gs) - span - in_call
    # A recorded wait on another stream is a dependency however short: no latency allowance.
    wait_stream = waited_streams(dev, s, nxt_c, has_next, waits)
    latency = np.where((waiting > QUEUED_LATENCY_NS) | (wait_stream >= 0), 0, waiting)
    per_class[GapClass.LAUNCH.value] = per_class[GapClass.LAUNCH.value] + in_call + latency
    per_class[GapClass.DEPENDENCY.value] = per_class[GapClass.DEPENDENCY.value] + (waiting - latency)

    # Work queued before the gap whose stream waited on another stream's event: the whole gap
    # is that dependency, whatever the host was doing meanwhile.
    edge = queued & (wait_stream >= 0)
    for c in CLASSES:
        per_class[c] = np.where(edge, 0, per_class[c])
    per_class[GapClass.DEPENDENCY.value] = np.where(edge, ge - gs, per_class[GapClass.DEPENDENCY.value])

    # A synchronize that was blocking while the device drained and returned in this gap.
    drained = sync_returns_in(gs, ge, host)
    for c in CLASSES:
        per_class[c] = np.where(drained, 0, per_class[c])
    per_class[GapClass.SYNC.value] = np.where(drained, ge - gs, per_class[GapClass.SYNC.value])

    class_matrix = np.stack([per_class[c] for c in CLASSES], axis=1)
    dominant = np.array(CLASSES, dtype=object)[np.argmax(class_matrix, axis=1)] if n else np.array([], dtype=object)
    mid = pos.reshape(n, k)[:, k // 2] if n else np.zeros(0, dtype=np.int64)
    return pl.DataFrame({
        GapCol.DEVICE: np.full(n, device, dtype=np.int32),
        GapCol.START: gs,
        GapCol.DUR: ge - gs,
        GapCol.GAP_CLASS: pl.Series(dominant.tolist(), dtype=pl.String),
        GapCol.HOST_PID: pid.astype(np.int64),
        GapCol.HOST_TID: tid.astype(np.int64),
        GapCol.HOST_INNERMOST: _names(s, _at(host.ids, mid)),
        GapCol.HOST_OP: _names(s, _at(host.op_ctx, mid)),
        GapCol.HOST_ANNOTATION: _names(s, _at(host.annotation_ctx, mid)),
        GapCol.HOST_PYTHON: _names(s, _at(host.python_ctx, mid)),
        GapCol.NEXT_ACTIVITY: _names(dev, np.where(has_next, nxt_c, -1)),
        GapCol.NEXT_LAUNCHED_BEFORE_GAP: queued,
        GapCol.WAIT_STREAM: pl.Series(wait_stream, dtype=pl.Int64).replace(-1, None),
        **{class_col(c): per_class[c].astype(np.int64) for c in CLASSES},
    })


def _at(values: I64, pos: I64) -> I64:
    """``values[pos]`` where ``pos`` >= 0, else -1 (everywhere when the host index is empty)."""
    if values.size == 0:
        return np.full(pos.size, -1, dtype=np.int64)
    return np.where(pos >= 0, values[np.maximum(pos, 0)], -1)


def _classify_samples(pos: I64, host: HostIndex, next_op: I64, short: npt.NDArray[np.bool_]) -> I64:
    """Class index per sampled instant, by what is on the host stack (first rule that holds)."""
    idx = {c: i for i, c in enumerate(CLASSES)}
    out = np.full(pos.size, idx[GapClass.OTHER.value], dtype=np.int64)
    on = pos >= 0
    if not on.any():  # no host activity under any sample (a GPU-only trace): nothing to look up
        return out
    p = np.maximum(pos, 0)
    decided = ~on

    def rule(mask: npt.NDArray[np.bool_], c: GapClass) -> None:
        nonlocal decided
        m = mask & ~decided
        out[m] = idx[c.value]
        decided = decided | m

    st = host.on_stack
    rule(on & st[Flag.DATALOADER][p], GapClass.INPUT)
    rule(on & st[Flag.SYNC][p], GapClass.SYNC)
    rule(on & st[Flag.ALLOC][p], GapClass.ALLOCATOR)
    rule(on & st[Flag.COMM][p], GapClass.COMM)
    rule(on & st[Flag.GRAPH][p], GapClass.GRAPH)
    rule(on & st[Flag.LAUNCH][p], GapClass.LAUNCH)
    # Eager dispatch: the host is inside the op that will launch the work ending a short gap.
    in_next_op = on & (next_op >= 0) & (host.op_ctx[p] == next_op)
    rule(in_next_op & short, GapClass.LAUNCH)
    rule(on, GapClass.HOST)
    return out


def _gather(frame: pl.DataFrame, column: str, rows: I64) -> I64:
    """``column`` at ``rows`` as int64, nulls as -1."""
    return np.asarray(frame.get_column(column).gather(rows).fill_null(-1).to_numpy(), dtype=np.int64)


def _names(s: pl.DataFrame, ids: I64) -> pl.Series:
    # Gathered, then made strings: casting the whole column would copy every name of the trace.
    if not s.height:
        return pl.repeat(None, ids.size, dtype=pl.String, eager=True)
    safe = np.maximum(ids, 0)
    values = s.get_column(Col.NAME).gather(safe).cast(pl.String) if ids.size else pl.Series([], dtype=pl.String)
    return values.set(pl.Series(ids < 0), None) if ids.size else values


def _assign_steps(table: pl.DataFrame, st: pl.DataFrame) -> pl.DataFrame:
    if st.height == 0 or table.height == 0:
        return table.with_columns(pl.lit(None, dtype=pl.Int64).alias(GapCol.STEP))
    starts = st.get_column(StepCol.TS).to_numpy()
    idx = np.searchsorted(starts, table.get_column(GapCol.START).to_numpy(), side="right") - 1
    ends = st.get_column(StepCol.WINDOW_END).to_numpy()
    inside = (idx >= 0) & (table.get_column(GapCol.START).to_numpy() < ends[np.maximum(idx, 0)])
    return table.with_columns(pl.Series(GapCol.STEP, np.where(inside, idx, -1)).replace(-1, None).cast(pl.Int64))


def _split_at(gs: I64, ge: I64, cuts: I64) -> tuple[I64, I64]:
    """Split intervals at the given instants (each cut strictly inside an interval splits it)."""
    if gs.size == 0:  # a GPU busy from the first step's start to the last one's end
        return gs, ge
    idx = np.searchsorted(gs, cuts, side="right") - 1
    inside = (idx >= 0) & (cuts > gs[np.maximum(idx, 0)]) & (cuts < ge[np.maximum(idx, 0)])
    if not inside.any():
        return gs, ge
    starts = np.concatenate([gs, cuts[inside]])
    starts.sort()
    ends = np.concatenate([ge, cuts[inside]])
    ends.sort()
    return starts, ends


def _per_step(table: pl.DataFrame, st: pl.DataFrame, busy: dict[int, DeviceBusy],
              kernel_busy: dict[int, DeviceBusy], short: pl.DataFrame) -> pl.DataFrame:
    sums = table.filter(pl.col(GapCol.STEP).is_not_null()).group_by(GapCol.DEVICE, GapCol.STEP).agg(
        [pl.col(c).sum() for c in CLASS_COLUMNS]
    )
    rows = []
    steps = st.select(StepCol.NAME, StepCol.TS, StepCol.WINDOW_END, StepCol.STEADY)
    for i, (name, ts, wend, steady) in enumerate(steps.iter_rows()):
        for device, b in busy.items():
            used = b.busy_in(ts, wend)
            k = kernel_busy[device].busy_in(ts, wend) if device in kernel_busy else 0
            rows.append((i, name, device, steady, wend - ts, used, wend - ts - used, k))
    base = pl.DataFrame(rows, orient="row", schema={
        GapCol.STEP: pl.Int64, GapCol.NAME: pl.String, GapCol.DEVICE: pl.Int32, GapCol.STEADY: pl.Boolean,
        GapCol.WINDOW: pl.Int64, GapCol.BUSY: pl.Int64, GapCol.IDLE: pl.Int64, GapCol.KERNEL_BUSY: pl.Int64})
    keys = [GapCol.DEVICE, GapCol.STEP]
    return base.join(sums, on=keys, how="left").join(
        short.filter(pl.col(GapCol.STEP).is_not_null()), on=keys, how="left"
    ).with_columns(
        [pl.col(c).fill_null(0).cast(pl.Int64) for c in (*CLASS_COLUMNS, GapCol.SHORT, GapCol.SHORT_GAPS)]
    ).sort(GapCol.STEP, GapCol.DEVICE)


def _empty_gaps() -> pl.DataFrame:
    return pl.DataFrame(schema={k: v for k, v in GAPS_SCHEMA.items() if k != GapCol.STEP})
