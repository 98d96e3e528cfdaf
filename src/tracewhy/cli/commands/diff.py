from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from tracewhy.analyses.diff import DiffOptions
from tracewhy.analyses.throughput import from_durations
from tracewhy.cli.base import Command, add_output_options, emit, load_trace, positive_int
from tracewhy.cli.throughput import add_throughput_options, throughput_options
from tracewhy.findings import thresholds as th
from tracewhy.findings.compare import compare
from tracewhy.renderers.compare import DiffPayload, DiffThroughputPayload, comparison_payload, render_comparison
from tracewhy.renderers.throughput import with_throughput_change


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
        options = DiffOptions(step_marker=args.step, warmup=args.warmup, confidence=th.DIFF_CONFIDENCE)
        rate = throughput_options(args)
        c = compare(load_trace(args.a), load_trace(args.b), options)
        payload: Mapping[str, Any]
        payload, view = comparison_payload(c), lambda: render_comparison(c, args.top)
        if rate is not None:
            a, b = (from_durations(d, rate) for d in (c.diff.a_step_durations_ns, c.diff.b_step_durations_ns))
            payload, view = with_throughput_change(payload, view, rate, a, b, after=c.statement)
        emit(args, self.name, payload, view)
        return 0
