"""Every command is a function of the Python API, and each gives the numbers the command's
``--json`` gives for the same input: run both here, compare the rows (the API's times put back on
the trace's clock, ``api_support.as_cli``) and the figures the command states."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import polars as pl
import pytest

import tracewhy as tw
from api_support import (
    A100,
    COMPILE,
    DIFF,
    LINES,
    LOGS,
    MEMORY,
    NCU_CSV,
    RANKS,
    TIMELINE,
    a100,
    as_cli,
    cli_json,
    result,
    same_rows,
)
from conftest import shared_trace
from tracewhy.cli import build_parser
from tracewhy.cli.commands import COMMAND_MODULES
from tracewhy.errors import UsageError


def test_every_command_is_a_function_with_the_commands_long_options() -> None:
    """Each command but the two that are not a computation (capture runs a profiler; mcp serves
    the commands) is a function, and each long option of the command is a keyword of it, named
    as the option (``--min-gap``: ``min_gap``), but for the outputs the CLI prints or writes."""
    printing = {"json", "top", "no_cache", "wide", "color", "help", "csv", "launches", "flame", "speedscope",
                "weight", "workers_help"}
    renamed = {"class": "gap_class", "gains": "gains", "output": "output"}
    parsers = build_parser().commands  # type: ignore[attr-defined]
    for command in COMMAND_MODULES:
        if command in ("capture", "mcp"):
            continue
        function = getattr(tw, command.replace("-", "_"))
        keywords = set(inspect.signature(function).parameters)
        for action in parsers[command]._actions:
            long = [s for s in action.option_strings if s.startswith("--")]
            if not long or (command in ("check", "schema") and long[0].startswith(("--max-", "--min-"))):
                continue
            name = long[0].removeprefix("--").replace("-", "_")
            if name not in printing:
                assert renamed.get(name, name) in keywords, f"tw.{function.__name__} lacks {long[0]}"



def test_tokens_per_step_is_items_per_step_in_tokens() -> None:
    """``tokens_per_step=N`` is the command's ``--tokens-per-step N``: ``--items-per-step N --unit tokens``."""
    trace = tw.load(Path(__file__).parent / "data" / "generated" / "cpu_generate_kv_cache.pt.trace.json.gz")
    by_tokens = tw.steps(trace, tokens_per_step=64).throughput
    by_items = tw.steps(trace, items_per_step=64, unit="tokens").throughput
    assert by_tokens is not None and by_tokens == by_items and by_tokens.unit == "tokens"
    with pytest.raises(UsageError):
        tw.steps(trace, tokens_per_step=64, items_per_step=64)

def test_diagnose() -> None:
    doc = cli_json("diagnose", str(shared_trace(A100)))
    d = result("diagnose")
    assert [(f.code, f.statement, f.recoverable_ns_per_step) for f in d] == \
        [(f["code"], f["statement"], f["recoverable_ns_per_step"]) for f in doc["findings"]]
    same_rows(as_cli(d.steps.table), doc["steps"], must_share=("ts_ns", "dur_ns", "gpu_busy_ns"))
    assert d.steps.stats is not None and d.steps.stats.p50_ns == doc["step_stats"]["p50_ns"]
    assert [f.code for f in tw.diagnose(a100(), top=2)] == [f["code"] for f in doc["findings"][:2]]


def test_steps_with_throughput() -> None:
    doc = cli_json("steps", str(shared_trace(A100)), "--items-per-step", "32", "--unit", "images")
    s = tw.steps(a100(), items_per_step=32, unit="images")
    same_rows(as_cli(s.table), doc["steps"], must_share=("name", "ts_ns", "window_end_ns", "steady"))
    assert s.throughput is not None and s.throughput.p50_per_s == doc["throughput"]["p50_per_s"]
    assert result("steps").throughput is None


def test_gaps_and_their_origin() -> None:
    doc = cli_json("gaps", str(shared_trace(A100)))
    g = result("gaps")
    largest = g.gaps.sort("dur_ns", descending=True, maintain_order=True)
    assert largest.get_column("start_ns").to_list() == [r["start_from_origin_ns"] for r in doc["gaps"]]
    assert largest.get_column("start_raw_ns").to_list() == [r["start_ns"] for r in doc["gaps"]]
    assert g.gaps.get_column("start_raw_ns").min() - g.gaps.get_column("start_ns").min() == doc["time_origin_ns"]
    only = cli_json("gaps", str(shared_trace(A100)), "--class", "launch", "--min-gap", "5000")
    assert len(tw.gaps(a100(), gap_class="launch", min_gap=5000)) == len(only["gaps"]) > 0


def test_kernels_ops_nvtx_and_info() -> None:
    path = str(shared_trace(A100))
    same_rows(as_cli(result("kernels").by_name), cli_json("kernels", path)["kernels"],
              must_share=("name", "count", "total_ns", "family"))
    same_rows(as_cli(result("ops").table), cli_json("ops", path)["ops"], must_share=("name", "calls", "gpu_self_ns"))
    same_rows(as_cli(tw.ops(a100(), shapes=True, sort="calls").table), cli_json("ops", path, "--shapes", "--sort",
                                                                              "calls")["ops"],
              must_share=("name", "calls"))
    same_rows(as_cli(result("nvtx").table), cli_json("nvtx", path)["ranges"], must_share=("name", "total_ns"))
    info = cli_json("info", path)["info"]
    assert (result("info").span_ns, result("info").first_ts_ns, len(result("info"))) == \
        (info["span_ns"], info["first_ts_ns"], len(info["devices"]))


def test_kernels_with_ncu_verdicts() -> None:
    doc = cli_json("kernels", str(shared_trace(A100)), "--ncu", str(shared_trace(NCU_CSV)))
    k = tw.kernels(a100(), ncu=shared_trace(NCU_CSV))
    same_rows(as_cli(k.by_name), doc["kernels"], must_share=("name", "ncu_match"))


def test_overlap_blocks_and_critical_path() -> None:
    path = str(shared_trace(A100))
    doc = cli_json("overlap", path)
    o = result("overlap")
    same_rows(as_cli(o.devices), doc["devices"], must_share=("device", "span_start_ns", "comm_exposed_ns"))
    same_rows(as_cli(o.steps), doc["steps"], must_share=("window_start_ns", "idle_ns"))
    same_rows(as_cli(result("blocks").table), cli_json("blocks", path)["blocks"], must_share=("name", "gpu_share"))
    cp = cli_json("critical-path", path)
    same_rows(as_cli(result("critical_path").steps), cp["steps"],
              must_share=("window_start_ns", "window_end_ns", "total_ns"))
    # --gains N replays the N items with most time on the path; the account's parts (category
    # "part", the gains diagnose's predictions share) come beside them whatever N is.
    replayed = [r.gains.filter(pl.col("gain_ns").is_not_null() & (pl.col("category") != "part"))
                .group_by("step").len().get_column("len").max()
                for r in (tw.critical_path(a100(), gains=3), result("critical_path"))]
    assert replayed[0] == 3 < replayed[1]


def test_account_is_the_commands_parts_and_windows() -> None:
    """``tw.account`` gives the parts and windows ``tracewhy account --json`` gives, the parts
    largest first as its rows (by name too), and ``top`` keeps the largest."""
    path = str(LINES)
    doc = cli_json("account", path)
    where = tw.account(path)
    same_rows(as_cli(where.account.parts), doc["parts"], must_share=("part", "ns_per_step", "share"))
    same_rows(as_cli(where.account.windows), doc["windows"], must_share=("window_start_ns", "window_end_ns"))
    assert [row["part"] for row in where] == [p["part"] for p in doc["parts"]]
    largest = doc["parts"][0]
    assert where[largest["part"]]["ns_per_step"] == largest["ns_per_step"] == where[0]["ns_per_step"]
    assert len(tw.account(path, top=2)) == 2


def test_lines_compile_and_memory() -> None:
    same_rows(as_cli(result("lines").table), cli_json("lines", str(LINES))["lines"],
              must_share=("function", "line", "host_self_ns", "calls"))
    trace, logs = f"{COMPILE}.pt.trace.json.gz", f"{COMPILE}.torch_logs.txt"
    doc = cli_json("compile", trace, "--logs", logs)
    c = result("compile")
    same_rows(as_cli(c.result.per_step), doc["steps"], must_share=("graph_breaks", "regions"))
    assert [f.code for f in c.findings] == [f["code"] for f in doc["findings"]]
    m = result("memory trace")
    mem = cli_json("memory", str(MEMORY))
    assert [(d.device, d.peak_allocated_bytes) for d in m] == \
        [(d["device"], d["peak_allocated_bytes"]) for d in mem["devices"]]
    timeline = cli_json("memory", str(TIMELINE))
    assert result("memory timeline").result.peak_total_bytes == timeline["peak_total_bytes"]


def test_sql() -> None:
    pytest.importorskip("duckdb")
    query = "SELECT family, count(*) AS kernels, sum(dur_ns) AS total_ns FROM kernels GROUP BY family ORDER BY 3 DESC"
    doc = cli_json("sql", str(shared_trace(A100)), query)
    r = tw.sql(a100(), query, top=2)
    assert as_cli(r.table) == [dict(sorted(row.items())) for row in doc["rows"][:2]] and len(r) == 2


def test_diff_check_ranks_pipeline_roofline_which_and_schema() -> None:
    d = result("diff")
    doc = cli_json("diff", *map(str, DIFF))
    assert (d.verdict, d.statement) == (doc["verdict"], doc["statement"])
    same_rows(as_cli(d.diff.ops), doc["ops"], must_share=("name", "delta_ns_per_step"))
    gate = cli_json("check", str(shared_trace(A100)), "--max-gpu-idle", "50%", "--max-step-p50", "1s")
    assert [r.line for r in result("check")] == [r["line"] for r in gate["results"]]
    ranks = cli_json("ranks", *map(str, RANKS), "--workers", "0")
    same_rows(as_cli(result("ranks").result.ranks), ranks["ranks"], must_share=("rank", "step_p50_ns"))
    chunks = cli_json("pipeline", str(LOGS))["chunks"]
    same_rows(as_cli(result("pipeline").result.chunks), chunks, must_share=("period_ns", "overlap_score"))
    roof = cli_json("roofline", str(shared_trace(NCU_CSV)))
    same_rows(as_cli(result("roofline").result.kernels), roof["kernels"], must_share=("name",))
    assert [a.symptom for a in tw.which("gaps")] == [a["symptom"] for a in cli_json("which", "gaps")["answers"]]
    assert tw.schema("gaps") == json.loads((Path(tw.__file__).parent / "schemas" / "gaps.json").read_text())
    with pytest.raises(ValueError, match=r"no command 'gap' has a schema; one of .*gaps"):
        tw.schema("gap")


def test_report_and_export_write_what_the_commands_write(tmp_path: Path) -> None:
    from tracewhy.cli import main

    trace = str(shared_trace("hta/a100_cuda_event_sync_small.json.gz"))
    assert main(["report", trace, "-o", str(tmp_path / "cli.html")]) == 0
    written = tw.report(trace, tmp_path / "api.html")
    html = tmp_path / "api.html"
    assert [(f.path, f.bytes) for f in written] == [(str(html), html.stat().st_size)]
    assert (tmp_path / "api.html").read_bytes() == (tmp_path / "cli.html").read_bytes()
    assert main(["export", trace, "-o", str(tmp_path / "cli.json.gz"), "--parquet", str(tmp_path / "cli")]) == 0
    exported = tw.export(trace, tmp_path / "api.json.gz", parquet=tmp_path / "api")
    assert exported[0].path == str(tmp_path / "api.json.gz")
    assert (tmp_path / "api.json.gz").read_bytes() == (tmp_path / "cli.json.gz").read_bytes()
    tables = [Path(f.path).name for f in exported[1:]]
    assert sorted(tables) == sorted(p.name for p in (tmp_path / "cli").iterdir()) and len(tables) > 5
    for name in tables:
        assert (tmp_path / "api" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    with pytest.raises(UsageError, match="would overwrite the input"):
        tw.report(trace, trace)
    with pytest.raises(ValueError, match="give output"):
        tw.export(trace)


def test_several_traces_are_a_report_per_trace_as_the_command_groups_them() -> None:
    """diagnose, steps, gaps and check take several traces (a list) as their commands do: the
    ranks of one job, or runs of one program compared; each trace's result has its own times
    from its own start."""
    ranks = [str(p) for p in RANKS]
    doc = cli_json("diagnose", *ranks)
    several = tw.diagnose(ranks)
    assert several.grouping is not None and several.grouping.read_as == doc["grouping"]["read_as"] == "ranks"
    assert [t.path for t in several] == [i["path"] for i in doc["inputs"]] and len(several) == 2
    for per, shown in zip(several, doc["inputs"], strict=True):
        assert [f.code for f in per.result] == [f["code"] for f in shown["findings"]]
        same_rows(as_cli(per.result.steps.table), shown["steps"], must_share=("ts_ns", "dur_ns"))
        assert per.result.steps.table.get_column("ts_ns")[0] == 0  # this trace's own start
    assert several[ranks[1]].identity.rank == 1
    runs = [str(p) for p in DIFF]
    steps_doc = cli_json("steps", *runs)
    st = tw.steps(runs, top=2)
    assert st.grouping is not None and st.grouping.read_as == steps_doc["grouping"]["read_as"]
    for per, shown in zip(st, steps_doc["inputs"], strict=True):
        same_rows(as_cli(per.result.table), shown["steps"][:2], must_share=("name", "ts_ns", "steady"))
    gaps_doc = cli_json("gaps", *ranks)
    assert [len(per.result.gaps) for per in tw.gaps(ranks)] == [len(i["gaps"]) for i in gaps_doc["inputs"]]
    gate_doc = cli_json("check", *ranks, "--max-step-p50", "1s")
    gate = tw.check(ranks, max_step_p50="1s")
    assert [[r.line for r in per.result] for per in gate] == [[r["line"] for r in i["results"]]
                                                                for i in gate_doc["inputs"]]
    assert tw.steps([ranks[0]]).table.equals(tw.steps(ranks[0]).table)  # a list of one is one trace
    assert tw.to_pandas(several)["path"].tolist() == ranks


def test_the_report_of_several_traces_is_the_commands(tmp_path: Path) -> None:
    from tracewhy.cli import main

    ranks = [str(p) for p in RANKS]
    assert main(["report", *ranks, "-o", str(tmp_path / "cli.html")]) == 0
    written = tw.report(ranks, tmp_path / "api.html")
    assert (tmp_path / "api.html").read_bytes() == (tmp_path / "cli.html").read_bytes()
    assert written[0].bytes == (tmp_path / "api.html").stat().st_size
