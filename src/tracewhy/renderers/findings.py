"""A command's findings under its tables (``overlap``, ``blocks``, ``ranks``, ``pipeline``): one line
each, coloured by severity, with the next step indented under it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracewhy.findings.model import Finding, Severity
from tracewhy.units import indented, printable

if TYPE_CHECKING:
    from rich.console import RenderableType


def render_findings(findings: list[Finding]) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = []
    for f in findings:
        style = "bold red" if f.severity is Severity.HIGH else "yellow" if f.severity is Severity.TRUST else "bold"
        parts.append(Text(f"[{f.severity.value}] {f.code}: {printable(f.statement)}", style=style))
        parts.append(indented(Text(f"next: {printable(f.next_step)}", style="dim"), 4))
    return Group(*parts)
