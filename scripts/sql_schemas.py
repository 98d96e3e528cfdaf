"""Print the reference of the tables ``tracewhy sql`` queries, as Markdown: each
table, what one row is, and its columns with their SQL types.

    python scripts/sql_schemas.py

Everything comes from ``tracewhy.analyses.sql`` (SQL_SCHEMAS, TABLE_ROWS), which declares the
tables from the model's and the analyses' schemas: the reference cannot drift from them.
"""

from __future__ import annotations

import polars as pl

from tracewhy.analyses.sql import SQL_SCHEMAS, TABLE_ROWS

#: The DuckDB type each polars dtype of the tables arrives as.
SQL_TYPES = {pl.Int64: "BIGINT", pl.Int32: "INTEGER", pl.Float64: "DOUBLE", pl.String: "VARCHAR",
             pl.Boolean: "BOOLEAN"}


def reference() -> str:
    lines = []
    for table, schema in SQL_SCHEMAS.items():
        columns = ", ".join(f"`{name}` {SQL_TYPES[type(dtype)]}" for name, dtype in schema.items())
        lines += [f"**{table}**: {TABLE_ROWS[table]}.", "", columns, ""]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(reference(), end="")
