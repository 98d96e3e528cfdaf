"""``sql``: a SQL query (DuckDB) over a trace's tables, and the tables themselves: each built only
when a query names it, steps, gaps and findings from one diagnosis when the findings are asked
for. ``export --parquet`` writes the same tables (``report_tables``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import polars as pl

from tracewhy.analyses.sql import (
    SQL_SCHEMAS,
    SQL_TABLES,
    Builder,
    FindingCol,
    SqlResult,
    Table,
    referenced_tables,
    run_query,
    sql_tables,
)
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.findings.model import Finding
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource

if TYPE_CHECKING:
    from tracewhy.model.trace import Trace
    from tracewhy.reports.diagnose import Report

#: The tables a query may name, in the order they are listed.
TABLES: Final = SQL_TABLES


@dataclass(frozen=True)
class SqlReportOptions:
    step_marker: str | None = None
    warmup: int | None = None


def sql_report(trace: TraceSource, query: str, options: SqlReportOptions | None = None,
               loader: Loader = PLAIN) -> SqlResult:
    """The rows of ``query`` over ``trace``'s tables. A bad query, or a missing DuckDB, fails
    before the trace is read."""
    options = options or SqlReportOptions()
    wanted = referenced_tables(query)
    t = loader.trace(trace)
    diagnose_options = DiagnoseOptions(step_marker=options.step_marker, warmup=options.warmup, fixes_together=False)
    return run_query(query, table_builders(t, diagnose_options, findings_wanted=Table.FINDINGS in wanted))


def table_builders(trace: Trace, options: DiagnoseOptions, findings_wanted: bool) -> dict[str, Builder]:
    """Each table's builder. With the findings wanted, steps and gaps are the diagnosis' own, so
    the tables agree and none is measured twice; without, no diagnosis runs, and its rules are
    not even imported."""

    def diagnosis() -> Report:
        from tracewhy.reports.diagnose import diagnose

        return diagnose(trace, options)

    if findings_wanted:
        return report_tables(trace, functools.cache(diagnosis))
    ctx = Context(trace, options)
    return sql_tables(trace, steps=ctx.steps, gaps=ctx.gaps, findings=lambda: findings_table(diagnosis().findings))


def report_tables(trace: Trace, report: Callable[[], Report]) -> dict[str, Builder]:
    """Each table's builder, steps, gaps and findings taken from one diagnosis."""
    return sql_tables(trace, steps=lambda: report().steps, gaps=lambda: report().gaps,
                      findings=lambda: findings_table(report().findings))


def findings_table(findings: list[Finding]) -> pl.DataFrame:
    """The findings table: one row per finding, in ``diagnose``'s order (``rank`` 1 first)."""
    return pl.DataFrame(
        {
            FindingCol.RANK: list(range(1, len(findings) + 1)),
            FindingCol.CODE: [f.code.value for f in findings],
            FindingCol.SEVERITY: [f.severity.value for f in findings],
            FindingCol.STATEMENT: [f.statement for f in findings],
            FindingCol.RECOVERABLE: [f.recoverable_ns_per_step for f in findings],
            FindingCol.NEXT_STEP: [f.next_step for f in findings],
        },
        schema=SQL_SCHEMAS[Table.FINDINGS],
    )
