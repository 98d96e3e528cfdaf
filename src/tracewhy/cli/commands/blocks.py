from __future__ import annotations

import argparse

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.renderers.blocks import BlocksPayload, LogBlocksPayload, blocks_output
from tracewhy.reports.blocks import LOG_WARMUP, BlocksReportOptions, blocks_report


class BlocksCommand(Command):
    """Which annotated block gates the step: GPU time per step of each record_function block.

    A block owns the GPU work launched while it was on the launching thread's stack; work other
    threads launched while it was open (autograd's backward thread) is shown apart. Says when a
    synchronize ends most blocks: then the times are attribution, not throughput.

    Given an instrument log (tracewhy.instrument's JSON Lines, a file or a directory of rank
    logs), reads its block timers instead: per rank and block, the time per step (or chunk) over
    the steady window, p50/p90/p99 and the share of the rank's top-level blocks.
    """

    name = "blocks"
    json_payloads = (BlocksPayload, LogBlocksPayload)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser, top=30)
        parser.add_argument("--names", metavar="A,B,C", default="",
                            help="only these blocks (comma-separated names; shell wildcards allowed)")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier; "
                                 f"instrument logs: the first {LOG_WARMUP} step or chunk of each rank)")

    def run(self, args: argparse.Namespace) -> int:
        names = tuple(n.strip() for n in args.names.split(",") if n.strip())
        options = BlocksReportOptions(names=names, step_marker=args.step, warmup=args.warmup)
        emit(args, self.name, *blocks_output(blocks_report(args.trace, options, loader()), args.top))
        return 0
