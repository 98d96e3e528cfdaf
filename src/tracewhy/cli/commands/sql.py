from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tracewhy.analyses.sql import SQL_TABLES, Builder, Table, referenced_tables, run_query, sql_tables
from tracewhy.cli.base import Command, add_output_options, emit, flush_warnings, load_trace, positive_int
from tracewhy.cli.output import refuse_overwrite, write_output
from tracewhy.errors import UsageError
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.renderers.sql import SqlPayload, findings_table, parquet_bytes, render_sql, sql_csv, sql_payload

if TYPE_CHECKING:
    from tracewhy.model.trace import Trace
    from tracewhy.reports.diagnose import Report


class SqlCommand(Command):
    """Run a SQL query (DuckDB) over the trace's tables: slices, kernels, copies, ops, memory,
    steps, gaps, findings.

    Times are int64 ns (ts_ns, dur_ns), names plain strings; only the tables the query names are
    built. Example: tracewhy sql run.json.gz "SELECT family, count(*), sum(dur_ns) FROM kernels
    GROUP BY family ORDER BY 3 DESC". Needs the sql extra: pip install 'tracewhy[sql]'.
    """

    name = "sql"
    json_payloads = (SqlPayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("query", metavar="QUERY", help=f"SQL over the tables {', '.join(SQL_TABLES)}")
        add_output_options(parser, top=50)
        parser.add_argument("--csv", action="store_true", help="print every row as CSV instead of a table")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        if args.csv and args.json:
            raise UsageError("--csv and --json: choose one")
        wanted = referenced_tables(args.query)  # a bad query or a missing DuckDB fails before the read
        trace = load_trace(args.trace)
        options = DiagnoseOptions(step_marker=args.step, warmup=args.warmup)
        result = run_query(args.query, table_builders(trace, options, findings_wanted=Table.FINDINGS in wanted))
        if args.csv:
            flush_warnings()
            sys.stdout.write(sql_csv(result))
            return 0
        emit(args, self.name, sql_payload(result), lambda: render_sql(result, args.top))
        return 0


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


def write_parquet_tables(trace: Trace, report: Report, directory: Path, source: Path) -> list[Path]:
    """Every SQL table as ``DIRECTORY/<table>.parquet`` (``export --parquet``), each written
    atomically; the directory is made when absent."""
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{directory}: --parquet needs a directory, and this is a file")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{directory}: cannot make the directory ({e.strerror or e})") from None
    builders = report_tables(trace, lambda: report)
    written = []
    for name in SQL_TABLES:
        path = directory / f"{name}.parquet"
        refuse_overwrite(path, source)
        write_output(path, parquet_bytes(builders[name]()))
        written.append(path)
    return written
