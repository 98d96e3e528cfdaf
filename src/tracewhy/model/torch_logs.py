"""What ``TORCH_LOGS="graph_breaks,recompiles"`` or a ``TORCH_TRACE`` directory recorded, as
tables: one row per graph break and per recompile, each with the compile id ``F/C`` that names
the region it belongs to (``readers/torch_logs`` and ``readers/torch_trace`` parse the logs into
these); from TORCH_TRACE also one row per compile (its phases' times and cache results) and one
per rank (what it compiled, and how that differs from the other ranks)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
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


class LogCompileCol:
    """Columns of ``TorchLogs.compiles`` (TORCH_TRACE only): one row per compile id per rank."""

    RANK: Final = "rank"  # the rank the log belongs to (null: a run without torch.distributed)
    COMPILE_ID: Final = LogBreakCol.COMPILE_ID  # "F/C", with "!A/" first for compiled autograd
    REGION: Final = LogBreakCol.REGION
    ATTEMPTS: Final = "attempts"  # Dynamo's tries at the frame (a graph break restarts the analysis)
    FUNCTION: Final = "function"  # the compiled frame's code name
    LOCATION: Final = "location"  # the compiled frame's file:first line
    GRAPHS: Final = "graphs"  # FX graphs Dynamo produced (0: the frame was not compiled)
    GRAPH_BREAKS: Final = "graph_breaks"  # graph break records of this compile
    #: The whole frame compile (forward), and its parts: Dynamo alone, AOT autograd alone (without
    #: Inductor), Inductor; null where the log has no compilation metrics for the compile.
    COMPILE_NS: Final = "compile_ns"
    DYNAMO_NS: Final = "dynamo_ns"
    AOT_AUTOGRAD_NS: Final = "aot_autograd_ns"
    INDUCTOR_NS: Final = "inductor_ns"
    #: The backward graph's compile, done at the first backward (``bwd_compilation_metrics``).
    BACKWARD_NS: Final = "backward_compile_ns"
    #: Inductor's FX graph cache and AOT autograd's cache: each result in order ("miss, hit").
    FX_GRAPH_CACHE: Final = "fx_graph_cache"
    AOT_AUTOGRAD_CACHE: Final = "aot_autograd_cache"
    RECOMPILE_GUARD: Final = "recompile_guard"  # the first guard whose failure made this compile
    FAILURE: Final = "failure"  # "fail_type: fail_reason" of a compile that failed


class LogRankCol:
    """Columns of ``TorchLogs.ranks`` (TORCH_TRACE only): one row per rank log."""

    RANK: Final = LogCompileCol.RANK
    COMPILES: Final = "compiles"
    GRAPHS: Final = "graphs"
    GRAPH_BREAKS: Final = "graph_breaks"
    RECOMPILES: Final = "recompiles"
    COMPILE_NS: Final = "compile_ns"  # forward and backward compiles, summed
    #: How this rank's compiles differ from those of most ranks (compile ids, graphs, break
    #: locations, recompiles); null when they are the same, and for a log with no rank beside
    #: ranked ones (another process: it is listed, not compared).
    DIFFERS: Final = "differs"


@dataclass(frozen=True)
class TorchLogs:
    """Breaks, recompiles and frames given up on, read from a log, and warnings about lines not
    understood. From a TORCH_TRACE directory of several ranks, the breaks, recompiles and
    fallbacks are those of ``rank`` (the lowest; ``for_rank`` picks another); ``compiles`` and
    ``ranks`` hold every rank's."""

    breaks: pl.DataFrame
    recompiles: pl.DataFrame
    fallbacks: pl.DataFrame
    warnings: tuple[str, ...]
    lines: int
    compiles: pl.DataFrame | None = None
    ranks: pl.DataFrame | None = None
    rank: int | None = None
    #: Each rank's (breaks, recompiles), for ``for_rank``.
    rank_tables: dict[int, tuple[pl.DataFrame, pl.DataFrame]] = field(default_factory=dict)

    def for_rank(self, rank: int | None) -> TorchLogs:
        """These logs with the breaks and recompiles of ``rank`` (the rank of the trace they are
        joined to); unchanged when that rank has no log here."""
        if rank is None or rank == self.rank or rank not in self.rank_tables:
            return self
        breaks, recompiles = self.rank_tables[rank]
        return dataclasses.replace(self, breaks=breaks, recompiles=recompiles, rank=rank)


BREAK_SCHEMA: Final = pl.Schema({c: pl.String() for c in (
    LogBreakCol.COMPILE_ID, LogBreakCol.REGION, LogBreakCol.FUNCTION, LogBreakCol.LOCATION, LogBreakCol.REASON)})
RECOMPILE_SCHEMA: Final = pl.Schema({
    LogRecompileCol.COMPILE_ID: pl.String(), LogRecompileCol.REGION: pl.String(), LogRecompileCol.FUNCTION: pl.String(),
    LogRecompileCol.LOCATION: pl.String(), LogRecompileCol.GUARD: pl.String(), LogRecompileCol.GUARDS: pl.Int64(),
})
FALLBACK_SCHEMA: Final = pl.Schema({c: pl.String() for c in (
    LogFallbackCol.COMPILE_ID, LogFallbackCol.REGION, LogFallbackCol.KIND, LogFallbackCol.FUNCTION,
    LogFallbackCol.LOCATION, LogFallbackCol.REASON)})
COMPILE_SCHEMA: Final = pl.Schema({
    LogCompileCol.RANK: pl.Int64(), LogCompileCol.COMPILE_ID: pl.String(), LogCompileCol.REGION: pl.String(),
    LogCompileCol.ATTEMPTS: pl.Int64(), LogCompileCol.FUNCTION: pl.String(), LogCompileCol.LOCATION: pl.String(),
    LogCompileCol.GRAPHS: pl.Int64(), LogCompileCol.GRAPH_BREAKS: pl.Int64(), LogCompileCol.COMPILE_NS: pl.Int64(),
    LogCompileCol.DYNAMO_NS: pl.Int64(), LogCompileCol.AOT_AUTOGRAD_NS: pl.Int64(),
    LogCompileCol.INDUCTOR_NS: pl.Int64(),
    LogCompileCol.BACKWARD_NS: pl.Int64(), LogCompileCol.FX_GRAPH_CACHE: pl.String(),
    LogCompileCol.AOT_AUTOGRAD_CACHE: pl.String(), LogCompileCol.RECOMPILE_GUARD: pl.String(),
    LogCompileCol.FAILURE: pl.String(),
})
RANK_SCHEMA: Final = pl.Schema({
    LogRankCol.RANK: pl.Int64(), LogRankCol.COMPILES: pl.Int64(), LogRankCol.GRAPHS: pl.Int64(),
    LogRankCol.GRAPH_BREAKS: pl.Int64(), LogRankCol.RECOMPILES: pl.Int64(), LogRankCol.COMPILE_NS: pl.Int64(),
    LogRankCol.DIFFERS: pl.String(),
})
