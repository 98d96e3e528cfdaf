from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, add_output_options, emit, loader
from tracewhy.renderers.info import InfoPayload, info_payload, render_info
from tracewhy.reports.info import InfoReportOptions, info_report


class InfoCommand(Command):
    """What a trace is: format, versions, devices, rank, capture options, event counts, steps, span."""

    name = "info"
    json_payloads = (InfoPayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser, top=None)
        parser.add_argument("--step", metavar="NAME", help="count steps marked by this annotation")

    def run(self, args: argparse.Namespace) -> int:
        result = info_report(args.trace, InfoReportOptions(step_marker=args.step), loader())
        emit(args, self.name, info_payload(result), lambda: render_info(result))
        return 0
