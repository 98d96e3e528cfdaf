from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, add_output_options, emit, loader
from tracewhy.renderers.roofline import NcuPayload, NcuRunsPayload, roofline_output
from tracewhy.renderers.roofline_ops import OpRooflinePayload
from tracewhy.reports.roofline import RooflineReportOptions, roofline_report


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
        r = roofline_report(args.report, RooflineReportOptions(device=args.device), loader())
        emit(args, self.name, *roofline_output(r, args.top, args.launches))
        return 0
