from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracewhy.cli.base import Command, load_trace, positive_int
from tracewhy.cli.output import refuse_overwrite, refuse_special_output, write_output
from tracewhy.errors import UsageError
from tracewhy.findings.context import DiagnoseOptions
from tracewhy.findings.diagnose import Report, diagnose
from tracewhy.findings.overview import overview
from tracewhy.model.trace import Trace
from tracewhy.readers.registry import read_raw_events
from tracewhy.renderers.perfetto import render_perfetto


class ExportCommand(Command):
    """Annotated trace for Perfetto / chrome://tracing: the original events plus tracewhy's tracks.

    Adds GPU idle gaps named by class, findings as slices with their statement, a GPU
    utilization counter, annotation/NVTX ranges projected onto the GPU rows and the critical
    path of up to three steps as one track (a slice per stretch of it). Kineto input
    keeps every original event exactly as written; Nsight Systems input is written as a Chrome
    trace of the same content. Output is gzipped when its name ends in .gz.
    --parquet DIR writes the tables tracewhy sql queries, one Parquet file each, for other tools.
    """

    name = "export"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-o", "--output", metavar="FILE",
                            help="annotated trace (.json or .json.gz; - for standard output)")
        parser.add_argument("--parquet", metavar="DIR",
                            help="write the tables tracewhy sql queries as DIR/<table>.parquet (-o not needed)")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        if args.output is None:
            if args.parquet is None:
                raise UsageError("give -o FILE (the annotated trace), --parquet DIR (the tables), or both")
            return _export_parquet(args)
        out = Path(args.output)
        refuse_overwrite(out, Path(args.trace))
        refuse_special_output(out)  # before the work, not after it
        trace = load_trace(args.trace)
        ov = overview(trace, DiagnoseOptions(step_marker=args.step, warmup=args.warmup))
        source = read_raw_events(trace.meta.format, Path(args.trace))
        data = render_perfetto(ov, source, trace, gz=out.name.endswith(".gz"))
        write_output(out, data)
        if args.parquet is not None:
            _export_parquet(args, trace, ov.report)
        added = len(ov.report.findings)
        path = ov.critical_path
        sys.stderr.write(f"wrote {out} ({len(data):,} bytes): {ov.report.gaps.gaps.height} gaps, {added} findings, "
                         f"{ov.projection.height} projected ranges, utilization of {len(ov.device_pids)} GPU(s), "
                         f"critical path of {path.steps.height if path is not None else 0} step(s)\n")
        return 0


def _export_parquet(args: argparse.Namespace, trace: Trace | None = None, report: Report | None = None) -> int:
    """The SQL tables as Parquet files, from the diagnosis already made when there is one."""
    from tracewhy.cli.commands.sql import write_parquet_tables

    trace = trace if trace is not None else load_trace(args.trace)
    options = DiagnoseOptions(step_marker=args.step, warmup=args.warmup)
    report = report if report is not None else diagnose(trace, options)
    written = write_parquet_tables(trace, report, Path(args.parquet), Path(args.trace))
    sys.stderr.write(f"wrote {len(written)} tables to {args.parquet}: {', '.join(p.stem for p in written)}\n")
    return 0
