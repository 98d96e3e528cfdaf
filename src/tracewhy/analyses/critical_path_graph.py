"""The dependency graph the critical path runs through: one node at the start and one at the end
of every host slice (CPU ops, annotations, runtime and driver calls) and every GPU activity
(kernels, copies, memsets), and an edge for each thing that makes one of those instants wait on
another: program order on a host thread, launch to GPU start, stream order on the GPU, a
synchronizing call waiting for the work it drains, and a stream waiting on another stream's event.

Every edge's length is the time between its ends, so every path between two instants is as long
as the time between them. What singles out the critical path is which in-edge *released* each
instant: the one whose source happened last (``binding``). Built once per Trace, with numpy;
this module builds the nodes and the edges along one timeline (a thread, a stream, a launch),
``critical_path_edges`` the waits that cross from one timeline to another.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.autograd_threads import backward_threads
from tracewhy.analyses.critical_path_edges import (
    Edge,
    EdgeParts,
    edges,
    full_queue_edges,
    handoff_edges,
    no_edges,
    stream_keys,
    sync_edges,
    unrecorded_wait_edges,
)
from tracewhy.analyses.id_arrays import Ids, narrow  # (node, edge and slice numbers)
from tracewhy.model import compiled
from tracewhy.model.linking import pair_key
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, Kind
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]


#: The kinds whose slices become nodes on the host side (Python frames would triple the nodes
#: of a with_stack trace and attribute nothing a CPU op does not).
GRAPH_HOST_KINDS: Final = (Kind.CPU_OP, Kind.ANNOTATION, Kind.RUNTIME, Kind.DRIVER)


class Graph(msgspec.Struct, frozen=True):
    """Nodes ``2i`` (start) and ``2i + 1`` (end) belong to slice ``node_slice[2i]``; edges are
    parallel arrays. ``bind_edge[v]`` is the edge that released node v (-1: nothing in the trace
    did: the first instant of a thread or stream)."""

    node_slice: Ids
    node_ts: I64
    node_pid: Ids  # the host process an instant belongs to (a GPU activity: its launcher's)
    src: Ids
    dst: Ids
    kind: npt.NDArray[np.int8]  # an Edge value
    attr: Ids  # the slice the edge's time is spent in (-1: none: an idle host thread or stream gap)
    bind_edge: Ids
    dropped_edges: int  # edges whose end precedes their start (clocks of host and GPU disagree)

    @property
    def elapsed(self) -> I64:
        ts = self.node_ts
        out: I64 = ts[self.dst] - ts[self.src]
        return out

    def end_nodes(self, slice_ids: npt.NDArray[np.integer[Any]]) -> I64:
        """The nodes where these slices end (the graph's slices are in id order), in one search: a
        search per slice copied the strided start nodes each time, 0.4 ms a call on a 1.2 M-node
        graph."""
        out: I64 = 2 * np.searchsorted(self.node_slice[0::2], slice_ids).astype(np.int64) + 1
        return out


def build_graph(trace: Trace) -> Graph:
    """The graph of a whole trace; see the module docstring for what its edges are."""
    trace.require_whole()
    s = trace.slices
    gpu_kinds = [k.value for k in GPU_ACTIVITY_KINDS]
    # (Rows filtered before the eleven columns are copied: filtering first copied all fifteen of
    # a large export's 8 M graph slices.)
    chosen = trace.slices_where(pl.col(Col.KIND).is_in([k.value for k in GRAPH_HOST_KINDS] + gpu_kinds),
                                Col.ID, Col.KIND, Col.NAME, Col.TS, Col.DUR, Col.PID, Col.TID, Col.DEVICE, Col.STREAM,
                                Col.DEPTH, Col.LAUNCH)
    ids = chosen.get_column(Col.ID).to_numpy()
    n = ids.size
    node_of = np.full(s.height, -1, dtype=np.int64)
    node_of[ids] = 2 * np.arange(n, dtype=np.int64)
    ts = chosen.get_column(Col.TS).to_numpy()
    end = ts + np.maximum(chosen.get_column(Col.DUR).to_numpy(), 0)
    node_ts = np.empty(2 * n, dtype=np.int64)
    node_ts[0::2], node_ts[1::2] = ts, end
    is_gpu = chosen.get_column(Col.KIND).is_in(gpu_kinds).to_numpy()
    pid = chosen.get_column(Col.PID).fill_null(-1).to_numpy()
    launch = chosen.get_column(Col.LAUNCH).fill_null(-1).to_numpy()
    all_pid = s.get_column(Col.PID).fill_null(-1).to_numpy()
    launcher_pid = np.where(launch >= 0, all_pid[np.maximum(launch, 0)], pid)
    owner = np.where(is_gpu, launcher_pid, pid)

    host = _host_chain(s, chosen, ~is_gpu, node_of)
    parts = [
        host,
        full_queue_edges(s, chosen, is_gpu, launcher_pid, node_ts),
        unrecorded_wait_edges(s, chosen, is_gpu, node_ts),
        handoff_edges(chosen, ~is_gpu, node_ts, host, backward_threads(trace),
                      s.get_column(Col.KIND).to_physical().to_numpy()),
        _gpu_chain(chosen, is_gpu),
        _launches(s, chosen, is_gpu, node_of),
        sync_edges(trace, chosen, is_gpu, node_of, node_ts),
    ]
    del host
    # Each column joined, its parts let go and its backward edges dropped before the next one is
    # joined: on a large export's 17 M edges the parts, the joined columns and their filtered
    # copies, all held at once, came to 1.4 GB at the end of the graph's build.
    columns = [list(c) for c in zip(*parts, strict=True)]
    del parts
    src, dst = _joined(columns, 0), _joined(columns, 1)
    forward = node_ts[dst] >= node_ts[src]
    dropped = int(forward.size - np.count_nonzero(forward))
    src = src[forward]
    dst = dst[forward]
    kind = _joined(columns, 2, np.int8)[forward]
    attr = narrow(_joined(columns, 3)[forward])
    del forward
    bind = _binding(node_ts, src, dst, kind)
    return Graph(node_slice=np.repeat(narrow(ids), 2), node_ts=node_ts, node_pid=np.repeat(narrow(owner), 2),
                 src=narrow(src), dst=narrow(dst), kind=kind, attr=narrow(attr), bind_edge=narrow(bind),
                 dropped_edges=dropped)


def _joined(columns: list[list[I64]], k: int, dtype: type[np.integer[Any]] | None = None) -> npt.NDArray[Any]:
    """Column ``k`` of the edge parts joined in one array (as ``dtype``, cast part by part while
    joined: the kinds, a byte each); the parts' own arrays are let go."""
    out: npt.NDArray[Any] = np.concatenate(columns[k], dtype=dtype, casting="same_kind")
    columns[k].clear()
    return out


def _host_chain(s: pl.DataFrame, chosen: pl.DataFrame, host: npt.NDArray[np.bool_], node_of: I64) -> EdgeParts:
    """Each host thread's instants in program order, each edge spent in the innermost slice
    open between its ends. At one instant: ends before starts, inner ends before outer ones,
    outer starts before inner ones, and a zero-length slice's end right after its start."""
    rows = np.flatnonzero(host)
    if rows.size == 0:
        return no_edges()
    ids = chosen.get_column(Col.ID).to_numpy()[rows]
    thread = _thread_ranks(chosen.get_column(Col.PID).fill_null(-1).to_numpy()[rows],
                           chosen.get_column(Col.TID).fill_null(-1).to_numpy()[rows])
    ts = chosen.get_column(Col.TS).to_numpy()[rows]
    dur = np.maximum(chosen.get_column(Col.DUR).to_numpy()[rows], 0)
    depth = chosen.get_column(Col.DEPTH).fill_null(0).to_numpy()[rows].astype(np.int64)
    order = _boundary_order(thread, ts, dur, depth)
    del ts, dur, depth
    # Boundary b is the start of row b, or for b >= rows.size the end of row b - rows.size: each
    # per-boundary array is made from its per-row halves (on a 600 MB export 13 M boundaries,
    # where a gather through b's row took a pass over 100 MB each time).
    in_order = np.r_[thread, thread][order]
    same = in_order[1:] == in_order[:-1]
    del in_order
    src_b, dst_b = order[:-1][same], order[1:][same]
    del order, same
    start_node = node_of[ids]
    node = np.r_[start_node, start_node + 1]
    # Innermost open slice after a boundary: the slice itself after its start; after its end,
    # its nearest enclosing graph slice (Python frames are not in the graph).
    open_after = np.r_[ids, _graph_parent(s, ids, node_of)]
    return edges(node[src_b], node[dst_b], Edge.HOST, open_after[src_b])


def _thread_ranks(pid: I64, tid: I64) -> I64:
    """One integer per (pid, tid) pair, in the pairs' order: both in one where they fit
    (``linking.pair_key``), else the pair's rank."""
    key = pair_key(pid, tid)
    if key is not None:
        return key
    _, rank = np.unique(np.stack([pid, tid], axis=1), axis=0, return_inverse=True)
    out: I64 = rank.reshape(-1).astype(np.int64)
    return out


def _boundary_order(thread: I64, ts: I64, dur: I64, depth: I64) -> I64:
    """The order of the host slices' boundaries (b < n: the start of row b; else the end of row
    b - n) by thread, time, then group (a non-zero-length slice's end before the rest), level
    (inner ends before outer ones, outer starts before inner ones), row, and start before end.
    The last four keys are one integer where it fits: each key of a sort is a pass over every
    boundary, 13 M of them on a large export."""
    n = ts.size
    top = int(np.abs(depth).max()) if n else 0
    b_thread, b_ts = np.r_[thread, thread], np.r_[ts, ts + dur]
    zero = dur == 0
    if 2 * (2 * top + 1) * max(n, 1) * 2 >= 1 << 62:
        is_end = np.r_[np.zeros(n, bool), np.ones(n, bool)]
        group = np.where(is_end & ~np.r_[zero, zero], 0, 1)
        level = np.where(group == 0, -np.r_[depth, depth], np.r_[depth, depth])
        row = np.r_[np.arange(n), np.arange(n)]
        order: I64 = np.lexsort((is_end, row, level, group, b_ts, b_thread))
        return order
    # ((group * (2 * top + 1) + level + top) * n + row) * 2 + is_end, with group 1 and level
    # +depth for starts and zero-length ends, group 0 and level -depth for other ends.
    row = np.arange(n, dtype=np.int64)
    start = ((2 * top + 1 + depth + top) * n + row) * 2
    end = np.where(zero, start + 1, ((top - depth) * n + row) * 2 + 1)
    del row
    order = np.lexsort((np.r_[start, end], b_ts, b_thread))
    return order


def _graph_parent(s: pl.DataFrame, ids: I64, node_of: I64) -> I64:
    """Per id: the nearest enclosing slice that is a graph node (-1: none)."""
    parent = s.get_column(Col.PARENT).fill_null(-1).to_numpy()
    return nearest_marked(parent, parent[ids], node_of >= 0)


def nearest_marked(parent: I64, at: I64, marked: npt.NDArray[np.bool_]) -> I64:
    """Per slice of ``at`` (-1: none): the nearest slice at or above it, following ``parent``,
    that is ``marked`` (-1: none). Only the slices not yet settled climb, a level per round."""
    cur: I64 = at.copy()
    todo = np.flatnonzero((cur >= 0) & ~marked[np.maximum(cur, 0)])
    while todo.size:
        cur[todo] = parent[cur[todo]]
        todo = todo[(cur[todo] >= 0) & ~marked[np.maximum(cur[todo], 0)]]
    return cur


def _gpu_chain(chosen: pl.DataFrame, is_gpu: npt.NDArray[np.bool_]) -> EdgeParts:
    """Each activity running (start to end) and stream order (one's end to the next's start)."""
    rows = np.flatnonzero(is_gpu)
    ids = chosen.get_column(Col.ID).to_numpy()[rows]
    key = stream_keys(chosen, rows)
    ts = chosen.get_column(Col.TS).to_numpy()[rows]
    end = ts + np.maximum(chosen.get_column(Col.DUR).to_numpy()[rows], 0)
    start_node = 2 * rows
    order = np.lexsort((ids, ts, key))
    nxt = order[1:][(key[order][1:] == key[order][:-1]) & (ts[order][1:] >= end[order][:-1])]
    prev = order[:-1][(key[order][1:] == key[order][:-1]) & (ts[order][1:] >= end[order][:-1])]
    run = edges(start_node, start_node + 1, Edge.GPU, ids)
    gap = edges(start_node[prev] + 1, start_node[nxt], Edge.GAP, np.full(nxt.size, -1, np.int64))
    return tuple(np.r_[a, b] for a, b in zip(run, gap, strict=True))


def _launches(s: pl.DataFrame, chosen: pl.DataFrame, is_gpu: npt.NDArray[np.bool_], node_of: I64) -> EdgeParts:
    """A launch call's start to its GPU activity's start (spent in the call: launch overhead),
    and, where a call returned after its activity ended and so waited for it, the activity's
    end to the call's end: synchronous calls (cudaMemcpy, cudaMemset), and copies, which
    cudaMemcpyAsync makes synchronous from or to pageable memory. A kernel launch that returns
    after a short kernel ended did not wait for it (launches are asynchronous)."""
    rows = np.flatnonzero(is_gpu)
    launch = chosen.get_column(Col.LAUNCH).fill_null(-1).to_numpy()[rows]
    has = (launch >= 0) & (node_of[np.maximum(launch, 0)] >= 0)
    rows, launch = rows[has], launch[has]
    call_start = node_of[launch]
    first, after, running = _replay_order(chosen, rows, launch)
    start = edges(call_start[first], 2 * rows[first], Edge.LAUNCH, launch[first])
    ids = chosen.get_column(Col.ID).to_numpy()
    start = tuple(np.r_[a, b] for a, b in zip(
        start, edges(2 * rows[running], 2 * rows[after], Edge.GPU, ids[rows[running]]), strict=True))
    names = s.get_column(Col.NAME).gather(launch)
    sync_names = [n for n in names.unique().to_list() if n is not None and api_names.is_sync_call(n)]
    ends = chosen.get_column(Col.TS).to_numpy()[rows] + np.maximum(chosen.get_column(Col.DUR).to_numpy()[rows], 0)
    call_end = s.get_column(Col.TS).to_numpy()[launch] + np.maximum(s.get_column(Col.DUR).to_numpy()[launch], 0)
    is_copy = (chosen.get_column(Col.KIND).gather(rows) == Kind.MEMCPY.value).to_numpy()
    waited = (ends <= call_end) & (names.is_in(sync_names).to_numpy() | is_copy)
    sync = edges(2 * rows[waited] + 1, call_start[waited] + 1, Edge.SYNC, launch[waited])
    return tuple(np.r_[a, b] for a, b in zip(start, sync, strict=True))


def _replay_order(chosen: pl.DataFrame, rows: I64, launch: I64) -> tuple[npt.NDArray[np.bool_], I64, I64]:
    """Of GPU ``rows`` and the ``launch`` call of each: which wait on their launch call, and the
    (later, earlier) row-index pairs where a later one overlaps the one before it.

    A CUDA/HIP graph launch replays many activities under one correlation id; only the first on
    each stream waits on the call. Each later one waits on the one before it in the replay, which
    stream order says (``_gpu_chain``) unless the two overlap: HIP's kernel timestamps in vLLM's
    piecewise-graph trace overlap consecutive graph kernels by ~100 ns, which leaves a kernel with
    only the launch edge, and the path then took the whole replay before it (169 ms there) as
    launch overhead. Such a kernel waits on the GPU running the one it overlaps instead: an edge
    from that one's start, spent in it.
    """
    key = stream_keys(chosen, rows)
    ts = chosen.get_column(Col.TS).to_numpy()[rows]
    end = ts + np.maximum(chosen.get_column(Col.DUR).to_numpy()[rows], 0)
    order = np.lexsort((ts, key, launch))
    same = (launch[order][1:] == launch[order][:-1]) & (key[order][1:] == key[order][:-1])
    later, earlier = order[1:][same], order[:-1][same]
    first = np.ones(rows.size, dtype=bool)
    first[later] = False
    overlaps = ts[later] < end[earlier]
    return first, later[overlaps], earlier[overlaps]


def _binding(node_ts: I64, src: I64, dst: I64, kind: npt.NDArray[np.int8]) -> I64:
    """Per node, the in-edge whose source happened last (ties: the higher Edge value); -1 for none."""
    bind = np.full(node_ts.size, -1, dtype=np.int64)
    if dst.size == 0:
        return bind
    fast = compiled.loops(dst.size)
    if fast is not None:  # (one pass over the edges: 0.1 s where the two np.maximum.at took 1.2 s on 17 M)
        done: I64 = fast.binding(node_ts, src, dst, kind, bind)
        return done
    at = node_ts[src]
    low = int(at.min())
    if int(at.max()) - low < 1 << 58 and int(kind.min()) >= 0 and int(kind.max()) < 1 << 4:
        # Per node the greatest (source time, kind) packed in one integer, then the last edge
        # that has it: two passes in edge order, where a lexsort by node, time and kind took
        # 2.2 s over a large export's 17 M edges.
        key = ((at - low) << 4) | kind.astype(np.int64)
        del at
        best = np.full(node_ts.size, -1, dtype=np.int64)
        np.maximum.at(best, dst, key)
        np.maximum.at(bind, dst, np.where(key == best[dst], np.arange(dst.size), -1))
        return bind
    order = np.lexsort((kind, node_ts[src], dst))
    d = dst[order]
    last = np.r_[d[1:] != d[:-1], True]
    bind[d[last]] = order[last]
    return bind


