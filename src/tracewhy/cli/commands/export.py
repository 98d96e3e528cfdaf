from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracewhy.cli.base import Command, emit, load_trace, positive_int
from tracewhy.cli.output import STDOUT, refuse_overwrite, refuse_special_output, write_output
from tracewhy.errors import UsageError
from tracewhy.findings.context import DiagnoseOptions
from tracewhy.model.trace import Trace
from tracewhy.readers.registry import read_raw_events
from tracewhy.renderers.export import ExportedTables, ExportedTrace, ExportPayload
from tracewhy.renderers.perfetto import render_perfetto
from tracewhy.reports.diagnose import Report, diagnose
from tracewhy.reports.overview import overview


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
        if args.output is None:
            if args.parquet is None:
                raise UsageError("give -o FILE (the annotated trace), --parquet DIR (the tables), or both")
            _emit(args, None, _export_parquet(args))
            return 0
        if args.json and args.output == STDOUT:
            raise UsageError("-o - writes the trace to standard output, and --json its own document: choose one")
        out = Path(args.output)
        refuse_overwrite(out, Path(args.trace))
        refuse_special_output(out)  # before the work, not after it
        trace = load_trace(args.trace)
        ov = overview(trace, DiagnoseOptions(step_marker=args.step, warmup=args.warmup))
        source = read_raw_events(trace.meta.format, Path(args.trace))
        data = render_perfetto(ov, source, trace, gz=out.name.endswith(".gz"))
        write_output(out, data)
        tables = _export_parquet(args, trace, ov.report) if args.parquet is not None else None
        path = ov.critical_path
        written: ExportedTrace = {
            "path": str(out), "bytes": len(data), "gaps": ov.report.gaps.gaps.height,
            "findings": len(ov.report.findings), "projected_ranges": ov.projection.height,
            "gpus": len(ov.device_pids), "critical_path_steps": path.steps.height if path is not None else 0,
        }
        sys.stderr.write(f"wrote {out} ({written['bytes']:,} bytes): {written['gaps']} gaps, "
                         f"{written['findings']} findings, {written['projected_ranges']} projected ranges, "
                         f"utilization of {written['gpus']} GPU(s), critical path of "
                         f"{written['critical_path_steps']} step(s)\n")
        _emit(args, written, tables)
        return 0


def _emit(args: argparse.Namespace, trace: ExportedTrace | None, tables: ExportedTables | None) -> None:
    """With --json, what was written; without it the lines on stderr said it."""
    if args.json:
        emit(args, ExportCommand.name, ExportPayload(trace=trace, parquet=tables), lambda: "")


def _export_parquet(args: argparse.Namespace, trace: Trace | None = None,
                    report: Report | None = None) -> ExportedTables:
    """The SQL tables as Parquet files, from the diagnosis already made when there is one."""
    from tracewhy.cli.commands.sql import write_parquet_tables

    trace = trace if trace is not None else load_trace(args.trace)
    options = DiagnoseOptions(step_marker=args.step, warmup=args.warmup)
    report = report if report is not None else diagnose(trace, options)
    written = write_parquet_tables(trace, report, Path(args.parquet), Path(args.trace))
    sys.stderr.write(f"wrote {len(written)} tables to {args.parquet}: {', '.join(p.stem for p in written)}\n")
    return {"directory": str(args.parquet), "tables": [p.stem for p in written], "files": [str(p) for p in written]}
