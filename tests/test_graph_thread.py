"""On a large trace the diagnosis builds the step account's graph on a thread of its own while its
first rules run (``Context.start_graph``): the output is the diagnosis built in turn, the graph is
built once and on that thread, and a build that fails there is built again where the account asks,
with nothing printed from the thread."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import shared_trace

from tracewhy.analyses import critical_path_graph
from tracewhy.reports import at_once

#: An exception escaping the graph's thread is an error here (pytest reports it as this warning).
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

# An nsys export (NVTX ranges around runtime calls) and a Kineto trace with two streams.
TRACES = ("nsys/nsysai_mfu_2gpu_before.sqlite.gz", "hta/a100_cuda_event_sync_multistream.json.gz")


def _diagnosis(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    from tracewhy.cli import main

    assert main(["diagnose", str(path), "--json", "--no-cache"]) == 0
    out = capsys.readouterr()
    return json.dumps(json.loads(out.out), sort_keys=True), out.err


def _recording_builds(monkeypatch: pytest.MonkeyPatch, fail_on_thread: bool = False) -> list[str]:
    """``build_graph`` recording the name of each thread that builds; ``fail_on_thread``: it raises
    on the graph's own thread."""
    threads: list[str] = []
    build = critical_path_graph.build_graph

    def recorded(trace: Any) -> Any:
        name = threading.current_thread().name
        threads.append(name)
        if fail_on_thread and name == "tracewhy-graph":
            raise RuntimeError("a build that fails on the graph's thread")
        return build(trace)

    monkeypatch.setattr(critical_path_graph, "build_graph", recorded)
    return threads


@pytest.mark.parametrize("relative", TRACES)
def test_the_graph_built_beside_the_rules_gives_the_same_diagnosis(relative: str, capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = shared_trace(relative)
    at_once_threads = _recording_builds(monkeypatch)
    expected, _ = _diagnosis(path, capsys)
    assert at_once_threads and "tracewhy-graph" not in at_once_threads  # (small: the rules run at once)
    monkeypatch.undo()
    monkeypatch.setattr(at_once, "MAX_SLICES", -1)  # every trace large: rules in turn, graph beside them
    threads = _recording_builds(monkeypatch)
    got, err = _diagnosis(path, capsys)
    assert got == expected
    assert threads == ["tracewhy-graph"]
    assert "Exception in thread" not in err


def test_a_build_that_fails_on_its_thread_is_built_again_where_asked(capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = shared_trace(TRACES[0])
    expected, _ = _diagnosis(path, capsys)
    monkeypatch.setattr(at_once, "MAX_SLICES", -1)
    threads = _recording_builds(monkeypatch, fail_on_thread=True)
    got, err = _diagnosis(path, capsys)
    assert got == expected
    assert threads[0] == "tracewhy-graph" and len(threads) == 2 and threads[1] != "tracewhy-graph"
    assert "Exception in thread" not in err and "a build that fails" not in err


@pytest.mark.parametrize("done_first", [False, True])
def test_meanwhile_runs_only_while_the_graph_is_being_built(done_first: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``graph`` computes the ``meanwhile`` analyses before it waits for the graph's thread, and
    not at all when the graph is already there; each once."""
    from tracewhy.findings.context import Context
    from tracewhy.readers import CacheOptions, read_trace

    trace = read_trace(shared_trace(TRACES[1]), cache=CacheOptions(enabled=False))
    release = threading.Event()
    build = critical_path_graph.build_graph

    def held(t: Any) -> Any:
        release.wait(timeout=30)
        return build(t)

    monkeypatch.setattr(critical_path_graph, "build_graph", held)
    ctx = Context(trace)
    ran: list[str] = []

    def meanwhile() -> None:
        ran.append("meanwhile")
        release.set()  # (the graph's thread was waiting until now: it was still being built)

    if done_first:
        release.set()
        ctx.cached("graph", lambda: build(trace))
    ctx.start_graph(meanwhile=[meanwhile])
    assert ctx.graph() is ctx.graph()
    assert ran == ([] if done_first else ["meanwhile"])


def test_what_the_account_would_wait_for_is_made_while_the_graph_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a large trace the syncs, the anti-patterns and the GPU work per NVTX range (the blocks
    rule's) are made on the rules' thread while the graph is still being built: here the build
    waits until all three are there, which it does only if ``graph`` makes them before it waits."""
    from tracewhy.findings.context import Context
    from tracewhy.readers import CacheOptions, read_trace
    from tracewhy.reports.diagnose import rule_findings

    trace = read_trace(shared_trace(TRACES[0]), cache=CacheOptions(enabled=False))
    wanted = {"syncs", "anti_patterns", "nvtx_gpu_work"}
    made: list[str] = []
    all_made = threading.Event()
    cached = Context.cached

    def recording(self: Context, key: str, compute: Any) -> Any:
        value = cached(self, key, compute)
        if key in wanted and key not in made:
            made.append(key)
            if wanted <= set(made):
                all_made.set()
        return value

    build = critical_path_graph.build_graph
    waited: list[bool] = []

    def held(t: Any) -> Any:
        waited.append(all_made.wait(timeout=30))
        return build(t)

    monkeypatch.setattr(Context, "cached", recording)
    monkeypatch.setattr(critical_path_graph, "build_graph", held)
    monkeypatch.setattr(at_once, "MAX_SLICES", -1)
    rule_findings(Context(trace))
    assert waited == [True]
