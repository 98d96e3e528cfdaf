from __future__ import annotations

import argparse

from tracewhy.analyses.overlap import OverlapOptions, overlap
from tracewhy.cli.base import Command, add_output_options, emit, load_trace, positive_int
from tracewhy.findings.overlap import exposed_comm_findings
from tracewhy.renderers.overlap import OverlapPayload, overlap_payload, render_overlap


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
        r = overlap(load_trace(args.trace), OverlapOptions(step_marker=args.step, warmup=args.warmup))
        found = exposed_comm_findings(r)
        emit(args, self.name, overlap_payload(r, found), lambda: render_overlap(r, found, args.top))
        return 0
