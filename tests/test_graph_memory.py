"""What the step account's graph holds while it is built (``critical_path_graph.build_graph``),
measured with tracemalloc (numpy reports its buffers to it) on real traces.

The graph ends with about 32 bytes per edge (ids as int32, kinds as bytes). Its build once held,
at its end, the parts of every kind of edge, their columns joined and the joined columns' copies
less the edges that run backward, all at once: 120 bytes per edge at the peak on every trace
measured (the 606 MB export of ``bench/bench_nsys_scale.py``, 17 M edges: 1.4 GB of it at once,
the diagnosis's first peak). Joined a column at a time, each column's parts let go as it is
joined and its backward edges dropped before the next, and the kinds made as bytes, the peak is
84 bytes per edge on the same traces. The bound sits between the two: a build that holds every
column's parts and copies at once again fails it."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from tests.conftest import shared_trace

from tracewhy.analyses.critical_path_edges import Edge, edges
from tracewhy.analyses.critical_path_graph import build_graph
from tracewhy.readers import read_trace

#: Bytes per edge at the build's peak (measured: 84 now, 120 before).
PEAK_BYTES_PER_EDGE = 100

# An nsys export (NVTX ranges, two GPUs) and a Kineto trace of one rank of eight.
TRACES = ("nsys/nsysai_h100_2gpu_1s.sqlite.gz", "hta/tracediff_control_a100_rank3of8.json.gz")


@pytest.mark.parametrize("relative", TRACES)
def test_the_graph_build_does_not_hold_every_column_twice(relative: str) -> None:
    trace = read_trace(shared_trace(relative))
    build_graph(trace)  # (anything made once per trace, cached on it, is made before measuring)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        graph = build_graph(trace)
        kept, peak = (m - base for m in tracemalloc.get_traced_memory())
    finally:
        tracemalloc.stop()
    edges = graph.src.size
    assert edges > 50_000  # (enough edges that the per-edge columns are most of the peak)
    assert kept / edges < 40  # the graph itself: ~32 bytes per edge
    assert peak / edges < PEAK_BYTES_PER_EDGE, f"{peak / edges:.0f} bytes per edge at the peak"


def test_edge_kinds_are_bytes_from_the_parts_on() -> None:
    """Every kind of edge is made with its kinds as int8 (``critical_path_edges.edges``): as int64
    they were 8 bytes per edge of the parts, 136 MB on the large export; the graph keeps them so."""
    ids = np.arange(4, dtype=np.int64)
    assert edges(ids, ids + 1, Edge.SYNC, ids)[2].dtype == np.int8
    graph = build_graph(read_trace(shared_trace(TRACES[0])))
    assert graph.kind.dtype == np.int8
    assert graph.src.dtype == graph.dst.dtype == np.int32
