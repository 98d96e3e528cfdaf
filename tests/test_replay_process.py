"""An edited replay reads only the edges into its sink's process where no edge joins two
processes (``replay_edges.process_edges``): on a real two-process export the path, its lengths
and the step's end are those of the replay over every edge of the window, under edits that drop,
scale and add edges (some of them in the other process, or between the two: that replay reads
every edge)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import shared_trace
from tracewhy.analyses import critical_path_replay
from tracewhy.analyses.account import StepModel, step_model
from tracewhy.analyses.critical_path_replay import EditedPath, GraphEdit
from tracewhy.readers import read_trace


@pytest.fixture(scope="module")
def model() -> StepModel:
    return step_model(read_trace(shared_trace("nsys/nsysai_mfu_2gpu_before.sqlite.gz")))


def _same(a: EditedPath, b: EditedPath) -> bool:
    return ((a.end_ns, a.start_ns) == (b.end_ns, b.start_ns) and np.array_equal(a.edges, b.edges)
            and np.array_equal(a.dur_ns, b.dur_ns))


def test_a_replay_of_the_sinks_process_is_the_replay_of_every_edge(model: StepModel,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    g = model.graph
    assert np.unique(g.node_pid).size == 2 and not (g.node_pid[g.src] != g.node_pid[g.dst]).any()
    path = model.paths[0]
    rng = np.random.default_rng(5)
    mine = np.flatnonzero(g.node_pid == path.pid)
    other = np.flatnonzero(g.node_pid != path.pid)
    edges = model.replay.window(path.window_start, path.window_end).edges
    src = np.r_[rng.choice(mine, 200), rng.choice(other, 200)]
    dst = np.r_[rng.choice(mine, 200), rng.choice(other, 200)]
    forward = g.node_ts[dst] >= g.node_ts[src]
    src, dst = src[forward], dst[forward]
    n = src.size
    added = dict(add_src=src, add_dst=dst, add_weight=rng.integers(0, 1000, n), add_kind=np.full(n, 2, np.int64),
                 add_attr=np.full(n, -1, np.int64))
    # The other process's work taking no time, and an edge of a second from its last instant
    # before the sink into the sink: the sink then ends a second after that instant's replayed
    # time, not its measured one (a replay of the sink's process alone would read that).
    theirs = edges[g.node_pid[g.dst[edges]] != path.pid]
    u = int(other[np.flatnonzero(g.node_ts[other] < g.node_ts[path.sink])[-1]])
    across = dict(scaled=theirs, factor=np.zeros(theirs.size), add_src=np.array([u]), add_dst=np.array([path.sink]),
                  add_weight=np.array([10**9]), add_kind=np.array([2]), add_attr=np.array([-1]))
    edits = [GraphEdit(), GraphEdit(drop=np.unique(rng.choice(edges, 300))),
             GraphEdit(scaled=path.edges[::7], factor=np.zeros(path.edges[::7].size)),
             GraphEdit(scaled=rng.choice(edges, 500), factor=rng.uniform(0, 1, 500), **added), GraphEdit(**across)]
    one = model.replay.window(path.window_start, path.window_end)
    got = [one.edited(path.sink, e) for e in edits]
    assert one._of_process[path.pid] is not None  # the replays above read one process's edges
    monkeypatch.setattr(critical_path_replay, "process_edges", lambda *a: None)
    every = model.replay.window(path.window_start, path.window_end)
    want = [every.edited(path.sink, e) for e in edits]
    assert all(_same(a, b) for a, b in zip(got, want, strict=True))
    assert got[2].end_ns < got[0].end_ns  # the path's every seventh edge taking no time shortens the step
    assert got[4].end_ns < int(g.node_ts[u]) + 10**9  # the other process's replayed time, not its measured one
