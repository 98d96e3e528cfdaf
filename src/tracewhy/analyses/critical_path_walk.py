"""Walking the critical path back through the dependency graph, and what each edge's time is
spent on: its category, kernel family and attributed slice. The critical path's composition and
the step account both walk with these; the graph itself is ``critical_path_graph``'s.
"""

from __future__ import annotations

import itertools
from typing import Final

import numpy as np
import numpy.typing as npt

from tracewhy.analyses import api_names
from tracewhy.analyses.critical_path_edges import KERNEL_GAP_MAX_NS, Edge, way_out_of_cycle
from tracewhy.analyses.critical_path_graph import Graph
from tracewhy.analyses.families import Family, classify_kernels
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
    order = np.lexsort((np.arange(graph.node_ts.size), graph.node_ts, graph.node_pid))
    pids = graph.node_pid[order]
    cut = np.flatnonzero(np.r_[True, pids[1:] != pids[:-1], True])
    return {int(pids[lo]): (order[lo:hi], graph.node_ts[order[lo:hi]]) for lo, hi in itertools.pairwise(cut)}


def walk(graph: Graph, nodes: tuple[I64, I64] | None, ws: int, we: int) -> tuple[list[int], int, int]:
    """The path's edges (last first), the time it starts, and its last node (-1: no node in the
    window): from the process's last instant at or before the window's end, back along each
    instant's releasing edge until the window's start or an instant nothing released."""
    if nodes is None:
        return [], we, -1
    order, times = nodes
    i = int(np.searchsorted(times, we, side="right")) - 1
    if i < 0 or times[i] <= ws:
        return [], we, -1
    sink = int(order[i])
    bind, src, ts = graph.bind_edge, graph.src, graph.node_ts
    path: list[int] = []
    seen: set[int] = set()
    v = sink
    while ts[v] > ws:
        e = int(bind[v])
        if v in seen:  # a cycle of equal-time edges: leave it by its latest earlier in-edge
            e = way_out_of_cycle(ts, src, graph.dst, graph.kind, v, seen)
        if e < 0:
            break
        seen.add(v)
        path.append(e)
        v = int(src[e])
    return path, int(ts[v]), sink


#: Each Edge value's name, lower-cased (the segments' ``edge`` column).
EDGE_NAMES: Final = np.array([e.name.lower() for e in sorted(Edge)], dtype=object)


class EdgeLabels:
    """Category, kernel family and attributed slice of every edge, computed once per trace."""

    def __init__(self, trace: Trace, graph: Graph) -> None:
        self.graph = graph
        s = trace.slices
        attr = graph.attr
        kind = s.get_column(Col.KIND).to_physical().to_numpy()
        code = KIND_CODE
        a_kind = np.where(attr >= 0, kind[np.maximum(attr, 0)], -1)
        names = s.get_column(Col.NAME)
        is_runtime = np.isin(a_kind, [code[Kind.RUNTIME.value], code[Kind.DRIVER.value]])
        unique = [n for n in names.gather(attr[is_runtime]).unique().to_list() if n is not None]
        sync_names = [n for n in unique if api_names.is_sync_call(n)]
        launch_names = [n for n in unique if api_names.is_launch_call(n)]
        a_names = names.gather(np.maximum(attr, 0))
        is_sync = is_runtime & a_names.is_in(sync_names).to_numpy()
        is_launch = is_runtime & a_names.is_in(launch_names).to_numpy()
        family = np.full(attr.size, None, dtype=object)
        classes = classify_kernels(trace)
        fam_of = dict(zip(classes.get_column(Col.ID).to_list(), classes.get_column("family").to_list(), strict=True))
        k = graph.kind
        gpu = k == Edge.GPU
        is_kernel = gpu & (a_kind == code[Kind.KERNEL.value])
        family[is_kernel] = [fam_of.get(int(a), Family.OTHER.value) for a in attr[is_kernel]]
        cat = np.full(attr.size, Category.HOST_OPS, dtype=object)
        cat[(k == Edge.HOST) & (attr < 0)] = Category.IDLE
        cat[(k == Edge.HOST) & is_launch] = Category.LAUNCH
        cat[(k == Edge.HOST) & is_sync] = Category.SYNC
        cat[k == Edge.LAUNCH] = Category.LAUNCH
        cat[gpu] = Category.COPIES
        cat[is_kernel] = Category.KERNELS
        cat[is_kernel & (family == Family.COMMUNICATION.value)] = Category.COMMUNICATION
        cat[is_kernel & (family == Family.COPY.value)] = Category.COPIES
        family[is_kernel & np.isin(cat, [Category.COMMUNICATION, Category.COPIES])] = None
        cat[k == Edge.GAP] = Category.KERNEL_GAP
        cat[(k == Edge.GAP) & (graph.elapsed > KERNEL_GAP_MAX_NS)] = Category.IDLE
        cat[(k == Edge.SYNC) | (k == Edge.EVENT_WAIT) | (k == Edge.HANDOFF)] = Category.SYNC
        self.category = cat
        self.family = family
