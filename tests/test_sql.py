"""tracewhy sql: DuckDB over the trace's tables. The tables hold what the analyses measure (kernel
count and time equal ``kernels --json`` on every shared trace; ops, copies, steps, gaps and
findings equal their analyses), each is built only when a query names it, errors are one line
with exit 2, and ``export --parquet`` writes the same tables."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

import tracewhy
from conftest import ROOT, TRACES, shared_trace
from test_kineto_real import FOLDERS, NOT_KINETO
from tracewhy.analyses.copies import copies
from tracewhy.analyses.kernels import KernelCol, kernels
from tracewhy.analyses.ops import OpCol, ops
from tracewhy.analyses.sql import SQL_SCHEMAS, SQL_TABLES, Builder, SqlResult, Table, run_query
from tracewhy.analyses.steps import steps
from tracewhy.cli import main
from tracewhy.errors import UsageError
from tracewhy.findings.context import DiagnoseOptions
from tracewhy.model.trace import Trace
from tracewhy.renderers.kernels import kernels_payload
from tracewhy.renderers.sql import sql_csv, sql_payload
from tracewhy.reports.diagnose import diagnose
from tracewhy.reports.sql import report_tables, table_builders

if importlib.util.find_spec("duckdb") is None:  # the 'sql' extra (in 'test' too, so CI has it)
    if os.environ.get("CI"):
        raise ImportError("CI installs the 'test' extra, which includes duckdb")
    pytest.skip("tracewhy sql needs duckdb: pip install '.[sql]'", allow_module_level=True)

NCCL = "hta/a100_ddp2_rank0_nccl2.17.json.gz"  # 8 A100s, NCCL, ProfilerStep markers, memcpys
MEMORY = "hta/v100_ddp2_rank1_memprofile.json.gz"  # profile_memory: allocator events
NSYS = "nsys/pipit_saxpy_mpi_cuda_a100_2022.2.sqlite.gz"  # nsys export with memcpys and memsets
SQL_PAGE = ROOT / "docs" / "commands" / "sql.md"
SCHEMAS_SCRIPT = ROOT / "scripts" / "sql_schemas.py"
START, END = "<!-- sql-tables:start -->", "<!-- sql-tables:end -->"

KERNEL_TOTALS = "SELECT count(*) AS n, coalesce(sum(dur_ns), 0) AS total_ns FROM kernels"


def _shared_traces() -> list[str]:
    """Every Kineto trace (as test_kineto_real lists them) and every nsys export in ../shared."""
    if not TRACES.is_dir():
        return [NCCL]  # shared_trace() skips or fails
    found = [f"{folder}/{p.name}" for folder in FOLDERS for p in sorted((TRACES / folder).glob("*.json*"))]
    kineto = [rel for rel in found if rel not in NOT_KINETO and "reference_outputs" not in rel]
    return kineto + [f"nsys/{p.name}" for p in sorted((TRACES / "nsys").glob("*.sqlite.gz"))]


def _builders(trace: Trace) -> dict[str, Builder]:
    return table_builders(trace, DiagnoseOptions(), findings_wanted=False)


def _query(trace: Trace, query: str) -> pl.DataFrame:
    return run_query(query, _builders(trace)).table


@pytest.fixture(scope="module")
def loaded() -> Callable[[str], Trace]:
    """Each trace read once for the whole module."""
    traces: dict[str, Trace] = {}

    def load(rel: str) -> Trace:
        if rel not in traces:
            traces[rel] = tracewhy.load(shared_trace(rel))
        return traces[rel]

    return load


@pytest.mark.parametrize("rel", _shared_traces())
def test_kernel_count_and_time_equal_kernels_json(rel: str) -> None:
    """The same count and total as ``kernels --json``, and per name, family
    and rule the same counts and times as its table."""
    trace = tracewhy.load(shared_trace(rel))
    expected = kernels_payload(kernels(trace))
    result = run_query(KERNEL_TOTALS, _builders(trace))
    (row,) = sql_payload(result)["rows"].to_dicts()
    assert (row["n"], row["total_ns"]) == (expected["total_count"], expected["total_time_ns"])
    by_name = _query(trace, "SELECT name, family, rule, count(*) AS count, sum(dur_ns) AS total_ns "
                            "FROM kernels GROUP BY ALL")
    keys = [KernelCol.NAME, KernelCol.FAMILY, KernelCol.RULE]
    want = expected["kernels"].select(*keys, KernelCol.COUNT, KernelCol.TOTAL)
    assert by_name.sort(keys).equals(want.sort(keys))


@pytest.mark.parametrize("rel", [NCCL, "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz", NSYS])
def test_kernels_json_and_sql_json_agree_through_the_command_line(rel: str, capsys: pytest.CaptureFixture[str]
                                                                   ) -> None:
    path = str(shared_trace(rel))
    assert main(["kernels", path, "--json"]) == 0
    k = json.loads(capsys.readouterr().out)
    assert main(["sql", path, KERNEL_TOTALS, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "sql" and doc["tables"] == ["kernels"] and doc["row_count"] == 1
    assert [c["name"] for c in doc["columns"]] == ["n", "total_ns"]
    assert doc["rows"] == [{"n": k["total_count"], "total_ns": k["total_time_ns"]}]
    assert k["total_count"] > 0


@pytest.mark.parametrize("rel", [NCCL, MEMORY, NSYS])
def test_every_table_has_its_declared_schema(rel: str, loaded: Callable[[str], Trace]) -> None:
    trace = loaded(rel)
    report = diagnose(trace)
    builders = report_tables(trace, lambda: report)
    for name in SQL_TABLES:
        frame = builders[name]()
        assert frame.schema == SQL_SCHEMAS[name], name
        # What DuckDB sees: the same columns, read without a copy through the Arrow stream.
        result = run_query(f"SELECT * FROM {name} LIMIT 0", builders)
        assert result.table.columns == list(SQL_SCHEMAS[name]), name


@pytest.mark.parametrize("rel", [NCCL, MEMORY])
def test_ops_rows_add_up_to_the_ops_table(rel: str, loaded: Callable[[str], Trace]) -> None:
    """Summed per name, the per-op rows give ``ops``' calls, CPU total and self, and GPU self."""
    trace = loaded(rel)
    got = _query(trace, "SELECT name, count(*) AS calls, sum(dur_ns) AS cpu_total_ns, sum(cpu_self_ns) AS "
                        "cpu_self_ns, sum(gpu_self_ns) AS gpu_self_ns FROM ops GROUP BY name")
    cols = [OpCol.NAME, OpCol.CALLS, OpCol.CPU_TOTAL, OpCol.CPU_SELF, OpCol.GPU_SELF]
    want = ops(trace).table.select(cols)
    assert got.height > 50
    assert got.sort(OpCol.NAME).equals(want.sort(OpCol.NAME))


@pytest.mark.parametrize("rel", [NCCL, NSYS])
def test_copies_add_up_to_the_copies_analysis(rel: str, loaded: Callable[[str], Trace]) -> None:
    trace = loaded(rel)
    got = _query(trace, "SELECT copy_kind, src_mem, dst_mem, count(*) AS count, sum(bytes) AS bytes, "
                        "sum(dur_ns) AS time_ns FROM copies WHERE kind = 'memcpy' GROUP BY ALL")
    want = copies(trace).by_direction.select("copy_kind", "src_mem", "dst_mem", "count", "bytes", "time_ns")
    keys = ["copy_kind", "src_mem", "dst_mem"]
    assert got.height > 0 and got.sort(keys).equals(want.sort(keys))
    (kinds,) = _query(trace, "SELECT list(DISTINCT kind ORDER BY kind) FROM copies").row(0)
    assert set(kinds) <= {"memcpy", "memset"}


def test_steps_gaps_and_findings_are_the_diagnosis(loaded: Callable[[str], Trace]) -> None:
    trace = loaded(NCCL)
    report = diagnose(trace)
    builders = report_tables(trace, lambda: report)
    got_steps = run_query("SELECT * EXCLUDE (step) FROM steps ORDER BY step", builders).table
    assert got_steps.equals(steps(trace).table) and got_steps.height > 1
    gaps = run_query("SELECT count(*) AS n, sum(dur_ns) AS idle FROM gaps", builders).table.row(0)
    assert gaps == (report.gaps.gaps.height, report.gaps.gaps.get_column("dur_ns").sum())
    # step joins the two: a gap's start lies in its step's window.
    outside = run_query("SELECT count(*) FROM gaps g JOIN steps s USING (step) "
                        "WHERE g.ts_ns < s.ts_ns OR g.ts_ns >= s.window_end_ns", builders).table.item()
    inside = run_query("SELECT count(*) FROM gaps WHERE step IS NOT NULL", builders).table.item()
    assert outside == 0 and inside > 0
    findings = run_query("SELECT code, severity, recoverable_ns_per_step FROM findings ORDER BY rank", builders)
    assert findings.table.rows() == [(f.code.value, f.severity.value, f.recoverable_ns_per_step)
                                     for f in report.findings]


def test_memory_table_is_the_models(loaded: Callable[[str], Trace]) -> None:
    trace = loaded(MEMORY)
    n, freed = _query(trace, "SELECT count(*), count(*) FILTER (WHERE bytes < 0) FROM memory").row(0)
    assert n == trace.memory.height > 0 and 0 < freed < n


def test_only_the_tables_a_query_names_are_built(loaded: Callable[[str], Trace]) -> None:
    trace = loaded(NCCL)
    built: list[str] = []
    real = _builders(trace)

    def recording(name: str) -> Builder:
        return lambda: built.append(name) or real[name]()

    builders = {name: recording(name) for name in SQL_TABLES}
    query = ("WITH big AS (SELECT * FROM kernels WHERE dur_ns > 100000) "
             "SELECT o.name, count(*) FROM big JOIN ops o ON big.op_id = o.id GROUP BY 1")
    result = run_query(query, builders)
    assert sorted(built) == ["kernels", "ops"] and result.tables_used == ("kernels", "ops")
    assert result.table.height > 0


def test_python_variables_are_not_tables(loaded: Callable[[str], Trace]) -> None:
    """DuckDB's replacement scans would read a Python frame variable of the query's name."""
    secret = pl.DataFrame({"x": [1]})
    assert secret.height == 1
    with pytest.raises(UsageError, match=r"Catalog Error.*secret.*tables: slices, kernels"):
        _query(loaded(NCCL), "SELECT * FROM secret")


def test_sums_are_integers_and_repeated_names_numbered(loaded: Callable[[str], Trace]) -> None:
    trace = loaded(NCCL)
    r = run_query("SELECT k.id, o.id, sum(k.dur_ns) OVER () AS total, INTERVAL 3 DAY AS wait, [1, 2] AS l "
                  "FROM kernels k JOIN ops o ON k.op_id = o.id ORDER BY k.id LIMIT 2", _builders(trace))
    assert r.table.columns == ["id", "id_2", "total", "wait", "l"]
    assert r.table.schema["total"] == pl.Int64 and r.table.schema["wait"] == pl.String
    assert r.column_types == ("BIGINT", "BIGINT", "BIGINT", "VARCHAR", "INTEGER[]")  # HUGEINT, INTERVAL as given
    assert r.table.item(0, "total") == _query(trace, "SELECT sum(dur_ns) FROM kernels WHERE op_id IS NOT NULL").item()
    rows = list(csv.DictReader(io.StringIO(sql_csv(r))))
    assert [row["l"] for row in rows] == ["[1,2]", "[1,2]"] and rows[0]["wait"] == "3 days"


def test_csv_has_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(shared_trace(NCCL))
    query = "SELECT name, dur_ns FROM kernels ORDER BY dur_ns DESC, id"
    assert main(["sql", path, query, "--csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["name", "dur_ns"] and len(rows) == 1 + 2700
    assert int(rows[1][1]) >= int(rows[-1][1])
    assert main(["sql", path, query]) == 0  # the terminal table: the first 50 rows
    out = capsys.readouterr().out
    assert "2700 rows" in out and "first 50; --csv or --json for all" in out


@pytest.mark.parametrize(("query", "message"), [
    ("SELEC 1", "sql: Parser Error: syntax error at or near \"SELEC\""),
    ("SELECT * FROM kernel", "sql: Catalog Error: Table with name kernel does not exist!"),
    ("SELECT nope FROM kernels", "sql: Binder Error: Referenced column \"nope\" not found"),
    ("SELECT 'abc'::INT", "sql: Conversion Error: Could not convert string 'abc' to INT32"),
])
def test_query_errors_are_one_line_exit_2(query: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", str(shared_trace(NCCL)), query]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tracewhy: error: {message}") and err.count("\n") == 1 and "Traceback" not in err


def test_csv_and_json_together_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", str(shared_trace(NCCL)), "SELECT 1", "--csv", "--json"]) == 2
    assert "choose one" in capsys.readouterr().err


def test_without_duckdb_one_line_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "duckdb", None)  # import duckdb raises ImportError
    assert main(["sql", str(shared_trace(NCCL)), "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "pip install 'tracewhy[sql]'" in err and "pip install '.[sql]'" in err


def test_runs_without_pyarrow() -> None:
    """The tables reach DuckDB through the Arrow PyCapsule: pyarrow (not a dependency) unused."""
    code = ("import sys; sys.modules['pyarrow'] = None\n"
            "from tracewhy.cli import main\n"
            f"sys.exit(main(['sql', {str(shared_trace(NCCL))!r}, {KERNEL_TOTALS!r}, '--json']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"][0]["n"] == 2700


def test_export_parquet_writes_every_table(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           loaded: Callable[[str], Trace]) -> None:
    path = str(shared_trace(NCCL))
    out = tmp_path / "tables"
    assert main(["export", path, "--parquet", str(out)]) == 0
    assert "wrote 8 tables" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{t}.parquet" for t in SQL_TABLES)
    trace = loaded(NCCL)
    for name in SQL_TABLES:
        assert pl.read_parquet(out / f"{name}.parquet").schema == SQL_SCHEMAS[name], name
    k = pl.read_parquet(out / "kernels.parquet")
    assert (k.height, k.get_column("dur_ns").sum()) == (kernels(trace).total_count, kernels(trace).total_time_ns)
    codes = pl.read_parquet(out / "findings.parquet").sort("rank").get_column("code").to_list()
    assert codes == [f.code.value for f in diagnose(trace).findings]
    # With -o too, both are written, from one diagnosis.
    annotated = tmp_path / "annotated.json.gz"
    assert main(["export", path, "-o", str(annotated), "--parquet", str(out)]) == 0
    assert annotated.stat().st_size > 0 and pl.read_parquet(out / "steps.parquet").height > 1


def test_export_needs_an_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(shared_trace(NCCL))
    assert main(["export", path]) == 2
    assert "-o FILE" in capsys.readouterr().err
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["export", path, "--parquet", str(a_file)]) == 2
    assert "needs a directory" in capsys.readouterr().err


def test_result_keeps_the_query_and_types(loaded: Callable[[str], Trace]) -> None:
    r = run_query("SELECT family, count(*) AS n FROM kernels GROUP BY 1 ORDER BY 2 DESC, 1", _builders(loaded(NCCL)))
    assert isinstance(r, SqlResult) and r.column_types == ("VARCHAR", "BIGINT") and r.tables_used == (Table.KERNELS,)
    payload = sql_payload(r)
    assert payload["columns"] == [{"name": "family", "type": "VARCHAR"}, {"name": "n", "type": "BIGINT"}]
    assert payload["row_count"] == r.table.height == kernels(loaded(NCCL)).by_family.height


def _schema_reference() -> str:
    return subprocess.run([sys.executable, str(SCHEMAS_SCRIPT)], capture_output=True, text=True, check=True).stdout


def test_schema_reference_names_every_column() -> None:
    text = _schema_reference()
    for name, schema in SQL_SCHEMAS.items():
        line = next(line for line in text.splitlines() if line.startswith(f"**{name}**"))
        columns = text.split(line, 1)[1].strip().splitlines()[0]
        assert [c.split("`")[1] for c in columns.split(", ")] == list(schema)


def test_the_docs_page_holds_the_schema_reference() -> None:
    """Fails until the output of ``python scripts/sql_schemas.py`` is between the sql page's
    markers; ``TRACEWHY_UPDATE_DOCS=1`` puts it there."""
    page = SQL_PAGE.read_text(encoding="utf-8")
    assert START in page and END in page, f"{SQL_PAGE.name} lacks {START} ... {END}"
    before, rest = page.split(START, 1)
    between, after = rest.split(END, 1)
    if os.environ.get("TRACEWHY_UPDATE_DOCS"):
        SQL_PAGE.write_text(f"{before}{START}\n{_schema_reference().strip()}\n{END}{after}", encoding="utf-8")
        return
    assert between.strip() == _schema_reference().strip(), (
        f"{SQL_PAGE.relative_to(ROOT)} is stale: TRACEWHY_UPDATE_DOCS=1 python -m pytest tests/test_sql.py")
