from __future__ import annotations

import argparse
from pathlib import Path

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.cli.throughput import add_decode_bytes_option, add_throughput_options, throughput_options
from tracewhy.renderers.diagnose import (
    DiagnoseSeveralPayload,
    DiagnoseThroughputPayload,
    diagnose_output,
    diagnose_several_output,
)
from tracewhy.reports.diagnose import DiagnoseReportOptions, diagnose_report, diagnose_several
from tracewhy.reports.inputs import is_several


class DiagnoseCommand(Command):
    """Ranked findings: why this job is slower than it should be, each with evidence and the next step.

    Several traces (files, or a directory of them): the ranks of one job (their distributedInfo:
    one world size and backend, distinct ranks, steps in common) give the cross-rank findings,
    the diagnosis of the rank that sets the pace and a line per other rank; other traces are
    diagnosed one after another, and the runs of the first's program (the same step marker and
    mostly the same op, kernel and annotation names) are compared with it, as tracewhy diff does.
    """

    name = "diagnose"
    takes_traces = True
    json_payloads = (DiagnoseThroughputPayload, DiagnoseSeveralPayload)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser, top=None)
        parser.add_argument("--top", type=positive_int, default=None, metavar="N",
                            help="findings to show (default all); --json has them all")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")
        parser.add_argument("--min-gap", type=positive_int, default=DiagnoseReportOptions().min_gap_ns, metavar="NS",
                            help="shortest GPU idle gap counted, in ns (default %(default)s)")
        parser.add_argument("--logs", type=Path, metavar="FILE|DIR",
                            help='stderr of the run with TORCH_LOGS="graph_breaks,recompiles" (plain or .gz), or '
                                 "the directory TORCH_TRACE named: names each graph break's reason and each "
                                 "recompile's failed guard")
        add_throughput_options(parser)
        add_decode_bytes_option(parser)

    def run(self, args: argparse.Namespace) -> int:
        options = DiagnoseReportOptions(step_marker=args.step, warmup=args.warmup, min_gap_ns=args.min_gap,
                                        torch_logs=args.logs, rate=throughput_options(args),
                                        decode_bytes=args.decode_bytes)
        if is_several(args.trace):
            emit(args, self.name, *diagnose_several_output(diagnose_several(args.trace, options, loader()), args.top))
        else:
            emit(args, self.name, *diagnose_output(diagnose_report(args.trace[0], options, loader()), args.top))
        return 0
