"""Nsight Compute results in normalized tables: one row per profiled launch, plus rules.

The ncu readers (CSV pages and ``.ncu-rep``) fill exactly these schemas; ``NcuReport.check()``
verifies them. Values are in base units whatever the export printed: time in ns, clocks in Hz,
sizes in bytes, rates in bytes/s, shares in percent (0-100, as ncu prints them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

import polars as pl

from tracewhy.model.trace import ModelError


class NcuCol:
    """Columns of the per-launch table (``NcuReport.launches``)."""

    LAUNCH: Final = "launch_id"  # ncu's "ID" (+ its run's id_offset): unique within the report
    RUN: Final = "run"  # which run (header block of a CSV) the launch came from; 0 if one run
    NAME: Final = "name"  # as ncu shows it (function name, or demangled with --print-kernel-base)
    DEMANGLED: Final = "demangled_name"  # full signature when the report has it
    PROCESS: Final = "process_id"
    DEVICE: Final = "device"
    CONTEXT: Final = "context"
    STREAM: Final = "stream"
    DEVICE_NAME: Final = "device_name"
    CC: Final = "compute_capability"  # "9.0"
    GRID_X: Final = "grid_x"
    GRID_Y: Final = "grid_y"
    GRID_Z: Final = "grid_z"
    BLOCK_X: Final = "block_x"
    BLOCK_Y: Final = "block_y"
    BLOCK_Z: Final = "block_z"
    CLOCKS_LOCKED: Final = "clocks_locked"  # ncu's own record of clock control for this launch
    DUR: Final = "dur_ns"
    ELAPSED_CYCLES: Final = "elapsed_cycles"
    SM_CLOCK: Final = "sm_clock_hz"  # measured during the launch
    SMSP_CLOCK: Final = "smsp_clock_hz"
    DRAM_CLOCK: Final = "dram_clock_hz"
    MAX_SM_CLOCK: Final = "max_sm_clock_hz"  # the device's maximum (boost) clock
    SM_COUNT: Final = "sm_count"
    GRID_SIZE: Final = "grid_size"  # blocks in the grid
    BLOCK_SIZE: Final = "block_size"  # threads per block
    REGISTERS: Final = "registers_per_thread"
    SHARED_STATIC: Final = "shared_mem_static_bytes"
    SHARED_DYNAMIC: Final = "shared_mem_dynamic_bytes"
    WAVES: Final = "waves_per_sm"
    SM_PCT: Final = "sm_throughput_pct"  # "Compute (SM) Throughput", % of peak
    MEM_PCT: Final = "memory_throughput_pct"  # "Memory Throughput": busiest memory unit, % of peak
    DRAM_PCT: Final = "dram_throughput_pct"
    L1_PCT: Final = "l1_throughput_pct"
    L2_PCT: Final = "l2_throughput_pct"
    DRAM_BYTES_PER_S: Final = "dram_bytes_per_s"
    DRAM_READ: Final = "dram_read_bytes"
    DRAM_WRITE: Final = "dram_write_bytes"
    DRAM_PEAK_PER_CYCLE: Final = "dram_peak_bytes_per_cycle"
    # Floating-point instructions executed per elapsed cycle, summed over the GPU (predicated on).
    FADD: Final = "fadd_per_cycle"
    FMUL: Final = "fmul_per_cycle"
    FFMA: Final = "ffma_per_cycle"
    DADD: Final = "dadd_per_cycle"
    DMUL: Final = "dmul_per_cycle"
    DFMA: Final = "dfma_per_cycle"
    HADD: Final = "hadd_per_cycle"
    HMUL: Final = "hmul_per_cycle"
    HFMA: Final = "hfma_per_cycle"
    FFMA_PEAK: Final = "ffma_peak_per_cycle"  # FFMA instructions the whole GPU can retire per cycle
    DFMA_PEAK: Final = "dfma_peak_per_cycle"
    TENSOR_PCT: Final = "tensor_pipe_pct"
    OCC_ACHIEVED: Final = "achieved_occupancy_pct"
    OCC_THEORETICAL: Final = "theoretical_occupancy_pct"
    LIMIT_BLOCKS: Final = "occupancy_limit_blocks"  # blocks per SM each resource allows
    LIMIT_REGISTERS: Final = "occupancy_limit_registers"
    LIMIT_SHARED: Final = "occupancy_limit_shared_mem"
    LIMIT_WARPS: Final = "occupancy_limit_warps"
    LIMIT_BARRIERS: Final = "occupancy_limit_barriers"
    WARP_CYCLES_PER_ISSUE: Final = "warp_cycles_per_issue"
    ISSUE_ACTIVE_PCT: Final = "issue_active_pct"
    ELIGIBLE_WARPS: Final = "eligible_warps_per_scheduler"
    ACTIVE_WARPS: Final = "active_warps_per_scheduler"
    LOCAL_LOADS: Final = "local_load_inst"  # register spills show up as local memory traffic
    LOCAL_STORES: Final = "local_store_inst"
    GLOBAL_LD_SECTORS: Final = "global_load_sectors"
    GLOBAL_LD_REQUESTS: Final = "global_load_requests"
    GLOBAL_ST_SECTORS: Final = "global_store_sectors"
    GLOBAL_ST_REQUESTS: Final = "global_store_requests"
    L2_EXCESS_SECTORS: Final = "l2_excess_sectors"  # sectors beyond a perfectly coalesced pattern
    L2_IDEAL_SECTORS: Final = "l2_ideal_sectors"
    L1_HIT_PCT: Final = "l1_hit_rate_pct"
    L2_HIT_PCT: Final = "l2_hit_rate_pct"


_F = pl.Float64()
_I = pl.Int64()

NCU_LAUNCHES_SCHEMA: Final = pl.Schema(
    {
        NcuCol.LAUNCH: _I,
        NcuCol.RUN: pl.Int32(),
        NcuCol.NAME: pl.String(),
        NcuCol.DEMANGLED: pl.String(),
        NcuCol.PROCESS: _I,
        NcuCol.DEVICE: pl.Int32(),
        NcuCol.CONTEXT: _I,
        NcuCol.STREAM: _I,
        NcuCol.DEVICE_NAME: pl.String(),
        NcuCol.CC: pl.String(),
        NcuCol.GRID_X: _I,
        NcuCol.GRID_Y: _I,
        NcuCol.GRID_Z: _I,
        NcuCol.BLOCK_X: _I,
        NcuCol.BLOCK_Y: _I,
        NcuCol.BLOCK_Z: _I,
        NcuCol.CLOCKS_LOCKED: pl.Boolean(),
        NcuCol.DUR: _I,
        NcuCol.ELAPSED_CYCLES: _F,
        NcuCol.SM_CLOCK: _F,
        NcuCol.SMSP_CLOCK: _F,
        NcuCol.DRAM_CLOCK: _F,
        NcuCol.MAX_SM_CLOCK: _F,
        NcuCol.SM_COUNT: _I,
        NcuCol.GRID_SIZE: _I,
        NcuCol.BLOCK_SIZE: _I,
        NcuCol.REGISTERS: _I,
        NcuCol.SHARED_STATIC: _I,
        NcuCol.SHARED_DYNAMIC: _I,
        NcuCol.WAVES: _F,
        NcuCol.SM_PCT: _F,
        NcuCol.MEM_PCT: _F,
        NcuCol.DRAM_PCT: _F,
        NcuCol.L1_PCT: _F,
        NcuCol.L2_PCT: _F,
        NcuCol.DRAM_BYTES_PER_S: _F,
        NcuCol.DRAM_READ: _F,
        NcuCol.DRAM_WRITE: _F,
        NcuCol.DRAM_PEAK_PER_CYCLE: _F,
        NcuCol.FADD: _F,
        NcuCol.FMUL: _F,
        NcuCol.FFMA: _F,
        NcuCol.DADD: _F,
        NcuCol.DMUL: _F,
        NcuCol.DFMA: _F,
        NcuCol.HADD: _F,
        NcuCol.HMUL: _F,
        NcuCol.HFMA: _F,
        NcuCol.FFMA_PEAK: _F,
        NcuCol.DFMA_PEAK: _F,
        NcuCol.TENSOR_PCT: _F,
        NcuCol.OCC_ACHIEVED: _F,
        NcuCol.OCC_THEORETICAL: _F,
        NcuCol.LIMIT_BLOCKS: _F,
        NcuCol.LIMIT_REGISTERS: _F,
        NcuCol.LIMIT_SHARED: _F,
        NcuCol.LIMIT_WARPS: _F,
        NcuCol.LIMIT_BARRIERS: _F,
        NcuCol.WARP_CYCLES_PER_ISSUE: _F,
        NcuCol.ISSUE_ACTIVE_PCT: _F,
        NcuCol.ELIGIBLE_WARPS: _F,
        NcuCol.ACTIVE_WARPS: _F,
        NcuCol.LOCAL_LOADS: _F,
        NcuCol.LOCAL_STORES: _F,
        NcuCol.GLOBAL_LD_SECTORS: _F,
        NcuCol.GLOBAL_LD_REQUESTS: _F,
        NcuCol.GLOBAL_ST_SECTORS: _F,
        NcuCol.GLOBAL_ST_REQUESTS: _F,
        NcuCol.L2_EXCESS_SECTORS: _F,
        NcuCol.L2_IDEAL_SECTORS: _F,
        NcuCol.L1_HIT_PCT: _F,
        NcuCol.L2_HIT_PCT: _F,
    }
)

#: Groups of the per-launch breakdown table: metrics that come as a family keyed by a name.
BREAKDOWN_GROUPS: Final = (
    "stall_cycles",  # warp cycles per issued instruction spent in each stall reason
    "stall_samples",  # PC-sampling counts per stall reason
    "pipe_pct",  # instruction pipeline utilization, % of peak while the SM is active
)


class BreakdownCol:
    """Columns of the breakdown table (``NcuReport.breakdowns``): one row per launch, group, key."""

    LAUNCH: Final = "launch_id"
    GROUP: Final = "group"
    KEY: Final = "key"  # e.g. "long_scoreboard", "fp64"
    VALUE: Final = "value"


NCU_BREAKDOWNS_SCHEMA: Final = pl.Schema(
    {
        BreakdownCol.LAUNCH: _I,
        BreakdownCol.GROUP: pl.Enum(list(BREAKDOWN_GROUPS)),
        BreakdownCol.KEY: pl.String(),
        BreakdownCol.VALUE: _F,
    }
)

RULE_SEVERITIES: Final = ("optimization", "warning", "error", "info", "ok", "none")
SPEEDUP_TYPES: Final = ("local", "global")


class RuleCol:
    """Columns of the rule table (``NcuReport.rules``): ncu's own guidance, one row per message."""

    LAUNCH: Final = "launch_id"
    RULE: Final = "rule_id"  # e.g. "SOLBottleneck", "UncoalescedGlobalAccess"
    SECTION: Final = "section"
    TITLE: Final = "title"  # e.g. "High Memory Throughput"; may be empty
    MESSAGE: Final = "message"  # plain text: ncu's @section/@url markup resolved to its label
    SEVERITY: Final = "severity"
    SPEEDUP_TYPE: Final = "speedup_type"
    SPEEDUP_PCT: Final = "speedup_pct"  # ncu's estimated speedup, % of this launch's time


NCU_RULES_SCHEMA: Final = pl.Schema(
    {
        RuleCol.LAUNCH: _I,
        RuleCol.RULE: pl.String(),
        RuleCol.SECTION: pl.String(),
        RuleCol.TITLE: pl.String(),
        RuleCol.MESSAGE: pl.String(),
        RuleCol.SEVERITY: pl.Enum(list(RULE_SEVERITIES)),
        RuleCol.SPEEDUP_TYPE: pl.Enum(list(SPEEDUP_TYPES)),
        RuleCol.SPEEDUP_PCT: _F,
    }
)

NCU_TABLE_SCHEMAS: Final = {
    "launches": NCU_LAUNCHES_SCHEMA,
    "breakdowns": NCU_BREAKDOWNS_SCHEMA,
    "rules": NCU_RULES_SCHEMA,
}


@dataclass(frozen=True)
class NcuRun:
    """One ncu run in the file: a CSV header block (files appended with ``>>`` hold several).

    ncu numbers each run's launches from 0, so run ``index`` keeps its IDs apart by adding
    ``id_offset`` (one past the previous run's highest launch_id) to them.
    """

    index: int
    format: str  # like NcuReport.format: one appended file may mix details and raw pages
    id_offset: int
    line: int | None = None  # 1-based line of the run's header in the file


@dataclass(frozen=True)
class NcuReport:
    """One Nsight Compute report (or CSV export of one) in normalized tables.

    ``format`` is ``ncu-rep``, ``ncu-csv-details`` or ``ncu-csv-raw`` (the first run's).
    ``launches`` keeps ncu's launch order. ``runs`` lists the runs when a CSV holds several
    (empty: one run, launch_id is ncu's ID); ``run_report`` gives one run alone.
    """

    path: str
    format: str
    tool_version: str | None
    profiler_cmdline: str | None
    launches: pl.DataFrame
    breakdowns: pl.DataFrame
    rules: pl.DataFrame
    warnings: tuple[str, ...] = ()
    runs: tuple[NcuRun, ...] = ()

    def run_report(self, index: int) -> NcuReport:
        """Run ``index`` alone, with ncu's own launch IDs, and without the file's warnings."""
        if not self.runs and index == 0:
            return replace(self, warnings=())
        run = self.runs[index]
        launches = self.launches.filter(pl.col(NcuCol.RUN) == index)
        ids = launches.get_column(NcuCol.LAUNCH)
        shifted = pl.col(NcuCol.LAUNCH) - run.id_offset
        return NcuReport(
            path=self.path, format=run.format, tool_version=self.tool_version,
            profiler_cmdline=self.profiler_cmdline,
            launches=launches.with_columns(shifted, pl.lit(0, pl.Int32).alias(NcuCol.RUN)),
            breakdowns=self.breakdowns.filter(pl.col(BreakdownCol.LAUNCH).is_in(ids.implode())).with_columns(shifted),
            rules=self.rules.filter(pl.col(RuleCol.LAUNCH).is_in(ids.implode())).with_columns(shifted),
        )

    def table(self, name: str) -> pl.DataFrame:
        value = getattr(self, name)
        assert isinstance(value, pl.DataFrame)
        return value

    def check(self) -> None:
        """Verify schemas and references; raise ModelError on the first break."""
        for name, schema in NCU_TABLE_SCHEMAS.items():
            got = self.table(name).schema
            if dict(got) != dict(schema):
                diff = {k: (got.get(k), v) for k, v in schema.items() if got.get(k) != v}
                extra = sorted(set(got) - set(schema))
                raise ModelError(f"ncu table {name}: schema mismatch {diff} extra={extra}")
        ids = self.launches.get_column(NcuCol.LAUNCH)
        if ids.null_count() or ids.n_unique() != ids.len():
            raise ModelError("ncu launch_id must be unique and never null")
        if self.launches.get_column(NcuCol.NAME).null_count():
            raise ModelError("every ncu launch needs a kernel name")
        durations = self.launches.get_column(NcuCol.DUR).drop_nulls()
        if durations.len() and durations.min() < 0:  # type: ignore[operator]
            raise ModelError("ncu dur_ns must not be negative")
        run_count = max(1, len(self.runs))
        run_column = self.launches.get_column(NcuCol.RUN)
        if run_column.null_count() or not run_column.is_between(0, run_count - 1).all():
            raise ModelError("ncu run must name one of the report's runs")
        known = set(ids.to_list())
        for name in ("breakdowns", "rules"):
            refs = set(self.table(name).get_column(BreakdownCol.LAUNCH).unique().to_list())
            if not refs <= known:
                raise ModelError(f"ncu {name} refer to launches that do not exist")
