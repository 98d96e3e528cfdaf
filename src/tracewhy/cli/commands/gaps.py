from __future__ import annotations

import argparse

import polars as pl

from tracewhy.analyses.gaps import CLASSES, GapsOptions, gaps
from tracewhy.analyses.steps import StepsOptions, steps
from tracewhy.cli.base import Command, add_output_options, emit, load_trace, positive_int
from tracewhy.renderers.diagnose import render_gaps


class GapsCommand(Command):
    """The largest GPU idle gaps, each with its class and what the host was doing at that moment."""

    name = "gaps"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--class", dest="gap_class", choices=CLASSES, help="only gaps of this class")
        parser.add_argument("--min-gap", type=positive_int, default=GapsOptions().min_gap_ns, metavar="NS",
                            help="shortest gap listed, in ns (default %(default)s)")

    def run(self, args: argparse.Namespace) -> int:
        trace = load_trace(args.trace)
        result = gaps(trace, steps(trace, StepsOptions(marker=args.step)), GapsOptions(args.min_gap))
        table = result.gaps.sort("dur_ns", descending=True)
        if args.gap_class:
            table = table.filter(pl.col("gap_class") == args.gap_class)
        payload = {"min_gap_ns": result.min_gap_ns, "gaps": table, "per_step": result.per_step}
        emit(args, self.name, payload, render_gaps(table, result.per_step, args.top))
        return 0
