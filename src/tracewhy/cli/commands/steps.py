from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.cli.throughput import add_decode_bytes_option, add_throughput_options, throughput_options
from tracewhy.renderers.steps import StepsSeveralPayload, StepsThroughputPayload, steps_output, steps_several_output
from tracewhy.reports.inputs import is_several
from tracewhy.reports.steps import StepsReportOptions, steps_report, steps_several


class StepsCommand(Command):
    """Steps (ProfilerStep#N or --step NAME): span, GPU work, steady-window p50/p90/p99.

    Several traces (files, or a directory of them): each one's table under a heading (a rank's
    when they are the ranks of one job), then the runs of the first's program compared with it.
    """

    name = "steps"
    takes_traces = True
    json_payloads = (StepsThroughputPayload, StepsSeveralPayload)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser, top=50)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")
        add_throughput_options(parser)
        add_decode_bytes_option(parser)

    def run(self, args: argparse.Namespace) -> int:
        options = StepsReportOptions(step_marker=args.step, warmup=args.warmup, rate=throughput_options(args),
                                     decode_bytes=args.decode_bytes)
        if is_several(args.trace):
            emit(args, self.name, *steps_several_output(steps_several(args.trace, options, loader()), args.top))
        else:
            emit(args, self.name, *steps_output(steps_report(args.trace[0], options, loader()), args.top))
        return 0
