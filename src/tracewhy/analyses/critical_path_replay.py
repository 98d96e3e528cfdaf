"""The replay behind the critical path's gains and the what-if predictions: a step's dependency
graph with some edges' time removed (or scaled, or the edges dropped, or new ones added: a
``GraphEdit``), each instant recomputed at the latest of its in-edges, so that the step's length
after the change can be read off its last instant, and its new critical path walked back from
there (``critical_path`` picks the items whose removal it replays; ``what_if`` builds the edits).
"""

from __future__ import annotations

import bisect
from array import array
from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt

from tracewhy.analyses.critical_path_edges import Edge, way_out_of_cycle
from tracewhy.analyses.critical_path_graph import Graph
from tracewhy.analyses.id_arrays import Ids, narrow
from tracewhy.analyses.replay_edges import (
    LiveInEdges,
    _ints,
    _positions,
    _replay_times,
    one_way_in,
    process_edges,
    scale_weights,
    window_order,
)
from tracewhy.analyses.replay_measured import MeasuredStretches
from tracewhy.model import compiled

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
F64 = npt.NDArray[np.float64]


#: The first instant an edit reaches (a position in the window) from which a replay's walk takes
#: the measured path's stretches (``MeasuredStretches``): before it the walk's steps below that
#: instant cost less than making them (0.3 s on a large export's whole-trace window).
STRETCHES_FROM: Final = 1 << 16


def _none() -> I64:
    return np.zeros(0, dtype=np.int64)


class GraphEdit(msgspec.Struct, frozen=True):
    """A change to a window's graph: edges dropped (a wait that no longer happens), edges whose
    replay weight is scaled (0: the work leaves; a fraction: it gets cheaper), and edges added
    between existing instants (a new dependency), each with its weight, Edge kind and attributed
    slice. Added edges must run forward in time (their source no later than their end). An added
    edge with weight stands for work moved off the graph's timelines (a collective a CPU backend
    would run on its own thread): ``add_like`` names, per added edge, the graph edge whose part
    the account gives its time (-1 or none given: no part)."""

    drop: I64 = msgspec.field(default_factory=_none)
    scaled: I64 = msgspec.field(default_factory=_none)
    factor: F64 = msgspec.field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    add_src: I64 = msgspec.field(default_factory=_none)
    add_dst: I64 = msgspec.field(default_factory=_none)
    add_weight: I64 = msgspec.field(default_factory=_none)
    add_kind: I64 = msgspec.field(default_factory=_none)
    add_attr: I64 = msgspec.field(default_factory=_none)
    add_like: I64 = msgspec.field(default_factory=_none)

    def __add__(self, other: GraphEdit) -> GraphEdit:
        """Both edits at once: drops united, factors multiplied, additions kept."""
        return GraphEdit(
            drop=np.union1d(self.drop, other.drop), scaled=np.r_[self.scaled, other.scaled],
            factor=np.r_[self.factor, other.factor], add_src=np.r_[self.add_src, other.add_src],
            add_dst=np.r_[self.add_dst, other.add_dst], add_weight=np.r_[self.add_weight, other.add_weight],
            add_kind=np.r_[self.add_kind, other.add_kind], add_attr=np.r_[self.add_attr, other.add_attr],
            add_like=np.r_[self.like, other.like])

    @property
    def like(self) -> I64:
        """``add_like`` with one entry per added edge (-1 where none was given)."""
        if self.add_like.size == self.add_src.size:
            return self.add_like
        return np.full(self.add_src.size, -1, dtype=np.int64)

    @property
    def empty(self) -> bool:
        return not (self.drop.size or self.scaled.size or self.add_src.size)


class EditedPath(msgspec.Struct, frozen=True):
    """A window replayed with an edit: the time of its last instant, and the critical path to it,
    edges in time order with their replayed lengths (the first clipped at the window's start).
    An edge the edit added is numbered ``graph.src.size + k`` (its k-th addition)."""

    end_ns: int
    edges: Ids  # (int32 where they fit: ``id_arrays.narrow``)
    dur_ns: I64
    start_ns: int


class Replay:
    """Replay weights: the edge that released an instant keeps its measured length (so the
    replay of the unchanged trace reproduces every time); any other in-edge is the least it can
    be: program order into a sync's end none (the call returns when its GPU work ends), a queued
    launch or a stream gap or a sync's return at most the trace's median of the ones that did
    release their instant."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        elapsed = graph.elapsed
        binding = np.zeros(graph.src.size, dtype=bool)
        bound = graph.bind_edge[graph.bind_edge >= 0]
        binding[bound] = True
        # The weights are the elapsed times changed in place (a copy of them was 136 MB on a
        # large export): each kind's floor reads its binding edges, which keep their time.
        weight = elapsed
        kind = graph.kind
        for k in (Edge.LAUNCH, Edge.GAP, Edge.SYNC):
            this = kind == k
            measured = elapsed[this & binding]
            floor = int(np.median(measured)) if measured.size else 0
            this &= ~binding
            weight[this] = np.minimum(elapsed[this], floor)
        weight[~binding & ((kind == Edge.HOST) | (kind == Edge.EVENT_WAIT) | (kind == Edge.HANDOFF))] = 0
        self.weight = weight

    def window(self, ws: int, we: int) -> ReplayWindow:
        return ReplayWindow(self, ws, we)


class ReplayWindow:
    """The replay restricted to a step's window: its nodes in an order every edge respects
    (``replay_edges.window_order``), instants whose releasing edge starts outside the window
    fixed at their times."""

    def __init__(self, replay: Replay, ws: int, we: int) -> None:
        g = replay.graph
        ts = g.node_ts
        if ts.size and int(ts.min()) >= ws and int(ts.max()) <= we:
            # Every instant in the window (a trace without step markers is one window): so every edge,
            # and the graph's own columns serve uncopied (six passes and gathers of 16-17 M less).
            nodes, edges = np.arange(ts.size, dtype=np.int64), narrow(np.arange(g.src.size, dtype=np.int64))
            src, dst, fixed_nodes = g.src, g.dst, np.flatnonzero(g.bind_edge < 0)
        else:
            nodes = np.flatnonzero((ts >= ws) & (ts <= we))
            inside = np.zeros(ts.size, dtype=bool)
            inside[nodes] = True
            edges = narrow(np.flatnonzero(inside[g.src] & inside[g.dst]))
            src, dst = g.src[edges], g.dst[edges]
            bind = g.bind_edge[nodes]
            fixed_nodes = nodes[(bind < 0) | ~inside[g.src[np.maximum(bind, 0)]]]
        order = window_order(nodes, src, dst, ts)
        # Positions (of instants and of edges in the window) as int32 and array("i"): they are most
        # of what a window holds, 16 M instants and 17 M edges on a large export's whole-trace window.
        pos = np.full(ts.size, -1, dtype=np.int32)
        pos[order] = np.arange(order.size)
        ps, pd = pos[src], pos[dst]
        fast = compiled.loops(pd.size)
        #: The window's edges in the order of their end's position (ties: in edge order); int32
        #: holds the positions of any window's edges (a whole-trace window of 17 M: 68 MB, not 136).
        #: (Compiled: a counting sort by position, 0.1 s where argsort took 0.5 s on 17 M edges.)
        self.by_dst = (fast.stable_by_key(pd, order.size) if fast is not None
                       else np.argsort(pd, kind="stable").astype(np.int32))
        fixed = np.zeros(order.size, dtype=bool)
        fixed[pos[fixed_nodes]] = True
        self.g, self.replay, self.edges, self.order = g, replay, edges, order.astype(np.int32)
        self.sink_pos = pos
        self.dst_pos = pd
        self.src_pos = ps
        self.fixed = fixed
        self.ws = ws
        self._in_edges: LiveInEdges | None = None
        self._of_process: dict[int, I32 | None] = {}

    def measured_times(self) -> array[int]:
        """The window's instants' measured times, in its order: made for each replay, which changes
        them in place (kept with the window, they were 122 MB of a whole-trace window of a large
        export, held from its first prediction to the last; the gather takes ~0.05 s there)."""
        return _ints(self.g.node_ts[self.order])

    def _live_in_edges(self) -> LiveInEdges:
        """``saved``'s view of the window's in-edges, built at its first call: a diagnosis replays
        with ``edited`` alone, and on a whole-trace window of a large export (16 M instants) these
        arrays were 0.3 GB, built for every window."""
        if self._in_edges is None:
            self._in_edges = LiveInEdges(self.src_pos, self.dst_pos, self.by_dst, self.fixed)
        return self._in_edges

    def saved(self, sink: int, ids: I64, kinds: tuple[Edge, ...]) -> int:
        """Step time saved when the edges of these kinds spent in these slices take no time."""
        g = self.g
        weight = self.replay.weight[self.edges].copy()
        hit = np.isin(g.attr[self.edges], ids) & np.isin(g.kind[self.edges], [int(k) for k in kinds])
        if not hit.any():
            return 0
        weight[hit] = 0
        w = _ints(weight)
        times = self.measured_times()
        live = self._live_in_edges()
        many_first, many_src, many_edge = live.many_first, live.many_src, live.many_edge
        # Instants ordered before the first one a removed edge leads to replay as measured.
        k = bisect.bisect_left(live.live, int(self.dst_pos[hit].min()))
        for i, u, e in zip(live.live[k:], live.src_of[k:], live.edge_of[k:], strict=True):
            if u >= 0:
                times[i] = times[u] + w[e]
            else:
                times[i] = max(times[many_src[j]] + w[many_edge[j]] for j in range(many_first[e], many_first[e + 1]))
        at = int(self.sink_pos[sink])
        measured = int(g.node_ts[sink])
        return measured - times[at] if at >= 0 else 0

    def edited(self, sink: int, edit: GraphEdit, known: I64 | None = None) -> EditedPath:
        """The window replayed with ``edit`` applied, and its critical path walked back from
        ``sink`` (at each instant, the in-edge that released it last; on a tie, the measured
        path's edge, then the latest source, then the higher Edge kind). ``known``: the window's
        measured critical path (edge ids in time order, walked by binding edges), which the walk
        takes as it is below the first instant the edit reaches (``MeasuredStretches``: made for
        this replay alone, where that instant is STRETCHES_FROM or later; kept for the window,
        they were 124 MB at a large export's peak in a replay that could not use them)."""
        n_graph = self.g.src.size
        weight = self.replay.weight[self.edges]
        if edit.scaled.size and self.edges.size:
            at = np.searchsorted(self.edges, edit.scaled)
            ok = (at < self.edges.size) & (self.edges[np.minimum(at, self.edges.size - 1)] == edit.scaled)
            scale_weights(weight, at[ok], edit.factor[ok])
        dropped = self._among(edit.drop)
        pos = self.sink_pos
        add_ps, add_pd = pos[edit.add_src], pos[edit.add_dst]
        added = np.flatnonzero((add_ps >= 0) & (add_pd >= 0) & (add_ps < add_pd))
        # The kept edges by their end's position (the window's order, less the dropped), then each
        # added one after the kept ones that end where it does: a stable sort of them all, without
        # sorting every edge of the window again (a whole-trace window of a large export has 17 M).
        # Only the edges into the sink's process, where no edge (nor an added one) joins two
        # processes: nothing else reaches the sink (``process_edges``).
        pid_of, pid = self.g.node_pid, int(self.g.node_pid[sink])
        if pid not in self._of_process:
            self._of_process[pid] = process_edges(self.g, self.edges, self.by_dst, pid)
        mine = self._of_process[pid]
        if mine is None or sink < 0 or (pid_of[edit.add_src[added]] != pid_of[edit.add_dst[added]]).any():
            mine = self.by_dst
        else:
            added = added[pid_of[edit.add_dst[added]] == pid]
        # Instants before the first one an edit reaches replay as measured (as in ``saved``).
        touched = np.r_[self.dst_pos[dropped], add_pd[added],
                        self.dst_pos[self._among(edit.scaled)]] if not edit.empty else np.zeros(0, np.int64)
        below = int(touched.min()) if touched.size else self.order.size
        measured = self.measured_times()  # (read by the stretches, then replayed in place)
        stretches = MeasuredStretches(self.g, known, pos, self.fixed, np.frombuffer(measured, dtype=np.int64),
                                      self.ws, self.edges, self.src_pos, self.dst_pos, mine) \
            if known is not None and known.size and below >= STRETCHES_FROM else None
        by_dst = mine[~dropped[mine]] if edit.drop.size else mine
        # (The edges' ids as int32, as their positions: 68 MB, not 136, on a large export's window.)
        ps, pd, w, ids = self.src_pos[by_dst], self.dst_pos[by_dst], weight[by_dst], self.edges[by_dst].astype(np.int32)
        del by_dst, weight
        if added.size:
            added = added[np.argsort(add_pd[added], kind="stable")]
            at = np.searchsorted(pd, add_pd[added], side="right")
            # (One at a time, each old column let go before the next is copied: 0.2 GB less at a
            # whole-trace window's peak.)
            ps = np.insert(ps, at, add_ps[added])
            pd = np.insert(pd, at, add_pd[added])
            w = np.insert(w, at, edit.add_weight[added])
            ids = np.insert(ids, at, n_graph + added)
        del dropped
        lo = int(np.searchsorted(pd, below)) if touched.size else pd.size
        # Sources and lengths as machine integers once, for the replay (from ``lo``) and the walk,
        # which reads them as arrays through the same memory (the numpy copies are let go first).
        src, length = _positions(ps), _ints(w)
        del ps, w
        times = _replay_times(measured, src, _positions(pd[lo:]), length, self.fixed.tobytes(), lo)
        return self._walk_back(int(pos[sink]), times, np.frombuffer(src, dtype=np.int32), pd,
                               np.frombuffer(length, dtype=np.int64), ids, np.r_[edit.add_kind, 0], src, length,
                               (stretches, below) if stretches is not None else None)

    def _among(self, ids: I64) -> npt.NDArray[np.bool_]:
        """Per edge of the window, whether it is one of ``ids``: found by a search in the window's
        edges (in id order) rather than ``np.isin`` over them all, 0.2 s a call on a whole-trace
        window of 17 M edges."""
        out = np.zeros(self.edges.size, dtype=bool)
        if ids.size and self.edges.size:
            at = np.searchsorted(self.edges, ids)
            found = at < self.edges.size
            at = at[found]
            out[at[self.edges[at] == ids[found]]] = True
        return out

    def _walk_back(self, at: int, times: array[int], ps: I32, pd: I32, w: I64, ids: I32 | I64, add_kind: I64,
                   src: array[int] | None = None, length: array[int] | None = None,
                   measured: tuple[MeasuredStretches, int] | None = None) -> EditedPath:
        """From instant ``at`` back along, at each instant, the in-edge that released it: the
        latest arrival; then the measured path's edge; then the latest source; then the higher
        kind; then the later edge. Decided only for the instants walked, from each one's run of
        in-edges (``pd`` is sorted): a sort of every edge of the window by those keys took 1.5 GB
        and most of a replay's time on a whole-trace window of a large export, for a path that
        passes a few percent of its instants. ``src``, ``length``: ``ps`` and ``w`` as machine
        integers, where the caller has them. The path is walked as positions in the arrays, and
        named by ``ids`` at the end (a copy of them took 136 MB on that window). ``measured``:
        the measured path's stretches, and the first instant the replay changed (below it the
        walk takes them whole)."""
        g, n_graph = self.g, self.g.src.size
        if at < 0:
            return EditedPath(0, _none(), _none(), 0)
        # Each instant's first in-edge, summed in int32 (a sum into int32 of int64 counts made an
        # int64 temporary of every instant), each array let go as soon as it is copied: on a
        # whole-trace window of a large export, 16 M instants, they were 0.3 GB of the peak.
        counts = np.bincount(pd, minlength=len(times)).astype(np.int32)
        starts = np.zeros(counts.size + 1, dtype=np.int32)
        np.cumsum(counts, dtype=np.int32, out=starts[1:])
        del counts
        first = _positions(starts)
        del starts
        stretches, below = measured if measured is not None else (None, -1)
        through = one_way_in(np.frombuffer(first, dtype=np.int32), np.frombuffer(times, dtype=np.int64), self.ws,
                             self.fixed, stretches.on if stretches is not None else None, below)
        src = src if src is not None else _positions(ps)
        length = length if length is not None else _ints(w)
        fixed, ws = self.fixed.tobytes(), self.ws
        g_kind, bind_edge, order = g.kind, g.bind_edge, self.order

        def released_by(v: int, lo: int, hi: int) -> int:
            best, latest, tie = lo, times[src[lo]] + length[lo], False
            for j in range(lo + 1, hi):
                arrival = times[src[j]] + length[j]
                if arrival > latest:
                    best, latest, tie = j, arrival, False
                elif arrival == latest:
                    tie = True
            if not tie:  # one latest arrival (most instants): the other keys need not be read
                return best
            bound = int(bind_edge[order[v]])
            best, best_key = -1, (0, False, 0, 0)
            for j in range(lo, hi):
                i, t_src = int(ids[j]), times[src[j]]
                kind = int(g_kind[i]) if i < n_graph else int(add_kind[i - n_graph])
                key = (t_src + length[j], i == bound, t_src, kind)
                if best < 0 or key >= best_key:
                    best, best_key = j, key
            return best

        path = array("q")
        # The instants walked, as flags: a set of them held 0.5 GB on a whole-trace window of a
        # large export; the cycle search (rare) gets them as a set, read off the path's edges'
        # ends (each edge taken is an in-edge of the instant it was taken at).
        seen = bytearray(len(times))
        on_path = stretches.on if stretches is not None else b""
        v = at
        while times[v] > ws and not fixed[v]:
            e = through[v]
            while e >= 0 and not seen[v]:  # (the instants most of a path passes: ``one_way_in``)
                seen[v] = 1
                path.append(e)
                v = src[e]
                e = through[v]
            if not (times[v] > ws and not fixed[v]):
                break
            if v < below and on_path[v] and not seen[v] and stretches is not None:
                v = stretches.take(v, path, seen)
                continue
            lo, hi = first[v], first[v + 1]
            if lo == hi:
                break
            if seen[v]:  # a cycle of equal-time edges (see ``critical_path_walk``): leave it
                kind = np.where(ids < n_graph, g_kind[np.minimum(ids, n_graph - 1)],
                                add_kind[np.maximum(ids - n_graph, 0)])
                walked = set(pd[np.frombuffer(path, dtype=np.int64)].tolist())
                e = way_out_of_cycle(np.asarray(times, dtype=np.int64), ps, pd, kind, v, walked)
                if e < 0:
                    break
            else:
                e = lo if hi - lo == 1 else released_by(v, lo, hi)
            seen[v] = 1
            path.append(e)
            v = src[e]
        # Each edge's length: its end's time less its source's (or the window's start). (An edge
        # that leaves a cycle ends at an instant walked at the time of the one it was taken at.)
        # (The walk's arrays per instant let go first, then in place, a column at a time: a path of
        # 6 M edges made 0.25 GB of temporaries here, beside 0.14 GB the walk no longer needed.)
        del first, through, seen, on_path
        on = np.frombuffer(path, dtype=np.int64)[::-1]
        t = np.frombuffer(times, dtype=np.int64)
        from_ns = t[ps[on]]
        np.maximum(from_ns, ws, out=from_ns)
        lengths: I64 = t[pd[on]]
        lengths -= from_ns
        del from_ns
        return EditedPath(end_ns=times[at], edges=narrow(ids[on]), dur_ns=lengths, start_ns=max(times[v], ws))
