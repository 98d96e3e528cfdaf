"""A step's outermost work on the host: the ops, annotations and runtime calls with nothing above
them but the step's own marker (``StepUnits.outermost``), the thread that runs the step
(``StepUnits.thread``), and the time on that thread outside all of them, stretch by stretch
(``stretches``): where a step's untraced Python, I/O or waits fall (``untraced_by_place``). The
spike analysis and the ``unexplained-part`` finding read it."""

from __future__ import annotations

from collections import Counter
from typing import Final

import numpy as np
import numpy.typing as npt

from tracewhy.analyses.host_activity import HostIndex
from tracewhy.analyses.steps import StepCol, StepsResult
from tracewhy.model.schema import KIND_CODE, LAUNCH_KINDS, Col, Kind
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]
#: What a step's time is counted in: ops, annotations, and runtime and driver calls made outside
#: any op (a cudaDeviceSynchronize from Python); Python frames are where the time went, not work.
LAUNCHES: Final = tuple(KIND_CODE[k.value] for k in LAUNCH_KINDS)
UNITS: Final = (KIND_CODE[Kind.CPU_OP.value], KIND_CODE[Kind.ANNOTATION.value], *LAUNCHES)
#: At most this many steps are read (spread evenly over the run): the means over them hold, and a
#: trace of thousands of steps is not scanned thousands of times.
MAX_STEPS: Final = 32


def spread_picks(count: int, at_most: int) -> list[int]:
    """Indexes of at most ``at_most`` of ``count`` items, spread evenly over them (all of them
    when they are no more): the steps a reading, the account or a replay takes from a long run."""
    if count <= at_most:
        return list(range(count))
    picks: list[int] = np.unique(np.linspace(0, count - 1, at_most).round().astype(np.int64)).tolist()
    return picks


def spread(steps: list[int]) -> list[int]:
    """At most ``MAX_STEPS`` of these steps, spread evenly over them."""
    return steps if len(steps) <= MAX_STEPS else [steps[i] for i in spread_picks(len(steps), MAX_STEPS)]


class StepUnits:
    """The host index's ops, annotations and runtime calls, by start time."""

    def __init__(self, host: HostIndex) -> None:
        self.host = host
        rows = np.flatnonzero(np.isin(host.kind_code, UNITS))
        self.rows = rows[np.argsort(host.ts[rows], kind="stable")]
        self.ts = host.ts[self.rows]
        self.annotations = np.flatnonzero(host.kind_code == KIND_CODE[Kind.ANNOTATION.value])

    def outermost(self, lo: int, hi: int) -> I64:
        """Rows starting in [lo, hi) with no op, annotation or runtime call above them but
        annotations that span the whole of it (the step's marker)."""
        h = self.host
        inside = self.rows[np.searchsorted(self.ts, lo):np.searchsorted(self.ts, hi)]
        a = self.annotations
        spanning = a[(h.ts[a] <= lo) & (h.end[a] >= hi)]
        inside = inside[~np.isin(inside, spanning)]
        parent = h.parent[inside]
        safe = np.maximum(parent, 0)
        op_above = (parent >= 0) & (h.op_ctx[safe] >= 0)
        annotation = h.annotation_ctx[safe]
        annotation_above = (parent >= 0) & (annotation >= 0) & ~np.isin(annotation, h.ids[spanning])
        call_above = (parent >= 0) & np.isin(h.kind_code[safe], LAUNCHES)  # a driver call in a runtime call
        out: I64 = inside[~op_above & ~annotation_above & ~call_above]
        return out

    def thread(self, lo: int, hi: int) -> tuple[int, int] | None:
        """The host index's rows of the thread whose outermost work covers the most of [lo, hi)."""
        h = self.host
        rows = self.outermost(lo, hi)
        best, covered = None, 0
        for bounds in h.threads.values():
            mine = rows[(rows >= bounds[0]) & (rows < bounds[1])]
            time = int((np.minimum(h.end[mine], hi) - np.maximum(h.ts[mine], lo)).sum())
            if time > covered:
                best, covered = bounds, time
        return best

    def on_thread(self, rows: I64, thread: tuple[int, int] | None) -> I64:
        """Of ``rows``, those of ``thread``, in start order."""
        if thread is None:
            return rows[:0]
        mine: I64 = np.sort(rows[(rows >= thread[0]) & (rows < thread[1])])
        return mine


def stretches(host: HostIndex, rows: I64, lo: int, hi: int) -> tuple[npt.NDArray[np.int64], I64]:
    """The time in [lo, hi) outside ``rows`` (one thread's outermost work, in start order), as
    stretches: one before the first row, one after each (none where the next row starts inside
    the ones before: a zero), and the row each follows (-1: the stretch opens the window)."""
    if rows.size == 0:
        return np.array([hi - lo], dtype=np.int64), np.array([-1], dtype=np.int64)
    ts, end = np.maximum(host.ts[rows], lo), np.minimum(host.end[rows], hi)
    reach = np.maximum.accumulate(end)
    gaps = np.maximum(np.r_[ts[0] - lo, ts[1:] - reach[:-1], hi - reach[-1]], 0)
    # The row a stretch follows: the one that reaches furthest before it.
    last = np.r_[0, np.flatnonzero(np.diff(reach) > 0) + 1]
    ender = last[np.searchsorted(last, np.arange(rows.size), side="right") - 1]
    before: I64 = np.r_[-1, rows[ender]]
    return gaps.astype(np.int64), before


def untraced_by_place(trace: Trace, steps: StepsResult, host: HostIndex, step_indexes: list[int]
                      ) -> list[tuple[str | None, float]]:
    """Over these steps (indexes into ``steps.table``; at most ``MAX_STEPS`` of them, spread), the
    untraced time on the step's thread by the op, annotation or call each stretch follows (None:
    the step's start), as a mean per step, largest first."""
    step_indexes = spread(step_indexes)
    if not step_indexes:
        return []
    table = steps.table
    starts = table.get_column(StepCol.TS).to_numpy()
    ends = starts + table.get_column(StepCol.DUR).to_numpy()
    units = StepUnits(host)
    thread = units.thread(int(starts[step_indexes[0]]), int(ends[step_indexes[0]]))
    if thread is None:
        return []
    names = trace.slices.get_column(Col.NAME)
    by: Counter[str | None] = Counter()
    for i in step_indexes:
        lo, hi = int(starts[i]), int(ends[i])
        gaps, before = stretches(host, units.on_thread(units.outermost(lo, hi), thread), lo, hi)
        for gap, row in zip(gaps.tolist(), before.tolist(), strict=True):
            if gap > 0:
                by[None if row < 0 else str(names[int(host.ids[row])])] += gap
    return [(name, ns / len(step_indexes)) for name, ns in sorted(by.items(), key=lambda kv: -kv[1])]
