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
    KCol,
    LCol,
    NcuRooflineMeasures,
    RooflineOptions,
    SCol,
    measure_roofline,
    weighted_by_kernel,
)
from tracewhy.analyses.roofline_join import demangled_names, match_ncu_names
from tracewhy.findings import thresholds as th
from tracewhy.findings.roofline_notes import ncu_notes
from tracewhy.model.ncu import BCol, NCol, NcuReport, RCol

MEMORY_BOUND: Final = "memory-bound"
COMPUTE_BOUND: Final = "compute-bound"
LATENCY_BOUND: Final = "latency-bound"
UNKNOWN: Final = "unknown"
BOUNDS: Final = (MEMORY_BOUND, COMPUTE_BOUND, LATENCY_BOUND, UNKNOWN)

#: Grid notes: fewer blocks than one wave, or a last wave mostly empty.
SMALL_GRID: Final = "small grid"
TAIL: Final = "tail"


class VCol:
    """Verdict columns of ``NcuRooflineResult.launches`` and ``kernels`` (beside ``LCol``'s)."""

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
class NcuRooflineResult:
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
    achieved, theoretical = m[LCol.ACHIEVED_OCCUPANCY_PCT], m[LCol.THEORETICAL_OCCUPANCY_PCT]
    limiter = m[LCol.OCCUPANCY_LIMITER]
    if limiter is not None and theoretical < th.LOW_THEORETICAL_OCCUPANCY_PCT:
        details.append(f"theoretical occupancy {theoretical:.0f}% is limited by {limiter} "
                       f"({m[LCol.LIMITER_BLOCKS_PER_SM]:.0f} blocks per SM)")
    if achieved is not None and theoretical and achieved < th.OCCUPANCY_GAP_RATIO * theoretical:
        details.append(f"achieved occupancy {achieved:.0f}% is well below the theoretical {theoretical:.0f}% "
                       "(load imbalance, a tail, or too few blocks)")
    waves = m[LCol.WAVES_PER_SM]
    grid_note = None
    if waves is not None:
        blocks, sms = m[LCol.GRID_SIZE], m[LCol.SM_COUNT]
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
    local = m[LCol.LOCAL_MEMORY_INST]
    spills = ([f"{local:,.0f} local-memory instructions: register spills (or local arrays) go to memory"]
              if local else [])
    flags: list[str] = []
    share = m[LCol.EXCESS_SECTOR_SHARE]
    if share is not None and share >= th.EXCESS_SECTORS_SHARE:
        flags.append(f"{share:.0%} of global-memory sectors are excess (uncoalesced)")
    for kind, column in (("load", LCol.SECTORS_PER_LOAD), ("store", LCol.SECTORS_PER_STORE)):
        ratio = m[column]
        if ratio is not None and ratio >= th.UNCOALESCED_SECTORS_PER_REQUEST:
            flags.append(f"global {kind}s touch {ratio:.0f} sectors per request (uncoalesced)")
    # No coalescing figure at all: unknown, not "coalesced".
    measured = any(m[c] is not None for c in (LCol.EXCESS_SECTOR_SHARE, LCol.SECTORS_PER_LOAD,
                                              LCol.SECTORS_PER_STORE))
    return bool(flags) if measured else None, spills + flags


def _stall_text(stalls: list[dict[str, Any]]) -> str | None:
    if not stalls:
        return None
    parts = []
    for s in stalls[:2]:
        reason = s[SCol.REASON]
        meaning = STALL_MEANING.get(reason, reason.replace("_", " "))
        unit = " cycles/instr" if s[SCol.SOURCE] == "stall_cycles" else " samples"
        parts.append(f"{reason} ({meaning}; {s[SCol.SHARE]:.0%}, {s[BCol.VALUE]:.1f}{unit})")
    return "warps stall mostly on " + " and ".join(parts)


def _verdict(m: dict[str, Any], ceil_dram: float | None, grid_note: str | None,
             stalls: list[dict[str, Any]]) -> tuple[str, str]:
    sm, mem = m[LCol.SM_PCT], m[LCol.MEMORY_PCT]
    dram, l1, l2 = m[LCol.DRAM_PCT], m[LCol.L1_PCT], m[LCol.L2_PCT]
    if sm is None and mem is None:
        if m[NCol.DUR] is None:
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
        rate = m[LCol.DRAM_BYTES_PER_S]
        if rate and ceil_dram:
            where += f" (DRAM {_fmt_rate(rate, 'B/s')} of {_fmt_rate(ceil_dram, 'B/s')})"
        if top and top[1] != "DRAM" and dram is not None and dram < th.SATURATED_PCT:
            where += f"; DRAM only {dram:.0f}%: on-chip traffic, not DRAM, is the limit"
        if balanced:
            where += f"; compute is close behind (SM {sm_t}): both need to shrink"
        return MEMORY_BOUND, where
    where = f"SM at {sm_v:.0f}% of peak (memory {mem_t})"
    tensor = m[LCol.TENSOR_PIPE_PCT]
    if tensor:
        where += f"; tensor pipe {tensor:.0f}% busy"
    if balanced:
        where += "; memory is close behind: both need to shrink"
    return COMPUTE_BOUND, where


def rule_rank(rule: dict[str, Any]) -> tuple[int, float, int]:
    """Sort key of one rule row, best first: global speedups by size, then untyped, then local,
    then rules without an estimate (SOLBottleneck, ncu's summary verdict, first among those)."""
    speedup = rule[RCol.SPEEDUP_PCT]
    if speedup is None or math.isnan(speedup):
        return 3, 0.0, 0 if rule[RCol.RULE] == "SOLBottleneck" else 1
    return SPEEDUP_TYPE_RANK.get(rule[RCol.SPEEDUP_TYPE], 1), -speedup, 0


def _top_rule(rules: list[dict[str, Any]]) -> tuple[str | None, float | None, str | None]:
    """The rule to lead with: the largest global estimated speedup (report order breaks ties)."""
    if not rules:
        return None, None, None
    pick = min(rules, key=rule_rank)
    text = pick[RCol.TITLE] or pick[RCol.MESSAGE].split(". ")[0]
    return f"{pick[RCol.RULE]}: {text}", pick[RCol.SPEEDUP_PCT], pick[RCol.SPEEDUP_TYPE]


def _judge_launch(m: dict[str, Any], stalls: list[dict[str, Any]], rules: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdict columns of one measured launch."""
    grid_note, details = _occupancy_details(m)
    uncoalesced, memory_details = _memory_details(m)
    bound, reason = _verdict(m, m[LCol.PEAK_DRAM_BYTES_PER_S], grid_note, stalls)
    top_rule, top_speedup, top_type = _top_rule(rules)
    locked = m[LCol.CLOCKS_LOCKED_RECORDED]
    if locked is None and m[LCol.CLOCK_RATIO] is not None:
        locked = m[LCol.CLOCK_RATIO] < th.CLOCK_LOCK_RATIO
    return {VCol.BOUND: bound, VCol.REASON: reason, VCol.DETAILS: "; ".join(details + memory_details) or None,
            VCol.GRID_NOTE: grid_note, VCol.UNCOALESCED: uncoalesced, VCol.TOP_STALLS: _stall_text(stalls),
            VCol.CLOCKS_LOCKED: locked, VCol.TOP_RULE: top_rule, VCol.TOP_RULE_SPEEDUP_PCT: top_speedup,
            VCol.TOP_RULE_SPEEDUP_TYPE: top_type}


#: The launch table as ``tracewhy roofline --json`` writes it: measurements and verdicts interleaved.
_VERDICT_DTYPES: Final = {
    VCol.BOUND: pl.String, VCol.REASON: pl.String, VCol.DETAILS: pl.String, VCol.GRID_NOTE: pl.String,
    VCol.UNCOALESCED: pl.Boolean, VCol.TOP_STALLS: pl.String, VCol.CLOCKS_LOCKED: pl.Boolean,
    VCol.TOP_RULE: pl.String, VCol.TOP_RULE_SPEEDUP_PCT: pl.Float64, VCol.TOP_RULE_SPEEDUP_TYPE: pl.String,
}
#: The columns' order; a measured column's dtype is the measurement's (``MEASURES_SCHEMA``).
_LAUNCH_COLUMNS: Final = (
    NCol.LAUNCH, NCol.NAME, NCol.DEMANGLED, NCol.DUR, VCol.BOUND, VCol.REASON, VCol.DETAILS,
    LCol.SM_PCT, LCol.MEMORY_PCT, LCol.DRAM_PCT, LCol.L1_PCT, LCol.L2_PCT, LCol.DRAM_BYTES_PER_S,
    LCol.PEAK_DRAM_BYTES_PER_S, LCol.FP64_FLOP_PER_S, LCol.FP32_FLOP_PER_S, LCol.FP16_FLOP_PER_S, LCol.PRECISION,
    LCol.FLOP_PER_S, LCol.PEAK_FLOP_PER_S, LCol.ARITHMETIC_INTENSITY, LCol.RIDGE_POINT, LCol.ROOF_FLOP_PER_S,
    LCol.ROOF_FRACTION, LCol.TENSOR_PIPE_PCT, LCol.ACHIEVED_OCCUPANCY_PCT, LCol.THEORETICAL_OCCUPANCY_PCT,
    LCol.OCCUPANCY_LIMITER, LCol.WAVES_PER_SM, VCol.GRID_NOTE, LCol.LOCAL_MEMORY_INST, LCol.EXCESS_SECTOR_SHARE,
    LCol.SECTORS_PER_LOAD, LCol.SECTORS_PER_STORE, VCol.UNCOALESCED, VCol.TOP_STALLS, LCol.SM_CLOCK_HZ,
    LCol.CLOCK_RATIO, VCol.CLOCKS_LOCKED, LCol.RULE_COUNT, VCol.TOP_RULE, VCol.TOP_RULE_SPEEDUP_PCT,
    VCol.TOP_RULE_SPEEDUP_TYPE,
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
    stalls = _by_launch(measures.stalls, BCol.LAUNCH)
    rules = _by_launch(measures.rules, RCol.LAUNCH)
    rows = [{**m, **_judge_launch(m, stalls.get(m[NCol.LAUNCH], []), rules.get(m[NCol.LAUNCH], []))}
            for m in measures.launches.iter_rows(named=True)]
    launches = pl.DataFrame(rows, schema=LAUNCH_VERDICTS_SCHEMA, strict=False)
    unknown = launches.filter(pl.col(VCol.BOUND) == UNKNOWN).height
    locked_values = launches.get_column(VCol.CLOCKS_LOCKED).drop_nulls()
    clocks_locked = bool(locked_values.any()) if locked_values.len() else None
    return NcuRooflineResult(
        path=measures.path, format=measures.format, tool_version=measures.tool_version,
        device_name=measures.device_name, ceilings=measures.ceilings, clocks_locked=clocks_locked,
        launches=launches.sort([NCol.DUR, NCol.LAUNCH], descending=[True, False], nulls_last=True),
        kernels=_by_kernel(launches), rules=measures.rules, stalls=measures.stalls,
        notes=ncu_notes(measures, launches, clocks_locked, unknown),
    )


def roofline(report: NcuReport, options: RooflineOptions | None = None) -> NcuRooflineResult:
    """Measure and judge one ncu report: what ``tracewhy roofline`` shows for it."""
    return judge_roofline(measure_roofline(report, options or RooflineOptions()))


#: Columns of ``NcuRooflineResult.kernels``, in the order ``tracewhy roofline --json`` writes them.
_KERNEL_COLUMNS: Final = (
    NCol.NAME, KCol.LAUNCHES, KCol.TOTAL_NS, KCol.MEAN_NS, *KCol.WEIGHTED, VCol.BOUND, VCol.REASON,
    VCol.DETAILS, LCol.OCCUPANCY_LIMITER, VCol.TOP_STALLS, VCol.TOP_RULE, VCol.TOP_RULE_SPEEDUP_PCT,
    VCol.TOP_RULE_SPEEDUP_TYPE, LCol.PRECISION, VCol.BOUNDS, VCol.SHARE,
)

#: ``NcuRooflineResult.kernels``: one row per kernel name, most time first.
_KERNEL_DTYPES: Final = {KCol.LAUNCHES: pl.Int64(), KCol.TOTAL_NS: pl.Int64(), KCol.MEAN_NS: pl.Int64(),
                         VCol.BOUNDS: pl.List(pl.String()), VCol.SHARE: pl.Float64()}
KERNEL_VERDICTS_SCHEMA: Final = pl.Schema(
    {c: _KERNEL_DTYPES[c] if c in _KERNEL_DTYPES else LAUNCH_VERDICTS_SCHEMA[c] for c in _KERNEL_COLUMNS})


def _by_kernel(launches: pl.DataFrame) -> pl.DataFrame:
    """One row per kernel name: time-weighted metrics, the bound that takes most of its time."""
    total = launches.get_column(NCol.DUR).sum() or 0
    by_bound = (
        launches.group_by(NCol.NAME, VCol.BOUND).agg(pl.col(NCol.DUR).sum().alias("bound_ns"))
        .sort([NCol.NAME, "bound_ns", VCol.BOUND], descending=[False, True, False], nulls_last=True)
        .group_by(NCol.NAME, maintain_order=True).first()
    )
    representative = (
        launches.join(by_bound.select(NCol.NAME, VCol.BOUND), on=[NCol.NAME, VCol.BOUND])
        .sort([NCol.NAME, NCol.DUR], descending=[False, True], nulls_last=True)
        .group_by(NCol.NAME, maintain_order=True)
        .first()
        .select(NCol.NAME, VCol.BOUND, VCol.REASON, VCol.DETAILS, LCol.OCCUPANCY_LIMITER, VCol.TOP_STALLS,
                VCol.TOP_RULE, VCol.TOP_RULE_SPEEDUP_PCT, VCol.TOP_RULE_SPEEDUP_TYPE, LCol.PRECISION)
    )
    bounds_seen = launches.group_by(NCol.NAME).agg(pl.col(VCol.BOUND).unique().sort().alias(VCol.BOUNDS))
    return (
        weighted_by_kernel(launches).join(representative, on=NCol.NAME, how="left")
        .join(bounds_seen, on=NCol.NAME, how="left")
        .with_columns(
            (pl.col(KCol.TOTAL_NS) / max(total, 1)).alias(VCol.SHARE),
            # The row's figures are time-weighted means; the reason's are its longest launch's.
            pl.when(pl.col(KCol.LAUNCHES) > 1).then(pl.format("in its longest launch, {}", VCol.REASON))
            .otherwise(pl.col(VCol.REASON)).alias(VCol.REASON),
        )
        .select(_KERNEL_COLUMNS)
        .sort([KCol.TOTAL_NS, NCol.NAME], descending=[True, False], nulls_last=True)
    )


#: ncu columns carried onto a trace's kernel rows by ``join_ncu``, renamed with an "ncu_" prefix.
CARRIED: Final = (VCol.BOUND, VCol.REASON, KCol.LAUNCHES, KCol.TOTAL_NS, LCol.SM_PCT, LCol.MEMORY_PCT,
                  LCol.DRAM_PCT, LCol.ROOF_FRACTION, LCol.ACHIEVED_OCCUPANCY_PCT, LCol.OCCUPANCY_LIMITER,
                  VCol.TOP_RULE)


#: The columns ``join_ncu`` adds: how the name matched, and the ncu verdict columns carried.
NCU_JOIN_SCHEMA: Final = pl.Schema({"ncu_match": pl.String(),
                                    **{f"ncu_{c}": KERNEL_VERDICTS_SCHEMA[c] for c in CARRIED}})


def join_ncu(kernels: pl.DataFrame, ncu: NcuRooflineResult, name_column: str = "name") -> pl.DataFrame:
    """``kernels`` (one row per trace kernel name) with ncu_* verdict columns and ``ncu_match``
    (how the name matched, ``analyses.roofline_join``)."""
    table = ncu.kernels.select(NCol.NAME, *CARRIED)
    keys, how = match_ncu_names(kernels.get_column(name_column).to_list(),
                                table.get_column(NCol.NAME).to_list(), demangled_names(ncu.launches))
    carried = table.rename({c: f"ncu_{c}" for c in CARRIED}).rename({NCol.NAME: "_ncu_key"})
    return (
        kernels.with_columns(pl.Series("_ncu_key", keys, dtype=pl.String), pl.Series("ncu_match", how, dtype=pl.String))
        .join(carried, on="_ncu_key", how="left")
        .drop("_ncu_key")
    )
