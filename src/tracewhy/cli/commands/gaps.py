from __future__ import annotations

import argparse

from tracewhy.analyses.gaps import CLASSES, GapsOptions, gaps
from tracewhy.analyses.steps import StepsOptions, steps
from tracewhy.cli.base import Command, add_output_options, emit, load_trace, positive_int
from tracewhy.model.schema import Col
from tracewhy.renderers.diagnose import GapsPayload, gap_rows, gaps_payload, render_gaps


class GapsCommand(Command):
    """The largest GPU idle gaps, each with its class and what the host was doing at that moment."""

    name = "gaps"
    json_payloads = (GapsPayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--class", dest="gap_class", choices=CLASSES, help="only gaps of this class")
        parser.add_argument("--min-gap", type=positive_int, default=GapsOptions().min_gap_ns, metavar="NS",
                            help="shortest gap listed, in ns (default %(default)s)")

    def run(self, args: argparse.Namespace) -> int:
        trace = load_trace(args.trace)
        result = gaps(trace, steps(trace, StepsOptions(marker=args.step)), GapsOptions(args.min_gap))
        origin = trace.slices.get_column(Col.TS).min() if trace.slices.height else None  # the trace start
        origin_ns = int(origin) if origin is not None else None  # type: ignore[arg-type]
        emit(args, self.name, gaps_payload(result, origin_ns, args.gap_class),
             lambda: render_gaps(gap_rows(result, origin_ns, args.gap_class), result.per_step, args.top))
        return 0
