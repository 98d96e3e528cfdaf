"""``gaps``: every GPU idle gap of a trace with its class and the host's activity, idle per step,
and the time origin the gap list's starts are shown from (the trace start)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from tracewhy.analyses.gaps import CLASSES, GapsOptions, GapsResult, gaps
from tracewhy.analyses.steps import StepsOptions, steps
from tracewhy.model.schema import Col
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource

if TYPE_CHECKING:
    from tracewhy.reports.several import SeveralReport

#: The classes a gap may have (``--class`` lists one of them).
GAP_CLASSES: Final = CLASSES


@dataclass(frozen=True)
class GapsReportOptions:
    step_marker: str | None = None
    #: Shortest gap listed; shorter ones are counted per step as short.
    min_gap_ns: int = GapsOptions().min_gap_ns


@dataclass(frozen=True)
class GapsReport:
    """The gaps, and ``origin_ns``: the trace start (the first event's start), None for a trace
    without slices."""

    result: GapsResult
    origin_ns: int | None


def gaps_report(trace: TraceSource, options: GapsReportOptions | None = None, loader: Loader = PLAIN) -> GapsReport:
    options = options or GapsReportOptions()
    t = loader.trace(trace)
    result = gaps(t, steps(t, StepsOptions(marker=options.step_marker)), GapsOptions(options.min_gap_ns))
    origin = t.slices.get_column(Col.TS).min() if t.slices.height else None
    return GapsReport(result, int(origin) if origin is not None else None)  # type: ignore[arg-type]


def gaps_several(sources: Sequence[TraceSource], options: GapsReportOptions | None = None,
                 loader: Loader = PLAIN) -> SeveralReport[GapsReport]:
    """The gaps of every trace ``sources`` stand for (a directory: the traces in it), grouped as
    ``reports/several.py`` says; runs of the first's program compared with it."""
    from tracewhy.reports.several import SeveralOptions, read_several  # (several traces only)

    options = options or GapsReportOptions()
    return read_several(sources, SeveralOptions(options.step_marker), lambda t: gaps_report(t, options), loader)
