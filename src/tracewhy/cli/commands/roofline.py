from __future__ import annotations

import argparse
from pathlib import Path

from tracewhy.analyses.roofline import RooflineOptions
from tracewhy.analyses.roofline_ops import OpRooflineOptions
from tracewhy.cli.base import Command, add_output_options, emit, load_trace, warn
from tracewhy.errors import TraceError
from tracewhy.findings.roofline import op_roofline, roofline
from tracewhy.readers.registry import InputKind, detect, read_kernel_metrics, suffixes
from tracewhy.renderers.roofline import (
    NcuPayload,
    NcuRunsPayload,
    OpRooflinePayload,
    ncu_payload,
    ncu_runs_payload,
    op_roofline_payload,
    render_ncu_roofline,
    render_ncu_runs,
    render_op_roofline,
)


class RooflineCommand(Command):
    """Why is this kernel slow: roofline bound and reasons per kernel (ncu) or per op (shapes).

    Give it an Nsight Compute report (.ncu-rep, or a CSV from ncu --csv / ncu --import X
    --csv --page details|raw) for per-kernel verdicts: memory-, compute- or latency-bound,
    with throughput vs peak, occupancy limiter, stalls, spills, coalescing and ncu's own
    rules. A CSV holding several ncu runs (exports appended into one file) is shown run by run.
    Give it a PyTorch profiler trace captured with record_shapes=True for a first
    roofline of each operator from its input shapes.
    """

    name = "roofline"
    json_payloads = (NcuPayload, NcuRunsPayload, OpRooflinePayload)
    takes_trace = False

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("report", metavar="REPORT_OR_TRACE",
                            help=".ncu-rep, ncu CSV export, or Kineto trace (.json/.json.gz)")
        add_output_options(parser)
        parser.add_argument("--device", metavar="NAME",
                            help="GPU for the peak table when the input does not name one (e.g. 'H100 SXM')")
        parser.add_argument("--launches", action="store_true",
                            help="ncu: one row per launch instead of per kernel name")

    def run(self, args: argparse.Namespace) -> int:
        path = Path(args.report)
        if not path.exists():
            raise TraceError(path, "no such file")
        timeline = detect(path, (InputKind.TIMELINE,))
        if timeline is not None and timeline.operator_shapes:
            ops = op_roofline(load_trace(args.report), OpRooflineOptions(device=args.device))
            emit(args, self.name, op_roofline_payload(ops), lambda: render_op_roofline(ops, args.top))
            return 0
        metrics = detect(path, (InputKind.KERNEL_METRICS,))
        if metrics is None and path.suffix not in suffixes(InputKind.KERNEL_METRICS):
            raise TraceError(path, "not a PyTorch profiler trace, an .ncu-rep report or an ncu CSV export")
        report = read_kernel_metrics(path, metrics)
        # What the reader skipped or reinterpreted: on stderr (emit prints it before the table,
        # also with --json), and the same lines under "warnings" in the JSON, as for traces.
        warn(path, report.warnings)
        options = RooflineOptions(device=args.device)
        if len(report.runs) > 1:
            runs = [(run, roofline(report.run_report(run.index), options)) for run in report.runs]
            emit(args, self.name, ncu_runs_payload(report.path, runs),
                 lambda: render_ncu_runs(runs, args.top, args.launches, report.warnings))
            return 0
        result = roofline(report, options)
        emit(args, self.name, ncu_payload(result),
             lambda: render_ncu_roofline(result, args.top, args.launches, report.warnings))
        return 0
