from __future__ import annotations

import argparse

from tracewhy.analyses.kernels import kernels
from tracewhy.cli.base import Command, add_output_options, emit, load_trace
from tracewhy.renderers.terminal import render_kernels


class KernelsCommand(Command):
    """GPU kernel time per kernel name and per family (GEMM, attention, communication, ...)."""

    name = "kernels"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser)

    def run(self, args: argparse.Namespace) -> int:
        r = kernels(load_trace(args.trace))
        payload = {
            "total_count": r.total_count,
            "total_time_ns": r.total_time_ns,
            "kernels": r.by_name,
            "families": r.by_family,
        }
        emit(args, self.name, payload, render_kernels(r, args.top))
        return 0
