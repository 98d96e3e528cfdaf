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
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.api_names import is_sync_call
from tracewhy.analyses.nvtx import gpu_projection
from tracewhy.analyses.steps import (
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

I64 = npt.NDArray[np.int64]

#: A synchronize that starts this soon after a block's end still ends that block: Python
#: returns from the ``with record_function(...)`` and calls ``torch.cuda.synchronize()`` in a
#: few microseconds; 1 ms leaves room for a slow host without reaching into the next block.
SYNC_AFTER_BLOCK_NS: Final = 1_000_000
#: Per-instance suffixes torch.autograd.profiler.emit_nvtx adds to range names: one block per op.
_INSTANCE_SUFFIX: Final = api_names.OP_RANGE_SUFFIX


@dataclass(frozen=True)
class BlocksOptions:
    names: tuple[str, ...] = ()  # fnmatch patterns; empty: every annotation but the step marker
    step_marker: str | None = None
    warmup: int | None = None


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
    SYNCED: Final = "synced"


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
    BlockCol.SYNCED: pl.Boolean(),
})


@dataclass(frozen=True)
class BlocksResult:
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

    @property
    def synced_share(self) -> float | None:
        """Share of blocks with GPU work that a synchronize ended (None without such blocks)."""
        gpu = int(self.table.get_column(BlockCol.GPU_INSTANCES).sum()) if self.table.height else 0
        return int(self.table.get_column(BlockCol.SYNCED_INSTANCES).sum()) / gpu if gpu else None


def blocks(
    trace: Trace, options: BlocksOptions = BlocksOptions(), steps_result: StepsResult | None = None
) -> BlocksResult:
    trace.require_whole()
    st = steps_result or steps(trace, StepsOptions(marker=options.step_marker, warmup=options.warmup))
    inst = _instances(trace, st)
    if options.names:
        inst = inst.filter(pl.col(Col.NAME).map_elements(
            lambda n: any(fnmatch.fnmatchcase(n, p) for p in options.names), return_dtype=pl.Boolean))
    windows = step_windows(trace, st)
    n_steps = int(windows.get_column(WindowCol.STEADY).sum())
    span = steady_span(windows)
    note = st.note
    if span is not None:
        chosen = inst.filter(pl.col(BlockCol.STEADY))
        lo, hi = span
    else:
        chosen, lo, hi, n_steps = inst, None, None, 1
        note = f"{note}; values are per capture, not per step" if note else "values are per capture, not per step"
    total_gpu = _gpu_time_launched(trace, lo, hi)
    table = (
        chosen.group_by(BlockCol.NAME)
        .agg(
            pl.col(BlockCol.DEPTH).min().cast(pl.Int64).alias(BlockCol.LEVEL),
            pl.len().cast(pl.Int64).alias(BlockCol.INSTANCES),
            (pl.col(BlockCol.DUR).sum() / n_steps).alias(BlockCol.CPU_PER_STEP),
            (pl.col(BlockCol.GPU_TIME).sum() / n_steps).alias(BlockCol.GPU_TIME_PER_STEP),
            (pl.col(BlockCol.GPU_SPAN).sum() / n_steps).alias(BlockCol.GPU_SPAN_PER_STEP),
            (pl.col(BlockCol.OTHER_THREADS_GPU).sum() / n_steps).alias(BlockCol.OTHER_THREADS_GPU_PER_STEP),
            (pl.col(BlockCol.GPU_OPS) > 0).sum().cast(pl.Int64).alias(BlockCol.GPU_INSTANCES),
            pl.col(BlockCol.SYNCED).sum().cast(pl.Int64).alias(BlockCol.SYNCED_INSTANCES),
        )
        .with_columns((pl.col(BlockCol.GPU_TIME_PER_STEP) * n_steps / total_gpu if total_gpu
                       else pl.lit(None, pl.Float64)).alias(BlockCol.GPU_SHARE))
        .sort([BlockCol.GPU_TIME_PER_STEP, BlockCol.CPU_PER_STEP, BlockCol.NAME], descending=[True, True, False])
        .select(*BLOCKS_SCHEMA)
    )
    return BlocksResult(table=table, instances=inst, steps=n_steps, gpu_time_ns_per_step=total_gpu / n_steps,
                        step_marker=st.marker, note=note)


def _instances(trace: Trace, st: StepsResult) -> pl.DataFrame:
    a = trace.of_kind(Kind.ANNOTATION).select(
        Col.ID, pl.col(Col.NAME).cast(pl.String), Col.TS, Col.DUR, Col.PID, Col.TID, Col.DEPTH
    ).filter(
        ~pl.col(Col.NAME).str.starts_with(st.marker) & ~pl.col(Col.NAME).str.starts_with(PROFILER_STEP)
    ).with_columns(pl.col(Col.NAME).str.replace(_INSTANCE_SUFFIX, ""))
    proj = gpu_projection(trace).table.select(
        Col.ID, pl.col("num_gpu_ops").alias(BlockCol.GPU_OPS), pl.col("gpu_time_ns").alias(BlockCol.GPU_TIME),
        pl.col("gpu_busy_ns").alias(BlockCol.GPU_BUSY), pl.col("proj_dur_ns").alias(BlockCol.GPU_SPAN),
    )
    a = a.join(proj, on=Col.ID, how="left").with_columns(
        pl.col(BlockCol.GPU_OPS, BlockCol.GPU_TIME, BlockCol.GPU_BUSY, BlockCol.GPU_SPAN).fill_null(0)
    ).sort(Col.TS, Col.ID)
    window_gpu = _launched_in(trace, a)
    a = a.with_columns(
        (pl.Series(window_gpu) - pl.col(BlockCol.GPU_TIME)).clip(lower_bound=0).alias(BlockCol.OTHER_THREADS_GPU),
        pl.Series(BlockCol.SYNCED, _synced(trace, a), dtype=pl.Boolean),
    )
    w = step_windows(trace, st).sort(WindowCol.WINDOW_START)
    inside = pl.col(Col.TS) < pl.col(WindowCol.WINDOW_END)
    return a.join_asof(
        w.select(WindowCol.PID, WindowCol.WINDOW_START, WindowCol.WINDOW_END, WindowCol.NUMBER, WindowCol.STEADY),
        left_on=Col.TS, right_on=WindowCol.WINDOW_START, by=Col.PID, strategy="backward",
        check_sortedness=False,  # both sides are sorted by time above
    ).with_columns(
        pl.when(inside).then(pl.col(WindowCol.NUMBER)).alias(BlockCol.STEP),
        (pl.col(WindowCol.STEADY).fill_null(False) & inside).fill_null(False).alias(BlockCol.STEADY),
    ).select(*BLOCK_INSTANCES_SCHEMA)


def _gpu_rows(trace: Trace) -> pl.DataFrame:
    """GPU activities with the host time and process of their launch (their own start and
    process when the launch was not recorded). Columns: _t, _pid, dur_ns."""
    s = trace.slices
    g = trace.of_kind(*GPU_ACTIVITY_KINDS).select(Col.LAUNCH, Col.TS, Col.PID, Col.DUR)
    launch = g.get_column(Col.LAUNCH).fill_null(-1).to_numpy()
    has = launch >= 0
    ts_all, pid_all = s.get_column(Col.TS).to_numpy(), s.get_column(Col.PID).fill_null(-1).to_numpy()
    t = np.where(has, ts_all[np.maximum(launch, 0)], g.get_column(Col.TS).to_numpy())
    pid = np.where(has, pid_all[np.maximum(launch, 0)], g.get_column(Col.PID).fill_null(-1).to_numpy())
    return pl.DataFrame({"_t": t, "_pid": pid, Col.DUR: g.get_column(Col.DUR).to_numpy()})


def _gpu_time_launched(trace: Trace, lo: int | None, hi: int | None) -> int:
    g = _gpu_rows(trace)
    if lo is not None and hi is not None:
        g = g.filter((pl.col("_t") >= lo) & (pl.col("_t") < hi))
    return int(g.get_column(Col.DUR).sum()) if g.height else 0


def _launched_in(trace: Trace, a: pl.DataFrame) -> I64:
    """GPU time launched by any thread of each range's process while the range was open."""
    g = _gpu_rows(trace).sort("_pid", "_t")
    out = np.zeros(a.height, dtype=np.int64)
    pids = a.get_column(Col.PID).fill_null(-1).to_numpy()
    starts = a.get_column(Col.TS).to_numpy()
    ends = starts + a.get_column(Col.DUR).to_numpy()
    for pid in np.unique(pids):
        gp = g.filter(pl.col("_pid") == pid)
        t = gp.get_column("_t").to_numpy()
        cum = np.concatenate(([0], np.cumsum(gp.get_column(Col.DUR).to_numpy())))
        m = pids == pid
        out[m] = cum[np.searchsorted(t, ends[m], side="left")] - cum[np.searchsorted(t, starts[m], side="left")]
    return out


def _synced(trace: Trace, a: pl.DataFrame) -> list[bool | None]:
    """Per range: did a synchronize follow its last launch (before any other launch, at the
    latest SYNC_AFTER_BLOCK_NS after its end)? None for ranges that launched nothing."""
    s = trace.slices
    gpu = s.filter(pl.col(Col.KIND).is_in([k.value for k in GPU_ACTIVITY_KINDS]))
    launched = gpu.get_column(Col.LAUNCH).drop_nulls()
    calls = trace.of_kind(*LAUNCH_KINDS).select(Col.ID, pl.col(Col.NAME).cast(pl.String), Col.TS, Col.PID, Col.TID)
    sync_names = [n for n in calls.get_column(Col.NAME).unique().to_list() if is_sync_call(n)]
    calls = calls.with_columns(
        pl.col(Col.ID).is_in(launched.implode()).alias("_launch"), pl.col(Col.NAME).is_in(sync_names).alias("_sync")
    ).filter(pl.col("_launch") | pl.col("_sync")).sort(Col.PID, Col.TID, Col.TS)
    out: list[bool | None] = [None] * a.height
    by_thread = dict(calls.group_by(Col.PID, Col.TID))
    for (pid, tid), rows in a.with_row_index("_row").group_by(Col.PID, Col.TID):
        c = by_thread.get((pid, tid))
        if c is None:
            continue
        ts = c.get_column(Col.TS).to_numpy()
        is_launch = c.get_column("_launch").to_numpy()
        is_sync = c.get_column("_sync").to_numpy()
        pos = np.arange(ts.size)
        last_launch = np.maximum.accumulate(np.where(is_launch, pos, -1))
        r_ts = rows.get_column(Col.TS).to_numpy()
        r_end = r_ts + rows.get_column(Col.DUR).to_numpy()
        lo = np.searchsorted(ts, r_ts, side="left")
        hi = np.searchsorted(ts, r_end, side="left")
        # All ranges of the thread at once (millions of NVTX ranges in a large nsys export).
        last = np.where(hi > lo, last_launch[np.maximum(hi - 1, 0)], -1)
        launched_in = last >= lo
        nxt = np.minimum(last + 1, ts.size - 1)
        synced = (last + 1 < ts.size) & is_sync[nxt] & (ts[nxt] <= r_end + SYNC_AFTER_BLOCK_NS)
        for row, flag in zip(rows.get_column("_row").to_numpy()[launched_in].tolist(),
                             synced[launched_in].tolist(), strict=True):
            out[row] = flag
    return out
