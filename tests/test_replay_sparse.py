"""A replay window holds only what ``edited`` reads: the in-edge index ``saved`` walks is built at
``saved``'s first call, and an edit's scaled edges change their own weights alone, instead of a
column of factors over every edge. Both give what the dense forms gave: checked against
``np.multiply.at`` over a column of ones, and on a real export's window (``saved`` after
``edited``, and a scaled edit's replay)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from conftest import shared_trace
from tracewhy.analyses import critical_path_replay
from tracewhy.analyses.account import StepModel, step_model
from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.critical_path_replay import GraphEdit
from tracewhy.analyses.replay_edges import scale_weights
from tracewhy.readers import read_trace


@pytest.fixture(scope="module")
def model() -> StepModel:
    return step_model(read_trace(shared_trace("nsys/nsysai_mfu_2gpu_before.sqlite.gz")))


def _dense_scale(weight: npt.NDArray[np.int64], at: npt.NDArray[np.int64], factor: npt.NDArray[np.float64]) -> None:
    scaled = np.ones(weight.size, dtype=np.float64)
    np.multiply.at(scaled, at, factor)
    weight[:] = np.round(weight * scaled).astype(np.int64)


def test_scaling_in_place_equals_a_column_of_factors() -> None:
    rng = np.random.default_rng(2)
    for _ in range(100):
        n = int(rng.integers(1, 40))
        weight = rng.integers(0, 10**12, n)
        at = rng.integers(0, n, int(rng.integers(0, 60)))  # entries named several times
        factor = rng.uniform(0, 1.5, at.size)
        want, got = weight.copy(), weight.copy()
        _dense_scale(want, at, factor)
        scale_weights(got, at, factor)
        assert np.array_equal(got, want)


def test_a_window_replays_scaled_edits_and_saves_as_before(model: StepModel, monkeypatch: pytest.MonkeyPatch) -> None:
    path = model.paths[0]
    w = model.replay.window(path.window_start, path.window_end)
    rng = np.random.default_rng(9)
    scaled = np.r_[rng.choice(w.edges, 400), path.edges]
    edit = GraphEdit(scaled=scaled, factor=rng.uniform(0, 1, scaled.size))
    got = w.edited(path.sink, edit)
    assert w._in_edges is None  # (``edited`` alone does not build ``saved``'s index)
    with monkeypatch.context() as m:
        m.setattr(critical_path_replay, "scale_weights", _dense_scale)
        want = w.edited(path.sink, edit)
    assert (got.end_ns, got.start_ns) == (want.end_ns, want.start_ns)
    assert np.array_equal(got.edges, want.edges) and np.array_equal(got.dur_ns, want.dur_ns)
    assert got.end_ns < int(model.graph.node_ts[path.sink])  # (the edit shortened the window)
    # ``saved`` builds its index on first use: removing the path's kernels saves what a fresh
    # window (which builds it at once) says, and something.
    kernels = np.unique(model.graph.attr[path.edges[model.graph.kind[path.edges] == int(Edge.GPU)]])
    saved = w.saved(path.sink, kernels, (Edge.GPU,))
    assert w._in_edges is not None
    assert saved == model.replay.window(path.window_start, path.window_end).saved(path.sink, kernels, (Edge.GPU,))
    assert saved > 0
