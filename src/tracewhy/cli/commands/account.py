from __future__ import annotations

import argparse
from pathlib import Path

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.cli.throughput import add_decode_bytes_option
from tracewhy.renderers.account import AccountInferencePayload, account_payload, render_account
from tracewhy.reports.account import AccountReportOptions, account_report


class AccountCommand(Command):
    """Where the step goes: each steady step's critical path split into named parts that add up
    to the step (kernels by family, copies, communication, launch overhead, syncs, idle, data
    loading, compilation, host work by line or op), each essential or avoidable, with the items
    behind it."""

    name = "account"
    json_payloads = (AccountInferencePayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")
        parser.add_argument("--max-steps", type=positive_int, default=AccountReportOptions().max_steps, metavar="N",
                            help="analyse at most N steady steps, spread over the run (default %(default)s)")
        parser.add_argument("--logs", type=Path, metavar="PATH",
                            help="TORCH_TRACE directory or TORCH_LOGS=output_code capture of the same run: a "
                                 "compiled kernel's host time is a part named by its source line")
        add_decode_bytes_option(parser)

    def run(self, args: argparse.Namespace) -> int:
        r = account_report(args.trace, AccountReportOptions(step_marker=args.step, warmup=args.warmup,
                                                            max_steps=args.max_steps, logs=args.logs,
                                                            decode_bytes=args.decode_bytes), loader())
        emit(args, self.name, account_payload(r), lambda: render_account(r, args.top))
        return 0
