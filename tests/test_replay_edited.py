"""A window replayed with an edit keeps its edges in the order of their ends' positions and
inserts the edges an edit adds among them, instead of sorting every edge of the window again
per edit. The replay is the same as that of the window's edges sorted anew: checked on a real
export's window with edits that drop, scale and add edges (several added ones ending at one
instant, as the drain edit's do)."""

from __future__ import annotations

from array import array

import numpy as np
import pytest

from conftest import shared_trace
from tracewhy.analyses.account import StepModel, step_model
from tracewhy.analyses.critical_path_replay import EditedPath, GraphEdit, ReplayWindow, _ints, _replay_times
from tracewhy.readers import read_trace


@pytest.fixture(scope="module")
def model() -> StepModel:
    return step_model(read_trace(shared_trace("nsys/nsysai_mfu_2gpu_before.sqlite.gz")))


def _sorted_anew(w: ReplayWindow, sink: int, edit: GraphEdit) -> EditedPath:
    """The replay with every kept and added edge sorted by its end's position (stable)."""
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
    times = _replay_times(array("q", w.times), _ints(ps[lo:]), _ints(pd[lo:]), _ints(wt[lo:]), w.fixed.tobytes())
    return w._walk_back(int(w.sink_pos[sink]), times, ps, pd, wt, ids, np.r_[edit.add_kind, 0])


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
