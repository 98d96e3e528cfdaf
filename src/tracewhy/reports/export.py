"""``export``: what the annotated trace and the Parquet tables are made of. For the annotated
trace (``-o``), the overview (the diagnosis and the views the report draws) and the trace's
events as its file holds them; for the tables (``--parquet``), the tables ``sql`` queries, from
the same diagnosis. Writing them is the CLI's; drawing the annotated trace is
``renderers/perfetto.py``'s."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath

from tracewhy.analyses.sql import SQL_TABLES, Builder
from tracewhy.findings.context import DiagnoseOptions
from tracewhy.model.raw_events import RawEvents
from tracewhy.model.trace import Trace
from tracewhy.reports.diagnose import Report, diagnose
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource
from tracewhy.reports.overview import ANNOTATED_TRACE_VIEWS, Overview, overview
from tracewhy.reports.sql import report_tables


@dataclass(frozen=True)
class ExportOptions:
    step_marker: str | None = None
    warmup: int | None = None
    #: The annotated trace is wanted (``-o``): the overview and the file's own events are made.
    annotated: bool = True


@dataclass(frozen=True)
class ExportReport:
    """``overview`` and ``raw_events`` (None: the trace is written from the model) for the
    annotated trace, None when it is not wanted; ``report``, the diagnosis the tables take their
    steps, gaps and findings from."""

    trace: Trace
    report: Report
    overview: Overview | None = None
    raw_events: RawEvents | None = None

    def tables(self) -> list[tuple[str, Builder]]:
        """Every SQL table, in ``sql``'s order, each built when called."""
        builders = report_tables(self.trace, lambda: self.report)
        return [(name, builders[name]) for name in SQL_TABLES]


def export_report(source: TraceSource, options: ExportOptions | None = None, loader: Loader = PLAIN) -> ExportReport:
    options = options or ExportOptions()
    trace = loader.trace(source)
    diagnose_options = DiagnoseOptions(step_marker=options.step_marker, warmup=options.warmup, fixes_together=False)
    if not options.annotated:
        return ExportReport(trace, diagnose(trace, diagnose_options))
    ov = overview(trace, diagnose_options, ANNOTATED_TRACE_VIEWS)
    raw = None
    if isinstance(source, (str, PurePath)):
        from tracewhy.readers.registry import read_raw_events

        raw = read_raw_events(trace.meta.format, Path(source))
    return ExportReport(trace, ov.report, ov, raw)
