"""Which annotated block gates the step: the GPU work each ``record_function`` / user annotation
range launched, per step and as a share of the step's GPU time, and whether a synchronize ends
the blocks (then the per-block times are attribution, not throughput).

A block owns the GPU work whose launching call ran while the block was on the launching
thread's stack (the NVTX GPU projection of analyses/nvtx.py, applied to Kineto annotations).
Work that other threads of the process launched while the block was open (the autograd
engine's backward thread, for a ``backward`` block on the main thread) is counted apart.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.api_names import is_sync_call
from tracewhy.analyses.nvtx_work import GpuWork, WorkCol, gpu_work, search_by_thread, thread_codes
from tracewhy.analyses.steps import (
    MARKED,
    PROFILER_STEP,
    StepsOptions,
    StepsResult,
    WindowCol,
    steady_span,
    step_windows,
    steps,
)
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, LAUNCH_KINDS, Col, Kind
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows

I64 = npt.NDArray[np.int64]

#: A synchronize ends a block when it is the next launch or sync call on the block's thread after
#: the block's last launch (so no other GPU work comes between) and starts at most this long after
#: the block's end. The order of calls is what ties the sync to the block; the window only stops a
#: sync long after (the next step's ``loss.item()`` past seconds of host work) from counting. Python
#: leaves ``with record_function(...)`` and reaches ``torch.cuda.synchronize()`` in a few µs, a
#: timing harness that reads a clock and logs in between in 0.1-0.5 ms; 1 ms holds both.
SYNC_AFTER_BLOCK_NS: Final = 1_000_000
#: Per-instance suffixes torch.autograd.profiler.emit_nvtx adds to range names: one block per op.
_INSTANCE_SUFFIX: Final = api_names.OP_RANGE_SUFFIX
#: Ranges ``_synced`` looks at a time.
_SYNC_CHUNK: Final = 1 << 20
#: Ranges whose columns are made at a time (``_instances``).
_CHUNK: Final = 1 << 20


@dataclass(frozen=True)
class BlocksOptions:
    names: tuple[str, ...] = ()  # fnmatch patterns; empty: every annotation but the step marker
    step_marker: str | None = None
    warmup: int | None = None
    #: False: ``instances`` comes back empty. diagnose reads only the table, and one row per
    #: range is millions of rows (0.6 GB) on a large nsys export.
    instances: bool = True


class BlockCol:
    """Columns of the BlocksResult tables."""

    # table: one row per block name
    NAME: Final = Col.NAME
    LEVEL: Final = "level"  # smallest nesting depth of its instances
    INSTANCES: Final = "instances"
    CPU_PER_STEP: Final = "cpu_ns_per_step"  # its ranges' host time
    GPU_TIME_PER_STEP: Final = "gpu_time_ns_per_step"  # sum of the durations of the GPU work it launched
    GPU_SHARE: Final = "gpu_share"  # of all GPU time launched in the window
    #: First launched activity start to last end, per instance, summed.
    GPU_SPAN_PER_STEP: Final = "gpu_span_ns_per_step"
    OTHER_THREADS_GPU_PER_STEP: Final = "other_threads_gpu_ns_per_step"
    GPU_INSTANCES: Final = "gpu_instances"  # instances that launched GPU work
    SYNCED_INSTANCES: Final = "synced_instances"  # of those, how many a synchronize ended
    # instances: one row per range
    ID: Final = Col.ID
    TS: Final = Col.TS
    DUR: Final = Col.DUR
    PID: Final = Col.PID
    TID: Final = Col.TID
    DEPTH: Final = Col.DEPTH
    STEP: Final = "step"  # the step's number
    STEADY: Final = WindowCol.STEADY
    GPU_OPS: Final = "gpu_ops"
    GPU_TIME: Final = "gpu_time_ns"
    GPU_BUSY: Final = "gpu_busy_ns"
    GPU_SPAN: Final = "gpu_span_ns"
    OTHER_THREADS_GPU: Final = "other_threads_gpu_ns"
    SYNCED: Final = "synced"  # null when it launched nothing
    SYNC_ID: Final = "sync_id"  # the synchronize call (its slice id) that ended it; null when none


BLOCKS_SCHEMA: Final = pl.Schema({
    BlockCol.NAME: pl.String(), BlockCol.LEVEL: pl.Int64(), BlockCol.INSTANCES: pl.Int64(),
    BlockCol.CPU_PER_STEP: pl.Float64(), BlockCol.GPU_TIME_PER_STEP: pl.Float64(), BlockCol.GPU_SHARE: pl.Float64(),
    BlockCol.GPU_SPAN_PER_STEP: pl.Float64(), BlockCol.OTHER_THREADS_GPU_PER_STEP: pl.Float64(),
    BlockCol.GPU_INSTANCES: pl.Int64(), BlockCol.SYNCED_INSTANCES: pl.Int64(),
})
BLOCK_INSTANCES_SCHEMA: Final = pl.Schema({
    BlockCol.ID: pl.Int64(), BlockCol.NAME: pl.String(), BlockCol.TS: pl.Int64(), BlockCol.DUR: pl.Int64(),
    BlockCol.PID: pl.Int64(), BlockCol.TID: pl.Int64(), BlockCol.DEPTH: pl.Int32(), BlockCol.STEP: pl.Int64(),
    BlockCol.STEADY: pl.Boolean(), BlockCol.GPU_OPS: pl.Int64(), BlockCol.GPU_TIME: pl.Int64(),
    BlockCol.GPU_BUSY: pl.Int64(), BlockCol.GPU_SPAN: pl.Int64(), BlockCol.OTHER_THREADS_GPU: pl.Int64(),
    BlockCol.SYNCED: pl.Boolean(), BlockCol.SYNC_ID: pl.Int64(),
})


@dataclass(frozen=True)
class BlocksResult(Rows, rows="table", key="name"):
    """``table`` (BLOCKS_SCHEMA): one row per block name, most GPU time first, over the steady
    steps (the whole capture when there are no steps; then ``per_step`` values are per capture).
    ``instances`` (BLOCK_INSTANCES_SCHEMA): one row per range. See BlockCol.
    """

    table: pl.DataFrame
    instances: pl.DataFrame
    steps: int
    gpu_time_ns_per_step: float
    step_marker: str
    note: str | None
    #: Distinct synchronize calls that ended a block with GPU work, over the same window as
    #: ``table`` (nested blocks that one synchronize ends count it once).
    ending_syncs: int
    #: No steady steps: ``table`` and ``ending_syncs`` cover the whole capture (``steps`` is 1).
    per_capture: bool

    @property
    def synced_share(self) -> float | None:
        """Share of blocks with GPU work that a synchronize ended (None without such blocks)."""
        gpu = int(self.table.get_column(BlockCol.GPU_INSTANCES).sum()) if self.table.height else 0
        return int(self.table.get_column(BlockCol.SYNCED_INSTANCES).sum()) / gpu if gpu else None


def blocks(
    trace: Trace, options: BlocksOptions = BlocksOptions(), steps_result: StepsResult | None = None,
    work: GpuWork | None = None,
) -> BlocksResult:
    """``work``: ``gpu_work(trace)``, when the caller has it (diagnose shares it with the report)."""
    trace.require_whole()
    steps_result = steps_result or steps(trace, StepsOptions(marker=options.step_marker, warmup=options.warmup))
    gpu = _gpu_rows(trace)
    chunks, names = _instances(trace, steps_result, options, work or gpu_work(trace), gpu)
    windows = step_windows(trace, steps_result)
    n_steps = int(windows.get_column(WindowCol.STEADY).sum())
    span = steady_span(windows)
    note = steps_result.note
    if span is not None:
        lo, hi = span
    else:
        lo, hi, n_steps = None, None, 1
        note = f"{note}; values are per capture, not per step" if note else "values are per capture, not per step"
    # Summed a chunk of ranges at a time (sums per name, then of those), each chunk's columns let
    # go before the next is made: all at once they were 0.3 GB over 4.8 M ranges of a large export.
    sums, syncs, kept = [], [], []
    for inst in chunks:
        chosen = inst.lazy().filter(pl.col(BlockCol.STEADY)) if span is not None else inst.lazy()
        sums.append(_sums_per_name(chosen))
        syncs.append(chosen.select(pl.col(BlockCol.SYNC_ID).drop_nulls().unique()).collect().get_column(
            BlockCol.SYNC_ID))
        if options.instances:
            kept.append(inst)
        del chosen, inst
    total_gpu = _gpu_time_launched(gpu, lo, hi)
    table = _table(pl.concat(sums), names, n_steps, total_gpu)
    ending_syncs = pl.concat(syncs).n_unique()
    instances = pl.concat(kept).with_columns(pl.col(Col.NAME).cast(pl.String).str.replace(_INSTANCE_SUFFIX, "")).select(
        *BLOCK_INSTANCES_SCHEMA) if options.instances else pl.DataFrame(schema=BLOCK_INSTANCES_SCHEMA)
    return BlocksResult(table=table, instances=instances, steps=n_steps, gpu_time_ns_per_step=total_gpu / n_steps,
                        step_marker=steps_result.marker, note=note, ending_syncs=ending_syncs,
                        per_capture=span is None)


def _sums_per_name(chosen: pl.LazyFrame) -> pl.DataFrame:
    """Per annotation name (a categorical code, no string per range) of these ranges: the least
    depth, the count and the sums ``_table`` adds up over every chunk of ranges."""
    return chosen.group_by(Col.NAME).agg(
        pl.col(BlockCol.DEPTH).min().alias(BlockCol.LEVEL), pl.len().alias(BlockCol.INSTANCES),
        pl.col(Col.DUR).sum().alias(BlockCol.CPU_PER_STEP), pl.col(BlockCol.GPU_TIME).sum(),
        pl.col(BlockCol.GPU_SPAN).sum(), pl.col(BlockCol.OTHER_THREADS_GPU).sum(),
        (pl.col(BlockCol.GPU_OPS) > 0).sum().alias(BlockCol.GPU_INSTANCES),
        pl.col(BlockCol.SYNCED).sum().alias(BlockCol.SYNCED_INSTANCES),
    ).collect()


def _table(sums: pl.DataFrame, names: pl.DataFrame, n_steps: int, total_gpu: int) -> pl.DataFrame:
    """BLOCKS_SCHEMA: the chunks' ``_sums_per_name`` per annotation name (integers: exact in any
    order), then per block name (emit_nvtx's per-call suffix dropped) over those few rows."""
    added = (BlockCol.INSTANCES, BlockCol.CPU_PER_STEP, BlockCol.GPU_TIME, BlockCol.GPU_SPAN,
             BlockCol.OTHER_THREADS_GPU, BlockCol.GPU_INSTANCES, BlockCol.SYNCED_INSTANCES)
    per_name = sums.group_by(Col.NAME).agg(pl.col(BlockCol.LEVEL).min(), *(pl.col(c).sum() for c in added)).join(
        names, left_on=Col.NAME, right_on="_raw").drop(Col.NAME).rename({"_block": BlockCol.NAME})
    counts = (BlockCol.INSTANCES, BlockCol.GPU_INSTANCES, BlockCol.SYNCED_INSTANCES)
    return (
        per_name.group_by(BlockCol.NAME)
        .agg(pl.col(BlockCol.LEVEL).min().cast(pl.Int64), *(pl.col(c).sum().cast(pl.Int64) for c in counts),
             *(pl.col(c).sum() / n_steps for c in (BlockCol.CPU_PER_STEP, BlockCol.GPU_TIME, BlockCol.GPU_SPAN,
                                                    BlockCol.OTHER_THREADS_GPU)))
        .rename({BlockCol.GPU_TIME: BlockCol.GPU_TIME_PER_STEP, BlockCol.GPU_SPAN: BlockCol.GPU_SPAN_PER_STEP,
                 BlockCol.OTHER_THREADS_GPU: BlockCol.OTHER_THREADS_GPU_PER_STEP})
        .with_columns((pl.col(BlockCol.GPU_TIME_PER_STEP) * n_steps / total_gpu if total_gpu
                       else pl.lit(None, pl.Float64)).alias(BlockCol.GPU_SHARE))
        .sort([BlockCol.GPU_TIME_PER_STEP, BlockCol.CPU_PER_STEP, BlockCol.NAME], descending=[True, True, False])
        .select(*BLOCKS_SCHEMA)
    )


def _block_names(raw: pl.Series, marker: str, patterns: tuple[str, ...]) -> pl.DataFrame:
    """The annotation names that are blocks (``_raw``, as the trace's categorical) with their
    block name (``_block``): not the step marker, emit_nvtx's suffix dropped, matching
    ``patterns`` when given. One row per distinct name, so strings are made only for these."""
    text = raw.cast(pl.String)
    names = pl.DataFrame({"_raw": raw, "_block": text.str.replace(_INSTANCE_SUFFIX, "")}).filter(
        ~text.str.starts_with(marker) & ~text.str.starts_with(PROFILER_STEP)
    )
    if patterns:
        names = names.filter(pl.col("_block").map_elements(
            lambda n: any(fnmatch.fnmatchcase(n, p) for p in patterns), return_dtype=pl.Boolean))
    return names


def _instances(
    trace: Trace, steps_result: StepsResult, options: BlocksOptions, work: GpuWork, gpu: pl.DataFrame
) -> tuple[Iterator[pl.DataFrame], pl.DataFrame]:
    """BLOCK_INSTANCES_SCHEMA's columns, the name still the trace's categorical, in chunks of
    ``_CHUNK`` ranges in time order, and the block names (``_block_names``). Narrow columns, a
    chunk at a time: a large nsys export has millions of ranges, each column 38 MB over 4.8 M."""
    # Iterations found from a block (the optimizer's step, a user's "forward") leave it a block.
    marker = steps_result.marker if steps_result.source == MARKED else PROFILER_STEP
    names = _block_names(trace.kind_columns((Kind.ANNOTATION,), Col.NAME).get_column(Col.NAME).unique(), marker,
                         options.names)
    # Rows filtered before their columns are copied: the ranges are copied once.
    a = trace.slices_where(
        (pl.col(Col.KIND) == Kind.ANNOTATION.value) & pl.col(Col.NAME).is_in(names.get_column("_raw").implode()),
        Col.ID, Col.NAME, Col.TS, Col.DUR, Col.PID, Col.TID, Col.DEPTH)
    # Slice ids ascend in slice order: times that ascend too mean the (time, id) order already.
    if not a.get_column(Col.TS).is_sorted():
        a = a.sort(Col.TS, Col.ID)
    return _chunks(trace, steps_result, a, work, gpu), names


def _chunks(trace: Trace, steps_result: StepsResult, a: pl.DataFrame, work: GpuWork, gpu: pl.DataFrame
            ) -> Iterator[pl.DataFrame]:
    """``_instances``' chunks of the ranges ``a`` (in time order): what needs every range at once
    (the sync that ends each, the GPU time launched in each) as arrays first, the measure with
    the largest temporaries first; then each chunk's columns."""
    ends = _sync_ends(trace, a)
    pids = a.get_column(Col.PID).fill_null(-1).to_numpy()
    starts = a.get_column(Col.TS).to_numpy()
    launched = _launched_in(gpu, pids, starts, starts + a.get_column(Col.DUR).to_numpy())
    del pids, starts
    w = step_windows(trace, steps_result).sort(WindowCol.WINDOW_START)
    inside = pl.col(Col.TS) < pl.col(WindowCol.WINDOW_END)
    right = w.select(WindowCol.PID, WindowCol.WINDOW_START, WindowCol.WINDOW_END, WindowCol.NUMBER, WindowCol.STEADY)
    for lo in range(0, a.height or 1, _CHUNK):
        c = a.slice(lo, _CHUNK)
        rows = slice(lo, lo + c.height)
        c = c.with_columns(_synced(ends, rows, c.height))
        c = c.with_columns(_measures(c.get_column(Col.ID).to_numpy(), work))
        other = (pl.Series(launched[rows]) - pl.col(BlockCol.GPU_TIME)).clip(lower_bound=0)
        c = c.with_columns(other.alias(BlockCol.OTHER_THREADS_GPU))
        # The join takes the two key columns only (it copies every column it is given); its rows
        # are the ranges' in order, so its result is added to them as columns.
        step_of = c.select(Col.TS, Col.PID).join_asof(
            right, left_on=Col.TS, right_on=WindowCol.WINDOW_START, by=Col.PID, strategy="backward",
            check_sortedness=False,  # both sides are sorted by time above
        ).select(
            pl.when(inside).then(pl.col(WindowCol.NUMBER)).alias(BlockCol.STEP),
            (pl.col(WindowCol.STEADY).fill_null(False) & inside).fill_null(False).alias(BlockCol.STEADY),
        )
        yield c.with_columns(step_of.get_columns()).select(*BLOCK_INSTANCES_SCHEMA)


def _measures(ids: I64, work: GpuWork) -> list[pl.Series]:
    """The GPU work of the ranges ``ids`` (0 for none), looked up in ``work.table`` (sorted by
    id) by binary search: a join would copy every column of millions of ranges once more."""
    work_ids = work.table.get_column(WorkCol.ID).to_numpy()
    at = np.minimum(np.searchsorted(work_ids, ids), max(work_ids.size - 1, 0))
    found = work_ids[at] == ids if work_ids.size else np.zeros(ids.size, dtype=bool)
    pairs = ((BlockCol.GPU_OPS, WorkCol.GPU_OPS), (BlockCol.GPU_TIME, WorkCol.GPU_TIME),
             (BlockCol.GPU_BUSY, WorkCol.GPU_BUSY), (BlockCol.GPU_SPAN, WorkCol.PROJ_DUR))
    return [pl.Series(ours, np.where(found, work.table.get_column(theirs).to_numpy()[at], 0) if work_ids.size
                      else np.zeros(ids.size, dtype=np.int64)) for ours, theirs in pairs]


def _gpu_rows(trace: Trace) -> pl.DataFrame:
    """GPU activities with the host time and process of their launch (their own start and
    process when the launch was not recorded). Columns: _t, _pid, dur_ns."""
    s = trace.slices
    g = trace.kind_columns(GPU_ACTIVITY_KINDS, Col.LAUNCH, Col.TS, Col.PID, Col.DUR)
    launch = g.get_column(Col.LAUNCH).fill_null(-1).to_numpy()
    has = launch >= 0
    ts_all, pid_all = s.get_column(Col.TS).to_numpy(), s.get_column(Col.PID).fill_null(-1).to_numpy()
    t = np.where(has, ts_all[np.maximum(launch, 0)], g.get_column(Col.TS).to_numpy())
    pid = np.where(has, pid_all[np.maximum(launch, 0)], g.get_column(Col.PID).fill_null(-1).to_numpy())
    return pl.DataFrame({"_t": t, "_pid": pid, Col.DUR: g.get_column(Col.DUR).to_numpy()})


def _gpu_time_launched(g: pl.DataFrame, lo: int | None, hi: int | None) -> int:
    if lo is not None and hi is not None:
        g = g.filter((pl.col("_t") >= lo) & (pl.col("_t") < hi))
    return int(g.get_column(Col.DUR).sum()) if g.height else 0


def _launched_in(gpu: pl.DataFrame, pids: I64, starts: I64, ends: I64) -> I64:
    """GPU time launched by any thread of each range's process while the range was open."""
    g = gpu.sort("_pid", "_t")
    out = np.zeros(pids.size, dtype=np.int64)
    for pid in pl.Series(pids).unique().to_list():
        gp = g.filter(pl.col("_pid") == pid)
        t = gp.get_column("_t").to_numpy()
        cum = np.concatenate(([0], np.cumsum(gp.get_column(Col.DUR).to_numpy())))
        m = pids == pid
        out[m] = cum[np.searchsorted(t, ends[m], side="left")] - cum[np.searchsorted(t, starts[m], side="left")]
    return out


#: Per range: the id of the synchronize call that followed its last launch (-1: none), and
#: whether it launched anything (``_sync_ends``).
SyncEnds = tuple[I64, npt.NDArray[np.bool_]]


def _sync_ends(trace: Trace, a: pl.DataFrame) -> SyncEnds | None:
    """Per range: did a synchronize follow its last launch (before any other launch, at the
    latest SYNC_AFTER_BLOCK_NS after its end)? The id of that synchronize call (nested ranges
    that end together share it), or -1; and whether the range launched anything. None when the
    trace has no launch or sync call.

    All ranges at once over the launch and sync calls sorted by (thread, start): a range's calls
    are a slice of its thread's (millions of NVTX ranges in a large nsys export)."""
    launched = trace.kind_columns(GPU_ACTIVITY_KINDS, Col.LAUNCH).get_column(Col.LAUNCH).drop_nulls()
    calls = trace.kind_columns(LAUNCH_KINDS, Col.ID, Col.NAME, Col.TS, Col.PID, Col.TID)
    kinds = calls.get_column(Col.NAME).unique()
    sync_names = kinds.filter(kinds.cast(pl.String).map_elements(is_sync_call, return_dtype=pl.Boolean))
    calls = calls.select(
        Col.ID, Col.PID, Col.TID, Col.TS, pl.col(Col.ID).is_in(launched.implode()).alias("_launch"),
        pl.col(Col.NAME).is_in(sync_names.implode()).alias("_sync"),
    ).filter(pl.col("_launch") | pl.col("_sync"))
    if calls.height == 0:
        return None
    r_threads, c_thread = thread_codes(a, calls)
    calls = calls.with_columns(pl.Series("_thread", c_thread)).sort("_thread", Col.TS, maintain_order=True)
    thread, ts = calls.get_column("_thread").to_numpy(), calls.get_column(Col.TS).to_numpy()
    # The latest launch at or before each call (an earlier thread's when this one has none yet).
    last_launch = np.maximum.accumulate(np.where(calls.get_column("_launch").to_numpy(), np.arange(ts.size), -1))
    is_sync = calls.get_column("_sync").to_numpy()
    r_ts, r_dur = a.get_column(Col.TS).to_numpy(), a.get_column(Col.DUR).to_numpy()
    ending = np.full(a.height, -1, dtype=np.int64)  # the row in ``calls`` of the sync that ended it
    launched_in = np.zeros(a.height, dtype=bool)
    for lo_row in range(0, a.height, _SYNC_CHUNK):  # bounds the temporaries on millions of ranges
        rows = slice(lo_row, lo_row + _SYNC_CHUNK)
        r_thread, start = r_threads[rows], r_ts[rows]
        end = start + r_dur[rows]
        lo = search_by_thread(thread, ts, r_thread, start, "left")
        hi = search_by_thread(thread, ts, r_thread, end, "left")
        last = np.where(hi > lo, last_launch[np.maximum(hi - 1, 0)], -1)
        launched_in[rows] = last >= lo  # a launch before ``lo`` is outside the range
        nxt = np.minimum(last + 1, ts.size - 1)
        synced = ((last + 1 < np.searchsorted(thread, r_thread, side="right")) & is_sync[nxt]
                  & (ts[nxt] <= end + SYNC_AFTER_BLOCK_NS))
        ending[rows] = np.where(synced & launched_in[rows], nxt, -1)
    sync_id = np.where(ending >= 0, calls.get_column(Col.ID).to_numpy()[np.maximum(ending, 0)], -1)
    return sync_id, launched_in


def _synced(ends: SyncEnds | None, rows: slice, n: int) -> list[pl.Series]:
    """The ``n`` ranges ``rows``' columns from ``_sync_ends``: synced (null for a range that
    launched nothing) and the id of the synchronize call (null for none)."""
    if ends is None:
        return [pl.Series(BlockCol.SYNCED, [None] * n, dtype=pl.Boolean),
                pl.Series(BlockCol.SYNC_ID, [None] * n, dtype=pl.Int64)]
    sync_id, launched_in = ends[0][rows], ends[1][rows]
    ended = sync_id >= 0
    sync_col = pl.Series(BlockCol.SYNC_ID, sync_id).zip_with(pl.Series(ended),
                                                             pl.repeat(None, n, dtype=pl.Int64, eager=True))
    nulls: pl.Series = pl.repeat(None, n, dtype=pl.Boolean, eager=True)
    synced_out: pl.Series = pl.Series(BlockCol.SYNCED, ended).zip_with(pl.Series(launched_in), nulls)
    return [synced_out, sync_col]
