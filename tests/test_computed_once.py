"""``report`` and ``export`` compute each analysis they share once per trace.

The overview runs the diagnosis beside its views; the views (``info``'s step count, the kernel
table) and the rules (the platform rule's kernel time) ask for the same steps and kernel table
the diagnosis' context holds, so each is computed once; so are the host index (the step search
and the rules), the host tree (the step account, memory, source-line, anti-pattern and
extra-copy analyses), the compile-marked slices (the step account, memory and the compile
analysis) and the threads that run backward (the dependency graph and the account's host
contexts). Calls are counted by replacing every module's binding of the analysis (``from x
import f`` copies the name), on every thread.
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from conftest import shared_trace
from tracewhy.analyses import autograd_threads, compile_slices, host_activity, kernels, nvtx, steps
from tracewhy.analyses.host_tree import HostTree
from tracewhy.reports import overview
from tracewhy.reports.export import ExportOptions, export_report
from tracewhy.reports.report import report_contents

#: Each counted analysis, computed once.
ONCE: dict[str, int] = {
    "steps": 1, "kernels": 1, "gpu_projection": 1, "overview": 1, "build_host_index": 1, "HostTree.of": 1,
    "marked_slices": 1, "_backward_threads": 1,
}
COUNTED: tuple[tuple[Any, str], ...] = (
    (steps, "steps"), (kernels, "kernels"), (nvtx, "gpu_projection"), (overview, "overview"),
    (host_activity, "build_host_index"), (compile_slices, "marked_slices"), (autograd_threads, "_backward_threads"),
)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[str]]:
    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    for module, name in COUNTED:
        real = getattr(module, name)

        def counting(*args: Any, _real: Callable[..., Any] = real, _name: str = name, **kwargs: Any) -> Any:
            with lock:
                counts[_name] += 1
            return _real(*args, **kwargs)

        for loaded in list(sys.modules.values()):
            if getattr(loaded, "__name__", "").startswith("tracewhy") and getattr(loaded, name, None) is real:
                monkeypatch.setattr(loaded, name, counting)
    real_tree = HostTree.of

    def counting_tree(trace: Any) -> HostTree:
        with lock:
            counts["HostTree.of"] += 1
        return real_tree(trace)

    monkeypatch.setattr(HostTree, "of", staticmethod(counting_tree))
    yield counts


@pytest.mark.parametrize("trace", [
    "tracelens/h100_bert-small_bs1_seq512.json.gz", "nsys/nsysai_mock_rtx3080.sqlite.gz",
])
def test_report_computes_each_analysis_once(trace: str, calls: collections.Counter[str]) -> None:
    report_contents(shared_trace(trace))
    assert dict(calls) == ONCE


def test_a_trace_without_step_markers_builds_its_host_index_once(calls: collections.Counter[str]) -> None:
    # No step marker in this export: the step search looks for the loop's own repeats in the host
    # index (and finds none), the index the diagnosis' rules read too; one build serves both.
    contents = report_contents(shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz"))
    assert isinstance(contents, overview.Overview) and contents.report.steps.table.height == 0
    assert contents.report.steps.note is not None and "no step markers" in contents.report.steps.note
    assert dict(calls) == ONCE


def test_export_computes_each_analysis_once(calls: collections.Counter[str]) -> None:
    export = export_report(shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz"), ExportOptions())
    assert export.overview is not None and export.overview.kernels.total_time_ns > 0
    assert dict(calls) == ONCE


def test_a_warmup_of_its_own_keeps_the_step_count_right(calls: collections.Counter[str]) -> None:
    # info counts every step; with --warmup the diagnosis' steps differ in their steady window
    # only, so the count is the same whichever computed them.
    from tracewhy.reports.report import ReportOptions

    path = shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz")
    plain = report_contents(path)
    with_warmup = report_contents(path, ReportOptions(warmup=0))
    assert isinstance(plain, overview.Overview) and isinstance(with_warmup, overview.Overview)
    assert with_warmup.info.step_count == plain.info.step_count == plain.report.steps.table.height > 0


def test_the_annotated_trace_is_the_same_from_the_exports_fewer_views() -> None:
    # export computes only what the annotated trace draws (no op roofline, no MFU, no replayed
    # critical-path gains): the file drawn from the report's every view is byte for byte the same.
    from pathlib import Path

    from tracewhy.findings.context import DiagnoseOptions
    from tracewhy.readers import read_trace
    from tracewhy.readers.registry import read_raw_events
    from tracewhy.renderers.perfetto import render_perfetto

    path = shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz")
    trace = read_trace(path)
    raw = read_raw_events(trace.meta.format, Path(path))
    options = DiagnoseOptions(fixes_together=False)
    every = overview.overview(trace, options)
    drawn = overview.overview(trace, options, overview.ANNOTATED_TRACE_VIEWS)
    assert every.mfu is not None and every.op_roofline is not None and drawn.mfu is None and drawn.op_roofline is None
    assert every.critical_path is not None and drawn.critical_path is not None
    assert every.critical_path.gains.get_column("gain_ns").drop_nulls().len() > 0
    assert drawn.critical_path.gains.get_column("gain_ns").drop_nulls().len() == 0
    assert render_perfetto(drawn, raw, trace) == render_perfetto(every, raw, trace)


def test_the_host_tree_makes_its_levels_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``HostTree.of`` asks ``nearest`` for its outermost syncs, which makes the tree's levels
    (``_by_level``, a stable sort of every slice by depth: 0.6 s on an 8 M-slice export); the tree
    it returns (the same parents and depths, a new instance) keeps them, so the nearest and
    outermost questions of a diagnosis never sort again, and answer as a tree made afresh does."""
    import numpy as np

    from tracewhy.analyses import host_tree
    from tracewhy.readers import read_trace

    trace = read_trace(shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz"))
    made = collections.Counter[str]()
    argsort = np.argsort

    def counted(a: Any, *args: Any, **kwargs: Any) -> Any:
        made["argsort"] += 1
        return argsort(a, *args, **kwargs)

    tree = HostTree.of(trace)
    monkeypatch.setattr(host_tree.np, "argsort", counted)
    first = tree.nearest(tree.is_op)
    outer = tree.outermost(tree.is_op)
    assert made["argsort"] == 0
    monkeypatch.undo()
    fresh = HostTree.of(trace)
    del fresh.__dict__["_levels"]
    assert np.array_equal(fresh.nearest(fresh.is_op), first)
    fresh_outer = fresh.outermost(fresh.is_op)
    assert outer is not None and fresh_outer is not None and np.array_equal(fresh_outer, outer)
