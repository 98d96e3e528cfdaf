"""A replay window that holds every instant of the graph (a trace without step markers is
accounted as one window) takes the graph's columns as they are instead of selecting its nodes and
edges; it must be the window the selection gives. Checked against that selection, written out
here as the window computed it before, on real traces' graphs: whole windows and parts of them."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from conftest import shared_trace
from tracewhy.analyses.critical_path_graph import build_graph
from tracewhy.analyses.critical_path_replay import Replay, ReplayWindow
from tracewhy.analyses.replay_edges import window_order
from tracewhy.readers import read_trace

I64 = npt.NDArray[np.int64]


def _selected(replay: Replay, ws: int, we: int) -> tuple[I64, I64, npt.NDArray[np.bool_]]:
    """The window's edges, its instants in replay order and which of them are fixed, by selection."""
    g = replay.graph
    ts = g.node_ts
    nodes = np.flatnonzero((ts >= ws) & (ts <= we))
    inside = np.zeros(ts.size, dtype=bool)
    inside[nodes] = True
    edges = np.flatnonzero(inside[g.src] & inside[g.dst])
    bind = g.bind_edge[nodes]
    fixed_nodes = nodes[(bind < 0) | ~inside[g.src[np.maximum(bind, 0)]]]
    order = window_order(nodes, g.src[edges], g.dst[edges], ts)
    pos = np.full(ts.size, -1, dtype=np.int64)
    pos[order] = np.arange(order.size)
    fixed = np.zeros(order.size, dtype=bool)
    fixed[pos[fixed_nodes]] = True
    return edges, order, fixed


@pytest.mark.parametrize("name", ["nsys/nsysai_mfu_2gpu_before.sqlite.gz", "nsys/nvfuser_xent_h200_2025.1.sqlite.gz",
                                  "hta/a100_ddp2_rank0_nccl2.17.json.gz"])
def test_a_whole_window_is_the_window_its_selection_gives(name: str) -> None:
    replay = Replay(build_graph(read_trace(shared_trace(name))))
    ts = replay.graph.node_ts
    lo, hi = int(ts.min()), int(ts.max())
    # The whole graph (exactly, and with room either side), then a middle part (selected).
    for ws, we in ((lo, hi), (lo - 1000, hi + 1000), (lo + (hi - lo) // 4, hi - (hi - lo) // 4)):
        w = ReplayWindow(replay, ws, we)
        edges, order, fixed = _selected(replay, ws, we)
        assert np.array_equal(w.edges, edges)
        assert np.array_equal(w.order, order) and np.array_equal(w.fixed, fixed)
        assert np.array_equal(np.frombuffer(w.measured_times(), dtype=np.int64), ts[order])
        pos = np.full(ts.size, -1, dtype=np.int64)
        pos[order] = np.arange(order.size)
        src, dst = replay.graph.src[edges], replay.graph.dst[edges]
        assert np.array_equal(w.src_pos, pos[src]) and np.array_equal(w.dst_pos, pos[dst])
        assert np.array_equal(w.by_dst, np.argsort(pos[dst], kind="stable"))
        assert edges.size > 0 and fixed.any()
