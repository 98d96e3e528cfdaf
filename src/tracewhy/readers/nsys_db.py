"""The open export: which tables and columns it has, and its rows fetched fast into polars.

Python's sqlite3 makes a tuple per row and an object per value; ``Db.frame`` lets SQLite
aggregate each column into one text instead, which polars parses (see its docstring). Also
the bit layout of nsys's serialized thread and process ids, which every query decodes.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

import polars as pl

# Serialized global ids (NSYS_NOTES §1.3): TID in bits 0-23, PID in bits 24-47, VM id above.
PID_SQL: Final = "(({c} >> 24) & 16777215)"
TID_SQL: Final = "({c} & 16777215)"
#: Rows SQLite aggregates into one text per column at once (tens of MB for a wide table).
FETCH_BATCH: Final = 250_000


@dataclass
class Db:
    """A read-only export with its table and column lists probed once."""

    conn: sqlite3.Connection
    tables: frozenset[str] = frozenset()
    problems: Counter[str] = field(default_factory=Counter)
    _columns: dict[str, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
        self.tables = frozenset(r[0] for r in rows)

    def columns(self, table: str) -> frozenset[str]:
        if table not in self.tables:
            return frozenset()
        if table not in self._columns:
            rows = self.conn.execute(f'PRAGMA table_info("{table}")').fetchall()
            self._columns[table] = frozenset(r[1] for r in rows)
        return self._columns[table]

    def has(self, table: str, *columns: str) -> bool:
        cols = self.columns(table)
        return bool(cols) and all(c in cols for c in columns)

    def col(self, table: str, column: str, default: str = "NULL") -> str:
        """The quoted column if the table has it, else a SQL default expression."""
        return f'"{column}"' if column in self.columns(table) else default

    def frame(self, table: str, select: str, schema: dict[str, Any], where: str = "") -> pl.DataFrame:
        """``SELECT select FROM table WHERE where`` as a frame: one column of ``schema`` per
        select expression, in order (integer or string dtypes).

        Python's sqlite3 makes a tuple per row and an object per value, which cost more than
        everything else the reader does. Instead SQLite writes each column of a batch into one
        text, integers comma-separated (``group_concat``), strings as a JSON array, and polars
        parses those: about 1.5x faster on the NVTX and runtime tables (bench/bench_nsys.py).
        Every aggregate sees the rows in the same order, so the columns stay aligned. Batches
        of FETCH_BATCH rows follow the rowid, so no text grows past SQLite's length limit.
        """
        names = list(schema)
        cols = [f"c{i}" for i in range(len(names))]
        aggs = [
            f"json_group_array(CAST({c} AS TEXT))" if schema[n] == pl.String()
            else f"group_concat(ifnull({c}, ''), ',')"
            for c, n in zip(cols, names, strict=True)
        ]
        condition = f"AND ({where})" if where else ""
        sql = f"""WITH q(_rowid, {', '.join(cols)}) AS (
            SELECT rowid, {select} FROM "{table}" WHERE rowid > ? {condition} ORDER BY rowid LIMIT {FETCH_BATCH})
            SELECT count(*), max(_rowid), {', '.join(aggs)} FROM q"""
        parts = []
        after = -(2**63)
        while True:
            row = self.conn.execute(sql, (after,)).fetchone()
            if not row[0]:
                break
            texts = pl.DataFrame([pl.Series(n, [text], dtype=pl.String())
                                  for n, text in zip(names, row[2:], strict=True)])
            parts.append(texts.select(_column(n, schema[n]) for n in names))
            if row[0] < FETCH_BATCH:
                break
            after = row[1]
        if not parts:
            return pl.DataFrame(schema=schema)
        return parts[0] if len(parts) == 1 else pl.concat(parts, rechunk=True)

    def scalar(self, sql: str) -> Any:
        row = self.conn.execute(sql).fetchone()
        return None if row is None else row[0]

    def rows_or_empty(self, table: str) -> bool:
        """True when the table exists and has at least one row."""
        return table in self.tables and self.scalar(f'SELECT 1 FROM "{table}" LIMIT 1') is not None


#: Per table group (see ``readers.nsys.tables_for``), the columns holding StringIds ids.
NAME_COLUMNS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "runtime": (("CUPTI_ACTIVITY_KIND_RUNTIME", "nameId"),),
    "kernel": (("CUPTI_ACTIVITY_KIND_KERNEL", "demangledName"), ("CUPTI_ACTIVITY_KIND_KERNEL", "shortName")),
    "nvtx": (("NVTX_EVENTS", "textId"),),
    "osrt": (("OSRT_API", "nameId"),),
    "overhead": (("PROFILER_OVERHEAD", "nameId"), ("CUPTI_ACTIVITY_KIND_OVERHEAD", "nameId")),
}


def _column(name: str, dtype: Any) -> pl.Expr:
    """One column of a ``Db.frame`` batch from the text SQLite aggregated it into."""
    text = pl.col(name)
    if dtype == pl.String():
        return text.str.json_decode(pl.List(pl.String())).explode()
    # An empty field is a NULL; anything else that is not an integer is a broken export.
    return text.str.split(",").explode().replace("", None).cast(dtype, strict=True)


def strings(db: Db, only: list[tuple[str, str]] | None = None) -> pl.DataFrame:
    """StringIds as (id, value); with ``only``, just the ids those (table, column)s use."""
    schema = {"id": pl.Int64(), "value": pl.String()}
    if not db.has("StringIds", "id", "value"):
        return pl.DataFrame(schema=schema)
    if only is None:
        return db.frame("StringIds", "id, value", schema)
    used = [f'SELECT "{c}" FROM "{t}"' for t, c in only if db.has(t, c)]
    if not used:
        return pl.DataFrame(schema=schema)
    return db.frame("StringIds", "id, value", schema, f"id IN ({' UNION '.join(used)})")
