"""The replay behind the critical path's gains: a step's dependency graph with some edges' time
removed, each instant recomputed at the latest of its in-edges, so that the step's length
without an item can be read off its last instant (``critical_path`` walks the path and picks
the items; this module says how much shorter the step would be without each).
"""

from __future__ import annotations

import bisect
from typing import Final

import numpy as np
import numpy.typing as npt

from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.critical_path_graph import Graph

I64 = npt.NDArray[np.int64]


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
        weight = elapsed.copy()
        for kind in (Edge.LAUNCH, Edge.GAP, Edge.SYNC):
            this = graph.kind == kind
            measured = elapsed[this & binding]
            floor = int(np.median(measured)) if measured.size else 0
            weight[this & ~binding] = np.minimum(elapsed[this & ~binding], floor)
        weight[~binding & np.isin(graph.kind, [Edge.HOST, Edge.EVENT_WAIT, Edge.HANDOFF])] = 0
        self.weight = weight

    def window(self, ws: int, we: int) -> ReplayWindow:
        return ReplayWindow(self, ws, we)


class ReplayWindow:
    """The replay restricted to a step's window: its nodes in an order every edge respects
    (``_order``), instants whose releasing edge starts outside the window fixed at their times."""

    def __init__(self, replay: Replay, ws: int, we: int) -> None:
        g = replay.graph
        ts = g.node_ts
        nodes = np.flatnonzero((ts >= ws) & (ts <= we))
        inside = np.zeros(ts.size, dtype=bool)
        inside[nodes] = True
        edges = np.flatnonzero(inside[g.src] & inside[g.dst])
        bind = g.bind_edge[nodes]
        fixed_nodes = nodes[(bind < 0) | ~inside[g.src[np.maximum(bind, 0)]]]
        order = _order(nodes, g.src[edges], g.dst[edges], ts)
        pos = np.full(ts.size, -1, dtype=np.int64)
        pos[order] = np.arange(order.size)
        ps, pd = pos[g.src[edges]], pos[g.dst[edges]]
        by_dst = np.argsort(pd, kind="stable")
        fixed = np.zeros(order.size, dtype=bool)
        fixed[pos[fixed_nodes]] = True
        indeg = np.bincount(pd, minlength=order.size)
        live = np.flatnonzero(~fixed & (indeg > 0))
        first = np.r_[0, np.cumsum(indeg)]
        self.g, self.replay, self.edges, self.order = g, replay, edges, order
        self.times = ts[order].tolist()
        # Per live position: its one in-edge (source position, edge position), or for the few
        # with several (-1, k): the k-th list of such pairs.
        self.live = live.tolist()
        one = indeg[live] == 1
        src_of = np.where(one, ps[by_dst[first[live]]], -1)
        edge_of = by_dst[first[live]].copy()
        many = np.flatnonzero(~one)
        edge_of[many] = np.arange(many.size)
        self.src_of, self.edge_of = src_of.tolist(), edge_of.tolist()
        self.many = [list(zip(ps[by_dst[first[i]:first[i + 1]]].tolist(), by_dst[first[i]:first[i + 1]].tolist(),
                              strict=True)) for i in live[many].tolist()]
        self.sink_pos = pos
        self.dst_pos = pd

    def saved(self, sink: int, ids: I64, kinds: tuple[Edge, ...]) -> int:
        """Step time saved when the edges of these kinds spent in these slices take no time."""
        g = self.g
        weight = self.replay.weight[self.edges].copy()
        hit = np.isin(g.attr[self.edges], ids) & np.isin(g.kind[self.edges], [int(k) for k in kinds])
        if not hit.any():
            return 0
        weight[hit] = 0
        w = weight.tolist()
        times = list(self.times)
        many = self.many
        # Instants ordered before the first one a removed edge leads to replay as measured.
        k = bisect.bisect_left(self.live, int(self.dst_pos[hit].min()))
        for i, u, e in zip(self.live[k:], self.src_of[k:], self.edge_of[k:], strict=True):
            if u >= 0:
                times[i] = times[u] + w[e]
            else:
                times[i] = max(times[a] + w[b] for a, b in many[e])
        at = int(self.sink_pos[sink])
        measured = int(g.node_ts[sink])
        return measured - times[at] if at >= 0 else 0


#: Rounds of ordering instants that share a time (equal-time edges: integer-microsecond traces);
#: chains of equal-time edges are a few links long, a cycle of them never settles.
_MAX_TIE_ROUNDS: Final = 64


def _order(nodes: I64, src: I64, dst: I64, ts: I64) -> I64:
    """These nodes in an order every edge respects: by time, and among equal times by the number
    of equal-time edges leading to each (an edge between equal times that contradicts another
    leaves its nodes in time order: their replayed times stay as measured)."""
    tie = ts[src] == ts[dst]
    ts_, td = src[tie], dst[tie]
    level = np.zeros(ts.size, dtype=np.int64)
    for _ in range(_MAX_TIE_ROUNDS):
        before = level[td].copy()
        np.maximum.at(level, td, level[ts_] + 1)
        if np.array_equal(before, level[td]):
            break
    result: I64 = nodes[np.lexsort((nodes, level[nodes], ts[nodes]))]
    return result
