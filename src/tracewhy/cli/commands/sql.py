from __future__ import annotations

import argparse
import sys

from tracewhy.cli.base import Command, add_output_options, emit, flush_warnings, loader, positive_int
from tracewhy.errors import UsageError
from tracewhy.renderers.sql import SqlPayload, render_sql, sql_csv, sql_payload
from tracewhy.reports.sql import TABLES, SqlReportOptions, sql_report


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
        parser.add_argument("query", metavar="QUERY", help=f"SQL over the tables {', '.join(TABLES)}")
        add_output_options(parser, top=50)
        parser.add_argument("--csv", action="store_true", help="print every row as CSV instead of a table")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        if args.csv and args.json:
            raise UsageError("--csv and --json: choose one")
        result = sql_report(args.trace, args.query, SqlReportOptions(step_marker=args.step, warmup=args.warmup),
                            loader())
        if args.csv:
            flush_warnings()
            sys.stdout.write(sql_csv(result))
            return 0
        emit(args, self.name, sql_payload(result), lambda: render_sql(result, args.top))
        return 0
