from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.errors import UsageError
from tracewhy.renderers.critical_path import CriticalPathPayload, critical_path_payload, render_critical_path
from tracewhy.reports.critical_path import CriticalPathReportOptions, critical_path_report


class CriticalPathCommand(Command):
    """The critical path of each step: what it is made of (host ops, launches, kernels by family,
    communication, copies, syncs, idle), what lies on it, and what removing each item would save."""

    name = "critical-path"
    json_payloads = (CriticalPathPayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--window", metavar="START_NS:END_NS",
                            help="analyse this one window (trace timestamps in ns) instead of the steps")
        parser.add_argument("--gains", type=positive_int, default=CriticalPathReportOptions().gain_items, metavar="N",
                            help="per step, replay the N items with the most time on the path without them "
                                 "(default %(default)s)")

    def run(self, args: argparse.Namespace) -> int:
        window = _window(args.window) if args.window else None
        r = critical_path_report(args.trace, CriticalPathReportOptions(step_marker=args.step, gain_items=args.gains,
                                                                      window_ns=window), loader())
        emit(args, self.name, critical_path_payload(r), lambda: render_critical_path(r, args.top))
        return 0


def _window(text: str) -> tuple[int, int]:
    start, sep, end = text.partition(":")
    try:
        window = (int(start), int(end))
    except ValueError:
        window = (0, -1)
    if not sep or window[1] <= window[0]:
        raise UsageError(f"--window takes START_NS:END_NS with START_NS < END_NS, got {text!r}")
    return window
