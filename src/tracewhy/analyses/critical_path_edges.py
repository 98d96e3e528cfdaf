"""The edges of the critical-path graph that cross from one timeline to another because
something waited: blocking calls on the GPU work they drain, streams on another stream's event
(recorded, or inferred where a trace has no sync records), a full launch queue on the GPU, and
the thread that called backward() and the autograd thread on each other. Also the edge
vocabulary (``Edge``) both graph modules share.
"""

from __future__ import annotations

import itertools
from enum import IntEnum
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.name_codes import decide, distinct_names
from tracewhy.model.schema import KIND_CODE, Col, Kind, SyncCol
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]


class Edge(IntEnum):
    """Why one instant waits on another. The value is also the tie-break when two in-edges
    release an instant at the same time: the higher one names the wait (a sync that returned
    the instant its kernel ended waited on the kernel, not on itself)."""

    HANDOFF = 0  # a backward (autograd) thread going idle to the thread that waited on it
    HOST = 1  # program order on one host thread
    LAUNCH = 2  # a launch call's start to the GPU activity it launched starting
    GAP = 3  # stream order: one activity's end to the next one's start on the same stream
    GPU = 4  # a GPU activity running
    EVENT_WAIT = 5  # cudaStreamWaitEvent: the awaited activity's end to the waiting stream's next start
    SYNC = 6  # a blocking call returning after the GPU work it drained ended


#: Edges as parallel arrays: source node, destination node, Edge value (a byte: ``edges``), slice.
EdgeParts = tuple[I64, I64, npt.NDArray[np.signedinteger[Any]], I64]


def no_edges() -> EdgeParts:
    """No edges (a kind of wait the trace has none of)."""
    empty = np.zeros(0, dtype=np.int64)
    return empty, empty, empty, empty


def way_out_of_cycle(times: I64, src: npt.NDArray[np.signedinteger[Any]], dst: npt.NDArray[np.signedinteger[Any]],
                     kind: npt.NDArray[np.signedinteger[Any]], v: int, seen: set[int]) -> int:
    """The in-edge (an index into ``src``/``dst``) by which a walk back along releasing edges leaves
    the cycle that closed at instant ``v``: of the edges into instants already walked at ``v``'s
    time, the one whose source happened last before that time (ties: the higher kind); -1 when
    none is earlier. Such cycles need instants that share a time and timelines that order them
    differently (a host thread, a stream and the launches between them with every time collapsed
    to one instant); the walk would go round one for ever. Rare: an O(edges) search per cycle met.
    ``times`` is per instant (measured, or replayed); both the critical path's walk and the
    replay's walk use it."""
    at = times[v]
    walked = np.fromiter(seen, dtype=np.int64, count=len(seen))
    into = np.flatnonzero(np.isin(dst, walked[times[walked] == at]) & (times[src] < at))
    if into.size == 0:
        return -1
    return int(into[np.lexsort((kind[into], times[src[into]]))[-1]])


def edges(src: I64, dst: I64, kind: Edge, attr: I64) -> EdgeParts:
    """Edges of one kind (the kind a byte per edge: 17 M of them on a large export)."""
    return src, dst, np.full(src.size, int(kind), dtype=np.int8), attr


def stream_keys(chosen: pl.DataFrame, rows: I64) -> I64:
    """One integer per (pid, device, stream) of these GPU rows: the triple's rank among the
    distinct ones in sorted order. (Ranked by one sort of the three columns of these rows:
    ``np.unique(axis=0)`` over every row's triple took 1.1 of the 2.1 s the graph takes on the
    97 MB nsys export.)"""
    if rows.size == 0:
        return np.zeros(0, np.int64)
    keys = chosen.select(pl.col(Col.PID).fill_null(-1).cast(pl.Int64), pl.col(Col.DEVICE).fill_null(-1).cast(pl.Int64),
                         pl.col(Col.STREAM).fill_null(-1).cast(pl.Int64))[rows]
    pid, device, stream = (keys.get_column(c).to_numpy() for c in keys.columns)
    order = np.lexsort((stream, device, pid))
    pid, device, stream = pid[order], device[order], stream[order]
    new = np.r_[True, (pid[1:] != pid[:-1]) | (device[1:] != device[:-1]) | (stream[1:] != stream[:-1])]
    out = np.empty(rows.size, dtype=np.int64)
    out[order] = np.cumsum(new) - 1
    return out


#: gpu_sync record names (Kineto cuda_sync, nsys CUPTI_ACTIVITY_KIND_SYNCHRONIZATION alike).
STREAM_SYNC: Final = "Stream Sync"
CONTEXT_SYNC: Final = "Context Sync"
EVENT_SYNC: Final = "Event Sync"
STREAM_WAIT_EVENT: Final = "Stream Wait Event"
#: A launch call longer than this that returned right after some GPU activity of its process
#: ended waited for a free slot in the launch queue (it holds about a thousand launches): the
#: host was waiting on the GPU. HTA flags launches over 50 µs as outliers for the same reason;
#: a launch takes a few µs when the queue has room.
QUEUE_WAIT_MIN_NS: Final = 50_000

#: A stream idle longer than this before an activity that was already launched waited on a
#: dependency (the GPU's own gap between queued kernels is a few µs); HTA's
#: KERNEL_KERNEL_DELAY_THRESHOLD_US, for the same reason.
KERNEL_GAP_MAX_NS: Final = 1_500_000

class _Streams:
    """GPU activities per stream, for asking which one a wait drained: each stream's activities
    in order with the time each was ready to run (its launch; its own start without one),
    running maximum taken so that a search finds the last one launched before an instant."""

    def __init__(self, s: pl.DataFrame, chosen: pl.DataFrame, is_gpu: npt.NDArray[np.bool_]) -> None:
        rows = np.flatnonzero(is_gpu)
        picked = chosen.select(pl.col(Col.PID).fill_null(-1), pl.col(Col.DEVICE).fill_null(-1).cast(pl.Int64),
                               pl.col(Col.STREAM).fill_null(-1), pl.col(Col.TS), pl.col(Col.LAUNCH).fill_null(-1))
        # The GPU rows gathered before the frame becomes one array: every chosen row's five
        # columns were 0.3 GB on a large export, 8 M host slices and 1 M kernels.
        cols = (picked[rows] if rows.size else picked.clear()).to_numpy()
        del picked
        launch = cols[:, 4]
        has = launch >= 0
        all_ts = s.get_column(Col.TS).to_numpy()
        all_pid = s.get_column(Col.PID).fill_null(-1).to_numpy()
        # An activity without a launch record was launched at the earliest when the one before it
        # on its stream was (stream order is launch order): it must not hold back the running
        # maximum at its own start. A capture that begins while the CPU runs ahead (nsys-ai's H100
        # window: 1800 of 3442 kernels launched before it) has hundreds of them queued before a
        # cudaStreamSynchronize; at their own start they hid the work the sync drained behind them.
        ready = np.where(has, all_ts[np.maximum(launch, 0)], np.iinfo(np.int64).min)
        launcher = np.where(has, all_pid[np.maximum(launch, 0)], -1)
        self.rows: dict[tuple[int, int, int], I64] = {}
        self.ready: dict[tuple[int, int, int], I64] = {}
        self.launchers: dict[tuple[int, int, int], set[int]] = {}
        if rows.size == 0:
            return
        order = np.lexsort((cols[:, 3], cols[:, 2], cols[:, 1], cols[:, 0]))
        k = cols[order, :3]
        cut = np.flatnonzero(np.r_[True, (k[1:] != k[:-1]).any(axis=1), True])
        for lo, hi in itertools.pairwise(cut):
            key = (int(k[lo, 0]), int(k[lo, 1]), int(k[lo, 2]))
            sel = order[lo:hi]
            self.rows[key] = rows[sel]
            self.ready[key] = np.maximum.accumulate(ready[sel])
            self.launchers[key] = set(launcher[sel].tolist()) - {-1}

    def drained(self, key: tuple[int, int, int], before: int) -> int:
        """The chosen-row of the last activity on a stream launched before an instant (-1: none)."""
        ready = self.ready.get(key)
        if ready is None:
            return -1
        i = int(np.searchsorted(ready, before, side="left")) - 1
        return int(self.rows[key][i]) if i >= 0 else -1

    def next_after(self, key: tuple[int, int, int], at: int) -> int:
        """The chosen-row of the first activity on a stream launched at or after an instant (-1: none)."""
        ready = self.ready.get(key)
        if ready is None:
            return -1
        i = int(np.searchsorted(ready, at, side="left"))
        return int(self.rows[key][i]) if i < ready.size else -1

    def of_device(self, pid: int, device: int) -> list[tuple[int, int, int]]:
        return [k for k in self.rows if k[0] == pid and k[1] == device]

    def launched_by(self, pid: int) -> list[tuple[int, int, int]]:
        return [k for k, pids in self.launchers.items() if pid in pids]


def sync_edges(trace: Trace, chosen: pl.DataFrame, is_gpu: npt.NDArray[np.bool_], node_of: I64,
           node_ts: I64) -> EdgeParts:
    """Blocking calls waiting for the GPU work they drain (the last activity launched on each
    drained stream before the call, or before the awaited event was recorded), and streams
    waiting on another stream's event. What is drained comes from the sync records (Kineto's
    cuda_sync, nsys' synchronization records); a blocking call without one drains every stream
    its process launched work on."""
    s = trace.slices
    streams = _Streams(s, chosen, is_gpu)
    all_ts = s.get_column(Col.TS).to_numpy()
    all_pid = s.get_column(Col.PID).fill_null(-1).to_numpy()
    records = trace.sync_attrs.select(SyncCol.ID, SyncCol.WAIT_STREAM, SyncCol.WAIT_RECORD_CORRELATION)
    gs = s.filter(pl.col(Col.KIND) == Kind.GPU_SYNC.value).select(
        Col.ID, pl.col(Col.NAME).cast(pl.String), pl.col(Col.PID).fill_null(-1),
        pl.col(Col.DEVICE).fill_null(-1).cast(pl.Int64), pl.col(Col.STREAM).fill_null(-1),
        pl.col(Col.LAUNCH).fill_null(-1),
    ).join(records, on=Col.ID, how="left").filter(pl.col(Col.LAUNCH) >= 0)
    record_calls = s.filter(pl.col(Col.KIND).is_in([Kind.RUNTIME.value, Kind.DRIVER.value])
                            & pl.col(Col.CORRELATION).is_in(gs.get_column(SyncCol.WAIT_RECORD_CORRELATION).drop_nulls()
                                                            .to_list())).select(Col.PID, Col.CORRELATION, Col.TS)
    record_ts = {(p, c): t for p, c, t in record_calls.iter_rows()}
    src: list[int] = []
    dst: list[int] = []
    kind: list[int] = []
    attr: list[int] = []

    def wait(row: int, node: int, edge: Edge, call: int) -> None:
        if row >= 0 and node_ts[2 * row + 1] <= node_ts[node]:
            src.append(2 * row + 1)
            dst.append(node)
            kind.append(int(edge))
            attr.append(call)

    seen: set[int] = set()
    for name, pid, device, stream, call, wait_stream, record_corr in gs.select(
            Col.NAME, Col.PID, Col.DEVICE, Col.STREAM, Col.LAUNCH, SyncCol.WAIT_STREAM,
            SyncCol.WAIT_RECORD_CORRELATION).iter_rows():
        if node_of[call] < 0:
            continue
        seen.add(call)
        call_end, call_ts = int(node_of[call]) + 1, int(all_ts[call])
        if name in (STREAM_SYNC, CONTEXT_SYNC):
            keys = [(pid, device, stream)] if name == STREAM_SYNC else streams.of_device(pid, device)
            for key in keys:
                wait(streams.drained(key, call_ts), call_end, Edge.SYNC, call)
        elif name in (EVENT_SYNC, STREAM_WAIT_EVENT) and wait_stream is not None and record_corr is not None:
            recorded = record_ts.get((int(all_pid[call]), record_corr))
            if recorded is None:
                continue
            awaited = streams.drained((pid, device, wait_stream), recorded)
            if name == EVENT_SYNC:
                wait(awaited, call_end, Edge.SYNC, call)
            else:
                waiter = streams.next_after((pid, device, stream), call_ts)
                if waiter >= 0:
                    wait(awaited, 2 * waiter, Edge.EVENT_WAIT, call)
    # Blocking calls no sync record describes: every stream of the process.
    host_sync = trace.kind_columns((Kind.RUNTIME, Kind.DRIVER), Col.ID, Col.NAME, Col.PID, Col.TS)
    _, distinct = distinct_names(host_sync.get_column(Col.NAME))
    names = [n for n in distinct if n and api_names.is_sync_call(n)]
    for call, _, pid, call_ts in host_sync.filter(pl.col(Col.NAME).is_in(names)).iter_rows():
        if call in seen or node_of[call] < 0:
            continue
        for key in streams.launched_by(-1 if pid is None else pid):
            wait(streams.drained(key, call_ts), int(node_of[call]) + 1, Edge.SYNC, call)
    as_array = [np.asarray(v, dtype=np.int64) for v in (src, dst, kind, attr)]
    return as_array[0], as_array[1], as_array[2], as_array[3]


def handoff_edges(chosen: pl.DataFrame, host: npt.NDArray[np.bool_], node_ts: I64, chain: EdgeParts,
                  threads: frozenset[tuple[int, int]], kind: npt.NDArray[np.uint8]) -> EdgeParts:
    """Threads waiting on each other around backward(): the calling thread waits (inside an
    annotation, or with nothing open) while a backward thread of its process (``threads``:
    ``backward_threads``) runs the autograd graph, and goes on when that thread goes idle; the
    backward thread sits idle until the calling thread hands it work. Edges: into the end of a
    waiting stretch on one side, from the latest instant within it on the other side that can
    end the wait (the end of a top-level slice on a backward thread; any start on another
    thread). ``kind``: every slice's kind code."""
    if not threads:
        return no_edges()
    rows = np.flatnonzero(host)
    pid = chosen.get_column(Col.PID).fill_null(-1).to_numpy()
    tid = chosen.get_column(Col.TID).fill_null(-1).to_numpy()
    # A thread at a time (a few threads), not a tuple per host slice (1 M of them: 0.28 s).
    on_backward = np.zeros(pid.size, dtype=bool)
    row_pid, row_tid = pid[rows], tid[rows]
    for p, t in threads:
        on_backward[rows[(row_pid == p) & (row_tid == t)]] = True
    depth = chosen.get_column(Col.DEPTH).fill_null(0).to_numpy()
    src, dst, _, attr = chain
    idle = attr < 0
    waiting = idle | (kind[np.maximum(attr, 0)] == KIND_CODE[Kind.ANNOTATION.value])
    stretch_row = dst // 2
    # Into the caller's waiting stretches: top-level ends on backward threads.
    caller = np.flatnonzero(waiting & ~on_backward[stretch_row])
    top_ends = rows[on_backward[rows] & (depth[rows] == 0)]
    a = _latest_within(2 * top_ends + 1, pid[top_ends], node_ts, src[caller], dst[caller], pid[stretch_row[caller]])
    # Into a backward thread's idle stretches: starts on the other threads.
    worker = np.flatnonzero(idle & on_backward[stretch_row])
    others = rows[~on_backward[rows]]
    b = _latest_within(2 * others, pid[others], node_ts, src[worker], dst[worker], pid[stretch_row[worker]])
    c = _first_handoffs(rows[on_backward[rows]], others, pid, tid, node_ts, threads)
    out_src, out_dst = np.r_[a[0], b[0], c[0]], np.r_[a[1], b[1], c[1]]
    return edges(out_src, out_dst, Edge.HANDOFF, np.full(out_src.size, -1, dtype=np.int64))


def _first_handoffs(backward: I64, others: I64, pid: I64, tid: I64, node_ts: I64,
                    threads: frozenset[tuple[int, int]]) -> tuple[I64, I64]:
    """Each backward thread's first slice in the trace (it has no idle stretch before it): from
    the latest start on another thread of its process at or before it (``backward``: their slices)."""
    out_src: list[int] = []
    out_dst: list[int] = []
    for p, t in sorted(threads):
        mine = backward[(pid[backward] == p) & (tid[backward] == t)]
        if mine.size == 0:  # a backward thread with no graph slice
            continue
        first = int(mine[np.argmin(node_ts[2 * mine])])
        cand = others[(pid[others] == p) & (node_ts[2 * others] <= node_ts[2 * first])]
        if cand.size:
            out_src.append(2 * int(cand[np.argmax(node_ts[2 * cand])]))
            out_dst.append(2 * first)
    return np.asarray(out_src, dtype=np.int64), np.asarray(out_dst, dtype=np.int64)


def _latest_within(cand: I64, cand_pid: I64, node_ts: I64, lo: I64, hi: I64, pid: I64) -> tuple[I64, I64]:
    """For each stretch (node ``lo`` to node ``hi``, in process ``pid``): the latest candidate
    node of that process strictly after lo and at or before hi. Returns (candidates, his)."""
    out_src: list[I64] = [np.zeros(0, np.int64)]
    out_dst: list[I64] = [np.zeros(0, np.int64)]
    for p in np.unique(pid).tolist():
        mine = cand[cand_pid == p]
        if mine.size == 0:  # e.g. a process whose only thread is its backward thread
            continue
        times = node_ts[mine]
        order = np.argsort(times, kind="stable")
        mine, times = mine[order], times[order]
        these = np.flatnonzero(pid == p)
        i = np.searchsorted(times, node_ts[hi[these]], side="right") - 1
        ok = (i >= 0) & (times[np.maximum(i, 0)] > node_ts[lo[these]])
        out_src.append(mine[i[ok]])
        out_dst.append(hi[these[ok]])
    return np.concatenate(out_src), np.concatenate(out_dst)


def full_queue_edges(s: pl.DataFrame, chosen: pl.DataFrame, is_gpu: npt.NDArray[np.bool_], launcher_pid: I64,
                node_ts: I64) -> EdgeParts:
    """Long launch calls released by the GPU: the latest end of a GPU activity of the call's
    process (or of one launched before the capture) within the call, to the call's end."""
    rows = np.flatnonzero(~is_gpu)
    names = chosen.get_column(Col.NAME).gather(rows)
    texts = names.unique().drop_nulls().to_list()
    is_launch = decide(texts, api_names.is_launch_call, api_names.PRETESTS[api_names.is_launch_call], False)
    launches = [n for n, hit in zip(texts, is_launch, strict=True) if hit]
    dur = chosen.get_column(Col.DUR).to_numpy()
    calls = rows[names.is_in(launches).to_numpy() & (dur[rows] > QUEUE_WAIT_MIN_NS)]
    if calls.size == 0:
        return no_edges()
    pid = chosen.get_column(Col.PID).fill_null(-1).to_numpy()
    gpu = np.flatnonzero(is_gpu)
    has_launch = chosen.get_column(Col.LAUNCH).is_not_null().to_numpy()[gpu]
    out_src: list[I64] = []
    out_dst: list[I64] = []
    for p in np.unique(pid[calls]).tolist():
        mine = gpu[(launcher_pid[gpu] == p) | ~has_launch]
        these = calls[pid[calls] == p]
        a, b = _latest_within(2 * mine + 1, np.full(mine.size, p), node_ts, 2 * these, 2 * these + 1,
                              np.full(these.size, p))
        out_src.append(a)
        out_dst.append(b)
    src, dst = np.concatenate(out_src), np.concatenate(out_dst)
    ids = chosen.get_column(Col.ID).to_numpy()
    # A call's own activity frees no slot for it (a module load makes a first launch slow).
    other = chosen.get_column(Col.LAUNCH).fill_null(-1).to_numpy()[src // 2] != ids[dst // 2]
    return edges(src[other], dst[other], Edge.SYNC, ids[dst[other] // 2])


def unrecorded_wait_edges(s: pl.DataFrame, chosen: pl.DataFrame, is_gpu: npt.NDArray[np.bool_],
                          node_ts: I64) -> EdgeParts:
    """An activity that started more than KERNEL_GAP_MAX_NS after both its launch and the end of
    its stream's previous activity waited on another stream (a cudaStreamWaitEvent the trace did
    not record: traces without cuda_sync events): the latest end of an activity on another
    stream of its device within that wait, to its start."""
    rows = np.flatnonzero(is_gpu)
    if rows.size == 0:
        return no_edges()
    key = stream_keys(chosen, rows)
    dev = chosen.select(pl.col(Col.PID).fill_null(-1) * 65536 + pl.col(Col.DEVICE).fill_null(-1).cast(pl.Int64)
                        ).to_series().to_numpy()[rows]
    ts = node_ts[2 * rows]
    end = node_ts[2 * rows + 1]
    launch = chosen.get_column(Col.LAUNCH).fill_null(-1).to_numpy()[rows]
    ready = np.where(launch >= 0, s.get_column(Col.TS).to_numpy()[np.maximum(launch, 0)], np.iinfo(np.int64).max)
    order = np.lexsort((ts, key))
    same = key[order][1:] == key[order][:-1]
    prev_end = np.full(rows.size, np.iinfo(np.int64).min)  # a stream's first activity: none
    prev_end[order[1:][same]] = end[order[:-1][same]]
    could_start = np.maximum(prev_end, ready)  # an unknown launch: never
    waiting = np.flatnonzero((ready < np.iinfo(np.int64).max) & (ts - could_start > KERNEL_GAP_MAX_NS))
    out_src: list[I64] = [np.zeros(0, np.int64)]
    out_dst: list[I64] = [np.zeros(0, np.int64)]
    for d in np.unique(dev[waiting]).tolist():
        on_dev = np.flatnonzero(dev == d)
        by_end = on_dev[np.argsort(end[on_dev], kind="stable")]
        ends = end[by_end]
        for w in waiting[dev[waiting] == d].tolist():
            i = int(np.searchsorted(ends, ts[w], side="right")) - 1
            while i >= 0 and key[by_end[i]] == key[w]:
                i -= 1
            if i >= 0 and ends[i] > could_start[w]:
                out_src.append(np.array([2 * rows[by_end[i]] + 1]))
                out_dst.append(np.array([2 * rows[w]]))
    src, dst = np.concatenate(out_src), np.concatenate(out_dst)
    return edges(src, dst, Edge.EVENT_WAIT, np.full(src.size, -1, dtype=np.int64))
