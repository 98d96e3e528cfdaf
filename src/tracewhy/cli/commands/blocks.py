from __future__ import annotations

import argparse

from tracewhy.analyses.blocks import BlocksOptions, blocks
from tracewhy.cli.base import Command, add_output_options, emit, load_trace, positive_int
from tracewhy.findings.blocks import attribution, synchronized_blocks
from tracewhy.renderers.overlap import blocks_payload, render_blocks


class BlocksCommand(Command):
    """Which annotated block gates the step: GPU time per step of each record_function block.

    A block owns the GPU work launched while it was on the launching thread's stack; work other
    threads launched while it was open (autograd's backward thread) is shown apart. Says when a
    synchronize ends most blocks: then the times are attribution, not throughput.
    """

    name = "blocks"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser, top=30)
        parser.add_argument("--names", metavar="A,B,C", default="",
                            help="only these blocks (comma-separated names; shell wildcards allowed)")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        names = tuple(n.strip() for n in args.names.split(",") if n.strip())
        r = blocks(load_trace(args.trace), BlocksOptions(names=names, step_marker=args.step, warmup=args.warmup))
        found = [f for f in (synchronized_blocks(r), attribution(r)) if f is not None]
        emit(args, self.name, blocks_payload(r, found), render_blocks(r, found, args.top))
        return 0
