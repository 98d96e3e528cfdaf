from __future__ import annotations

import argparse
import sys

from tracewhy.cli.base import Command, emit
from tracewhy.errors import UsageError
from tracewhy.renderers.capture import CapturePayload, capture_lines, capture_payload
from tracewhy.reports.capture import (
    CaptureOptions,
    capture_plan,
    profiler_on_path,
    reader_argv,
    reader_command,
    run_profiler,
    written_reports,
)


class CaptureCommand(Command):
    """Capture with Nsight Systems or Nsight Compute, then read the result.

    tracewhy capture nsys [--name N] -- python train.py ...   (then: diagnose on each report)
    tracewhy capture ncu --kernel REGEX [--launch-skip N] [--name N] -- python train.py ...
    (then: roofline). Without the tool on PATH, prints the exact commands and exits 0.
    --json prints the commands, and after a run the profiler's exit status and the reports it
    wrote with the commands that read them (the run's own output goes to stderr), as one document.
    """

    name = "capture"
    takes_trace = False
    json_payloads = (CapturePayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("tool", choices=("nsys", "ncu"), help="the profiler to run")
        parser.add_argument("rest", nargs=argparse.REMAINDER, metavar="[OPTIONS] -- CMD",
                            help="--name N (report name), --kernel REGEX and --launch-skip N (ncu), --dry-run, "
                                 "--json; then -- and the job to profile")
        parser.add_argument("--json", action="store_true", help="print versioned JSON instead of lines")

    def run(self, args: argparse.Namespace) -> int:
        options, job = _split(args.rest)
        args.json = args.json or options.json
        plan = capture_plan(CaptureOptions(args.tool, tuple(job), options.name, options.kernel, options.launch_skip))
        if options.dry_run or not profiler_on_path(plan):
            why = "dry run" if options.dry_run else f"{args.tool} is not on PATH"
            payload = capture_payload(args.tool, plan.profile, plan.then, not_run_because=why)
            if args.json:
                emit(args, self.name, payload, lambda: "")
            else:
                print(capture_lines(payload))
            return 0
        print(f"tracewhy: running {plan.profile_line}", file=sys.stderr)
        status = run_profiler(plan, job_output_to_stderr=args.json)
        if status != 0:
            print(f"tracewhy: {args.tool} exited {status}; nothing to read", file=sys.stderr)
            if args.json:
                emit(args, self.name, capture_payload(args.tool, plan.profile, [], exit_status=status), lambda: "")
            return 1
        reports, missing = written_reports(plan)
        if missing:
            print(f"tracewhy: {missing}", file=sys.stderr)
        if args.json:
            then = [reader_command(args.tool, r) for r in reports]
            emit(args, self.name, capture_payload(args.tool, plan.profile, then, exit_status=0,
                                                  reports=[str(r) for r in reports]), lambda: "")
            return 0 if reports else 1
        from tracewhy.cli import main  # each report read by its command, as if run after the capture

        return max((main(reader_argv(args.tool, r)) for r in reports), default=1)


def _split(rest: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options before ``--`` and the job after it (argparse's REMAINDER would take the
    options as part of the job)."""
    if "--" in rest:
        cut = rest.index("--")
        before, job = rest[:cut], rest[cut + 1:]
    else:
        before, job = [], rest
    p = argparse.ArgumentParser(prog="tracewhy capture TOOL", add_help=False, exit_on_error=False)
    p.add_argument("--name", default=None)
    p.add_argument("--kernel", default=None)
    p.add_argument("--launch-skip", type=int, default=0)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--json", action="store_true")
    try:
        options, unknown = p.parse_known_args(before)
    except argparse.ArgumentError as e:
        raise UsageError(f"capture: {e}") from None
    if unknown:
        raise UsageError(f"capture: unknown options {unknown}; put the job after --")
    return options, job
