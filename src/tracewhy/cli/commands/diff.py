from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.cli.throughput import add_throughput_options, throughput_options
from tracewhy.renderers.diff import DiffPayload, DiffThroughputPayload, diff_output
from tracewhy.reports.diff import DiffReportOptions, diff_report


class DiffCommand(Command):
    """Compare run B with run A: faster, slower or within noise, and what changed.

    Steady step times are compared with the Hodges-Lehmann shift and its exact rank-based
    confidence interval; ops, annotated blocks and kernels per steady step, largest change
    first; and what differs in devices, ranks and capture options (saying when the two runs
    are not comparable).
    """

    name = "diff"
    json_payloads = (DiffPayload, DiffThroughputPayload)
    takes_trace = False

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("a", metavar="A", help="baseline trace")
        parser.add_argument("b", metavar="B", help="trace to compare with the baseline")
        add_output_options(parser, top=10)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up in each run (default: a first step #0 or outlier)")
        add_throughput_options(parser)

    def run(self, args: argparse.Namespace) -> int:
        options = DiffReportOptions(step_marker=args.step, warmup=args.warmup, rate=throughput_options(args))
        report = diff_report(args.a, args.b, options, loader())
        emit(args, self.name, *diff_output(report, args.top))
        return 0
