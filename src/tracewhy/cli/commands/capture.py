from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from tracewhy.cli.base import Command, emit
from tracewhy.errors import UsageError
from tracewhy.findings.playbook import ncu_command, nsys_command, shell
from tracewhy.renderers.capture import CapturePayload, capture_lines, capture_payload


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
        options, cmd = _split(args.rest)
        args.json = args.json or options.json
        if not cmd:
            raise UsageError("give the job to profile after --, e.g. tracewhy capture nsys -- python train.py")
        if args.tool == "ncu" and not options.kernel:
            raise UsageError("capture ncu needs --kernel REGEX (one kernel's launch; see tracewhy kernels TRACE)")
        if options.launch_skip < 0:
            raise UsageError("--launch-skip must be >= 0")
        if args.tool == "nsys":
            name = options.name or "run"
            profile = nsys_command(cmd, name)
            then = [f"tracewhy diagnose {name}_<RANK>.nsys-rep  (tracewhy exports it to SQLite once)"]
        else:
            name = options.name or "kernel"
            profile = ncu_command(cmd, options.kernel, options.launch_skip, name)
            then = [f"tracewhy roofline {name}.ncu-rep"]
        found = shutil.which(args.tool)
        if options.dry_run or found is None:
            why = "dry run" if options.dry_run else f"{args.tool} is not on PATH"
            payload = capture_payload(args.tool, profile, then, not_run_because=why)
            if args.json:
                emit(args, self.name, payload, lambda: "")
            else:
                print(capture_lines(payload))
            return 0
        print(f"tracewhy: running {shell(profile)}", file=sys.stderr)
        # Under --json the job's own output goes to stderr: stdout holds the one JSON document.
        done = subprocess.run(profile, check=False, stdout=2 if args.json else None)
        if done.returncode != 0:
            print(f"tracewhy: {args.tool} exited {done.returncode}; nothing to read", file=sys.stderr)
            if args.json:
                emit(args, self.name, capture_payload(args.tool, profile, [], exit_status=done.returncode),
                     lambda: "")
            return 1
        reports = _reports(args.tool, name)
        if args.json:
            emit(args, self.name, capture_payload(args.tool, profile, [_reader(args.tool, r) for r in reports],
                                                  exit_status=0, reports=[str(r) for r in reports]), lambda: "")
            return 0 if reports else 1
        return _read_results(args.tool, name, reports)


def _split(rest: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options before ``--`` and the job after it (argparse's REMAINDER would take the
    options as part of the job)."""
    if "--" in rest:
        cut = rest.index("--")
        before, cmd = rest[:cut], rest[cut + 1:]
    else:
        before, cmd = [], rest
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
    return options, cmd


def _reports(tool: str, name: str) -> list[Path]:
    """The reports the run wrote; none said on stderr."""
    if tool == "nsys":
        reports = sorted(Path().glob(f"{name}_*.nsys-rep")) or sorted(Path().glob(f"{name}*.nsys-rep"))
        if not reports:
            print(f"tracewhy: nsys wrote no {name}_*.nsys-rep here (did the job call "
                  "torch.cuda.profiler.start()? tracewhy.capture.profile does)", file=sys.stderr)
        return reports
    report = Path(f"{name}.ncu-rep")
    if not report.exists():
        print(f"tracewhy: ncu wrote no {report} (no launch matched the kernel regex?)", file=sys.stderr)
        return []
    return [report]


def _reader(tool: str, report: Path) -> str:
    """The tracewhy command that reads one report of ``tool``."""
    return shell(["tracewhy", "diagnose" if tool == "nsys" else "roofline", str(report)])


def _read_results(tool: str, name: str, reports: list[Path]) -> int:
    """Each report read by its command (diagnose, roofline), as if run after the capture."""
    from tracewhy.cli import main

    if not reports:
        return 1
    return max(main(["diagnose" if tool == "nsys" else "roofline", str(r)]) for r in reports)
