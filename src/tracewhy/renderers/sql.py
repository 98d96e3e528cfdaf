"""``sql``: a query's rows as a terminal table, the ``--json`` payload or ``--csv``; and a table
as Parquet bytes for ``export --parquet``."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Annotated, Any, Final, TypedDict

import msgspec
import polars as pl

from tracewhy.analyses.sql import SqlResult
from tracewhy.renderers.layout import Column, Layout, label, name, number, text
from tracewhy.units import printable

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.text import Text

    from tracewhy.renderers.json_schema import free_rows


class SqlColumn(TypedDict):
    name: str
    #: DuckDB's type of the column (BIGINT, VARCHAR, DOUBLE, ...).
    type: str


class SqlPayload(TypedDict):
    """``sql``: the query, the tables it read, its columns and every row."""

    query: str
    tables: list[str]
    columns: list[SqlColumn]
    row_count: int
    #: The rows are the query's: a column's name and type are the query's, so an average the
    #: query names ``mean_ns`` is not rounded by tracewhy.
    rows: Annotated[pl.DataFrame, free_rows("every row, an object keyed by column name")]


def sql_payload(r: SqlResult) -> SqlPayload:
    """The JSON of ``sql``: the query, the tables it read, each column's name and DuckDB type,
    and every row as an object keyed by column name."""
    return {
        "query": r.query,
        "tables": list(r.tables_used),
        "columns": [{"name": name, "type": t} for name, t in zip(r.table.columns, r.column_types, strict=True)],
        "row_count": r.table.height,
        "rows": r.table,
    }


#: A text cell starting with one of these is a formula to a spreadsheet (CSV injection, OWASP):
#: it is written with a leading apostrophe, which spreadsheets read as "text". Numbers are left alone.
_FORMULA_LEADS: Final = r"^[=+\-@\t\r]"


def sql_csv(r: SqlResult) -> str:
    """The rows as CSV with a header line; list and struct values as JSON text; text cells that a
    spreadsheet would run as a formula (``=``, ``+``, ``-``, ``@``, tab, CR first) escaped with a
    leading apostrophe."""
    flat = _flat(r.table)
    text = [name for name, dtype in flat.schema.items() if dtype == pl.String]
    escaped = flat.with_columns(
        pl.when(pl.col(c).str.contains(_FORMULA_LEADS)).then("'" + pl.col(c)).otherwise(pl.col(c)).alias(c)
        for c in text
    )
    return escaped.write_csv()


def sql_layout(schema: pl.Schema) -> Layout:
    """A query's table: numbers never cut, strings shown as names (cut in the middle last), lists
    and structs as wrapped text; the columns leave a narrow terminal from the last one back, the
    first (the query's key, most often) never."""
    def column(header: str, dtype: pl.DataType) -> Column:
        if dtype.is_numeric():
            return number(header)
        if dtype.is_nested():
            return text(header)
        return name(header) if dtype == pl.String else label(header)

    columns = tuple(column(printable(h), dtype) for h, dtype in schema.items())
    return Layout(columns, drop=tuple(c.header for c in reversed(columns[1:])))


def render_sql(r: SqlResult, top: int) -> RenderableType:
    """The first ``top`` rows; numbers as DuckDB gave them (times stay in ns), nulls dim."""
    shown = r.table.head(top)
    title = f"{r.table.height} row{'s' if r.table.height != 1 else ''}"
    caption = f"first {top}; --csv or --json for all" if r.table.height > top else None
    t = sql_layout(r.table.schema).table(title, caption)
    strings = [dtype == pl.String for dtype in r.table.schema.values()]
    for row in shown.iter_rows():
        t.add_row(*(("null" if v is None else str(v)) if is_string else _cell(v)
                    for v, is_string in zip(row, strings, strict=True)))
    return t


def parquet_bytes(frame: pl.DataFrame) -> bytes:
    """One table as a Parquet file's bytes (written by the caller, atomically)."""
    buffer = io.BytesIO()
    frame.write_parquet(buffer)
    return buffer.getvalue()


def _cell(value: Any) -> Text:
    from rich.text import Text

    if value is None:
        return Text("null", style="dim")
    if isinstance(value, float):
        return Text(f"{value:.6g}")
    if isinstance(value, (list, dict)):
        return Text(printable(_json_text(value) or ""))
    return Text(printable(str(value)))


def _flat(frame: pl.DataFrame) -> pl.DataFrame:
    """Nested columns (lists, structs, arrays) as JSON text: CSV holds only flat values."""
    nested = [name for name, dtype in frame.schema.items() if dtype.is_nested()]
    if not nested:
        return frame
    return frame.with_columns(
        pl.Series(name, [_json_text(v) for v in frame.get_column(name).to_list()], dtype=pl.String) for name in nested
    )


def _json_text(value: Any) -> str | None:
    """A nested value (list, struct, map) as compact JSON text."""
    return None if value is None else msgspec.json.encode(value).decode()
