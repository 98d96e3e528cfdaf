"""The ``check`` gate's output: one plain line per limit (CI logs are grepped line by line) and
its JSON. Takes a finished CheckReport."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from tracewhy.findings.model import Finding
from tracewhy.renderers.diff import DiffPayload, comparison_payload
from tracewhy.reports.check import CheckReport
from tracewhy.reports.check_metrics import METRICS, fmt_value

if TYPE_CHECKING:
    from tracewhy.renderers.several import GroupingJson
    from tracewhy.reports.several import PerTrace, SeveralReport


class CheckLimitResult(TypedDict):
    """One limit and what the trace measured for it."""

    #: BOUND-METRIC, as the option is spelt (max-gpu-idle).
    check: str
    metric: str
    #: "max" or "min".
    bound: str
    #: The limit in the metric's unit (a share, ns, a count, bytes, items/s).
    limit: float
    #: As the user wrote it.
    limit_text: str
    limit_shown: str
    #: Null where the trace cannot measure it.
    measured: float | None
    measured_text: str
    passed: bool
    note: str | None
    #: The line ``check`` prints for it.
    line: str
    #: A speed figure of a trace timed block by block: attribution, not throughput.
    attribution_only: bool


class CheckNoteJson(TypedDict):
    """A finding that qualifies a trace's figures without failing the gate."""

    #: "trace" or "baseline".
    about: str
    path: str
    #: The line ``check`` prints for it.
    line: str
    finding: Finding


class CheckBaseline(DiffPayload):
    """``--baseline``: the comparison with the baseline trace (as ``diff --json``), and its verdict."""

    passed: bool
    line: str | None


class CheckPayload(TypedDict):
    """``check``: every limit with its measured value, the baseline comparison, and the verdict
    (the exit code is 1 when ``passed`` is false)."""

    passed: bool
    results: list[CheckLimitResult]
    #: The lines of the limits (and baseline, partial-trace verdicts) that failed.
    violations: list[str]
    #: Why the trace (or the baseline) lacks events.
    partial: list[str]
    partial_passed: bool
    #: The trace was timed block by block (blocks-synchronized): its speed figures are attribution.
    attribution_only: bool
    #: Findings that qualify the figures without failing the gate.
    notes: list[CheckNoteJson]
    baseline: CheckBaseline | None


def check_payload(r: CheckReport) -> CheckPayload:
    """The JSON of ``check``: every limit with its measured value, and the baseline comparison."""
    return {
        "passed": r.passed,
        "results": [
            {
                "check": x.limit.key, "metric": x.limit.metric, "bound": x.limit.bound,
                "limit": x.limit.value, "limit_text": x.limit.text,
                "limit_shown": fmt_value(METRICS[x.limit.metric].unit, x.limit.value),
                "measured": x.measured, "measured_text": x.measured_text, "passed": x.passed, "note": x.note,
                "line": x.line, "attribution_only": x.attribution_only,
            }
            for x in r.results
        ],
        "violations": r.violations,
        "partial": r.partial, "partial_passed": r.partial_passed,
        # A trace timed block by block: its speed figures are attribution, not throughput.
        "attribution_only": r.attribution_only,
        "notes": [{"about": n.about, "path": n.path, "line": n.line, "finding": n.finding} for n in r.notes],
        "baseline": None if r.baseline is None else {
            **comparison_payload(r.baseline), "passed": r.baseline_passed, "line": r.baseline_line,
        },
    }


def check_lines(r: CheckReport) -> list[str]:
    """The lines ``check`` prints: one per limit, the baseline and partial-trace verdicts, the notes
    that qualify the figures without failing the gate, a total."""
    lines = [x.line for x in r.results]
    if r.baseline_line:
        lines.append(r.baseline_line)
    if r.partial_line:
        lines.append(r.partial_line)
    lines += [n.line for n in r.notes]
    n = len(r.results) + (1 if r.baseline is not None else 0) + (1 if r.partial else 0)
    failed = len(r.violations)
    lines.append(f"check: {failed} of {n} failed" if failed else f"check: all {n} passed")
    return lines


class CheckInput(CheckPayload):
    """One trace's gate (as ``check TRACE --json`` gives it), with its path and rank."""

    path: str
    #: The rank the trace's distributedInfo names; null where it names none.
    rank: int | None


class CheckSeveralPayload(TypedDict):
    """``check`` of several traces: each one gated alike; the command fails when any fails."""

    grouping: GroupingJson
    #: Every trace passed (the exit code is 1 when false).
    passed: bool
    #: The traces that failed: "rank N (FILE)" when read as ranks, else the file.
    failed: list[str]
    #: In rank order when read as ranks, else as given.
    inputs: list[CheckInput]


def check_several_payload(r: SeveralReport[CheckReport]) -> CheckSeveralPayload | CheckPayload:
    """The JSON of ``check`` on several traces; one trace left: that trace's, as if given alone."""
    from tracewhy.renderers.several import grouping_payload, input_entries

    if r.grouping is None:
        return check_payload(r.inputs[0].result)
    entries: Any = input_entries(r, lambda c: (check_payload(c), lambda: ""))
    return {"grouping": grouping_payload(r), "passed": several_passed(r), "failed": failed_traces(r),
            "inputs": entries}


def several_passed(r: SeveralReport[CheckReport]) -> bool:
    return all(i.result.passed for i in r.inputs)


def failed_traces(r: SeveralReport[CheckReport]) -> list[str]:
    return [_who(i, r) for i in r.by_rank() if not i.result.passed]


def _who(i: PerTrace[CheckReport], r: SeveralReport[CheckReport]) -> str:
    return f"rank {i.identity.rank} ({i.path})" if r.as_ranks else i.path


def check_several_lines(r: SeveralReport[CheckReport]) -> list[str]:
    """The lines of ``check`` on several traces: each trace's under a heading, then a total that
    names the traces that failed. One trace left: that trace's lines."""
    if r.grouping is None:
        return check_lines(r.inputs[0].result)
    lines = [f"{len(r.inputs)} traces: {r.grouping.reason}"]
    for n, i in enumerate(r.by_rank(), 1):
        lines.append(f"== {f'rank {i.identity.rank}' if r.as_ranks else f'{n} of {len(r.inputs)}'}: {i.path} ==")
        lines += check_lines(i.result)
    failed = failed_traces(r)
    lines.append(f"check: {len(failed)} of {len(r.inputs)} traces failed: {', '.join(failed)}" if failed
                 else f"check: all {len(r.inputs)} traces passed")
    return lines
