"""A line tracewhy names is the line of a call only where the trace holds one. torch's Python
tracer names a frame entered while profiling by where its function starts (``co_firstlineno``)
and a frame already running when the profiler started by the line it ran then (the profiler's
start: ``prof.step()``). The truth here is independent of tracewhy: the generator's own source
(the ``def`` and the ``prof.step()`` lines, found by parsing it) and the raw events (a function
entered again while profiling is named by its first line, which no running line precedes)."""

from __future__ import annotations

import ast
import gzip
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

import tracewhy
from conftest import GENERATED, ROOT, shared_trace
from test_lines import _load
from tracewhy.analyses.account import AccountCol, step_account
from tracewhy.analyses.host_tree import HostTree
from tracewhy.analyses.lines import LineCol, LinesResult, lines
from tracewhy.analyses.source_lines import LineKind, line_of, parse_frame, running_at_start
from tracewhy.findings import source_line
from tracewhy.findings.codes import Code
from tracewhy.model.schema import Col
from tracewhy.model.trace import Trace
from tracewhy.reports.diagnose import diagnose

SCRIPT = ROOT / "scripts" / "gen_traces" / "lines_traces.py"
BERT_H100 = "tracelens/h100_bert-small_bs1_seq512.json.gz"
RESNET_LEGACY = "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz"




@cache
def _lines(path: Path) -> LinesResult:
    return lines(_load(path))


def _generated(name: str) -> Path:
    return GENERATED / f"cpu_lines_{name}.pt.trace.json.gz"


def _function(name: str) -> ast.FunctionDef:
    for node in ast.walk(ast.parse(SCRIPT.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"{name} is not defined in {SCRIPT.name}")


def _call_line(function: str, text: str) -> int:
    """The one line of ``function``'s body in the generator that contains ``text``."""
    node = _function(function)
    source = SCRIPT.read_text(encoding="utf-8").splitlines()
    found = [n for n in range(node.lineno, (node.end_lineno or node.lineno) + 1) if text in source[n - 1]]
    assert len(found) == 1, found
    return found[0]


def _row(r: LinesResult, function: str) -> dict[str, Any]:
    rows = r.table.filter((pl.col(LineCol.FUNCTION) == function) & (pl.col(LineCol.FILE) == SCRIPT.name)).to_dicts()
    assert len(rows) == 1, rows
    return rows[0]


def _ids(trace: Trace, pattern: str) -> np.ndarray[Any, Any]:
    return trace.slices.filter(pl.col(Col.NAME).cast(pl.String).str.contains(pattern)).get_column(Col.ID).to_numpy()


@pytest.mark.parametrize(("name", "loop"), [("item", "make_item"), ("loop", "make_loop"), ("sleep", "make_sleep")])
def test_a_loop_running_when_the_profiler_started_names_no_line(name: str, loop: str) -> None:
    """The schedule starts the profiler inside ``prof.step()``: the loop's frame was running then
    and the trace names it by the ``prof.step()`` line, where none of its work is."""
    row = _row(_lines(_generated(name)), loop)
    assert row[LineCol.LINE] == _call_line(loop, "prof.step()") != _function(loop).lineno
    assert row[LineCol.LINE_KIND] == LineKind.AT_START


@pytest.mark.parametrize(("name", "function"), [("item", "read_metrics"), ("loop", "python_loop_sum"),
                                                ("sleep", "__getitem__")])
def test_a_frame_entered_while_profiling_names_its_def_line(name: str, function: str) -> None:
    row = _row(_lines(_generated(name)), function)
    assert (row[LineCol.LINE], row[LineCol.LINE_KIND]) == (_function(function).lineno, LineKind.DEF)


@pytest.mark.parametrize("path", [_generated("loop"), shared_trace(BERT_H100)], ids=["cpu_lines_loop", "bert_h100"])
def test_frames_running_at_the_start_name_a_later_line_than_their_calls(path: Path) -> None:
    """Read from the raw events: a function that also runs later, entered while profiling, is
    named there by its first line; its frame found running at the start names a line after it
    (the line it was running). Every frame tracewhy finds running at the start has a source
    file, and on these traces they are single chains from the outermost frame of a thread."""
    trace = _load(path)
    tree = HostTree.of(trace)
    running = running_at_start(trace, tree)
    names = trace.slices.get_column(Col.NAME).cast(pl.String)
    at_start: dict[tuple[str, str], set[int]] = {}
    for file, line, function, _ in map(parse_frame, names.gather(np.flatnonzero(running)).to_list()):
        at_start.setdefault((file, function), set()).add(line)
    assert all(line > 0 for lines_of in at_start.values() for line in lines_of)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        raw = [e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "python_function"]
    frame = re.compile(r"^(.+)\((\d+)\): (.+)$")
    later: dict[tuple[str, str], set[int]] = {}
    for m in filter(None, map(frame.match, raw)):
        later.setdefault((m.group(1), m.group(3)), set()).add(int(m.group(2)))
    compared = 0
    for key, running_lines in at_start.items():
        others = later[key] - running_lines
        if others and len(running_lines) == 1:  # (two functions of one name in a file: threading's wait)
            assert max(others) < min(running_lines), (key, running_lines, others)
            compared += 1
    assert compared >= 2  # profiler.py step and _transit_action, at least
    parents = tree.parent[np.flatnonzero(running)]
    assert (parents < 0).sum() == len({(p, t) for p, t in trace.slices.select(Col.PID, Col.TID).filter(
        pl.Series(running)).unique().iter_rows()})


def test_the_line_of_a_frame_running_at_the_start_is_a_call_toward_its_child_running_then() -> None:
    """make_item ran ``prof.step()`` when the profiler started: the right line for the profiler's
    own start under it, the wrong one for the ``torch.no_grad()`` it opens later."""
    trace = _load(_generated("item"))
    toward_step = line_of(trace, _ids(trace, r"\): _transit_action$"))
    assert toward_step == ("lines_traces.py", _call_line("make_item", "prof.step()"), "make_item", LineKind.CALL)
    no_grad = line_of(trace, _ids(trace, r"^torch/autograd/grad_mode\.py\(\d+\): __enter__$"))
    assert no_grad is not None and (no_grad.function, no_grad.kind) == ("make_item", LineKind.AT_START)
    assert source_line.where(no_grad) == "make_item in lines_traces.py, running since before profiling began"


def test_a_finding_names_the_function_not_its_def_line_as_the_call() -> None:
    """read_metrics calls ``.item()`` two lines below its ``def``; the trace holds only the def
    line, so the finding names the function defined there and never "user line" with it."""
    trace = _load(_generated("item"))
    [f] = [f for f in diagnose(trace).findings if f.code == Code.SCALAR_READ_PER_STEP]
    def_line, item_line = _function("read_metrics").lineno, _call_line("read_metrics", "loss.item()")
    assert item_line > def_line
    assert f.evidence["line"] == {"file": SCRIPT.name, "line": def_line, "function": "read_metrics", "kind": "def"}
    assert f"user function read_metrics defined at {SCRIPT.name}:{def_line}" in f.statement
    assert f"user line {SCRIPT.name}:{def_line}" not in f.statement + f.next_step


def test_legacy_call_stacks_are_lines_of_calls() -> None:
    r = lines(_load(shared_trace(RESNET_LEGACY)))
    assert r.table.height and set(r.table.get_column(LineCol.LINE_KIND).to_list()) == {LineKind.CALL}
    legacy = _load(shared_trace(RESNET_LEGACY))
    line = line_of(legacy, _ids(legacy, r"^aten::conv2d$"))
    assert line is not None and line.kind == LineKind.CALL
    assert source_line.named(line).startswith(f"user line {line.file}:{line.line} in ")


def test_the_step_account_names_a_loop_running_at_the_start_without_its_prof_step_line() -> None:
    """The account splits host time by the user frame above it: the loop's own time is a part,
    named by its function, not by the ``prof.step()`` line the trace gives its frame."""
    parts = step_account(_load(_generated("loop"))).parts.get_column(AccountCol.PART).to_list()
    loop = [p for p in parts if "make_loop" in p]
    assert loop == ["host: lines_traces.py make_loop (running at start)"]
    assert f"host: lines_traces.py:{_function('python_loop_sum').lineno} python_loop_sum" in parts


def test_a_trace_cut_after_the_profiler_started_has_no_frame_running_at_the_start(tmp_path: Path) -> None:
    """cpu_lines_item cut at its second ``synthetic_batch`` call, as a tool trimming a window
    would: its thread now begins with frames entered while profiling, one of whose names the
    trace repeats later (the function's def line), so none is taken for the profiler's start."""
    with gzip.open(_generated("item"), "rt", encoding="utf-8") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    cut = sorted(e["ts"] for e in events if e.get("name", "").endswith("): synthetic_batch"))[1]
    doc["traceEvents"] = [e for e in events if e.get("ph") != "X" or e["ts"] >= cut]
    path = tmp_path / "cut.pt.trace.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    trace = tracewhy.load(path)
    first = trace.slices.filter(pl.col(Col.KIND) == "python").sort(Col.TS).get_column(Col.NAME).cast(pl.String)[0]
    assert first.endswith("): synthetic_batch")
    assert not running_at_start(trace, HostTree.of(trace)).any()


def test_a_read_in_a_loop_the_profiler_started_in_names_the_loop_not_its_start_line() -> None:
    """cpu_lines_started: ``prof.start()`` runs inside the loop, which reads the loss with
    ``.item()`` on a line of its own. The trace names the loop's frame by the ``prof.start()``
    line and nothing by the read's line, so the finding names the loop's function alone."""
    path = _generated("started")
    start_line = _call_line("make_started", "            prof.start()")
    read_line = _call_line("make_started", "loss.item()")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        frames = {e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "python_function"}
    assert f"{SCRIPT.name}({start_line}): make_started" in frames
    assert not any(name.startswith(f"{SCRIPT.name}({read_line}):") for name in frames)
    [f] = [f for f in diagnose(_load(path)).findings if f.code == Code.SCALAR_READ_PER_STEP]
    assert f.evidence["line"] == {"file": SCRIPT.name, "line": start_line, "function": "make_started",
                                  "kind": LineKind.AT_START}
    assert "user function make_started in lines_traces.py, running since before profiling began" in f.statement
    assert f"{SCRIPT.name}:{start_line}" not in f.statement + f.next_step
