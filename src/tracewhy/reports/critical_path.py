"""``critical-path``: the critical path of each step (or of one window): what it is made of, what
lies on it, and what removing each of its top items would save (the path replayed without it)."""

from __future__ import annotations

from dataclasses import dataclass

from tracewhy.analyses.critical_path import CriticalPathOptions, CriticalPathResult, critical_path
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource


@dataclass(frozen=True)
class CriticalPathReportOptions:
    step_marker: str | None = None
    #: Per step, the items with most time on the path whose removal is replayed.
    gain_items: int = CriticalPathOptions().gain_items
    #: Analyse this one window (trace timestamps in ns) instead of the steps.
    window_ns: tuple[int, int] | None = None


def critical_path_report(trace: TraceSource, options: CriticalPathReportOptions | None = None,
                         loader: Loader = PLAIN) -> CriticalPathResult:
    options = options or CriticalPathReportOptions()
    return critical_path(loader.trace(trace), CriticalPathOptions(marker=options.step_marker,
                                                                  gain_items=options.gain_items,
                                                                  window_ns=options.window_ns))
