from __future__ import annotations

import argparse
import sys

from tracewhy.cli.base import Command, add_output_options, emit, loader
from tracewhy.renderers.nvtx import NvtxPayload, empty_note, nvtx_payload, render_nvtx
from tracewhy.reports.nvtx import nvtx_report


class NvtxCommand(Command):
    """Per NVTX range name: time as nsys nvtx_sum, GPU projection as nvtx_gpu_proj_sum (Kineto: annotations).

    On Kineto input the ranges are the user annotations (record_function scopes, ProfilerStep#N).
    """

    name = "nvtx"
    json_payloads = (NvtxPayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser)

    def run(self, args: argparse.Namespace) -> int:
        r = nvtx_report(args.trace, loader())
        note = empty_note(r, args.trace)
        if note and not getattr(args, "json", False):
            sys.stdout.write(note + "\n")
            return 0
        emit(args, self.name, nvtx_payload(r, args.trace), lambda: render_nvtx(r, args.top))
        return 0
