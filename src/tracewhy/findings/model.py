"""What a finding is: a judged measurement, phrased for an engineer, with evidence and a next step."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tracewhy.analyses.stats import nearest_ns
from tracewhy.findings.codes import Code


class Severity(str, Enum):
    """How much a finding matters; ``TRUST`` findings say how far the other numbers can be trusted."""

    TRUST = "trust"  # about the capture itself: shown first, never ranked by time
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"
    INFO = "info"


_ORDER = {Severity.TRUST: 0, Severity.HIGH: 1, Severity.MEDIUM: 2, Severity.LOW: 3, Severity.INFO: 4}


@dataclass(frozen=True)
class Finding:
    """One statement about a trace.

    ``code`` is stable kebab-case (scripts match on it), one of ``findings.codes.Code``.
    ``statement`` is one line with the numbers in it. ``evidence`` holds the measured values,
    time ranges and names it rests on; a time in it (a key ending in ``_ns``) is whole
    nanoseconds, a fractional one (a mean, a median) rounded to the nearest.
    ``recoverable_ns_per_step`` is the step time the fix gives back: for a finding that explains a
    part of the step account (``part``), the measured step less ``predicted_step_ns``, the step
    replayed with the fix (``analyses.what_if``); else the rule's own estimate (0 when not a time
    finding). ``next_bottleneck`` is the largest avoidable part of the predicted step.
    ``next_step`` names the next tool and exact command, or the change to try.
    """

    code: Code
    severity: Severity
    statement: str
    next_step: str
    recoverable_ns_per_step: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)
    #: Codes of other findings this one points the reader to; ``diagnose`` names in the text only
    #: those it prints (``findings.consolidate``), so no text refers to a finding that is absent.
    see: tuple[Code, ...] = ()
    #: Codes this finding sums up (GPU idle overall, then one finding per idle class): it is
    #: placed right before the first of them that is printed.
    parts: tuple[Code, ...] = ()
    #: The part of the step account (``analyses.account``) this finding explains; None when it
    #: explains none (not a time finding, or its time is not on the step's critical path).
    part: str | None = None
    #: The mean step predicted with the fix (None: no prediction; without steps, the trace's window).
    predicted_step_ns: int | None = None
    #: The largest avoidable part of the predicted step (None: none left, or no prediction).
    next_bottleneck: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", _whole_times(self.evidence))


def rank(findings: list[Finding]) -> list[Finding]:
    """Trust findings first, then by recoverable time per step (largest first), then severity, code."""
    return sorted(
        findings,
        key=lambda f: (
            0 if f.severity is Severity.TRUST else 1,
            -f.recoverable_ns_per_step,
            _ORDER[f.severity],
            f.code,
        ),
    )


def _whole_times(evidence: dict[str, Any]) -> dict[str, Any]:
    """``evidence`` with every finite float under a key ending in ``_ns`` (in nested dicts and
    lists too) rounded to the nearest nanosecond: time is whole nanoseconds in every output."""

    def walk(value: Any, timed: bool) -> Any:
        if isinstance(value, dict):  # (the values of a dict under a time's key are times)
            return {k: walk(v, timed or (isinstance(k, str) and k.endswith("_ns"))) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, timed) for v in value]
        if isinstance(value, tuple):
            return tuple(walk(v, timed) for v in value)
        if timed and isinstance(value, float) and math.isfinite(value):
            return nearest_ns(value)
        return value

    out: dict[str, Any] = walk(evidence, False)
    return out
