"""``tracewhy lines``: which Python line is slow. The planted lines of the generated traces come
first by their measure; counts and times are checked against the raw events of the files
(python_function frames, legacy ``Call stack`` args, kernels linked by correlation)."""

from __future__ import annotations

import ast
import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

import tracewhy
from conftest import GENERATED, ROOT, shared_trace
from tracewhy.analyses.lines import LineCol, LinesOptions, LinesResult, StackCol, lines
from tracewhy.analyses.source_lines import LineKind, line_of, parse_frame
from tracewhy.cli import main
from tracewhy.model.schema import Col
from tracewhy.model.trace import Trace
from tracewhy.renderers.lines import SPEEDSCOPE_SCHEMA, folded_stacks, location, speedscope_profile

SCRIPT = ROOT / "scripts" / "gen_traces" / "lines_traces.py"
BERT = "tracelens/h100_bert-small_bs1_seq512.json.gz"
RESNET_LEGACY = "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz"


@cache
def _load(path: Path) -> Trace:
    trace = tracewhy.load(path)
    trace.check()
    return trace


def _generated(name: str) -> Path:
    return GENERATED / f"cpu_lines_{name}.pt.trace.json.gz"


@cache
def _raw(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return [e for e in events if e.get("ph") == "X"]


def _def_line(function: str) -> int:
    """Where the generator defines ``function``: the line a with_stack frame of it names."""
    for node in ast.walk(ast.parse(SCRIPT.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return node.lineno
    raise AssertionError(f"{function} is not defined in {SCRIPT.name}")


def _row(r: LinesResult, function: str, file: str = "lines_traces.py") -> dict[str, Any]:
    rows = r.table.filter((pl.col(LineCol.FUNCTION) == function) & (pl.col(LineCol.FILE) == file)).to_dicts()
    assert len(rows) == 1, rows
    return rows[0]


def _ns(us: float) -> int:
    return round(us * 1000)


def _roots(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events not inside another of them on the same thread (spans nest on a thread)."""
    out: list[dict[str, Any]] = []
    open_end: dict[tuple[Any, Any], float] = {}
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        key = (e["pid"], e["tid"])
        if e["ts"] >= open_end.get(key, float("-inf")):
            out.append(e)
            open_end[key] = e["ts"] + e["dur"]
    return out


@pytest.mark.parametrize(("name", "sort_by", "function"), [
    ("sleep", LineCol.HOST_SELF, "__getitem__"),
    ("item", LineCol.SYNCS, "read_metrics"),
    ("loop", LineCol.HOST_SELF, "python_loop_sum"),
    ("loop", LineCol.OPS, "python_loop_sum"),
])
def test_the_planted_line_is_first_by_its_measure(name: str, sort_by: str, function: str) -> None:
    r = lines(_load(_generated(name)), LinesOptions(sort_by=sort_by))
    first = r.table.row(0, named=True)
    assert (first[LineCol.FILE], first[LineCol.LINE], first[LineCol.FUNCTION]) == \
        ("lines_traces.py", _def_line(function), function)
    assert first[sort_by] > r.table.row(1, named=True)[sort_by]
    assert r.source == "python_function" and r.table.get_column(LineCol.USER).all()


def test_default_order_on_a_cpu_trace_is_host_self_time() -> None:
    r = lines(_load(_generated("sleep")))
    assert r.sort_by == LineCol.HOST_SELF and r.gpu_time_ns == 0
    assert r.table.row(0, named=True)[LineCol.FUNCTION] == "__getitem__"
    assert r.table.get_column(LineCol.GPU).sum() == 0


def test_calls_and_totals_are_the_raw_frames() -> None:
    """A function that never recurses: its calls are its python_function events, its host total
    their summed durations (µs in the file, 1 ns of rounding each)."""
    path = _generated("sleep")
    r = lines(_load(path), LinesOptions(include_library=True))
    for function, file in (("__getitem__", "lines_traces.py"), ("train_step", "workloads.py"),
                           ("forward", "workloads.py")):
        row = _row(r, function, file)
        raw = [e for e in _raw(path) if e.get("cat") == "python_function" and e["name"].startswith(f"{file}(")
               and e["name"].endswith(f": {function}")]
        assert row[LineCol.CALLS] == len(raw)
        assert abs(row[LineCol.HOST_TOTAL] - sum(_ns(e["dur"]) for e in raw)) <= len(raw)
    getitem = _row(r, "__getitem__")
    assert getitem[LineCol.CALLS] == 3 * 16  # three active steps of a batch of 16


def test_self_times_split_the_root_frames_time() -> None:
    """With --all every frame is listed: self times add up to the outermost frames' time (from
    the raw events), and the stacks carry the same time. User-only: the stacks still match."""
    path = _generated("loop")
    trace = _load(path)
    every = lines(trace, LinesOptions(include_library=True))
    roots = _roots([e for e in _raw(path) if e.get("cat") == "python_function"])
    expected = sum(_ns(e["dur"]) for e in roots)
    assert abs(int(every.table.get_column(LineCol.HOST_SELF).sum()) - expected) <= 2 * len(roots)
    assert every.stacks.get_column(StackCol.HOST).sum() == every.table.get_column(LineCol.HOST_SELF).sum()
    user = lines(trace)
    assert user.stacks.get_column(StackCol.HOST).sum() == user.table.get_column(LineCol.HOST_SELF).sum()
    # Library frames under python_loop_sum (Tensor.__iter__, the builtins) are its self time by
    # default and their own rows with --all.
    assert _row(user, "python_loop_sum")[LineCol.HOST_SELF] > _row(every, "python_loop_sum")[LineCol.HOST_SELF]
    assert every.table.filter(~pl.col(LineCol.USER)).height > 0 and user.table.filter(~pl.col(LineCol.USER)).is_empty()


def test_sync_points_are_the_raw_scalar_reads() -> None:
    path = _generated("item")
    r = lines(_load(path))
    items = [e for e in _raw(path) if e.get("cat") == "cpu_op" and e["name"] == "aten::item"]
    assert len(items) == 3 * 3
    assert _row(r, "read_metrics")[LineCol.SYNCS] == len(items) == r.table.get_column(LineCol.SYNCS).sum()


def test_library_syncs_are_their_own_rows_with_all() -> None:
    """Adam's single-tensor step reads each of six step counters with .item() (cpu_adam_item):
    with --all those reads sit in torch/optim, the planted log_loss keeps its one per step."""
    path = GENERATED / "cpu_adam_item.pt.trace.json.gz"
    r = lines(_load(path), LinesOptions(include_library=True, sort_by=LineCol.SYNCS))
    reads = sum(1 for e in _raw(path) if e.get("cat") == "cpu_op" and e["name"] == "aten::item")
    assert r.table.get_column(LineCol.SYNCS).sum() == reads == 7 * 5
    optim = r.table.filter(pl.col(LineCol.FILE).str.starts_with("torch/optim/"))
    assert optim.get_column(LineCol.SYNCS).sum() == 6 * 5
    assert _row(r, "log_loss", "optimizer_traces.py")[LineCol.SYNCS] == 5


def test_gpu_time_is_the_kernels_launched_under_python_frames() -> None:
    """On a GPU trace: the device time of every kernel, copy and memset whose launch (runtime
    call, matched by correlation in the raw file) lies inside a python_function frame on its
    thread is split over the frames' GPU self time; the outermost frame's GPU total is all of it."""
    path = shared_trace(BERT)
    raw = _raw(path)
    frames = [e for e in raw if e.get("cat") == "python_function"]
    launches = {e["args"]["correlation"]: e for e in raw
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    expected = 0
    for k in (e for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")):
        call = launches.get(k.get("args", {}).get("correlation"))
        if call is not None and any(f["tid"] == call["tid"] and f["ts"] <= call["ts"] < f["ts"] + f["dur"]
                                    for f in frames):
            expected += _ns(k["dur"])
    r = lines(_load(path), LinesOptions(include_library=True))
    assert r.sort_by == LineCol.GPU_SELF and expected > 0
    assert r.table.get_column(LineCol.GPU_SELF).sum() == expected == r.stacks.get_column(StackCol.GPU).sum()
    assert r.table.get_column(LineCol.GPU).max() == expected
    user = lines(_load(path))
    top = int(user.table.row(0, named=True)[LineCol.GPU_SELF])
    assert top == user.table.get_column(LineCol.GPU_SELF).max() and top > 0


def test_legacy_call_stacks() -> None:
    """PyTorch 1.8 wrote a ``Call stack`` arg on each op instead of frames: the user lines are
    the user entries of those stacks, and the time is that of the outermost ops carrying one."""
    path = shared_trace(RESNET_LEGACY)
    raw = [e for e in _raw(path) if e.get("args", {}).get("Call stack")]
    user_entries = {entry for e in raw for entry in e["args"]["Call stack"].split(";")
                    if "site-packages" not in entry}
    r = lines(_load(path))
    assert r.source == "call_stack"
    assert {f"{f}({n}): {fn}" for f, n, fn in r.table.select(LineCol.FILE, LineCol.LINE, LineCol.FUNCTION)
            .iter_rows()} == user_entries
    every = lines(_load(path), LinesOptions(include_library=True))
    roots = _roots(raw)
    self_ns = int(every.table.get_column(LineCol.HOST_SELF).sum())
    assert abs(self_ns - sum(_ns(e["dur"]) for e in roots)) <= len(roots)
    assert every.stacks.get_column(StackCol.HOST).sum() == every.table.get_column(LineCol.HOST_SELF).sum()


def test_a_trace_without_stacks_says_how_to_capture_one() -> None:
    r = lines(_load(shared_trace("hta/tracediff_test_v100_rank1of2.json.gz")))
    assert r.source == "none" and r.table.is_empty() and r.note is not None and "with_stack=True" in r.note


def test_folded_stacks_and_speedscope_carry_the_self_times() -> None:
    r = lines(_load(shared_trace(BERT)), LinesOptions(include_library=True))
    labels = {location(f, n, fn, k) for f, n, fn, k in r.table.select(LineCol.FILE, LineCol.LINE, LineCol.FUNCTION,
                                                                       LineCol.LINE_KIND).iter_rows()}
    for weight, column in (("host", LineCol.HOST_SELF), ("gpu", LineCol.GPU_SELF)):
        folded = folded_stacks(r, weight).splitlines()
        total = 0
        for text in folded:
            stack, value = text.rsplit(" ", 1)
            assert all(frame in labels for frame in stack.split(";"))
            total += int(value)
        assert total == r.table.get_column(column).sum()
        doc = speedscope_profile(r, weight)
        assert doc["$schema"] == SPEEDSCOPE_SCHEMA
        profile = doc["profiles"][0]
        assert profile["type"] == "sampled" and profile["unit"] == "nanoseconds"
        assert len(profile["samples"]) == len(profile["weights"]) == len(folded)
        assert profile["endValue"] == sum(profile["weights"]) == total
        n_frames = len(doc["shared"]["frames"])
        assert all(0 <= i < n_frames for sample in profile["samples"] for i in sample)


def test_cli_json_contract_and_profile_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    flame, scope = tmp_path / "lines.folded", tmp_path / "lines.speedscope.json"
    path = str(_generated("sleep"))
    assert main(["lines", path, "--json", "--flame", str(flame), "--speedscope", str(scope)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "lines" and doc["source"] == "python_function"
    first = doc["lines"][0]
    assert {"file", "line", "function", "host_self_ns", "host_total_ns", "gpu_ns", "calls"} <= set(first)
    assert (first["file"], first["line"], first["function"]) == ("lines_traces.py", _def_line("__getitem__"),
                                                                  "__getitem__")
    assert flame.read_text().count("__getitem__") >= 1
    assert json.loads(scope.read_text())["$schema"] == SPEEDSCOPE_SCHEMA
    assert main(["lines", path, "--all", "--top", "30"]) == 0
    out = capsys.readouterr().out
    assert "torch/" in out and "built-in" not in out  # a builtin's time is its caller's


def test_line_of_names_the_line_behind_slices() -> None:
    """What diagnose needs: the user line above a sync (or an op), and the user line inside an
    input fetch; legacy call stacks give the calling line itself."""
    def ids(trace: Trace, prefix: str) -> np.ndarray[Any, Any]:
        return trace.slices.filter(pl.col(Col.NAME).cast(pl.String).str.starts_with(prefix)).get_column(Col.ID) \
            .to_numpy()

    item = _load(_generated("item"))
    assert line_of(item, ids(item, "aten::item")) == ("lines_traces.py", _def_line("read_metrics"), "read_metrics",
                                                      LineKind.DEF)
    sleep = _load(_generated("sleep"))
    fetch = ids(sleep, "enumerate(DataLoader)")
    assert line_of(sleep, fetch, within=True) == ("lines_traces.py", _def_line("__getitem__"), "__getitem__",
                                                  LineKind.DEF)
    above = line_of(sleep, fetch)
    assert above is not None and above.function == "make_sleep"  # the loop the fetch is in
    legacy = _load(shared_trace(RESNET_LEGACY))
    convs = [e for e in _raw(shared_trace(RESNET_LEGACY)) if e["name"] == "aten::conv2d"]
    callers = {next(x for x in e["args"]["Call stack"].split(";") if "site-packages" not in x) for e in convs}
    assert callers == {"resnet50_profiler_api.py(46): <module>"}
    assert line_of(legacy, ids(legacy, "aten::conv2d")) == ("resnet50_profiler_api.py", 46, "<module>", LineKind.CALL)
    assert line_of(_load(shared_trace("hta/tracediff_test_v100_rank1of2.json.gz")), [0]) is None
    assert line_of(item, []) is None


@pytest.mark.parametrize(("name", "expected"), [
    ("train.py(12): step", ("train.py", 12, "step", True)),
    ("/home/me/proj/model.py(3): forward", ("/home/me/proj/model.py", 3, "forward", True)),
    ("torch/nn/modules/module.py(1779): _call_impl", ("torch/nn/modules/module.py", 1779, "_call_impl", False)),
    ("/usr/lib/python3/dist-packages/numpy/core.py(5): f", ("/usr/lib/python3/dist-packages/numpy/core.py", 5, "f",
                                                           False)),
    ("typing.py(359): inner", ("typing.py", 359, "inner", False)),
    ("multiprocessing/spawn.py(122): spawn_main", ("multiprocessing/spawn.py", 122, "spawn_main", False)),
    ("<string>(1): <module>", ("<string>", 1, "<module>", False)),
    ("<built-in method item of Tensor object at 0x7f7ba8820280>", ("", 0, "<built-in method item of Tensor object>",
                                                                  False)),
    ("nn.Module: Linear_0", ("", 0, "nn.Module: Linear_0", False)),
])
def test_frame_names(name: str, expected: tuple[str, int, str, bool]) -> None:
    assert parse_frame(name) == expected
