from __future__ import annotations

import argparse
import sys

from tracewhy.cli.base import Command, emit, flush_warnings, loader, positive_int
from tracewhy.cli.throughput import add_throughput_options, items_and_unit
from tracewhy.renderers.check import (
    CheckPayload,
    CheckSeveralPayload,
    check_lines,
    check_payload,
    check_several_lines,
    check_several_payload,
    several_passed,
)
from tracewhy.reports.check import CheckReportOptions, check_report, check_several
from tracewhy.reports.check_metrics import METRICS
from tracewhy.reports.inputs import is_several

#: Exit code when a threshold is violated (tracewhy.cli documents the codes).
EXIT_VIOLATION = 1
#: How each unit's limit is written, for the options' help.
_EXAMPLES = {"share": "PCT", "duration": "TIME", "count": "N", "bytes": "SIZE", "rate": "N/s"}


class CheckCommand(Command):
    """CI gate: exit 1 when a threshold is violated, printing one line per violation.

    Thresholds come from options (--max-gpu-idle 20%, --max-step-p50 120ms, ...) or from
    [tool.tracewhy.check] in a pyproject.toml (--config FILE, else the nearest pyproject.toml
    above the current directory); options win. --baseline A also fails when the step time
    regressed significantly against trace A (the test of `tracewhy diff`).

    Several traces (files, or a directory of them): each is checked against the same limits (a
    rank's lines under its heading when they are the ranks of one job); the gate fails when any
    trace fails, and the last line names them.
    """

    name = "check"
    takes_traces = True
    json_payloads = (CheckPayload, CheckSeveralPayload)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="print versioned JSON instead of lines")
        parser.add_argument("--config", metavar="FILE", help="pyproject.toml holding [tool.tracewhy.check]")
        parser.add_argument("--baseline", metavar="TRACE", help="fail on a significant step-time regression vs TRACE")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")
        parser.add_argument("--allow-unmeasured", action="store_true", default=None,
                            help="pass a threshold the trace cannot measure (default: it fails)")
        parser.add_argument("--allow-partial", action="store_true", default=None,
                            help="check a trace that lacks events (cut file, events still open, tables skipped); "
                                 "by default it fails as partial-trace")
        add_throughput_options(parser)
        for metric in METRICS.values():
            for bound in metric.bounds:
                parser.add_argument(f"--{bound}-{metric.name}", metavar=_EXAMPLES[metric.unit],
                                    dest=f"limit:{bound}-{metric.name}", help=f"{bound} {metric.help}")

    def run(self, args: argparse.Namespace) -> int:
        limits = {k.removeprefix("limit:"): v for k, v in vars(args).items()
                  if k.startswith("limit:") and v is not None}
        items_per_step, unit = items_and_unit(args)
        options = CheckReportOptions(
            limits=limits, config=args.config, baseline=args.baseline, step_marker=args.step, warmup=args.warmup,
            allow_unmeasured=args.allow_unmeasured, allow_partial=args.allow_partial,
            items_per_step=items_per_step, unit=unit)
        if is_several(args.trace):
            several = check_several(args.trace, options, loader())
            payload, lines, passed = check_several_payload(several), check_several_lines(several), \
                several_passed(several)
        else:
            report = check_report(args.trace[0], options, loader())
            payload, lines, passed = check_payload(report), check_lines(report), report.passed
        if args.json:
            emit(args, self.name, payload, lambda: "")
        else:  # plain lines, never wrapped: CI logs are grepped line by line
            flush_warnings()
            sys.stdout.write("".join(line + "\n" for line in lines))
        return 0 if passed else EXIT_VIOLATION
