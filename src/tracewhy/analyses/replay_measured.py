"""The measured critical path of a window (the account's walk) as stretches a replay's walk back
takes whole: below the first instant an edit reaches, every instant keeps its measured time and
its in-edges, and the edge that released it is its binding edge, so the walk there is the
account's. A whole-trace window of a large export walks 6.7 M edges back one Python step each,
and the replay with no edit but the drain walks the account's path again.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left

import numpy as np
import numpy.typing as npt

from tracewhy.analyses.critical_path_graph import Graph

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
B = npt.NDArray[np.bool_]


class MeasuredStretches:
    """The edges of ``known`` (a path of bind edges in time order, graph ids) a walk back may
    take as they are, by position in the window: an edge is taken as measured where it is its
    end's binding edge, runs forward in the window's order, ends at an instant that is neither
    fixed nor at or before the window's start, and no edge of the window runs back into that
    instant (its replayed source would be read). ``by_dst``: the edges the replay reads, as
    positions in the window's ``edges`` by their ends' order; the walk names an edge by its
    place there (the same in every replay below the first instant an edit reaches)."""

    def __init__(self, g: Graph, known: I64, pos: I32, fixed: B, times: I64, ws: int, edges: I64,
                 src_pos: I32, dst_pos: I32, by_dst: I32) -> None:
        self.g, self.known, self.pos = g, known, pos
        dst = g.dst[known]
        kd, ks = pos[dst], pos[g.src[known]]
        ok = (kd >= 0) & (ks >= 0) & (ks < kd) & (g.bind_edge[dst] == known)
        del dst
        at = np.maximum(kd, 0)
        back = np.zeros(fixed.size, dtype=bool)
        back[dst_pos[src_pos >= dst_pos]] = True
        ok &= ~fixed[at] & (times[at] > ws) & ~back[at]
        del back, at
        place = np.full(edges.size, -1, dtype=np.int32)
        place[by_dst] = np.arange(by_dst.size, dtype=np.int32)
        if edges.size:
            found = np.minimum(np.searchsorted(edges, known), edges.size - 1)
            self.place: I32 = np.where(edges[found] == known, place[found], -1).astype(np.int32)
        else:
            self.place = np.full(known.size, -1, dtype=np.int32)
        del place
        ok &= self.place >= 0
        # An instant the path passes twice (a cycle it left) is taken by the slow walk alone.
        ends, count = np.unique(kd[ok], return_counts=True)
        ok &= ~np.isin(kd, ends[count > 1])
        del ends, count
        # Each taken edge's run: back to the first one whose source is not the end of the one
        # before it (or that one not taken).
        k = np.arange(known.size, dtype=np.int32)
        linked = np.zeros(known.size, dtype=bool)
        linked[1:] = ok[1:] & ok[:-1] & (kd[:-1] == ks[1:])
        self.run_lo: I32 = np.maximum.accumulate(np.where(linked, 0, k)) if known.size else k
        del linked, k, ks
        keep = np.flatnonzero(ok).astype(np.int32)
        keep = keep[np.argsort(kd[keep], kind="stable")]
        # (A flag per position first: most instants of the walk's slow part are not on the path.)
        self.on = bytearray(fixed.size)
        np.frombuffer(self.on, dtype=np.uint8)[kd[keep]] = 1
        self.keys = array("i")
        self.keys.frombytes(np.ascontiguousarray(kd[keep], dtype=np.int32).tobytes())
        self.at = keep

    def take(self, v: int, path: array[int], seen: bytearray) -> int:
        """From instant ``v`` (on the path: ``on[v]``, not yet seen), the path's edges back to its
        run's start or before an instant already walked, added to ``path`` (last first) and their
        ends to ``seen``; returns the instant the walk goes on from."""
        k = int(self.at[bisect_left(self.keys, v)])
        lo = int(self.run_lo[k])
        g, pos, known = self.g, self.pos, self.known
        ends = pos[g.dst[known[lo:k + 1]]]
        walked = np.frombuffer(seen, dtype=np.uint8)
        met = np.flatnonzero(walked[ends])
        if met.size:
            lo += int(met[-1]) + 1
            ends = ends[int(met[-1]) + 1:]
        path.frombytes(self.place[lo:k + 1][::-1].astype(np.int64).tobytes())
        walked[ends] = 1
        return int(pos[g.src[known[lo]]])
