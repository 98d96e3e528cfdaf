"""``diagnose``: run every rule on a trace and rank what they find."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tracewhy.analyses.gaps import GapsResult
from tracewhy.analyses.steps import StepsResult
from tracewhy.findings import blocks, host, idle, nsys_rules, overlap, platform, trust
from tracewhy.findings.basis import Basis, basis
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.findings.model import Finding, Severity, rank
from tracewhy.model.trace import Trace

Rule = Callable[[Context], list[Finding]]

#: Every rule module; each returns the findings it can make for one trace.
RULES: tuple[Rule, ...] = (
    trust.findings, idle.findings, host.findings, platform.findings, overlap.findings, blocks.findings,
    nsys_rules.findings,
)


@dataclass(frozen=True)
class Report:
    """The ranked findings and the measurements they rest on."""

    path: str
    findings: list[Finding]
    steps: StepsResult
    gaps: GapsResult
    basis: Basis

    @property
    def healthy(self) -> bool:
        return not any(f.severity in (Severity.HIGH, Severity.MEDIUM) for f in self.findings)


def diagnose(trace: Trace, options: DiagnoseOptions | None = None) -> Report:
    ctx = Context(trace, options or DiagnoseOptions())
    found: list[Finding] = []
    for rule in RULES:
        found += rule(ctx)
    return Report(path=trace.meta.path, findings=rank(found), steps=ctx.steps(), gaps=ctx.gaps(), basis=basis(ctx))
