"""The ``check`` gate's output: one plain line per limit (CI logs are grepped line by line) and
its JSON. Takes a finished CheckReport."""

from __future__ import annotations

from typing import Any

from tracewhy.findings.check import METRICS, CheckReport, fmt_value
from tracewhy.renderers.compare import comparison_payload


def check_payload(r: CheckReport) -> dict[str, Any]:
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
            "passed": r.baseline_passed, "line": r.baseline_line, **comparison_payload(r.baseline),
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
