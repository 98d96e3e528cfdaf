"""``capture``: the profiler command that captures what tracewhy reads (Nsight Systems over the
steps between ``torch.cuda.profiler.start()`` and ``stop()``, or Nsight Compute on one launch of
one kernel, as ``findings/playbook.py`` words them), running it, and the reports it wrote with the
tracewhy command that reads each."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tracewhy.errors import UsageError
from tracewhy.findings.playbook import ncu_command, nsys_command, shell


@dataclass(frozen=True)
class CaptureOptions:
    #: "nsys" or "ncu".
    tool: str
    #: The job to profile, one argument per item.
    job: tuple[str, ...]
    #: The report's name (default "run" for nsys, "kernel" for ncu).
    name: str | None = None
    #: ncu: a regular expression naming the kernel whose launch is profiled.
    kernel: str | None = None
    #: ncu: launches of that kernel to skip first.
    launch_skip: int = 0


@dataclass(frozen=True)
class CapturePlan:
    """The profiler's command line (``profile``), the report name, and what reads the reports."""

    tool: str
    name: str
    profile: list[str]
    then: list[str]

    @property
    def profile_line(self) -> str:
        """The profiler's command as one shell line."""
        return shell(self.profile)


def capture_plan(options: CaptureOptions) -> CapturePlan:
    """The command to run; a UsageError for a capture that cannot be asked for."""
    if not options.job:
        raise UsageError("give the job to profile after --, e.g. tracewhy capture nsys -- python train.py")
    if options.tool == "ncu" and not options.kernel:
        raise UsageError("capture ncu needs --kernel REGEX (one kernel's launch; see tracewhy kernels TRACE)")
    if options.launch_skip < 0:
        raise UsageError("--launch-skip must be >= 0")
    if options.tool == "nsys":
        name = options.name or "run"
        return CapturePlan("nsys", name, nsys_command(options.job, name),
                           [f"tracewhy diagnose {name}_<RANK>.nsys-rep  (tracewhy exports it to SQLite once)"])
    name = options.name or "kernel"
    assert options.kernel is not None
    return CapturePlan("ncu", name, ncu_command(options.job, options.kernel, options.launch_skip, name),
                       [f"tracewhy roofline {name}.ncu-rep"])


def profiler_on_path(plan: CapturePlan) -> bool:
    return shutil.which(plan.tool) is not None


def run_profiler(plan: CapturePlan, *, job_output_to_stderr: bool) -> int:
    """Run the profiler on the job; its exit status. ``job_output_to_stderr``: the job's own
    output goes to stderr (under --json, stdout holds the one JSON document)."""
    return subprocess.run(plan.profile, check=False, stdout=2 if job_output_to_stderr else None).returncode


def written_reports(plan: CapturePlan) -> tuple[list[Path], str | None]:
    """The reports the run wrote, and why there are none when there are none."""
    if plan.tool == "nsys":
        reports = sorted(Path().glob(f"{plan.name}_*.nsys-rep")) or sorted(Path().glob(f"{plan.name}*.nsys-rep"))
        if not reports:
            return [], (f"nsys wrote no {plan.name}_*.nsys-rep here (did the job call "
                        "torch.cuda.profiler.start()? tracewhy.capture.profile does)")
        return reports, None
    report = Path(f"{plan.name}.ncu-rep")
    if not report.exists():
        return [], f"ncu wrote no {report} (no launch matched the kernel regex?)"
    return [report], None


def reader_argv(tool: str, report: Path) -> list[str]:
    """The tracewhy command line that reads one report of ``tool``, without the program name."""
    return ["diagnose" if tool == "nsys" else "roofline", str(report)]


def reader_command(tool: str, report: Path) -> str:
    """The same as one shell line."""
    return shell(["tracewhy", *reader_argv(tool, report)])
