from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, add_output_options, emit, loader
from tracewhy.renderers.kernels import KernelsNcuPayload, KernelsPayload, kernels_output
from tracewhy.reports.kernels import KernelsReportOptions, kernels_report


class KernelsCommand(Command):
    """GPU kernel time per kernel name and per family (GEMM, attention, communication, ...)."""

    name = "kernels"
    json_payloads = (KernelsPayload, KernelsNcuPayload)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser)
        parser.add_argument("--ncu", metavar="REPORT",
                            help="join Nsight Compute verdicts (.ncu-rep or ncu CSV) onto the kernels by name")

    def run(self, args: argparse.Namespace) -> int:
        emit(args, self.name, *kernels_output(kernels_report(args.trace, KernelsReportOptions(ncu=args.ncu),
                                                             loader()), args.top))
        return 0
