"""An Nsight Compute report's launches summed per kernel name: launch count, total and mean time,
and the time-weighted means of the throughput figures ``analyses.roofline`` measures per launch."""

from __future__ import annotations

from typing import Final

import polars as pl

from tracewhy.analyses.roofline import MeasureCol
from tracewhy.analyses.stats import whole_ns
from tracewhy.model.ncu import NcuCol


class WeightedCol:
    """Columns of ``weighted_by_kernel`` beside ``NcuCol.NAME`` and the ``WEIGHTED`` launch columns."""

    LAUNCHES: Final = "launches"
    TOTAL_NS: Final = "total_ns"
    MEAN_NS: Final = "mean_ns"  # to the nearest nanosecond
    WEIGHTED: Final = (MeasureCol.SM_PCT, MeasureCol.MEMORY_PCT, MeasureCol.DRAM_PCT, MeasureCol.ACHIEVED_OCCUPANCY_PCT,
                       MeasureCol.THEORETICAL_OCCUPANCY_PCT, MeasureCol.ROOF_FRACTION, MeasureCol.ARITHMETIC_INTENSITY,
                       MeasureCol.DRAM_BYTES_PER_S, MeasureCol.FLOP_PER_S)


def weighted_by_kernel(launches: pl.DataFrame) -> pl.DataFrame:
    """One row per kernel name: launch count, total and mean time, and time-weighted means of
    the throughput figures (launches without a duration or a figure carry no weight)."""
    w = pl.col(NcuCol.DUR).cast(pl.Float64)

    def wmean(col: str) -> pl.Expr:
        valid = pl.col(col).is_not_null() & pl.col(NcuCol.DUR).is_not_null()
        weight = w.filter(valid).sum()
        return (pl.when(weight > 0).then((pl.col(col) * w).filter(valid).sum() / weight)
                .otherwise(None).alias(col))

    return launches.group_by(NcuCol.NAME).agg(
        pl.len().cast(pl.Int64).alias(WeightedCol.LAUNCHES),
        pl.col(NcuCol.DUR).sum().alias(WeightedCol.TOTAL_NS),
        whole_ns(pl.col(NcuCol.DUR).mean()).alias(WeightedCol.MEAN_NS),
        *(wmean(c) for c in WeightedCol.WEIGHTED),
    )
