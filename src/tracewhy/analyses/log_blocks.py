"""Block timers from instrument logs: per rank and block name, its time per step (or chunk) over
the steady window, p50/p90/p99, and its share of the rank's top-level block time.

A log's blocks carry a ``step`` and, in pipelines, a ``chunk``: the unit is the chunk when every
block has one, else the step when every block has one, else the whole log (one unit, nothing
left out as warm-up). The basis is the GPU time when every block has one (CUDA events: host time
of an unsynchronized block is only its launches), else the host time. Shares divide by the
top-level blocks of the same rank: ranks run side by side on separate clocks, so one rank's
blocks never share a denominator with another's. Judging (the attribution line, the
attribution-mode warning) is ``findings/blocks.py``'s.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Final

import numpy as np
import polars as pl

from tracewhy.analyses.stats import nearest_ns
from tracewhy.errors import UsageError
from tracewhy.model.instrument import InstrumentLog, LogBlockCol
from tracewhy.rows import Rows

#: Units (steps or chunks) left out at the start of each rank by default: the first one pays for
#: allocation, compilation and cache fill.
DEFAULT_LOG_WARMUP: Final = 1

CHUNK, STEP, CAPTURE = "chunk", "step", "capture"
HOST, GPU = "host", "gpu"
#: ``sync_mode`` values: every steady instance ended with a synchronize, none, or some.
SYNC, ASYNC, MIXED = "sync", "async", "mixed"


class LogBlocksCol:
    """Columns of ``LogBlocksResult.table`` (one row per rank and block name)."""

    RANK: Final = LogBlockCol.RANK
    NAME: Final = LogBlockCol.NAME
    LEVEL: Final = "level"  # smallest nesting depth of its instances
    INSTANCES: Final = "instances"  # in the steady window
    UNITS: Final = "units"  # steady steps/chunks it ran in
    TOTAL: Final = "total_ns"  # on the basis, over the steady window
    PER_UNIT: Final = "ns_per_unit"  # total over the rank's steady units (a unit it skipped counts 0)
    SHARE: Final = "share"  # of the rank's top-level blocks' total
    #: Of its time per unit, over the units it ran in; each to the nearest nanosecond.
    P50: Final = "p50_ns"
    P90: Final = "p90_ns"
    P99: Final = "p99_ns"
    HOST_TOTAL: Final = "host_total_ns"
    GPU_TOTAL: Final = "gpu_total_ns"  # null where no instance has a GPU time
    SYNC_MODE: Final = "sync_mode"


LOG_BLOCKS_TABLE_SCHEMA: Final = pl.Schema({
    LogBlocksCol.RANK: pl.Int64, LogBlocksCol.NAME: pl.String, LogBlocksCol.LEVEL: pl.Int64,
    LogBlocksCol.INSTANCES: pl.Int64, LogBlocksCol.UNITS: pl.Int64, LogBlocksCol.TOTAL: pl.Int64,
    LogBlocksCol.PER_UNIT: pl.Float64, LogBlocksCol.SHARE: pl.Float64, LogBlocksCol.P50: pl.Int64,
    LogBlocksCol.P90: pl.Int64, LogBlocksCol.P99: pl.Int64, LogBlocksCol.HOST_TOTAL: pl.Int64,
    LogBlocksCol.GPU_TOTAL: pl.Int64, LogBlocksCol.SYNC_MODE: pl.String,
})


class UnitCol:
    """Columns of ``LogBlocksResult.per_unit`` (one row per rank, unit and block name)."""

    RANK: Final = LogBlockCol.RANK
    UNIT: Final = "unit"  # the step or chunk number (0 for a whole-log unit)
    NAME: Final = LogBlockCol.NAME
    NS: Final = "ns"  # on the basis, summed over the block's instances in the unit
    STEADY: Final = "steady"


UNITS_SCHEMA: Final = pl.Schema({
    UnitCol.RANK: pl.Int64, UnitCol.UNIT: pl.Int64, UnitCol.NAME: pl.String, UnitCol.NS: pl.Int64,
    UnitCol.STEADY: pl.Boolean,
})


@dataclass(frozen=True)
class LogBlocksOptions:
    names: tuple[str, ...] = ()  # fnmatch patterns; empty: every block
    warmup: int = DEFAULT_LOG_WARMUP


@dataclass(frozen=True)
class LogBlocksResult(Rows, rows="table", key="name"):
    """``table`` (LOG_BLOCKS_TABLE_SCHEMA): per rank, most time first. ``per_unit``
    (UNITS_SCHEMA): every unit, warm-up included. ``steady_units``: rank -> steady units."""

    source: str
    table: pl.DataFrame
    per_unit: pl.DataFrame
    unit: str  # CHUNK, STEP or CAPTURE
    basis: str  # GPU or HOST
    warmup: int  # units left out per rank (0 for CAPTURE)
    steady_units: dict[int, int]
    sync: bool  # written in attribution mode (header or any block)
    synced_instances: int
    instances: int


def log_blocks(log: InstrumentLog, options: LogBlocksOptions = LogBlocksOptions()) -> LogBlocksResult:
    """Per rank and block name: its time per unit over the steady window and its share."""
    if options.warmup < 0:
        raise UsageError("--warmup must be >= 0")
    b = log.blocks
    if options.names:
        b = b.filter(pl.col(LogBlockCol.NAME).map_elements(
            lambda n: any(fnmatch.fnmatchcase(n, p) for p in options.names), return_dtype=pl.Boolean))
    unit = _unit(b)
    basis = GPU if b.height and b.get_column(LogBlockCol.GPU).null_count() == 0 else HOST
    warmup = 0 if unit == CAPTURE else options.warmup
    value = LogBlockCol.GPU if basis == GPU else LogBlockCol.HOST
    b = b.with_columns((pl.col(unit) if unit != CAPTURE else pl.lit(0, pl.Int64)).alias(UnitCol.UNIT))
    # Per rank, the first ``warmup`` distinct units (in unit order) are warm-up.
    order = pl.col(UnitCol.UNIT).rank("dense").over(LogBlockCol.RANK)
    b = b.with_columns((order > warmup).alias(UnitCol.STEADY))
    per_unit = (
        b.group_by(UnitCol.RANK, UnitCol.UNIT, UnitCol.NAME, maintain_order=True)
        .agg(pl.col(value).sum().alias(UnitCol.NS), pl.col(UnitCol.STEADY).first())
        .sort(UnitCol.RANK, UnitCol.UNIT, UnitCol.NAME)
        .select(*UNITS_SCHEMA)
    )
    steady = b.filter(pl.col(UnitCol.STEADY))
    counts = steady.group_by(LogBlockCol.RANK).agg(pl.col(UnitCol.UNIT).n_unique())
    steady_units = {int(r): int(n) for r, n in counts.iter_rows()}
    table = _table(steady, per_unit.filter(pl.col(UnitCol.STEADY)), value, steady_units)
    synced = int(steady.get_column(LogBlockCol.SYNC).sum()) if steady.height else 0
    return LogBlocksResult(source=log.source, table=table, per_unit=per_unit, unit=unit, basis=basis, warmup=warmup,
                           steady_units=steady_units, sync=log.sync, synced_instances=synced,
                           instances=steady.height)


def _unit(b: pl.DataFrame) -> str:
    if b.height and b.get_column(LogBlockCol.CHUNK).null_count() == 0:
        return CHUNK
    if b.height and b.get_column(LogBlockCol.STEP).null_count() == 0:
        return STEP
    return CAPTURE


def _table(steady: pl.DataFrame, units: pl.DataFrame, value: str, steady_units: dict[int, int]) -> pl.DataFrame:
    n_units = pl.col(LogBlocksCol.RANK).replace_strict(steady_units, return_dtype=pl.Float64)
    sync = pl.col(LogBlockCol.SYNC)
    per_name = steady.group_by(LogBlockCol.RANK, LogBlockCol.NAME).agg(
        pl.col(LogBlockCol.DEPTH).min().alias(LogBlocksCol.LEVEL),
        pl.len().cast(pl.Int64).alias(LogBlocksCol.INSTANCES),
        pl.col(UnitCol.UNIT).n_unique().cast(pl.Int64).alias(LogBlocksCol.UNITS),
        pl.col(value).sum().alias(LogBlocksCol.TOTAL),
        pl.col(LogBlockCol.HOST).sum().alias(LogBlocksCol.HOST_TOTAL),
        pl.when(pl.col(LogBlockCol.GPU).is_not_null().any()).then(pl.col(LogBlockCol.GPU).sum())
        .alias(LogBlocksCol.GPU_TOTAL),
        pl.when(sync.all()).then(pl.lit(SYNC)).when(sync.any()).then(pl.lit(MIXED)).otherwise(pl.lit(ASYNC))
        .alias(LogBlocksCol.SYNC_MODE),
    )
    spread = pl.DataFrame(
        [_percentiles(rank, name, g.get_column(UnitCol.NS)) for (rank, name), g in
         units.group_by(UnitCol.RANK, UnitCol.NAME)],
        schema={LogBlocksCol.RANK: pl.Int64, LogBlocksCol.NAME: pl.String, LogBlocksCol.P50: pl.Int64,
                LogBlocksCol.P90: pl.Int64, LogBlocksCol.P99: pl.Int64}, orient="row",
    )
    top_level = pl.col(LogBlocksCol.LEVEL) == pl.col(LogBlocksCol.LEVEL).min().over(LogBlocksCol.RANK)
    top_total = pl.col(LogBlocksCol.TOTAL).filter(top_level).sum().over(LogBlocksCol.RANK)
    return (
        per_name.join(spread, on=[LogBlocksCol.RANK, LogBlocksCol.NAME], how="left")
        .with_columns(
            (pl.col(LogBlocksCol.TOTAL) / n_units).alias(LogBlocksCol.PER_UNIT),
            pl.when(top_total > 0).then(pl.col(LogBlocksCol.TOTAL) / top_total).alias(LogBlocksCol.SHARE),
        )
        .sort([LogBlocksCol.RANK, LogBlocksCol.TOTAL, LogBlocksCol.NAME], descending=[False, True, False])
        .select(*LOG_BLOCKS_TABLE_SCHEMA)
        .cast(LOG_BLOCKS_TABLE_SCHEMA)
    )


def _percentiles(rank: object, name: object, ns: pl.Series) -> tuple[object, object, int, int, int]:
    p50, p90, p99 = (nearest_ns(float(x)) for x in np.percentile(ns.to_numpy().astype(np.float64), [50, 90, 99]))
    return rank, name, p50, p90, p99
