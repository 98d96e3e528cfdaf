"""``steps``: every step's span and GPU work, the warm-up left out, the steady window's
statistics and each step's and region's MFU; with ``--items-per-step``, the throughput at the
steady step times."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tracewhy.analyses.mfu_steps import MfuResult, measure_mfu
from tracewhy.analyses.step_bytes import DecodeBandwidth, decode_bandwidth
from tracewhy.analyses.step_classes import StepClasses, prefill_warmup_reason, step_classes
from tracewhy.analyses.steps import StepsOptions, StepsResult, steps
from tracewhy.analyses.throughput import Throughput, ThroughputOptions, from_step_stats
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource

if TYPE_CHECKING:
    from tracewhy.reports.several import SeveralReport


@dataclass(frozen=True)
class StepsReportOptions:
    step_marker: str | None = None
    warmup: int | None = None
    #: Items per step, to say the steady step times as throughput.
    rate: ThroughputOptions | None = None
    #: Bytes one decode step reads, as the user gave them (``--decode-bytes``).
    decode_bytes: int | None = None


@dataclass(frozen=True)
class StepsReport:
    """The steps, their MFU, and (with ``rate``) the throughput at the steady step times (None
    without steady steps); on an inference trace, the steps by class and the decode steps' memory
    bandwidth."""

    result: StepsResult
    rate: ThroughputOptions | None = None
    throughput: Throughput | None = None
    classes: StepClasses | None = None
    decode: DecodeBandwidth | None = None
    mfu: MfuResult | None = None


def steps_report(trace: TraceSource, options: StepsReportOptions | None = None, loader: Loader = PLAIN) -> StepsReport:
    options = options or StepsReportOptions()
    t = loader.trace(trace)
    r = steps(t, StepsOptions(marker=options.step_marker, warmup=options.warmup))
    rate = options.rate
    classes = step_classes(t, r, rate)
    prefill = prefill_warmup_reason(r, classes) if classes is not None else None
    if prefill is not None:
        r = replace(r, warmup_reason=prefill)
    return StepsReport(r, rate, from_step_stats(r.stats, rate) if rate is not None else None, classes,
                       decode_bandwidth(t, classes, options.decode_bytes) if classes is not None else None,
                       measure_mfu(t, r))


def steps_several(sources: Sequence[TraceSource], options: StepsReportOptions | None = None,
                  loader: Loader = PLAIN) -> SeveralReport[StepsReport]:
    """The steps of every trace ``sources`` stand for (a directory: the traces in it), grouped as
    ``reports/several.py`` says; runs of the first's program compared with it."""
    from tracewhy.reports.several import SeveralOptions, read_several  # (several traces only)

    options = options or StepsReportOptions()
    return read_several(sources, SeveralOptions(options.step_marker, options.warmup),
                        lambda t: steps_report(t, options), loader)
