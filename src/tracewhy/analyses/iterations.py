"""The windows a step account (and the critical path) divides: the steps (``steps``: a
ProfilerStep#, a repeated top-level annotation or NVTX range, else the iterations found from the
loop's own repeating structure, ``loop_iterations``), else the whole trace as one window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import polars as pl

from tracewhy.analyses.critical_path_graph import Graph
from tracewhy.analyses.loop_iterations import IterationSource
from tracewhy.analyses.steps import MARKED, WINDOWS_SCHEMA, StepsResult, WindowCol, step_windows
from tracewhy.model.trace import Trace


class WindowSource:
    """How the windows were found: ``StepsResult.source`` (markers, or how iterations were found),
    or the whole trace."""

    STEPS: Final = MARKED  # step markers (``steps.steps``)
    DATALOADER: Final = IterationSource.DATALOADER  # one iteration per DataLoader fetch: fetch start to the next
    OPTIMIZER: Final = IterationSource.OPTIMIZER  # one iteration per Optimizer.step: one step's end to the next's
    ZERO_GRAD: Final = IterationSource.ZERO_GRAD
    ANNOTATION: Final = IterationSource.ANNOTATION
    WHOLE_TRACE: Final = "whole_trace"


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
    """The steps (marked, or the loop's iterations: ``steps_result.source`` says which); else the
    whole trace, owned by the process with the most instants in the graph."""
    if steps_result.table.height:
        return AccountWindows(steps_result.source, steps_result.marker, step_windows(trace, steps_result),
                              steps_result.note)
    return _whole_trace(graph)


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
