"""``compile TRACE --logs DIR`` on real TORCH_TRACE directories (scripts/gen_traces/torch_trace_logs.py):
compile ids, breaks and recompiles checked against the profiler trace and the TORCH_LOGS capture of
the same run, phase times against the raw metrics, and the rank whose compiles differ named.

Every expected value is read here from the raw files with the standard library (the trace's
``Torch-Compiled Region: F/C`` names, the log's ``compilation_metrics`` lines, the generator's
source line of the planted break), never from tracewhy's own output.
"""

from __future__ import annotations

import gzip
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from conftest import GENERATED, ROOT
from tracewhy.cli import main
from tracewhy.model.torch_logs import LogCompileCol, LogRankCol, TorchLogs
from tracewhy.readers.registry import read_compile_logs

BREAK_ITEM = GENERATED / "cpu_ttrace_break_item.torch_trace"
RANKS = GENERATED / "cpu_ttrace_ranks.torch_trace"
_REGION = re.compile(r"Torch-Compiled Region: (\d+/\d+)")


@cache
def _read(path: Path) -> TorchLogs:
    return read_compile_logs(path)


def _trace_regions(trace: Path) -> set[str]:
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    return {m.group(1) for e in events if (m := _REGION.fullmatch(str(e.get("name", ""))))}


def _raw_entries(log_dir: Path) -> list[dict[str, Any]]:
    """Every envelope of every log in ``log_dir``, parsed with the standard library."""
    out = []
    for log in sorted(log_dir.glob("*.log.gz")):
        for line in gzip.decompress(log.read_bytes()).decode().split("\n"):
            if line and not line.startswith("\t"):
                out.append(json.loads(line.split("] ", 1)[1]))
    return out


def _planted_break_line() -> str:
    """``file:line`` of the ``.item()`` in compile_traces.TinyNet.forward, from the source."""
    source = (ROOT / "scripts/gen_traces/compile_traces.py").read_text(encoding="utf-8").splitlines()
    number = next(i for i, line in enumerate(source, 1) if ".item()" in line and "x = x /" in line)
    return f"scripts/gen_traces/compile_traces.py:{number}"


def test_compile_reads_a_torch_trace_directory(capsys: pytest.CaptureFixture[str]) -> None:
    trace = GENERATED / "cpu_ttrace_break_item.pt.trace.json.gz"
    assert main(["compile", "--no-cache", str(trace), "--logs", str(BREAK_ITEM), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [b["location"].endswith(_planted_break_line()) for b in doc["logged_breaks"]] == [True]
    assert "Tensor.item()" in doc["logged_breaks"][0]["reason"]
    assert [(r["region"], r["failed_guards"]) for r in doc["logged_recompiles"]] == [("1/1", 1)]
    joined = {r["region"]: r for r in doc["regions"]}
    assert joined["0/0"]["break_reason"] and joined["1/1"]["recompile_guard"].startswith("___stack2 ==")
    assert {c["compile_id"] for c in doc["logged_compiles"]} == {"0/0", "1/0", "1/1"}
    assert main(["compile", "--no-cache", str(trace), "--logs", str(BREAK_ITEM)]) == 0
    assert "compiles in the TORCH_TRACE logs" in capsys.readouterr().out


def test_the_compile_ids_that_made_graphs_are_the_trace_s_regions() -> None:
    compiles = _read(BREAK_ITEM).compiles
    assert compiles is not None
    with_graphs = set(compiles.filter(pl.col(LogCompileCol.GRAPHS) > 0)[LogCompileCol.REGION])
    assert with_graphs == _trace_regions(GENERATED / "cpu_ttrace_break_item.pt.trace.json.gz") == {"0/0", "1/0", "1/1"}


def test_breaks_and_recompiles_match_the_torch_logs_capture_of_the_same_run() -> None:
    structured = _read(BREAK_ITEM)
    text = read_compile_logs(GENERATED / "cpu_ttrace_break_item.torch_logs.txt")
    assert text.compiles is None  # a TORCH_LOGS capture has no per-compile metrics
    cols = ["region", "location", "reason"]
    assert structured.breaks.select(cols).to_dicts() == text.breaks.select(cols).to_dicts()
    assert structured.breaks.height == 1
    cols = ["region", "function", "guard"]
    assert structured.recompiles.select(cols).to_dicts() == text.recompiles.select(cols).to_dicts()


def test_phase_times_are_the_logged_metrics_and_add_up() -> None:
    raw = {f"{e['frame_id']}/{e['frame_compile_id']}": e["compilation_metrics"]
           for e in _raw_entries(BREAK_ITEM) if "compilation_metrics" in e}
    fx_misses: dict[str, int] = {}
    for e in _raw_entries(BREAK_ITEM):
        if e.get("artifact", {}).get("name") == "fx_graph_cache_miss":
            key = f"{e['frame_id']}/{e['frame_compile_id']}"
            fx_misses[key] = fx_misses.get(key, 0) + 1
    compiles = _read(BREAK_ITEM).compiles
    assert compiles is not None
    for row in compiles.iter_rows(named=True):
        m = raw[row[LogCompileCol.COMPILE_ID]]
        assert row[LogCompileCol.COMPILE_NS] == m["duration_us"] * 1000
        assert row[LogCompileCol.INDUCTOR_NS] == m["inductor_cumulative_compile_time_us"] * 1000
        parts = row[LogCompileCol.DYNAMO_NS] + row[LogCompileCol.AOT_AUTOGRAD_NS] + row[LogCompileCol.INDUCTOR_NS]
        assert parts == row[LogCompileCol.COMPILE_NS]
        assert row[LogCompileCol.FUNCTION] == m["co_name"]
        # A fresh cache directory: the forward and the backward graph each miss the FX graph cache.
        assert row[LogCompileCol.FX_GRAPH_CACHE] == ", ".join(["miss"] * fx_misses[row[LogCompileCol.COMPILE_ID]])


def test_the_rank_that_compiles_differently_is_named() -> None:
    logs = _read(RANKS)
    assert logs.ranks is not None and logs.compiles is not None
    ranks = {r[LogRankCol.RANK]: r for r in logs.ranks.iter_rows(named=True)}
    # Each rank's profiler trace shows which regions it ran: the log must agree.
    for rank in (0, 1):
        compiled = set(logs.compiles.filter((pl.col(LogCompileCol.RANK) == rank) & (pl.col(LogCompileCol.GRAPHS) > 0))
                       [LogCompileCol.REGION])
        assert compiled == _trace_regions(GENERATED / f"cpu_ttrace_ranks_rank{rank}.pt.trace.json.gz")
        assert ranks[rank][LogRankCol.GRAPHS] == len(compiled)
    assert ranks[0][LogRankCol.DIFFERS] is None
    differs = ranks[1][LogRankCol.DIFFERS]
    assert differs is not None and "1/0" in differs and "2 graphs (rank 0: 1)" in differs
    assert "torch_trace_logs.py" in differs  # where rank 1's break is
    assert logs.rank == 0 and logs.breaks.height == 0  # the breaks shown are the lowest rank's


def test_one_rank_log_file_is_read_alone() -> None:
    logs = read_compile_logs(RANKS / "dedicated_log_torch_trace_rank_1.log.gz")
    assert logs.rank == 1 and logs.breaks.height == 1 and logs.compiles is not None
    assert logs.compiles.height == 2


def test_bad_lines_are_warned_and_the_rest_read(tmp_path: Path) -> None:
    text = gzip.decompress((BREAK_ITEM / "dedicated_log_torch_trace_run.log.gz").read_bytes()).decode()
    lines = text.split("\n")
    lines.insert(3, "V1128 20:02:23.480000 30360 torch/x.py:1] {broken json")
    lines.insert(5, "a line from another logger")
    (tmp_path / "dedicated_log_torch_trace_x.log").write_text("\n".join(lines), encoding="utf-8")
    logs = read_compile_logs(tmp_path)
    assert logs.breaks.height == 1 and logs.compiles is not None and logs.compiles.height == 3
    assert any("1 TORCH_TRACE line with an envelope that is not a JSON object" in w for w in logs.warnings)
    assert any("not TORCH_TRACE entries" in w for w in logs.warnings)


def test_a_directory_without_logs_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("nothing here", encoding="utf-8")
    trace = GENERATED / "cpu_ttrace_break_item.pt.trace.json.gz"
    code = main(["compile", "--no-cache", str(trace), "--logs", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code not in (0, 70) and len(err.splitlines()) == 1
    assert str(tmp_path) in err and "TORCH_TRACE" in err


def test_compile_says_which_rank_compiles_differently(capsys: pytest.CaptureFixture[str]) -> None:
    trace = GENERATED / "cpu_ttrace_ranks_rank0.pt.trace.json.gz"
    assert main(["compile", "--no-cache", str(trace), "--logs", str(RANKS), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    found = [f for f in doc["findings"] if f["code"] == "compile-ranks-differ"]
    assert len(found) == 1
    assert "1 of 2 ranks" in found[0]["statement"] and "rank 1 compiles 1/0" in found[0]["statement"]
    assert [r["rank"] for r in doc["logged_ranks"]] == [0, 1]
    # One rank's logs alone: nothing to compare, no finding.
    single = RANKS / "dedicated_log_torch_trace_rank_0.log.gz"
    assert main(["compile", "--no-cache", str(trace), "--logs", str(single), "--json"]) == 0
    assert not [f for f in json.loads(capsys.readouterr().out)["findings"] if f["code"] == "compile-ranks-differ"]


def test_a_rank_s_trace_is_joined_to_that_rank_s_breaks(capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1's trace with the whole directory: its break (only rank 1 breaks) names the regions,
    not the lowest rank's (none)."""
    source = (ROOT / "scripts/gen_traces/torch_trace_logs.py").read_text(encoding="utf-8").splitlines()
    line = next(i for i, text in enumerate(source, 1) if text.strip().startswith("torch._dynamo.graph_break()"))
    trace = GENERATED / "cpu_ttrace_ranks_rank1.pt.trace.json.gz"
    assert main(["compile", "--no-cache", str(trace), "--logs", str(RANKS), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [b["location"] for b in doc["logged_breaks"]] == [f"scripts/gen_traces/torch_trace_logs.py:{line}"]
    assert {r["region"]: r["break_location"] for r in doc["regions"]}["0/0"].endswith(f":{line}")
    graph_breaks = [f for f in doc["findings"] if f["code"] == "graph-breaks"]
    assert len(graph_breaks) == 1 and f"torch_trace_logs.py:{line}" in graph_breaks[0]["statement"]


def test_a_log_with_no_rank_beside_rank_logs_is_listed_not_compared(tmp_path: Path) -> None:
    """A process that never joined the group (a launcher compiling a helper) writes a log without
    ``rank``: it is not a rank that compiles differently."""
    for log in RANKS.iterdir():
        (tmp_path / log.name).write_bytes(log.read_bytes())
    single = (BREAK_ITEM / "dedicated_log_torch_trace_run.log.gz").read_bytes()
    (tmp_path / "dedicated_log_torch_trace_launcher.log.gz").write_bytes(single)
    logs = read_compile_logs(tmp_path)
    assert logs.ranks is not None
    assert [(r[LogRankCol.RANK], r[LogRankCol.DIFFERS] is None) for r in logs.ranks.iter_rows(named=True)] == [
        (None, True), (0, True), (1, False)]
