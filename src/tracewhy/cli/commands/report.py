from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracewhy.analyses.memory import analyze_timeline
from tracewhy.cli.base import Command, emit, load_trace, loader, positive_int, warn, warnings_so_far
from tracewhy.cli.output import refuse_overwrite, refuse_special_output, write_output
from tracewhy.errors import UsageError
from tracewhy.findings.context import DiagnoseOptions
from tracewhy.findings.roofline import roofline
from tracewhy.readers.registry import InputKind, detect, read_kernel_metrics, read_memory_timeline
from tracewhy.renderers.html import render_html
from tracewhy.renderers.jsonout import envelope
from tracewhy.renderers.report import (
    NcuReportPayload,
    RanksReportPayload,
    ReportPayload,
    TimelineReportPayload,
    memory_timeline_report_payload,
    ncu_report_payload,
    overview_payload,
    ranks_report_payload,
)
from tracewhy.reports.overview import overview


class ReportCommand(Command):
    """Self-contained HTML report: findings, step time, GPU utilization with gaps, tables.

    One file with everything inlined (no network, no CDN): findings first, the step-time chart
    (steady window, p50/p90/p99), GPU utilization over time with idle gaps coloured by class,
    the largest gaps with host activity, sortable operator and kernel tables, overlap and block
    attribution where present, the critical path of up to three steps (its composition per step,
    the kernel families on it and what shortening each item would save), and the shape-based
    roofline when shapes were recorded.
    With profile_memory, allocated and reserved memory over time per device with the peak and
    the ledger at it. TRACE may also be a directory of rank traces (a rank-by-metric heatmap and
    the rank findings), an Nsight Compute report (roofline scatter and kernel verdicts) or a
    memory-timeline export (its categories stacked over time).
    --json prints the JSON report the page is made from.
    """

    name = "report"
    json_payloads = (ReportPayload, RanksReportPayload, NcuReportPayload, TimelineReportPayload)

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
            refuse_overwrite(Path(args.output), Path(args.trace))
            refuse_special_output(Path(args.output))
        payload = self._payload(args)
        if args.json:
            emit(args, self.name, payload, lambda: "")
            return 0
        out = Path(args.output)
        html = render_html(envelope(self.name, payload, warnings_so_far())).encode()
        write_output(out, html)
        sys.stderr.write(f"wrote {out} ({len(html):,} bytes, {len(payload['findings'])} findings)\n")
        return 0

    def _payload(self, args: argparse.Namespace
                 ) -> ReportPayload | RanksReportPayload | NcuReportPayload | TimelineReportPayload:
        path = Path(args.trace)
        if path.is_dir():  # one trace per rank (the ranks modules are imported for this case only)
            from tracewhy.reports.ranks import RanksReportOptions, ranks_report, trace_files

            files = trace_files([args.trace])
            ranks = ranks_report(files, RanksReportOptions(step_marker=args.step, warmup=args.warmup), loader=loader())
            return ranks_report_payload(ranks.result, ranks.findings, args.trace)
        fmt = detect(path, (InputKind.KERNEL_METRICS, InputKind.MEMORY_TIMELINE))
        if fmt is not None and fmt.kind is InputKind.KERNEL_METRICS:
            report = read_kernel_metrics(path, fmt)
            warn(path, report.warnings)
            return ncu_report_payload(roofline(report))
        if fmt is not None:
            tl = read_memory_timeline(path, fmt)
            return memory_timeline_report_payload(analyze_timeline(tl), args.trace, tl.layout.value)
        ov = overview(load_trace(args.trace), DiagnoseOptions(step_marker=args.step, warmup=args.warmup))
        return overview_payload(ov)
