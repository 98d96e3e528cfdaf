"""The untraced host time around ops a fix removes: the Python that called them (a forward
hook, checkpoint()'s wrapper) runs between ops, where the profiler records nothing but the gap.
When the ops go, that Python goes with them, and the thread passes from the op before them to
the op after them in the gap two neighbouring ops usually leave. (What activation checkpointing
costs around and inside its regions: ``what_if_checkpoint``.)
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tracewhy.analyses import api_names
from tracewhy.analyses.critical_path_replay import GraphEdit

if TYPE_CHECKING:  # what_if_edits imports this module
    from tracewhy.analyses.what_if_window import WindowEdges

B = npt.NDArray[np.bool_]


class Untraced:
    """A window's untraced host edges (outside every op), and what shrinking chose of them."""

    def __init__(self, w: WindowEdges) -> None:
        rules, g = w.model.rules, w.model.graph
        attr = np.maximum(w.attr, 0)
        self.w = w
        self.tid = rules.ctx.tid[attr]  # the thread each edge's time is spent on
        self.host = w.host()
        self.edges = self.host & (rules.ctx.outer_op[attr] < 0)
        self.src_ts, self.dst_ts = g.node_ts[w.src], g.node_ts[w.dst]
        self.chosen = np.zeros(w.ids.size, dtype=bool)
        self.factors = np.ones(w.ids.size, dtype=np.float64)
        self._on_thread: dict[int, B] = {}

    def shrink(self, span: B, to_ns: float) -> None:
        """Scale these untraced edges so that together they take ``to_ns``, where they take more."""
        spent = float((self.dst_ts[span] - self.src_ts[span]).sum())
        if spent > to_ns:
            self.chosen |= span
            self.factors[span] = to_ns / spent

    def between(self, tid: int, lo: int, hi: int) -> B:
        """This thread's untraced edges from ``lo`` to ``hi`` (the thread's, made once per thread:
        a window's runs and stretches on one thread are many)."""
        on = self._on_thread.get(tid)
        if on is None:
            on = self._on_thread[tid] = self.edges & (self.tid == tid)
        span: B = on & (self.src_ts >= lo) & (self.dst_ts <= hi)
        return span

    def edit(self) -> GraphEdit:
        return GraphEdit(scaled=self.w.ids[self.chosen], factor=self.factors[self.chosen])


def typical_gap(starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], marked: B) -> float | None:
    """The median gap between two neighbouring ops (in start order) neither of which is
    ``marked``; None without such a pair."""
    kept_pairs = ~marked[:-1] & ~marked[1:]
    if not kept_pairs.any():
        return None
    return float(np.median(np.maximum(starts[1:] - ends[:-1], 0)[kept_pairs]))


def untraced_around(w: WindowEdges, removed: set[int]) -> GraphEdit:
    """Per thread, each run of consecutive outermost ops that are all in ``removed``: the
    untraced host time (edges outside every op) from the end of the op before the run (or the
    window's start) to the start of the op after it (or the window's end) shrinks to the
    window's typical gap (the median gap between two neighbouring ops neither of which is
    removed). Untraced time only ever shrinks."""
    if not removed:  # no run to shrink around (every call on an nsys export: each scanned 17 M edges)
        return GraphEdit()
    rules, u = w.model.rules, Untraced(w)
    for tid in np.unique(u.tid[u.host]).tolist():
        ops = ops_in_order(w, u.host & (u.tid == tid))
        if ops.size < 3:
            continue
        gone = np.isin(ops, list(removed))
        if not gone.any():
            continue
        starts, ends = rules.slice_ts[ops], rules.slice_end[ops]
        typical = typical_gap(starts, ends, gone)
        if typical is None:
            continue
        for first, last in _runs(gone):
            # A run at the window's edge (logging at the step's end) reaches to the window's
            # bound on that side: the code that ran it ends (or starts) the step.
            lo = ends[first - 1] if first > 0 else w.path.window_start
            hi = starts[last + 1] if last < ops.size - 1 else w.path.window_end
            u.shrink(u.between(tid, lo, hi), typical)
    return u.edit()


def untraced_before(w: WindowEdges, firsts: set[int]) -> GraphEdit:
    """The untraced host time just before each of these outermost ops, from the end of the op
    before it on its thread (or the window's start) to its start, shrinks to the window's
    typical gap (the median gap between two neighbouring ops, neither of them in ``firsts``):
    the Python that ran there before them and will not once a fix removes it (a wrapper whose
    own work the trace records as no op). Untraced time only ever shrinks."""
    if not firsts:
        return GraphEdit()
    rules, u = w.model.rules, Untraced(w)
    for tid in np.unique(rules.ctx.tid[list(firsts)]).tolist():
        ops = ops_in_order(w, u.host & (u.tid == tid))
        at = np.isin(ops, list(firsts))
        starts, ends = rules.slice_ts[ops], rules.slice_end[ops]
        typical = typical_gap(starts, ends, at)
        if ops.size < 3 or typical is None:
            continue
        for i in np.flatnonzero(at).tolist():
            u.shrink(u.between(tid, ends[i - 1] if i > 0 else w.path.window_start, starts[i]), typical)
    return u.edit()


def released_after(w: WindowEdges, calls: list[int]) -> GraphEdit:
    """The untraced time where a grown tensor is released, which a buffer allocated once never
    is: after each growth call (``calls``, outermost ops of one thread) up to the next op (the
    Python drops the tensor the call replaced), and, when the loop ends the step (every op after
    the last call repeats in the window at least once per growth), after the window's last op
    up to its end (the grown tensor dropped as the code returns). Each such stretch shrinks to
    the window's typical gap (the median gap between two neighbouring ops neither of which is a
    growth call); the stretches take what the trace shows there, nothing where it shows none."""
    rules, u = w.model.rules, Untraced(w)
    ctx = rules.ctx
    tid = ctx.tid[calls[0]]
    ops = ops_in_order(w, u.host & (u.tid == tid))
    growth = np.isin(ops, calls)
    starts, ends = rules.slice_ts[ops], rules.slice_end[ops]
    typical = typical_gap(starts, ends, growth)
    if ops.size < 3 or typical is None or not growth[:-1].any():
        return GraphEdit()
    spans = [(int(ends[i]), int(starts[i + 1])) for i in np.flatnonzero(growth[:-1]).tolist()]
    last = int(np.flatnonzero(growth)[-1])
    counts = Counter(ctx.name(int(o)) for o in ops.tolist())
    if all(counts[ctx.name(int(o))] >= len(calls) - 1 for o in ops[last + 1:].tolist()):
        spans.append((int(ends[-1]), w.path.window_end))
    for lo, hi in spans:
        u.shrink(u.between(tid, lo, hi), typical)
    return u.edit()


def loop_between(w: WindowEdges, host: B) -> GraphEdit:
    """Among these host edges, per thread, the untraced time (edges outside every op) between
    two consecutive outermost ops that both repeat in the window (one call per parameter, by
    name) takes none: the Python of a per-parameter loop, gone when one multi-tensor call per op
    replaces it. A read into Python (``api_names.is_scalar_read``: a value per parameter that no
    multi-tensor op returns) stays with the untraced time on both sides of it; the ops' own time
    stays."""
    rules, g = w.model.rules, w.model.graph
    ctx = rules.ctx
    attr = np.maximum(w.attr, 0)
    outer = ctx.outer_op[attr]
    untraced = host & (outer < 0)
    src_ts, dst_ts = g.node_ts[w.src], g.node_ts[w.dst]
    chosen = np.zeros(w.ids.size, dtype=bool)
    for tid in np.unique(ctx.tid[attr[host]]).tolist():
        ops = ops_in_order(w, host & (ctx.tid[attr] == tid))
        names = [ctx.name(int(o)) for o in ops.tolist()]
        counts = Counter(names)
        looped = np.array([counts[n] > 1 and not api_names.is_scalar_read(n) for n in names], dtype=bool)
        pairs = np.flatnonzero(looped[:-1] & looped[1:])
        if pairs.size == 0:
            continue
        on_thread = untraced & (ctx.tid[attr] == tid)
        lo, hi = rules.slice_end[ops[pairs]], rules.slice_ts[ops[pairs + 1]]
        # The gap an edge lies in: the last op ending at or before the edge's start.
        at = np.searchsorted(lo, src_ts[on_thread], side="right") - 1
        inside = (at >= 0) & (dst_ts[on_thread] <= hi[np.maximum(at, 0)])
        chosen[np.flatnonzero(on_thread)[inside]] = True
    return GraphEdit(scaled=w.ids[chosen], factor=np.zeros(int(chosen.sum())))


def ops_in_order(w: WindowEdges, rows: B) -> npt.NDArray[np.int64]:
    """The outermost ops of the slices these edges (``rows``) are spent in, in start order."""
    rules = w.model.rules
    outer = rules.ctx.outer_op[np.maximum(w.attr, 0)]
    ops = np.unique(outer[rows & (outer >= 0)])
    ordered: npt.NDArray[np.int64] = ops[np.argsort(rules.slice_ts[ops], kind="stable")]
    return ordered


def _runs(flags: B) -> list[tuple[int, int]]:
    """(first, last) index of each run of True."""
    edges = np.diff(np.concatenate(([0], flags.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1).tolist(), (np.flatnonzero(edges == -1) - 1).tolist(), strict=True))
