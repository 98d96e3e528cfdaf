"""Whether allocated memory grows step after step, from the allocations themselves: which
allocation sites (the outermost op and the user's Python line that allocated) keep more bytes live
at the end of each steady step than at its start. A leak adds bytes in every steady step; a buffer
allocated lazily and kept (an optimizer's state, FSDP's unsharded parameters) adds them in one
step and then holds, and is no leak.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.model.schema import MemEventCol

I64 = npt.NDArray[np.int64]


class SiteCol:
    """Columns of ``StepGrowth.sites``: allocation sites whose live bytes rose in every steady step,
    most bytes per step first."""

    OP: Final = "op"  # outermost CPU op on the allocating thread
    FRAME: Final = "frame"  # innermost user Python frame ("file:line function"); null without with_stack
    #: Median rise of the site's live bytes per steady step (a median: the first step's frees of
    #: blocks allocated before the trace began cannot be paired, and would lift a mean)
    BYTES_PER_STEP: Final = "kept_bytes_per_step"
    STEPS: Final = "steps"


SITES_SCHEMA: Final = pl.Schema({SiteCol.OP: pl.String(), SiteCol.FRAME: pl.String(),
                                 SiteCol.BYTES_PER_STEP: pl.Float64(), SiteCol.STEPS: pl.Int64()})


@dataclass(frozen=True)
class StepGrowth:
    """How allocated-at-end moved over the steady steps, and ``sites`` (SITES_SCHEMA)."""

    rises: int  # steady steps whose end is above the previous steady step's end
    steady_steps: int
    sites: pl.DataFrame

    @property
    def rises_every_step(self) -> bool:
        """Each steady step ends above the one before it (two rises at least)."""
        return self.steady_steps >= 3 and self.rises == self.steady_steps - 1


def step_growth(ev: pl.DataFrame, allocated_at_end: list[int | None], steady: list[bool],
                window_of_event: I64, *, op: str, frame: str) -> StepGrowth:
    """``ev``: one device's events in order, with ``op`` and ``frame`` columns naming each
    allocation's site; ``allocated_at_end`` and ``steady``: per step window; ``window_of_event``:
    each event's window (-1 outside). A block counts for its site in the window where it was
    allocated (+ its bytes) and in the one where it was freed (- its bytes)."""
    steady_rows = [i for i, s in enumerate(steady) if s and allocated_at_end[i] is not None]
    ends = [int(allocated_at_end[i] or 0) for i in steady_rows]
    rises = sum(b > a for a, b in itertools.pairwise(ends))
    empty = pl.DataFrame(schema=SITES_SCHEMA)
    if not steady_rows or ev.get_column(MemEventCol.ADDR).null_count():
        return StepGrowth(rises, len(ends), empty)
    paired = (
        ev.with_columns(pl.int_range(pl.len()).alias("_row"), pl.Series("_w", window_of_event))
        .sort(MemEventCol.ADDR, "_row")
        .with_columns(pl.col(MemEventCol.BYTES).shift(-1).over(MemEventCol.ADDR).alias("_next_bytes"),
                      pl.col("_w").shift(-1).over(MemEventCol.ADDR).alias("_free_w"))
        .filter(pl.col(MemEventCol.BYTES) > 0)
    )
    allocated = paired.select(op, frame, pl.col("_w"), pl.col(MemEventCol.BYTES).alias("_delta"))
    freed = paired.filter(pl.col("_next_bytes") < 0).select(
        op, frame, pl.col("_free_w").alias("_w"), (-pl.col(MemEventCol.BYTES)).alias("_delta"))
    per_step = (
        pl.concat([allocated, freed]).filter(pl.col("_w").is_in(steady_rows))
        .group_by(op, frame, "_w").agg(pl.col("_delta").sum())
    )
    n = len(steady_rows)
    sites = (
        per_step.group_by(op, frame)
        .agg((pl.col("_delta") > 0).sum().cast(pl.Int64).alias(SiteCol.STEPS),
             pl.col("_delta").median().alias(SiteCol.BYTES_PER_STEP))
        # a site rises in every steady step: n windows, each with more allocated than freed
        .filter(pl.col(SiteCol.STEPS) == n)
        .select(pl.col(op).alias(SiteCol.OP), pl.col(frame).alias(SiteCol.FRAME), SiteCol.BYTES_PER_STEP,
                SiteCol.STEPS)
        .cast(SITES_SCHEMA)
        .sort([SiteCol.BYTES_PER_STEP, SiteCol.OP], descending=[True, False], nulls_last=True)
    )
    return StepGrowth(rises, len(ends), sites)
