"""Roofline verdicts of an Nsight Compute report: which limit each kernel hits, and why, in words.

``analyses.roofline`` measures; this module judges those numbers against ``findings.thresholds``
(the roofline section): the bound of every launch and kernel, the reason and details behind it,
and the ncu rule to lead with; ``join_ncu`` carries the verdicts onto a trace's kernels. The
report-wide notes are ``findings/roofline_notes.py``'s, the verdicts of ops from their recorded
shapes ``findings/roofline_ops.py``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

import polars as pl

from tracewhy.analyses.roofline import (
    MEASURES_SCHEMA,
    Ceilings,
    MeasureCol,
    NcuRooflineMeasures,
    RooflineOptions,
    StallCol,
    measure_roofline,
)
from tracewhy.analyses.roofline_join import demangled_names, match_ncu_names
from tracewhy.analyses.roofline_weighted import WeightedCol, weighted_by_kernel
from tracewhy.findings import thresholds as th
from tracewhy.findings.roofline_notes import ncu_notes
from tracewhy.model.ncu import BreakdownCol, NcuCol, NcuReport, RuleCol
from tracewhy.rows import Rows

MEMORY_BOUND: Final = "memory-bound"
COMPUTE_BOUND: Final = "compute-bound"
LATENCY_BOUND: Final = "latency-bound"
UNKNOWN: Final = "unknown"
BOUNDS: Final = (MEMORY_BOUND, COMPUTE_BOUND, LATENCY_BOUND, UNKNOWN)

#: Grid notes: fewer blocks than one wave, or a last wave mostly empty.
SMALL_GRID: Final = "small grid"
TAIL: Final = "tail"


class VerdictCol:
    """Verdict columns of ``NcuRooflineResult.launches`` and ``kernels`` (beside ``MeasureCol``'s)."""

    BOUND: Final = "bound"
    REASON: Final = "reason"
    DETAILS: Final = "details"  # "; "-separated sentences
    GRID_NOTE: Final = "grid_note"  # SMALL_GRID, TAIL or null
    UNCOALESCED: Final = "uncoalesced"
    TOP_STALLS: Final = "top_stalls"
    CLOCKS_LOCKED: Final = "clocks_locked"
    TOP_RULE: Final = "top_rule"
    TOP_RULE_SPEEDUP_PCT: Final = "top_rule_speedup_pct"
    TOP_RULE_SPEEDUP_TYPE: Final = "top_rule_speedup_type"
    BOUNDS: Final = "bounds"  # kernels: every bound its launches got
    SHARE: Final = "share"  # kernels: share of all launches' time


#: What each warp-stall reason means, in the words the verdicts use.
STALL_MEANING: Final = {
    "long_scoreboard": "waiting on global/local memory",
    "short_scoreboard": "waiting on shared memory or special-function results",
    "wait": "fixed-latency instruction dependencies",
    "math_pipe_throttle": "math pipes busy",
    "mio_throttle": "shared-memory/special-function queue full",
    "lg_throttle": "global/local memory queue full",
    "tex_throttle": "texture queue full",
    "barrier": "waiting at block barriers",
    "membar": "waiting on memory fences",
    "branch_resolving": "resolving branch targets",
    "no_instruction": "instruction-cache misses",
    "no_instructions": "instruction-cache misses",
    "imc_miss": "constant-cache misses",
    "drain": "draining stores at exit",
    "dispatch_stall": "dispatch stalls",
    "sleeping": "sleeping",
    "misc": "miscellaneous",
}

#: Rank of ncu's speedup types, best first. NvRules (IFrontend.SpeedupType) defines GLOBAL as
#: "the proportional reduction in runtime of the entire workload" and LOCAL as "the proportional
#: increase in efficiency of the hardware usage when viewing the performance problem in
#: isolation": only a global figure is a share of the kernel's time, so a local 98.9% (a pipe
#: that is idle, in a memory-bound copy) says less than a global 74% (uncoalesced accesses).
#: A rule whose export gives no type (CSV pages without the column) ranks between the two.
SPEEDUP_TYPE_RANK: Final = {"global": 0, None: 1, "local": 2}


@dataclass(frozen=True)
class NcuRooflineResult(Rows, rows="kernels", key="name"):
    """Verdicts for every launch (``launches``) and kernel name (``kernels``), longest first.

    ``rules`` holds ncu's messages with the kernel name; ``stalls`` the stall breakdown with
    each reason's share of stall cycles. ``notes`` are report-wide caveats (clock locking,
    where the peaks came from).
    """

    path: str
    format: str
    tool_version: str | None
    device_name: str | None
    ceilings: Ceilings
    clocks_locked: bool | None
    launches: pl.DataFrame
    kernels: pl.DataFrame
    rules: pl.DataFrame
    stalls: pl.DataFrame
    notes: tuple[str, ...]


# --- ncu: one launch ---------------------------------------------------------------------------


def _fmt_rate(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _occupancy_details(m: dict[str, Any]) -> tuple[str | None, list[str]]:
    """(grid note, details) from occupancy, waves and tails."""
    details: list[str] = []
    achieved, theoretical = m[MeasureCol.ACHIEVED_OCCUPANCY_PCT], m[MeasureCol.THEORETICAL_OCCUPANCY_PCT]
    limiter = m[MeasureCol.OCCUPANCY_LIMITER]
    if limiter is not None and theoretical < th.LOW_THEORETICAL_OCCUPANCY_PCT:
        details.append(f"theoretical occupancy {theoretical:.0f}% is limited by {limiter} "
                       f"({m[MeasureCol.LIMITER_BLOCKS_PER_SM]:.0f} blocks per SM)")
    if achieved is not None and theoretical and achieved < th.OCCUPANCY_GAP_RATIO * theoretical:
        details.append(f"achieved occupancy {achieved:.0f}% is well below the theoretical {theoretical:.0f}% "
                       "(load imbalance, a tail, or too few blocks)")
    waves = m[MeasureCol.WAVES_PER_SM]
    grid_note = None
    if waves is not None:
        blocks, sms = m[MeasureCol.GRID_SIZE], m[MeasureCol.SM_COUNT]
        if waves < th.FULL_WAVE:
            grid_note = SMALL_GRID
            extra = f" ({blocks:.0f} blocks for {sms:.0f} SMs)" if blocks and sms else ""
            details.append(f"the grid fills only {waves:.2f} of one wave{extra}: SMs sit idle")
        elif waves < th.TAIL_MAX_WAVES:
            fill = waves - math.floor(waves)
            if 0.0 < fill < th.TAIL_FILL_BELOW:
                grid_note = TAIL
                details.append(f"{waves:.2f} waves: the last wave is {fill:.0%} full, so SMs idle through it")
    return grid_note, details


def _memory_details(m: dict[str, Any]) -> tuple[bool | None, list[str]]:
    """(uncoalesced, details) from spills and the coalescing figures."""
    local = m[MeasureCol.LOCAL_MEMORY_INST]
    spills = ([f"{local:,.0f} local-memory instructions: register spills (or local arrays) go to memory"]
              if local else [])
    flags: list[str] = []
    share = m[MeasureCol.EXCESS_SECTOR_SHARE]
    if share is not None and share >= th.EXCESS_SECTORS_SHARE:
        flags.append(f"{share:.0%} of global-memory sectors are excess (uncoalesced)")
    for kind, column in (("load", MeasureCol.SECTORS_PER_LOAD), ("store", MeasureCol.SECTORS_PER_STORE)):
        ratio = m[column]
        if ratio is not None and ratio >= th.UNCOALESCED_SECTORS_PER_REQUEST:
            flags.append(f"global {kind}s touch {ratio:.0f} sectors per request (uncoalesced)")
    # No coalescing figure at all: unknown, not "coalesced".
    measured = any(m[c] is not None for c in (MeasureCol.EXCESS_SECTOR_SHARE, MeasureCol.SECTORS_PER_LOAD,
                                              MeasureCol.SECTORS_PER_STORE))
    return bool(flags) if measured else None, spills + flags


def _stall_text(stalls: list[dict[str, Any]]) -> str | None:
    if not stalls:
        return None
    parts = []
    for s in stalls[:2]:
        reason = s[StallCol.REASON]
        meaning = STALL_MEANING.get(reason, reason.replace("_", " "))
        unit = " cycles/instr" if s[StallCol.SOURCE] == "stall_cycles" else " samples"
        parts.append(f"{reason} ({meaning}; {s[StallCol.SHARE]:.0%}, {s[BreakdownCol.VALUE]:.1f}{unit})")
    return "warps stall mostly on " + " and ".join(parts)


def _verdict(m: dict[str, Any], ceil_dram: float | None, grid_note: str | None,
             stalls: list[dict[str, Any]]) -> tuple[str, str]:
    sm, mem = m[MeasureCol.SM_PCT], m[MeasureCol.MEMORY_PCT]
    dram, l1, l2 = m[MeasureCol.DRAM_PCT], m[MeasureCol.L1_PCT], m[MeasureCol.L2_PCT]
    if sm is None and mem is None:
        if m[NcuCol.DUR] is None:
            return UNKNOWN, "ncu recorded no metrics for this launch (collection failed or was skipped)"
        return UNKNOWN, "the export has neither compute nor memory throughput for this launch"
    sm_v, mem_v = sm or 0.0, mem or 0.0
    # A throughput the export lacks is said to be missing, not shown as 0%.
    sm_t = f"{sm_v:.0f}%" if sm is not None else "not in the export"
    mem_t = f"{mem_v:.0f}%" if mem is not None else "not in the export"
    if max(sm_v, mem_v) < th.SATURATED_PCT:
        why = [f"neither compute (SM {sm_t}) nor memory ({mem_t}) is near its peak"]
        if grid_note == SMALL_GRID:
            why.append("too few blocks to fill the GPU")
        stall = _stall_text(stalls)
        if stall:
            why.append(stall)
        return LATENCY_BOUND, "; ".join(why)
    balanced = abs(sm_v - mem_v) < th.BALANCED_GAP_PCT
    if mem_v >= sm_v:
        levels = [(v, n) for v, n in ((dram, "DRAM"), (l2, "L2"), (l1, "L1/shared")) if v is not None]
        top = max(levels) if levels else None
        where = f"{top[1]} at {top[0]:.0f}% of peak" if top else f"memory at {mem_v:.0f}% of peak"
        rate = m[MeasureCol.DRAM_BYTES_PER_S]
        if rate and ceil_dram:
            where += f" (DRAM {_fmt_rate(rate, 'B/s')} of {_fmt_rate(ceil_dram, 'B/s')})"
        if top and top[1] != "DRAM" and dram is not None and dram < th.SATURATED_PCT:
            where += f"; DRAM only {dram:.0f}%: on-chip traffic, not DRAM, is the limit"
        if balanced:
            where += f"; compute is close behind (SM {sm_t}): both need to shrink"
        return MEMORY_BOUND, where
    where = f"SM at {sm_v:.0f}% of peak (memory {mem_t})"
    tensor = m[MeasureCol.TENSOR_PIPE_PCT]
    if tensor:
        where += f"; tensor pipe {tensor:.0f}% busy"
    if balanced:
        where += "; memory is close behind: both need to shrink"
    return COMPUTE_BOUND, where


def rule_rank(rule: dict[str, Any]) -> tuple[int, float, int]:
    """Sort key of one rule row, best first: global speedups by size, then untyped, then local,
    then rules without an estimate (SOLBottleneck, ncu's summary verdict, first among those)."""
    speedup = rule[RuleCol.SPEEDUP_PCT]
    if speedup is None or math.isnan(speedup):
        return 3, 0.0, 0 if rule[RuleCol.RULE] == "SOLBottleneck" else 1
    return SPEEDUP_TYPE_RANK.get(rule[RuleCol.SPEEDUP_TYPE], 1), -speedup, 0


def _top_rule(rules: list[dict[str, Any]]) -> tuple[str | None, float | None, str | None]:
    """The rule to lead with: the largest global estimated speedup (report order breaks ties)."""
    if not rules:
        return None, None, None
    pick = min(rules, key=rule_rank)
    text = pick[RuleCol.TITLE] or pick[RuleCol.MESSAGE].split(". ")[0]
    return f"{pick[RuleCol.RULE]}: {text}", pick[RuleCol.SPEEDUP_PCT], pick[RuleCol.SPEEDUP_TYPE]


def _judge_launch(m: dict[str, Any], stalls: list[dict[str, Any]], rules: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdict columns of one measured launch."""
    grid_note, details = _occupancy_details(m)
    uncoalesced, memory_details = _memory_details(m)
    bound, reason = _verdict(m, m[MeasureCol.PEAK_DRAM_BYTES_PER_S], grid_note, stalls)
    top_rule, top_speedup, top_type = _top_rule(rules)
    locked = m[MeasureCol.CLOCKS_LOCKED_RECORDED]
    if locked is None and m[MeasureCol.CLOCK_RATIO] is not None:
        locked = m[MeasureCol.CLOCK_RATIO] < th.CLOCK_LOCK_RATIO
    return {VerdictCol.BOUND: bound, VerdictCol.REASON: reason,
            VerdictCol.DETAILS: "; ".join(details + memory_details) or None,
            VerdictCol.GRID_NOTE: grid_note, VerdictCol.UNCOALESCED: uncoalesced,
            VerdictCol.TOP_STALLS: _stall_text(stalls),
            VerdictCol.CLOCKS_LOCKED: locked, VerdictCol.TOP_RULE: top_rule,
            VerdictCol.TOP_RULE_SPEEDUP_PCT: top_speedup,
            VerdictCol.TOP_RULE_SPEEDUP_TYPE: top_type}


#: The launch table as ``tracewhy roofline --json`` writes it: measurements and verdicts interleaved.
_VERDICT_DTYPES: Final = {
    VerdictCol.BOUND: pl.String, VerdictCol.REASON: pl.String, VerdictCol.DETAILS: pl.String,
    VerdictCol.GRID_NOTE: pl.String,
    VerdictCol.UNCOALESCED: pl.Boolean, VerdictCol.TOP_STALLS: pl.String, VerdictCol.CLOCKS_LOCKED: pl.Boolean,
    VerdictCol.TOP_RULE: pl.String, VerdictCol.TOP_RULE_SPEEDUP_PCT: pl.Float64,
    VerdictCol.TOP_RULE_SPEEDUP_TYPE: pl.String,
}
#: The columns' order; a measured column's dtype is the measurement's (``MEASURES_SCHEMA``).
_LAUNCH_COLUMNS: Final = (
    NcuCol.LAUNCH, NcuCol.NAME, NcuCol.DEMANGLED, NcuCol.DUR, VerdictCol.BOUND, VerdictCol.REASON, VerdictCol.DETAILS,
    MeasureCol.SM_PCT, MeasureCol.MEMORY_PCT, MeasureCol.DRAM_PCT, MeasureCol.L1_PCT, MeasureCol.L2_PCT,
    MeasureCol.DRAM_BYTES_PER_S,
    MeasureCol.PEAK_DRAM_BYTES_PER_S, MeasureCol.FP64_FLOP_PER_S, MeasureCol.FP32_FLOP_PER_S,
    MeasureCol.FP16_FLOP_PER_S, MeasureCol.PRECISION,
    MeasureCol.FLOP_PER_S, MeasureCol.PEAK_FLOP_PER_S, MeasureCol.ARITHMETIC_INTENSITY, MeasureCol.RIDGE_POINT,
    MeasureCol.ROOF_FLOP_PER_S,
    MeasureCol.ROOF_FRACTION, MeasureCol.TENSOR_PIPE_PCT, MeasureCol.ACHIEVED_OCCUPANCY_PCT,
    MeasureCol.THEORETICAL_OCCUPANCY_PCT,
    MeasureCol.OCCUPANCY_LIMITER, MeasureCol.WAVES_PER_SM, VerdictCol.GRID_NOTE, MeasureCol.LOCAL_MEMORY_INST,
    MeasureCol.EXCESS_SECTOR_SHARE,
    MeasureCol.SECTORS_PER_LOAD, MeasureCol.SECTORS_PER_STORE, VerdictCol.UNCOALESCED, VerdictCol.TOP_STALLS,
    MeasureCol.SM_CLOCK_HZ,
    MeasureCol.CLOCK_RATIO, VerdictCol.CLOCKS_LOCKED, MeasureCol.RULE_COUNT, VerdictCol.TOP_RULE,
    VerdictCol.TOP_RULE_SPEEDUP_PCT,
    VerdictCol.TOP_RULE_SPEEDUP_TYPE,
)
#: ``NcuRooflineResult.launches``: one row per launch, longest first.
LAUNCH_VERDICTS_SCHEMA: Final = pl.Schema(
    {c: _VERDICT_DTYPES[c] if c in _VERDICT_DTYPES else MEASURES_SCHEMA[c] for c in _LAUNCH_COLUMNS})


def _by_launch(frame: pl.DataFrame, key: str) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for row in frame.iter_rows(named=True):
        out.setdefault(row[key], []).append(row)
    return out


# --- ncu: the report -------------------------------------------------------------------------


def judge_roofline(measures: NcuRooflineMeasures) -> NcuRooflineResult:
    """Verdicts for measured launches, kernel rows by name, and the report-wide notes."""
    stalls = _by_launch(measures.stalls, BreakdownCol.LAUNCH)
    rules = _by_launch(measures.rules, RuleCol.LAUNCH)
    rows = [{**m, **_judge_launch(m, stalls.get(m[NcuCol.LAUNCH], []), rules.get(m[NcuCol.LAUNCH], []))}
            for m in measures.launches.iter_rows(named=True)]
    launches = pl.DataFrame(rows, schema=LAUNCH_VERDICTS_SCHEMA, strict=False)
    unknown = launches.filter(pl.col(VerdictCol.BOUND) == UNKNOWN).height
    locked_values = launches.get_column(VerdictCol.CLOCKS_LOCKED).drop_nulls()
    clocks_locked = bool(locked_values.any()) if locked_values.len() else None
    return NcuRooflineResult(
        path=measures.path, format=measures.format, tool_version=measures.tool_version,
        device_name=measures.device_name, ceilings=measures.ceilings, clocks_locked=clocks_locked,
        launches=launches.sort([NcuCol.DUR, NcuCol.LAUNCH], descending=[True, False], nulls_last=True),
        kernels=_by_kernel(launches), rules=measures.rules, stalls=measures.stalls,
        notes=ncu_notes(measures, launches, clocks_locked, unknown),
    )


def roofline(report: NcuReport, options: RooflineOptions | None = None) -> NcuRooflineResult:
    """Measure and judge one ncu report: what ``tracewhy roofline`` shows for it."""
    return judge_roofline(measure_roofline(report, options or RooflineOptions()))


#: Columns of ``NcuRooflineResult.kernels``, in the order ``tracewhy roofline --json`` writes them.
_KERNEL_COLUMNS: Final = (
    NcuCol.NAME, WeightedCol.LAUNCHES, WeightedCol.TOTAL_NS, WeightedCol.MEAN_NS, *WeightedCol.WEIGHTED,
    VerdictCol.BOUND, VerdictCol.REASON,
    VerdictCol.DETAILS, MeasureCol.OCCUPANCY_LIMITER, VerdictCol.TOP_STALLS, VerdictCol.TOP_RULE,
    VerdictCol.TOP_RULE_SPEEDUP_PCT,
    VerdictCol.TOP_RULE_SPEEDUP_TYPE, MeasureCol.PRECISION, VerdictCol.BOUNDS, VerdictCol.SHARE,
)

#: ``NcuRooflineResult.kernels``: one row per kernel name, most time first.
_KERNEL_DTYPES: Final = {WeightedCol.LAUNCHES: pl.Int64(), WeightedCol.TOTAL_NS: pl.Int64(),
                         WeightedCol.MEAN_NS: pl.Int64(),
                         VerdictCol.BOUNDS: pl.List(pl.String()), VerdictCol.SHARE: pl.Float64()}
KERNEL_VERDICTS_SCHEMA: Final = pl.Schema(
    {c: _KERNEL_DTYPES[c] if c in _KERNEL_DTYPES else LAUNCH_VERDICTS_SCHEMA[c] for c in _KERNEL_COLUMNS})


def _by_kernel(launches: pl.DataFrame) -> pl.DataFrame:
    """One row per kernel name: time-weighted metrics, the bound that takes most of its time."""
    total = launches.get_column(NcuCol.DUR).sum() or 0
    by_bound = (
        launches.group_by(NcuCol.NAME, VerdictCol.BOUND).agg(pl.col(NcuCol.DUR).sum().alias("bound_ns"))
        .sort([NcuCol.NAME, "bound_ns", VerdictCol.BOUND], descending=[False, True, False], nulls_last=True)
        .group_by(NcuCol.NAME, maintain_order=True).first()
    )
    representative = (
        launches.join(by_bound.select(NcuCol.NAME, VerdictCol.BOUND), on=[NcuCol.NAME, VerdictCol.BOUND])
        .sort([NcuCol.NAME, NcuCol.DUR], descending=[False, True], nulls_last=True)
        .group_by(NcuCol.NAME, maintain_order=True)
        .first()
        .select(NcuCol.NAME, VerdictCol.BOUND, VerdictCol.REASON, VerdictCol.DETAILS, MeasureCol.OCCUPANCY_LIMITER,
                VerdictCol.TOP_STALLS,
                VerdictCol.TOP_RULE, VerdictCol.TOP_RULE_SPEEDUP_PCT, VerdictCol.TOP_RULE_SPEEDUP_TYPE,
                MeasureCol.PRECISION)
    )
    bounds_seen = launches.group_by(NcuCol.NAME).agg(pl.col(VerdictCol.BOUND).unique().sort().alias(VerdictCol.BOUNDS))
    return (
        weighted_by_kernel(launches).join(representative, on=NcuCol.NAME, how="left")
        .join(bounds_seen, on=NcuCol.NAME, how="left")
        .with_columns(
            (pl.col(WeightedCol.TOTAL_NS) / max(total, 1)).alias(VerdictCol.SHARE),
            # The row's figures are time-weighted means; the reason's are its longest launch's.
            pl.when(pl.col(WeightedCol.LAUNCHES) > 1).then(pl.format("in its longest launch, {}", VerdictCol.REASON))
            .otherwise(pl.col(VerdictCol.REASON)).alias(VerdictCol.REASON),
        )
        .select(_KERNEL_COLUMNS)
        .sort([WeightedCol.TOTAL_NS, NcuCol.NAME], descending=[True, False], nulls_last=True)
    )


#: ncu columns carried onto a trace's kernel rows by ``join_ncu``, renamed with an "ncu_" prefix.
CARRIED: Final = (VerdictCol.BOUND, VerdictCol.REASON, WeightedCol.LAUNCHES, WeightedCol.TOTAL_NS, MeasureCol.SM_PCT,
                  MeasureCol.MEMORY_PCT,
                  MeasureCol.DRAM_PCT, MeasureCol.ROOF_FRACTION, MeasureCol.ACHIEVED_OCCUPANCY_PCT,
                  MeasureCol.OCCUPANCY_LIMITER,
                  VerdictCol.TOP_RULE)


#: The columns ``join_ncu`` adds: how the name matched, and the ncu verdict columns carried.
NCU_JOIN_SCHEMA: Final = pl.Schema({"ncu_match": pl.String(),
                                    **{f"ncu_{c}": KERNEL_VERDICTS_SCHEMA[c] for c in CARRIED}})


def join_ncu(kernels: pl.DataFrame, ncu: NcuRooflineResult, name_column: str = "name") -> pl.DataFrame:
    """``kernels`` (one row per trace kernel name) with ncu_* verdict columns and ``ncu_match``
    (how the name matched, ``analyses.roofline_join``)."""
    table = ncu.kernels.select(NcuCol.NAME, *CARRIED)
    keys, how = match_ncu_names(kernels.get_column(name_column).to_list(),
                                table.get_column(NcuCol.NAME).to_list(), demangled_names(ncu.launches))
    carried = table.rename({c: f"ncu_{c}" for c in CARRIED}).rename({NcuCol.NAME: "_ncu_key"})
    return (
        kernels.with_columns(pl.Series("_ncu_key", keys, dtype=pl.String), pl.Series("ncu_match", how, dtype=pl.String))
        .join(carried, on="_ncu_key", how="left")
        .drop("_ncu_key")
    )
