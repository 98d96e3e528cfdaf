from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, emit
from tracewhy.renderers.which import WhichPayload, render_which, which_payload
from tracewhy.reports.which import which_report


class WhichCommand(Command):
    """Which tool to run first for a symptom, with the exact capture command and what to look for.

    Give words of the symptom ("gaps", "one rank slow", "memory grows", "graph breaks") or
    nothing to list every entry. diagnose's next steps use the same table.
    """

    name = "which"
    json_payloads = (WhichPayload,)
    takes_trace = False

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("symptom", nargs="*", metavar="SYMPTOM", help="words of the symptom")
        parser.add_argument("--json", action="store_true", help="print versioned JSON instead of tables")

    def run(self, args: argparse.Namespace) -> int:
        found = which_report(args.symptom).answers
        emit(args, self.name, which_payload(args.symptom, found), lambda: render_which(args.symptom, found))
        return 0 if found else 1
