"""Walking the critical path back through the dependency graph, and what each edge's time is
spent on: its category, kernel family and attributed slice. The critical path's composition and
the step account both walk with these; the graph itself is ``critical_path_graph``'s.
"""

from __future__ import annotations

import itertools
from array import array
from types import ModuleType
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.critical_path_edges import KERNEL_GAP_MAX_NS, Edge, way_out_of_cycle
from tracewhy.analyses.critical_path_graph import Graph
from tracewhy.analyses.families import Family, classify_kernels
from tracewhy.model import compiled
from tracewhy.model.schema import KIND_CODE, Col, Kind
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]


class Category:
    """What a stretch of the path was spent on; the composition's keys."""

    HOST_OPS: Final = "host_ops"  # CPU ops and annotated host code
    LAUNCH: Final = "launch_overhead"  # launch calls and launch-to-start latency
    KERNELS: Final = "kernels"  # compute kernels (by family in ``families``)
    COMMUNICATION: Final = "communication"
    COPIES: Final = "copies"  # memcpy, memset and copy kernels
    #: Blocking calls and cross-stream waits returning after their GPU work, and a thread going
    #: on after the backward thread it waited on went idle.
    SYNC: Final = "sync"
    KERNEL_GAP: Final = "kernel_gap"  # the GPU between two queued activities on a stream
    #: Nothing recorded going on: a host thread with nothing open (Python, input, waits), or a
    #: stream idle longer than KERNEL_GAP_MAX_NS before its next activity (a wait not recorded).
    IDLE: Final = "idle"


CATEGORIES: Final = (Category.HOST_OPS, Category.LAUNCH, Category.KERNELS, Category.COMMUNICATION,
                     Category.COPIES, Category.SYNC, Category.KERNEL_GAP, Category.IDLE)
#: Categories whose items can be shortened (a wait or a gap is shortened by shortening its cause).
WORK_CATEGORIES: Final = (Category.HOST_OPS, Category.LAUNCH, Category.KERNELS, Category.COMMUNICATION,
                          Category.COPIES)


def nodes_by_pid(graph: Graph) -> dict[int, tuple[I64, I64]]:
    """Per owning process: its nodes sorted by time, and their times."""
    if graph.node_ts.size == 0:
        return {}
    # (np.lexsort is stable: nodes of one time stay in node order without a third key, one pass
    # fewer over 16 M nodes on a large export.)
    order = np.lexsort((graph.node_ts, graph.node_pid))
    pids = graph.node_pid[order]
    cut = np.flatnonzero(np.r_[True, pids[1:] != pids[:-1], True])
    return {int(pids[lo]): (order[lo:hi], graph.node_ts[order[lo:hi]]) for lo, hi in itertools.pairwise(cut)}


def walk(graph: Graph, nodes: tuple[I64, I64] | None, ws: int, we: int) -> tuple[array[int], int, int]:
    """The path's edges (last first), the time it starts, and its last node (-1: no node in the
    window): from the process's last instant at or before the window's end, back along each
    instant's releasing edge until the window's start or an instant nothing released.

    The edges are kept as machine integers and only the instants of the time being walked are
    remembered: a whole-trace window of a large export walks millions of edges, and a list of
    them with a set of every instant passed held 0.5 GB. Times never increase along the walk
    (edges run forward in time), so an instant met twice was met at the same time: that set
    holds all the walk needs to see a cycle."""
    path: array[int] = array("q")
    if nodes is None:
        return path, we, -1
    order, times = nodes
    i = int(np.searchsorted(times, we, side="right")) - 1
    if i < 0 or times[i] <= ws:
        return path, we, -1
    sink = int(order[i])
    fast = compiled.loops(order.size)
    if fast is not None:
        path, start = _compiled_walk(fast, graph, sink, ws)
        return path, start, sink
    # Read through memoryviews (.data), which give Python ints without a numpy scalar between: half
    # the walk's time (a whole-trace window of a large export walks millions of instants).
    bind, src, ts = graph.bind_edge.data, graph.src.data, graph.node_ts.data
    seen: set[int] = set()
    v = sink
    now: int = ts[v]
    while now > ws:
        e: int = bind[v]
        if seen and v in seen:  # a cycle of equal-time edges: leave it by its latest earlier in-edge
            e = way_out_of_cycle(graph.node_ts, graph.src, graph.dst, graph.kind, v, seen)
        if e < 0:
            break
        path.append(e)
        u: int = src[e]
        at: int = ts[u]
        if at != now:  # (``v`` is remembered only when the next instant is at its time)
            if seen:  # (most steps go back in time with nothing remembered: no call to clear)
                seen.clear()
            now = at
        else:
            seen.add(v)
        v = u
    return path, now, sink


def _compiled_walk(fast: ModuleType, graph: Graph, v: int, ws: int) -> tuple[array[int], int]:
    """``walk``'s steps from ``v`` by the compiled loop, which stops at each cycle it meets (rare) for
    this one to leave it as ``walk`` does; the path and the time it starts."""
    path: array[int] = array("q")
    ts, src = graph.node_ts, graph.src
    out = np.empty(min(ts.size, _WALK_BUFFER), dtype=np.int64)
    walked = np.zeros(0, dtype=np.int64)  # the instants walked at v's time
    while True:
        n, v, status, walked = fast.walk(graph.bind_edge, src, ts, v, ws, walked, out)
        path.frombytes(out[:n].tobytes())
        if status == fast.WALK_FULL:
            continue
        if status == fast.WALK_DONE:
            return path, int(ts[v])
        e = way_out_of_cycle(ts, src, graph.dst, graph.kind, v, set(walked.tolist()))
        if e < 0:
            return path, int(ts[v])
        path.append(e)
        u = int(src[e])
        walked = np.r_[walked, v] if ts[u] == ts[v] else walked[:0]
        v = u


#: Edges the compiled walk writes before handing them over (8 MB).
_WALK_BUFFER: Final = 1 << 20


#: Each Edge value's name, lower-cased (the segments' ``edge`` column).
EDGE_NAMES: Final = np.array([e.name.lower() for e in sorted(Edge)], dtype=object)


class EdgeLabels:
    """Category, kernel family and attributed slice of every edge, computed once per trace.

    Categories are held as codes (positions in CATEGORIES, one byte an edge) and named only for
    the edges asked about: a large export's graph has 17 M edges, and a name per edge held as an
    object array, then as fixed-width strings to encode it, took 1.6 GB at the account's peak."""

    def __init__(self, trace: Trace, graph: Graph) -> None:
        self.graph = graph
        s = trace.slices
        attr = graph.attr
        kind = s.get_column(Col.KIND).to_physical().to_numpy()
        code = KIND_CODE
        a_kind = np.where(attr >= 0, kind[np.maximum(attr, 0)], -1)
        names = s.get_column(Col.NAME)
        is_runtime = np.isin(a_kind, [code[Kind.RUNTIME.value], code[Kind.DRIVER.value]])
        runtime_edges = np.flatnonzero(is_runtime)
        del is_runtime
        # (The runtime edges' names alone, tested once per distinct name: a name gathered for each
        # of a large export's 17 M edges, then tested twice, took 0.5 s.)
        r_names = names.gather(attr[runtime_edges])
        unique = [n for n in r_names.unique().to_list() if n is not None]
        is_sync = np.zeros(attr.size, dtype=bool)
        is_sync[runtime_edges] = r_names.is_in([n for n in unique if api_names.is_sync_call(n)]).to_numpy()
        is_launch = np.zeros(attr.size, dtype=bool)
        is_launch[runtime_edges] = r_names.is_in([n for n in unique if api_names.is_launch_call(n)]).to_numpy()
        del r_names, runtime_edges
        classes = classify_kernels(trace)
        #: Each kernel's family (ID, family): ``family`` names the edges asked about from it.
        self._classes = classes.select(Col.ID, "family")
        k = graph.kind
        gpu = k == Edge.GPU
        is_kernel = gpu & (a_kind == code[Kind.KERNEL.value])
        del a_kind
        kernel_edges = np.flatnonzero(is_kernel)
        kernel_family = _family_column(classes, attr[kernel_edges])
        at = {c: np.int8(i) for i, c in enumerate(CATEGORIES)}
        cat = np.full(attr.size, at[Category.HOST_OPS], dtype=np.int8)
        cat[(k == Edge.HOST) & (attr < 0)] = at[Category.IDLE]
        cat[(k == Edge.HOST) & is_launch] = at[Category.LAUNCH]
        cat[(k == Edge.HOST) & is_sync] = at[Category.SYNC]
        cat[k == Edge.LAUNCH] = at[Category.LAUNCH]
        cat[gpu] = at[Category.COPIES]
        cat[is_kernel] = at[Category.KERNELS]
        cat[kernel_edges[(kernel_family == Family.COMMUNICATION.value).to_numpy()]] = at[Category.COMMUNICATION]
        cat[kernel_edges[(kernel_family == Family.COPY.value).to_numpy()]] = at[Category.COPIES]
        del kernel_family
        # (A stream gap's length read for the gaps alone: every edge's is a 136 MB column on a
        # large export.)
        gaps = np.flatnonzero(k == Edge.GAP)
        ts = graph.node_ts
        cat[gaps] = np.where(ts[graph.dst[gaps]] - ts[graph.src[gaps]] > KERNEL_GAP_MAX_NS, at[Category.IDLE],
                             at[Category.KERNEL_GAP])
        cat[(k == Edge.SYNC) | (k == Edge.EVENT_WAIT) | (k == Edge.HANDOFF)] = at[Category.SYNC]
        #: Each edge's category, as its position in CATEGORIES.
        self.category_code = cat

    def category(self, edges: I64) -> npt.NDArray[np.object_]:
        """The category names of these edges."""
        return _CATEGORY_NAMES[self.category_code[edges]]

    def family(self, edges: I64) -> npt.NDArray[np.object_]:
        """The kernel family of these edges: None but for compute kernels (communication and
        copy kernels are their categories)."""
        out = np.full(edges.size, None, dtype=object)
        compute = self.category_code[edges] == CATEGORIES.index(Category.KERNELS)
        out[compute] = _families_of(self._classes, self.graph.attr[edges[compute]])
        return out


_CATEGORY_NAMES: Final = np.array(CATEGORIES, dtype=object)


def _families_of(classes: pl.DataFrame, kernel_ids: I64) -> list[str]:
    """The family of each of these kernel slices (OTHER for one the classes do not hold)."""
    out: list[str] = _family_column(classes, kernel_ids).to_list()
    return out


def _family_column(classes: pl.DataFrame, kernel_ids: I64) -> pl.Series:
    """``_families_of`` as a column: the classes joined on the ids, in their order (a dict lookup per
    kernel was 0.6 s for a large export's 1 M kernels)."""
    ids = pl.DataFrame({Col.ID: kernel_ids}).cast({Col.ID: classes.schema[Col.ID]})
    return (ids.join(classes.select(Col.ID, "family"), on=Col.ID, how="left", maintain_order="left")
            .get_column("family").fill_null(Family.OTHER.value))
