"""Memory from a profiler trace's ``[memory]`` events (``profile_memory=True``): allocated and
reserved bytes over time per device, the peak and what was running at it, the ops that
allocate most, churn and growth over the steady steps, and the ledger of what was live at the
peak; and the same ledger read from a memory-timeline export, whose categories are the profiler's own.

A Kineto trace has no categories, so its ledger is inferred from where each live block was
allocated (``LEDGER_RULES`` below) and says so (``ledger_source``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.host_activity import Flag, HostIndex, build_host_index
from tracewhy.analyses.steps import StepsOptions, StepsResult, WindowCol, step_windows, steps
from tracewhy.model.memory_timeline import EXPORT_CATEGORIES, LedgerCategory, MemoryTimeline, TimelineCol
from tracewhy.model.schema import KIND_CODE, Col, Kind, MCol
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

#: What ``DeviceMemory.ledger`` inference rests on, in the order the rules are tried (first match
#: wins); a block is "short-lived" when it is freed before the outermost op that allocated it ends.
LEDGER_RULES: Final = (
    ("comm_buckets", "allocated under a collective, DDP's Reducer or FSDP's flat parameters"),
    ("kv_cache", "allocated under a frame or op naming a KV cache / past_key_values"),
    ("inputs", "allocated under a DataLoader fetch"),
    ("gradients", "allocated in backward (or under AccumulateGrad) and not freed in backward"),
    ("optimizer_state", "allocated inside Optimizer.step and still live after that step ends"),
    ("temporaries", "allocated inside Optimizer.step and freed within it, in backward and freed in backward, "
                    "or short-lived"),
    ("parameters", "allocated before the first step and never freed"),
    ("activations", "allocated in forward and live beyond its op (freed in backward, or never)"),
    ("preexisting", "allocated before the trace began (the peak's bytes that no event in the trace explains)"),
)
_BACKWARD = re.compile(r"^autograd::engine::evaluate_function|Backward\d*$|^backward$", re.IGNORECASE)
_ACCUMULATE_GRAD = re.compile(r"AccumulateGrad")
_COMM_BUCKET = re.compile(r"Reducer|flat_?param|FlatParam")
_KV_CACHE = re.compile(r"kv_?cache|past_key_values|KVCache", re.IGNORECASE)
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
    peak_python_stack: tuple[str, ...]  # innermost first; empty without with_stack
    ledger: dict[str, int]  # LedgerCategory value -> bytes live at the peak
    timeline: pl.DataFrame  # ts_ns, total_allocated, total_reserved: the events' own totals
    steps: pl.DataFrame  # CHURN_SCHEMA
    growth_bytes_per_step: float | None  # least-squares slope of allocated-at-end over steady steps
    #: Where allocated comes from: the events' own "Total Allocated", or (traces of PyTorch < 1.10,
    #: which carry only "Bytes") the running sum of event sizes from the trace's start, as
    #: TensorBoard's plugin drew it: memory allocated before the trace is then missing.
    allocated_source: str = "total_allocated"

    @property
    def slack_at_peak_bytes(self) -> int | None:
        """Reserved but not allocated at the peak: cached free blocks and fragmentation."""
        if self.reserved_at_peak_bytes is None:
            return None
        return max(self.reserved_at_peak_bytes - self.peak_allocated_bytes, 0)


@dataclass(frozen=True)
class MemoryResult:
    devices: tuple[DeviceMemory, ...]
    top_ops: pl.DataFrame  # TOP_OPS_SCHEMA
    ledger_source: str  # "inferred": from where blocks were allocated (LEDGER_RULES)
    note: str | None = None


@dataclass(frozen=True)
class MemoryOptions:
    marker: str | None = None  # step annotation, as StepsOptions.marker
    warmup: int | None = None


@dataclass(frozen=True)
class TimelineResult:
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


@dataclass(frozen=True)
class _Context:
    """Per memory event (rows of the sorted events table): what the allocating stack held."""

    innermost: I64  # HostIndex row, -1 when no slice is open
    outermost_op: I64  # slice id of the outermost CPU op, -1 if none
    scope_end: I64  # end of that op (ns); -1 without one
    optimizer_end: I64  # end of the outermost optimizer slice on the stack; -1 without one
    bits: dict[str, B]


def analyze_memory(trace: Trace, options: MemoryOptions = MemoryOptions(), *, host: HostIndex | None = None,
                   step_result: StepsResult | None = None) -> MemoryResult:
    """``host`` and ``step_result``: the host index and steps already built for the trace (a
    diagnosis has them), so they are not built twice; else they are built here from ``options``."""
    trace.require_whole()
    ev = trace.memory.sort(MCol.TS, maintain_order=True).with_row_index("_seq")
    if ev.height == 0:
        empty = pl.DataFrame(schema=TOP_OPS_SCHEMA)
        return MemoryResult((), empty, "inferred", "no [memory] events: profile with profile_memory=True")
    labels = ev.select(MCol.DEVICE_TYPE, MCol.DEVICE_ID).unique()
    ev = ev.join(labels.with_columns(pl.Series("_device", [device_label(t, i) for t, i in labels.iter_rows()],
                                               dtype=pl.String)),
                 on=[MCol.DEVICE_TYPE, MCol.DEVICE_ID], how="left").sort("_seq")
    index = host if host is not None else build_host_index(trace)
    ctx = _contexts(trace, index, ev)
    op_names = trace.slices.get_column(Col.NAME).gather(np.maximum(ctx.outermost_op, 0)).cast(pl.String)
    op_names = pl.select(pl.when(pl.Series(ctx.outermost_op >= 0)).then(op_names).otherwise(pl.lit(NO_OP))).to_series()
    ev = ev.with_columns(op_names.alias("_op"),
                         pl.Series("_scope_end", ctx.scope_end), pl.Series("_opt_end", ctx.optimizer_end),
                         *[pl.Series(f"_{k}", v) for k, v in ctx.bits.items()],
                         pl.Series("_inner", ctx.innermost))
    st = step_result if step_result is not None else steps(trace, StepsOptions(marker=options.marker,
                                                                                warmup=options.warmup))
    windows = step_windows(trace, st).sort(WindowCol.WINDOW_START)
    ev = ev.with_columns(pl.Series("_pos", np.arange(ev.height, dtype=np.int64)))
    devices = tuple(_device(trace, index, part, windows)
                    for _, part in sorted(ev.group_by("_device"), key=lambda kv: str(kv[0][0])))
    return MemoryResult(devices, _top_ops(ev), "inferred")


def _contexts(trace: Trace, index: HostIndex, ev: pl.DataFrame) -> _Context:
    """Walk each event's stack once, up from its innermost slice: the outermost CPU op and the
    end of it, the outermost optimizer slice's end, and which ledger patterns the stack holds."""
    n = ev.height
    inner = np.full(n, -1, dtype=np.int64)
    pid, tid, ts = (ev.get_column(c).to_numpy() for c in (MCol.PID, MCol.TID, MCol.TS))
    threads, which = np.unique(np.stack([pid, tid], axis=1), axis=0, return_inverse=True)
    for i, (p, t) in enumerate(threads):
        rows = np.flatnonzero(which.ravel() == i)
        inner[rows] = index.innermost(int(p), int(t), ts[rows])
    names = trace.slices.get_column(Col.NAME).gather(index.ids)
    unique = [u for u in names.unique().to_list() if u is not None]

    def matching(pattern: re.Pattern[str]) -> B:
        hits = [u for u in unique if pattern.search(u)]
        return names.is_in(hits).to_numpy() if hits else np.zeros(index.ids.size, dtype=bool)

    own = {
        "backward": matching(_BACKWARD),
        "accumulate_grad": matching(_ACCUMULATE_GRAD),
        "comm": matching(_COMM_BUCKET) | index.self_flag[Flag.COMM],
        "kv_cache": matching(_KV_CACHE),
        "dataloader": index.self_flag[Flag.DATALOADER],
        "optimizer": index.self_flag[Flag.OPTIMIZER],
    }
    is_op = index.kind_code == KIND_CODE[Kind.CPU_OP.value]
    bits = {k: np.zeros(n, dtype=bool) for k in own}
    outer_op = np.full(n, -1, dtype=np.int64)
    scope_end = np.full(n, -1, dtype=np.int64)
    opt_end = np.full(n, -1, dtype=np.int64)
    todo = np.flatnonzero(inner >= 0)
    cur = inner[todo]
    while todo.size:
        for k, flags in own.items():
            bits[k][todo] |= flags[cur]
        op_here = is_op[cur]
        outer_op[todo[op_here]] = index.ids[cur[op_here]]
        scope_end[todo[op_here]] = index.end[cur[op_here]]
        opt_here = own["optimizer"][cur]
        opt_end[todo[opt_here]] = index.end[cur[opt_here]]
        cur = index.parent[cur]
        keep = cur >= 0
        todo, cur = todo[keep], cur[keep]
    return _Context(inner, outer_op, scope_end, opt_end, bits)


def _top_ops(ev: pl.DataFrame) -> pl.DataFrame:
    b = pl.col(MCol.BYTES)
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
    if ev.get_column(MCol.TOTAL_ALLOCATED).null_count() == ev.height:
        source = "running_sum"
        ev = ev.with_columns(pl.col(MCol.BYTES).cum_sum().alias(MCol.TOTAL_ALLOCATED))
    alloc = ev.get_column(MCol.TOTAL_ALLOCATED).fill_null(strategy="forward").fill_null(0).to_numpy()
    reserved_col = ev.get_column(MCol.TOTAL_RESERVED)
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
    w = int(np.searchsorted(starts, peak[MCol.TS], side="right")) - 1
    in_step = w >= 0 and peak[MCol.TS] < ends[w]
    return DeviceMemory(
        device=str(peak["_device"]), events=ev.height, peak_allocated_bytes=int(alloc[at]),
        peak_reserved_bytes=None if reserved is None else int(reserved.max()),
        reserved_at_peak_bytes=None if reserved is None else int(reserved[at]),
        peak_ts_ns=int(peak[MCol.TS]),
        peak_step=str(windows.get_column(WindowCol.STEP)[w]) if in_step else None,
        peak_op=None if peak["_op"] == NO_OP else str(peak["_op"]),
        peak_innermost_op=ctx_name(index.op_ctx), peak_annotation=ctx_name(index.annotation_ctx),
        peak_python_stack=_python_stack(index, names, inner),
        ledger=_ledger(ev, at, starts, int(alloc[at])),
        timeline=ev.select(MCol.TS, MCol.TOTAL_ALLOCATED, MCol.TOTAL_RESERVED),
        steps=(table := _churn(ev, windows)),
        growth_bytes_per_step=_growth(table),
        allocated_source=source,
    )


def _python_stack(index: HostIndex, names: pl.Series, inner: int) -> tuple[str, ...]:
    out: list[str] = []
    cur = inner
    python = KIND_CODE[Kind.PYTHON.value]
    while cur >= 0:
        if index.kind_code[cur] == python:
            out.append(str(names[int(index.ids[cur])]))
        cur = int(index.parent[cur])
    return tuple(out)


def _ledger(ev: pl.DataFrame, at: int, step_starts: I64, peak: int) -> dict[str, int]:
    """Bytes live at the peak by LEDGER_RULES. Allocations pair with the next event at the same
    address; one with no free before the peak (``at``, the row in ``ev``) is live there. Events
    without addresses (PyTorch < 1.10) cannot be paired: all of the peak is then unknown."""
    if ev.get_column(MCol.ADDR).null_count():
        return {LedgerCategory.UNKNOWN.value: peak}
    paired = (
        ev.with_columns(pl.int_range(pl.len()).alias("_row"))
        .sort(MCol.ADDR, "_row")
        .with_columns(pl.col("_row").shift(-1).over(MCol.ADDR).alias("_next_row"),
                      pl.col(MCol.BYTES).shift(-1).over(MCol.ADDR).alias("_next_bytes"),
                      pl.col(MCol.TS).shift(-1).over(MCol.ADDR).alias("_free_ts"),
                      pl.col("_backward").shift(-1).over(MCol.ADDR).alias("_freed_in_backward"))
        .filter(pl.col(MCol.BYTES) > 0)
        .with_columns(pl.when(pl.col("_next_bytes") < 0).then(pl.col("_next_row")).alias("_free_row"))
        .with_columns(pl.when(pl.col("_next_bytes") < 0).then(pl.col("_free_ts")).alias("_free_ts"))
    )
    live = paired.filter((pl.col("_row") <= at) & (pl.col("_free_row").is_null() | (pl.col("_free_row") > at)))
    first_step = int(step_starts[0]) if step_starts.size else None
    freed = pl.col("_free_ts").is_not_null()
    short = freed & (pl.col("_free_ts") <= pl.col("_scope_end"))
    before_steps = pl.lit(False) if first_step is None else pl.col(MCol.TS) < first_step
    category = (
        pl.when(pl.col("_comm")).then(pl.lit(LedgerCategory.COMM_BUCKETS.value))
        .when(pl.col("_kv_cache")).then(pl.lit(LedgerCategory.KV_CACHE.value))
        .when(pl.col("_dataloader")).then(pl.lit(LedgerCategory.INPUTS.value))
        .when((pl.col("_accumulate_grad") | pl.col("_backward")) & ~short & ~(freed & pl.col("_freed_in_backward")))
        .then(pl.lit(LedgerCategory.GRADIENTS.value))
        .when(pl.col("_optimizer") & (~freed | (pl.col("_free_ts") > pl.col("_opt_end"))))
        .then(pl.lit(LedgerCategory.OPTIMIZER_STATE.value))
        .when(pl.col("_optimizer") | pl.col("_backward") | short).then(pl.lit(LedgerCategory.TEMPORARIES.value))
        .when(before_steps & ~freed).then(pl.lit(LedgerCategory.PARAMETERS.value))
        .otherwise(pl.lit(LedgerCategory.ACTIVATIONS.value))
    )
    sums = live.group_by(category.alias("_cat")).agg(pl.col(MCol.BYTES).sum())
    ledger = {c.value: 0 for c in LedgerCategory if c is not LedgerCategory.AUTOGRAD_DETAIL
              and c is not LedgerCategory.UNKNOWN}
    for cat, nbytes in sums.iter_rows():
        ledger[str(cat)] = int(nbytes)
    explained = sum(ledger.values())
    ledger[LedgerCategory.PREEXISTING.value] = max(peak - explained, 0)
    return ledger


def _churn(ev: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Allocations, frees and bytes cycled per step window, and allocated at its end."""
    schema = CHURN_SCHEMA
    if windows.height == 0:
        return pl.DataFrame(schema=schema)
    starts = windows.get_column(WindowCol.WINDOW_START).to_numpy()
    ends = windows.get_column(WindowCol.WINDOW_END).to_numpy()
    ts = ev.get_column(MCol.TS).to_numpy()
    w = np.searchsorted(starts, ts, side="right") - 1
    inside = (w >= 0) & (ts < ends[np.maximum(w, 0)])
    b = pl.col(MCol.BYTES)
    per = (
        ev.with_columns(pl.Series("_w", np.where(inside, w, -1)),
                        (pl.col(MCol.TOTAL_RESERVED) != pl.col(MCol.TOTAL_RESERVED).shift(1)).fill_null(False)
                        .alias("_reserve_change"))
        .filter(pl.col("_w") >= 0)
        .group_by("_w")
        .agg((b > 0).sum().cast(pl.Int64).alias(ChurnCol.ALLOCATIONS),
             (b < 0).sum().cast(pl.Int64).alias(ChurnCol.FREES),
             b.filter(b > 0).sum().alias(ChurnCol.BYTES_ALLOCATED),
             pl.col(MCol.TOTAL_ALLOCATED).last().alias(ChurnCol.ALLOCATED_AT_END),
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
