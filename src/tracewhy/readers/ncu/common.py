"""What the ncu readers share: which metric or details-page label fills which column.

Both readers collect, per launch, metric values by ncu metric name (raw page, ``.ncu-rep``)
or by the label the details page prints ("Duration", "SOL DRAM"), already in base units
(``ncu_units``). ``build_report`` resolves them into the tables of ``model.ncu``. Metric
names are tried first, in the order listed: they are exact. Labels changed between ncu
versions (2020.3 prints "SOL SM" where 2022+ prints "Compute (SM) Throughput"), so each
column lists every label known to carry it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import polars as pl

from tracewhy.errors import TraceError
from tracewhy.model.ncu import (
    NCU_BREAKDOWNS_SCHEMA,
    NCU_LAUNCHES_SCHEMA,
    NCU_RULES_SCHEMA,
    BreakdownCol,
    NcuCol,
    NcuReport,
    NcuRun,
    RuleCol,
)
from tracewhy.readers.ncu import units as u

Value = float | str


@dataclass(frozen=True)
class Field:
    """One launch column: the metrics (by name) and details labels that can fill it."""

    column: str
    dimension: str
    metrics: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    scale: float = 1.0  # applied after unit normalization (device attributes in kHz)


_SASS_OP = "smsp__sass_thread_inst_executed_op_{}_pred_on.sum.per_cycle_elapsed"

FIELDS: Final = (
    Field(NcuCol.DUR, u.TIME, ("gpu__time_duration.sum", "gpu__time_duration.avg"), ("Duration",)),
    Field(NcuCol.ELAPSED_CYCLES, u.COUNT, ("gpc__cycles_elapsed.max",), ("Elapsed Cycles",)),
    # The SM clock is the one ncu's roofline sections multiply per-cycle figures by: the peak
    # with sm__cycles_elapsed.avg.per_second, the achieved with smsp__ (equal to it in every
    # report here). The SOL header's "SM Frequency" is the GPC clock, which differs from it by
    # +4.4% (RTX 3060 Ti) to -8.2% (H100) in ncu 2024.3 reports; basic-set reports carry only
    # the GPC clock, so it is the fallback.
    Field(NcuCol.SM_CLOCK, u.FREQ,
          ("sm__cycles_elapsed.avg.per_second", "smsp__cycles_elapsed.avg.per_second",
           "gpc__cycles_elapsed.avg.per_second"),
          ("SM Frequency",)),
    Field(NcuCol.SMSP_CLOCK, u.FREQ, ("smsp__cycles_elapsed.avg.per_second",)),
    # ncu 2020.3 labels the DRAM clock "Memory Frequency".
    Field(NcuCol.DRAM_CLOCK, u.FREQ, ("dram__cycles_elapsed.avg.per_second",),
          ("DRAM Frequency", "Memory Frequency")),
    Field(NcuCol.MAX_SM_CLOCK, u.FREQ, ("device__attribute_max_gpu_frequency_khz",), scale=1e3),
    Field(NcuCol.SM_COUNT, u.COUNT, ("launch__sm_count", "device__attribute_multiprocessor_count"),
          ("# SMs",)),
    Field(NcuCol.GRID_SIZE, u.COUNT, ("launch__grid_size",), ("Grid Size",)),
    Field(NcuCol.BLOCK_SIZE, u.COUNT, ("launch__block_size",), ("Block Size",)),
    Field(NcuCol.REGISTERS, u.COUNT, ("launch__registers_per_thread",), ("Registers Per Thread",)),
    Field(NcuCol.SHARED_STATIC, u.BYTES, ("launch__shared_mem_per_block_static",),
          ("Static Shared Memory Per Block",)),
    Field(NcuCol.SHARED_DYNAMIC, u.BYTES, ("launch__shared_mem_per_block_dynamic",),
          ("Dynamic Shared Memory Per Block",)),
    Field(NcuCol.WAVES, u.COUNT, ("launch__waves_per_multiprocessor",), ("Waves Per SM",)),
    Field(NcuCol.SM_PCT, u.PCT, ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
          ("Compute (SM) Throughput", "SOL SM", "Compute (SM) [%]")),
    # "Memory Throughput" is also the label of dram__bytes.sum.per_second in the Memory Workload
    # Analysis section; the dimension (% vs byte/s) tells them apart.
    Field(NcuCol.MEM_PCT, u.PCT, ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
          ("Memory Throughput", "SOL Memory", "Memory [%]")),
    # ncu <= 2020 called DRAM "FB" (frame buffer) in the SOL section.
    Field(NcuCol.DRAM_PCT, u.PCT,
          ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
          ("DRAM Throughput", "SOL DRAM", "SOL FB")),
    Field(NcuCol.L1_PCT, u.PCT, ("l1tex__throughput.avg.pct_of_peak_sustained_active",),
          ("L1/TEX Cache Throughput", "SOL L1/TEX Cache")),
    Field(NcuCol.L2_PCT, u.PCT, ("lts__throughput.avg.pct_of_peak_sustained_elapsed",),
          ("L2 Cache Throughput", "SOL L2 Cache")),
    Field(NcuCol.DRAM_BYTES_PER_S, u.RATE, ("dram__bytes.sum.per_second",),
          ("Memory Throughput", "DRAM Bandwidth")),
    # Blackwell-era metric lists name them dram__bytes_op_read/write (2026 CSVs here).
    Field(NcuCol.DRAM_READ, u.BYTES, ("dram__bytes_read.sum", "dram__bytes_op_read.sum")),
    Field(NcuCol.DRAM_WRITE, u.BYTES, ("dram__bytes_write.sum", "dram__bytes_op_write.sum")),
    Field(NcuCol.DRAM_PEAK_PER_CYCLE, u.PER_CYCLE, ("dram__bytes.sum.peak_sustained",),
          ("Theoretical DRAM Bytes Accessible",)),
    Field(NcuCol.FADD, u.PER_CYCLE, (_SASS_OP.format("fadd"),)),
    Field(NcuCol.FMUL, u.PER_CYCLE, (_SASS_OP.format("fmul"),)),
    Field(NcuCol.FFMA, u.PER_CYCLE, (_SASS_OP.format("ffma"),)),
    Field(NcuCol.DADD, u.PER_CYCLE, (_SASS_OP.format("dadd"),)),
    Field(NcuCol.DMUL, u.PER_CYCLE, (_SASS_OP.format("dmul"),)),
    Field(NcuCol.DFMA, u.PER_CYCLE, (_SASS_OP.format("dfma"),)),
    Field(NcuCol.HADD, u.PER_CYCLE, (_SASS_OP.format("hadd"),)),
    Field(NcuCol.HMUL, u.PER_CYCLE, (_SASS_OP.format("hmul"),)),
    Field(NcuCol.HFMA, u.PER_CYCLE, (_SASS_OP.format("hfma"),)),
    Field(NcuCol.FFMA_PEAK, u.PER_CYCLE, ("sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained",)),
    Field(NcuCol.DFMA_PEAK, u.PER_CYCLE, ("sm__sass_thread_inst_executed_op_dfma_pred_on.sum.peak_sustained",)),
    Field(NcuCol.TENSOR_PCT, u.PCT,
          ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
           "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
           "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active")),
    Field(NcuCol.OCC_ACHIEVED, u.PCT, ("sm__warps_active.avg.pct_of_peak_sustained_active",),
          ("Achieved Occupancy",)),
    Field(NcuCol.OCC_THEORETICAL, u.PCT, ("sm__maximum_warps_per_active_cycle_pct",),
          ("Theoretical Occupancy",)),
    Field(NcuCol.LIMIT_BLOCKS, u.COUNT, ("launch__occupancy_limit_blocks",), ("Block Limit SM",)),
    Field(NcuCol.LIMIT_REGISTERS, u.COUNT, ("launch__occupancy_limit_registers",),
          ("Block Limit Registers",)),
    Field(NcuCol.LIMIT_SHARED, u.COUNT, ("launch__occupancy_limit_shared_mem",),
          ("Block Limit Shared Mem",)),
    Field(NcuCol.LIMIT_WARPS, u.COUNT, ("launch__occupancy_limit_warps",), ("Block Limit Warps",)),
    Field(NcuCol.LIMIT_BARRIERS, u.COUNT, ("launch__occupancy_limit_barriers",),
          ("Block Limit Barriers",)),
    Field(NcuCol.WARP_CYCLES_PER_ISSUE, u.COUNT, ("smsp__average_warp_latency_per_inst_issued.ratio",),
          ("Warp Cycles Per Issued Instruction",)),
    Field(NcuCol.ISSUE_ACTIVE_PCT, u.PCT, ("smsp__issue_active.avg.pct_of_peak_sustained_active",),
          ("One or More Eligible",)),
    Field(NcuCol.ELIGIBLE_WARPS, u.COUNT, ("smsp__warps_eligible.avg.per_cycle_active",),
          ("Eligible Warps Per Scheduler",)),
    Field(NcuCol.ACTIVE_WARPS, u.COUNT, ("smsp__warps_active.avg.per_cycle_active",),
          ("Active Warps Per Scheduler",)),
    Field(NcuCol.LOCAL_LOADS, u.COUNT,
          ("sass__inst_executed_local_loads", "smsp__sass_inst_executed_op_local_ld.sum",
           "smsp__inst_executed_op_local_ld.sum")),
    Field(NcuCol.LOCAL_STORES, u.COUNT,
          ("sass__inst_executed_local_stores", "smsp__sass_inst_executed_op_local_st.sum",
           "smsp__inst_executed_op_local_st.sum")),
    Field(NcuCol.GLOBAL_LD_SECTORS, u.COUNT, ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",)),
    Field(NcuCol.GLOBAL_LD_REQUESTS, u.COUNT, ("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",)),
    Field(NcuCol.GLOBAL_ST_SECTORS, u.COUNT, ("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",)),
    Field(NcuCol.GLOBAL_ST_REQUESTS, u.COUNT, ("l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",)),
    Field(NcuCol.L2_EXCESS_SECTORS, u.COUNT, ("derived__memory_l2_theoretical_sectors_global_excessive",)),
    Field(NcuCol.L2_IDEAL_SECTORS, u.COUNT, ("memory_l2_theoretical_sectors_global_ideal",)),
    Field(NcuCol.L1_HIT_PCT, u.PCT, ("l1tex__t_sector_hit_rate.pct",), ("L1/TEX Hit Rate",)),
    Field(NcuCol.L2_HIT_PCT, u.PCT, ("lts__t_sector_hit_rate.pct",), ("L2 Hit Rate",)),
)

#: Metric-name families that become breakdown rows: (group, pattern whose group 1 is the key).
BREAKDOWN_PATTERNS: Final = (
    ("stall_cycles", re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")),
    # ncu 2019.x-2020.1 named the same quantity smsp__average_warp_latency_issue_stalled_*.
    ("stall_cycles", re.compile(r"^smsp__average_warp_latency_issue_stalled_(\w+?)\.ratio$")),
    ("stall_samples", re.compile(r"^smsp__pcsamp_warps_issue_stalled_(\w+?)$")),
    ("pipe_pct", re.compile(r"^sm__inst_executed_pipe_(\w+?)\.avg\.pct_of_peak_sustained_active$")),
)
#: Details-page labels of the Warp State Statistics body ("Stall Long Scoreboard").
_STALL_LABEL: Final = re.compile(r"^Stall (.+)$")


class Problems:
    """What a reader skipped, reinterpreted or could not read, tallied by kind: the report gets
    one warning line per kind, with its count and the first case, however many rows had it."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._first: dict[str, str] = {}
        self._noun: dict[str, str] = {}

    def add(self, kind: str, where: str = "", noun: str = "row") -> None:
        self._counts[kind] = self._counts.get(kind, 0) + 1
        self._noun.setdefault(kind, noun)
        if where:
            self._first.setdefault(kind, where)

    def __len__(self) -> int:
        return len(self._counts)

    def lines(self) -> tuple[str, ...]:
        out = []
        for kind, n in self._counts.items():
            noun = self._noun[kind]
            noun = noun if n == 1 else noun + ("es" if noun.endswith(("ch", "s")) else "s")
            first = self._first.get(kind)
            out.append(f"{kind}: {n} {noun}" + (f" (first: {first})" if first else ""))
        return tuple(out)


@dataclass
class LaunchRecord:
    """Everything a reader found about one launch, before resolution into columns."""

    launch_id: int  # ncu's ID within its run
    name: str
    run: int = 0
    where: str = ""  # how a warning names the launch to the user ("line 12", "launch 3")
    identity: dict[str, object] = field(default_factory=dict)  # NcuCol -> value, taken as is
    metrics: dict[str, tuple[Value, str]] = field(default_factory=dict)  # name -> (value, dim)
    labels: dict[str, list[tuple[Value, str]]] = field(default_factory=dict)  # label -> values
    rules: list[dict[str, object]] = field(default_factory=list)  # RuleCol -> value
    units: dict[str, str] = field(default_factory=dict)  # metric or label -> unit, if UNKNOWN


_MARKUP: Final = re.compile(r"@(\w+):([^@]*)@")


def plain_rule_text(text: str) -> str:
    """ncu's rule markup resolved to what its UI shows: "@section:Id:Label@" -> "Label".

    "@url:Label:https://...@" becomes "Label"; "@source:Id:0x7f..@" the address.
    """

    def repl(m: re.Match[str]) -> str:
        kind, body = m.group(1), m.group(2)
        if kind == "url":
            return body.split(":", 1)[0]
        return body.rsplit(":", 1)[-1] if ":" in body else body

    return " ".join(_MARKUP.sub(repl, text).split())


def parse_dim3(text: str) -> tuple[int, int, int] | None:
    """"(256, 1, 1)" -> (256, 1, 1); None for anything else."""
    parts = re.findall(r"\d+", text or "")
    if len(parts) != 3:
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def _compatible(dim: str, wanted: str) -> bool:
    # A unitless value is taken in base units: raw pages of some versions leave units empty.
    # Counts take any unit: ncu labels some sector counts "byte" (derived__memory_l2_
    # theoretical_sectors_global_excessive), and ncu_report 2026.3 returns that unit or none
    # depending on which metrics were read before. An unknown unit is never a time or a rate.
    return dim == wanted or dim == u.COUNT or wanted == u.COUNT


def _resolve(record: LaunchRecord, spec: Field, problems: Problems) -> float | None:
    refused: list[str] = []
    texts: list[tuple[str, str]] = []  # (name, text): a cell that holds words, not a number
    for metric in spec.metrics:
        got = record.metrics.get(metric)
        if got is not None and isinstance(got[0], str):
            texts.append((metric, got[0]))
        if got is not None and isinstance(got[0], float):
            if _compatible(got[1], spec.dimension):
                return got[0] * spec.scale
            if got[1] == u.UNKNOWN:
                refused.append(metric)
    for label in spec.labels:
        for value, dim in record.labels.get(label, ()):
            if isinstance(value, float) and (dim == spec.dimension or (
                    dim in (u.COUNT, u.UNKNOWN) and spec.dimension == u.COUNT) or (
                    dim == u.COUNT and spec.dimension == u.PER_CYCLE)):
                return value * spec.scale
            if isinstance(value, float) and dim == u.UNKNOWN:
                refused.append(label)
            if isinstance(value, str):
                texts.append((label, value))
    for name, text in texts[:1]:
        # ("fast" where a duration belongs was shown as a 0 ns kernel, and called latency-bound.)
        problems.add(f"{name} is text, not a number: {spec.column} left empty", f"{record.where}: {text[:40]!r}",
                     "launch")
    for name in refused[:1]:
        problems.add(f"{name} in unit {record.units.get(name, '?')[:40]!r}, not a {spec.dimension} unit "
                     f"tracewhy knows: not used as {spec.column}", record.where, "launch")
    return None


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) or math.isinf(value) else value


def _breakdown_rows(record: LaunchRecord) -> list[dict[str, object]]:
    rows: dict[tuple[str, str], float] = {}
    for metric, (value, _dim) in record.metrics.items():
        if not isinstance(value, float) or _finite(value) is None:
            continue
        for group, pattern in BREAKDOWN_PATTERNS:
            m = pattern.match(metric)
            if m and not m.group(1).endswith("not_issued"):
                rows.setdefault((group, m.group(1)), value)
                break
    for label, values in record.labels.items():
        m = _STALL_LABEL.match(label)
        if m and values and isinstance(values[0][0], float) and _finite(values[0][0]) is not None:
            key = m.group(1).strip().lower().replace(" ", "_")
            rows.setdefault(("stall_cycles", key), values[0][0])
    return [
        {BreakdownCol.LAUNCH: record.launch_id, BreakdownCol.GROUP: g, BreakdownCol.KEY: k, BreakdownCol.VALUE: v}
        for (g, k), v in sorted(rows.items())
    ]


_INT_RANGE: Final = {
    name: (-(2**31), 2**31 - 1) if dtype == pl.Int32 else (-u.INT64_MAX - 1, u.INT64_MAX)
    for name, dtype in NCU_LAUNCHES_SCHEMA.items() if dtype in (pl.Int64, pl.Int32)
}


def _whole(value: object) -> tuple[int | None, str | None]:
    """An identity or count value fit for its integer column, or the reason it is not."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None, "nan or inf"
        value = round(value)
    if not isinstance(value, int) or isinstance(value, bool):
        return None, "not a whole number"
    return value, None


def _run_offsets(records: list[LaunchRecord], count: int) -> list[int]:
    """Each run's launch_id offset: one past the previous run's highest (shifted) ID."""
    highest = [-1] * count
    for rec in records:
        highest[rec.run] = max(highest[rec.run], rec.launch_id)
    offsets = [0] * count
    for k in range(1, count):
        offsets[k] = offsets[k - 1] + highest[k - 1] + 1
    return offsets


def build_report(
    path: Path,
    fmt: str,
    records: list[LaunchRecord],
    *,
    tool_version: str | None = None,
    profiler_cmdline: str | None = None,
    warnings: tuple[str, ...] = (),
    problems: Problems | None = None,
    runs: tuple[NcuRun, ...] = (),
) -> NcuReport:
    """Resolve collected launches into an NcuReport; raise TraceError if nothing usable.

    ``runs`` (with each record's ``run``) describes a file holding several ncu runs; the
    offsets there are recomputed here.
    """
    problems = problems if problems is not None else Problems()
    if not records:
        detail = "; ".join(problems.lines())
        raise TraceError(path, "contains no profiled kernel launches" + (f"; {detail}" if detail else ""))
    offsets = _run_offsets(records, max(1, len(runs)))
    runs = tuple(NcuRun(r.index, r.format, offsets[r.index], r.line) for r in runs) if len(runs) > 1 else ()
    seen: set[tuple[int, int]] = set()
    launch_rows: list[dict[str, object]] = []
    breakdown_rows: list[dict[str, object]] = []
    rule_rows: list[dict[str, object]] = []
    for rec in records:
        if (rec.run, rec.launch_id) in seen:
            problems.add("launch IDs that appear twice in one run (kept the first)", rec.where, "launch")
            continue
        seen.add((rec.run, rec.launch_id))
        launch_id = rec.launch_id + offsets[rec.run]
        if launch_id > u.INT64_MAX:
            problems.add("launches skipped: ID beyond int64 once numbered on after earlier runs", rec.where,
                         "launch")
            continue
        row: dict[str, object] = {NcuCol.LAUNCH: launch_id, NcuCol.RUN: rec.run, NcuCol.NAME: rec.name}
        for column, raw in rec.identity.items():
            if column not in _INT_RANGE:
                row[column] = raw
                continue
            whole, problem = _whole(raw)
            low, high = _INT_RANGE[column]
            if whole is not None and not low <= whole <= high:
                problem = "beyond int64" if high == u.INT64_MAX else "beyond int32"
            if problem:
                problems.add(f"{column} {problem}, left empty", rec.where, "launch")
            else:
                row[column] = whole
        for spec in FIELDS:
            value = _resolve(rec, spec, problems)
            if value is None:
                continue
            if math.isnan(value) or math.isinf(value):
                problems.add(f"{spec.column} nan or inf, left empty", rec.where, "launch")
            elif spec.column == NcuCol.DUR and value < 0:
                # A negative duration is no measurement (a corrupted or hand-edited file).
                problems.add(f"{spec.column} negative, left empty", rec.where, "launch")
            elif spec.column in _INT_RANGE and not _INT_RANGE[spec.column][0] <= value <= _INT_RANGE[spec.column][1]:
                problems.add(f"{spec.column} beyond int64, left empty", rec.where, "launch")
            else:
                row[spec.column] = round(value) if spec.column in _INT_RANGE else value
        launch_rows.append(row)
        breakdown_rows.extend({**b, BreakdownCol.LAUNCH: launch_id} for b in _breakdown_rows(rec))
        for rule in rec.rules:
            rule_rows.append({RuleCol.LAUNCH: launch_id, **rule})
    launches = pl.DataFrame(launch_rows, schema=NCU_LAUNCHES_SCHEMA, strict=False)
    breakdowns = pl.DataFrame(breakdown_rows, schema=NCU_BREAKDOWNS_SCHEMA, strict=False)
    rules = pl.DataFrame(rule_rows, schema=NCU_RULES_SCHEMA, strict=False)
    report = NcuReport(
        path=str(path), format=fmt, tool_version=tool_version, profiler_cmdline=profiler_cmdline,
        launches=launches, breakdowns=breakdowns, rules=rules, warnings=(*warnings, *problems.lines()),
        runs=runs,
    )
    report.check()
    return report
