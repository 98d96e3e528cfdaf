"""Input pipeline: DataLoader time per step, and how much of it the GPU spent idle."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracewhy.analyses.host_activity import Flag, HostIndex
from tracewhy.analyses.intervals import union
from tracewhy.analyses.steps import StepCol, StepsResult, WindowCol
from tracewhy.analyses.utilization import DeviceBusy


@dataclass(frozen=True)
class InputResult:
    """``per_step``: step, steady, window_ns, dataloader_ns (union of DataLoader fetches on the
    host inside the step window), idle_during_ns (of that, time the busiest device was idle)."""

    fetches: int
    per_step: pl.DataFrame


def input_pipeline(steps: StepsResult, host: HostIndex, busy: dict[int, DeviceBusy]) -> InputResult:
    rows = np.flatnonzero(host.self_flag[Flag.DATALOADER])
    ds, de = union(host.ts[rows], host.end[rows])
    out = []
    windows = steps.table.select(StepCol.TS, StepCol.WINDOW_END, StepCol.STEADY)
    for i, (ts, wend, steady) in enumerate(windows.iter_rows()):
        s = np.clip(ds, ts, wend)
        e = np.clip(de, ts, wend)
        loader = int((e - s).sum())
        covered = max((sum(b.busy_in(int(a), int(z)) for a, z in zip(s, e, strict=True) if z > a)
                       for b in busy.values()), default=0)
        out.append((i, steady, wend - ts, loader, loader - covered))
    per_step = pl.DataFrame(out, orient="row", schema={
        "step": pl.Int64, StepCol.STEADY: pl.Boolean, WindowCol.WINDOW: pl.Int64,
        "dataloader_ns": pl.Int64, "idle_during_ns": pl.Int64})
    return InputResult(fetches=int(rows.size), per_step=per_step)
