from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.cli.throughput import add_throughput_options, throughput_options
from tracewhy.renderers.steps import StepsThroughputPayload, steps_output
from tracewhy.reports.steps import StepsReportOptions, steps_report


class StepsCommand(Command):
    """Steps (ProfilerStep#N or --step NAME): span, GPU work, steady-window p50/p90/p99."""

    name = "steps"
    json_payloads = (StepsThroughputPayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser, top=50)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")
        add_throughput_options(parser)

    def run(self, args: argparse.Namespace) -> int:
        options = StepsReportOptions(step_marker=args.step, warmup=args.warmup, rate=throughput_options(args))
        emit(args, self.name, *steps_output(steps_report(args.trace, options, loader()), args.top))
        return 0
