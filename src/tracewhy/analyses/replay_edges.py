"""Which of a replayed window's edges a replay reads, and how its loops hold them: ``saved``'s
view of each live instant's in-edges (``LiveInEdges``), the edges that end in one process
(``process_edges``), positions and times as machine integers (``_positions``, ``_ints``), the
order of a window's instants that every edge respects (``window_order``), and the replay's pass
over them (``_replay_times``).
"""

from __future__ import annotations

import itertools
from array import array
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tracewhy.analyses.critical_path_graph import Graph
from tracewhy.model import compiled

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]


class LiveInEdges:
    """Per live position of a window (not fixed, with an in-edge; ascending): its one in-edge
    (source position, edge position), or for the few with several (-1, k): the k-th group of
    such pairs, at many_first[k] to many_first[k + 1] (flat arrays: 1.3 M lists of pairs were
    0.3 GB). ``ps``, ``pd``: the window's edges' source and end positions; ``by_dst``: the
    edges in the order of their ends."""

    def __init__(self, ps: I32, pd: I32, by_dst: I32, fixed: npt.NDArray[np.bool_]) -> None:
        indeg = np.bincount(pd, minlength=fixed.size)
        live = np.flatnonzero(~fixed & (indeg > 0))
        first = np.r_[0, np.cumsum(indeg)]
        self.live = _positions(live)
        one = indeg[live] == 1
        src_of = np.where(one, ps[by_dst[first[live]]], -1)
        edge_of = by_dst[first[live]].astype(np.int64)
        many = np.flatnonzero(~one)
        edge_of[many] = np.arange(many.size)
        self.src_of, self.edge_of = _positions(src_of), _positions(edge_of)
        lo, hi = first[live[many]], first[live[many] + 1]
        offsets = np.r_[0, np.cumsum(hi - lo)]
        at = np.repeat(lo - offsets[:-1], hi - lo) + np.arange(int(offsets[-1]))
        self.many_first = _positions(offsets)
        self.many_src, self.many_edge = _positions(ps[by_dst[at]]), _positions(by_dst[at])


def process_edges(g: Graph, edges: I64, by_dst: I32, pid: int) -> I32 | None:
    """Of a window's edges (``by_dst``: positions in ``edges``, by their ends' order), those that
    end in process ``pid``; None when an edge of the window joins two processes. Else a replay
    from one of its instants depends on its own process's alone (half the edges of a
    two-process export's whole-trace window, whose steps are one process's)."""
    ids = edges[by_dst]
    ends = g.node_pid[g.dst[ids]]
    if (ends != g.node_pid[g.src[ids]]).any():
        return None
    out: I32 = by_dst[ends == pid]
    return out


def _ints(values: npt.NDArray[np.integer[Any]]) -> array[int]:
    """Integers as machine integers the replay's loops read one by one: a list of Python ints is
    4.5 times the memory (a whole-trace window of a large export has 16 M instants, whose lists
    held 4 GB)."""
    out = array("q")
    out.frombytes(np.ascontiguousarray(values, dtype=np.int64).data.cast("B"))  # (no copy between)
    return out


def _positions(values: npt.NDArray[np.integer[Any]]) -> array[int]:
    """Positions in a window (under 2^31) as the replay's loops read them, half of ``_ints``."""
    out = array("i")
    out.frombytes(np.ascontiguousarray(values, dtype=np.int32).data.cast("B"))
    return out


def one_way_in(starts: npt.NDArray[np.int32], times: npt.NDArray[np.int64], ws: int,
               fixed: npt.NDArray[np.bool_], on_measured: bytearray | None, below: int) -> array[int]:
    """Per instant of a replayed window, the one in-edge a walk back takes there without
    weighing others: where the instant has exactly one (``starts``: each instant's first in-edge
    position, edges by their ends' order), lies after the window's start, is not fixed, and is
    not where the walk takes the measured path's stretches instead (``on_measured`` below
    ``below``); else -1. Most instants of a step's path have one in-edge (program order on a
    thread); the walk passes them by this array alone: the 33 walks of a diagnosis of HTA's V100
    DDP rank took 0.32 s instead of 0.48 deciding each instant."""
    one = (np.diff(starts) == 1) & (times > ws) & ~fixed
    if on_measured is not None and below > 0:
        one[:below] &= np.frombuffer(on_measured, dtype=np.uint8)[:below] == 0
    return _positions(np.where(one, starts[:-1], np.int32(-1)))  # (int32: a whole-trace window has 16 M)


def scale_weights(weight: I64, at: I64, factor: F64) -> None:
    """``weight`` (in place) with the entries ``at`` multiplied by their ``factor`` (an entry
    named several times: by each, in order, as ``np.multiply.at`` over a column of ones would)
    and rounded: only the scaled entries are touched (a column of factors, its product and its
    rounding were three float64 copies of every edge's weight, 136 MB each on a whole-trace
    window of a large export)."""
    if at.size == 0:
        return
    order = np.argsort(at, kind="stable")
    at, factor = at[order], factor[order]
    first = np.flatnonzero(np.r_[True, at[1:] != at[:-1]])
    hit = at[first]
    weight[hit] = np.round(weight[hit] * np.multiply.reduceat(factor, first)).astype(np.int64)


#: Rounds of ordering instants that share a time (equal-time edges: integer-microsecond traces);
#: chains of equal-time edges are a few links long, a cycle of them never settles.
_MAX_TIE_ROUNDS: Final = 64


def window_order(nodes: I64, src: I64, dst: I64, ts: I64) -> I64:
    """These nodes (ascending) in an order every edge respects: by time, and among equal times by
    the number of equal-time edges leading to each, then by node (an edge between equal times that
    contradicts another leaves its nodes in time order: their replayed times stay as measured)."""
    tie = ts[src] == ts[dst]
    whole = nodes.size == ts.size  # (ascending and every node: nodes is arange, gathers through it copies)
    if not tie.any():
        # No equal-time edge: by time alone, one stable sort (a nanosecond clock's export has none;
        # on a 606 MB one's 16 M instants the two-key lexsort and its gathers took twice as long).
        by_time: I64 = np.argsort(ts if whole else ts[nodes], kind="stable")
        return by_time if whole else nodes[by_time]
    ts_, td = src[tie], dst[tie]
    level = np.zeros(ts.size, dtype=np.int64)
    for _ in range(_MAX_TIE_ROUNDS):
        before = level[td].copy()
        np.maximum.at(level, td, level[ts_] + 1)
        if np.array_equal(before, level[td]):
            break
    # (``nodes`` ascend and np.lexsort is stable: ties stay in node order without a third key.)
    if whole:
        everything: I64 = np.lexsort((level, ts))
        return everything
    return nodes[np.lexsort((level[nodes], ts[nodes]))]


def _replay_times(times: array[int], ps: array[int], pd: array[int], w: array[int], fixed: bytes, lo: int = 0
                  ) -> array[int]:
    """Each instant (by position, edges sorted by their end's) at the latest of its in-edges;
    fixed instants and those without an in-edge keep their measured times. A source later in
    the order than its end (a contradicting tie) counts at its measured time. Edges from ``lo``
    on in ``ps`` and ``w``, all of ``pd`` (its tail from ``lo``). A long pass runs compiled
    (``compiled.loops``), on views of the same arrays."""
    fast = compiled.loops(len(pd))
    if fast is not None:
        fast.replay_times(np.frombuffer(times, dtype=np.int64), np.frombuffer(ps, dtype=np.int32),
                          np.frombuffer(pd, dtype=np.int32), np.frombuffer(w, dtype=np.int64),
                          np.frombuffer(fixed, dtype=np.bool_), lo)
        return times
    cur, best = -1, 0
    for u, v, length in zip(itertools.islice(ps, lo, None), pd, itertools.islice(w, lo, None), strict=True):
        if v != cur:
            if cur >= 0 and not fixed[cur]:
                times[cur] = best
            cur, best = v, times[u] + length
        elif times[u] + length > best:
            best = times[u] + length
    if cur >= 0 and not fixed[cur]:
        times[cur] = best
    return times
