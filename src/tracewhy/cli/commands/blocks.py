from __future__ import annotations

import argparse
from pathlib import Path

from tracewhy.analyses.blocks import BlocksOptions, blocks
from tracewhy.analyses.log_blocks import DEFAULT_LOG_WARMUP, LogBlocksOptions, log_blocks
from tracewhy.cli.base import Command, add_output_options, emit, load_trace, positive_int, warn
from tracewhy.errors import UsageError
from tracewhy.findings.blocks import attribution, log_attribution, log_synchronized, synchronized_blocks
from tracewhy.readers.registry import InputKind, detect, read_stage_logs
from tracewhy.renderers.log_blocks import LogBlocksPayload, log_blocks_payload, render_log_blocks
from tracewhy.renderers.overlap import BlocksPayload, blocks_payload, render_blocks


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
                                 f"instrument logs: the first {DEFAULT_LOG_WARMUP} step or chunk of each rank)")

    def run(self, args: argparse.Namespace) -> int:
        names = tuple(n.strip() for n in args.names.split(",") if n.strip())
        if detect(Path(args.trace), (InputKind.STAGE_LOGS,)) is not None:
            return self._run_log(args, names)
        r = blocks(load_trace(args.trace), BlocksOptions(names=names, step_marker=args.step, warmup=args.warmup))
        found = [f for f in (synchronized_blocks(r), attribution(r)) if f is not None]
        emit(args, self.name, blocks_payload(r, found), lambda: render_blocks(r, found, args.top))
        return 0

    def _run_log(self, args: argparse.Namespace, names: tuple[str, ...]) -> int:
        if args.step:
            raise UsageError("--step names a trace's step annotation; an instrument log's blocks carry their step")
        log = read_stage_logs([Path(args.trace)])
        warn(log.source, log.warnings)
        warmup = DEFAULT_LOG_WARMUP if args.warmup is None else args.warmup
        r = log_blocks(log, LogBlocksOptions(names=names, warmup=warmup))
        found = [f for f in (log_synchronized(r), log_attribution(r)) if f is not None]
        emit(args, self.name, log_blocks_payload(r, found), lambda: render_log_blocks(r, found, args.top))
        return 0
