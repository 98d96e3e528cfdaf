"""The compiled replay pass and walk (``model/compiled``, numba) give what the Python loops give:
on generated windows and graphs, integer for integer, on real traces' graphs and diagnoses the same.
The Python loops are the reference: every earlier test and figure was made with them. Also: a
plain install (no numba) keeps them in Python, and the graph's ids are int32 where they fit."""

from __future__ import annotations

import importlib.util
import json
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.conftest import shared_trace

from tracewhy.analyses import critical_path_replay, critical_path_walk
from tracewhy.analyses.critical_path_graph import Graph, build_graph
from tracewhy.model import compiled

#: The tests that run the compiled loops need numba (the ``test`` extra has it: CI runs them).
needs_numba = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                 reason="numba (the fast extra) is not installed")


@contextmanager
def compiled_loops_from(items: int | None, counted: Sequence[str]) -> Iterator[list[tuple[str, int]]]:
    """The loops compiled from ``items`` on (None: never, the Python and numpy reference); yields
    the compiled loops of ``counted`` that ran, as (name, length of the first argument)."""
    ran: list[tuple[str, int]] = []
    with pytest.MonkeyPatch.context() as mp:
        if items is None:
            mp.setattr(compiled, "_loaded", [None])
        else:
            mp.setattr(compiled, "MIN_ITEMS", items)
            mp.setattr(compiled, "_loaded", [])
            module = compiled.loops(items)
            assert module is not None, "numba is installed, so the compiled loops must load"
            for name in counted:
                mp.setattr(module, name, _counting(getattr(module, name), name, ran))
        yield ran


def _counting(loop: Any, name: str, ran: list[tuple[str, int]]) -> Any:
    def counted(first: Any, *rest: Any) -> Any:
        ran.append((name, len(first)))
        return loop(first, *rest)
    return counted


def compile_every_pass(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every replay and walk compiled, whatever its length; returns what ran compiled: each replay's
    number of edges, -1 for each walk's call."""
    monkeypatch.setattr(compiled, "MIN_ITEMS", 0)
    monkeypatch.setattr(compiled, "_loaded", [])
    passes: list[int] = []
    module = compiled.loops(0)
    assert module is not None, "numba is installed, so the compiled loops must load"
    replay, walk = module.replay_times, module.walk

    def counted_replay(times: Any, ps: Any, pd: Any, *rest: Any) -> Any:
        passes.append(len(pd))
        return replay(times, ps, pd, *rest)

    def counted_walk(*args: Any) -> Any:
        passes.append(-1)
        return walk(*args)

    monkeypatch.setattr(module, "replay_times", counted_replay)
    monkeypatch.setattr(module, "walk", counted_walk)
    return passes


@st.composite
def windows(draw: st.DrawFn) -> tuple[array[int], array[int], array[int], array[int], bytes, int]:
    """A window as ``_replay_times`` takes it: instants' times, edges sorted by their end's position
    (sources anywhere, a later one included: a contradicting tie), weights, fixed flags, ``lo``."""
    n = draw(st.integers(1, 40))
    times = draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.integers(0, 10**5)),
                          max_size=120))
    edges.sort(key=lambda e: e[1])  # (stable: edges into one instant keep their order)
    fixed = bytes(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    lo = draw(st.integers(0, len(edges)))
    ps = array("i", [u for u, _, _ in edges])
    pd = array("i", [v for _, v, _ in edges][lo:])
    w = array("q", [x for _, _, x in edges])
    return array("q", times), ps, pd, w, fixed, lo


@needs_numba
@settings(max_examples=300, deadline=None)
@given(windows())
def test_compiled_pass_replays_as_the_python_loop(window: tuple[array[int], array[int], array[int], array[int],
                                                                 bytes, int]) -> None:
    times, ps, pd, w, fixed, lo = window
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compiled, "_loaded", [None])
        expected = critical_path_replay._replay_times(array("q", times), ps, pd, w, fixed, lo)
    with pytest.MonkeyPatch.context() as mp:
        passes = compile_every_pass(mp)
        got = critical_path_replay._replay_times(array("q", times), ps, pd, w, fixed, lo)
    assert passes == [len(pd)]
    assert got == expected


@st.composite
def graphs(draw: st.DrawFn) -> tuple[Graph, int, int]:
    """A graph of one process whose instants share few times, so that releasing edges between equal
    times close cycles (``way_out_of_cycle``), with a window's start and the instant to walk from."""
    n = draw(st.integers(2, 12))
    ts = np.array(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)), dtype=np.int64)
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), min_size=1, max_size=80))
    pairs = [(u, v) for u, v in pairs if ts[u] <= ts[v] and u != v] or [(0, 0)]
    if draw(st.booleans()):  # each edge between equal times both ways round
        pairs += [(v, u) for u, v in pairs if ts[u] == ts[v]]
    src = np.array([u for u, _ in pairs], dtype=np.int64)
    dst = np.array([v for _, v in pairs], dtype=np.int64)
    bind = np.full(n, -1, dtype=np.int64)
    for v in range(n):
        into = np.flatnonzero(dst == v)
        if into.size and draw(st.integers(0, 3)):  # (mostly bound: chains, and cycles, are long)
            bind[v] = into[draw(st.integers(0, into.size - 1))]
    ring = [v for v in range(n) if ts[v] == ts[n - 1]]  # (the walk starts at the last instant)
    if len(ring) > 1 and draw(st.booleans()):  # a ring of releasing edges among equal times
        ring = draw(st.permutations(ring))[: draw(st.integers(2, len(ring)))]
        first = src.size
        src = np.r_[src, ring[1:], ring[:1]]
        dst = np.r_[dst, ring]
        bind[ring] = np.arange(first, first + len(ring))
    kind = np.array(draw(st.lists(st.integers(0, 7), min_size=src.size, max_size=src.size)), dtype=np.int8)
    graph = Graph(node_slice=np.arange(n) // 2, node_ts=ts, node_pid=np.zeros(n, dtype=np.int64), src=src,
                  dst=dst, kind=kind, attr=np.full(src.size, -1, dtype=np.int64), bind_edge=bind, dropped_edges=0)
    return graph, draw(st.integers(-1, 2)), draw(st.integers(0, 2))


@needs_numba
@settings(max_examples=400, deadline=None)
@given(graphs())
def test_compiled_walk_walks_as_the_python_walk(case: tuple[Graph, int, int]) -> None:
    graph, ws, we = case
    nodes = critical_path_walk.nodes_by_pid(graph)[0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compiled, "_loaded", [None])
        path, start, sink = critical_path_walk.walk(graph, nodes, ws, we)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(critical_path_walk, "_WALK_BUFFER", 2)  # (full buffers handed over, too)
        passes = compile_every_pass(mp)
        got = critical_path_walk.walk(graph, nodes, ws, we)
    assert got == (path, start, sink)
    assert passes or sink < 0


@needs_numba
@pytest.mark.parametrize("relative", ["nsys/nsysai_mfu_2gpu_before.sqlite.gz", "hta/a100_ddp2_rank0_nccl2.17.json.gz",
                                      "kineto/resnet50_nw4_span1_worker0.1623212756351.pt.trace.json.gz"])
def test_compiled_walk_of_real_graphs(relative: str) -> None:
    """Every process's walk over the whole trace and over each tenth of it, both ways."""
    from tracewhy import load

    graph = build_graph(load(shared_trace(relative)))
    ids = (graph.src, graph.dst, graph.attr, graph.node_slice, graph.bind_edge)
    assert {a.dtype for a in ids} == {np.dtype(np.int32)}
    by_pid = critical_path_walk.nodes_by_pid(graph)
    lo, hi = int(graph.node_ts.min()), int(graph.node_ts.max())
    windows = [(lo + (hi - lo) * k // 10, lo + (hi - lo) * (k + 1) // 10) for k in range(10)] + [(lo - 1, hi)]
    walked = 0
    for nodes in by_pid.values():
        for ws, we in windows:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(compiled, "_loaded", [None])
                expected = critical_path_walk.walk(graph, nodes, ws, we)
            with pytest.MonkeyPatch.context() as mp:
                compile_every_pass(mp)
                assert critical_path_walk.walk(graph, nodes, ws, we) == expected
            walked += len(expected[0])
    assert walked > 1000


def test_without_numba_the_python_loops_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain install (no ``fast`` extra): numba does not import, and the loops stay in Python."""
    import sys

    monkeypatch.setitem(sys.modules, "numba", None)  # (import numba now raises ImportError)
    monkeypatch.delitem(sys.modules, "tracewhy.model.compiled_loops", raising=False)
    monkeypatch.delattr(sys.modules["tracewhy.model"], "compiled_loops", raising=False)
    monkeypatch.setattr(compiled, "_loaded", [])
    assert compiled.loops(compiled.MIN_ITEMS) is None
    times = array("q", [5, 0, 0])
    got = critical_path_replay._replay_times(times, array("i", [0, 1]), array("i", [1, 2]), array("q", [3, 4]),
                                             bytes(3), 0)
    assert got == array("q", [5, 8, 12])


def test_short_passes_and_turned_off_stay_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "_loaded", [])
    assert compiled.loops(compiled.MIN_ITEMS - 1) is None
    assert not compiled._loaded, "a short pass must not load numba"
    monkeypatch.setenv(compiled.ENV_JIT, "0")
    assert compiled.loops(compiled.MIN_ITEMS) is None


# Traces whose diagnoses replay windows (the predictions and the critical path's gains): nsys
# exports of two processes, a DDP rank with NCCL, a CUDA-event multistream trace.
REPLAYED = [
    "nsys/nsysai_mfu_2gpu_before.sqlite.gz",
    "nsys/nsysai_h100_2gpu_1s.sqlite.gz",
    "hta/a100_ddp2_rank0_nccl2.17.json.gz",
    "hta/a100_cuda_event_sync_multistream.json.gz",
]


def _diagnosis(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    from tracewhy.cli import main

    assert main(["diagnose", str(path), "--json", "--no-cache"]) == 0
    return json.dumps(json.loads(capsys.readouterr().out), sort_keys=True)


@needs_numba
@pytest.mark.parametrize("relative", REPLAYED)
def test_real_diagnosis_is_the_same_with_every_pass_compiled(relative: str, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = shared_trace(relative)
    monkeypatch.setattr(compiled, "_loaded", [None])
    in_python = _diagnosis(path, capsys)
    monkeypatch.undo()
    passes = compile_every_pass(monkeypatch)
    assert _diagnosis(path, capsys) == in_python
    assert passes and max(passes) > 0, "the diagnosis must have replayed through the compiled pass"
