"""Memory from a profiler trace's ``[memory]`` events (``profile_memory=True``): allocated and
reserved bytes over time per device, the peak and what was running at it, the ops that
allocate most, churn and growth over the steady steps, and the ledger of what was live at the
peak; and the same ledger read from a memory-timeline export, whose categories are the profiler's own.

A Kineto trace has no categories, so its ledger is inferred from where each live block was
allocated (``LEDGER_RULES`` below) and says so (``ledger_source``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.account_host import PHASE_CONTEXTS, HostContext, host_context
from tracewhy.analyses.host_activity import HostIndex, build_host_index
from tracewhy.analyses.host_tree import HostTree
from tracewhy.analyses.memory_growth import SITES_SCHEMA, StepGrowth, step_growth
from tracewhy.analyses.memory_ledger import (
    LIVE_SITES_SCHEMA,
    allocation_contexts,
    ledger_at_peak,
    live_at,
    live_sites,
)
from tracewhy.analyses.source_lines import parse_frame
from tracewhy.analyses.steps import StepsOptions, StepsResult, WindowCol, step_windows, steps
from tracewhy.model.memory_timeline import EXPORT_CATEGORIES, MemoryTimeline, TimelineCol
from tracewhy.model.schema import KIND_CODE, Col, Kind, MemEventCol
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

#: Stands for events outside any CPU op in ``top_ops``.
NO_OP: Final = "(outside any op)"


class OpMemCol:
    """Columns of ``MemoryResult.top_ops``: allocator events grouped by the outermost CPU op open
    on the allocating thread, per device, most bytes allocated first."""

    DEVICE: Final = "device"
    OP: Final = "op"
    ALLOCATIONS: Final = "allocations"
    FREES: Final = "frees"
    BYTES_ALLOCATED: Final = "bytes_allocated"
    NET_BYTES: Final = "net_bytes"  # allocated less freed within the op: what it left live


TOP_OPS_SCHEMA: Final = pl.Schema({OpMemCol.DEVICE: pl.String(), OpMemCol.OP: pl.String(),
                                   OpMemCol.ALLOCATIONS: pl.Int64(), OpMemCol.FREES: pl.Int64(),
                                   OpMemCol.BYTES_ALLOCATED: pl.Int64(), OpMemCol.NET_BYTES: pl.Int64()})


class ChurnCol:
    """Columns of ``DeviceMemory.steps``: one row per step window, time order."""

    STEP: Final = WindowCol.STEP
    STEADY: Final = WindowCol.STEADY
    ALLOCATIONS: Final = "allocations"
    FREES: Final = "frees"
    BYTES_ALLOCATED: Final = "bytes_allocated"
    ALLOCATED_AT_END: Final = "allocated_at_end_bytes"  # Total Allocated after the window's last event
    #: Events that changed Total Reserved: the caching allocator called cudaMalloc or cudaFree.
    RESERVE_CHANGES: Final = "reserve_changes"


CHURN_SCHEMA: Final = pl.Schema({ChurnCol.STEP: pl.String(), ChurnCol.STEADY: pl.Boolean(),
                                 ChurnCol.ALLOCATIONS: pl.Int64(), ChurnCol.FREES: pl.Int64(),
                                 ChurnCol.BYTES_ALLOCATED: pl.Int64(), ChurnCol.ALLOCATED_AT_END: pl.Int64(),
                                 ChurnCol.RESERVE_CHANGES: pl.Int64()})


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory. Peaks are of the allocator's own running totals (``Total
    Allocated`` / ``Total Reserved`` of the events), not of sums of event sizes."""

    device: str  # "cpu", "cuda:0"
    events: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int | None  # None: the events carry no Total Reserved (PyTorch < 1.10)
    reserved_at_peak_bytes: int | None
    peak_ts_ns: int
    peak_step: str | None
    peak_op: str | None  # outermost CPU op open at the peak
    peak_innermost_op: str | None
    peak_annotation: str | None
    #: The step phase at the peak, by what encloses the allocating op (as the step account finds
    #: phases): "optimizer", "backward", "forward"; None outside them.
    peak_phase: str | None
    #: The innermost user Python frame at the peak ("file:line function"); None without with_stack.
    peak_frame: str | None
    peak_python_stack: tuple[str, ...]  # innermost first; empty without with_stack
    ledger: dict[str, int]  # LedgerCategory value -> bytes live at the peak
    timeline: pl.DataFrame  # ts_ns, total_allocated, total_reserved: the events' own totals
    steps: pl.DataFrame  # CHURN_SCHEMA
    growth_bytes_per_step: float | None  # least-squares slope of allocated-at-end over steady steps
    growth: StepGrowth  # whether allocated rises in every steady step, and the sites that keep bytes each step
    #: Where allocated comes from: the events' own "Total Allocated", or (traces of PyTorch < 1.10,
    #: which carry only "Bytes") the running sum of event sizes from the trace's start, as
    #: TensorBoard's plugin drew it: memory allocated before the trace is then missing.
    allocated_source: str = "total_allocated"
    #: The blocks live at the peak by allocation site (LIVE_SITES_SCHEMA); they add up to the peak.
    live_sites: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=LIVE_SITES_SCHEMA), repr=False)
    #: The peak of allocated within each steady step, in time order: how much the peak moves
    #: from one step to the next of the same loop.
    steady_step_peaks_bytes: tuple[int, ...] = ()

    @property
    def slack_at_peak_bytes(self) -> int | None:
        """Reserved but not allocated at the peak: cached free blocks and fragmentation."""
        if self.reserved_at_peak_bytes is None:
            return None
        return max(self.reserved_at_peak_bytes - self.peak_allocated_bytes, 0)


@dataclass(frozen=True)
class MemoryResult(Rows, rows="devices", key="device"):
    devices: tuple[DeviceMemory, ...]
    top_ops: pl.DataFrame  # TOP_OPS_SCHEMA
    ledger_source: str  # "inferred": from where blocks were allocated (LEDGER_RULES)
    note: str | None = None


@dataclass(frozen=True)
class MemoryOptions:
    marker: str | None = None  # step annotation, as StepsOptions.marker
    warmup: int | None = None


@dataclass(frozen=True)
class TimelineResult(Rows, rows="table"):
    """A memory-timeline export's peak and its ledger, in the profiler's own categories."""

    peak_total_bytes: int
    peak_ts_ns: int | None
    ledger_at_peak: dict[str, int]
    table: pl.DataFrame = field(repr=False)  # TimelineCol
    ledger_source: str = "export"


def analyze_timeline(tl: MemoryTimeline) -> TimelineResult:
    """Peak of the summed categories and each category's bytes at that instant."""
    t = tl.table
    if t.height == 0:
        return TimelineResult(0, None, {c.value: 0 for c in EXPORT_CATEGORIES}, t)
    row = t.row(int(t.get_column(TimelineCol.TOTAL).arg_max() or 0), named=True)
    return TimelineResult(int(row[TimelineCol.TOTAL]), int(row[TimelineCol.TS]),
                          {c: int(row[c]) for c in TimelineCol.CATEGORIES}, t)


#: c10::DeviceType numbers of the devices a [memory] event names (c10/core/DeviceType.h);
#: ROCm builds write 6 (HIP) for what Python calls "cuda".
DEVICE_TYPES: Final = {1: "cuda", 6: "hip", 12: "xpu", 13: "mps", 19: "mtia"}


def device_label(device_type: int, device_id: int) -> str:
    """"cpu", or the device kind and index ("cuda:0", "hip:0"); an unlisted kind keeps its number."""
    if device_type == 0:
        return "cpu"
    return f"{DEVICE_TYPES.get(device_type, f'device{device_type}')}:{device_id}"


def analyze_memory(trace: Trace, options: MemoryOptions = MemoryOptions(), *, host: HostIndex | None = None,
                   steps_result: StepsResult | None = None, tree: HostTree | None = None,
                   marked: pl.DataFrame | None = None, contexts: HostContext | None = None) -> MemoryResult:
    """``host``, ``steps_result``, ``tree``, ``marked`` and ``contexts``: the host index, steps,
    ``HostTree``, compile-marked slices and the step account's ``host_context`` already built for
    the trace (a diagnosis has them), so they are not built twice; else they are built here from
    ``options``."""
    trace.require_whole()
    ev = trace.memory.sort(MemEventCol.TS, maintain_order=True).with_row_index("_seq")
    if ev.height == 0:
        empty = pl.DataFrame(schema=TOP_OPS_SCHEMA)
        return MemoryResult((), empty, "inferred", "no [memory] events: profile with profile_memory=True")
    labels = ev.select(MemEventCol.DEVICE_TYPE, MemEventCol.DEVICE_ID).unique()
    ev = ev.join(labels.with_columns(pl.Series("_device", [device_label(t, i) for t, i in labels.iter_rows()],
                                               dtype=pl.String)),
                 on=[MemEventCol.DEVICE_TYPE, MemEventCol.DEVICE_ID], how="left").sort("_seq")
    index = host if host is not None else build_host_index(trace)
    steps_result = steps_result if steps_result is not None else steps(trace, StepsOptions(marker=options.marker,
                                                                                warmup=options.warmup))
    ctx = allocation_contexts(trace, index, ev)
    op_names = trace.slices.get_column(Col.NAME).gather(np.maximum(ctx.outermost_op, 0)).cast(pl.String)
    op_names = pl.select(pl.when(pl.Series(ctx.outermost_op >= 0)).then(op_names).otherwise(pl.lit(NO_OP))).to_series()
    phase_and_frame = _phase_and_frame(trace, ctx.innermost, index, contexts or _contexts(trace, steps_result, tree,
                                                                                          marked))
    ev = ev.with_columns(op_names.alias("_op"), *phase_and_frame,
                         pl.Series("_scope_end", ctx.scope_end), pl.Series("_opt_end", ctx.optimizer_end),
                         *[pl.Series(f"_{k}", v) for k, v in ctx.bits.items()],
                         pl.Series("_inner", ctx.innermost))
    windows = step_windows(trace, steps_result).sort(WindowCol.WINDOW_START)
    ev = ev.with_columns(pl.Series("_pos", np.arange(ev.height, dtype=np.int64)))
    devices = tuple(_device(trace, index, part, windows)
                    for _, part in sorted(ev.group_by("_device"), key=lambda kv: str(kv[0][0])))
    return MemoryResult(devices, _top_ops(ev), "inferred")


def _contexts(trace: Trace, found: StepsResult, tree: HostTree | None, marked: pl.DataFrame | None) -> HostContext:
    """The host contexts of the trace's slices, as the step account finds them. (The step markers
    decide only the outermost blocks, which the phase and the frame do not read: a diagnosis
    passes the account's own contexts, found with the account's markers.)"""
    markers = step_windows(trace, found).get_column(WindowCol.STEP_ID).drop_nulls().to_numpy()
    return host_context(trace, markers, tree, marked)


def _phase_and_frame(trace: Trace, innermost: I64, index: HostIndex, hc: HostContext) -> list[pl.Series]:
    """Per event: the step phase of the slice open at it (the account's host contexts, so the
    optimizer's, backward's and forward's bounds are the account's), and the innermost user Python
    frame above it as "file:line function" (null without with_stack)."""
    slice_id = np.where(innermost >= 0, index.ids[np.maximum(innermost, 0)], -1)
    names = {int(p): p.name.lower() for p in PHASE_CONTEXTS}
    # Each event's context code in one gather (-1: no slice open, which no phase has).
    context = np.where(slice_id >= 0, hc.context[np.maximum(slice_id, 0)], -1).tolist()
    phase = [names.get(c) for c in context]
    frame_id = np.where(slice_id >= 0, hc.user_frame[np.maximum(slice_id, 0)], -1)
    text: dict[int, str] = {}
    for f in np.unique(frame_id[frame_id >= 0]).tolist():
        file, line, function, _ = parse_frame(hc.name(f))
        text[f] = f"{file.rsplit('/', 1)[-1]}:{line} {function}"
    return [pl.Series("_phase", phase, dtype=pl.String),
            pl.Series("_frame", [text.get(f) for f in frame_id.tolist()], dtype=pl.String)]


def _top_ops(ev: pl.DataFrame) -> pl.DataFrame:
    b = pl.col(MemEventCol.BYTES)
    return (
        ev.group_by("_device", "_op")
        .agg((b > 0).sum().cast(pl.Int64).alias(OpMemCol.ALLOCATIONS),
             (b < 0).sum().cast(pl.Int64).alias(OpMemCol.FREES),
             b.filter(b > 0).sum().alias(OpMemCol.BYTES_ALLOCATED), b.sum().alias(OpMemCol.NET_BYTES))
        .rename({"_device": OpMemCol.DEVICE, "_op": OpMemCol.OP})
        .sort([OpMemCol.BYTES_ALLOCATED, OpMemCol.DEVICE, OpMemCol.OP], descending=[True, False, False])
    )


def _device(trace: Trace, index: HostIndex, ev: pl.DataFrame, windows: pl.DataFrame) -> DeviceMemory:
    ev = ev.sort("_pos")
    source = "total_allocated"
    if ev.get_column(MemEventCol.TOTAL_ALLOCATED).null_count() == ev.height:
        source = "running_sum"
        ev = ev.with_columns(pl.col(MemEventCol.BYTES).cum_sum().alias(MemEventCol.TOTAL_ALLOCATED))
    alloc = ev.get_column(MemEventCol.TOTAL_ALLOCATED).fill_null(strategy="forward").fill_null(0).to_numpy()
    reserved_col = ev.get_column(MemEventCol.TOTAL_RESERVED)
    reserved = None if reserved_col.null_count() == ev.height else \
        reserved_col.fill_null(strategy="forward").fill_null(0).to_numpy()
    at = int(np.argmax(alloc))
    peak = ev.row(at, named=True)
    names = trace.slices.get_column(Col.NAME)
    inner = int(peak["_inner"])

    def ctx_name(ids: I64) -> str | None:
        return None if inner < 0 or ids[inner] < 0 else str(names[int(ids[inner])])

    starts = windows.get_column(WindowCol.WINDOW_START).to_numpy()
    ends = windows.get_column(WindowCol.WINDOW_END).to_numpy()
    w = int(np.searchsorted(starts, peak[MemEventCol.TS], side="right")) - 1
    in_step = w >= 0 and peak[MemEventCol.TS] < ends[w]
    table = _churn(ev, windows)
    live = live_at(ev, at)  # (the ledger and the sites read the same blocks)
    return DeviceMemory(
        device=str(peak["_device"]), events=ev.height, peak_allocated_bytes=int(alloc[at]),
        peak_reserved_bytes=None if reserved is None else int(reserved.max()),
        reserved_at_peak_bytes=None if reserved is None else int(reserved[at]),
        peak_ts_ns=int(peak[MemEventCol.TS]),
        peak_step=str(windows.get_column(WindowCol.STEP)[w]) if in_step else None,
        peak_op=None if peak["_op"] == NO_OP else str(peak["_op"]),
        peak_innermost_op=ctx_name(index.op_ctx), peak_annotation=ctx_name(index.annotation_ctx),
        peak_phase=peak["_phase"], peak_frame=peak["_frame"],
        peak_python_stack=_python_stack(index, names, inner),
        ledger=ledger_at_peak(live, starts, int(alloc[at])),
        timeline=ev.select(MemEventCol.TS, MemEventCol.TOTAL_ALLOCATED, MemEventCol.TOTAL_RESERVED),
        steps=table,
        growth_bytes_per_step=_growth(table),
        growth=_step_growth(ev, windows, table),
        allocated_source=source,
        live_sites=live_sites(ev, live, int(alloc[at]), op="_op", frame="_frame"),
        steady_step_peaks_bytes=_steady_peaks(ev, windows, alloc),
    )


def _steady_peaks(ev: pl.DataFrame, windows: pl.DataFrame, alloc: I64) -> tuple[int, ...]:
    """The largest allocated after any event of each steady step window that has events."""
    if windows.height == 0:
        return ()
    w = _window_of(ev, windows)
    steady = np.flatnonzero(windows.get_column(WindowCol.STEADY).to_numpy())
    return tuple(int(alloc[w == i].max()) for i in steady.tolist() if (w == i).any())


def _python_stack(index: HostIndex, names: pl.Series, inner: int) -> tuple[str, ...]:
    out: list[str] = []
    cur = inner
    python = KIND_CODE[Kind.PYTHON.value]
    while cur >= 0:
        if index.kind_code[cur] == python:
            out.append(str(names[int(index.ids[cur])]))
        cur = int(index.parent[cur])
    return tuple(out)


def _window_of(ev: pl.DataFrame, windows: pl.DataFrame) -> I64:
    """Each event's step window (row of ``windows``, in time order); -1 outside every window."""
    starts = windows.get_column(WindowCol.WINDOW_START).to_numpy()
    ends = windows.get_column(WindowCol.WINDOW_END).to_numpy()
    ts = ev.get_column(MemEventCol.TS).to_numpy()
    w = np.searchsorted(starts, ts, side="right") - 1
    out: I64 = np.where((w >= 0) & (ts < ends[np.maximum(w, 0)]), w, -1).astype(np.int64)
    return out


def _step_growth(ev: pl.DataFrame, windows: pl.DataFrame, table: pl.DataFrame) -> StepGrowth:
    if windows.height == 0:
        return StepGrowth(0, 0, pl.DataFrame(schema=SITES_SCHEMA))
    return step_growth(ev, table.get_column(ChurnCol.ALLOCATED_AT_END).to_list(),
                       table.get_column(ChurnCol.STEADY).to_list(), _window_of(ev, windows), op="_op", frame="_frame")


def _churn(ev: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Allocations, frees and bytes cycled per step window, and allocated at its end."""
    schema = CHURN_SCHEMA
    if windows.height == 0:
        return pl.DataFrame(schema=schema)
    b = pl.col(MemEventCol.BYTES)
    per = (
        ev.with_columns(pl.Series("_w", _window_of(ev, windows)),
                        (pl.col(MemEventCol.TOTAL_RESERVED) != pl.col(MemEventCol.TOTAL_RESERVED).shift(1))
                        .fill_null(False).alias("_reserve_change"))
        .filter(pl.col("_w") >= 0)
        .group_by("_w")
        .agg((b > 0).sum().cast(pl.Int64).alias(ChurnCol.ALLOCATIONS),
             (b < 0).sum().cast(pl.Int64).alias(ChurnCol.FREES),
             b.filter(b > 0).sum().alias(ChurnCol.BYTES_ALLOCATED),
             pl.col(MemEventCol.TOTAL_ALLOCATED).last().alias(ChurnCol.ALLOCATED_AT_END),
             pl.col("_reserve_change").sum().cast(pl.Int64).alias(ChurnCol.RESERVE_CHANGES))
    )
    return (
        windows.with_row_index("_w").with_columns(pl.col("_w").cast(pl.Int64))
        .join(per, on="_w", how="left")
        .select(pl.col(WindowCol.STEP).alias(ChurnCol.STEP), pl.col(WindowCol.STEADY).alias(ChurnCol.STEADY),
                pl.col(ChurnCol.ALLOCATIONS).fill_null(0), pl.col(ChurnCol.FREES).fill_null(0),
                pl.col(ChurnCol.BYTES_ALLOCATED).fill_null(0), ChurnCol.ALLOCATED_AT_END,
                pl.col(ChurnCol.RESERVE_CHANGES).fill_null(0))
        .cast(schema)
    )


def _growth(table: pl.DataFrame) -> float | None:
    """Slope of allocated-at-end over the steady steps that have events; None under two."""
    y = table.filter(pl.col(ChurnCol.STEADY) & pl.col(ChurnCol.ALLOCATED_AT_END).is_not_null()) \
        .get_column(ChurnCol.ALLOCATED_AT_END).to_numpy().astype(np.float64)
    if y.size < 2:
        return None
    x = np.arange(y.size, dtype=np.float64)
    return round(float(np.polyfit(x, y, 1)[0]), 1)  # to 0.1 B: a flat loop reads 0.0, not polyfit noise
