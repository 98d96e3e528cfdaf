"""The open export: which tables and columns it has, and its rows fetched fast into polars.

Python's sqlite3 makes a tuple per row and an object per value; ``Db.frame`` lets SQLite
aggregate each column into one text instead, which polars parses (see its docstring). Also
the bit layout of nsys's serialized thread and process ids, which every query decodes.
"""

from __future__ import annotations

import math
import re
import sqlite3
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import polars as pl

from tracewhy.readers.nsys.arrow import ArrowFetch

# Serialized global ids (NSYS_NOTES §1.3): TID in bits 0-23, PID in bits 24-47, VM id above.
PID_SQL: Final = "(({c} >> 24) & 16777215)"
TID_SQL: Final = "({c} & 16777215)"
#: Rows SQLite aggregates into one text per column at once (tens of MB for a wide table).
FETCH_BATCH: Final = 250_000


class ColumnTypeError(ValueError):
    """A column of an event table holds values its type cannot (text where nsys writes integers);
    the message starts with the table's name."""


@dataclass
class Db:
    """A read-only export with its table and column lists probed once."""

    conn: sqlite3.Connection
    tables: frozenset[str] = frozenset()
    #: Views, which nsys never writes. Reading one runs SQL the file supplies (a recursive view
    #: can run forever), so a view where a table is expected is reported and not read.
    views: frozenset[str] = frozenset()
    problems: Counter[str] = field(default_factory=Counter)
    #: Tables the reader wanted but could not read (a view, a WITHOUT ROWID table, a table
    #: lacking a needed column): their events are missing, not zero (TraceMeta.skipped_tables).
    skipped: set[str] = field(default_factory=set)
    #: Rows of an event table left out for a missing start or an impossible duration, by table
    #: (TraceMeta.dropped_events, by the kind the table holds).
    dropped: Counter[str] = field(default_factory=Counter)
    #: Rows lasting longer than this are corrupt (see ``readers.nsys.plausible_duration_ns``).
    max_dur_ns: int | None = None
    #: The optional Arrow-native fetch of integer columns (``nsys_arrow``); None: text aggregation.
    arrow: ArrowFetch | None = None
    _columns: dict[str, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rows = self.conn.execute("SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
        self.tables = frozenset(str(name) for kind, name in rows if kind == "table")
        self.views = frozenset(str(name) for kind, name in rows if kind == "view")

    def columns(self, table: str) -> frozenset[str]:
        if table in self.views:
            self.problems[f"{table} is a view, not a table as nsys writes it: not read"] = 1
            self.skipped.add(table)
            return frozenset()
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

    def frame(self, table: str, select: str, schema: dict[str, Any], where: str = "",
              rowids: tuple[int, int] | None = None) -> pl.DataFrame:
        """``SELECT select FROM table WHERE where`` as a frame: one column of ``schema`` per
        select expression, in order (integer or string dtypes); ``rowids``: only the rows in
        these bounds (both included), one of ``rowid_ranges``.

        Python's sqlite3 makes a tuple per row and an object per value, which cost more than
        everything else the reader does. Integer-only selects go through the optional Arrow
        fetch (``nsys_arrow``) when it is installed and can vouch for the values. Otherwise
        SQLite writes each column of a batch into one text, integers comma-separated
        (``group_concat``), strings as a JSON array: numpy parses integer columns without NULLs
        (``_plain_integers``), polars the rest, strictly. Every aggregate sees the rows in the
        same order, so the columns stay aligned. Batches of FETCH_BATCH rows follow the rowid,
        so no text grows past SQLite's length limit.
        """
        names = list(schema)
        cols = [f"c{i}" for i in range(len(names))]
        aggs = [
            f"json_group_array(CAST({c} AS TEXT))" if schema[n] == pl.String()
            else f"group_concat(ifnull({c}, ''), ',')"
            for c, n in zip(cols, names, strict=True)
        ]
        if not self._has_rowid(table):
            return pl.DataFrame(schema=schema)
        if self.arrow is not None:
            fast = self.arrow.frame(table, select, where, schema, rowids)
            if fast is not None:
                return fast
        condition = f"AND ({where})" if where else ""
        if rowids is not None:
            condition += f" AND rowid BETWEEN {int(rowids[0])} AND {int(rowids[1])}"
        sql = f"""WITH q(_rowid, {', '.join(cols)}) AS (
            SELECT rowid, {select} FROM "{table}" WHERE rowid > ? {condition} ORDER BY rowid LIMIT {FETCH_BATCH})
            SELECT count(*), max(_rowid), {', '.join(aggs)} FROM q"""
        parts = []
        after = -(2**63)
        while True:
            row = self.conn.execute(sql, (after,)).fetchone()
            if not row[0]:
                break
            try:
                parts.append(pl.DataFrame([_batch_column(n, schema[n], text, row[0])
                                           for n, text in zip(names, row[2:], strict=True)]))
            except pl.exceptions.PolarsError as e:
                raise ColumnTypeError(f"{table}: {' '.join(str(e).split(chr(10) * 2)[0].split())}") from None
            if row[0] < FETCH_BATCH:
                break
            after = row[1]
        if not parts:
            return pl.DataFrame(schema=schema)
        return parts[0] if len(parts) == 1 else pl.concat(parts, rechunk=True)

    def rowid_ranges(self, table: str, rows: int) -> list[tuple[int, int]]:
        """Contiguous inclusive rowid ranges of at most ``rows`` rowids covering ``table`` in
        order, for fetching a large table a range at a time; none for an empty table or one
        without rowids."""
        if not self._has_rowid(table):
            return []
        # Two queries: SQLite reads min(rowid) and max(rowid) off the B-tree only when each is a
        # query's sole aggregate.
        lo = as_int(self.scalar(f'SELECT min(rowid) FROM "{table}"'))
        hi = as_int(self.scalar(f'SELECT max(rowid) FROM "{table}"'))
        if lo is None or hi is None:
            return []
        return [(start, min(start + rows - 1, hi)) for start in range(lo, hi + 1, rows)]

    def _has_rowid(self, table: str) -> bool:
        """Whether the batches of ``frame`` can follow the table's rowid; a WITHOUT ROWID table
        (nsys writes none) is reported and not read."""
        try:
            self.conn.execute(f'SELECT rowid FROM "{table}" LIMIT 0')
        except sqlite3.OperationalError:
            self.problems[f"{table} is a WITHOUT ROWID table, unlike those nsys writes: not read"] = 1
            self.skipped.add(table)
            return False
        return True

    def scalar(self, sql: str) -> Any:
        row = self.conn.execute(sql).fetchone()
        return None if row is None else row[0]

    def rows_or_empty(self, table: str) -> bool:
        """True when the table exists and has at least one row."""
        return bool(self.columns(table)) and self.scalar(f'SELECT 1 FROM "{table}" LIMIT 1') is not None


_INTEGER_TEXT: Final = re.compile(r"[+-]?[0-9]+", re.ASCII)
_INT64: Final = 2**63
_INT64_MIN: Final = -(2**63)


def as_int(value: Any) -> int | None:
    """An integer a metadata cell holds, or None for NULL and anything else.

    Metadata tables are key/value text in places (META_DATA_EXPORT) and SQLite stores what it is
    given whatever the declared type, so a cell may hold '--5' or '²' (both pass ``isdigit``
    checks) or 1e400. Only ASCII decimal integers and integral reals within int64 are numbers.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        value = int(value) if math.isfinite(value) and value.is_integer() else None
    elif isinstance(value, str):
        value = int(value.strip()) if _INTEGER_TEXT.fullmatch(value.strip()) else None
    if isinstance(value, int) and -_INT64 <= value < _INT64:
        return value
    return None


def _batch_column(name: str, dtype: Any, text: str, rows: int) -> pl.Series:
    """One column of a ``Db.frame`` batch from the text SQLite aggregated it into."""
    ints = None if dtype == pl.String() else _plain_integers(text, rows)
    parsed: pl.Series = (
        pl.Series(name, ints).cast(dtype, strict=True) if ints is not None
        else pl.DataFrame({name: [text]}, schema={name: pl.String()}).select(_column(name, dtype)).to_series()
    )
    return parsed


#: The only bytes a column of integers without NULLs aggregates into.
_DIGITS: Final = b"0123456789,-"


def _plain_integers(text: str, rows: int) -> np.ndarray[Any, np.dtype[np.int64]] | None:
    """``rows`` comma-separated integers parsed by numpy (about 3x polars' split and cast), or
    None where the text holds a NULL (an empty field) or anything but plain int64 decimals: such
    a column takes the strict polars parse, which says what is wrong."""
    if not text.isascii() or ",," in text or text.startswith(",") or text.endswith(","):
        return None
    if text.encode("ascii").translate(None, _DIGITS):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            ints = np.fromstring(text, dtype=np.int64, sep=",")
        except (ValueError, DeprecationWarning):  # '1-2', '-': not integers
            return None
    # numpy clamps what overflows int64 to its ends, which no export holds.
    if ints.shape[0] != rows or (rows and (ints.min() == _INT64_MIN or ints.max() == _INT64 - 1)):
        return None
    return ints


def _column(name: str, dtype: Any) -> pl.Expr:
    """A ``Db.frame`` batch column parsed strictly by polars."""
    text = pl.col(name)
    if dtype == pl.String():
        return text.str.json_decode(pl.List(pl.String())).explode()
    # An empty field is a NULL; anything else that is not an integer is a broken export.
    return text.str.split(",").explode().replace("", None).cast(dtype, strict=True)


def strings(db: Db, ids: list[int] | None = None) -> pl.DataFrame:
    """StringIds as (id, value); with ``ids``, just those."""
    schema = {"id": pl.Int64(), "value": pl.String()}
    if not db.has("StringIds", "id", "value") or ids == []:
        return pl.DataFrame(schema=schema)
    # id is the INTEGER PRIMARY KEY in every export; in a file where it is not, an id that is not
    # an integer names nothing, and a repeated one must not repeat rows in every join on it.
    where = "typeof(id) = 'integer'" + ("" if ids is None else f" AND id IN ({', '.join(map(str, ids))})")
    odd = db.scalar("SELECT count(*) FROM StringIds WHERE typeof(id) != 'integer'")
    if odd:
        db.problems[f"StringIds: {odd} strings with an id that is not an integer skipped"] = 1
    return db.frame("StringIds", "id, value", schema, where).unique(subset="id", keep="first", maintain_order=True)


class Strings:
    """The StringIds the reader's tables name: all of them, fetched once (a whole read), or, in
    a partial read, those the rows read name, looked up by id (exports hold 1e5+ strings, and a
    subquery over the tables' name columns would scan them all a second time)."""

    def __init__(self, db: Db, *, whole: bool) -> None:
        self._db = db
        self._all = strings(db) if whole else None

    def of(self, ids: pl.Series) -> pl.DataFrame:
        """(id, value) for at least the ids in ``ids``, those StringIds holds."""
        if self._all is not None:
            return self._all
        wanted = ids.drop_nulls().unique().sort().to_list()
        return strings(self._db, [int(i) for i in wanted])
