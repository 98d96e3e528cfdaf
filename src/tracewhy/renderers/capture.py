"""What ``capture`` prints: the profiler command it runs (or would run), what to run next and,
after a run, the profiler's exit status and the reports it wrote; as plain lines and as JSON."""

from __future__ import annotations

from typing import TypedDict

from tracewhy.findings.playbook import shell


class CapturePayload(TypedDict):
    """``capture``: the profiler command, whether it ran, its exit status, the reports it wrote
    and the tracewhy commands that read them."""

    #: "nsys" or "ncu".
    profiler: str
    #: The profiler's command line, one argument per item.
    profile_command: list[str]
    #: The same as one shell line.
    profile_command_line: str
    #: Whether the profiler was run (not with --dry-run, nor without it on PATH).
    ran: bool
    #: Why it was not run: "dry run" or "nsys is not on PATH"; null when it ran.
    not_run_because: str | None
    #: The profiler's exit status; null when it did not run.
    exit_status: int | None
    #: The reports the run wrote (empty before a run).
    reports: list[str]
    #: What to run next: on each report, or (before a run) on the reports it will write.
    then: list[str]


def capture_payload(profiler: str, command: list[str], then: list[str], *, not_run_because: str | None = None,
                    exit_status: int | None = None, reports: list[str] | None = None) -> CapturePayload:
    return {"profiler": profiler, "profile_command": command, "profile_command_line": shell(command),
            "ran": not_run_because is None, "not_run_because": not_run_because, "exit_status": exit_status,
            "reports": reports or [], "then": then}


def capture_lines(p: CapturePayload) -> str:
    """The plain lines of a capture that did not run: the commands to run where the tool is."""
    return f"# {p['not_run_because']}: run these where {p['profiler']} is installed\n{p['profile_command_line']}\n" + \
        "\n".join(p["then"])
