from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracewhy.cli.base import Command, load_trace, positive_int
from tracewhy.cli.commands.export import write_atomically
from tracewhy.errors import UsageError
from tracewhy.findings.context import DiagnoseOptions
from tracewhy.findings.overview import overview
from tracewhy.renderers.html import render_html, report_json


class ReportCommand(Command):
    """Self-contained HTML report: findings, step time, GPU utilization with gaps, tables.

    One file with everything inlined (no network, no CDN): findings first, the step-time chart
    (steady window, p50/p90/p99), GPU utilization over time with idle gaps coloured by class,
    the largest gaps with host activity, sortable operator and kernel tables, overlap and block
    attribution where present, and the shape-based roofline when shapes were recorded.
    --json prints the JSON report the page is made from.
    """

    name = "report"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-o", "--output", metavar="FILE", help="the HTML file to write")
        parser.add_argument("--json", action="store_true", help="print the JSON report instead")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default 1 when there are 3 or more)")

    def run(self, args: argparse.Namespace) -> int:
        if not args.json and not args.output:
            raise UsageError("give -o FILE for the HTML report, or --json")
        ov = overview(load_trace(args.trace), DiagnoseOptions(step_marker=args.step, warmup=args.warmup))
        if args.json:
            sys.stdout.write(report_json(ov).decode() + "\n")
            return 0
        out = Path(args.output)
        html = render_html(ov).encode()
        write_atomically(out, html)
        sys.stderr.write(f"wrote {out} ({len(html):,} bytes, {len(ov.report.findings)} findings)\n")
        return 0
