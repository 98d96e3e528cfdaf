"""``sql`` sees only the trace's tables: no file read or written, no extension installed, the
configuration locked, one statement per call; ``--csv`` cells that a spreadsheet would run as a
formula are escaped. Each escape is tried for real against DuckDB, in tmp_path."""

from __future__ import annotations

import csv
import importlib.util
import io
from pathlib import Path

import pytest

from conftest import shared_trace
from tracewhy.analyses.sql import run_query
from tracewhy.cli import main
from tracewhy.errors import UsageError
from tracewhy.renderers.sql import sql_csv

if importlib.util.find_spec("duckdb") is None:  # the 'sql' extra
    pytest.skip("duckdb is not installed", allow_module_level=True)

NCCL = "hta/a100_ddp2_rank0_nccl2.17.json.gz"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    f = tmp_path / "secret.csv"
    f.write_text("token\nhunter2\n")
    return f


@pytest.mark.parametrize("reader", ["read_text", "read_csv", "read_blob", "glob"])
def test_a_query_cannot_read_a_file(secret: Path, reader: str) -> None:
    with pytest.raises(UsageError, match="disabled by configuration"):
        run_query(f"SELECT * FROM {reader}('{secret}')", {})


def test_a_query_cannot_write_or_attach_a_file(tmp_path: Path) -> None:
    for query, made in ((f"COPY (SELECT 1 AS x) TO '{tmp_path / 'out.csv'}'", tmp_path / "out.csv"),
                        (f"ATTACH '{tmp_path / 'x.db'}' AS x", tmp_path / "x.db")):
        with pytest.raises(UsageError, match="disabled"):
            run_query(query, {})
        assert not made.exists()


@pytest.mark.parametrize("query", ["INSTALL httpfs", "LOAD httpfs"])
def test_no_extension_is_installed_or_loaded(query: str) -> None:
    with pytest.raises(UsageError, match="disabled"):
        run_query(query, {})


@pytest.mark.parametrize("query", ["SET enable_external_access = true", "RESET enable_external_access",
                                   "SET lock_configuration = false", "SET autoinstall_known_extensions = true"])
def test_the_configuration_cannot_be_unlocked(query: str) -> None:
    with pytest.raises(UsageError, match="locked"):
        run_query(query, {})


@pytest.mark.parametrize("query", ["SELECT 1; SELECT 2", "SET threads = 1; SELECT 1"])
def test_one_statement_per_call(query: str) -> None:
    with pytest.raises(UsageError, match="one statement"):
        run_query(query, {})
    assert run_query("SELECT ';' AS x;", {}).table.item() == ";"  # a semicolon in a string, a trailing one


def test_reading_a_file_is_refused_over_a_real_trace(secret: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(shared_trace(NCCL))
    assert main(["sql", path, f"SELECT count(*) AS n FROM kernels, read_csv('{secret}')"]) == 2
    captured = capsys.readouterr()
    assert "hunter2" not in captured.out and "disabled by configuration" in captured.err
    # The trace's own tables are still there, and cells a spreadsheet would run are escaped.
    query = ("SELECT name, '=HYPERLINK(\"http://x\")' AS f, '+1' AS p, '-1+1' AS m, '@SUM(A1)' AS a, "
             "-5 AS n FROM kernels ORDER BY dur_ns DESC LIMIT 1")
    assert main(["sql", path, query, "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 1 and rows[0]["name"] and not rows[0]["name"].startswith("'")
    assert (rows[0]["f"], rows[0]["p"], rows[0]["m"], rows[0]["a"]) == (
        "'=HYPERLINK(\"http://x\")", "'+1", "'-1+1", "'@SUM(A1)")
    assert rows[0]["n"] == "-5"  # a number stays a number


def test_csv_escapes_tab_and_carriage_return_leads_too() -> None:
    out = sql_csv(run_query("SELECT chr(9) || '=1' AS t, chr(13) || '=1' AS r, 'a=1' AS plain", {}))
    row = next(csv.DictReader(io.StringIO(out)))
    assert row == {"t": "'\t=1", "r": "'\r=1", "plain": "a=1"}
