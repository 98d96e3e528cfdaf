from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.renderers.gaps import GapsPayload, GapsSeveralPayload, gaps_output, gaps_several_output
from tracewhy.reports.gaps import GAP_CLASSES, GapsReportOptions, gaps_report, gaps_several
from tracewhy.reports.inputs import is_several


class GapsCommand(Command):
    """The largest GPU idle gaps, each with its class and what the host was doing at that moment.

    Several traces (files, or a directory of them): each one's gaps under a heading (a rank's
    when they are the ranks of one job), then the runs of the first's program compared with it.
    """

    name = "gaps"
    takes_traces = True
    json_payloads = (GapsPayload, GapsSeveralPayload)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--class", dest="gap_class", choices=GAP_CLASSES, help="only gaps of this class")
        parser.add_argument("--min-gap", type=positive_int, default=GapsReportOptions().min_gap_ns, metavar="NS",
                            help="shortest gap listed, in ns (default %(default)s)")

    def run(self, args: argparse.Namespace) -> int:
        options = GapsReportOptions(step_marker=args.step, min_gap_ns=args.min_gap)
        if is_several(args.trace):
            several = gaps_several(args.trace, options, loader())
            emit(args, self.name, *gaps_several_output(several, args.gap_class, args.top))
        else:
            emit(args, self.name, *gaps_output(gaps_report(args.trace[0], options, loader()), args.gap_class, args.top))
        return 0
