from __future__ import annotations

import argparse
from pathlib import Path

from tracewhy.cli.base import Command, add_output_options, emit, loader
from tracewhy.renderers.ops import OpsByShapesPayload, OpsPayload, ops_payload, render_ops
from tracewhy.reports.ops import OPS_SORT_KEYS, OpsReportOptions, ops_report


class OpsCommand(Command):
    """Per operator: calls, CPU total and self time, GPU time of the work it launched. With --logs
    (TORCH_TRACE or TORCH_LOGS=output_code of the same run) each compiled kernel is a row of its
    own, named with the source line that has the largest share of it."""

    name = "ops"
    json_payloads = (OpsPayload, OpsByShapesPayload)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser)
        parser.add_argument("--shapes", action="store_true",
                            help="one row per operator and input shapes (needs record_shapes)")
        parser.add_argument("--sort", choices=OPS_SORT_KEYS, default=None,
                            help="sort key (default: gpu_self_ns, or cpu_self_ns on CPU-only traces)")
        parser.add_argument("--logs", type=Path, metavar="PATH",
                            help="TORCH_TRACE directory or TORCH_LOGS=output_code capture of the same run: "
                                 "compiled kernels as rows, with their source lines")

    def run(self, args: argparse.Namespace) -> int:
        r = ops_report(args.trace, OpsReportOptions(by_shapes=args.shapes, sort_by=args.sort, logs=args.logs),
                       loader())
        emit(args, self.name, ops_payload(r), lambda: render_ops(r, args.top))
        return 0
