"""The replay's pass over a window's edges, the walk back along the critical path, the nesting
of host slices, the host tree's nearest and outermost marked slices, the graph's binding edges
and the replay window's order of edges, compiled by numba (imported only through
``compiled.loops``, which falls back to the Python and numpy loops without it)."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import numpy.typing as npt


# cache: compiled once per machine and numba version, then loaded from numba's cache. nogil:
# nothing in it touches Python objects.
@numba.njit(cache=True, nogil=True)
def replay_times(times: npt.NDArray[np.int64], ps: npt.NDArray[np.int32], pd: npt.NDArray[np.int32],
                 w: npt.NDArray[np.int64], fixed: npt.NDArray[np.bool_], lo: int) -> Any:
    """``critical_path_replay._replay_times``, on numpy views of the same arrays (``times`` is
    changed in place): each instant at the latest of its in-edges, edges sorted by their end's
    position; fixed instants and those without an in-edge keep their times."""
    cur = -1
    best = 0
    for i in range(pd.shape[0]):
        v = pd[i]
        if v != cur and cur >= 0 and not fixed[cur]:
            times[cur] = best  # (before the arrival is read: its source may be that instant)
        arrival = times[ps[lo + i]] + w[lo + i]
        if v != cur:
            cur = v
            best = arrival
        elif arrival > best:
            best = arrival
    if cur >= 0 and not fixed[cur]:
        times[cur] = best
    return times


@numba.njit(cache=True, nogil=True)
def _push(stack: npt.NDArray[np.int64], k: int, value: int) -> Any:
    """``stack`` with ``value`` at ``k``: itself, or a copy twice as long when it is full."""
    if k == stack.shape[0]:
        grown = np.empty(2 * k, dtype=np.int64)
        grown[:k] = stack
        stack = grown
    stack[k] = value
    return stack


#: How a compiled walk stopped: at the window's start or an instant nothing released; at an instant
#: already walked at its time (a cycle, which the caller leaves); with its buffer full.
WALK_DONE, WALK_CYCLE, WALK_FULL = 0, 1, 2


@numba.njit(cache=True, nogil=True)
def walk(bind: npt.NDArray[np.signedinteger[Any]], src: npt.NDArray[np.signedinteger[Any]], ts: npt.NDArray[np.int64],
         v: int, ws: int, walked: npt.NDArray[np.int64], out: npt.NDArray[np.int64]) -> Any:
    """``critical_path_walk.walk``'s steps from instant ``v``: back along each instant's releasing
    edge (``bind``) while its time is after ``ws``, the edges taken written to ``out``. ``walked``:
    the instants already walked at ``v``'s time. Returns (edges written, the instant reached, how it
    stopped, the instants walked at that instant's time)."""
    marks = np.zeros(ts.shape[0], dtype=np.bool_)
    run = np.empty(max(16, 2 * walked.shape[0]), dtype=np.int64)
    k = 0
    for x in walked:
        marks[x] = True
        run[k] = x
        k += 1
    n = 0
    status = WALK_DONE
    now = ts[v]
    while now > ws:
        if k > 0 and marks[v]:
            status = WALK_CYCLE
            break
        e = bind[v]
        if e < 0:
            break
        if n == out.shape[0]:
            status = WALK_FULL
            break
        out[n] = e
        n += 1
        u = src[e]
        at = ts[u]
        if at != now:
            for j in range(k):
                marks[run[j]] = False
            k = 0
            now = at
        else:
            marks[v] = True
            run = _push(run, k, v)
            k += 1
        v = u
    return n, v, status, run[:k].copy()


@numba.njit(cache=True, nogil=True)
def nest(end: npt.NDArray[np.int64], reach: npt.NDArray[np.int64], flag: npt.NDArray[np.bool_],
         parent: npt.NDArray[np.signedinteger[Any]], depth: npt.NDArray[np.signedinteger[Any]],
         op: npt.NDArray[np.signedinteger[Any]]) -> None:
    """``linking.nest_host_slices``' parent, depth and innermost flagged proper ancestor of each row
    (-1: none), written into ``parent``, ``depth`` and ``op``, in one pass over rows sorted as it
    sorts them. A row's parent is the nearest earlier row whose ``end`` reaches its ``reach``: a
    stack of the rows that may still be someone's parent, from which a row first drops those that
    fall short of it (a row that falls short of row i falls short of every later row that i itself
    does not reach, ``_previous_reaching``'s invariant), so each row is pushed and dropped once."""
    stack = np.empty(64, dtype=np.int64)
    k = 0
    for i in range(end.shape[0]):
        r = reach[i]
        while k > 0 and end[stack[k - 1]] < r:
            k -= 1
        if k == 0:
            parent[i] = -1
            depth[i] = 0
            op[i] = -1
        else:
            p = stack[k - 1]
            parent[i] = p
            depth[i] = depth[p] + 1
            op[i] = p if flag[p] else op[p]
        stack = _push(stack, k, i)
        k += 1


@numba.njit(cache=True, nogil=True)
def nearest_by_level(mark: npt.NDArray[np.bool_], rows: npt.NDArray[np.int32], parents: npt.NDArray[np.int32],
                     out: npt.NDArray[np.int64]) -> Any:
    """``host_tree._nearest_by_level`` in one pass, written into ``out``: each slice itself when
    marked (else -1), then, over ``rows`` in level order (a parent's level before its children's),
    an unmarked one takes its parent's answer, settled before it."""
    for i in range(mark.shape[0]):
        out[i] = i if mark[i] else -1
    for j in range(rows.shape[0]):
        r = rows[j]
        if not mark[r]:
            out[r] = out[parents[j]]
    return out


@numba.njit(cache=True, nogil=True)
def outermost_by_level(mark: npt.NDArray[np.bool_], rows: npt.NDArray[np.int32], parents: npt.NDArray[np.int32],
                       out: npt.NDArray[np.int64]) -> Any:
    """``HostTree.outermost`` in one pass, written into ``out``: each slice itself when marked
    (else -1), then, over ``rows`` in level order, a slice takes its parent's answer where the
    parent has one."""
    for i in range(mark.shape[0]):
        out[i] = i if mark[i] else -1
    for j in range(rows.shape[0]):
        above = out[parents[j]]
        if above >= 0:
            out[rows[j]] = above
    return out


@numba.njit(cache=True, nogil=True)
def stable_by_key(keys: npt.NDArray[np.int32], size: int) -> Any:
    """``np.argsort(keys, kind="stable")`` as int32 for keys in [0, size): a counting sort, two
    passes over the keys where a comparison sort takes log n."""
    first = np.zeros(size + 1, dtype=np.int64)
    for i in range(keys.shape[0]):
        first[keys[i] + 1] += 1
    for k in range(size):
        first[k + 1] += first[k]
    out = np.empty(keys.shape[0], dtype=np.int32)
    for i in range(keys.shape[0]):
        k = keys[i]
        out[first[k]] = i
        first[k] += 1
    return out


@numba.njit(cache=True, nogil=True)
def binding(node_ts: npt.NDArray[np.int64], src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64],
            kind: npt.NDArray[np.int8], bind: npt.NDArray[np.int64]) -> Any:
    """``critical_path_graph._binding`` in one pass over the edges, written into ``bind`` (-1 where
    no edge ends): per node, the in-edge whose source happened last, on a tie the higher kind,
    then the later edge."""
    best_at = np.empty(bind.shape[0], dtype=np.int64)
    best_kind = np.empty(bind.shape[0], dtype=np.int8)
    for e in range(dst.shape[0]):
        v = dst[e]
        at = node_ts[src[e]]
        k = kind[e]
        b = bind[v]
        if b < 0 or at > best_at[v] or (at == best_at[v] and k >= best_kind[v]):
            bind[v] = e
            best_at[v] = at
            best_kind[v] = k
    return bind


def warm() -> None:
    """Compile (or load from numba's cache) the loops for the array types the callers pass, so
    that whatever numba has to say or raise doing it happens where ``compiled`` can catch it."""
    one = np.zeros(1, dtype=np.int64)
    positions = np.zeros(1, dtype=np.int32)
    replay_times(one.copy(), positions, positions.copy(), one.copy(), np.frombuffer(b"\x00", dtype=np.bool_), 0)
    walk(np.full(1, -1, dtype=np.int32), positions.copy(), one.copy(), 0, 0, one[:0], one.copy())  # (graph ids: int32)
    # (row numbers: int32 below 2**31 rows, linking._index_dtype)
    nest(one, one.copy(), np.zeros(1, dtype=np.bool_), positions.copy(), positions.copy(), positions.copy())
    # (the host tree's levels: int32 slice ids, HostTree._by_level)
    nearest_by_level(np.zeros(1, dtype=np.bool_), positions[:0], positions[:0], one.copy())
    outermost_by_level(np.zeros(1, dtype=np.bool_), positions[:0], positions[:0], one.copy())
    stable_by_key(positions.copy(), 1)  # (a replay window's positions: int32)
    binding(one.copy(), one.copy(), one.copy(), np.zeros(1, dtype=np.int8), np.full(1, -1, dtype=np.int64))
