from __future__ import annotations

import argparse

from tracewhy.analyses.diff import DiffOptions
from tracewhy.cli.base import Command, add_output_options, emit, load_trace, positive_int
from tracewhy.findings import thresholds as th
from tracewhy.findings.compare import compare
from tracewhy.renderers.compare import comparison_payload, render_comparison


class DiffCommand(Command):
    """Compare run B with run A: faster, slower or within noise, and what changed.

    Steady step times are compared with the Hodges-Lehmann shift and its exact rank-based
    confidence interval; ops, annotated blocks and kernels per steady step, largest change
    first; and what differs in devices, ranks and capture options (saying when the two runs
    are not comparable).
    """

    name = "diff"
    takes_trace = False

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("a", metavar="A", help="baseline trace")
        parser.add_argument("b", metavar="B", help="trace to compare with the baseline")
        add_output_options(parser, top=10)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up in each run (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        options = DiffOptions(step_marker=args.step, warmup=args.warmup, confidence=th.DIFF_CONFIDENCE)
        c = compare(load_trace(args.a), load_trace(args.b), options)
        emit(args, self.name, comparison_payload(c), render_comparison(c, args.top))
        return 0
