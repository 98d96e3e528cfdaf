"""Throughput in the user's unit: steady step (or pipeline chunk) times turned into items per
second, given how many items one step handles (``--items-per-step N --unit frames``).

The one conversion every command uses. Rates are taken at step-time quantiles: ``p50_per_s``
is items over the median step time, ``p90_per_s`` items over the p90 step time (the slow tail:
90% of steps ran at least this fast), ``mean_per_s`` items over the mean step time (all items
over all steady time). How a rate is worded and gated is in ``findings/throughput.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from tracewhy.analyses.stats import nearest_ns
from tracewhy.analyses.steps import StepStats
from tracewhy.errors import UsageError

#: The units a user may name; frames per second read as FPS.
UNITS: Final = ("frames", "tokens", "samples", "images")
TOKENS: Final = "tokens"
DEFAULT_UNIT: Final = "samples"


@dataclass(frozen=True)
class ThroughputOptions:
    items_per_step: float
    unit: str = DEFAULT_UNIT

    def __post_init__(self) -> None:
        if not self.items_per_step > 0:
            raise UsageError(f"--items-per-step must be > 0, got {self.items_per_step:g}")
        if self.unit not in UNITS:
            raise UsageError(f"--unit must be one of {', '.join(UNITS)}, got {self.unit!r}")


def requested(items_per_step: float | None, unit: str | None,
              tokens_per_step: float | None = None) -> ThroughputOptions | None:
    """The throughput a user asked for (``--items-per-step N --unit U``, or ``--tokens-per-step N``
    for ``--items-per-step N --unit tokens``); None when not asked."""
    if tokens_per_step is not None:
        if items_per_step is not None or unit not in (None, TOKENS):
            raise UsageError("--tokens-per-step N is --items-per-step N --unit tokens: give one or the other")
        return ThroughputOptions(items_per_step=tokens_per_step, unit=TOKENS)
    if items_per_step is None:
        if unit is not None:
            raise UsageError("--unit needs --items-per-step N (how many of them one step handles)")
        return None
    return ThroughputOptions(items_per_step=items_per_step, unit=unit or DEFAULT_UNIT)


def items_and_unit(items_per_step: float | None, unit: str | None,
                   tokens_per_step: float | None) -> tuple[float | None, str | None]:
    """Items per step and unit apart (``check`` also reads them from its config, so neither is
    required here), with ``tokens_per_step`` N read as N items of the unit tokens."""
    if tokens_per_step is None:
        return items_per_step, unit
    options = requested(items_per_step, unit, tokens_per_step)
    assert options is not None
    return options.items_per_step, options.unit


@dataclass(frozen=True)
class Throughput:
    """Items per second at the steady step times; ``per`` is "step" or "chunk". The step times are
    whole nanoseconds (the nearest to the statistic), and each rate is items over its step time."""

    items_per_step: float
    unit: str
    per: str
    count: int  # steady steps (chunks) the step times come from
    p50_step_ns: int
    p90_step_ns: int
    mean_step_ns: int
    p50_per_s: float
    p90_per_s: float
    mean_per_s: float


def throughput(p50_ns: float | None, p90_ns: float | None, mean_ns: float | None, count: int,
               options: ThroughputOptions, per: str = "step") -> Throughput | None:
    """Items per second at the given step-time statistics; None without a positive step time."""
    if not count or p50_ns is None or p90_ns is None or mean_ns is None or min(p50_ns, p90_ns, mean_ns) <= 0:
        return None
    n = options.items_per_step
    p50, p90, mean = (max(nearest_ns(v), 1) for v in (p50_ns, p90_ns, mean_ns))  # (under 0.5 ns is still > 0)
    return Throughput(items_per_step=n, unit=options.unit, per=per, count=count, p50_step_ns=p50,
                      p90_step_ns=p90, mean_step_ns=mean, p50_per_s=n * 1e9 / p50,
                      p90_per_s=n * 1e9 / p90, mean_per_s=n * 1e9 / mean)


def from_step_stats(stats: StepStats | None, options: ThroughputOptions) -> Throughput | None:
    """From ``steps``' steady statistics."""
    if stats is None:
        return None
    return throughput(stats.p50_ns, stats.p90_ns, stats.mean_ns, stats.count, options)


def from_durations(durations_ns: Sequence[int | float], options: ThroughputOptions,
                   per: str = "step") -> Throughput | None:
    """From steady step (or chunk period) durations, with the quantiles ``steps`` uses."""
    v = np.asarray(durations_ns, dtype=np.float64)
    if v.size == 0:
        return None
    p50, p90 = (float(x) for x in np.percentile(v, [50, 90]))
    return throughput(p50, p90, float(v.mean()), int(v.size), options, per)
