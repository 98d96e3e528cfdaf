from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, add_output_options, emit, load_trace, positive_int
from tracewhy.findings.context import DiagnoseOptions
from tracewhy.findings.diagnose import diagnose
from tracewhy.renderers.diagnose import diagnose_payload, render_diagnose


class DiagnoseCommand(Command):
    """Ranked findings: why this job is slower than it should be, each with evidence and the next step."""

    name = "diagnose"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser, top=None)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")
        parser.add_argument("--min-gap", type=positive_int, default=DiagnoseOptions().min_gap_ns, metavar="NS",
                            help="shortest GPU idle gap counted, in ns (default %(default)s)")

    def run(self, args: argparse.Namespace) -> int:
        report = diagnose(load_trace(args.trace),
                          DiagnoseOptions(step_marker=args.step, warmup=args.warmup, min_gap_ns=args.min_gap))
        emit(args, self.name, diagnose_payload(report), render_diagnose(report))
        return 0
