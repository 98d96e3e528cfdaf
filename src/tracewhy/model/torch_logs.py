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


class LogFallbackCol:
    """Columns of ``TorchLogs.fallbacks``: one row per frame Dynamo gave up on (a frame skipped
    after a graph break it cannot resume from, or the recompile limit reached)."""

    COMPILE_ID: Final = "compile_id"  # the compile that gave up, "F/C"
    REGION: Final = LogBreakCol.REGION
    KIND: Final = "kind"  # FallbackKind
    FUNCTION: Final = "function"
    LOCATION: Final = "location"  # the function's file:line
    REASON: Final = "reason"  # the limit and the last guard failure, or the break that skipped the frame


class FallbackKind:
    """Why Dynamo gave up on a frame, as the log says it."""

    RECOMPILE_LIMIT: Final = "recompile limit"
    FRAME_SKIPPED: Final = "frame skipped"


@dataclass(frozen=True)
class TorchLogs:
    """Breaks, recompiles and frames given up on, read from a log, and warnings about lines not
    understood."""

    breaks: pl.DataFrame
    recompiles: pl.DataFrame
    fallbacks: pl.DataFrame
    warnings: tuple[str, ...]
    lines: int


BREAK_SCHEMA: Final = pl.Schema({c: pl.String() for c in (
    LogBreakCol.COMPILE_ID, LogBreakCol.REGION, LogBreakCol.FUNCTION, LogBreakCol.LOCATION, LogBreakCol.REASON)})
RECOMPILE_SCHEMA: Final = pl.Schema({
    LogRecompileCol.COMPILE_ID: pl.String(), LogRecompileCol.REGION: pl.String(), LogRecompileCol.FUNCTION: pl.String(),
    LogRecompileCol.LOCATION: pl.String(), LogRecompileCol.GUARD: pl.String(), LogRecompileCol.GUARDS: pl.Int64(),
})
FALLBACK_SCHEMA: Final = pl.Schema({c: pl.String() for c in (
    LogFallbackCol.COMPILE_ID, LogFallbackCol.REGION, LogFallbackCol.KIND, LogFallbackCol.FUNCTION,
    LogFallbackCol.LOCATION, LogFallbackCol.REASON)})
