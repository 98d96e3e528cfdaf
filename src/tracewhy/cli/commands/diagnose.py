from __future__ import annotations

import argparse
from pathlib import Path

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.cli.throughput import add_throughput_options, throughput_options
from tracewhy.renderers.diagnose import DiagnoseThroughputPayload, diagnose_output
from tracewhy.reports.diagnose import DiagnoseReportOptions, diagnose_report


class DiagnoseCommand(Command):
    """Ranked findings: why this job is slower than it should be, each with evidence and the next step."""

    name = "diagnose"
    json_payloads = (DiagnoseThroughputPayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser, top=None)
        parser.add_argument("--top", type=positive_int, default=None, metavar="N",
                            help="findings to show (default all); --json has them all")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")
        parser.add_argument("--min-gap", type=positive_int, default=DiagnoseReportOptions().min_gap_ns, metavar="NS",
                            help="shortest GPU idle gap counted, in ns (default %(default)s)")
        parser.add_argument("--logs", type=Path, metavar="FILE",
                            help='stderr of the run with TORCH_LOGS="graph_breaks,recompiles" (plain or .gz): '
                                 "names each graph break's reason and each recompile's failed guard")
        add_throughput_options(parser)

    def run(self, args: argparse.Namespace) -> int:
        options = DiagnoseReportOptions(step_marker=args.step, warmup=args.warmup, min_gap_ns=args.min_gap,
                                        torch_logs=args.logs, rate=throughput_options(args))
        emit(args, self.name, *diagnose_output(diagnose_report(args.trace, options, loader()), args.top))
        return 0
