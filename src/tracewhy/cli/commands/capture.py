from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from tracewhy.cli.base import Command
from tracewhy.errors import UsageError
from tracewhy.findings.playbook import ncu_command, nsys_command, shell


class CaptureCommand(Command):
    """Capture with Nsight Systems or Nsight Compute, then read the result.

    tracewhy capture nsys [--name N] -- python train.py ...   (then: diagnose on each report)
    tracewhy capture ncu --kernel REGEX [--launch-skip N] [--name N] -- python train.py ...
    (then: roofline). Without the tool on PATH, prints the exact commands and exits 0.
    """

    name = "capture"
    takes_trace = False

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("tool", choices=("nsys", "ncu"), help="the profiler to run")
        parser.add_argument("rest", nargs=argparse.REMAINDER, metavar="[OPTIONS] -- CMD",
                            help="--name N (report name), --kernel REGEX and --launch-skip N (ncu), --dry-run; "
                                 "then -- and the job to profile")

    def run(self, args: argparse.Namespace) -> int:
        options, cmd = _split(args.rest)
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
            print(f"# {why}: run these where {args.tool} is installed\n{shell(profile)}\n" +
                  "\n".join(f"{t}" for t in then))
            return 0
        print(f"tracewhy: running {shell(profile)}", file=sys.stderr)
        done = subprocess.run(profile, check=False)
        if done.returncode != 0:
            print(f"tracewhy: {args.tool} exited {done.returncode}; nothing to read", file=sys.stderr)
            return 1
        return _read_results(args.tool, name)


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
    try:
        options, unknown = p.parse_known_args(before)
    except argparse.ArgumentError as e:
        raise UsageError(f"capture: {e}") from None
    if unknown:
        raise UsageError(f"capture: unknown options {unknown}; put the job after --")
    return options, cmd


def _read_results(tool: str, name: str) -> int:
    from tracewhy.cli import main

    if tool == "nsys":
        reports = sorted(Path().glob(f"{name}_*.nsys-rep")) or sorted(Path().glob(f"{name}*.nsys-rep"))
        if not reports:
            print(f"tracewhy: nsys wrote no {name}_*.nsys-rep here (did the job call "
                  "torch.cuda.profiler.start()? tracewhy.capture.profile does)", file=sys.stderr)
            return 1
        return max(main(["diagnose", str(r)]) for r in reports)
    report = Path(f"{name}.ncu-rep")
    if not report.exists():
        print(f"tracewhy: ncu wrote no {report} (no launch matched the kernel regex?)", file=sys.stderr)
        return 1
    return main(["roofline", str(report)])
