"""Where each kernel of an Nsight Compute report stands against its roofs: the numbers only.

Per launch: compute and memory throughput as % of peak (speed of light), achieved FLOP/s per
precision and DRAM bandwidth, arithmetic intensity against the device's ridge point, the
occupancy limit and its resource, waves, register spills, coalescing figures and clocks; per
launch and reason, the warp-stall breakdown. ``findings.roofline`` turns these into the bound
and its reasons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

import polars as pl

from tracewhy.analyses.peaks import DevicePeaks, lookup_peaks
from tracewhy.model.ncu import NCU_RULES_SCHEMA, BreakdownCol, NcuCol, NcuReport

#: Stall reasons that are not waits: "selected" is issuing, "not_selected" is ready but another
#: warp was picked. A measurement parameter, not a verdict line: it defines what a stall is, so
#: every stall share (``StallCol.SHARE``) is a share of the cycles warps actually waited.
NON_STALL_REASONS: Final = ("selected", "not_selected")

#: Occupancy limit columns and the resource each stands for.
_LIMITERS: Final = (
    (NcuCol.LIMIT_REGISTERS, "registers"),
    (NcuCol.LIMIT_SHARED, "shared memory"),
    (NcuCol.LIMIT_WARPS, "block size (warps per block)"),
    (NcuCol.LIMIT_BLOCKS, "max blocks per SM"),
    (NcuCol.LIMIT_BARRIERS, "barriers"),
)


class MeasureCol:
    """Measured columns of ``NcuRooflineMeasures.launches`` (beside ncu's launch id, names, duration)."""

    SM_PCT: Final = "sm_pct"
    MEMORY_PCT: Final = "memory_pct"
    DRAM_PCT: Final = "dram_pct"
    L1_PCT: Final = "l1_pct"
    L2_PCT: Final = "l2_pct"
    DRAM_BYTES_PER_S: Final = "dram_bytes_per_s"
    PEAK_DRAM_BYTES_PER_S: Final = "peak_dram_bytes_per_s"
    FP64_FLOP_PER_S: Final = "fp64_flop_per_s"
    FP32_FLOP_PER_S: Final = "fp32_flop_per_s"
    FP16_FLOP_PER_S: Final = "fp16_flop_per_s"
    PRECISION: Final = "precision"  # the precision with the most FLOP/s: the roof the kernel is placed under
    FLOP_PER_S: Final = "flop_per_s"
    PEAK_FLOP_PER_S: Final = "peak_flop_per_s"
    ARITHMETIC_INTENSITY: Final = "arithmetic_intensity"  # FLOP per DRAM byte
    RIDGE_POINT: Final = "ridge_point"
    ROOF_FLOP_PER_S: Final = "roof_flop_per_s"
    ROOF_FRACTION: Final = "roof_fraction"
    TENSOR_PIPE_PCT: Final = "tensor_pipe_pct"
    ACHIEVED_OCCUPANCY_PCT: Final = "achieved_occupancy_pct"
    THEORETICAL_OCCUPANCY_PCT: Final = "theoretical_occupancy_pct"
    OCCUPANCY_LIMITER: Final = "occupancy_limiter"  # the resource(s) with the lowest block limit, when below 100%
    LIMITER_BLOCKS_PER_SM: Final = "limiter_blocks_per_sm"  # that lowest limit
    WAVES_PER_SM: Final = "waves_per_sm"
    GRID_SIZE: Final = "grid_size"
    SM_COUNT: Final = "sm_count"
    LOCAL_MEMORY_INST: Final = "local_memory_inst"
    EXCESS_SECTOR_SHARE: Final = "excess_sector_share"
    SECTORS_PER_LOAD: Final = "sectors_per_load"
    SECTORS_PER_STORE: Final = "sectors_per_store"
    SM_CLOCK_HZ: Final = "sm_clock_hz"
    CLOCK_RATIO: Final = "clock_ratio"  # SM clock over the device's maximum
    CLOCKS_LOCKED_RECORDED: Final = "clocks_locked_recorded"  # ncu's own ClockStatus, when it has one
    RULE_COUNT: Final = "rule_count"


class StallCol:
    """Columns of ``NcuRooflineMeasures.stalls`` beside ``BreakdownCol.LAUNCH``, ``BreakdownCol.VALUE`` and
    ``NcuCol.NAME``."""

    REASON: Final = "reason"
    SHARE: Final = "share"  # of the launch's stall cycles (or samples)
    SOURCE: Final = "source"  # "stall_cycles" (cycles per issued instruction) or "stall_samples"


#: ``NcuRooflineMeasures.stalls``: per launch, each stall reason's value and share, with the kernel's name.
STALLS_SCHEMA: Final = pl.Schema({BreakdownCol.LAUNCH: pl.Int64(), StallCol.REASON: pl.String(),
                                  BreakdownCol.VALUE: pl.Float64(),
                                  StallCol.SHARE: pl.Float64(), StallCol.SOURCE: pl.String(), NcuCol.NAME: pl.String()})
#: ``NcuRooflineMeasures.rules``: ncu's rule messages (NCU_RULES_SCHEMA) with the kernel's name.
RULES_SCHEMA: Final = pl.Schema({**NCU_RULES_SCHEMA, NcuCol.NAME: pl.String()})


@dataclass(frozen=True)
class RooflineOptions:
    device: str | None = None  # GPU name for the peak table when the report does not name one


@dataclass(frozen=True)
class Ceilings:
    """The roofs used: peak FLOP/s per precision and DRAM bytes/s, and where they came from."""

    flop_per_s: dict[str, float] = field(default_factory=dict)
    dram_bytes_per_s: float | None = None
    source: str = "none"


@dataclass(frozen=True)
class NcuRooflineMeasures:
    """Measurements for every launch (``launches``, in report order) of one ncu report.

    ``rules`` holds ncu's messages with the kernel name; ``stalls`` the stall breakdown with
    each reason's share. ``ceilings`` are the longest launch's (its measured clocks are the
    steadiest); ``peaks`` is the peak-table entry used for figures the report lacks;
    ``warnings`` what the reader skipped or reinterpreted.
    """

    path: str
    format: str
    tool_version: str | None
    device_name: str | None
    ceilings: Ceilings
    peaks: DevicePeaks | None
    warnings: tuple[str, ...]
    launches: pl.DataFrame
    rules: pl.DataFrame
    stalls: pl.DataFrame


def _num(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _sum(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _flops_per_cycle(row: dict[str, Any], add: str, mul: str, fma: str) -> float | None:
    a, m, f = _num(row, add), _num(row, mul), _num(row, fma)
    if a is None and m is None and f is None:
        return None
    return (a or 0.0) + (m or 0.0) + 2.0 * (f or 0.0)


def _stalls(report: NcuReport) -> pl.DataFrame:
    """Stall reasons per launch with their share of stall cycles (or of samples as a fallback)."""
    b = report.breakdowns
    groups = [g for g in ("stall_cycles", "stall_samples") if b.filter(pl.col(BreakdownCol.GROUP) == g).height]
    if not groups:
        return pl.DataFrame(schema={c: STALLS_SCHEMA[c] for c in STALLS_SCHEMA if c != NcuCol.NAME})
    frames = []
    for group in groups:
        s = b.filter((pl.col(BreakdownCol.GROUP) == group) & ~pl.col(BreakdownCol.KEY).is_in(list(NON_STALL_REASONS)))
        frames.append(s.with_columns(pl.lit(group).alias(StallCol.SOURCE)))
    s = pl.concat(frames)
    # Prefer cycles-per-issue; samples only for launches that lack them.
    has_cycles = s.filter(pl.col(StallCol.SOURCE) == "stall_cycles").get_column(BreakdownCol.LAUNCH).unique()
    s = s.filter((pl.col(StallCol.SOURCE) == "stall_cycles") | ~pl.col(BreakdownCol.LAUNCH).is_in(has_cycles.implode()))
    return (
        s.with_columns((pl.col(BreakdownCol.VALUE) / pl.col(BreakdownCol.VALUE).sum().over(BreakdownCol.LAUNCH))
                       .alias(StallCol.SHARE))
        .select(BreakdownCol.LAUNCH, pl.col(BreakdownCol.KEY).alias(StallCol.REASON), BreakdownCol.VALUE,
                StallCol.SHARE, StallCol.SOURCE)
        .sort([BreakdownCol.LAUNCH, BreakdownCol.VALUE, StallCol.REASON], descending=[False, True, False])
    )


def _table_peaks(report: NcuReport, options: RooflineOptions) -> DevicePeaks | None:
    names = report.launches.get_column(NcuCol.DEVICE_NAME).drop_nulls()
    sms = report.launches.get_column(NcuCol.SM_COUNT).drop_nulls()
    name = options.device or (names[0] if names.len() else None)
    return lookup_peaks(name, int(sms[0]) if sms.len() else None)


@dataclass(frozen=True)
class _Launch:
    """One launch's raw ncu row, read with NaN as missing."""

    row: dict[str, Any]

    def get(self, key: str) -> float | None:
        return _num(self.row, key)


def _sm_clock(launch: _Launch) -> float | None:
    """The one clock that turns per-cycle counts into rates, for the roof and the achieved alike.

    ncu's roofline sections do the same (peak x sm__cycles_elapsed.avg.per_second, achieved x
    smsp__cycles_elapsed.avg.per_second, equal to each other), so achieved / peak is exactly the
    ratio of the per-cycle counts, whatever the clock. A roof at another clock than the achieved
    point (the GPC clock, as before) misplaces the kernel by the two clocks' ratio.
    """
    return launch.get(NcuCol.SM_CLOCK) or launch.get(NcuCol.SMSP_CLOCK)


def _ceilings(launch: _Launch, table: DevicePeaks | None, clock_ratio: float | None) -> Ceilings:
    flops: dict[str, float] = {}
    sources: set[str] = set()
    clock = _sm_clock(launch)
    for precision, column in (("fp32", NcuCol.FFMA_PEAK), ("fp64", NcuCol.DFMA_PEAK)):
        per_cycle = launch.get(column)
        if per_cycle and clock:
            flops[precision] = 2.0 * per_cycle * clock
            sources.add("report")
    if table is not None:
        # Table compute peaks are at boost clock; a clock-locked run gets the locked share.
        scale = clock_ratio if clock_ratio is not None and clock_ratio < 1.0 else 1.0
        for precision, value in table.flop_per_s.items():
            if precision not in flops:
                flops[precision] = value * scale
                sources.add("table")
    dram = None
    per_cycle = launch.get(NcuCol.DRAM_PEAK_PER_CYCLE)
    dram_clock = launch.get(NcuCol.DRAM_CLOCK)
    if per_cycle and dram_clock:
        dram = per_cycle * dram_clock
        sources.add("report")
    elif table is not None:
        dram = table.dram_bytes_per_s
        sources.add("table")
    return Ceilings(flops, dram, "+".join(sorted(sources)) or "none")


def _clock_ratio(launch: _Launch, table: DevicePeaks | None) -> float | None:
    clock = launch.get(NcuCol.SM_CLOCK)
    top = launch.get(NcuCol.MAX_SM_CLOCK) or (table.boost_clock_hz if table else None)
    return clock / top if clock and top else None


def _throughputs(launch: _Launch, ceil: Ceilings) -> dict[str, float | None]:
    dur = launch.get(NcuCol.DUR)
    dram_rate = launch.get(NcuCol.DRAM_BYTES_PER_S)
    moved = _sum(launch.get(NcuCol.DRAM_READ), launch.get(NcuCol.DRAM_WRITE))
    if dram_rate is None and moved is not None and dur:
        dram_rate = moved * 1e9 / dur
    dram_pct = launch.get(NcuCol.DRAM_PCT)
    if dram_pct is None and dram_rate is not None and ceil.dram_bytes_per_s:
        dram_pct = 100.0 * dram_rate / ceil.dram_bytes_per_s
    mem_pct = launch.get(NcuCol.MEM_PCT)
    if mem_pct is None:
        levels = [v for v in (dram_pct, launch.get(NcuCol.L1_PCT), launch.get(NcuCol.L2_PCT)) if v is not None]
        mem_pct = max(levels) if levels else None
    clock = _sm_clock(launch)
    flops: dict[str, float | None] = {}
    for column, ops in ((MeasureCol.FP64_FLOP_PER_S, (NcuCol.DADD, NcuCol.DMUL, NcuCol.DFMA)),
                        (MeasureCol.FP32_FLOP_PER_S, (NcuCol.FADD, NcuCol.FMUL, NcuCol.FFMA)),
                        (MeasureCol.FP16_FLOP_PER_S, (NcuCol.HADD, NcuCol.HMUL, NcuCol.HFMA))):
        per_cycle = _flops_per_cycle(launch.row, *ops)
        flops[column] = per_cycle * clock if per_cycle is not None and clock else None
    return {MeasureCol.DRAM_BYTES_PER_S: dram_rate, MeasureCol.DRAM_PCT: dram_pct, MeasureCol.MEMORY_PCT: mem_pct,
            **flops}


_PRECISION_COLUMNS: Final = (("fp64", MeasureCol.FP64_FLOP_PER_S), ("fp32", MeasureCol.FP32_FLOP_PER_S),
                             ("fp16", MeasureCol.FP16_FLOP_PER_S))


def _roofline(t: dict[str, float | None], ceil: Ceilings) -> dict[str, Any]:
    """Position against the roof of the precision the kernel used most."""
    achieved = {p: t[column] for p, column in _PRECISION_COLUMNS}
    used = {p: v for p, v in achieved.items() if v}
    out: dict[str, Any] = {MeasureCol.PRECISION: None, MeasureCol.FLOP_PER_S: None, MeasureCol.PEAK_FLOP_PER_S: None,
                           MeasureCol.ARITHMETIC_INTENSITY: None, MeasureCol.RIDGE_POINT: None,
                           MeasureCol.ROOF_FLOP_PER_S: None, MeasureCol.ROOF_FRACTION: None}
    if not used:
        # No floating-point work: the only roof is DRAM bandwidth.
        bw = t[MeasureCol.DRAM_BYTES_PER_S]
        if bw and ceil.dram_bytes_per_s:
            out[MeasureCol.ROOF_FRACTION] = bw / ceil.dram_bytes_per_s
        return out
    precision = max(used, key=lambda p: used[p])
    peak = ceil.flop_per_s.get("fp16_tensor" if precision == "fp16" else precision)
    flop_rate = used[precision]
    out.update({MeasureCol.PRECISION: precision, MeasureCol.FLOP_PER_S: flop_rate, MeasureCol.PEAK_FLOP_PER_S: peak})
    bw = t[MeasureCol.DRAM_BYTES_PER_S]
    if bw:
        ai = flop_rate / bw
        out[MeasureCol.ARITHMETIC_INTENSITY] = ai
        if peak and ceil.dram_bytes_per_s:
            roof = min(peak, ai * ceil.dram_bytes_per_s)
            out.update({MeasureCol.RIDGE_POINT: peak / ceil.dram_bytes_per_s, MeasureCol.ROOF_FLOP_PER_S: roof,
                        MeasureCol.ROOF_FRACTION: flop_rate / roof})
    return out


def _occupancy(launch: _Launch) -> dict[str, Any]:
    """The resource(s) with the lowest block limit, when theoretical occupancy is below 100%."""
    theoretical = launch.get(NcuCol.OCC_THEORETICAL)
    present = [(v, what) for v, what in ((launch.get(col), what) for col, what in _LIMITERS) if v is not None]
    if not present or theoretical is None or theoretical >= 100.0:
        return {MeasureCol.OCCUPANCY_LIMITER: None, MeasureCol.LIMITER_BLOCKS_PER_SM: None}
    low = min(v for v, _ in present)
    return {MeasureCol.OCCUPANCY_LIMITER: " and ".join(w for v, w in present if v == low),
            MeasureCol.LIMITER_BLOCKS_PER_SM: low}


def _memory_access(launch: _Launch) -> dict[str, Any]:
    """Local-memory instructions (spills), excess L2 sectors and sectors per global request."""
    out: dict[str, Any] = {MeasureCol.LOCAL_MEMORY_INST: _sum(launch.get(NcuCol.LOCAL_LOADS),
                                                              launch.get(NcuCol.LOCAL_STORES)),
                           MeasureCol.EXCESS_SECTOR_SHARE: None, MeasureCol.SECTORS_PER_LOAD: None,
                           MeasureCol.SECTORS_PER_STORE: None}
    excess, ideal = launch.get(NcuCol.L2_EXCESS_SECTORS), launch.get(NcuCol.L2_IDEAL_SECTORS)
    if excess is not None and ideal:
        out[MeasureCol.EXCESS_SECTOR_SHARE] = excess / (excess + ideal)
    for column, sectors, requests in ((MeasureCol.SECTORS_PER_LOAD, NcuCol.GLOBAL_LD_SECTORS,
                                       NcuCol.GLOBAL_LD_REQUESTS),
                                      (MeasureCol.SECTORS_PER_STORE, NcuCol.GLOBAL_ST_SECTORS,
                                       NcuCol.GLOBAL_ST_REQUESTS)):
        s, r = launch.get(sectors), launch.get(requests)
        if s is not None and r:
            out[column] = s / r
    return out


#: Dtypes of ``NcuRooflineMeasures.launches``; findings' launch table takes its measured columns' from here.
MEASURES_SCHEMA: Final = {
    NcuCol.LAUNCH: pl.Int64, NcuCol.NAME: pl.String, NcuCol.DEMANGLED: pl.String, NcuCol.DUR: pl.Int64,
    MeasureCol.SM_PCT: pl.Float64, MeasureCol.MEMORY_PCT: pl.Float64, MeasureCol.DRAM_PCT: pl.Float64,
    MeasureCol.L1_PCT: pl.Float64, MeasureCol.L2_PCT: pl.Float64, MeasureCol.DRAM_BYTES_PER_S: pl.Float64,
    MeasureCol.PEAK_DRAM_BYTES_PER_S: pl.Float64, MeasureCol.FP64_FLOP_PER_S: pl.Float64,
    MeasureCol.FP32_FLOP_PER_S: pl.Float64, MeasureCol.FP16_FLOP_PER_S: pl.Float64, MeasureCol.PRECISION: pl.String,
    MeasureCol.FLOP_PER_S: pl.Float64, MeasureCol.PEAK_FLOP_PER_S: pl.Float64,
    MeasureCol.ARITHMETIC_INTENSITY: pl.Float64,
    MeasureCol.RIDGE_POINT: pl.Float64, MeasureCol.ROOF_FLOP_PER_S: pl.Float64, MeasureCol.ROOF_FRACTION: pl.Float64,
    MeasureCol.TENSOR_PIPE_PCT: pl.Float64, MeasureCol.ACHIEVED_OCCUPANCY_PCT: pl.Float64,
    MeasureCol.THEORETICAL_OCCUPANCY_PCT: pl.Float64, MeasureCol.OCCUPANCY_LIMITER: pl.String,
    MeasureCol.LIMITER_BLOCKS_PER_SM: pl.Float64, MeasureCol.WAVES_PER_SM: pl.Float64, MeasureCol.GRID_SIZE: pl.Float64,
    MeasureCol.SM_COUNT: pl.Float64, MeasureCol.LOCAL_MEMORY_INST: pl.Float64,
    MeasureCol.EXCESS_SECTOR_SHARE: pl.Float64,
    MeasureCol.SECTORS_PER_LOAD: pl.Float64, MeasureCol.SECTORS_PER_STORE: pl.Float64,
    MeasureCol.SM_CLOCK_HZ: pl.Float64,
    MeasureCol.CLOCK_RATIO: pl.Float64, MeasureCol.CLOCKS_LOCKED_RECORDED: pl.Boolean, MeasureCol.RULE_COUNT: pl.Int64,
}


def measure_roofline(report: NcuReport, options: RooflineOptions = RooflineOptions()) -> NcuRooflineMeasures:
    table = _table_peaks(report, options)
    rule_counts: dict[int, int] = {}
    for launch_id in report.rules.get_column(NcuCol.LAUNCH).to_list():
        rule_counts[launch_id] = rule_counts.get(launch_id, 0) + 1
    rows: list[dict[str, Any]] = []
    # Report-wide ceilings are those of the longest launch: its measured clocks are the steadiest.
    ceilings, longest = Ceilings(), -1
    for raw in report.launches.iter_rows(named=True):
        launch = _Launch(raw)
        ratio = _clock_ratio(launch, table)
        ceil = _ceilings(launch, table, ratio)
        if (raw[NcuCol.DUR] or 0) > longest:
            ceilings, longest = ceil, raw[NcuCol.DUR] or 0
        t = _throughputs(launch, ceil)
        rows.append({
            NcuCol.LAUNCH: raw[NcuCol.LAUNCH], NcuCol.NAME: raw[NcuCol.NAME], NcuCol.DEMANGLED: raw[NcuCol.DEMANGLED],
            NcuCol.DUR: raw[NcuCol.DUR], **t, **_roofline(t, ceil), **_occupancy(launch), **_memory_access(launch),
            MeasureCol.SM_PCT: launch.get(NcuCol.SM_PCT), MeasureCol.L1_PCT: launch.get(NcuCol.L1_PCT),
            MeasureCol.L2_PCT: launch.get(NcuCol.L2_PCT), MeasureCol.PEAK_DRAM_BYTES_PER_S: ceil.dram_bytes_per_s,
            MeasureCol.TENSOR_PIPE_PCT: launch.get(NcuCol.TENSOR_PCT),
            MeasureCol.ACHIEVED_OCCUPANCY_PCT: launch.get(NcuCol.OCC_ACHIEVED),
            MeasureCol.THEORETICAL_OCCUPANCY_PCT: launch.get(NcuCol.OCC_THEORETICAL),
            MeasureCol.WAVES_PER_SM: launch.get(NcuCol.WAVES), MeasureCol.GRID_SIZE: launch.get(NcuCol.GRID_SIZE),
            MeasureCol.SM_COUNT: launch.get(NcuCol.SM_COUNT), MeasureCol.SM_CLOCK_HZ: launch.get(NcuCol.SM_CLOCK),
            MeasureCol.CLOCK_RATIO: ratio, MeasureCol.CLOCKS_LOCKED_RECORDED: raw[NcuCol.CLOCKS_LOCKED],
            MeasureCol.RULE_COUNT: rule_counts.get(raw[NcuCol.LAUNCH], 0),
        })
    names = report.launches.get_column(NcuCol.DEVICE_NAME).drop_nulls()
    device = names[0] if names.len() else (table.name if table else options.device)
    kernel_names = report.launches.select(NcuCol.LAUNCH, NcuCol.NAME)
    return NcuRooflineMeasures(
        path=report.path, format=report.format, tool_version=report.tool_version, device_name=device,
        ceilings=ceilings, peaks=table, warnings=tuple(report.warnings),
        launches=pl.DataFrame(rows, schema=MEASURES_SCHEMA, strict=False),
        rules=report.rules.join(kernel_names, on=NcuCol.LAUNCH, how="left"),
        stalls=_stalls(report).join(kernel_names, on=NcuCol.LAUNCH, how="left"),
    )
