from __future__ import annotations

import argparse
from pathlib import Path

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.renderers.compile import CompileLogsPayload, CompilePayload, compile_payload, render_compile
from tracewhy.reports.compile import CompileReportOptions, compile_report


class CompileCommand(Command):
    """torch.compile: compiled regions, graph breaks, recompiles and compile time per step, the
    cold start, and (with --logs) each break's reason and each recompile's failed guard from a
    TORCH_LOGS="graph_breaks,recompiles" capture or a TORCH_TRACE directory (which adds every
    compile's time by phase and cache results, and the ranks whose compiles differ)."""

    name = "compile"
    json_payloads = (CompilePayload, CompileLogsPayload)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser, top=50)
        parser.add_argument("--logs", type=Path, metavar="FILE|DIR",
                            help='stderr of the run with TORCH_LOGS="graph_breaks,recompiles" (plain or .gz), '
                                 "or the directory TORCH_TRACE named (one log per rank)")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        r = compile_report(args.trace, CompileReportOptions(step_marker=args.step, warmup=args.warmup,
                                                            torch_logs=args.logs), loader())
        emit(args, self.name, compile_payload(r.result, r.logs, r.findings),
             lambda: render_compile(r.result, r.logs, r.findings, args.top))
        return 0
