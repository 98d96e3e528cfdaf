from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.errors import UsageError
from tracewhy.renderers.memory import MemoryPayload, SnapshotPayload, TimelinePayload, memory_output
from tracewhy.renderers.memory_compare import (
    MemoryGrowthPayload,
    MemoryRanksPayload,
    memory_growth_output,
    memory_ranks_output,
)
from tracewhy.reports.memory import MemoryReportOptions, memory_growth_report, memory_ranks_report, memory_report


class MemoryCommand(Command):
    """Memory: peak allocated/reserved with its step and op, the ledger at the peak, top allocating
    ops, churn and growth per step. Reads a profile_memory trace, a memory-timeline export or a
    CUDA memory snapshot (pickle, read without running it).

    Several traces or snapshots (or a directory of them), one per rank: each rank's peak, the
    highest against the median, and the allocation sites that differ between ranks (the rank from
    distributedInfo or the snapshot's device, else a 'rankN' in the file name).
    A --vs B: what grew from run A to run B of one program (peak, reserved against allocated, bytes
    live at the peak per allocation site), beyond the noise the runs' own steps show.
    """

    name = "memory"
    json_payloads = (MemoryPayload, TimelinePayload, SnapshotPayload, MemoryRanksPayload, MemoryGrowthPayload)
    takes_trace = False

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("trace", nargs="+", metavar="TRACE",
                            help="a profile_memory trace, memory-timeline export or CUDA memory snapshot; several "
                                 "(or a directory of them): one per rank")
        add_output_options(parser, top=15)
        parser.add_argument("--vs", dest="b", metavar="B", default=None,
                            help="compare with run B of the same program (a trace against a trace, a snapshot "
                                 "against a snapshot): what grew from TRACE to B")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        options = MemoryReportOptions(step_marker=args.step, warmup=args.warmup)
        paths: list[str] = args.trace
        if args.b is not None:
            if len(paths) != 1:
                raise UsageError("--vs compares one run with another: give one TRACE before --vs")
            growth = memory_growth_report(paths[0], args.b, options, loader())
            emit(args, self.name, *memory_growth_output(growth, args.top))
        elif len(paths) > 1 or _is_dir(paths[0]):
            ranks = memory_ranks_report(paths, options, loader())
            emit(args, self.name, *memory_ranks_output(ranks, args.top))
        else:
            r = memory_report(paths[0], options, loader())
            emit(args, self.name, *memory_output(r, args.top))
        return 0


def _is_dir(path: str) -> bool:
    from pathlib import Path

    return Path(path).is_dir()
