"""The Python API: one function per CLI command, with the command's defaults, calling the
command's report (``reports/``, which the CLI calls too) and returning its typed result.

Every result is sized, iterable over its main rows and indexable (``tracewhy.rows``); every table
in it holds names as plain strings and times from the trace start (``api/tables.py``). The
functions live by what they take: one trace (``trace_commands``), other or several inputs
(``input_commands``), and a file to write (``file_commands``). ``capture`` stays a command beside
``tracewhy.capture.profile`` (it runs a profiler over a job), and ``mcp`` is the server that hands
these commands to agents.
"""

from __future__ import annotations

from tracewhy.api.file_commands import WrittenExport, WrittenFile, WrittenReport, export, report
from tracewhy.api.input_commands import check, diff, pipeline, ranks, roofline, schema, which
from tracewhy.api.results import Diagnosis, Diff, Steps
from tracewhy.api.tables import RAW_SUFFIX, TIME_COLUMNS, TraceLike, public, slices, time_origin_ns, to_pandas
from tracewhy.api.trace_commands import (
    NSYS_STATS_REPORTS,
    account,
    blocks,
    compile,
    critical_path,
    diagnose,
    gaps,
    info,
    kernels,
    lines,
    memory,
    nsys_stats,
    nvtx,
    ops,
    overlap,
    sql,
    steps,
)

__all__ = [
    "NSYS_STATS_REPORTS", "RAW_SUFFIX", "TIME_COLUMNS", "Diagnosis", "Diff", "Steps", "TraceLike", "WrittenExport",
    "WrittenFile", "WrittenReport", "account", "blocks", "check", "compile", "critical_path", "diagnose", "diff",
    "export", "gaps", "info", "kernels", "lines", "memory", "nsys_stats", "nvtx", "ops", "overlap", "pipeline",
    "public", "ranks", "report", "roofline", "schema", "slices", "sql", "steps", "time_origin_ns", "to_pandas",
    "which",
]
