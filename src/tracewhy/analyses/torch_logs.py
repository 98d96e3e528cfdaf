"""The join of a TORCH_LOGS capture to the trace's compiled regions: where a logged break or
recompile has the compile id ``F/C`` of a region, the region gets its break (reason, location)
and the guard whose failure compiled it."""

from __future__ import annotations

from typing import Final

import polars as pl

from tracewhy.analyses.compile import RegionCol
from tracewhy.model.torch_logs import LogBreakCol, LogRecompileCol, TorchLogs


class JoinCol:
    """Columns ``join_regions`` adds to the regions table."""

    BREAK_LOCATION: Final = "break_location"
    BREAK_REASON: Final = "break_reason"
    GUARD: Final = "recompile_guard"


JOIN_SCHEMA: Final = pl.Schema({JoinCol.BREAK_LOCATION: pl.String(), JoinCol.BREAK_REASON: pl.String(),
                                JoinCol.GUARD: pl.String()})


def join_regions(regions: pl.DataFrame, logs: TorchLogs) -> pl.DataFrame:
    """The trace's regions (``CompileResult.regions``) with, where the compile id matches, the
    logged break of that frame (reason, location) and the guard whose failure compiled it."""
    breaks = logs.breaks.drop_nulls(LogBreakCol.REGION).group_by(LogBreakCol.REGION, maintain_order=True).agg(
        pl.col(LogBreakCol.LOCATION).first().alias(JoinCol.BREAK_LOCATION),
        pl.col(LogBreakCol.REASON).first().alias(JoinCol.BREAK_REASON))
    recompiles = logs.recompiles.drop_nulls(LogRecompileCol.REGION).group_by(
        LogRecompileCol.REGION, maintain_order=True).agg(pl.col(LogRecompileCol.GUARD).first().alias(JoinCol.GUARD))
    return (regions.join(breaks, left_on=RegionCol.REGION, right_on=LogBreakCol.REGION, how="left")
            .join(recompiles, left_on=RegionCol.REGION, right_on=LogRecompileCol.REGION, how="left"))
