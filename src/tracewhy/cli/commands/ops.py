from __future__ import annotations

import argparse

from tracewhy.analyses.ops import SORT_KEYS, OpsOptions, ops
from tracewhy.cli.base import Command, add_output_options, emit, load_trace
from tracewhy.renderers.terminal import OpsByShapesPayload, OpsPayload, ops_payload, render_ops


class OpsCommand(Command):
    """Per operator: calls, CPU total and self time, GPU time of the work it launched."""

    name = "ops"
    json_payloads = (OpsPayload, OpsByShapesPayload)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser)
        parser.add_argument("--shapes", action="store_true",
                            help="one row per operator and input shapes (needs record_shapes)")
        parser.add_argument("--sort", choices=SORT_KEYS, default=None,
                            help="sort key (default: gpu_self_ns, or cpu_self_ns on CPU-only traces)")

    def run(self, args: argparse.Namespace) -> int:
        r = ops(load_trace(args.trace), OpsOptions(by_shapes=args.shapes, sort_by=args.sort))
        emit(args, self.name, ops_payload(r), lambda: render_ops(r, args.top))
        return 0
