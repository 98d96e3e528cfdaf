"""The commands that write files, as functions: ``report`` (the HTML report) and ``export`` (the
annotated trace for Perfetto, and the SQL tables as Parquet). Each computes what its command
computes (``reports/report.py``, ``reports/export.py``), has it drawn by the command's renderer,
writes it as the command does (``output_files.py``: never over the input, atomically) and returns
what it wrote, with what the files show."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tracewhy.api.tables import Reads, Sources, TraceLike, as_sources, handed_out
from tracewhy.model.trace import Trace
from tracewhy.reports.diagnose import Report
from tracewhy.reports.export import ExportOptions, export_report
from tracewhy.reports.inputs import TraceSource
from tracewhy.reports.overview import Overview
from tracewhy.reports.report import ReportContents, ReportOptions, report_contents, report_several
from tracewhy.rows import Rows


@dataclass(frozen=True)
class WrittenFile:
    """A file written: where, and its size."""

    path: str
    bytes: int


@dataclass(frozen=True)
class WrittenReport(Rows, rows="files", key="path"):
    """The HTML report written (``files``: the one file) and what it shows (``contents``: a
    trace's overview, the ranks compared, an ncu report's verdicts or a memory timeline)."""

    files: list[WrittenFile]
    contents: ReportContents


@dataclass(frozen=True)
class WrittenExport(Rows, rows="files", key="path"):
    """The files ``export`` wrote (the annotated trace first, then a Parquet file per table), the
    overview the annotated trace draws (None without one; without the op roofline, the MFU and
    the critical path's gains, which only the report draws) and the diagnosis the tables hold."""

    files: list[WrittenFile]
    overview: Overview | None
    report: Report


def report(trace: Sources, output: str | Path, *, step: str | None = None,
           warmup: int | None = None) -> WrittenReport:
    """Write the self-contained HTML report of ``trace`` (a trace, an ncu report or a
    memory-timeline export; several traces, a list or a directory of them: the ranks of one job
    compared, or each run's overview and the runs compared) to ``output`` (``tracewhy report -o``)."""
    from tracewhy.output_files import refuse_overwrite, refuse_special_output, write_output
    from tracewhy.renderers.html import render_html
    from tracewhy.renderers.jsonout import envelope
    from tracewhy.renderers.report import report_payload

    out = Path(output)
    sources = as_sources(trace)
    for source in sources:
        refuse_overwrite(out, _source_path(source))
    refuse_special_output(out)
    options = ReportOptions(step_marker=step, warmup=warmup)

    def make(reads: Reads) -> WrittenReport:
        contents = (report_contents(sources[0], options, reads.loader) if len(sources) == 1
                    else report_several(sources, options, reads.loader))
        page = render_html(envelope("report", report_payload(contents), reads.warnings)).encode()
        write_output(out, page)
        return WrittenReport([WrittenFile(str(out), len(page))], contents)

    return handed_out(sources[0] if len(sources) == 1 else None, make)


def export(trace: TraceLike, output: str | Path | None = None, *, parquet: str | Path | None = None,
           step: str | None = None, warmup: int | None = None) -> WrittenExport:
    """Write the annotated trace for Perfetto to ``output`` (``tracewhy export -o``; gzipped when
    its name ends in .gz) and/or the tables ``sql`` queries as ``parquet/TABLE.parquet``
    (``--parquet``)."""
    from tracewhy.output_files import refuse_overwrite, refuse_special_output, write_files, write_output
    from tracewhy.renderers.export import parquet_files
    from tracewhy.renderers.perfetto import render_perfetto

    if output is None and parquet is None:
        raise ValueError("give output (the annotated trace), parquet (a directory for the tables), or both")
    source = _source_path(trace)
    if output is not None:
        refuse_overwrite(Path(output), source)
        refuse_special_output(Path(output))

    def make(reads: Reads) -> WrittenExport:
        r = export_report(trace, ExportOptions(step_marker=step, warmup=warmup, annotated=output is not None),
                          reads.loader)
        files: list[WrittenFile] = []
        if r.overview is not None and output is not None:
            data = render_perfetto(r.overview, r.raw_events, r.trace, gz=Path(output).name.endswith(".gz"))
            write_output(Path(output), data)
            files.append(WrittenFile(str(output), len(data)))
        if parquet is not None:
            written = write_files(Path(parquet), parquet_files(r.tables()), source)
            files += [WrittenFile(str(p), p.stat().st_size) for p in written]
        return WrittenExport(files, r.overview, r.report)

    return handed_out(trace, make)


def _source_path(trace: TraceSource) -> Path:
    """The input's file, which an output may not overwrite."""
    return Path(trace.meta.path) if isinstance(trace, Trace) else Path(trace)
