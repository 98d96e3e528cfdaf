from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracewhy.cli.base import Command, emit, loader, positive_int, warnings_so_far
from tracewhy.errors import UsageError
from tracewhy.output_files import refuse_overwrite, refuse_special_output, write_output
from tracewhy.renderers.html import render_html
from tracewhy.renderers.jsonout import envelope
from tracewhy.renderers.report import ReportPayload, findings_count, report_payload
from tracewhy.renderers.report_inputs import (
    NcuReportPayload,
    RanksReportPayload,
    RunsReportPayload,
    TimelineReportPayload,
)
from tracewhy.reports.report import ReportOptions, report_contents, report_several


class ReportCommand(Command):
    """Self-contained HTML report: findings, step time, GPU utilization with gaps, tables.

    One file with everything inlined (no network, no CDN): findings first, the step-time chart
    (steady window, p50/p90/p99), GPU utilization over time with idle gaps coloured by class,
    the largest gaps with host activity, sortable operator and kernel tables, overlap and block
    attribution where present, the critical path of up to three steps (its composition per step,
    the kernel families on it and what shortening each item would save), and the shape-based
    roofline when shapes were recorded.
    With profile_memory, allocated and reserved memory over time per device with the peak and
    the ledger at it. TRACE may also be an Nsight Compute report (roofline scatter and kernel
    verdicts) or a memory-timeline export (its categories stacked over time).
    Several traces (files, or a directory of them): the ranks of one job (by their
    distributedInfo) give a rank-by-metric heatmap and the rank findings; other traces give one
    page with each one's report, after the runs of the first's program compared with it.
    --json prints the JSON report the page is made from.
    """

    name = "report"
    takes_traces = True
    json_payloads = (ReportPayload, RanksReportPayload, RunsReportPayload, NcuReportPayload, TimelineReportPayload)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-o", "--output", metavar="FILE", help="the HTML file to write (- for standard output)")
        parser.add_argument("--json", action="store_true", help="print the JSON report instead")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        if not args.json and not args.output:
            raise UsageError("give -o FILE for the HTML report, or --json")
        if not args.json:
            for source in args.trace:
                refuse_overwrite(Path(args.output), Path(source))
            refuse_special_output(Path(args.output))
        options = ReportOptions(step_marker=args.step, warmup=args.warmup)
        contents = (report_contents(args.trace[0], options, loader()) if len(args.trace) == 1
                    else report_several(args.trace, options, loader()))
        payload = report_payload(contents)
        if args.json:
            emit(args, self.name, payload, lambda: "")
            return 0
        out = Path(args.output)
        html = render_html(envelope(self.name, payload, warnings_so_far())).encode()
        write_output(out, html)
        sys.stderr.write(f"wrote {out} ({len(html):,} bytes, {findings_count(payload)} findings)\n")
        return 0
