"""Why each kernel of an Nsight Compute report is slow: roofline position, bound, and reasons.

Per launch: compute and memory throughput as % of peak (speed of light), achieved FLOP/s per
precision and DRAM bandwidth, arithmetic intensity against the device's ridge point, a bound
(memory / compute / latency) with its reason in words, the occupancy limiter, waves and tail,
register spills, uncoalesced-access signs, the dominant warp stalls, and ncu's own rule
messages with their estimated speedups. Per kernel name: the same, weighted by time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

import polars as pl

from tracewhy.analyses import roofline_thresholds as th
from tracewhy.analyses.peaks import DevicePeaks, lookup_peaks
from tracewhy.model.ncu import BCol, NCol, NcuReport, RCol

MEMORY_BOUND: Final = "memory-bound"
COMPUTE_BOUND: Final = "compute-bound"
LATENCY_BOUND: Final = "latency-bound"
UNKNOWN: Final = "unknown"
BOUNDS: Final = (MEMORY_BOUND, COMPUTE_BOUND, LATENCY_BOUND, UNKNOWN)

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

#: Occupancy limit columns and the resource each stands for.
_LIMITERS: Final = (
    (NCol.LIMIT_REGISTERS, "registers"),
    (NCol.LIMIT_SHARED, "shared memory"),
    (NCol.LIMIT_WARPS, "block size (warps per block)"),
    (NCol.LIMIT_BLOCKS, "max blocks per SM"),
    (NCol.LIMIT_BARRIERS, "barriers"),
)


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


def _fmt_rate(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _stalls(report: NcuReport) -> pl.DataFrame:
    """Stall reasons per launch with their share of stall cycles (or of samples as a fallback)."""
    b = report.breakdowns
    groups = [g for g in ("stall_cycles", "stall_samples") if b.filter(pl.col(BCol.GROUP) == g).height]
    if not groups:
        return pl.DataFrame(schema={BCol.LAUNCH: pl.Int64, "reason": pl.String, BCol.VALUE: pl.Float64,
                                    "share": pl.Float64, "source": pl.String})
    frames = []
    for group in groups:
        s = b.filter((pl.col(BCol.GROUP) == group) & ~pl.col(BCol.KEY).is_in(list(th.NON_STALL_REASONS)))
        frames.append(s.with_columns(pl.lit(group).alias("source")))
    s = pl.concat(frames)
    # Prefer cycles-per-issue; samples only for launches that lack them.
    has_cycles = s.filter(pl.col("source") == "stall_cycles").get_column(BCol.LAUNCH).unique()
    s = s.filter((pl.col("source") == "stall_cycles") | ~pl.col(BCol.LAUNCH).is_in(has_cycles.implode()))
    return (
        s.with_columns((pl.col(BCol.VALUE) / pl.col(BCol.VALUE).sum().over(BCol.LAUNCH)).alias("share"))
        .select(BCol.LAUNCH, pl.col(BCol.KEY).alias("reason"), BCol.VALUE, "share", "source")
        .sort([BCol.LAUNCH, BCol.VALUE, "reason"], descending=[False, True, False])
    )


def _table_peaks(report: NcuReport, options: RooflineOptions) -> DevicePeaks | None:
    names = report.launches.get_column(NCol.DEVICE_NAME).drop_nulls()
    sms = report.launches.get_column(NCol.SM_COUNT).drop_nulls()
    name = options.device or (names[0] if names.len() else None)
    return lookup_peaks(name, int(sms[0]) if sms.len() else None)


@dataclass
class _Launch:
    """Working state for one launch's verdict."""

    row: dict[str, Any]
    details: list[str] = field(default_factory=list)

    def get(self, key: str) -> float | None:
        return _num(self.row, key)


def _sm_clock(launch: _Launch) -> float | None:
    """The one clock that turns per-cycle counts into rates, for the roof and the achieved alike.

    ncu's roofline sections do the same (peak x sm__cycles_elapsed.avg.per_second, achieved x
    smsp__cycles_elapsed.avg.per_second, equal to each other), so achieved / peak is exactly the
    ratio of the per-cycle counts, whatever the clock. A roof at another clock than the achieved
    point (the GPC clock, as before) misplaces the kernel by the two clocks' ratio.
    """
    return launch.get(NCol.SM_CLOCK) or launch.get(NCol.SMSP_CLOCK)


def _ceilings(launch: _Launch, table: DevicePeaks | None, clock_ratio: float | None) -> Ceilings:
    flops: dict[str, float] = {}
    sources: set[str] = set()
    clock = _sm_clock(launch)
    for precision, column in (("fp32", NCol.FFMA_PEAK), ("fp64", NCol.DFMA_PEAK)):
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
    per_cycle = launch.get(NCol.DRAM_PEAK_PER_CYCLE)
    dram_clock = launch.get(NCol.DRAM_CLOCK)
    if per_cycle and dram_clock:
        dram = per_cycle * dram_clock
        sources.add("report")
    elif table is not None:
        dram = table.dram_bytes_per_s
        sources.add("table")
    return Ceilings(flops, dram, "+".join(sorted(sources)) or "none")


def _clock_ratio(launch: _Launch, table: DevicePeaks | None) -> float | None:
    clock = launch.get(NCol.SM_CLOCK)
    top = launch.get(NCol.MAX_SM_CLOCK) or (table.boost_clock_hz if table else None)
    return clock / top if clock and top else None


def _throughputs(launch: _Launch, ceil: Ceilings) -> dict[str, float | None]:
    dur = launch.get(NCol.DUR)
    dram_rate = launch.get(NCol.DRAM_BYTES_PER_S)
    moved = _sum(launch.get(NCol.DRAM_READ), launch.get(NCol.DRAM_WRITE))
    if dram_rate is None and moved is not None and dur:
        dram_rate = moved * 1e9 / dur
    dram_pct = launch.get(NCol.DRAM_PCT)
    if dram_pct is None and dram_rate is not None and ceil.dram_bytes_per_s:
        dram_pct = 100.0 * dram_rate / ceil.dram_bytes_per_s
    mem_pct = launch.get(NCol.MEM_PCT)
    if mem_pct is None:
        levels = [v for v in (dram_pct, launch.get(NCol.L1_PCT), launch.get(NCol.L2_PCT)) if v is not None]
        mem_pct = max(levels) if levels else None
    clock = _sm_clock(launch)
    flops: dict[str, float | None] = {}
    for precision, ops in (("fp64", (NCol.DADD, NCol.DMUL, NCol.DFMA)),
                           ("fp32", (NCol.FADD, NCol.FMUL, NCol.FFMA)),
                           ("fp16", (NCol.HADD, NCol.HMUL, NCol.HFMA))):
        per_cycle = _flops_per_cycle(launch.row, *ops)
        flops[precision] = per_cycle * clock if per_cycle is not None and clock else None
    return {"dram_bytes_per_s": dram_rate, "dram_pct": dram_pct, "memory_pct": mem_pct, **{
        f"{p}_flop_per_s": v for p, v in flops.items()}}


def _roofline(t: dict[str, float | None], ceil: Ceilings) -> dict[str, Any]:
    """Position against the roof of the precision the kernel used most."""
    achieved = {p: t[f"{p}_flop_per_s"] for p in ("fp64", "fp32", "fp16")}
    used = {p: v for p, v in achieved.items() if v}
    out: dict[str, Any] = {"precision": None, "flop_per_s": None, "peak_flop_per_s": None,
                           "arithmetic_intensity": None, "ridge_point": None,
                           "roof_flop_per_s": None, "roof_fraction": None}
    if not used:
        # No floating-point work: the only roof is DRAM bandwidth.
        bw = t["dram_bytes_per_s"]
        if bw and ceil.dram_bytes_per_s:
            out["roof_fraction"] = bw / ceil.dram_bytes_per_s
        return out
    precision = max(used, key=lambda p: used[p])
    peak = ceil.flop_per_s.get("fp16_tensor" if precision == "fp16" else precision)
    flop_rate = used[precision]
    out.update(precision=precision, flop_per_s=flop_rate, peak_flop_per_s=peak)
    bw = t["dram_bytes_per_s"]
    if bw:
        ai = flop_rate / bw
        out["arithmetic_intensity"] = ai
        if peak and ceil.dram_bytes_per_s:
            roof = min(peak, ai * ceil.dram_bytes_per_s)
            out.update(ridge_point=peak / ceil.dram_bytes_per_s, roof_flop_per_s=roof,
                       roof_fraction=flop_rate / roof)
    return out


def _occupancy(launch: _Launch) -> tuple[str | None, str | None]:
    """(limiter, grid note) and details about occupancy, waves and tails."""
    achieved, theoretical = launch.get(NCol.OCC_ACHIEVED), launch.get(NCol.OCC_THEORETICAL)
    limiter = None
    limits = [(launch.get(col), what) for col, what in _LIMITERS]
    present = [(v, w) for v, w in limits if v is not None]
    if present and theoretical is not None and theoretical < 100.0:
        low = min(v for v, _ in present)
        names = [w for v, w in present if v == low]
        limiter = " and ".join(names)
        if theoretical < th.LOW_THEORETICAL_OCCUPANCY_PCT:
            launch.details.append(
                f"theoretical occupancy {theoretical:.0f}% is limited by {limiter} "
                f"({low:.0f} blocks per SM)")
    if achieved is not None and theoretical and achieved < th.OCCUPANCY_GAP_RATIO * theoretical:
        launch.details.append(
            f"achieved occupancy {achieved:.0f}% is well below the theoretical {theoretical:.0f}% "
            "(load imbalance, a tail, or too few blocks)")
    waves = launch.get(NCol.WAVES)
    grid_note = None
    if waves is not None:
        blocks, sms = launch.get(NCol.GRID_SIZE), launch.get(NCol.SM_COUNT)
        if waves < th.FULL_WAVE:
            grid_note = "small grid"
            extra = f" ({blocks:.0f} blocks for {sms:.0f} SMs)" if blocks and sms else ""
            launch.details.append(f"the grid fills only {waves:.2f} of one wave{extra}: SMs sit idle")
        elif waves < th.TAIL_MAX_WAVES:
            fill = waves - math.floor(waves)
            if 0.0 < fill < th.TAIL_FILL_BELOW:
                grid_note = "tail"
                launch.details.append(
                    f"{waves:.2f} waves: the last wave is {fill:.0%} full, so SMs idle through it")
    return limiter, grid_note


def _memory_signs(launch: _Launch) -> dict[str, Any]:
    out: dict[str, Any] = {"local_memory_inst": None, "excess_sector_share": None,
                           "sectors_per_load": None, "sectors_per_store": None, "uncoalesced": None}
    local = _sum(launch.get(NCol.LOCAL_LOADS), launch.get(NCol.LOCAL_STORES))
    out["local_memory_inst"] = local
    if local:
        launch.details.append(
            f"{local:,.0f} local-memory instructions: register spills (or local arrays) go to memory")
    flags = []
    excess, ideal = launch.get(NCol.L2_EXCESS_SECTORS), launch.get(NCol.L2_IDEAL_SECTORS)
    if excess is not None and ideal:
        share = excess / (excess + ideal)
        out["excess_sector_share"] = share
        if share >= th.EXCESS_SECTORS_SHARE:
            flags.append(f"{share:.0%} of global-memory sectors are excess (uncoalesced)")
    for kind, sectors, requests in (("load", NCol.GLOBAL_LD_SECTORS, NCol.GLOBAL_LD_REQUESTS),
                                    ("store", NCol.GLOBAL_ST_SECTORS, NCol.GLOBAL_ST_REQUESTS)):
        s, r = launch.get(sectors), launch.get(requests)
        if s is not None and r:
            ratio = s / r
            out[f"sectors_per_{kind}"] = ratio
            if ratio >= th.UNCOALESCED_SECTORS_PER_REQUEST:
                flags.append(f"global {kind}s touch {ratio:.0f} sectors per request (uncoalesced)")
    out["uncoalesced"] = bool(flags) if (out["excess_sector_share"] is not None
                                         or out["sectors_per_load"] is not None
                                         or out["sectors_per_store"] is not None) else None
    launch.details.extend(flags)
    return out


def _stall_text(stalls: list[dict[str, Any]]) -> str | None:
    if not stalls:
        return None
    parts = []
    for s in stalls[:2]:
        meaning = STALL_MEANING.get(s["reason"], s["reason"].replace("_", " "))
        unit = " cycles/instr" if s["source"] == "stall_cycles" else " samples"
        parts.append(f"{s['reason']} ({meaning}; {s['share']:.0%}, {s['value']:.1f}{unit})")
    return "warps stall mostly on " + " and ".join(parts)


def _verdict(launch: _Launch, t: dict[str, float | None], ceil: Ceilings, grid_note: str | None,
             stalls: list[dict[str, Any]]) -> tuple[str, str]:
    sm, mem = launch.get(NCol.SM_PCT), t["memory_pct"]
    dram, l1, l2 = t["dram_pct"], launch.get(NCol.L1_PCT), launch.get(NCol.L2_PCT)
    if sm is None and mem is None:
        if launch.get(NCol.DUR) is None:
            return UNKNOWN, "ncu recorded no metrics for this launch (collection failed or was skipped)"
        return UNKNOWN, "the export has neither compute nor memory throughput for this launch"
    sm_v, mem_v = sm or 0.0, mem or 0.0
    # A throughput the export lacks is said to be missing, not shown as 0%.
    sm_t = f"{sm_v:.0f}%" if sm is not None else "not in the export"
    mem_t = f"{mem_v:.0f}%" if mem is not None else "not in the export"
    if max(sm_v, mem_v) < th.SATURATED_PCT:
        why = [f"neither compute (SM {sm_t}) nor memory ({mem_t}) is near its peak"]
        if grid_note == "small grid":
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
        rate = t["dram_bytes_per_s"]
        if rate and ceil.dram_bytes_per_s:
            where += (f" (DRAM {_fmt_rate(rate, 'B/s')} of {_fmt_rate(ceil.dram_bytes_per_s, 'B/s')})")
        if top and top[1] != "DRAM" and dram is not None and dram < th.SATURATED_PCT:
            where += f"; DRAM only {dram:.0f}%: on-chip traffic, not DRAM, is the limit"
        if balanced:
            where += f"; compute is close behind (SM {sm_t}): both need to shrink"
        return MEMORY_BOUND, where
    where = f"SM at {sm_v:.0f}% of peak (memory {mem_t})"
    tensor = launch.get(NCol.TENSOR_PCT)
    if tensor:
        where += f"; tensor pipe {tensor:.0f}% busy"
    if balanced:
        where += "; memory is close behind: both need to shrink"
    return COMPUTE_BOUND, where


#: Rank of ncu's speedup types, best first. NvRules (IFrontend.SpeedupType) defines GLOBAL as
#: "the proportional reduction in runtime of the entire workload" and LOCAL as "the proportional
#: increase in efficiency of the hardware usage when viewing the performance problem in
#: isolation": only a global figure is a share of the kernel's time, so a local 98.9% (a pipe
#: that is idle, in a memory-bound copy) says less than a global 74% (uncoalesced accesses).
#: A rule whose export gives no type (CSV pages without the column) ranks between the two.
SPEEDUP_TYPE_RANK: Final = {"global": 0, None: 1, "local": 2}


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


_LAUNCH_SCHEMA: Final = {
    NCol.LAUNCH: pl.Int64, NCol.NAME: pl.String, NCol.DEMANGLED: pl.String, NCol.DUR: pl.Int64,
    "bound": pl.String,
    "reason": pl.String, "details": pl.String, "sm_pct": pl.Float64, "memory_pct": pl.Float64,
    "dram_pct": pl.Float64, "l1_pct": pl.Float64, "l2_pct": pl.Float64,
    "dram_bytes_per_s": pl.Float64, "peak_dram_bytes_per_s": pl.Float64,
    "fp64_flop_per_s": pl.Float64, "fp32_flop_per_s": pl.Float64, "fp16_flop_per_s": pl.Float64,
    "precision": pl.String, "flop_per_s": pl.Float64, "peak_flop_per_s": pl.Float64,
    "arithmetic_intensity": pl.Float64, "ridge_point": pl.Float64, "roof_flop_per_s": pl.Float64,
    "roof_fraction": pl.Float64, "tensor_pipe_pct": pl.Float64,
    "achieved_occupancy_pct": pl.Float64, "theoretical_occupancy_pct": pl.Float64,
    "occupancy_limiter": pl.String, "waves_per_sm": pl.Float64, "grid_note": pl.String,
    "local_memory_inst": pl.Float64, "excess_sector_share": pl.Float64,
    "sectors_per_load": pl.Float64, "sectors_per_store": pl.Float64, "uncoalesced": pl.Boolean,
    "top_stalls": pl.String, "sm_clock_hz": pl.Float64, "clock_ratio": pl.Float64,
    "clocks_locked": pl.Boolean, "rule_count": pl.Int64, "top_rule": pl.String,
    "top_rule_speedup_pct": pl.Float64, "top_rule_speedup_type": pl.String,
}


def roofline(report: NcuReport, options: RooflineOptions = RooflineOptions()) -> NcuRooflineResult:
    table = _table_peaks(report, options)
    stalls = _stalls(report)
    stalls_by_launch: dict[int, list[dict[str, Any]]] = {}
    for s in stalls.iter_rows(named=True):
        stalls_by_launch.setdefault(s[BCol.LAUNCH], []).append(s)
    rules_by_launch: dict[int, list[dict[str, Any]]] = {}
    for r in report.rules.iter_rows(named=True):
        rules_by_launch.setdefault(r[RCol.LAUNCH], []).append(r)

    rows: list[dict[str, Any]] = []
    # Report-wide ceilings are those of the longest launch: its measured clocks are the steadiest.
    ceilings, longest = Ceilings(), -1
    for raw in report.launches.iter_rows(named=True):
        launch = _Launch(raw)
        ratio = _clock_ratio(launch, table)
        ceil = _ceilings(launch, table, ratio)
        if (raw[NCol.DUR] or 0) > longest:
            ceilings, longest = ceil, raw[NCol.DUR] or 0
        t = _throughputs(launch, ceil)
        roof = _roofline(t, ceil)
        limiter, grid_note = _occupancy(launch)
        signs = _memory_signs(launch)
        launch_id = raw[NCol.LAUNCH]
        bound, reason = _verdict(launch, t, ceil, grid_note, stalls_by_launch.get(launch_id, []))
        top_rule, top_speedup, top_type = _top_rule(rules_by_launch.get(launch_id, []))
        locked = raw[NCol.CLOCKS_LOCKED]
        if locked is None and ratio is not None:
            locked = ratio < th.CLOCK_LOCK_RATIO
        rows.append({
            NCol.LAUNCH: launch_id, NCol.NAME: raw[NCol.NAME], NCol.DEMANGLED: raw[NCol.DEMANGLED],
            NCol.DUR: raw[NCol.DUR],
            "bound": bound, "reason": reason, "details": "; ".join(launch.details) or None,
            "sm_pct": launch.get(NCol.SM_PCT), "memory_pct": t["memory_pct"], "dram_pct": t["dram_pct"],
            "l1_pct": launch.get(NCol.L1_PCT), "l2_pct": launch.get(NCol.L2_PCT),
            "dram_bytes_per_s": t["dram_bytes_per_s"], "peak_dram_bytes_per_s": ceil.dram_bytes_per_s,
            "fp64_flop_per_s": t["fp64_flop_per_s"], "fp32_flop_per_s": t["fp32_flop_per_s"],
            "fp16_flop_per_s": t["fp16_flop_per_s"], **roof,
            "tensor_pipe_pct": launch.get(NCol.TENSOR_PCT),
            "achieved_occupancy_pct": launch.get(NCol.OCC_ACHIEVED),
            "theoretical_occupancy_pct": launch.get(NCol.OCC_THEORETICAL),
            "occupancy_limiter": limiter, "waves_per_sm": launch.get(NCol.WAVES), "grid_note": grid_note,
            **signs,
            "top_stalls": _stall_text(stalls_by_launch.get(launch_id, [])),
            "sm_clock_hz": launch.get(NCol.SM_CLOCK), "clock_ratio": ratio, "clocks_locked": locked,
            "rule_count": len(rules_by_launch.get(launch_id, [])), "top_rule": top_rule,
            "top_rule_speedup_pct": top_speedup, "top_rule_speedup_type": top_type,
        })
    launches = pl.DataFrame(rows, schema=_LAUNCH_SCHEMA, strict=False)
    names = report.launches.get_column(NCol.DEVICE_NAME).drop_nulls()
    device = names[0] if names.len() else (table.name if table else options.device)
    locked_values = launches.get_column("clocks_locked").drop_nulls()
    clocks_locked = bool(locked_values.any()) if locked_values.len() else None
    notes = _notes(report, launches, ceilings, table, clocks_locked)
    rules = report.rules.join(report.launches.select(NCol.LAUNCH, NCol.NAME), on=NCol.LAUNCH, how="left")
    stalls = stalls.join(report.launches.select(NCol.LAUNCH, NCol.NAME), on=NCol.LAUNCH, how="left")
    return NcuRooflineResult(
        path=report.path, format=report.format, tool_version=report.tool_version, device_name=device,
        ceilings=ceilings, clocks_locked=clocks_locked,
        launches=launches.sort([NCol.DUR, NCol.LAUNCH], descending=[True, False], nulls_last=True),
        kernels=_by_kernel(launches), rules=rules, stalls=stalls, notes=notes,
    )


def _notes(report: NcuReport, launches: pl.DataFrame, ceilings: Ceilings, table: DevicePeaks | None,
           clocks_locked: bool | None) -> tuple[str, ...]:
    notes = list(report.warnings)
    clock_note = _clock_note(report, launches, clocks_locked)
    if clock_note:
        notes.append(clock_note)
    if ceilings.source == "none":
        notes.append("no peaks: the report has none and the device is not in the peak table "
                     "(pass --device NAME); percentages of peak come from ncu alone")
    elif "table" in ceilings.source and table is not None:
        notes.append(f"peaks not in the report come from the {table.name} entry ({table.source})"
                     + (f"; {table.scaled_note}" if table.scaled_note else ""))
    unknown = launches.filter(pl.col("bound") == UNKNOWN).height
    if unknown:
        notes.append(f"{unknown} launch(es) have no throughput metrics and no verdict")
    return tuple(notes)


def _clock_note(report: NcuReport, launches: pl.DataFrame, clocks_locked: bool | None) -> str | None:
    """What the SM clock of the longest launch says about the capture, if anything."""
    timed = launches.filter(pl.col(NCol.DUR).is_not_null())
    longest = timed.sort(NCol.DUR, descending=True).row(0, named=True) if timed.height else {}
    ratio, clock = longest.get("clock_ratio"), longest.get("sm_clock_hz")
    # ncu's own record (ClockStatus), not the guess from the clock that launches["clocks_locked"]
    # falls back to.
    raw = report.launches.filter(pl.col(NCol.LAUNCH) == longest.get(NCol.LAUNCH, -1))
    recorded = raw.get_column(NCol.CLOCKS_LOCKED)[0] if raw.height else None
    if ratio is not None and clock and ratio < th.LOW_CLOCK_RATIO:
        cause = {
            True: "clocks were locked for profiling (ncu's default --clock-control base)",
            False: ("ncu did not lock the clocks, so the GPU ran throttled (power or thermal limit) "
                    "or clocked down between kernels"),
            None: "clocks were locked for profiling or the GPU throttled",
        }[recorded]
        return (f"SM clock {clock / 1e9:.2f} GHz during the capture, {ratio:.0%} of the "
                f"{clock / ratio / 1e9:.2f} GHz boost: {cause}. Compute-bound kernels run up to "
                f"{1 / ratio:.1f}x faster at boost; compute peaks here are at the profiled clock.")
    if not clocks_locked:
        return None
    at = f" (SM clock {clock / 1e9:.2f} GHz, {ratio:.0%} of the maximum)" if ratio is not None and clock else ""
    what = ("clocks were locked for profiling" if report.launches.get_column(NCol.CLOCKS_LOCKED).drop_nulls().len()
            else "clocks were probably locked for profiling (or the GPU throttled)")
    return (f"{what}{at}: ncu's default --clock-control base. Durations are longer than in an "
            "unlocked run, and compute peaks here are at the profiled clock.")


def _by_kernel(launches: pl.DataFrame) -> pl.DataFrame:
    """One row per kernel name: time-weighted metrics, the bound that takes most of its time."""
    total = launches.get_column(NCol.DUR).sum() or 0
    w = pl.col(NCol.DUR).cast(pl.Float64)

    def wmean(col: str) -> pl.Expr:
        valid = pl.col(col).is_not_null() & pl.col(NCol.DUR).is_not_null()
        weight = w.filter(valid).sum()
        return (pl.when(weight > 0).then((pl.col(col) * w).filter(valid).sum() / weight)
                .otherwise(None).alias(col))

    by_bound = (
        launches.group_by(NCol.NAME, "bound").agg(pl.col(NCol.DUR).sum().alias("bound_ns"))
        .sort([NCol.NAME, "bound_ns", "bound"], descending=[False, True, False], nulls_last=True)
        .group_by(NCol.NAME, maintain_order=True).first()
    )
    representative = (
        launches.join(by_bound.select(NCol.NAME, "bound"), on=[NCol.NAME, "bound"])
        .sort([NCol.NAME, NCol.DUR], descending=[False, True], nulls_last=True)
        .group_by(NCol.NAME, maintain_order=True)
        .first()
        .select(NCol.NAME, "bound", "reason", "details", "occupancy_limiter", "top_stalls", "top_rule",
                "top_rule_speedup_pct", "top_rule_speedup_type", "precision")
    )
    bounds_seen = launches.group_by(NCol.NAME).agg(pl.col("bound").unique().sort().alias("bounds"))
    stats = launches.group_by(NCol.NAME).agg(
        pl.len().cast(pl.Int64).alias("launches"),
        pl.col(NCol.DUR).sum().alias("total_ns"),
        pl.col(NCol.DUR).mean().alias("mean_ns"),
        *(wmean(c) for c in ("sm_pct", "memory_pct", "dram_pct", "achieved_occupancy_pct",
                             "theoretical_occupancy_pct", "roof_fraction", "arithmetic_intensity",
                             "dram_bytes_per_s", "flop_per_s")),
    )
    return (
        stats.join(representative, on=NCol.NAME, how="left")
        .join(bounds_seen, on=NCol.NAME, how="left")
        .with_columns(
            (pl.col("total_ns") / max(total, 1)).alias("share"),
            # The row's figures are time-weighted means; the reason's are its longest launch's.
            pl.when(pl.col("launches") > 1).then(pl.format("in its longest launch, {}", "reason"))
            .otherwise(pl.col("reason")).alias("reason"),
        )
        .sort(["total_ns", NCol.NAME], descending=[True, False], nulls_last=True)
    )
