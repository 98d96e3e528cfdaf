from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.renderers.overlap import OverlapPayload, overlap_payload, render_overlap
from tracewhy.reports.overlap import OverlapReportOptions, overlap_report


class OverlapCommand(Command):
    """Is the overlap real: compute, communication (hidden/exposed), copies and idle per GPU and step.

    Exposed communication is communication with no compute kernel running beside it: it is on
    the critical path. Also lists the collectives by exposed time and how many streams ran at once.
    """

    name = "overlap"
    json_payloads = (OverlapPayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        r = overlap_report(args.trace, OverlapReportOptions(step_marker=args.step, warmup=args.warmup), loader())
        emit(args, self.name, overlap_payload(r.result, r.findings), lambda: render_overlap(r.result, r.findings,
                                                                                           args.top))
        return 0
