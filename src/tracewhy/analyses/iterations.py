"""The windows a step account divides: the steps when the trace marks them (``steps``: a
ProfilerStep#, a repeated top-level annotation or NVTX range), else iterations found from the
loop's own repeating structure (one per DataLoader fetch on the thread that fetches most, else
one per ``Optimizer.step``), else the whole trace as one window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.critical_path_graph import Graph
from tracewhy.analyses.steps import WINDOWS_SCHEMA, StepsResult, WindowCol, default_warmup, step_windows
from tracewhy.model.schema import HOST_KINDS, Col
from tracewhy.model.trace import Trace


class WindowSource:
    """How the windows were found."""

    STEPS: Final = "steps"  # step markers (``steps.steps``)
    DATALOADER: Final = "dataloader"  # one iteration per DataLoader fetch: fetch start to the next
    OPTIMIZER: Final = "optimizer"  # one iteration per Optimizer.step: one step's end to the next's
    WHOLE_TRACE: Final = "whole_trace"


#: A loop shows at least this many fetches (or optimizer steps) to give one full iteration
#: between two of them.
MIN_REPEATS: Final = 2
WHOLE_TRACE_NAME: Final = "(whole trace)"


@dataclass(frozen=True)
class AccountWindows:
    """``windows`` has ``steps.WINDOWS_SCHEMA``, in time order; ``marker`` names what delimits
    them (the step marker, the fetch's or optimizer step's name, or WHOLE_TRACE_NAME)."""

    source: str
    marker: str
    windows: pl.DataFrame
    note: str | None


def account_windows(trace: Trace, steps_result: StepsResult, graph: Graph) -> AccountWindows:
    """Steps first; without them, iterations from DataLoader fetches, then from optimizer steps;
    else the whole trace, owned by the process with the most instants in the graph."""
    if steps_result.table.height:
        return AccountWindows(WindowSource.STEPS, steps_result.marker, step_windows(trace, steps_result),
                              steps_result.note)
    for source, test in ((WindowSource.DATALOADER, api_names.is_dataloader),
                         (WindowSource.OPTIMIZER, api_names.is_optimizer_step)):
        found = _iterations(trace, source, test)
        if found is not None:
            return found
    return _whole_trace(graph)


def _iterations(trace: Trace, source: str, test: Callable[[str], bool]) -> AccountWindows | None:
    """One window per repeat of the marker on the thread with the most of them (outermost spans
    only: a fetch nested in a fetch is the same fetch)."""
    names = trace.kind_columns(HOST_KINDS, Col.NAME).get_column(Col.NAME).unique().drop_nulls().cast(pl.String)
    matching = [n for n in names.to_list() if test(n)]
    if not matching:
        return None
    marks = trace.slices_where(pl.col(Col.KIND).is_in([k.value for k in HOST_KINDS]) & pl.col(Col.NAME).is_in(matching),
                               Col.ID, pl.col(Col.NAME).cast(pl.String), Col.TS, Col.DUR, Col.PID, Col.TID)
    busiest = marks.group_by(Col.PID, Col.TID).len().sort(["len", Col.PID, Col.TID],
                                                          descending=[True, False, False]).row(0)
    marks = marks.filter((pl.col(Col.PID) == busiest[0]) & (pl.col(Col.TID) == busiest[1])).sort(Col.TS)
    end = (marks.get_column(Col.TS) + marks.get_column(Col.DUR)).to_numpy()
    outermost = np.r_[True, marks.get_column(Col.TS).to_numpy()[1:] >= np.maximum.accumulate(end)[:-1]]
    marks = marks.filter(pl.Series(outermost))
    if marks.height < MIN_REPEATS:
        return None
    ts = marks.get_column(Col.TS).to_numpy()
    ends = ts + marks.get_column(Col.DUR).to_numpy()
    # A fetch opens its iteration; an optimizer step closes its own.
    bounds = ts if source == WindowSource.DATALOADER else ends
    starts, stops = bounds[:-1], bounds[1:]
    keep = marks.head(marks.height - 1) if source == WindowSource.DATALOADER else marks.tail(marks.height - 1)
    durations = (stops - starts).tolist()
    warmup, reason = default_warmup([None] * len(durations), durations)
    windows = pl.DataFrame({
        WindowCol.STEP: keep.get_column(Col.NAME), WindowCol.NUMBER: list(range(len(durations))),
        WindowCol.STEADY: [i >= warmup for i in range(len(durations))],
        WindowCol.PID: np.full(len(durations), busiest[0], dtype=np.int64), WindowCol.STEP_ID: keep.get_column(Col.ID),
        WindowCol.DUR: keep.get_column(Col.DUR), WindowCol.WINDOW_START: starts, WindowCol.WINDOW_END: stops,
        WindowCol.WINDOW: stops - starts,
    }, schema=WINDOWS_SCHEMA)
    what = "DataLoader fetch" if source == WindowSource.DATALOADER else "optimizer step"
    note = (f"no step markers: {len(durations)} iterations from one {what} to the next "
            f"({marks.height} of {keep.get_column(Col.NAME)[0]!r} on one thread); warm-up: {reason}")
    return AccountWindows(source, str(keep.get_column(Col.NAME)[0]), windows, note)


def _whole_trace(graph: Graph) -> AccountWindows:
    """The whole trace as one window: from the first to the last instant of the process with the
    most instants (a trace of several processes is accounted for one of them)."""
    if graph.node_ts.size == 0:
        return AccountWindows(WindowSource.WHOLE_TRACE, WHOLE_TRACE_NAME, pl.DataFrame(schema=WINDOWS_SCHEMA),
                              "nothing in this trace to account for (no host slices or GPU activities)")
    pids, counts = np.unique(graph.node_pid, return_counts=True)
    pid = int(pids[np.argmax(counts)])
    times = graph.node_ts[graph.node_pid == pid]
    lo, hi = int(times.min()), int(times.max())
    windows = pl.DataFrame({
        WindowCol.STEP: [WHOLE_TRACE_NAME], WindowCol.NUMBER: [None], WindowCol.STEADY: [True],
        WindowCol.PID: [pid], WindowCol.STEP_ID: [None], WindowCol.DUR: [hi - lo], WindowCol.WINDOW_START: [lo],
        WindowCol.WINDOW_END: [hi], WindowCol.WINDOW: [hi - lo],
    }, schema=WINDOWS_SCHEMA)
    others = f"; the trace holds {pids.size} processes, this is process {pid}'s" if pids.size > 1 else ""
    note = f"no step markers and no repeating DataLoader fetch or optimizer step: the whole trace is one window{others}"
    return AccountWindows(WindowSource.WHOLE_TRACE, WHOLE_TRACE_NAME, windows, note)
