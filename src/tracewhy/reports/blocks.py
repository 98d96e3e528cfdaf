"""``blocks``: which annotated block gates the step. On a profiler trace, the GPU time per step of
each record_function block; on an instrument log (``tracewhy.instrument``'s JSON Lines, a file or
a directory of rank logs), its block timers per rank. Either way, with the attribution line and
whether a synchronize ends the blocks (``findings/blocks.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Final

from tracewhy.analyses.blocks import BlocksOptions, BlocksResult, blocks
from tracewhy.analyses.log_blocks import DEFAULT_LOG_WARMUP, LogBlocksOptions, LogBlocksResult, log_blocks
from tracewhy.errors import UsageError
from tracewhy.findings.blocks import attribution, log_attribution, log_synchronized, synchronized_blocks
from tracewhy.findings.model import Finding
from tracewhy.readers.registry import InputKind, detect, read_stage_logs
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource

#: Steps (or chunks) of each rank an instrument log's blocks leave out as warm-up by default.
LOG_WARMUP: Final = DEFAULT_LOG_WARMUP


@dataclass(frozen=True)
class BlocksReportOptions:
    #: Only these blocks (names; shell wildcards allowed); empty: every block.
    names: tuple[str, ...] = ()
    #: A trace's step annotation (an instrument log's blocks carry their step).
    step_marker: str | None = None
    #: None: a first step #0 or outlier on a trace, ``LOG_WARMUP`` on an instrument log.
    warmup: int | None = None


@dataclass(frozen=True)
class BlocksReport:
    """The blocks of a profiler trace, and the findings on them."""

    result: BlocksResult
    findings: list[Finding]


@dataclass(frozen=True)
class LogBlocksReport:
    """The block timers of an instrument log, and the findings on them."""

    result: LogBlocksResult
    findings: list[Finding]


def blocks_report(source: TraceSource, options: BlocksReportOptions | None = None,
                  loader: Loader = PLAIN) -> BlocksReport | LogBlocksReport:
    """The blocks of a trace, or of an instrument log when ``source`` is one (told by content)."""
    options = options or BlocksReportOptions()
    if isinstance(source, (str, PurePath)) and detect(Path(source), (InputKind.STAGE_LOGS,)) is not None:
        return _log_report(Path(source), options, loader)
    r = blocks(loader.trace(source), BlocksOptions(names=options.names, step_marker=options.step_marker,
                                                   warmup=options.warmup))
    return BlocksReport(r, [f for f in (synchronized_blocks(r), attribution(r)) if f is not None])


def _log_report(path: Path, options: BlocksReportOptions, loader: Loader) -> LogBlocksReport:
    if options.step_marker:
        raise UsageError("--step names a trace's step annotation; an instrument log's blocks carry their step")
    log = read_stage_logs([path])
    loader.warn(log.source, log.warnings)
    warmup = LOG_WARMUP if options.warmup is None else options.warmup
    r = log_blocks(log, LogBlocksOptions(names=options.names, warmup=warmup))
    return LogBlocksReport(r, [f for f in (log_synchronized(r), log_attribution(r)) if f is not None])
