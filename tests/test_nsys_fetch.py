"""The nsys reader's fast fetch paths read exactly what the strict path reads: the
optional Arrow fetch through ADBC's SQLite driver, and numpy's parse of integer columns. A value
either cannot vouch for (a NULL, text, a real, an overflow) takes the strict path, which still
names the table of a wrong-typed column."""

from __future__ import annotations

import gzip
import sqlite3
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from nsys_support import FIXTURES, export_path
from tracewhy.errors import TraceError
from tracewhy.model.schema import LaunchAttrCol
from tracewhy.model.trace import Trace
from tracewhy.readers.nsys import db as nsys_db
from tracewhy.readers.nsys.reader import read_nsys

KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"


def _tables(trace: Trace) -> list[pl.DataFrame]:
    return [trace.slices, trace.kernel_attrs, trace.copy_attrs, trace.nvtx_attrs, trace.threads, trace.devices]


def _same(a: Trace, b: Trace) -> None:
    for x, y in zip(_tables(a), _tables(b), strict=True):
        assert x.equals(y)
    assert a.meta == b.meta


def _strict(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the strict path: no Arrow fetch, no numpy parse."""
    monkeypatch.setenv("TRACEWHY_NSYS_ADBC", "0")
    monkeypatch.setattr(nsys_db, "_plain_integers", lambda text, rows: None)


@pytest.mark.parametrize("name", FIXTURES)
def test_fast_and_strict_paths_read_the_same_trace(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = read_nsys(export_path(name))
    _strict(monkeypatch)
    strict = read_nsys(export_path(name))
    _same(fast, strict)


def test_the_arrow_fetch_is_taken_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("adbc_driver_sqlite")
    from tracewhy.readers.nsys import arrow as nsys_arrow

    taken = []
    original = nsys_arrow.ArrowFetch.query

    def spy(self: nsys_arrow.ArrowFetch, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame | None:
        got = original(self, sql, schema)
        taken.append((sql, got is not None))
        return got

    monkeypatch.setattr(nsys_arrow.ArrowFetch, "query", spy)
    trace = read_nsys(export_path("nsysai_mfu_2gpu_before"))
    assert trace.slices.height
    assert any(KERNELS in sql and ok for sql, ok in taken)
    # Text columns too, as bytes that polars decodes.
    assert any("NVTX_EVENTS" in sql and "CAST(" in sql and ok for sql, ok in taken)


def _nvtx_copy(tmp_path: Path) -> Path:
    """nsysai_mfu_2gpu_before with its NVTX table 8x longer (153k rows, more than two of the
    driver's 65k-row batches)."""
    path = tmp_path / "nvtx.sqlite"
    path.write_bytes(gzip.decompress(export_path("nsysai_mfu_2gpu_before").read_bytes()))
    conn = sqlite3.connect(path)
    for _ in range(3):
        conn.execute("INSERT INTO NVTX_EVENTS SELECT * FROM NVTX_EVENTS")
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize(
    ("edit", "fast_path"),
    [
        # Text NULL in the whole first batch, which a driver inferring types from it would take
        # for integers.
        ("UPDATE NVTX_EVENTS SET text = NULL WHERE rowid <= 70000", True),
        # A number where text belongs: read as its text, as SQLite's CAST gives it.
        ("UPDATE NVTX_EVENTS SET text = 12.5 WHERE rowid = 9001", True),
        # Text that is not UTF-8: the strict path reads it, leniently.
        ("UPDATE NVTX_EVENTS SET text = CAST(X'666fff6f' AS TEXT) WHERE rowid = 9000", False),
    ],
)
def test_text_read_through_arrow_equals_the_strict_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: str, fast_path: bool
) -> None:
    pytest.importorskip("adbc_driver_sqlite")
    from tracewhy.readers.nsys import arrow as nsys_arrow

    fetched: list[bool] = []
    original = nsys_arrow.ArrowFetch.frame

    def spy(self: nsys_arrow.ArrowFetch, table: str, *args: Any) -> pl.DataFrame | None:
        got = original(self, table, *args)
        if table == "NVTX_EVENTS":
            fetched.append(got is not None)
        return got

    monkeypatch.setattr(nsys_arrow.ArrowFetch, "frame", spy)
    path = _nvtx_copy(tmp_path)
    conn = sqlite3.connect(path)
    conn.execute(edit)
    conn.commit()
    conn.close()
    fast = read_nsys(path)
    assert fetched[0] is fast_path
    _strict(monkeypatch)
    _same(fast, read_nsys(path))


def _mock_copy(tmp_path: Path) -> Path:
    path = tmp_path / "mock.sqlite"
    path.write_bytes(gzip.decompress(export_path("nsysai_mock_rtx3080").read_bytes()))
    return path


def _with_kernel_end(tmp_path: Path, value: str, row: str) -> Path:
    """The mock export with the kernel end of its first (``row`` "min") or last ("max") row set
    to the SQL literal ``value``."""
    path = _mock_copy(tmp_path)
    conn = sqlite3.connect(path)
    conn.execute(f'UPDATE {KERNELS} SET "end" = {value} WHERE rowid = (SELECT {row}(rowid) FROM {KERNELS})')
    conn.commit()
    conn.close()
    return path


# (SQLite stores '12 ' and '+7' in an INTEGER column as integers: those are not hostile.)
@pytest.mark.parametrize("value", ["1.5", "'99999999999999999999'", "'abc'", "'1-2'"])
@pytest.mark.parametrize("arrow", ["1", "0"])
def test_a_kernel_end_that_is_not_an_integer_names_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, arrow: str
) -> None:
    monkeypatch.setenv("TRACEWHY_NSYS_ADBC", arrow)
    with pytest.raises(TraceError, match=f"wrong type \\({KERNELS}"):
        read_nsys(_with_kernel_end(tmp_path, value, "max"))


@pytest.mark.parametrize("arrow", ["1", "0"])
def test_nulls_after_many_rows_read_as_nulls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arrow: str) -> None:
    """The Arrow driver infers a column's type from its first rows; NULLs before and after them
    stay NULL, and the trace equals the strict path's."""
    monkeypatch.setenv("TRACEWHY_NSYS_ADBC", arrow)
    path = _mock_copy(tmp_path)
    conn = sqlite3.connect(path)
    # Without the NOT NULL constraints (CREATE TABLE AS keeps none), as a hand-edited file has it.
    conn.execute(f"CREATE TABLE _k AS SELECT * FROM {KERNELS}")
    conn.execute(f"DROP TABLE {KERNELS}")
    conn.execute(f"ALTER TABLE _k RENAME TO {KERNELS}")
    for _ in range(11):  # 2 kernels -> 4096 (the driver's first batch is 1024 rows)
        conn.execute(f"INSERT INTO {KERNELS} SELECT * FROM {KERNELS}")
    conn.execute(f"UPDATE {KERNELS} SET gridY = NULL WHERE rowid IN (1, 3000)")
    conn.commit()
    conn.close()
    fast = read_nsys(path)
    assert fast.kernel_attrs.height == 4096
    assert fast.kernel_attrs.get_column(LaunchAttrCol.GRID_Y).null_count() == 2
    _strict(monkeypatch)
    _same(fast, read_nsys(path))


@pytest.mark.parametrize("name", FIXTURES)
def test_a_table_fetched_in_rowid_ranges_on_threads_reads_as_one_query(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts small enough that every table of a real export splits (up to four threads, ranges
    that need not hold equal rows) give the same trace as a single query per table."""
    pytest.importorskip("adbc_driver_sqlite")
    from tracewhy.readers.nsys import arrow as nsys_arrow

    ranged: list[str] = []
    original = nsys_arrow.ArrowFetch.query

    def spy(self: nsys_arrow.ArrowFetch, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame | None:
        if "rowid BETWEEN" in sql:
            ranged.append(sql)
        return original(self, sql, schema)

    monkeypatch.setattr(nsys_arrow.ArrowFetch, "query", spy)
    monkeypatch.setattr(nsys_arrow, "MAX_PARTS", 1)
    single = read_nsys(export_path(name))
    assert not ranged
    monkeypatch.setattr(nsys_arrow, "MAX_PARTS", 4)
    monkeypatch.setattr(nsys_arrow, "MIN_PART_ROWS", 7)
    monkeypatch.setattr(nsys_arrow.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    split = read_nsys(export_path(name))
    if single.kernel_attrs.height >= 14:
        assert any(KERNELS in sql for sql in ranged)
    _same(single, split)


@pytest.mark.parametrize("row", ["min", "max"])
def test_a_wrong_value_in_any_range_falls_back_to_the_strict_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, row: str
) -> None:
    """A text end in the first or the last range makes the whole table take the strict path,
    which names the table."""
    pytest.importorskip("adbc_driver_sqlite")
    from tracewhy.readers.nsys import arrow as nsys_arrow

    monkeypatch.setattr(nsys_arrow, "MIN_PART_ROWS", 1)
    with pytest.raises(TraceError, match=f"wrong type \\({KERNELS}"):
        read_nsys(_with_kernel_end(tmp_path, "'abc'", row))


@pytest.mark.parametrize("arrow", ["1", "0"])
def test_nvtx_fetched_a_rowid_range_at_a_time_reads_as_one_query(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arrow: str
) -> None:
    """NVTX_EVENTS is fetched and its text resolved one rowid range at a time (a million rowids,
    so a 4.8 M-row table's fetch is not held whole); range edges must not show, on either
    fetch path, nor where the Arrow fetch splits a range on threads."""
    if arrow == "1":
        pytest.importorskip("adbc_driver_sqlite")
    from tracewhy.readers.nsys import arrow as nsys_arrow
    from tracewhy.readers.nsys import nvtx_tables

    monkeypatch.setenv("TRACEWHY_NSYS_ADBC", arrow)
    path = _nvtx_copy(tmp_path)
    fetched: list[tuple[int, int] | None] = []
    original = nsys_db.Db.frame

    def spy(self: nsys_db.Db, table: str, select: str, schema: dict[str, Any], where: str = "",
            rowids: tuple[int, int] | None = None) -> pl.DataFrame:
        if table == "NVTX_EVENTS":
            fetched.append(rowids)
        return original(self, table, select, schema, where, rowids)

    monkeypatch.setattr(nsys_db.Db, "frame", spy)
    whole = read_nsys(path)
    assert len(fetched) == 1
    fetched.clear()
    monkeypatch.setattr(nvtx_tables, "NVTX_CHUNK_ROWIDS", 10_007)
    monkeypatch.setattr(nsys_arrow, "MIN_PART_ROWS", 1_000)
    monkeypatch.setattr(nsys_arrow.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    chunked = read_nsys(path)
    assert len(fetched) > 10 and whole.nvtx_attrs.height > 100_000
    _same(whole, chunked)
