from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.renderers.memory import MemoryPayload, SnapshotPayload, TimelinePayload, memory_output
from tracewhy.reports.memory import MemoryReportOptions, memory_report


class MemoryCommand(Command):
    """Memory: peak allocated/reserved with its step and op, the ledger at the peak, top allocating
    ops, churn and growth per step. Reads a profile_memory trace, a memory-timeline export or a
    CUDA memory snapshot (pickle, read without running it)."""

    name = "memory"
    json_payloads = (MemoryPayload, TimelinePayload, SnapshotPayload)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser, top=15)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        r = memory_report(args.trace, MemoryReportOptions(step_marker=args.step, warmup=args.warmup), loader())
        emit(args, self.name, *memory_output(r, args.top))
        return 0
