"""``steps``: every step's span and GPU work, the warm-up left out, and the steady window's
statistics; with ``--items-per-step``, the throughput at the steady step times."""

from __future__ import annotations

from dataclasses import dataclass

from tracewhy.analyses.steps import StepsOptions, StepsResult, steps
from tracewhy.analyses.throughput import Throughput, ThroughputOptions, from_step_stats
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource


@dataclass(frozen=True)
class StepsReportOptions:
    step_marker: str | None = None
    warmup: int | None = None
    #: Items per step, to say the steady step times as throughput.
    rate: ThroughputOptions | None = None


@dataclass(frozen=True)
class StepsReport:
    """The steps, and (with ``rate``) the throughput at the steady step times (None without steady steps)."""

    result: StepsResult
    rate: ThroughputOptions | None = None
    throughput: Throughput | None = None


def steps_report(trace: TraceSource, options: StepsReportOptions | None = None, loader: Loader = PLAIN) -> StepsReport:
    options = options or StepsReportOptions()
    r = steps(loader.trace(trace), StepsOptions(marker=options.step_marker, warmup=options.warmup))
    rate = options.rate
    return StepsReport(r, rate, from_step_stats(r.stats, rate) if rate is not None else None)
