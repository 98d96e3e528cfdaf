"""An optional Arrow-native fetch of integer and text columns, through ADBC's SQLite driver.

``adbc-driver-sqlite`` (with ``adbc-driver-manager``; neither needs pyarrow) steps through the
rows in C and fills Arrow arrays that polars takes without a copy: on the 1 M-kernel export of
bench/bench_nsys.py it fetches the kernel table about 2.5x faster than SQLite's own text
aggregation (``Db.frame``'s way without it). Its import costs ~5 ms.

It is a fast path only. The driver infers each column's type from the first rows and stops at a
later value of another type; a column of another type than the schema's, or any failure, returns
None and the caller takes the strict path, which says what is wrong with the file. Text comes
over as bytes, since the driver hands strings over without checking their UTF-8 and strings in an
export come from the traced program; polars decodes them strictly, and a table holding one that
is not UTF-8 takes the strict path too. On a 4.8 M-row NVTX table (inflated
nsysai_mfu_2gpu_before) that fetches the text in about 1 s of CPU against 6 s for SQLite's JSON
aggregation and its parse.

A large table is fetched in rowid ranges on as many threads as the process has CPUs (at most
``MAX_PARTS``), each over its own connection: the driver steps SQLite and polars takes the Arrow
stream without holding the GIL, so two threads fetch the 1 M-kernel table in 0.41 s against 0.81 s
on one (bench/bench_nsys_scale.py's export, an idle 2-core machine). The parts are concatenated in
rowid order, so the frame is the one a single query gives.

``TRACEWHY_NSYS_ADBC=0`` turns it off (benchmarks compare both paths).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import polars as pl

#: Rows per Arrow batch the driver fills (its default, 1024, makes a thousand chunks per 1 M rows).
BATCH_ROWS: Final = 65_536
_INTEGER_DTYPES: Final = (pl.Int64(), pl.Int32(), pl.Null())
#: Most threads one table is fetched on.
MAX_PARTS: Final = 4
#: Fewest rowids a thread is given: below it, starting a thread and a connection costs more than
#: it saves.
MIN_PART_ROWS: Final = 200_000


class ArrowFetch:
    """An ADBC connection to one export, opened read-only like ``nsys_open`` opens it."""

    def __init__(self, database: Any) -> None:
        self._database = database
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cpus = os.cpu_count() or 1
        #: Threads a large table is fetched on.
        self.threads = max(1, min(cpus, MAX_PARTS))

    def frame(self, table: str, select: str, where: str, schema: dict[str, Any],
              rowids: tuple[int, int] | None = None) -> pl.DataFrame | None:
        """``SELECT select FROM table WHERE where`` in rowid order as a frame of ``schema``
        (integer and string columns, one per select expression, in order), or None where the
        fast path cannot vouch for them; ``rowids``: only the rows in these bounds (both
        included). A large table or range is fetched in rowid ranges on threads."""
        if any(dtype not in _INTEGER_DTYPES and dtype != pl.String() for dtype in schema.values()):
            return None
        ranges = self._ranges(table) if rowids is None else self._split(*rowids)
        split: list[tuple[int, int] | None] = list(ranges) if len(ranges) > 1 else [None]
        sqls = [_fetch_sql(table, select, where, schema, bounds) for bounds in split]
        if len(sqls) == 1:
            parts = [self._typed(sqls[0], schema)]
        else:
            with ThreadPoolExecutor(len(sqls)) as pool:
                parts = list(pool.map(self._typed, sqls, [schema] * len(sqls)))
        if any(part is None for part in parts):
            return None
        return _concatenated([p for p in parts if p is not None])

    def _typed(self, sql: str, schema: dict[str, Any]) -> pl.DataFrame | None:
        """The rows of a ``_fetch_sql`` query as a frame of ``schema``: each string column comes
        as bytes and a NULL flag, and is decoded here; None where a string is not UTF-8."""
        strings = [name for name, dtype in schema.items() if dtype == pl.String()]
        raw = {name: pl.Binary() if name in strings else dtype for name, dtype in schema.items()}
        got = self.query(sql, {**raw, **{_flag(name): pl.Int64() for name in strings}})
        if got is None or not strings:
            return got
        try:
            # Strict: bytes that are not UTF-8 fail the cast, and the strict path then decides.
            return got.select(
                pl.when(pl.col(_flag(name)) == 0).then(pl.col(name).cast(pl.String)).alias(name)
                if name in strings else pl.col(name)
                for name in schema
            )
        except pl.exceptions.PolarsError:
            return None

    def query(self, sql: str, schema: dict[str, Any]) -> pl.DataFrame | None:
        """The rows of ``sql`` as a frame of ``schema`` (integer and binary columns), or None
        where the fast path cannot vouch for them. Runs on a connection of its own, so threads
        may call it at once."""
        import adbc_driver_manager

        connection = adbc_driver_manager.AdbcConnection(self._database)
        statement = adbc_driver_manager.AdbcStatement(connection)
        try:
            statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
            statement.set_sql_query(sql)
            stream, _ = statement.execute_query()
            got = pl.DataFrame(stream)
        except (adbc_driver_manager.Error, pl.exceptions.PolarsError):
            return None  # a value of another type than the first rows' (the driver's check)
        finally:
            statement.close()
            connection.close()
        if got.width != len(schema):
            return None
        if not got.height:  # (no rows: the driver cannot infer types, and needs not)
            return pl.DataFrame(schema=schema)
        for dtype, want in zip(got.dtypes, schema.values(), strict=True):
            if dtype != pl.Null() and dtype != (pl.Binary() if want == pl.Binary() else pl.Int64()):
                return None
        try:
            return got.rename(dict(zip(got.columns, schema, strict=True))).cast(schema, strict=True)  # type: ignore[arg-type]
        except pl.exceptions.PolarsError:  # out of range for a narrower type
            return None

    def _ranges(self, table: str) -> list[tuple[int, int]]:
        """Contiguous inclusive rowid ranges covering ``table``, one per thread (one range for a
        small table, or when the bounds cannot be read)."""
        # Two subqueries: SQLite reads min(rowid) and max(rowid) off the B-tree only when each
        # is a query's sole aggregate; together they scanned the table (0.5 s on 600 MB).
        bounds = self.query(f'SELECT (SELECT min(rowid) FROM "{table}"), (SELECT max(rowid) FROM "{table}")',
                            {"lo": pl.Int64(), "hi": pl.Int64()})
        if bounds is None or bounds.height != 1 or None in bounds.row(0):
            return []
        lo, hi = bounds.row(0)
        return self._split(lo, hi)

    def _split(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Rowids ``lo`` to ``hi`` (both included) in contiguous ranges, one per thread."""
        parts = min(self.threads, (hi - lo + 1) // MIN_PART_ROWS)
        if parts < 2:
            return [(lo, hi)]
        edges = [lo + (hi - lo + 1) * i // parts for i in range(parts + 1)]
        return [(edges[i], edges[i + 1] - 1) for i in range(parts)]

    def close(self) -> None:
        self._database.close()


def _concatenated(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """The parts one under another, each column in one chunk (the driver's batches make a chunk
    each). Column by column, each part's column let go once copied: rechunking whole frames held
    every column twice, 1 GB more at the peak of a 4.8 M-row NVTX table."""
    pending = [part.get_columns() for part in parts]
    parts.clear()
    columns = []
    while pending[0]:
        columns.append(pl.concat([part.pop(0) for part in pending], rechunk=True))
    return pl.DataFrame(columns)


def _flag(name: str) -> str:
    return f"_{name}_is_null"


def _fetch_sql(table: str, select: str, where: str, schema: dict[str, Any], bounds: tuple[int, int] | None) -> str:
    """The query ``ArrowFetch.frame`` runs (over rowids ``bounds``, both included, when given).

    A string column is fetched as its bytes (never NULL) and a flag saying where it is NULL:
    the driver takes a column's type from its first rows, and a text column NULL in all of
    them would be taken for integers and fail at its first text.
    """
    names = [f"c{i}" for i in range(len(schema))]
    strings = [n for n, dtype in zip(names, schema.values(), strict=True) if dtype == pl.String()]
    outer = [f"ifnull(CAST({n} AS BLOB), X'')" if n in strings else n for n in names]
    outer += [f"{n} IS NULL" for n in strings]
    conditions = [f"({where})"] if where else []
    if bounds is not None:
        conditions.append(f"rowid BETWEEN {bounds[0]} AND {bounds[1]}")
    condition = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return (f'WITH q(_rowid, {", ".join(names)}) AS (SELECT rowid, {select} FROM "{table}"{condition}) '
            f"SELECT {', '.join(outer)} FROM q ORDER BY _rowid")


def open_arrow(file: Path) -> ArrowFetch | None:
    """An ADBC connection to ``file`` (read-only, immutable), or None without the driver or when
    turned off."""
    if os.environ.get("TRACEWHY_NSYS_ADBC", "1") == "0":
        return None
    try:
        import adbc_driver_manager
        import adbc_driver_sqlite
    except ImportError:
        return None
    try:
        return ArrowFetch(adbc_driver_sqlite.connect(f"{file.resolve().as_uri()}?mode=ro&immutable=1"))
    except adbc_driver_manager.Error:
        return None
