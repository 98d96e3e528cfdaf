from __future__ import annotations

import argparse
from pathlib import Path

from tracewhy.analyses.kernels import KERNELS_NEED, kernels
from tracewhy.cli.base import Command, add_output_options, emit, load_trace, warn
from tracewhy.renderers.terminal import KernelsNcuPayload, KernelsPayload, kernels_payload, render_kernels


class KernelsCommand(Command):
    """GPU kernel time per kernel name and per family (GEMM, attention, communication, ...)."""

    name = "kernels"
    json_payloads = (KernelsPayload, KernelsNcuPayload)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser)
        parser.add_argument("--ncu", metavar="REPORT",
                            help="join Nsight Compute verdicts (.ncu-rep or ncu CSV) onto the kernels by name")

    def run(self, args: argparse.Namespace) -> int:
        # Kernels only: on nsys input just the kernel table is read, as `nsys stats -r
        # cuda_gpu_kern_sum` does; the analysis refuses a Trace without kernels (Trace.require).
        r = kernels(load_trace(args.trace, kinds=KERNELS_NEED))
        if args.ncu:  # the roofline command's verdicts, matched to this trace's kernel names
            from rich.console import Group

            from tracewhy.findings.roofline import join_ncu, roofline
            from tracewhy.readers.registry import read_kernel_metrics
            from tracewhy.renderers.roofline import render_ncu_join

            ncu = read_kernel_metrics(Path(args.ncu))
            warn(args.ncu, ncu.warnings)
            joined = join_ncu(r.by_name, roofline(ncu))
            emit(args, self.name, kernels_payload(r, joined),
                 lambda: Group(render_kernels(r, args.top), render_ncu_join(joined, args.top)))
            return 0
        emit(args, self.name, kernels_payload(r), lambda: render_kernels(r, args.top))
        return 0
