"""Memory compared: the ranks of one job (each rank's peak, the imbalance, and the allocation
sites whose live bytes at the peak differ from rank to rank), and run A against run B of one
program (what grew: the peak, reserved against allocated, and the bytes live at the peak per
allocation site, beyond the noise the runs' own steps show).

Each input is first summarized as a ``MemoryCapture`` (its device's peak and the bytes live at it
by site), from a profile_memory trace (site: the allocating op, the user's frame where the trace
has Python frames, and the block's size class) or an allocator snapshot (site: the allocation's
top user frame).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import polars as pl

from tracewhy.analyses.memory import DeviceMemory, MemoryResult
from tracewhy.analyses.memory_ledger import LIVE_SITES_SCHEMA, LiveSiteCol
from tracewhy.analyses.memory_snapshot import LiveCol, SnapshotDevice, SnapshotResult
from tracewhy.rows import Rows

#: The least a difference must be to count as beyond noise, as a share of the larger peak: the
#: bytes of one program's allocations move between runs by less than this (padding, the
#: allocator's rounding, sizes that follow the data), even where a trace's steps show no spread.
NOISE_FLOOR_SHARE: Final = 0.005
SITE_KEY: Final = (LiveSiteCol.OP, LiveSiteCol.FRAME, LiveSiteCol.SIZE_CLASS)


@dataclass(frozen=True)
class MemoryCapture:
    """One input's memory, reduced to what comparisons need: its device (the accelerator with the
    highest peak, else the CPU), the peak, and the bytes live at the peak by site (LIVE_SITES_SCHEMA,
    adding up to the peak)."""

    source: str
    kind: str  # "trace" or "snapshot"
    device: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int | None
    reserved_at_peak_bytes: int | None
    #: Each steady step's own peak (traces with steps); empty for a snapshot.
    step_peaks_bytes: tuple[int, ...]
    sites: pl.DataFrame
    peak_step: str | None = None

    @property
    def slack_at_peak_bytes(self) -> int | None:
        """Reserved but not allocated at the peak."""
        if self.reserved_at_peak_bytes is None:
            return None
        return max(self.reserved_at_peak_bytes - self.peak_allocated_bytes, 0)

    @property
    def step_spread_bytes(self) -> int:
        """How far the peak moves from one steady step to another (0 under two steps)."""
        return max(self.step_peaks_bytes) - min(self.step_peaks_bytes) if len(self.step_peaks_bytes) > 1 else 0


def trace_capture(result: MemoryResult, source: str) -> MemoryCapture | None:
    """A profile_memory trace's capture; None without memory events."""
    if not result.devices:
        return None
    accelerators = [d for d in result.devices if d.device != "cpu"]
    d: DeviceMemory = max(accelerators or result.devices, key=lambda x: (x.peak_allocated_bytes, x.device))
    return MemoryCapture(source, "trace", d.device, d.peak_allocated_bytes, d.peak_reserved_bytes,
                         d.reserved_at_peak_bytes, d.steady_step_peaks_bytes, d.live_sites, d.peak_step)


def snapshot_capture(result: SnapshotResult, source: str) -> MemoryCapture | None:
    """An allocator snapshot's capture, of its device with the highest peak; None without devices.
    Its sites are the live blocks' top user frames (the snapshot keeps no op names)."""
    if not result.devices:
        return None
    d: SnapshotDevice = max(result.devices, key=lambda x: (x.peak_allocated_bytes, -x.device))
    live = d.live_at_peak
    sites = pl.DataFrame({
        LiveSiteCol.OP: [None] * live.height, LiveSiteCol.FRAME: live.get_column(LiveCol.FRAME),
        LiveSiteCol.SIZE_CLASS: [None] * live.height, LiveSiteCol.BLOCKS: live.get_column(LiveCol.BLOCKS),
        LiveSiteCol.BYTES: live.get_column(LiveCol.BYTES)}, schema=LIVE_SITES_SCHEMA)
    return MemoryCapture(source, "snapshot", f"cuda:{d.device}", d.peak_allocated_bytes, d.peak_reserved_bytes,
                         d.reserved_at_peak_bytes, (), sites)


class GrowthCol:
    """Columns of ``MemoryGrowth.sites``: bytes live at each side's peak per site, the largest
    growth first."""

    OP: Final = LiveSiteCol.OP
    FRAME: Final = LiveSiteCol.FRAME
    SIZE_CLASS: Final = LiveSiteCol.SIZE_CLASS
    A_BYTES: Final = "a_bytes"
    B_BYTES: Final = "b_bytes"
    GROWTH: Final = "growth_bytes"  # B less A; negative where B holds less
    BEYOND_NOISE: Final = "beyond_noise"  # |growth| above MemoryGrowth.noise_bytes


GROWTH_SCHEMA: Final = pl.Schema({GrowthCol.OP: pl.String(), GrowthCol.FRAME: pl.String(),
                                  GrowthCol.SIZE_CLASS: pl.Int64(), GrowthCol.A_BYTES: pl.Int64(),
                                  GrowthCol.B_BYTES: pl.Int64(), GrowthCol.GROWTH: pl.Int64(),
                                  GrowthCol.BEYOND_NOISE: pl.Boolean()})


class MemoryMeasureCol:
    """Columns of ``MemoryGrowth.measures``: the whole-run measures of A and B."""

    MEASURE: Final = "measure"  # "peak_allocated", "peak_reserved", "reserved_at_peak", "slack_at_peak"
    A_BYTES: Final = GrowthCol.A_BYTES
    B_BYTES: Final = GrowthCol.B_BYTES
    GROWTH: Final = GrowthCol.GROWTH
    BEYOND_NOISE: Final = GrowthCol.BEYOND_NOISE


MEASURES_SCHEMA: Final = pl.Schema({MemoryMeasureCol.MEASURE: pl.String(), MemoryMeasureCol.A_BYTES: pl.Int64(),
                                    MemoryMeasureCol.B_BYTES: pl.Int64(), MemoryMeasureCol.GROWTH: pl.Int64(),
                                    MemoryMeasureCol.BEYOND_NOISE: pl.Boolean()})


OP_GROWTH_SCHEMA: Final = pl.Schema({GrowthCol.OP: pl.String(), GrowthCol.A_BYTES: pl.Int64(),
                                     GrowthCol.B_BYTES: pl.Int64(), GrowthCol.GROWTH: pl.Int64(),
                                     GrowthCol.BEYOND_NOISE: pl.Boolean()})


@dataclass(frozen=True)
class MemoryGrowth(Rows, rows="sites"):
    """Run B against run A. ``noise_bytes``: the larger of either run's step-to-step spread of its
    peak and NOISE_FLOOR_SHARE of the larger peak; a difference within it is noise."""

    a: MemoryCapture
    b: MemoryCapture
    noise_bytes: int
    measures: pl.DataFrame  # MEASURES_SCHEMA
    sites: pl.DataFrame  # GROWTH_SCHEMA
    #: The sites summed per op (OP_GROWTH_SCHEMA), largest growth first: an op whose blocks moved
    #: to another size class nets out here. Empty for snapshots, which name no ops.
    ops: pl.DataFrame

    @property
    def peak_growth_bytes(self) -> int:
        return self.b.peak_allocated_bytes - self.a.peak_allocated_bytes


def _site_key(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with a string key per site (nulls included), to join sites across inputs."""
    return df.with_columns(pl.concat_str([pl.col(c).cast(pl.String).fill_null("\x00") for c in SITE_KEY],
                                         separator="\x1f").alias("_key"))


def comparable_sites(tables: Sequence[pl.DataFrame]) -> list[pl.DataFrame]:
    """``tables`` (LIVE_SITES_SCHEMA) made comparable: where some name Python frames and others
    name none (captured without with_stack), the frames are dropped from all and the rows they
    split merged, so that one site is one row on every side."""
    named = [t.get_column(LiveSiteCol.FRAME).null_count() < t.height for t in tables]
    if all(named) or not any(named):
        return list(tables)
    return [t.group_by(LiveSiteCol.OP, LiveSiteCol.SIZE_CLASS)
            .agg(pl.col(LiveSiteCol.BLOCKS).sum(), pl.col(LiveSiteCol.BYTES).sum())
            .with_columns(pl.lit(None, dtype=pl.String).alias(LiveSiteCol.FRAME))
            .select(list(LIVE_SITES_SCHEMA)).cast(LIVE_SITES_SCHEMA) for t in tables]


def compare_runs(a: MemoryCapture, b: MemoryCapture) -> MemoryGrowth:
    """What grew from A to B: the whole-run measures, and per site the bytes live at each peak."""
    noise = max(a.step_spread_bytes, b.step_spread_bytes,
                int(NOISE_FLOOR_SHARE * max(a.peak_allocated_bytes, b.peak_allocated_bytes)))
    beyond = pl.col(GrowthCol.GROWTH).abs() > noise
    a_sites, b_sites = comparable_sites([a.sites, b.sites])
    sites = (
        _site_key(a_sites).select("_key", *SITE_KEY, pl.col(LiveSiteCol.BYTES).alias(GrowthCol.A_BYTES))
        .join(_site_key(b_sites).select("_key", *SITE_KEY, pl.col(LiveSiteCol.BYTES).alias(GrowthCol.B_BYTES)),
              on="_key", how="full", coalesce=False)
        .select(*[pl.coalesce(c, f"{c}_right").alias(c) for c in SITE_KEY],
                pl.col(GrowthCol.A_BYTES).fill_null(0), pl.col(GrowthCol.B_BYTES).fill_null(0))
        .with_columns((pl.col(GrowthCol.B_BYTES) - pl.col(GrowthCol.A_BYTES)).alias(GrowthCol.GROWTH))
        .with_columns(beyond.alias(GrowthCol.BEYOND_NOISE))
        .cast(GROWTH_SCHEMA)
        .sort([GrowthCol.GROWTH, *SITE_KEY], descending=[True, False, False, False], nulls_last=True)
    )
    rows = [("peak_allocated", a.peak_allocated_bytes, b.peak_allocated_bytes),
            ("peak_reserved", a.peak_reserved_bytes, b.peak_reserved_bytes),
            ("reserved_at_peak", a.reserved_at_peak_bytes, b.reserved_at_peak_bytes),
            ("slack_at_peak", a.slack_at_peak_bytes, b.slack_at_peak_bytes)]
    m_ = MemoryMeasureCol
    measures = pl.DataFrame([(m, x, y) for m, x, y in rows], schema=[m_.MEASURE, m_.A_BYTES, m_.B_BYTES], orient="row")
    measures = measures.with_columns((pl.col(m_.B_BYTES) - pl.col(m_.A_BYTES)).alias(m_.GROWTH)
                                     ).with_columns(beyond.fill_null(False).alias(m_.BEYOND_NOISE))
    ops = (
        sites.filter(pl.col(GrowthCol.OP).is_not_null())
        .group_by(GrowthCol.OP).agg(pl.col(GrowthCol.A_BYTES).sum(), pl.col(GrowthCol.B_BYTES).sum())
        .with_columns((pl.col(GrowthCol.B_BYTES) - pl.col(GrowthCol.A_BYTES)).alias(GrowthCol.GROWTH))
        .with_columns(beyond.alias(GrowthCol.BEYOND_NOISE))
        .cast(OP_GROWTH_SCHEMA)
        .sort([GrowthCol.GROWTH, GrowthCol.OP], descending=[True, False])
    )
    return MemoryGrowth(a, b, noise, measures.cast(MEASURES_SCHEMA), sites, ops)


@dataclass(frozen=True)
class RankCapture:
    """A rank's capture and how its rank was decided: "distributedInfo", "snapshot device" or
    "file name"."""

    rank: int
    rank_from: str
    capture: MemoryCapture


class RankMemCol:
    """Columns of ``MemoryRanks.ranks``: one row per rank, in rank order."""

    RANK: Final = "rank"
    RANK_FROM: Final = "rank_from"
    SOURCE: Final = "source"
    DEVICE: Final = "device"
    PEAK_ALLOCATED: Final = "peak_allocated_bytes"
    PEAK_RESERVED: Final = "peak_reserved_bytes"
    RESERVED_AT_PEAK: Final = "reserved_at_peak_bytes"
    PEAK_STEP: Final = "peak_step"
    ABOVE_MEDIAN: Final = "above_median_bytes"  # peak allocated less the ranks' median


RANK_MEMORY_SCHEMA: Final = pl.Schema({RankMemCol.RANK: pl.Int64(), RankMemCol.RANK_FROM: pl.String(),
                                       RankMemCol.SOURCE: pl.String(), RankMemCol.DEVICE: pl.String(),
                                       RankMemCol.PEAK_ALLOCATED: pl.Int64(), RankMemCol.PEAK_RESERVED: pl.Int64(),
                                       RankMemCol.RESERVED_AT_PEAK: pl.Int64(), RankMemCol.PEAK_STEP: pl.String(),
                                       RankMemCol.ABOVE_MEDIAN: pl.Int64()})


class RankSiteCol:
    """Columns of ``MemoryRanks.sites``: per site, the bytes live at each rank's own peak; the
    sites that differ most between ranks first."""

    OP: Final = LiveSiteCol.OP
    FRAME: Final = LiveSiteCol.FRAME
    SIZE_CLASS: Final = LiveSiteCol.SIZE_CLASS
    MAX_RANK: Final = "max_rank"  # the rank holding the most (the lowest such rank on a tie)
    MAX_BYTES: Final = "max_bytes"
    MIN_RANK: Final = "min_rank"
    MIN_BYTES: Final = "min_bytes"  # 0 where some rank holds none
    MEDIAN_BYTES: Final = "median_bytes"
    SPREAD: Final = "spread_bytes"  # max less min
    BY_RANK: Final = "bytes_by_rank"  # in rank order, as ``ranks`` lists them


RANK_SITES_SCHEMA: Final = pl.Schema({RankSiteCol.OP: pl.String(), RankSiteCol.FRAME: pl.String(),
                                      RankSiteCol.SIZE_CLASS: pl.Int64(), RankSiteCol.MAX_RANK: pl.Int64(),
                                      RankSiteCol.MAX_BYTES: pl.Int64(), RankSiteCol.MIN_RANK: pl.Int64(),
                                      RankSiteCol.MIN_BYTES: pl.Int64(), RankSiteCol.MEDIAN_BYTES: pl.Float64(),
                                      RankSiteCol.SPREAD: pl.Int64(), RankSiteCol.BY_RANK: pl.List(pl.Int64())})


@dataclass(frozen=True)
class MemoryRanks(Rows, rows="ranks", key="rank"):
    """The ranks' memory: each rank's peak (``ranks``), the highest against the median, and the
    sites whose bytes live at the peak differ between ranks (``sites``)."""

    ranks: pl.DataFrame  # RANK_MEMORY_SCHEMA
    max_rank: int
    max_peak_bytes: int
    median_peak_bytes: float
    sites: pl.DataFrame  # RANK_SITES_SCHEMA

    @property
    def imbalance(self) -> float | None:
        """The highest rank's peak over the median peak; None where the median is 0."""
        return self.max_peak_bytes / self.median_peak_bytes if self.median_peak_bytes else None


def compare_rank_memory(ranks: Sequence[RankCapture]) -> MemoryRanks:
    """``ranks``: one capture per rank, in rank order."""
    peaks = np.array([r.capture.peak_allocated_bytes for r in ranks], dtype=np.int64)
    median = float(np.median(peaks))
    top = int(np.argmax(peaks))
    table = pl.DataFrame([(r.rank, r.rank_from, r.capture.source, r.capture.device, r.capture.peak_allocated_bytes,
                           r.capture.peak_reserved_bytes, r.capture.reserved_at_peak_bytes, r.capture.peak_step,
                           round(r.capture.peak_allocated_bytes - median)) for r in ranks],
                         schema=RANK_MEMORY_SCHEMA, orient="row")
    return MemoryRanks(table, ranks[top].rank, int(peaks[top]), median, _rank_sites(ranks))


def _rank_sites(ranks: Sequence[RankCapture]) -> pl.DataFrame:
    keyed = [_site_key(t) for t in comparable_sites([r.capture.sites for r in ranks])]
    names = pl.concat([k.select("_key", *SITE_KEY) for k in keyed]).unique("_key", keep="first")
    wide = names.sort("_key")
    for i, k in enumerate(keyed):
        wide = wide.join(k.select("_key", pl.col(LiveSiteCol.BYTES).alias(f"_r{i}")), on="_key", how="left")
    per_rank = wide.select([pl.col(f"_r{i}").fill_null(0) for i in range(len(ranks))]).to_numpy().astype(np.int64)
    labels = np.array([r.rank for r in ranks], dtype=np.int64)
    hi, lo = per_rank.argmax(axis=1), per_rank.argmin(axis=1)
    rows = np.arange(per_rank.shape[0])
    return (
        wide.select(*SITE_KEY)
        .with_columns(pl.Series(RankSiteCol.MAX_RANK, labels[hi]), pl.Series(RankSiteCol.MAX_BYTES, per_rank[rows, hi]),
                      pl.Series(RankSiteCol.MIN_RANK, labels[lo]), pl.Series(RankSiteCol.MIN_BYTES, per_rank[rows, lo]),
                      pl.Series(RankSiteCol.MEDIAN_BYTES, np.median(per_rank, axis=1) if per_rank.size else []),
                      pl.Series(RankSiteCol.SPREAD, per_rank[rows, hi] - per_rank[rows, lo]),
                      pl.Series(RankSiteCol.BY_RANK, per_rank.tolist(), dtype=pl.List(pl.Int64())))
        .cast(RANK_SITES_SCHEMA)
        .sort([RankSiteCol.SPREAD, RankSiteCol.MAX_BYTES, *SITE_KEY], descending=[True, True, False, False, False],
              nulls_last=True)
    )
