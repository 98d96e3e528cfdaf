"""An optional Arrow-native fetch of integer columns, through ADBC's SQLite driver.

``adbc-driver-sqlite`` (with ``adbc-driver-manager``; neither needs pyarrow) steps through the
rows in C and fills Arrow arrays that polars takes without a copy: on the 1 M-kernel export of
bench/bench_nsys.py it fetches the kernel table about 2.5x faster than SQLite's own text
aggregation (``Db.frame``'s way without it). Its import costs ~5 ms.

It is a fast path only. The driver infers each column's type from the first rows and stops at a
later value of another type; a column of another type than the schema's, or any failure, returns
None and the caller takes the strict path, which says what is wrong with the file. Text columns
always take the strict path: the driver hands strings over without checking their UTF-8, and
strings in an export come from the traced program.

``TRACEWHY_NSYS_ADBC=0`` turns it off (benchmarks compare both paths).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import polars as pl

#: Rows per Arrow batch the driver fills (its default, 1024, makes a thousand chunks per 1 M rows).
BATCH_ROWS: Final = 65_536
_INTEGER_DTYPES: Final = (pl.Int64(), pl.Int32(), pl.Null())


class ArrowFetch:
    """An ADBC connection to one export, opened read-only like ``nsys_open`` opens it."""

    def __init__(self, database: Any, connection: Any) -> None:
        self._database = database
        self._connection = connection

    def frame(self, sql: str, schema: dict[str, Any]) -> pl.DataFrame | None:
        """The rows of ``sql`` as a frame of ``schema`` (integer columns, one per select
        expression, in order), or None where the fast path cannot vouch for them."""
        import adbc_driver_manager

        if any(dtype not in _INTEGER_DTYPES for dtype in schema.values()):
            return None
        statement = adbc_driver_manager.AdbcStatement(self._connection)
        try:
            statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
            statement.set_sql_query(sql)
            stream, _ = statement.execute_query()
            got = pl.DataFrame(stream)
        except (adbc_driver_manager.Error, pl.exceptions.PolarsError):
            return None  # a value of another type than the first rows' (the driver's check)
        finally:
            statement.close()
        if got.width != len(schema) or any(dtype not in (pl.Int64(), pl.Null()) for dtype in got.dtypes):
            return None
        try:
            return got.rechunk().rename(dict(zip(got.columns, schema, strict=True))).cast(schema, strict=True)  # type: ignore[arg-type]
        except pl.exceptions.PolarsError:  # out of range for a narrower type
            return None

    def close(self) -> None:
        self._connection.close()
        self._database.close()


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
        database = adbc_driver_sqlite.connect(f"{file.resolve().as_uri()}?mode=ro&immutable=1")
        return ArrowFetch(database, adbc_driver_manager.AdbcConnection(database))
    except adbc_driver_manager.Error:
        return None
