from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.renderers.gaps import GapsPayload, gap_rows, gaps_payload, render_gaps
from tracewhy.reports.gaps import GAP_CLASSES, GapsReportOptions, gaps_report


class GapsCommand(Command):
    """The largest GPU idle gaps, each with its class and what the host was doing at that moment."""

    name = "gaps"
    json_payloads = (GapsPayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--class", dest="gap_class", choices=GAP_CLASSES, help="only gaps of this class")
        parser.add_argument("--min-gap", type=positive_int, default=GapsReportOptions().min_gap_ns, metavar="NS",
                            help="shortest gap listed, in ns (default %(default)s)")

    def run(self, args: argparse.Namespace) -> int:
        r = gaps_report(args.trace, GapsReportOptions(step_marker=args.step, min_gap_ns=args.min_gap), loader())
        emit(args, self.name, gaps_payload(r.result, r.origin_ns, args.gap_class),
             lambda: render_gaps(gap_rows(r.result, r.origin_ns, args.gap_class), r.result.per_step, args.top))
        return 0
