from __future__ import annotations

import argparse

from tracewhy.analyses.steps import StepsOptions, steps
from tracewhy.cli.base import Command, add_output_options, emit, load_trace, positive_int
from tracewhy.renderers.terminal import render_steps, steps_payload


class StepsCommand(Command):
    """Steps (ProfilerStep#N or --step NAME): span, GPU work, steady-window p50/p90/p99."""

    name = "steps"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser, top=50)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        r = steps(load_trace(args.trace), StepsOptions(marker=args.step, warmup=args.warmup))
        emit(args, self.name, steps_payload(r), render_steps(r, args.top))
        return 0
