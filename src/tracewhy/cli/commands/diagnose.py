from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from tracewhy.analyses.throughput import from_step_stats
from tracewhy.cli.base import Command, add_output_options, emit, load_trace, positive_int, warn
from tracewhy.cli.throughput import add_throughput_options, throughput_options
from tracewhy.findings.context import DiagnoseOptions
from tracewhy.findings.diagnose import diagnose
from tracewhy.renderers.diagnose import DiagnoseThroughputPayload, diagnose_payload, render_diagnose
from tracewhy.renderers.throughput import with_throughput

if TYPE_CHECKING:
    from tracewhy.model.torch_logs import TorchLogs


class DiagnoseCommand(Command):
    """Ranked findings: why this job is slower than it should be, each with evidence and the next step."""

    name = "diagnose"
    json_payloads = (DiagnoseThroughputPayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser, top=None)
        parser.add_argument("--top", type=positive_int, default=None, metavar="N",
                            help="findings to show (default all); --json has them all")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")
        parser.add_argument("--min-gap", type=positive_int, default=DiagnoseOptions().min_gap_ns, metavar="NS",
                            help="shortest GPU idle gap counted, in ns (default %(default)s)")
        parser.add_argument("--logs", type=Path, metavar="FILE",
                            help='stderr of the run with TORCH_LOGS="graph_breaks,recompiles" (plain or .gz): '
                                 "names each graph break's reason and each recompile's failed guard")
        add_throughput_options(parser)

    def run(self, args: argparse.Namespace) -> int:
        rate = throughput_options(args)
        logs = _torch_logs(args.logs)
        report = diagnose(load_trace(args.trace),
                          DiagnoseOptions(step_marker=args.step, warmup=args.warmup, min_gap_ns=args.min_gap,
                                          torch_logs=logs))
        t = from_step_stats(report.steps.stats, rate) if rate is not None else None
        payload, view = with_throughput(diagnose_payload(report), lambda: render_diagnose(report, args.top), rate, t)
        emit(args, self.name, payload, view)
        return 0


def _torch_logs(path: Path | None) -> TorchLogs | None:
    """The TORCH_LOGS capture of ``--logs``, its lines not understood said as warnings."""
    if path is None:
        return None
    from tracewhy.readers.registry import read_compile_logs  # (only with --logs)

    logs = read_compile_logs(path)
    if logs.warnings:
        warn(path, logs.warnings)
    return logs
