from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracewhy.cli.base import Command, emit, loader, positive_int
from tracewhy.errors import UsageError
from tracewhy.output_files import STDOUT, refuse_overwrite, refuse_special_output, write_files, write_output
from tracewhy.renderers.export import (
    ExportedTables,
    ExportedTrace,
    ExportPayload,
    exported_tables,
    exported_tables_line,
    exported_trace,
    exported_trace_line,
    parquet_files,
)
from tracewhy.renderers.perfetto import render_perfetto
from tracewhy.reports.export import ExportOptions, ExportReport, export_report


class ExportCommand(Command):
    """Annotated trace for Perfetto / chrome://tracing: the original events plus tracewhy's tracks.

    Adds GPU idle gaps named by class, findings as slices with their statement, a GPU
    utilization counter, annotation/NVTX ranges projected onto the GPU rows and the critical
    path of up to three steps as one track (a slice per stretch of it). Kineto input
    keeps every original event exactly as written; Nsight Systems input is written as a Chrome
    trace of the same content. Output is gzipped when its name ends in .gz.
    --parquet DIR writes the tables tracewhy sql queries, one Parquet file each, for other tools.
    --json prints what was written (and where) as JSON.
    """

    name = "export"
    json_payloads = (ExportPayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-o", "--output", metavar="FILE",
                            help="annotated trace (.json or .json.gz; - for standard output)")
        parser.add_argument("--parquet", metavar="DIR",
                            help="write the tables tracewhy sql queries as DIR/<table>.parquet (-o not needed)")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")
        parser.add_argument("--json", action="store_true", help="print what was written as versioned JSON")

    def run(self, args: argparse.Namespace) -> int:
        if args.output is None and args.parquet is None:
            raise UsageError("give -o FILE (the annotated trace), --parquet DIR (the tables), or both")
        if args.output is not None and args.json and args.output == STDOUT:
            raise UsageError("-o - writes the trace to standard output, and --json its own document: choose one")
        if args.output is not None:
            refuse_overwrite(Path(args.output), Path(args.trace))
            refuse_special_output(Path(args.output))  # before the work, not after it
        r = export_report(args.trace, ExportOptions(step_marker=args.step, warmup=args.warmup,
                                                    annotated=args.output is not None), loader())
        written: ExportedTrace | None = None
        if r.overview is not None:
            out = Path(args.output)
            data = render_perfetto(r.overview, r.raw_events, r.trace, gz=out.name.endswith(".gz"))
            write_output(out, data)
            written = exported_trace(r.overview, str(out), len(data))
        tables = self._parquet(args, r) if args.parquet is not None else None
        if written is not None:
            sys.stderr.write(exported_trace_line(written))
        if args.json:  # (without it the lines on stderr said it)
            emit(args, self.name, ExportPayload(trace=written, parquet=tables), lambda: "")
        return 0

    def _parquet(self, args: argparse.Namespace, r: ExportReport) -> ExportedTables:
        written = write_files(Path(args.parquet), parquet_files(r.tables()), Path(args.trace))
        tables = exported_tables(args.parquet, written)
        sys.stderr.write(exported_tables_line(tables))
        return tables
