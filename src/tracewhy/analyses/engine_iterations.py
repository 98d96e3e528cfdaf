"""The engine's iterations as steps, when nothing else marks them: a vLLM or SGLang capture often
holds one or two iterations, fewer than a repeated marker needs, each a top-level annotation that
launched the model's GPU work."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.host_activity import HostIndex
from tracewhy.analyses.loop_iterations import IterationSource, LoopIterations
from tracewhy.analyses.nvtx import PROFILER_STEP_PREFIX
from tracewhy.analyses.step_marker import top_level_annotations
from tracewhy.analyses.step_verdicts import StepOps, annotation_verdict, shape_verdict
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col
from tracewhy.model.trace import KINETO_FORMAT, Trace


def engine_iterations(trace: Trace, host: Callable[[], HostIndex] | None = None) -> LoopIterations | None:
    """The engine's iterations, when nothing else marks steps: the top-level annotations of one
    thread that launched GPU work and whose class the shapes inside them or their own name
    states (a vLLM or SGLang capture often holds one or two iterations, fewer than a repeated
    marker needs). None when there is no such annotation. ``host`` gives the trace's host index
    (``host_index_once``)."""
    if trace.meta.format != KINETO_FORMAT:
        return None
    found_tops = top_level_annotations(trace, host() if host is not None else None)
    if found_tops is None:
        return None
    tops = found_tops.with_columns(pl.col(Col.PID, Col.TID).fill_null(-1)).filter(
        ~pl.col(Col.NAME).str.starts_with(PROFILER_STEP_PREFIX)).sort(Col.TS)
    launched = _launch_times(trace)
    found = StepOps(trace)
    keep = []
    for i, (name, pid, ts, end) in enumerate(tops.select(Col.NAME, Col.PID, Col.TS, "end").iter_rows()):
        times = launched.get(pid)
        if times is None or np.searchsorted(times, end) <= np.searchsorted(times, ts):
            continue
        if shape_verdict(found.queries(pid, ts, end)) or annotation_verdict(name or ""):
            keep.append(i)
    if not keep:
        return None
    chosen = tops[keep]
    # One thread: the one with the most iterations (an engine's loop runs on one thread).
    best = chosen.group_by(Col.PID, Col.TID).len().sort(["len", Col.PID, Col.TID], descending=[True, False, False])
    pid, tid = int(best[Col.PID][0]), int(best[Col.TID][0])
    mine = chosen.filter((pl.col(Col.PID) == pid) & (pl.col(Col.TID) == tid))
    return LoopIterations(
        source=IterationSource.ENGINE, name=str(mine[Col.NAME][0]), pid=pid, tid=tid,
        starts=mine.get_column(Col.TS).to_numpy().astype(np.int64),
        ends=mine.get_column("end").to_numpy().astype(np.int64),
        boundary_ids=mine.get_column(Col.ID).to_numpy().astype(np.int64),
        rule=(f"one per engine iteration: {mine.height} top-level annotation(s) on thread {tid} that launched GPU "
              "work and whose attention shapes or engine annotation state prefill or decode"),
    )


def _launch_times(trace: Trace) -> dict[int, npt.NDArray[np.int64]]:
    """Per process, the sorted start times of the calls that launched GPU activity."""
    launch = trace.kind_columns(GPU_ACTIVITY_KINDS, Col.LAUNCH).drop_nulls(Col.LAUNCH).get_column(Col.LAUNCH)
    s = trace.slices
    frame = pl.DataFrame({Col.TS: s.get_column(Col.TS).gather(launch), Col.PID: s.get_column(Col.PID).gather(launch)})
    return {int(p): np.sort(g.get_column(Col.TS).to_numpy()) for (p,), g in frame.group_by(Col.PID)}
