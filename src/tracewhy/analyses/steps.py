"""Training/inference steps: their spans on the CPU, the GPU work each launched, and
steady-window statistics with warm-up excluded."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.engine_iterations import engine_iterations
from tracewhy.analyses.host_activity import HostIndex, host_index_once
from tracewhy.analyses.intervals import covered_ns
from tracewhy.analyses.loop_iterations import IterationSource, LoopIterations, loop_iterations
from tracewhy.analyses.nvtx import nvtx_step_marker
from tracewhy.analyses.stats import nearest_ns
from tracewhy.analyses.step_marker import annotation_step_marker, numbers_past_int64_note
from tracewhy.analyses.step_notes import unlinked_kernels_note
from tracewhy.analyses.warmup import default_warmup
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, Kind
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows

PROFILER_STEP = "ProfilerStep"
#: ``StepsResult.source`` of steps the trace marks; iterations found otherwise carry their
#: ``loop_iterations.IterationSource``.
MARKED: Final = "steps"
_STEP_KINDS = (Kind.ANNOTATION.value, Kind.CPU_OP.value)


#: Step numbers at or past this do not fit the Int64 column (``ProfilerStep#99999999999999999999999``
#: in a hostile file); such a step keeps its name and has no number.
_INT64_LIMIT = 2**63


@dataclass(frozen=True)
class StepsOptions:
    marker: str | None = None  # None: ProfilerStep#N
    warmup: int | None = None  # None: default_warmup decides (the first iteration, or an outlier)


@dataclass(frozen=True)
class StepStats:
    """Statistics of the steady steps' durations. The mean and the percentiles (the median of an
    even count, interpolated p90 and p99) are rounded to the nearest nanosecond."""

    count: int
    mean_ns: int
    min_ns: int
    max_ns: int
    p50_ns: int
    p90_ns: int
    p99_ns: int


class StepCol:
    """Columns of ``StepsResult.table``, one row per step in time order."""

    NAME: Final = Col.NAME
    NUMBER: Final = "number"  # N of the marker's "#N"; null without one
    TS: Final = Col.TS  # the step's span on the CPU, as recorded
    DUR: Final = Col.DUR
    GPU_START: Final = "gpu_start_ns"
    GPU_END: Final = "gpu_end_ns"
    GPU_BUSY: Final = "gpu_busy_ns"  # union of the device activity the step launched
    KERNEL_COUNT: Final = "kernel_count"
    KERNEL_TIME: Final = "kernel_time_ns"
    #: End of the step's window: the next step's start (see ``steps``).
    WINDOW_END: Final = "window_end_ns"
    #: Where the step's own time ends: its CPU span or, when longer, the GPU's time on the work
    #: it launched after what was queued before it; the last step's window ends there.
    OWN_END: Final = "own_end_ns"
    STEADY: Final = "steady"  # not warm-up


STEPS_SCHEMA: Final = pl.Schema({
    StepCol.NAME: pl.String(), StepCol.NUMBER: pl.Int64(), StepCol.TS: pl.Int64(), StepCol.DUR: pl.Int64(),
    StepCol.GPU_START: pl.Int64(), StepCol.GPU_END: pl.Int64(), StepCol.GPU_BUSY: pl.Int64(),
    StepCol.KERNEL_COUNT: pl.Int64(), StepCol.KERNEL_TIME: pl.Int64(), StepCol.WINDOW_END: pl.Int64(),
    StepCol.OWN_END: pl.Int64(), StepCol.STEADY: pl.Boolean(),
})


class WindowCol:
    """Columns of ``step_windows``: one window per step, the loop's period in its process."""

    STEP: Final = "step"  # the marker's name
    NUMBER: Final = StepCol.NUMBER
    STEADY: Final = StepCol.STEADY
    PID: Final = Col.PID
    STEP_ID: Final = "step_id"  # the marker's slice
    DUR: Final = Col.DUR  # the marker's host span
    WINDOW_START: Final = "window_start_ns"
    WINDOW_END: Final = StepCol.WINDOW_END
    WINDOW: Final = "window_ns"


WINDOWS_SCHEMA: Final = pl.Schema({
    WindowCol.STEP: pl.String(), WindowCol.NUMBER: pl.Int64(), WindowCol.STEADY: pl.Boolean(),
    WindowCol.PID: pl.Int64(), WindowCol.STEP_ID: pl.Int64(), WindowCol.DUR: pl.Int64(),
    WindowCol.WINDOW_START: pl.Int64(), WindowCol.WINDOW_END: pl.Int64(), WindowCol.WINDOW: pl.Int64(),
})


@dataclass(frozen=True)
class StepsResult(Rows, rows="table", key="name"):
    """Steps in time order: ``table`` has STEPS_SCHEMA (see StepCol). ``stats`` covers the
    steady steps only."""

    marker: str
    table: pl.DataFrame
    warmup: int
    stats: StepStats | None
    note: str | None
    #: Why ``warmup`` leading steps were excluded (or none was), in a phrase.
    warmup_reason: str = ""
    #: MARKED, or how the iterations were found without markers (``loop_iterations.IterationSource``).
    source: str = MARKED
    #: Per step, the slice it was found from, for iterations (markers are found again by name and start).
    iteration_ids: tuple[int, ...] = ()


def steps(trace: Trace, options: StepsOptions = StepsOptions(),
          host: Callable[[], HostIndex] | None = None) -> StepsResult:
    """``host`` gives the trace's host index where the caller keeps one (a diagnosis does); it is
    built only for a trace without step markers, once for the marker and iteration searches."""
    # nsys input without ProfilerStep# ranges: the most repeated top-level NVTX range.
    trace.require_whole()
    host_index = host if host is not None else host_index_once(trace)
    chosen = None if options.marker else (nvtx_step_marker(trace) or annotation_step_marker(trace, host_index))
    marker = options.marker or (chosen.name if chosen else PROFILER_STEP)
    # "--step aten::to" also finds emit_nvtx's "aten::to, seq = 3, op_id = 999599" ranges.
    pattern = re.compile(rf"^{re.escape(marker)}(?:#?(\d+))?(?:{api_names.OP_RANGE_SUFFIX[:-1]})?$")
    s = trace.slices
    # The marker is matched against each distinct name; only the matching rows are copied, and
    # only their names become strings (4.8 M annotations of a large nsys export took 1 GB so).
    names = trace.kind_columns(_STEP_KINDS, Col.NAME).get_column(Col.NAME).unique().cast(pl.String).to_list()
    matching = [n for n in names if pattern.match(n)]
    marks = _drop_nested_duplicates(
        trace.slices_where(pl.col(Col.KIND).is_in(_STEP_KINDS) & pl.col(Col.NAME).is_in(matching),
                           Col.ID, pl.col(Col.NAME).cast(pl.String), Col.TS, Col.DUR, Col.PID, Col.TID)
        .sort([Col.TS, Col.DUR], descending=[False, True])
    )
    loop = ((loop_iterations(trace, host_index()) or engine_iterations(trace, host_index))
            if marks.height == 0 and chosen is None and not options.marker else None)
    if loop is not None:
        marker, marks = loop.name, _iteration_marks(trace, loop)
    if marks.height == 0:
        hint = "" if options.marker else "; name a repeated annotation with --step NAME"
        return StepsResult(
            marker=marker, table=_empty_table(), warmup=0, stats=None,
            note=f"no step markers named {marker!r} in this trace{hint}",
        )
    numbers = [
        number if (m := pattern.match(n)) and m.group(1) and (number := int(m.group(1))) < _INT64_LIMIT else None
        for n in marks.get_column(Col.NAME).to_list()
    ]

    gpu = trace.kind_columns(GPU_ACTIVITY_KINDS, Col.TS, Col.DUR, Col.KIND, Col.LAUNCH).drop_nulls(Col.LAUNCH)
    launch_ts = s.get_column(Col.TS).gather(gpu.get_column(Col.LAUNCH)).to_numpy()
    launch_pid = s.get_column(Col.PID).gather(gpu.get_column(Col.LAUNCH)).to_numpy()
    g_ts = gpu.get_column(Col.TS).to_numpy()
    g_end = g_ts + gpu.get_column(Col.DUR).to_numpy()
    g_dur = gpu.get_column(Col.DUR).to_numpy()
    g_kernel = (gpu.get_column(Col.KIND) == Kind.KERNEL.value).to_numpy()
    order = np.argsort(launch_ts, kind="stable")
    launch_ts, launch_pid = launch_ts[order], launch_pid[order]
    g_ts, g_end, g_dur, g_kernel = g_ts[order], g_end[order], g_dur[order], g_kernel[order]

    rows: list[tuple[int | None, int | None, int, int, int]] = []
    for ts, dur, pid in marks.select(Col.TS, Col.DUR, Col.PID).iter_rows():
        lo, hi = np.searchsorted(launch_ts, [ts, ts + dur], side="left")
        # Work launched inside the step's window from the same process (any thread: the
        # backward pass launches from autograd threads).
        sel = np.arange(lo, hi)[launch_pid[lo:hi] == pid]
        if sel.size:
            busy = covered_ns(g_ts[sel], g_end[sel])
            rows.append((int(g_ts[sel].min()), int(g_end[sel].max()), busy,
                         int(g_kernel[sel].sum()), int(g_dur[sel][g_kernel[sel]].sum())))
        else:
            rows.append((None, None, 0, 0, 0))
    n = marks.height
    # A step's window runs to the next step's start (the loop's full period, input loading
    # between markers included). The last step has no next start: its window lasts its CPU
    # span or, when longer, the GPU's time on the work it launched. That time starts when the
    # GPU is done with what earlier steps queued: when the GPU runs behind the CPU, ending the
    # window at the end of the last step's GPU work would also take in that backlog (a 185 ms
    # last window among 96 ms ones on a V100 trace). GPU utilization over these windows agrees
    # with tb_plugin's reference outputs (tests/test_diagnose_real.py).
    starts = marks.get_column(Col.TS).to_list()
    own_ends = _own_ends(marks, rows, launch_ts, launch_pid, g_end)
    # Iterations end where the next begins, the last one too (its closing fetch or optimizer step);
    # an engine's last one with its own time, as a marked step (a decode's annotation closes at its
    # graph's launch, long before the GPU runs it).
    window_ends = [*starts[1:], own_ends[-1] if loop is None or loop.source == IterationSource.ENGINE
                   else int(loop.ends[-1])]
    durations = marks.get_column(Col.DUR).to_list()
    if options.warmup is not None:
        warmup, warmup_reason = max(0, min(options.warmup, n)), f"--warmup {options.warmup}"
    else:
        warmup, warmup_reason = default_warmup(numbers, durations, [r[2] for r in rows])
    table = pl.DataFrame(
        {
            StepCol.NAME: marks.get_column(Col.NAME),
            StepCol.NUMBER: numbers,
            StepCol.TS: marks.get_column(Col.TS),
            StepCol.DUR: marks.get_column(Col.DUR),
            StepCol.GPU_START: [r[0] for r in rows],
            StepCol.GPU_END: [r[1] for r in rows],
            StepCol.GPU_BUSY: [r[2] for r in rows],
            StepCol.KERNEL_COUNT: [r[3] for r in rows],
            StepCol.KERNEL_TIME: [r[4] for r in rows],
            StepCol.WINDOW_END: window_ends,
            StepCol.OWN_END: own_ends,
            StepCol.STEADY: [i >= warmup for i in range(n)],
        },
        schema=STEPS_SCHEMA,
    )
    steady = table.filter(pl.col(StepCol.STEADY)).get_column(StepCol.DUR).to_numpy()
    note = None
    if steady.size == 0:
        note = f"all {n} steps are warm-up (--warmup {options.warmup}): no steady step is left to measure"
    elif steady.size < 3:
        note = f"only {steady.size} steady step(s): statistics are indicative, not reliable"
    found_by = chosen.note if chosen is not None else None
    if loop is not None:
        found_by = (f"no step markers: {n} iterations, {loop.rule}; choose another with --step NAME")
    if found_by is not None:
        note = found_by if note is None else f"{found_by}; {note}"
    short = _short_markers(table)
    if short is not None:
        note = short if note is None else f"{note}; {short}"
    unlinked = unlinked_kernels_note(s, starts[0], window_ends[-1])
    if unlinked is not None:
        note = unlinked if note is None else f"{note}; {unlinked}"
    huge = numbers_past_int64_note(marks.get_column(Col.NAME).to_list(), numbers, pattern)
    if huge is not None:
        note = huge if note is None else f"{note}; {huge}"
    return StepsResult(marker=marker, table=table, warmup=warmup, stats=_stats(steady), note=note,
                       warmup_reason=warmup_reason, source=MARKED if loop is None else loop.source,
                       iteration_ids=() if loop is None else tuple(loop.boundary_ids.tolist()))


def _iteration_marks(trace: Trace, loop: LoopIterations) -> pl.DataFrame:
    """The iterations as step marks: their spans, named after the op they were found from."""
    n = loop.starts.size
    return pl.DataFrame({
        Col.ID: loop.boundary_ids, Col.NAME: [loop.name] * n, Col.TS: loop.starts, Col.DUR: loop.ends - loop.starts,
        Col.PID: np.full(n, loop.pid, dtype=np.int64), Col.TID: np.full(n, loop.tid, dtype=np.int64),
    }, schema={Col.ID: pl.Int64, Col.NAME: pl.String, Col.TS: pl.Int64, Col.DUR: pl.Int64, Col.PID: pl.Int64,
               Col.TID: pl.Int64})


def _own_ends(marks: pl.DataFrame, rows: list[tuple[int | None, int | None, int, int, int]],
              launch_ts: npt.NDArray[np.int64], launch_pid: npt.NDArray[np.int64],
              g_end: npt.NDArray[np.int64]) -> list[int]:
    """Where each step's own time ends: its CPU span or, when longer, the GPU's time on the work
    it launched, counted from when the GPU finished what the process had queued before the step
    began (when the GPU runs behind, the end of the step's GPU work alone would take that in).
    ``launch_ts`` is sorted; ``g_end`` is the end of the GPU activity each launch started."""
    ts = marks.get_column(Col.TS).to_numpy()
    pid = marks.get_column(Col.PID).to_numpy()
    backlog = ts.copy()
    for p in np.unique(pid).tolist():
        mine = launch_pid == p
        done = np.maximum.accumulate(g_end[mine]) if mine.any() else np.zeros(0, dtype=np.int64)
        at = pid == p
        before = np.searchsorted(launch_ts[mine], ts[at], side="left")
        queued = np.where(before > 0, done[np.maximum(before - 1, 0)] if done.size else 0, ts[at])
        backlog[at] = np.maximum(ts[at], queued)
    ends = []
    for t, d, b, r in zip(ts.tolist(), marks.get_column(Col.DUR).to_list(), backlog.tolist(), rows, strict=True):
        gpu_end = r[1]
        ends.append(t + max(d, 0 if gpu_end is None else gpu_end - b))
    return ends


def _short_markers(table: pl.DataFrame) -> str | None:
    """Say so when the markers cover a small part of each step's period (a range around an
    asynchronous launch): their CPU span, which the statistics are of, is then not the step time."""
    full = table.head(table.height - 1)  # the last window has no next start
    if full.height < 2:
        return None
    span = float(np.median(full.get_column(StepCol.DUR).to_numpy()))
    period = float(np.median((full.get_column(StepCol.WINDOW_END) - full.get_column(StepCol.TS)).to_numpy()))
    if period <= 0 or span >= 0.1 * period:
        return None
    return (f"the markers cover {100 * span / period:.2g}% of each step's period (median {span / 1e6:.3f} ms "
            f"of {period / 1e6:.3f} ms between starts): the statistics are of the markers' CPU span, not "
            "the step time; the period is the step time")


def _drop_nested_duplicates(marks: pl.DataFrame) -> pl.DataFrame:
    """Keep one span per step: a same-named span inside another (some 1.x builds record a step
    both as an op and as an annotation) is the same step."""
    keep: list[int] = []
    open_end: dict[str, int] = {}
    for i, (name, ts, dur) in enumerate(marks.select(Col.NAME, Col.TS, Col.DUR).iter_rows()):
        if ts < open_end.get(name, -1):
            continue
        open_end[name] = ts + dur
        keep.append(i)
    return marks[keep]


def _stats(values: npt.NDArray[np.int64]) -> StepStats | None:
    if values.size == 0:
        return None
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return StepStats(
        count=int(values.size),
        mean_ns=nearest_ns(float(values.mean())),
        min_ns=int(values.min()),
        max_ns=int(values.max()),
        p50_ns=nearest_ns(float(p50)),
        p90_ns=nearest_ns(float(p90)),
        p99_ns=nearest_ns(float(p99)),
    )


def _empty_table() -> pl.DataFrame:
    return pl.DataFrame(schema=STEPS_SCHEMA)


def step_windows(trace: Trace, steps_result: StepsResult) -> pl.DataFrame:
    """One window per step, with WINDOWS_SCHEMA (see WindowCol), in time order.

    Windows run from a step's start to the next step's start in the same process (each
    process has its own loop when one nsys file holds several ranks); a process's last step's
    window ends where its own time ends (``StepCol.OWN_END``).

    Computed once per Trace and steps result: a diagnosis asks for it five times (overlap,
    memory, blocks twice, compile), the report once more; a Trace never changes, and the
    windows are kept beside the steps result they came from (of_kind keeps its tables the
    same way)."""
    trace.require_whole()
    kept: dict[int, tuple[StepsResult, pl.DataFrame]] = trace.__dict__.setdefault("_step_windows", {})
    hit = kept.get(id(steps_result))
    if hit is None or hit[0] is not steps_result:
        hit = kept[id(steps_result)] = (steps_result, _step_windows(trace, steps_result))
    return hit[1]


def _step_windows(trace: Trace, steps_result: StepsResult) -> pl.DataFrame:
    t = steps_result.table
    if t.height == 0:
        return pl.DataFrame(schema=WINDOWS_SCHEMA)
    if steps_result.iteration_ids:
        return _iteration_windows(trace, steps_result)
    # Only slices starting when a step starts can be its marker: filtered on that first, so that
    # only their names become strings (a 1 GB trace has 1.5 M ops and annotations).
    marks = trace.slices.filter(
        pl.col(Col.KIND).is_in(_STEP_KINDS) & pl.col(Col.TS).is_in(t.get_column(StepCol.TS).unique().to_list())
    ).select(
        pl.col(Col.ID).alias(WindowCol.STEP_ID), pl.col(Col.NAME).cast(pl.String), Col.TS, Col.DUR, Col.PID
    ).unique([Col.NAME, Col.TS, Col.DUR], keep="first", maintain_order=True)
    w = t.join(marks, left_on=[StepCol.NAME, StepCol.TS, StepCol.DUR], right_on=[Col.NAME, Col.TS, Col.DUR],
               how="left").sort(StepCol.TS)
    return (
        w.with_columns(pl.col(StepCol.TS).shift(-1).over(Col.PID).alias("_next"))
        .select(
            pl.col(StepCol.NAME).alias(WindowCol.STEP), WindowCol.NUMBER, WindowCol.STEADY, WindowCol.PID,
            WindowCol.STEP_ID, WindowCol.DUR, pl.col(StepCol.TS).alias(WindowCol.WINDOW_START),
            pl.coalesce("_next", StepCol.OWN_END).alias(WindowCol.WINDOW_END),
        )
        .with_columns((pl.col(WindowCol.WINDOW_END) - pl.col(WindowCol.WINDOW_START)).alias(WindowCol.WINDOW))
    )


def _iteration_windows(trace: Trace, steps_result: StepsResult) -> pl.DataFrame:
    """Iterations tile their thread's loop: each window is the iteration's span (the last one's
    own end when the GPU runs past it), in the process of the slices they were found from."""
    t = steps_result.table
    ids = pl.Series(WindowCol.STEP_ID, steps_result.iteration_ids, dtype=pl.Int64)
    return t.select(
        pl.col(StepCol.NAME).alias(WindowCol.STEP), WindowCol.NUMBER, WindowCol.STEADY,
        trace.slices.get_column(Col.PID).gather(ids).alias(WindowCol.PID), ids, WindowCol.DUR,
        pl.col(StepCol.TS).alias(WindowCol.WINDOW_START), WindowCol.WINDOW_END,
    ).with_columns((pl.col(WindowCol.WINDOW_END) - pl.col(WindowCol.WINDOW_START)).alias(WindowCol.WINDOW)).cast(
        WINDOWS_SCHEMA)


def steady_span(windows: pl.DataFrame, start: str = WindowCol.WINDOW_START) -> tuple[int, int] | None:
    """The steady window: the first steady step's start to the last steady step's window end,
    over a table with ``StepCol.STEADY`` and ``StepCol.WINDOW_END`` (``step_windows``, or the
    steps table itself with ``start=StepCol.TS``); None without a steady step."""
    steady = windows.filter(pl.col(StepCol.STEADY))
    if steady.height == 0:
        return None
    lo, hi = steady.select(pl.col(start).min(), pl.col(StepCol.WINDOW_END).max()).row(0)
    return int(lo), int(hi)
