"""Step-time spikes: steady steps well above the median, and what they contain that a median
step does not (allocator calls, synchronizes, collectives). Compile work inside a step is
measured by the compile analysis (``analyses.compile``, its ``compile_ns`` per step)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracewhy.analyses.host_activity import Flag, HostIndex
from tracewhy.analyses.steps import StepCol, StepsResult
from tracewhy.model.schema import Kind
from tracewhy.model.trace import Trace

#: A steady step this much above the steady median is a spike (the sleep and scheduler noise
#: of a healthy loop stays well under it).
SPIKE_MARGIN = 0.25
_FEATURES = ("allocator_calls", "syncs", "collectives")


@dataclass(frozen=True)
class SpikesResult:
    """``per_step``: step, steady, dur_ns and counts of allocator calls, syncs and collectives in
    the step window. ``spikes``: the steady steps above median x (1 + margin),
    with each count's excess over the steady median."""

    per_step: pl.DataFrame
    spikes: pl.DataFrame
    margin: float


def spikes(trace: Trace, steps: StepsResult, host: HostIndex, margin: float = SPIKE_MARGIN) -> SpikesResult:
    trace.require_whole()
    features = {
        "allocator_calls": host.self_flag[Flag.ALLOC],
        "syncs": host.self_flag[Flag.SYNC],
        "collectives": host.self_flag[Flag.COMM] & host.is_kind(Kind.CPU_OP),
    }
    times = {k: np.sort(host.ts[v]) for k, v in features.items()}
    rows = []
    windows = steps.table.select(StepCol.TS, StepCol.DUR, StepCol.WINDOW_END, StepCol.STEADY)
    for i, (ts, dur, wend, steady) in enumerate(windows.iter_rows()):
        counts = [int(np.searchsorted(times[k], wend) - np.searchsorted(times[k], ts)) for k in _FEATURES]
        rows.append((i, steady, dur, *counts))
    per_step = pl.DataFrame(rows, orient="row", schema={
        "step": pl.Int64, StepCol.STEADY: pl.Boolean, "dur_ns": pl.Int64, **{k: pl.Int64 for k in _FEATURES}})
    steady_steps = per_step.filter(pl.col(StepCol.STEADY))
    if steady_steps.height < 3:
        return SpikesResult(per_step=per_step, spikes=per_step.clear(), margin=margin)
    median = float(steady_steps.get_column("dur_ns").median())  # type: ignore[arg-type]
    base = {k: float(steady_steps.get_column(k).median()) for k in _FEATURES}  # type: ignore[arg-type]
    found = steady_steps.filter(pl.col("dur_ns") > median * (1 + margin)).with_columns(
        (pl.col("dur_ns") - median).alias("excess_ns"),
        *[(pl.col(k) - base[k]).alias(f"extra_{k}") for k in _FEATURES],
    )
    return SpikesResult(per_step=per_step, spikes=found, margin=margin)
