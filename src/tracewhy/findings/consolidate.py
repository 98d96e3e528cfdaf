"""One consistent text out of the rules' findings: one finding per cause, references only to
findings that are printed, a summary before the findings it sums up, and severity by the share
of the step a fix would recover, within what the capture can support (``CaptureSize``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Final

import msgspec

from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import STRUCTURAL, Code
from tracewhy.findings.model import Finding, Severity, rank

#: ``nsys analyze`` rules (findings/nsys_rules.py) that flag the same cause as one of tracewhy's
#: own findings, which has more context: the nsys finding is folded into it, its rule and
#: evidence kept. pageable-memcpy counts every copy through pageable memory, cuda_memcpy_async the
#: asynchronous ones among them; cuda_memcpy_sync and synchronous-memcpy both count the
#: cudaMemcpy-without-Async calls; gpu_time_util and gpu-low-utilization both measure GPU idle.
SAME_CAUSE: Final = {
    Code.NSYS_ASYNC_MEMCPY_PAGEABLE: Code.PAGEABLE_MEMCPY,
    Code.NSYS_SYNC_MEMCPY: Code.SYNCHRONOUS_MEMCPY,
    Code.NSYS_GPU_LOW_UTILIZATION: Code.GPU_LOW_UTILIZATION,
}
#: Findings whose recoverable time is a lower bound of what the fix gives back, so a small share
#: does not make them minor: a graph break's eager ops between graphs leave out the fusion lost
#: across the break and the guards of the next graph; a steady recompile recurs with each new shape.
#: A copy-bound step's prediction moves the copies beside compute, but fewer bytes save more
#: than that; a large avoidable part no rule explains is at least worth reading.
SEVERITY_FLOOR: Final = {Code.GRAPH_BREAKS: Severity.MEDIUM, Code.RECOMPILE: Severity.MEDIUM,
                         Code.COPY_BOUND: Severity.HIGH, Code.UNEXPLAINED_PART: Severity.MEDIUM}
#: Severities that rank by recoverable time; TRUST and INFO say something else.
_BY_SHARE: Final = (Severity.HIGH, Severity.MEDIUM, Severity.LOW)


class CaptureSize(msgspec.Struct, frozen=True):
    """How much the capture holds, which bounds the severity it can support: its events (slices
    of every kind) and its analysed steps (None: no step markers, the trace is one window)."""

    events: int
    steps: int | None


def consolidate(findings: list[Finding], window_ns: float | None,
                capture: CaptureSize | None = None) -> list[Finding]:
    """The findings as ``diagnose`` prints them. ``window_ns``: the step (or the trace, without
    steps) that recoverable times are shares of; None when it cannot be measured. ``capture``:
    what the capture holds (None: not judged)."""
    merged = _merge_same_cause(findings)
    judged = [_within_capture(_severity_by_share(_within_window(f, window_ns), window_ns), capture)
              for f in merged]
    printed = {f.code for f in judged}
    return _summaries_first(rank([_with_references(f, printed) for f in judged]))


def _merge_same_cause(findings: list[Finding]) -> list[Finding]:
    by_code = {f.code: f for f in findings}
    out: list[Finding] = []
    for f in findings:
        if f.code in SAME_CAUSE and SAME_CAUSE[f.code] in by_code:
            continue  # folded into the finding below
        folded = [g for g in findings if SAME_CAUSE.get(g.code) == f.code]
        if folded:
            rules = [str(g.evidence.get("rule", g.code)) for g in folded]
            f = replace(f, statement=f"{f.statement} (nsys rule {', '.join(rules)} flags the same cause.)",
                        evidence={**f.evidence, "nsys_rules": {r: g.evidence for r, g in zip(rules, folded,
                                                                                          strict=True)}})
        out.append(f)
    return out


def _severity_by_share(f: Finding, window_ns: float | None) -> Finding:
    """HIGH from HIGH_SEVERITY_SHARE of the step recoverable, MEDIUM from IDLE_CLASS_MIN_SHARE,
    LOW under it: 98.8 ms of a 252 ms step is not low, whatever the rule's default. A code in
    SEVERITY_FLOOR stays at least at its floor."""
    if f.code == Code.UNEXPLAINED_PART and f.predicted_step_ns is not None and f.recoverable_ns_per_step <= 0:
        return replace(f, severity=Severity.LOW)  # replayed without it, the step is no shorter: worth a line, no more
    if f.severity not in _BY_SHARE or not window_ns or f.recoverable_ns_per_step <= 0:
        return f
    severity = severity_for_share(f.recoverable_ns_per_step / window_ns)
    floor = SEVERITY_FLOOR.get(f.code)
    if floor is not None and _BY_SHARE.index(severity) > _BY_SHARE.index(floor):
        severity = floor
    return replace(f, severity=severity)


def _within_window(f: Finding, window_ns: float | None) -> Finding:
    """A fix cannot give back more than the time the finding was measured over: a recoverable
    time above the window is cut to it (the rule's own figure kept in the evidence)."""
    if not window_ns or f.recoverable_ns_per_step <= window_ns:
        return f
    return replace(f, recoverable_ns_per_step=int(window_ns),
                   evidence={**f.evidence, "recoverable_measured_ns": f.recoverable_ns_per_step})


def _within_capture(f: Finding, capture: CaptureSize | None) -> Finding:
    """Medium and high say how much step time a fix gives back, so they need a time to give back
    (a summary without one of its own, like gpu-low-utilization, is info: its parts carry the
    severity; any other finding is low) and a capture that can show the cost recurs: fewer
    than MIN_EVENTS_FOR_SEVERITY events, at most low; fewer than HIGH_SEVERITY_MIN_STEPS
    analysed steps, at most medium. The reason goes in the evidence (``severity_capped``)."""
    if f.severity not in (Severity.HIGH, Severity.MEDIUM):
        return f
    if f.recoverable_ns_per_step <= 0 and f.code not in STRUCTURAL:
        return _capped(f, Severity.INFO if f.parts else Severity.LOW,
                       "no recoverable time: medium and high say how much of the step a fix gives back", say=False)
    if capture is None:
        return f
    if capture.events < th.MIN_EVENTS_FOR_SEVERITY:
        return _capped(f, Severity.LOW, f"the capture holds {capture.events} events, fewer than "
                                        f"{th.MIN_EVENTS_FOR_SEVERITY}: too few to show what the job repeats")
    if f.severity is Severity.HIGH and capture.steps is not None and capture.steps < th.HIGH_SEVERITY_MIN_STEPS:
        return _capped(f, Severity.MEDIUM, f"the capture holds {capture.steps} analysed step(s), fewer than "
                                           f"{th.HIGH_SEVERITY_MIN_STEPS}: one step cannot show the cost recurs")
    return f


def _capped(f: Finding, severity: Severity, reason: str, say: bool = True) -> Finding:
    """``f`` at ``severity``, the reason in its evidence and (``say``) at the end of its statement."""
    said = f" ({severity.value.capitalize()}, not {f.severity.value}: {reason}.)" if say else ""
    statement = f"{f.statement}{said}"
    return replace(f, severity=severity, statement=statement,
                   evidence={**f.evidence, "severity_capped": reason, "severity_uncapped": f.severity.value})


def severity_for_share(share: float) -> Severity:
    """HIGH from HIGH_SEVERITY_SHARE of the step (or capture), MEDIUM from IDLE_CLASS_MIN_SHARE."""
    return (Severity.HIGH if share >= th.HIGH_SEVERITY_SHARE
            else Severity.MEDIUM if share >= th.IDLE_CLASS_MIN_SHARE else Severity.LOW)


def _with_references(f: Finding, printed: set[Code]) -> Finding:
    present = [c for c in f.see if c in printed and c != f.code]
    if not present:
        return f
    names = ", ".join(present)
    return replace(f, next_step=f"{f.next_step} See also: {names}.", see=tuple(present))


def _summaries_first(findings: list[Finding]) -> list[Finding]:
    """Each summary moved right before the first of its parts (it ranks by its own time otherwise,
    usually after them: a summary recovers nothing a part does not)."""
    out = list(findings)
    for summary in [f for f in findings if f.parts]:
        positions = [i for i, g in enumerate(out) if g.code in summary.parts]
        here = out.index(summary)
        if positions and positions[0] < here:
            out.pop(here)
            out.insert(positions[0], summary)
    return out
