from __future__ import annotations

import argparse
from pathlib import Path

from tracewhy.analyses.compile import compile_analysis
from tracewhy.analyses.steps import StepsOptions, steps
from tracewhy.cli.base import Command, add_output_options, emit, load_trace, positive_int, warn
from tracewhy.findings.compile import compile_findings
from tracewhy.readers.registry import read_compile_logs
from tracewhy.renderers.compile import CompileLogsPayload, CompilePayload, compile_payload, render_compile


class CompileCommand(Command):
    """torch.compile: compiled regions, graph breaks, recompiles and compile time per step, the
    cold start, and (with --logs) each break's reason and each recompile's failed guard from a
    TORCH_LOGS="graph_breaks,recompiles" capture."""

    name = "compile"
    json_payloads = (CompilePayload, CompileLogsPayload)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser, top=50)
        parser.add_argument("--logs", type=Path, metavar="FILE",
                            help='stderr of the run with TORCH_LOGS="graph_breaks,recompiles" (plain or .gz)')
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        logs = read_compile_logs(args.logs) if args.logs is not None else None
        if logs is not None and logs.warnings:
            warn(args.logs, logs.warnings)
        trace = load_trace(args.trace)
        st = steps(trace, StepsOptions(marker=args.step, warmup=args.warmup))
        result = compile_analysis(trace, st)
        found = compile_findings(result, st.stats.p50_ns if st.stats else None, logs)
        emit(args, self.name, compile_payload(result, logs, found),
             lambda: render_compile(result, logs, found, args.top))
        return 0
