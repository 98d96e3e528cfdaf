"""What ``TORCH_LOGS="graph_breaks,recompiles"`` recorded, as tables: one row per graph break
and per recompile, each with the compile id ``F/C`` that names the region it belongs to
(``readers/torch_logs`` parses the log into these)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl


class LogBreakCol:
    """Columns of ``TorchLogs.breaks``: one row per graph break record."""

    COMPILE_ID: Final = "compile_id"  # the frame compile that broke, "F/C" (null if not logged)
    #: The same as "F/C", named as the compile analysis names the trace's regions (its
    #: ``RegionCol.REGION``), which these rows are joined to.
    REGION: Final = "region"
    FUNCTION: Final = "function"
    LOCATION: Final = "location"  # file:line of the break in user code
    REASON: Final = "reason"


class LogRecompileCol:
    """Columns of ``TorchLogs.recompiles``: one row per recompile record."""

    COMPILE_ID: Final = "compile_id"  # the new compile, "F/C" with C > 0
    REGION: Final = LogBreakCol.REGION
    FUNCTION: Final = "function"
    LOCATION: Final = "location"
    GUARD: Final = "guard"  # the first guard that failed
    GUARDS: Final = "failed_guards"


@dataclass(frozen=True)
class TorchLogs:
    """Breaks and recompiles read from a log, and warnings about lines not understood."""

    breaks: pl.DataFrame
    recompiles: pl.DataFrame
    warnings: tuple[str, ...]
    lines: int


BREAK_SCHEMA: Final = pl.Schema({c: pl.String() for c in (
    LogBreakCol.COMPILE_ID, LogBreakCol.REGION, LogBreakCol.FUNCTION, LogBreakCol.LOCATION, LogBreakCol.REASON)})
RECOMPILE_SCHEMA: Final = pl.Schema({
    LogRecompileCol.COMPILE_ID: pl.String(), LogRecompileCol.REGION: pl.String(), LogRecompileCol.FUNCTION: pl.String(),
    LogRecompileCol.LOCATION: pl.String(), LogRecompileCol.GUARD: pl.String(), LogRecompileCol.GUARDS: pl.Int64(),
})
