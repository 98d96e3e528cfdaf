"""The compiled host-tree passes, the graph's binding edges and the replay window's counting sort
(``model/compiled_loops``, numba) give what numpy gives: ``HostTree.nearest`` and
``HostTree.outermost`` a level at a time, ``nearest_marked``'s pointer jumping, the packed-key and
lexsort ``_binding``, and ``np.argsort(kind="stable")``. The numpy versions are the reference (every
earlier test and figure was made with them): on generated forests, edges and keys, and on real
traces' trees and graphs, integer for integer."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.conftest import shared_trace
from tests.test_compiled_loops import compiled_loops_from, needs_numba
from tests.test_compiled_nesting import REAL

from tracewhy.analyses import critical_path_graph, critical_path_replay, replay_edges
from tracewhy.analyses.critical_path_graph import build_graph
from tracewhy.analyses.host_tree import HostTree, nearest_marked
from tracewhy.model import compiled
from tracewhy.readers import CacheOptions, read_trace

I64 = np.int64


@contextmanager
def _passes(*, compiled_from: int | None) -> Iterator[list[str]]:
    """The loops compiled from ``compiled_from`` items on (None: never, numpy's passes); yields the
    names of the compiled passes that ran."""
    with compiled_loops_from(compiled_from, ["nearest_by_level", "outermost_by_level", "stable_by_key",
                                             "binding"]) as ran:
        names: list[str] = []
        yield names
        names.extend(name for name, _ in ran)


@st.composite
def forests(draw: st.DrawFn) -> tuple[HostTree, np.ndarray[Any, Any]]:
    """A forest in slice-id order (a parent before its children, as readers number slices), depths
    that count the parent chain, and a mark on some slices."""
    n = draw(st.integers(1, 80))
    parent = np.full(n, -1, dtype=I64)
    for i in range(1, n):
        parent[i] = draw(st.integers(-1, i - 1))
    depth = np.zeros(n, dtype=I64)
    for i in range(n):
        depth[i] = depth[parent[i]] + 1 if parent[i] >= 0 else 0
    mark = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    zeros = np.zeros(n, dtype=I64)
    tree = HostTree(parent=parent, depth=depth, ts=zeros, dur=zeros, is_python=np.zeros(n, dtype=bool),
                    is_op=mark.copy(), is_sync=np.zeros(n, dtype=bool), gpu_self=zeros)
    return tree, mark


def _answers(tree: HostTree, mark: np.ndarray[Any, Any], compiled_from: int | None) -> tuple[list[Any], list[str]]:
    fresh = HostTree(**{f: getattr(tree, f) for f in tree.__dataclass_fields__})  # (no kept levels)
    with _passes(compiled_from=compiled_from) as ran:
        got = [fresh.nearest(mark), fresh.nearest(mark, strict=True), fresh.outermost(mark)]
    return got, ran


@needs_numba
@settings(max_examples=300, deadline=None)
@given(forests())
def test_compiled_tree_passes_answer_as_numpy(case: tuple[HostTree, np.ndarray[Any, Any]]) -> None:
    tree, mark = case
    expected, ran = _answers(tree, mark, None)
    assert ran == []
    got, ran = _answers(tree, mark, 0)
    assert ran == ["nearest_by_level", "nearest_by_level", "outermost_by_level"]
    for want, have in zip(expected, got, strict=True):
        np.testing.assert_array_equal(have, want)
    # and both as the pointer jumping that needs no levels
    np.testing.assert_array_equal(got[0], nearest_marked(tree.parent, mark))


@needs_numba
@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=300), st.integers(0, 5))
def test_counting_sort_orders_as_stable_argsort(keys: list[int], spare: int) -> None:
    k = np.array(keys, dtype=np.int32)
    size = (int(k.max()) + 1 if k.size else 0) + spare
    with _passes(compiled_from=0):
        module = compiled.loops(0)
        assert module is not None
        got = module.stable_by_key(k, size)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.argsort(k, kind="stable"))


@st.composite
def edge_lists(draw: st.DrawFn) -> tuple[np.ndarray[Any, Any], ...]:
    """Edges between a few nodes on a coarse clock (ties of source time and of kind), some nodes
    with no in-edge."""
    nodes = draw(st.integers(1, 30))
    node_ts = np.array(draw(st.lists(st.integers(0, 8), min_size=nodes, max_size=nodes)), dtype=I64) * 1000
    m = draw(st.integers(0, 80))
    ends = st.lists(st.integers(0, nodes - 1), min_size=m, max_size=m)
    src, dst = (np.array(draw(ends), dtype=I64) for _ in range(2))
    kind = np.array(draw(st.lists(st.integers(0, 3), min_size=m, max_size=m)), dtype=np.int8)
    return node_ts, src, dst, kind


@needs_numba
@settings(max_examples=300, deadline=None)
@given(edge_lists(), st.booleans())
def test_compiled_binding_binds_as_numpy(case: tuple[np.ndarray[Any, Any], ...], far: bool) -> None:
    node_ts, src, dst, kind = case
    if far:  # source times too far apart to pack with the kind: numpy's lexsort path
        node_ts = node_ts * (1 << 50)
    with _passes(compiled_from=None):
        expected = critical_path_graph._binding(node_ts, src, dst, kind)
    with _passes(compiled_from=0) as ran:
        got = critical_path_graph._binding(node_ts, src, dst, kind)
    assert ran == (["binding"] if dst.size else [])
    np.testing.assert_array_equal(got, expected)


# The real traces the compiled nesting is tested on (``test_compiled_nesting.REAL``): Python frames
# nested deep, several host threads, nsys exports (runtime calls under NVTX ranges).
@needs_numba
@pytest.mark.parametrize("relative", REAL)
def test_real_trees_and_windows_are_the_same_compiled(relative: str) -> None:
    trace = read_trace(shared_trace(relative), cache=CacheOptions(enabled=False))
    tree = HostTree.of(trace)
    marks = {"op": tree.is_op, "python": tree.is_python, "sync": tree.is_sync,
             "launched": tree.gpu_self > 0, "every third": np.arange(tree.parent.size) % 3 == 0}
    assert tree.parent.max() >= 0 and tree.depth.max() >= 2, "a tree worth the test"
    for name, mark in marks.items():
        expected, _ = _answers(tree, mark, None)
        got, ran = _answers(tree, mark, 0)
        assert ran, name
        for want, have in zip(expected, got, strict=True):
            np.testing.assert_array_equal(have, want, err_msg=name)
    with _passes(compiled_from=None):
        graph = build_graph(trace)
    with _passes(compiled_from=0) as ran:
        np.testing.assert_array_equal(build_graph(trace).bind_edge, graph.bind_edge)
    assert "binding" in ran
    replay = critical_path_replay.Replay(graph)
    ws, we = int(graph.node_ts.min()), int(graph.node_ts.max())
    with _passes(compiled_from=None):
        expected_window = replay.window(ws, we)
    with _passes(compiled_from=0) as ran:
        window = replay.window(ws, we)
    assert "stable_by_key" in ran
    np.testing.assert_array_equal(window.by_dst, expected_window.by_dst)
    assert window.by_dst.dtype == expected_window.by_dst.dtype == np.int32


def test_the_tree_passes_do_not_load_the_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading numba costs about 0.6 s, more than the tree's passes save: they take the compiled
    loops only where something else has loaded them."""
    monkeypatch.setattr(compiled, "MIN_ITEMS", 0)
    monkeypatch.setattr(compiled, "_loaded", [])
    parent = np.array([-1, 0, 1, 0], dtype=I64)
    tree = HostTree(parent=parent, depth=np.array([0, 1, 2, 1], dtype=I64), ts=parent * 0, dur=parent * 0,
                    is_python=np.zeros(4, dtype=bool), is_op=np.array([True, False, False, False]),
                    is_sync=np.zeros(4, dtype=bool), gpu_self=parent * 0)
    assert tree.nearest(tree.is_op).tolist() == [0, 0, 0, 0]
    assert tree.outermost(tree.is_op) is not None
    assert compiled._loaded == []


def _order_by_lexsort(nodes: np.ndarray[Any, Any], src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any],
                      ts: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``replay_edges.window_order`` as it was before its shortcuts: levels of equal-time edges,
    then a two-key lexsort of every node gathered through ``nodes``."""
    tie = ts[src] == ts[dst]
    level = np.zeros(ts.size, dtype=I64)
    for _ in range(64):
        before = level[dst[tie]].copy()
        np.maximum.at(level, dst[tie], level[src[tie]] + 1)
        if np.array_equal(before, level[dst[tie]]):
            break
    out: np.ndarray[Any, Any] = nodes[np.lexsort((level[nodes], ts[nodes]))]
    return out


@settings(max_examples=400, deadline=None)
@given(edge_lists(), st.booleans(), st.booleans(), st.data())
def test_window_order_is_the_two_key_lexsort(case: tuple[np.ndarray[Any, Any], ...], distinct: bool, whole: bool,
                                             data: st.DataObject) -> None:
    """With and without equal-time edges (``distinct``: every node at its own time, the edges
    between equal times dropped), for a whole-trace window and for some nodes."""
    node_ts, src, dst, _ = case
    if distinct:
        node_ts = np.array(data.draw(st.permutations(range(node_ts.size))), dtype=I64) * 1000
        keep = node_ts[src] != node_ts[dst]
        src, dst = src[keep], dst[keep]
    nodes = (np.arange(node_ts.size, dtype=I64) if whole else
             np.flatnonzero(np.array(data.draw(st.lists(st.booleans(), min_size=node_ts.size,
                                                         max_size=node_ts.size)), dtype=bool)))
    np.testing.assert_array_equal(replay_edges.window_order(nodes, src, dst, node_ts),
                                  _order_by_lexsort(nodes, src, dst, node_ts))
