"""A window replayed with an edit keeps its edges in the order of their ends' positions and
inserts the edges an edit adds among them, instead of sorting every edge of the window again
per edit. The replay is the same as that of the window's edges sorted anew: checked on a real
export's window with edits that drop, scale and add edges (several added ones ending at one
instant, as the drain edit's do)."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from conftest import shared_trace
from tracewhy.analyses.account import StepModel, step_model
from tracewhy.analyses.critical_path_edges import way_out_of_cycle
from tracewhy.analyses.critical_path_replay import EditedPath, GraphEdit, ReplayWindow, _ints, _replay_times
from tracewhy.readers import read_trace

#: A walk back from an instant of a replayed window: (at, times, src, dst, weight, ids, add_kind).
Walk = Callable[[int, "array[int]", Any, Any, Any, Any, Any], EditedPath]


@pytest.fixture(scope="module")
def model() -> StepModel:
    return step_model(read_trace(shared_trace("nsys/nsysai_mfu_2gpu_before.sqlite.gz")))


def _sorted_anew(w: ReplayWindow, sink: int, edit: GraphEdit, walk: Walk | None = None) -> EditedPath:
    """The replay with every kept and added edge sorted by its end's position (stable), walked
    back by ``walk`` (the window's own walk by default)."""
    weight = w.replay.weight[w.edges].astype(np.int64)
    if edit.scaled.size:
        at = np.searchsorted(w.edges, edit.scaled)
        ok = (at < w.edges.size) & (w.edges[np.minimum(at, w.edges.size - 1)] == edit.scaled)
        scaled = np.ones(w.edges.size)
        np.multiply.at(scaled, at[ok], edit.factor[ok])
        weight = np.round(weight * scaled).astype(np.int64)
    keep = ~np.isin(w.edges, edit.drop)
    add_ps, add_pd = w.sink_pos[edit.add_src], w.sink_pos[edit.add_dst]
    added = np.flatnonzero((add_ps >= 0) & (add_pd >= 0) & (add_ps < add_pd))
    ps, pd = np.r_[w.src_pos[keep], add_ps[added]], np.r_[w.dst_pos[keep], add_pd[added]]
    wt, ids = np.r_[weight[keep], edit.add_weight[added]], np.r_[w.edges[keep], w.g.src.size + added]
    order = np.argsort(pd, kind="stable")
    ps, pd, wt, ids = ps[order], pd[order], wt[order], ids[order]
    touched = np.r_[w.dst_pos[~keep], add_pd[added], w.dst_pos[np.isin(w.edges, edit.scaled)]]
    lo = int(np.searchsorted(pd, touched.min())) if touched.size else pd.size
    times = _replay_times(w.measured_times(), _ints(ps[lo:]), _ints(pd[lo:]), _ints(wt[lo:]), w.fixed.tobytes())
    walk = walk or w._walk_back
    return walk(int(w.sink_pos[sink]), times, ps, pd, wt, ids, np.r_[edit.add_kind, 0])


def test_edited_replays_as_sorting_every_edge_anew(model: StepModel) -> None:
    path = model.paths[0]
    w = model.replay.window(path.window_start, path.window_end)
    rng = np.random.default_rng(7)
    nodes = np.flatnonzero(w.sink_pos >= 0)
    src = rng.choice(nodes, 400)
    dst = rng.choice(nodes, 400)
    dst[::4] = dst[0]  # several added edges end at one instant
    forward = model.graph.node_ts[dst] >= model.graph.node_ts[src]
    src, dst = src[forward], dst[forward]
    edit = GraphEdit(drop=np.unique(rng.choice(w.edges, 300)), scaled=rng.choice(w.edges, 500),
                     factor=rng.uniform(0, 1, 500), add_src=src, add_dst=dst,
                     add_weight=rng.integers(0, 1000, src.size), add_kind=np.full(src.size, 2, np.int64),
                     add_attr=np.full(src.size, -1, np.int64))
    for e in (edit, GraphEdit(drop=edit.drop), GraphEdit(add_src=src, add_dst=dst, add_weight=edit.add_weight,
                                                          add_kind=edit.add_kind, add_attr=edit.add_attr)):
        got, want = w.edited(path.sink, e), _sorted_anew(w, path.sink, e)
        assert (got.end_ns, got.start_ns) == (want.end_ns, want.start_ns)
        assert np.array_equal(got.edges, want.edges) and np.array_equal(got.dur_ns, want.dur_ns)
        assert got.edges.size > 0


def _walk_sorting_every_edge(w: ReplayWindow) -> Walk:
    """The walk back as first written: every edge of the window sorted by the keys that pick the
    edge releasing an instant (latest arrival, the measured path's edge, latest source, higher
    kind, later edge), the last of each instant's run taken, then followed from ``at``."""

    def walk(at: int, times: array[int], ps: Any, pd: Any, wt: Any, ids: Any, add_kind: Any) -> EditedPath:
        g, n_graph = w.g, w.g.src.size
        t = np.asarray(times, dtype=np.int64)
        kind = np.where(ids < n_graph, g.kind[np.minimum(ids, n_graph - 1)], add_kind[np.maximum(ids - n_graph, 0)])
        measured = ids == g.bind_edge[w.order][pd]
        order = np.lexsort((kind, t[ps], measured, t[ps] + wt, pd))
        last = order[np.r_[pd[order][1:] != pd[order][:-1], True]]
        best = np.full(t.size, -1, dtype=np.int64)
        best[pd[last]] = last
        path, lengths, walked = [], [], set()
        v = at
        while t[v] > w.ws and not w.fixed[v] and best[v] >= 0:
            e = int(best[v])
            if v in walked:
                e = way_out_of_cycle(t, ps, pd, kind, v, walked)
                if e < 0:
                    break
            walked.add(v)
            u = int(ps[e])
            path.append(int(ids[e]))
            lengths.append(int(t[v] - max(t[u], w.ws)))
            v = u
        return EditedPath(end_ns=int(t[at]), edges=np.array(path[::-1], dtype=np.int64),
                          dur_ns=np.array(lengths[::-1], dtype=np.int64), start_ns=max(int(t[v]), w.ws))

    return walk


@pytest.mark.parametrize("name", ["nsys/nsysai_mfu_2gpu_before.sqlite.gz", "hta/a100_ddp2_rank0_nccl2.17.json.gz"])
def test_walk_back_picks_each_instants_edge_as_sorting_every_edge(name: str) -> None:
    """The walk decides the releasing edge only at the instants it passes; a sort of all the
    window's edges by the same keys picks the same path, on real windows replayed with edits that
    drop, scale and add edges: among them two copies of each of some of the measured path's
    edges in place of the edge, which tie on every key but the last."""
    m = step_model(read_trace(shared_trace(name)))
    rng = np.random.default_rng(11)
    g = m.graph
    for path in m.paths[:1]:
        w = m.replay.window(path.window_start, path.window_end)
        nodes = np.flatnonzero(w.sink_pos >= 0)
        src, dst = rng.choice(nodes, 300), rng.choice(nodes, 300)
        forward = m.graph.node_ts[dst] >= m.graph.node_ts[src]
        copied = np.unique(rng.choice(path.edges, 500))
        twice = np.r_[copied, copied]
        src, dst = np.r_[src[forward], g.src[twice]], np.r_[dst[forward], g.dst[twice]]
        added = dict(add_src=src, add_dst=dst,
                     add_weight=np.r_[rng.integers(0, 1000, forward.sum()), m.replay.weight[twice]],
                     add_kind=np.r_[rng.integers(0, 7, forward.sum()), g.kind[twice]],
                     add_attr=np.full(src.size, -1, np.int64))
        for edit in (GraphEdit(), GraphEdit(drop=np.unique(rng.choice(w.edges, 200))),
                     GraphEdit(scaled=rng.choice(w.edges, 400), factor=rng.uniform(0, 1, 400)),
                     GraphEdit(drop=copied, **added)):
            got = _sorted_anew(w, path.sink, edit)
            want = _sorted_anew(w, path.sink, edit, _walk_sorting_every_edge(w))
            assert (got.end_ns, got.start_ns) == (want.end_ns, want.start_ns)
            assert np.array_equal(got.edges, want.edges) and np.array_equal(got.dur_ns, want.dur_ns)
            assert got.edges.size > 0


def test_edges_among_ids_as_numpys_membership(model: StepModel) -> None:
    """A window finds which of its edges an edit names by searching its edges (in id order)."""
    path = model.paths[0]
    w = model.replay.window(path.window_start, path.window_end)
    rng = np.random.default_rng(3)
    ids = np.r_[rng.choice(w.edges, 500), rng.integers(-5, model.graph.src.size + 50, 500), w.edges[-1]]
    got = w._among(ids)
    assert got.sum() > 400
    assert np.array_equal(got, np.isin(w.edges, ids))
    assert not w._among(np.zeros(0, np.int64)).any()
