from __future__ import annotations

import argparse

from tracewhy.analyses.steps import StepsOptions, steps
from tracewhy.analyses.throughput import from_step_stats
from tracewhy.cli.base import Command, add_output_options, emit, load_trace, positive_int
from tracewhy.cli.throughput import add_throughput_options, throughput_options
from tracewhy.renderers.terminal import StepsThroughputPayload, render_steps, steps_payload
from tracewhy.renderers.throughput import with_throughput


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
        rate = throughput_options(args)
        r = steps(load_trace(args.trace), StepsOptions(marker=args.step, warmup=args.warmup))
        t = from_step_stats(r.stats, rate) if rate is not None else None
        emit(args, self.name, *with_throughput(steps_payload(r), lambda: render_steps(r, args.top), rate, t))
        return 0
